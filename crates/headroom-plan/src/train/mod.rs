//! Training memory per GPU, term by term, and the step time.
//!
//! | term | formula | source (research/estimation.md) |
//! |---|---|---|
//! | weights, gradients, optimizer | bytes/param by precision and optimizer, for the parameters on the GPU's pipeline stage ÷ tensor parallelism, ÷ data parallelism for the ZeRO-sharded ones; LoRA: frozen base at its width plus adapters with full states; offloaded states leave the GPU | §1.1–§1.4 |
//! | activations | per layer sbh·(c₀ + c₁·f/h) at the activation width, plus the attention core: 5as²b (eager) or 4asb (SDPA/flash); ÷t (the replicated 10·sbh stays without sequence parallelism), ÷ context parallelism; × the micro-batches a 1F1B stage holds (first stage: L layers' worth), × 1 + (p−1)/(p·v) interleaved; by checkpoint policy | §2.1, §2.3, §2.5, §8.4 |
//! | logits | b·s·V/t on the last stage × the bytes the loss holds at its peak: Hugging Face's loss upcasts the 16-bit logits to fp32 and keeps both, log-softmax keeps its fp32 output, and the backward makes an fp32 gradient and its 16-bit copy: 2 + 4 + 4 + 4 + 2 = 16 bytes (12 in fp32) | §2.4 |
//! | temporary | cuBLAS workspace; ZeRO-3's gathered layer (4 × layer params), or under pipelining the stage's parameters gathered in 16 bits (FSDP2 keeps them from a micro-batch's forward to its backward); under DeepSpeed its gradient bucket and ZeRO-3's parameters still gathered at the turn to the backward ([`deepspeed`]); a dequantized QLoRA matrix; the offload gradient bucket | §1.4, §4.1 |
//! | framework | CUDA context; NCCL buffers with more than one GPU; the caching allocator's rounding and slack over the short-lived terms (activations, logits, temporaries) | §4.1, §9 |
//!
//! With pipeline parallelism the first stage (most activations) and the last
//! (the logits) are both estimated and the larger is the answer.
//!
//! Step time, per optimizer step of `accumulation` micro-batches: each layer's
//! kernels on the GPU's share (tensor and context parallelism split them, a
//! pipeline stage runs L/p layers) by class ([`crate::kernel`]): the matrix
//! multiplies by shape, at the part's measured matrix efficiency times the
//! share of its SMs their tiles keep busy, their backward as the input's and
//! the weight's gradients (the input's alone for a frozen LoRA base); attention
//! by kernel (a fused kernel at its measured share of the peak, the causal half
//! skipped; materialised scores as batched multiplies and a softmax's memory
//! traffic); norms, residual adds and activations by the bytes they move; the
//! logits and the loss on the last stage; plus what the checkpoint policy
//! recomputes, class by class;
//! the pipeline runs m + (p−1)/v micro-batch slots (the bubble); per
//! micro-batch, tensor parallelism's 4 all-reduces of sbh per layer (6 with
//! recomputation) on the critical path (beyond the GEMMs with
//! Transformer Engine's overlap), context parallelism's K/V
//! all-gathers (forward, backward) and gradient reduce-scatter beyond what
//! the attention hides, and the stage-to-stage sends; the data-parallel
//! collectives (all-reduce of the gradients for plain data parallelism and
//! ZeRO-1; ZeRO-2 reduce-scatters per micro-batch and gathers the weights
//! once; ZeRO-3 gathers the weights twice and reduce-scatters per
//! micro-batch) beyond the forward or backward they overlap; and the
//! optimizer step: memory-bound on the GPU (the weights, gradients and
//! states it updates read and written at 90% of the HBM bandwidth), or with
//! offload the host-link traffic and the CPU's step, not overlapped.

use crate::gpu::GpuSpec;
pub use crate::model::Head;
use crate::model::Model;
use crate::names::named;
use crate::parallel;
use crate::step::{Phase, Phases};
use memory::{memory, share, StageMemory};
use time::{forward_flops, step_time, ForwardFlops};

const GIB: f64 = (1u64 << 30) as f64;

mod config;
pub mod deepspeed;
mod memory;
mod time;

pub use config::{
    ActivationModel, Attention, BaseWeights, Checkpointing, Finetune, Framework, LoraTargets, Offload, Optimizer,
    Precision, TrainConfig,
};
pub use memory::{model_states, state_bytes_per_param, ModelStates};

