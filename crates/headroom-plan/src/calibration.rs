//! A calibration: the corrections fitted to snapshots of the user's own run
//! ([`crate::calibrate`]), as a transform of a step program. The program's tensors are
//! grouped by what the snapshot can tell apart — what lives between steps, what a forward
//! keeps, what a backward and an optimizer step make ([`group`]) — each group scaled, and
//! tensors of fitted laws added where their phases are ([`Calibration::apply_program`]).

use crate::program::{Law, Op, Phase, Program, Term};
use headroom_trace::phase::ByPhase;

/// One fitted correction of the step program ([`crate::calibrate`]): its own tensors scaled,
/// and a tensor of a fitted law added.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Correction {
    /// What the term's own tensors are multiplied by (1: as planned).
    pub scale: f64,
    /// What is added beside them (zero: nothing).
    pub law: Law,
}

impl Default for Correction {
    fn default() -> Self {
        Correction { scale: 1.0, law: Law::default() }
    }
}

/// An out-of-memory error a snapshot ended in: at this shape or beyond, on a device whose
/// memory for PyTorch is no more than `capacity`, the job does not fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomEvidence {
    pub batch: u64,
    pub seq: u64,
    /// The most PyTorch could have had: what it held, and less than the request beyond.
    pub capacity: u64,
    /// The error as the recording has it.
    pub oom: headroom_trace::recorded_step::RecordedOom,
}

/// What a calibration corrects a tensor as ([`group`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// What lives between steps: the optimizer's state.
    Kept,
    /// What a phase of the step keeps or makes.
    Phase(Phase),
}

/// One value for each group a calibration corrects: what lives between steps, and each phase
/// of the step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ByGroup<T> {
    pub kept: T,
    pub phases: ByPhase<T>,
}

impl<T> ByGroup<T> {
    /// Group `g`'s value; `None` for a phase outside a step.
    pub fn get(&self, g: Group) -> Option<&T> {
        match g {
            Group::Kept => Some(&self.kept),
            Group::Phase(p) => self.phases.get(p),
        }
    }

    /// Group `g`'s value; `None` for a phase outside a step.
    pub fn get_mut(&mut self, g: Group) -> Option<&mut T> {
        match g {
            Group::Kept => Some(&mut self.kept),
            Group::Phase(p) => self.phases.get_mut(p),
        }
    }
}

/// The fitted corrections of a job's step program, from snapshots of the user's own run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Calibration {
    /// Each group's correction. `kept`: the optimizer's state scaled, and bytes the script
    /// keeps added from the first step on. `phases.forward`: what each forward keeps (the
    /// layers' activations and the logits, scaled), and what it adds, alive until its
    /// backward ends. `phases.backward`: the backward's own tensors, and what it adds until
    /// the optimizer step. `phases.optimizer_step`: the optimizer step's temporaries, and
    /// what it adds while it runs.
    pub corrections: ByGroup<Correction>,
    /// The out-of-memory error a snapshot ended in.
    pub oom: Option<OomEvidence>,
}

impl Calibration {
    /// Whether the OOM evidence says a job of this shape does not fit in `capacity` bytes.
    pub fn refuses(&self, micro_batch: u64, seq: u64, capacity: f64) -> Option<&OomEvidence> {
        self.oom.as_ref().filter(|e| micro_batch >= e.batch && seq >= e.seq && capacity <= e.capacity as f64)
    }

    /// `p` corrected: each group's tensors scaled (the optimizer state, what forwards,
    /// backwards and optimizer steps make), and the added tensors alive where their phases
    /// are — what the script keeps from the first forward on, a forward's until its backward
    /// ends, a backward's until the optimizer step, the optimizer step's while it runs.
    pub fn apply_program(&self, p: &Program) -> Program {
        let made = made_in(p);
        let mut out =
            Program { tensors: p.tensors.clone(), ops: Vec::with_capacity(p.ops.len() + 16), sites: p.sites.clone() };
        for (t, &m) in out.tensors.iter_mut().zip(&made) {
            if let Some(c) = group(t, m).and_then(|g| self.corrections.get(g)) {
                if c.scale != 1.0 {
                    t.law = t.law.scaled(c.scale);
                }
            }
        }
        let nonzero = |l: &Law| *l != Law::default();
        let kept = self.corrections.kept.law;
        let site = out.site("calibration (fitted to the snapshot)");
        let mut kept_made = false;
        let mut open: Vec<crate::program::TensorId> = Vec::new();
        for op in &p.ops {
            let Op::Mark { phase, .. } = *op else {
                out.ops.push(*op);
                continue;
            };
            // Outside a step (the model's setup) nothing is added.
            let Some(c) = self.corrections.phases.get(phase) else {
                out.ops.push(*op);
                continue;
            };
            // A forward's correction lives through its backward (what the layers keep); every
            // other until the next phase.
            if phase != Phase::Backward {
                for t in open.drain(..) {
                    out.ops.push(Op::Free(t));
                }
            }
            if !kept_made && nonzero(&kept) {
                kept_made = true;
                out.alloc(kept, Term::Temporary, site);
            }
            out.ops.push(*op);
            let term = if phase == Phase::OptimizerStep { Term::Temporary } else { Term::Activations };
            if nonzero(&c.law) {
                open.push(out.alloc(c.law, term, site));
            }
        }
        for t in open {
            out.ops.push(Op::Free(t));
        }
        out
    }
}

/// The group a tensor's scale belongs to.
///
/// What grows with the tokens in a forward or a backward — what the layers keep, their
/// transients, the backward's gradients of them — is the forward's, wherever it is made: the
/// backward's tensors have the activations' shapes, and scaling one without the other would
/// leave every freed activation's block a little too small or too large for the tensor that
/// reuses it (fragmentation the run does not have). A program laid out from the closed form
/// (every size fixed at its shape) scales its activations and logits.
pub fn group(t: &crate::program::Tensor, made_in: Phase) -> Option<Group> {
    let tokens = t.law.grows_with_batch() || t.law.per_position != 0.0 || t.law.per_position_square != 0.0;
    match (t.term, made_in) {
        (Term::Activations | Term::Logits | Term::Temporary, Phase::Forward | Phase::Backward) if tokens => {
            Some(Group::Phase(Phase::Forward))
        }
        (Term::Activations | Term::Logits, Phase::Forward | Phase::Backward) => Some(Group::Phase(Phase::Forward)),
        (Term::Temporary, Phase::Backward) => Some(Group::Phase(Phase::Backward)),
        (Term::Temporary, Phase::OptimizerStep) => Some(Group::Phase(Phase::OptimizerStep)),
        (Term::Optimizer, _) => Some(Group::Kept),
        _ => None,
    }
}

/// The phase each tensor is allocated in.
pub fn made_in(p: &Program) -> Vec<Phase> {
    let mut out = vec![Phase::Setup; p.tensors.len()];
    let mut phase = Phase::Setup;
    for op in &p.ops {
        match *op {
            Op::Mark { phase: ph, .. } => phase = ph,
            Op::Alloc(t) => {
                if let Some(slot) = out.get_mut(t as usize) {
                    *slot = phase;
                }
            }
            Op::Free(_) | Op::EmptyCache => {}
        }
    }
    out
}
