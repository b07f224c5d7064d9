//! The job: a model and a GPU from the catalogs, and what a training run is — precision,
//! optimizer and its implementation, attention kernel, checkpointing, fine-tuning, offload,
//! parallel layout, whose code runs it — checked together once ([`Job::new`]). The top of
//! the planner's floors: it imports only the catalogs (models, GPUs, parallel layouts).

use crate::gpu::GpuSpec;
use crate::model::{Family, Head, Model};
use crate::names::{named, Named};
use crate::parallel::{Parallelism, StageOutputs};
use crate::recording::Recording;

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

/// Which implementation of `torch.optim.AdamW` runs (research/optimizer-step-memory.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptimizerImpl {
    /// One kernel per operation over every parameter at once: torch's default on CUDA; its
    /// square root of the second moments is a copy of the state, alive for the step.
    Foreach,
    /// One fused kernel: no temporaries. transformers' Trainer picks it on torch ≥ 2.8.
    Fused,
    /// One parameter at a time: torch's default elsewhere; two temporaries of the largest.
    ForLoop,
}

named!(OptimizerImpl {
    Foreach => ("foreach", "torch's default on CUDA: a copy of the second moments during the step"),
    Fused => ("fused", "one kernel, no temporaries (transformers' Trainer on torch >= 2.8)"),
    ForLoop => ("for-loop", "one parameter at a time"),
});

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
    /// torchtitan's per-op selective checkpointing (`selective_ac_option = "op"`): keep each
    /// layer's input, the outputs of its attention kernel and of every other matrix multiply
    /// (the first, third, ...); recompute the rest.
    PerOp,
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

impl LoraTargets {
    /// (inputs, outputs) of each linear layer of a block that gets an adapter, as peft wraps
    /// them: a layer transformers fuses is one layer with one adapter, r × (inputs + outputs),
    /// not one for each projection it fuses ([`fused_linears`]). Query and value: the
    /// projections peft targets by default for the family (`q_proj` and `v_proj`; the fused
    /// query-key-value layer where there is one: GPT-2's `c_attn`). A mixture of experts'
    /// MLP is wrapped as [`moe_adapted`] says.
    pub fn adapted(self, model: &Model) -> Vec<(u64, u64)> {
        let linears = fused_linears(model);
        match self {
            LoraTargets::All if model.experts > 1 => linears[..4].iter().copied().chain(moe_adapted(model)).collect(),
            LoraTargets::All => linears,
            LoraTargets::QueryValue if fuses_qkv(model) => vec![linears[0]],
            LoraTargets::QueryValue => vec![linears[0], linears[2]],
        }
    }

    /// (inputs, outputs) of every linear layer of the model that gets an adapter, as peft
    /// wraps them with `head` on top: each block's ([`LoraTargets::adapted`]), and where a
    /// model has more than its blocks' — T5's decoder blocks attend to the encoder's output
    /// through a second set of query, key, value and output projections (`EncDecAttention`,
    /// whose `q` and `v` peft's default targets match too); BERT's masked-LM head has a
    /// transform (`cls.predictions.transform.dense`, h × h) that "all-linear" wraps, its
    /// output layer left out as every family's is.
    pub fn adapters(self, model: &Model, head: Head) -> Vec<(u64, u64)> {
        let block = self.adapted(model);
        let mut out: Vec<(u64, u64)> = (0..model.layers).flat_map(|_| block.iter().copied()).collect();
        match model.family {
            Family::T5 => {
                let attention = &fused_linears(model)[..4];
                let cross = match self {
                    LoraTargets::All => attention.to_vec(),
                    LoraTargets::QueryValue => vec![attention[0], attention[2]],
                };
                out.extend((0..model.decoder_layers).flat_map(|_| cross.iter().copied()));
            }
            Family::Bert if self == LoraTargets::All && head != Head::SeqCls => out.push((model.hidden, model.hidden)),
            _ => {}
        }
        out
    }
}

