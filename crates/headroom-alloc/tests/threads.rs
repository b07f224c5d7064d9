//! The `Send + Sync` allocator under several threads at once: six threads
//! malloc, free, record_stream, complete events and empty the cache at random
//! on four streams, over three settings and many seeds; the validator runs
//! while they work and after, and once every block is freed and every event
//! done, nothing is left allocated or reserved.

use headroom_alloc::units::MIB;
use headroom_alloc::{AllocError, AllocatorConfig, CachingAllocator, SimDevice};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const CAPACITY: u64 = 512 * MIB;

fn worker(a: &CachingAllocator<SimDevice>, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut live: Vec<u64> = Vec::new();
    for i in 0..1500 {
        let stream = rng.random_range(0..4u64);
        match rng.random_range(0..20) {
            0..=7 => {
                let size = match rng.random_range(0..3) {
                    0 => rng.random_range(1..=MIB),
                    1 => rng.random_range(MIB + 1..10 * MIB),
                    _ => rng.random_range(10 * MIB..40 * MIB),
                };
                match a.malloc(size, stream) {
                    Ok(b) => live.push(b.ptr),
                    Err(AllocError::OutOfMemory(r) | AllocError::OverLimit(r)) => {
                        assert!(r.reserved <= CAPACITY && r.allocated <= r.reserved, "{r:?}")
                    }
                    Err(e) => panic!("malloc({size}) on stream {stream}: {e}"),
                }
            }
            8..=14 if !live.is_empty() => {
                let ptr = live.swap_remove(rng.random_range(0..live.len()));
                a.free(ptr).unwrap();
            }
            15..=16 if !live.is_empty() => {
                let ptr = live[rng.random_range(0..live.len())];
                a.record_stream(ptr, stream).unwrap();
            }
            17 => a.with_device(|d| d.complete_events_on(stream)),
            18 if i % 50 == 0 => a.empty_cache().unwrap(),
            _ => {}
        }
        if i % 101 == 0 {
            a.validate().unwrap_or_else(|e| panic!("seed {seed}, step {i}: {e}"));
        }
    }
    for ptr in live {
        a.free(ptr).unwrap();
    }
}

#[test]
fn many_threads_on_many_streams_keep_every_invariant() {
    for conf in ["", "expandable_segments:True", "max_split_size_mb:40,garbage_collection_threshold:0.7"] {
        for seed in 0..12u64 {
            let a = CachingAllocator::new(SimDevice::new(CAPACITY), AllocatorConfig::parse(conf).unwrap());
            if conf.contains("garbage") {
                a.set_memory_fraction(0.8).unwrap();
            }
            std::thread::scope(|s| {
                for t in 0..6 {
                    let a = &a;
                    s.spawn(move || worker(a, seed * 1000 + t));
                }
            });
            a.validate().unwrap();
            a.with_device(|d| d.complete_all_events());
            a.empty_cache().unwrap();
            a.validate().unwrap();
            let stats = a.memory_stats();
            assert_eq!(stats["allocated_bytes.all.current"], 0, "{conf} seed {seed}");
            assert_eq!(stats["reserved_bytes.all.current"], 0, "{conf} seed {seed}: the cache empties");
            assert_eq!(a.with_device(|d| d.used_bytes()), 0, "{conf} seed {seed}: the device has it all back");
        }
    }
}
