#!/usr/bin/env python3
"""A compiled step recorded (`StepRecorder(compile=True)`, headroom_gpu.compiled) against the
same step compiled by Inductor for real on the CPU: how much the recording's graphs, run as
eager operators, overstate the compiled step's live peak.

    PYTHONPATH=python python3 scripts/validate/compiled_recording.py --out data/validation/compiled_recording.json

Each job is recorder_truth.py's training step (measure.py's small config of the family, fp32,
2 x 128, AdamW with foreach) with `torch.compile(model)`:
- **recorded**: under fake tensors, `StepRecorder(compile=True, route_sdpa=False)`; the second
  step's live peak, and what the forward graphs save for the backward (the partitioner's
  decision, which the recording keeps exactly);
- **Inductor**: the same build compiled by Inductor with its CPU kernels, with real tensors: a
  first step compiles, the second is measured by the profiler's allocator events, as
  recorder_truth.py measures (storages of more than 8 bytes);
- and the eager step, recorded and measured the same way, for scale.

The recording's fused intermediates are allocated where Inductor's kernels keep them in
registers, so the recorded peak is an upper bound of the compiled one: the gap is what the
upper bound costs. Inductor's CPU kernels fuse as its GPU kernels do in the main (pointwise
and reductions into their producers' loops); matrix multiplies are library calls on both.
"""

import argparse
import gc
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import recorder_truth as truth  # noqa: E402

FAMILIES = ("gpt2", "llama")


def _job(family):
    return dict(mode="train", family=family, head="causal-lm", precision="fp32", attention="sdpa", lora=None,
                batch=2, seq=128)


def recorded(job, cfg, compile):
    from headroom_gpu.recorder import StepRecorder

    with StepRecorder(route_sdpa=False, compile=compile) as rec:
        torch.manual_seed(0)
        model = truth._model(job, cfg)
        step, _, _ = truth._step_fn(job, cfg, torch.compile(model) if compile else model)
        for _ in range(2):
            with rec.step():
                step()
    saved = sum(g.saved_bytes for g in rec.compiled_graphs)
    return truth.second_step_peak(rec, truth.SCALAR), saved, len(rec.compiled_graphs)


def measured(job, cfg, compile):
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    inductor_config.fx_graph_cache = functorch_config.enable_autograd_cache = False
    torch.manual_seed(0)
    model = truth._model(job, cfg)
    step, batch, opt = truth._step_fn(job, cfg, torch.compile(model) if compile else model)
    step()  # compiles, and makes the optimizer's state
    gc.collect()
    alive = list(model.parameters()) + list(model.buffers()) + list(batch.values())
    alive += [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    peak = truth.storage_bytes(alive, truth.SCALAR) + truth.profiled(step, truth.SCALAR)
    torch._dynamo.reset()
    return peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the figures as JSON to this file")
    ap.add_argument("--only", choices=FAMILIES, help="one family")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfgs = truth.configs()
    rows = []
    for family in [a.only] if a.only else FAMILIES:
        job, cfg = _job(family), cfgs[family]
        rec_compiled, saved, graphs = recorded(job, cfg, True)
        rec_eager, _, _ = recorded(job, cfg, False)
        row = {"family": family, "recorded_compiled_peak_bytes": rec_compiled, "saved_bytes": saved,
               "graphs": graphs, "inductor_peak_bytes": measured(job, cfg, True),
               "recorded_eager_peak_bytes": rec_eager, "eager_peak_bytes": measured(job, cfg, False)}
        row["upper_bound_gap"] = (rec_compiled - row["inductor_peak_bytes"]) / row["inductor_peak_bytes"]
        rows.append(row)
        print(row, flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"about": "a compiled step's recording against Inductor on the CPU: "
                                "scripts/validate/compiled_recording.py", "torch": torch.__version__, "jobs": rows},
                      f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
