#!/usr/bin/env python3
"""The step recorder against PyTorch's MemTracker (issue 46): the same step through both tools,
in one sitting, each job and each tool in a fresh subprocess with a timeout, beside the GPU's
`max_memory_allocated` for that step on one NVIDIA H200.

    PYTHONPATH=python python3 scripts/validate/recorder_vs_memtracker.py --out data/validation/recorder_vs_memtracker.json
    python3 scripts/validate/recorder_vs_memtracker.py --table data/validation/recorder_vs_memtracker.json

The step is the one `python -m headroom_gpu record` records and `scripts/gpu/validate_recorder.py`
ran on the GPU: a transformers model built from its config (`AutoModelForCausalLM.from_config`,
the weights in the job's dtype, SDPA attention), `torch.optim.AdamW(foreach=True)`, then for each
of two steps the forward with the loss, its backward, the optimizer step and
`zero_grad(set_to_none=True)`; LoRA is peft's over every linear layer.

- **MemTracker**: `torch.distributed._tools.mem_tracker.MemTracker`, stock, as its documentation
  runs it (`track_external(model, optimizer)`, `reset_mod_stats()` after the first step), under
  `FakeTensorMode`. Fake CUDA tensors fail in the backward on a machine without a GPU
  ("hasPrimaryContext expects a valid device index"), so it runs as a user without a GPU can run
  it: fake tensors on the CPU device, and its peak is the CPU device's (`get_tracker_snapshot("peak")`,
  the `Total` of the device). Attention is then the CPU's own SDPA choice, not a GPU's: that is
  part of what is compared. Nothing in MemTracker is patched; what fails is written down as it
  fails.
- **recorder**: `headroom_gpu.transformers_step.record` (what `python -m headroom_gpu record`
  runs), two steps, under fake tensors, SDPA routed as an sm90 GPU routes it; its peak is
  `StepRecorder.peak`, the highest live bytes of the tensors, before any allocator rounding or
  workspace.

Both peaks are raw tensor bytes; the GPU's `max_memory_allocated` also holds the caching
allocator's 512-byte rounding and cuBLAS's workspaces (a few MiB).

The jobs, chosen before any run (JOBS below): the eleven recorder GPU rows of docs/VALIDATION.md
(their GPU figure is that table's, GiB to two decimals, so each carries up to ±0.005 GiB), and six
of the dev grid's 36 (/work/shared/gpu/devgrid-cases.json, its measured peaks from
devgrid-measured.jsonl): each model's bf16 and fp32 step at 1 × 512 without checkpointing. The
dev grid's AMP steps are left out (autocast("cuda") switches itself off on a CPU device, so
MemTracker would run a different step), and so are its checkpointed and 4 × 2,048 ones (time).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
DEVGRID = os.environ.get("HEADROOM_DEVGRID", "/work/shared/gpu")
GIB = 1 << 30

# The recorder GPU rows of docs/VALIDATION.md ("Steps recorded by `python -m headroom_gpu
# record` ... on one NVIDIA H200"): the job and the GPU's max_memory_allocated in GiB.
RECORDER_ROWS = [
    ("gpt2 bf16 4x1024", dict(model="data/models/presets/gpt2.json", batch=4, seq=1024, dtype="bf16"), 5.13),
    ("gpt2 fp32 2x1024", dict(model="data/models/presets/gpt2.json", batch=2, seq=1024, dtype="fp32"), 4.63),
    ("qwen3-1.7b bf16 1x512", dict(model="data/models/qwen3-1.7b.json", batch=1, seq=512, dtype="bf16"), 16.09),
    ("qwen3-1.7b bf16 4x2048", dict(model="data/models/qwen3-1.7b.json", batch=4, seq=2048, dtype="bf16"), 47.81),
    ("qwen3-1.7b bf16 4x2048 LoRA r=16",
     dict(model="data/models/qwen3-1.7b.json", batch=4, seq=2048, dtype="bf16", lora=16), 49.88),
    # Measured as "fp32" when the config's torch_dtype (bfloat16) won over the job's dtype, on the
    # GPU and in both tools alike: a bf16 step (docs/VALIDATION.md).
    ("qwen3-1.7b bf16 2x1024", dict(model="data/models/qwen3-1.7b.json", batch=2, seq=1024, dtype="bf16"), 19.21),
    ("llama-3-8b bf16 1x2048", dict(model="data/models/presets/llama-3-8b.json", batch=1, seq=2048, dtype="bf16"),
     74.85),
    ("gemma-2b bf16 2x1024", dict(model="data/models/presets/gemma-2b.json", batch=2, seq=1024, dtype="bf16"), 26.19),
    ("phi-3-mini bf16 1x1024", dict(model="data/models/presets/phi-3-mini.json", batch=1, seq=1024, dtype="bf16"),
     35.65),
    ("pythia-1b bf16 4x1024", dict(model="data/models/presets/pythia-1b.json", batch=4, seq=1024, dtype="bf16"), 12.55),
    ("pythia-1b fp32 2x1024", dict(model="data/models/presets/pythia-1b.json", batch=2, seq=1024, dtype="fp32"), 18.92),
]

DEVGRID_NAMES = [
    "llama-1b-train-bf16-none-sdpa-1x512",
    "llama-1b-train-fp32-none-sdpa-1x512",
    "qwen2-0.5b-train-bf16-none-sdpa-1x512",
    "qwen2-0.5b-train-fp32-none-sdpa-1x512",
    "gpt2-medium-train-bf16-none-sdpa-1x512",
    "gpt2-medium-train-fp32-none-sdpa-1x512",
]

# Run order: small jobs first, so that a short sitting still compares many.
ORDER = ["gpt2 bf16 4x1024", "gpt2 fp32 2x1024", *DEVGRID_NAMES, "qwen3-1.7b bf16 4x2048 LoRA r=16",
         "pythia-1b bf16 4x1024", "pythia-1b fp32 2x1024", "qwen3-1.7b bf16 1x512", "qwen3-1.7b bf16 2x1024",
         "qwen3-1.7b bf16 4x2048", "gemma-2b bf16 2x1024", "phi-3-mini bf16 1x1024", "llama-3-8b bf16 1x2048"]


def jobs(config_dir: str) -> list[dict]:
    """Every job, in ORDER: its name, source, the step and the GPU's allocated peak in bytes."""
    out = {}
    for name, step, gib in RECORDER_ROWS:
        step = dict(step, model=os.path.join(ROOT, step["model"]))
        out[name] = dict(name=name, source="recorder GPU rows", step=step, gpu_allocated=round(gib * GIB),
                         gpu_resolution=round(0.005 * GIB))
    cases = {c["name"]: c for c in json.load(open(os.path.join(DEVGRID, "devgrid-cases.json")))}
    measured = {}
    for line in open(os.path.join(DEVGRID, "devgrid-measured.jsonl")):
        row = json.loads(line)
        if "name" in row:
            measured[row["name"]] = row
    for name in DEVGRID_NAMES:
        case = cases[name]
        path = os.path.join(config_dir, f"{case['model']}.json")
        with open(path, "w") as f:
            json.dump(case["config"], f)
        step = dict(model=path, batch=case["batch"], seq=case["seq"], dtype=case["precision"])
        out[name] = dict(name=name, source="dev grid", step=step, gpu_allocated=measured[name]["peak_allocated"],
                         gpu_resolution=0)
    return [out[n] for n in ORDER]


