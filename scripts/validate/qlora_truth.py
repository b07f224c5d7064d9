#!/usr/bin/env python3
"""QLoRA's steps as `python -m headroom_gpu record --qlora RANK` records them (fake tensors,
CUDA's bitsandbytes rules: `headroom_gpu.qlora`), for the planner's replay of the recorded QLoRA
templates (`data/programs/hf-qlora.tpl`): at model dimensions, depths, shapes and ranks the
templates were not recorded at (they were at a hidden size of 768, 12 heads of 80 over 4
key-value heads, BLOOM's and BERT's 12 of 64, T5's 12 of 80, an MLP of 704, a vocabulary of
4096, five layers (T5: five a stack), 2x56, 2x88 and 3x56 tokens, rank 22). BERT is trained as
a masked LM and T5 as a sequence-to-sequence LM, the heads `record --qlora` gives them. Each
family's first case is recorded again without checkpointing (`record --qlora --no-checkpoint`),
against the templates recorded without it; `QV_CASES` with the adapters on the query and value
projections alone (`record --qlora --lora-targets qv`), against the `qlora-qv` templates, and
`FULL_QV_CASES` so without checkpointing, against the `full/qlora-qv` templates.

Each case is `transformers_step.record` — the code `record --qlora` runs — with the recorder
noting the phase each allocation and free happens in: the second step's live peak (every
tensor alive, weights and optimizer state included) per phase, the forward, the backward and
the optimizer step (with `zero_grad`), as `Program::step_peaks` reads a plan. The second step's
forward holds what the first's loss holds (`record` keeps `loss` until the next forward's
replaces it); the plan's first step has none of it, so the test reads the plan's third. Every
case is a check row: nothing in the templates is fitted to them (`cargo test -p headroom-plan
--test qlora_truth` compares).

    PYTHONPATH=python /work/venv-torch/bin/python scripts/validate/qlora_truth.py --out data/validation/qlora_fake_truth.json
    PYTHONPATH=python /work/venv-torch/bin/python scripts/validate/qlora_truth.py --only qwen3 --out data/validation/qlora_fake_truth.json
    PYTHONPATH=python /work/venv-torch/bin/python scripts/validate/qlora_truth.py --only gpt2 --checkpoint off --out data/validation/qlora_fake_truth.json
    PYTHONPATH=python /work/venv-torch/bin/python scripts/validate/qlora_truth.py --only llama --targets qv --out data/validation/qlora_fake_truth.json
    PYTHONPATH=python /work/venv-torch/bin/python scripts/validate/qlora_truth.py --checkpoint off --targets qv --out data/validation/qlora_fake_truth.json
    PYTHONPATH=python /work/venv-torch/bin/python scripts/validate/qlora_truth.py --variants --out data/validation/qlora_fake_truth.json
    PYTHONPATH=python /work/venv-torch/bin/python scripts/validate/qlora_truth.py --ungrouped --out data/validation/qlora_fake_truth.json
    PYTHONPATH=python /work/venv-torch/bin/python scripts/validate/qlora_truth.py --ungrouped --only qwen2 --out data/validation/qlora_fake_truth.json
    PYTHONPATH=python /work/venv-torch/bin/python scripts/validate/qlora_truth.py --precisions --out data/validation/qlora_fake_truth.json

`UNGROUPED_CASES` have every head its own key-value head, whose fp32 attention (QLoRA's) a GPU
runs on the memory-efficient kernel: against the `.../bf16/sdpa/...` templates recorded so.
`PRECISION_CASES` are QLoRA under autocast (`--dtype amp`) and computing in fp32 (`--dtype fp32`):
against the `.../amp-cuda/...` and `.../fp32/...` templates.
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import case_table  # noqa: E402

# (family, config, layers, batch, seq, rank): chosen before any comparison, every one away from
# the recording's dimensions, depth (5), shapes and rank (22); the first two at widths whose
# heads share key-value heads in a power-of-two ratio, as Llama 3's and Mistral's do.
CASES = [
    ("llama", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64,
               "intermediate_size": 2816, "vocab_size": 8000}, 6, 1, 256, 16),
    ("llama", {"hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
               "intermediate_size": 5632, "vocab_size": 32000}, 4, 2, 128, 64),
    ("llama", {"hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
               "intermediate_size": 1408, "vocab_size": 4096}, 8, 4, 64, 8),
    ("mistral", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64,
                 "intermediate_size": 3584, "vocab_size": 8000}, 5, 2, 96, 32),
    # Qwen2-0.5B's widths (its query as wide as the hidden size, biases on the query, key and value).
    ("qwen2", {"hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2, "head_dim": 64,
               "intermediate_size": 4864, "vocab_size": 8000}, 6, 1, 200, 16),
    # A head of 128, the query twice the hidden size, as Qwen3's small models have.
    ("qwen3", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
               "intermediate_size": 3072, "vocab_size": 8000}, 5, 2, 64, 8),
    # Phi-3's fused qkv_proj and gate_up_proj, every head its own key-value head, as Phi-3-mini's.
    ("phi3", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 64,
              "intermediate_size": 2816, "vocab_size": 8000, "pad_token_id": 0}, 4, 2, 128, 16),
    # Every layer sparse, with a shared expert, as the catalog reads Qwen2-MoE.
    ("qwen2_moe", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64,
                   "intermediate_size": 2816, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 2048,
                   "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
                   "qkv_bias": True, "use_sliding_window": False, "vocab_size": 8000}, 6, 2, 80, 8),
    # One key-value head of 256 and tied embeddings, as Gemma-2B's.
    ("gemma", {"hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
               "intermediate_size": 4096, "vocab_size": 8000, "tie_word_embeddings": True}, 6, 1, 192, 8),
    # Eight experts, two a token, as Mixtral-8x7B's.
    ("mixtral", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64,
                 "intermediate_size": 1792, "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 8000,
                 "sliding_window": None}, 4, 1, 128, 16),
    # Every layer sparse, with no shared expert, as the catalog reads Qwen3-MoE.
    ("qwen3_moe", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128,
                   "intermediate_size": 3072, "moe_intermediate_size": 384, "num_experts": 16,
                   "num_experts_per_tok": 4, "decoder_sparse_step": 1, "mlp_only_layers": [],
                   "use_sliding_window": False, "vocab_size": 8000}, 4, 2, 64, 8),
    # ALiBi, the query, key and value fused, heads of 128 and tied embeddings, as BLOOM-7b1's.
    ("bloom", {"hidden_size": 1024, "n_layer": 5, "n_head": 8, "vocab_size": 8000, "tie_word_embeddings": True},
     5, 2, 96, 16),
    # Sliding and global layers in turn, logits soft-capped, tied embeddings, as Gemma-2-9B's.
    ("gemma2", {"hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 128,
                "intermediate_size": 4096, "vocab_size": 8000, "sliding_window": 4096, "query_pre_attn_scalar": 128,
                "tie_word_embeddings": True}, 6, 1, 160, 8),
    # GPT-2's fused c_attn (a Conv1D) and learned positions, its output layer tied as every GPT-2's
    # is, SDPA given its causal mask (memory-efficient attention's logsumexp padded to 32
    # positions: 100 is not a multiple).
    ("gpt2", {"n_embd": 1024, "n_head": 16, "n_layer": 6, "n_positions": 4096, "vocab_size": 8000,
              "tie_word_embeddings": True}, 6, 2, 100, 16),
    # Gemma 3's query and key norms, one key-value head of 256, five sliding layers to one global
    # (its default pattern) and a window the sequence passes, its output layer tied, as
    # Gemma-3-1B's.
    ("gemma3_text", {"hidden_size": 640, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                     "intermediate_size": 2048, "vocab_size": 8000, "sliding_window": 64,
                     "query_pre_attn_scalar": 256, "tie_word_embeddings": True}, 7, 1, 150, 8),
    # GPT-NeoX's fused query_key_value, a quarter of each head rotated and parallel residuals,
    # untied, as Pythia's.
    ("gpt_neox", {"hidden_size": 1024, "num_attention_heads": 8, "intermediate_size": 4096, "vocab_size": 8000,
                  "rotary_pct": 0.25, "use_parallel_residual": True}, 5, 3, 72, 32),
    # A masked LM (peft's plain PeftModel), its masked-LM head's transform adapted too, heads of 64
    # and the decoder tied to the embeddings, as bert-large's.
    ("bert", {"hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 4096, "vocab_size": 8000,
              "tie_word_embeddings": True}, 4, 2, 128, 16),
    # A sequence-to-sequence LM (peft's SEQ_2_SEQ_LM): v1.0's ReLU MLP, its `wo` kept a full fp32
    # layer (`_keep_in_fp32_modules`), the decoder's cross-attention adapted, tied, at t5-large's
    # widths (16 heads of 64, the query as wide as the hidden size, an MLP of 4,096).
    ("t5", {"d_model": 1024, "num_heads": 16, "d_kv": 64, "d_ff": 4096, "num_layers": 4, "num_decoder_layers": 4,
            "feed_forward_proj": "relu", "vocab_size": 8000, "tie_word_embeddings": True,
            "decoder_start_token_id": 0, "pad_token_id": 0}, 4, 1, 160, 8),
]
# QLoRA without checkpointing (`prepare_model_for_kbit_training(model, use_gradient_checkpointing=
# False)`, `record --qlora --no-checkpoint`), checked against the `.../full/qlora-all` templates:
# each family's first case above, unchanged, chosen before those templates were recorded.
NO_CHECKPOINT = list({c[0]: c for c in reversed(CASES)}.values())[::-1]
# QLoRA on the query and value projections (`record --qlora --lora-targets qv`, peft's default
# targets for the family: a fused query-key-value layer one adapter), checked against the
# `.../ckpt/qlora-qv` templates: (family, config, layers, batch, seq, rank), chosen before those
# templates were recorded, at widths, depths, shapes and ranks neither they nor the cases above
# use.
QV_CASES = [
    # Grouped key-value heads four to one, as Llama 3's.
    ("llama", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64,
               "intermediate_size": 3584, "vocab_size": 8000}, 6, 2, 112, 16),
    # A hidden size of 1,280 over 20 heads of 64 and 4 key-value heads.
    ("mistral", {"hidden_size": 1280, "num_attention_heads": 20, "num_key_value_heads": 4, "head_dim": 64,
                 "intermediate_size": 3456, "vocab_size": 8000}, 4, 1, 224, 8),
    # Qwen2-0.5B's widths, biases on the query, key and value.
    ("qwen2", {"hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2, "head_dim": 64,
               "intermediate_size": 4864, "vocab_size": 8000}, 5, 3, 64, 32),
    # A head of 128, the query twice the hidden size.
    ("qwen3", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
               "intermediate_size": 3072, "vocab_size": 8000}, 4, 1, 176, 16),
    # One key-value head of 256, tied embeddings.
    ("gemma", {"hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
               "intermediate_size": 4096, "vocab_size": 8000, "tie_word_embeddings": True}, 5, 2, 96, 16),
    # The fused qkv_proj one adapter.
    ("phi3", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 64,
              "intermediate_size": 2816, "vocab_size": 8000, "pad_token_id": 0}, 5, 1, 160, 8),
    # The fused c_attn (a Conv1D) one adapter, tied.
    ("gpt2", {"n_embd": 1024, "n_head": 16, "n_layer": 5, "n_positions": 4096, "vocab_size": 8000,
              "tie_word_embeddings": True}, 5, 1, 136, 32),
    # The fused query_key_value one adapter, a quarter of each head rotated, untied.
    ("gpt_neox", {"hidden_size": 1024, "num_attention_heads": 8, "intermediate_size": 4096, "vocab_size": 8000,
                  "rotary_pct": 0.25, "use_parallel_residual": True}, 4, 2, 80, 16),
    # Eight experts, two a token: their stacks frozen (bitsandbytes quantizes linear layers alone),
    # no adapter on them. Written at three layers, moved to six before its template was recorded:
    # the plan keeps two layers at each end, so no model of fewer than four plans.
    ("mixtral", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64,
                 "intermediate_size": 1792, "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 8000,
                 "sliding_window": None}, 6, 2, 64, 8),
]
# QLoRA on the query and value projections without checkpointing (`record --qlora --lora-targets
# qv --no-checkpoint`), checked against the `.../full/qlora-qv` templates: (family, config, layers,
# batch, seq, rank), chosen after those templates were recorded and before any case was measured
# against them, at widths, depths, shapes and ranks neither the templates nor the cases above use;
# first the seven families no query-value case covers, then Phi-3, whose checkpointed query-value
# case is the furthest off. Every quantized layer whole blocks of 16,384 (bitsandbytes' rounding
# is checked by the cases above; these check the expansion without recomputation).
FULL_QV_CASES = [
    # A shared expert beside four routed experts of 704, 8 heads of 128 over 2 key-value heads.
    ("qwen2_moe", {"hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
                   "intermediate_size": 2816, "moe_intermediate_size": 704, "shared_expert_intermediate_size": 2816,
                   "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
                   "qkv_bias": True, "use_sliding_window": False, "vocab_size": 8000}, 5, 1, 144, 32),
    # A hidden size of 1,280 over 10 heads of 128 and 2 key-value heads, eight experts of 512.
    ("qwen3_moe", {"hidden_size": 1280, "num_attention_heads": 10, "num_key_value_heads": 2, "head_dim": 128,
                   "intermediate_size": 3456, "moe_intermediate_size": 512, "num_experts": 8,
                   "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
                   "use_sliding_window": False, "vocab_size": 8000}, 4, 3, 48, 16),
    # The fused query_key_value one adapter, 12 heads of 128, ALiBi, tied.
    ("bloom", {"hidden_size": 1536, "n_layer": 4, "n_head": 12, "vocab_size": 8000, "tie_word_embeddings": True},
     4, 1, 200, 8),
    # Sliding and global layers in turn, 8 heads of 128 over 4 key-value heads, tied.
    ("gemma2", {"hidden_size": 1280, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 128,
                "intermediate_size": 3584, "vocab_size": 8000, "sliding_window": 4096, "query_pre_attn_scalar": 128,
                "tie_word_embeddings": True}, 5, 2, 72, 32),
    # Gemma-3-1B's widths (1,152 over 4 heads of 256, one key-value head, an MLP of 6,912), five
    # sliding layers to one global and a window the sequence passes, tied.
    ("gemma3_text", {"hidden_size": 1152, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                     "intermediate_size": 6912, "vocab_size": 8000, "sliding_window": 128,
                     "query_pre_attn_scalar": 256, "tie_word_embeddings": True}, 7, 2, 160, 16),
    # A masked LM at 8 heads of 64 on 512, six layers, tied.
    ("bert", {"hidden_size": 512, "num_attention_heads": 8, "intermediate_size": 2048, "vocab_size": 8000,
              "tie_word_embeddings": True}, 6, 4, 64, 8),
    # A sequence-to-sequence LM at t5-small's widths (8 heads of 64 on 512, v1.0's ReLU MLP of
    # 2,048, its `wo` fp32), five layers a stack, tied.
    ("t5", {"d_model": 512, "num_heads": 8, "d_kv": 64, "d_ff": 2048, "num_layers": 5, "num_decoder_layers": 5,
            "feed_forward_proj": "relu", "vocab_size": 8000, "tie_word_embeddings": True,
            "decoder_start_token_id": 0, "pad_token_id": 0}, 5, 2, 96, 16),
    # The fused qkv_proj one adapter, 20 heads of 64 on 1,280, each its own key-value head.
    ("phi3", {"hidden_size": 1280, "num_attention_heads": 20, "num_key_value_heads": 20, "head_dim": 64,
              "intermediate_size": 3456, "vocab_size": 8000, "pad_token_id": 0}, 6, 2, 64, 16),
]
# QLoRA's base stored otherwise than QLoRA's NF4 with double quantization (`record --qlora
# --base-weights fp4`, `--double-quant off`), against the templates replayed with the same storage
# (`headroom plan --base-weights fp4`, `--double-quant off`): (family, config, layers, batch, seq,
# rank, checkpoint, quant type, double quantization), chosen before any was recorded, at widths,
# depths, shapes and ranks neither the templates nor the cases above use (every weight whole
# blocks of 64).
VARIANT_CASES = [
    # Heads of 128 over a hidden size of 1,536, three query heads a key-value head.
    ("llama", {"hidden_size": 1536, "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 128,
               "intermediate_size": 4096, "vocab_size": 8000}, 5, 1, 192, 16, True, "nf4", False),
    ("llama", {"hidden_size": 1536, "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 128,
               "intermediate_size": 4096, "vocab_size": 8000}, 5, 1, 192, 16, True, "fp4", True),
    # Qwen2-0.5B's widths, without checkpointing.
    ("qwen2", {"hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2, "head_dim": 64,
               "intermediate_size": 4864, "vocab_size": 8000}, 4, 2, 96, 8, False, "nf4", False),
    # One key-value head of 256, tied embeddings.
    ("gemma", {"hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
               "intermediate_size": 4096, "vocab_size": 8000, "tie_word_embeddings": True}, 5, 1, 160, 8, True,
     "nf4", False),
    ("gemma", {"hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
               "intermediate_size": 4096, "vocab_size": 8000, "tie_word_embeddings": True}, 5, 1, 160, 8, True,
     "fp4", True),
]
# QLoRA of models whose every head is its own key-value head (Llama 2's, Gemma-7B's,
# Qwen1.5-MoE's), whose fp32 attention a GPU runs on the memory-efficient kernel, checked against
# the `.../bf16/sdpa/...` templates recorded so (the grouped families' math-path recordings are
# `.../bf16/sdpa-math/...`): (family, config, layers, batch, seq, rank, checkpoint, targets),
# chosen before any was measured, at widths, depths, shapes and ranks the templates and the
# cases above do not use.
UNGROUPED_CASES = [
    # Llama 2's layout at 20 heads of 64 on 1,280, the query and value adapted, no checkpointing
    # (Llama-2-7B's `--lora-targets qv` plan).
    ("llama", {"hidden_size": 1280, "num_attention_heads": 20, "num_key_value_heads": 20, "head_dim": 64,
               "intermediate_size": 3456, "vocab_size": 8000}, 5, 2, 96, 16, False, "qv"),
    # 16 heads of 64 on 1,024, every linear layer adapted, checkpointed.
    ("llama", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 64,
               "intermediate_size": 2752, "vocab_size": 8000}, 6, 1, 224, 8, True, "all"),
    # Gemma-7B's layout: heads of 256, each its own key-value head, the query wider than the
    # hidden size (8 heads on 1,024; Gemma-7B's 16 on 3,072), tied, no checkpointing.
    ("gemma", {"hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 256,
               "intermediate_size": 4096, "vocab_size": 8000, "tie_word_embeddings": True}, 5, 1, 128, 16, False,
     "all"),
    # Qwen1.5-MoE's layout: 16 heads of 64 over 16, a shared expert beside the routed ones,
    # checkpointed, the query and value adapted.
    ("qwen2_moe", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 64,
                   "intermediate_size": 2816, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 2048,
                   "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
                   "qkv_bias": True, "use_sliding_window": False, "vocab_size": 8000}, 5, 2, 64, 16, True, "qv"),
    # Added with the `sdpa` QLoRA templates of Qwen2, Mistral, Qwen3, Mixtral and Qwen3-MoE, chosen
    # before any was measured. Qwen1.5's layout (Qwen1.5-7B's 32 heads of 128 over 32, biases on the
    # query, key and value) at 10 heads of 128 on 1,280, every linear layer adapted, checkpointed.
    ("qwen2", {"hidden_size": 1280, "num_attention_heads": 10, "num_key_value_heads": 10, "head_dim": 128,
               "intermediate_size": 3456, "vocab_size": 8000}, 6, 1, 208, 16, True, "all"),
    # Qwen1.5-0.5B's heads (16 of 64 over 16 on 1,024), the query and value adapted, no checkpointing.
    ("qwen2", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 64,
               "intermediate_size": 2816, "vocab_size": 8000}, 4, 2, 120, 8, False, "qv"),
    # Mistral's code at 12 heads of 128 over 12 on 1,536, every linear layer adapted, no checkpointing.
    ("mistral", {"hidden_size": 1536, "num_attention_heads": 12, "num_key_value_heads": 12, "head_dim": 128,
                 "intermediate_size": 4096, "vocab_size": 8000}, 4, 1, 168, 32, False, "all"),
    # Qwen3's query and key norms, heads of 128 (the query twice the hidden size) over 16,
    # checkpointed, the query and value adapted.
    ("qwen3", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 128,
               "intermediate_size": 3072, "vocab_size": 8000}, 6, 2, 104, 8, True, "qv"),
    # Eight experts, two a token, 16 heads of 64 over 16, every linear layer adapted, no
    # checkpointing.
    ("mixtral", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 64,
                 "intermediate_size": 1792, "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 8000,
                 "sliding_window": None}, 5, 1, 184, 16, False, "all"),
    # Every layer sparse, no shared expert, 8 heads of 128 over 8 on 1,024, checkpointed, the query
    # and value adapted.
    ("qwen3_moe", {"hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 128,
                   "intermediate_size": 3072, "moe_intermediate_size": 384, "num_experts": 8,
                   "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
                   "use_sliding_window": False, "vocab_size": 8000}, 4, 3, 40, 16, True, "qv"),
]
# QLoRA at the other precisions `record --qlora` records (`--dtype amp`: the step under
# `torch.autocast("cuda", torch.bfloat16)`, as `Trainer(bf16=True)` runs it; `--dtype fp32`:
# `bnb_4bit_compute_dtype=torch.float32`), checked against the `.../amp-cuda/...` and `.../fp32/...`
# templates (`data/programs/hf-qlora-amp.tpl`, `hf-qlora-fp32.tpl`): (family, config, layers, batch,
# seq, rank, checkpoint, precision[, targets]), chosen before any was measured and before the templates they
# check were all recorded, at widths, depths, shapes and ranks neither the templates nor the cases
# above use; the tolerance is the other QLoRA rows' 3%.
PRECISION_CASES = [
    # Llama 3's layout (16 heads of 64 over 4 key-value heads) under autocast, checkpointed.
    ("llama", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64,
               "intermediate_size": 2816, "vocab_size": 8000}, 6, 2, 96, 16, True, "amp"),
    # Llama 2's layout (every head its own key-value head) under autocast: the same fused kernel.
    ("llama", {"hidden_size": 1280, "num_attention_heads": 20, "num_key_value_heads": 20, "head_dim": 64,
               "intermediate_size": 3456, "vocab_size": 8000}, 5, 1, 160, 8, True, "amp"),
    # Mistral's code, 8 heads of 128 over 2, under autocast, checkpointed.
    ("mistral", {"hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
                 "intermediate_size": 3584, "vocab_size": 8000}, 4, 2, 72, 32, True, "amp"),
    # fp32 compute over Llama 3's layout (16 heads of 64 over 8), checkpointed: SDPA's math path.
    ("llama", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64,
               "intermediate_size": 2816, "vocab_size": 8000}, 5, 2, 80, 32, True, "fp32"),
    # The query and value projections' adapters alone (`--lora-targets qv`), against the
    # `…/qlora-qv` templates: chosen before those templates were recorded and before any was
    # measured. Llama 3's layout under autocast, checkpointed.
    ("llama", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64,
               "intermediate_size": 2816, "vocab_size": 8000}, 4, 1, 176, 8, True, "amp", "qv"),
    # Mistral's code, 8 heads of 128 over 2, under autocast without checkpointing.
    ("mistral", {"hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
                 "intermediate_size": 3584, "vocab_size": 8000}, 6, 2, 64, 16, False, "amp", "qv"),
    # fp32 compute over 16 heads of 64 over 8, checkpointed: SDPA's math path.
    ("llama", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64,
               "intermediate_size": 2816, "vocab_size": 8000}, 6, 1, 200, 32, True, "fp32", "qv"),
]
# Families recorded with eager attention: transformers has no SDPA path for BLOOM, and Gemma-2's
# steps are recorded eager alone (the planner runs them eager whatever is asked); T5's cases were
# recorded eager before its SDPA steps were, and are planned with eager asked (a case written
# with `attention` says which it ran).
EAGER = {"bloom", "gemma2", "t5"}


def phased():
    from headroom_gpu.recorder import StepRecorder

    class Phased(StepRecorder):
        """The recorder, with the step and phase each event happens in."""

        def __init__(self, **kw):
            # The CPU's dropout, as the templates are recorded and `qlora_truth`'s replay on the
            # CPU device plans them: noise in the input's dtype, not CUDA's one-byte mask.
            super().__init__(cuda_dropout=False, **kw)
            self.phases = []

        def _sync(self):
            # A free can take an allocation back (a gradient sum made in place): one phase an event.
            del self.phases[len(self.events):]
            self.phases += [self._when()] * (len(self.events) - len(self.phases))

        def _seen(self, t):
            super()._seen(t)
            self._sync()

        def _freed(self, rec):
            super()._freed(rec)
            self._sync()

    return Phased


def peaks(rec, step=2):
    """{phase: live peak} of step `step`, a phase holding at least what it began with."""
    total, out, current = 0, {}, None
    for (kind, st), when in zip(rec.events, rec.phases):
        phase = when.split(".")[1] if when.startswith(f"step{step}.") else None
        if phase != current:
            current = phase
            if phase:
                out[phase] = max(out.get(phase, 0), total)
        total += st.size if kind == "alloc" else -st.size
        if phase and kind == "alloc":
            out[phase] = max(out[phase], total)
    return out


def case(family, fields, layers, batch, seq, rank, checkpoint=True, targets="all", quant_type="nf4",
         double_quant=True, precision="bf16"):
    from headroom_gpu import transformers_step

    config = {"model_type": family, "num_hidden_layers": layers, "max_position_embeddings": 4096,
              "tie_word_embeddings": False, **fields}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "config.json")
        with open(path, "w") as f:
            json.dump(config, f)
        original = transformers_step.StepRecorder
        transformers_step.StepRecorder = phased()
        try:
            attention = "eager" if family in EAGER else "sdpa"
            rec = transformers_step.record(transformers_step.StepSpec(model=path, batch=batch, seq=seq, qlora=rank,
                                                                      qlora_checkpoint=checkpoint, steps=2,
                                                                      attention=attention, lora_targets=targets,
                                                                      qlora_quant_type=quant_type,
                                                                      qlora_double_quant=double_quant,
                                                                      dtype=precision))
        finally:
            transformers_step.StepRecorder = original
    p = peaks(rec)
    return {"family": family, "config": config, "layers": layers, "batch": batch, "seq": seq, "rank": rank,
            "checkpoint": checkpoint, "attention": attention, **({"targets": targets} if targets != "all" else {}),
            **({"quant_type": quant_type} if quant_type != "nf4" else {}),
            **({"double_quant": False} if not double_quant else {}),
            **({"precision": precision} if precision != "bf16" else {}),
            "peak_bytes": max(p.values()), "phases": p, "assumptions": rec.assumptions}


def case_key(c):
    """A recorded case's family, config (less what `case` adds), depth, shape, rank, checkpointing
    and targets."""
    fields = {k: v for k, v in c["config"].items()
              if k not in ("model_type", "num_hidden_layers", "max_position_embeddings", "tie_word_embeddings")
              or k == "tie_word_embeddings" and v}
    return (c["family"], json.dumps(fields, sort_keys=True), c["layers"], c["batch"], c["seq"], c["rank"],
            c.get("checkpoint", True), c.get("targets", "all"))


def identity(c):
    """What tells a recorded case from every other: `case_key`, the base's storage and the
    precision."""
    return case_key(c) + (c.get("quant_type", "nf4"), c.get("double_quant", True), c.get("precision", "bf16"))


def in_place(old, cases):
    """`cases` in the order of `old` (a case recorded again where it was), then the new ones."""
    fresh = {identity(c): c for c in cases}
    out = [fresh.pop(identity(c)) for c in old if identity(c) in fresh]
    return out + list(fresh.values())


def _ungrouped(c):
    """Whether a recorded case is a row of UNGROUPED_CASES."""
    return case_key(c) in {(f, json.dumps(fields, sort_keys=True), *rest) for f, fields, *rest in UNGROUPED_CASES}


# The cases recorded by a switch of their own (`--variants`, `--ungrouped`, `--precisions`): their
# rows, what a row's fields after the rank name (`case`'s arguments), and which recorded cases are
# theirs. A run of the other cases keeps them from --out.
SWITCHED = {
    "variants": (VARIANT_CASES, ("checkpoint", "quant_type", "double_quant"),
                 lambda c: "quant_type" in c or "double_quant" in c),
    "ungrouped": (UNGROUPED_CASES, ("checkpoint", "targets"), _ungrouped),
    "precisions": (PRECISION_CASES, ("checkpoint", "precision", "targets"), lambda c: "precision" in c),
}


def switched_case(kind):
    """`case` for a row of the `kind` group of SWITCHED."""
    names = SWITCHED[kind][1]
    return lambda c: case(*c[:6], **dict(zip(names, c[6:])))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", help="comma-separated families: their cases recorded again, the others' kept from --out")
    ap.add_argument("--checkpoint", choices=("on", "off", "both"), default="both",
                    help="the cases with checkpointing (CASES), without (NO_CHECKPOINT), or both (default); "
                         "with --only, the other kind's cases of those families are kept from --out")
    ap.add_argument("--targets", choices=("all", "qv", "both"), default="both",
                    help="the cases with adapters on every linear layer (CASES, NO_CHECKPOINT), on the query and "
                         "value projections (QV_CASES with checkpointing, FULL_QV_CASES without), or both (default); "
                         "with --only, the others are kept from --out")
    ap.add_argument("--variants", action="store_true",
                    help="record VARIANT_CASES alone (FP4, no double quantization; with --only, those families'), the "
                         "other cases kept from --out")
    ap.add_argument("--precisions", action="store_true",
                    help="record PRECISION_CASES alone (AMP and fp32 compute; with --only, those families'), the other "
                         "cases kept from --out")
    ap.add_argument("--ungrouped", action="store_true",
                    help="record UNGROUPED_CASES alone (every head its own key-value head; with --only, those "
                         "families'), the other cases kept from --out")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    kinds = {"on": [True], "off": [False], "both": [True, False]}[args.checkpoint]
    targets = {"all": ["all"], "qv": ["qv"], "both": ["all", "qv"]}[args.targets]
    import bitsandbytes
    import peft
    import torch
    import transformers

    switch = next((k for k in SWITCHED if getattr(args, k)), None)
    partial = switch or only or len(kinds) < 2 or len(targets) < 2
    cases, old = [], []
    if partial and os.path.exists(args.out):
        with open(args.out) as f:
            old = json.load(f)["cases"]
        if switch:
            # That group's cases (with --only, those families') recorded again, every other kept.
            mine = SWITCHED[switch][2]
            cases = [c for c in old if not mine(c) or only and c["family"] not in only]
        else:
            cases = [c for c in old
                     if any(mine(c) for _, _, mine in SWITCHED.values()) or only and c["family"] not in only
                     or c.get("checkpoint", True) not in kinds or c.get("targets", "all") not in targets]
    elif switch:
        raise SystemExit(f"qlora_truth: --{switch} records one group into an existing --out; {args.out} is missing")
    groups = ((CASES, True, "all"), (NO_CHECKPOINT, False, "all"), (QV_CASES, True, "qv"), (FULL_QV_CASES, False, "qv"))
    todo = [] if switch else [
        (c, checkpoint, t) for group, checkpoint, t in groups
        if checkpoint in kinds and t in targets for c in group if not only or c[0] in only]
    cases += [r for _, r in case_table.measured(todo, lambda x: case(*x[0], checkpoint=x[1], targets=x[2]),
                                                 "assumptions")]
    for kind, (rows, _, _) in SWITCHED.items():
        if kind == switch or not partial:
            todo = [c for c in rows if not only or c[0] in only]
            cases += [r for _, r in case_table.measured(todo, switched_case(kind), "assumptions")]
    about = {"about": "QLoRA steps as `record --qlora` records them: scripts/validate/qlora_truth.py",
             "torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
             "bitsandbytes": bitsandbytes.__version__}
    with open(args.out, "w") as f:
        json.dump({**about, "cases": in_place(old, cases)}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
