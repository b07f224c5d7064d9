//! The step time (see the parent module): each layer's kernels by class — matrix
//! multiplies by shape, attention by kernel, memory-bound ops by the bytes they move
//! ([`crate::kernel`]) — forward, backward and what checkpointing recomputes; then the
//! pipeline bubble, exposed collectives, the optimizer step or its offload.

use crate::gpu::GpuSpec;
use crate::job::{Attention, Checkpointing, Finetune, Framework, Offload, PipelineStage, Precision, TrainConfig};
use crate::kernel::{Dtype, Kernels};
use crate::model::{Head, Model};
use crate::parallel;
use crate::placement::{main_grads_fp32, share, state_bytes_per_param};

/// Forward FLOPs per micro-batch over the whole model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ForwardFlops {
    /// The layers' linear layers.
    pub linear: f64,
    /// The layers' attention (scores and the weighted sum).
    pub attention: f64,
    /// The LM head.
    pub head: f64,
}

/// Forward FLOPs per micro-batch over the whole model.
pub fn forward_flops(model: &Model, cfg: &TrainConfig) -> ForwardFlops {
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

/// One layer's kernels for one micro-batch on one GPU, seconds, by class of operation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LayerTimes {
    pub linear: Pass,
    pub attention: Pass,
    /// Norms, residual adds, the MLP's activation: bound by memory.
    pub elementwise: Pass,
}

/// A kernel class's forward and backward.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pass {
    pub forward: f64,
    pub backward: f64,
}

/// The format the step's kernels compute in.
fn dtype(precision: Precision) -> Dtype {
    match precision {
        Precision::Fp32 => Dtype::Fp32,
        Precision::Fp8 => Dtype::Fp8,
        Precision::Bf16 => Dtype::Bf16,
        Precision::Mixed | Precision::Amp => Dtype::Half,
    }
}

/// The step's kernels: in its format, at the rate kernels reach back to back in a step.
fn kernels<'a>(gpu: &'a GpuSpec, cfg: &TrainConfig) -> Kernels<'a> {
    let c = &cfg.coefficients;
    Kernels { gpu, dtype: dtype(cfg.precision), hbm_efficiency: c.hbm_efficiency, sustained: c.kernel_efficiency }
}

/// A matrix multiply of `tokens` rows by a `k`×`n` weight: its forward, and its
/// backward — the input's gradient (`tokens`×`n` by `n`×`k`) and, unless the weight is
/// frozen, the weight's (`k`×`tokens` by `tokens`×`n`).
fn linear(kn: &Kernels, tokens: f64, k: f64, n: f64, frozen: bool) -> Pass {
    let input_grad = kn.matmul(1.0, tokens, k, n);
    let weight_grad = if frozen { 0.0 } else { kn.matmul(1.0, k, n, tokens) };
    Pass { forward: kn.matmul(1.0, tokens, n, k), backward: input_grad + weight_grad }
}

/// One transformer layer's kernels on one GPU (tensor-parallel shards of `t`, the
/// sequence split over `c` context-parallel ranks), forward and backward.
pub fn layer_times(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig) -> LayerTimes {
    let par = &cfg.parallel;
    let (t, c) = (par.tensor.max(1) as f64, par.context.max(1) as f64);
    let kn = kernels(gpu, cfg);
    let eb = kn.dtype.bytes();
    let frozen = matches!(cfg.finetune, Finetune::Lora { .. });
    let (h, f) = (model.hidden as f64, model.intermediate as f64);
    let (q, kv) = ((model.heads * model.head_dim) as f64, (model.kv_heads * model.head_dim) as f64);
    let tokens = cfg.micro_batch as f64 * cfg.seq as f64 / c;
    let add = |a: Pass, b: Pass| Pass { forward: a.forward + b.forward, backward: a.backward + b.backward };
    // Query, key and value in one column-parallel multiply, the output projection row-parallel.
    let mut lin = add(linear(&kn, tokens, h, (q + 2.0 * kv) / t, frozen), linear(&kn, tokens, q / t, h, frozen));
    // Each expert sees its share of the tokens; a dense MLP is one expert that sees them all.
    let experts = model.experts.max(1) as f64;
    let expert_tokens = tokens * model.experts_per_token.max(1) as f64 / experts;
    let up = if model.gated_mlp { 2.0 * f } else { f };
    let mlp = add(linear(&kn, expert_tokens, h, up / t, frozen), linear(&kn, expert_tokens, f / t, h, frozen));
    lin = add(lin, Pass { forward: experts * mlp.forward, backward: experts * mlp.backward });

    let heads = cfg.micro_batch as f64 * model.heads as f64 / t;
    let (s, d) = (cfg.seq as f64, model.head_dim as f64);
    // Decoders mask the future; encoders (BERT, T5's encoder) attend both ways.
    let causal = model.decoder_layers == model.layers;
    // Megatron-LM's layers are Transformer Engine's, whose fused attention is cuDNN's;
    // PyTorch's SDPA and transformers run FlashAttention-2's class.
    let fused = if cfg.framework == Framework::Megatron {
        gpu.arch.cudnn_attention_efficiency()
    } else {
        gpu.arch.attention_efficiency()
    };
    let (forward, backward) = match cfg.attention {
        Attention::Eager => kn.eager_attention(heads, s / c, s, d),
        Attention::Sdpa | Attention::Flash => kn.flash_attention(heads, s / c, s, d, causal, fused),
    };
    let attention = Pass { forward, backward };

    // Two norms (each reads and writes the hidden state) and two residual adds (each
    // reads two and writes one) per layer, on every token of the tensor-parallel group
    // unless sequence parallelism shards them; the activation reads the MLP's up
    // projection (both halves when gated) and writes one. A backward moves twice the
    // bytes: the output's gradient and the saved input read, the input's gradient written.
    let sp = if par.sequence_parallel { t } else { 1.0 };
    let hidden_passes = 2.0 * 2.0 + 2.0 * 3.0;
    let activation_passes = if model.gated_mlp { 3.0 } else { 2.0 };
    let bytes = eb
        * (tokens / sp * h * hidden_passes
            + tokens * model.experts_per_token.max(1) as f64 * f / t * activation_passes);
    let elementwise = Pass { forward: kn.memory(bytes), backward: kn.memory(2.0 * bytes) };
    LayerTimes { linear: lin, attention, elementwise }
}

