//! A step program from the closed-form pass ([`crate::live`]): for the jobs no template
//! was recorded for — Megatron's and torchtitan's layers, pipeline stages, ZeRO's shards,
//! LoRA, compiled steps, calibrated plans.
//!
//! The terms the closed form gives are laid out as a step allocates them, so that the
//! replay sees tensors of the sizes and lifetimes a real step has rather than one sum:
//!
//! - setup: the weights, one tensor per layer's share and the tables outside the layers;
//!   the persistent buffers (cuBLAS workspace, a framework's buckets);
//! - each micro-batch's forward: every layer's kept activations as that layer's tensors
//!   (what it saves for the backward), then the logits and the loss's tensors; the
//!   temporaries the step gathers (ZeRO-3's layer, AMP's copies) for as long as the forward;
//! - the backward: the loss's gradients; then layer by layer from the top, the layer's
//!   gradients made and its activations freed; a checkpointed layer's activations made again
//!   before its backward (the recompute) and freed after it;
//! - the optimizer step: the state made by the first step, its temporaries, then
//!   `zero_grad` freeing the gradients.
//!
//! Where the closed form models the step by phases ([`crate::step`]), each phase's peak is
//! what the program holds at its peak: the forward's activations and logits, the
//! backward's, and the optimizer's temporaries.

use crate::job::{Checkpointing, Framework, TrainConfig};
use crate::live::StageMemory;
use crate::program::{Law, Phase, Program, TensorId, Term};

