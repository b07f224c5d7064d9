//! What a user asks for, before the planner's defaults and rules: each field one setting as the
//! command line (or a library caller) gives it, `None` where it was left to the planner.
//! [`TrainRequest::resolve`] and [`InferRequest::resolve`] fill in the defaults that depend on
//! other settings (torchtitan shards over every data-parallel GPU; `--vpp` picks the
//! interleaved schedule; QLoRA stores its base in NF4; vLLM's batch limits follow the GPU)
//! and check the rules of the domain, so that every caller gets the same job the command
//! line gets. Flags that belong to the other mode are the command line's to refuse.

use crate::bnb::{Bnb, ComputeDtype, QuantType};
use crate::engine::Engine;
use crate::gpu::GpuSpec;
use crate::infer::{InferConfig, Runtime, WeightFormat};
use crate::job::{
    Attention, BaseWeights, Checkpointing, Finetune, Framework, Job, LoraTargets, LossLife, Offload, Optimizer,
    OptimizerImpl, Precision, TrainConfig, MOST_TOKENS,
};
use crate::model::{Head, Model};
use crate::names::{named, Named};
use crate::parallel::{Parallelism, PipelineSchedule, StageOutputs};
use crate::recording::Recording;
use crate::sglang::Sglang;
use crate::InvalidConfig;

/// Full fine-tuning, or adapters over a frozen base (QLoRA's in NF4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FinetuneMode {
    #[default]
    Full,
    Lora,
    Qlora,
}

named!(FinetuneMode {
    Full => ("full", "every parameter trains"),
    Lora => ("lora", "LoRA adapters over a frozen base"),
    Qlora => ("qlora", "LoRA over a 4-bit NF4 base"),
});

/// What `torch.compile` compiles: torchtitan's `compile.components`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Compile {
    /// Eager.
    #[default]
    Off,
    /// The model's blocks and the loss.
    All,
    /// The model's blocks; the loss runs eagerly (torchtitan's setting).
    Model,
}

named!(Compile {
    Off => ("off", "eager"),
    All => ("all", "the blocks and the loss"),
    Model => ("model", "the blocks alone, the loss eager (torchtitan)"),
});

/// A training job as asked for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainRequest {
    pub micro_batch: u64,
    pub seq: u64,
    /// An encoder-decoder's decoder length [default: `seq`].
    pub target_seq: Option<u64>,
    pub accumulation: u64,
    /// GPUs in the job; data parallelism is what tensor × pipeline × context leaves.
    pub gpus: u64,
    pub tensor: u64,
    pub pipeline: u64,
    pub context: u64,
    /// Model chunks per pipeline stage [default: 1, or 2 with a looped schedule].
    pub virtual_stages: Option<u64>,
    /// [default: 1F1B, or interleaved 1F1B with more than one chunk per stage].
    pub schedule: Option<PipelineSchedule>,
    pub stage_outputs: Option<StageOutputs>,
    pub sequence_parallel: bool,
    pub tp_comm_overlap: bool,
    /// [default: 0, or 3 under torchtitan with more than one GPU to shard over].
    pub zero: Option<u8>,
    pub replicate: u64,
    pub finetune: FinetuneMode,
    /// [default: 16].
    pub lora_rank: Option<u64>,
    /// [default: every linear layer].
    pub lora_targets: Option<LoraTargets>,
    /// [default: the training width; NF4 for QLoRA].
    pub base_weights: Option<BaseWeights>,
    /// A 4-bit base's double quantization [default: on, QLoRA's].
    pub double_quant: Option<bool>,
    /// transformers' `config.use_cache` in the training forward [default: on, transformers'].
    pub use_cache: Option<bool>,
    /// How long the training loop keeps the step's `loss` [default: transformers' `Trainer`'s,
    /// freed as each backward ends].
    pub loss_lives: Option<LossLife>,
    /// The model built from its config on the GPU (`from_config` under `torch.device("cuda")`)
    /// [default: off, a model loaded].
    pub built_on_device: Option<bool>,
    pub offload: Offload,
    pub precision: Precision,
    pub optimizer: Optimizer,
    pub optimizer_impl: Option<OptimizerImpl>,
    pub attention: Attention,
    pub framework: Framework,
    pub head: Head,
    pub checkpointing: Checkpointing,
    pub compile: Compile,
}

