//! `headroom plan`'s arguments, and the configurations they describe.

use crate::named_arg::named;
use crate::target_arg::Target;
use anyhow::Context;
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use headroom_alloc::{AllocatorConfig, PolicyName};
use headroom_plan::bnb::{Bnb, ComputeDtype, QuantType};
use headroom_plan::emit::Engine;
use headroom_plan::engine::Engine as Serving;
use headroom_plan::gpu::GpuSpec;
use headroom_plan::infer::{InferConfig, Runtime, WeightFormat};
use headroom_plan::model::Model;
use headroom_plan::names::Named;
use headroom_plan::parallel::{Parallelism, PipelineSchedule, StageOutputs};
use headroom_plan::sglang::Sglang;
use headroom_plan::train::{
    ActivationModel, Attention, BaseWeights, Checkpointing, Estimator, Finetune, Framework, Head, LoraTargets, Offload,
    Optimizer, OptimizerImpl, Precision, TrainConfig,
};

/// Will it fit? Memory per GPU, term by term, for training or inference, and
/// the estimated step time.
///
/// Training: the job's step program — every allocation and free of building the model and
/// of three steps, the optimizer's included — replayed through PyTorch's caching allocator
/// (headroom's, decision for decision) on the memory PyTorch can have of the GPU: its
/// allocated and reserved peaks, the phase that peaks, and whether it runs out, where and by
/// how much. Where transformers runs the job (--framework auto: one model replica per GPU,
/// full fine-tuning, no or full checkpointing) the program is its code's own, recorded
/// tensor by tensor and expanded to the model's depth and shape, with the GPU's SDPA kernel,
/// dropout masks and cuBLAS workspaces; elsewhere the closed form's terms — weights,
/// gradients and optimizer state (by precision, optimizer, ZeRO stage, LoRA and offload),
/// activations (by attention kernel, layout and checkpoint policy, Korthikanti's for
/// Megatron; `optimal` solves for the fastest schedule that fits), logits and the loss,
/// temporaries — laid out as a step. --alloc-conf and --policy replay it under other
/// allocator settings; a job that does not fit is told the settings that would make it
/// fit. Inference: as vLLM sizes its KV cache at start-up — gpu_memory_utilization of the
/// device, less the weights, the peak of its profile run (a forward of
/// max_num_batched_tokens tokens, then the sampler over max_num_seqs rows) and the memory
/// outside PyTorch — and how many sequences of --seq tokens that cache holds; with
/// --framework hf, transformers' own forward with a cache, as generate's first forward (or,
/// with --all-logits, an evaluation loop) runs it, its temporaries and logits recorded the
/// same way.
///
/// Your own model's layers, optimizer or script may keep more or less than
/// any recipe: --calibrate fits the plan to a memory snapshot of a smaller
/// run of the same job (torch.cuda.memory._dump_snapshot around one step),
/// and plans the larger one from it.
///
/// Parallelism: --gpus with --tp, --pp (--vpp), --cp; the rest is data
/// parallel with --zero. Fine-tuning: --finetune lora|qlora. Offload:
/// --offload optimizer|params. Step time adds up each layer's kernels on the
/// GPU (matrix multiplies by shape at the part's measured efficiency,
/// attention by kernel, memory-bound ops by the bytes they move), pipeline
/// bubbles and collectives over NVLink or the network.
///
/// --model takes a preset (llama-3-8b, mistral-7b, qwen2.5-7b, gpt2, t5-base,
/// bert-base-uncased, pythia-1b, ...) or the path of a Hugging Face config.json.
///
/// Exit status: 0 if it fits, 1 if not, 2 on bad input.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  headroom plan --model llama-2-7b --gpu a100-80gb --train --precision bf16 --batch 8 --seq 4096 --attention flash --checkpoint optimal\n  \
                        headroom plan --model llama-3-8b --gpu h100-sxm --gpus 8 --zero 3 --train --batch 1 --seq 8192 --checkpoint full --max-batch\n  \
                        headroom plan --model llama-3-70b --gpu h100-sxm --gpus 64 --tp 8 --pp 2 --zero 1 --batch 1 --accumulation 16 --seq 8192 --checkpoint selective\n  \
                        headroom plan --model llama-3.1-8b --gpu rtx-4090 --finetune qlora --lora-rank 32 --seq 4096 --checkpoint full --max-seq\n  \
                        headroom plan --model llama-2-70b --gpu a100-80gb --gpus 64 --tp 8 --pp 4 --batch 1 --global-batch 512 --recommend --emit megatron\n  \
                        headroom plan --model llama-3-70b --gpu h100-sxm --gpus 64 --framework torchtitan --tp 8 --pp 4 --pp-schedule interleaved-1f1b --batch 1 --accumulation 8 --seq 8192 --checkpoint full\n  \
                        headroom plan --model llama-3.1-8b --gpu h200 --gpus 32 --framework torchtitan --precision fp8 --compile --batch 2 --seq 8192 --checkpoint per-op\n  \
                        headroom plan --model data/models/qwen3-1.7b.json --gpu l4 --infer --seq 4096 --batch 16 --weights int4 --json\n  \
                        headroom plan --model llama-3.1-8b --gpu h100-sxm --infer --framework vllm --seq 16000 --gpu-memory-utilization 0.85 --max-num-seqs 256\n  \
                        headroom plan --model llama-3-70b --gpu h100-sxm --gpus 4 --tp 4 --infer --framework sglang --seq 8192 --batch 32\n  \
                        headroom plan --model t0-3b --gpu a100-40gb --precision fp32 --batch 8 --seq 64 --finetune lora --zero 3 --offload params\n  \
                        headroom plan --model llama-3.1-8b --gpu a100-80gb --infer --framework hf --attention eager --batch 2 --seq 8192\n  \
                        headroom plan --model data/models/octocoder.json --gpu a100-40gb --infer --seq 80 --quantize fp4\n  \
                        headroom plan --model data/models/qwen3-1.7b.json --gpu h200 --precision bf16 --attention sdpa --batch 4 --seq 2048 --calibrate data/snapshots/qwen3-1.7b-train.pickle --calibrate-batch 1 --calibrate-seq 512"
)]
pub struct PlanArgs {
    #[command(flatten)]
    pub target: Target,
    /// Estimate training (the default).
    #[arg(long, conflicts_with = "infer")]
    pub train: bool,
    /// Estimate inference.
    #[arg(long)]
    pub infer: bool,
    /// Micro-batch (training) or concurrent sequences (inference).
    #[arg(long, default_value_t = 1, value_parser = positive())]
    pub batch: u64,
    /// Sequence length in tokens.
    #[arg(long, default_value_t = 2048, value_parser = tokens())]
    pub seq: u64,
    /// GPUs in the job (at most 2^20); data parallelism is what tensor × pipeline × context parallelism leaves.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub gpus: u64,
    /// Tensor-parallel GPUs (Megatron; keep it inside a node).
    #[arg(long, default_value_t = 1, value_parser = positive())]
    pub tp: u64,
    /// Pipeline stages (1F1B). Where they do not divide the layers, the
    /// first and last stage hold ⌈layers / pp⌉ and the middle ones the rest
    /// (Megatron's --decoder-first/last-pipeline-num-layers).
    #[arg(long, default_value_t = 1, value_parser = positive())]
    pub pp: u64,
    /// Model chunks per pipeline stage: more than 1 is the interleaved schedule
    /// [default: 1, or 2 with --pp-schedule interleaved-1f1b, zero-bubble or zbv, as torchtitan].
    #[arg(long, conflicts_with = "infer", value_parser = positive())]
    vpp: Option<u64>,
    /// PyTorch's pipeline schedule (torchtitan's pipeline_parallel_schedule) [default:
    /// 1f1b, or interleaved-1f1b with --vpp 2 or more]. Under --framework torchtitan every
    /// pipeline rank is planned from the schedule's own order of forwards and backwards, and
    /// the rank that peaks is reported: 1f1b keeps min(micro-batches, pp - rank)
    /// micro-batches in flight (--accumulation is the micro-batch count), interleaved-1f1b
    /// more of smaller chunks; zero-bubble and zbv (torchtitan only) split each backward
    /// and keep the linears' inputs until the weights' half runs.
    #[arg(long, conflicts_with = "infer", value_parser = named::<PipelineSchedule>())]
    pp_schedule: Option<PipelineSchedule>,
    /// What each pipeline stage keeps of its micro-batches' outputs once their backward has
    /// run (PyTorch's output_chunks, which step() merges and returns) [default: none, as
    /// torchtitan runs since October 2025; every for a PyTorch before 2.8]. Under
    /// --framework torchtitan with --pp.
    #[arg(long, conflicts_with = "infer", value_parser = named::<StageOutputs>())]
    pp_outputs: Option<StageOutputs>,
    /// Context-parallel GPUs (the sequence split across GPUs).
    #[arg(long, default_value_t = 1, value_parser = positive())]
    pub cp: u64,
    /// Turn off Megatron's sequence parallelism (on by default with --tp).
    #[arg(long, conflicts_with = "infer")]
    no_sequence_parallel: bool,
    /// Overlap tensor-parallel communication with the GEMMs (Transformer Engine, Megatron's --tp-comm-overlap).
    #[arg(long, conflicts_with = "infer")]
    tp_comm_overlap: bool,
    /// ZeRO stage over the data-parallel GPUs (FSDP: 2 = SHARD_GRAD_OP, 3 = FULL_SHARD; under
    /// --framework torchtitan, FSDP2's reshard_after_forward False or True) [default: 0, or 3
    /// with --framework torchtitan on more than one data-parallel GPU, as torchtitan shards]
    #[arg(long, conflicts_with = "infer", value_parser = clap::value_parser!(u8).range(0..=3))]
    zero: Option<u8>,
    /// HSDP under --framework torchtitan: the data-parallel GPUs as this many replicas of an
    /// FSDP group, each sharding the model states over the rest (torchtitan's
    /// data_parallel_replicate_degree); must divide them
    #[arg(long, default_value_t = 1, conflicts_with = "infer", value_parser = clap::value_parser!(u64).range(1..))]
    dp_replicate: u64,
    /// Micro-batches per optimizer step (gradient accumulation; the pipeline's micro-batches).
    #[arg(long, conflicts_with = "infer", default_value_t = 1, value_parser = positive())]
    accumulation: u64,
    /// Sequences per optimizer step over all GPUs for --recommend (default: batch × accumulation × data-parallel GPUs).
    #[arg(long, conflicts_with = "infer", value_parser = positive())]
    pub global_batch: Option<u64>,
    /// Full fine-tuning, LoRA adapters over a frozen base, or QLoRA (LoRA over a 4-bit NF4 base).
    #[arg(long, conflicts_with = "infer", value_enum, default_value_t = FinetuneArg::Full)]
    finetune: FinetuneArg,
    /// LoRA rank (with --finetune lora or qlora) [default: 16].
    #[arg(long, conflicts_with = "infer", value_parser = positive())]
    lora_rank: Option<u64>,
    /// Linear layers that get adapters (with --finetune lora or qlora): every one, or the query
    /// and value projections [default: all].
    #[arg(long, conflicts_with = "infer", value_parser = named::<LoraTargets>())]
    lora_targets: Option<LoraTargets>,
    /// Storage of the frozen base under LoRA (qlora implies nf4).
    #[arg(long, conflicts_with = "infer", value_parser = named::<BaseWeights>())]
    base_weights: Option<BaseWeights>,
    /// CPU offload (DeepSpeed ZeRO-Offload): the optimizer, or the optimizer and the parameters (needs --zero 3).
    #[arg(long, conflicts_with = "infer", value_parser = named::<Offload>(), default_value = "none")]
    offload: Offload,
    #[arg(long, conflicts_with = "infer", value_parser = named::<Precision>(), default_value = "mixed")]
    pub precision: Precision,
    #[arg(long, conflicts_with = "infer", value_parser = named::<Optimizer>(), default_value = "adamw")]
    pub optimizer: Optimizer,
    /// AdamW's implementation: foreach (torch's default on CUDA: a copy of the second
    /// moments for the length of the step), fused (one kernel, no temporaries; what
    /// transformers' Trainer picks on torch >= 2.8) or for-loop [default: foreach].
    #[arg(long, conflicts_with = "infer", value_parser = named::<OptimizerImpl>())]
    pub optimizer_impl: Option<OptimizerImpl>,
    /// The caching allocator's settings, in PYTORCH_CUDA_ALLOC_CONF syntax (e.g.
    /// "expandable_segments:True"): the job is replayed under them. Repeat to compare
    /// settings; the first is the plan's.
    #[arg(long = "alloc-conf", value_name = "STR", conflicts_with = "infer")]
    pub alloc_conf: Vec<String>,
    /// The allocation policy the job is replayed under: pytorch (PyTorch's caching
    /// allocator, the default), expandable, headroom, lifetime or planned (headroom's own,
    /// as its PyTorch plug-in runs them). Repeat to compare; the first is the plan's.
    #[arg(long = "policy", value_name = "NAME", conflicts_with = "infer")]
    pub policy: Vec<PolicyName>,
    /// Write the job's step program — every allocation and free of its steps, at the
    /// planned shape — as a JSONL trace that `headroom replay` reads.
    #[arg(long, value_name = "FILE", conflicts_with = "infer")]
    pub dump_program: Option<std::path::PathBuf>,
    #[arg(long, value_parser = named::<Attention>(), default_value = "sdpa")]
    pub attention: Attention,
    /// Whose code runs the step. auto: Hugging Face transformers where it can run the job
    /// (one model replica per GPU, full fine-tuning, no or full checkpointing; the peak from
    /// its recorded steps), Megatron-LM otherwise; with --offload, deepspeed. deepspeed:
    /// transformers' code under DeepSpeed's ZeRO engine at its default buckets (the gradient
    /// bucket; under ZeRO-3 the small tensors it never partitions and the parameters it keeps
    /// gathered from the forward into the backward).
    /// With --infer: auto and vllm plan vLLM's serving engine (its KV cache pool, sized at
    /// start-up; --gpu-memory-utilization, --max-num-batched-tokens, --max-num-seqs,
    /// --block-size); sglang plans SGLang's server (its token pool: --mem-fraction-static of
    /// the free memory at start-up less the weights); hf plans transformers' own forward with
    /// a cache as generate's first one runs it (the last position's logits; every position's
    /// with --all-logits) and the temporaries its code allocates, as measured; fp32 or bf16
    /// --weights, --attention eager or sdpa, --quantize for bitsandbytes' int8 or 4-bit
    /// linear layers.
    #[arg(long, value_parser = named::<Framework>(), default_value = "auto")]
    framework: Framework,
    /// The output layer and loss: vocabulary logits for every position (causal-lm,
    /// masked-lm) or a classifier (seq-cls).
    #[arg(long, conflicts_with = "infer", value_parser = named::<Head>(), default_value = "causal-lm")]
    head: Head,
    /// none, full, selective (Megatron's: the attention core recomputed), per-op (torchtitan's:
    /// every op but attention and every other matrix multiply), every-K (e.g. every-4), or optimal.
    #[arg(long, conflicts_with = "infer", default_value = "none")]
    pub checkpoint: String,
    /// The model run through torch.compile: what its graphs hold at each moment of the step
    /// (less than the eager code: norms and activation functions are recomputed in the
    /// backward), as recorded for decoders at fp32, bf16 and AMP without checkpointing and at
    /// fp32 with full checkpointing; elsewhere the eager code's. Under --framework torchtitan,
    /// what its `compile.components` name: `all` (the default: each block and the loss, as
    /// torchtitan has compiled them since April 2025) or `model` (the blocks alone, the loss
    /// eager, as before).
    #[arg(long, conflicts_with = "infer", num_args = 0..=1, default_missing_value = "all", value_name = "COMPONENTS")]
    compile: Option<CompileArg>,
    /// Also find the largest micro-batch that fits (searched up to 2^40).
    #[arg(long, conflicts_with = "infer")]
    pub max_batch: bool,
    /// Also find the longest sequence that fits at this batch (training or inference; up to
    /// the model's learned positions, or 2^24 tokens).
    #[arg(long)]
    pub max_seq: bool,
    /// Fit the plan to a memory snapshot of a smaller run of the same job (a pickle from
    /// torch.cuda.memory._dump_snapshot, recorded around one training step): what your own
    /// layers keep, what your optimizer allocates and what the script holds between steps,
    /// measured phase by phase. Repeat it with snapshots at two or more sequence lengths to
    /// fit eager attention's s × s matrices apart from what grows with the tokens.
    #[arg(long, value_name = "SNAPSHOT", conflicts_with_all = ["infer", "recommend"])]
    pub calibrate: Vec<std::path::PathBuf>,
    /// The micro-batch each --calibrate run used, in the same order (one value: all of them;
    /// default: --batch).
    #[arg(long, requires = "calibrate", value_parser = positive())]
    pub calibrate_batch: Vec<u64>,
    /// The sequence length each --calibrate run used, in the same order (one value: all of
    /// them; default: --seq).
    #[arg(long, requires = "calibrate", value_parser = positive())]
    pub calibrate_seq: Vec<u64>,
    /// Search precision, attention kernel, checkpointing, the tensor ×
    /// pipeline × context × data split of --gpus, ZeRO stage, offload and
    /// micro-batch (with gradient accumulation to --global-batch sequences
    /// per step) for the configurations that fit, fastest first.
    #[arg(long, conflicts_with = "infer")]
    pub recommend: bool,
    /// Print the configuration for an engine (the best recommendation with --recommend).
    #[arg(long, conflicts_with = "infer", value_parser = named::<Engine>())]
    pub emit: Option<Engine>,
    /// With --infer --framework hf: plan a forward that keeps every position's logits (an
    /// evaluation loop's model(input_ids)) instead of generate's first forward, which keeps
    /// the last position's.
    #[arg(long, requires = "infer")]
    all_logits: bool,
    /// Inference weight format (fp32 and bf16 with --framework hf; with --quantize, the dtype
    /// of what bitsandbytes leaves unquantized).
    #[arg(long, requires = "infer", value_parser = named::<WeightFormat>(), default_value = "bf16")]
    weights: WeightFormat,
    /// With --infer: quantize the linear layers as transformers loads them with bitsandbytes
    /// (BitsAndBytesConfig; implies --framework hf). int8: LLM.int8() — int8 weights with an
    /// fp32 scale a row, and each layer's input columns above 6.0 multiplied in fp16. nf4, fp4:
    /// two weights a byte with an fp32 absmax per 64, the whole weight dequantized for each
    /// layer's multiply over the prompt (bitsandbytes up to 0.49; 0.50's fused kernel skips
    /// that copy). The head, embeddings, norms and a mixture's experts keep --weights' dtype
    /// (fp32, or bf16 for any 16-bit load), as do the activations and the cache.
    #[arg(long, requires = "infer", value_enum)]
    quantize: Option<QuantizeArg>,
    /// With --quantize nf4 or fp4: bnb_4bit_use_double_quant — the absmax values quantized
    /// again to a byte each, with an fp32 absmax per 256 (0.127 bit a weight instead of 0.5).
    #[arg(long, requires = "quantize")]
    double_quant: bool,
    /// With --quantize nf4 or fp4: bnb_4bit_compute_dtype, the dtype each layer casts its
    /// input and dequantized weight to [default: fp32, transformers' default].
    #[arg(long, requires = "quantize", value_parser = named::<ComputeDtype>())]
    compute_dtype: Option<ComputeDtype>,
    /// Inference KV-cache element width [default: bf16; with --framework hf the weights'].
    #[arg(long, requires = "infer", value_enum)]
    kv_dtype: Option<KvArg>,
    /// vLLM: the share of the GPU's memory the engine may take, weights, profile run and KV
    /// cache together [default: 0.9].
    #[arg(long, requires = "infer", value_parser = share)]
    gpu_memory_utilization: Option<f64>,
    /// vLLM: tokens in one step, the length of its profile run's forward [default: 8192 on
    /// GPUs of 70 GiB or more but the A100, 2048 elsewhere, as `vllm serve`].
    #[arg(long, requires = "infer", value_parser = tokens())]
    max_num_batched_tokens: Option<u64>,
    /// vLLM: sequences in one step, the rows its profile run samples [default: 1024 on GPUs
    /// of 70 GiB or more but the A100, 256 elsewhere, as `vllm serve`].
    #[arg(long, requires = "infer", value_parser = tokens())]
    max_num_seqs: Option<u64>,
    /// vLLM: tokens per KV-cache block; a sequence takes whole blocks [default: 16].
    #[arg(long, requires = "infer", value_parser = positive())]
    block_size: Option<u64>,
    /// SGLang: the share of the free memory at start-up the weights and the KV pool take;
    /// the rest is left for activations and CUDA graphs [default: SGLang's own, from the
    /// GPU's memory and --tp: 0.834 on one H100].
    #[arg(long, requires = "infer", value_parser = share)]
    mem_fraction_static: Option<f64>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum FinetuneArg {
    Full,
    Lora,
    Qlora,
}

/// bitsandbytes' formats, as `BitsAndBytesConfig` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum QuantizeArg {
    /// load_in_8bit: LLM.int8()
    Int8,
    /// load_in_4bit, bnb_4bit_quant_type nf4 (QLoRA's NormalFloat4)
    Nf4,
    /// load_in_4bit, bnb_4bit_quant_type fp4 (transformers' default 4-bit type)
    Fp4,
}

