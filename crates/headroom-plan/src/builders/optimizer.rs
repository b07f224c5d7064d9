//! The optimizer step as a program: what `torch.optim` allocates for the implementation
//! that runs (research/optimizer-step-memory.md).
//!
//! | optimizer | first step | every step |
//! |---|---|---|
//! | AdamW, foreach (torch's default on CUDA) | `exp_avg`, `exp_avg_sq` per parameter, in order | `torch._foreach_sqrt` of every second moment at once (a copy of the state's size), freed when the step returns |
//! | AdamW, fused (transformers' Trainer on torch ≥ 2.8) | the same, and a device `step` counter per parameter | nothing |
//! | AdamW, for-loop (torch's default on CPU) | the same as foreach | per parameter, `sqrt` then the quotient `denom`; the previous `denom` lives until the next is made |
//! | SGD with momentum | a momentum buffer per parameter (a copy of its gradient) | nothing |
//! | SGD | nothing | nothing |
//! | Adafactor (transformers') | factored second moments: a row and a column per matrix, fp32 | per parameter, fp32 copies of the update (two, or four for 16-bit parameters), freed at once |
//! | 8-bit Adam (bitsandbytes) | two one-byte states per parameter | nothing |
//!
//! With mixed precision the fp32 master weights are optimizer state too (made in the
//! first step, as DeepSpeed and Megatron keep them).

use super::Device;
use crate::job::{Optimizer, OptimizerImpl, Precision, TrainConfig};
use crate::program::{Law, Program, TensorId, Term};

/// A parameter the optimizer updates: its law (the bytes of the parameter itself).
#[derive(Clone, Copy, Debug)]
pub struct OptimizerParam {
    pub law: Law,
}

/// What persists between steps: the state tensors made by the first step.
#[derive(Clone, Debug, Default)]
pub struct State {
    pub made: bool,
    pub tensors: Vec<TensorId>,
}

/// Bytes per byte of a parameter that a state tensor of its width takes.
fn state_width(precision: Precision) -> f64 {
    match precision {
        // Mixed precision keeps fp32 states for 16-bit parameters.
        Precision::Mixed | Precision::Fp8 => 2.0,
        _ => 1.0,
    }
}

/// One optimizer step over `params` with `grads` (a parameter without a gradient is skipped,
/// as `torch.optim` skips it).
pub fn step(
    p: &mut Program,
    state: &mut State,
    params: &[OptimizerParam],
    grads: &[Option<TensorId>],
    cfg: &TrainConfig,
    device: Device,
) {
    let site = site(p, cfg.optimizer);
    let width = state_width(cfg.precision);
    let with_grad: Vec<&OptimizerParam> =
        params.iter().zip(grads).filter(|(_, g)| g.is_some()).map(|(p, _)| p).collect();
    let first = !state.made;
    if first {
        state.made = true;
        let implementation = cfg.optimizer_implementation(device);
        for x in &with_grad {
            if matches!(cfg.precision, Precision::Mixed | Precision::Fp8) {
                // The fp32 master copy.
                state.tensors.push(p.alloc(x.law.scaled(2.0), Term::Optimizer, site));
            }
            match cfg.optimizer {
                Optimizer::AdamW => {
                    if implementation == OptimizerImpl::Fused && matches!(device, Device::Gpu(_)) {
                        state.tensors.push(p.alloc(Law::fixed(4.0), Term::Optimizer, site));
                    }
                    state.tensors.push(p.alloc(x.law.scaled(width), Term::Optimizer, site));
                    state.tensors.push(p.alloc(x.law.scaled(width), Term::Optimizer, site));
                }
                Optimizer::SgdMomentum => state.tensors.push(p.alloc(x.law.scaled(width), Term::Optimizer, site)),
                Optimizer::Sgd => {}
                Optimizer::Adafactor => {
                    // A row and a column of fp32 per matrix: a small share of it.
                    let factored = Law { fixed: (x.law.fixed / bytes_per(cfg.precision)).sqrt() * 2.0 * 4.0, ..x.law };
                    state.tensors.push(p.alloc(factored, Term::Optimizer, site));
                }
                Optimizer::Adam8bit => {
                    let one_byte = x.law.scaled(1.0 / bytes_per(cfg.precision));
                    state.tensors.push(p.alloc(one_byte, Term::Optimizer, site));
                    state.tensors.push(p.alloc(one_byte, Term::Optimizer, site));
                }
            }
        }
    }
    let laws: Vec<Law> = with_grad.iter().map(|x| x.law).collect();
    temporaries(p, &laws, cfg, device, site);
}

/// What one optimizer step allocates and frees beside the state, over parameters of the
/// bytes `laws` give, for the implementation that runs (the table above): every builder's
/// optimizer step makes these, whoever lays out the state.
pub fn temporaries(p: &mut Program, laws: &[Law], cfg: &TrainConfig, device: Device, site: u32) {
    let width = state_width(cfg.precision);
    match (cfg.optimizer, cfg.optimizer_implementation(device)) {
        (Optimizer::AdamW, OptimizerImpl::Foreach) => {
            let sqrt: Vec<TensorId> = laws.iter().map(|x| p.alloc(x.scaled(width), Term::Temporary, site)).collect();
            for id in sqrt {
                p.free(id);
            }
        }
        (Optimizer::AdamW, OptimizerImpl::ForLoop) => {
            let mut denom: Option<TensorId> = None;
            for x in laws {
                let sqrt = p.alloc(x.scaled(width), Term::Temporary, site);
                let quotient = p.alloc(x.scaled(width), Term::Temporary, site);
                p.free(sqrt);
                if let Some(d) = denom.replace(quotient) {
                    p.free(d);
                }
            }
            if let Some(d) = denom {
                p.free(d);
            }
        }
        (Optimizer::Adafactor, _) => {
            let copies = if matches!(cfg.precision, Precision::Fp32 | Precision::Amp) { 2.0 } else { 4.0 };
            for x in laws {
                let fp32 = x.scaled(4.0 / bytes_per(cfg.precision) * copies);
                let id = p.alloc(fp32, Term::Temporary, site);
                p.free(id);
            }
        }
        _ => {}
    }
}

/// The site an optimizer's tensors are made at.
pub fn site(p: &mut Program, optimizer: Optimizer) -> u32 {
    p.site(match optimizer {
        Optimizer::AdamW => "torch.optim.AdamW",
        Optimizer::Sgd | Optimizer::SgdMomentum => "torch.optim.SGD",
        Optimizer::Adafactor => "transformers Adafactor",
        Optimizer::Adam8bit => "bitsandbytes AdamW8bit",
    })
}

/// Bytes of a parameter element in the job's precision.
fn bytes_per(precision: Precision) -> f64 {
    match precision {
        Precision::Fp32 | Precision::Amp => 4.0,
        _ => 2.0,
    }
}
