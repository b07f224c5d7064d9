//! A calibration: the corrections fitted to snapshots of the user's own run
//! ([`crate::calibrate`]), as a transform of a step program. The program's tensors are
//! grouped by what the snapshot can tell apart — what lives between steps, what a forward
//! keeps, what a backward and an optimizer step make ([`group`]) — each group scaled, and
//! tensors of fitted laws added where their phases are ([`Calibration::apply_program`]).

use crate::program::{Law, Op, Phase, Program, Term};

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
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OomEvidence {
    pub batch: u64,
    pub seq: u64,
    /// The rounded bytes asked.
    pub asked: u64,
    /// What the device said was free (more than asked: a per-process limit refused it).
    pub device_free: Option<u64>,
    pub allocated: u64,
    pub reserved: u64,
    /// The most PyTorch could have had: what it held, and less than the request beyond.
    pub capacity: u64,
    pub phase: crate::program::Phase,
}

/// The fitted corrections of a job's step program, from snapshots of the user's own run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Calibration {
    /// What lives between steps: the optimizer's state scaled, and bytes the script keeps
    /// added from the first step on.
    pub kept: Correction,
    /// What each forward keeps (the layers' activations and the logits, scaled), and what it
    /// adds, alive until its backward ends.
    pub forward: Correction,
    /// The backward's own tensors, and what it adds until the optimizer step.
    pub backward: Correction,
    /// The optimizer step's temporaries, and what it adds while it runs.
    pub optimizer: Correction,
    /// The out-of-memory error a snapshot ended in.
    pub oom: Option<OomEvidence>,
}

impl Calibration {
    /// The correction of phase `k`: 0 forward, 1 backward, 2 optimizer step.
    pub fn phase_mut(&mut self, k: usize) -> &mut Correction {
        match k {
            0 => &mut self.forward,
            1 => &mut self.backward,
            _ => &mut self.optimizer,
        }
    }

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
        let scales = [self.forward.scale, self.backward.scale, self.optimizer.scale, self.kept.scale];
        for (t, &m) in out.tensors.iter_mut().zip(&made) {
            if let Some(g) = group(t, m) {
                if scales[g] != 1.0 {
                    t.law = t.law.scaled(scales[g]);
                }
            }
        }
        let nonzero = |l: &Law| *l != Law::default();
        let site = out.site("calibration (fitted to the snapshot)");
        let mut kept_made = false;
        let mut open: Vec<crate::program::TensorId> = Vec::new();
        for op in &p.ops {
            let Op::Mark { phase, .. } = *op else {
                out.ops.push(*op);
                continue;
            };
            // A forward's correction lives through its backward (what the layers keep); every
            // other until the next phase.
            if phase != Phase::Setup && phase != Phase::Backward {
                for t in open.drain(..) {
                    out.ops.push(Op::Free(t));
                }
            }
            if phase != Phase::Setup && !kept_made && nonzero(&self.kept.law) {
                kept_made = true;
                out.alloc(self.kept.law, Term::Temporary, site);
            }
            out.ops.push(*op);
            let (law, term) = match phase {
                Phase::Setup => continue,
                Phase::Forward => (self.forward.law, Term::Activations),
                Phase::Backward => (self.backward.law, Term::Activations),
                Phase::Optimizer => (self.optimizer.law, Term::Temporary),
            };
            if nonzero(&law) {
                open.push(out.alloc(law, term, site));
            }
        }
        for t in open {
            out.ops.push(Op::Free(t));
        }
        out
    }
}

/// The group a tensor's scale belongs to: 0 forward, 1 backward, 2 optimizer, 3 state.
///
/// What grows with the tokens in a forward or a backward — what the layers keep, their
/// transients, the backward's gradients of them — is the forward's, wherever it is made: the
/// backward's tensors have the activations' shapes, and scaling one without the other would
/// leave every freed activation's block a little too small or too large for the tensor that
/// reuses it (fragmentation the run does not have). A program laid out from the closed form
/// (every size fixed at its shape) scales its activations and logits.
pub fn group(t: &crate::program::Tensor, made_in: Phase) -> Option<usize> {
    let tokens = t.law.grows_with_batch() || t.law.per_position != 0.0 || t.law.per_position_square != 0.0;
    match (t.term, made_in) {
        (Term::Activations | Term::Logits | Term::Temporary, Phase::Forward | Phase::Backward) if tokens => Some(0),
        (Term::Activations | Term::Logits, Phase::Forward | Phase::Backward) => Some(0),
        (Term::Temporary, Phase::Backward) => Some(1),
        (Term::Temporary, Phase::Optimizer) => Some(2),
        (Term::Optimizer, _) => Some(3),
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