/// What torch.compile compiles: torchtitan's `compile.components`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum CompileArg {
    /// The model's blocks and the loss.
    All,
    /// The model's blocks; the loss runs eagerly.
    Model,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum KvArg {
    Bf16,
    Fp8,
}

impl KvArg {
    fn name(self) -> &'static str {
        match self {
            KvArg::Bf16 => "bf16",
            KvArg::Fp8 => "fp8",
        }
    }
}

/// A share in (0, 1].
fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 1.0 => Ok(x),
        Ok(x) => Err(format!("{x} is not in (0, 1]: the share of the GPU's memory the engine may take")),
        Err(_) => Err(format!("{s:?} is not a number (e.g. 0.9)")),
    }
}

/// A whole number of at least 1.
fn positive() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(1..)
}

/// The most tokens a micro-batch, a sequence or a serving step may have. Bytes are counted
/// in 64 bits, and attention's sequence² × heads × 4 bytes passes 2^64 not far beyond; no
/// GPU holds even the hidden states of 2^32 tokens (32 TiB at 4096 × 2 bytes each).
const MOST_TOKENS: u64 = 1 << 32;

fn tokens() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(1..=MOST_TOKENS)
}

/// Refuses a micro-batch of more than [`MOST_TOKENS`] tokens.
fn check_tokens(batch: u64, seq: u64) -> Result<()> {
    if batch.checked_mul(seq).is_none_or(|t| t > MOST_TOKENS) {
        bail!("--batch {batch} × --seq {seq} is more than 2^32 tokens in one micro-batch: no GPU holds that");
    }
    Ok(())
}

