//! Property tests: random sequences of allocator operations, under several
//! configurations, keep every invariant after every step (see `validate`),
//! the device agrees with the statistics, and the allocator fails a request
//! only when it must: a request the device and the limit have room for
//! succeeds, and an out-of-memory leaves nothing cached that a flush could
//! have given back. Two deliberately broken policies show the suite catches
//! an allocator that gives up too early or always.

use headroom_alloc::policy::{
    ExpandablePolicy, HeadroomPolicy, LifetimePolicy, PlannedPolicy, Policy, PyTorchPolicy, Rung,
};
use headroom_alloc::sizing;
use headroom_alloc::units::MIB;
use headroom_alloc::{AllocError, AllocatorConfig, DeviceCachingAllocator, DeviceMemory, SimDevice};
use proptest::prelude::*;
use proptest::test_runner::{TestError, TestRunner};

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

/// The most a request can take from the device: its new segment, or the
/// pages an expandable segment maps for it.
fn worst_need(cfg: &AllocatorConfig, size: u64) -> u64 {
    let rounded = sizing::round_size(cfg, size);
    let segment = sizing::allocation_size(cfg, rounded);
    if cfg.expandable_segments {
        let page = sizing::expandable_page_size(cfg, sizing::pool_for(rounded));
        segment.max(rounded.div_ceil(page) * page)
    } else {
        segment
    }
}

/// An out-of-memory must be forced: nothing cached whole that a flush could
/// return, and the request's worst need beyond what the device or the limit leaves.
fn check_oom<P: Policy>(
    a: &mut DeviceCachingAllocator<SimDevice, P>,
    cfg: &AllocatorConfig,
    size: u64,
    err: &AllocError,
) -> Result<(), String> {
    let r = err.oom_report().ok_or_else(|| format!("not an out-of-memory: {err}"))?;
    if let AllocError::NeverFits(_) = err {
        return if r.alloc_size > CAPACITY || size >= 1 << 60 {
            Ok(())
        } else {
            Err(format!("NeverFits for {size} B on a device of {CAPACITY}"))
        };
    }
    let idle: Vec<_> = a.snapshot().segments.into_iter().filter(|s| !s.is_expandable && s.active_size == 0).collect();
    if let Some(s) = idle.first() {
        return Err(format!(
            "out of memory for {size} B with a whole segment of {} cached at {:#x}",
            s.total_size, s.address
        ));
    }
    let need = worst_need(cfg, size);
    let over_limit = r.allowed.is_some_and(|l| r.reserved + need > l);
    if need <= r.device_free && !over_limit {
        return Err(format!("out of memory for {size} B (needs at most {need}) with {} free", r.device_free));
    }
    Ok(())
}

fn run(conf: &str, ops: &[Op]) -> Result<(), TestCaseError> {
    run_with(conf, ops, PyTorchPolicy)
}

