//! The private-pool snapshots PyTorch 2.11's own allocator recorded on an
//! H200 (data/snapshots/private-pools): a CUDA graph's capture, replays,
//! reset and `empty_cache()`, and a `torch.cuda.MemPool`'s buffers, the pool
//! deleted and emptied. Their trace entries carry no pool id, so the replay
//! infers each request's pool (snapshot_pools.rs) and must then match every
//! recorded decision; and the pools it infers are the ones inspect lists.

use headroom_trace::snapshot::{read_snapshot_file, MemorySnapshot, TraceAction};
use headroom_trace::snapshot_pools::RecordedPools;
use headroom_trace::snapshot_replay::{check_device, Fidelity};
use std::path::Path;

fn recording(name: &str) -> MemorySnapshot {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/snapshots/private-pools").join(name);
    read_snapshot_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn check(snap: &MemorySnapshot) -> Fidelity {
    let f = check_device(snap, 0, 141 << 30, |_| {}).unwrap();
    assert!(f.is_exact(), "{f}: {:?}", f.first_divergence);
    f
}

/// Requests of each private pool, as inspect counts them.
fn requests_by_pool(snap: &MemorySnapshot) -> Vec<((u64, u64), usize)> {
    let pools = RecordedPools::of(snap, 0);
    let trace = &snap.device_traces[0];
    pools
        .ids()
        .into_iter()
        .map(|id| {
            let n = trace
                .iter()
                .enumerate()
                .filter(|(i, e)| e.action == TraceAction::Alloc && pools.pool_of(*i, e) == id)
                .count();
            (id, n)
        })
        .collect()
}

#[test]
fn the_cuda_graph_recording_replays_decision_for_decision() {
    let snap = recording("h200-cuda-graph.pickle");
    assert!(snap.device_traces[0].iter().all(|e| e.pool_id == (0, 0)), "this PyTorch records no pool ids");
    let f = check(&snap);
    assert_eq!(
        (f.alloc_total, f.segment_total, f.final_blocks_total),
        (65, 23, 15),
        "every alloc, segment event and final block"
    );
    // Three of the graph's segments were released before the snapshot: the
    // trace alone says they were the graph's.
    assert_eq!(f.recorded.pool_notes.len(), 3, "{:#?}", f.recorded.pool_notes);
    assert!(f.recorded.pool_notes.iter().all(|n| n.contains("(1, 0)") && !n.contains("does not say")));
}

#[test]
fn the_graphs_pool_is_told_from_an_earlier_segment_at_the_same_address() {
    // 0x7fdee6000000 was a default-pool segment of 16 MiB (released when the
    // capture began) before it was the graph's segment of 32 MiB.
    let snap = recording("h200-cuda-graph.pickle");
    let pools = RecordedPools::of(&snap, 0);
    let trace = &snap.device_traces[0];
    let at = |action, size| {
        trace.iter().position(|e| e.action == action && e.addr == 0x7fde_e600_0000 && e.size == size).unwrap()
    };
    assert_eq!(pools.pool_at(0x7fde_e600_0000, at(TraceAction::SegmentFree, 16 << 20)), (0, 0));
    assert_eq!(pools.pool_at(0x7fde_e600_0000, at(TraceAction::SegmentAlloc, 32 << 20) + 1), (1, 0));
}

#[test]
fn the_mempool_recording_replays_decision_for_decision() {
    let snap = recording("h200-mempool.pickle");
    assert!(snap.segments.is_empty(), "no segment is left to name the pool");
    let f = check(&snap);
    assert_eq!((f.alloc_total, f.segment_total, f.final_blocks_total), (8, 6, 0));
    assert_eq!(f.recorded.pool_notes.len(), 2, "{:#?}", f.recorded.pool_notes);
}

#[test]
fn the_pools_inspect_lists_are_the_recorded_ones() {
    // The graph's pool (1, 0): the 16 requests of its capture (two 8-byte
    // requests on the capture stream before the capture began went to the
    // default pools). The MemPool: its three buffers, under the first id
    // PyTorch gives a MemPool, as the trace does not name it.
    assert_eq!(requests_by_pool(&recording("h200-cuda-graph.pickle")), [((1, 0), 16)]);
    assert_eq!(requests_by_pool(&recording("h200-mempool.pickle")), [((0, 1), 3)]);
}

#[test]
fn pools_inferred_beside_the_start_state_are_the_ones_inferred_at_the_first_replay() {
    use headroom_trace::device_trace::DeviceTrace;
    for name in ["h200-cuda-graph.pickle", "h200-mempool.pickle"] {
        let snap = recording(name);
        let beside = DeviceTrace::with_pools(&snap, 0).unwrap();
        let later = DeviceTrace::new(&snap, 0).unwrap();
        assert!(!beside.pools().ids().is_empty(), "{name}: a recording with private pools");
        assert_eq!(format!("{:?}", beside.pools()), format!("{:?}", later.pools()), "{name}");
        assert_eq!(beside.start, later.start, "{name}");
    }
}
