//! Training memory per GPU, term by term, and the step time.
//!
//! | term | formula | source (research/estimation.md) |
//! |---|---|---|
//! | weights, gradients, optimizer | bytes/param by precision and optimizer, for the parameters on the GPU's pipeline stage ÷ tensor parallelism, ÷ data parallelism for the ZeRO-sharded ones; LoRA: frozen base at its width plus adapters with full states; offloaded states leave the GPU | §1.1–§1.4 |
//! | activations | per layer sbh·(c₀ + c₁·f/h) at the activation width, plus the attention core: 5as²b (eager) or 4asb (SDPA/flash); ÷t (the replicated 10·sbh stays without sequence parallelism), ÷ context parallelism; × the micro-batches a 1F1B stage holds (first stage: L layers' worth), × 1 + (p−1)/(p·v) interleaved; by checkpoint policy | §2.1, §2.3, §2.5, §8.4 |
//! | logits | b·s·V/t on the last stage × the bytes the loss holds at its peak: Hugging Face's loss upcasts the 16-bit logits to fp32 and keeps both, log-softmax keeps its fp32 output, and the backward makes an fp32 gradient and its 16-bit copy: 2 + 4 + 4 + 4 + 2 = 16 bytes (12 in fp32) | §2.4 |
//! | temporary | cuBLAS workspace; ZeRO-3's gathered layer (4 × layer params); a dequantized QLoRA matrix; the offload gradient bucket | §1.4, §4.1 |
//! | framework | CUDA context; NCCL buffers with more than one GPU; the caching allocator's rounding and slack over the short-lived terms (activations, logits, temporaries) | §4.1, §9 |
//!
//! With pipeline parallelism the first stage (most activations) and the last
//! (the logits) are both estimated and the larger is the answer.
//!
//! Step time, per optimizer step of `accumulation` micro-batches: model FLOPs
//! 6·N·tokens plus attention (12·L·b·s²·H·d), 4·N with a frozen LoRA base
//! (no weight gradients), plus what the checkpoint policy recomputes, split
//! over tensor × context × pipeline ranks, at [`ActivationModel::mfu`] of the
//! GPU's dense peak for the precision (fp8 for the linear layers under fp8);
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

use crate::checkpoint::{self, Chain, Loss, Stage};
use crate::gpu::GpuSpec;
pub use crate::model::Head;
use crate::model::{Family, Model};
use crate::parallel::{self, Parallelism};
use crate::recipe::{self, Recipe};
use crate::step::{self, Phase, Phases, StepParts};

const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

/// Precision regimes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// Everything fp32.
    Fp32,
    /// `torch.autocast`: fp32 weights, gradients and optimizer; 16-bit activations.
    Amp,
    /// 16-bit weights and gradients with an fp32 master copy in the optimizer (DeepSpeed, Megatron).
    Mixed,
    /// Everything bf16, optimizer states included (no master copy).
    Bf16,
    /// Transformer Engine fp8: mixed precision plus an fp8 copy of the weights,
    /// linear layers computed and their inputs saved in fp8.
    Fp8,
}

/// Optimizers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Optimizer {
    AdamW,
    Sgd,
    SgdMomentum,
    Adafactor,
    Adam8bit,
}

/// Attention kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attention {
    /// Materialises the s×s scores and probabilities.
    Eager,
    /// PyTorch's scaled_dot_product_attention (flash or memory-efficient kernel).
    Sdpa,
    Flash,
}

/// Activation checkpointing policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checkpointing {
    None,
    /// Keep each layer's input; recompute each layer in the backward.
    Full,
    /// Recompute only the attention core (Korthikanti et al.).
    Selective,
    /// Keep the input of every k-th layer.
    EveryK(u64),
    /// The fastest schedule that fits the GPU ([`crate::checkpoint`]).
    Optimal,
}

/// Which linear layers get LoRA adapters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoraTargets {
    /// Every linear layer of every block (QLoRA's recommendation; peft's "all-linear").
    All,
    /// The query and value projections (the LoRA paper's Wq, Wv).
    QueryValue,
}

/// How the frozen base of a LoRA run is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BaseWeights {
    /// The training precision's weight width (2 bytes, or 4 for fp32/AMP).
    Native,
    /// bitsandbytes LLM.int8: 1 byte plus a scale per row.
    Int8,
    /// QLoRA's NormalFloat4 with double quantization: 4.127 bits.
    Nf4,
}

/// Full fine-tuning or adapters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finetune {
    Full,
    Lora { rank: u64, targets: LoraTargets, base: BaseWeights },
}

