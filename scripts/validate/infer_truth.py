#!/usr/bin/env python3
"""Ground truth for the inference templates (`data/programs/hf-infer.json`): transformers'
`generate` and an evaluation loop's forward run for real on the CPU, at configs, depths and
shapes none of the templates was recorded at, each measured by the profiler's allocator
events: the storages alive when the call begins (the weights, buffers, ids and mask) plus the
highest running sum of the allocator's events during it.

The configs: each family's `wide` small config (measure.py: hidden 384, 6 heads of 64, its
MLP half as wide again, a vocabulary of 6000) at 6 layers (the templates: 5, checked at 7);
Qwen3 as Qwen2's with Qwen3's model type. The shapes: generate 2 x 100 with 6 new tokens,
1 x 160 with 12, 3 x 40 with 24 (more decode steps than the planner replays, 16); the forward
(every position's logits, `torch.no_grad()`, `use_cache=True`) 2 x 100, bf16 and fp32 (the fp32
forwards added after the rest had run, before any of them ran).

The split, declared before the first run: Llama (the family the recorder was developed on)
is tuning, the other families are check. The tolerance, declared before the first run: the
planner's live peak within 3% of the measured one (the inference forwards' tolerance in
docs/VALIDATION.md). `cargo test -p headroom-plan --test infer_truth` plans every row.

    /work/venv-torch/bin/python scripts/validate/infer_truth.py --out data/validation/infer_truth.json
"""

import argparse
import gc
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import measure  # noqa: E402

LAYERS = 6
GENERATE = ((2, 100, 6), (1, 160, 12), (3, 40, 24))
FORWARD = ((2, 100),)
FAMILIES = ("llama", "qwen2", "qwen3", "gpt2", "mistral")


def config(family):
    small = measure.small_configs()
    base = small[("qwen2" if family == "qwen3" else family, "wide")]
    cfg = dict(base)
    if family == "qwen3":
        cfg["model_type"] = "qwen3"
    for k in ("num_hidden_layers", "n_layer"):
        if k in cfg:
            cfg[k] = LAYERS
    return cfg


def measured(family, precision, mode, batch, seq, new_tokens):
    cfg = config(family)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = measure.build(cfg, "causal-lm", "sdpa", dtype)
    model.eval()
    model.generation_config.pad_token_id = 0
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg["vocab_size"], (batch, seq), generator=g)
    mask = torch.ones_like(ids)
    before = measure.storage_bytes(list(model.parameters()) + list(model.buffers()) + [ids, mask])

    def run():
        if mode == "generate":
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False)
        else:
            with torch.no_grad():
                out = model(input_ids=ids, use_cache=True)
        del out

    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    live = peak = 0
    for e in sorted((e.start_ns(), i, e.nbytes()) for i, e in
                    enumerate(prof.profiler.kineto_results.events()) if e.name() == "[memory]"):
        live += e[2]
        peak = max(peak, live)
    return {"family": family, "precision": precision, "mode": mode, "batch": batch, "seq": seq,
            "new_tokens": new_tokens, "config": cfg, "peak_bytes": before + peak, "before_bytes": before,
            "split": "tuning" if family == "llama" else "check"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import transformers
    rows = []
    for family in FAMILIES:
        for precision in ("bf16", "fp32"):
            for b, s, n in GENERATE:
                rows.append(measured(family, precision, "generate", b, s, n))
                print(rows[-1]["family"], precision, b, s, n, rows[-1]["peak_bytes"], flush=True)
            for b, s in FORWARD:
                rows.append(measured(family, precision, "forward", b, s, 1))
    with open(args.out, "w") as f:
        json.dump({"about": "scripts/validate/infer_truth.py", "torch": torch.__version__,
                   "transformers": transformers.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
