//! The simulated GPU a snapshot replays on.
//!
//! Where a new segment lands decides later choices: among free blocks of
//! equal size PyTorch takes the lowest address, so a replay whose segments
//! sit elsewhere than the recorded ones picks blocks in another order from
//! then on, and its peaks drift from the recording's although every rule is
//! PyTorch's. So the device follows the recording: while the replay's device
//! calls are the recorded ones, in order — each `cudaMalloc` of the recorded
//! size, each `cudaFree`, map and unmap of the recorded range — it hands out
//! the recorded addresses (and places an expandable segment's reservation
//! where its first recorded mapping begins). From the first call that is not
//! the recorded one (another size, a call the recording did not make, or one
//! it made that the replay skips) it picks its own, for the rest of the run.
//!
//! The calls are compared in order and never searched for: a replay that
//! departs once has left the recorded run, whatever it does later.

use crate::memory_snapshot::{TraceAction, TraceEvent};
use headroom_alloc::{
    CountingDevice, DeviceCalls, DeviceError, DeviceInfo, DeviceMemory, EventId, MemInfo, SimDevice, StreamId,
};

/// One recorded device call: `segment_alloc`, `segment_free`, `segment_map` or `segment_unmap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceCall {
    pub action: TraceAction,
    pub addr: u64,
    pub size: u64,
}

impl DeviceCall {
    /// The device calls of a trace, in order.
    pub fn of_trace(trace: &[TraceEvent]) -> Vec<DeviceCall> {
        trace
            .iter()
            .filter(|e| crate::trace_index::is_segment_event(e.action))
            .map(|e| DeviceCall { action: e.action, addr: e.addr, size: e.size })
            .collect()
    }
}

/// A [`SimDevice`] that follows a recorded run's device calls while they
/// agree. See the module documentation.
#[derive(Clone, Debug)]
pub struct RecordedDevice {
    /// Counted: what the replay's device calls would cost on a GPU.
    sim: CountingDevice<SimDevice>,
    script: Vec<DeviceCall>,
    /// The next recorded call.
    next: usize,
    following: bool,
    /// Set while a request the recording shows failing is replayed: the
    /// reservation it makes on its way to failing is not the one the next
    /// recorded mapping opens.
    failing: bool,
}

impl RecordedDevice {
    /// A device that picks every address itself.
    pub fn new(sim: SimDevice) -> Self {
        RecordedDevice { sim: CountingDevice::new(sim), script: Vec::new(), next: 0, following: false, failing: false }
    }

    /// A device that follows `script`, the recorded run's device calls in order.
    pub fn following(sim: SimDevice, script: Vec<DeviceCall>) -> Self {
        RecordedDevice { sim: CountingDevice::new(sim), script, next: 0, following: true, failing: false }
    }

    /// The simulated device underneath, to place segments and complete
    /// events (which are not device calls of the replay's).
    pub fn sim(&self) -> &SimDevice {
        self.sim.inner()
    }

    pub fn sim_mut(&mut self) -> &mut SimDevice {
        self.sim.inner_mut()
    }

    /// The device calls the replay made, by kind, with the pages mapped and unmapped.
    pub fn calls(&self) -> DeviceCalls {
        self.sim.calls()
    }

    /// Says that the request replayed now is one the recording shows failing
    /// (an `oom` entry), or that it is over.
    pub fn replaying_a_failure(&mut self, yes: bool) {
        self.failing = yes;
    }

    /// Whether every device call so far was the recorded one.
    pub fn is_following(&self) -> bool {
        self.following
    }

    /// Recorded device calls the replay made, in order, before it departed (or all of them).
    pub fn calls_followed(&self) -> usize {
        self.next
    }

    /// The recorded call the replay's next one must equal to keep following.
    fn expected(&self) -> Option<DeviceCall> {
        self.following.then(|| self.script.get(self.next).copied()).flatten()
    }

    /// Takes the replay's call: the next recorded one if it is `call`, else
    /// the replay has departed from the recording.
    fn take(&mut self, call: DeviceCall) -> bool {
        if self.expected() == Some(call) {
            self.next += 1;
            true
        } else {
            self.following = false;
            false
        }
    }
}

impl DeviceMemory for RecordedDevice {
    fn info(&self) -> DeviceInfo {
        self.sim.info()
    }