/// CPU offload (DeepSpeed ZeRO-Offload / ZeRO-Infinity).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offload {
    None,
    /// Optimizer state, master weights and gradients live on the CPU; the CPU runs the optimizer step.
    Optimizer,
    /// The 16-bit weights too (needs ZeRO-3): fetched layer by layer.
    OptimizerAndParams,
}

/// The coefficients of the activation and time model, in one place so that
/// a calibration from a measured run can replace them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActivationModel {
    /// sbh coefficient independent of the MLP width (attention linears, norms, dropouts): 18.
    pub c0: f64,
    /// sb·f coefficient of a 2-matrix GELU MLP (its 4h form gives Korthikanti's 16 of 34): 4.
    pub c1_mlp: f64,
    /// The same for a gated MLP (one more f-wide tensor saved): 6.
    pub c1_gated: f64,
    /// Of c₀, what tensor parallelism without sequence parallelism replicates (norm inputs, their outputs, dropout masks): 10.
    pub c0_replicated: f64,
    /// Of c₀, the inputs of linear layers (QKV, output projection, MLP input): 6; saved in fp8 under fp8.
    pub c0_linear_inputs: f64,
    /// Of c₁, the input of the MLP's last linear layer: 2.
    pub c1_linear_inputs: f64,
    /// fp32 copies of the logits alive at the loss's peak (the upcast, log-softmax's output, the gradient): 3.
    pub logits_fp32_copies: f64,
    /// Low-precision copies alive with them under 16-bit training (the logits, the gradient): 2.
    pub logits_low_precision_copies: f64,
    /// Fraction of the dense peak the step reaches (llm-analysis's training default).
    pub mfu: f64,
    /// Parameters a CPU optimizer step updates per second, per GPU's share (DeepSpeed CPU-Adam).
    pub host_optimizer_params_per_s: f64,
    /// Fraction of the HBM bandwidth a memory-bound kernel (the optimizer step) reaches
    /// (llm-analysis's default).
    pub hbm_efficiency: f64,
    /// What the caching allocator reserves beyond the tensors that churn each step
    /// (activations, logits, temporaries): block rounding and cached free blocks, 5%
    /// (research/estimation.md §9: 5–15% of reserved over allocated).
    pub allocator_slack: f64,
}

impl Default for ActivationModel {
    fn default() -> Self {
        ActivationModel {
            c0: 18.0,
            c1_mlp: 4.0,
            c1_gated: 6.0,
            c0_replicated: 10.0,
            c0_linear_inputs: 6.0,
            c1_linear_inputs: 2.0,
            logits_fp32_copies: 3.0,
            logits_low_precision_copies: 2.0,
            mfu: 0.5,
            host_optimizer_params_per_s: 1e9,
            hbm_efficiency: 0.9,
            allocator_slack: 0.05,
        }
    }
}

/// A training configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainConfig {
    pub micro_batch: u64,
    pub seq: u64,
    /// Micro-batches per optimizer step (gradient accumulation; the pipeline's micro-batches).
    pub accumulation: u64,
    pub precision: Precision,
    pub optimizer: Optimizer,
    pub attention: Attention,
    pub checkpointing: Checkpointing,
    pub parallel: Parallelism,
    pub finetune: Finetune,
    pub offload: Offload,
    pub coefficients: ActivationModel,
    /// Whose code runs the step: its activations and what each phase keeps.
    pub framework: Framework,
    /// The output layer and loss.
    pub head: Head,
}

/// Whose code runs a training step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framework {
    /// Hugging Face transformers (with the Trainer, Accelerate, DeepSpeed or FSDP) where it
    /// can run the job — one model replica per GPU, full fine-tuning, no or full
    /// checkpointing — and Megatron-LM otherwise.
    Auto,
    /// transformers' own modelling code: its activation recipes and the step's phases ([`crate::step`]).
    HuggingFace,
    /// Megatron-LM's fused kernels: Korthikanti et al.'s activations, all terms at once.
    Megatron,
}

impl Framework {
    /// The name `--framework` and `--json` use.
    pub fn name(self) -> &'static str {
        match self {
            Framework::Auto => "auto",
            Framework::HuggingFace => "hf",
            Framework::Megatron => "megatron",
        }
    }
}

impl TrainConfig {
    /// One GPU, full fine-tuning, no offload, default coefficients.
    pub fn new(micro_batch: u64, seq: u64, precision: Precision, optimizer: Optimizer) -> TrainConfig {
        TrainConfig {
            micro_batch,
            seq,
            accumulation: 1,
            precision,
            optimizer,
            attention: Attention::Sdpa,
            checkpointing: Checkpointing::None,
            parallel: Parallelism::default(),
            finetune: Finetune::Full,
            offload: Offload::None,
            coefficients: ActivationModel::default(),
            framework: Framework::Auto,
            head: Head::CausalLm,
        }
    }

