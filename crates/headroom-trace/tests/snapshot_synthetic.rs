//! What the real fixtures never show, recorded from headroom's own runs and
//! read back through the pickle writer and reader: blocks used on several
//! streams (`record_stream`, frees completing later), the allocator's own
//! flush when the device says no, a recorded `oom`, and a trace cut by the
//! ring buffer, several devices with expandable segments mapped when their
//! traces begin. Each snapshot must check decision for decision.

use headroom_alloc::AllocatorConfig;
use headroom_trace::device_trace::DeviceTrace;
use headroom_trace::jsonl::{TraceLine, TraceOp};
use headroom_trace::recorded_memory::recorded_peak_reserved;
use headroom_trace::recorded_step::step_starts;
use headroom_trace::replay::{replay, ReplayOptions};
use headroom_trace::replay_device::DeviceCall;
use headroom_trace::snapshot::{read_snapshot, MemorySnapshot, TraceAction};
use headroom_trace::snapshot_file::{write_snapshot, SnapshotFormat};
use headroom_trace::snapshot_replay::{check_device, check_from, Fidelity};
use headroom_trace::trace_index::TraceIndex;
use headroom_trace::what_if::what_if_device;

#[path = "support/xorshift.rs"]
mod xorshift;
use xorshift::xorshift;

const MIB: u64 = 1 << 20;

/// A deterministic workload: steps of allocations on three streams, some
/// used on another stream before they are freed, events completing now and
/// then, a share of each step kept alive across steps.
fn workload(steps: usize) -> Vec<TraceLine> {
    let mut ops = Vec::new();
    let mut push = |op| ops.push(TraceLine { line: ops.len() + 1, op });
    let mut rand = xorshift(0x2545_f491_4f6c_dd1d);
    let mut kept: Vec<String> = Vec::new();
    for step in 0..steps {
        let mut temps = Vec::new();
        for k in 0..12 {
            let id = format!("s{step}k{k}");
            let size = match rand(4) {
                0 => 512 + rand(4096),
                1 => MIB + rand(3 * MIB),
                _ => 6 * MIB + rand(20 * MIB),
            };
            push(TraceOp::Alloc { id: id.clone(), size, stream: rand(3) });
            if rand(3) == 0 {
                push(TraceOp::RecordStream { id: id.clone(), stream: 3 + rand(2) });
            }
            temps.push(id);
        }
        if rand(4) == 0 {
            kept.push(temps.pop().expect("twelve per step"));
        }
        if kept.len() > 6 {
            push(TraceOp::Free { id: kept.remove(0) });
        }
        for id in temps {
            push(TraceOp::Free { id });
        }
        if step % 3 == 2 {
            push(TraceOp::CompleteEvents);
        }
    }
    ops
}

/// The run recorded as PyTorch would dump it, through headroom's pickle writer and reader.
fn recorded(ops: &[TraceLine], capacity: u64, history: usize) -> MemorySnapshot {
    let opts = ReplayOptions {
        config: AllocatorConfig::default(),
        capacity,
        history: Some(history),
        policy: headroom_alloc::PolicyName::PyTorch,
    };
    let (_, mut a) = replay(ops, &opts, |_| {}).expect("the workload is a consistent program");
    let mut bytes = Vec::new();
    write_snapshot(&a.snapshot(), SnapshotFormat::Pickle, &mut bytes).unwrap();
    read_snapshot(&bytes[..]).expect("headroom reads what it writes")
}

fn count(snap: &MemorySnapshot, action: TraceAction) -> usize {
    snap.device_traces[0].iter().filter(|e| e.action == action).count()
}

fn assert_exact(f: &Fidelity, what: &str) {
    assert!(f.is_exact(), "{what}: {:?}", f.first_divergence);
    assert!(f.alloc_total > 0 && f.final_blocks_total > 0, "{what}: nothing was checked");
    println!("{what}: {f}, {} live at start", f.live_at_start);
}

/// The trace's index says what the walks of the whole trace it stands for say.
fn assert_index_reads_the_trace(snap: &MemorySnapshot, device: u32) {
    let trace = &snap.device_traces[device as usize];
    let index = TraceIndex::of(snap, device);
    let calls = DeviceCall::of_trace(trace);
    assert!(!calls.is_empty(), "device {device}: the trace makes device calls");
    assert_eq!(index.device_calls(trace), calls, "device {device}");
    assert_eq!(index.step_starts(), step_starts(snap, device), "device {device}");
    let end = calls.iter().map(|c| c.addr + c.size).max();
    assert_eq!(index.calls_end(trace), end.unwrap_or(0), "device {device}");
    let maps = trace.iter().any(|e| e.action == TraceAction::SegmentMap);
    assert_eq!(index.maps(trace), maps, "device {device}");
    assert!(!index.names_a_pool(), "device {device}: no private pool");
}

#[test]
fn blocks_used_on_other_streams_free_when_their_events_complete() {
    let snap = recorded(&workload(200), 80 << 30, usize::MAX);
    let trace = &snap.device_traces[0];
    // Frees of blocks used on another stream are requested first and complete
    // later; the last few are still waiting when the snapshot is taken.
    let requested = count(&snap, TraceAction::FreeRequested);
    let completed = count(&snap, TraceAction::FreeCompleted);
    assert!(requested > completed && completed > requested - 20, "{requested} requested, {completed} completed");
    let delayed = trace.iter().enumerate().filter(|(i, e)| {
        e.action == TraceAction::FreeCompleted
            && trace[i - 1].action != TraceAction::FreeRequested
            && trace[i - 1].addr != e.addr
    });
    assert!(delayed.count() > 50, "record_stream delayed some frees");
    let streams: std::collections::BTreeSet<u64> = trace.iter().map(|e| e.stream).collect();
    assert!(streams.len() >= 3, "{streams:?}");
    assert_exact(&check_device(&snap, 0, 80 << 30, |_| {}).unwrap(), "record_stream");
}

