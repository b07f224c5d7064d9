#!/usr/bin/env bash
# Time and peak memory of headroom on long or infeasible inputs (docs/PERFORMANCE.md,
# "When nothing fits" and "Bounded memory on long inputs"). Usage:
#   cargo build --release -p headroom-cli && bash scripts/bench/long_inputs.sh [BINARY]
set -euo pipefail
H=${1:-target/release/headroom}
H=$(realpath "$H")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

# Rotor's instance in MiB: 199 stages and the loss, activations 5 MiB, saved data 10 MiB.
python3 -c 'import json; print(json.dumps({"input_bytes": 5 << 20, "stages": [{"forward_time": 1, "backward_time": 2, "output_bytes": 5 << 20, "saved_bytes": 10 << 20}] * 199}))' > r200.json

python3 "$here/load_trace.py" load1m.jsonl   # 1,000,000 operations

run() {
    local label=$1; shift
    /usr/bin/time -f "$label: %e s, %M KB peak RSS, exit %x" "$@" > /dev/null 2> err.txt || true
    tail -1 err.txt
}
run "checkpoint, 200 stages, budget 20 MiB" "$H" checkpoint r200.json --budget 20MiB
run "kv simulate --requests 100000" "$H" kv simulate --model llama-3-8b --gpu h100-sxm --requests 100000
run "replay 1M ops --snapshot-out" "$H" replay load1m.jsonl --snapshot-out s.pickle
echo "snapshot: $(stat -c %s s.pickle) bytes"
run "replay 1M ops --snapshot-out, every entry" "$H" replay load1m.jsonl --snapshot-out all.pickle --max-entries 4294967296
echo "snapshot: $(stat -c %s all.pickle) bytes"
run "replay 1M ops" "$H" replay load1m.jsonl