    /// Whether `model` can train this way on `gpu`; the reason if not.
    pub fn check(&self, model: &Model, gpu: &GpuSpec) -> Result<(), String> {
        if self.micro_batch == 0 || self.seq == 0 || self.accumulation == 0 {
            return Err("micro-batch, sequence length and accumulation must be positive".into());
        }
        self.parallel.check(model, self.seq)?;
        if self.precision == Precision::Fp8 && gpu.fp8_flops.is_none() {
            return Err(format!("{} has no fp8 tensor cores (Hopper, Ada, Blackwell and MI300 do)", gpu.name));
        }
        if self.offload == Offload::OptimizerAndParams && self.parallel.zero_stage < 3 {
            return Err("offloading the parameters needs ZeRO stage 3".into());
        }
        if self.checkpointing == Checkpointing::Optimal && self.parallel.pipeline > 1 {
            return Err(
                "optimal checkpointing plans one pipeline stage; with --pp use full, selective or every-K".into()
            );
        }
        if let Finetune::Lora { rank, .. } = self.finetune {
            if rank == 0 {
                return Err("the LoRA rank must be positive".into());
            }
        }
        Ok(())
    }

    /// Sequences per optimizer step over all data-parallel replicas.
    pub fn global_batch(&self) -> u64 {
        self.micro_batch.saturating_mul(self.accumulation).saturating_mul(self.parallel.data)
    }
}

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
    /// The phase of the step that peaks, when transformers' code runs it.
    pub phase: Option<Phase>,
    /// Each phase's peak, then.
    pub phases: Option<Phases>,
    /// Whose code the estimate models: [`Framework::HuggingFace`] or [`Framework::Megatron`].
    pub framework: Framework,
    /// With `Checkpointing::Optimal`: the schedule's peak did not fit even with every layer recomputed.
    pub note: Option<String>,
}

/// Bytes per parameter of weights, gradients and optimizer state, unsharded.
pub fn state_bytes_per_param(hidden: u64, precision: Precision, optimizer: Optimizer) -> (f64, f64, f64) {
    // Adafactor factors the second moment of an n×m matrix into n + m values.
    let adafactor = 2.0 * 4.0 / hidden as f64;
    let (w, g, master, state_width) = match precision {
        Precision::Fp32 | Precision::Amp => (4.0, 4.0, 0.0, 4.0),
        Precision::Mixed => (2.0, 2.0, 4.0, 4.0),
        // The fp8 copy of the weights is kept beside the bf16 ones for the step.
        Precision::Fp8 => (3.0, 2.0, 4.0, 4.0),
        Precision::Bf16 => (2.0, 2.0, 0.0, 2.0),
    };
    let states = match optimizer {
        Optimizer::AdamW => 2.0 * state_width,
        Optimizer::SgdMomentum => state_width,
        Optimizer::Sgd => 0.0,
        Optimizer::Adafactor => adafactor,
        Optimizer::Adam8bit => 2.0,
    };
    (w, g, master + states)
}

/// Weights, gradients and optimizer bytes per GPU for `params` trainable
/// parameters under the ZeRO stage (1 shards the optimizer state over the
/// data-parallel GPUs, 2 also the gradients, 3 also the weights) and offload.
pub fn model_states(params: u64, hidden: u64, cfg: &TrainConfig) -> (f64, f64, f64) {
    let (w, g, o) = state_bytes_per_param(hidden, cfg.precision, cfg.optimizer);
    let par = &cfg.parallel;
    let n = par.data.max(1) as f64;
    let shard = |stage: u8| if par.zero_stage >= stage { n } else { 1.0 };
    let psi = params as f64;
    let weights = if cfg.offload == Offload::OptimizerAndParams { 0.0 } else { w * psi / shard(3) };
    let (gradients, optimizer) = match cfg.offload {
        Offload::None => (g * psi / shard(2), o * psi / shard(1)),
        Offload::Optimizer | Offload::OptimizerAndParams => (0.0, 0.0),
    };
    (weights, gradients, optimizer)
}

fn activation_width(p: Precision) -> f64 {
    if p == Precision::Fp32 {
        4.0
    } else {
        2.0
    }
}

/// The GPU's share of the model: parameters on its pipeline stage ÷ tensor
/// parallelism, split into what trains and what is frozen.
struct Share {
    /// Parameters with gradients and optimizer state.
    trainable: f64,
    /// Frozen parameters stored at the base width (LoRA's quantizable linears).
    frozen_linear: f64,
    /// Frozen parameters at the training width (embeddings and norms under LoRA).
    frozen_other: f64,
}

