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
//! from here. These are the closed form's ([`crate::closed_form`]): a program of the step
//! is replayed for the answer. Every term is checked against real PyTorch steps on CPU
//! (`crates/headroom-plan/tests/ground_truth.rs`, `docs/VALIDATION.md`).

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
}

/// The peak of each phase.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Phases {
    pub forward: PhasePeak,
    pub backward: PhasePeak,
    pub optimizer: PhasePeak,
    /// The tensors of the vocabulary's width that make the phases' logits.
    pub loss: LossTensors,
}

/// The loss's tensors of the vocabulary's width, in bytes, as an eager step makes them apart:
/// the caching allocator reuses the forward's blocks for the backward's by their sizes, which
/// one sum of them would hide. All zero where the loss is fused into a compiled graph.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossTensors {
    /// The model's logits, in its width.
    pub logits: f64,
    /// Their fp32 copy where the loss upcasts 16-bit logits; none otherwise.
    pub upcast: f64,
    /// log-softmax's output, which its backward reads.
    pub log_softmax: f64,
    /// Each of the backward's two gradients of the logits in the loss's width: `nll_loss`'s
    /// and `log_softmax`'s.
    pub gradient: f64,
    /// The gradient cast back to the logits' width, where the loss upcast them.
    pub gradient_downcast: f64,
}

impl LossTensors {
    fn of(p: &StepParts) -> LossTensors {
        if p.compiled {
            return LossTensors::default();
        }
        let n = p.tokens * p.logit_width;
        let upcast = p.loss_bytes > p.logit_bytes;
        let cast = |bytes: f64| if upcast { bytes * n } else { 0.0 };
        LossTensors {
            logits: p.logit_bytes * n,
            upcast: cast(p.loss_bytes),
            log_softmax: p.loss_bytes * n,
            gradient: p.loss_bytes * n,
            gradient_downcast: cast(p.logit_bytes),
        }
    }

    /// What the forward holds of them at the loss.
    pub fn forward(&self) -> f64 {
        self.logits + self.upcast + self.log_softmax
    }

    /// What the backward holds of them at its start: log-softmax's output beside both gradients.
    pub fn backward(&self) -> f64 {
        self.log_softmax + 2.0 * self.gradient
    }
}

impl Phases {
    /// The largest phase.
    pub fn peak(&self) -> (Phase, PhasePeak) {
        [(Phase::Forward, self.forward), (Phase::Backward, self.backward), (Phase::OptimizerStep, self.optimizer)]
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
    Phases { forward, backward, optimizer, loss: LossTensors::of(p) }
}

/// What a phase holds whatever the shape's activations: weights, state, inputs.
pub fn base(p: &PhasePeak) -> f64 {
    p.total - p.gradients - p.activations - p.logits - p.temporary
}
