"""headroom's snapshot reader beside CPython's pickle.load (garbage collector
on and off) on the same file, run after one another in rounds so a busy
machine slows all three alike: each read's own time (the process start and
exit not counted), its peak RSS, the median and best of the rounds, and
headroom's speed as a ratio to each. Usage:
    python3 read_compare.py READER FILE [ROUNDS]"""
import os
import statistics
import subprocess
import sys

LOAD = """
import gc, pickle, resource, sys, time
if sys.argv[2] == "off":
    gc.disable()
t = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    pickle.load(f)
print(time.perf_counter() - t)
"""


def run(cmd, parse):
    out = subprocess.run(["/usr/bin/time", "-f", "%M"] + cmd, capture_output=True, text=True, check=True)
    rss_kb = int(out.stderr.strip().splitlines()[-1])
    return parse(out.stdout), rss_kb


def main():
    reader, path = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    size = os.path.getsize(path)
    rows = {
        "headroom": lambda: run([reader, path], lambda o: float(o.split("read in ")[1].split(" s")[0])),
        "pickle.load, gc on": lambda: run([sys.executable, "-c", LOAD, path, "on"], float),
        "pickle.load, gc off": lambda: run([sys.executable, "-c", LOAD, path, "off"], float),
    }
    times = {k: [] for k in rows}
    rss = {k: 0 for k in rows}
    for _ in range(rounds):
        for name, go in rows.items():
            t, kb = go()
            times[name].append(t)
            rss[name] = max(rss[name], kb)
    print(f"file: {path}, {size} bytes, {rounds} rounds")
    print("| reader | median | best | MB/s (median) | peak RSS | RSS / file |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in rows:
        med, best = statistics.median(times[name]), min(times[name])
        print(f"| {name} | {med:.3f} s | {best:.3f} s | {size / med / 1e6:.0f} | "
              f"{rss[name] / 1024:.0f} MiB | {rss[name] * 1024 / size:.2f}x |")
    ours = statistics.median(times["headroom"])
    for name in list(rows)[1:]:
        r = [p / h for p, h in zip(times[name], times["headroom"])]
        print(f"headroom vs {name}: {statistics.median(times[name]) / ours:.2f}x faster "
              f"(per round {min(r):.2f}-{max(r):.2f}x)")


if __name__ == "__main__":
    main()