fn parse_checkpointing(s: &str) -> Result<Checkpointing> {
    Ok(match s {
        "none" => Checkpointing::None,
        "full" => Checkpointing::Full,
        "selective" => Checkpointing::Selective,
        "per-op" => Checkpointing::PerOp,
        "optimal" => Checkpointing::Optimal,
        other => match other.strip_prefix("every-").map(str::parse::<u64>) {
            Some(Ok(k)) if k > 0 => Checkpointing::EveryK(k),
            _ => bail!("--checkpoint {other:?}: expected none, full, selective, per-op, every-K or optimal"),
        },
    })
}

impl PlanArgs {
    /// The training configuration the arguments describe.
    pub fn train_config(&self) -> Result<TrainConfig> {
        let a = self;
        check_tokens(a.batch, a.seq)?;
        if matches!(a.framework, Framework::Vllm | Framework::Sglang) {
            bail!(
                "--framework {} plans inference: add --infer (training takes auto, hf, deepspeed, megatron or torchtitan)",
                a.framework.arg()
            );
        }
        let model_parallel = a.tp.checked_mul(a.pp).and_then(|x| x.checked_mul(a.cp)).unwrap_or(u64::MAX);
        if !a.gpus.is_multiple_of(model_parallel) || model_parallel > a.gpus {
            bail!(
                "--gpus {} is not a multiple of tp × pp × cp = {}",
                a.gpus,
                a.tp as u128 * a.pp as u128 * a.cp as u128
            );
        }
        if a.compile == Some(CompileArg::Model) && a.framework != Framework::Torchtitan {
            bail!(
                "--compile model (the blocks compiled, the loss eager) is torchtitan's setting: add --framework \
                 torchtitan, or write --compile alone for the whole model"
            );
        }
        let data = a.gpus / model_parallel;
        if let Some(o) = a.pp_outputs {
            if a.pp == 1 {
                bail!("--pp-outputs needs more than one pipeline stage (--pp)");
            }
            if a.framework != Framework::Torchtitan && o != StageOutputs::None {
                bail!(
                    "--pp-outputs is PyTorch's pipelining, as torchtitan runs it: add --framework torchtitan (the \
                     other frameworks' pipelines are planned in closed form)"
                );
            }
        }
        let schedule = match (a.pp_schedule, a.vpp) {
            (Some(_), _) if a.pp == 1 => bail!("--pp-schedule needs more than one pipeline stage (--pp)"),
            (Some(PipelineSchedule::Schedule1F1B), Some(v)) if v > 1 => bail!(
                "--pp-schedule 1f1b runs one stage per rank; --vpp {v} asks for {v}: use --pp-schedule interleaved-1f1b"
            ),
            (Some(s), _) => s,
            (None, Some(v)) if v > 1 => PipelineSchedule::Interleaved1F1B,
            (None, _) => PipelineSchedule::Schedule1F1B,
        };
        if a.batch.checked_mul(a.accumulation).and_then(|x| x.checked_mul(data)).is_none() {
            bail!(
            "the global batch, --batch {} × --accumulation {} × {data} data-parallel GPUs, is more than 2^64 sequences",
            a.batch,
            a.accumulation
        );
        }
        let finetune = match a.finetune {
            FinetuneArg::Full => {
                for (flag, set) in [
                    ("--base-weights", a.base_weights.is_some()),
                    ("--lora-rank", a.lora_rank.is_some()),
                    ("--lora-targets", a.lora_targets.is_some()),
                ] {
                    if set {
                        bail!("{flag} applies to --finetune lora or qlora");
                    }
                }
                Finetune::Full
            }
            FinetuneArg::Lora | FinetuneArg::Qlora => Finetune::Lora {
                rank: a.lora_rank.unwrap_or(16),
                targets: a.lora_targets.unwrap_or(LoraTargets::All),
                base: match (a.base_weights, a.finetune) {
                    (Some(base), _) => base,
                    (None, FinetuneArg::Qlora) => BaseWeights::Nf4,
                    (None, _) => BaseWeights::Native,
                },
            },
        };
        Ok(TrainConfig {
            micro_batch: a.batch,
            seq: a.seq,
            accumulation: a.accumulation,
            precision: a.precision,
            optimizer: a.optimizer,
            attention: a.attention,
            checkpointing: parse_checkpointing(&a.checkpoint)?,
            parallel: Parallelism {
                data,
                tensor: a.tp,
                pipeline: a.pp,
                context: a.cp,
                sequence_parallel: !a.no_sequence_parallel,
                virtual_stages: a.vpp.unwrap_or(if schedule.looped() { 2 } else { 1 }),
                schedule,
                stage_outputs: a.pp_outputs.unwrap_or_default(),
                tp_comm_overlap: a.tp_comm_overlap,
                // torchtitan shards over every data-parallel GPU unless told otherwise
                // (`data_parallel_shard_degree = -1`).
                zero_stage: a.zero.unwrap_or(
                    if a.framework == Framework::Torchtitan && (data / a.dp_replicate.max(1)) * a.cp > 1 {
                        3
                    } else {
                        0
                    },
                ),
                replicate: a.dp_replicate,
            },
            finetune,
            offload: a.offload,
            coefficients: ActivationModel::default(),
            framework: a.framework,
            head: a.head,
            compile: a.compile.is_some(),
            compile_loss: a.compile == Some(CompileArg::All),
            optimizer_impl: a.optimizer_impl,
        })
    }