impl Default for TrainRequest {
    fn default() -> Self {
        TrainRequest {
            micro_batch: 1,
            seq: 2048,
            target_seq: None,
            accumulation: 1,
            gpus: 1,
            tensor: 1,
            pipeline: 1,
            context: 1,
            virtual_stages: None,
            schedule: None,
            stage_outputs: None,
            sequence_parallel: true,
            tp_comm_overlap: false,
            zero: None,
            replicate: 1,
            finetune: FinetuneMode::Full,
            lora_rank: None,
            lora_targets: None,
            base_weights: None,
            double_quant: None,
            use_cache: None,
            loss_lives: None,
            built_on_device: None,
            offload: Offload::None,
            precision: Precision::Mixed,
            optimizer: Optimizer::AdamW,
            optimizer_impl: None,
            attention: Attention::Sdpa,
            framework: Framework::Auto,
            head: Head::CausalLm,
            checkpointing: Checkpointing::None,
            compile: Compile::Off,
        }
    }
}

fn refuse<T>(why: impl Into<String>) -> Result<T, InvalidConfig> {
    Err(InvalidConfig(why.into()))
}

impl TrainRequest {
    /// The job this request describes for `model` on `gpu`, with the defaults that depend on
    /// the other settings filled in, checked by every rule ([`Job::new`]).
    pub fn resolve<'a>(&self, model: &'a Model, gpu: &'a GpuSpec) -> Result<Job<'a>, InvalidConfig> {
        Job::new(model, gpu, self.config()?)
    }

