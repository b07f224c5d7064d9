#!/usr/bin/env python3
"""torchtune's single-device recipes, recorded, against the same step run on the CPU: each job's
live peak as `headroom_gpu.torchtune_recipe` records it under fake tensors, beside the same
recipe step with real tensors measured by the profiler's allocator events (recorder_truth.py's
method, which is measure.py's).

    PYTHONPATH=python python3 scripts/validate/torchtune_truth.py --out data/validation/torchtune_truth.json

A job is one of torchtune 0.6.1's llama3_2 configs (1B_full_single_device.yaml,
1B_lora_single_device.yaml, as shipped with the package) with the changes the job names, on a
two-layer Llama 3.2 of tied embeddings (the config in `MODEL`), 2 sequences of 64 tokens.
Both sides run `RecipeStep` (the recipe's setup and its training loop's step) on the same
objects, with torchtune's `OffloadActivations` on `one_stream_offloading()`:
- **CPU**: a warm-up step, then the profiled one; the peak is the bytes of the storages alive
  when it starts (`RecipeStep.alive()`: weights, buffers, every optimizer's state, the label
  cache) plus the highest running sum of the allocator's events in it.
- **recorder**: two steps under fake tensors (`StepRecorder(route_sdpa=False)`: attention is the
  CPU's own SDPA choice, as the CPU run takes it); the peak is the highest live bytes of the
  recording in the second step.
Storages of at most 8 bytes are left out on both sides (recorder_truth.py says why: a CPU
kernel's scalar arguments). "Exact" is equal to the byte, declared before the run; every job is
a check job (no constant of the recorder was set on torchtune).
"""

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from recorder_truth import SCALAR, second_step_peak, storage_bytes  # noqa: E402

MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
         "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256,
         "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "rope_theta": 500000.0,
         "rope_scaling": {"factor": 32.0, "rope_type": "llama3", "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                          "original_max_position_embeddings": 8192}}
BATCH, SEQ = 2, 64

# (name, config, changes to the config's keys)
JOBS = (
    ("full_single_device as shipped: 8-bit AdamW in the backward, chunked CE", "1B_full_single_device.yaml", {}),
    ("full, torch AdamW after the backward, chunked CE", "1B_full_single_device.yaml",
     {"optimizer_in_bwd": False, "optimizer": {"_component_": "torch.optim.AdamW", "lr": 2e-5}}),
    ("full, torch AdamW in the backward, chunked CE", "1B_full_single_device.yaml",
     {"optimizer": {"_component_": "torch.optim.AdamW", "lr": 2e-5}}),
    ("full, torch AdamW after the backward, cross-entropy unchunked", "1B_full_single_device.yaml",
     {"optimizer_in_bwd": False, "optimizer": {"_component_": "torch.optim.AdamW", "lr": 2e-5},
      "loss": {"_component_": "torch.nn.CrossEntropyLoss"}}),
    ("full as shipped, activation offloading", "1B_full_single_device.yaml", {"enable_activation_offloading": True}),
    ("full as shipped, activation checkpointing", "1B_full_single_device.yaml",
     {"enable_activation_checkpointing": True}),
    ("full as shipped, checkpointing and offloading", "1B_full_single_device.yaml",
     {"enable_activation_checkpointing": True, "enable_activation_offloading": True}),
    ("lora_single_device as shipped: fused AdamW, 8 micro-batches", "1B_lora_single_device.yaml", {}),
    ("lora, activation offloading", "1B_lora_single_device.yaml", {"enable_activation_offloading": True}),
)


def config_path(name):
    from headroom_gpu.torchtune_recipe import shipped

    return shipped(os.path.join("llama3_2", name))


def write_recipe(directory, name, changes):
    """The shipped config with `changes`, written to `directory`."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(config_path(name))
    for key, value in changes.items():
        cfg[key] = value
    path = os.path.join(directory, name)
    OmegaConf.save(cfg, path)
    return path


# CPU kernels whose scratch buffers (oneDNN's packing of bf16 matrices, the CPU flash attention's
# per-thread blocks, bitsandbytes' CPU update of 8-bit state) are allocated and freed inside the
# kernel: no tensor of the step holds them, and the GPU's kernels have their own (cuBLAS's
# workspace, which the plan adds) or none (bitsandbytes' CUDA update is in place).
KERNELS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
           "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
           "bitsandbytes::optimizer_update_8bit_blockwise")


def profiled_without_scratch(fn, least):
    """The profiler's running peak as `profiled` counts it, and the same less every block a CPU
    kernel of `KERNELS` allocated and freed inside one call of itself (its scratch), paired by
    address in the profiler's trace."""
    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as g:
            trace = json.load(g)["traceEvents"]
    calls = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in trace if e.get("ph") == "X" and e.get("name") in KERNELS]
    memory = sorted((e["ts"], i, e["args"]["Addr"], e["args"]["Bytes"]) for i, e in enumerate(trace)
                    if e.get("name") == "[memory]")
    open_at, scratch = {}, set()
    for ts, i, addr, nbytes in memory:
        if nbytes > 0:
            open_at[addr] = (ts, i)
        elif addr in open_at:
            start, j = open_at.pop(addr)
            if any(a <= start and ts <= b for a, b in calls):
                scratch.update((i, j))
    peaks = []
    for skip in (set(), scratch):
        live = peak = 0
        for ts, i, addr, nbytes in memory:
            if abs(nbytes) > least and i not in skip:
                live += nbytes
                peak = max(peak, live)
        peaks.append(peak)
    return peaks