/// The adapters "all-linear" gives a mixture of experts' MLP under peft 0.21 and transformers
/// 5, as (inputs, outputs) whose sum times the rank is the adapters' parameters. transformers
/// 5 keeps each layer's experts as two stacked weights (`gate_up_proj`, E × 2f × h;
/// `down_proj`, E × h × f) and its router as no `nn.Linear`. For the model types transformers
/// converts as Mixtral's or Qwen2-MoE's (Mixtral and Qwen3-MoE here), peft rewrites the
/// per-expert targets to those stacks: the router's weight gets an adapter (h → E), and each
/// stack one of rank E × r over all its experts, 2E × r for `gate_up_proj` (the gate's and
/// the up projection's ranks summed), so A is (2E r) × h and B 2f × (2E r). Qwen2-MoE's own
/// type is no such conversion's, and "all-linear" wraps its `nn.Linear`s alone: the shared
/// expert's three and its one-wide gate, no routed expert and no router.
fn moe_adapted(model: &Model) -> Vec<(u64, u64)> {
    let (h, f, e) = (model.hidden, model.intermediate, model.experts);
    if model.model_type == "qwen2_moe" {
        let s = model.shared_expert;
        return vec![(h, s), (h, s), (s, h), (h, 1)];
    }
    vec![(h, e), (2 * e * h, 2 * e * 2 * f), (e * f, e * h)]
}

/// Whether transformers computes the block's query, key and value in one linear layer:
/// GPT-2's `c_attn` (a `Conv1D`), GPT-NeoX's and BLOOM's `query_key_value`, Phi-3's `qkv_proj`.
pub fn fuses_qkv(model: &Model) -> bool {
    matches!(model.family, Family::Gpt2 | Family::NeoX | Family::Bloom) || model.model_type == "phi3"
}

/// A block's linear layers as transformers builds them, (inputs, outputs) each: those of
/// [`Model::block_linears`] (query, key, value, output, then the MLP's), with the query, key
/// and value one layer where the family fuses them ([`fuses_qkv`]) and Phi-3's MLP gate and
/// up projections one (`gate_up_proj`).
pub fn fused_linears(model: &Model) -> Vec<(u64, u64)> {
    let l = model.block_linears();
    let (attention, mlp) = l.split_at(4);
    let mut out = if fuses_qkv(model) {
        vec![(attention[0].0, attention[0].1 + attention[1].1 + attention[2].1), attention[3]]
    } else {
        attention.to_vec()
    };
    if model.model_type == "phi3" && model.gated_mlp {
        out.extend(mlp.chunks(3).flat_map(|c| [(c[0].0, c[0].1 + c[1].1), c[2]]));
    } else {
        out.extend_from_slice(mlp);
    }
    out
}

/// How the frozen base of a LoRA run is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BaseWeights {
    /// The training precision's weight width (2 bytes, or 4 for fp32/AMP).
    Native,
    /// bitsandbytes LLM.int8: 1 byte plus a scale per row.
    Int8,
    /// QLoRA's 4-bit NormalFloat (`bnb_4bit_quant_type="nf4"`): 4.127 bits a weight with double
    /// quantization ([`TrainConfig::double_quant`]), 4.5 without.
    Nf4,
    /// bitsandbytes' 4-bit float (`bnb_4bit_quant_type="fp4"`): the same bytes as NF4 (another
    /// 16-value code to the same packed nibbles and absmax).
    Fp4,
}

