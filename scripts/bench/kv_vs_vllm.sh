#!/usr/bin/env bash
# headroom's KV block manager beside vLLM's own BlockPool, in one run (docs/PERFORMANCE.md,
# "Paged KV cache"). Fetches the pinned vLLM wheel without its dependencies (no torch), unpacks
# the four files the block pool needs, runs scripts/bench/vllm_block_pool.py on them, then
# `cargo bench -p headroom-kv --bench kv` on the same workloads; then block hashing again, the two
# in turn three times, so that a machine whose load drifts weighs on both alike. Usage:
#   bash scripts/bench/kv_vs_vllm.sh [VLLM_VERSION]     (default 0.33.0)
# PYTHON names the interpreter (default python3); with the xxhash package installed in it, vLLM's
# xxhash option is timed too.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
version=${1:-0.33.0}
py=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps "vllm==$version" -d "$work"
python3 - "$work" <<'PY'
import glob, sys, zipfile
files = ["vllm/v1/core/block_pool.py", "vllm/v1/core/kv_cache_utils.py", "vllm/utils/hashing.py", "vllm/utils/math_utils.py"]
zipfile.ZipFile(glob.glob(f"{sys.argv[1]}/vllm-*.whl")[0]).extractall(f"{sys.argv[1]}/unpacked", files)
PY
echo "== vLLM $version BlockPool (CPython $("$py" -c 'import platform; print(platform.python_version())'))"
"$py" "$root/scripts/bench/vllm_block_pool.py" "$work/unpacked"
echo "== headroom"
cargo bench -q -p headroom-kv --bench kv --manifest-path "$root/Cargo.toml" -- \
    'block_alloc_free|block_hash|prefix_cache|request_cycle|scheduler' 2>&1 | grep -E 'time:|thrpt:|^[a-z_]+/|request_cycle:'
for round in 1 2 3; do
    echo "== block hashing, round $round: vLLM, then headroom"
    "$py" "$root/scripts/bench/vllm_block_pool.py" "$work/unpacked" --hash-only
    cargo bench -q -p headroom-kv --bench kv --manifest-path "$root/Cargo.toml" -- block_hash 2>&1 | grep -E 'time:'
done
