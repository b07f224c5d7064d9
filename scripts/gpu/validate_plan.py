#!/usr/bin/env python3
"""Measure real training peaks and compare them with `headroom plan`.

Runs Hugging Face models built from their configs (random weights: nothing is
downloaded) over a grid of batch, sequence, precision and checkpointing, on the
GPU this machine has. Each run does three optimizer steps of AdamW on random
tokens and records torch.cuda.max_memory_allocated() and max_memory_reserved() (or
that it ran out of memory), then asks `headroom plan --json` for the same
configuration and prints a markdown table of predicted (`allocated_bytes`,
`reserved_bytes`, `fits`: the job's step program replayed through headroom's
allocator) against measured, for docs/GPU.md.

    cargo build --release -p headroom-cli
    python3 scripts/gpu/validate_plan.py [--headroom target/release/headroom] [--quick] [--compile]

With --compile each step runs through torch.compile(model) and the plan is asked with
--compile (what the compiled graphs keep, recorded on CPU for decoders at fp32, bf16 and AMP).

With --snapshots DIR, the jobs named by --snapshot-jobs (the dev grid's names,
`llama-1b-train-fp32-full-sdpa-4x2048`) are recorded from their first request
(`torch.cuda.memory._record_memory_history`) into DIR/<job>.pickle, and the plan's program of
the same job is written beside it (DIR/<job>.jsonl, `plan --dump-program`), with the command
that lists both runs' large segments side by side (scripts/validate/segments.py). The jobs
before them still run, in the grid's order, as the dev grid's process ran them:

    python3 scripts/gpu/validate_plan.py --models llama-1b --shapes 1x512,4x2048 \
        --snapshots gpu-results/segments --snapshot-jobs llama-1b-train-fp32-full-sdpa-4x2048

Needs torch with CUDA and transformers. Without a GPU it says so and exits 2.
"""

import argparse
import itertools
import json
import os
import subprocess
import tempfile

import gpu_env

# Small and mid-sized members of the families the planner reads, as config.json fields.
CONFIGS = {
    "llama-1b": {
        "model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
        "max_position_embeddings": 8192, "tie_word_embeddings": True,
    },
    "qwen2-0.5b": {
        "model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
        "max_position_embeddings": 32768, "tie_word_embeddings": True,
    },
    "gpt2-medium": {
        "model_type": "gpt2", "n_embd": 1024, "n_layer": 24, "n_head": 16, "n_positions": 4096,
        "vocab_size": 50257,
    },
}

# (headroom --precision, torch dtype of the weights, autocast)
PRECISIONS = {"bf16": ("bfloat16", False), "fp32": ("float32", False), "amp": ("float32", True)}


def fail(msg):
    gpu_env.fail("validate_plan", msg)


def job_name(label, batch, seq, precision, checkpoint):
    """The dev grid's name of a job (../shared/gpu/devgrid-cases.json)."""
    return f"{label}-train-{precision}-{checkpoint}-sdpa-{batch}x{seq}"


def jobs(models, shapes):
    """(label, cfg, batch, seq, precision, checkpoint) in the order the grid runs them."""
    out = []
    for label in models:
        for (batch, seq), precision, checkpoint in itertools.product(shapes, PRECISIONS, ["none", "full"]):
            out.append((label, CONFIGS[label], batch, seq, precision, checkpoint))
    return out


def measure(torch, transformers, cfg, batch, seq, precision, checkpoint, compiled=False, snapshot=None):
    dtype_name, autocast = PRECISIONS[precision]
    dtype = getattr(torch, dtype_name)
    config = transformers.AutoConfig.for_model(**cfg)
    config._attn_implementation = "sdpa"
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    if snapshot:
        # From the job's first request: the segments it makes, and the Python frame of each request.
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    if checkpoint == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    tokens = torch.randint(0, cfg["vocab_size"], (batch, seq), device="cuda")
    if compiled:
        torch._dynamo.reset()
    forward = torch.compile(model, dynamic=False) if compiled else model
    try:
        for _ in range(3):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                loss = forward(input_ids=tokens, labels=tokens).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
    except torch.cuda.OutOfMemoryError:
        peak = None
    if snapshot:
        torch.cuda.memory._dump_snapshot(snapshot)
        torch.cuda.memory._record_memory_history(enabled=None)
    del model, forward, opt, tokens
    torch.cuda.empty_cache()
    return peak