    /// The allocator settings and policies to replay under, labelled as the user wrote them:
    /// every --alloc-conf under every --policy, the first the plan's.
    pub fn allocators(&self) -> Result<Vec<(String, Estimator)>> {
        let confs = if self.alloc_conf.is_empty() { vec![String::new()] } else { self.alloc_conf.clone() };
        let policies = if self.policy.is_empty() { vec![PolicyName::PyTorch] } else { self.policy.clone() };
        let mut out = Vec::new();
        for conf in &confs {
            let alloc = AllocatorConfig::parse(conf).with_context(|| format!("--alloc-conf {conf:?}"))?;
            for &policy in &policies {
                let label = match (conf.is_empty(), policy) {
                    (true, PolicyName::PyTorch) => "PyTorch's defaults".to_string(),
                    (true, p) => format!("--policy {p}"),
                    (false, PolicyName::PyTorch) => format!("PYTORCH_CUDA_ALLOC_CONF={conf}"),
                    (false, p) => format!("PYTORCH_CUDA_ALLOC_CONF={conf} --policy {p}"),
                };
                out.push((label, Estimator { alloc: alloc.clone(), policy, ..Estimator::default() }));
            }
        }
        Ok(out)
    }
}

impl PlanArgs {
    /// The inference configuration the arguments describe, on `gpu`.
    pub fn infer_config(&self, gpu: &GpuSpec) -> Result<InferConfig> {
        check_tokens(self.batch, self.seq)?;
        let engine_flags = [
            ("--gpu-memory-utilization", self.gpu_memory_utilization.is_some()),
            ("--max-num-batched-tokens", self.max_num_batched_tokens.is_some()),
            ("--max-num-seqs", self.max_num_seqs.is_some()),
            ("--block-size", self.block_size.is_some()),
        ];
        if self.framework != Framework::Sglang && self.mem_fraction_static.is_some() {
            bail!("--mem-fraction-static: an SGLang setting (--framework sglang)");
        }
        let quantize = self.quantize_config()?;
        // bitsandbytes runs inside transformers: --quantize picks its forward, as --offload
        // picks DeepSpeed for training.
        let framework = match (self.framework, quantize) {
            (Framework::Auto, Some(_)) => Framework::HuggingFace,
            (Framework::Vllm | Framework::Sglang, Some(_)) => bail!(
                "--quantize: bitsandbytes quantizes transformers' linear layers as it loads them (--framework hf); \
                 {} loads checkpoints quantized ahead: --weights int8, int4 or fp8",
                self.framework.arg()
            ),
            (f, _) => f,
        };
        let serving = matches!(framework, Framework::Auto | Framework::Vllm | Framework::Sglang);
        if serving && self.all_logits {
            bail!("--all-logits: a serving engine keeps the last positions' logits (--all-logits applies to --framework hf)");
        }
        if serving && self.attention == Attention::Eager {
            bail!(
                "--attention eager: serving engines run their own attention kernels (eager applies to --framework hf)"
            );
        }
        let runtime = match framework {
            Framework::Sglang => {
                if let Some((flag, _)) = engine_flags.iter().find(|(_, set)| *set) {
                    bail!("{flag}: a vLLM setting (--framework vllm); SGLang's is --mem-fraction-static");
                }
                let share = self.mem_fraction_static.map(|f| Sglang { mem_fraction_static: f });
                Runtime::Sglang(share.unwrap_or_else(|| Sglang::defaults(gpu, self.tp)))
            }
            Framework::Auto | Framework::Vllm => {
                let d = Serving::vllm_defaults(gpu);
                let serving = Serving {
                    gpu_memory_utilization: self.gpu_memory_utilization.unwrap_or(d.gpu_memory_utilization),
                    max_num_batched_tokens: self.max_num_batched_tokens.unwrap_or(d.max_num_batched_tokens),
                    max_num_seqs: self.max_num_seqs.unwrap_or(d.max_num_seqs),
                    block_size: self.block_size.unwrap_or(d.block_size),
                };
                // vLLM's SchedulerConfig refuses to start with fewer tokens a step than sequences
                // (every running sequence takes at least one token of a step).
                if serving.max_num_batched_tokens < serving.max_num_seqs {
                    bail!(
                        "vLLM refuses to start: max_num_batched_tokens ({}) must be greater than or equal to \
                         max_num_seqs ({}) (--max-num-batched-tokens, --max-num-seqs; defaults {} and {} on this GPU)",
                        serving.max_num_batched_tokens,
                        serving.max_num_seqs,
                        d.max_num_batched_tokens,
                        d.max_num_seqs
                    );
                }
                Runtime::Vllm(serving)
            }
            Framework::HuggingFace => {
                if let Some((flag, _)) = engine_flags.iter().find(|(_, set)| *set) {
                    bail!("{flag}: a vLLM setting (--framework vllm); transformers' forward has none");
                }
                if let Some(kv) = self.kv_dtype {
                    bail!(
                        "--kv-dtype {}: transformers caches keys and values in the weights' dtype (--weights)",
                        kv.name()
                    );
                }
                Runtime::Transformers { attention: self.attention, all_logits: self.all_logits }
            }
            other => {
                bail!(
                    "--framework {}: plans training; --infer takes auto or vllm (vLLM's engine), sglang or hf",
                    other.arg()
                )
            }
        };
        Ok(InferConfig {
            runtime,
            tensor: self.tp,
            batch: self.batch,
            seq: self.seq,
            weights: self.weights,
            kv_bytes: match self.kv_dtype {
                Some(KvArg::Fp8) => 1.0,
                Some(KvArg::Bf16) | None => 2.0,
            },
            quantize,
        })
    }

