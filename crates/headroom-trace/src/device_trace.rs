//! One device's trace in a snapshot, with the allocator's state when it began:
//! what every replay of the trace starts from.

use crate::snapshot::{MemorySnapshot, TraceEvent};
use crate::snapshot_pools::RecordedPools;
use crate::start_state::{infer_start, InconsistentTrace, StartState};
use crate::trace_index::TraceIndex;
use std::sync::OnceLock;

/// One device's trace in a snapshot, with the allocator's state when the
/// trace began: inferred once, then checked and replayed under any settings.
pub struct DeviceTrace<'a> {
    pub snap: &'a MemorySnapshot,
    pub device: u32,
    pub start: StartState,
    /// The recorded private pools, inferred from the whole trace at the first replay that
    /// asks: the check and every what-if share them.
    pools: OnceLock<RecordedPools>,
    /// The trace's segment events and steps, found at the first replay that asks.
    index: OnceLock<TraceIndex>,
}

impl<'a> DeviceTrace<'a> {
    /// The start state inferred under the snapshot's recorded settings.
    pub fn new(snap: &'a MemorySnapshot, device: u32) -> Result<Self, InconsistentTrace> {
        let start = infer_start(snap, device, &snap.allocator_config().0)?;
        Ok(DeviceTrace::from_start(snap, device, start))
    }

    /// [`DeviceTrace::new`], with the private pools inferred beside the start state on a
    /// thread of their own: each reads the whole trace, neither needs the other, and the
    /// first replay needs both.
    pub fn with_pools(snap: &'a MemorySnapshot, device: u32) -> Result<Self, InconsistentTrace> {
        std::thread::scope(|scope| {
            let pools = scope.spawn(|| {
                let index = TraceIndex::of(snap, device);
                (RecordedPools::of_index(snap, device, &index), index)
            });
            let t = DeviceTrace::new(snap, device);
            let (pools, index) = pools.join().expect("inferring the private pools does not panic");
            t.inspect(|t| {
                let _ = t.pools.set(pools);
                let _ = t.index.set(index);
            })
        })
    }

    /// The trace from a start state already inferred.
    pub fn from_start(snap: &'a MemorySnapshot, device: u32, start: StartState) -> Self {
        DeviceTrace { snap, device, start, pools: OnceLock::new(), index: OnceLock::new() }
    }

    /// The recorded run's private pools ([`RecordedPools::of`]).
    pub fn pools(&self) -> &RecordedPools {
        self.pools.get_or_init(|| RecordedPools::of_index(self.snap, self.device, self.index()))
    }

    /// The trace's segment events and steps ([`TraceIndex`]).
    pub fn index(&self) -> &TraceIndex {
        self.index.get_or_init(|| TraceIndex::of(self.snap, self.device))
    }

    pub fn trace(&self) -> &'a [TraceEvent] {
        self.snap.device_traces.get(self.device as usize).map_or(&[], Vec::as_slice)
    }
}