    /// The job that replays `recording`: this request's shape (one recorded, or any where the
    /// recording's laws were fitted from shapes that vary towards it), GPU and GPUs (the recording is one rank's step; NCCL's buffers are added outside the allocator), and its layer checkpointing (`full` or `every-k`, made of the recording by
    /// [`crate::recompute`]), and nothing else of it. Every other setting that shapes a program
    /// is the recording's own, so a request that sets one is refused by the flag's name.
    pub fn resolve_recorded<'a>(
        &self,
        model: &'a Model,
        gpu: &'a GpuSpec,
        recording: &'a Recording,
    ) -> Result<Job<'a>, InvalidConfig> {
        let d = TrainRequest::default();
        let r = self;
        let set = [
            ("--target-seq", r.target_seq.is_some()),
            ("--accumulation", r.accumulation != d.accumulation),
            ("--tp", r.tensor != d.tensor),
            ("--pp", r.pipeline != d.pipeline),
            ("--cp", r.context != d.context),
            ("--vpp", r.virtual_stages.is_some()),
            ("--pp-schedule", r.schedule.is_some()),
            ("--pp-outputs", r.stage_outputs.is_some()),
            ("--no-sequence-parallel", r.sequence_parallel != d.sequence_parallel),
            ("--tp-comm-overlap", r.tp_comm_overlap),
            ("--zero", r.zero.is_some()),
            ("--dp-replicate", r.replicate != d.replicate),
            ("--finetune", r.finetune != d.finetune),
            ("--lora-rank", r.lora_rank.is_some()),
            ("--lora-targets", r.lora_targets.is_some()),
            ("--base-weights", r.base_weights.is_some()),
            ("--offload", r.offload != d.offload),
            ("--precision", r.precision != d.precision),
            ("--optimizer", r.optimizer != d.optimizer),
            ("--optimizer-impl", r.optimizer_impl.is_some()),
            ("--attention", r.attention != d.attention),
            ("--framework", r.framework != d.framework),
            ("--head", r.head != d.head),
            (
                "--checkpoint",
                !matches!(r.checkpointing, Checkpointing::None | Checkpointing::Full | Checkpointing::EveryK(_)),
            ),
            ("--compile", r.compile != d.compile),
            ("--use-cache", r.use_cache.is_some()),
            ("--loss-lives", r.loss_lives.is_some()),
            ("--built-on-device", r.built_on_device.is_some()),
        ];
        if let Some((flag, _)) = set.iter().find(|(_, given)| *given) {
            return Err(InvalidConfig(format!(
                "{flag} shapes the step program, and --program {} brings its own: record the step with that \
                 setting instead (python -m headroom_gpu record), or leave out --program",
                recording.path
            )));
        }
        if recording.inference() && r.checkpointing != Checkpointing::None {
            return Err(InvalidConfig(format!(
                "--checkpoint frees a layer's saved activations for the backward to make again, and --program {} is \
                 inference (its steps are forwards, without a backward): there is nothing to recompute; leave out \
                 --checkpoint",
                recording.path
            )));
        }
        if let Some(why) = recording.refuses_shape(r.micro_batch, r.seq) {
            return Err(InvalidConfig(why));
        }
        let job = self.resolve(model, gpu)?;
        Ok(Job { recording: Some(recording), ..job })
    }

    /// The training configuration, before the rules that need the model and the GPU.
    pub fn config(&self) -> Result<TrainConfig, InvalidConfig> {
        let r = self;
        if r.micro_batch.checked_mul(r.seq).is_none_or(|t| t > MOST_TOKENS) {
            return refuse(format!(
                "--batch {} × --seq {} is more than 2^32 tokens in one micro-batch: no GPU holds that",
                r.micro_batch, r.seq
            ));
        }
        let model_parallel = r.tensor.checked_mul(r.pipeline).and_then(|x| x.checked_mul(r.context));
        let Some(model_parallel) = model_parallel.filter(|&m| m > 0 && m <= r.gpus && r.gpus.is_multiple_of(m)) else {
            return refuse(format!(
                "--gpus {} is not a multiple of tp × pp × cp = {}",
                r.gpus,
                r.tensor as u128 * r.pipeline as u128 * r.context as u128
            ));
        };
        let data = r.gpus / model_parallel;
        let schedule = match (r.schedule, r.virtual_stages) {
            (Some(_), _) if r.pipeline == 1 => {
                return refuse("--pp-schedule needs more than one pipeline stage (--pp)")
            }
            (Some(PipelineSchedule::Schedule1F1B), Some(v)) if v > 1 => {
                return refuse(format!(
                    "--pp-schedule 1f1b runs one stage per rank; --vpp {v} asks for {v}: use --pp-schedule \
                     interleaved-1f1b"
                ))
            }
            (Some(s), _) => s,
            (None, Some(v)) if v > 1 => PipelineSchedule::Interleaved1F1B,
            (None, _) => PipelineSchedule::Schedule1F1B,
        };
        if r.stage_outputs.is_some() && r.pipeline == 1 {
            return refuse("--pp-outputs needs more than one pipeline stage (--pp)");
        }
        let torchtitan = r.framework == Framework::Torchtitan;
        if r.compile == Compile::Model && !torchtitan {
            return refuse(
                "--compile model (the blocks compiled, the loss eager) is torchtitan's setting: add --framework \
                 torchtitan, or write --compile alone for the whole model",
            );
        }
        let finetune = self.finetune()?;
        if let Some(on) = r.double_quant {
            if !matches!(finetune, Finetune::Lora { base, .. } if base.four_bit()) {
                return refuse(format!(
                    "--double-quant {}: bitsandbytes' setting of a 4-bit LoRA base (--finetune qlora, or --base-weights \
                     nf4 or fp4)",
                    if on { "on" } else { "off" }
                ));
            }
        }
        Ok(TrainConfig {
            micro_batch: r.micro_batch,
            seq: r.seq,
            target_seq: r.target_seq,
            accumulation: r.accumulation,
            precision: r.precision,
            optimizer: r.optimizer,
            attention: r.attention,
            checkpointing: r.checkpointing,
            parallel: Parallelism {
                data,
                tensor: r.tensor,
                pipeline: r.pipeline,
                context: r.context,
                sequence_parallel: r.sequence_parallel,
                virtual_stages: r.virtual_stages.unwrap_or(if schedule.looped() { 2 } else { 1 }),
                schedule,
                stage_outputs: r.stage_outputs.unwrap_or_default(),
                tp_comm_overlap: r.tp_comm_overlap,
                // torchtitan shards over every data-parallel GPU unless told otherwise
                // (`data_parallel_shard_degree = -1`).
                zero_stage: r.zero.unwrap_or(if torchtitan && (data / r.replicate.max(1)) * r.context > 1 {
                    3
                } else {
                    0
                }),
                replicate: r.replicate,
            },
            finetune,
            offload: r.offload,
            framework: r.framework,
            head: r.head,
            compile: r.compile != Compile::Off,
            compile_loss: r.compile == Compile::All,
            optimizer_impl: r.optimizer_impl,
            double_quant: r.double_quant.unwrap_or(true),
            // Every causal LM's config says `use_cache: true`, and transformers builds the cache
            // in a training forward unless the script turns it off.
            use_cache: r.use_cache.unwrap_or(true),
            // The most common runner of transformers' models: `Trainer.training_step` returns
            // `loss.detach()`, so the loss goes with each micro-batch's backward.
            loss_lives: r.loss_lives.unwrap_or_default(),
            // `from_pretrained` builds on the meta device and loads the weights.
            built_on_device: r.built_on_device.unwrap_or(false),
        })
    }

    fn finetune(&self) -> Result<Finetune, InvalidConfig> {
        Ok(match self.finetune {
            FinetuneMode::Full => {
                for (flag, set) in [
                    ("--base-weights", self.base_weights.is_some()),
                    ("--lora-rank", self.lora_rank.is_some()),
                    ("--lora-targets", self.lora_targets.is_some()),
                ] {
                    if set {
                        return refuse(format!("{flag} applies to --finetune lora or qlora"));
                    }
                }
                Finetune::Full
            }
            mode => Finetune::Lora {
                rank: self.lora_rank.unwrap_or(16),
                targets: self.lora_targets.unwrap_or(LoraTargets::All),
                base: match (self.base_weights, mode) {
                    (Some(base), _) => base,
                    (None, FinetuneMode::Qlora) => BaseWeights::Nf4,
                    (None, _) => BaseWeights::Native,
                },
            },
        })
    }
}