impl BaseWeights {
    /// Whether bitsandbytes stores the base in 4 bits (QLoRA's `Linear4bit`).
    pub fn four_bit(self) -> bool {
        matches!(self, BaseWeights::Nf4 | BaseWeights::Fp4)
    }
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

/// A training configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainConfig {
    pub micro_batch: u64,
    /// Tokens a sequence: an encoder-decoder's encoder input.
    pub seq: u64,
    /// An encoder-decoder's decoder length (its labels, shifted right into the decoder), where
    /// it is not `seq`: a sequence-to-sequence job's targets are often far shorter than its
    /// inputs. `None`: the decoder as long as the encoder.
    pub target_seq: Option<u64>,
    /// Micro-batches per optimizer step (gradient accumulation; the pipeline's micro-batches).
    pub accumulation: u64,
    pub precision: Precision,
    pub optimizer: Optimizer,
    pub attention: Attention,
    pub checkpointing: Checkpointing,
    pub parallel: Parallelism,
    pub finetune: Finetune,
    pub offload: Offload,
    /// Whose code runs the step: its activations and what each phase keeps.
    pub framework: Framework,
    /// The output layer and loss.
    pub head: Head,
    /// The forward compiled with `torch.compile` (and the backward AOTAutograd derives from
    /// it): what its graphs hold, where recorded (decoders at fp32, bf16 and AMP without
    /// checkpointing, at fp32 with full checkpointing).
    pub compile: bool,
    /// With `compile`, the loss compiled too (torchtitan's `compile.components` with
    /// "loss", its default since April 2025): the cross-entropy fused, keeping the logits and
    /// a log-sum-exp instead of fp32 copies of the logits. torchtitan only.
    pub compile_loss: bool,
    /// AdamW's implementation; `None`: torch's default for the device (foreach on CUDA).
    pub optimizer_impl: Option<OptimizerImpl>,
    /// A 4-bit LoRA base's `bnb_4bit_use_double_quant`: each block's absmax quantized again to
    /// a byte, with an fp32 absmax per 256 of them (QLoRA's setup, the default), or kept in
    /// fp32, one a block of 64. Read only with a 4-bit base ([`BaseWeights::four_bit`]).
    pub double_quant: bool,
    /// transformers' `config.use_cache` in the training forward: on (every causal LM's config
    /// default, which a script that does not set `model.config.use_cache = False` trains with),
    /// its forward builds a `DynamicCache` and copies each layer's key and value into it. Under
    /// gradient checkpointing transformers turns it off whatever is set. It moves a peak where
    /// the query, key and value are one fused projection ([`fuses_qkv`]); elsewhere a copy only
    /// stands in for what it copies.
    pub use_cache: bool,
    /// How long the training loop keeps the step's `loss`, and with it what the loss's autograd
    /// graph holds after the backward (under checkpointing with peft, the input embeddings' output
    /// that `enable_input_require_grads` makes require a gradient, and its `.grad`; T5's zero
    /// position bias). Read by transformers' recorded step, where its template keeps such tensors.
    pub loss_lives: LossLife,
    /// The model built from its config on the GPU (transformers' `from_config` under
    /// `torch.device("cuda")`), where `from_pretrained` builds it on the meta device and loads
    /// the weights: `nn.Linear` makes a tied output layer's own weight after the model's last
    /// weight, and tying the embeddings frees it, which moves where the step's segments fall.
    /// Read by transformers' step program; off by default (a model loaded).
    pub built_on_device: bool,
}

/// How long a training loop keeps the step's `loss` tensor (and so its autograd graph, and what
/// that graph holds after `loss.backward()`): the loop, not the model, decides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LossLife {
    /// transformers' `Trainer.training_step` (and TRL's trainers, which run it) returns
    /// `loss.detach()`: the loss goes as each micro-batch's backward ends, before the optimizer
    /// step, as in a loop that runs `del loss` after `loss.backward()`.
    #[default]
    Trainer,
    /// A step function that returns `loss.item()`: the loss lives through the optimizer step and
    /// `zero_grad`, and goes as the function returns (between its micro-batches, when the next
    /// forward's loss replaces it).
    Function,
    /// A plain loop body, `loss = model(**batch).loss; loss.backward(); opt.step();
    /// opt.zero_grad()`: the loss lives on through the next step's forward, until that
    /// forward's loss replaces it, and the last goes as the loop ends.
    Inline,
}

