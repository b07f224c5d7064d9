//! The closed form: the bytes a step holds at its peak, term by term, without the allocator
//! (research/estimation.md). It has two callers: the closed-form program builders
//! ([`crate::builders::analytic`]), which lay its terms out as a step for the jobs no program
//! was recorded for, and the search's screen ([`crate::estimate::Estimator::screen`]), which
//! prunes configurations before any is replayed.
//!
//! | term | formula | source (research/estimation.md) |
//! |---|---|---|
//! | weights, gradients, optimizer | bytes/param by precision and optimizer, for the parameters on the GPU's pipeline stage ÷ tensor parallelism, ÷ data parallelism for the ZeRO-sharded ones; LoRA: frozen base at its width plus adapters with full states; offloaded states leave the GPU | §1.1–§1.4 |
//! | activations | per layer sbh·(c₀ + c₁·f/h) at the activation width, plus the attention core: 5as²b (eager) or 4asb (SDPA/flash); ÷t (the replicated 10·sbh stays without sequence parallelism), ÷ context parallelism; × the micro-batches a 1F1B stage holds (first stage: L layers' worth), × 1 + (p−1)/(p·v) interleaved; by checkpoint policy. Under peft's LoRA of every linear layer of Mixtral or Qwen3-MoE, each layer's merged expert stacks too: E × 3·f·h at the activation width ([`merged_experts`]) | §2.1, §2.3, §2.5, §8.4 |
//! | logits | b·s·V/t on the last stage × the bytes the loss holds at its peak: Hugging Face's loss upcasts the 16-bit logits to fp32 and keeps both, log-softmax keeps its fp32 output, and the backward makes an fp32 gradient and its 16-bit copy: 2 + 4 + 4 + 4 + 2 = 16 bytes (12 in fp32) | §2.4 |
//! | temporary | cuBLAS workspace; ZeRO-3's gathered layer (4 × layer params), or under pipelining the stage's parameters gathered in 16 bits (FSDP2 keeps them from a micro-batch's forward to its backward); under DeepSpeed its gradient bucket and ZeRO-3's parameters still gathered at the turn to the backward ([`deepspeed`]); a dequantized QLoRA matrix; the offload gradient bucket | §1.4, §4.1 |
//! | framework | CUDA context; NCCL buffers with more than one GPU | §4.1, §9 |
//!
//! Where transformers' code runs the layers ([`crate::phases`]), the activations, logits and
//! temporaries are its recorded phases' instead: recorded with the key-value cache on, and
//! without it ([`TrainConfig::use_cache`] false) moved by what SDPA saves in its place
//! ([`without_cache`]).

use crate::checkpoint::{self, Chain, Loss, Stage};
use crate::deepspeed;
use crate::job::{
    Attention, BaseWeights, Checkpointing, Device, Finetune, Framework, Job, LoraTargets, Offload, Optimizer,
    OptimizerImpl, PipelineStage, Precision, TrainConfig,
};
use crate::model::{Family, Head, Model};
use crate::phases::{self, Phases, StepParts};
use crate::placement::{
    activation_width, frozen_bytes, frozen_width, model_states, share, state_bytes_per_param, ModelStates, Share,
};
use crate::placement::{forward_flops, ForwardFlops};
use crate::recipe::{self, Recipe};
use crate::step_recipe::step_recipe;

/// The coefficients of the closed form's activations and loss, in 16-bit units of s·b·h
/// (Korthikanti et al.), in one place.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Coefficients {
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
}

/// Korthikanti et al.'s coefficients (research/estimation.md §2.1, §2.4).
pub const COEFFICIENTS: Coefficients = Coefficients {
    c0: 18.0,
    c1_mlp: 4.0,
    c1_gated: 6.0,
    c0_replicated: 10.0,
    c0_linear_inputs: 6.0,
    c1_linear_inputs: 2.0,
    logits_fp32_copies: 3.0,
    logits_low_precision_copies: 2.0,
};

pub const GIB: f64 = (1u64 << 30) as f64;

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

/// One layer's activations on this GPU for one micro-batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerActivations {
    /// What the layer keeps for its backward.
    pub kept: f64,
    /// Of which the attention core.
    pub core: f64,
    /// The layer's input (what full checkpointing keeps).
    pub input: f64,
}

