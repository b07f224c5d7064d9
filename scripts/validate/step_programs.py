#!/usr/bin/env python3
"""What a Hugging Face transformers training job allocates and frees, tensor by tensor, in
order: the step programs `headroom plan` replays through its allocator.

For each family's recording config (`measure.recording_config`: every model dimension a
distinct size) at three layers, this runs the job as a user's script does — the model built
(its key-value cache off, as a training script sets it: `measure.no_cache`),
`torch.optim.AdamW` created, then two steps of forward with the loss, backward, `opt.step()`
and `opt.zero_grad(set_to_none=True)` — under the profiler, and keeps every allocation and
free of the CPU allocator, with the operator that made it, the layer whose module was running
(forward hooks; in the backward, hooks on its output's and input's gradients), and what the
tensor became (a parameter, a gradient, optimizer state, an input). It does this at three shapes (batch x sequence 2x56, 2x88, 3x56) and writes
each tensor's size as a law in the model's dimensions: bytes fixed (a parameter's shape, in
units such as `q*h`), per token, per token x position (eager attention's s x s), per
sequence, per position or per position squared, each a sum of `coefficient x unit product`.
A sequence-to-sequence step (T5) is recorded at four shapes whose decoder has a length of its
own (`TARGET_SHAPES`), and its decoder's tensors are written in that length (`target_law`).

A template has three sections: `setup` (the model and the inputs), `step1` (the first step's
forward and backward) and `step` (a later one's). The optimizer step and `zero_grad` are
left out: the planner makes them for the implementation asked (foreach, fused, for-loop);
the recorded optimizer (AdamW with foreach) is kept apart as `optimizer_check` so a test can
hold the planner's version to it. Each event is `[kind, tensor, layer]`: `a` allocates, `f`
frees, and `layer` is the layer it belongs to (the layer whose module ran, or, outside any,
the layer of the tensor it touches), as `[stack, n]` with n of 0, 1, 2: the planner repeats
the middle layer's events for every layer between the first and the last.

Each dropout's output (its forward's and its backward's) names the tensor it consumed
(`sources`): a step without dropout returns the input itself, and the planner's replay of one
keeps the input alive in the output's place.

Left out and reported: allocations made and freed inside one operator with no operator
inside it (CPU kernels' own scratch: a GPU kernel keeps its own, which the planner adds
where it matters), and tensors of a few bytes (Python numbers wrapped as CPU tensors).

A law is read from bytes at one model, so the recording config must let no two readings give
the same bytes: where heads over key-value heads is an element widths' ratio (8 over 4, 4 over
2), an fp32 key reads as a bf16 query. A recording with a law a tied unit could read as well
(`law_ambiguity.py`) is refused, not written; the grouped families are recorded at 15 heads
over 5 (`GQA`).

Each template also stores what the recorder saw at four layers (`check`): the allocations
and the live peak at one shape, which the planner's expansion of the three-layer template
must reproduce exactly (`cargo test -p headroom-plan program_templates`).

    .venv/bin/python scripts/validate/step_programs.py --out data/programs/hf.tpl
    .venv/bin/python scripts/validate/step_programs.py --only llama,qwen2 --out a.json
    .venv/bin/python scripts/validate/step_programs.py --merge a.json b.json --out data/programs/hf.tpl

`--use-cache` records the training forward with the config's `use_cache` left on (transformers'
default: a `DynamicCache` built, each layer's key and value copied into it) under keys with
`/cache` after the checkpointing (`…/full/cache`, `…/full/cache/lora-all`), merged into
`data/programs/hf-cache.tpl`. The families that fuse the query, key and value (GPT-2, Phi-3,
GPT-NeoX, BLOOM) are recorded so, the planner's `--use-cache` picking the half; checkpointed keys
are left out (transformers turns the cache off under checkpointing):

    PYTHONPATH=python .venv/bin/python scripts/validate/step_programs.py --use-cache --only gpt2/causal-lm/bf16/sdpa/full --lora all,qv --out a.json
    .venv/bin/python scripts/validate/step_programs.py --merge data/programs/hf-cache.tpl a.json --out data/programs/hf-cache.tpl

`--out` and `--merge` take the packed form the planner bundles (`.tpl`) and the recorders' JSON
alike (`template_file.py`; docs/TRACE_FORMAT.md, "Program templates"): a path ending in `.tpl`
is written packed, any other as JSON.

`data/programs/hf.tpl` holds Llama, Qwen2, Qwen3 and GPT-2; `data/programs/hf-families.tpl`
the families recorded since (Mistral, Phi-3, Gemma, Gemma-2, GPT-NeoX, BLOOM, Mixtral,
Qwen3-MoE), one key a run (`--only mistral/causal-lm/bf16/sdpa/full`) merged with `--merge`.
Mixtral and Qwen3-MoE run transformers' default experts implementation (`grouped_mm`): every
tensor of their experts is sized by the tokens times the experts a token, whatever the routing.
`data/programs/hf-more.tpl` holds what was recorded after those: BERT (masked LM), T5 (its
encoder stack recorded as a stack of its own; v1.0's ReLU MLP, tied, the catalog's T5 presets'),
Qwen2-MoE (a shared expert, unit `fs`), Gemma 3's text model, and eager attention for families
recorded with SDPA. `data/programs/hf-variants.tpl` holds the combinations recorded after those
for families the files above hold: eager attention in bf16 with checkpointing and in fp32
(Mistral, Qwen2, Qwen3, GPT-2, GPT-NeoX, Phi-3, Gemma), in bf16 and fp32 (Mixtral, Qwen2-MoE,
Gemma 3) and in bf16 (BERT); AMP (Gemma-2, BLOOM, Qwen2-MoE, Gemma 3, and T5 with either MLP,
with and without checkpointing); fp32 with SDPA's math path (Mixtral, with and without
checkpointing; Gemma and Gemma 3 checkpointed) and with SDPA's fused kernel (Gemma, with and
without checkpointing); checkpointed fp32 (Gemma 3 and Qwen2-MoE with SDPA, Gemma-2, BLOOM) and
checkpointed bf16 (BERT); and, for full fine-tuning's last gaps, eager AMP with and without
checkpointing (Llama, Mistral, Mixtral, Qwen2, Phi-3, Gemma, GPT-2, GPT-NeoX, BERT; BLOOM's
checkpointed), checkpointed eager fp32 (Llama, Mistral, Mixtral, Qwen2, Phi-3, Gemma, GPT-2,
GPT-NeoX), checkpointed AMP with SDPA (Gemma, GPT-NeoX, BERT) and checkpointed eager bf16
(BERT, Mixtral); then each family's own where a job planned from no recording or from the
code it shares (Qwen3 from Qwen2's, Gemma-2 from Gemma's): checkpointed eager bf16 and fp32 for
Gemma 3, Qwen2-MoE and Qwen3-MoE (Qwen3-MoE's without checkpointing too, and its fp32 on SDPA's
math path), AMP under CUDA's policy (`amp-cuda`) eager with and without checkpointing and SDPA
checkpointed for the three, Qwen3's checkpointed eager fp32 and eager AMP, Gemma-2's checkpointed
AMP; one `--only KEY` run each (or several keys a run) merged with `--merge`. T5
is recorded with v1.0's ReLU MLP; `--gated` records it with v1.1's gated MLP (flan-t5, T0, mT5)
under keys with `/gated` after the checkpointing (`…/full/gated`, `…/full/gated/lora-all`):

    .venv/bin/python scripts/validate/step_programs.py --gated --only t5/seq2seq-lm/bf16/eager/full --out a.json

`--untied` with `--gated` records v1.1 as its checkpoints are (flan-t5's, T0's and mT5's config.json
say `tie_word_embeddings: false`): its output layer a weight of its own (`untie_t5`), so the
template plans those models, and a tied one without the head's weight. Without it T5 is tied,
and a tied template plans no untied model. Every `/gated` training key is recorded so: full
fine-tuning, LoRA and QLoRA (whose loader, `headroom_gpu.qlora.build`, unties the head as the
config says), both targets, at bf16, fp32 and under CUDA's autocast (`amp-cuda`), without and
with checkpointing; only the CPU's `amp` keys are tied (the CPU ground truth's T5 is):

    .venv/bin/python scripts/validate/step_programs.py --gated --untied --only t5/seq2seq-lm/fp32/eager/full --lora all --out a.json
    .venv/bin/python scripts/validate/step_programs.py --gated --untied --only t5/seq2seq-lm/bf16/eager/full,t5/seq2seq-lm/bf16/eager/ckpt --qlora qv --out b.json

AMP is recorded twice. `amp` runs the forward under the CPU's autocast, as the CPU ground truth
runs it; `amp-cuda` under CUDA's autocast policy (`headroom_gpu.amp.cuda_autocast`,
`torch.autocast("cuda", torch.bfloat16)` on CPU tensors), as a GPU runs it: CUDA runs `softmax`,
`layer_norm`, `pow` and the losses in fp32 where the CPU keeps a bf16 input's dtype, so T5's
cross-attention probabilities (bf16 scores plus a bf16 zero bias) are fp32 there and bf16
here. A GPU's AMP plan replays `amp-cuda` where it was recorded (T5 v1.0, full and
checkpointed; T5 v1.1 untied, the same; BERT with SDPA, checkpointed too, and eager; GPT-2 and
GPT-NeoX eager, GPT-NeoX's SDPA checkpointed), the T5 and BERT SDPA rows held to an H200 in
docs/VALIDATION.md. It is recorded where a step under CUDA's policy makes other tensors than
under the CPU's: GPT-2's tanh GELU runs in fp32; the CPU's autocast promotes `cat`'s inputs,
copying GPT-NeoX's unrotated query and key part to fp32, CUDA's does not; BERT's eager softmax,
its head's LayerNorm and its loss. Llama, Mistral, Mixtral, Qwen2, Gemma and BLOOM make the same
tensors under both (their softmax and norms run in fp32 by their own casts), and Phi-3 differs by
copies of no elements: their `amp` step plans a GPU too:

    .venv/bin/python scripts/validate/step_programs.py --only t5/seq2seq-lm/amp-cuda/eager/full --out a.json
    .venv/bin/python scripts/validate/step_programs.py --gated --untied --only t5/seq2seq-lm/amp-cuda/eager/full --out a.json

`--lora all,qv` records peft's LoRA step instead (`data/programs/hf-lora.tpl`, keys ending
`/lora-all` or `/lora-qv`), at fp32 and bf16 with SDPA (and its math path at fp32): the model
wrapped by `get_peft_model` with its defaults before the optimizer is made, the base frozen
(parameters with no gradient), the adapters at rank `LORA_RANK`, a size apart from every other
dimension, so the adapters' weights and every tensor as wide as the rank are laws in the unit
`r` and any rank plans:

    .venv/bin/python scripts/validate/step_programs.py --only llama/causal-lm/bf16/sdpa/full --lora all --out a.json
    .venv/bin/python scripts/validate/step_programs.py --only gemma2/causal-lm/bf16/eager/full --lora all --out b.json
    .venv/bin/python scripts/validate/step_programs.py --merge data/programs/hf-lora.tpl a.json b.json --out data/programs/hf-lora.tpl

Eager attention is recorded where transformers has none other (BLOOM) or where the key asks for
it (Gemma-2, whose full training is recorded eager alone; `--attention eager` asked of the others:
`--only mixtral/causal-lm/bf16/eager/full,mixtral/causal-lm/bf16/eager/ckpt --lora all,qv`). peft's "all-linear" wraps a stack of
experts' weights (Mixtral's and Qwen3-MoE's `grouped_mm` experts) with one adapter of rank E x r
over them all: its weights are laws in the unit `Er`. `hf-lora.tpl` holds every linear layer's
adapters (`lora-all`) at bf16 with SDPA for Llama, Qwen2, Qwen3, Mistral, GPT-2, Gemma, Gemma 3,
Phi-3, GPT-NeoX, Mixtral, Qwen2-MoE and Qwen3-MoE, with eager attention for Gemma-2, BLOOM,
Mixtral, Qwen2-MoE, Qwen3-MoE and (merged into `data/programs/hf-lora-eager.tpl`, as `hf-lora.tpl`
nears 2 MiB) Llama, Qwen2, Qwen3, Mistral, GPT-2, Gemma, Phi-3, GPT-NeoX, BERT and Gemma 3 (`--only
phi3/causal-lm/bf16/eager/full,phi3/causal-lm/bf16/eager/ckpt --lora all,qv`; both targets), each without and with full checkpointing; at fp32 for Llama, Qwen2,
Qwen3, Mistral and GPT-2, on SDPA's math path (`--only llama/causal-lm/fp32/sdpa-math/full`) for
Llama, Mistral, Qwen2, Qwen3, Mixtral, Gemma and Gemma 3, each checkpointed too; with SDPA for
Phi-3 (checkpointed too), Gemma, GPT-NeoX and Qwen2-MoE, checkpointed for GPT-2 and Llama, eager for BLOOM
and Gemma-2 (checkpointed too) and (into `data/programs/hf-lora-fp32.tpl`) Llama, GPT-2, Mistral, Qwen2, Phi-3 and Gemma, checkpointed too; and the query and value projections' (`lora-qv`) at bf16 for Llama, Qwen2, Qwen3, Mistral, GPT-2, GPT-NeoX, Phi-3, Gemma, BLOOM, Gemma-2, Gemma 3,
Mixtral, Qwen2-MoE and Qwen3-MoE, each without and with full checkpointing, and at fp32 on SDPA's math path
(`--only llama/causal-lm/fp32/sdpa-math/full --lora qv`) for Llama, Qwen2, Qwen3, Mistral, Gemma, Gemma 3,
Mixtral and Phi-3, and with SDPA (`--only gpt2/causal-lm/fp32/sdpa/full --lora qv`, merged into
`data/programs/hf-lora-fp32.tpl`, as `hf-lora.tpl` nears 2 MiB) for GPT-2, Phi-3, Gemma, Qwen2-MoE,
GPT-NeoX and Llama, on SDPA's math path for Qwen3-MoE and eager for BLOOM, Gemma-2, Llama, GPT-2, Mistral, Qwen2, Phi-3 and Gemma (into that file too),
each checkpointed too (a fused query-key-value layer wrapped whole: peft's default target for GPT-2, GPT-NeoX and BLOOM,
`QV_TARGETS`' for Phi-3 and the MoE families, which peft has no default for). BERT (a masked LM: peft has no task type for one, so a plain
`PeftModel`; SDPA) and T5 (`SEQ_2_SEQ_LM`; eager, and with SDPA in `hf-t5-sdpa.tpl`, below) at bf16,
at fp32 and with full checkpointing at both precisions, with both targets (T5 with v1.0's MLP, and with `--gated --untied`
v1.1's as its checkpoints are, its output layer its own);
and with eager attention asked at fp32 (into `hf-lora-fp32.tpl`, both targets,
checkpointed too) for Gemma 3, GPT-NeoX, Mixtral, Qwen2-MoE, Qwen3-MoE, Qwen3 and BERT
(`--only bert/masked-lm/fp32/eager/full,bert/masked-lm/fp32/eager/ckpt --lora all,qv`): "all-linear" wraps BERT's masked-LM head's transform and T5's decoder's
cross-attention, and peft's default targets for them are BERT's `query` and `value` and T5's
`q` and `v` (its cross-attention's too).

LoRA under AMP (a model loaded in fp32, peft's adapters fp32 over it, the forward under bf16
autocast: `Trainer(bf16=True)`) is recorded where an AMP key is asked by name, under CUDA's
autocast policy (`amp-cuda`, the key a GPU's AMP job looks up first), into
`data/programs/hf-lora-amp.tpl` (keys `…/amp-cuda/…/lora-all` and `…/lora-qv`):

    PYTHONPATH=python .venv/bin/python scripts/validate/step_programs.py --only llama/causal-lm/amp-cuda/sdpa/full,llama/causal-lm/amp-cuda/sdpa/ckpt --lora all,qv --out a.json
    .venv/bin/python scripts/validate/step_programs.py --merge data/programs/hf-lora-amp.tpl a.json --out data/programs/hf-lora-amp.tpl

Autocast casts a frozen fp32 weight to bf16 at every matmul, uncached (its cache keeps the casts
of weights that require a gradient alone), and the matmul keeps the copy for its backward:
without checkpointing every layer's bf16 copy of its weights lives until the backward, as on a
GPU. Recorded, both targets, without and with full checkpointing: Llama, Qwen2, Mistral, Qwen3,
Gemma, Gemma 3, Phi-3, GPT-2, GPT-NeoX, Mixtral, Qwen2-MoE and Qwen3-MoE with SDPA, BLOOM,
Gemma-2, T5 v1.0 and T5 v1.1 (`--gated --untied`: T0's and mT0's) eager and BERT with SDPA.
With eager attention asked of the families
recorded with SDPA (`…/amp-cuda/eager/…`), into `data/programs/hf-lora-amp-eager.tpl`: Llama,
Mistral, Mixtral, Qwen2, Phi-3, Gemma, GPT-2, GPT-NeoX, BERT, Qwen3, Gemma 3, Qwen2-MoE and
Qwen3-MoE, every family recorded with SDPA, both targets, without and with full checkpointing
(a fused query-key-value layer recorded with the model's cache off, as every training step here
is):

    PYTHONPATH=python .venv/bin/python scripts/validate/step_programs.py --only mistral/causal-lm/amp-cuda/eager/full,mistral/causal-lm/amp-cuda/eager/ckpt --lora all --out a.json

No `amp` (the CPU's autocast) LoRA step is recorded: a CPU's AMP LoRA plan passes to the next
builder.

The last step's loss is held while the profiler runs (`steps` returns it), as a script's `loss`
is held until the next forward's replaces it: what its graph keeps after the backward (under
checkpointing, the leaf `enable_input_require_grads` makes of the input embeddings' output, and
its `.grad`) is never freed in the recorded step, and the planner holds it as long as the job's
loop keeps its loss (`headroom plan --loss-lives`). The first step's pair, freed in the second
step's forward where the new loss takes the name, is kept in `step1` as held there, its free left
out (`held_into_step2`), so the plan's first step makes it as the job's does and frees it where
the job's loop lets its loss go. Templates recorded before 2026-11-30 left it out as living from
one step into the next (`left_out` counted two such tensors); checkpointed LoRA steps recorded
while `steps` let the loss go inside the profile left out both steps' pairs (four) and planned
the optimizer step about 1% low on CPU. T5's graph holds three such leaves, each with its
`.grad` (the encoder's and the decoder's input embeddings' outputs, and the cross-attention's
zero position bias T5Attention makes require a gradient under checkpointing): six a step.

`--qlora all` records QLoRA's step instead (`data/programs/hf-qlora.tpl`, keys ending
`/bf16/sdpa/ckpt/qlora-all`, or `/bf16/eager/ckpt/qlora-all` where the recordings have no SDPA
path (BLOOM; T5's SDPA is in `hf-t5-sdpa.tpl`, below) or the key asks for eager attention
(`--only gemma2/causal-lm/bf16/eager/ckpt`);
eager attention asked of a family recorded with SDPA goes to `data/programs/hf-qlora-eager.tpl`,
as `hf-qlora.tpl` nears 2 MiB (`--only llama/causal-lm/bf16/eager/full,llama/causal-lm/bf16/eager/ckpt`,
then `--qlora qv`: the four keys each of Llama, Qwen2, Mistral, Gemma, Phi-3, GPT-2, GPT-NeoX,
Qwen3, Gemma 3, BERT, Mixtral, Qwen2-MoE and Qwen3-MoE);
QLoRA's SDPA runs in fp32, so a family with grouped key-value heads (`GQA_FAMILIES`) is recorded
under `/bf16/sdpa-math/` over grouped heads (a GPU's math path) and under `/bf16/sdpa/` with every
head its own key-value head (the memory-efficient kernel; `qlora_programs.py`);
`/full/qlora-all` without checkpointing, as `prepare_model_for_kbit_training(model,
use_gradient_checkpointing=False)` sets it up;
BERT as a masked LM, T5 as a sequence-to-sequence LM, each with peft's task type for it): peft's
LoRA over bitsandbytes' NF4 base as `python -m headroom_gpu record --qlora` runs it, under fake
tensors with CUDA's rules, since bitsandbytes has no CPU kernels for CUDA's path
(`qlora_programs.py` reads that recording into the tensors and events below). `--qlora qv` records
it with the adapters on the query and value projections alone (keys ending `/qlora-qv`), the
targets the LoRA steps' `lora-qv` have (`QV_TARGETS` where peft has no default; the same table as
`headroom_gpu.qlora.QV_TARGETS`):

    PYTHONPATH=python .venv/bin/python scripts/validate/step_programs.py --only llama --qlora all --out data/programs/hf-qlora.tpl
    PYTHONPATH=python .venv/bin/python scripts/validate/step_programs.py --only llama/causal-lm/bf16/sdpa/full --qlora all --out a.json
    PYTHONPATH=python .venv/bin/python scripts/validate/step_programs.py --only llama/causal-lm/bf16/sdpa/ckpt --qlora qv --out b.json
    PYTHONPATH=python .venv/bin/python scripts/validate/step_programs.py --merge data/programs/hf-qlora.tpl a.json --out data/programs/hf-qlora.tpl

QLoRA at fp32 compute (`…/fp32/…`) and under AMP (`…/amp-cuda/…`: bf16 compute under CUDA's
autocast, `Trainer(bf16=True)`) is recorded where `--only` names the key, into
`data/programs/hf-qlora-fp32.tpl` and `data/programs/hf-qlora-amp.tpl` (at fp32 SDPA's math path,
`sdpa-math`, over grouped heads and the memory-efficient kernel, `sdpa`, over ungrouped ones;
under autocast a fused kernel over grouped heads, no `sdpa-math`). `amp-cuda`, every linear layer
(`qlora-all`): checkpointed, every family of the plan sweep (Llama, Mistral, Qwen2, Mixtral,
Gemma, Phi-3, GPT-2, GPT-NeoX and BERT with SDPA and eager, BLOOM and T5 eager; T5's SDPA below); without
checkpointing, the same. `fp32`:
checkpointed, SDPA (`sdpa-math` for Llama, Mistral, Qwen2 and Mixtral; `sdpa` for Gemma, Phi-3, GPT-2,
GPT-NeoX and BERT) and eager (Llama, Qwen2, Mistral, Mixtral, Gemma, Phi-3, GPT-2, GPT-NeoX, BERT,
BLOOM and T5); without checkpointing, Llama, Mistral, Qwen2 and Mixtral (`sdpa-math` and eager),
Gemma, Phi-3, GPT-2, GPT-NeoX and BERT (`sdpa` and eager), BLOOM and T5 (eager). The query and
value projections (`--qlora qv`, `qlora-qv`): every key above under AMP and at fp32. Then every
family's own where a job planned from no recording or from the code it shares, both targets,
with and without checkpointing: at fp32 Gemma on SDPA's math path (Gemma-2B's one key-value head),
Gemma-2 eager, Gemma 3, Qwen3 and Qwen3-MoE on the math path and eager, Qwen2-MoE with SDPA and
eager; under AMP Gemma-2 eager, Gemma 3, Qwen3, Qwen2-MoE and Qwen3-MoE with SDPA and eager.
Several keys a run, one file each precision:

    PYTHONPATH=python .venv/bin/python scripts/validate/step_programs.py --only gemma/causal-lm/amp-cuda/sdpa/full,gemma/causal-lm/amp-cuda/eager/full --qlora all --out a.json
    .venv/bin/python scripts/validate/step_programs.py --merge data/programs/hf-qlora-amp.tpl a.json --out data/programs/hf-qlora-amp.tpl

T5 with SDPA (`t5/seq2seq-lm/PRECISION/sdpa/...`, `data/programs/hf-t5-sdpa.tpl`): transformers 5.24
runs T5's attention through SDPA (its default since transformers#47014), its relative position
bias the mask, so a GPU runs the memory-efficient kernel (`headroom_gpu.sdpa`: a mask, no grouped
heads), which keeps the output, the bias and a log-sum-exp where eager keeps each head's scores
and probabilities. The CPU runs SDPA with a mask that requires a gradient (the full fine-tuning's,
whose bias trains) on its math path, so the step is recorded as a GPU runs it (`ROUTED_SDPA`,
`gpu_sdpa`): each call routed by the GPU's rule onto the kernel's CPU stand-in
(`efficient_on_cpu`: its outputs and gradients allocated as CUDA allocates them, the log-sum-exp
padded to 32 positions, `tok32`/`ttok32`, the bias's gradient to 16 columns, `tok_s16`, `ttok_t16`,
`ttok_s16`); QLoRA's recorder routes it so under fake tensors. Every training key T5 has eager is
recorded with SDPA too, v1.0 tied and v1.1 (`--gated --untied`) untied, but the CPU's `amp`,
recorded on the CPU's own kernel (a CPU job's):

    T=t5/seq2seq-lm; K=$T/fp32/sdpa/full,$T/fp32/sdpa/ckpt,$T/bf16/sdpa/full,$T/bf16/sdpa/ckpt,$T/amp-cuda/sdpa/full,$T/amp-cuda/sdpa/ckpt
    PYTHONPATH=python .venv/bin/python scripts/validate/step_programs.py --only $K,$T/amp/sdpa/full,$T/amp/sdpa/ckpt --out a.json
    PYTHONPATH=python .venv/bin/python scripts/validate/step_programs.py --only $K --lora all,qv --out b.json
    PYTHONPATH=python .venv/bin/python scripts/validate/step_programs.py --only $K --qlora all --out c.json
    (and each again with --gated --untied; --qlora qv)
    .venv/bin/python scripts/validate/step_programs.py --merge a.json b.json c.json ... --out data/programs/hf-t5-sdpa.tpl
"""

