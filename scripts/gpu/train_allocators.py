#!/usr/bin/env python3
"""Train one model under PyTorch's allocator, PyTorch's with expandable segments, and headroom's.

Each allocator runs in its own process (an allocator is chosen before CUDA starts): a
GPT-2-medium-sized model built from its config (random weights, fixed seed: nothing is
downloaded) trains for --steps AdamW steps under bf16 autocast, batch --batch, with a
sequence length drawn per step from a seeded generator between --min-seq and --max-seq
(the variable-length workload on which the caching allocator fragments). Each reports peak
reserved memory, the mean step time after warm-up, and every step's loss; the table compares
them, and the losses must agree across allocators. The native runs also write a memory
snapshot of their first steps (test data for `headroom inspect` and `headroom replay`).

With --edge, the job runs at the edge of the GPU's memory: a probe run under PyTorch's
allocator measures the step's peak allocated memory, and every allocator then runs under a
per-process limit that much plus --edge-margin (5%): too little for PyTorch's defaults, whose
cache fragments on variable lengths (the step runs out of memory), and what expandable segments
and headroom's policy are for. Each run reports where it ran out, if it did, its device calls
(allocations and frees, mappings and unmappings) and its step time: what device calls cost a
policy that keeps its peak low.

With --bench, each process instead times warm malloc+free pairs through
torch.cuda.caching_allocator_alloc / caching_allocator_delete, which go to the current
allocator: PyTorch's own, or headroom's plug-in.

    cargo build --release -p headroom-torch
    python3 scripts/gpu/train_allocators.py --out gpu-results [--steps 300] [--bench | --edge]

Needs torch with CUDA, transformers, and the plug-in (target/release/libheadroom_torch.so, or
--lib, or HEADROOM_TORCH_LIB). Without a GPU it says so and exits 2.
"""

import argparse
import json
import os
import subprocess
import sys
import time

MODES = ("native", "expandable", "headroom")


def fail(msg):
    print(f"train_allocators: {msg}", file=sys.stderr)
    sys.exit(2)


def worker(args):
    """One allocator's run, in this process; prints one JSON object."""
    if args.mode == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch

    if not torch.cuda.is_available():
        fail("needs a CUDA GPU (torch.cuda.is_available() is False)")
    if args.limit_bytes:
        # The same limit for every allocator: a fraction of the device, set before the first allocation.
        fraction = args.limit_bytes / args.total_bytes
        if args.mode == "headroom":
            os.environ["HEADROOM_ALLOC_CONF"] = f"per_process_memory_fraction:{fraction:.6f}"
        else:
            torch.cuda.set_per_process_memory_fraction(fraction, 0)
    if args.mode == "headroom":
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
        from headroom_gpu import torch_allocator

        torch_allocator.use(args.lib, policy=args.policy)
    if args.bench:
        return bench(torch, args)
    import random

    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=1024, n_layer=24, n_head=16, n_positions=args.max_seq, vocab_size=50257)
    config._attn_implementation = "sdpa"
    model = transformers.GPT2LMHeadModel(config).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    lengths = random.Random(1).choices(range(args.min_seq, args.max_seq + 1), k=args.steps)
    data = torch.Generator().manual_seed(2)
    snapshot = args.mode != "headroom" and args.snapshot_steps > 0
    if snapshot:
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    losses, times = [], []
    oom_at_step = None
    for step, seq in enumerate(lengths):
        tokens = torch.randint(0, config.vocab_size, (args.batch, seq), generator=data).cuda()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
            opt.step()
        except torch.OutOfMemoryError:
            if not args.limit_bytes:
                raise
            oom_at_step = step
            break
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if snapshot and step + 1 == args.snapshot_steps:
            path = os.path.join(args.out, f"{args.mode}-gpt2-medium-b{args.batch}.pickle")
            torch.cuda.memory._dump_snapshot(path)
            torch.cuda.memory._record_memory_history(enabled=None)
    if args.mode == "headroom":
        from headroom_gpu import torch_allocator

        stats = torch_allocator.memory_stats(0, args.lib)
    else:
        stats = torch.cuda.memory_stats(0)
    warm = times[min(10, len(times) - 1):] or [float("nan")]
    print(json.dumps({
        "mode": args.mode, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "total_memory_bytes": torch.cuda.get_device_properties(0).total_memory, "limit_bytes": args.limit_bytes,
        "peak_reserved_bytes": stats["reserved_bytes.all.peak"], "peak_allocated_bytes": stats["allocated_bytes.all.peak"],
        "num_device_alloc": stats.get("num_device_alloc"), "num_device_free": stats.get("num_device_free"),
        "num_alloc_retries": stats.get("num_alloc_retries"), "oom_at_step": oom_at_step,
        "step_time_s": sum(warm) / len(warm), "losses": losses,
    }))


