//! The peak of allocated bytes in each phase of a training step: what the
//! forward, the backward and the optimizer step each held at their highest.
//!
//! The phase is a property of moments, not of allocations: a moment belongs
//! to the phase of the last allocation whose frames name one
//! ([`crate::frames`]). The loss, computed in the user's own code
//! between the model's forward and the backward, names none, so it stays in
//! the forward — where `headroom plan` counts it too ("the forward, at the
//! loss"). A trace of several steps switches back to the forward at the next
//! `Module.forward` allocation, and each phase's peak is its highest over all
//! steps. The moments before the first labelled allocation are the
//! forward's: a trace recorded between steps begins there.
//!
//! Recorded with Python stacks only (`stacks="python"`), the backward's
//! allocations carry no frames at all: the autograd engine runs on threads
//! without Python. In a snapshot that has frames, an allocation without any
//! during the forward is the backward beginning.
//!
//! `headroom plan --calibrate` fits its terms to these figures.

use crate::frames::Phase;
use crate::sites::Sites;
use crate::walk::Walk;
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
        [("forward", self.forward_bytes), ("backward", self.backward_bytes), ("optimizer step", self.optimizer_bytes)]
            .into_iter()
            .filter_map(|(name, b)| Some(format!("{name} {}", headroom_alloc::units::format_size(b?))))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The largest of the phases' peaks (the trace's allocated peak).
    pub fn peak_bytes(&self) -> u64 {
        [self.forward_bytes, self.backward_bytes, self.optimizer_bytes]
            .into_iter()
            .flatten()
            .fold(self.start_bytes, u64::max)
    }
}

/// The step phase an allocation of phase `p` switches to from `now`, if any.
fn step_phase(p: Phase, now: StepPhase) -> Option<StepPhase> {
    match p {
        Phase::Forward | Phase::Evaluation => Some(StepPhase::Forward),
        Phase::Backward => Some(StepPhase::Backward),
        Phase::Unknown if now == StepPhase::Forward => Some(StepPhase::Backward),
        Phase::OptimizerStep => Some(StepPhase::Optimizer),
        Phase::Setup | Phase::DataLoading | Phase::Other | Phase::Unknown => None,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StepPhase {
    Forward,
    Backward,
    Optimizer,
}

/// Walks the whole trace once from where `walk` stands (its start). The walk
/// is left at the end.
pub fn step_phases(walk: &mut Walk, sites: &mut Sites) -> StepPhases {
    let trace = walk.trace();
    let start = walk.totals.allocated_bytes;
    let mut out = StepPhases { start_bytes: start, forward_bytes: Some(start), ..StepPhases::default() };
    let mut phase = StepPhase::Forward;
    while walk.next < trace.len() {
        let e = &trace[walk.next];
        walk.step();
        if e.action == headroom_trace::snapshot::TraceAction::Alloc {
            if let Some(p) = step_phase(sites.info(e.stack).phase, phase) {
                phase = p;
            }
        }
        let slot = match phase {
            StepPhase::Forward => &mut out.forward_bytes,
            StepPhase::Backward => &mut out.backward_bytes,
            StepPhase::Optimizer => &mut out.optimizer_bytes,
        };
        let now = walk.totals.allocated_bytes;
        *slot = Some(slot.map_or(now, |b| b.max(now)));
    }
    out
}
