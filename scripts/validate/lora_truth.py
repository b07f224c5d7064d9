#!/usr/bin/env python3
"""peft LoRA training steps measured on CPU, for the planner's replay of the recorded LoRA
templates (`data/programs/hf-lora.tpl`): at depths, shapes and ranks the templates were not
recorded at (they were at five layers, 2x56, 2x88, 3x56 tokens, rank 22).

Each case builds a family's config (measure.py's `small_configs` base, or `CONFIGS` here for
the families that grid lacks) at its depth, in the case's variant of the family where it comes
in more than one (`VARIANTS`: T5 v1.0's ReLU MLP or v1.1's gated one, each planned from a
template of its own), with eager attention where the planner plans it
so, or on SDPA's math path where the case asks for it (`sdpa-math`: the path a GPU takes for
fp32 with grouped key-value heads, which the CPU takes when asked, as step_programs.py records
it), wraps it with peft's LoRA as step_programs.py records it (`lora_model`), keeps peft's count
of the trainable parameters, creates `torch.optim.AdamW` (foreach) over the model's parameters
and runs a step to make the optimizer state; then a second step is measured as measure.py measures one: the storages alive when it starts (weights,
buffers, optimizer state, inputs) plus the highest running sum of the profiler's allocation
events, per phase and over the step. A case at `amp-cuda` is AMP as a GPU runs it: fp32 weights
and adapters, each step under CUDA's autocast policy (`step_programs.cuda_policy`, the forward
under `torch.autocast("cuda", torch.bfloat16)`), as step_programs.py records its `amp-cuda`
templates (`data/programs/hf-lora-amp.tpl`; with eager attention asked, `hf-lora-amp-eager.tpl`). A case
builds its model with the key-value cache off (`measure.no_cache`) unless it turns it on
(`use_cache`, the config's default: the training forward builds a `DynamicCache`), and is then
planned from the template recorded with it (`…/cache/…`, `data/programs/hf-cache.tpl`); each row
says which (`use_cache`; a row without it was measured before `no_cache`, with the cache on,
and is kept for its case). Every case is a check row: nothing in the templates is
fitted to them (`cargo test -p headroom-plan --test lora_truth` compares).

    /work/venv-torch/bin/python scripts/validate/lora_truth.py --out data/validation/lora_cpu_truth.json
    /work/venv-torch/bin/python scripts/validate/lora_truth.py --reuse data/validation/lora_cpu_truth.json \
        --jobs 2 --out data/validation/lora_cpu_truth.json
"""

import argparse
import contextlib
import gc
import json
import sys

import torch
from torch.profiler import record_function

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import case_table  # noqa: E402
import measure  # noqa: E402
import step_programs  # noqa: E402

