//! The passes of one trace share its index (each entry's allocation slot among it): a check
//! and what-ifs run one after another on one `DeviceTrace`, its index made beside the start
//! state, decide what each decides on a trace of its own, whatever their order, on recorded
//! runs with frees that complete later, flushes, OOMs, expandable segments and traces cut by
//! the ring buffer (blocks live at the start, freed and allocated over by the trace).

use headroom_alloc::{AllocatorConfig, PolicyName};
use headroom_trace::device_trace::DeviceTrace;
use headroom_trace::jsonl::TraceLine;
use headroom_trace::replay::{replay, ReplayOptions};
use headroom_trace::snapshot::{read_snapshot, MemorySnapshot};
use headroom_trace::snapshot_file::{write_snapshot, SnapshotFormat};
use headroom_trace::snapshot_replay::{check_from, Fidelity, Recorded};
use headroom_trace::what_if::{live_peak_bytes, what_if, Setup, StartFrom, WhatIf};
use proptest::prelude::*;

#[path = "support/synthetic_workload.rs"]
mod synthetic_workload;
use synthetic_workload::workload;

const MIB: u64 = 1 << 20;

/// The run recorded as PyTorch would dump it, keeping the last `history` entries.
fn recorded(ops: &[TraceLine], config: &AllocatorConfig, capacity: u64, history: usize) -> MemorySnapshot {
    let opts = ReplayOptions { config: config.clone(), capacity, history: Some(history), policy: PolicyName::PyTorch };
    let (_, mut a) = replay(ops, &opts, |_| {}).expect("the workload is a consistent program");
    let mut bytes = Vec::new();
    write_snapshot(&a.snapshot(), SnapshotFormat::Pickle, &mut bytes).unwrap();
    read_snapshot(&bytes[..]).expect("headroom reads what it writes")
}

/// What one pass decided.
#[derive(Debug, PartialEq)]
enum Outcome {
    Check(Box<Result<Fidelity, String>>),
    WhatIf(Box<Result<WhatIf, String>>),
    LivePeak(u64),
}

/// Pass `kind` over `t`: the check, what-ifs under the recorded settings, expandable
/// segments, headroom's policy from an empty device, and the live peak.
fn pass(t: &DeviceTrace, kind: u8, config: &AllocatorConfig, capacity: u64, run: &Recorded) -> Outcome {
    let mut expandable = config.clone();
    expandable.apply("expandable_segments:True").unwrap();
    let setup = |config: &AllocatorConfig, policy, start| Setup { config: config.clone(), policy, start };
    let what =
        |s: Setup| Outcome::WhatIf(Box::new(what_if(t, s, capacity, run, None, |_| {}).map_err(|e| e.to_string())));
    match kind {
        0 => Outcome::Check(Box::new(check_from(t, config.clone(), capacity, |_| {}).map_err(|e| e.to_string()))),
        1 => what(setup(config, PolicyName::PyTorch, StartFrom::Recorded)),
        2 => what(setup(&expandable, PolicyName::PyTorch, StartFrom::Recorded)),
        3 => what(setup(config, PolicyName::Headroom, StartFrom::Fresh)),
        _ => Outcome::LivePeak(live_peak_bytes(t, config)),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn passes_sharing_one_index_decide_what_each_decides_alone(
        seed in any::<u64>(),
        steps in 20usize..120,
        capacity in prop::sample::select(vec![80u64 << 30, 160 * MIB, 48 * MIB]),
        expandable in any::<bool>(),
        history in prop::sample::select(vec![usize::MAX, 1500, 400]),
        order in prop::collection::vec(0u8..5, 1..7),
    ) {
        let config = if expandable {
            AllocatorConfig::parse("expandable_segments:True").unwrap()
        } else {
            AllocatorConfig::default()
        };
        let snap = recorded(&workload(seed, steps, false), &config, capacity, history);
        let Ok(alone) = DeviceTrace::new(&snap, 0) else {
            // The start state cannot be inferred: then no pass runs, shared or not.
            prop_assert!(DeviceTrace::with_pools(&snap, 0).is_err());
            return Ok(());
        };
        let run = check_from(&alone, config.clone(), capacity, |_| {}).map(|f| f.recorded).unwrap_or_default();
        let shared = DeviceTrace::with_pools(&snap, 0).unwrap();
        for &kind in &order {
            let each_alone = pass(&DeviceTrace::new(&snap, 0).unwrap(), kind, &config, capacity, &run);
            prop_assert_eq!(pass(&shared, kind, &config, capacity, &run), each_alone, "pass {}", kind);
        }
    }
}
