#!/usr/bin/env python3
"""Time whole training steps of the dev grid on this GPU, with `headroom plan`'s step time
and its breakdown (`step_time_s`, `step_time_breakdown` in `--json`) beside each.

The grid is the one in ../shared/gpu/devgrid-measured.jsonl: the models of
validate_plan.py (llama-1b, qwen2-0.5b, gpt2-medium, built from their configs with random
weights: nothing is downloaded) × batch × sequence {1 × 512, 4 × 2048} × precision {bf16,
fp32, amp} × checkpointing {none, full}, SDPA attention. Each job runs as a user's script
does: forward with the loss, backward, `torch.optim.AdamW` at torch's defaults (foreach on
CUDA), `zero_grad(set_to_none=True)`; bf16 = bf16 weights and states, amp = fp32 weights
under `torch.autocast(bfloat16)`, full = `gradient_checkpointing_enable(use_reentrant=False)`.
A step's time is the mean of the steps after the first (`--steps`, 3 by default, as the
grid was timed), each between `torch.cuda.synchronize()` calls, so a step the host cannot
issue fast enough shows as the host's time, as it does to a user.

Prints a markdown table (for docs/VALIDATION.md) and, with --jsonl, one line a job in the
grid's format with the plan's figures added. The plan is asked for the GPU by its catalog
name (from the device's name, or --gpu) with the memory torch reports.

    cargo build --release -p headroom-cli
    python3 scripts/gpu/step_time.py [--headroom target/release/headroom] [--gpu h200] [--jsonl out.jsonl]

Needs torch with CUDA and transformers. Without a GPU it says so and exits 2.
"""

import argparse
import itertools
import json
import os
import subprocess
import tempfile
import time

import gpu_env
from layer_time import GPUS
from validate_plan import CONFIGS, PRECISIONS

SHAPES = [(1, 512), (4, 2048)]
CHECKPOINTS = ["none", "full"]


def fail(msg):
    gpu_env.fail("step_time", msg)


def timed(torch, transformers, cfg, batch, seq, precision, checkpoint, steps):
    """Mean seconds of the optimizer steps after the first, or None when the job runs out of memory."""
    dtype_name, autocast = PRECISIONS[precision]
    config = transformers.AutoConfig.for_model(**cfg)
    config._attn_implementation = "sdpa"
    torch.cuda.empty_cache()
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=getattr(torch, dtype_name)).cuda()
    if checkpoint == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    tokens = torch.randint(0, cfg["vocab_size"], (batch, seq), device="cuda")
    times = []
    try:
        for _ in range(steps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    except torch.cuda.OutOfMemoryError:
        times = None
    del model, opt, tokens
    torch.cuda.empty_cache()
    # The first step allocates the optimizer's states and warms cuBLAS and the caching allocator.
    return None if times is None else sum(times[1:]) / len(times[1:])


def plan(headroom, path, gpu, memory, batch, seq, precision, checkpoint):
    cmd = [headroom, "plan", "--model", path, "--gpu", gpu, "--gpu-memory", str(memory), "--train",
           "--batch", str(batch), "--seq", str(seq), "--precision", precision, "--attention", "sdpa",
           "--checkpoint", checkpoint, "--framework", "hf", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    # 1 is "does not fit", still a plan with its step time; 2 is a refused question.
    if out.returncode >= 2:
        fail(f"{' '.join(cmd)}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--headroom", default="target/release/headroom")
    ap.add_argument("--gpu", help="the catalog name of this GPU (default: from its device name)")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps per job, the first not timed")
    ap.add_argument("--jsonl", help="write one line a job: the measurement and the plan")
    args = ap.parse_args()
    if args.steps < 2:
        fail("--steps must be at least 2: the first step is not timed")
    torch, transformers = gpu_env.require("step_time", args.headroom, "times real training steps")
    name = torch.cuda.get_device_name()
    gpu = args.gpu or next((g for frag, g in GPUS if frag in name), None)
    if gpu is None:
        fail(f"{name} is not in the catalog's list here; name it with --gpu")
    memory = torch.cuda.mem_get_info()[1]
    print(f"{name} as {gpu}, torch {torch.__version__}, transformers {transformers.__version__}\n")
    print("| job | measured | planned | error | compute | memory-bound | launch | communication | dominant |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    out = open(args.jsonl, "w") if args.jsonl else None
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, cfg in CONFIGS.items():
            path = os.path.join(tmp, label, "config.json")
            os.makedirs(os.path.dirname(path))
            with open(path, "w") as f:
                json.dump(cfg, f)
            for (batch, seq), precision, checkpoint in itertools.product(SHAPES, PRECISIONS, CHECKPOINTS):
                job = f"{label}-train-{precision}-{checkpoint}-sdpa-{batch}x{seq}"
                measured = timed(torch, transformers, cfg, batch, seq, precision, checkpoint, args.steps)
                p = plan(args.headroom, path, gpu, memory, batch, seq, precision, checkpoint)
                planned, parts = p["step_time_s"], p["step_time_breakdown"]
                ms = lambda s: f"{s * 1e3:.1f}"
                if measured is None:
                    cells = ["OOM", ms(planned), "–"]
                else:
                    errors.append(planned / measured - 1)
                    cells = [ms(measured), ms(planned), f"{planned / measured - 1:+.1%}"]
                cells += [ms(parts[k]) for k in ("compute_s", "memory_bound_s", "launch_s", "communication_s")]
                print(f"| {job} | " + " | ".join(cells) + f" | {parts['dominant']} |", flush=True)
                if out:
                    out.write(json.dumps({"name": job, "step_s": measured, "planned_step_s": planned,
                                          "step_time_breakdown": parts}) + "\n")
                    out.flush()
    if out:
        out.close()
    if errors:
        within = sum(abs(e) <= 0.15 for e in errors)
        worst = max(max(1 + e, 1 / (1 + e)) for e in errors)
        print(f"\n{within} of {len(errors)} within ±15%; worst {worst:.2f}× off")


if __name__ == "__main__":
    main()