import argparse
import contextlib
import importlib
import json
import os
import re
import sys

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import efficient_on_cpu  # noqa: E402
import infer_recipes  # noqa: E402
import measure  # noqa: E402
import template_file  # noqa: E402
from layer_marks import hook_layers, layer_pattern, layer_tag  # noqa: E402
from law_ambiguity import law_rivals, shared_widths  # noqa: E402
from per_head_laws import head_law, relaw  # noqa: E402

sys.path.insert(0, os.path.join(__file__.rsplit("/", 1)[0], "..", "..", "python"))
from headroom_gpu import amp as cuda_amp  # noqa: E402

# AMP recorded under CUDA's autocast policy (`headroom_gpu.amp.cuda_autocast`): the step a GPU
# runs, where `amp` is the CPU's autocast (its `softmax`, `layer_norm`, `pow` and losses keep a
# bf16 input's dtype, where CUDA's run them in fp32). The planner plans a GPU's AMP job with
# the `amp-cuda` template where one is recorded, a CPU's with `amp`.
AMP_CUDA = "amp-cuda"


def cuda_policy():
    """`headroom_gpu.amp.cuda_autocast()` over ATen's operators alone: transformers imports
    torchvision, whose `nms` and `roi_align` have CPU autocast kernels of their own, outside
    `aten` (CUDA's autocast registers theirs in torchvision too, and no model here calls them)."""
    ops = cuda_amp._cpu_autocast_ops()
    cuda_amp._cpu_autocast_ops = lambda: frozenset(n for n in ops if n.startswith("aten::"))
    return cuda_amp.cuda_autocast()