/// Who serves the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Server {
    /// vLLM, or transformers where `--quantize` asks for bitsandbytes.
    #[default]
    Auto,
    Vllm,
    Sglang,
    /// transformers' own forward with a cache.
    HuggingFace,
}

named!(Server {
    Auto => ("auto", "vLLM's serving engine (transformers with --quantize)"),
    Vllm => ("vllm", "vLLM's serving engine"),
    Sglang => ("sglang", "SGLang's server"),
    HuggingFace => ("hf", "transformers' own forward with a cache"),
});

/// The KV cache's element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDtype {
    Bf16,
    Fp8,
}

named!(KvDtype {
    Bf16 => ("bf16", ""),
    Fp8 => ("fp8", ""),
});

/// bitsandbytes' formats, as `BitsAndBytesConfig` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quantize {
    Int8,
    Nf4,
    Fp4,
}

named!(Quantize {
    Int8 => ("int8", "load_in_8bit: LLM.int8()"),
    Nf4 => ("nf4", "load_in_4bit, bnb_4bit_quant_type nf4 (QLoRA's NormalFloat4)"),
    Fp4 => ("fp4", "load_in_4bit, bnb_4bit_quant_type fp4 (transformers' default 4-bit type)"),
});

/// An inference job as asked for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InferRequest {
    pub server: Server,
    /// Concurrent sequences.
    pub batch: u64,
    pub seq: u64,
    /// GPUs: one tensor-parallel group.
    pub gpus: u64,
    /// Tensor-parallel GPUs [default: --gpus, one tensor-parallel group over them].
    pub tensor: Option<u64>,
    pub pipeline: u64,
    pub context: u64,
    pub weights: WeightFormat,
    /// [default: bf16; with transformers the weights'].
    pub kv_dtype: Option<KvDtype>,
    pub attention: Attention,
    pub all_logits: bool,
    /// transformers' `generate`: tokens generated after the prompt of `seq` [1: its first
    /// forward alone].
    pub new_tokens: u64,
    pub quantize: Option<Quantize>,
    pub double_quant: bool,
    pub compute_dtype: Option<ComputeDtype>,
    pub gpu_memory_utilization: Option<f64>,
    pub max_num_batched_tokens: Option<u64>,
    pub max_num_seqs: Option<u64>,
    pub block_size: Option<u64>,
    pub mem_fraction_static: Option<f64>,
}

impl Default for InferRequest {
    fn default() -> Self {
        InferRequest {
            server: Server::Auto,
            batch: 1,
            seq: 2048,
            gpus: 1,
            tensor: None,
            pipeline: 1,
            context: 1,
            weights: WeightFormat::Bf16,
            kv_dtype: None,
            attention: Attention::Sdpa,
            all_logits: false,
            new_tokens: 1,
            quantize: None,
            double_quant: false,
            compute_dtype: None,
            gpu_memory_utilization: None,
            max_num_batched_tokens: None,
            max_num_seqs: None,
            block_size: None,
            mem_fraction_static: None,
        }
    }
}

