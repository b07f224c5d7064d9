#!/usr/bin/env python3
"""Record the private-pool fixtures the replay must match (issue 44). Run on an H200 on
2026-11-28 (docs/GPU.md): the graph and MemPool recordings are data/snapshots/private-pools.

Three programs, each in its own process with PyTorch's native allocator, memory history on
from the start (`torch.cuda.memory._record_memory_history`), each dumping a snapshot whose
segments carry `segment_pool_id` other than (0, 0):

- graph: a small MLP's forward and backward captured with `torch.cuda.graph` (warm-up on a
  side stream, as PyTorch's docs do), replayed a few times, then the graph reset and
  `torch.cuda.empty_cache()` called, so that the pool's release shows in the trace;
- mempool: `torch.cuda.MemPool()` with `torch.cuda.use_mem_pool` around buffers allocated
  beside eager work, the pool deleted and emptied at the end;
- reduce_overhead: the same MLP through `torch.compile(mode="reduce-overhead")` (CUDA graphs
  of Inductor's), several steps.

Each snapshot is written to OUT/pools-<name>.pickle, then checked with this checkout's
`headroom replay SNAPSHOT --check --json` (every decision against the recorded one) and
`headroom inspect SNAPSHOT --json` (its `pools`); the results go to OUT/pools.jsonl as they
come. Copy the snapshots to ../shared/gpu/snapshots to make them the replay's fixtures.

    cargo build --release -p headroom-cli
    python3 scripts/gpu/record_pools.py --out gpu-results [--only graph,mempool,reduce_overhead]

Needs torch with CUDA (2.5 or newer for MemPool). Without a GPU it says so and exits 2.
"""

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGRAMS = ("graph", "mempool", "reduce_overhead")


def fail(msg):
    print(f"record_pools: {msg}", file=sys.stderr)
    sys.exit(2)


def mlp(torch):
    return torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
    ).cuda()


def graph(torch):
    model, opt = mlp(torch), None
    x = torch.randn(64, 1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(x).sum().backward()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = model(x)
        y.sum().backward()
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    del y, opt
    g.reset()
    torch.cuda.empty_cache()


def mempool(torch):
    pool = torch.cuda.MemPool()
    eager = [torch.empty(3 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]
    with torch.cuda.use_mem_pool(pool):
        buffers = [torch.empty((i + 1) * (5 << 20), dtype=torch.uint8, device="cuda") for i in range(3)]
    more = torch.empty(7 << 20, dtype=torch.uint8, device="cuda")
    del buffers, eager, more
    del pool
    torch.cuda.empty_cache()


def reduce_overhead(torch):
    model = torch.compile(mlp(torch), mode="reduce-overhead")
    for _ in range(6):
        # Each step's outputs live in the graph's pool until the next replay overwrites them:
        # a training loop says where a step begins (torch 2.11 refuses the backward otherwise).
        torch.compiler.cudagraph_mark_step_begin()
        x = torch.randn(64, 1024, device="cuda")
        model(x).sum().backward()
    torch.cuda.synchronize()


def worker(name, out):
    try:
        import torch
    except ImportError:
        fail("torch is not installed: this script records on a GPU with torch and CUDA")

    if not torch.cuda.is_available():
        fail("no CUDA device: this script records on a GPU")
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    globals()[name](torch)
    path = os.path.join(out, f"pools-{name}.pickle")
    torch.cuda.memory._dump_snapshot(path)
    print(path)


def headroom(*args):
    exe = os.environ.get("HEADROOM_BIN", os.path.join(ROOT, "target/release/headroom"))
    r = subprocess.run([exe, *args], capture_output=True, text=True)
    try:
        return r.returncode, json.loads(r.stdout)
    except json.JSONDecodeError:
        return r.returncode, {"stderr": r.stderr[-2000:]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default=",".join(PROGRAMS))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.worker:
        return worker(args.worker, args.out)
    with open(os.path.join(args.out, "pools.jsonl"), "a") as log:
        for name in args.only.split(","):
            if name not in PROGRAMS:
                fail(f"unknown program {name!r}: expected {', '.join(PROGRAMS)}")
            r = subprocess.run([sys.executable, __file__, "--out", args.out, "--worker", name], capture_output=True, text=True)
            if r.returncode != 0:
                log.write(json.dumps({"program": name, "error": r.stderr[-4000:]}) + "\n")
                log.flush()
                if r.returncode == 2:
                    sys.stderr.write(r.stderr)
                    sys.exit(2)
                continue
            path = r.stdout.strip().splitlines()[-1]
            check_rc, check = headroom("replay", path, "--check", "--json")
            _, report = headroom("inspect", path, "--json")
            pools = [d.get("pools") for d in report.get("devices", [])] if isinstance(report, dict) else None
            log.write(json.dumps({"program": name, "snapshot": path, "check_exit": check_rc, "check": check, "pools": pools}) + "\n")
            log.flush()
            print(f"{name}: {path}, replay --check exit {check_rc}")


if __name__ == "__main__":
    main()
