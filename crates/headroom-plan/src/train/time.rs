//! The step time (see the parent module): FLOPs at the GPU's peak, the pipeline bubble,
//! exposed collectives, the optimizer step or its offload.

use super::memory::{share, state_bytes_per_param};
use super::{Checkpointing, Finetune, Offload, PipelineStage, Precision, TrainConfig};
use crate::gpu::GpuSpec;
use crate::model::Model;
use crate::parallel;

/// Forward FLOPs per micro-batch over the whole model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct ForwardFlops {
    /// The layers' linear layers.
    pub linear: f64,
    /// The layers' attention (scores and the weighted sum).
    pub attention: f64,
    /// The LM head.
    pub head: f64,
}

/// Forward FLOPs per micro-batch over the whole model.
pub(super) fn forward_flops(model: &Model, cfg: &TrainConfig) -> ForwardFlops {
    // In f64: a batch and a sequence as large as a user may type would wrap u64.
    let tokens = cfg.micro_batch as f64 * cfg.seq as f64;
    let layer_params = model.layer_params() as f64 * model.active_params() as f64 / model.params() as f64;
    let attention = 4.0 * tokens * cfg.seq as f64 * (model.heads * model.head_dim) as f64;
    let l = model.layers as f64;
    ForwardFlops {
        linear: 2.0 * layer_params * tokens * l,
        attention: attention * l,
        head: 2.0 * (model.vocab * model.hidden) as f64 * tokens,
    }
}

/// Seconds per optimizer step (see the module documentation).
pub(super) fn step_time(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig, recompute_fraction: f64) -> f64 {
    let par = &cfg.parallel;
    let (t, c, p, v) = (par.tensor.max(1), par.context.max(1), par.pipeline.max(1), par.virtual_stages.max(1));
    let m = cfg.accumulation.max(1) as f64;
    let ForwardFlops { linear: lin, attention: attn, head } = forward_flops(model, cfg);
    let lora = matches!(cfg.finetune, Finetune::Lora { .. });
    let passes = if lora { 2.0 } else { 3.0 } + recompute_fraction;
    let mfu = cfg.coefficients.mfu;
    let (linear_peak, attention_peak) = match cfg.precision {
        Precision::Fp32 => (gpu.fp32_flops, gpu.fp32_flops),
        Precision::Fp8 => (gpu.fp8_flops.unwrap_or(gpu.bf16_flops), gpu.bf16_flops),
        _ => (gpu.bf16_flops, gpu.bf16_flops),
    };
    let split = (t * c * p) as f64;
    let attention_time = passes * attn / attention_peak / (mfu * split);
    let compute = passes * (lin + head) / linear_peak / (mfu * split) + attention_time;
    let forward_time = compute / passes;
    let backward_time = compute - forward_time;
    let (s, b, h) = (cfg.seq as f64, cfg.micro_batch as f64, model.hidden as f64);
    let lp = model.layers.div_ceil(p) as f64;
    // Tensor parallelism: 4 all-reduces of the 16-bit hidden states per layer, 6 when the forward is redone;
    // each sits between two matmuls that need it, on the critical path.
    let recomputes =
        matches!(cfg.checkpointing, Checkpointing::Full | Checkpointing::EveryK(_) | Checkpointing::Optimal);
    let tp_ops = if recomputes { 6.0 } else { 4.0 };
    let mut tp = lp * tp_ops * parallel::all_reduce(s / c as f64 * b * h * 2.0, t, par.tensor_bandwidth(gpu));
    if par.tp_comm_overlap {
        // Chunked against the GEMMs it feeds: only what outlasts them shows.
        tp = (tp - (compute - attention_time)).max(0.0);
    }
    // Context parallelism: K and V gathered for the forward and again for the backward, their gradients
    // reduce-scattered; the ring passes them while the attention computes, so only the excess shows.
    let kv = 2.0 * s * b * (model.kv_heads * model.head_dim) as f64 * 2.0 / t as f64;
    let cp = (lp * 3.0 * parallel::all_gather(kv, c, par.context_bandwidth(gpu)) - attention_time).max(0.0);
    // Stage to stage: activations forward, their gradients backward, once per chunk.
    let boundary = s / c as f64 * b * h * 2.0 / if par.sequence_parallel { t as f64 } else { 1.0 };
    let p2p = if p > 1 { 2.0 * v as f64 * parallel::send(boundary, par.pipeline_bandwidth(gpu)) } else { 0.0 };
    let per_micro_batch = compute + tp + cp + p2p;
    let slots = m + (p as f64 - 1.0) / v as f64;
    let mut step = slots * per_micro_batch;

    // Data parallelism over the 16-bit weights and gradients this GPU holds. The engines
    // overlap it with compute — DDP's bucketed all-reduce and ZeRO's reduce-scatters with
    // the backward, ZeRO-3's prefetched gathers with the pass that needs them — so only
    // what outlasts that compute is added.
    let stage = if p > 1 { PipelineStage::First } else { PipelineStage::Only };
    let sh = share(model, cfg, stage);
    let grads16 = 2.0 * sh.trainable;
    let weights16 = 2.0 * (sh.trainable + sh.frozen_linear + sh.frozen_other);
    let n = par.shard_degree();
    let bw = par.data_bandwidth(gpu);
    let exposed = |comm: f64, under: f64| (comm - under).max(0.0);
    step += match par.zero_stage {
        0 | 1 => exposed(parallel::all_reduce(grads16, n, bw), backward_time),
        2 => m * exposed(parallel::all_gather(grads16, n, bw), backward_time) + parallel::all_gather(grads16, n, bw),
        _ => {
            let gather = parallel::all_gather(weights16, n, bw);
            m * (exposed(gather, forward_time) + exposed(gather + parallel::all_gather(grads16, n, bw), backward_time))
        }
    };
    let host = gpu.host_bandwidth * parallel::LINK_EFFICIENCY;
    if cfg.offload == Offload::None {
        // The optimizer step is bound by HBM: it reads the gradients, weights and states of
        // the parameters this GPU updates and writes the weights and states back.
        let s = state_bytes_per_param(model.hidden, cfg.precision, cfg.optimizer);
        let (w, g, o) = (s.weights, s.gradients, s.optimizer);
        let updated = sh.trainable / if par.zero_stage >= 1 { n as f64 } else { 1.0 };
        step += updated * (g + 2.0 * (w + o)) / (gpu.bandwidth * cfg.coefficients.hbm_efficiency);
    } else {
        let trainable = sh.trainable / n as f64;
        // Gradients down and updated weights up, then the CPU's optimizer step.
        step += 4.0 * trainable / host + trainable / cfg.coefficients.host_optimizer_params_per_s;
    }
    if cfg.offload == Offload::OptimizerAndParams {
        // Each micro-batch fetches the GPU's weight shard for the forward and again for the backward.
        step += m * 2.0 * weights16 / n as f64 / host;
    }
    step
}
