//! Snapshots of runs with private pools (a CUDA graph's capture, a
//! `torch.cuda.MemPool`), recorded from headroom's own allocator, written as
//! PyTorch's pickle and read back: the reader keeps each segment's
//! `segment_pool_id` and each entry's `pool_id`, and the replay puts every
//! request in its pool, releases a pool where the recorded run's flush gave
//! its memory back, and matches every decision.

use headroom_alloc::units::MIB;
use headroom_alloc::{AllocatorConfig, DeviceCachingAllocator, MempoolId, SimDevice};
use headroom_trace::snapshot::{read_snapshot, MemorySnapshot};
use headroom_trace::snapshot_file::{write_snapshot, SnapshotFormat};
use headroom_trace::snapshot_pools::RecordedPools;
use headroom_trace::snapshot_replay::check_device;

const GRAPH: MempoolId = (1, 0);
const MEMPOOL: MempoolId = (0, 1);

/// A training-like run: weights, a warm-up step, a captured step whose
/// temporaries are freed and reused inside the graph's pool, a `MemPool`'s
/// buffers, eager steps beside them, and (with `release`) the graph and the
/// pool released and flushed before the last step.
fn recorded(conf: &str, release: bool, strip_entry_pools: bool) -> MemorySnapshot {
    let mut a = DeviceCachingAllocator::new(SimDevice::new(8 << 30), AllocatorConfig::parse(conf).unwrap());
    a.record_history(Some(1 << 20));
    let weights: Vec<u64> = (0..4).map(|i| a.malloc((12 + i) * MIB, 0).unwrap().ptr).collect();
    let step = |a: &mut DeviceCachingAllocator<SimDevice>, stream: u64| {
        let mut keep = Vec::new();
        for k in 0..10u64 {
            let t = a.malloc((k % 4) * 3 * MIB + 700 * 1024, stream).unwrap();
            let u = a.malloc(4096 * (k + 1), stream).unwrap();
            a.free(u.ptr).unwrap();
            if k % 3 == 0 {
                keep.push(t.ptr);
            } else {
                a.free(t.ptr).unwrap();
            }
        }
        keep
    };
    for p in step(&mut a, 0) {
        a.free(p).unwrap();
    }
    a.begin_allocate_to_pool(GRAPH, Box::new(|s| s == 5)).unwrap();
    let graph_outputs = step(&mut a, 5);
    a.end_allocate_to_pool(GRAPH).unwrap();
    a.create_or_incref_pool(MEMPOOL).unwrap();
    a.begin_allocate_to_pool(MEMPOOL, Box::new(|_| true)).unwrap();
    let buffers: Vec<u64> = (0..3).map(|i| a.malloc((i + 1) * 5 * MIB, 0).unwrap().ptr).collect();
    a.end_allocate_to_pool(MEMPOOL).unwrap();
    a.release_pool(MEMPOOL).unwrap();
    for p in step(&mut a, 0) {
        a.free(p).unwrap();
    }
    for p in graph_outputs {
        a.free(p).unwrap();
    }
    if release {
        for p in buffers {
            a.free(p).unwrap();
        }
        a.release_pool(GRAPH).unwrap();
        a.release_pool(MEMPOOL).unwrap();
        a.empty_cache().unwrap();
    }
    for p in step(&mut a, 0) {
        a.free(p).unwrap();
    }
    a.free(weights[1]).unwrap();
    a.validate().unwrap();
    let mut snap = a.snapshot();
    if strip_entry_pools {
        for e in &mut snap.device_traces[0] {
            e.pool_id = (0, 0);
        }
    }
    let mut bytes = Vec::new();
    write_snapshot(&snap, SnapshotFormat::Pickle, &mut bytes).unwrap();
    read_snapshot(&bytes[..]).unwrap()
}

fn exact(snap: &MemorySnapshot) {
    let f = check_device(snap, 0, 8 << 30, |_| {}).unwrap();
    assert!(f.is_exact(), "{f:?}");
    assert!(f.alloc_total > 60 && f.segment_total > 5, "{f:?}");
}

#[test]
fn the_reader_keeps_pool_ids_of_segments_and_entries() {
    let snap = recorded("", false, false);
    let ids: Vec<(i64, i64)> = snap.segments.iter().map(|s| s.pool_id).collect();
    assert!(ids.contains(&(1, 0)) && ids.contains(&(0, 1)) && ids.contains(&(0, 0)), "{ids:?}");
    assert!(snap.device_traces[0].iter().any(|e| e.pool_id == GRAPH));
    let pools = RecordedPools::of(&snap, 0);
    assert!(pools.any());
}

#[test]
fn a_run_with_live_pools_replays_decision_for_decision() {
    exact(&recorded("", false, false));
    exact(&recorded("expandable_segments:True", false, false));
}

#[test]
fn a_run_that_releases_its_pools_replays_decision_for_decision() {
    exact(&recorded("", true, false));
    exact(&recorded("expandable_segments:True", true, false));
}

#[test]
fn without_pool_ids_on_entries_the_segments_tell_the_pool() {
    // PyTorch's older snapshots mark segments only: a request goes to the pool of the
    // segment it was placed in.
    exact(&recorded("", false, true));
}

/// The negative control: replayed with every request in the default pools, the
/// run does not match.
#[test]
fn a_replay_that_ignores_the_pools_diverges() {
    let mut snap = recorded("", false, true);
    for s in &mut snap.segments {
        s.pool_id = (0, 0);
    }
    let f = check_device(&snap, 0, 8 << 30, |_| {});
    assert!(f.map_or(true, |f| !f.is_exact()));
}

/// A segment of a graph's pool that no rule can tell from the default pools'
/// (no room elsewhere for its request, the capture's last request, given back
/// with no default segment beside it) is replayed in the default pools, and
/// the check says the trace does not decide it.
#[test]
fn a_pool_the_trace_cannot_decide_is_said_so() {
    let mut a = DeviceCachingAllocator::new(SimDevice::new(8 << 30), AllocatorConfig::default());
    a.record_history(Some(1 << 20));
    a.begin_allocate_to_pool(GRAPH, Box::new(|s| s == 5)).unwrap();
    let kept = a.malloc(MIB, 5).unwrap();
    let big = a.malloc(30 * MIB, 5).unwrap();
    a.free(big.ptr).unwrap();
    a.end_allocate_to_pool(GRAPH).unwrap();
    a.release_pool(GRAPH).unwrap();
    a.empty_cache().unwrap();
    assert!(a.pool_use_count(GRAPH).is_some(), "the pool keeps the segment of {:#x}", kept.ptr);
    let mut snap = a.snapshot();
    for e in &mut snap.device_traces[0] {
        e.pool_id = (0, 0);
    }
    let mut bytes = Vec::new();
    write_snapshot(&snap, SnapshotFormat::Pickle, &mut bytes).unwrap();
    let snap = read_snapshot(&bytes[..]).unwrap();
    let f = check_device(&snap, 0, 8 << 30, |_| {}).unwrap();
    let notes = &f.recorded.pool_notes;
    assert!(notes.len() == 1 && notes[0].contains("does not say"), "{notes:#?}");
    assert!(f.is_exact(), "{f}: {:?}", f.first_divergence);
}