    /// The bitsandbytes quantization --quantize, --double-quant and --compute-dtype describe.
    fn quantize_config(&self) -> Result<Option<Bnb>> {
        let Some(q) = self.quantize else { return Ok(None) };
        if !matches!(self.weights, WeightFormat::Fp32 | WeightFormat::Bf16) {
            bail!(
                "--weights {} with --quantize: --weights is the dtype bitsandbytes leaves the head, embeddings \
                 and norms in (fp32, or bf16 for any 16-bit load); --quantize {} sets the linear layers'",
                self.weights.name(),
                q.to_possible_value().map_or_else(String::new, |v| v.get_name().to_string())
            );
        }
        let quant_type = match q {
            QuantizeArg::Int8 => {
                if self.double_quant {
                    bail!("--double-quant: quantizes 4-bit layers' absmax values (--quantize nf4 or fp4); int8 keeps an fp32 scale a row");
                }
                if let Some(c) = self.compute_dtype {
                    bail!(
                        "--compute-dtype {}: a 4-bit setting (--quantize nf4 or fp4); LLM.int8() multiplies in int8 and fp16",
                        c.name()
                    );
                }
                return Ok(Some(Bnb::Int8));
            }
            QuantizeArg::Nf4 => QuantType::Nf4,
            QuantizeArg::Fp4 => QuantType::Fp4,
        };
        Ok(Some(Bnb::FourBit {
            quant_type,
            double_quant: self.double_quant,
            compute: self.compute_dtype.unwrap_or(ComputeDtype::Fp32),
        }))
    }

    /// `--infer` plans one tensor-parallel group of a generating model.
    pub fn check_inference(&self, model: &Model) -> Result<()> {
        if !model.generates() {
            bail!("{} is an encoder: --infer plans generation with a KV cache; plan its training instead", model.name);
        }
        check_positions(model, self.seq)?;
        if self.pp > 1 || self.cp > 1 || self.gpus != self.tp {
            bail!("--infer plans one tensor-parallel group: set --gpus equal to --tp (and no --pp or --cp)");
        }
        if !model.heads.is_multiple_of(self.tp) {
            bail!("--tp {} does not divide the {} attention heads", self.tp, model.heads);
        }
        Ok(())
    }
}

/// Learned position tables end at `max_position`: no longer sequence exists.
pub fn check_positions(model: &Model, seq: u64) -> Result<()> {
    if model.learned_positions() && seq > model.max_position {
        bail!(
            "--seq {seq}: {} has {} learned positions, and no sequence may be longer",
            model.name,
            model.max_position
        );
    }
    Ok(())
}