# (family, precision, checkpointing, layers, batch, seq, rank, targets[, variant[, attention[,
# target_seq[, use_cache]]]]): chosen before any comparison, every one away from the recording's
# depth (5), shapes and rank (22). The variant names one of VARIANTS' changes to the family's
# config; a case without one runs the family's config as it is. The attention is the family's
# own (`attention_of`) unless a case names `sdpa-math`. A sequence-to-sequence case's decoder is
# `seq` tokens long unless it names its own length (`target_seq`: its labels' tokens). The
# key-value cache is off (`measure.no_cache`, as a training script sets it) unless a case turns
# it on (`use_cache`: the config's default left as it is).
CASES = [
    ("llama", "bf16", False, 6, 2, 128, 16, "all"),
    ("qwen2", "bf16", False, 7, 2, 96, 32, "all"),
    ("mistral", "bf16", False, 6, 1, 160, 8, "all"),
    ("llama", "bf16", False, 8, 1, 96, 64, "all"),
    # The families recorded since, each at a config of its own (measure.py's `base`, or
    # CONFIGS below), other than its recording config.
    ("gemma", "bf16", False, 6, 2, 128, 16, "all"),
    ("gemma2", "bf16", False, 6, 1, 96, 8, "all"),
    ("gemma3_text", "bf16", False, 7, 2, 96, 32, "all"),
    ("phi3", "bf16", False, 6, 2, 112, 16, "all"),
    ("mixtral", "bf16", False, 6, 2, 64, 8, "all"),
    ("gpt_neox", "bf16", False, 7, 1, 128, 8, "all"),
    ("qwen2_moe", "bf16", False, 6, 1, 96, 16, "all"),
    ("bloom", "bf16", False, 6, 2, 96, 16, "all"),
    ("qwen3_moe", "bf16", False, 7, 2, 64, 32, "all"),
    # Checkpointing.
    ("qwen2", "bf16", True, 6, 2, 128, 16, "all"),
    ("mistral", "bf16", True, 7, 1, 160, 32, "all"),
    ("gpt2", "bf16", True, 6, 2, 96, 8, "all"),
    # The query and value projections alone.
    ("qwen2", "bf16", False, 6, 2, 96, 16, "qv"),
    ("qwen3", "bf16", False, 7, 1, 128, 64, "qv"),
    ("mistral", "bf16", False, 6, 2, 64, 8, "qv"),
    # fp32.
    ("qwen2", "fp32", False, 6, 1, 96, 16, "all"),
    ("qwen3", "fp32", False, 6, 2, 64, 8, "all"),
    ("mistral", "fp32", False, 7, 1, 128, 32, "all"),
    ("gpt2", "fp32", False, 6, 2, 96, 16, "all"),
    # BERT as a masked LM (peft's plain PeftModel: it has no masked-LM task type) and T5 as a
    # sequence-to-sequence LM (SEQ_2_SEQ_LM), at measure.py's `deep` configs (widths and heads
    # other than the recording's); T5's layers a stack, its encoder's and its decoder's.
    ("bert", "bf16", False, 6, 2, 128, 16, "all"),
    ("bert", "bf16", False, 7, 1, 160, 8, "qv"),
    ("t5", "bf16", False, 6, 2, 96, 16, "all", "v1.1"),
    ("t5", "bf16", False, 5, 1, 128, 32, "qv", "v1.1"),
    ("bert", "fp32", False, 6, 1, 96, 16, "all"),
    ("t5", "bf16", True, 6, 2, 64, 8, "all", "v1.1"),
    # T5 v1.0 (t5-base's one ReLU projection in), planned from the templates recorded with it.
    ("t5", "bf16", False, 7, 1, 112, 16, "all", "v1.0"),
    ("t5", "bf16", False, 6, 2, 80, 8, "qv", "v1.0"),
    ("t5", "bf16", True, 6, 1, 128, 32, "all", "v1.0"),
    ("t5", "fp32", False, 6, 2, 64, 16, "all", "v1.0"),
    ("bert", "bf16", True, 7, 2, 96, 32, "all"),
    ("t5", "fp32", True, 6, 1, 96, 8, "all", "v1.0"),
    ("bert", "fp32", True, 6, 2, 80, 8, "all"),
    ("t5", "fp32", False, 7, 2, 64, 8, "all", "v1.1"),
    ("t5", "fp32", True, 6, 2, 96, 16, "all", "v1.1"),
    ("bert", "fp32", False, 7, 2, 96, 16, "qv"),
    ("t5", "fp32", False, 6, 1, 112, 32, "qv", "v1.0"),
    ("bert", "bf16", True, 6, 1, 128, 8, "qv"),
    ("bert", "fp32", True, 7, 1, 112, 32, "qv"),
    ("t5", "bf16", True, 7, 2, 64, 16, "qv", "v1.0"),
    ("t5", "fp32", True, 6, 2, 80, 16, "qv", "v1.0"),
    # The decoder families' checkpointed steps, their query and value projections alone (a
    # fused query-key-value layer whole, as peft's defaults take it), and both together.
    ("gemma", "bf16", True, 7, 1, 128, 8, "all"),
    ("phi3", "bf16", True, 6, 2, 96, 32, "all"),
    ("bloom", "bf16", True, 7, 1, 112, 8, "all"),
    ("mixtral", "bf16", True, 7, 1, 64, 16, "all"),
    ("qwen2_moe", "bf16", True, 7, 2, 64, 8, "all"),
    ("gpt2", "bf16", False, 7, 2, 96, 16, "qv"),
    ("gpt_neox", "bf16", False, 6, 2, 112, 8, "qv"),
    ("phi3", "bf16", False, 7, 1, 128, 16, "qv"),
    ("gemma2", "bf16", False, 6, 2, 80, 32, "qv"),
    ("qwen3_moe", "bf16", False, 6, 2, 64, 8, "qv"),
    ("llama", "bf16", True, 7, 2, 96, 16, "qv"),
    ("gpt2", "bf16", True, 6, 1, 128, 8, "qv"),
    ("mistral", "bf16", True, 6, 2, 80, 32, "qv"),
    # fp32 on SDPA's math path (a GPU's for fp32 with grouped key-value heads), asked for here.
    ("llama", "fp32", False, 7, 1, 128, 16, "all", None, "sdpa-math"),
    ("mistral", "fp32", False, 6, 2, 96, 8, "all", None, "sdpa-math"),
    ("qwen2", "fp32", False, 6, 1, 128, 32, "all", None, "sdpa-math"),
    ("llama", "fp32", True, 6, 2, 96, 32, "all", None, "sdpa-math"),
    ("qwen3", "fp32", False, 7, 2, 64, 16, "all", None, "sdpa-math"),
    ("mistral", "fp32", True, 7, 1, 128, 16, "all", None, "sdpa-math"),
    ("mixtral", "fp32", False, 6, 1, 96, 8, "all", None, "sdpa-math"),
    ("qwen2", "fp32", True, 6, 2, 80, 8, "all", None, "sdpa-math"),
    ("gemma", "fp32", True, 7, 1, 112, 8, "all", None, "sdpa-math"),
    ("gemma", "fp32", False, 6, 2, 80, 16, "all", None, "sdpa-math"),
    ("gemma3_text", "fp32", False, 6, 2, 96, 8, "all", None, "sdpa-math"),
    ("mixtral", "fp32", True, 6, 2, 64, 16, "all", None, "sdpa-math"),
    ("qwen3", "fp32", True, 6, 1, 160, 16, "all", None, "sdpa-math"),
    ("gemma3_text", "fp32", True, 6, 1, 128, 16, "all", None, "sdpa-math"),
    # fp32 with the attention each family's fp32 full fine-tuning was recorded with.
    ("gemma2", "fp32", False, 6, 2, 64, 16, "all"),
    ("phi3", "fp32", False, 6, 1, 128, 16, "all"),
    ("gemma", "fp32", False, 7, 2, 96, 8, "all"),
    ("gpt_neox", "fp32", False, 6, 2, 112, 16, "all"),
    ("bloom", "fp32", False, 7, 1, 96, 16, "all"),
    ("gpt2", "fp32", True, 7, 2, 64, 16, "all"),
    ("phi3", "fp32", True, 7, 2, 96, 8, "all"),
    ("qwen2_moe", "fp32", False, 6, 2, 96, 16, "all"),
    ("gemma2", "fp32", True, 7, 1, 112, 8, "all"),
    # fp32 LoRA of the mixtures of experts and Phi-3 on SDPA's math path, and the checkpointed
    # fp32 LoRA of Qwen2-MoE, Gemma, GPT-NeoX (SDPA) and BLOOM (eager).
    ("qwen3_moe", "fp32", False, 6, 2, 96, 16, "all", None, "sdpa-math"),
    ("qwen3_moe", "fp32", True, 7, 1, 128, 8, "all", None, "sdpa-math"),
    ("qwen2_moe", "fp32", False, 7, 1, 112, 8, "all", None, "sdpa-math"),
    ("qwen2_moe", "fp32", True, 6, 2, 80, 16, "all", None, "sdpa-math"),
    ("phi3", "fp32", False, 7, 2, 80, 32, "all", None, "sdpa-math"),
    ("phi3", "fp32", True, 6, 1, 160, 16, "all", None, "sdpa-math"),
    ("qwen2_moe", "fp32", True, 7, 1, 96, 32, "all"),
    ("gemma", "fp32", True, 6, 2, 96, 16, "all"),
    ("gpt_neox", "fp32", True, 7, 1, 128, 8, "all"),
    ("bloom", "fp32", True, 6, 2, 80, 32, "all"),
    # fp32 on SDPA's math path, the query and value projections alone.
    ("llama", "fp32", False, 6, 2, 96, 16, "qv", None, "sdpa-math"),
    ("qwen2", "fp32", True, 7, 1, 128, 8, "qv", None, "sdpa-math"),
    ("mistral", "fp32", False, 7, 1, 112, 32, "qv", None, "sdpa-math"),
    ("qwen3", "fp32", True, 6, 2, 80, 16, "qv", None, "sdpa-math"),
    ("gemma", "fp32", False, 7, 2, 64, 16, "qv", None, "sdpa-math"),
    ("gemma3_text", "fp32", True, 7, 1, 112, 32, "qv", None, "sdpa-math"),
    ("mixtral", "fp32", False, 7, 1, 80, 16, "qv", None, "sdpa-math"),
    ("phi3", "fp32", True, 7, 2, 64, 8, "qv", None, "sdpa-math"),
    # fp32, the query and value projections alone, with each family's own attention (SDPA's
    # fused kernel, eager for BLOOM and Gemma-2) and Qwen3-MoE on the math path.
    ("gpt2", "fp32", False, 6, 2, 80, 16, "qv"),
    ("phi3", "fp32", True, 7, 1, 96, 16, "qv"),
    ("gemma", "fp32", False, 6, 1, 128, 8, "qv"),
    ("qwen2_moe", "fp32", False, 7, 2, 64, 16, "qv"),
    ("qwen3_moe", "fp32", True, 6, 1, 112, 8, "qv", None, "sdpa-math"),
    ("gpt_neox", "fp32", True, 6, 2, 96, 32, "qv"),
    ("bloom", "fp32", False, 6, 1, 112, 16, "qv"),
    ("gemma2", "fp32", True, 7, 2, 80, 8, "qv"),
    # fp32 with SDPA's fused kernel for Llama (Llama 2's 32 heads and 32), and eager attention
    # asked for Llama, GPT-2, Mistral, Qwen2, Phi-3 and Gemma.
    ("llama", "fp32", True, 6, 2, 112, 16, "all"),
    ("llama", "fp32", False, 7, 1, 80, 32, "qv"),
    ("llama", "fp32", False, 6, 2, 96, 8, "qv", None, "eager"),
    ("llama", "fp32", True, 7, 1, 128, 16, "all", None, "eager"),
    ("gpt2", "fp32", True, 7, 1, 112, 16, "all", None, "eager"),
    ("gpt2", "fp32", False, 6, 2, 64, 32, "qv", None, "eager"),
    ("mistral", "fp32", False, 7, 2, 80, 16, "all", None, "eager"),
    ("mistral", "fp32", True, 6, 1, 112, 8, "qv", None, "eager"),
    ("qwen2", "fp32", True, 7, 2, 64, 32, "all", None, "eager"),
    ("phi3", "fp32", False, 6, 2, 96, 16, "qv", None, "eager"),
    ("gemma", "fp32", True, 7, 1, 96, 8, "all", None, "eager"),
    # Eager attention asked for Gemma 3, GPT-NeoX, the mixtures of experts and BERT.
    ("gemma3_text", "fp32", True, 7, 2, 80, 16, "all", None, "eager"),
    ("gpt_neox", "fp32", False, 6, 1, 128, 16, "qv", None, "eager"),
    ("mixtral", "fp32", True, 6, 2, 64, 8, "all", None, "eager"),
    ("qwen2_moe", "fp32", False, 7, 1, 96, 16, "qv", None, "eager"),
    ("qwen3_moe", "fp32", False, 6, 2, 80, 8, "all", None, "eager"),
    ("bert", "fp32", True, 6, 1, 128, 16, "all", None, "eager"),
    # T5 v1.1 untied (T0's, mT0's), its query and value projections, its decoder shorter than
    # its encoder (a sequence-to-sequence job's labels: peft's seq2seq example pads them to the
    # longest class name), planned from the templates recorded at two lengths.
    ("t5", "fp32", False, 6, 2, 80, 16, "qv", "v1.1-untied", "eager", 12),
    ("t5", "fp32", True, 7, 1, 96, 8, "qv", "v1.1-untied", "eager", 5),
    # bf16 with eager attention asked for the mixtures of experts (peft's merged expert stacks
    # under transformers' eager attention).
    ("mixtral", "bf16", False, 7, 1, 80, 16, "all", None, "eager"),
    ("qwen3_moe", "bf16", True, 6, 2, 64, 16, "all", None, "eager"),
    ("qwen2_moe", "bf16", False, 6, 2, 80, 8, "qv", None, "eager"),
    # bf16 with eager attention asked for the families recorded with SDPA (Llama and GPT-2 of
    # the ten, both targets, with and without checkpointing).
    ("llama", "bf16", False, 7, 1, 112, 16, "all", None, "eager"),
    ("llama", "bf16", True, 6, 2, 80, 8, "qv", None, "eager"),
    ("gpt2", "bf16", True, 6, 2, 80, 8, "all", None, "eager"),
    ("gpt2", "bf16", False, 7, 1, 128, 32, "qv", None, "eager"),
    # AMP as a GPU runs it (`amp-cuda`: fp32 weights and adapters, the step under CUDA's
    # autocast policy, as step_programs.py records it), planned from the `…/amp-cuda/…`
    # template a GPU's AMP job picks.
    ("llama", "amp-cuda", False, 6, 2, 96, 16, "all"),
    ("llama", "amp-cuda", True, 7, 1, 128, 8, "all"),
    ("llama", "amp-cuda", False, 7, 2, 80, 32, "qv"),
    # AMP as a GPU runs it with eager attention asked of the families recorded with SDPA,
    # planned from the `…/amp-cuda/eager/…` templates (`data/programs/hf-lora-amp-eager.tpl`):
    # both targets, with and without checkpointing, a fused query-key-value layer among them.
    ("llama", "amp-cuda", False, 7, 1, 96, 16, "all", None, "eager"),
    ("mistral", "amp-cuda", True, 6, 2, 80, 8, "all", None, "eager"),
    ("qwen2", "amp-cuda", False, 6, 1, 128, 8, "qv", None, "eager"),
    ("gpt2", "amp-cuda", False, 6, 2, 64, 32, "qv", None, "eager"),
    ("phi3", "amp-cuda", True, 7, 1, 112, 16, "qv", None, "eager"),
    ("gemma", "amp-cuda", True, 6, 2, 64, 16, "all", None, "eager"),
    ("gpt_neox", "amp-cuda", False, 7, 2, 80, 16, "all", None, "eager"),
    ("mixtral", "amp-cuda", False, 6, 1, 64, 16, "all", None, "eager"),
    ("bert", "amp-cuda", True, 6, 1, 96, 8, "all", None, "eager"),
    # The key-value cache on (`use_cache`, transformers' default in a training forward:
    # `DynamicCache` copies each layer's key and value), planned from the `…/cache/…` keys
    # (`data/programs/hf-cache.tpl`): the families that fuse the query, key and value, where
    # the cache moves the peak, without checkpointing (transformers turns the cache off under
    # it). Each case without the cache above, for GPT-2, Phi-3 and GPT-NeoX, with it too; and
    # AMP with SDPA and Phi-3's eager AMP, each both ways.
    ("phi3", "bf16", False, 6, 2, 112, 16, "all", None, None, None, True),
    ("gpt_neox", "bf16", False, 7, 1, 128, 8, "all", None, None, None, True),
    ("gpt2", "bf16", False, 7, 2, 96, 16, "qv", None, None, None, True),
    ("gpt_neox", "bf16", False, 6, 2, 112, 8, "qv", None, None, None, True),
    ("phi3", "bf16", False, 7, 1, 128, 16, "qv", None, None, None, True),
    ("phi3", "fp32", False, 6, 1, 128, 16, "all", None, None, None, True),
    ("gpt_neox", "fp32", False, 6, 2, 112, 16, "all", None, None, None, True),
    ("gpt2", "bf16", False, 7, 1, 128, 32, "qv", None, "eager", None, True),
    ("gpt2", "amp-cuda", False, 6, 2, 64, 32, "qv", None, "eager", None, True),
    ("gpt_neox", "amp-cuda", False, 7, 2, 80, 16, "all", None, "eager", None, True),
    ("gpt2", "amp-cuda", False, 7, 1, 112, 16, "all"),
    ("gpt2", "amp-cuda", False, 7, 1, 112, 16, "all", None, None, None, True),
    ("phi3", "amp-cuda", False, 6, 2, 80, 8, "qv"),
    ("phi3", "amp-cuda", False, 6, 2, 80, 8, "qv", None, None, None, True),
    ("gpt_neox", "amp-cuda", False, 6, 1, 144, 32, "qv"),
    ("gpt_neox", "amp-cuda", False, 6, 1, 144, 32, "qv", None, None, None, True),
    ("phi3", "amp-cuda", False, 7, 2, 64, 16, "all", None, "eager"),
    ("phi3", "amp-cuda", False, 7, 2, 64, 16, "all", None, "eager", None, True),
]