def cpu_peak(recipe, model):
    from headroom_gpu import torchtune_recipe as tr

    torch.manual_seed(0)
    with tr.one_stream_offloading(), tr.sized_rope_scaling(False):
        step = tr.RecipeStep(recipe, model, BATCH, SEQ)
        step.run()  # the first makes the optimizer's state
        gc.collect()
        alive = storage_bytes(step.alive(), SCALAR)
        return [alive + peak for peak in profiled_without_scratch(step.run, SCALAR)]


def recorded_peak(recipe, model):
    from headroom_gpu import torchtune_recipe as tr

    out = tr.record(recipe, model, BATCH, SEQ, steps=2, fake=True, route_sdpa=False)
    return second_step_peak(out.rec, SCALAR), out.host_peak, out.rec.peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the result file to write")
    a = ap.parse_args()
    torch.set_num_threads(1)
    from headroom_gpu import torchtune_recipe as tr

    tmp = tempfile.mkdtemp()
    model = os.path.join(tmp, "config.json")
    with open(model, "w") as f:
        json.dump(MODEL, f)
    results = []
    for name, config, changes in JOBS:
        recipe = tr.read(write_recipe(tmp, config, changes))
        t = time.time()
        recorded, host, _ = recorded_peak(recipe, model)
        measured, without_scratch = cpu_peak(recipe, model)
        r = {"job": name, "config": config, "changes": changes, "cpu_peak_bytes": measured,
             "cpu_peak_without_kernel_scratch_bytes": without_scratch, "recorded_peak_bytes": recorded,
             "exact": recorded == measured, "exact_without_kernel_scratch": recorded == without_scratch,
             "host_peak_bytes": host, "seconds": round(time.time() - t, 1)}
        results.append(r)
        print(f"{name}: cpu {measured} (without kernel scratch {without_scratch}) recorded {recorded} "
              f"{'exact' if r['exact'] else 'OFF'} host {host}", file=sys.stderr, flush=True)
    import torchtune

    out = {"about": "torchtune's recipes recorded, against the same step on CPU: scripts/validate/torchtune_truth.py",
           "torch": torch.__version__, "torchtune": torchtune.__version__,
           "torchao": __import__("torchao").__version__, "python": platform.python_version(),
           "model": MODEL, "batch": BATCH, "seq": SEQ, "jobs": results,
           "exact": sum(1 for r in results if r["exact"]),
           "exact_without_kernel_scratch": sum(1 for r in results if r["exact_without_kernel_scratch"])}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