/// Parameters on one stage: its layers plus the embedding (first) or the head (last).
fn stage_params(model: &Model, par: &Parallelism, stage: PipelineStage, output: Head) -> f64 {
    let layers = model.layers.div_ceil(par.pipeline.max(1)) as f64;
    let t = par.tensor.max(1) as f64;
    let head = (model.vocab * model.hidden) as f64;
    let embedding = model.embedding_params() as f64 - if model.tied_embeddings { 0.0 } else { head };
    (match stage {
        PipelineStage::Only => model.params_with(output) as f64,
        PipelineStage::First => layers * model.layer_params() as f64 + embedding,
        // Megatron keeps a copy of a tied embedding on the last stage for the head.
        PipelineStage::Last => layers * model.layer_params() as f64 + head,
    }) / t
}

fn share(model: &Model, cfg: &TrainConfig, stage: PipelineStage) -> Share {
    let all = stage_params(model, &cfg.parallel, stage, cfg.head);
    match cfg.finetune {
        Finetune::Full => Share { trainable: all, frozen_linear: 0.0, frozen_other: 0.0 },
        Finetune::Lora { rank, targets, .. } => {
            let t = cfg.parallel.tensor.max(1) as f64;
            let layers = match stage {
                PipelineStage::Only => model.layers,
                _ => model.layers.div_ceil(cfg.parallel.pipeline.max(1)),
            } as f64;
            let linears = model.block_linears();
            let targeted: &[(u64, u64)] = match targets {
                LoraTargets::All => &linears,
                // Query and value: the first and third of the attention projections.
                LoraTargets::QueryValue => &[linears[0], linears[2]],
            };
            let adapters = layers * targeted.iter().map(|&(i, o)| rank * (i + o)).sum::<u64>() as f64 / t;
            let linear = layers * linears.iter().map(|&(i, o)| i * o).sum::<u64>() as f64 / t;
            Share { trainable: adapters, frozen_linear: linear.min(all), frozen_other: (all - linear).max(0.0) }
        }
    }
}

fn frozen_bytes(share: &Share, cfg: &TrainConfig) -> f64 {
    let native = match cfg.precision {
        Precision::Fp32 | Precision::Amp => 4.0,
        _ => 2.0,
    };
    // peft's prepare_model_for_kbit_training casts what it does not quantize
    // (embeddings, norms, the head) to fp32.
    let (base, other) = match cfg.finetune {
        Finetune::Lora { base: BaseWeights::Int8, .. } => (1.0 + 4.0 / 4096.0, 4.0),
        // 4-bit values plus double-quantized absmax constants: 0.127 bit a weight (QLoRA §3).
        Finetune::Lora { base: BaseWeights::Nf4, .. } => ((4.0 + 0.127) / 8.0, 4.0),
        _ => (native, native),
    };
    share.frozen_linear * base + share.frozen_other * other
}

/// Per-layer activation bytes on this GPU for one micro-batch: (kept by the
/// layer, of which the attention core, the layer's input).
fn layer_activations(model: &Model, cfg: &TrainConfig) -> (f64, f64, f64) {
    let par = &cfg.parallel;
    let (t, c) = (par.tensor.max(1) as f64, par.context.max(1) as f64);
    let (s, b, h) = (cfg.seq as f64, cfg.micro_batch as f64, model.hidden as f64);
    let s_local = s / c;
    let a = model.heads as f64;
    let width = activation_width(cfg.precision) / 2.0;
    let k = &cfg.coefficients;
    let f_over_h = model.intermediate as f64 / h * model.experts_per_token.max(1) as f64;
    let c1 = if model.gated_mlp { k.c1_gated } else { k.c1_mlp };
    // sbh coefficients in 16-bit units.
    let mut coef = k.c0 + c1 * f_over_h;
    if model.family == Family::T5 {
        // The decoder's cross-attention block: attention (11) and its norm (2), averaged over all blocks.
        coef += 13.0 * model.decoder_layers as f64 / model.layers as f64;
    }
    let linear_inputs = k.c0_linear_inputs + k.c1_linear_inputs * f_over_h;
    if let Finetune::Lora { targets: LoraTargets::QueryValue, .. } = cfg.finetune {
        // A frozen linear layer without an adapter saves no input (autograd saves what a required gradient needs);
        // the QKV input stays (2 of the 6).
        coef -= linear_inputs - 2.0;
    }
    if cfg.precision == Precision::Fp8 {
        coef -= linear_inputs / 2.0;
    }
    let replicated = if t > 1.0 && !par.sequence_parallel { k.c0_replicated } else { 0.0 };
    let linear = s_local * b * h * (replicated + (coef - replicated) / t) * width;
    let core = match cfg.attention {
        Attention::Eager => 5.0 * a * s_local * s * b * width / t,
        Attention::Sdpa | Attention::Flash => 4.0 * a * s_local * b / t,
    };
    let input = s_local * b * h * 2.0 * width / if par.sequence_parallel { t } else { 1.0 };
    (linear + core, core, input)
}