# Families measure.py's grid has no config for: widths, heads, experts and windows of their
# own, none of them the recording's (step_programs.config).
CONFIGS = {
    "qwen3": dict(model_type="qwen3", hidden_size=256, num_hidden_layers=3, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=48, intermediate_size=704, vocab_size=4096,
                  max_position_embeddings=2048, tie_word_embeddings=False, use_sliding_window=False),
    "gemma2": dict(model_type="gemma2", hidden_size=192, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=64, intermediate_size=768, vocab_size=5000,
                   max_position_embeddings=2048, sliding_window=4096, query_pre_attn_scalar=64),
    "gemma3_text": dict(model_type="gemma3_text", hidden_size=192, num_hidden_layers=3, num_attention_heads=4,
                        num_key_value_heads=1, head_dim=64, intermediate_size=768, vocab_size=5000,
                        max_position_embeddings=2048, sliding_window=64, query_pre_attn_scalar=64),
    "qwen2_moe": dict(model_type="qwen2_moe", hidden_size=192, num_hidden_layers=3, num_attention_heads=6,
                      num_key_value_heads=2, head_dim=32, intermediate_size=512, moe_intermediate_size=160,
                      shared_expert_intermediate_size=320, num_experts=6, num_experts_per_tok=2,
                      decoder_sparse_step=1, mlp_only_layers=[], vocab_size=5000, max_position_embeddings=2048,
                      tie_word_embeddings=False, use_sliding_window=False),
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=192, num_hidden_layers=3, num_attention_heads=6,
                      num_key_value_heads=3, head_dim=32, intermediate_size=512, moe_intermediate_size=144,
                      num_experts=5, num_experts_per_tok=3, decoder_sparse_step=1, mlp_only_layers=[],
                      vocab_size=5000, max_position_embeddings=2048, tie_word_embeddings=False,
                      use_sliding_window=False),
}
# The variants a family comes in, each a change to its config. T5: v1.0's MLP is one ReLU
# projection in (t5-base, t5-large, t5-3b), v1.1's a gated-GELU pair (flan-t5, T0, mT5);
# measure.py's T5 configs are v1.1's. The planner picks a T5 template by its MLP.
VARIANTS = {
    "t5": {"v1.0": dict(feed_forward_proj="relu"), "v1.1": dict(feed_forward_proj="gated-gelu"),
           # v1.1 as its checkpoints are (T0, mT0, flan-t5): its output layer a weight of its own
           # (`step_programs.untie_t5`, after the model is built).
           "v1.1-untied": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)},
}
UNTIED = {"v1.1-untied"}
# measure.py's base BERT is the recording's config: its `deep` one, as T5's.
DEEP = {"bert", "t5"}
# BLOOM and T5 have no SDPA path in transformers, and Gemma-2's steps were recorded with eager
# attention alone: the planner plans SDPA asked of any of them as eager, and so they run here.
EAGER = {"bloom", "gemma2", "t5"}
HEADS = {"bert": "masked-lm", "t5": "seq2seq-lm"}


