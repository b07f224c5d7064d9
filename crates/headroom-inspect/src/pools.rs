//! The private pools of a snapshot (CUDA graphs, `torch.cuda.MemPool`): what
//! each holds when the snapshot was taken, and how many of the trace's
//! requests it served. Their memory is the graphs' for as long as the
//! graphs live: it is reserved but not the default pools' to reuse.

use headroom_alloc::BlockState;
use headroom_trace::snapshot::{MemorySnapshot, TraceAction};
use headroom_trace::snapshot_pools::RecordedPools;
use serde::Serialize;
use std::collections::BTreeMap;

/// One private pool of a device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PoolSummary {
    /// `segment_pool_id`: graphs are (n, 0), `MemPool`s (0, n).
    pub id: (u64, u64),
    /// Segments (or mapped runs of expandable segments) it holds now, and their bytes.
    pub segments: u64,
    pub reserved_bytes: u64,
    /// Its blocks allocated now, and those allocated or waiting for other streams.
    pub allocated_bytes: u64,
    pub active_bytes: u64,
    /// The trace's requests it served.
    pub requests: u64,
}

/// The private pools of `device`, by id; empty when the run used none.
pub fn private_pools(snap: &MemorySnapshot, device: u32) -> Vec<PoolSummary> {
    private_pools_of(snap, device, &RecordedPools::of(snap, device))
}

/// [`private_pools`], with the pools the trace shows already read.
pub fn private_pools_of(snap: &MemorySnapshot, device: u32, recorded: &RecordedPools) -> Vec<PoolSummary> {
    let mut pools: BTreeMap<(u64, u64), PoolSummary> = BTreeMap::new();
    for s in snap.segments.iter().filter(|s| s.device == device && s.pool_id != (0, 0)) {
        let id = (s.pool_id.0 as u64, s.pool_id.1 as u64);
        let p = pools.entry(id).or_insert_with(|| PoolSummary { id, ..Default::default() });
        p.segments += 1;
        p.reserved_bytes += s.total_size;
        for b in &s.blocks {
            match b.state {
                BlockState::ActiveAllocated => {
                    p.allocated_bytes += b.size;
                    p.active_bytes += b.size;
                }
                BlockState::ActivePendingFree => p.active_bytes += b.size,
                BlockState::Inactive => {}
            }
        }
    }
    if recorded.any() {
        // Pools the trace shows though none of their segments is left.
        for id in recorded.ids() {
            pools.entry(id).or_insert_with(|| PoolSummary { id, ..Default::default() });
        }
        let trace = snap.device_traces.get(device as usize).map_or(&[][..], Vec::as_slice);
        for (i, e) in trace.iter().enumerate().filter(|(_, e)| e.action == TraceAction::Alloc) {
            let id = recorded.pool_of(i, e);
            if id != (0, 0) {
                pools.entry(id).or_insert_with(|| PoolSummary { id, ..Default::default() }).requests += 1;
            }
        }
    }
    pools.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_alloc::{AllocatorConfig, DeviceCachingAllocator, SimDevice};
    use headroom_trace::snapshot::read_snapshot;
    use headroom_trace::snapshot_file::{write_snapshot, SnapshotFormat};

    #[test]
    fn each_pool_is_summed_apart_from_the_default_pools() {
        let mut a = DeviceCachingAllocator::new(SimDevice::new(1 << 32), AllocatorConfig::default());
        a.record_history(Some(1000));
        let _w = a.malloc(30 << 20, 0).unwrap();
        a.begin_allocate_to_pool((1, 0), Box::new(|s| s == 5)).unwrap();
        let g: Vec<u64> = (0..3).map(|_| a.malloc(3 << 20, 5).unwrap().ptr).collect();
        a.free(g[1]).unwrap();
        a.end_allocate_to_pool((1, 0)).unwrap();
        let mut bytes = Vec::new();
        write_snapshot(&a.snapshot(), SnapshotFormat::Pickle, &mut bytes).unwrap();
        let snap = read_snapshot(&bytes[..]).unwrap();
        let pools = private_pools(&snap, 0);
        let want = PoolSummary {
            id: (1, 0),
            segments: 1,
            reserved_bytes: 20 << 20,
            allocated_bytes: 6 << 20,
            active_bytes: 6 << 20,
            requests: 3,
        };
        assert_eq!(pools, [want]);
    }

    #[test]
    fn pytorchs_own_recordings_list_their_pools() {
        // Recorded by PyTorch 2.11 on an H200: trace entries without pool ids. The
        // graph's pool keeps three segments; the MemPool's are all given back, and
        // the trace does not name it.
        let read = |name: &str| {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/snapshots/private-pools");
            headroom_trace::snapshot::read_snapshot_file(&dir.join(name)).unwrap()
        };
        let graph = private_pools(&read("h200-cuda-graph.pickle"), 0);
        assert_eq!(graph.iter().map(|p| (p.id, p.segments, p.requests)).collect::<Vec<_>>(), [((1, 0), 3, 16)]);
        let mempool = private_pools(&read("h200-mempool.pickle"), 0);
        assert_eq!(mempool.iter().map(|p| (p.id, p.segments, p.requests)).collect::<Vec<_>>(), [((0, 1), 0, 3)]);
    }
}