/// Whose code runs a training step. [`Framework::Auto`] is a request, not an answer: the
/// program builder that runs the job ([`crate::builders`]) names the framework it models, and
/// the estimate reports that one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framework {
    /// Hugging Face transformers (with the Trainer, Accelerate, DeepSpeed or FSDP) where it
    /// can run the job — one model replica per GPU, full fine-tuning, no or full
    /// checkpointing — and Megatron-LM otherwise; DeepSpeed with CPU offload.
    Auto,
    /// transformers' own modelling code: its activation recipes and the step's phases ([`crate::phases`]).
    HuggingFace,
    /// DeepSpeed's ZeRO engine over transformers' modelling code, at DeepSpeed's default
    /// buckets ([`super::deepspeed`]); what `--offload` implies.
    DeepSpeed,
    /// Megatron-LM's fused kernels: Korthikanti et al.'s activations, all terms at once.
    Megatron,
    /// torchtitan: PyTorch's FSDP2, tensor, pipeline and context parallelism over its
    /// Llama code ([`crate::builders::fsdp2`]); where that program does not serve, Megatron's
    /// accounting of the layers with torchtitan's loss — the bf16 logits upcast for
    /// `cross_entropy` and deleted before the backward (its `train.py`), so the peak holds
    /// log-softmax's fp32 output, its gradient and the gradient of its input: 12 bytes a
    /// logit, not transformers' 16.
    Torchtitan,
}

named!(Framework {
    Auto => ("auto", "Hugging Face transformers where it can run the job, Megatron-LM otherwise, DeepSpeed with --offload"),
    HuggingFace => ("hf", "Hugging Face transformers"),
    DeepSpeed => ("deepspeed", "DeepSpeed's ZeRO engine over transformers (implied by --offload)"),
    Megatron => ("megatron", "Megatron-LM"),
    Torchtitan => ("torchtitan", "torchtitan (PyTorch's FSDP2, TP, PP and CP)"),
});

named!(LossLife {
    Trainer => ("trainer", "transformers' Trainer and TRL's trainers (training_step returns loss.detach()), or a loop that runs del loss after loss.backward(): freed as each backward ends"),
    Function => ("function", "a step function that returns loss.item(): freed as it returns, after the optimizer step and zero_grad"),
    Inline => ("inline", "a loop body loss = model(**batch).loss; loss.backward(); opt.step(); opt.zero_grad(): held through the next forward, until the next loss replaces it"),
});

named!(Precision {
    Mixed => ("mixed", "16-bit weights and gradients, fp32 master copy in the optimizer"),
    Amp => ("amp", "torch.autocast: fp32 weights, 16-bit activations"),
    Bf16 => ("bf16", "everything bf16, optimizer states included"),
    Fp32 => ("fp32", "everything fp32"),
    Fp8 => ("fp8", "fp8 linears (Hopper, Ada, Blackwell, MI300): Transformer Engine; under torchtitan torchao's float8 with its fp8 all-gather"),
});

named!(Optimizer {
    AdamW => ("adamw", ""),
    Sgd => ("sgd", ""),
    SgdMomentum => ("sgd-momentum", ""),
    Adafactor => ("adafactor", ""),
    Adam8bit => ("adam8bit", "bitsandbytes 8-bit Adam"),
});

named!(Attention {
    Eager => ("eager", "materialises the scores"),
    Sdpa => ("sdpa", "torch's scaled_dot_product_attention"),
    Flash => ("flash", "FlashAttention"),
});

named!(LoraTargets {
    All => ("all", "every linear layer"),
    QueryValue => ("qv", "the query and value projections"),
});

named!(BaseWeights {
    Native => ("native", "the training precision's width"),
    Int8 => ("int8", "bitsandbytes LLM.int8"),
    Nf4 => ("nf4", "QLoRA's NormalFloat4"),
    Fp4 => ("fp4", "bitsandbytes' 4-bit float, stored as NF4 is"),
});