#[test]
fn the_allocators_own_flush_replays_in_order() {
    // A device too small to cache every step's segments: when it says no,
    // the allocator releases its cached segments and asks again.
    let snap = recorded(&workload(200), 160 * MIB, usize::MAX);
    let trace = &snap.device_traces[0];
    let flushes = trace
        .windows(2)
        .filter(|w| w[0].action == TraceAction::SegmentFree && w[1].action == TraceAction::SegmentAlloc)
        .count();
    assert!(flushes > 5, "{flushes} flushes");
    assert_index_reads_the_trace(&snap, 0);
    let f = check_device(&snap, 0, 160 * MIB, |_| {}).unwrap();
    assert!(f.segment_total > 100);
    assert_exact(&f, "flushes");
}

#[test]
fn a_recorded_oom_is_an_oom_in_the_replay() {
    let snap = recorded(&workload(200), 48 * MIB, usize::MAX);
    assert!(count(&snap, TraceAction::Oom) > 0, "the 48 MiB device ran out");
    let f = check_device(&snap, 0, 48 * MIB, |_| {}).unwrap();
    assert!(f.oom_total > 0);
    assert_exact(&f, "oom");
}

#[test]
fn a_trace_cut_by_the_ring_buffer_replays_from_the_state_it_began_in() {
    let ops = workload(300);
    let whole = recorded(&ops, 80 << 30, usize::MAX);
    let cut = recorded(&ops, 80 << 30, 1500);
    assert_eq!(cut.device_traces[0].len(), 1500);
    assert!(whole.device_traces[0].len() > 3 * 1500);
    println!("ring buffer: the last 1500 of {} entries", whole.device_traces[0].len());
    let f = check_device(&cut, 0, 80 << 30, |_| {}).unwrap();
    assert!(f.live_at_start > 0, "the kept blocks were live when the cut trace began");
    assert_exact(&f, "ring buffer");
}

/// Several devices with expandable segments, each run out of memory on a
/// device of its own size, the traces cut by the ring buffer so that each
/// begins with expandable segments mapped: every device replays decision
/// for decision, and under the recorded settings the what-if replay is the
/// recorded run (the device calls, the peak, the OOMs).
#[test]
fn several_devices_with_expandable_segments_and_ooms_replay_as_recorded() {
    let config = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let mut merged: Option<headroom_alloc::Snapshot> = None;
    // Each device's memory, which sizes its reservations (1.125 times it) and
    // which the replays are told, as `--capacity` tells them.
    let capacities = [200 * MIB, 120 * MIB, 64 * MIB];
    for (device, capacity) in (0u32..).zip(capacities) {
        let opts = ReplayOptions {
            config: config.clone(),
            capacity,
            history: Some(1500),
            policy: headroom_alloc::PolicyName::PyTorch,
        };
        let (_, mut a) = replay(&workload(150 + 50 * device as usize), &opts, |_| {}).unwrap();
        let mut s = a.snapshot();
        let m = merged.get_or_insert_with(|| headroom_alloc::Snapshot {
            segments: Vec::new(),
            device_traces: Vec::new(),
            allocator_settings: s.allocator_settings.clone(),
        });
        for seg in &mut s.segments {
            seg.device = device;
        }
        m.segments.append(&mut s.segments);
        m.device_traces.push(s.device_traces.remove(0));
    }
    let mut bytes = Vec::new();
    write_snapshot(&merged.unwrap(), SnapshotFormat::Pickle, &mut bytes).unwrap();
    let snap = read_snapshot(&bytes[..]).unwrap();
    assert_eq!(snap.devices(), [0, 1, 2]);
    let ooms: usize = snap.device_traces.iter().flatten().filter(|e| e.action == TraceAction::Oom).count();
    assert!(ooms > 0, "the small devices ran out of memory");
    for device in snap.devices() {
        assert_index_reads_the_trace(&snap, device);
        assert!(TraceIndex::of(&snap, device).maps(&snap.device_traces[device as usize]), "device {device}");
        let t = DeviceTrace::new(&snap, device).unwrap();
        assert!(
            t.start.segments.iter().any(|s| s.expandable),
            "device {device} begins with expandable segments mapped"
        );
        let capacity = capacities[device as usize];
        let f = check_from(&t, config.clone(), capacity, |_| {}).unwrap();
        assert_exact(&f, &format!("device {device}, expandable, {} OOMs", f.oom_total));
        let w = what_if_device(&t, config.clone(), capacity, &f.recorded, None, |_| {}).unwrap();
        let calls = headroom_trace::replay_device::DeviceCall::of_trace(&snap.device_traces[device as usize]).len();
        assert_eq!(w.device_calls_followed, calls, "device {device}: the baseline makes the recorded device calls");
        assert_eq!(w.peak_reserved_bytes, recorded_peak_reserved(&t), "device {device}");
        assert_eq!((w.ooms.len(), w.recorded_ooms_served), (0, 0), "device {device}: OOMs where recorded only");
    }
}
