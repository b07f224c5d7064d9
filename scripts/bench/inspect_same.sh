#!/usr/bin/env bash
# The report, unchanged: `inspect` (text) and `inspect --json` of every snapshot in the
# fixtures and the GPU measurements' snapshots, and of each FILE given, compared byte for
# byte (and by exit status) with an older build's (docs/PERFORMANCE.md, "inspect, fifth
# round"). With --html, the HTML report instead: `inspect --html PAGE` of the same files,
# the page and the printed output compared ("inspect, eighth round"). Usage:
#   BEFORE=/path/to/an/older/headroom bash scripts/bench/inspect_same.sh [--html] [FILE...]
# NOW names the build under test (default: this tree's release build, built first).
# Prints each output that differs and exits 1 if any does.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
: "${BEFORE:?set BEFORE to an older build of headroom}"
html=0
if [ "${1:-}" = "--html" ]; then
    html=1
    shift
fi
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

# The text and the JSON report of $1, by both builds.
same_reports() {
    local f=$1 json b n
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
}

# The HTML page of $1 and what `inspect --html` prints, by both builds.
same_page() {
    local f=$1 b=0 n=0 same=1
    # The same page path for both builds: the printed output names it.
    timeout 600 "$BEFORE" inspect "$f" --html "$work/page.html" > "$work/before.out" 2>&1 || b=$?
    mv "$work/page.html" "$work/before.html" 2>/dev/null || rm -f "$work/before.html"
    timeout 600 "$H" inspect "$f" --html "$work/page.html" > "$work/now.out" 2>&1 || n=$?
    mv "$work/page.html" "$work/now.html" 2>/dev/null || rm -f "$work/now.html"
    outputs=$((outputs + 1))
    if [ "$b" != "$n" ] || ! cmp -s "$work/before.out" "$work/now.out"; then same=0; fi
    if [ -e "$work/before.html" ] || [ -e "$work/now.html" ]; then
        cmp -s "$work/before.html" "$work/now.html" 2>/dev/null || same=0
    fi
    if [ "$same" = 0 ]; then
        echo "differs (exit $b, now $n): inspect $f --html"
        differ=1
    fi
    rm -f "$work/before.html" "$work/now.html"
}

for f in "$fixtures"/* "$gpu"/* "$@"; do
    [ -e "$f" ] || continue
    if [ "$html" = 1 ]; then same_page "$f"; else same_reports "$f"; fi
done
what=outputs
[ "$html" = 1 ] && what="pages (with their printed output)"
[ "$differ" = 0 ] && echo "$outputs $what byte-identical to BEFORE's, with the same exit status"
exit "$differ"