SHAPES = ((2, 56), (2, 88), (3, 56))
# Recorded at five layers: the first two and the last two as they are, the middle one repeated
# for every layer between (what a layer does may reach two layers back: transformers frees a
# layer's output only after the next one has run).
LAYERS = 5
EDGE = 2
CHECK_LAYERS = 7
# Allocations of at most this many bytes that no law explains are Python numbers the CPU wraps
# as tensors (on a GPU they stay on the host).
TINY = 8

DECODERS = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "mixtral", "qwen3_moe", "gpt2", "gpt_neox",
            "bloom", "qwen2_moe", "gemma3_text")


# The transformers package of a model type whose code lives under another name.
CODE = {"gemma3_text": "gemma3"}


# Set (by `--gated`) to record T5 with v1.1's gated MLP, under keys with `/gated` after the checkpointing.
GATED_T5 = "STEP_PROGRAMS_GATED_T5"
# Set (by `--untied`, with `--gated`) to record T5 v1.1 as its checkpoints are (flan-t5's, T0's,
# mT5's): its output layer a weight of its own (`untie_t5`), the decoder's output unscaled.
UNTIED_T5 = "STEP_PROGRAMS_UNTIED_T5"
# Set (by `--use-cache`) to record the training forward with the config's `use_cache` left on,
# transformers' default, under keys with `/cache` after the checkpointing (and T5's `/gated`).
USE_CACHE = "STEP_PROGRAMS_USE_CACHE"


# Grouped key-value heads recorded as 15 heads of 40 over 5 key-value heads, at a hidden size of
# 240 (a multiple of the heads: Gemma-2's, Gemma 3's and Phi-3's configs refuse another; no power
# of two takes an odd count). Every width the layers make must be told apart by its size
# (`law_ambiguity.py` refuses a recording where two readings give the same bytes): with a
# power-of-two ratio of heads to key-value heads (8 over 4, 4 over 2: Llama's and the Gemma
# families' templates until 2026-11-29) an fp32 key is as large as a bf16 query; with 4
# key-value heads (12 over 4: the other grouped families' until then) a key is four heads wide,
# so half a bf16 key (rotate_half's) reads as an fp32 head; with a head as wide as the heads'
# count in fp32 (48 = 12 x 4) a per-head mean is half a head. Among 15, 5 and 40 no ratio is
# one of element widths, and 5 key-value heads put a key's per-head fp32 statistics (20 bytes a
# token) above the few bytes a token read as bytes.
GQA = {"hidden_size": 240, "num_attention_heads": 15, "num_key_value_heads": 5, "head_dim": 40}
GQA_FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "phi3", "mixtral", "qwen3_moe", "qwen2_moe", "gemma", "gemma2",
                "gemma3_text")
# No small multiple of the hidden size, the heads' widths or the vocabulary, nor half or twice one.
MLP_WIDTH = 1184
# Experts recorded as 9, 7 of them per token, each 352 wide: the router's tensors a token
# (its logits, E wide; the chosen experts' weights and indices, k wide) more than 16 bytes at
# 2 bytes an element and more, and apart from the heads' (15) and key-value heads' (5) counts and widths, and an
# expert's fused gate and up projection (2 f) apart from the tokens' expert activations (k f),
# which are equal at k = 2. transformers' default experts implementation (`grouped_mm`) sizes
# every tensor by the tokens times k, whatever the routing: the sizes are laws in batch and
# sequence.
MOE = {"mixtral": {"num_local_experts": 9, "num_experts_per_tok": 7, "intermediate_size": 352},
       "qwen3_moe": {"num_experts": 9, "num_experts_per_tok": 7, "moe_intermediate_size": 352},
       # Qwen2-MoE's shared expert 608 wide: no small multiple or half of another width.
       "qwen2_moe": {"num_experts": 9, "num_experts_per_tok": 7, "moe_intermediate_size": 352,
                     "shared_expert_intermediate_size": 608}}


def refuse_rivals(lw, d, what):
    """Refuses a law the recording's dimensions `d` cannot tell from another (`law_ambiguity.py`):
    right at the recording's heads, it would be wrong on a model with other head ratios."""
    rival = law_rivals(lw, d)
    if rival:
        kind, mine, others = rival[0]
        raise Unexplained(f"{what}: its {kind} law {mine} reads as well as {others} at {d['heads']} heads over "
                          f"{d.get('kv_heads')} of {d.get('d')}: record it at heads whose ratios no element "
                          f"widths share (law_ambiguity.py)")


def config(family, layers):
    cfg = dict(measure.recording_config(family)) if family in measure_families() else extra_config(family)
    if family in GQA_FAMILIES:
        # Phi-3 fuses the query, key and value projections: with half as many key-value heads
        # as heads its output (q + 2 kv) would be 2 q wide, with these it is `qkv` alone.
        cfg.update(GQA)
    if family in ("gemma", "gemma2", "gemma3_text", "gpt_neox"):
        # An MLP four times the hidden size (the small configs') makes an fp32 copy of a
        # bf16 hidden state as wide as half the MLP's activations: an MLP width of its own.
        cfg.update({"intermediate_size": MLP_WIDTH})
    if family == "bert":
        # Its small config's MLP is four times the hidden size and its position table twice it:
        # an fp32 copy of a bf16 hidden state (peft's adapters' input) would be as wide as half
        # the MLP's activations, or a position a token. Widths of their own.
        cfg.update({"intermediate_size": MLP_WIDTH, "max_position_embeddings": 1000})
    cfg.update(MOE.get(family, {}))
    for k in ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers"):
        if k in cfg:
            cfg[k] = layers
    if family == "gemma3_text":
        # Sliding layers, the last one global: both of transformers' masks are made, and the
        # layers repeated are sliding ones, as five of every six of Gemma 3's are.
        cfg["layer_types"] = ["sliding_attention"] * (layers - 1) + ["full_attention"]
    if family == "t5":
        # T5 v1.0's MLP (one ReLU projection in: the catalog's t5-base, t5-large and t5-3b), or
        # with `--gated` v1.1's gated pair (flan-t5, T0, mT5); tied unless `--untied`. Read from
        # the environment: each recording runs in a process of its own (`isolated`).
        cfg["feed_forward_proj"] = "gated-gelu" if os.environ.get(GATED_T5) else "relu"
        if os.environ.get(UNTIED_T5):
            # `T5Config` reads the flag as v1.1's config.json says it: no scaling of the
            # decoder's output before the output layer.
            cfg["tie_word_embeddings"] = False
    return cfg


def untie_t5(model):
    """T5 v1.1's output layer, a weight of its own. transformers 5 builds every T5 tied
    (`T5Config` sets `tie_word_embeddings`), and unties it only when a checkpoint holds both
    weights with different values, as v1.1's (flan-t5's, T0's, mT5's) do: made here as loading
    one leaves it, a parameter beside the embeddings."""
    model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone())
    model.all_tied_weights_keys.pop("lm_head.weight", None)


def measure_families():
    return {f for f, _ in measure.small_configs()}


def extra_config(family):
    """Recording configs of families the CPU ground truth does not measure yet."""
    llama = measure.recording_config("llama")
    if family == "qwen3":
        return dict(llama, model_type="qwen3", num_key_value_heads=2, use_sliding_window=False)
    if family == "qwen3_moe":
        # Every layer sparse (decoder_sparse_step 1, no mlp_only_layers), as the catalog reads it.
        return dict(llama, model_type="qwen3_moe", num_key_value_heads=2, decoder_sparse_step=1,
                    mlp_only_layers=[], use_sliding_window=False)
    if family == "qwen2_moe":
        # Every layer sparse, as the catalog reads it; attention with biases, as Qwen2's.
        return dict(llama, model_type="qwen2_moe", num_key_value_heads=2, decoder_sparse_step=1,
                    mlp_only_layers=[], use_sliding_window=False, qkv_bias=True)
    if family == "gemma3_text":
        # A window shorter than the recorded sequences, so the sliding layers' mask is made.
        return dict(model_type="gemma3_text", hidden_size=256, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=96, intermediate_size=1024, vocab_size=4096,
                    max_position_embeddings=2048, sliding_window=32, query_pre_attn_scalar=96)
    if family == "gemma2":
        return dict(model_type="gemma2", hidden_size=256, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=96, intermediate_size=1024, vocab_size=4096,
                    max_position_embeddings=2048, sliding_window=4096, query_pre_attn_scalar=96)
    raise SystemExit(f"no recording config for {family}")


