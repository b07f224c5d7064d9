//! The peak of allocated bytes in each phase of a training step: what the
//! forward, the backward and the optimizer step each held at their highest.
//!
//! The phase is a property of moments, not of allocations: a moment belongs
//! to the phase of the last allocation whose frames name one
//! ([`headroom_trace::recorded_step::step_phase`], the rule the planner's
//! calibration reads steps by). The loss, computed in the user's own code
//! between the model's forward and the backward, names none, so it stays in
//! the forward — where `headroom plan` counts it too ("the forward, at the
//! loss"). A trace of several steps switches back to the forward at the next
//! `Module.forward` allocation, and each phase's peak is its highest over all
//! steps. The moments before the first labelled allocation are the
//! forward's: a trace recorded between steps begins there.
//!
//! This is not where steps begin ([`headroom_trace::recorded_step::find_steps`]
//! cuts whole steps for the calibration): these are the whole trace's peaks,
//! steps cut short included, and a moment after an optimizer step stays in it
//! until an allocation names another phase.
//!
//! Recorded with Python stacks only (`stacks="python"`), the backward's
//! allocations carry no frames at all: the autograd engine runs on threads
//! without Python. In a snapshot that has frames, an allocation without any
//! during the forward is the backward beginning.
//!
//! `headroom plan --calibrate` fits its terms to these figures.

use crate::frames::Phase;
use headroom_trace::phase::ByPhase;
use serde::Serialize;

/// A step's phases as one trace measured them, in bytes allocated (what
/// `torch.cuda.max_memory_allocated()` counts). A phase the trace never
/// entered is `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StepPhases {
    /// Allocated when the trace began: what the step starts from (weights,
    /// optimizer state, inputs, anything else kept between steps).
    pub start_bytes: u64,
    pub forward_bytes: Option<u64>,
    pub backward_bytes: Option<u64>,
    pub optimizer_bytes: Option<u64>,
}

impl StepPhases {
    /// "forward 6.43 GiB, backward 6.45 GiB, optimizer step 6.54 GiB": the phases entered.
    pub fn peaks_text(&self) -> String {
        self.peaks()
            .iter()
            .filter_map(|(phase, b)| Some(format!("{phase} {}", headroom_alloc::units::format_size((*b)?))))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The largest of the phases' peaks (the trace's allocated peak).
    pub fn peak_bytes(&self) -> u64 {
        self.peaks().iter().filter_map(|(_, b)| *b).fold(self.start_bytes, u64::max)
    }

    /// Each phase's peak, `None` where the trace never entered it.
    pub fn peaks(&self) -> ByPhase<Option<u64>> {
        ByPhase { forward: self.forward_bytes, backward: self.backward_bytes, optimizer_step: self.optimizer_bytes }
    }
}

/// Each phase's peak, taken entry by entry as a walk of the trace applies them (the
/// walk of [`crate::over_time`], beside the timeline's bands and the allocations): the
/// phases are the moments' passes that [`crate::roles::Lifetimes`] already read.
pub struct PhasePeaks {
    start: u64,
    peaks: ByPhase<Option<u64>>,
}

impl PhasePeaks {
    /// From the trace's start, `start` bytes allocated: a forward's moment.
    pub fn new(start: u64) -> PhasePeaks {
        PhasePeaks { start, peaks: ByPhase { forward: Some(start), ..ByPhase::default() } }
    }

    /// An entry applied: the moment after it is in `phase`, with `allocated` bytes.
    pub fn see(&mut self, phase: Phase, allocated: u64) {
        if let Some(slot) = self.peaks.get_mut(phase) {
            *slot = Some(slot.map_or(allocated, |b| b.max(allocated)));
        }
    }

    pub fn finish(self) -> StepPhases {
        StepPhases {
            start_bytes: self.start,
            forward_bytes: self.peaks.forward,
            backward_bytes: self.peaks.backward,
            optimizer_bytes: self.peaks.optimizer_step,
        }
    }
}
