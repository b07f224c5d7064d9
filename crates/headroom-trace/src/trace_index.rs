//! What every replay of a device's trace reads from it besides the entries themselves — the
//! segment events, whether any entry names a private pool or records an OOM, where steps
//! begin, and each entry's allocation slot ([`crate::entry_slots`]) — found in one walk of
//! the entries.
//!
//! A trace entry is 88 bytes and a real trace holds millions: each walk of it streams
//! hundreds of megabytes from memory, and the pools' inference, the recorded device's
//! script, the recorded peak and the steps each made one of their own
//! (docs/PERFORMANCE.md, "Replay passes, tenth round"). The segment events are a few
//! thousand of those entries, so each of those readings walks this index instead.
//!
//! A [`crate::device_trace::DeviceTrace`] makes it once, beside the start state on a thread
//! of its own, and the check and every what-if of that trace share it: the slots' probes of a
//! map of addresses are then paid once per trace, not once per pass (docs/PERFORMANCE.md,
//! "Replay passes, eleventh round" and "twelfth round").

use crate::entry_slots::EntrySlots;
use crate::memory_snapshot::{MemorySnapshot, TraceAction, TraceEvent};
use crate::recorded_step::StepStarts;
use crate::replay_device::DeviceCall;
use headroom_alloc::DEFAULT_MEMPOOL;

/// Whether `a` is a device call: `segment_alloc`, `segment_free`, `segment_map` or `segment_unmap`.
#[inline]
pub(crate) fn is_segment_event(a: TraceAction) -> bool {
    matches!(
        a,
        TraceAction::SegmentAlloc | TraceAction::SegmentFree | TraceAction::SegmentMap | TraceAction::SegmentUnmap
    )
}

/// One device's trace, indexed: see the module documentation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceIndex {
    /// The entries that are device calls, ascending.
    segment_events: Vec<usize>,
    /// Whether any entry names a private pool (`pool_id`).
    names_a_pool: bool,
    /// Whether any entry is an OOM the recorded run reported.
    records_an_oom: bool,
    /// The entries at which steps 2, 3, … begin ([`crate::recorded_step::step_starts`]).
    step_starts: Vec<usize>,
    /// Each entry's slot code ([`crate::entry_slots`]).
    slots: Vec<u32>,
    /// The slots the trace's own allocations use: `0..slot_count`.
    slot_count: u32,
}

impl TraceIndex {
    /// `device`'s trace in `snap`, indexed.
    pub fn of(snap: &MemorySnapshot, device: u32) -> Self {
        let trace = snap.device_traces.get(device as usize).map_or(&[][..], Vec::as_slice);
        let mut segment_events = Vec::new();
        let mut names_a_pool = false;
        let mut records_an_oom = false;
        let mut steps = StepStarts::new(snap);
        let mut slots = EntrySlots::with_capacity(trace.len());
        for (i, e) in trace.iter().enumerate() {
            names_a_pool |= e.pool_id != DEFAULT_MEMPOOL;
            records_an_oom |= e.action == TraceAction::Oom;
            if is_segment_event(e.action) {
                segment_events.push(i);
            }
            steps.see(snap, i, e);
            slots.see(trace, i);
        }
        let slot_count = slots.count();
        TraceIndex {
            segment_events,
            names_a_pool,
            records_an_oom,
            step_starts: steps.starts,
            slots: slots.codes,
            slot_count,
        }
    }

    /// Every entry's slot code, packed ([`crate::entry_slots::Code::of`] reads one), one per entry of the trace.
    #[inline]
    pub(crate) fn slot_codes(&self) -> &[u32] {
        &self.slots
    }

    /// The slots the trace's own allocations use: `0..slot_count()`.
    pub(crate) fn slot_count(&self) -> u32 {
        self.slot_count
    }

    /// The entries that are device calls, ascending.
    pub fn segment_events(&self) -> &[usize] {
        &self.segment_events
    }

    /// Whether any entry names a private pool.
    pub fn names_a_pool(&self) -> bool {
        self.names_a_pool
    }

    /// Whether any entry is an OOM the recorded run reported.
    pub fn records_an_oom(&self) -> bool {
        self.records_an_oom
    }

    /// Whether the trace releases a segment (`segment_free`, `segment_unmap`) or records an OOM.
    pub fn releases(&self, trace: &[TraceEvent]) -> bool {
        self.records_an_oom
            || self
                .segment_events
                .iter()
                .any(|&i| matches!(trace[i].action, TraceAction::SegmentFree | TraceAction::SegmentUnmap))
    }

    /// The entries at which steps 2, 3, … begin.
    pub fn step_starts(&self) -> &[usize] {
        &self.step_starts
    }

    /// The device calls of `trace` (the trace indexed), in order: [`DeviceCall::of_trace`].
    pub fn device_calls(&self, trace: &[TraceEvent]) -> Vec<DeviceCall> {
        self.segment_events
            .iter()
            .map(|&i| &trace[i])
            .map(|e| DeviceCall { action: e.action, addr: e.addr, size: e.size })
            .collect()
    }

    /// The end of the highest range a device call of `trace` names (0 if none).
    pub fn calls_end(&self, trace: &[TraceEvent]) -> u64 {
        self.segment_events.iter().map(|&i| trace[i].addr.saturating_add(trace[i].size)).max().unwrap_or(0)
    }

    /// Whether `trace` maps any page of an expandable segment.
    pub fn maps(&self, trace: &[TraceEvent]) -> bool {
        self.segment_events.iter().any(|&i| trace[i].action == TraceAction::SegmentMap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recorded_step::step_starts;
    use crate::snapshot::read_snapshot_file;
    use std::path::Path;

    /// The index says what the walks it stands for said, on every fixture.
    #[test]
    fn the_index_reads_what_the_walks_of_the_trace_read() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/pytorch-snapshots");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            eprintln!("skipped: no fixtures at {}", dir.display());
            return;
        };
        let mut seen = 0;
        for path in entries.flatten().map(|e| e.path()) {
            let Ok(snap) = read_snapshot_file(&path) else { continue };
            for device in 0..snap.device_traces.len() as u32 {
                let trace = &snap.device_traces[device as usize];
                let index = TraceIndex::of(&snap, device);
                let name = path.display();
                assert_eq!(index.device_calls(trace), DeviceCall::of_trace(trace), "{name}");
                assert_eq!(index.step_starts(), step_starts(&snap, device), "{name}");
                assert_eq!(index.names_a_pool(), trace.iter().any(|e| e.pool_id != DEFAULT_MEMPOOL), "{name}");
                assert_eq!(index.maps(trace), trace.iter().any(|e| e.action == TraceAction::SegmentMap), "{name}");
                let releases = trace.iter().any(|e| {
                    matches!(e.action, TraceAction::SegmentFree | TraceAction::SegmentUnmap | TraceAction::Oom)
                });
                assert_eq!(index.releases(trace), releases, "{name}");
                let end = DeviceCall::of_trace(trace).iter().map(|c| c.addr.saturating_add(c.size)).max();
                assert_eq!(index.calls_end(trace), end.unwrap_or(0), "{name}");
                seen += 1;
            }
        }
        assert!(seen > 0, "no fixture read from {}", dir.display());
    }
}