    fn mem_get_info(&self) -> MemInfo {
        self.sim.mem_get_info()
    }

    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        let recorded = self.expected().filter(|c| {
            c.action == TraceAction::SegmentAlloc && c.size == size && !self.sim().segment_overlaps(c.addr, size)
        });
        let Some(call) = recorded else {
            self.following = false;
            return self.sim.malloc(size);
        };
        self.sim_mut().push_next_address(call.addr);
        let r = self.sim.malloc(size);
        if r.is_ok() {
            self.next += 1;
        } else {
            // The recorded device granted what this one refused.
            self.sim_mut().clear_next_addresses();
            self.following = false;
        }
        r
    }

    fn free(&mut self, ptr: u64, size: u64) -> Result<(), DeviceError> {
        self.take(DeviceCall { action: TraceAction::SegmentFree, addr: ptr, size });
        self.sim.free(ptr, size)
    }

    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError> {
        // A reservation is not traced; its first mapping is, at its base. A
        // request reserves before its first attempt to map, which may fail and
        // be retried after the releases of a flush: the mapping is the first
        // call after them.
        let upcoming = self.script[self.next.min(self.script.len())..]
            .iter()
            .find(|c| !matches!(c.action, TraceAction::SegmentFree | TraceAction::SegmentUnmap))
            .copied();
        let mapping = upcoming.filter(|c| self.following && !self.failing && c.action == TraceAction::SegmentMap);
        if let Some(c) = mapping {
            if !self.sim().is_reserved(c.addr) && !self.sim().reservation_overlaps(c.addr, size) {
                self.sim_mut().push_next_reservation(c.addr);
            }
        }
        let r = self.sim.reserve(size);
        self.sim_mut().clear_next_addresses();
        r
    }

    fn release_reservation(&mut self, va: u64, size: u64) -> Result<(), DeviceError> {
        self.sim.release_reservation(va, size)
    }

    fn map(&mut self, va: u64, size: u64, page: u64) -> Result<(), DeviceError> {
        let r = self.sim.map(va, size, page);
        let call = DeviceCall { action: TraceAction::SegmentMap, addr: va, size };
        if r.is_ok() {
            self.take(call);
        } else {
            self.following = false;
        }
        r
    }

    fn unmap(&mut self, va: u64, size: u64, page: u64, stream: StreamId) -> Result<(), DeviceError> {
        self.take(DeviceCall { action: TraceAction::SegmentUnmap, addr: va, size });
        self.sim.unmap(va, size, page, stream)
    }

    fn record_event(&mut self, stream: StreamId) -> Result<EventId, DeviceError> {
        self.sim.record_event(stream)
    }

    fn query_event(&mut self, event: EventId) -> Result<bool, DeviceError> {
        self.sim.query_event(event)
    }

    fn synchronize_event(&mut self, event: EventId) -> Result<(), DeviceError> {
        self.sim.synchronize_event(event)
    }

    fn destroy_event(&mut self, event: EventId) {
        self.sim.destroy_event(event)
    }

    fn synchronize(&mut self) -> Result<(), DeviceError> {
        self.sim.synchronize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_alloc::units::MIB;

    fn call(action: TraceAction, addr: u64, size: u64) -> DeviceCall {
        DeviceCall { action, addr, size }
    }

    #[test]
    fn recorded_addresses_while_the_calls_agree_then_its_own() {
        let script = vec![
            call(TraceAction::SegmentAlloc, 0x5000_0000, 20 * MIB),
            call(TraceAction::SegmentAlloc, 0x4000_0000, 2 * MIB),
            call(TraceAction::SegmentFree, 0x5000_0000, 20 * MIB),
            call(TraceAction::SegmentAlloc, 0x6000_0000, 40 * MIB),
        ];
        let mut d = RecordedDevice::following(SimDevice::new(1 << 30), script);
        assert_eq!(d.malloc(20 * MIB).unwrap(), 0x5000_0000);
        assert_eq!(d.malloc(2 * MIB).unwrap(), 0x4000_0000);
        d.free(0x5000_0000, 20 * MIB).unwrap();
        assert!(d.is_following());
        // Another size than the recording's: the device's own address from here on.
        let own = d.malloc(42 * MIB).unwrap();
        assert_ne!(own, 0x6000_0000);
        assert!(!d.is_following());
        assert_eq!(d.calls_followed(), 3);
        assert_ne!(d.malloc(40 * MIB).unwrap(), 0x6000_0000, "a departed replay never returns to the recording");
    }

    #[test]
    fn a_call_the_recording_did_not_make_ends_the_following() {
        let script = vec![call(TraceAction::SegmentAlloc, 0x5000_0000, 20 * MIB)];
        let mut d = RecordedDevice::following(SimDevice::new(1 << 30), script);
        let p = d.malloc(20 * MIB).unwrap();
        d.free(p, 20 * MIB).unwrap();
        assert!(!d.is_following());
    }

    #[test]
    fn a_reservation_starts_where_its_first_recorded_mapping_does() {
        let va = 0x7f00_0000_0000;
        let script = vec![call(TraceAction::SegmentMap, va, 20 * MIB), call(TraceAction::SegmentUnmap, va, 20 * MIB)];
        let mut d = RecordedDevice::following(SimDevice::new(1 << 30), script);
        assert_eq!(d.reserve(1 << 30).unwrap(), va);
        d.map(va, 20 * MIB, 20 * MIB).unwrap();
        d.unmap(va, 20 * MIB, 20 * MIB, 0).unwrap();
        assert!(d.is_following());
        assert_eq!(d.calls_followed(), 2);
    }
}
