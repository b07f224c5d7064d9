//! A device's trace as the moments a planner compares with its own step
//! ([`headroom_trace::recorded_step::Recording`]): each allocation and free with the phase its
//! frames name and the totals after it, and each refusal.
//!
//! `headroom plan --calibrate` finds the run's whole steps in this list and fits its step
//! program to the last steady one. Nothing here decides what a step is
//! ([`headroom_trace::recorded_step`] does): the phases come from the frames alone
//! ([`crate::frames`]), the totals from the walk ([`crate::walk`]), so the same list serves
//! any reader of steps.

use crate::frames::Classifier;
use crate::walk::Walk;
use headroom_trace::device_trace::DeviceTrace;
use headroom_trace::recorded_step::{Entry, Moment, Recording};
use headroom_trace::snapshot::{MemorySnapshot, TraceAction};

/// The device a snapshot trained on: the one whose trace is longest. `None` when no device
/// has a trace (the snapshot holds only the moment it was taken).
pub fn trained_device(snap: &MemorySnapshot) -> Option<u32> {
    snap.devices()
        .into_iter()
        .filter_map(|d| Some((d, snap.device_traces.get(d as usize)?.len())))
        .filter(|&(_, n)| n > 0)
        .max_by_key(|&(_, n)| n)
        .map(|(d, _)| d)
}

/// The moments of `device`'s trace in `snap`. Block sizes are the requests rounded as
/// PyTorch rounds them (a large block's unsplit remainder, at most 1 MiB, is missed).
pub fn recording(snap: &MemorySnapshot, device: u32) -> Recording {
    let dt = DeviceTrace::new(snap, device).ok();
    let mut walk = Walk::new(snap, device, dt.as_ref().map(|t| &t.start));
    let trace = walk.trace();
    let mut classifier = Classifier::new(&snap.stacks, false);
    let mut out = Recording {
        start_allocated: walk.totals.allocated_bytes,
        start_reserved: walk.totals.reserved_bytes,
        entries: Vec::with_capacity(trace.len()),
        ..Recording::default()
    };
    while let Some(e) = trace.get(walk.next) {
        let moment = match e.action {
            TraceAction::Alloc => {
                out.has_frames |= e.stack != 0;
                let phase = classifier.info(e.stack).phase;
                let i = walk.next;
                walk.step();
                let bytes = walk.allocated_by(i).map_or(0, |l| l.size);
                Some(Moment::Alloc { bytes, phase })
            }
            TraceAction::FreeRequested | TraceAction::Free => {
                let before = walk.named_by_next().filter(|l| !l.pending).map(|l| (l.size, l.since.is_none()));
                walk.step();
                before.map(|(bytes, before_trace)| Moment::Free { bytes, before_trace })
            }
            TraceAction::Oom => {
                walk.step();
                Some(Moment::Oom { asked: e.size, device_free: e.device_free })
            }
            _ => {
                walk.step();
                None
            }
        };
        if let Some(moment) = moment {
            out.entries.push(Entry {
                moment,
                allocated: walk.totals.allocated_bytes,
                reserved: walk.totals.reserved_bytes,
            });
        } else if let Some(last) = out.entries.last_mut() {
            // A segment's entry moves reserved memory between moments: it belongs to the last.
            last.reserved = last.reserved.max(walk.totals.reserved_bytes);
        } else {
            out.start_reserved = out.start_reserved.max(walk.totals.reserved_bytes);
        }
    }
    out.unmatched_frees = walk.unmatched_frees;
    out
}
