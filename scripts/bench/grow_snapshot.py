"""Grows a real snapshot to ~100 MB (or MB megabytes) for the snapshot benchmarks: its
trace repeated, entries as new dicts sharing their stacks as PyTorch shares them.
Usage: python3 grow_snapshot.py FIXTURE OUT [MB]"""
import pickle
import sys

snap = pickle.load(open(sys.argv[1], "rb"))
trace = snap["device_traces"][0]
copies = []
target = int(sys.argv[3]) if len(sys.argv) > 3 else 100
while sum(map(len, copies)) * 75 < target * 1_000_000:
    copies.append([dict(e) for e in trace])
snap["device_traces"][0] = [e for c in copies for e in c]
with open(sys.argv[2], "wb") as f:
    pickle.dump(snap, f, protocol=4)
