#!/usr/bin/env bash
# The checkpointing solver end to end beside rotor's own (docs/PERFORMANCE.md, "Optimal
# checkpointing"), on rotor's benchmark instance: homogeneous chains of 50 to 400 stages,
# forward 1, backward 2, activations of 5 slots, saved data of 10, a budget of 500 slots.
# For each length, headroom and rotor run in turn, ROUNDS times, each under /usr/bin/time;
# both print their makespan (rotor's C solver: 152, 353, 754, 1556). Usage:
#   bash scripts/bench/checkpoint.sh [ROTOR_ALGORITHMS_DIR [ROUNDS [STAGES...]]]
# ROTOR_ALGORITHMS_DIR is rotor's rotor/algorithms folder with its C extension built in place
# (`python3 setup.py build_ext --inplace` there, numpy installed); without it only headroom runs.
# PYTHON names the interpreter that has numpy (default python3); BEFORE, an older build of
# headroom to run in the same rounds.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
rotor=${1:-}
rounds=${2:-3}
shift $(( $# < 2 ? $# : 2 ))
sizes=${*:-50 100 200 400}
py=${PYTHON:-python3}
cargo build -q --release -p headroom-cli --manifest-path "$root/Cargo.toml"
H=$root/target/release/headroom
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
t() { /usr/bin/time -f "%e s wall, %U s user, %M KB peak RSS" "${@:2}" > "$work/out" 2> "$work/time" || true; echo "  $1: $(head -c 200 "$work/out" | tr '\n' ' ')$(tail -1 "$work/time")"; }
for stages in $sizes; do
    python3 - "$stages" > "$work/rotor$stages.json" <<'PY'
import json, sys
n = int(sys.argv[1])
stage = lambda i: {"name": f"layer{i}", "forward_time": 1.0, "backward_time": 2.0, "output_bytes": 5, "saved_bytes": 10}
print(json.dumps({"input_bytes": 5, "stages": [stage(i) for i in range(n)]}))
PY
    echo "$stages stages x 500 slots"
    for _ in $(seq "$rounds"); do
        if [ -n "${BEFORE:-}" ]; then
            t "before" sh -c "'$BEFORE' checkpoint '$work/rotor$stages.json' --budget 500 --slots 500 --json | python3 -c 'import json,sys; print(\"makespan\", json.load(sys.stdin)[\"time\"])'"
        fi
        t "headroom" sh -c "'$H' checkpoint '$work/rotor$stages.json' --budget 500 --slots 500 --json | python3 -c 'import json,sys; print(\"makespan\", json.load(sys.stdin)[\"time\"])'"
        if [ -n "$rotor" ]; then
            t "rotor" "$py" "$root/scripts/bench/rotor_persistent.py" "$rotor" "$stages" 500
        fi
    done
done
