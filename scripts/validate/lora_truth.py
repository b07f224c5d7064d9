#!/usr/bin/env python3
"""peft LoRA training steps measured on CPU, for the planner's replay of the recorded LoRA
templates (`data/programs/hf-lora.json`): at depths, shapes and ranks the templates were not
recorded at (they were at five layers, 2x56, 2x88, 3x56 tokens, rank 22).

Each case builds a family's base config (measure.py's `small_configs`) at its depth, wraps it
with peft's LoRA as step_programs.py records it (`lora_model`), creates `torch.optim.AdamW`
(foreach) over the model's parameters and runs a step to make the optimizer state; then a
second step is measured as measure.py measures one: the storages alive when it starts (weights,
buffers, optimizer state, inputs) plus the highest running sum of the profiler's allocation
events, per phase and over the step. Every case is a check row: nothing in the templates is
fitted to them (`cargo test -p headroom-plan --test lora_truth` compares).

    /work/venv-torch/bin/python scripts/validate/lora_truth.py --out data/validation/lora_cpu_truth.json
"""

import argparse
import gc
import json
import sys

import torch
from torch.profiler import record_function

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import measure  # noqa: E402
import step_programs  # noqa: E402

# (family, precision, checkpointing, layers, batch, seq, rank, targets): chosen before any
# comparison, every one away from the recording's depth (5), shapes and rank (22).
CASES = [
    ("llama", "bf16", False, 6, 2, 128, 16, "all"),
    ("qwen2", "bf16", False, 7, 2, 96, 32, "all"),
    ("mistral", "bf16", False, 6, 1, 160, 8, "all"),
    ("llama", "bf16", False, 8, 1, 96, 64, "all"),
]


def config(family, layers):
    cfg = dict(measure.small_configs()[(family, "base")])
    for k in ("num_hidden_layers", "n_layer"):
        if k in cfg:
            cfg[k] = layers
    return cfg


def case(family, precision, checkpointing, layers, batch, seq, rank, targets):
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    cfg = config(family, layers)
    # Dropout off, as measure.py's cases run (the planner plans a CPU step without it).
    model = measure.build(cfg, "causal-lm", "sdpa", dtype)
    model = step_programs.lora_model(model, rank, targets)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    batch_inputs = measure.inputs(cfg, "causal-lm", batch, seq)

    def step():
        with record_function("forward"):
            loss = model(**batch_inputs).loss
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
        with record_function("zero_grad"):
            opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    step()
    gc.collect()
    weights = measure.storage_bytes(list(model.parameters()) + list(model.buffers()))
    state = measure.storage_bytes(list(measure.state_tensors(opt)))
    inp = measure.storage_bytes(batch_inputs.values())
    _, per, peak, _ = measure.profiled(step)
    base = weights + state + inp
    return {"family": family, "precision": precision, "checkpointing": checkpointing, "layers": layers,
            "batch": batch, "seq": seq, "rank": rank, "targets": targets, "split": "check", "config": cfg,
            "weight_bytes": weights, "optimizer_state_bytes": state, "input_bytes": inp,
            "phases": {k: base + v for k, v in per.items()}, "peak_bytes": base + peak}


def isolated(*args):
    """`case(*args)` in a process of its own, so one case's caches cannot change another's."""
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(case, args)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import peft
    import transformers
    out = {"about": "peft LoRA steps measured on CPU: scripts/validate/lora_truth.py", "torch": torch.__version__,
           "transformers": transformers.__version__, "peft": peft.__version__, "cases": []}
    for c in CASES:
        out["cases"].append(isolated(*c))
        print(json.dumps({k: v for k, v in out["cases"][-1].items() if k != "config"}), flush=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
