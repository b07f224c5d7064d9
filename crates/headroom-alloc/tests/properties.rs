//! Property tests: random sequences of allocator operations, under several
//! configurations, keep every invariant after every step (see `validate`),
//! and the device agrees with the statistics.

use headroom_alloc::units::MIB;
use headroom_alloc::{AllocError, AllocatorConfig, DeviceCachingAllocator, DeviceMemory, SimDevice};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: u64, stream: u64 },
    Free { pick: usize },
    RecordStream { pick: usize, stream: u64 },
    CompleteEvents { stream: Option<u64> },
    EmptyCache,
    SetFraction { fraction: f64 },
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..=MIB,              // small pool
        3 => MIB + 1..10 * MIB,       // large pool, shared 20 MiB segments
        2 => 10 * MIB..120 * MIB,     // own segments, oversize with max_split_size
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (size(), 0u64..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        7 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => (any::<usize>(), 0u64..3).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
        2 => proptest::option::of(0u64..3).prop_map(|stream| Op::CompleteEvents { stream }),
        1 => Just(Op::EmptyCache),
        1 => prop_oneof![Just(1.0), 0.3f64..1.0].prop_map(|fraction| Op::SetFraction { fraction }),
    ]
}

const CONFIGS: [&str; 6] = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:40",
    "garbage_collection_threshold:0.6",
    "roundup_power2_divisions:[64:8,256:4,>:2]",
    "max_split_size_mb:24,max_non_split_rounding_mb:32,garbage_collection_threshold:0.8,expandable_segments:True",
];

const CAPACITY: u64 = 600 * MIB;

fn run(conf: &str, ops: &[Op]) -> Result<(), TestCaseError> {
    let cfg = AllocatorConfig::parse(conf).unwrap();
    let mut a = DeviceCachingAllocator::new(SimDevice::new(CAPACITY), cfg);
    a.record_history(Some(1 << 20));
    let mut live: Vec<u64> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Alloc { size, stream } => match a.malloc(size, stream) {
                Ok(b) => {
                    prop_assert!(b.size >= size);
                    live.push(b.ptr);
                }
                Err(AllocError::OutOfMemory(_) | AllocError::OverLimit(_) | AllocError::NeverFits(_)) => {}
                Err(e) => return Err(TestCaseError::fail(format!("step {step}: {e}"))),
            },
            Op::Free { pick } if !live.is_empty() => {
                let ptr = live.swap_remove(pick % live.len());
                a.free(ptr).map_err(|e| TestCaseError::fail(format!("step {step}: {e}")))?;
            }
            Op::RecordStream { pick, stream } if !live.is_empty() => {
                a.record_stream(live[pick % live.len()], stream).unwrap();
            }
            Op::CompleteEvents { stream: Some(s) } => a.device_mut().complete_events_on(s),
            Op::CompleteEvents { stream: None } => a.device_mut().complete_all_events(),
            Op::EmptyCache => a.empty_cache().unwrap(),
            Op::SetFraction { fraction } => a.set_memory_fraction(fraction).unwrap(),
            _ => {}
        }
        if let Err(v) = a.validate() {
            return Err(TestCaseError::fail(format!("step {step} ({op:?}) in `{conf}`: {v}")));
        }
        prop_assert_eq!(a.reserved_bytes(), a.device().used_bytes(), "step {}", step);
        let info = a.device().mem_get_info();
        prop_assert_eq!(info.free + a.reserved_bytes(), CAPACITY);
    }
    // Freeing everything and flushing returns every byte to the device.
    for ptr in live.drain(..) {
        a.free(ptr).unwrap();
    }
    a.empty_cache().unwrap();
    a.validate().map_err(|v| TestCaseError::fail(v.to_string()))?;
    prop_assert_eq!(a.reserved_bytes(), 0);
    prop_assert_eq!(a.device().used_bytes(), 0);
    prop_assert_eq!(a.device().live_events(), 0);
    let s = a.memory_stats();
    for k in
        ["allocation.all.current", "active_bytes.all.current", "requested_bytes.all.current", "segment.all.current"]
    {
        prop_assert_eq!(s[k], 0, "{}", k);
    }
    // Every allocation in the trace is matched by a completed free.
    let snap = a.snapshot();
    let count = |name: &str| snap.device_traces[0].iter().filter(|e| e.action.name() == name).count();
    prop_assert_eq!(count("alloc"), count("free_completed"));
    prop_assert_eq!(count("alloc"), count("free_requested"));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_after_every_step(conf in 0..CONFIGS.len(), ops in proptest::collection::vec(op(), 1..160)) {
        run(CONFIGS[conf], &ops)?;
    }
}

/// Replaying the same operations twice gives the same addresses and stats:
/// the simulated device and the policy are deterministic.
#[test]
fn deterministic() {
    let ops: Vec<(u64, u64)> = (1..400u64).map(|i| ((i * 7919) % (40 * MIB) + 1, i % 2)).collect();
    let go = || {
        let mut a = DeviceCachingAllocator::new(SimDevice::new(4 << 30), AllocatorConfig::default());
        let mut out = Vec::new();
        for (i, &(s, st)) in ops.iter().enumerate() {
            let b = a.malloc(s, st).unwrap();
            out.push(b.ptr);
            if i % 3 == 0 {
                a.free(b.ptr).unwrap();
            }
        }
        (out, a.memory_stats())
    };
    assert_eq!(go(), go());
}