/// The largest divisor of `n` no more than `most` (1 at least).
fn largest_divisor(n: u64, most: u64) -> u64 {
    (1..=most.min(n)).rev().find(|d| n.is_multiple_of(*d)).unwrap_or(1)
}

impl InferRequest {
    /// The inference configuration this request describes for `model` on `gpu`, checked.
    pub fn resolve(&self, model: &Model, gpu: &GpuSpec) -> Result<InferConfig, InvalidConfig> {
        let r = self;
        if r.batch == 0 || r.seq == 0 {
            return refuse("the batch and the sequence length must be positive");
        }
        if r.batch.checked_mul(r.seq).is_none_or(|t| t > MOST_TOKENS) {
            return refuse(format!(
                "--batch {} × --seq {} is more than 2^32 tokens in one step: no GPU holds that",
                r.batch, r.seq
            ));
        }
        // An encoder (BERT) generates nothing and keeps no cache: its inference is one forward
        // over the input, which transformers runs and a serving engine does not.
        if !model.generates() {
            if matches!(r.server, Server::Vllm | Server::Sglang) {
                return refuse(format!(
                    "{} is an encoder: it keeps no KV cache and generates no tokens for {} to serve; plan its \
                     forward with --framework hf",
                    model.name,
                    r.server.name()
                ));
            }
            if r.new_tokens > 1 {
                return refuse(format!(
                    "--new-tokens {}: {} is an encoder and generates no tokens; its inference is one forward over \
                     the input: drop --new-tokens",
                    r.new_tokens, model.name
                ));
            }
        }
        if model.learned_positions() && r.seq > model.max_position {
            return refuse(format!(
                "--seq {}: {} has {} learned positions, and no sequence may be longer",
                r.seq, model.name, model.max_position
            ));
        }
        if r.pipeline > 1 || r.context > 1 {
            return refuse("--infer plans one tensor-parallel group: no --pp or --cp");
        }
        let tensor = match r.tensor {
            Some(t) if t != r.gpus => {
                return refuse(format!(
                    "--infer plans one tensor-parallel group: --tp {t} on --gpus {} would be {} replicas, each \
                     planned alone: plan one with --gpus {t} --tp {t}",
                    r.gpus,
                    r.gpus as f64 / t as f64
                ))
            }
            Some(t) => t,
            // Over several GPUs an engine splits the model by tensor parallelism, where the
            // heads divide; a server that runs on one GPU only says so below.
            None if r.gpus > 1 && !model.heads.is_multiple_of(r.gpus) => {
                return refuse(format!(
                    "--gpus {}: serving over several GPUs splits the model by tensor parallelism (--tp {}), and {} \
                     does not divide {}'s {} attention heads; plan a group of GPUs that does (e.g. --gpus {}), \
                     one replica per group",
                    r.gpus,
                    r.gpus,
                    r.gpus,
                    model.name,
                    model.heads,
                    largest_divisor(model.heads, r.gpus)
                ))
            }
            None => r.gpus,
        };
        if tensor == 0 || !model.heads.is_multiple_of(tensor) {
            return refuse(format!("--tp {tensor} does not divide the {} attention heads", model.heads));
        }
        let runtime = match self.runtime(gpu, tensor, !model.generates())? {
            // Every position's logits, as an encoder's forward computes them.
            Runtime::Transformers { attention, .. } if !model.generates() => {
                Runtime::Transformers { attention, all_logits: true, new_tokens: 1 }
            }
            runtime => runtime,
        };
        let config = InferConfig {
            runtime,
            tensor,
            batch: r.batch,
            seq: r.seq,
            weights: r.weights,
            kv_bytes: match r.kv_dtype {
                Some(KvDtype::Fp8) => 1.0,
                Some(KvDtype::Bf16) | None => 2.0,
            },
            quantize: self.bnb()?,
        };
        crate::infer::check(model, &config).map_err(|e| InvalidConfig(e.to_string()))?;
        Ok(config)
    }