/// Forward FLOPs per micro-batch over the whole model: (the layers' linear
/// layers, the layers' attention, the LM head).
fn forward_flops(model: &Model, cfg: &TrainConfig) -> (f64, f64, f64) {
    // In f64: a batch and a sequence as large as a user may type would wrap u64.
    let tokens = cfg.micro_batch as f64 * cfg.seq as f64;
    let layer_params = model.layer_params() as f64 * model.active_params() as f64 / model.params() as f64;
    let attention = 4.0 * tokens * cfg.seq as f64 * (model.heads * model.head_dim) as f64;
    let l = model.layers as f64;
    (2.0 * layer_params * tokens * l, attention * l, 2.0 * (model.vocab * model.hidden) as f64 * tokens)
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
    let (StageMemory { breakdown, recompute_fraction, note, phases, gpu_only }, stage) =
        best.expect("at least one stage");
    let per_gpu = breakdown.total();
    let par = &cfg.parallel;
    let trainable_params = (share(model, cfg, PipelineStage::Only).trainable * par.tensor as f64).round() as u64;
    let time = step_time(model, gpu, cfg, recompute_fraction);
    let tokens = cfg.micro_batch as f64 * cfg.seq as f64 * cfg.accumulation as f64 * par.data as f64;
    let (lin, attn, head) = forward_flops(model, cfg);
    let passes = if matches!(cfg.finetune, Finetune::Lora { .. }) { 2.0 } else { 3.0 };
    let model_flops = passes * (lin + attn + head) * (cfg.accumulation * par.data) as f64;
    let peak = match cfg.precision {
        Precision::Fp32 => gpu.fp32_flops,
        Precision::Fp8 => gpu.fp8_flops.unwrap_or(gpu.bf16_flops),
        _ => gpu.bf16_flops,
    };
    let sh = share(model, cfg, stage);
    let d = par.data.max(1) as f64;
    // The fp32 master, the optimizer's states and fp32 gradients of the GPU's shard; with
    // the parameters offloaded, their 16-bit copy too.
    let offloaded_states =
        (state_bytes_per_param(model.hidden, Precision::Mixed, cfg.optimizer).2 + 4.0) * sh.trainable;
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
        tokens_per_s: tokens / time,
        mfu: model_flops / (time * par.gpus() as f64 * peak),
        recompute_fraction,
        trainable_params,
        host_bytes: host_per_gpu * par.gpus().min(parallel::GPUS_PER_NODE) as f64,
        allocated_bytes: per_gpu - breakdown.framework,
        tensor_bytes: per_gpu - breakdown.framework - gpu_only,
        phase: phases.map(|p| p.peak().0),
        phases,
        framework: if phases.is_some() { Framework::HuggingFace } else { Framework::Megatron },
        note,
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

/// One stage's memory.
struct StageMemory {
    /// Bytes by term (at the peak phase, when the step is modelled by phases).
    breakdown: Breakdown,
    /// Forward FLOPs recomputed, as a fraction of one forward.
    recompute_fraction: f64,
    /// Why nothing fits (optimal checkpointing).
    note: Option<String>,
    /// The step's phases, when transformers' code runs it ([`crate::step`]).
    phases: Option<Phases>,
    /// Tensors only a GPU has: cuBLAS workspaces.
    gpu_only: f64,
}

/// The activation recipe of transformers' code for this job, when transformers runs it:
/// one model replica per GPU, full fine-tuning, no or full checkpointing, a precision
/// transformers has.
fn hf_recipe(model: &Model, cfg: &TrainConfig) -> Option<&'static Recipe> {
    let par = &cfg.parallel;
    let runs = cfg.framework != Framework::Megatron
        && cfg.finetune == Finetune::Full
        && par.tensor == 1
        && par.pipeline == 1
        && par.context == 1
        && matches!(cfg.checkpointing, Checkpointing::None | Checkpointing::Full);
    if runs {
        recipe::recipe(model, cfg.precision, cfg.attention)
    } else {
        None
    }
}