/// Bytes per GPU by term.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Breakdown {
    pub weights: f64,
    pub gradients: f64,
    pub optimizer: f64,
    pub activations: f64,
    pub logits: f64,
    pub temporary: f64,
    pub framework: f64,
    /// What a calibration from the user's own run adds at the peak phase (may be negative).
    pub calibration: f64,
}

impl Breakdown {
    pub fn total(&self) -> f64 {
        self.weights
            + self.gradients
            + self.optimizer
            + self.activations
            + self.logits
            + self.temporary
            + self.framework
            + self.calibration
    }
}

/// Which pipeline stage holds the peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PipelineStage {
    /// No pipeline: the GPU holds the whole model.
    Only,
    /// The first stage: the embedding and the most micro-batches in flight.
    First,
    /// The last stage: the head and the logits.
    Last,
}

named!(PipelineStage {
    Only => ("only", ""),
    First => ("first", ""),
    Last => ("last", ""),
});

/// What a configuration needs and how fast it runs.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainEstimate {
    pub breakdown: Breakdown,
    pub per_gpu_bytes: f64,
    pub fits: bool,
    /// The stage whose memory is reported.
    pub stage: PipelineStage,
    /// Seconds per optimizer step.
    pub step_time_s: f64,
    /// Tokens per second over the whole job.
    pub tokens_per_s: f64,
    /// Model FLOPs (6N or 4N per token plus attention, no recomputation) per second over the GPUs' dense peak.
    pub mfu: f64,
    /// One layer's forward and backward for one micro-batch, seconds: its kernels,
    /// tensor-parallel all-reduces that are not overlapped, and what checkpointing
    /// recomputes (in the backward), as a per-layer profile shows them.
    pub layer_time_s: [f64; 2],
    /// Forward FLOPs recomputed, as a fraction of one forward pass.
    pub recompute_fraction: f64,
    /// Parameters with gradients (all of them, or the adapters).
    pub trainable_params: u64,
    /// Host memory per node the offloaded states take.
    pub host_bytes: f64,
    /// What PyTorch's `torch.cuda.max_memory_allocated()` would report: the total less
    /// the CUDA context, NCCL and the allocator's slack.
    pub allocated_bytes: f64,
    /// The same less what only a GPU has (cuBLAS workspaces): the tensors a step makes,
    /// what the CPU ground truth measures.
    pub tensor_bytes: f64,
    /// What `torch.cuda.max_memory_reserved()` would report: the tensors plus the caching
    /// allocator's slack, without the CUDA context and NCCL.
    pub reserved_bytes: f64,
    /// The phase of the step that peaks, when transformers' code runs it.
    pub phase: Option<Phase>,
    /// Each phase's peak, then.
    pub phases: Option<Phases>,
    /// Whose code the estimate models: [`Framework::HuggingFace`], [`Framework::DeepSpeed`],
    /// [`Framework::Megatron`] or [`Framework::Torchtitan`].
    pub framework: Framework,
    /// With `Checkpointing::Optimal`: the schedule's peak did not fit even with every layer recomputed.
    pub note: Option<String>,
    /// Whether the activations are `torch.compile`'s: asked for, and recorded for the job's
    /// family and precision without checkpointing.
    pub compiled: bool,
}