ANNOTATION = re.compile(r"setup|step\d\.\w+|layer:\w+:\d+|repeat_kv|dropout\.pair")
# Operators whose CPU kernels keep scratch of their own, made and dropped inside one call.
# `aten::histc` (a mixture of experts' tokens per expert, transformers' grouped experts) keeps
# its bin edges and one histogram per intra-op thread, so the recording would follow the
# recording machine's thread count; CUDA's histc allocates only its output.
# The memory-efficient kernel's CPU stand-in (`efficient_on_cpu`) works in the math path's
# scratch, which a GPU's kernel keeps in registers and shared memory.
CPU_KERNELS = ("aten::_scaled_dot_product_flash_attention_for_cpu",
               "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
               "aten::histc") + efficient_on_cpu.OPERATORS
CPU_GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def allocations(prof, marks=ANNOTATION):
    """The allocator's events of a profile in time order, each (time, ptr, size, ops): `ops` the
    operators it happened inside, outermost first, each (name, node id), less the ranges `marks`
    names (a recording's own marks are no operators: `cpu_scratch` reads the innermost one)."""
    allocs = []

    def walk(node, ops):
        if node.tag == _EventType.Allocation:
            a = node.extra_fields
            allocs.append((node.start_time_ns, a.ptr, a.alloc_size, ops))
            return
        if node.tag == _EventType.TorchOp and not marks.fullmatch(node.name):
            ops = ops + [(node.name, id(node))]
        for c in node.children:
            walk(c, ops)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root, [])
    allocs.sort(key=lambda a: a[0])
    return allocs


def cpu_scratch(made, freed):
    """Whether a tensor made inside the operators `made` and freed inside `freed` (`allocations`'
    stacks) is a CPU kernel's own scratch, which the templates leave out: made and dropped inside
    one call of such a kernel, or inside one matrix multiply with no operator below it (a 16-bit
    GEMM's packed operands, whose size follows the CPU's blocking, not the shapes; cuBLAS on a GPU
    works in the workspace the planner adds)."""
    return any(name in CPU_KERNELS and (name, n) in freed for name, n in made) \
        or (bool(made) and made[-1][0] in CPU_GEMMS and freed[-1:] == made[-1:])


# What a tensor made under these operators is, for the planner's GPU rules: SDPA's fused
# kernel (its outputs replaced by the GPU kernel's), dropout (a GPU keeps a one-byte mask).
KERNEL_TAGS = (("sdpa", re.compile(r"aten::_scaled_dot_product_\w*attention\w*|ScaledDotProduct\w*Backward")),
               ("dropout", re.compile(r"aten::dropout|aten::native_dropout\w*|aten::bernoulli_?|NativeDropoutBackward\w*")))


class DropoutSources:
    """Which tensor each dropout consumed, in call order: `(input's storage, output's storage)`
    for the forward, and for its backward the gradient handed to it and the one it made.
    Without dropout (a rate of 0, or eval mode) `F.dropout` returns its input itself, and the
    backward passes the gradient through: a replay of a dropout-free step keeps the input (the
    gradient) alive as long as the recorded output was, since what saved the output saves the
    input in its place (T5's `wo` saves its MLP's activation). `F.dropout` is wrapped while
    this is entered (`nn.Dropout` and T5's attention call it through the module, so a
    checkpointed layer's recomputation is seen too)."""

    def __init__(self):
        self.pairs = []
        self._dropout = None

    def __enter__(self):
        self._dropout = torch.nn.functional.dropout
        inner = self._dropout

        def dropout(input, *args, **kwargs):
            out = inner(input, *args, **kwargs)
            if isinstance(out, torch.Tensor) and out is not input:
                self._pair(input, out)
                if out.grad_fn is not None:
                    out.grad_fn.register_hook(self._backward)
            return out

        torch.nn.functional.dropout = dropout
        return self

    def __exit__(self, *exc):
        torch.nn.functional.dropout = self._dropout

    def _backward(self, grad_inputs, grad_outputs):
        if grad_inputs[0] is not None:
            self._pair(grad_outputs[0], grad_inputs[0])

    def _pair(self, given, made):
        """`made` came of `given`: the pair, and a mark in the profile when (the output is the
        tensor live at its storage then)."""
        self.pairs.append((storage_ptr(given), storage_ptr(made)))
        with record_function("dropout.pair"):
            pass


def storage_ptr(t):
    """The address of `t`'s storage, with no storage object made: one made of a gradient in the
    backward outlives it (the storage keeps it for Python) and holds the storage, which then never
    takes autograd's sum in place (`InputBuffer::accumulate` wants a storage `use_count` of 1);
    the residual's gradient that a dropout's backward is handed is the first of such a sum."""
    return t.data_ptr() - t.storage_offset() * t.element_size()


