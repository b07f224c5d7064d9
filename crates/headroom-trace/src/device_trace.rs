//! One device's trace in a snapshot, with the allocator's state when it began:
//! what every replay of the trace starts from.

use crate::snapshot::{MemorySnapshot, TraceEvent};
use crate::start_state::{infer_start, InconsistentTrace, StartState};

/// One device's trace in a snapshot, with the allocator's state when the
/// trace began: inferred once, then checked and replayed under any settings.
pub struct DeviceTrace<'a> {
    pub snap: &'a MemorySnapshot,
    pub device: u32,
    pub start: StartState,
}

impl<'a> DeviceTrace<'a> {
    /// The start state inferred under the snapshot's recorded settings.
    pub fn new(snap: &'a MemorySnapshot, device: u32) -> Result<Self, InconsistentTrace> {
        let start = infer_start(snap, device, &snap.allocator_config().0)?;
        Ok(DeviceTrace { snap, device, start })
    }

    pub fn trace(&self) -> &'a [TraceEvent] {
        self.snap.device_traces.get(self.device as usize).map_or(&[], Vec::as_slice)
    }
}
