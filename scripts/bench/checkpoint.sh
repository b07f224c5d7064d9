#!/usr/bin/env bash
# The checkpointing solver end to end on rotor's benchmark instance (docs/PERFORMANCE.md,
# "Optimal checkpointing"): homogeneous chains of 50, 100 and 200 stages, forward 1,
# backward 2, activations of 5 slots, saved data of 10, a budget of 500 slots. Prints each
# makespan (rotor's C solver: 152, 353, 754), the time and the peak memory. Usage:
#   bash scripts/bench/checkpoint.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cargo build -q --release -p headroom-cli --manifest-path "$root/Cargo.toml"
H=$root/target/release/headroom
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for stages in 50 100 200; do
    python3 - "$stages" > "$work/rotor$stages.json" <<'PY'
import json, sys
n = int(sys.argv[1])
stage = lambda i: {"name": f"layer{i}", "forward_time": 1.0, "backward_time": 2.0, "output_bytes": 5, "saved_bytes": 10}
print(json.dumps({"input_bytes": 5, "stages": [stage(i) for i in range(n)]}))
PY
    /usr/bin/time -f "%e s, %M KB peak RSS" "$H" checkpoint "$work/rotor$stages.json" --budget 500 --slots 500 --json \
        > "$work/out.json" 2> "$work/time" || true
    makespan=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["time"])' "$work/out.json")
    echo "$stages stages: makespan $makespan, $(tail -1 "$work/time")"
done