def steps(model, inputs, opt, precision, attn, grads):
    """Two steps as a user's script runs them: forward with the loss (under autocast for AMP),
    backward, `opt.step()`, `opt.zero_grad(set_to_none=True)`; each step's gradients' storages
    into `grads`. Returns the last step's loss, for the caller to hold while the profiler runs,
    as a script's `loss` is held until the next forward's replaces it: what its graph keeps after
    the backward (under checkpointing, the leaf `enable_input_require_grads` makes of the input
    embeddings' output, and its `.grad`) is never freed in the recorded step, which the planner
    reads as held by the loss, for as long as the job's loop keeps it (`--loss-lives`). Freed as
    `steps` returned, it would read as living from one step into the next and be left out."""
    for step in (1, 2):
        with record_function(f"step{step}.forward"), sdpa_backend(attn):
            if precision == "amp":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = model(**inputs).loss
            elif precision == AMP_CUDA:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(**inputs).loss
            else:
                loss = model(**inputs).loss
        with record_function(f"step{step}.backward"), sdpa_backend(attn):
            loss.backward()
        grads[step] = {p.grad.untyped_storage().data_ptr(): i
                       for i, (_, p) in enumerate(model.named_parameters()) if p.grad is not None}
        with record_function(f"step{step}.optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
    return loss


class Job:
    """One recorded run: every allocation and free in time order, and what each tensor became."""

    def __init__(self, family, head, precision, attn, checkpointing, batch, seq, layers, adapters=None, target=None):
        shape = f"{batch}x{seq}" + (f"->{target}" if target else "")
        self.what = f"{key(family, head, precision, attn, checkpointing, adapters)} {shape} L{layers}"
        cfg = config(family, layers)
        if attn == "sdpa":
            # A GPU's fused SDPA kernels drop out inside the kernel (its random state is two
            # numbers): no mask. The CPU takes the math path for SDPA with dropout, so the
            # fused kernel is recorded without it; `sdpa-math` and eager keep it.
            for k in ("attn_pdrop", "attention_dropout", "attention_probs_dropout_prob"):
                if k in cfg or family in ("gpt2", "bert"):
                    cfg[k] = 0.0
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        kernel = "sdpa" if attn.startswith("sdpa") else attn
        torch.manual_seed(0)
        grads = {}
        sources = DropoutSources()
        # The modules that call `repeat_kv` imported before `repeats_marked` patches them: the
        # model's code and SDPA's integration are otherwise imported when the model is first
        # built, inside the recording, and their copies of keys and values go unmarked.
        for module in ("transformers.integrations.sdpa_attention",
                       f"transformers.models.{CODE.get(family, family)}.modeling_{CODE.get(family, family)}"):
            importlib.import_module(module)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, \
                infer_recipes.repeats_marked(), sources:
            with record_function("setup"):
                model = measure.build(cfg, head, kernel, dtype, dropout=True)
                if not os.environ.get(USE_CACHE):
                    measure.no_cache(model)
                if family == "t5" and os.environ.get(UNTIED_T5):
                    untie_t5(model)
                if adapters:
                    model = lora_model(model, head, *adapters)
                if checkpointing:
                    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                hook_layers(model, family)
                opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
                inputs = measure.inputs(cfg, head, batch, seq, target)
            # CUDA's policy for the whole of each step: a checkpointed layer's forward, run again
            # in the backward under the autocast state it saved, casts as a GPU's does too.
            policy = cuda_policy() if precision == AMP_CUDA else contextlib.nullcontext()
            routed = gpu_sdpa(self.what) if family in ROUTED_SDPA and attn == "sdpa" and precision != "amp" \
                else contextlib.nullcontext()
            with policy, routed:
                held = steps(model, inputs, opt, precision, attn, grads)
        # The last loss let go once the profiler has stopped (`steps`).
        del held
        pattern = layer_pattern(family)
        self.params = []
        for name, p in model.named_parameters():
            name = name.removeprefix(PEFT_PREFIX)
            hit = re.match(pattern.pattern + r"\.", name)
            layer = [("enc" if hit.group(1) == "encoder" else "main"), int(hit.group(2))] if hit else None
            self.params.append({"name": name, "shape": list(p.shape), "bytes": p.element_size(), "layer": layer,
                                "ptr": p.untyped_storage().data_ptr()})
        self.dims = dims(model.get_base_model() if adapters else model, cfg)
        if adapters:
            self.dims["r"] = adapters[0]
            if any(re.search(r"\.experts\b.*\.lora_A\.", p["name"]) for p in self.params):
                # peft's LoRA on a stack of experts' weights (E x out x in) is one adapter of
                # rank E x r over them all: its A and B as wide as `Er`.
                self.dims["Er"] = self.dims["E"] * adapters[0]
        self.grads = grads
        persistent = {p["ptr"]: ("param", i) for i, p in enumerate(self.params)}
        persistent.update({b.untyped_storage().data_ptr(): ("buffer", None) for b in model.buffers()})
        persistent.update({t.untyped_storage().data_ptr(): ("input", None) for t in inputs.values()})
        persistent.update({v.untyped_storage().data_ptr(): ("state", None) for st in opt.state.values()
                           for v in st.values() if isinstance(v, torch.Tensor) and v.dim() > 0})
        self._read(prof, persistent, sources.pairs)

    def _read(self, prof, persistent, dropouts):
        events = list(prof.profiler.kineto_results.events())
        self.ranges = sorted(((layer_tag(e.name()), e.start_ns(), e.end_ns()) for e in events
                              if e.name().startswith("layer:")), key=lambda r: r[2] - r[1])
        self.sections = [(e.name(), e.start_ns(), e.end_ns()) for e in events
                         if e.name() == "setup" or re.fullmatch(r"step\d\.\w+", e.name())]
        repeats = [(e.start_ns(), e.end_ns()) for e in events if e.name() == "repeat_kv"]
        allocs = allocations(prof)
        self.tensors, self.events, live = [], [], {}
        # Each dropout's pair, at its mark: the tensors live at their storages then.
        marks = sorted(e.start_ns() for e in events if e.name() == "dropout.pair")
        if len(marks) != len(dropouts):
            raise Unexplained(f"{len(dropouts)} dropouts, {len(marks)} marks of them in the profile")
        pending = list(zip(marks, dropouts))[::-1]

        def paired(until):
            while pending and pending[-1][0] < until:
                _, (given, made) = pending.pop()
                if made in live and given in live:
                    out = self.tensors[live[made]]
                    out["source"] = live[given]
                    # A dropout's backward's output (the gradient times the noise) is dropout's.
                    out["kernel_hint"] = "dropout"

        for t, ptr, size, ops in allocs:
            paired(t)
            if size > 0:
                live[ptr] = len(self.tensors)
                self.tensors.append({"size": size, "ops": ops, "ptr": ptr, "section": self.section_at(t),
                                     "layer": self.layer_at(t), "freed": None,
                                     "repeat": any(a <= t <= b for a, b in repeats)})
                self.events.append(("a", live[ptr]))
            elif ptr in live:
                i = live.pop(ptr)
                self.tensors[i]["freed"] = {"ops": ops, "section": self.section_at(t), "layer": self.layer_at(t)}
                self.events.append(("f", i))
        step_of = {"step1.backward": 1, "step2.backward": 2}
        for tensor in self.tensors:
            alive = tensor["freed"] is None
            role = persistent.get(tensor["ptr"]) if alive else None
            grad = self.grads.get(step_of.get(tensor["section"]), {}).get(tensor["ptr"])
            if grad is not None and tensor["freed"] and tensor["freed"]["section"].endswith(".optimizer"):
                role = ("grad", grad)
            tensor["role"] = role
            tensor["kernel"] = next((tag for tag, rx in KERNEL_TAGS
                                     if any(rx.fullmatch(name) for name, _ in tensor["ops"])),
                                    tensor.get("kernel_hint"))
            if tensor["repeat"]:
                tensor["kernel"] = "repeat_kv"
            made_by = {name for name, _ in tensor["ops"]}
            if (tensor["kernel"] == "dropout" and "aten::dropout" in made_by
                    and made_by & {"aten::empty_like", "aten::bernoulli_", "aten::bernoulli"}):
                # CPU's dropout keeps its noise in the activations' dtype; a GPU's fused dropout
                # keeps a one-byte mask instead. The noise is made by `aten::empty_like`, which
                # profiles with `aten::empty_strided` beneath it: any operator of the chain.
                tensor["kernel"] = "dropout-mask"
            tensor["scratch"] = bool(tensor["freed"]) and cpu_scratch(tensor["ops"], tensor["freed"]["ops"])

    def section_at(self, t):
        return next((name for name, start, end in self.sections if start <= t <= end), None)

    def layer_at(self, t):
        """(the innermost layer whose module runs at `t` — a recomputed layer's forward runs
        inside its backward — or None, the layer that ran last before `t`)."""
        inside = next((tag for tag, start, end in self.ranges if start <= t <= end), None)
        if inside is not None:
            return inside, inside
        began = next((start for name, start, end in self.sections if start <= t <= end), 0)
        ended = [(end, tag) for tag, start, end in self.ranges if began <= start and end < t]
        return None, (max(ended)[1] if ended else None)


def strays(events):
    """Events of the middle layer between events of layers on one side of it (a free of the
    third layer's tensor after the second layer's backward, when the first layer's input needs
    no gradient: a frozen embedding under LoRA) happen once, not once a replica: each such run
    belongs to the layer before it, which reaches the tensor by its distance."""
    def side(c):
        return None if c is None else (c[0], c[1] < EDGE)

    i = 0
    while i < len(events):
        c = events[i][2]
        if c is None or c[1] != EDGE:
            i += 1
            continue
        end = i
        while end < len(events) and events[end][2] == c:
            end += 1
        before = next((e[2] for e in reversed(events[:i]) if e[2] and e[2][0] == c[0]), None)
        after = next((e[2] for e in events[end:] if e[2] and e[2][0] == c[0]), None)
        if before is not None and after is not None and side(before) == side(after):
            for e in events[i:end]:
                e[2] = before
        i = end


def dims(model, cfg):
    d = infer_recipes.recipes.dims(model, cfg)
    c = model.config
    d["P"] = getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", 0) or 0
    if cfg.get("model_type") == "phi3":
        # Its fused query-key-value projection's width.
        d["qkv"] = d["q"] + 2 * d["kv"]
    if cfg.get("model_type") in ("qwen3_moe", "qwen2_moe"):
        # Qwen's MoE configs name their experts' count and width apart from a dense MLP's.
        d["E"], d["k"], d["f"] = c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size
        d["kf"], d["kh"] = d["k"] * d["f"], d["k"] * d["h"]
    if cfg.get("model_type") == "qwen2_moe":
        d["fs"] = c.shared_expert_intermediate_size
    if cfg.get("model_type") == "t5":
        # Its position bias's rows: a count of its own, read as a coefficient, not a unit.
        d["buckets"] = c.relative_attention_num_buckets
    refuse_shared_widths(d, cfg.get("model_type"))
    return d


def refuse_shared_widths(d, family):
    """Refuses a recording whose head-tied widths are other widths of it (`law_ambiguity.py`): a
    tensor that follows one would read as the other."""
    shared = shared_widths(d, family)
    if shared:
        raise Unexplained(f"{family}: recorded where {', '.join(f'{u} = {v}' for u, v in shared)}, a tensor "
                          "following one reads as the other: record it at a head width of its own "
                          "(law_ambiguity.py's shared_widths)")


@contextlib.contextmanager
def sdpa_backend(attn):
    """`sdpa-math`: SDPA's composite math path, which a GPU takes where no fused kernel
    serves (fp32 with grouped key-value heads): recorded on CPU by asking for it."""
    if attn == "sdpa-math":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel([SDPBackend.MATH]):
            yield
    else:
        yield


# Families whose SDPA the CPU runs on another path than a GPU, recorded as a GPU runs it: T5, whose
# mask is the position bias, trained in a full fine-tuning, where the CPU takes the math path
# and keeps the probabilities, and a GPU the memory-efficient kernel (`efficient_on_cpu`). Not
# under the CPU's autocast (`amp`), whose keys plan a CPU's own AMP step.
ROUTED_SDPA = {"t5"}


@contextlib.contextmanager
def gpu_sdpa(what):
    """SDPA routed by a GPU's rule (`headroom_gpu.sdpa`), after CUDA autocast's casts where its
    policy is active, onto `efficient_on_cpu`'s kernel: the memory-efficient kernel alone, for
    the families of ROUTED_SDPA, whose masks a GPU hands to no other."""
    from headroom_gpu import sdpa
    f = torch.nn.functional
    original = f.scaled_dot_product_attention
    chosen = {}
    with efficient_on_cpu.registered():
        f.scaled_dot_product_attention = cuda_amp.autocast_first(sdpa.routed(original, chosen))
        try:
            yield
        finally:
            f.scaled_dot_product_attention = original
    if set(chosen) != {sdpa.EFFICIENT}:
        raise Unexplained(f"{what}: SDPA ran {chosen}, where a GPU runs the memory-efficient kernel alone")


def key(family, head, precision, attn, checkpointing, adapters=None):
    base = f"{family}/{head}/{precision}/{attn}/{'ckpt' if checkpointing else 'full'}"
    # (rank, targets) for peft's LoRA; (rank, targets, "qlora") over a 4-bit base.
    return f"{base}/{adapters[2] if len(adapters) > 2 else 'lora'}-{adapters[1]}" if adapters else base


# --- adapters -----------------------------------------------------------------------------

# peft's name for the wrapped model, before the model's own parameter names.
PEFT_PREFIX = "base_model.model."
# The rank adapters are recorded at: its multiples (2r, 4r, r/2) are no small multiple of any
# other dimension of the recording configs, so a tensor r wide is told apart by its size.
LORA_RANK = 22


# peft's task type for each head: a sequence-to-sequence LM wrapped as one (its generate and
# its decoder's inputs); peft has none for a masked LM, which is wrapped as a plain PeftModel.
PEFT_TASK = {"causal-lm": "CAUSAL_LM", "seq2seq-lm": "SEQ_2_SEQ_LM", "masked-lm": None}


# The query and value targets of the families peft's table of defaults
# (`TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`) lacks, where `get_peft_model` asks for
# them: the MoE families' `q_proj` and `v_proj`, as their dense kin's defaults are; Phi-3's
# fused `qkv_proj`, as peft's defaults for the other fused families are their fused layer
# (GPT-2's `c_attn`, GPT-NeoX's and BLOOM's `query_key_value`): no adapter can wrap a part of one.
# Mixtral's default (`q_proj`, `v_proj`) is in the table, but peft 0.21 rewrites a Mixtral
# config's targets for transformers 5's fused experts before it fills in the default, leaving
# none (`NoMatchingPeftModuleError`): a user's run names them, as this does.
QV_TARGETS = {"phi3": ["qkv_proj"], "qwen2_moe": ["q_proj", "v_proj"], "qwen3_moe": ["q_proj", "v_proj"],
              "mixtral": ["q_proj", "v_proj"]}


def lora_model(model, head, rank, targets):
    """`model` with peft's LoRA adapters as a user's run makes them (`get_peft_model` with
    its defaults: no dropout, adapters of a 16-bit base autocast to fp32): on every linear
    layer of the blocks (`all`: peft's "all-linear", the output layer left out) or on the
    query and value projections (`qv`: peft's default targets for the family: BERT's `query`
    and `value`, T5's `q` and `v`, GPT-2's fused `c_attn`; `QV_TARGETS` where peft has none)."""
    import peft
    import peft.tuners.lora.torchao
    # peft asks, for every layer it wraps, whether torchao quantized it, and raises where an
    # older torchao is installed beside it; no layer here is torchao's.
    peft.tuners.lora.torchao.is_torchao_available = lambda: False
    # Each adapter made inside its layer's profiler range, as the layers' forward hooks mark
    # them in the step: the adapter's first weights (fp32, cast to the base's dtype, then
    # back to fp32) belong to the layer it adapts.
    create = peft.tuners.lora.LoraModel._create_and_replace
    if not getattr(create, "layered", False):
        def layered(self, config, adapter, target, target_name, parent, current_key, **kw):
            hit = re.search(r"(?:^|\.)(?:(encoder)\.block|decoder\.block|layers|h|layer)\.(\d+)\.", current_key)
            stack = "enc" if hit and hit.group(1) else "main"
            tag = record_function(f"layer:{stack}:{hit.group(2)}") if hit else contextlib.nullcontext()
            with tag:
                return create(self, config, adapter, target, target_name, parent, current_key, **kw)
        layered.layered = True
        peft.tuners.lora.LoraModel._create_and_replace = layered
    qv = QV_TARGETS.get(model.config.model_type)
    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, task_type=PEFT_TASK[head],
                             target_modules="all-linear" if targets == "all" else qv)
    return peft.get_peft_model(model, config)


# --- laws ---------------------------------------------------------------------------------

UNITS = ["h", "f", "q", "kv", "kf", "kh", "heads", "kv_heads", "d", "V", "E", "k", "P", "qkv", "fs", "r", "Er"]
COEFFICIENTS = (1, 2, 3, 4, 6, 8, 12, 16, 5, 10, 24, 32)


def per_unit(nbytes, d, what, widths=(2, 4, 1, 8)):
    """{unit: bytes per unit} for `nbytes` (per token, position or sequence): a small
    multiple of one of the model's dimensions, or bytes (`one`) when no dimension is so small.
    The elements are tried at each of `widths` bytes in turn (the job's own first), so a bf16
    key of kv elements is `kv`, never half of `q` where the recording's q is twice its kv."""
    if nbytes == 0:
        return {}
    if nbytes <= 16:
        return {"one": nbytes}
    for w in widths:
        e = nbytes / w
        if abs(e - round(e)) > 1e-9:
            continue
        # Half a dimension (rotary embeddings' rotate_half) before a multiple.
        for c in (1, 0.5, 2, 3, 4, 5, 6, 8):
            for u in UNITS:
                if d.get(u) and abs(e - c * d[u]) < 1e-6:
                    return {u: float(c * w)}
    for c in COEFFICIENTS:
        for u in UNITS:
            for v in UNITS:
                if d.get(u) and d.get(v) and abs(nbytes - c * d[u] * d[v]) < 1e-6:
                    return {f"{u}*{v}": float(c)}
    # A dimension plus a few bytes (labels shifted by one position are padded by one).
    for c in COEFFICIENTS:
        for u in UNITS:
            rest = nbytes - c * d.get(u, 0)
            if d.get(u) and 0 < rest <= 16:
                return {u: float(c), "one": float(rest)}
    raise Unexplained(f"{what}: {nbytes} bytes fit no unit of {d}")


def widths_of(precision):
    """Element widths to try, the job's own first (AMP computes in bf16)."""
    return (4, 2, 1, 8) if precision == "fp32" else (2, 4, 1, 8)


def position_widths(kind, precision):
    """Widths for a law of `kind`: what the batch shares per position (rotary tables) is
    computed in fp32 whatever the job's precision."""
    return (4, 2, 1, 8) if kind in ("pos", "tpos") else widths_of(precision)