    /// Who runs the forward, with its settings: bitsandbytes runs inside transformers, so
    /// `--quantize` picks transformers' forward, as `--offload` picks DeepSpeed for training,
    /// and so does an `encoder`, which no serving engine runs.
    fn runtime(&self, gpu: &GpuSpec, tensor: u64, encoder: bool) -> Result<Runtime, InvalidConfig> {
        let r = self;
        let engine_flags = [
            ("--gpu-memory-utilization", r.gpu_memory_utilization.is_some()),
            ("--max-num-batched-tokens", r.max_num_batched_tokens.is_some()),
            ("--max-num-seqs", r.max_num_seqs.is_some()),
            ("--block-size", r.block_size.is_some()),
        ];
        if r.server != Server::Sglang && r.mem_fraction_static.is_some() {
            return refuse("--mem-fraction-static: an SGLang setting (--framework sglang)");
        }
        let server = match (r.server, r.quantize) {
            (Server::Auto, Some(_)) => Server::HuggingFace,
            (Server::Auto, None) if encoder => Server::HuggingFace,
            (Server::Vllm | Server::Sglang, Some(_)) => {
                return refuse(format!(
                    "--quantize: bitsandbytes quantizes transformers' linear layers as it loads them (--framework hf); \
                     {} loads checkpoints quantized ahead: --weights int8, int4 or fp8",
                    r.server.name()
                ))
            }
            (s, None) => s,
            (s, Some(_)) => s,
        };
        let serving = server != Server::HuggingFace;
        if r.new_tokens == 0 {
            return refuse("--new-tokens must be positive: generate makes one token at least");
        }
        if serving && r.new_tokens > 1 {
            return refuse(
                "--new-tokens: transformers' generate (--framework hf); a serving engine's --seq is prompt and output",
            );
        }
        if r.all_logits && r.new_tokens > 1 {
            return refuse("--new-tokens plans generate; --all-logits plans one forward that keeps every logit");
        }
        if serving && r.all_logits {
            return refuse(
                "--all-logits: a serving engine keeps the last positions' logits (--all-logits applies to --framework hf)",
            );
        }
        if serving && r.attention == Attention::Eager {
            return refuse(
                "--attention eager: serving engines run their own attention kernels (eager applies to --framework hf)",
            );
        }
        Ok(match server {
            Server::Sglang => {
                if let Some((flag, _)) = engine_flags.iter().find(|(_, set)| *set) {
                    return refuse(format!(
                        "{flag}: a vLLM setting (--framework vllm); SGLang's is --mem-fraction-static"
                    ));
                }
                let share = r.mem_fraction_static.map(|f| Sglang { mem_fraction_static: f });
                Runtime::Sglang(share.unwrap_or_else(|| Sglang::defaults(gpu, tensor)))
            }
            Server::Auto | Server::Vllm => {
                let d = Engine::vllm_defaults(gpu);
                let engine = Engine {
                    gpu_memory_utilization: r.gpu_memory_utilization.unwrap_or(d.gpu_memory_utilization),
                    max_num_batched_tokens: r.max_num_batched_tokens.unwrap_or(d.max_num_batched_tokens),
                    max_num_seqs: r.max_num_seqs.unwrap_or(d.max_num_seqs),
                    block_size: r.block_size.unwrap_or(d.block_size),
                };
                // vLLM's SchedulerConfig refuses to start with fewer tokens a step than sequences
                // (every running sequence takes at least one token of a step).
                if engine.max_num_batched_tokens < engine.max_num_seqs {
                    return refuse(format!(
                        "vLLM refuses to start: max_num_batched_tokens ({}) must be greater than or equal to \
                         max_num_seqs ({}) (--max-num-batched-tokens, --max-num-seqs; defaults {} and {} on this GPU)",
                        engine.max_num_batched_tokens, engine.max_num_seqs, d.max_num_batched_tokens, d.max_num_seqs
                    ));
                }
                Runtime::Vllm(engine)
            }
            Server::HuggingFace => {
                if let Some((flag, _)) = engine_flags.iter().find(|(_, set)| *set) {
                    return refuse(format!(
                        "{flag}: a vLLM setting (--framework vllm); transformers' forward has none"
                    ));
                }
                if let Some(kv) = r.kv_dtype {
                    return refuse(format!(
                        "--kv-dtype {}: transformers caches keys and values in the weights' dtype (--weights)",
                        kv.name()
                    ));
                }
                Runtime::Transformers { attention: r.attention, all_logits: r.all_logits, new_tokens: r.new_tokens }
            }
        })
    }