/// What the optimizer step allocates beside its state: `torch.optim.AdamW` with `foreach`
/// takes the square root of every second moment at once (a tensor the size of the state
/// it reads); transformers' Adafactor works one parameter at a time in fp32, holding two
/// tensors the size of the largest (four for 16-bit parameters: their fp32 copy and their
/// gradient's); SGD updates in place.
fn optimizer_temp(model: &Model, cfg: &TrainConfig, trainable: f64) -> f64 {
    let state_width = match cfg.precision {
        Precision::Bf16 => 2.0,
        _ => 4.0,
    };
    let shard = if cfg.parallel.zero_stage >= 1 { cfg.parallel.data.max(1) as f64 } else { 1.0 };
    let sixteen_bit = matches!(cfg.precision, Precision::Bf16 | Precision::Mixed | Precision::Fp8);
    match cfg.optimizer {
        Optimizer::AdamW => state_width * trainable / shard,
        Optimizer::Adafactor => 4.0 * if sixteen_bit { 4.0 } else { 2.0 } * largest_param(model),
        _ => 0.0,
    }
}

/// Elements of the largest parameter tensor: the embedding, or an MoE layer's experts
/// stacked in one tensor (transformers keeps them so), or a block's largest linear.
fn largest_param(model: &Model) -> f64 {
    let embedding = (model.vocab * model.hidden) as f64;
    let linear = model.block_linears().iter().map(|&(i, o)| (i * o) as f64).fold(0.0, f64::max);
    let experts = if model.experts > 1 {
        (model.experts * if model.gated_mlp { 2 } else { 1 } * model.intermediate * model.hidden) as f64
    } else {
        0.0
    };
    embedding.max(linear).max(experts)
}