/// One layer's activation bytes on this GPU for one micro-batch.
pub fn layer_activations(model: &Model, cfg: &TrainConfig) -> LayerActivations {
    let par = &cfg.parallel;
    let (t, c) = (par.tensor.max(1) as f64, par.context.max(1) as f64);
    let (s, b, h) = (cfg.seq as f64, cfg.micro_batch as f64, model.hidden as f64);
    let s_local = s / c;
    let a = model.heads as f64;
    let width = activation_width(cfg.precision) / 2.0;
    let k = &COEFFICIENTS;
    let f_over_h = model.intermediate as f64 / h * model.experts_per_token.max(1) as f64;
    let c1 = if model.gated_mlp { k.c1_gated } else { k.c1_mlp };
    // sbh coefficients in 16-bit units.
    let mut coef = k.c0 + c1 * f_over_h;
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
    // Tokens a block's tensors are sized by, averaged over the model's blocks (each `·s_local·b`
    // below): a decoder's or an encoder's own; T5's encoder blocks at the encoder's input, its
    // decoder blocks at the decoder's length (`--target-seq`), and its decoder's cross-attention
    // block — attention (11) and its norm (2) — at the decoder's length but for the keys and
    // values (4 of the 13), which the encoder's output sizes.
    let (block, cross, scores, per_head) = if model.family == Family::T5 {
        let (dec, l) = (model.decoder_layers as f64, model.layers as f64);
        let enc = l - dec;
        let r = cfg.decoder_seq() as f64 / s;
        ((enc + dec * r) / l, dec * (9.0 * r + 4.0) / l, (enc + dec * r * r) / l, (enc + dec * r) / l)
    } else {
        (1.0, 0.0, 1.0, 1.0)
    };
    let linear = s_local * b * h * (block * (replicated + (coef - replicated) / t) + cross / t) * width;
    let core = match cfg.attention {
        Attention::Eager => 5.0 * a * s_local * s * b * width / t * scores,
        Attention::Sdpa | Attention::Flash => 4.0 * a * s_local * b / t * per_head,
    };
    let input = block * s_local * b * h * 2.0 * width / if par.sequence_parallel { t } else { 1.0 };
    LayerActivations { kept: linear + core, core, input }
}

/// Bytes of one layer's expert stacks as peft merges them, kept for the backward: peft 0.21's
/// "all-linear" wraps each of transformers 5's stacked expert parameters (`gate_up_proj`,
/// E × 2f × h, and `down_proj`, E × h × f) of Mixtral and Qwen3-MoE in a `ParamWrapper`, whose
/// forward folds the adapter into a new tensor as large as the stack (W + s · B @ A, one
/// `torch.baddbmm`, in the compute dtype: autocast's 16 bits under AMP, the 16-bit experts a
/// 4-bit base leaves unquantized) that `grouped_mm` saves for the input's gradient
/// (docs/VALIDATION.md, "The merged expert weights of peft's LoRA"). None where peft wraps no
/// stack: Qwen2-MoE's experts (transformers' conversion table names no pattern for
/// `qwen2_moe`), adapters on the query and value projections alone, a dense model, or LoRA
/// that is not peft's over transformers' code (`transformers` false: Megatron's keeps the
/// frozen weights and adds the adapters' activations beside them).
pub fn merged_experts(model: &Model, cfg: &TrainConfig, transformers: bool) -> f64 {
    let wrapped = matches!(model.model_type, "mixtral" | "qwen3_moe") && model.experts > 1;
    if !transformers || !wrapped || !matches!(cfg.finetune, Finetune::Lora { targets: LoraTargets::All, .. }) {
        return 0.0;
    }
    let t = cfg.parallel.tensor.max(1) as f64;
    (model.experts * 3 * model.intermediate * model.hidden) as f64 * activation_width(cfg.precision) / t
}

/// What one layer keeps under torchtitan's per-op checkpointing: its input, the outputs of
/// the first, third, ... matrix multiply of the block (wq, wv, w1, w2 in a Llama block), and
/// the attention kernel's output and log-sum-exp (eager attention's batched products are not
/// on the list: recomputed). Tensor parallelism shards every one; without sequence
/// parallelism the input and the row-parallel outputs stay whole. Also the share of the
/// linear layers' FLOPs recomputed: the matrix multiplies not kept (the second, fourth, ...).
fn per_op(model: &Model, cfg: &TrainConfig) -> (f64, f64) {
    let par = &cfg.parallel;
    let (t, c) = (par.tensor.max(1) as f64, par.context.max(1) as f64);
    let tokens = cfg.seq as f64 / c * cfg.micro_batch as f64;
    let bytes = activation_width(cfg.precision).max(2.0);
    let whole = |replicated: bool| if replicated && !par.sequence_parallel { 1.0 } else { t };
    let linears = model.block_linears();
    let mlp = if model.gated_mlp { 3 } else { 2 };
    // Experts see only their routed tokens.
    let routed = model.experts_per_token.max(1) as f64 / model.experts.max(1) as f64;
    let q = (model.heads * model.head_dim) as f64;
    let mut units = model.hidden as f64 / whole(true);
    let (mut all, mut again) = (0u64, 0u64);
    for (i, &(inp, out)) in linears.iter().enumerate() {
        all += inp * out;
        if i % 2 == 1 {
            again += inp * out;
            continue;
        }
        let row_parallel = i == 3 || (i >= 4 && (i - 4) % mlp == mlp - 1);
        let share = if i >= 4 { routed } else { 1.0 };
        units += out as f64 * share / whole(row_parallel);
    }
    let kernel = match cfg.attention {
        Attention::Eager => 0.0,
        Attention::Sdpa | Attention::Flash => q / t * bytes + 4.0 * model.heads as f64 / t,
    };
    (tokens * (units * bytes + kernel), again as f64 / all.max(1) as f64)
}