# -- the two tools, each run in a subprocess of its own ---------------------------------------

def run_memtracker(step: dict, steps: int = 2) -> dict:
    """Stock MemTracker on the step, fake tensors on the CPU device."""
    import torch
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
    if step.get("lora"):
        import peft
    config = transformers.AutoConfig.from_pretrained(step["model"])
    config.use_cache = False
    start = time.perf_counter()
    with FakeTensorMode():
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtypes[step["dtype"]])
        try:
            # `dtype` given, as the recorder gives it: the config's `torch_dtype` would win otherwise.
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                                  dtype=dtypes[step["dtype"]])
        finally:
            torch.set_default_dtype(previous)
        if step.get("lora"):
            lora = peft.LoraConfig(r=step["lora"], lora_alpha=2 * step["lora"], target_modules="all-linear",
                                   lora_dropout=0.0)
            model = peft.get_peft_model(model, lora)
        model.train()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, foreach=True)
        ids = torch.randint(0, config.vocab_size, (step["batch"], step["seq"]))
        tracker = MemTracker()
        tracker.track_external(model, opt)
        with tracker:
            for i in range(steps):
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                del loss
                opt.step()
                opt.zero_grad(set_to_none=True)
                if i == 0:
                    tracker.reset_mod_stats()
        peaks = tracker.get_tracker_snapshot("peak")
    seconds = time.perf_counter() - start
    return {"peak": max(d["Total"] for d in peaks.values()), "devices": [str(d) for d in peaks], "seconds": seconds}