def bench(torch, args):
    """Warm malloc+free pairs through whichever allocator is current."""
    sizes = [512, 4096, 1 << 20, 8 << 20]
    out = {"mode": args.mode, "device": torch.cuda.get_device_name(0), "pairs": args.pairs, "ns_per_pair": {}}
    for size in sizes:
        for _ in range(1000):  # warm: the cache holds a block of this size from here on
            torch.cuda.caching_allocator_delete(torch.cuda.caching_allocator_alloc(size))
        t0 = time.perf_counter_ns()
        for _ in range(args.pairs):
            torch.cuda.caching_allocator_delete(torch.cuda.caching_allocator_alloc(size))
        out["ns_per_pair"][str(size)] = (time.perf_counter_ns() - t0) / args.pairs
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu-results", help="directory for snapshots and results.json")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--min-seq", type=int, default=128)
    ap.add_argument("--max-seq", type=int, default=1024)
    ap.add_argument("--snapshot-steps", type=int, default=3, help="steps recorded in the native runs' snapshots")
    ap.add_argument("--policy", default="headroom", help="headroom's policy: pytorch, expandable, headroom, tight, lifetime or planned")
    ap.add_argument("--lib", default=os.environ.get("HEADROOM_TORCH_LIB", "target/release/libheadroom_torch.so"))
    ap.add_argument("--bench", action="store_true", help="time warm malloc+free pairs instead of training")
    ap.add_argument("--pairs", type=int, default=100_000)
    ap.add_argument("--edge", action="store_true", help="run every allocator under a limit just above the step's peak allocated")
    ap.add_argument("--edge-margin", type=float, default=0.05, help="with --edge: the limit's room above the peak allocated")
    ap.add_argument("--limit-bytes", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--total-bytes", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps < 1 or args.batch < 1 or not 1 <= args.min_seq <= args.max_seq:
        fail("--steps and --batch must be at least 1, and --min-seq at most --max-seq")
    os.makedirs(args.out, exist_ok=True)
    if args.mode:
        return worker(args)
    try:
        import torch
    except ImportError:
        fail("needs torch (with CUDA)")
    if not torch.cuda.is_available():
        fail("needs a CUDA GPU (torch.cuda.is_available() is False)")
    if not os.path.isfile(args.lib):
        fail(f"{args.lib}: no plug-in; build it with `cargo build --release -p headroom-torch`")
    extra = []
    if args.edge:
        # The probe: the step's peak allocated under PyTorch's allocator, with no limit.
        probe_steps = str(min(args.steps, 20))
        cmd = [sys.executable, __file__, "--mode", "native", "--snapshot-steps", "0"] + sys.argv[1:] + ["--steps", probe_steps]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"the probe run failed:\n{r.stderr}")
        peak = json.loads(r.stdout.strip().splitlines()[-1])["peak_allocated_bytes"]
        # The device's size is read here, in the parent: in a headroom worker any CUDA call
        # before the swap initializes PyTorch's allocator, and PyTorch then refuses the swap.
        total = torch.cuda.get_device_properties(0).total_memory
        extra = [
            "--limit-bytes", str(int(peak * (1 + args.edge_margin))),
            "--total-bytes", str(total),
            "--snapshot-steps", "0",
        ]
    results = []
    for mode in MODES:
        cmd = [sys.executable, __file__, "--mode", mode] + [a for a in sys.argv[1:]] + extra
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"the {mode} run failed:\n{r.stderr}")
        results.append(json.loads(r.stdout.strip().splitlines()[-1]))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    if args.bench:
        sizes = list(results[0]["ns_per_pair"])
        print("| allocator | " + " | ".join(f"{s} B" for s in sizes) + " |")
        print("|---|" + "---:|" * len(sizes))
        for r in results:
            print(f"| {r['mode']} | " + " | ".join(f"{r['ns_per_pair'][s]:.0f} ns" for s in sizes) + " |")
        return
    base = results[0]
    print(f"{base['device']}, torch {base['torch']}: GPT-2 medium, batch {args.batch}, "
          f"sequences {args.min_seq}-{args.max_seq}, {args.steps} steps")
    if args.edge:
        print(f"under a limit of {base['limit_bytes'] / 2**30:.2f} GiB (the probe's peak allocated + {args.edge_margin:.0%})")
        print("| allocator | ran out at step | peak reserved | device allocs + frees | step time |")
        print("|---|---:|---:|---:|---:|")
        for r in results:
            print(f"| {r['mode']} | {r['oom_at_step'] if r['oom_at_step'] is not None else '-'} | "
                  f"{r['peak_reserved_bytes'] / 2**30:.2f} GiB | {r['num_device_alloc']} + {r['num_device_free']} | "
                  f"{r['step_time_s'] * 1e3:.1f} ms |")
        return
    print("| allocator | peak reserved | peak allocated | device mallocs | step time | vs native | max loss difference |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        diff = max(abs(a - b) for a, b in zip(r["losses"], base["losses"]))
        print(f"| {r['mode']} | {r['peak_reserved_bytes'] / 2**30:.2f} GiB | {r['peak_allocated_bytes'] / 2**30:.2f} GiB | "
              f"{r['num_device_alloc']} | {r['step_time_s'] * 1e3:.1f} ms | "
              f"{(r['step_time_s'] / base['step_time_s'] - 1) * 100:+.1f}% | {diff:.2e} |")


if __name__ == "__main__":
    main()