fn memory(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig, stage: PipelineStage) -> StageMemory {
    let par = &cfg.parallel;
    let (t, c, p) = (par.tensor.max(1) as f64, par.context.max(1) as f64, par.pipeline.max(1));
    let sh = share(model, cfg, stage);
    let (weights, gradients, optimizer) = model_states(sh.trainable.round() as u64, model.hidden, cfg);
    let frozen = if cfg.offload == Offload::OptimizerAndParams {
        0.0
    } else {
        frozen_bytes(&sh, cfg) / if par.zero_stage >= 3 { par.data.max(1) as f64 } else { 1.0 }
    };
    let mut br = Breakdown { weights: weights + frozen, gradients, optimizer, ..Breakdown::default() };
    let (s, b) = (cfg.seq as f64, cfg.micro_batch as f64);
    let width = activation_width(cfg.precision);
    let (per_layer, core, hidden_state) = layer_activations(model, cfg);
    let lp = model.layers.div_ceil(p) as f64;
    // Layers' worth of activations the stage holds: 1F1B keeps up to p micro-batches on the
    // first stage (fewer with fewer micro-batches), the interleaved schedule a little more.
    let in_flight = match stage {
        PipelineStage::Only | PipelineStage::Last => 1.0,
        PipelineStage::First => {
            let v = par.virtual_stages.max(1) as f64;
            let interleaved = if v > 1.0 { 1.0 + (p as f64 - 1.0) / (p as f64 * v) } else { 1.0 };
            p.min(cfg.accumulation) as f64 * interleaved
        }
    };
    let l = lp * in_flight;
    if stage != PipelineStage::First {
        let k = &cfg.coefficients;
        let per_logit =
            4.0 * k.logits_fp32_copies + if width < 4.0 { width * k.logits_low_precision_copies } else { 0.0 };
        br.logits = s / c * b * model.vocab as f64 * per_logit / t;
    }
    let hopper = gpu.name.starts_with('h') || gpu.name.starts_with('b');
    br.temporary = if hopper { 32.0 * MIB } else { 4.0 * MIB };
    if par.zero_stage >= 3 && par.data > 1 {
        br.temporary += 4.0 * model.layer_params() as f64 / t;
    }
    if let Finetune::Lora { base: BaseWeights::Int8 | BaseWeights::Nf4, .. } = cfg.finetune {
        let largest = model.block_linears().iter().map(|&(i, o)| i * o).max().unwrap_or(0);
        br.temporary += 2.0 * largest as f64 / t;
    }
    if cfg.offload != Offload::None {
        // DeepSpeed's reduce bucket (5e8 elements of 16-bit gradients) or the gradients, if fewer.
        br.temporary += (2.0 * sh.trainable).min(1e9);
    }
    br.framework = 0.5 * GIB + if par.gpus() > 1 { 1.5 * GIB } else { 0.0 };
    let (lin, attn, head) = forward_flops(model, cfg);
    let layer_flops = (lin + attn) / model.layers as f64;
    let forward = lin + attn + head;
    let mut recompute_fraction = 0.0;
    let mut note = None;
    br.activations = match cfg.checkpointing {
        Checkpointing::None => l * per_layer,
        Checkpointing::Selective => {
            if cfg.attention == Attention::Eager {
                // The s² tensors are recomputed: their FLOPs are a small share of the layer's.
                recompute_fraction = attn / forward;
            }
            l * (per_layer - core) + core
        }
        Checkpointing::Full => {
            recompute_fraction = (lin + attn) / forward;
            l * hidden_state + per_layer
        }
        Checkpointing::EveryK(k) => {
            let k = (k as f64).clamp(1.0, lp);
            recompute_fraction = (lin + attn) / forward;
            (l / k).ceil() * hidden_state + k * per_layer
        }
        Checkpointing::Optimal => {
            // The schedule's peak (activations and logits) and the temporaries carry the allocator's slack.
            let slack = 1.0 + cfg.coefficients.allocator_slack;
            let fixed = br.weights + br.gradients + br.optimizer + br.framework + slack * br.temporary;
            let budget = ((gpu.memory_bytes as f64 - fixed) / slack).max(0.0) as u64;
            // Below one layer's input, no schedule can run: say why without asking the solver.
            let floor = (hidden_state * 3.0).max(1.0) as u64;
            let chain = Chain {
                input_bytes: hidden_state as u64,
                stages: (0..model.layers)
                    .map(|i| Stage {
                        name: format!("layer{i}"),
                        forward_time: layer_flops,
                        backward_time: 2.0 * layer_flops,
                        output_bytes: hidden_state as u64,
                        saved_bytes: per_layer.max(hidden_state) as u64,
                        forward_tmp_bytes: 0,
                        backward_tmp_bytes: 0,
                    })
                    .collect(),
                loss: Loss {
                    forward_time: head,
                    backward_time: 2.0 * head,
                    saved_bytes: br.logits as u64,
                    ..Loss::default()
                },
            };
            // rotor's 500 slots, fewer for deep models so the table stays near 40 MB.
            let n = model.layers as f64 + 1.0;
            let slots = (500.0 * (201.0 / n).powi(2)).clamp(50.0, 500.0) as u32;
            let solved = if budget < floor {
                Err(format!(
                    "the model states and fixed terms take {:.2} GiB of the GPU's {:.2} GiB, leaving {:.2} GiB for \
                     activations: less than any schedule needs",
                    fixed / GIB,
                    gpu.memory_bytes as f64 / GIB,
                    budget as f64 / GIB
                ))
            } else {
                checkpoint::solve(&chain, budget, slots).map_err(|e| e.to_string())
            };
            match solved {
                Ok(plan) => {
                    recompute_fraction = (plan.outcome.time - 3.0 * forward).max(0.0) / forward;
                    // The schedule's peak holds the logits too; report them apart.
                    (plan.outcome.peak as f64 - br.logits).max(0.0)
                }
                Err(e) => {
                    note = Some(format!("no checkpointing schedule fits: {e}"));
                    recompute_fraction = (lin + attn) / forward;
                    l * hidden_state + per_layer
                }
            }
        }
    };
    let gpu_only = if hopper { 32.0 * MIB } else { 4.0 * MIB };
    let mut phases = None;
    if let Some(r) = hf_recipe(model, cfg).filter(|_| stage == PipelineStage::Only) {
        let checkpointed = cfg.checkpointing == Checkpointing::Full;
        let mut saved = r.saved(model, b, s, model.layers as f64, checkpointed);
        let logit_width = match cfg.head {
            Head::SeqCls => {
                saved.outside = r.outside_without_vocabulary(model, b, s);
                // The classifier's few logits a sequence.
                2.0 / s
            }
            Head::CausalLm | Head::MaskedLm => model.vocab as f64,
        };
        let (_, g, _) = state_bytes_per_param(model.hidden, cfg.precision, cfg.optimizer);
        let parts = StepParts {
            weights: br.weights,
            gradients: br.gradients,
            optimizer_state: br.optimizer,
            optimizer_temp: optimizer_temp(model, cfg, sh.trainable),
            inputs: 16.0 * b * s,
            saved,
            tokens: b * s,
            logit_width,
            logit_bytes: if cfg.precision == Precision::Fp32 { 4.0 } else { 2.0 },
            loss_bytes: r.loss_bytes(),
            // A T5 recipe layer is an encoder and a decoder block; one block is recomputed at a time.
            recomputed_layer: checkpointed
                .then(|| r.layer_full(model, b, s) / if model.family == Family::T5 { 2.0 } else { 1.0 }),
            head_gradient: g * (model.vocab * model.hidden) as f64,
            attention_backward: if cfg.attention == Attention::Eager || !r.has_sdpa() {
                8.0 * b * model.heads as f64 * s * s
            } else {
                0.0
            },
            // The embedding's gradient, made last: tied to the head, it is a new tensor added to
            // the head's gradient — in place in fp32, out of place (one more) in 16 bits.
            embedding_tail: if model.tied_embeddings && cfg.head != Head::SeqCls {
                g * (model.vocab * model.hidden) as f64 * if g < 4.0 { 2.0 } else { 1.0 }
            } else {
                0.0
            },
        };
        let ph = step::phases(&parts);
        let (_, peak) = ph.peak();
        br.gradients = peak.gradients;
        br.activations = peak.activations + parts.inputs;
        br.logits = peak.logits;
        br.temporary += peak.temporary;
        recompute_fraction = if checkpointed { (lin + attn) / forward } else { 0.0 };
        phases = Some(ph);
    }
    br.framework += cfg.coefficients.allocator_slack * (br.activations + br.logits + br.temporary);
    StageMemory { breakdown: br, recompute_fraction, note, phases, gpu_only }
}

