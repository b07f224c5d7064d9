#!/usr/bin/env bash
# `headroom inspect` on a 100 MB memory snapshot beside PyTorch's own
# `_memory_viz.py stats` (standard library only), time and peak memory, on the
# same file (docs/PERFORMANCE.md, "Inspecting snapshots"). Usage:
#   bash scripts/bench/inspect.sh [MEMORY_VIZ_PY] [FIXTURE]
# MEMORY_VIZ_PY defaults to the installed torch's torch/cuda/_memory_viz.py.
# FIXTURE is grown to ~100 MB as scripts/bench/snapshot_read.sh grows it.
# With BEFORE=/path/to/an/older/headroom, the report must not have changed:
# `inspect --json` of every fixture beside FIXTURE and of the grown snapshot is
# compared byte for byte with BEFORE's (any difference fails the script), and
# the two are timed in five alternated pairs.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
viz=${1:-$(python3 -c 'import torch.cuda._memory_viz as m; print(m.__file__)')}
fixture=${2:-$root/../shared/fixtures/pytorch-snapshots/Wedsonlin__assignment2-systems__8630bcfe__results_medium_1024_training_memory_snapshot.pickle}
cargo build -q --release -p headroom-cli --manifest-path "$root/Cargo.toml"
H=$root/target/release/headroom
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$viz" "$work/memory_viz.py"
python3 "$root/scripts/bench/grow_snapshot.py" "$fixture" "$work/big.pickle"
echo "file: $(stat -c %s "$work/big.pickle") bytes"
t() { /usr/bin/time -f "$1: %e s, %U s user, %M KB peak RSS" "${@:2}" > /dev/null 2> "$work/err" || true; tail -1 "$work/err"; }
for i in 1 2; do
    t "headroom inspect" "$H" inspect "$work/big.pickle"
    t "headroom inspect --html" "$H" inspect "$work/big.pickle" --html "$work/report.html"
    t "_memory_viz.py stats" python3 "$work/memory_viz.py" stats "$work/big.pickle"
done
echo "report: $(stat -c %s "$work/report.html") bytes"
if [ -n "${BEFORE:-}" ]; then
    differ=0
    for f in "$(dirname "$fixture")"/* "$work/big.pickle"; do
        "$BEFORE" inspect "$f" --json > "$work/before.json" 2>&1 || true
        "$H" inspect "$f" --json > "$work/now.json" 2>&1 || true
        cmp -s "$work/before.json" "$work/now.json" || { echo "report differs: $f"; differ=1; }
    done
    [ "$differ" = 0 ] && echo "inspect --json: byte-identical to BEFORE's on every fixture and the grown snapshot"
    for i in 1 2 3 4 5; do
        echo "load $(cut -d' ' -f1 /proc/loadavg)"
        t "before" "$BEFORE" inspect "$work/big.pickle"
        t "now" "$H" inspect "$work/big.pickle"
    done
    exit "$differ"
fi