/// One stage's memory.
pub struct StageMemory {
    /// Bytes by term (at the peak phase, when the step is modelled by phases).
    pub breakdown: Breakdown,
    /// Forward FLOPs recomputed, as a fraction of one forward.
    pub recompute_fraction: f64,
    /// Why nothing fits (optimal checkpointing).
    pub note: Option<String>,
    /// The step's phases, when transformers' code runs it ([`crate::phases`]).
    pub phases: Option<Phases>,
    /// Tensors only a GPU has: cuBLAS workspaces.
    pub gpu_only: f64,
    /// What the process holds outside the caching allocator: the CUDA context and NCCL's buffers.
    pub outside_allocator: f64,
}

/// The activation recipe recorded of transformers' code for the job's family, precision and
/// attention (and its compiled step, where one was recorded).
pub fn hf_recipe(model: &Model, cfg: &TrainConfig) -> Option<&'static Recipe> {
    recipe::recipe(model, cfg.precision, cfg.attention, compiled_recipe(model, cfg))
}

/// Whether the job's activations are `torch.compile`'s: asked for, and recorded for its
/// family, precision and checkpointing (the compiled step itself, or without checkpointing
/// what it saves); elsewhere the eager code's recipes stand for them.
pub fn compiled_recipe(model: &Model, cfg: &TrainConfig) -> bool {
    let checkpointed = match cfg.checkpointing {
        Checkpointing::None => false,
        Checkpointing::Full => true,
        _ => return false,
    };
    cfg.compile
        && (step_recipe(model, cfg.precision, cfg.attention, checkpointed, cfg.head, true).is_some()
            || !checkpointed && recipe::has_compiled(model, cfg.precision, cfg.attention))
}