fn run_with<P: Policy>(conf: &str, ops: &[Op], policy: P) -> Result<(), TestCaseError> {
    let mut a =
        DeviceCachingAllocator::with_policy(SimDevice::new(CAPACITY), AllocatorConfig::parse(conf).unwrap(), policy);
    // The settings in force, with the policy's own over the user's.
    let cfg = a.config().clone();
    a.record_history(Some(1 << 20));
    let mut live: Vec<u64> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Alloc { size, stream } => {
                let free_before = a.device().mem_get_info().free;
                let room = a.memory_limit().map_or(u64::MAX, |l| l.saturating_sub(a.reserved_bytes()));
                match a.malloc(size, stream) {
                    Ok(b) => {
                        prop_assert!(b.size >= size);
                        live.push(b.ptr);
                    }
                    Err(e @ (AllocError::OutOfMemory(_) | AllocError::OverLimit(_) | AllocError::NeverFits(_))) => {
                        let need = worst_need(&cfg, size);
                        if need <= free_before && need <= room {
                            return Err(TestCaseError::fail(format!(
                                "step {step}: {size} B refused with {free_before} free and {room} under the limit"
                            )));
                        }
                        check_oom(&mut a, &cfg, size, &e)
                            .map_err(|m| TestCaseError::fail(format!("step {step}: {m}")))?;
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("step {step}: {e}"))),
                }
            }
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
    // The trace names the callers' streams, whatever placement streams the policy used.
    prop_assert!(snap.device_traces[0].iter().all(|e| e.stream < 3), "a stream no caller used");
    prop_assert!(snap.segments.iter().all(|s| s.stream < 3), "a segment on a stream no caller used");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_after_every_step(conf in 0..CONFIGS.len(), ops in proptest::collection::vec(op(), 1..160)) {
        run(CONFIGS[conf], &ops)?;
    }

    /// headroom's policies keep the same invariants and fail only when they must.
    #[test]
    fn every_policy_keeps_the_invariants(conf in 0..CONFIGS.len(), ops in proptest::collection::vec(op(), 1..160)) {
        run_with(CONFIGS[conf], &ops, ExpandablePolicy)?;
        run_with(CONFIGS[conf], &ops, HeadroomPolicy)?;
        // Lifetimes of a few allocations: both placement streams in use within 160 steps.
        run_with(CONFIGS[conf], &ops, LifetimePolicy::long_after(4))?;
        run_with(CONFIGS[conf], &ops, PlannedPolicy::default())?;
    }

    /// A random step of requests and frees, repeated: `planned` makes its plan and serves
    /// the later steps from its arena, with the same invariants after every operation,
    /// and with a departing step in the middle.
    #[test]
    fn planned_keeps_the_invariants_on_repeated_steps(
        conf in 0..CONFIGS.len(),
        step in proptest::collection::vec(
            prop_oneof![3 => size().prop_map(|size| Op::Alloc { size, stream: 0 }), 2 => any::<usize>().prop_map(|pick| Op::Free { pick })],
            4..40,
        ),
        odd in size(),
    ) {
        let mut ops = Vec::new();
        for i in 0..8 {
            ops.extend(step.iter().cloned());
            if i == 5 {
                ops.push(Op::Alloc { size: odd, stream: 0 });
            }
        }
        run_with(CONFIGS[conf], &ops, PlannedPolicy::default())?;
    }
}

/// A policy that gives up as soon as the device says no, without flushing the cache.
struct GivesUpEarly;

/// A policy that never asks the device: every request the cache cannot serve fails.
struct NeverAllocates;

/// PyTorch's choices, except for the ladder.
macro_rules! pytorch_but_ladder {
    ($t:ty, $ladder:expr) => {
        impl Policy for $t {
            fn ladder(&self) -> &[Rung] {
                &$ladder
            }
        }
    };
}
pytorch_but_ladder!(GivesUpEarly, [Rung::Allocate]);
pytorch_but_ladder!(NeverAllocates, []);

/// The suite, run on random workloads against a broken policy, must find a failing case.
fn suite_catches(name: &str, check: impl Fn(&str, &[Op]) -> Result<(), TestCaseError>) {
    let mut runner =
        TestRunner::new(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() });
    let result = runner
        .run(&(0..CONFIGS.len(), proptest::collection::vec(op(), 1..160)), |(conf, ops)| check(CONFIGS[conf], &ops));
    match result {
        Err(TestError::Fail(why, _)) => eprintln!("negative control {name}: caught ({why})"),
        other => panic!("the property suite did not catch {name}: {other:?}"),
    }
}

#[test]
fn negative_control_an_allocator_that_gives_up_without_flushing_is_caught() {
    suite_catches("GivesUpEarly", |conf, ops| run_with(conf, ops, GivesUpEarly));
}

#[test]
fn negative_control_an_allocator_that_never_allocates_is_caught() {
    suite_catches("NeverAllocates", |conf, ops| run_with(conf, ops, NeverAllocates));
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
