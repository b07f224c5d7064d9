#!/usr/bin/env python3
"""Ground truth for the inference templates (`data/programs/hf-infer.tpl`): transformers'
`generate` and an evaluation loop's forward run for real on the CPU, at configs, depths and
shapes none of the templates was recorded at, each measured by the profiler's allocator
events: the storages alive when the call begins (the weights, buffers, ids and mask) plus the
highest running sum of the allocator's events during it.

The configs: each family's `wide` small config (measure.py: hidden 384, 6 heads of 64, its
MLP half as wide again, a vocabulary of 6000) at 6 layers (the templates: 5, checked at 7);
Qwen3 as Qwen2's with Qwen3's model type; Gemma-2 and Gemma-3 as Gemma's with their own model
types (a window of 4096, longer than every shape: the planner serves a sliding cache within its
window only); Qwen2-MoE and Qwen3-MoE as Qwen2's with 4 experts of 576, 2 a token (Mixtral's
`wide` experts), Qwen2-MoE's shared expert 768 wide. BLOOM and Gemma-2 run eager attention
(transformers has no SDPA for them), the rest SDPA, Llama both. The shapes: generate 2 x 100 with 6 new tokens,
1 x 160 with 12, 3 x 40 with 24 (more decode steps than the planner replays, 16); the forward
(every position's logits, `torch.no_grad()`, `use_cache=True`) 2 x 100, bf16 and fp32 (the fp32
forwards added after the rest had run, before any of them ran). The families after Mistral
(`--only`) were added with their templates, the same shapes and tolerance, into the same file.

BERT (a masked LM: an encoder, its forward alone, no cache) and T5 (a sequence-to-sequence LM:
its evaluation forward, the decoder's input as long as the encoder's, with `use_cache=True`)
were added with their forward templates, all check: their `wide` configs at 6 layers (T5: 6 a
stack, v1.0's ReLU MLP), BERT with SDPA, T5 eager (transformers' T5 attention is its own), bf16
and fp32, the forward at 2 x 100 and 1 x 160 (`ENCODER_FORWARD`), the same tolerance. T5's
`generate` was added with its template (`--only t5 --mode generate`, the forward rows kept), at
the decoders' generate shapes (the encoder's input 2 x 100, 1 x 160 and 3 x 40; the decoder's
past to 23, beyond the 16 steps the planner replays), check rows, the same tolerance; then
(declared after those rows were seen: two of the three peak in the prompt's forward, the
encoder's) 2 x 16 with 300 new tokens (`LONG_DECODE`), where the last decode step, its
decoder's cache 300 positions, decides the peak, check rows, the same tolerance. T5 v1.1's
`generate` (`--only t5/bf16/eager/gated,t5/fp32/eager/gated --mode generate`: its gated MLP) at
the same four shapes, with its `/gated` templates, check rows, the same tolerance.

SDPA's math path at fp32 (`sdpa-math`, asked for with `sdpa_kernel([SDPBackend.MATH])`: a GPU's
path for fp32 with grouped key-value heads) was added with its templates for every family
recorded on it (`GROUPED`), in the same configs (Phi-3's with 2 key-value heads of its 6, as
the planner takes the path only where they are grouped; Qwen2's, Qwen3's, Gemma's, Gemma-3's and
the Qwen MoEs' `wide` configs have one, multi-query), the same shapes and tolerance; and T5 v1.1
(`--only t5/bf16/eager/gated`: its gated MLP, its output layer its own) with its forward
templates, at T5's shapes. Their rows carry `attn` `sdpa-math`, or `variant` `gated`.

Over bitsandbytes' layers (`QUANTIZED`, `--quant`: NF4 with double quantization and bf16
compute, and LLM.int8(), each over a bf16 load, keys ending `/nf4` and `/int8`), the model is
built and loaded as `quant_infer.py` records its templates, and run under its `CudaPath` (what
bitsandbytes' CUDA kernels allocate, which this CPU cannot run): so these rows check the
templates' laws in the model's dimensions, depth, shapes and decode steps against a real run,
not bitsandbytes' CUDA kernels themselves. The cases, declared before their templates were
recorded: NF4 for Qwen2-MoE, BERT and T5 (v1.0), LLM.int8() for Gemma, Phi-3 and Mixtral, at the
`wide` configs and shapes above (nothing makes their 4-bit weights whole blocks of 16,384:
Qwen2-MoE's key and value projections, 64 x 384, and T5's MLP, 960 x 384, are not, so
bitsandbytes' second-level absmax rounds up there), the same tolerance, check rows; a row carries
`quant`. LLM.int8() for GPT-2, GPT-NeoX, BLOOM, T5 (v1.0, its `wo` kept fp32), BERT (its
forward), Qwen2-MoE, Qwen3-MoE, Gemma-2 and Gemma 3 was declared after those rows were measured,
before any of its own: the same configs, shapes and tolerance, check rows, each against its peak
without the CPU kernels' scratch (below). Their first measurement put BERT's NF4 forward at
1 x 160 at -3.00% (2 x 100: -2.10%): its peak falls inside the MLP's output layer, where
oneDNN's bf16 `addmm` holds a scratch buffer of 338 KiB beside the dequantized weight, which the
template leaves out as every template leaves out a CPU kernel's scratch (a GPU's cuBLAS has none).
Declared after that, before the rows were measured again: each row over bitsandbytes' layers
carries its peak without the CPU kernels' scratch too (`peak_without_cpu_scratch`, by the
templates' own rule), against which the test holds it; `peak_bytes` stays the raw peak, and
docs/VALIDATION.md gives both errors.

The split, declared before the first run: Llama (the family the recorder was developed on)
is tuning, the other families are check. The tolerance, declared before the first run: the
planner's live peak within 3% of the measured one (the inference forwards' tolerance in
docs/VALIDATION.md). `cargo test -p headroom-plan --test infer_truth` plans every row.

    /work/venv-torch/bin/python scripts/validate/infer_truth.py --out data/validation/infer_truth.json
    PYTHONPATH=python /work/venv-torch/bin/python scripts/validate/infer_truth.py --quant nf4 --out data/validation/infer_truth.json
    PYTHONPATH=python /work/venv-torch/bin/python scripts/validate/infer_truth.py --quant int8 --only gpt2,bloom --out data/validation/infer_truth.json
"""