def reclassified(t, precision):
    """A compact template's laws classified again from the bytes they give at the recording's
    dimensions (what `per_unit` now reads them as)."""
    d = t["dims"]
    out = []
    for law in t["laws"]:
        new = {}
        for kind, units in law.items():
            if kind == "fixed" or any("*" in u for u in units):
                new[kind] = units
                continue
            bytes_ = sum(c * (1 if u == "one" else d[u]) for u, c in units.items())
            if kind in PAIR_KINDS:
                new[kind] = units
            else:
                new[kind] = per_unit(bytes_, d, "reclassify", position_widths(kind, precision))
        out.append(new)
    t = dict(t, laws=out, tensors=[list(r) for r in t["tensors"]])
    # `per_unit` reads a bool `_safe_softmax` makes per head (a few bytes a token) as bytes.
    relaw(t)
    return t


# Laws of bytes a pair of positions: the encoder's, the decoder's and the cross-attention's.
PAIR_KINDS = ("tok_s", "pos_s", "ttok_t", "tpos_t", "ttok_s", "tpos_s", "tok_s16", "ttok_t16", "ttok_s16")


class Unexplained(Exception):
    pass


# CUDA's memory-efficient attention (SDPA with a mask) keeps its softmax statistics, the
# logsumexp, fp32 per head for the sequence rounded up to this many positions (`kAlignLSE`).
PAD = 32


