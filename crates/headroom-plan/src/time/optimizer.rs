//! The optimizer step's time: memory-bound on the GPU as its implementation runs it, issued by
//! the host where transformers' step was recorded; or with offload, the host link's traffic
//! and the CPU's step.

use super::{eager, Clocks, Host, Stretch, HBM_EFFICIENCY, HOST_OPTIMIZER_PARAMS_PER_S, KERNEL_FLOOR_S};
use crate::job::{Job, Offload, Optimizer, OptimizerImpl, PipelineStage, Precision, TrainConfig};
use crate::model::Model;
use crate::parallel;
use crate::placement::{main_grads_fp32, share, state_bytes_per_param};

/// The optimizer step after `step` seconds, and what of it is communication: on the GPU as
/// its implementation runs it, or with offload the host link's traffic and the CPU's step (the
/// parameters fetched from the host for every pass too where they are offloaded).
#[allow(clippy::too_many_arguments)]
pub(super) fn optimizer_time(
    job: &Job,
    recorded: Option<&eager::Step>,
    layers: f64,
    tensors: f64,
    grad_width: f64,
    host: &Host,
    clocks: &mut Clocks,
    mut step: f64,
) -> (f64, f64) {
    let (model, gpu, cfg) = (job.model, job.gpu, &job.train);
    let par = &cfg.parallel;
    let m = cfg.accumulation.max(1) as f64;
    let sh = share(model, cfg, if par.pipeline > 1 { PipelineStage::First } else { PipelineStage::Only });
    let n = par.shard_degree();
    let mut communication = 0.0;
    let host_link = gpu.host_bandwidth * parallel::LINK_EFFICIENCY;
    let updated = sh.trainable / if par.zero_stage >= 1 { n as f64 } else { 1.0 };
    if cfg.offload == Offload::None {
        match recorded.filter(|_| !cfg.deepspeed()) {
            Some(st) => {
                // torch.optim's step, as its implementation runs it: memory-bound over the
                // parameters this GPU updates, and issued by the host (Python per parameter
                // tensor; the for-loop one kernel launch per operation per tensor).
                let implementation = cfg.optimizer_implementation(crate::job::Device::Gpu(gpu));
                let bytes = optimizer_bytes_per_param(model, cfg, implementation) * updated;
                let ops = optimizer_ops(st, layers, tensors, updated, implementation);
                let run = Stretch {
                    n: 1.0,
                    host: host.python_op * ops.python + host.engine_op * ops.scalar_reads,
                    compute: 0.0,
                    memory: (bytes / (gpu.bandwidth * HBM_EFFICIENCY)).max(ops.launches * KERNEL_FLOOR_S),
                };
                clocks.gpu = step;
                clocks.run(run);
                step = clocks.gpu;
            }
            None => {
                // The optimizer step is bound by HBM: it reads the gradients, weights and states of
                // the parameters this GPU updates and writes the weights and states back.
                let s = state_bytes_per_param(model.hidden, cfg.precision, cfg.optimizer);
                let (w, o) = (s.weights, s.optimizer);
                let t = updated * (grad_width + 2.0 * (w + o)) / (gpu.bandwidth * HBM_EFFICIENCY);
                step += t;
                clocks.busy.memory += t;
            }
        }
    } else {
        let trainable = sh.trainable / n as f64;
        // Gradients down and updated weights up, then the CPU's optimizer step.
        let t = 4.0 * trainable / host_link + trainable / HOST_OPTIMIZER_PARAMS_PER_S;
        step += t;
        communication += t;
    }
    if cfg.offload == Offload::OptimizerAndParams {
        // Each micro-batch fetches the GPU's weight shard for the forward and again for the backward.
        let weights16 = 2.0 * (sh.trainable + sh.frozen_linear + sh.frozen_other);
        let t = m * 2.0 * weights16 / n as f64 / host_link;
        step += t;
        communication += t;
    }
    (step, communication)
}