import argparse
import contextlib
import gc
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import infer_programs  # noqa: E402
import measure  # noqa: E402
import quant_infer as qi  # noqa: E402
import step_programs as sp  # noqa: E402

LAYERS = 6
GENERATE = ((2, 100, 6), (1, 160, 12), (3, 40, 24))
FORWARD = ((2, 100),)
ENCODER_FORWARD = ((2, 100), (1, 160))
# An encoder-decoder's long generation after a short input: its decode steps decide the peak.
LONG_DECODE = ((2, 16, 300),)
FAMILIES = ("llama", "qwen2", "qwen3", "gpt2", "mistral", "phi3", "gemma", "gemma2", "gemma3_text", "gpt_neox", "bloom",
            "mixtral", "qwen2_moe", "qwen3_moe", "bert", "t5")
EAGER_ONLY = ("gemma2", "bloom", "t5")
# Families recorded for their forward alone, and how each is built.
FORWARD_ONLY = ("bert",)
# Whose forward runs at ENCODER_FORWARD's shapes.
ENCODERS = ("bert", "t5")
HEADS = {"bert": "masked-lm", "t5": "seq2seq-lm"}
# Families whose rows are measured on SDPA's math path at fp32 too (`sdpa-math`, asked for on
# the CPU): a GPU's path for fp32 with grouped key-value heads.
GROUPED = ("llama", "qwen2", "qwen3", "mistral", "phi3", "gemma", "gemma3_text", "mixtral", "qwen2_moe",
           "qwen3_moe")
# T5 v1.1's gated MLP, its rows apart from v1.0's.
VARIANTS = {"t5": ("", "gated")}
# The quantized rows (`--quant`): bitsandbytes' format -> the families measured over it.
QUANTIZED = {"nf4": ("qwen2_moe", "bert", "t5"),
             "int8": ("gemma", "phi3", "mixtral", "gpt2", "gpt_neox", "bloom", "t5", "bert", "qwen2_moe", "qwen3_moe",
                      "gemma2", "gemma3_text")}
