#!/usr/bin/env bash
# The report, unchanged: `inspect` (text) and `inspect --json` of every snapshot in
# the fixtures and the GPU measurements' snapshots, and of each FILE given, compared
# byte for byte (and by exit status) with an older build's (docs/PERFORMANCE.md,
# "inspect, fifth round"). Usage:
#   BEFORE=/path/to/an/older/headroom bash scripts/bench/inspect_same.sh [FILE...]
# NOW names the build under test (default: this tree's release build, built first).
# Prints each output that differs and exits 1 if any does.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
: "${BEFORE:?set BEFORE to an older build of headroom}"
fixtures=${FIXTURES:-$root/../shared/fixtures/pytorch-snapshots}
gpu=${GPU_SNAPSHOTS:-$root/../shared/gpu/snapshots}
if [ -z "${NOW:-}" ]; then
    cargo build -q --release -p headroom-cli --manifest-path "$root/Cargo.toml"
fi
H=${NOW:-$root/target/release/headroom}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
differ=0
outputs=0
for f in "$fixtures"/* "$gpu"/* "$@"; do
    [ -e "$f" ] || continue
    for json in "" "--json"; do
        b=0; n=0
        # shellcheck disable=SC2086
        timeout 600 "$BEFORE" inspect "$f" $json > "$work/before" 2>&1 || b=$?
        # shellcheck disable=SC2086
        timeout 600 "$H" inspect "$f" $json > "$work/now" 2>&1 || n=$?
        outputs=$((outputs + 1))
        if [ "$b" != "$n" ] || ! cmp -s "$work/before" "$work/now"; then
            echo "differs (exit $b, now $n): inspect $f $json"
            differ=1
        fi
    done
done
[ "$differ" = 0 ] && echo "$outputs outputs byte-identical to BEFORE's, with the same exit status"
exit "$differ"
