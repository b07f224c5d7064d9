"""The 100 MB snapshot the snapshot issue's figures were measured on: a real
trace (ZidongLiu/DeComFL, 23,105 entries) repeated REPS times (50 makes
100,350,578 bytes, sha256 2b9434b51214d83e...), each repetition with entry
dicts of its own, later in time by the trace's span plus a millisecond, and
frames lists of its own (shared among its entries as in the recording); the
frame dicts themselves stay shared, as PyTorch shares them in a long run.
Usage: python3 synth_snapshot.py FIXTURE REPS OUT"""
import pickle
import sys

fixture, reps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with open(fixture, "rb") as f:
    snap = pickle.load(f)
device = next(d for d, trace in enumerate(snap["device_traces"]) if trace)
trace = snap["device_traces"][device]
span = trace[-1]["time_us"] - trace[0]["time_us"] + 1000
grown = []
for rep in range(reps):
    shift = rep * span
    copies = {}  # one copy per frames list of the recording, per repetition
    for entry in trace:
        e = dict(entry)
        if "time_us" in e:
            e["time_us"] = entry["time_us"] + shift
        frames = entry.get("frames")
        if frames is not None:
            e["frames"] = copies.setdefault(id(frames), list(frames))
        grown.append(e)
snap["device_traces"][device] = grown
notes = snap.get("external_annotations") or []
snap["external_annotations"] = [dict(a, time_us=a["time_us"] + rep * span) for rep in range(reps) for a in notes]
with open(out, "wb") as f:
    pickle.dump(snap, f, protocol=4)