# Whose `wide` config each family's is made from.
BASE = {"qwen3": "qwen2", "gemma2": "gemma", "gemma3_text": "gemma", "qwen2_moe": "qwen2", "qwen3_moe": "qwen2"}


def config(family, attn="sdpa", variant=""):
    small = measure.small_configs()
    cfg = dict(small[(BASE.get(family, family), "wide")])
    if family in BASE:
        cfg["model_type"] = family
    if family in ("gemma2", "gemma3_text"):
        cfg.update(sliding_window=4096, query_pre_attn_scalar=64)
    if family in ("qwen2_moe", "qwen3_moe"):
        cfg.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=576, decoder_sparse_step=1,
                   mlp_only_layers=[])
    if family == "qwen2_moe":
        cfg.update(shared_expert_intermediate_size=768, qkv_bias=True)
    if family == "t5" and variant == "gated":
        # T5 v1.1's gated MLP, its output layer its own (`infer_programs.untie_t5`).
        cfg.update(feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    elif family == "t5":
        # T5 v1.0's MLP, as its template was recorded (ReLU, tied output layer).
        cfg.update(feed_forward_proj="relu")
    if attn == "sdpa-math" and cfg.get("num_key_value_heads") == cfg.get("num_attention_heads"):
        # The math path's rows in a config that groups its key-value heads (Phi-3's `wide` has
        # as many as heads), as the planner takes that path for such a model only.
        cfg["num_key_value_heads"] = cfg["num_attention_heads"] // 3
    for k in ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers"):
        if k in cfg:
            cfg[k] = LAYERS
    return cfg


def measured(family, precision, mode, batch, seq, new_tokens, attn="sdpa", variant="", quant=None):
    cfg = config(family, attn, variant)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    cuda = qi.CudaPath() if quant else contextlib.nullcontext()
    if quant:
        # Built and loaded as its template was recorded (quant_infer.py), outside the measurement.
        import bitsandbytes  # noqa: F401  (its operators registered before CudaPath names them)
        meta = qi.build(cfg, HEADS.get(family, "causal-lm"), attn, quant)
        with cuda:
            model = qi.load(meta, quant)
    else:
        model = measure.build(cfg, HEADS.get(family, "causal-lm"), "sdpa" if attn == "sdpa-math" else attn, dtype)
    if variant == "gated":
        infer_programs.untie_t5(model)
    model.eval()
    if mode == "generate":
        model.generation_config.pad_token_id = 0
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg["vocab_size"], (batch, seq), generator=g)
    # T5's decoder input as long as the encoder's (labels shifted right); an encoder keeps no cache.
    labels = torch.randint(0, cfg["vocab_size"], (batch, seq), generator=g)
    extra = {"decoder_input_ids": torch.cat([torch.zeros_like(labels[:, :1]), labels[:, :-1]], 1)} \
        if family == "t5" and mode == "forward" else {}
    cache = {} if family == "bert" else {"use_cache": True}
    mask = torch.ones_like(ids)
    kept = qi.kept_tensors(model) if quant else []
    before = measure.storage_bytes(list(model.parameters()) + list(model.buffers()) + kept
                                   + [ids, mask, *extra.values()])

    def run():
        if mode == "generate":
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False)
        else:
            with torch.no_grad():
                out = model(input_ids=ids, **cache, **extra)
        del out

    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, sp.sdpa_backend(attn), cuda:
        run()
    live = peak = 0
    for e in sorted((e.start_ns(), i, e.nbytes()) for i, e in
                    enumerate(prof.profiler.kineto_results.events()) if e.name() == "[memory]"):
        live += e[2]
        peak = max(peak, live)
    # Over bitsandbytes' layers, the peak without the CPU's kernel scratch too (`scratch_free_peak`).
    apart = {"quant": quant, "peak_without_cpu_scratch": before + scratch_free_peak(prof)} if quant else {}
    return {"family": family, "precision": precision, "mode": mode, "batch": batch, "seq": seq,
            "new_tokens": new_tokens, "attn": attn, "config": cfg, "peak_bytes": before + peak, "before_bytes": before,
            "split": "tuning" if family == "llama" else "check", **({"variant": variant} if variant else {}), **apart}