/// The output layer and the loss for one micro-batch: the logits' multiply, and the
/// loss's passes over the logits (upcast, log-softmax, its gradient and the downcast:
/// 14 bytes a logit each way, as the transformers loss the memory model counts moves them).
fn head_times(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig) -> Pass {
    let par = &cfg.parallel;
    let (t, c) = (par.tensor.max(1) as f64, par.context.max(1) as f64);
    let kn = kernels(gpu, cfg);
    let tokens = cfg.micro_batch as f64 * cfg.seq as f64 / c;
    let outputs = match cfg.head {
        Head::SeqCls => return Pass::default(),
        Head::CausalLm | Head::MaskedLm => model.vocab as f64 / t,
    };
    let frozen = matches!(cfg.finetune, Finetune::Lora { .. });
    let logits = linear(&kn, tokens, model.hidden as f64, outputs, frozen);
    let loss = kn.memory(14.0 * tokens * outputs);
    Pass { forward: logits.forward + loss, backward: logits.backward + loss }
}

/// An optimizer step's time, and one layer's within it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepTime {
    pub step: f64,
    /// One layer's forward for one micro-batch, tensor-parallel all-reduces included.
    pub layer_forward: f64,
    /// Its backward, with what checkpointing recomputes.
    pub layer_backward: f64,
}

/// Seconds per optimizer step (see the module documentation).
pub fn step_time(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig, recompute_fraction: f64) -> StepTime {
    let par = &cfg.parallel;
    let (t, c, p, v) = (par.tensor.max(1), par.context.max(1), par.pipeline.max(1), par.virtual_stages.max(1));
    let m = cfg.accumulation.max(1) as f64;
    let layer = layer_times(model, gpu, cfg);
    let head = head_times(model, gpu, cfg);
    // What the backward runs again, by class. Selective checkpointing with a fused kernel
    // recomputes nothing the kernel's own backward does not; per-op checkpointing reruns
    // every other matrix multiply and everything bound by memory; a solver's schedule
    // reruns its share of each layer.
    let ForwardFlops { linear: lin, attention: attn, head: head_flops } = forward_flops(model, cfg);
    let forward_flops_total = lin + attn + head_flops;
    let (r_lin, r_attn, r_elem) = match cfg.checkpointing {
        Checkpointing::None => (0.0, 0.0, 0.0),
        Checkpointing::Full | Checkpointing::EveryK(_) => (1.0, 1.0, 1.0),
        Checkpointing::Selective => (0.0, if cfg.attention == Attention::Eager { 1.0 } else { 0.0 }, 0.0),
        Checkpointing::PerOp => ((recompute_fraction * forward_flops_total / lin.max(1.0)).min(1.0), 0.0, 1.0),
        Checkpointing::Optimal => {
            let share = (recompute_fraction * forward_flops_total / (lin + attn).max(1.0)).clamp(0.0, 1.0);
            (share, share, share)
        }
    };
    let layers = model.layers as f64 / p as f64;
    // One layer's kernels, its forward and its backward with what it recomputes.
    let layer_compute_forward = layer.linear.forward + layer.attention.forward + layer.elementwise.forward;
    let layer_compute_backward = layer.linear.backward
        + layer.attention.backward
        + layer.elementwise.backward
        + r_lin * layer.linear.forward
        + r_attn * layer.attention.forward
        + r_elem * layer.elementwise.forward;
    let forward_time = layers * layer_compute_forward + head.forward / p as f64;
    let backward_time = layers * layer_compute_backward + head.backward / p as f64;
    let compute = forward_time + backward_time;
    let attention_time = layers * (layer.attention.forward * (1.0 + r_attn) + layer.attention.backward);
    let (s, b, h) = (cfg.seq as f64, cfg.micro_batch as f64, model.hidden as f64);
    let lp = model.layers.div_ceil(p) as f64;
    // Tensor parallelism: 4 all-reduces of the 16-bit hidden states per layer, 6 when the forward is redone;
    // each sits between two matmuls that need it, on the critical path.
    let recomputes =
        matches!(cfg.checkpointing, Checkpointing::Full | Checkpointing::EveryK(_) | Checkpointing::Optimal);
    let tp_ops = if recomputes { 6.0 } else { 4.0 };
    let all_reduce = parallel::all_reduce(s / c as f64 * b * h * 2.0, t, par.tensor_bandwidth(gpu));
    let mut tp = lp * tp_ops * all_reduce;
    // One layer's forward and backward as a profiler would time them: two all-reduces in
    // the forward, the rest in the backward (none shown when overlapped).
    let shown = if par.tp_comm_overlap { 0.0 } else { all_reduce };
    let layer_forward = layer_compute_forward + 2.0 * shown;
    let layer_backward = layer_compute_backward + (tp_ops - 2.0) * shown;
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
        let g = if main_grads_fp32(cfg) { 4.0 } else { s.gradients };
        let (w, o) = (s.weights, s.optimizer);
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
    StepTime { step, layer_forward, layer_backward }
}
