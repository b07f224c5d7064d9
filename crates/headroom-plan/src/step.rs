//! A training step as Hugging Face transformers and `torch.optim` run it, as
//! phases: the peak is the largest of what each phase holds, not the sum of
//! every term — with `zero_grad(set_to_none=True)`, no gradient exists while
//! the forward keeps its activations, and the activations are gone by the
//! optimizer step.
//!
//! | phase | alive (tensors only) |
//! |---|---|
//! | forward, at the loss | weights, optimizer state, inputs, AMP's 16-bit weight copies, what the recipe saves, and the logits (upcast to fp32 when 16-bit) |
//! | start of the backward | the same without the logits, with the loss's two fp32 gradients of the logits (`nll_loss` and `log_softmax` backward) |
//! | a checkpointed layer's backward | one layer's full keep beside the checkpoints, with the head's gradient |
//! | end of the backward | weights, state, every gradient |
//! | optimizer step | weights, state, gradients and the optimizer's temporaries (AdamW with `foreach`: a square root of the second moments, the size of the state it reads) |
//!
//! Where transformers' own step was recorded allocation by allocation
//! ([`crate::step_recipe`]: every family it runs), the forward and backward
//! are the peaks of its moments instead, and only the optimizer step comes
//! from here. Every term is checked against real PyTorch steps on CPU
//! (`crates/headroom-plan/tests/ground_truth.rs`, `docs/VALIDATION.md`).

use crate::program::{Law, Op, Program, Term};
use crate::recipe::Saved;

pub use crate::program::Phase;

/// What a step is made of, in bytes on one GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepParts {
    pub weights: f64,
    pub gradients: f64,
    pub optimizer_state: f64,
    /// What the optimizer step allocates beside the state.
    pub optimizer_temp: f64,
    /// Token ids and labels.
    pub inputs: f64,
    pub saved: Saved,
    /// Tokens of the micro-batch.
    pub tokens: f64,
    /// Logits per token (the vocabulary; a few labels for classification).
    pub logit_width: f64,
    /// Bytes per logit (2 for 16-bit models and AMP, 4 for fp32).
    pub logit_bytes: f64,
    /// Bytes per logit of the loss's log-softmax and its gradients (4 when the loss upcasts).
    pub loss_bytes: f64,
    /// With checkpointing: one layer's full keep, recomputed in the backward.
    pub recomputed_layer: Option<f64>,
    /// Of that layer's keep, eager attention's s × s matrices.
    pub recomputed_layer_attention: f64,
    /// The gradient of the output layer, made first in the backward.
    pub head_gradient: f64,
    /// What a layer's attention backward holds beside its saved tensors (eager: two fp32
    /// s × s gradients).
    pub attention_backward: f64,
    /// What the embedding's backward makes beside every other gradient, last: its
    /// gradient, and with tied embeddings the sum with the head's gradient too.
    pub embedding_tail: f64,
    /// The step runs as `torch.compile`'s graphs: the loss is fused into the forward's graph,
    /// which ends holding what it saves and nothing more of the vocabulary's width (the
    /// logits are among the saved tensors). Where the compiled step itself was recorded
    /// ([`crate::step_recipe`]), its moments replace these phases' forward and backward.
    pub compiled: bool,
}

/// The bytes alive at each phase's peak, tensors only, and which terms make them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PhasePeak {
    pub total: f64,
    pub gradients: f64,
    pub activations: f64,
    /// Of `activations`, eager attention's s × s matrices and their gradients: what grows
    /// with the square of the sequence.
    pub attention: f64,
    /// The loss: saved outside the layers, and the logits' transients.
    pub logits: f64,
    /// AMP's weight copies, or the optimizer's temporaries.
    pub temporary: f64,
    /// What a calibration from the user's own run adds ([`crate::calibrate`]); 0 without one.
    pub calibration: f64,
}

/// The peak of each phase.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Phases {
    pub forward: PhasePeak,
    pub backward: PhasePeak,
    pub optimizer: PhasePeak,
}