def attention_of(family):
    return "eager" if family in EAGER else "sdpa"


def config(family, layers, variant=None):
    if family in CONFIGS:
        cfg = dict(CONFIGS[family])
    else:
        cfg = dict(measure.small_configs()[(family, "deep" if family in DEEP else "base")])
    if variant is not None:
        cfg.update(VARIANTS[family][variant])
    for k in ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers"):
        if k in cfg:
            cfg[k] = layers
    return cfg


def variant_of(family, cfg):
    """Which of VARIANTS' changes `cfg` carries (None for a family with one variant)."""
    return next((v for v, change in VARIANTS.get(family, {}).items()
                 if all(cfg.get(k) == x for k, x in change.items())), None)


def case(family, precision, checkpointing, layers, batch, seq, rank, targets, variant=None, attention=None,
         target_seq=None, use_cache=False):
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    cfg = config(family, layers, variant)
    attention = attention or attention_of(family)
    # Dropout off, as measure.py's cases run (the planner plans a CPU step without it).
    head = HEADS.get(family, "causal-lm")
    model = measure.build(cfg, head, "eager" if attention == "eager" else "sdpa", dtype)
    if not use_cache:
        measure.no_cache(model)
    if variant in UNTIED:
        step_programs.untie_t5(model)
    model = step_programs.lora_model(model, head, rank, targets)
    trainable, _ = model.get_nb_trainable_parameters()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    batch_inputs = measure.inputs(cfg, head, batch, seq, target_seq)

    amp = precision == step_programs.AMP_CUDA

    def step():
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if amp else contextlib.nullcontext()
        with record_function("forward"), step_programs.sdpa_backend(attention), autocast:
            loss = model(**batch_inputs).loss
        with record_function("backward"), step_programs.sdpa_backend(attention):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
        with record_function("zero_grad"):
            opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    # CUDA's autocast policy over both steps, as step_programs.py records `amp-cuda`: a
    # checkpointed layer's forward, run again in the backward, casts as a GPU's does too.
    with step_programs.cuda_policy() if amp else contextlib.nullcontext():
        step()
        gc.collect()
        weights = measure.storage_bytes(list(model.parameters()) + list(model.buffers()))
        state = measure.storage_bytes(list(measure.state_tensors(opt)))
        inp = measure.storage_bytes(batch_inputs.values())
        _, per, peak, _ = measure.profiled(step)
    base = weights + state + inp
    return {"family": family, "precision": precision, "checkpointing": checkpointing, "layers": layers,
            "batch": batch, "seq": seq, "target_seq": target_seq, "rank": rank, "targets": targets,
            "variant": variant, "split": "check",
            "config": cfg,
            "attention": attention, "trainable_parameters": trainable,
            "weight_bytes": weights, "optimizer_state_bytes": state, "input_bytes": inp,
            "phases": {k: base + v for k, v in per.items()}, "peak_bytes": base + peak,
            # A row without this field was measured before `measure.no_cache`: with the cache on.
            "use_cache": use_cache}


