//! KV-cache benchmarks in the shapes of the vLLM 0.33 block-pool measurements
//! (research/anchor-measurements.md §4): a pool of 65,536 blocks of 16 tokens.
//! Figures and the comparison are in docs/PERFORMANCE.md.
//!
//! `cargo bench -p headroom-kv --bench kv`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use headroom_kv::catalog::{gpu, model};
use headroom_kv::dist::LengthDist;
use headroom_kv::hash::{hash_block, hash_blocks, none_hash, BlockHash};
use headroom_kv::sim::{PagedScheduler, Request, SimConfig};
use headroom_kv::{BlockPool, FreeOrder, KvCacheManager, KvConfig, KvRequest};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;
use std::hint::black_box;

const POOL: u32 = 65_536;
const BS: usize = 16;

fn alloc_free(c: &mut Criterion) {
    let mut g = c.benchmark_group("block_alloc_free");
    g.throughput(Throughput::Elements(1));
    for caching in [false, true] {
        let name = if caching { "caching_on" } else { "caching_off" };
        let mut pool = BlockPool::new(POOL, caching, FreeOrder::PrependUnhashed);
        let mut out = Vec::with_capacity(16);
        g.bench_function(format!("1_per_call/{name}"), |b| {
            b.iter(|| {
                out.clear();
                pool.get_new_blocks(1, &mut out).unwrap();
                pool.free_blocks(out.iter().copied());
            })
        });
        g.throughput(Throughput::Elements(16));
        g.bench_function(format!("16_per_call/{name}"), |b| {
            b.iter(|| {
                out.clear();
                pool.get_new_blocks(16, &mut out).unwrap();
                pool.free_blocks(out.iter().rev().copied());
            })
        });
        // Steady state: 2,048 live requests of 16 blocks; free the oldest, allocate a new one.
        let mut live: VecDeque<Vec<u32>> = VecDeque::new();
        for _ in 0..2048 {
            let mut v = Vec::new();
            pool.get_new_blocks(16, &mut v).unwrap();
            live.push_back(v);
        }
        g.bench_function(format!("steady_2048x16/{name}"), |b| {
            b.iter(|| {
                let mut v = live.pop_front().unwrap();
                pool.free_blocks(v.iter().rev().copied());
                v.clear();
                pool.get_new_blocks(16, &mut v).unwrap();
                live.push_back(v);
            })
        });
        g.throughput(Throughput::Elements(1));
    }
    g.finish();
}

fn hashing(c: &mut Criterion) {
    let mut g = c.benchmark_group("block_hash");
    let mut rng = ChaCha8Rng::seed_from_u64(1234);
    let tokens: Vec<u32> = (0..BS).map(|_| rng.random_range(0..128_000)).collect();
    let parent = none_hash();
    g.throughput(Throughput::Elements(1));
    g.bench_function("one_block_16_tokens", |b| b.iter(|| hash_block(black_box(&parent), black_box(&tokens), b"")));
    g.finish();
}

/// 400 cached prompts of 128 blocks; queries share a random-length prefix of one of them.
fn cached_pool(rng: &mut ChaCha8Rng) -> (KvCacheManager, Vec<Vec<u32>>) {
    let mut kv = KvCacheManager::new(KvConfig {
        num_blocks: POOL,
        block_size: BS,
        max_model_len: 1 << 20,
        enable_caching: true,
        free_order: FreeOrder::PrependUnhashed,
        watermark: 0.0,
    });
    let mut prompts = Vec::new();
    for i in 0..400u64 {
        let p: Vec<u32> = (0..128 * BS).map(|_| rng.random_range(0..128_000)).collect();
        let r = KvRequest::new(i, p.clone(), BS, b"");
        kv.allocate_slots(&r, p.len(), &[], 0, false).unwrap();
        kv.free(i);
        prompts.push(p);
    }
    (kv, prompts)
}

fn query(rng: &mut ChaCha8Rng, prompts: &[Vec<u32>]) -> Vec<u32> {
    let base = &prompts[rng.random_range(0..prompts.len())];
    let shared = rng.random_range(0..=128usize) * BS;
    let mut q = base[..shared].to_vec();
    q.extend((shared..128 * BS).map(|_| rng.random_range(0..128_000)));
    q
}

