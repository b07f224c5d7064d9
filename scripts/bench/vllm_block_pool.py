"""vLLM's own BlockPool on the workloads of crates/headroom-kv/benches/kv.rs.

Loads vLLM's real block_pool.py, kv_cache_utils.py, hashing.py and math_utils.py from an
unpacked vLLM wheel (scripts/bench/kv_vs_vllm.sh fetches the pinned one, without torch) and
stands in small modules for what they import only for features these paths do not touch
(events, metrics, multimodal, configs). Prints one line per benchmark: the median of three
runs, per block or per call as kv.rs measures it. Usage:

    python3 scripts/bench/vllm_block_pool.py UNPACKED_WHEEL_DIR [--hash-only]
"""

import random
import statistics
import sys
import time
import types
from collections import deque

POOL = 65_536
BS = 16


def load_vllm(root):
    """Import vllm.v1.core.block_pool from `root` with stand-ins for its heavy imports."""

    def package(name, path=None):
        m = types.ModuleType(name)
        m.__path__ = [path] if path else []
        sys.modules[name] = m
        return m

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    class Anything:
        def __init__(self, *a, **k):
            pass

        def __class_getitem__(cls, item):
            return cls

    vllm = package("vllm", f"{root}/vllm")
    package("vllm.v1", f"{root}/vllm/v1")
    package("vllm.v1.core", f"{root}/vllm/v1/core")
    package("vllm.utils", f"{root}/vllm/utils")
    package("vllm.distributed")
    package("vllm.multimodal")
    import logging

    module("vllm.logger", init_logger=logging.getLogger)
    vllm.envs = module("vllm.envs")
    module("vllm.config", VllmConfig=Anything)
    module(
        "vllm.distributed.kv_events",
        MEDIUM_GPU="GPU",
        AllBlocksCleared=Anything,
        BlockRemoved=Anything,
        BlockStored=Anything,
        KVCacheEvent=Anything,
    )
    module("vllm.multimodal.utils", get_mm_features_in_window=lambda *a, **k: (0, []))
    module("vllm.v1.core.kv_cache_metrics", KVCacheMetricsCollector=Anything)
    module("vllm.v1.request", Request=Anything)
    module("vllm.v1.utils", tensor_data=lambda t: t)
    module("vllm.v1.kv_cache_spec_registry", KVCacheSpecRegistry=Anything)
    module(
        "vllm.v1.kv_cache_interface",
        KVCacheConfig=Anything,
        KVCacheGroupSpec=Anything,
        KVCacheSpec=Anything,
        MambaSpec=Anything,
        UniformTypeKVCacheSpecs=Anything,
        iter_layer_specs=lambda *a, **k: [],
    )
    if "cbor2" not in sys.modules:
        try:
            import cbor2  # noqa: F401  (only sha256_cbor uses it)
        except ImportError:
            module("cbor2", dumps=None)
    import vllm.v1.core.block_pool as bp
    import vllm.v1.core.kv_cache_utils as ku
    from vllm.utils.hashing import sha256

    ku.init_none_hash(sha256)
    return bp, ku, sha256


class Req:
    """What BlockPool.cache_full_blocks reads of a request."""

    def __init__(self, block_hashes):
        self.block_hashes = block_hashes


def median_ns(fn, ops, runs=3):
    times = []
    for _ in range(runs):
        t = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t) / ops)
    return statistics.median(times)


def hash_rows(ku, sha256, rng, n):
    """Hashing one 16-token block after the seed, as kv.rs's block_hash measures it."""
    tokens = [rng.randrange(128_000) for _ in range(BS)]
    none = ku.NONE_HASH

    def hashing():
        for _ in range(n):
            ku.hash_block_tokens(sha256, none, tokens, None)

    print(f"block hash, 16 tokens: {median_ns(hashing, n):.0f} ns")

    # vLLM's faster option (--prefix-caching-hash-algo xxhash: xxh3_128 of the same pickle), when
    # the xxhash package is installed. It is not collision-resistant against chosen inputs.
    from vllm.utils import hashing as vh

    if vh._xxhash is not None:

        def hashing_xxhash():
            for _ in range(n):
                ku.hash_block_tokens(vh.xxhash, none, tokens, None)

        print(f"block hash, 16 tokens, xxhash: {median_ns(hashing_xxhash, n):.0f} ns")


