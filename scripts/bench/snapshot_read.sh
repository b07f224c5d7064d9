#!/usr/bin/env bash
# Reading a 100 MB memory snapshot: headroom's reader beside CPython's pickle.load
# (garbage collector on and off), in rounds on the same file, time and peak memory;
# then replay speed (docs/PERFORMANCE.md, "Reading snapshots"). Usage:
#   bash scripts/bench/snapshot_read.sh [ROUNDS]
# The file is the one the snapshot issue's figures were measured on (same bytes):
# ../shared/fixtures' ZidongLiu trace repeated 50 times by synth_snapshot.py.
# A second, a training snapshot (Wedsonlin, GPT medium) grown by grow_snapshot.py,
# has fewer stacks and more entries.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
fixtures=$root/../shared/fixtures/pytorch-snapshots
rounds=${1:-5}
cargo build -q --release -p headroom-trace --example read_snapshot --manifest-path "$root/Cargo.toml"
reader=$root/target/release/examples/read_snapshot
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 "$root/scripts/bench/synth_snapshot.py" "$fixtures/ZidongLiu__DeComFL__edd30e09__memory.pickle" 50 "$work/synth100.pickle"
echo "synth100.pickle sha256: $(sha256sum "$work/synth100.pickle" | cut -c1-16) (the issue's: 2b9434b51214d83e)"
python3 "$root/scripts/bench/read_compare.py" "$reader" "$work/synth100.pickle" "$rounds"
rm "$work/synth100.pickle"
python3 "$root/scripts/bench/grow_snapshot.py" "$fixtures/Wedsonlin__assignment2-systems__8630bcfe__results_medium_1024_training_memory_snapshot.pickle" "$work/big.pickle"
python3 "$root/scripts/bench/read_compare.py" "$reader" "$work/big.pickle" "$rounds"
t() { /usr/bin/time -f "$1: %e s, %M KB peak RSS" "${@:2}" > "$work/out" 2> "$work/err" || true; tail -1 "$work/err"; }

# Replay speed: a consistent 1,000,000-operation run, written as a snapshot by headroom; each
# pass timed on its own (start state, check, what-if), then the whole `headroom replay`.
cargo build -q --release -p headroom-cli --manifest-path "$root/Cargo.toml"
H=$root/target/release/headroom
python3 "$root/scripts/bench/load_trace.py" "$work/load1m.jsonl"
"$H" replay "$work/load1m.jsonl" --capacity 1PiB --snapshot-out "$work/run.pickle" --max-entries 4294967296 > /dev/null
for i in 1 2; do "$reader" "$work/run.pickle" --replay; done
t "headroom replay run.pickle (read, check, what-if)" "$H" replay "$work/run.pickle" --capacity 1PiB