def run_recorder(step: dict, steps: int = 2) -> dict:
    """The recorder on the step, as `python -m headroom_gpu record` runs it."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import transformers  # noqa: F401

    from headroom_gpu.transformers_step import StepSpec, record

    if step.get("lora"):
        import peft  # noqa: F401
    start = time.perf_counter()
    rec = record(StepSpec(steps=steps, **step))
    seconds = time.perf_counter() - start
    out = {"peak": rec.peak, "seconds": seconds, "sdpa": dict(rec.sdpa_kernels)}
    if os.environ.get("HEADROOM_PROGRAM_OUT"):
        rec.write(os.environ["HEADROOM_PROGRAM_OUT"])
    return out


def one(tool: str, step: dict) -> dict:
    """Runs one tool on one step in this process; the result, or what failed."""
    try:
        result = (run_memtracker if tool == "memtracker" else run_recorder)(step)
        result["status"] = "ok"
    except Exception as e:  # a tool's failure is a result here
        result = {"status": "failed", "failure": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    result["max_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return result


def in_subprocess(tool: str, step: dict, timeout: float) -> dict:
    """`one` in a fresh Python; its wall time counts the imports too."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, __file__, "--one", tool, json.dumps(step)], capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "failure": f"no result in {timeout:.0f} s", "wall": timeout}
    wall = time.perf_counter() - start
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"status": "failed", "failure": f"exit {done.returncode}: {tail}", "wall": wall}
    result = json.loads(lines[-1])
    result["wall"] = wall
    return result


def error(peak: int | None, gpu: int) -> float | None:
    return None if peak is None else (peak - gpu) / gpu


def table(data: dict) -> str:
    rows = ["| job | GPU allocated | MemTracker peak | diff | time | recorder peak | diff | time |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for job in data["jobs"]:
        cells = [job["name"], f"{job['gpu_allocated'] / GIB:.2f} GiB"]
        for tool in ("memtracker", "recorder"):
            r = job[tool]
            if r["status"] == "ok":
                cells += [f"{r['peak'] / GIB:.2f} GiB", f"{100 * r['error']:+.2f}%", f"{r['seconds']:.1f} s"]
            else:
                cells += [f"**{r['status']}**", "—", f"{r.get('wall', 0):.1f} s"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--table")
    p.add_argument("--one", nargs=2, metavar=("TOOL", "STEP"), help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=600, help="seconds a tool may take on a job (default 600)")
    p.add_argument("--only", nargs="*", help="run only these jobs (by name)")
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], json.loads(args.one[1]))), flush=True)
        return
    if args.table:
        print(table(json.load(open(args.table))))
        return
    import torch
    import transformers

    data = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} vCPUs, shared",
            "torch": torch.__version__, "transformers": transformers.__version__, "jobs": []}
    with tempfile.TemporaryDirectory() as configs:
        for job in jobs(configs):
            if args.only and job["name"] not in args.only:
                continue
            job["load_before"] = os.getloadavg()[0]
            for tool in ("memtracker", "recorder"):
                r = in_subprocess(tool, job["step"], args.timeout)
                r["error"] = error(r.get("peak"), job["gpu_allocated"])
                job[tool] = r
                print(job["name"], tool, json.dumps(r), file=sys.stderr, flush=True)
            job["step"]["model"] = os.path.relpath(job["step"]["model"], ROOT) \
                if job["source"] != "dev grid" else f"devgrid-cases.json: {job['name']}"
            data["jobs"].append(job)
            if args.out:  # written after each job, so that an interrupted sitting keeps what it measured
                with open(args.out, "w") as f:
                    json.dump(data, f, indent=1)
                    f.write("\n")


if __name__ == "__main__":
    main()
