//! Traces with expandable segments cut by the ring buffer, recorded from headroom's own
//! runs under PyTorch's rules: a release unmaps whole free pages and keeps a reservation
//! while any page of it stays mapped, so a trace may begin with the low pages of a
//! reservation unmapped, and PyTorch maps the lowest unmapped pages of the stream first.
//! The check must rebuild the reservation from below its first mapped run.

use headroom_alloc::{AllocatorConfig, PolicyName, PoolKind, Snapshot};
use headroom_trace::device_trace::DeviceTrace;
use headroom_trace::jsonl::{TraceLine, TraceOp};
use headroom_trace::replay::{replay, ReplayOptions};
use headroom_trace::snapshot::{read_snapshot, MemorySnapshot, TraceAction};
use headroom_trace::snapshot_file::{write_snapshot, SnapshotFormat};
use headroom_trace::snapshot_replay::check_from;

#[path = "support/synthetic_workload.rs"]
mod synthetic_workload;
use synthetic_workload::workload;

const MIB: u64 = 1 << 20;

/// The run as the allocator holds it at the end, every entry of its history kept.
fn recorded(ops: &[TraceLine], config: &AllocatorConfig, capacity: u64) -> Snapshot {
    let opts =
        ReplayOptions { config: config.clone(), capacity, history: Some(usize::MAX), policy: PolicyName::PyTorch };
    let (_, mut a) = replay(ops, &opts, |_| {}).expect("the workload is a consistent program");
    a.snapshot()
}

/// The snapshot PyTorch would dump had its ring buffer kept all but the first `dropped`
/// entries (the final segments as they are, the oldest entries gone), through the pickle
/// writer and reader.
fn cut(snap: &Snapshot, dropped: usize) -> MemorySnapshot {
    let mut cut = snap.clone();
    let trace = &mut cut.device_traces[0];
    trace.drain(..dropped.min(trace.len()));
    let mut bytes = Vec::new();
    write_snapshot(&cut, SnapshotFormat::Pickle, &mut bytes).unwrap();
    read_snapshot(&bytes[..]).expect("headroom reads what it writes")
}

fn ops(list: Vec<TraceOp>) -> Vec<TraceLine> {
    list.into_iter().enumerate().map(|(i, op)| TraceLine { line: i + 1, op }).collect()
}

fn alloc(id: &str, size: u64) -> TraceOp {
    TraceOp::Alloc { id: id.into(), size, stream: 0 }
}

/// The smallest such trace: page 0 of stream 0's reservation held a block, page 1 another;
/// the first was freed and `empty_cache` unmapped page 0 before the trace began. The next
/// request maps page 0 again, below the one run mapped when the trace began.
#[test]
fn a_page_unmapped_below_the_first_mapped_run_is_mapped_again_first() {
    let config = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let run = ops(vec![
        alloc("a", 20 * MIB),
        alloc("b", 20 * MIB),
        TraceOp::Free { id: "a".into() },
        TraceOp::EmptyCache,
        alloc("c", 10 * MIB),
    ]);
    let whole = recorded(&run, &config, 160 * MIB);
    let full = cut(&whole, 0);
    let trace = &full.device_traces[0];
    let actions: Vec<(TraceAction, u64)> = trace.iter().map(|e| (e.action, e.addr)).collect();
    let base = trace[0].addr;
    let unmap = actions.iter().position(|&a| a == (TraceAction::SegmentUnmap, base)).expect("page 0 is unmapped");
    let remap = actions.iter().rposition(|&a| a == (TraceAction::SegmentMap, base)).expect("page 0 is mapped again");
    assert!(unmap < remap, "{actions:x?}");

    let snap = cut(&whole, unmap + 1);
    let t = DeviceTrace::new(&snap, 0).unwrap();
    let runs: Vec<(u64, u64)> = t.start.segments.iter().map(|s| (s.address, s.size)).collect();
    assert_eq!(runs, vec![(base + 20 * MIB, 20 * MIB)], "page 1 alone was mapped when the trace began");
    assert_eq!(t.start.segments[0].reserved_from, base);
    let f = check_from(&t, config, 160 * MIB, |_| {}).unwrap();
    assert!(f.is_exact(), "{:?}", f.first_divergence);
}

/// A run of the small pool's that the final segments no longer show and no block of the
/// trace lies in: its pool is the small one, as its size (one 2 MiB page, not a whole
/// number of large pages) says, and it is rebuilt in a reservation of 2 MiB pages.
#[test]
fn a_small_run_unmapped_early_in_the_trace_is_rebuilt_in_the_small_pool() {
    let config = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let full = recorded(&workload(13832693973753839578, 31, true), &config, 48 * MIB);
    let dropped = (full.device_traces[0].len() as f64 * 0.28348827530721377) as usize;
    let snap = cut(&full, dropped);
    let t = DeviceTrace::new(&snap, 0).unwrap();
    let final_runs: Vec<u64> = snap.segments.iter().map(|s| s.address).collect();
    let small = t.start.segments.iter().find(|s| s.size == 2 * MIB && !final_runs.contains(&s.address));
    let small = small.expect("a run of one small page the final segments do not show");
    assert_eq!(small.pool, PoolKind::Small);
    let f = check_from(&t, config, 48 * MIB, |_| {}).unwrap();
    assert!(f.is_exact(), "{:?}", f.first_divergence);
}
