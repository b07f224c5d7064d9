#!/usr/bin/env bash
# The HTML report, unchanged: `inspect --html` of every snapshot in the fixtures and the
# GPU measurements' snapshots, and of each FILE given, compared byte for byte (page, printed
# output and exit status) with an older build's (docs/PERFORMANCE.md, "inspect, eighth
# round"). Usage:
#   BEFORE=/path/to/an/older/headroom NOW=/path/to/headroom bash scripts/bench/inspect_html_same.sh [FILE...]
# Prints each page that differs and exits 1 if any does.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
: "${BEFORE:?set BEFORE to an older build of headroom}"
H=${NOW:-$root/target/release/headroom}
fixtures=${FIXTURES:-$root/../shared/fixtures/pytorch-snapshots}
gpu=${GPU_SNAPSHOTS:-$root/../shared/gpu/snapshots}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
differ=0
pages=0
for f in "$fixtures"/* "$gpu"/* "$@"; do
    [ -e "$f" ] || continue
    b=0; n=0
    # The same page path for both builds: the printed output names it.
    timeout 600 "$BEFORE" inspect "$f" --html "$work/page.html" > "$work/before.out" 2>&1 || b=$?
    mv "$work/page.html" "$work/before.html" 2>/dev/null || rm -f "$work/before.html"
    timeout 600 "$H" inspect "$f" --html "$work/page.html" > "$work/now.out" 2>&1 || n=$?
    mv "$work/page.html" "$work/now.html" 2>/dev/null || rm -f "$work/now.html"
    pages=$((pages + 1))
    same=1
    if [ "$b" != "$n" ] || ! cmp -s "$work/before.out" "$work/now.out"; then same=0; fi
    if [ -e "$work/before.html" ] || [ -e "$work/now.html" ]; then
        cmp -s "$work/before.html" "$work/now.html" 2>/dev/null || same=0
    fi
    if [ "$same" = 0 ]; then
        echo "differs (exit $b, now $n): inspect $f --html"
        differ=1
    fi
    rm -f "$work/before.html" "$work/now.html"
done
[ "$differ" = 0 ] && echo "$pages pages byte-identical to BEFORE's, with the same output and exit status"
exit "$differ"