/// Bytes an optimizer step moves per parameter it updates. AdamW (torch.optim, decoupled
/// weight decay at its default 0.01), per its implementation
/// (research/optimizer-step-memory.md §3–§4): foreach and the for-loop make the same passes —
/// the weights scaled (read, write), the first moment lerped toward the gradient (two
/// reads, a write), the second scaled and the squared gradient added (two passes), its
/// square root into a new tensor, divided and offset in place (three passes), and the
/// weights updated from the first moment and that root (three reads, a write): 4 weight
/// widths, 12 state widths, 2 gradient widths. The fused kernel reads the weights, the
/// gradient and both moments once and writes three. A master copy (mixed precision) is
/// updated in fp32 and copied to the 16-bit weights. Other optimizers: the gradients
/// read, the weights and states read and written.
fn optimizer_bytes_per_param(model: &Model, cfg: &TrainConfig, implementation: OptimizerImpl) -> f64 {
    let s = state_bytes_per_param(model.hidden, cfg.precision, cfg.optimizer);
    let g = if main_grads_fp32(cfg) { 4.0 } else { s.gradients };
    if cfg.optimizer != Optimizer::AdamW {
        return g + 2.0 * (s.weights + s.optimizer);
    }
    let master = matches!(cfg.precision, Precision::Mixed | Precision::Fp8);
    let (w, moment, copy) =
        if master { (4.0, (s.optimizer - 4.0) / 2.0, 4.0 + s.weights) } else { (s.weights, s.optimizer / 2.0, 0.0) };
    copy + match implementation {
        OptimizerImpl::Foreach | OptimizerImpl::ForLoop => 4.0 * w + 12.0 * moment + 2.0 * g,
        OptimizerImpl::Fused => 2.0 * w + 4.0 * moment + g,
    }
}

/// What the host does for an optimizer step.
struct OptimizerOps {
    /// Operators its Python dispatches.
    python: f64,
    /// Each parameter's step count read back as a Python number (`_get_value`, twice per
    /// tensor in foreach's bias corrections): a C++ call from a tight loop, dispatched at
    /// the engine's rate rather than at a model's, whose operators carry the modules' Python.
    scalar_reads: f64,
    /// Kernels it launches.
    launches: f64,
}

/// Operators the host dispatches for the optimizer step and the kernels they launch:
/// foreach as recorded (the per-tensor reads of the layers' parameters, eight `_foreach_`
/// calls) and its launches — `multi_tensor_apply` launches a kernel per 320 blocks of
/// 65,536 elements or per 110 to 36 tensors, whichever comes first (MultiTensorApply.cuh) —;
/// the for-loop, eight operators per tensor on top; the fused kernel, one call over the
/// lists, its step counts left on the device.
fn optimizer_ops(
    st: &eager::Step,
    layers: f64,
    tensors: f64,
    elements: f64,
    implementation: OptimizerImpl,
) -> OptimizerOps {
    let (python, scalar_reads) = (st.optimizer.rest.ops, layers * st.optimizer.layer.ops);
    let chunks = (elements / (65_536.0 * 320.0)).ceil();
    match implementation {
        OptimizerImpl::Foreach => {
            // Lists of one to three tensors a kernel: 110, 64 and 48 tensors a launch at most.
            let per_op = [110.0, 64.0, 110.0, 48.0, 64.0, 110.0, 110.0, 48.0];
            let launches = per_op.iter().map(|&k| chunks.max((tensors / k).ceil())).sum();
            OptimizerOps { python, scalar_reads, launches }
        }
        OptimizerImpl::ForLoop => {
            OptimizerOps { python: python + 8.0 * tensors, scalar_reads, launches: 8.0 * tensors }
        }
        OptimizerImpl::Fused => OptimizerOps {
            python: (python - 7.0).max(0.0),
            scalar_reads: 0.0,
            launches: chunks.max((tensors / 36.0).ceil()),
        },
    }
}