fn prefix_cache(c: &mut Criterion) {
    let mut g = c.benchmark_group("prefix_cache");
    let mut rng = ChaCha8Rng::seed_from_u64(1234);
    let (kv, prompts) = cached_pool(&mut rng);
    let queries: Vec<Vec<BlockHash>> = (0..2000).map(|_| hash_blocks(&query(&mut rng, &prompts), BS, b"")).collect();
    let lookups: u64 = queries
        .iter()
        .map(|hs| hs.iter().take_while(|h| kv.pool().get_cached_block(h).is_some()).count() as u64 + 1)
        .sum();
    g.throughput(Throughput::Elements(lookups));
    // The lookup loop of find_longest_cache_hit: hash lookups until the first miss.
    g.bench_function("lookup_until_miss_2000_queries", |b| {
        b.iter(|| {
            let mut hits = 0usize;
            for hs in &queries {
                for h in hs {
                    if kv.pool().get_cached_block(h).is_none() {
                        break;
                    }
                    hits += 1;
                }
            }
            hits
        })
    });
    g.finish();

    // The request cycle: lookup, touch hits, allocate the rest, cache the full
    // blocks, free tail first — over 16,000 requests prepared in advance (hashes
    // included), each sample starting from the 400 cached prompts, as vLLM's was measured.
    let mut g = c.benchmark_group("request_cycle");
    g.throughput(Throughput::Elements(1));
    let (_, prompts) = cached_pool(&mut ChaCha8Rng::seed_from_u64(1234));
    let requests: Vec<KvRequest> =
        (0..16_000u64).map(|i| KvRequest::new(1_000_000 + i, query(&mut rng, &prompts), BS, b"")).collect();
    g.bench_function("128_blocks", |b| {
        b.iter_custom(|iters| {
            // Always whole passes, so the mix of hits, misses and evictions is
            // the pass's; the time is scaled to the iterations asked for.
            let passes = iters.div_ceil(requests.len() as u64).max(1);
            let mut total = std::time::Duration::ZERO;
            let mut hits = 0usize;
            for _ in 0..passes {
                let (mut kv, _) = cached_pool(&mut ChaCha8Rng::seed_from_u64(1234));
                let start = std::time::Instant::now();
                for r in &requests {
                    let (h, hit_tokens) = kv.get_computed_blocks(r);
                    hits += h.len();
                    kv.allocate_slots(r, r.num_tokens() - hit_tokens, &h, 0, false).unwrap();
                    kv.free(r.id);
                }
                total += start.elapsed();
            }
            black_box(hits);
            total.mul_f64(iters as f64 / (passes * requests.len() as u64) as f64)
        })
    });
    // The pass's hit fraction, for the record.
    let (mut kv, _) = cached_pool(&mut ChaCha8Rng::seed_from_u64(1234));
    let hits: usize = requests
        .iter()
        .map(|r| {
            let (h, t) = kv.get_computed_blocks(r);
            kv.allocate_slots(r, r.num_tokens() - t, &h, 0, false).unwrap();
            kv.free(r.id);
            h.len()
        })
        .sum();
    eprintln!(
        "request_cycle: {} of {} blocks hit ({:.0}%), {} evictions",
        hits,
        requests.len() * 128,
        100.0 * hits as f64 / (requests.len() * 128) as f64,
        kv.pool().evictions()
    );
    g.finish();
}

fn scheduler_step(c: &mut Criterion) {
    let cfg = SimConfig {
        model: model("llama-3-8b").unwrap(),
        gpu: gpu("h100-sxm").unwrap(),
        gpu_memory_utilization: 0.9,
        num_requests: 256,
        prompt_len: LengthDist::Fixed(512),
        output_len: LengthDist::Fixed(3000),
        shared_prefix: None,
        block_size: BS,
        max_batched_tokens: 8192,
        max_num_seqs: 256,
        max_model_len: 8192,
        enable_caching: true,
        num_gpu_blocks: Some(POOL),
        seed: 1,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let requests = (0..256).map(|_| Request {
        prompt: (0..512).map(|_| rng.random_range(0..128_000)).collect(),
        prompt_len: 512,
        output_len: 3000,
    });
    let budget = headroom_kv::sim::kv_budget(&cfg).unwrap();
    let mut s = PagedScheduler::new(&cfg, &budget, requests);
    // Run until all 256 requests are decoding.
    for _ in 0..40 {
        s.schedule();
        s.execute();
    }
    assert_eq!(s.num_running(), 256);
    let mut g = c.benchmark_group("scheduler");
    // Scheduling is idempotent while nothing executes: each iteration is one full decision pass.
    g.bench_function("schedule_256_decoding", |b| b.iter(|| s.schedule()));
    g.finish();
}

criterion_group!(benches, alloc_free, hashing, prefix_cache, scheduler_step);
criterion_main!(benches);
