//! How much memory the recorded run had, as far as its trace tells.
//!
//! A snapshot does not record the device's size. What it records are the
//! device's answers: every `segment_alloc` and `segment_map` it granted, and
//! the requests it refused — a refusal shows as the allocator releasing its
//! cache and asking again, or as an `oom` entry, which also carries what
//! `cudaMemGetInfo` said was free then. From those:
//!
//! - every grant says the device had at least what was reserved after it, so
//!   at least the recorded peak reserved;
//! - a refusal says the process could not hold what was reserved plus what
//!   was asked for;
//! - an `oom` with less free on the device than the request needed was the
//!   device's own refusal: the process had what it held plus what was free;
//! - an `oom` with more free on the device than the request could have
//!   needed was not the device's: a per-process limit refused it
//!   (`torch.cuda.set_per_process_memory_fraction`, whose limit PyTorch checks
//!   before it asks the device). The limit lies between the peak reserved and
//!   what the refused request would have brought reserved memory to.
//!
//! The limit is replayed at the lower end of that range, the least the run
//! can have had: a setting that avoids an OOM under it avoids it under the
//! real limit too.

use crate::device_trace::DeviceTrace;
use crate::snapshot::TraceAction;
use serde::Serialize;

/// A request the recorded device (or a per-process limit) refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// The trace entry of the request: an `alloc` the allocator served after
    /// releasing its cache, or an `oom`.
    pub index: usize,
    /// Bytes reserved when the refused request was asked for.
    pub reserved: u64,
    /// Bytes the refused request asked for, as PyTorch counts a request
    /// against a per-process limit (its segment size).
    pub asked: u64,
    /// The most device memory any call for the request could have needed:
    /// `asked`, or with expandable segments the pages a mapping of it could
    /// span. A device with more than this free did not refuse the request.
    pub needs_at_most: u64,
    /// What the device said was free, when the trace recorded it (`oom` entries).
    pub device_free: Option<u64>,
}

/// A range a byte count is known to lie in: `at_least <= x < below`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Bounds {
    pub at_least: u64,
    pub below: u64,
}

/// What one device's trace says about its memory. See the module documentation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RecordedMemory {
    /// The most the recorded run reserved: the start state and its segment
    /// events, recounted.
    pub peak_reserved: u64,
    /// The bytes the device had for this process: held plus free at a
    /// refusal that recorded the device's free memory.
    pub device: Option<u64>,
    /// A per-process limit that refused a request the device had room for.
    pub limit: Option<Bounds>,
    /// The least reserved-plus-asked among refusals that say nothing of the
    /// device's free memory (the allocator's own flushes): the process could
    /// not hold that much.
    pub refused_at: Option<u64>,
}

impl RecordedMemory {
    /// What `t`'s trace says, given the requests the check found refused.
    pub fn infer(t: &DeviceTrace, refusals: &[Refusal]) -> RecordedMemory {
        let mut m = RecordedMemory { peak_reserved: recorded_peak_reserved(t), ..Default::default() };
        let mut limit_below: Option<u64> = None;
        for r in refusals {
            let wanted = r.reserved.saturating_add(r.asked);
            match r.device_free {
                Some(free) => {
                    m.device.get_or_insert(r.reserved.saturating_add(free));
                    if free >= r.needs_at_most {
                        limit_below = Some(limit_below.map_or(wanted, |b| b.min(wanted)));
                    }
                }
                None => m.refused_at = Some(m.refused_at.map_or(wanted, |b| b.min(wanted))),
            }
        }
        if let Some(below) = limit_below {
            // Under a limit the allocator's own flushes were the limit's refusals too.
            let below = m.refused_at.map_or(below, |f| f.min(below));
            m.limit = Some(Bounds { at_least: m.peak_reserved, below: below.max(m.peak_reserved + 1) });
            m.refused_at = None;
        }
        m
    }

    /// The simulated device's size for a replay: `given` (`--capacity`) when
    /// there is one; else the device's, when a refusal recorded it; else, when
    /// the device refused without saying what it had, the most the run
    /// reserved (the least it can have had); else `default`, or the recorded
    /// peak if that is more. With the reason, for the report.
    pub fn capacity(&self, given: Option<u64>, default: u64) -> (u64, CapacitySource) {
        if let Some(c) = given {
            return (c, CapacitySource::Given);
        }
        if let Some(d) = self.device {
            return (d.max(self.peak_reserved), CapacitySource::RecordedDevice);
        }
        if self.refused_at.is_some() {
            return (self.peak_reserved, CapacitySource::RefusedAbovePeak);
        }
        if self.peak_reserved > default {
            return (self.peak_reserved, CapacitySource::RecordedPeak);
        }
        (default, CapacitySource::Default)
    }

    /// The per-process limit a replay runs under: the least the recording allows.
    pub fn replayed_limit(&self) -> Option<u64> {
        self.limit.map(|b| b.at_least)
    }
}

/// Where a replay's device size came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacitySource {
    /// `--capacity`.
    Given,
    /// Held plus free when the device refused a request.
    RecordedDevice,
    /// The device refused requests without recording its free memory: the
    /// most the run reserved, the least it can have had.
    RefusedAbovePeak,
    /// Nothing was refused and the default is less than the run reserved.
    RecordedPeak,
    /// Nothing was refused: the default size.
    Default,
}

impl CapacitySource {
    /// The stable name in JSON and its meaning in text.
    pub fn describe(self) -> &'static str {
        match self {
            CapacitySource::Given => "as given with --capacity",
            CapacitySource::RecordedDevice => "the recorded device: held plus free when it refused a request",
            CapacitySource::RefusedAbovePeak => {
                "the most the recorded run reserved: its device refused more without recording its size"
            }
            CapacitySource::RecordedPeak => "the most the recorded run reserved, above the default",
            CapacitySource::Default => "the default: the recording does not say",
        }
    }
}

/// The most bytes the recorded run reserved: what was reserved when its
/// trace began, and each `segment_alloc` / `segment_map` / `segment_free` /
/// `segment_unmap` since, counted as recorded.
pub fn recorded_peak_reserved(t: &DeviceTrace) -> u64 {
    let mut now = t.start.reserved_bytes();
    let mut peak = now;
    let trace = t.trace();
    for e in t.index().segment_events().iter().map(|&i| &trace[i]) {
        match e.action {
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => {
                now = now.saturating_add(e.size);
                peak = peak.max(now);
            }
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => now = now.saturating_sub(e.size),
            _ => {}
        }
    }
    peak
}
