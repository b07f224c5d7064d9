#!/usr/bin/env bash
# The recorder's time and memory on one step, two builds alternated in one sitting, and the bytes
# each wrote compared: `headroom_gpu record` under /usr/bin/time -v, ROUNDS times each.
#
#   BEFORE=OLD/python AFTER=python PYTHON=python3 bash scripts/bench/record.sh ROUNDS -- RECORD-ARGS...
#   BEFORE=/tmp/old/python AFTER=python bash scripts/bench/record.sh 2 -- \
#       --model data/models/presets/llama-3-70b.json --batch 1 --seq 4096 --dtype bf16
#
# BEFORE and AFTER are directories holding a headroom_gpu package (a checkout's python/, or a
# copy of it from `git archive`). Each run prints its user and system CPU seconds, wall seconds,
# peak RSS and the load average as it ended: on a shared machine the CPU time is the figure, the
# wall time says how much of a CPU the run got.
set -euo pipefail

rounds=${1:?usage: record.sh ROUNDS -- RECORD-ARGS...}
shift
[ "${1:-}" = "--" ] && shift
python=${PYTHON:-python3}
before=${BEFORE:?BEFORE: a directory holding the headroom_gpu package to compare against}
after=${AFTER:-python}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

printf '%-6s %5s %8s %8s %8s %9s  %s\n' build round user_s sys_s wall_s rss_mib load
for round in $(seq 1 "$rounds"); do
    for build in before after; do
        dir=$before
        [ "$build" = after ] && dir=$after
        log="$out/$build.$round.time"
        PYTHONPATH="$dir" /usr/bin/time -v "$python" -m headroom_gpu record "$@" --out "$out/$build.$round.jsonl" \
            > "$out/$build.$round.log" 2> "$log"
        user=$(awk -F': ' '/User time/ {print $2}' "$log")
        sys=$(awk -F': ' '/System time/ {print $2}' "$log")
        wall=$(awk -F': ' '/Elapsed \(wall/ {n = split($2, p, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + p[i]; print s}' "$log")
        rss=$(awk -F': ' '/Maximum resident/ {printf "%.0f", $2 / 1024}' "$log")
        printf '%-6s %5s %8s %8s %8s %9s  %s\n' "$build" "$round" "$user" "$sys" "$wall" "$rss" \
            "$(cut -d' ' -f1-3 /proc/loadavg)"
    done
done
for round in $(seq 1 "$rounds"); do
    if cmp -s "$out/before.$round.jsonl" "$out/after.$round.jsonl"; then
        echo "round $round: the same bytes ($(wc -l < "$out/after.$round.jsonl") lines)"
    else
        echo "round $round: the programs differ" >&2
        exit 1
    fi
done