    /// The bitsandbytes quantization `--quantize`, `--double-quant` and `--compute-dtype` describe.
    fn bnb(&self) -> Result<Option<Bnb>, InvalidConfig> {
        let Some(q) = self.quantize else {
            if self.double_quant {
                return refuse("--double-quant: quantizes 4-bit layers' absmax values (--quantize nf4 or fp4)");
            }
            if let Some(c) = self.compute_dtype {
                return refuse(format!("--compute-dtype {}: a 4-bit setting (--quantize nf4 or fp4)", c.name()));
            }
            return Ok(None);
        };
        if !matches!(self.weights, WeightFormat::Fp32 | WeightFormat::Bf16) {
            return refuse(format!(
                "--weights {} with --quantize: --weights is the dtype bitsandbytes leaves the head, embeddings \
                 and norms in (fp32, or bf16 for any 16-bit load); --quantize {} sets the linear layers'",
                self.weights.name(),
                q.name()
            ));
        }
        let quant_type = match q {
            Quantize::Int8 => {
                if self.double_quant {
                    return refuse(
                        "--double-quant: quantizes 4-bit layers' absmax values (--quantize nf4 or fp4); int8 keeps an \
                         fp32 scale a row",
                    );
                }
                if let Some(c) = self.compute_dtype {
                    return refuse(format!(
                        "--compute-dtype {}: a 4-bit setting (--quantize nf4 or fp4); LLM.int8() multiplies in int8 \
                         and fp16",
                        c.name()
                    ));
                }
                return Ok(Some(Bnb::Int8));
            }
            Quantize::Nf4 => QuantType::Nf4,
            Quantize::Fp4 => QuantType::Fp4,
        };
        Ok(Some(Bnb::FourBit {
            quant_type,
            double_quant: self.double_quant,
            compute: self.compute_dtype.unwrap_or(ComputeDtype::Fp32),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torchtitan_shards_over_every_data_parallel_gpu_unless_told() {
        let r = TrainRequest { gpus: 8, framework: Framework::Torchtitan, ..TrainRequest::default() };
        assert_eq!(r.config().unwrap().parallel.zero_stage, 3);
        let replicas = TrainRequest { replicate: 8, ..r };
        assert_eq!(replicas.config().unwrap().parallel.zero_stage, 0);
        assert_eq!(TrainRequest { gpus: 8, ..TrainRequest::default() }.config().unwrap().parallel.zero_stage, 0);
    }

    #[test]
    fn a_chunk_count_picks_the_interleaved_schedule() {
        let r = TrainRequest { gpus: 4, pipeline: 4, virtual_stages: Some(2), ..TrainRequest::default() };
        assert_eq!(r.config().unwrap().parallel.pipeline_schedule(), PipelineSchedule::Interleaved1F1B);
        let one = TrainRequest { schedule: Some(PipelineSchedule::Schedule1F1B), ..r };
        assert!(one.config().unwrap_err().0.contains("interleaved-1f1b"));
    }

    #[test]
    fn lora_settings_without_lora_are_refused_by_name() {
        let r = TrainRequest { lora_rank: Some(8), ..TrainRequest::default() };
        assert!(r.config().unwrap_err().0.contains("--lora-rank"));
        let q = TrainRequest { finetune: FinetuneMode::Qlora, ..TrainRequest::default() };
        assert!(matches!(q.config().unwrap().finetune, Finetune::Lora { base: BaseWeights::Nf4, rank: 16, .. }));
    }

    #[test]
    fn the_gpus_must_hold_whole_model_parallel_groups() {
        let r = TrainRequest { gpus: 6, tensor: 4, ..TrainRequest::default() };
        assert!(r.config().unwrap_err().0.contains("not a multiple"));
        let overflow = TrainRequest { gpus: 8, tensor: u64::MAX, pipeline: 2, ..TrainRequest::default() };
        assert!(overflow.config().is_err());
    }

    #[test]
    fn vllm_refuses_fewer_tokens_a_step_than_sequences() {
        let m = crate::model::preset("llama-3-8b").unwrap();
        let g = crate::gpu::gpu("h100-sxm").unwrap();
        let r = InferRequest { max_num_batched_tokens: Some(16), max_num_seqs: Some(32), ..InferRequest::default() };
        assert!(r.resolve(&m, &g).unwrap_err().0.contains("refuses to start"));
        let q = InferRequest { quantize: Some(Quantize::Nf4), ..InferRequest::default() };
        assert!(matches!(q.resolve(&m, &g).unwrap().runtime, Runtime::Transformers { .. }));
        let dq = InferRequest { double_quant: true, ..InferRequest::default() };
        assert!(dq.resolve(&m, &g).unwrap_err().0.contains("--double-quant"));
    }
}
