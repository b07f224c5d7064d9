//! How long a step's `loss` lives ([`LossLife`]), and with it what the loss's autograd graph
//! holds after the backward: the tensors the recorded step made and never freed — under
//! checkpointing, the leaves made to require a gradient (the input embeddings' output, which
//! peft's `enable_input_require_grads` marks; T5's zero position bias) and their `.grad`s.
//!
//! Between micro-batches of one step, the loop keeps the loss until the next forward's replaces
//! it, except transformers' `Trainer`, whose `training_step` returns after each backward. So the
//! plan frees a micro-batch's pair: as its backward ends (`trainer`); as the next micro-batch's
//! forward ends, the last of the step after the optimizer step and `zero_grad` (`function`); or as
//! the next forward ends, the next step's for the step's last, the last as the loop ends
//! (`inline`).

use crate::builders::{Device, StateScale};
use crate::job::{LossLife, TrainConfig};
use crate::model::Model;
use crate::program::{Program, TensorId};

/// What the loss's graph holds now that a micro-batch's backward has ended: freed at once where
/// the loop lets the loss go with the backward; what is still held otherwise.
pub(super) fn backward_ended(life: LossLife, p: &mut Program, held: Vec<TensorId>) -> Vec<TensorId> {
    match life {
        LossLife::Trainer => {
            free(p, held);
            Vec::new()
        }
        LossLife::Function | LossLife::Inline => held,
    }
}

/// What the loss's graph holds once the step's optimizer step and `zero_grad` are done: freed
/// where the step's function returns; still held where the loop keeps its loss.
pub(super) fn step_ended(life: LossLife, p: &mut Program, held: Vec<TensorId>) -> Vec<TensorId> {
    match life {
        LossLife::Function => {
            free(p, held);
            Vec::new()
        }
        LossLife::Trainer | LossLife::Inline => held,
    }
}

/// The loop ends: the last loss goes, and what its graph held with it.
pub(super) fn loop_ended(p: &mut Program, held: Vec<TensorId>) {
    free(p, held);
}

fn free(p: &mut Program, held: Vec<TensorId>) {
    for id in held {
        p.free(id);
    }
}

/// The first steady step of a replay: one whose forward holds what the loop holds of the step
/// before's loss. A template recorded since 2026-11-30 keeps the first step's pair in `step1`, as
/// held there (`step_programs.held_into_step2`), so with an `inline` loop its second step's forward
/// holds the first's and is steady; one recorded before left it out (as living from one step into
/// the next), so its second step's forward holds none and its third is the first to hold the
/// second's. The third is steady for both. A loop that lets its loss go within the step carries
/// nothing over, and its second step is steady.
pub(super) fn steady_step(life: LossLife) -> u32 {
    match life {
        LossLife::Inline => 3,
        LossLife::Trainer | LossLife::Function => 2,
    }
}

/// Whether template `key`'s step, as `device` runs it for `cfg`, leaves anything held by the
/// loss after its backward: where it does, how long the loop keeps its loss moves the plan.
pub fn loss_holds(model: &Model, cfg: &TrainConfig, device: Device, key: &str) -> bool {
    // The second step holds it whether or not the template's `step1` does (`steady_step`).
    super::program_of(model, cfg, device, key, 2, &StateScale::default()).is_ok_and(|hf| hf.loss_held > 0)
}
