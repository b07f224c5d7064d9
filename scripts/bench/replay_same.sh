#!/usr/bin/env bash
# Every decision of a replay, unchanged: `--json` of `inspect`, `replay --check`,
# `replay --alloc-conf expandable_segments:True` and `replay --policy headroom` on
# every fixture and on each FILE given, compared byte for byte (and by exit
# status) with an older build's (docs/PERFORMANCE.md, "Replay passes, fourth
# round"). Usage:
#   BEFORE=/path/to/an/older/headroom bash scripts/bench/replay_same.sh [FILE...]
# NOW names the build under test (default: this tree's release build, built first).
# Prints each output that differs and exits 1 if any does.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
: "${BEFORE:?set BEFORE to an older build of headroom}"
fixtures=${FIXTURES:-$root/../shared/fixtures/pytorch-snapshots}
if [ -z "${NOW:-}" ]; then
    cargo build -q --release -p headroom-cli --manifest-path "$root/Cargo.toml"
fi
H=${NOW:-$root/target/release/headroom}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
differ=0
outputs=0
for f in "$fixtures"/*.pickle "$fixtures"/*.json "$@"; do
    [ -e "$f" ] || continue
    for args in "inspect --json" "replay --check --json" "replay --alloc-conf expandable_segments:True --json" "replay --policy headroom --json"; do
        set -- $args
        cmd=$1
        shift
        b=0; n=0
        timeout 600 "$BEFORE" "$cmd" "$f" "$@" > "$work/before" 2>&1 || b=$?
        timeout 600 "$H" "$cmd" "$f" "$@" > "$work/now" 2>&1 || n=$?
        outputs=$((outputs + 1))
        if [ "$b" != "$n" ] || ! cmp -s "$work/before" "$work/now"; then
            echo "differs (exit $b, now $n): $cmd $f $*"
            differ=1
        fi
    done
done
[ "$differ" = 0 ] && echo "$outputs outputs byte-identical to BEFORE's, with the same exit status"
exit "$differ"