def main(root, hash_only=False):
    bp, ku, sha256 = load_vllm(root)
    rng = random.Random(1234)
    if hash_only:
        hash_rows(ku, sha256, rng, 200_000)
        return

    def block_hashes(tokens):
        out, parent = [], None
        for i in range(0, len(tokens) - len(tokens) % BS, BS):
            parent = ku.hash_block_tokens(sha256, parent, tokens[i : i + BS], None)
            out.append(parent)
        return out

    n = 200_000
    for caching in (False, True):
        name = "on" if caching else "off"
        pool = bp.BlockPool(POOL, caching, BS)

        def one():
            for _ in range(n):
                pool.free_blocks(pool.get_new_blocks(1))

        print(f"block allocate + free, 1 per call, caching {name}: {median_ns(one, n):.0f} ns")

        def sixteen():
            for _ in range(n // 16):
                pool.free_blocks(reversed(pool.get_new_blocks(16)))

        print(f"block allocate + free, 16 per call, caching {name}: {median_ns(sixteen, n // 16 * 16):.0f} ns per block")
        live = deque(pool.get_new_blocks(16) for _ in range(2048))

        def steady():
            for _ in range(n // 16):
                pool.free_blocks(reversed(live.popleft()))
                live.append(pool.get_new_blocks(16))

        print(f"steady 2,048 x 16, caching {name}: {median_ns(steady, n // 16 * 16):.0f} ns per block")

    hash_rows(ku, sha256, rng, n)

    def cached_pool(seed_rng):
        pool = bp.BlockPool(POOL, True, BS)
        prompts = []
        for _ in range(400):
            p = [seed_rng.randrange(128_000) for _ in range(128 * BS)]
            blocks = pool.get_new_blocks(128)
            pool.cache_full_blocks(Req(block_hashes(p)), blocks, 0, 128, BS, 0)
            pool.free_blocks(reversed(blocks))
            prompts.append(p)
        return pool, prompts

    def query(q_rng, prompts):
        base = prompts[q_rng.randrange(len(prompts))]
        shared = q_rng.randint(0, 128) * BS
        return base[:shared] + [q_rng.randrange(128_000) for _ in range(shared, 128 * BS)]

    pool, prompts = cached_pool(random.Random(1234))
    queries = [block_hashes(query(rng, prompts)) for _ in range(2000)]
    lookups = sum(sum(1 for _ in take_hits(pool, hs)) + 1 for hs in queries)

    def lookup():
        for hs in queries:
            for h in hs:
                if pool.get_cached_block(h, [0]) is None:
                    break

    print(f"prefix-cache lookup until the first miss: {median_ns(lookup, lookups):.0f} ns")

    requests = [Req(block_hashes(query(rng, prompts))) for _ in range(16_000)]

    def cycle():
        pool, _ = cached_pool(random.Random(1234))
        t = time.perf_counter_ns()
        for r in requests:
            hits = []
            for h in r.block_hashes[:127]:
                b = pool.get_cached_block(h, [0])
                if b is None:
                    break
                hits.append(b[0])
            pool.touch(hits)
            blocks = hits + pool.get_new_blocks(128 - len(hits))
            pool.cache_full_blocks(r, blocks, len(hits), 128, BS, 0)
            pool.free_blocks(reversed(blocks))
        return time.perf_counter_ns() - t

    times = sorted(cycle() / len(requests) for _ in range(3))
    print(f"request cycle, 128 blocks: {times[1] / 1000:.0f} us")


def take_hits(pool, hashes):
    for h in hashes:
        if pool.get_cached_block(h, [0]) is None:
            return
        yield h


if __name__ == "__main__":
    main(sys.argv[1], "--hash-only" in sys.argv[2:])
