#!/usr/bin/env python3
"""Device calls per training step and their device time, per policy, on the
training traces of the fixtures and on the GPU snapshots (docs/PERFORMANCE.md,
"Device calls and their time on a GPU"). Runs `headroom replay SNAPSHOT
--policy pytorch --policy expandable --policy headroom --policy tight --json` on each and
prints a Markdown table. Usage:

    cargo build --release -p headroom-cli
    python3 scripts/bench/device_calls.py [HEADROOM] [SHARED]

HEADROOM defaults to target/release/headroom, SHARED to ../shared beside the
checkout. With --against-expandable it prints instead, for every device trace
of the fixtures, the GPU snapshots and the bundled snapshot, replayed from an
empty device as `headroom replay SNAPSHOT --policy expandable --policy headroom`
does: peak reserved and device calls (maps + unmaps) of both, their ratio,
and whether headroom keeps its promise there (reserved no more than
expandable's, calls at most 1.25 times), then the count (docs/PERFORMANCE.md). Device time is what the calls take at the published per-call costs
of `headroom_alloc::DeviceCosts::PUBLISHED`; steps are told apart by the
optimizer's frames, and "steady" is every step after the second.
"""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
AGAINST = "--against-expandable" in sys.argv
ARGS = [a for a in sys.argv[1:] if a != "--against-expandable"]
HEADROOM = ARGS[0] if len(ARGS) > 0 else str(ROOT / "target/release/headroom")
SHARED = pathlib.Path(ARGS[1] if len(ARGS) > 1 else ROOT.parent / "shared")
POLICIES = ["pytorch", "expandable", "headroom", "tight"]


def training(name):
    """A training trace: named so (as tests/policies.rs does), or with more than one step."""
    return "train" in name or "step" in name


def replay_devices(path, policies):
    """Each device's runs, one per policy, of the devices that have a trace."""
    args = [HEADROOM, "replay", str(path), "--json"] + [a for p in policies for a in ("--policy", p)]
    out = subprocess.run(args, capture_output=True, text=True)
    # Snapshots recorded without a trace have no runs to compare.
    if out.returncode == 2 and "error: nothing" in out.stderr:
        return []
    if out.returncode not in (0, 1):
        sys.exit(f"{path}: {out.stderr}")
    return [(d["device"], d["runs"]) for d in json.loads(out.stdout)["devices"] if d["runs"]]


def replay(path):
    return next((runs for _, runs in replay_devices(path, POLICIES)), [])


def against_expandable(snapshots):
    print("| snapshot | device | `expandable` peak GiB | calls | `headroom` peak GiB | calls | calls ratio | promise |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    kept = total = 0
    for path in snapshots:
        for device, (e, h) in replay_devices(path, ["expandable", "headroom"]):
            ce, ch = (r["num_device_alloc"] + r["num_device_free"] for r in (e, h))
            pe, ph = e["peak_reserved_bytes"], h["peak_reserved_bytes"]
            if ce == 0 and ch == 0:
                continue
            ok = ph <= pe and 4 * ch <= 5 * ce
            total += 1
            kept += ok
            name = path.name.removesuffix(".pickle.gz").removesuffix(".pickle")
            print(f"| {name} | {device} | {pe / 2**30:.2f} | {ce} | {ph / 2**30:.2f} | {ch} | {ch / ce:.2f} | {'kept' if ok else 'missed'} |")
    print(f"\nKept on {kept} of {total} device traces.")


def main():
    snapshots = sorted((SHARED / "fixtures/pytorch-snapshots").glob("*.pickle"))
    snapshots += sorted((SHARED / "gpu/snapshots").glob("*.pickle.gz"))
    if AGAINST:
        return against_expandable(snapshots + [ROOT / "data/snapshots/qwen3-1.7b-train.pickle.gz"])
    print("| snapshot | steps | " + " | ".join(f"`{p}` peak GiB / calls by step / steady / device ms" for p in POLICIES) + " |")
    print("|---|---:|" + "---|" * len(POLICIES))
    for path in snapshots:
        runs = replay(path)
        if not runs:
            continue
        steps = len(runs[0]["calls_by_step"])
        if not (training(path.name) or steps > 2):
            continue
        cells = []
        for r in runs:
            by_step = r["calls_by_step"]
            shown = " ".join(map(str, by_step)) if len(by_step) <= 4 else " ".join(map(str, by_step[:3])) + f" … {by_step[-1]}"
            steady = "-" if r["steady_state_calls"] is None else r["steady_state_calls"]
            cells.append(f"{r['peak_reserved_bytes'] / 2**30:.2f} / {shown} / {steady} / {r['device_ns'] / 1e6:.0f}")
        name = path.name.removesuffix(".pickle.gz").removesuffix(".pickle")
        print(f"| {name} | {steps} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