def scratch_free_peak(prof):
    """The highest running sum of the allocator's events less the CPU kernels' own scratch, by the
    rule the templates leave it out by (`step_programs.cpu_scratch`, as `infer_programs.InferJob`
    reads its recordings), which a GPU's kernels do not allocate. (oneDNN's bf16 `addmm` makes a
    buffer of a few hundred KiB that dies inside it: at the peak of a 4-bit model's forward, where
    each layer's weight is dequantized beside it.)"""
    allocs = infer_programs.allocations(prof)
    made, scratch = {}, set()
    for i, (_, ptr, size, ops) in enumerate(allocs):
        if size > 0:
            made[ptr] = (i, ops)
        elif ptr in made:
            j, at = made.pop(ptr)
            if sp.cpu_scratch(at, ops):
                scratch.update((i, j))
    live = peak = 0
    for i, (_, _, size, _) in enumerate(allocs):
        if i not in scratch:
            live += size
            peak = max(peak, live)
    return peak


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", help="comma-separated families or family/precision/attn[/gated]: their rows measured and "
                                   "put in --out in place of theirs, the others' kept")
    ap.add_argument("--mode", choices=("generate", "forward"),
                    help="with --only: this mode's rows alone measured, the other's kept")
    ap.add_argument("--quant", choices=sorted(QUANTIZED),
                    help="the rows over bitsandbytes' layers of this format (QUANTIZED's families, or --only's of "
                         "them) measured and put in --out in place of theirs, the others' kept")
    args = ap.parse_args()
    import transformers
    only = set(args.only.split(",")) if args.only else set()
    rows = []
    if only or args.quant:
        with open(args.out) as f:
            rows = json.load(f)["rows"]
    jobs = []
    for family in () if args.quant else FAMILIES:
        attns = [("bf16", "eager"), ("fp32", "eager")] if family in EAGER_ONLY else \
            [("bf16", "sdpa"), ("fp32", "sdpa")] + ([("bf16", "eager")] if family == "llama" else []) \
            + ([("fp32", "sdpa-math")] if family in GROUPED else [])
        jobs += [(family, precision, attn, variant, None) for precision, attn in attns
                 for variant in VARIANTS.get(family, ("",))
                 if not only or family in only
                 or f"{family}/{precision}/{attn}" + (f"/{variant}" if variant else "") in only]
    # Over bitsandbytes' layers: bf16 compute, the attention a bf16 model of the family runs, T5 v1.0.
    jobs += [(family, "bf16", "eager" if family in EAGER_ONLY else "sdpa", "", args.quant)
             for family in QUANTIZED.get(args.quant, ()) if not only or family in only]
    done = set(jobs)
    modes = (args.mode,) if args.mode else ("generate", "forward")
    rows = [r for r in rows if (r["family"], r["precision"], r.get("attn", "sdpa"), r.get("variant", ""),
                                r.get("quant")) not in done or r["mode"] not in modes]

    def write():
        with open(args.out, "w") as f:
            json.dump({"about": "scripts/validate/infer_truth.py", "torch": torch.__version__,
                       "transformers": transformers.__version__, "rows": rows}, f, indent=1)

    for family, precision, attn, variant, quant in jobs:
        for b, s, n in () if family in FORWARD_ONLY or "generate" not in modes else \
                GENERATE + (LONG_DECODE if family == "t5" else ()):
            rows.append(measured(family, precision, "generate", b, s, n, attn, variant, quant))
            print(family, precision, attn, variant, quant, b, s, n, rows[-1]["peak_bytes"], flush=True)
        for b, s in () if "forward" not in modes else ENCODER_FORWARD if family in ENCODERS else FORWARD:
            rows.append(measured(family, precision, "forward", b, s, 1, attn, variant, quant))
            print(family, precision, attn, variant, quant, b, s, rows[-1]["peak_bytes"], flush=True)
        write()
    write()


if __name__ == "__main__":
    main()