/// What the optimizer step allocates beside its state, at its peak, for the implementation
/// that runs ([`crate::builders::optimizer`]): AdamW's foreach takes the square root of every
/// second moment at once (a tensor the size of the state it reads), its for-loop two of the
/// largest parameter's, its fused kernel none; transformers' Adafactor works one parameter at a
/// time in fp32, holding two tensors the size of the largest (four for 16-bit parameters: their
/// fp32 copy and their gradient's); SGD updates in place; an optimizer on the CPU nothing here.
fn optimizer_temp(job: &Job, trainable: f64) -> f64 {
    let (model, cfg) = (job.model, &job.train);
    let state_width = match cfg.precision {
        Precision::Bf16 => 2.0,
        _ => 4.0,
    };
    let shard = if cfg.parallel.zero_stage >= 1 { cfg.parallel.shard_degree() as f64 } else { 1.0 };
    let sixteen_bit = matches!(cfg.precision, Precision::Bf16 | Precision::Mixed | Precision::Fp8);
    if cfg.offload != Offload::None {
        return 0.0;
    }
    match (cfg.optimizer, cfg.optimizer_implementation(Device::Gpu(job.gpu))) {
        (Optimizer::AdamW, OptimizerImpl::Foreach) => state_width * trainable / shard,
        (Optimizer::AdamW, OptimizerImpl::ForLoop) => 2.0 * state_width * largest_param(model),
        (Optimizer::Adafactor, _) => 4.0 * if sixteen_bit { 4.0 } else { 2.0 } * largest_param(model),
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

/// The closed form's terms for `stage` of the job: Korthikanti et al.'s activations, or with
/// `transformers` (its code runs the layers, [`crate::builders`] says) transformers' recorded
/// phases where they were recorded. `held_back` bytes of the GPU are kept from optimal
/// checkpointing's budget: what the allocator's caching takes beyond the tensors, found by
/// replaying.
pub fn memory(job: &Job, stage: PipelineStage, transformers: bool, held_back: f64) -> StageMemory {
    let (model, cfg) = (job.model, &job.train);
    let sh = share(model, cfg, stage);
    let mut br = states(model, cfg, &sh);
    if cfg.deepspeed() {
        br.weights += deepspeed_persistent(model, cfg);
    }
    if matches!(stage, PipelineStage::Only | PipelineStage::Last) {
        br.logits = logits(model, cfg);
    }
    br.temporary = temporaries(job, &sh);
    br.framework = job.outside_allocator();
    let merged = merged_experts(model, cfg, transformers);
    let (activations, recompute_fraction, note) = activations(job, stage, &br, held_back, merged);
    br.activations = activations;
    let mut m = StageMemory {
        breakdown: br,
        recompute_fraction,
        note,
        phases: None,
        gpu_only: job.gpu.arch.cublas_workspace_bytes() as f64,
        outside_allocator: job.outside_allocator(),
    };
    if transformers && stage == PipelineStage::Only {
        if let Some(r) = hf_recipe(model, cfg) {
            transformers_phases(&mut m, job, r, &sh);
        }
    }
    m
}

/// Weights (the trained share and the frozen base), gradients and optimizer state on the GPU.
fn states(model: &Model, cfg: &TrainConfig, sh: &Share) -> Breakdown {
    let par = &cfg.parallel;
    let ModelStates { weights, gradients, optimizer } = model_states(sh.trainable.round() as u64, model.hidden, cfg);
    let frozen = if cfg.offload == Offload::OptimizerAndParams {
        0.0
    } else {
        frozen_bytes(model, sh, cfg) / if par.zero_stage >= 3 { par.shard_degree() as f64 } else { 1.0 }
    };
    Breakdown { weights: weights + frozen, gradients, optimizer, ..Breakdown::default() }
}

/// The loss's bytes at its peak on the stage that holds the head.
fn logits(model: &Model, cfg: &TrainConfig) -> f64 {
    let par = &cfg.parallel;
    let (t, c) = (par.tensor.max(1) as f64, par.context.max(1) as f64);
    let k = &COEFFICIENTS;
    let width = activation_width(cfg.precision);
    // torchtitan deletes the 16-bit logits before the backward, where the loss peaks.
    let low = if cfg.framework == Framework::Torchtitan { 0.0 } else { k.logits_low_precision_copies };
    let per_logit = 4.0 * k.logits_fp32_copies + if width < 4.0 { width * low } else { 0.0 };
    // T5's logits are its decoder's, at the decoder's length.
    let positions = if model.family == Family::T5 { cfg.decoder_seq() } else { cfg.seq };
    positions as f64 / c * cfg.micro_batch as f64 * model.vocab as f64 * per_logit / t
}

/// What the step gathers, buckets or dequantizes beside the model states, with the cuBLAS
/// workspace; DeepSpeed's persistent parameters join the weights.
fn temporaries(job: &Job, sh: &Share) -> f64 {
    let (model, cfg) = (job.model, &job.train);
    let par = &cfg.parallel;
    let (t, p) = (par.tensor.max(1) as f64, par.pipeline.max(1));
    let mut temporary = job.gpu.arch.cublas_workspace_bytes() as f64;
    if cfg.deepspeed() {
        let ds = deepspeed::buffers(model, cfg, frozen_width(model, cfg).1);
        temporary += ds.reduce_bucket + ds.gathered;
    } else if par.zero_stage >= 3 && par.shard_degree() > 1 {
        temporary += if p > 1 {
            // Under pipelining FSDP2 keeps a stage's parameters gathered from a micro-batch's
            // forward to its backward (torchtitan: `reshard_after_forward=False` with PP, so
            // that each micro-batch does not gather them again), and 1F1B always has one in
            // flight: the stage's whole model, in the compute width, beside its shard.
            let width = if matches!(cfg.precision, Precision::Fp32) { 4.0 } else { 2.0 };
            width * (sh.trainable + sh.frozen_linear + sh.frozen_other)
        } else {
            4.0 * model.layer_params() as f64 / t
        };
    }
    if let Finetune::Lora { base: BaseWeights::Int8 | BaseWeights::Nf4 | BaseWeights::Fp4, .. } = cfg.finetune {
        let largest = model.block_linears().iter().map(|&(i, o)| i * o).max().unwrap_or(0);
        temporary += 2.0 * largest as f64 / t;
    }
    if cfg.offload != Offload::None && !cfg.deepspeed() {
        // DeepSpeed's reduce bucket (5e8 elements of 16-bit gradients) or the gradients, if fewer.
        temporary += (2.0 * sh.trainable).min(1e9);
    }
    temporary
}

/// DeepSpeed's persistent parameters: whole on every GPU, in place of the shard counted
/// ([`states`] counts their shard).
fn deepspeed_persistent(model: &Model, cfg: &TrainConfig) -> f64 {
    let par = &cfg.parallel;
    let ds = deepspeed::buffers(model, cfg, frozen_width(model, cfg).1);
    match cfg.offload {
        Offload::OptimizerAndParams => ds.persistent,
        _ if par.zero_stage >= 3 => ds.persistent * (1.0 - 1.0 / par.shard_degree() as f64),
        _ => 0.0,
    }
}

/// Layers' worth of activations the stage holds: 1F1B keeps up to p micro-batches on the
/// first stage (fewer with fewer micro-batches), the interleaved schedule a little more.
fn layers_held(model: &Model, cfg: &TrainConfig, stage: PipelineStage) -> f64 {
    let par = &cfg.parallel;
    let p = par.pipeline.max(1);
    let in_flight = match stage {
        PipelineStage::Only | PipelineStage::Last | PipelineStage::Middle => 1.0,
        PipelineStage::First => {
            let v = par.virtual_stages.max(1) as f64;
            let interleaved = if v > 1.0 { 1.0 + (p as f64 - 1.0) / (p as f64 * v) } else { 1.0 };
            p.min(cfg.accumulation) as f64 * interleaved
        }
    };
    model.layers.div_ceil(p) as f64 * in_flight
}

/// Forward FLOPs the backward recomputes, as a fraction of one forward, for every policy but
/// optimal checkpointing (whose schedule the solver picks, [`memory`]).
pub fn recompute_fraction(job: &Job) -> f64 {
    let (model, cfg) = (job.model, &job.train);
    let ForwardFlops { linear: lin, attention: attn, head } = forward_flops(model, cfg);
    let forward = lin + attn + head;
    match cfg.checkpointing {
        Checkpointing::None | Checkpointing::Optimal => 0.0,
        Checkpointing::PerOp => lin * per_op(model, cfg).1 / forward,
        // The s² tensors are recomputed: their FLOPs are a small share of the layer's.
        Checkpointing::Selective if cfg.attention == Attention::Eager => attn / forward,
        Checkpointing::Selective => 0.0,
        Checkpointing::Full | Checkpointing::EveryK(_) => (lin + attn) / forward,
    }
}

/// The activations the stage keeps under the job's checkpoint policy, the share of a forward
/// the backward recomputes, and why no schedule fits where optimal checkpointing finds none.
/// `merged`: what a layer keeps beside its activations whatever the tokens (peft's merged
/// expert stacks, [`merged_experts`]): every layer's without checkpointing, the recomputed
/// layer's with it.
fn activations(
    job: &Job,
    stage: PipelineStage,
    br: &Breakdown,
    held_back: f64,
    merged: f64,
) -> (f64, f64, Option<String>) {
    let (model, cfg) = (job.model, &job.train);
    let LayerActivations { kept, core, input: hidden_state } = layer_activations(model, cfg);
    let per_layer = kept + merged;
    let l = layers_held(model, cfg, stage);
    let lp = model.layers.div_ceil(cfg.parallel.pipeline.max(1)) as f64;
    let recompute = recompute_fraction(job);
    match cfg.checkpointing {
        Checkpointing::None => (l * per_layer, recompute, None),
        // The backward recomputes one layer at a time beside every layer's kept tensors.
        Checkpointing::PerOp => (l * per_op(model, cfg).0 + per_layer, recompute, None),
        Checkpointing::Selective => (l * (per_layer - core) + core, recompute, None),
        Checkpointing::Full => (l * hidden_state + per_layer, recompute, None),
        Checkpointing::EveryK(k) => {
            let k = (k as f64).clamp(1.0, lp);
            ((l / k).ceil() * hidden_state + k * per_layer, recompute, None)
        }
        Checkpointing::Optimal => optimal(job, br, per_layer, hidden_state, l, held_back),
    }
}

/// The most stages optimal checkpointing solves for: a model this deep is solved in a fraction
/// of a second, and deeper ones over runs of layers.
const MOST_STAGES: u64 = 256;

/// The model's layers as the chain the solver schedules: past [`MOST_STAGES`] layers, runs of
/// adjacent layers are one stage (the solver's work grows with the cube of the stages), a
/// schedule that checkpoints between runs only.
fn layer_chain(job: &Job, br: &Breakdown, per_layer: f64, hidden_state: f64) -> Chain {
    let (model, cfg) = (job.model, &job.train);
    let ForwardFlops { linear: lin, attention: attn, head } = forward_flops(model, cfg);
    let layer_flops = (lin + attn) / model.layers as f64;
    let run = model.layers.div_ceil(MOST_STAGES).max(1);
    Chain {
        input_bytes: hidden_state as u64,
        stages: (0..model.layers.div_ceil(run))
            .map(|i| {
                let k = run.min(model.layers - i * run) as f64;
                Stage {
                    name: format!("layer{}", i * run),
                    forward_time: k * layer_flops,
                    backward_time: 2.0 * k * layer_flops,
                    output_bytes: hidden_state as u64,
                    saved_bytes: (k * per_layer).max(hidden_state) as u64,
                    forward_tmp_bytes: 0,
                    backward_tmp_bytes: 0,
                }
            })
            .collect(),
        loss: Loss { forward_time: head, backward_time: 2.0 * head, saved_bytes: br.logits as u64, ..Loss::default() },
    }
}

/// The fastest checkpointing schedule whose peak fits what the model states and fixed terms
/// leave of the GPU ([`crate::checkpoint`]), or full checkpointing with the reason none fits.
fn optimal(
    job: &Job,
    br: &Breakdown,
    per_layer: f64,
    hidden_state: f64,
    l: f64,
    held_back: f64,
) -> (f64, f64, Option<String>) {
    let (model, gpu, cfg) = (job.model, job.gpu, &job.train);
    let ForwardFlops { linear: lin, attention: attn, head } = forward_flops(model, cfg);
    let forward = lin + attn + head;
    let fixed = br.weights + br.gradients + br.optimizer + br.framework + br.temporary;
    let budget = (gpu.memory_bytes as f64 - fixed - held_back).max(0.0) as u64;
    // Below one layer's input, no schedule can run: say why without asking the solver.
    let floor = (hidden_state * 3.0).max(1.0) as u64;
    let chain = layer_chain(job, br, per_layer, hidden_state);
    // rotor's 500 slots, fewer for deep models so the table stays near 40 MB.
    let n = chain.stages.len() as f64 + 1.0;
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
        // The schedule's peak holds the logits too; report them apart.
        Ok(plan) => (
            (plan.outcome.peak as f64 - br.logits).max(0.0),
            (plan.outcome.time - 3.0 * forward).max(0.0) / forward,
            None,
        ),
        Err(e) => {
            (l * hidden_state + per_layer, (lin + attn) / forward, Some(format!("no checkpointing schedule fits: {e}")))
        }
    }
}

/// Bytes a token a layer that transformers' training forward without its key-value cache
/// keeps beyond the same forward with it, the one its recipes were recorded with
/// (`scripts/validate/step_recipes.py` leaves the config's `use_cache` on); 0 with the cache.
/// The cache moves what SDPA saves where the query, key and value are views of one fused
/// projection's output ([`crate::job::fuses_qkv`]), without checkpointing (transformers turns
/// the cache off under it): with the cache, its update copies the key and the value
/// (`torch.cat` onto an empty `DynamicCache`) and SDPA saves the copies. GPT-2's query is a view
/// of the fused output too, so that output stays either way and the copies come on top:
/// without the cache, two key-value widths fewer. Phi-3's and GPT-NeoX's rotated query and key
/// are new tensors: without the cache SDPA saves the value as a view, keeping the fused output
/// (a query and two key-value widths) and the rotated key where the copies were, a query and a
/// key-value width more. Eager attention's matmuls save copies of their own either way (every
/// eager step recorded both ways had the same peak), and BLOOM has no SDPA path.
pub fn without_cache(model: &Model, cfg: &TrainConfig) -> f64 {
    if cfg.use_cache
        || !crate::job::fuses_qkv(model)
        || cfg.checkpointing != Checkpointing::None
        || cfg.attention == Attention::Eager
    {
        return 0.0;
    }
    let (q, kv) = ((model.heads * model.head_dim) as f64, (model.kv_heads * model.head_dim) as f64);
    let width = activation_width(cfg.precision);
    match model.family {
        Family::Gpt2 => -2.0 * kv * width,
        Family::NeoX => (q + kv) * width,
        _ if model.model_type == "phi3" => (q + kv) * width,
        _ => 0.0,
    }
}

/// The step as transformers' code runs it, by its recorded phases ([`crate::phases`]): the
/// activations, logits and temporaries of the phase that peaks.
fn transformers_phases(m: &mut StageMemory, job: &Job, r: &Recipe, sh: &Share) {
    let (model, cfg) = (job.model, &job.train);
    let (b, s) = (cfg.micro_batch as f64, cfg.seq as f64);
    let br = &mut m.breakdown;
    let checkpointed = cfg.checkpointing == Checkpointing::Full;
    let compiled = compiled_recipe(model, cfg);
    let mut saved = r.saved(model, b, s, model.layers as f64, checkpointed);
    let logit_width = match cfg.head {
        Head::SeqCls => {
            saved.outside = r.outside_without_vocabulary(model, b, s);
            // The classifier's few logits a sequence.
            2.0 / s
        }
        Head::CausalLm | Head::MaskedLm => model.vocab as f64,
    };
    let g = state_bytes_per_param(model.hidden, cfg.precision, cfg.optimizer).gradients;
    // A T5 recipe layer is an encoder and a decoder block; one block is recomputed at a time.
    let blocks = if model.family == Family::T5 { 2.0 } else { 1.0 };
    let parts = StepParts {
        weights: br.weights,
        gradients: br.gradients,
        optimizer_state: br.optimizer,
        optimizer_temp: optimizer_temp(job, sh.trainable),
        inputs: 16.0 * b * s,
        saved,
        tokens: b * s,
        logit_width,
        logit_bytes: if cfg.precision == Precision::Fp32 { 4.0 } else { 2.0 },
        loss_bytes: r.loss_bytes(),
        recomputed_layer: checkpointed.then(|| r.layer_full(model, b, s) / blocks),
        recomputed_layer_attention: if checkpointed { r.layer_full_attention(model, b, s) / blocks } else { 0.0 },
        head_gradient: g * (model.vocab * model.hidden) as f64,
        attention_backward: if cfg.attention == Attention::Eager || !r.has_sdpa() {
            8.0 * b * model.heads as f64 * s * s
        } else {
            0.0
        },
        compiled,
        // The embedding's gradient, made last: tied to the head, it is a new tensor added to
        // the head's gradient — in place in fp32, out of place (one more) in 16 bits.
        embedding_tail: if model.tied_embeddings && cfg.head != Head::SeqCls {
            g * (model.vocab * model.hidden) as f64 * if g < 4.0 { 2.0 } else { 1.0 }
        } else {
            0.0
        },
    };
    let mut ph = phases::phases(&parts);
    // Where transformers' own step was recorded allocation by allocation (every family it
    // runs here, and its compiled steps where recorded), its forward and backward are its
    // moments' peaks.
    if let Some(sr) = step_recipe(model, cfg.precision, cfg.attention, checkpointed, cfg.head, compiled) {
        let base = parts.weights + parts.optimizer_state + parts.inputs;
        // The share of the gradients this GPU holds (ZeRO's shards, offload).
        let whole = g * model.params() as f64;
        let scale = if whole > 0.0 { (parts.gradients / whole).min(1.0) } else { 1.0 };
        (ph.forward, ph.backward) = sr.peaks(model, b, s, model.layers as f64, base, scale);
    }
    // peft's merged expert stacks: every layer's from its forward to its backward, or under
    // checkpointing the one layer's its forward or recomputation makes. The recipes were
    // recorded with the key-value cache on: without it, what each layer keeps in its place.
    let merged = merged_experts(model, cfg, true) * if checkpointed { 1.0 } else { model.layers as f64 };
    let cache = without_cache(model, cfg) * b * s * model.layers as f64;
    for p in [&mut ph.forward, &mut ph.backward] {
        p.activations += merged + cache;
        p.total += merged + cache;
    }
    let (_, peak) = ph.peak();
    br.gradients = peak.gradients;
    br.activations = peak.activations + parts.inputs;
    br.logits = peak.logits;
    br.temporary += peak.temporary;
    let ForwardFlops { linear: lin, attention: attn, head } = forward_flops(model, cfg);
    m.recompute_fraction = if checkpointed { (lin + attn) / (lin + attn + head) } else { 0.0 };
    m.phases = Some(ph);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Optimizer, Precision, TrainConfig};

    /// Optimal checkpointing's work is bounded by the stages it solves, not by the depth asked:
    /// the deepest model a plan lays out is solved over at most [`MOST_STAGES`] runs of layers,
    /// which hold every layer's saved bytes.
    #[test]
    fn the_deepest_model_is_solved_over_runs_of_layers_holding_every_layer() {
        let base = crate::model::preset("llama-3-8b").unwrap();
        let m = Model { layers: 1024, decoder_layers: 1024, hidden: 256, heads: 4, kv_heads: 4, head_dim: 64, ..base };
        let g = crate::gpu::gpu("h100-sxm").unwrap();
        let job = Job::new(&m, &g, TrainConfig::new(8, 512, Precision::Mixed, Optimizer::AdamW)).unwrap();
        let per_layer = 3.0 * (1 << 20) as f64;
        let chain = layer_chain(&job, &Breakdown::default(), per_layer, 1024.0);
        assert_eq!(chain.stages.len() as u64, MOST_STAGES);
        let saved: u64 = chain.stages.iter().map(|s| s.saved_bytes).sum();
        assert_eq!(saved, (1024.0 * per_layer) as u64);
        let shallow = Model { layers: 32, decoder_layers: 32, ..m.clone() };
        let job = Job::new(&shallow, &g, TrainConfig::new(8, 512, Precision::Mixed, Optimizer::AdamW)).unwrap();
        assert_eq!(layer_chain(&job, &Breakdown::default(), per_layer, 1024.0).stages.len(), 32);
    }

    /// T5's blocks at their stacks' own lengths: a decoder as long as the encoder is the job
    /// without `--target-seq`; a decoder of `t` tokens keeps its blocks' tensors at `t` (the
    /// cross-attention's keys and values at the encoder's `s`), its self-attention's scores at
    /// t², and its logits at `t`.
    #[test]
    fn t5_s_decoder_blocks_and_logits_follow_the_decoder_s_length() {
        let t0 = crate::model::preset("t0-3b").unwrap();
        let cfg = |target_seq| TrainConfig {
            attention: Attention::Eager,
            target_seq,
            ..TrainConfig::new(8, 64, Precision::Fp32, Optimizer::AdamW)
        };
        let (none, same, short) = (cfg(None), cfg(Some(64)), cfg(Some(4)));
        assert_eq!(layer_activations(&t0, &none), layer_activations(&t0, &same));
        assert_eq!(logits(&t0, &none), logits(&t0, &same));
        assert_eq!(logits(&t0, &short) * 16.0, logits(&t0, &none));
        let (a, b) = (layer_activations(&t0, &none), layer_activations(&t0, &short));
        assert!(b.kept < a.kept && b.input < a.input && b.core < a.core);
        // The encoder's half of the blocks stays whole.
        assert!(b.input > a.input / 2.0 && b.core > a.core / 2.0);
    }

    /// transformers' phases with and without the key-value cache (`--use-cache`): the recipes
    /// hold the cache's step, and without it the forward's and the backward's peaks move by
    /// every layer's difference in what SDPA saves: GPT-2's key and value copies gone, Phi-3's
    /// and GPT-NeoX's fused output and rotated key kept in their place. Eager attention, BLOOM,
    /// checkpointing and the families whose projections are their own plan either setting alike.
    #[test]
    fn the_phases_plan_the_step_without_the_cache_by_what_sdpa_saves_in_its_place() {
        let g = crate::gpu::gpu("h200").unwrap();
        let phases = |name: &str, attention: Attention, checkpointing: Checkpointing, use_cache: bool| {
            let m = crate::model::preset(name).unwrap();
            let cfg = TrainConfig {
                attention,
                checkpointing,
                use_cache,
                ..TrainConfig::new(2, 1024, Precision::Bf16, Optimizer::AdamW)
            };
            let job = Job::new(&m, &g, cfg).unwrap();
            let ph = memory(&job, PipelineStage::Only, true, 0.0).phases.expect("transformers' phases");
            (ph.forward.total, ph.backward.total)
        };
        let moved = |name: &str, attention: Attention, checkpointing: Checkpointing| {
            let (on, off) =
                (phases(name, attention, checkpointing, true), phases(name, attention, checkpointing, false));
            assert_eq!(off.0 - on.0, off.1 - on.1, "{name}: both phases move alike");
            off.0 - on.0
        };
        let tokens_layers_bytes = |name: &str| {
            let m = crate::model::preset(name).unwrap();
            (2.0 * 1024.0 * m.layers as f64 * 2.0, (m.heads * m.head_dim) as f64, (m.kv_heads * m.head_dim) as f64)
        };
        let (n, _, kv) = tokens_layers_bytes("gpt2-medium");
        assert_eq!(moved("gpt2-medium", Attention::Sdpa, Checkpointing::None), -2.0 * kv * n);
        for name in ["phi-3-mini", "pythia-1b"] {
            let (n, q, kv) = tokens_layers_bytes(name);
            assert_eq!(moved(name, Attention::Sdpa, Checkpointing::None), (q + kv) * n, "{name}");
        }
        for (name, attention, checkpointing) in [
            ("gpt2-medium", Attention::Eager, Checkpointing::None),
            ("gpt2-medium", Attention::Sdpa, Checkpointing::Full),
            ("bloom-7b1", Attention::Eager, Checkpointing::None),
            ("llama-3-8b", Attention::Sdpa, Checkpointing::None),
        ] {
            assert_eq!(moved(name, attention, checkpointing), 0.0, "{name} {attention:?} {checkpointing:?}");
        }
    }
}