def trainable(family, precision, layers, rank, targets, variant=None):
    """peft's count of the trainable parameters of a case's model, without running it."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    head = HEADS.get(family, "causal-lm")
    model = measure.build(config(family, layers, variant), head, "eager" if family in EAGER else "sdpa", dtype)
    if variant in UNTIED:
        step_programs.untie_t5(model)
    return step_programs.lora_model(model, head, rank, targets).get_nb_trainable_parameters()[0]


def measured(args):
    return case(*args)


FIELDS = ("family", "precision", "checkpointing", "layers", "batch", "seq", "rank", "targets", "variant",
          "attention", "target_seq", "use_cache")


def whole(c):
    """Case `c` with all of FIELDS: the variant None where it names none, the attention the
    family's own where it names none, the decoder length None (as long as the encoder's), the
    key-value cache off where it does not turn it on."""
    if len(c) < 10 or c[9] is None:
        c = c[:9] + (None,) * (9 - len(c)) + (attention_of(c[0]),) + c[10:]
    if len(c) < 11:
        c = c + (None,)
    return c + (False,) * (len(FIELDS) - len(c))


def earlier_case(row):
    """The case an earlier output's row measured. A row without `use_cache` was measured before
    `measure.no_cache`, with the cache on, and stands for its case as listed (without the cache):
    kept, and read as measured with it (the truth test reads it so)."""
    return tuple(row[k] for k in FIELDS[:-1]) + (row.get("use_cache", False),)


CASES = [whole(c) for c in CASES]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reuse", help="an earlier output (same torch, transformers and peft): its cases are kept, "
                                    "with peft's trainable count added where it lacks one, and only the others run")
    ap.add_argument("--jobs", type=int, default=1, help="cases measured at once, each in a process of its own")
    args = ap.parse_args()
    import multiprocessing

    import peft
    import transformers
    out = {"about": "peft LoRA steps measured on CPU: scripts/validate/lora_truth.py", "torch": torch.__version__,
           "transformers": transformers.__version__, "peft": peft.__version__, "cases": []}
    earlier = {}
    if args.reuse:
        with open(args.reuse) as f:
            old = json.load(f)
        if any(old[k] != out[k] for k in ("torch", "transformers", "peft")):
            raise SystemExit(f"{args.reuse} was measured with other versions: measure every case anew")
        for c in old["cases"]:
            # A row measured before cases named their variant: the one its config carries.
            c.setdefault("variant", variant_of(c["family"], c["config"]))
            c.setdefault("attention", attention_of(c["family"]))
            c.setdefault("target_seq", None)
        earlier = {earlier_case(c): c for c in old["cases"]}
    todo = [c for c in CASES if c not in earlier]
    fresh = {}

    def row(c):
        if c in fresh:
            return fresh[c]
        r = earlier[c]
        if "trainable_parameters" not in r:
            r["trainable_parameters"] = trainable(c[0], c[1], c[3], c[6], c[7], c[8])
        return r

    # Each case in a process of its own, so one case's caches cannot change another's; the
    # output written as each arrives, in CASES' order.
    with multiprocessing.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
        for c, r in case_table.measured(todo, measured, "config", pool.imap):
            fresh[c] = r
            out["cases"] = [row(x) for x in CASES if x in fresh or x in earlier]
            with open(args.out, "w") as f:
                json.dump(out, f, indent=1)
    out["cases"] = [row(x) for x in CASES]
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)

if __name__ == "__main__":
    main()