/// Estimates one configuration on one GPU model. The configuration should
/// pass [`TrainConfig::check`]; anything else gets a best-effort answer.
pub fn estimate(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig) -> TrainEstimate {
    let mut best: Option<(StageMemory, PipelineStage)> = None;
    for &stage in stages(cfg) {
        let m = memory(model, gpu, cfg, stage);
        if best.as_ref().is_none_or(|b| m.breakdown.total() > b.0.breakdown.total()) {
            best = Some((m, stage));
        }
    }
    let (StageMemory { breakdown, recompute_fraction, note, phases, gpu_only, outside_allocator }, stage) =
        best.expect("at least one stage");
    let per_gpu = breakdown.total();
    let par = &cfg.parallel;
    let trainable_params = (share(model, cfg, PipelineStage::Only).trainable * par.tensor as f64).round() as u64;
    let timing = step_time(model, gpu, cfg, recompute_fraction);
    let time = timing.step;
    let tokens = cfg.micro_batch as f64 * cfg.seq as f64 * cfg.accumulation as f64 * par.data as f64;
    let ForwardFlops { linear: lin, attention: attn, head } = forward_flops(model, cfg);
    let passes = if matches!(cfg.finetune, Finetune::Lora { .. }) { 2.0 } else { 3.0 };
    let model_flops = passes * (lin + attn + head) * (cfg.accumulation * par.data) as f64;
    let peak = match cfg.precision {
        Precision::Fp32 => gpu.fp32_flops,
        Precision::Fp8 => gpu.fp8_flops.unwrap_or(gpu.bf16_flops),
        _ => gpu.bf16_flops,
    };
    let sh = share(model, cfg, stage);
    let d = par.shard_degree() as f64;
    // The fp32 master, the optimizer's states and fp32 gradients of the GPU's shard; with
    // the parameters offloaded, their 16-bit copy too.
    let offloaded_states =
        (state_bytes_per_param(model.hidden, Precision::Mixed, cfg.optimizer).optimizer + 4.0) * sh.trainable;
    let host_per_gpu = match cfg.offload {
        Offload::None => 0.0,
        Offload::Optimizer => offloaded_states / d,
        Offload::OptimizerAndParams => {
            (offloaded_states + 2.0 * (sh.trainable + sh.frozen_linear + sh.frozen_other)) / d
        }
    };
    TrainEstimate {
        breakdown,
        per_gpu_bytes: per_gpu,
        fits: per_gpu <= gpu.memory_bytes as f64 && note.is_none(),
        stage,
        step_time_s: time,
        layer_time_s: [timing.layer_forward, timing.layer_backward],
        tokens_per_s: tokens / time,
        mfu: model_flops / (time * par.gpus() as f64 * peak),
        recompute_fraction,
        trainable_params,
        host_bytes: host_per_gpu * par.gpus().min(parallel::GPUS_PER_NODE) as f64,
        allocated_bytes: per_gpu - breakdown.framework,
        tensor_bytes: per_gpu - breakdown.framework - gpu_only,
        reserved_bytes: per_gpu - outside_allocator,
        phase: phases.map(|p| p.peak().0),
        phases,
        framework: match (phases.is_some(), cfg.framework) {
            _ if cfg.deepspeed() => Framework::DeepSpeed,
            (true, _) => Framework::HuggingFace,
            (false, Framework::Torchtitan) => Framework::Torchtitan,
            (false, _) => Framework::Megatron,
        },
        note,
        compiled: memory::compiled_recipe(model, cfg),
    }
}

/// The pipeline stages whose memory is estimated: the one GPU's, or the first and last stage's.
fn stages(cfg: &TrainConfig) -> &'static [PipelineStage] {
    if cfg.parallel.pipeline > 1 {
        &[PipelineStage::First, PipelineStage::Last]
    } else {
        &[PipelineStage::Only]
    }
}

/// Whether the configuration fits the GPU: the memory half of [`estimate`],
/// for searches that discard most configurations before timing them.
pub fn fits(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig) -> bool {
    stages(cfg).iter().all(|&stage| {
        let m = memory(model, gpu, cfg, stage);
        m.note.is_none() && m.breakdown.total() <= gpu.memory_bytes as f64
    })
}

/// The longest sequence that fits (0 if none does), up to `limit` tokens.
pub fn max_seq(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig, limit: u64) -> u64 {
    largest(limit, |seq| estimate(model, gpu, &TrainConfig { seq, ..*cfg }).fits)
}

