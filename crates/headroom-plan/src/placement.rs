//! Parameter placement: what of the model one GPU holds — its pipeline stage's layers over
//! tensor parallelism, what trains and what is frozen (LoRA), and the bytes of weights,
//! gradients and optimizer state under ZeRO sharding and offload.

use crate::bnb::{quantized_linears, Bnb, ComputeDtype, QuantType};
use crate::job::{BaseWeights, Finetune, Framework, Offload, Optimizer, PipelineStage, Precision, TrainConfig};
use crate::model::{Head, Model};
use crate::parallel::Parallelism;

/// Weights, gradients and optimizer state: bytes per parameter, or bytes per GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ModelStates {
    pub weights: f64,
    pub gradients: f64,
    /// Optimizer state, with the fp32 master weights where the precision keeps them.
    pub optimizer: f64,
}

impl ModelStates {
    pub fn total(&self) -> f64 {
        self.weights + self.gradients + self.optimizer
    }
}

/// Bytes per parameter of weights, gradients and optimizer state, unsharded.
pub fn state_bytes_per_param(hidden: u64, precision: Precision, optimizer: Optimizer) -> ModelStates {
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
    ModelStates { weights: w, gradients: g, optimizer: master + states }
}

/// Weights, gradients and optimizer bytes per GPU for `params` trainable
/// parameters under the ZeRO stage (1 shards the optimizer state over the
/// data- and context-parallel GPUs, 2 also the gradients, 3 also the weights)
/// and offload.
pub fn model_states(params: u64, hidden: u64, cfg: &TrainConfig) -> ModelStates {
    let ModelStates { weights: w, gradients: g, optimizer: o } =
        state_bytes_per_param(hidden, cfg.precision, cfg.optimizer);
    let g = if main_grads_fp32(cfg) { 4.0 } else { g };
    let par = &cfg.parallel;
    let n = par.shard_degree() as f64;
    let shard = |stage: u8| if par.zero_stage >= stage { n } else { 1.0 };
    let psi = params as f64;
    let weights = if cfg.offload == Offload::OptimizerAndParams { 0.0 } else { w * psi / shard(3) };
    let (gradients, optimizer) = match cfg.offload {
        Offload::None => (g * psi / shard(2), o * psi / shard(1)),
        Offload::Optimizer | Offload::OptimizerAndParams => (0.0, 0.0),
    };
    ModelStates { weights, gradients, optimizer }
}

/// Whether gradients are kept in fp32 beside 16-bit weights: Megatron-LM accumulates and
/// reduces bf16 training's gradients in fp32 "main grads" (it forces
/// `accumulate_allreduce_grads_in_fp32` with `--bf16`), and its distributed optimizer
/// shards the fp32 master weights and Adam's states but not those gradients: 18 bytes a
/// parameter, 6 + 12/d with the distributed optimizer over d GPUs, where DeepSpeed's ZeRO
/// keeps 16 and 4 + 12/d (Megatron-LM's README, "Distributed optimizer").
/// Only for runs Megatron-LM makes: full training, its plain data parallelism or its
/// distributed optimizer (ZeRO-1); ZeRO-2/3 and LoRA jobs are DeepSpeed's, FSDP's or peft's.
pub fn main_grads_fp32(cfg: &TrainConfig) -> bool {
    cfg.framework == Framework::Megatron
        && cfg.finetune == Finetune::Full
        && cfg.parallel.zero_stage <= 1
        && matches!(cfg.precision, Precision::Mixed | Precision::Fp8)
}

pub fn activation_width(p: Precision) -> f64 {
    if p == Precision::Fp32 {
        4.0
    } else {
        2.0
    }
}

/// The GPU's share of the model: parameters on its pipeline stage ÷ tensor
/// parallelism, split into what trains and what is frozen.
pub struct Share {
    /// Parameters with gradients and optimizer state.
    pub trainable: f64,
    /// Frozen parameters stored at the base width (LoRA's quantizable linears).
    pub frozen_linear: f64,
    /// Frozen parameters at the training width (embeddings and norms under LoRA).
    pub frozen_other: f64,
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
        PipelineStage::Middle => layers * model.layer_params() as f64,
    }) / t
}

pub fn share(model: &Model, cfg: &TrainConfig, stage: PipelineStage) -> Share {
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
            let adapters = match stage {
                PipelineStage::Only => {
                    targets.adapters(model, cfg.head).iter().map(|&(i, o)| rank * (i + o)).sum::<u64>() as f64 / t
                }
                _ => layers * targets.adapted(model).iter().map(|&(i, o)| rank * (i + o)).sum::<u64>() as f64 / t,
            };
            let linear = layers * linears.iter().map(|&(i, o)| i * o).sum::<u64>() as f64 / t;
            Share { trainable: adapters, frozen_linear: linear.min(all), frozen_other: (all - linear).max(0.0) }
        }
    }
}

