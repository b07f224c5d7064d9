//! Allocator benchmarks (figures in docs/PERFORMANCE.md):
//!
//! - `warm_pair`: one malloc + free of a size already cached, for a small and
//!   a large size, on the single-threaded allocator and through the mutex
//!   (the difference is the lock's cost);
//! - `random_allocations`: RMM's workload — sizes uniform in [1, max] MiB, a
//!   random mix of allocations and frees, live memory capped at 16,000 MiB;
//!   prints peak reserved / peak allocated for each case once;
//! - `threads`: warm pairs from 1, 2 and 4 threads, each on its own stream,
//!   sharing one allocator;
//! - `policies`: host time per operation of each named policy (`pytorch`,
//!   `expandable`, `headroom`) side by side, on RMM's workload and as warm
//!   pairs; prints each policy's peak reserved / peak allocated once.
//!
//! `cargo bench -p headroom-alloc --bench allocator`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use headroom_alloc::units::{GIB, MIB};
use headroom_alloc::{AllocatorConfig, CachingAllocator, DeviceCachingAllocator, Policy, PolicyName, SimDevice};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn warm_pair(c: &mut Criterion) {
    let mut g = c.benchmark_group("warm_pair");
    for (name, size) in [("small_4KiB", 4096u64), ("large_64MiB", 64 * MIB)] {
        let mut a = DeviceCachingAllocator::new(SimDevice::new(80 * GIB), AllocatorConfig::default());
        let b = a.malloc(size, 0).unwrap();
        a.free(b.ptr).unwrap();
        g.bench_function(BenchmarkId::new("unlocked", name), |bench| {
            bench.iter(|| {
                let b = a.malloc(black_box(size), 0).unwrap();
                a.free(b.ptr).unwrap();
            })
        });
        let shared = CachingAllocator::new(SimDevice::new(80 * GIB), AllocatorConfig::default());
        let b = shared.malloc(size, 0).unwrap();
        shared.free(b.ptr).unwrap();
        g.bench_function(BenchmarkId::new("locked", name), |bench| {
            bench.iter(|| {
                let b = shared.malloc(black_box(size), 0).unwrap();
                shared.free(b.ptr).unwrap();
            })
        });
    }
    g.finish();
}

enum Op {
    Alloc(u64),
    Free(usize),
}

/// RMM `random_allocations`: allocate or free with equal probability while
/// something is live; an allocation that would exceed the cap frees instead.
fn rmm_workload(count: usize, max_mib: u64, seed: u64) -> Vec<Op> {
    const CAP: u64 = 16_000 * MIB;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut live: Vec<u64> = Vec::new();
    let mut live_bytes = 0u64;
    let mut ops = Vec::with_capacity(2 * count);
    let mut allocs = 0;
    while allocs < count || !live.is_empty() {
        let size = rng.random_range(1..=max_mib * MIB);
        let alloc = allocs < count && (live.is_empty() || rng.random_bool(0.5)) && live_bytes + size <= CAP;
        if alloc {
            ops.push(Op::Alloc(size));
            live.push(size);
            live_bytes += size;
            allocs += 1;
        } else {
            let i = rng.random_range(0..live.len());
            live_bytes -= live.swap_remove(i);
            ops.push(Op::Free(i));
        }
    }
    ops
}

/// Runs the workload; returns (peak reserved, peak allocated).
fn run_workload<P: Policy>(a: &mut DeviceCachingAllocator<SimDevice, P>, ops: &[Op]) -> (i64, i64) {
    let mut live: Vec<u64> = Vec::new();
    for op in ops {
        match *op {
            Op::Alloc(s) => live.push(a.malloc(s, 0).expect("fits in 80 GiB").ptr),
            Op::Free(i) => a.free(live.swap_remove(i)).unwrap(),
        }
    }
    let s = a.stats();
    (s.reserved_bytes.all().peak, s.allocated_bytes.all().peak)
}

fn random_allocations(c: &mut Criterion) {
    let mut g = c.benchmark_group("random_allocations");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    for count in [1_000usize, 10_000, 100_000] {
        for max_mib in [1u64, 4, 64, 256, 1024, 4096] {
            let ops = rmm_workload(count, max_mib, 42);
            let mut a = DeviceCachingAllocator::new(SimDevice::new(80 * GIB), AllocatorConfig::default());
            let (reserved, allocated) = run_workload(&mut a, &ops);
            eprintln!(
                "random_allocations/{count}x{max_mib}MiB: {} ops, peak reserved / peak allocated = {:.3}",
                ops.len(),
                reserved as f64 / allocated as f64
            );
            g.throughput(Throughput::Elements(ops.len() as u64));
            g.bench_function(BenchmarkId::new(format!("{count}"), format!("{max_mib}MiB")), |b| {
                b.iter_batched(
                    || DeviceCachingAllocator::new(SimDevice::new(80 * GIB), AllocatorConfig::default()),
                    |mut a| run_workload(&mut a, &ops),
                    criterion::BatchSize::LargeInput,
                )
            });
        }
    }
    g.finish();
}

fn threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("threads");
    const PAIRS: u64 = 20_000;
    for n in [1u64, 2, 4] {
        g.throughput(Throughput::Elements(PAIRS * n));
        g.bench_function(BenchmarkId::new("warm_pair_4KiB", n), |b| {
            b.iter_custom(|iters| {
                let a = Arc::new(CachingAllocator::new(SimDevice::new(80 * GIB), AllocatorConfig::default()));
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    std::thread::scope(|s| {
                        for stream in 0..n {
                            let a = Arc::clone(&a);
                            s.spawn(move || {
                                for _ in 0..PAIRS {
                                    let blk = a.malloc(black_box(4096), stream).unwrap();
                                    a.free(blk.ptr).unwrap();
                                }
                            });
                        }
                    });
                    total += start.elapsed();
                }
                total
            })
        });
    }
    g.finish();
}

fn policies(c: &mut Criterion) {
    let mut g = c.benchmark_group("policies");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    let fresh = |p: PolicyName| {
        DeviceCachingAllocator::with_policy(SimDevice::new(80 * GIB), AllocatorConfig::default(), p.build())
    };
    for max_mib in [4u64, 64] {
        let ops = rmm_workload(10_000, max_mib, 42);
        for p in PolicyName::ALL {
            let (reserved, allocated) = run_workload(&mut fresh(p), &ops);
            eprintln!(
                "policies/{p}/10000x{max_mib}MiB: peak reserved / peak allocated = {:.3}",
                reserved as f64 / allocated as f64
            );
            g.throughput(Throughput::Elements(ops.len() as u64));
            g.bench_function(BenchmarkId::new(p.name(), format!("10000x{max_mib}MiB")), |b| {
                b.iter_batched(|| fresh(p), |mut a| run_workload(&mut a, &ops), criterion::BatchSize::LargeInput)
            });
        }
    }
    g.throughput(Throughput::Elements(1));
    for p in PolicyName::ALL {
        let mut a = fresh(p);
        let b = a.malloc(64 * MIB, 0).unwrap();
        a.free(b.ptr).unwrap();
        g.bench_function(BenchmarkId::new(p.name(), "warm_pair_64MiB"), |bench| {
            bench.iter(|| {
                let b = a.malloc(black_box(64 * MIB), 0).unwrap();
                a.free(b.ptr).unwrap();
            })
        });
    }
    g.finish();
}

criterion_group!(benches, warm_pair, random_allocations, threads, policies);
criterion_main!(benches);