impl Named for Offload {
    const ALL: &'static [Self] = &[Offload::None, Offload::Optimizer, Offload::OptimizerAndParams];
    fn name(self) -> &'static str {
        match self {
            Offload::None => "none",
            Offload::Optimizer => "optimizer",
            Offload::OptimizerAndParams => "optimizer+params",
        }
    }
    fn arg(self) -> &'static str {
        match self {
            Offload::OptimizerAndParams => "params",
            other => other.name(),
        }
    }
    fn help(self) -> &'static str {
        match self {
            Offload::None => "",
            Offload::Optimizer => "the optimizer state, master weights and gradients",
            Offload::OptimizerAndParams => "the optimizer and the parameters (needs --zero 3)",
        }
    }
}

impl TrainConfig {
    /// One GPU, full fine-tuning, no offload, default coefficients.
    pub fn new(micro_batch: u64, seq: u64, precision: Precision, optimizer: Optimizer) -> TrainConfig {
        TrainConfig {
            micro_batch,
            seq,
            target_seq: None,
            accumulation: 1,
            precision,
            optimizer,
            attention: Attention::Sdpa,
            checkpointing: Checkpointing::None,
            parallel: Parallelism::default(),
            finetune: Finetune::Full,
            offload: Offload::None,
            framework: Framework::Auto,
            head: Head::CausalLm,
            compile: false,
            compile_loss: false,
            optimizer_impl: None,
            double_quant: true,
            use_cache: true,
            loss_lives: LossLife::Trainer,
            built_on_device: false,
        }
    }

    /// Whether `model` can train this way on `gpu`; the reason if not. [`Job::new`] checks
    /// this and the rules that need the model's shape.
    pub fn check(&self, model: &Model, gpu: &GpuSpec) -> Result<(), crate::InvalidConfig> {
        self.why_not(model, gpu).map_err(crate::InvalidConfig)
    }

    fn why_not(&self, model: &Model, gpu: &GpuSpec) -> Result<(), String> {
        if self.micro_batch == 0 || self.seq == 0 || self.accumulation == 0 {
            return Err("micro-batch, sequence length and accumulation must be positive".into());
        }
        if self.micro_batch.checked_mul(self.seq).is_none_or(|t| t > MOST_TOKENS) {
            return Err(format!(
                "a micro-batch of {} × {} tokens is more than 2^32 tokens: no GPU holds that",
                self.micro_batch, self.seq
            ));
        }
        if self.micro_batch.checked_mul(self.accumulation).and_then(|x| x.checked_mul(self.parallel.data)).is_none() {
            return Err(format!(
                "the global batch, {} × {} accumulated × {} data-parallel GPUs, is more than 2^64 sequences",
                self.micro_batch, self.accumulation, self.parallel.data
            ));
        }
        if let Some(t) = self.target_seq {
            if model.family != Family::T5 {
                return Err(format!(
                    "--target-seq {t}: the decoder's length of an encoder-decoder model, and {} is {} (one stack, \
                     whose length is --seq)",
                    model.name,
                    if model.family == Family::Bert { "an encoder" } else { "a decoder" }
                ));
            }
            if t == 0 {
                return Err("--target-seq must be positive".into());
            }
            if self.micro_batch.checked_mul(t).is_none_or(|n| n > MOST_TOKENS) {
                return Err(format!(
                    "a micro-batch of {} × {t} decoder tokens is more than 2^32 tokens: no GPU holds that",
                    self.micro_batch
                ));
            }
        }
        let torchtitan = self.framework == Framework::Torchtitan;
        self.parallel.why_not(model, self.seq, !torchtitan)?;
        if self.parallel.replicate > 1 && !torchtitan {
            return Err("HSDP replicas (--dp-replicate) are planned under --framework torchtitan".into());
        }
        if torchtitan && self.parallel.zero_stage == 1 {
            return Err("torchtitan has no ZeRO stage 1: its data parallelism is FSDP2 (--zero 3, or --zero 2 for \
                        reshard_after_forward=False) or replicas (--zero 0)"
                .into());
        }
        let schedule = self.parallel.pipeline_schedule();
        if schedule.zero_bubble() && !torchtitan {
            return Err(format!(
                "the {} schedule is PyTorch's (torch.distributed.pipelining): plan it with --framework torchtitan",
                schedule.class()
            ));
        }
        if torchtitan && schedule.looped() {
            crate::pipelining::microbatches_per_round(self.parallel.pipeline, self.accumulation)?;
        }
        if self.parallel.stage_outputs != StageOutputs::None {
            if self.parallel.pipeline == 1 {
                return Err("--pp-outputs needs more than one pipeline stage (--pp)".into());
            }
            if !torchtitan {
                return Err("--pp-outputs is PyTorch's pipelining, as torchtitan runs it: add --framework torchtitan \
                            (the other frameworks' pipelines are planned in closed form)"
                    .into());
            }
        }
        if self.compile_loss && !self.compile {
            return Err("the loss is compiled only with the model (torch.compile)".into());
        }
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
        if let Checkpointing::EveryK(0) = self.checkpointing {
            return Err("--checkpoint every-K needs K of at least 1".into());
        }
        if let Finetune::Lora { rank, .. } = self.finetune {
            if rank == 0 {
                return Err("the LoRA rank must be positive".into());
            }
            let smallest = model.block_linears().iter().map(|&(i, o)| i.min(o)).min().unwrap_or(0);
            if rank > smallest {
                return Err(format!(
                    "--lora-rank {rank} is more than the smallest adapted dimension, {smallest} (a full-rank update)"
                ));
            }
        }
        if model.learned_positions() && self.seq > model.max_position {
            return Err(format!(
                "--seq {}: {} has {} learned positions, and no sequence may be longer",
                self.seq, model.name, model.max_position
            ));
        }
        Ok(())
    }