/// The largest n in 1..=limit for which `fits(n)`, 0 if none: doubling, then bisection
/// (what fits is taken as monotone in n).
pub(crate) fn largest(limit: u64, fits: impl Fn(u64) -> bool) -> u64 {
    if limit == 0 || !fits(1) {
        return 0;
    }
    let (mut lo, mut hi) = (1u64, 2u64);
    while hi <= limit && fits(hi) {
        lo = hi;
        if hi == u64::MAX {
            return lo;
        }
        hi = hi.saturating_mul(2);
    }
    let mut hi = hi.min(limit.saturating_add(1));
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The largest micro-batch that fits (0 if none does), up to `limit`.
pub fn max_micro_batch(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig, limit: u64) -> u64 {
    largest(limit, |b| estimate(model, gpu, &TrainConfig { micro_batch: b, ..*cfg }).fits)
}

#[cfg(test)]
mod tests {
    use super::memory::{layer_activations, LayerActivations};
    use super::*;
    use crate::gpu::gpu;
    use crate::model::preset;
    use crate::parallel::Parallelism;

    /// ZeRO's Table 1: per-device model states in GB (1e9 bytes), mixed-precision Adam (K = 12).
    #[test]
    fn zero_table_1_exactly() {
        type Column = (u64, [f64; 3]);
        let rows: [(u64, [Column; 4]); 3] = [
            (
                7_500_000_000,
                [
                    (16, [35.6, 21.6, 7.5]),
                    (64, [31.4, 16.6, 1.88]),
                    (256, [30.4, 15.4, 0.47]),
                    (1024, [30.1, 15.1, 0.12]),
                ],
            ),
            (
                128_000_000_000,
                [
                    (16, [608.0, 368.0, 128.0]),
                    (64, [536.0, 284.0, 32.0]),
                    (256, [518.0, 263.0, 8.0]),
                    (1024, [513.0, 257.0, 2.0]),
                ],
            ),
            (
                1_000_000_000_000,
                [
                    (16, [4750.0, 2875.0, 1000.0]),
                    (64, [4187.0, 2218.0, 250.0]),
                    (256, [4046.0, 2054.0, 62.5]),
                    (1024, [4011.0, 2013.0, 15.6]),
                ],
            ),
        ];
        for (params, cols) in rows {
            for (dp, want) in cols {
                for (stage, paper) in [1u8, 2, 3].into_iter().zip(want) {
                    let cfg = TrainConfig { parallel: Parallelism::data_parallel(dp, stage), ..base() };
                    let ModelStates { weights: w, gradients: g, optimizer: o } = model_states(params, 4096, &cfg);
                    let states = (w + g + o) / 1e9;
                    // The paper rounds to 3 significant figures (1 decimal for the small ones).
                    let tol = (paper * 0.006).max(0.006);
                    assert!(
                        (states - paper).abs() <= tol,
                        "{params} params, DP {dp}, stage {stage}: {states} vs {paper}"
                    );
                }
            }
        }
    }

    fn base() -> TrainConfig {
        TrainConfig {
            seq: 2048,
            attention: Attention::Eager,
            ..TrainConfig::new(1, 2048, Precision::Mixed, Optimizer::AdamW)
        }
    }

    fn gpt(name: &str, h: u64, l: u64, a: u64) -> Model {
        Model::gpt(name, h, l, a, 51200, 2048)
    }

    /// Korthikanti et al.: GPT-3 175B (a = 96, s = 2048, h = 12288, b = 1): sbh(34 + 5as/h) = 2.87 GB a layer, unparallelised.
    #[test]
    fn korthikanti_per_layer_figures() {
        let gpt3 = gpt("gpt3", 12288, 96, 96);
        let LayerActivations { kept: eager, core, .. } = layer_activations(&gpt3, &base());
        assert!((eager / 1e9 - 2.87).abs() < 0.01, "{eager}");
        // Selective recomputation leaves 34·sbh = 0.86 GB.
        assert!(((eager - core) / 1e9 - 0.856).abs() < 0.01);
        let flash = layer_activations(&gpt3, &TrainConfig { attention: Attention::Flash, ..base() }).kept;
        assert!(flash < eager / 3.0);
        // Table 2 under 8-way tensor parallelism: sequence parallel (34 + 5as/h)·sbh/t = 0.359 GB;
        // with selective recomputation 34·sbh/t = 0.107 GB; full recomputation keeps 2sbh = 0.050 GB.
        let tp = |sp: bool| TrainConfig {
            parallel: Parallelism { tensor: 8, sequence_parallel: sp, ..Parallelism::default() },
            ..base()
        };
        let LayerActivations { kept: with_sp, core: core_sp, .. } = layer_activations(&gpt3, &tp(true));
        assert!((with_sp / 1e9 - 0.359).abs() < 0.002, "{with_sp}");
        assert!(((with_sp - core_sp) / 1e9 - 0.107).abs() < 0.001);
        let input = layer_activations(&gpt3, &tp(false)).input;
        assert!((input / 1e9 - 0.050).abs() < 0.001);
        // Without sequence parallelism, 22B at b = 4: sbh(10 + 24/t + 5as/(ht)) = 1.33 GB.
        let m22 = gpt("22b", 6144, 48, 64);
        let tp_only = layer_activations(&m22, &TrainConfig { micro_batch: 4, ..tp(false) }).kept;
        assert!((tp_only / 1e9 - 1.33).abs() < 0.01, "{tp_only}");
        let unsplit = layer_activations(&m22, &TrainConfig { micro_batch: 4, ..base() }).kept;
        assert!((unsplit / 1e9 - 7.08).abs() < 0.01, "{unsplit}");
    }

    /// Korthikanti §4.2.3: the first 1F1B stage holds p micro-batches of L/p layers — L layers' worth, whatever p —
    /// and the interleaved schedule (1 + (p−1)/(p·v)) times that; fewer micro-batches than stages hold fewer.
    #[test]
    fn pipeline_first_stage_holds_a_whole_model_of_activations() {
        let m = gpt("175b", 12288, 96, 96);
        let g = GpuSpec { memory_bytes: 1 << 50, ..crate::gpu::gpu("a100-80gb").unwrap() };
        let at = |p: u64, v: u64, m_: u64| {
            let cfg = TrainConfig {
                accumulation: m_,
                parallel: Parallelism { tensor: 8, pipeline: p, virtual_stages: v, ..Parallelism::default() },
                ..base()
            };
            memory(&m, &g, &cfg, if p > 1 { PipelineStage::First } else { PipelineStage::Only }).breakdown.activations
        };
        let one = at(1, 1, 64);
        assert!((at(8, 1, 64) / one - 1.0).abs() < 1e-9);
        assert!((at(8, 3, 64) / one - (1.0 + 7.0 / 24.0)).abs() < 1e-9);
        assert!((at(8, 1, 2) / one - 0.25).abs() < 1e-9);
        // The last stage holds the logits and one micro-batch.
        let cfg = TrainConfig {
            accumulation: 64,
            parallel: Parallelism { tensor: 8, pipeline: 8, ..Parallelism::default() },
            ..base()
        };
        let last = memory(&m, &g, &cfg, PipelineStage::Last).breakdown;
        assert!(last.logits > 0.0 && (last.activations / one - 1.0 / 8.0).abs() < 1e-9);
        assert_eq!(memory(&m, &g, &cfg, PipelineStage::First).breakdown.logits, 0.0);
        // Weights: a stage holds its layers and its embedding, ÷ t.
        let e = estimate(&m, &g, &cfg);
        let per_stage = (12.0 * 12288f64.powi(2) * 12.0 + 51200.0 * 12288.0) / 8.0;
        assert!((e.breakdown.weights / (2.0 * per_stage) - 1.0).abs() < 0.01);
    }

    #[test]
    fn fits_is_the_memory_half_of_estimate() {
        let m = crate::model::preset("llama-2-70b").unwrap();
        let g = crate::gpu::gpu("a100-80gb").unwrap();
        let mut seen = [0, 0];
        for (t, p, zero, b, ckpt) in [
            (1, 1, 3, 1, Checkpointing::Full),
            (8, 1, 1, 1, Checkpointing::None),
            (8, 4, 1, 1, Checkpointing::Selective),
            (4, 8, 0, 2, Checkpointing::Full),
            (2, 2, 3, 4, Checkpointing::EveryK(4)),
            (8, 8, 1, 8, Checkpointing::None),
        ] {
            let cfg = TrainConfig {
                accumulation: 16,
                checkpointing: ckpt,
                parallel: Parallelism { data: 4, tensor: t, pipeline: p, zero_stage: zero, ..Parallelism::default() },
                ..TrainConfig::new(b, 4096, Precision::Mixed, Optimizer::AdamW)
            };
            let e = estimate(&m, &g, &cfg);
            assert_eq!(fits(&m, &g, &cfg), e.fits, "{cfg:?}");
            seen[e.fits as usize] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0, "both outcomes covered: {seen:?}");
    }

    #[test]
    fn bubbles_and_collectives_cost_time() {
        let m = crate::model::preset("llama-2-70b").unwrap();
        let g = crate::gpu::gpu("h100-sxm").unwrap();
        let cfg = |p: u64, v: u64, acc: u64| TrainConfig {
            accumulation: acc,
            attention: Attention::Flash,
            parallel: Parallelism { tensor: 8, pipeline: p, virtual_stages: v, ..Parallelism::default() },
            ..TrainConfig::new(1, 4096, Precision::Mixed, Optimizer::AdamW)
        };
        let t = |c: TrainConfig| estimate(&m, &g, &c).step_time_s;
        // 1F1B: (m + p − 1) slots of 1/p of the work; interleaving shrinks the bubble to (p−1)/v.
        let (p4, p4v2) = (t(cfg(4, 1, 8)), t(cfg(4, 2, 8)));
        assert!(p4v2 < p4);
        // Each micro-batch more is one slot more; what is left of 11 slots is the optimizer step.
        let per_slot = (t(cfg(4, 1, 16)) - p4) / 8.0;
        assert!((t(cfg(4, 1, 24)) - t(cfg(4, 1, 16)) - 8.0 * per_slot).abs() / p4 < 1e-9);
        let optimizer = p4 - 11.0 * per_slot;
        assert!(optimizer > 0.0 && optimizer < 0.05 * p4, "{optimizer} of {p4}");
        // Tensor parallelism across nodes is slower than inside one.
        let inside = estimate(&m, &g, &cfg(1, 1, 1));
        assert!(inside.mfu < 0.5 && inside.mfu > 0.3, "{}", inside.mfu);
    }

    #[test]
    fn zero_shards_over_the_data_and_context_gpus() {
        // torchtitan's Table 2 layouts: 8 GPUs as FSDP 8 × CP 1 down to FSDP 1 × CP 8, each
        // at a sequence that grows with CP, so every GPU holds the same tokens.
        let m = crate::model::preset("llama-3.1-8b").unwrap();
        let g = crate::gpu::gpu("h100-sxm").unwrap();
        let cfg = |cp: u64| TrainConfig {
            attention: Attention::Flash,
            checkpointing: Checkpointing::Full,
            parallel: Parallelism { data: 8 / cp, context: cp, zero_stage: 3, ..Parallelism::default() },
            ..TrainConfig::new(1, 32768 * cp, Precision::Mixed, Optimizer::AdamW)
        };
        let psi = m.params();
        let states = |c: &TrainConfig| {
            let s = model_states(psi, m.hidden, c);
            s.weights + s.gradients + s.optimizer
        };
        assert!((states(&cfg(1)) - 16.0 * psi as f64 / 8.0).abs() < 1.0, "16 bytes a parameter over 8 GPUs");
        // With context parallelism the step is Megatron's (transformers cannot split a sequence).
        let two = estimate(&m, &g, &cfg(2));
        for cp in [2, 4, 8] {
            assert!((states(&cfg(cp)) - states(&cfg(1))).abs() < 1.0, "CP {cp}: the states stay sharded 8 ways");
            // The same tokens on every GPU, the same states: the same memory.
            let e = estimate(&m, &g, &cfg(cp));
            assert!((e.per_gpu_bytes - two.per_gpu_bytes).abs() / two.per_gpu_bytes < 0.01, "CP {cp}");
        }
    }

    #[test]
    fn per_op_checkpointing_keeps_what_torchtitan_saves() {
        let m = crate::model::preset("llama-3.1-8b").unwrap();
        let g = crate::gpu::gpu("h100-sxm").unwrap();
        let with = |checkpointing| {
            let cfg = TrainConfig {
                attention: Attention::Flash,
                checkpointing,
                parallel: Parallelism::data_parallel(8, 3),
                // Megatron's accounting for all three (transformers has no per-op policy).
                framework: Framework::Megatron,
                ..TrainConfig::new(2, 8192, Precision::Mixed, Optimizer::AdamW)
            };
            estimate(&m, &g, &cfg)
        };
        let (full, per_op, selective) =
            (with(Checkpointing::Full), with(Checkpointing::PerOp), with(Checkpointing::Selective));
        // A Llama block, by hand: the input (h), wq (h), wv (kv), w1 (f), w2 (h) and the
        // attention output (h) in bf16, and flash attention's fp32 log-sum-exp per head.
        let tokens = 2.0 * 8192.0;
        let (h, kv, f) = (4096.0, 1024.0, 14336.0);
        let kept = tokens * ((h + h + kv + f + h + h) * 2.0 + 4.0 * 32.0);
        let input = tokens * h * 2.0;
        // Both keep one layer's full set beside the rest while it is recomputed.
        let per_layer = full.breakdown.activations - 32.0 * input;
        assert!((per_op.breakdown.activations - per_layer - 32.0 * kept).abs() < 1.0);
        assert!(full.breakdown.activations < per_op.breakdown.activations);
        assert!(per_op.breakdown.activations < selective.breakdown.activations);
        // It recomputes wk, wo and w3: between selective (nothing, with flash) and full.
        assert!(selective.recompute_fraction < per_op.recompute_fraction);
        assert!(per_op.recompute_fraction < full.recompute_fraction);
    }

    #[test]
    fn fsdp_under_pipelining_keeps_the_stage_gathered() {
        let m = crate::model::preset("llama-3-70b").unwrap();
        let g = crate::gpu::gpu("h100-sxm").unwrap();
        let with = |zero_stage| {
            let cfg = TrainConfig {
                accumulation: 8,
                attention: Attention::Flash,
                checkpointing: Checkpointing::Full,
                parallel: Parallelism { data: 4, pipeline: 4, zero_stage, ..Parallelism::default() },
                ..TrainConfig::new(1, 4096, Precision::Mixed, Optimizer::AdamW)
            };
            estimate(&m, &g, &cfg).breakdown.temporary
        };
        // A quarter of the model, gathered in bf16, beside the shard ZeRO-3 keeps.
        let gathered = with(3) - with(1);
        let quarter = 2.0 * m.params() as f64 / 4.0;
        assert!(gathered > 0.9 * quarter && gathered < 1.2 * quarter, "{gathered} vs {quarter}");
    }

    #[test]
    fn torchtitans_loss_holds_twelve_bytes_a_logit() {
        let m = crate::model::preset("llama-3.1-8b").unwrap();
        let g = crate::gpu::gpu("h100-sxm").unwrap();
        let logits = |framework| {
            let cfg = TrainConfig {
                framework,
                attention: Attention::Flash,
                checkpointing: Checkpointing::PerOp,
                parallel: Parallelism::data_parallel(8, 3),
                ..TrainConfig::new(2, 8192, Precision::Mixed, Optimizer::AdamW)
            };
            let e = estimate(&m, &g, &cfg);
            assert_eq!(e.framework, framework);
            e.breakdown.logits
        };
        let per_token = 2.0 * 8192.0 * m.vocab as f64;
        assert_eq!(logits(Framework::Torchtitan), 12.0 * per_token);
        assert_eq!(logits(Framework::Megatron), 16.0 * per_token);
    }

    #[test]
    fn lora_keeps_a_frozen_base_and_trains_adapters() {
        let m = crate::model::preset("llama-2-7b").unwrap();
        let g = crate::gpu::gpu("a100-80gb").unwrap();
        let lora = |base| TrainConfig {
            finetune: Finetune::Lora { rank: 64, targets: LoraTargets::All, base },
            attention: Attention::Flash,
            ..TrainConfig::new(1, 512, Precision::Mixed, Optimizer::AdamW)
        };
        let e = estimate(&m, &g, &lora(BaseWeights::Native));
        // r = 64 on every linear layer: 64 × (4·(4096+4096) + 3·(4096+11008)) × 32 layers.
        assert_eq!(e.trainable_params, 64 * (4 * 8192 + 3 * 15104) * 32);
        let base16 = 2.0 * m.params() as f64;
        assert!((e.breakdown.weights - base16 - 2.0 * e.trainable_params as f64).abs() < 1e3);
        assert_eq!(e.breakdown.gradients, 2.0 * e.trainable_params as f64);
        // QLoRA: 4.127-bit linears, fp32 embeddings and norms.
        let q = estimate(&m, &g, &lora(BaseWeights::Nf4));
        let linears = 32.0 * (4.0 * 4096.0 * 4096.0 + 3.0 * 4096.0 * 11008.0);
        let want = linears * 4.127 / 8.0 + (m.params() as f64 - linears) * 4.0 + 2.0 * e.trainable_params as f64;
        assert!((q.breakdown.weights / want - 1.0).abs() < 1e-9);
        // No weight gradients for the base: 4N instead of 6N per token.
        let full = estimate(&m, &g, &TrainConfig { finetune: Finetune::Full, ..lora(BaseWeights::Native) });
        assert!(e.step_time_s < full.step_time_s * 0.75);
    }

    /// DeepSpeed's memory estimator (research/estimation.md §1.4), t5-3b on one node of 8 GPUs, GiB:
    /// ZeRO-2 with optimizer offload 2Ψ = 5.31; ZeRO-3 with optimizer offload 2Ψ/8 + the gathered layer;
    /// with the parameters offloaded too, none but the few DeepSpeed never partitions.
    #[test]
    fn offload_moves_the_optimizer_to_the_host() {
        let m = crate::model::preset("t5-3b").unwrap();
        let g = crate::gpu::gpu("a100-80gb").unwrap();
        let cfg = |zero, offload| TrainConfig {
            parallel: Parallelism::data_parallel(8, zero),
            offload,
            ..TrainConfig::new(1, 512, Precision::Mixed, Optimizer::AdamW)
        };
        let states = |e: &TrainEstimate| (e.breakdown.weights + e.breakdown.gradients + e.breakdown.optimizer) / GIB;
        let z2 = estimate(&m, &g, &cfg(2, Offload::Optimizer));
        assert!((states(&z2) - 5.31).abs() < 0.01, "{}", states(&z2));
        let z3 = estimate(&m, &g, &cfg(3, Offload::Optimizer));
        assert!((states(&z3) - 5.31 / 8.0).abs() < 0.01);
        let all = estimate(&m, &g, &cfg(3, Offload::OptimizerAndParams));
        // Only what DeepSpeed never partitions stays: the norms and position tables, whole.
        let kept = deepspeed::buffers(&m, &cfg(3, Offload::OptimizerAndParams), 2.0).persistent;
        assert!(kept > 0.0 && kept < (1 << 20) as f64, "{kept}");
        assert!((states(&all) * GIB / kept - 1.0).abs() < 1e-9);
        // The host holds the fp32 master, both moments and fp32 gradients: 16 bytes a parameter per node.
        assert!((z2.host_bytes / (16.0 * m.params() as f64) - 1.0).abs() < 1e-9);
        assert!(z2.step_time_s > estimate(&m, &g, &cfg(2, Offload::None)).step_time_s);
    }

    #[test]
    fn fp8_saves_linear_inputs_in_one_byte_and_runs_faster() {
        let m = crate::model::preset("llama-3-8b").unwrap();
        let g = crate::gpu::gpu("h100-sxm").unwrap();
        let cfg = |p| TrainConfig { attention: Attention::Flash, ..TrainConfig::new(2, 4096, p, Optimizer::AdamW) };
        let bf16 = estimate(&m, &g, &cfg(Precision::Mixed));
        let fp8 = estimate(&m, &g, &cfg(Precision::Fp8));
        assert!(fp8.breakdown.activations < bf16.breakdown.activations);
        assert!(fp8.breakdown.weights > bf16.breakdown.weights);
        assert!(fp8.step_time_s < 0.7 * bf16.step_time_s);
        let a100 = crate::gpu::gpu("a100-80gb").unwrap();
        assert!(cfg(Precision::Fp8).check(&m, &a100).unwrap_err().0.contains("fp8"));
    }

    #[test]
    fn policies_trade_memory_for_time_and_optimal_fits_between() {
        let m = preset("llama-2-7b").unwrap();
        let g = gpu("a100-80gb").unwrap();
        let cfg = |c| TrainConfig {
            micro_batch: 8,
            seq: 4096,
            precision: Precision::Bf16,
            attention: Attention::Flash,
            checkpointing: c,
            ..base()
        };
        let none = estimate(&m, &g, &cfg(Checkpointing::None));
        let full = estimate(&m, &g, &cfg(Checkpointing::Full));
        let optimal = estimate(&m, &g, &cfg(Checkpointing::Optimal));
        assert!(!none.fits && full.fits && optimal.fits);
        assert!(full.breakdown.activations < none.breakdown.activations);
        assert!(optimal.step_time_s <= full.step_time_s && optimal.step_time_s >= none.step_time_s);
        assert!(optimal.per_gpu_bytes <= g.memory_bytes as f64);
        let most = max_micro_batch(&m, &g, &cfg(Checkpointing::Full), 1024);
        assert!(
            most >= 8 && !estimate(&m, &g, &TrainConfig { micro_batch: most + 1, ..cfg(Checkpointing::Full) }).fits
        );
    }
}
