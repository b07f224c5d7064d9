//! The private pools of a recorded run (CUDA graphs, `torch.cuda.MemPool`),
//! as a replay needs them: which pool each recorded request went to, and
//! when a pool was released.
//!
//! A snapshot marks each segment with its `segment_pool_id`, and newer
//! traces (and headroom's) mark each entry with its `pool_id`. A request
//! whose entry carries no pool went to the pool of the segment it was
//! placed in: a segment of the final state, or one the trace allocated or
//! mapped. A pool's release is not an entry of its own: a recorded flush that
//! gives back a private pool's segment shows that the pool had been released
//! before it, so the replay releases it there.

use crate::memory_snapshot::{MemorySnapshot, TraceAction, TraceEvent};
use headroom_alloc::{DeviceCachingAllocator, DeviceMemory, MempoolId, Policy, DEFAULT_MEMPOOL};
use std::collections::BTreeMap;

/// The address ranges of a device's private-pool segments, start -> (end, pool).
#[derive(Clone, Debug, Default)]
pub struct RecordedPools {
    ranges: BTreeMap<u64, (u64, MempoolId)>,
}

impl RecordedPools {
    /// The private-pool segments `device`'s snapshot and trace name.
    pub fn of(snap: &MemorySnapshot, device: u32) -> Self {
        let mut ranges = BTreeMap::new();
        for s in snap.segments.iter().filter(|s| s.device == device && s.pool_id != (0, 0)) {
            ranges
                .insert(s.address, (s.address.saturating_add(s.total_size), (s.pool_id.0 as u64, s.pool_id.1 as u64)));
        }
        let trace = snap.device_traces.get(device as usize).map_or(&[][..], |t| &t[..]);
        for e in trace {
            let segment = matches!(e.action, TraceAction::SegmentAlloc | TraceAction::SegmentMap);
            if segment && e.pool_id != DEFAULT_MEMPOOL {
                ranges.entry(e.addr).or_insert((e.addr.saturating_add(e.size), e.pool_id));
            }
        }
        RecordedPools { ranges }
    }

    /// Whether the run used any private pool.
    pub fn any(&self) -> bool {
        !self.ranges.is_empty()
    }

    /// The pool the recorded request `e` went to.
    pub fn pool_of(&self, e: &TraceEvent) -> MempoolId {
        if e.pool_id != DEFAULT_MEMPOOL {
            return e.pool_id;
        }
        self.pool_at(e.addr)
    }

    /// The pool of the segment holding `addr` (the default pools if none of the private ones does).
    pub fn pool_at(&self, addr: u64) -> MempoolId {
        self.ranges.range(..=addr).next_back().filter(|(_, &(end, _))| addr < end).map_or(DEFAULT_MEMPOOL, |(_, r)| r.1)
    }

    /// Releases, in `a`, every pool whose segment the recorded segment events
    /// `indices` of `trace` give back: the recorded run had released it.
    pub fn release_freed<D: DeviceMemory, P: Policy>(
        &self,
        a: &mut DeviceCachingAllocator<D, P>,
        trace: &[TraceEvent],
        indices: impl IntoIterator<Item = usize>,
    ) {
        if !self.any() {
            return;
        }
        for i in indices {
            let e = &trace[i];
            if !matches!(e.action, TraceAction::SegmentFree | TraceAction::SegmentUnmap) {
                continue;
            }
            let id = self.pool_of(e);
            while id != DEFAULT_MEMPOOL && a.pool_use_count(id).is_some_and(|n| n > 0) {
                // Cannot fail: the pool exists and is in use.
                let _ = a.release_pool(id);
            }
        }
    }

    /// The segment events of the release burst that starts at `from`.
    pub fn burst(trace: &[TraceEvent], from: usize) -> impl Iterator<Item = usize> + '_ {
        (from..trace.len())
            .take_while(|&i| matches!(trace[i].action, TraceAction::SegmentFree | TraceAction::SegmentUnmap))
    }
}