    /// Whether DeepSpeed's ZeRO engine runs the job: asked for, or implied by CPU offload
    /// (ZeRO-Offload is DeepSpeed's; the other engines' offload is planned with their name).
    pub fn deepspeed(&self) -> bool {
        self.framework == Framework::DeepSpeed || (self.framework == Framework::Auto && self.offload != Offload::None)
    }

    /// An encoder-decoder's decoder length: `--target-seq`, or the encoder's where not given.
    pub fn decoder_seq(&self) -> u64 {
        self.target_seq.unwrap_or(self.seq)
    }

    /// Whether the job's decoder is a length of its own, not the encoder's.
    pub fn decoder_length_apart(&self) -> bool {
        self.target_seq.is_some_and(|t| t != self.seq)
    }

    /// Sequences per optimizer step over all data-parallel replicas.
    pub fn global_batch(&self) -> u64 {
        self.micro_batch.saturating_mul(self.accumulation).saturating_mul(self.parallel.data)
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
    /// A pipeline rank holding neither the first nor the last stage (torchtitan's plan
    /// of every rank can find the peak there).
    Middle,
}

named!(PipelineStage {
    Only => ("only", ""),
    First => ("first", ""),
    Last => ("last", ""),
    Middle => ("middle", ""),
});

/// The most tokens a micro-batch, a sequence or a serving step may have. Bytes are counted in
/// 64 bits, and attention's sequence² × heads × 4 bytes passes 2^64 not far beyond; no GPU
/// holds even the hidden states of 2^32 tokens (32 TiB at 4096 × 2 bytes each).
pub const MOST_TOKENS: u64 = 1 << 32;

/// A training job: the model, the GPU and how it trains, checked together. Every function
/// of the planner that needs all three takes the job; a `Job` exists only once its
/// settings passed every rule ([`Job::new`]), so the planner's rooms below it assume them.
#[derive(Clone, Copy, Debug)]
pub struct Job<'a> {
    pub model: &'a Model,
    pub gpu: &'a GpuSpec,
    pub train: TrainConfig,
    /// The user's own step program, where the job brings one (`--program`): it is replayed as
    /// recorded ([`crate::builders::recorded`]).
    pub recording: Option<&'a Recording>,
}