/// The closed form's terms for one stage, laid out as a program of `steps` steps over
/// `layers` layers' worth of activations.
pub fn program(cfg: &TrainConfig, m: &StageMemory, workspace: f64, layers: u64, steps: u32) -> Program {
    let mut p = Program::default();
    let b = &m.breakdown;
    let layers = layers.max(1);
    let site = |p: &mut Program, s: &str| p.site(s);
    p.mark(0, Phase::Setup);
    // Weights: a layer's share each, the rest (embeddings, head) as one table.
    let w_site = site(&mut p, "weights");
    let per_layer_weights = b.weights * 0.9 / layers as f64;
    for _ in 0..layers {
        p.alloc(Law::fixed(per_layer_weights), Term::Weights, w_site);
    }
    p.alloc(Law::fixed(b.weights - per_layer_weights * layers as f64), Term::Weights, w_site);
    let ws_site = site(&mut p, "cuBLAS workspace");
    if workspace > 0.0 {
        p.alloc(Law::fixed(workspace), Term::Workspace, ws_site);
    }
    // The phases' terms, or the closed form's sum at once.
    let (fwd_act, fwd_logits, fwd_temp, bwd_grads, bwd_act, bwd_logits, bwd_temp, opt_temp) = match &m.phases {
        Some(ph) => (
            ph.forward.activations,
            ph.forward.logits,
            ph.forward.temporary + ph.forward.calibration.max(0.0),
            ph.backward.gradients,
            ph.backward.activations,
            ph.backward.logits,
            ph.backward.temporary + ph.backward.calibration.max(0.0),
            ph.optimizer.temporary + ph.optimizer.calibration.max(0.0),
        ),
        None => {
            let temp = (b.temporary - workspace).max(0.0);
            // The closed form's logits are the loss's every copy at its peak: held once.
            (b.activations, b.logits, temp, b.gradients, b.activations, 0.0, temp, 0.0)
        }
    };
    let a_site = site(&mut p, "layer activations");
    let l_site = site(&mut p, "logits and loss");
    let t_site = site(&mut p, "temporaries");
    let g_site = site(&mut p, "gradients");
    let o_site = site(&mut p, "optimizer");
    let checkpointed = !matches!(cfg.checkpointing, Checkpointing::None);
    // Megatron's and DeepSpeed's gradients live in buffers made once; PyTorch's
    // `zero_grad(set_to_none=True)` (transformers, torchtitan) frees them every step.
    let persistent_grads = m.phases.is_none() && cfg.framework != Framework::Torchtitan || cfg.deepspeed();
    let mut kept_grads: Vec<TensorId> = Vec::new();
    if persistent_grads {
        for _ in 0..layers {
            kept_grads.push(p.alloc(Law::fixed(bwd_grads / layers as f64), Term::Gradients, g_site));
        }
    }
    let per_layer = fwd_act / layers as f64;
    let mut states: Vec<TensorId> = Vec::new();
    // The loss's tensors as shares of the closed form's logits: 16-bit logits, their fp32
    // upcast and log-softmax's output in the forward; the fp32 gradient and its 16-bit copy in
    // the backward (16 bytes a logit). In fp32 (and torchtitan's, which deletes the 16-bit
    // logits first) 12: two copies in the forward, the gradient in the backward.
    let sixteen = m.phases.is_none()
        && cfg.framework != Framework::Torchtitan
        && !matches!(cfg.precision, crate::job::Precision::Fp32);
    let (loss_forward, loss_backward): (&[f64], &[f64]) = match (m.phases.is_some(), sixteen) {
        (true, _) => (&[1.0], &[]),
        (false, true) => (&[2.0 / 16.0, 4.0 / 16.0, 4.0 / 16.0], &[4.0 / 16.0, 2.0 / 16.0]),
        (false, false) => (&[4.0 / 12.0, 4.0 / 12.0], &[4.0 / 12.0]),
    };
    // Temporaries a phase model names (AMP's weight copies) are made layer by layer and kept
    // for the forward, as autocast's cache keeps them; the others (ZeRO-3's gathered layer,
    // a dequantized base matrix, a bucket) are a layer's own, made and dropped around it.
    let cached_temps = m.phases.is_some();
    for step in 1..=steps {
        let mut grads: Vec<TensorId> = Vec::new();
        for micro in 0..cfg.accumulation.max(1) {
            p.mark(step, Phase::Forward);
            let mut cache = Vec::new();
            let mut acts = Vec::with_capacity(layers as usize);
            for _ in 0..layers {
                if fwd_temp > 0.0 {
                    if cached_temps {
                        cache.push(p.alloc(Law::fixed(fwd_temp / layers as f64), Term::Temporary, t_site));
                    } else {
                        let t = p.alloc(Law::fixed(fwd_temp), Term::Temporary, t_site);
                        p.free(t);
                    }
                }
                acts.push(p.alloc(Law::fixed(per_layer), Term::Activations, a_site));
            }
            let logits: Vec<TensorId> =
                loss_forward.iter().map(|k| p.alloc(Law::fixed(fwd_logits * k), Term::Logits, l_site)).collect();
            for t in cache {
                p.free(t);
            }
            p.mark(step, Phase::Backward);
            // Without a phase model the closed form's logits are every copy the loss holds at
            // its peak: the backward's gradients of the logits join the forward's copies, then
            // all go. With one, the phase model counts the backward's apart.
            let grads_of_logits: Vec<TensorId> =
                loss_backward.iter().map(|k| p.alloc(Law::fixed(fwd_logits * k), Term::Logits, l_site)).collect();
            for l in logits.into_iter().chain(grads_of_logits) {
                p.free(l);
            }
            let loss = (bwd_logits > 0.0).then(|| p.alloc(Law::fixed(bwd_logits), Term::Logits, l_site));
            // Under checkpointing the backward holds one layer's full keep beside the kept inputs.
            let recompute = (checkpointed && bwd_act > fwd_act)
                .then(|| p.alloc(Law::fixed(bwd_act - fwd_act), Term::Activations, a_site));
            if let Some(l) = loss {
                p.free(l);
            }
            for act in acts.into_iter().rev() {
                if bwd_temp > 0.0 {
                    let t = p.alloc(Law::fixed(bwd_temp), Term::Temporary, t_site);
                    p.free(t);
                }
                if persistent_grads {
                    // Accumulated into the buffer.
                } else if micro == 0 {
                    grads.push(p.alloc(Law::fixed(bwd_grads / layers as f64), Term::Gradients, g_site));
                } else {
                    let g = p.alloc(Law::fixed(bwd_grads / layers as f64), Term::Gradients, g_site);
                    p.free(g);
                }
                p.free(act);
            }
            if let Some(r) = recompute {
                p.free(r);
            }
        }
        p.mark(step, Phase::Optimizer);
        if states.is_empty() && b.optimizer > 0.0 {
            for _ in 0..layers {
                states.push(p.alloc(Law::fixed(b.optimizer / layers as f64), Term::Optimizer, o_site));
            }
        }
        if opt_temp > 0.0 {
            let t = p.alloc(Law::fixed(opt_temp), Term::Temporary, o_site);
            p.free(t);
        }
        for g in grads {
            p.free(g);
        }
    }
    p
}