/// Seconds per optimizer step (see the module documentation).
fn step_time(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig, recompute_fraction: f64) -> f64 {
    let par = &cfg.parallel;
    let (t, c, p, v) = (par.tensor.max(1), par.context.max(1), par.pipeline.max(1), par.virtual_stages.max(1));
    let m = cfg.accumulation.max(1) as f64;
    let (lin, attn, head) = forward_flops(model, cfg);
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
    let n = par.data.max(1);
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
        let (w, g, o) = state_bytes_per_param(model.hidden, cfg.precision, cfg.optimizer);
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

/// The largest micro-batch that fits (0 if none does), up to `limit`.
pub fn max_micro_batch(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig, limit: u64) -> u64 {
    let fits = |b: u64| estimate(model, gpu, &TrainConfig { micro_batch: b, ..*cfg }).fits;
    if !fits(1) {
        return 0;
    }
    let (mut lo, mut hi) = (1u64, 2u64);
    while hi <= limit && fits(hi) {
        lo = hi;
        hi *= 2;
    }
    let mut hi = hi.min(limit + 1);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::gpu;
    use crate::model::preset;

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
                    let (w, g, o) = model_states(params, 4096, &cfg);
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
        let (eager, core, _) = layer_activations(&gpt3, &base());
        assert!((eager / 1e9 - 2.87).abs() < 0.01, "{eager}");
        // Selective recomputation leaves 34·sbh = 0.86 GB.
        assert!(((eager - core) / 1e9 - 0.856).abs() < 0.01);
        let flash = layer_activations(&gpt3, &TrainConfig { attention: Attention::Flash, ..base() }).0;
        assert!(flash < eager / 3.0);
        // Table 2 under 8-way tensor parallelism: sequence parallel (34 + 5as/h)·sbh/t = 0.359 GB;
        // with selective recomputation 34·sbh/t = 0.107 GB; full recomputation keeps 2sbh = 0.050 GB.
        let tp = |sp: bool| TrainConfig {
            parallel: Parallelism { tensor: 8, sequence_parallel: sp, ..Parallelism::default() },
            ..base()
        };
        let (with_sp, core_sp, _) = layer_activations(&gpt3, &tp(true));
        assert!((with_sp / 1e9 - 0.359).abs() < 0.002, "{with_sp}");
        assert!(((with_sp - core_sp) / 1e9 - 0.107).abs() < 0.001);
        let (_, _, input) = layer_activations(&gpt3, &tp(false));
        assert!((input / 1e9 - 0.050).abs() < 0.001);
        // Without sequence parallelism, 22B at b = 4: sbh(10 + 24/t + 5as/(ht)) = 1.33 GB.
        let m22 = gpt("22b", 6144, 48, 64);
        let (tp_only, _, _) = layer_activations(&m22, &TrainConfig { micro_batch: 4, ..tp(false) });
        assert!((tp_only / 1e9 - 1.33).abs() < 0.01, "{tp_only}");
        let unsplit = layer_activations(&m22, &TrainConfig { micro_batch: 4, ..base() }).0;
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
        let per_slot = p4 / (8.0 + 3.0);
        assert!((t(cfg(4, 1, 16)) - 19.0 * per_slot).abs() / p4 < 0.01);
        // Tensor parallelism across nodes is slower than inside one.
        let inside = estimate(&m, &g, &cfg(1, 1, 1));
        assert!(inside.mfu < 0.5 && inside.mfu > 0.3, "{}", inside.mfu);
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
    /// ZeRO-2 with optimizer offload 2Ψ = 5.31; ZeRO-3 with optimizer offload 2Ψ/8 + the gathered layer.
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
        assert_eq!(states(&all), 0.0);
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
        assert!(cfg(Precision::Fp8).check(&m, &a100).unwrap_err().contains("fp8"));
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