/// bitsandbytes' format of a quantized LoRA base, as peft's recipes load it: LLM.int8(), or
/// QLoRA's 4 bits (NF4 or FP4, with or without double quantization) and bf16 compute.
pub fn base_format(cfg: &TrainConfig) -> Option<Bnb> {
    let four_bit =
        |quant_type| Bnb::FourBit { quant_type, double_quant: cfg.double_quant, compute: ComputeDtype::Bf16 };
    match cfg.finetune {
        Finetune::Lora { base: BaseWeights::Int8, .. } => Some(Bnb::Int8),
        Finetune::Lora { base: BaseWeights::Nf4, .. } => Some(four_bit(QuantType::Nf4)),
        Finetune::Lora { base: BaseWeights::Fp4, .. } => Some(four_bit(QuantType::Fp4)),
        _ => None,
    }
}

/// Bytes per frozen parameter: (the linear layers', the others'). A quantized base's linear
/// layers are as bitsandbytes stores them ([`Bnb::stored_bytes`]: NF4 with double
/// quantization is 4.127 bits a weight, QLoRA §3), averaged over the model's linears; peft's
/// prepare_model_for_kbit_training casts what it does not quantize (embeddings, norms, the
/// head) to fp32.
pub fn frozen_width(model: &Model, cfg: &TrainConfig) -> (f64, f64) {
    let native = match cfg.precision {
        Precision::Fp32 | Precision::Amp => 4.0,
        _ => 2.0,
    };
    match base_format(cfg) {
        Some(format) => {
            let linears = quantized_linears(model);
            let elements: u64 = linears.iter().map(|&(k, n)| k * n).sum();
            let stored: f64 = linears.iter().map(|&(k, n)| format.stored_bytes(k, n)).sum();
            (stored / elements.max(1) as f64, 4.0)
        }
        None => (native, native),
    }
}

pub fn frozen_bytes(model: &Model, share: &Share, cfg: &TrainConfig) -> f64 {
    let (base, other) = frozen_width(model, cfg);
    share.frozen_linear * base + share.frozen_other * other
}

/// The parameter tensors one GPU's optimizer steps over on `stage`, as element counts in the
/// order it walks them: each layer's trained linears (or LoRA's two adapter matrices per
/// adapted linear) and the rest of the layer, then the tables outside the layers. They add up
/// to the stage's trainable share over the GPUs ZeRO shards the optimizer's work across: the
/// sizes the per-parameter temporaries of an optimizer step follow.
pub fn updated_tensors(model: &Model, cfg: &TrainConfig, stage: PipelineStage) -> Vec<f64> {
    let sh = share(model, cfg, stage);
    let par = &cfg.parallel;
    let layers = match stage {
        PipelineStage::Only => model.layers,
        _ => model.layers.div_ceil(par.pipeline.max(1)),
    };
    let linears = model.block_linears();
    let adapters = |linears: &[(u64, u64)], rank: u64| -> Vec<f64> {
        linears.iter().flat_map(|&(i, o)| [(rank * i) as f64, (rank * o) as f64]).collect()
    };
    let mut out: Vec<f64> = match cfg.finetune {
        Finetune::Full => {
            let linear: u64 = linears.iter().map(|&(i, o)| i * o).sum();
            let mut v: Vec<f64> = linears.iter().map(|&(i, o)| (i * o) as f64).collect();
            v.push(model.layer_params().saturating_sub(linear) as f64);
            (0..layers).flat_map(|_| v.iter().copied()).collect()
        }
        Finetune::Lora { rank, targets, .. } if stage == PipelineStage::Only => {
            adapters(&targets.adapters(model, cfg.head), rank)
        }
        Finetune::Lora { rank, targets, .. } => {
            let v = adapters(&targets.adapted(model), rank);
            (0..layers).flat_map(|_| v.iter().copied()).collect()
        }
    };
    let in_layers: f64 = out.iter().sum();
    let t = par.tensor.max(1) as f64;
    // What trains outside the layers: the embedding, the head, the final norm.
    let outside = sh.trainable * t - in_layers;
    if outside > 0.0 {
        out.push(outside);
    }
    let shard = if par.zero_stage >= 1 { par.shard_degree() as f64 } else { 1.0 };
    let total: f64 = out.iter().sum();
    let scale = if total > 0.0 { sh.trainable / shard / total } else { 0.0 };
    out.retain(|&x| x > 0.0);
    out.iter().map(|x| x * scale).collect()
}

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
