#!/usr/bin/env python3
"""The large segments of a run, in the order PyTorch's allocator made them, and what holds them
at the end: a GPU's snapshot beside the plan's program replayed through headroom's allocator.

Reserved memory is the sum of the segments `cudaMalloc` made; where the plan's allocated peak is
right and its reserved is not, the two runs made different segments, and the first segment one
made and the other did not names the request that differs. Each segment of at least `--min`
bytes is listed with the request that made it (a GPU snapshot's innermost Python frame outside
torch, or the program's tensor id), then each such segment's live blocks at the end: what kept
the segment from serving the request that had to make a new one.

    python3 scripts/validate/segments.py GPU.pickle[.gz] [--program JOB.jsonl --headroom BIN --capacity BYTES]
    python3 scripts/validate/segments.py --program JOB.jsonl --headroom BIN --capacity BYTES

`GPU.pickle` is what `torch.cuda.memory._dump_snapshot` wrote with the history recorded from
before the job's first request (scripts/gpu/validate_plan.py --snapshots writes one a job, and
the job's program beside it); `JOB.jsonl` is `headroom plan --dump-program`'s trace of the same
job, replayed here on a device of `--capacity` bytes (the plan's `capacity_bytes`).
"""

import argparse
import gzip
import json
import os
import pickle
import subprocess
import sys
import tempfile

MIB = 1 << 20


def load(path):
    """A snapshot, pickled or JSON, gzip-compressed or not."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        snap = json.loads(raw) if raw.lstrip()[:1] == b"{" else pickle.loads(raw)
    except (OSError, EOFError, ValueError, pickle.UnpicklingError) as e:
        raise SystemExit(f"segments: {path}: not a readable snapshot ({e})") from None
    if not isinstance(snap, dict) or "segments" not in snap:
        raise SystemExit(f"segments: {path}: not a PyTorch memory snapshot (no segments)")
    return snap


def _frame_label(frames):
    """The innermost Python frame outside torch itself (the model's, the loss's, the script's),
    else the innermost frame; a replayed snapshot's requests carry none."""
    python = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    for f in python:
        name = str(f["filename"])
        if "/torch/" not in name:
            return f"{os.path.basename(name)}:{f.get('line')} {f.get('name')}"
    if python:
        f = python[0]
        return f"{os.path.basename(str(f['filename']))}:{f.get('line')} {f.get('name')}"
    return ""


def program_ids(path):
    """The program's tensor ids in the order it requests them (the replay's requests, one for one)."""
    ids = []
    with open(path) as f:
        for line in f:
            op = json.loads(line)
            if op.get("op") == "alloc":
                ids.append(str(op["id"]))
    return ids


def history(snapshot, names=None):
    """(segments made, live blocks at the end, reserved at the end) of device 0's trace.
    Segments: (request ordinal, bytes, address, label of the request that made it). Live
    blocks: address -> (bytes, label). `names`: the program's ids, the replay's request labels."""
    traces = snapshot.get("device_traces") or [[]]
    trace = next((t for t in traces if t), [])
    made, live, pending = [], {}, None
    n = 0
    for e in trace:
        action = e.get("action")
        if action == "segment_alloc":
            pending = (e["addr"], e["size"])
        elif action == "alloc":
            label = names[n] if names is not None and n < len(names) else _frame_label(e.get("frames") or [])
            live[e["addr"]] = (e["size"], label)
            if pending is not None and pending[0] == e["addr"]:
                made.append((n, pending[1], pending[0], label))
            pending = None
            n += 1
        elif action in ("free_completed",):
            live.pop(e["addr"], None)
    reserved = sum(s["total_size"] for s in snapshot.get("segments", []))
    return made, live, reserved, n


def describe(title, snapshot, names, min_bytes, out):
    made, live, reserved, requests = history(snapshot, names)
    segs = snapshot.get("segments", [])
    out.write(f"{title}: {reserved / MIB:,.0f} MiB reserved in {len(segs)} segments, {requests:,} requests traced\n")
    big = [m for m in made if m[1] >= min_bytes]
    out.write(f"  segments of {min_bytes / MIB:,.0f} MiB or more, in the order they were made:\n")
    for i, (n, size, _addr, label) in enumerate(big, 1):
        out.write(f"  {i:3d} {size / MIB:9,.0f} MiB  request {n:6d}  {label}\n")
    order = {addr: i for i, (_n, _size, addr, _label) in enumerate(big, 1)}
    out.write("  at the end, what each holds:\n")
    for s in sorted(segs, key=lambda s: order.get(s["address"], 0)):
        if s["total_size"] < min_bytes:
            continue
        lo, hi = s["address"], s["address"] + s["total_size"]
        held = sorted((a, v) for a, v in live.items() if lo <= a < hi)
        used = sum(v[0] for _, v in held)
        which = f"segment {order[lo]:3d}" if lo in order else "made before the trace"
        out.write(f"  {which}, {s['total_size'] / MIB:,.0f} MiB: {used / MIB:,.1f} MiB live in {len(held)} blocks\n")
        for a, (size, label) in held[:6]:
            out.write(f"        +{(a - lo) / MIB:8,.1f} {size / MIB:9,.1f} MiB  {label}\n")
        if len(held) > 6:
            out.write(f"        ... {len(held) - 6} more\n")
    return [m[1] for m in big]


def first_difference(a, b):
    """The first position where the two runs' large segments differ in size, or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def replay(headroom, program, capacity):
    """The plan's program replayed by headroom; its final snapshot (JSON)."""
    with tempfile.TemporaryDirectory() as tmp:
        snap = os.path.join(tmp, "plan.json")
        try:
            r = subprocess.run([headroom, "replay", program, "--capacity", str(capacity), "--snapshot-out", snap],
                               capture_output=True, text=True)
        except OSError as e:
            raise SystemExit(f"segments: cannot run {headroom} ({e.strerror}); give --headroom the binary") from None
        if r.returncode != 0:
            raise SystemExit(f"segments: headroom replay {program} failed ({r.returncode}): {r.stderr.strip()}")
        with open(snap) as f:
            return json.load(f)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("snapshot", nargs="?", help="a GPU's snapshot of the job (torch.cuda.memory._dump_snapshot)")
    ap.add_argument("--program", help="the plan's program of the same job (headroom plan --dump-program)")
    ap.add_argument("--headroom", default="target/debug/headroom", help="the headroom binary that replays --program")
    ap.add_argument("--capacity", type=int, help="device bytes the program is replayed on (the plan's capacity_bytes)")
    ap.add_argument("--min", type=float, default=1024, help="list segments of at least this many MiB (default 1024)")
    args = ap.parse_args(argv)
    if not args.snapshot and not args.program:
        ap.error("give a snapshot, a --program, or both")
    if args.program and not args.capacity:
        ap.error("--program needs --capacity (the plan's capacity_bytes)")
    min_bytes = int(args.min * MIB)
    sizes = []
    if args.snapshot:
        sizes.append(describe(f"GPU {args.snapshot}", load(args.snapshot), None, min_bytes, sys.stdout))
    if args.program:
        snap = replay(args.headroom, args.program, args.capacity)
        sizes.append(describe(f"plan {args.program}", snap, program_ids(args.program), min_bytes, sys.stdout))
    if len(sizes) == 2:
        i = first_difference(*sizes)
        if i is None:
            print("the same large segments, in the same order")
        else:
            def size(run):
                return f"{run[i] / MIB:,.0f} MiB" if i < len(run) else "none"

            print(f"first difference: large segment {i + 1}: GPU {size(sizes[0])}, plan {size(sizes[1])}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