def predict(headroom, path, gpu_memory, batch, seq, precision, checkpoint, compiled=False, program=None):
    cmd = [headroom, "plan", "--model", path, "--gpu", "h100-sxm", "--gpu-memory", str(gpu_memory),
           "--train", "--batch", str(batch), "--seq", str(seq), "--precision", precision,
           "--attention", "sdpa", "--checkpoint", checkpoint, "--json"] + (["--compile"] if compiled else [])
    if program:
        cmd += ["--dump-program", program]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode == 2:
        fail(f"{' '.join(cmd)}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def shapes_arg(text):
    """`1x512,4x2048` as [(1, 512), (4, 2048)]."""
    out = []
    for part in text.split(","):
        try:
            batch, seq = (int(x) for x in part.strip().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not BATCHxSEQ (e.g. 4x2048)") from None
        out.append((batch, seq))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--headroom", default="target/release/headroom")
    ap.add_argument("--quick", action="store_true", help="one model, a small grid")
    ap.add_argument("--compile", action="store_true", help="torch.compile'd steps against plan --compile")
    ap.add_argument("--models", help=f"comma-separated, of {', '.join(CONFIGS)} (default: all)")
    ap.add_argument("--shapes", type=shapes_arg, default=[(1, 512), (1, 2048), (4, 512), (4, 2048)],
                    help="BATCHxSEQ,... (default 1x512,1x2048,4x512,4x2048; the dev grid's: 1x512,4x2048)")
    ap.add_argument("--snapshots", help="directory for the snapshots and programs of --snapshot-jobs")
    ap.add_argument("--snapshot-jobs", default="", help="comma-separated job names to record (with --snapshots)")
    args = ap.parse_args()
    models = args.models.split(",") if args.models else list(CONFIGS)
    unknown = [m for m in models if m not in CONFIGS]
    if unknown:
        ap.error(f"--models: no model named {', '.join(unknown)}; the models: {', '.join(CONFIGS)}")
    if args.quick:
        models = models[:1]
    grid = jobs(models, args.shapes)
    if args.quick:
        grid = grid[::3]
    names = [job_name(label, batch, seq, precision, checkpoint) for label, _, batch, seq, precision, checkpoint in grid]
    wanted = [n for n in args.snapshot_jobs.split(",") if n]
    if wanted and not args.snapshots:
        ap.error("--snapshot-jobs needs --snapshots DIR")
    missing = [n for n in wanted if n not in names]
    if missing:
        ap.error(f"--snapshot-jobs: no job named {', '.join(missing)} in this grid; its jobs: {', '.join(names)}")
    torch, transformers = gpu_env.require("validate_plan", args.headroom, "measures real peaks")
    total = torch.cuda.mem_get_info()[1]
    name = torch.cuda.get_device_name()
    if args.snapshots:
        os.makedirs(args.snapshots, exist_ok=True)
    print(f"{name}, {total / 2**30:.1f} GiB, torch {torch.__version__}, transformers {transformers.__version__}\n")
    print("| model | batch × seq | precision | checkpoint | allocated | planned | error | reserved | planned | error | verdict |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---|")
    errors, reserved_errors, verdicts, compare = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for (label, cfg, batch, seq, precision, checkpoint), job in zip(grid, names):
            path = os.path.join(tmp, label, "config.json")
            if not os.path.exists(path):
                os.makedirs(os.path.dirname(path))
                with open(path, "w") as f:
                    json.dump(cfg, f)
            snapshot = program = None
            if job in wanted:
                snapshot = os.path.join(args.snapshots, f"{job}.pickle")
                program = os.path.join(args.snapshots, f"{job}.jsonl")
            peak = measure(torch, transformers, cfg, batch, seq, precision, checkpoint, args.compile, snapshot)
            plan = predict(args.headroom, path, total, batch, seq, precision, checkpoint, args.compile, program)
            if snapshot:
                compare.append(f"python3 scripts/validate/segments.py {snapshot} --program {program} "
                               f"--headroom {args.headroom} --capacity {plan['capacity_bytes']}")
            predicted, reserved = plan["allocated_bytes"], plan["reserved_bytes"]
            gib = lambda b: f"{b / 2**30:.2f} GiB"
            ran = peak is not None
            verdicts.append(ran == plan["fits"])
            verdict = f"{'ran' if ran else 'OOM'}, plan: {'fits' if plan['fits'] else 'does NOT fit'}"
            if not ran:
                row = ("OOM", gib(predicted), "–", "–", gib(reserved), "–")
            else:
                err = predicted / peak[0] - 1
                rerr = reserved / peak[1] - 1
                errors.append(abs(err))
                reserved_errors.append(abs(rerr))
                row = (gib(peak[0]), gib(predicted), f"{err:+.1%}", gib(peak[1]), gib(reserved), f"{rerr:+.1%}")
            print(f"| {label} | {batch} × {seq} | {precision} | {checkpoint} | " + " | ".join(row) + f" | {verdict} |",
                  flush=True)
    if errors:
        for name, errs in (("allocated", errors), ("reserved", reserved_errors)):
            within = sum(e <= 0.05 for e in errs)
            print(f"\n{name}: {within} of {len(errs)} within 5%; mean |error| {sum(errs) / len(errs):.1%}, "
                  f"worst {max(errs):.1%}")
    print(f"verdicts right: {sum(verdicts)} of {len(verdicts)}")
    if compare:
        print("\nThe large segments of each recorded job against its plan's replay:")
        for line in compare:
            print("  " + line)


if __name__ == "__main__":
    main()