def padded_law(sizes, d, what, widths, shapes=SHAPES):
    """`tok32`: bytes per token of each sequence rounded up to PAD positions, where the sizes
    at `shapes` are one such law; None otherwise."""
    per = {n / (b * -(-s // PAD) * PAD) for n, (b, s) in zip(sizes, shapes)}
    if len(per) != 1:
        return None
    return {"tok32": per_unit(per.pop(), d, what, widths)}


# The memory-efficient kernel's gradient of the bias it was handed (T5's position bias, which
# trains) is made with its last dimension, the positions attended to, rounded up to this many
# (`attention_backward.cu`), and sliced back.
PAD_COLUMNS = 16


def padded_pairs(sizes, shapes=SHAPES):
    """`tok_s16`: bytes a token and a position it attends to rounded up to PAD_COLUMNS, where
    the sizes at `shapes` are one such law (bytes a pair, read per head as every pair's is:
    `per_head_laws`); None otherwise."""
    per = {n / (b * s * (-(-s // PAD_COLUMNS) * PAD_COLUMNS)) for n, (b, s) in zip(sizes, shapes)}
    if len(per) != 1:
        return None
    return {"tok_s16": {"one": per.pop()}}


def law(n1, n2, n3, d, param_shapes, what, widths=(2, 4, 1, 8), shapes=SHAPES):
    """A tensor's size seen at the three `shapes` (SHAPES), as {kind: {unit: bytes}} with kind
    `fixed`, `tok` (b x s), `tok_s` (b x s x s), `seq` (b), `pos` (s), `pos_s` (s x s), or,
    where none of those fits, `tok32` (b x s rounded up to PAD) or `tok_s16` (b x s x s, the
    positions attended to rounded up to PAD_COLUMNS)."""
    (b, s1), (_, s2), (b3, _) = shapes
    if n1 == n2 == n3:
        if n1 <= TINY:
            return {"fixed": {"one": float(n1)}}
        for shape, units, coef in param_shapes:
            for w in (2, 4, 1, 8):
                if n1 == w * shape:
                    return {"fixed": {units: float(w * coef)}}
        return {"fixed": per_unit(n1, d, what, widths)}
    grows_b = n3 * b == n1 * b3
    if grows_b or n3 == n1:
        # One law in s, times b or not: s^2, s, or s plus a constant.
        g1, g2 = (n1 / b, n2 / b) if grows_b else (n1, n2)
        kind, kind_s, kind_1 = ("tok", "tok_s", "seq") if grows_b else ("pos", "pos_s", "fixed")
        if g2 * s1 * s1 == g1 * s2 * s2:
            # Bytes a pair; per head or not by what made it (`per_head_laws.head_law`).
            return {kind_s: {"one": g1 / (s1 * s1)}}
        slope = (g2 - g1) / (s2 - s1)
        const = g1 - slope * s1
        # No line in s: the memory-efficient kernel's padded bias gradient, where it is one.
        pairs = grows_b and abs(const) > 64 and padded_pairs((n1, n2, n3), shapes)
        if pairs:
            return pairs
        if slope == 0 and grows_b:
            # The same for every length: per sequence.
            return {kind_1: per_unit(const, d, what, widths)}
        out = {kind: per_unit(slope, d, what, (4, 2, 1, 8) if kind == "pos" else widths)}
        if abs(const) > 1e-9:
            # A few bytes more (labels padded by one) or fewer (T5's decoder inputs: the
            # labels shifted right, one position dropped) than the positions make.
            if abs(const) > 64:
                padded = padded_law((n1, n2, n3), d, what, widths, shapes)
                if padded:
                    return padded
                raise Unexplained(f"{what}: {n1}, {n2}, {n3} bytes at {shapes}: no law")
            out[kind_1] = {"one": const}
        return out
    raise Unexplained(f"{what}: {n1}, {n2}, {n3} bytes at {shapes} grow with the batch in part")


# A sequence-to-sequence job's shapes, (batch, encoder length, decoder length): SHAPES with a
# decoder of its own length, and a fourth shape whose decoder alone is longer, so that each
# tensor's law reads the encoder's length (`s`) and the decoder's (`t`) apart.
TARGET_SHAPES = ((2, 56, 24), (2, 88, 24), (3, 56, 24), (2, 56, 40))

# A law read in the decoder's length, as the kinds the planner reads it by: b x t, b x t x t
# (the decoder's self-attention), t, t x t (its position bias), b x t padded to PAD positions.
TARGET_KINDS = {"tok": "ttok", "tok_s": "ttok_t", "pos": "tpos", "pos_s": "tpos_t", "seq": "seq", "fixed": "fixed",
                "tok32": "ttok32", "tok_s16": "ttok_t16"}


def target_law(sizes, d, param_shapes, what, widths=(2, 4, 1, 8)):
    """A tensor's size seen at the four TARGET_SHAPES, as `law` reads it, in the encoder's
    length (kinds as `law`'s), the decoder's (`ttok`, `ttok_t`, `tpos`, `tpos_t`, `ttok32`: the
    memory-efficient kernel's log-sum-exp over the decoder's queries, `ttok_t16`: its bias
    gradient over them), or both (`ttok_s`: b x t x s, the cross-attention's scores; `tpos_s`:
    t x s, its position bias; `ttok_s16`: b x t x s padded, its bias gradient)."""
    n1, n2, n3, n4 = sizes
    (b, s1, t1), (_, s2, _), (b3, _, _), (_, _, t2) = TARGET_SHAPES
    if n4 == n1:
        return law(n1, n2, n3, d, param_shapes, what, widths, ((b, s1), (b, s2), (b3, s1)))
    if n2 == n1:
        lw = law(n1, n4, n3, d, param_shapes, what, widths, ((b, t1), (b, t2), (b3, t1)))
        return {TARGET_KINDS[k]: v for k, v in lw.items()}
    grows_b = n3 * b == n1 * b3
    if (grows_b or n3 == n1) and n2 * s1 == n1 * s2 and n4 * t1 == n1 * t2:
        per = n1 / (s1 * t1 * (b if grows_b else 1))
        return {("ttok_s" if grows_b else "tpos_s"): {"one": per}}
    # The cross-attention's bias gradient, its encoder positions padded (`padded_pairs`).
    per = {n / (bb * t * (-(-s // PAD_COLUMNS) * PAD_COLUMNS)) for n, (bb, s, t) in zip(sizes, TARGET_SHAPES)}
    if grows_b and len(per) == 1:
        return {"ttok_s16": {"one": per.pop()}}
    raise Unexplained(f"{what}: {sizes} bytes at {TARGET_SHAPES}: no law in the two lengths")


def shape_units(shape, d):
    """A parameter's shape as (coefficient, product of units): (1, "q*h"), or (3, "h*h") for
    GPT-2's fused query-key-value projection (h x 3h), or (32, "heads") for T5's position bias
    (its buckets x heads)."""
    coef, names = 1, []
    for n in shape:
        if n == 1:
            continue
        if n == d.get("buckets"):
            # T5's relative position buckets (32 in every T5 config): a count, no model dimension.
            coef *= n
            continue
        hit = next(((c, u) for c in (1, 2, 3, 4) for u in UNITS if d.get(u) and n == c * d[u]), None)
        if hit is None:
            raise Unexplained(f"a parameter dimension of {n} is no unit of {d}")
        coef *= hit[0]
        names.append(hit[1])
    return coef, "*".join(names) or "one"


# --- templates ----------------------------------------------------------------------------

KEPT_SECTIONS = {"setup": "setup", "step1.forward": "step1", "step1.backward": "step1",
                 "step2.forward": "step", "step2.backward": "step"}


def held_into_step2(t):
    """Whether tensor `t` is what the first step's loss holds after its backward: made in the
    first step and freed in the second step's forward, where the new loss takes the name
    (`loss = model(...).loss`) and the old one's graph goes. Under checkpointing with peft, the
    leaf `enable_input_require_grads` makes of the input embeddings' output and its `.grad` (T5's
    three leaves and theirs). A template keeps it in `step1` as held there, never freed: the
    planner frees it where the job's loop lets its loss go (`--loss-lives`), as it frees the
    later steps' pair (`step`'s, which the recording never frees)."""
    freed = t["freed"]
    return (KEPT_SECTIONS.get(t["section"]) == "step1" and freed is not None
            and freed["section"] == "step2.forward" and not (t["role"] and t["role"][0] == "grad"))


def kept(job):
    """The tensors a template keeps, by index, and why each other one is left out."""
    keep, left = [], {}
    for i, t in enumerate(job.tensors):
        section = KEPT_SECTIONS.get(t["section"])
        freed = t["freed"]
        why = None
        if section is None:
            why = "optimizer"
        elif t["scratch"]:
            why = "CPU kernel scratch"
        elif t["size"] <= TINY and t["role"] is None:
            why = "a Python number"
        elif section != "setup" and t["role"] is None and not any(n.startswith(("aten::", "bitsandbytes::"))
                                                                  for n, _ in t["ops"]):
            # Checkpointing's saved random-number state (a CPU tensor on a GPU too), made under
            # an autograd node or no operator at all.
            why = "made outside any operator"
        elif held_into_step2(t):
            pass
        elif freed and freed["section"] != t["section"] and KEPT_SECTIONS.get(freed["section"]) != section \
                and not (t["role"] and t["role"][0] == "grad") and not (section == "setup"
                                                                        and freed["section"].startswith("step1")):
            why = "lives from one step into the next"
        if why:
            left[i] = why
        else:
            keep.append(i)
    held = [i for i in keep if held_into_step2(job.tensors[i])]
    # The second step's loss holds what the first's did (the recording never frees it): as many
    # tensors, or the first step's pair is something else.
    never = [i for i in keep if job.tensors[i]["freed"] is None and job.tensors[i]["role"] is None
             and KEPT_SECTIONS.get(job.tensors[i]["section"]) == "step"]
    if len(held) != len(never):
        raise Unexplained(f"{job.what}: the first step's loss holds {len(held)} tensors into the second step's "
                          f"forward, the second's {len(never)} past its end")
    return keep, left


def home(job, t):
    """The layer a tensor belongs to: the one whose module made it (or ran last before), or a
    parameter's or gradient's own."""
    tensor = job.tensors[t]
    role = tensor["role"]
    if role and role[0] in ("param", "grad"):
        layer = job.params[role[1]]["layer"]
        return (layer[0], int(layer[1])) if layer else None
    inside, last = tensor["layer"]
    return inside if inside is not None else last


def sequence(job, keep):
    """The kept events by section: [(kind, tensor, layer)]. An event belongs to the layer
    whose module ran; between layers, to the layer that ran last (what happens between two
    layers repeats with them) — except in a run of events between layers that touches
    tensors of three or more layers of a stack (a loop over the layers, such as the frees of
    every layer's cache at the end of the forward), where each belongs to its tensor's layer."""
    keep = set(keep)
    raw = {"setup": [], "step1": [], "step": []}
    for kind, t in job.events:
        if t not in keep:
            continue
        tensor = job.tensors[t]
        if kind == "f":
            section = KEPT_SECTIONS.get(tensor["freed"]["section"])
            if section is None:
                continue  # zero_grad's frees of the gradients: the planner makes them
            if held_into_step2(tensor):
                continue  # the first step's loss goes where the job's loop lets it go: the planner's
            inside, last = tensor["freed"]["layer"]
        else:
            section = KEPT_SECTIONS[tensor["section"]]
            inside, last = tensor["layer"]
        part = (tensor["freed"]["section"] if kind == "f" else tensor["section"]).split(".")[-1]
        raw[section].append([kind, t, inside, last, home(job, t), part])
    out = {}
    for section, events in raw.items():
        i = 0
        while i < len(events):
            if events[i][2] is not None:
                i += 1
                continue
            end = i
            while end < len(events) and events[end][2] is None:
                end += 1
            homes = {}
            for e in events[i:end]:
                if e[4] is not None:
                    homes.setdefault(e[4][0], set()).add(e[4][1])
            loop = any(len(v) >= 3 for v in homes.values())
            for e in events[i:end]:
                e[2] = (e[4] if e[4] is not None else e[3]) if loop else (e[3] if e[3] is not None else e[4])
            i = end
        # Frees with no allocation between them leave the allocator in the same state in any
        # order, and some come in a hash table's order (autocast's cache of weight casts):
        # each such run in one order, by layer and then by when the tensor was made.
        i = 0
        while i < len(events):
            end = i
            while end < len(events) and events[end][0] == "f":
                end += 1
            if end > i + 1:
                events[i:end] = sorted(events[i:end], key=lambda e: (e[5] == "backward", e[2] or ("", -1), e[1]))
            i = max(end, i + 1)
        strays(events)
        out[section] = [(k, t, (c[0], int(c[1])) if c else None) for k, t, c, _, _, _ in events]
        backward = next((i for i, e in enumerate(events) if e[5] == "backward"), len(events))
        out[section + ":backward"] = backward
    return out


def concrete(n, stack, layers, j=None):
    """The layer of a model with `layers` {stack: count} that recorded layer n stands for: the
    first EDGE and the last EDGE as they are, the middle one as replica `j`."""
    if n < EDGE:
        return n
    if n >= LAYERS - EDGE:
        return layers[stack] - (LAYERS - n)
    return j


def expand(events, homes, layers):
    """The events of a template recorded at LAYERS layers a stack, for `layers` {stack: n}
    (at least 2 x EDGE): the middle layer's runs repeated for every layer between the first
    EDGE and the last EDGE (the planner's `synth::hf` does the same). Returns
    [(kind, (tensor, layer))]."""
    middle = EDGE
    out = []
    i = 0
    while i < len(events):
        kind, t, ctx = events[i]
        if ctx is None or ctx[1] != middle:
            out.append((kind, instance(t, homes[t], ctx, None, layers)))
            i += 1
            continue
        stack = ctx[0]
        end = i
        while end < len(events) and events[end][2] == (stack, middle):
            end += 1
        before = next((e[2][1] for e in reversed(events[:i]) if e[2] and e[2][0] == stack and e[2][1] != middle),
                      None)
        after = next((e[2][1] for e in events[end:] if e[2] and e[2][0] == stack and e[2][1] != middle), None)
        ascending = (before is not None and before < middle) or (before is None and after is not None
                                                                  and after > middle)
        replicas = range(EDGE, layers[stack] - EDGE)
        for j in (replicas if ascending else reversed(replicas)):
            for kind, t, ctx in events[i:end]:
                out.append((kind, instance(t, homes[t], ctx, j, layers)))
        i = end
    return out


def instance(t, h, ctx, j, layers):
    """Which instance of tensor `t` (home layer `h`) an event at `ctx` (replica `j` where
    `ctx` is the middle layer) touches: (t, concrete layer or None). Within EDGE layers of
    the event the reference is relative (the layer before, two before); beyond, the recorded
    layer stands for its own concrete layer."""
    if h is None:
        return (t, None)
    stack, n = h
    if ctx is None or ctx[0] != stack or abs(n - ctx[1]) > EDGE:
        if EDGE <= n < LAYERS - EDGE:
            raise Unexplained(f"tensor {t} of a middle layer touched from {ctx}")
        return (t, (stack, concrete(n, stack, layers)))
    here = concrete(ctx[1], stack, layers, j)
    return (t, (stack, here + (n - ctx[1])))


def digest(items):
    """A 64-bit FNV-1a over the decimal text of `items` (the planner computes the same)."""
    h = 0xcbf29ce484222325
    for x in items:
        for byte in f"{x};".encode():
            h ^= byte
            h = (h * 0x100000001b3) % (1 << 64)
    return f"{h:016x}"


def check_of(events, sizes):
    """What the planner's expansion must reproduce: each event's kind and bytes, digested,
    with the count and the live peak."""
    live = peak = 0
    flat = []
    for kind, (t, _) in events:
        n = sizes[t]
        live += n if kind == "a" else -n
        peak = max(peak, live)
        flat += [kind, n]
    return {"events": len(events), "peak": peak, "digest": digest(flat)}


def template(family, head, precision, attn, checkpointing, adapters=None):
    what = key(family, head, precision, attn, checkpointing, adapters)
    # QLoRA's step is recorded by the fake recorder with CUDA's rules (qlora_programs.py).
    cls = qlora_programs().QLoraJob if adapters and adapters[2:] == ("qlora",) else Job
    # A sequence-to-sequence job's decoder at a length of its own (TARGET_SHAPES), so that
    # its laws read the two lengths apart; QLoRA's fake recorder runs one length.
    two_lengths = head == "seq2seq-lm" and cls is Job
    shapes = TARGET_SHAPES if two_lengths else SHAPES
    jobs = [isolated(cls, family, head, precision, attn, checkpointing, *shape[:2], LAYERS, adapters, *shape[2:])
            for shape in shapes]
    deep = isolated(cls, family, head, precision, attn, checkpointing, *shapes[0][:2], CHECK_LAYERS, adapters,
                    *shapes[0][2:])
    base = jobs[0]
    keeps = [kept(j) for j in jobs]
    if len({len(k) for k, _ in keeps}) != 1:
        raise Unexplained(f"{what}: the step allocates {[len(k) for k, _ in keeps]} tensors at {shapes}")
    d = base.dims
    param_shapes = []
    params = []
    for p in base.params:
        n = 1
        for x in p["shape"]:
            n *= x
        coef, units = shape_units(p["shape"], d)
        param_shapes.append((n, units, coef))
        params.append({"name": p["name"], "units": units, "count": coef, "bytes": p["bytes"], "layer": p["layer"]})
    tensors = []
    index = {}
    for pos, t in enumerate(keeps[0][0]):
        ts = [j.tensors[k[0][pos]] for j, k in zip(jobs, keeps)]
        if len({(x["section"], x["layer"], x["role"] and x["role"][0]) for x in ts}) != 1:
            raise Unexplained(f"{what}: tensor {pos} is made in different places at different shapes")
        tensor = ts[0]
        role = tensor["role"]
        section = KEPT_SECTIONS[tensor["section"]]
        leaf = next((name for name, _ in reversed(tensor["ops"])), "")
        top = next((name for name, _ in tensor["ops"]), "")
        try:
            if role and role[0] in ("param", "grad"):
                p = params[role[1]]
                lw = {"fixed": {p["units"]: float(p["bytes"] * p["count"])}}
            elif hasattr(base, "fractions") and len({x["size"] for x in ts}) == 1:
                lw = qlora_programs().fixed_law(ts[0]["size"], param_shapes, base.fractions, d,
                                                f"{what} tensor {pos}", widths_of(precision), tensor["ops"],
                                                base.state_weights.get(t))
            elif two_lengths:
                lw = target_law([x["size"] for x in ts], d, param_shapes, f"{what} tensor {pos}",
                                widths_of(precision))
            else:
                lw = law(ts[0]["size"], ts[1]["size"], ts[2]["size"], d, param_shapes, f"{what} tensor {pos}",
                         widths_of(precision))
        except Unexplained as e:
            # Which operator made it, for whoever reads why a key was not recorded.
            raise Unexplained(f"{e} (made by {top} > {leaf}, {tensor['section']})") from None
        if not (role and role[0] in ("param", "grad")):
            lw = head_law(lw, d["heads"], top if top == leaf else f"{top} > {leaf}", d.get("kv_heads"))
            refuse_rivals(lw, d, f"{what} tensor {pos} ({top} > {leaf})")
        if role and role[0] == "param" or role and role[0] == "buffer":
            term = "weights"
        elif role and role[0] == "grad":
            term = "gradients"
        elif role and role[0] == "input":
            term = "inputs"
        elif section == "setup":
            term = "temporary"
        elif any("V" in u.split("*") for kinds in lw.values() for u in kinds if kinds is not lw.get("fixed")):
            term = "logits"
        elif "fixed" in lw and len(lw) == 1 and tensor["size"] > 4096:
            # Copies of weights, sized by no shape: AMP's 16-bit casts, and peft's merged expert
            # stacks (W + s * B @ A), which autograd keeps from a layer's forward to its backward.
            term = "temporary"
        else:
            term = "activations"
        entry = {"law": lw, "term": term, "site": top if top == leaf else f"{top} > {leaf}"}
        if role and role[0] in ("param", "grad"):
            entry[role[0]] = role[1]
        if tensor["kernel"]:
            entry["kernel"] = tensor["kernel"]
        if tensor.get("source") in index:
            entry["source"] = index[tensor["source"]]
        index[t] = len(tensors)
        tensors.append(entry)
    seq = sequence(base, keeps[0][0])
    sections = {}
    homes = {index[t]: home(base, t) for t in index}
    for name, events in list(seq.items()):
        if name.endswith(":backward"):
            sections[name.replace(":", "_")] = seq.pop(name)
            continue
        sections[name] = [[k, index[t], list(c) if c else None] for k, t, c in events]
    # The check: the deeper run's kept events, against this template expanded to its depth.
    deep_keep, _ = kept(deep)
    deep_seq = {k: v for k, v in sequence(deep, deep_keep).items() if ":" not in k}
    sizes = {index[t]: base.tensors[t]["size"] for t in index}
    stacks = {c[0] for events in seq.values() for _, _, c in events if c}
    check = {"layers": CHECK_LAYERS, "batch": shapes[0][0], "seq": shapes[0][1]}
    if two_lengths:
        check["target_seq"] = shapes[0][2]
    for name, events in seq.items():
        mine = check_of(expand([(k, index[t], c) for k, t, c in events], homes, {s: CHECK_LAYERS for s in stacks}),
                        sizes)
        deep_sizes = {t: deep.tensors[t]["size"] for t in deep_keep}
        theirs = check_of([(k, (t, None)) for k, t, c in deep_seq[name]], deep_sizes)
        if mine != theirs:
            raise Unexplained(f"{what}: the {name} section at {CHECK_LAYERS} layers is not the template's "
                              f"expansion ({theirs} recorded, {mine} expanded)")
        check[name] = mine
    left = {}
    for _, why in keeps[0][1].items():
        left[why] = left.get(why, 0) + 1
    optimizer = optimizer_check(base)
    return {"dims": d, "params": params, "tensors": tensors, "homes": {str(k): v for k, v in homes.items() if v},
            **sections, "check": check, "optimizer_check": optimizer, "left_out": left}


def optimizer_check(job):
    """The recorded AdamW (foreach) steps: per step, allocations, bytes and the live peak over
    where the step began, which the planner's foreach step must reproduce on CPU."""
    out = {}
    for step in (1, 2):
        name = f"step{step}.optimizer"
        live = peak = count = total = 0
        for kind, t in job.events:
            tensor = job.tensors[t]
            where = tensor["section"] if kind == "a" else tensor["freed"]["section"]
            if where != name or (kind == "f" and tensor["section"] != name and
                                 not (tensor["role"] and tensor["role"][0] == "grad")):
                continue
            n = tensor["size"]
            if n <= TINY:
                continue  # the CPU's step counters and wrapped numbers
            if kind == "a":
                live += n
                count += 1
                total += n
                peak = max(peak, live)
            else:
                live -= n
        out[f"step{step}"] = {"allocations": count, "bytes": total, "peak": peak}
    return out


def isolated(fn, *args):
    """`fn(*args)` in a process of its own, so one recording's caches cannot change another's.
    With `STEP_PROGRAMS_CACHE` set to a folder, each run is kept there and read back when asked
    again (a template whose check fails can be read again without running the model)."""
    import hashlib
    import multiprocessing
    import os
    import pickle
    cache = os.environ.get("STEP_PROGRAMS_CACHE")
    path = None
    if cache:
        # The switches the spawned process reads from the environment are part of the run.
        switches = tuple(os.environ.get(v) for v in (GATED_T5, UNTIED_T5, USE_CACHE))
        what = repr((fn.__name__,) + args + ((switches,) if any(switches) else ()))
        path = os.path.join(cache, hashlib.sha1(what.encode()).hexdigest() + ".pickle")
        if os.path.exists(path):
            with open(path, "rb") as f:
                return pickle.load(f)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        job = pool.apply(_run, (fn.__name__,) + args)
    if path:
        with open(path, "wb") as f:
            pickle.dump(job, f)
    return job


def _run(name, *args):
    job = (globals().get(name) or getattr(qlora_programs(), name))(*args)
    job.__dict__.pop("ranges", None)
    for t in job.tensors:
        t["ops"] = [(n, 0) for n, _ in t["ops"]]
        if t["freed"]:
            t["freed"]["ops"] = []
    return job


def qlora_programs():
    import qlora_programs as q
    return q


def keys(only):
    """The jobs recorded: every decoder as a causal LM, BERT as a masked LM, T5 as a
    sequence-to-sequence LM; at fp32, bf16 and AMP; with eager attention and SDPA (and, at fp32,
    SDPA's math path, which a GPU takes for fp32 with grouped key-value heads); with and
    without full checkpointing."""
    out = []
    for family in DECODERS + ("bert", "t5"):
        if only and family not in only:
            continue
        head = "causal-lm" if family in DECODERS else ("masked-lm" if family == "bert" else "seq2seq-lm")
        attns = ["eager"] if family in measure.NO_SDPA and family not in ROUTED_SDPA else ["eager", "sdpa"]
        for precision in ("fp32", "bf16", "amp", AMP_CUDA):
            kinds = attns + (["sdpa-math"] if precision == "fp32" and "sdpa" in attns else [])
            for attn in kinds:
                for ckpt in (False, True):
                    out.append((family, head, precision, attn, ckpt))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", help="comma-separated families, or whole keys (family/head/precision/attn/ckpt|full)")
    ap.add_argument("--merge", nargs="*", help="merge these outputs (later ones win) instead of recording")
    ap.add_argument("--lora", help="comma-separated adapter targets (all, qv): record LoRA steps at fp32 and bf16 "
                                   "(AMP where --only names an AMP key) instead of full fine-tuning")
    ap.add_argument("--gated", action="store_true", help="record T5 with v1.1's gated MLP (gated-gelu) instead of "
                                                          "v1.0's ReLU one, under keys with /gated after the "
                                                          "checkpointing (before a LoRA suffix)")
    ap.add_argument("--untied", action="store_true", help="with --gated: T5 v1.1 as its checkpoints are, its output "
                                                          "layer a weight of its own (tied otherwise)")
    ap.add_argument("--qlora", choices=("all", "qv"), help="record QLoRA's step (LoRA on every linear layer of a "
                                                             "4-bit base, or on its query and value projections: qv; "
                                                             "bf16 compute, SDPA, with and without checkpointing; "
                                                             "fp32 compute and AMP, amp-cuda, where --only names "
                                                             "the key) under fake tensors")
    ap.add_argument("--use-cache", action="store_true",
                    help="record the training forward with the config's use_cache left on (transformers' default: "
                         "a DynamicCache built and each layer's keys and values copied into it), under keys with "
                         "/cache after the checkpointing; checkpointed keys are left out (transformers turns the "
                         "cache off under checkpointing)")
    args = ap.parse_args()
    if args.merge:
        merged = {}
        for path in args.merge:
            for k, t in template_file.read(path)["templates"].items():
                if "error" in t and k in merged and "error" not in merged[k]:
                    continue  # a failed recording never replaces a good one
                merged[k] = reclassified(t, k.split("/")[2]) if "laws" in t else t
        write(args.out, merged)
        return
    only = set(args.only.split(",")) if args.only else set()
    whole = {k for k in only if "/" in k}
    families = {k for k in only if "/" not in k}
    out = {}
    jobs = keys(families | {k.split("/")[0] for k in whole})
    if args.lora:
        # SDPA (and, at fp32, its math path, which a GPU takes with grouped key-value heads);
        # eager where transformers has no SDPA path, or where a key asks for it (Gemma-2, whose
        # full training is recorded with eager attention only). AMP (fp32 weights and adapters,
        # the forward under autocast) where a key asks for it.
        jobs = [j + ((LORA_RANK, t),) for j in jobs if (j[2] in ("fp32", "bf16") or key(*j) in whole)
                and (j[3] != "eager" or j[0] in measure.NO_SDPA or key(*j) in whole) for t in args.lora.split(",")]
    elif args.qlora:
        # As peft's prepare_model_for_kbit_training sets it up: bf16 compute, with checkpointing
        # (its default) and without (`use_gradient_checkpointing=False`); SDPA, or eager where the
        # recordings have none (BLOOM), or had none (T5, now recorded with both), or a key asks
        # for it (Gemma-2).
        # SDPA runs in fp32 under QLoRA (qlora_programs.py): the families with grouped key-value
        # heads are recorded twice, `sdpa` with every head its own key-value head (the fused
        # kernel's) and `sdpa-math` with grouped heads (the math path's).
        # fp32 compute and AMP (bf16 compute under CUDA's autocast, `amp-cuda`) where a key asks
        # for them by name: at fp32 SDPA's math path too (grouped heads), under autocast SDPA in bf16
        # on a fused kernel over grouped heads, no math path.
        bf16 = [j + ((LORA_RANK, args.qlora, "qlora"),) for j in jobs
                if j[2] == "bf16"
                and (j[3] == "sdpa" or j[3] == "eager" and (j[0] in measure.NO_SDPA or key(*j) in whole))]
        bf16 += [j[:3] + ("sdpa-math",) + j[4:] for j in bf16 if j[3] == "sdpa" and j[0] in GQA_FAMILIES]
        jobs = bf16 + [j + ((LORA_RANK, args.qlora, "qlora"),) for j in jobs
                       if j[2] in ("fp32", AMP_CUDA) and key(*j) in whole]
    if args.untied and not args.gated:
        ap.error("--untied is T5 v1.1's output layer: give it with --gated")
    if args.untied:
        os.environ[UNTIED_T5] = "1"
    if args.gated:
        os.environ[GATED_T5] = "1"
        jobs = [j for j in jobs if j[0] == "t5"]
    if args.use_cache:
        if args.qlora:
            ap.error("--use-cache: QLoRA's recorder sets use_cache = False, as peft's QLoRA scripts do")
        os.environ[USE_CACHE] = "1"
        jobs = [j for j in jobs if not j[4]]
    for job in jobs:
        name = key(*job)
        # `/gated`, then `/cache`, after the checkpointing and before any adapters' suffix, as
        # the planner asks.
        base = key(*job[:5])
        name = base + ("/gated" if args.gated else "") + ("/cache" if args.use_cache else "") + name[len(base):]
        if whole and name not in whole and key(*job[:5]) not in whole and job[0] not in families:
            continue
        try:
            out[name] = template(*job)
            print(f"{name}: {len(out[name]['tensors'])} tensors, left out {out[name]['left_out']}", flush=True)
        except Unexplained as e:
            print(f"{name}: not recorded: {e}", file=sys.stderr, flush=True)
            out[name] = {"error": str(e)}
        write(args.out, out)


TERMS = ["weights", "gradients", "optimizer", "activations", "logits", "temporary", "workspace", "inputs"]
STACKS = ["main", "enc"]


def compact(t):
    """A template as the planner reads it (`crates/headroom-plan/src/program_template.rs`):
    laws and sites in tables; each tensor `[law, term, site, param, grad, kernel, home]` (-1 or
    "" for none; a layer as stack x 100 + n, stack 0 the main one, 1 T5's encoder); each section
    a flat list of `kind, tensor, layer` triples (kind 0 allocates, 1 frees); `step1` null when
    the first step makes what every later step does."""
    if "error" in t or "laws" in t:
        return t
    laws, sites, law_index, site_index = [], [], {}, {}

    def layer(c):
        return -1 if not c else STACKS.index(c[0]) * 100 + int(c[1])

    rows = []
    for x in t["tensors"]:
        lk = json.dumps(x["law"], sort_keys=True)
        if lk not in law_index:
            law_index[lk] = len(laws)
            laws.append(x["law"])
        if x["site"] not in site_index:
            site_index[x["site"]] = len(sites)
            sites.append(x["site"])
        rows.append([law_index[lk], TERMS.index(x["term"]), site_index[x["site"]], x.get("param", -1),
                     x.get("grad", -1), x.get("kernel", "")])
    for k, h in t.get("homes", {}).items():
        rows[int(k)].append(layer(h))
    for r in rows:
        if len(r) == 6:
            r.append(-1)

    def flat(events):
        return [v for k, i, c in events for v in (0 if k == "a" else 1, i, layer(c))]

    def shape(events):
        return [(k, rows[i], tuple(c) if c else None) for k, i, c in events]

    step1 = None if shape(t["step1"]) == shape(t["step"]) else t["step1"]
    # Only the tensors the kept sections touch, numbered anew.
    used = sorted({i for name in ("setup", "step") for _, i, _ in t[name]}
                  | ({i for _, i, _ in step1} if step1 else set()))
    renumber = {i: n for n, i in enumerate(used)}
    rows = [rows[i] for i in used]

    def flat(events):
        return [v for k, i, c in events for v in (0 if k == "a" else 1, renumber[i], layer(c))]

    step1 = flat(step1) if step1 else None
    # Each dropout's output (forward or backward) and the tensor it consumed: `[output, input]`.
    sources = [[renumber[i], renumber[x["source"]]] for i, x in enumerate(t["tensors"])
               if "source" in x and i in renumber and x["source"] in renumber]
    return {"dims": t["dims"], "params": [[p["name"], p["units"], p["count"], p["bytes"], layer(p["layer"])]
                                          for p in t["params"]],
            "laws": laws, "sites": sites, "tensors": rows, "setup": flat(t["setup"]), "step1": step1,
            "step": flat(t["step"]), "backward": [t.get("step1_backward"), t.get("step_backward")],
            "check": t["check"], "optimizer_check": t["optimizer_check"], "left_out": t["left_out"],
            **({"sources": sources} if sources else {})}


def write(path, templates):
    """`templates` in the planner's form, to `path` (packed where it ends in `.tpl`)."""
    import transformers
    template_file.write(path, {
        "about": "What a transformers training job allocates and frees: scripts/validate/step_programs.py",
        "torch": torch.__version__, "transformers": transformers.__version__, "shapes": SHAPES,
        "layers": LAYERS, "edge": EDGE, "templates": {k: compact(v) for k, v in templates.items()}})


if __name__ == "__main__":
    main()
