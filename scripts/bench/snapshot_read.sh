#!/usr/bin/env bash
# Reading a 100 MB memory snapshot: headroom's reader beside CPython's pickle.load
# (garbage collector on and off), time and peak memory, on the same file; then replay
# speed (docs/PERFORMANCE.md, "Reading snapshots"). Usage:
#   bash scripts/bench/snapshot_read.sh [FIXTURE]
# FIXTURE (default: a real training snapshot from ../shared/fixtures) has its trace
# repeated, entries as new dicts sharing their stacks as PyTorch shares them, to ~100 MB.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
fixture=${1:-$root/../shared/fixtures/pytorch-snapshots/Wedsonlin__assignment2-systems__8630bcfe__results_medium_1024_training_memory_snapshot.pickle}
cargo build -q --release -p headroom-trace --example read_snapshot --manifest-path "$root/Cargo.toml"
reader=$root/target/release/examples/read_snapshot
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 "$root/scripts/bench/grow_snapshot.py" "$fixture" "$work/big.pickle"
echo "file: $(stat -c %s "$work/big.pickle") bytes"
t() { /usr/bin/time -f "$1: %e s, %M KB peak RSS" "${@:2}" > "$work/out" 2> "$work/err" || true; tail -1 "$work/err"; }
for i in 1 2; do
    t "headroom reader" "$reader" "$work/big.pickle"
    t "pickle.load, gc on" python3 -c 'import pickle,sys; pickle.load(open(sys.argv[1],"rb"))' "$work/big.pickle"
    t "pickle.load, gc off" python3 -c 'import gc,pickle,sys; gc.disable(); pickle.load(open(sys.argv[1],"rb"))' "$work/big.pickle"
done
cat "$work/out"

# Replay speed: a consistent 1,000,000-operation run, written as a snapshot by headroom; each
# pass timed on its own (start state, check, what-if), then the whole `headroom replay`.
cargo build -q --release -p headroom-cli --manifest-path "$root/Cargo.toml"
H=$root/target/release/headroom
python3 "$root/scripts/bench/load_trace.py" "$work/load1m.jsonl"
"$H" replay "$work/load1m.jsonl" --capacity 1PiB --snapshot-out "$work/run.pickle" --max-entries 4294967296 > /dev/null
for i in 1 2; do "$reader" "$work/run.pickle" --replay; done
t "headroom replay run.pickle (read, check, what-if)" "$H" replay "$work/run.pickle" --capacity 1PiB
