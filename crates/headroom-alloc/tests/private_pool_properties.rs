//! Property tests for private pools: random captures (begun, ended, their
//! pools released) mixed with requests, frees, cross-stream uses and
//! flushes, under several configurations. After every step the allocator's
//! invariants hold, every live block lies in a segment of the pool its
//! request was diverted to, and a pool still in use never gives memory back.
//! At the end, with every capture ended, every pool released and every block
//! freed, a flush returns every byte and forgets every pool.

use headroom_alloc::units::MIB;
use headroom_alloc::{AllocatorConfig, DeviceCachingAllocator, MempoolId, SimDevice, DEFAULT_MEMPOOL};
use proptest::prelude::*;
use std::collections::BTreeMap;

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        size: u64,
        stream: u64,
    },
    Free {
        pick: usize,
    },
    RecordStream {
        pick: usize,
        stream: u64,
    },
    CompleteEvents,
    EmptyCache,
    /// Capture into pool `(pool, 0)` on `stream`.
    Begin {
        pool: u64,
        stream: u64,
    },
    End {
        pick: usize,
    },
    Release {
        pool: u64,
    },
    EmptyPool {
        pool: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![4 => 1u64..=MIB, 3 => MIB + 1..10 * MIB, 1 => 10 * MIB..60 * MIB];
    prop_oneof![
        10 => (size, 0u64..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        7 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => (any::<usize>(), 0u64..3).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
        2 => Just(Op::CompleteEvents),
        1 => Just(Op::EmptyCache),
        2 => (1u64..4, 0u64..3).prop_map(|(pool, stream)| Op::Begin { pool, stream }),
        2 => any::<usize>().prop_map(|pick| Op::End { pick }),
        1 => (1u64..4).prop_map(|pool| Op::Release { pool }),
        1 => (1u64..4).prop_map(|pool| Op::EmptyPool { pool }),
    ]
}

const CONFIGS: [&str; 3] = ["", "expandable_segments:True", "max_split_size_mb:40"];

fn run(conf: &str, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut a = DeviceCachingAllocator::new(SimDevice::new(1 << 36), AllocatorConfig::parse(conf).unwrap());
    // The model: captures underway (pool, stream), oldest first; each pool's users.
    let mut captures: Vec<(MempoolId, u64)> = Vec::new();
    let mut users: BTreeMap<MempoolId, u32> = BTreeMap::new();
    let mut live: Vec<(u64, MempoolId)> = Vec::new();
    let fail = |step: usize, m: String| TestCaseError::fail(format!("step {step} in `{conf}`: {m}"));
    for (step, op) in ops.iter().enumerate() {
        let reserved_in_use: BTreeMap<MempoolId, u64> =
            a.private_pools().iter().filter(|p| p.use_count > 0).map(|p| (p.id, p.reserved_bytes)).collect();
        match *op {
            Op::Alloc { size, stream } => {
                let want = captures.iter().rev().find(|c| c.1 == stream).map_or(DEFAULT_MEMPOOL, |c| c.0);
                let b = a.malloc(size, stream).map_err(|e| fail(step, e.to_string()))?;
                live.push((b.ptr, want));
            }
            Op::Free { pick } if !live.is_empty() => {
                let (ptr, _) = live.swap_remove(pick % live.len());
                a.free(ptr).map_err(|e| fail(step, e.to_string()))?;
            }
            Op::RecordStream { pick, stream } if !live.is_empty() => {
                a.record_stream(live[pick % live.len()].0, stream).map_err(|e| fail(step, e.to_string()))?;
            }
            Op::CompleteEvents => a.device_mut().complete_all_events(),
            Op::EmptyCache => a.empty_cache().map_err(|e| fail(step, e.to_string()))?,
            Op::Begin { pool, stream } => {
                let id = (pool, 0);
                let released = users.get(&id) == Some(&0) && a.pool_use_count(id).is_some();
                let busy = captures.iter().any(|c| c.0 == id);
                let r = a.begin_allocate_to_pool(id, Box::new(move |s| s == stream));
                if busy || released {
                    prop_assert!(r.is_err(), "step {}: a capture into {:?} was accepted", step, id);
                } else {
                    r.map_err(|e| fail(step, e.to_string()))?;
                    captures.push((id, stream));
                    *users.entry(id).or_default() += 1;
                }
            }
            Op::End { pick } if !captures.is_empty() => {
                let (id, _) = captures.remove(pick % captures.len());
                a.end_allocate_to_pool(id).map_err(|e| fail(step, e.to_string()))?;
            }
            Op::Release { pool } => {
                let id = (pool, 0);
                // A capture underway holds its use; release only the uses beyond those.
                let held = captures.iter().filter(|c| c.0 == id).count() as u32;
                match users.get_mut(&id) {
                    Some(n) if *n > held => {
                        a.release_pool(id).map_err(|e| fail(step, e.to_string()))?;
                        *n -= 1;
                    }
                    _ => {}
                }
            }
            Op::EmptyPool { pool } => a.empty_cache_pool((pool, 0)).map_err(|e| fail(step, e.to_string()))?,
            _ => {}
        }
        a.validate().map_err(|v| fail(step, format!("({op:?}) {v}")))?;
        prop_assert_eq!(a.reserved_bytes(), a.device().used_bytes());
        let snap = a.snapshot();
        for &(ptr, want) in &live {
            let seg = snap.segments.iter().find(|s| s.address <= ptr && ptr < s.address + s.total_size);
            prop_assert_eq!(seg.map(|s| s.segment_pool_id), Some(want), "step {}: block {:#x}", step, ptr);
        }
        for p in a.private_pools() {
            if let Some(&before) = reserved_in_use.get(&p.id) {
                prop_assert!(p.reserved_bytes >= before, "step {}: pool {:?} in use gave memory back", step, p.id);
            }
        }
        users.retain(|id, _| a.pool_use_count(*id).is_some());
    }
    for (id, _) in captures.drain(..) {
        a.end_allocate_to_pool(id).unwrap();
    }
    for (&id, &n) in &users {
        for _ in 0..n {
            a.release_pool(id).unwrap();
        }
    }
    for (ptr, _) in live.drain(..) {
        a.free(ptr).unwrap();
    }
    a.device_mut().complete_all_events();
    a.empty_cache().unwrap();
    a.validate().map_err(|v| TestCaseError::fail(v.to_string()))?;
    prop_assert_eq!(a.reserved_bytes(), 0);
    prop_assert!(a.private_pools().is_empty(), "pools left: {:?}", a.private_pools());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn pools_keep_the_invariants_and_their_memory(conf in 0..CONFIGS.len(), ops in proptest::collection::vec(op(), 1..160)) {
        run(CONFIGS[conf], &ops)?;
    }
}