impl Phases {
    /// The largest phase.
    pub fn peak(&self) -> (Phase, PhasePeak) {
        [(Phase::Forward, self.forward), (Phase::Backward, self.backward), (Phase::Optimizer, self.optimizer)]
            .into_iter()
            .fold((Phase::Forward, self.forward), |best, p| if p.1.total > best.1.total { p } else { best })
    }
}

/// The phases of one step.
pub fn phases(p: &StepParts) -> Phases {
    let base = p.weights + p.optimizer_state + p.inputs;
    let s = &p.saved;
    let copies = s.weight_copies;
    let logits = p.tokens * p.logit_width;
    // A loss that upcasts 16-bit logits holds the fp32 copy beside them; its log-softmax
    // output is in the recipe.
    let upcast = if p.loss_bytes > p.logit_bytes { p.loss_bytes } else { 0.0 };
    let at_loss = if p.compiled { 0.0 } else { logits * (p.logit_bytes + upcast) };
    let peak = |gradients: f64, (activations, attention): (f64, f64), loss: f64, temporary: f64| PhasePeak {
        total: base + gradients + activations + loss + temporary,
        gradients,
        activations,
        attention,
        logits: loss,
        temporary,
        calibration: 0.0,
    };
    let layers = (s.layers, s.attention);
    let with_layer =
        |layer: f64, extra: f64| (s.layers + layer + extra, s.attention + p.recomputed_layer_attention + extra);
    let mut forward = peak(0.0, layers, s.outside + at_loss, copies);
    if let Some(layer) = p.recomputed_layer {
        // Under checkpointing a layer's forward still makes everything it would keep, then drops it.
        let inside = peak(0.0, with_layer(layer, 0.0), 0.0, copies);
        if inside.total > forward.total {
            forward = inside;
        }
    }
    // nll_loss's and log_softmax's gradients of the logits, side by side, in the loss's width.
    let start = peak(0.0, layers, s.outside + logits * 2.0 * p.loss_bytes, copies);
    let mut backward = start;
    if let Some(layer) = p.recomputed_layer {
        // The top layer recomputed beside every checkpoint, the head's gradient made, the
        // loss's tensors gone; eager attention's backward holds the gradients of its s × s
        // probabilities and scores in fp32 besides.
        let top = peak(p.head_gradient, with_layer(layer, p.attention_backward), 0.0, copies);
        if top.total > backward.total {
            backward = top;
        }
    }
    let end = peak(p.gradients, (0.0, 0.0), 0.0, p.embedding_tail);
    if end.total > backward.total {
        backward = end;
    }
    let optimizer = peak(p.gradients, (0.0, 0.0), 0.0, p.optimizer_temp);
    Phases { forward, backward, optimizer }
}

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
        let made = crate::calibrate::made_in(p);
        let mut out =
            Program { tensors: p.tensors.clone(), ops: Vec::with_capacity(p.ops.len() + 16), sites: p.sites.clone() };
        let scales = [self.forward.scale, self.backward.scale, self.optimizer.scale, self.kept.scale];
        for (t, &m) in out.tensors.iter_mut().zip(&made) {
            if let Some(g) = crate::calibrate::group(t, m) {
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

    /// The closed form's phases, corrected as far as phases can be: the forward's scale on
    /// the activations and logits, what the script keeps on every phase.
    pub fn apply(&self, p: &Phases) -> Phases {
        let kept = self.kept.law.fixed;
        let one = |p: &PhasePeak| {
            let activations = p.activations * self.forward.scale;
            let attention = p.attention * self.forward.scale;
            let logits = p.logits * self.forward.scale;
            let calibration = p.calibration + kept;
            PhasePeak {
                total: base(p) + p.gradients + activations + logits + p.temporary + calibration,
                activations,
                attention,
                logits,
                calibration,
                ..*p
            }
        };
        Phases { forward: one(&p.forward), backward: one(&p.backward), optimizer: one(&p.optimizer) }
    }
}

/// What a phase holds whatever the shape's activations: weights, state, inputs.
pub fn base(p: &PhasePeak) -> f64 {
    p.total - p.gradients - p.activations - p.logits - p.temporary - p.calibration
}