impl<'a> Job<'a> {
    /// The job, if `model` can train as `train` says on `gpu`; the reason if not.
    pub fn new(model: &'a Model, gpu: &'a GpuSpec, train: TrainConfig) -> Result<Job<'a>, crate::InvalidConfig> {
        train.check(model, gpu)?;
        Ok(Job { model, gpu, train, recording: None })
    }

    /// The same model and GPU trained as `train` says, checked again.
    pub fn with(&self, train: TrainConfig) -> Result<Job<'a>, crate::InvalidConfig> {
        Ok(Job { recording: self.recording, ..Job::new(self.model, self.gpu, train)? })
    }

    /// Bytes the process holds on the GPU outside PyTorch's allocator: the driver's own, the
    /// CUDA context, and NCCL's buffers with more than one GPU.
    pub fn outside_allocator(&self) -> f64 {
        let arch = self.gpu.arch;
        arch.driver_reserved_bytes() as f64
            + arch.training_context_bytes() as f64
            + if self.train.parallel.gpus() > 1 { crate::parallel::NCCL_BYTES } else { 0.0 }
    }

    /// What PyTorch's caching allocator can have of the GPU: its memory less what lives
    /// outside the allocator.
    pub fn capacity(&self) -> u64 {
        (self.gpu.memory_bytes as f64 - self.outside_allocator()).max(0.0) as u64
    }
}

/// Where the program runs.
#[derive(Clone, Copy, Debug)]
pub enum Device<'a> {
    /// A GPU: its kernels' own buffers, cuBLAS workspaces, its SDPA kernels.
    Gpu(&'a GpuSpec),
    /// The CPU the templates were recorded on, as the CPU ground truth measures it.
    Cpu,
}

impl TrainConfig {
    /// The implementation of AdamW that runs when none is named: Megatron-LM's and
    /// DeepSpeed's own fused Adam; torch.optim's foreach on CUDA tensors and its for-loop
    /// elsewhere.
    pub fn optimizer_implementation(&self, device: Device) -> OptimizerImpl {
        self.optimizer_impl.unwrap_or(match (self.framework, device) {
            (Framework::Megatron | Framework::DeepSpeed, _) => OptimizerImpl::Fused,
            (_, Device::Gpu(_)) => OptimizerImpl::Foreach,
            (_, Device::Cpu) => OptimizerImpl::ForLoop,
        })
    }
}

impl Checkpointing {
    /// The policy `--checkpoint` names: none, full, selective, per-op, every-K or optimal.
    pub fn parse(s: &str) -> Result<Checkpointing, String> {
        Ok(match s {
            "none" => Checkpointing::None,
            "full" => Checkpointing::Full,
            "selective" => Checkpointing::Selective,
            "per-op" => Checkpointing::PerOp,
            "optimal" => Checkpointing::Optimal,
            other => match other.strip_prefix("every-").map(str::parse::<u64>) {
                Some(Ok(k)) if k > 0 => Checkpointing::EveryK(k),
                _ => return Err(format!("{other:?}: expected none, full, selective, per-op, every-K or optimal")),
            },
        })
    }

    /// Its name, as `--checkpoint` and `--json` spell it.
    pub fn spelling(self) -> String {
        match self {
            Checkpointing::None => "none".into(),
            Checkpointing::Full => "full".into(),
            Checkpointing::Selective => "selective".into(),
            Checkpointing::PerOp => "per-op".into(),
            Checkpointing::EveryK(k) => format!("every-{k}"),
            Checkpointing::Optimal => "optimal".into(),
        }
    }
}

impl Finetune {
    /// Its name, as `--finetune` and `--json` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Finetune::Full => "full",
            Finetune::Lora { base: BaseWeights::Nf4 | BaseWeights::Fp4, .. } => "qlora",
            Finetune::Lora { base: BaseWeights::Int8, .. } => "lora-int8",
            Finetune::Lora { .. } => "lora",
        }
    }
}
