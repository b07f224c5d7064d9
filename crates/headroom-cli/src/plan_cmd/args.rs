//! `headroom plan`'s flags: each read into the library's request for its mode
//! ([`TrainRequest`], [`InferRequest`]), which fills in the defaults and checks the domain.
//! What this file checks is the flags themselves: that each belongs to the mode asked for.

use crate::named_arg::named;
use crate::target_arg::Target;
use anyhow::{bail, Context, Result};
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::Args;
use headroom_alloc::PolicyName;
use headroom_plan::bnb::ComputeDtype;
use headroom_plan::emit::Engine;
use headroom_plan::estimate::Estimator;
use headroom_plan::infer::WeightFormat;
use headroom_plan::job::{
    Attention, BaseWeights, Checkpointing, Framework, LoraTargets, LossLife, Offload, Optimizer, OptimizerImpl,
    Precision, MOST_TOKENS,
};
use headroom_plan::model::Head;
use headroom_plan::names::Named;
use headroom_plan::parallel::{PipelineSchedule, StageOutputs};
use headroom_plan::request::{Compile, FinetuneMode, InferRequest, KvDtype, Quantize, Server, TrainRequest};
use headroom_plan::search::Held;

const JOB: &str = "Model and job";
const PARALLEL: &str = "Parallelism";
const LEVERS: &str = "Memory levers";
const ALLOCATOR: &str = "Allocator";
const ENGINE: &str = "Inference engine (--infer)";
const CALIBRATION: &str = "Calibration";
const OUTPUT: &str = "Questions and output";

/// Will it fit? Memory per GPU, term by term, for training or inference, and
/// the estimated step time.
///
/// Training: the job's step program — every allocation and free of building the model and
/// of three steps, the optimizer's included — replayed through PyTorch's caching allocator
/// (headroom's, decision for decision) on the memory PyTorch can have of the GPU: its
/// allocated and reserved peaks, the phase that peaks, and whether it runs out, where and by
/// how much. Who builds the program is chosen from a table, one builder per framework's
/// code, and the plan names it: transformers' own step recorded tensor by tensor (one model
/// replica per GPU, full fine-tuning, no or full checkpointing), torchtitan's FSDP2 and
/// pipeline ranks from their code, or the closed form's terms — weights, gradients and
/// optimizer state, Korthikanti et al.'s activations by attention kernel, layout and
/// checkpoint policy (`optimal` solves for the fastest schedule that fits), logits,
/// temporaries — laid out as a step for DeepSpeed, Megatron-LM and what no recording covers.
/// A --framework that no builder serves is refused with each builder's reason. --alloc-conf
/// and --policy replay it under other allocator settings; a job that does not fit is told
/// the levers that would make it fit (checkpointing, micro-batch with accumulation,
/// attention kernel, fused AdamW, expandable segments, LoRA/QLoRA, more GPUs), each planned
/// again, and one that reserves far more than it allocates, what expandable segments
/// save. Inference: as vLLM sizes its KV cache at start-up —
/// gpu_memory_utilization of the device, less the weights, the peak of its profile run (a
/// forward of max_num_batched_tokens tokens, then the sampler over max_num_seqs rows) and
/// the memory outside PyTorch — and how many sequences of --seq tokens that cache holds;
/// with --framework hf, transformers' own generate (its prompt's forward and --new-tokens'
/// decode steps, the cache growing a position a step) or, with --all-logits, an evaluation
/// loop's forward, replayed as its code was recorded tensor by tensor, or where no recording
/// serves (most families' eager attention, bitsandbytes, the families not recorded) its peak
/// moment in closed form; the plan says which.
///
/// Any other step — your own model, loss, optimizer and wrappers — can be recorded without a
/// GPU (`python -m headroom_gpu record`, docs/RECORDING.md) and planned with --program.
///
/// Your own model's layers, optimizer or script may keep more or less than any recipe:
/// --calibrate fits the plan to a memory snapshot of a smaller run of the same job
/// (torch.cuda.memory._dump_snapshot around one step), and plans the larger one from it.
///
/// --model takes a preset (llama-3-8b, mistral-7b, qwen2.5-7b, gpt2, t5-base,
/// bert-base-uncased, pythia-1b, ...) or the path of a Hugging Face config.json.
///
/// Exit status: 0 if it fits (with --infer and a serving engine: if the engine would start), 1
/// if not, 2 on bad input.
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
                        headroom plan --model t0-3b --gpu a100-80gb --precision fp32 --batch 8 --seq 64 --target-seq 4 --finetune lora --lora-rank 8 --lora-targets qv\n  \
                        headroom plan --model llama-3.1-8b --gpu a100-80gb --infer --framework hf --attention eager --batch 2 --seq 8192\n  \
                        headroom plan --model data/models/octocoder.json --gpu a100-40gb --infer --seq 80 --quantize fp4\n  \
                        headroom plan --model data/models/qwen3-1.7b.json --gpu h200 --precision bf16 --attention sdpa --batch 4 --seq 2048 --calibrate data/snapshots/qwen3-1.7b-train.pickle.gz --calibrate-batch 1 --calibrate-seq 512\n  \
                        headroom plan --model gpt2 --gpu l4 --batch 4 --seq 1024 --program data/recordings/gpt2-bf16-b4-s1024.jsonl\n  \
                        headroom plan --model gpt2 --gpu l4 --program data/recordings/gpt2-bf16-b2-s512.jsonl --program data/recordings/gpt2-bf16-b4-s1024.jsonl --max-batch\n  \
                        headroom plan --gpu l4 --gpu-memory 6GiB --program data/recordings/gpt2-bf16-b4-s1024.jsonl --recommend\n  \
                        headroom plan --config data/configs/torchtitan-llama3_8b.toml --gpu h100-sxm --gpus 8"
)]
#[command(mut_arg("model", |a| a.required(false)))]
pub struct PlanArgs {
    #[command(flatten)]
    pub target: Target,
    /// Read the job from FILE, the file the job already has: torchtitan's job TOML (.toml), a
    /// DeepSpeed config (.json; its "auto" values from --hf-args), accelerate's config or a
    /// torchtune recipe (.yaml), or a file holding a `vllm serve` or `python -m
    /// sglang.launch_server` line (an inference plan). The model is the file's where it names
    /// one. Flags given beside it override the file's values. Every field the plan does not
    /// follow is named in the output ("not honoured"; with --json, config.not_honoured).
    #[arg(long, value_name = "FILE", help_heading = JOB, conflicts_with = "program")]
    pub config: Option<std::path::PathBuf>,
    /// With a DeepSpeed --config: transformers' TrainingArguments as JSON
    /// (TrainingArguments.to_json_string()), which fill the DeepSpeed file's "auto" values and
    /// give what it leaves to the Trainer (per_device_train_batch_size,
    /// gradient_accumulation_steps, bf16, fp16, gradient_checkpointing, optim).
    #[arg(long, value_name = "FILE", help_heading = JOB, requires = "config")]
    pub hf_args: Option<std::path::PathBuf>,
    /// Estimate training (the default).
    #[arg(long, conflicts_with = "infer", help_heading = JOB)]
    pub train: bool,
    /// Estimate inference.
    #[arg(long, help_heading = JOB)]
    pub infer: bool,
    /// Plan the step recorded in FILE instead of one the planner builds: a JSONL step program
    /// as `python -m headroom_gpu record` writes it from your own model, loss and optimizer
    /// under fake tensors (no GPU), or as --dump-program writes it. It is replayed as recorded
    /// on --gpu's memory less what lives outside PyTorch, under --alloc-conf and --policy, at
    /// the shape it was recorded at (its first line says it; --batch and --seq default to it),
    /// and every flag that shapes a program is the recording's own and refused, but
    /// --checkpoint full or every-k (made of the recording) and --gpus N (the recording is one
    /// rank's step; NCCL's buffers are added). --model is optional: without it the model is the
    /// recording's own, named as the recording names it. Given two or three times, the same
    /// step recorded at two or three shapes: each tensor's size law is fitted from its sizes, so
    /// --batch and --seq plan other shapes and --max-batch and --max-seq search them (two
    /// batches among the shapes for --batch, two lengths for --seq). With --recommend, the
    /// recording's levers are searched: allocator settings, checkpointing by layers and the
    /// micro-batch.
    #[arg(long, value_name = "FILE", help_heading = JOB, action = clap::ArgAction::Append,
          conflicts_with_all = ["infer", "emit", "calibrate"])]
    pub program: Vec<std::path::PathBuf>,
    /// Micro-batch (training) or concurrent sequences (inference) [default: 1].
    #[arg(long, value_parser = positive(), help_heading = JOB)]
    pub batch: Option<u64>,
    /// Sequence length in tokens [default: 2048]; an encoder-decoder's (T5's) encoder input.
    #[arg(long, value_parser = tokens(), help_heading = JOB)]
    pub seq: Option<u64>,
    /// An encoder-decoder's (T5's) decoder length in tokens: its labels, shifted right into the
    /// decoder, often far shorter than the input (a class name, a summary) [default: --seq].
    /// Refused for a model with one stack (a decoder or an encoder), whose length is --seq.
    #[arg(long, value_name = "N", value_parser = tokens(), help_heading = JOB)]
    pub target_seq: Option<u64>,
    /// Micro-batches per optimizer step (gradient accumulation; the pipeline's micro-batches)
    /// [default: 1].
    #[arg(long, value_parser = positive(), help_heading = JOB)]
    accumulation: Option<u64>,
    /// Sequences per optimizer step over all GPUs for --recommend (default: batch × accumulation × data-parallel GPUs).
    #[arg(long, value_parser = positive(), help_heading = JOB)]
    pub global_batch: Option<u64>,
    /// Numerics of the step [default: mixed].
    #[arg(long, value_parser = named::<Precision>(), help_heading = JOB)]
    precision: Option<Precision>,
    /// [default: adamw]
    #[arg(long, value_parser = named::<Optimizer>(), help_heading = JOB)]
    optimizer: Option<Optimizer>,
    /// AdamW's implementation: foreach (torch's default on CUDA: a copy of the second
    /// moments for the length of the step), fused (one kernel, no temporaries; what
    /// transformers' Trainer picks on torch >= 2.8) or for-loop [default: foreach under
    /// torch.optim; Megatron-LM and DeepSpeed run their own fused Adam].
    #[arg(long, value_parser = named::<OptimizerImpl>(), help_heading = JOB)]
    optimizer_impl: Option<OptimizerImpl>,
    /// The attention kernel [default: sdpa].
    #[arg(long, value_parser = named::<Attention>(), help_heading = JOB)]
    attention: Option<Attention>,
    /// Whose code runs the step. Training: auto (transformers where it runs the job — one
    /// model replica per GPU, full fine-tuning, no or full checkpointing —, DeepSpeed with
    /// --offload, Megatron-LM otherwise), hf, deepspeed (transformers' code under DeepSpeed's
    /// ZeRO engine at its default buckets), megatron or torchtitan (PyTorch's FSDP2, TP, PP and
    /// CP). With --infer: auto and vllm (vLLM's serving engine: its KV cache pool sized at
    /// start-up), sglang (SGLang's token pool: --mem-fraction-static of the free memory at
    /// start-up less the weights), hf (transformers' own forward with a cache, as generate's
    /// first one runs it) [default: auto].
    #[arg(long, value_parser = framework(), help_heading = JOB)]
    framework: Option<String>,
    /// The output layer and loss: vocabulary logits for every position (causal-lm,
    /// masked-lm) or a classifier (seq-cls) [default: causal-lm].
    #[arg(long, value_parser = named::<Head>(), help_heading = JOB)]
    head: Option<Head>,
    /// Full fine-tuning, LoRA adapters over a frozen base, or QLoRA (LoRA over a 4-bit NF4
    /// base with double quantization; --base-weights fp4 and --double-quant off change its
    /// storage) [default: full].
    #[arg(long, value_parser = named::<FinetuneMode>(), help_heading = JOB)]
    finetune: Option<FinetuneMode>,
    /// LoRA rank (with --finetune lora or qlora) [default: 16].
    #[arg(long, value_parser = positive(), help_heading = JOB)]
    lora_rank: Option<u64>,
    /// Linear layers that get adapters (with --finetune lora or qlora): every one, or the query
    /// and value projections [default: all].
    #[arg(long, value_parser = named::<LoraTargets>(), help_heading = JOB)]
    lora_targets: Option<LoraTargets>,
    /// Storage of the frozen base under LoRA (qlora implies nf4). fp4 stores what nf4 stores
    /// (two weights a byte and the same absmax; only the 16-value code differs): a QLoRA job
    /// with either replays the same recorded step.
    #[arg(long, value_parser = named::<BaseWeights>(), help_heading = JOB)]
    base_weights: Option<BaseWeights>,
    /// The model run through torch.compile: what its graphs hold at each moment of the step
    /// (less than the eager code: norms and activation functions are recomputed in the
    /// backward), as recorded for decoders at fp32, bf16 and AMP without checkpointing and at
    /// fp32 with full checkpointing; elsewhere the eager code's. Under --framework torchtitan,
    /// what its `compile.components` name: `all` (the default: each block and the loss, as
    /// torchtitan has compiled them since April 2025) or `model` (the blocks alone, the loss
    /// eager, as before).
    #[arg(long, num_args = 0..=1, default_missing_value = "all", value_name = "COMPONENTS",
          value_parser = named::<Compile>(), help_heading = JOB)]
    compile: Option<Compile>,
    /// GPUs in the job (at most 2^20); data parallelism is what tensor × pipeline × context
    /// parallelism leaves [default: 1].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 20), help_heading = PARALLEL)]
    pub gpus: Option<u64>,
    /// Tensor-parallel GPUs (keep it inside a node) [default: 1; with --infer, --gpus].
    #[arg(long, value_parser = positive(), help_heading = PARALLEL)]
    pub tp: Option<u64>,
    /// Pipeline stages (1F1B). Where they do not divide the layers, the first and last stage
    /// hold ⌈layers / pp⌉ and the middle ones the rest (Megatron's
    /// --decoder-first/last-pipeline-num-layers) [default: 1].
    #[arg(long, value_parser = positive(), help_heading = PARALLEL)]
    pub pp: Option<u64>,
    /// Model chunks per pipeline stage: more than 1 is the interleaved schedule
    /// [default: 1, or 2 with --pp-schedule interleaved-1f1b, zero-bubble or zbv, as torchtitan].
    #[arg(long, value_parser = positive(), help_heading = PARALLEL)]
    vpp: Option<u64>,
    /// PyTorch's pipeline schedule (torchtitan's pipeline_parallel_schedule) [default: 1f1b,
    /// or interleaved-1f1b with --vpp 2 or more]. Under --framework torchtitan every pipeline
    /// rank is planned from the schedule's own order of forwards and backwards, and the rank
    /// that peaks is reported: 1f1b keeps min(micro-batches, pp - rank) micro-batches in
    /// flight (--accumulation is the micro-batch count), interleaved-1f1b more of smaller
    /// chunks; zero-bubble and zbv (torchtitan only) split each backward and keep the linears'
    /// inputs until the weights' half runs.
    #[arg(long, value_parser = named::<PipelineSchedule>(), help_heading = PARALLEL)]
    pp_schedule: Option<PipelineSchedule>,
    /// What each pipeline stage keeps of its micro-batches' outputs once their backward has
    /// run (PyTorch's output_chunks, which step() merges and returns) [default: none, as
    /// torchtitan runs since October 2025; every for a PyTorch before 2.8]. Under
    /// --framework torchtitan with --pp.
    #[arg(long, value_parser = named::<StageOutputs>(), help_heading = PARALLEL)]
    pp_outputs: Option<StageOutputs>,
    /// Context-parallel GPUs (the sequence split across GPUs) [default: 1].
    #[arg(long, value_parser = positive(), help_heading = PARALLEL)]
    pub cp: Option<u64>,
    /// Turn off Megatron's sequence parallelism (on by default with --tp).
    #[arg(long, help_heading = PARALLEL)]
    no_sequence_parallel: bool,
    /// Overlap tensor-parallel communication with the GEMMs (Transformer Engine, Megatron's --tp-comm-overlap).
    #[arg(long, help_heading = PARALLEL)]
    tp_comm_overlap: bool,
    /// ZeRO stage over the data-parallel GPUs (FSDP: 2 = SHARD_GRAD_OP, 3 = FULL_SHARD; under
    /// --framework torchtitan, FSDP2's reshard_after_forward False or True) [default: 0, or 3
    /// with --framework torchtitan on more than one data-parallel GPU, as torchtitan shards]
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=3), help_heading = PARALLEL)]
    zero: Option<u8>,
    /// HSDP under --framework torchtitan: the data-parallel GPUs as this many replicas of an
    /// FSDP group, each sharding the model states over the rest (torchtitan's
    /// data_parallel_replicate_degree); must divide them [default: 1]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), help_heading = PARALLEL)]
    dp_replicate: Option<u64>,
    /// none, full, selective (Megatron's: the attention core recomputed), per-op (torchtitan's:
    /// every op but attention and every other matrix multiply), every-K (e.g. every-4), or
    /// optimal [default: none].
    #[arg(long, value_parser = checkpointing, help_heading = LEVERS)]
    pub checkpoint: Option<Checkpointing>,
    /// transformers' `model.config.use_cache` in the training forward. true, transformers'
    /// default, what a script gets unless it sets `model.config.use_cache = False` and what the
    /// dev grid's GPU runs measured: the forward builds a DynamicCache and copies each layer's
    /// key and value into it. Under
    /// --checkpoint full it changes nothing (transformers turns the cache off). It moves the
    /// peak of the families that fuse the query, key and value into one layer (GPT-2, Phi-3,
    /// GPT-NeoX, BLOOM), recorded both ways; any other family plans either setting from one
    /// recording [default: true].
    #[arg(long, value_name = "true|false", value_parser = clap::value_parser!(bool), help_heading = LEVERS)]
    use_cache: Option<bool>,
    /// How long the training loop keeps the step's loss, and with it what the loss's graph
    /// holds after the backward: under --checkpoint full, T5's zero position bias and, with LoRA or
    /// QLoRA, the input embeddings' output that peft's enable_input_require_grads makes require
    /// a gradient, each with its .grad. It moves the plan only where the step's loss holds such
    /// tensors, which the plan's text names [default: trainer].
    #[arg(long, value_parser = named::<LossLife>(), help_heading = LEVERS)]
    loss_lives: Option<LossLife>,
    /// The model built from its config on the GPU (transformers' from_config under
    /// torch.device("cuda")), where from_pretrained builds it on the meta device and loads
    /// the weights: a tied output layer's own weight is made after the model's last weight and
    /// freed as the embeddings are tied, which moves where the step's segments fall
    /// [default: false].
    #[arg(long, value_name = "true|false", value_parser = clap::value_parser!(bool), help_heading = LEVERS)]
    built_on_device: Option<bool>,
    /// CPU offload (DeepSpeed ZeRO-Offload): the optimizer, or the optimizer and the
    /// parameters (needs --zero 3) [default: none].
    #[arg(long, value_parser = named::<Offload>(), help_heading = LEVERS)]
    offload: Option<Offload>,
    /// The caching allocator's settings, in PYTORCH_CUDA_ALLOC_CONF syntax (e.g.
    /// "expandable_segments:True"): the job is replayed under them. Repeat to compare
    /// settings; the first is the plan's.
    #[arg(long = "alloc-conf", value_name = "STR", help_heading = ALLOCATOR)]
    pub alloc_conf: Vec<String>,
    /// The allocation policy the job is replayed under: pytorch (PyTorch's caching
    /// allocator, the default), expandable, headroom, lifetime or planned (headroom's own,
    /// as its PyTorch plug-in runs them). Repeat to compare; the first is the plan's.
    #[arg(long = "policy", value_name = "NAME", help_heading = ALLOCATOR)]
    pub policy: Vec<PolicyName>,
    /// Inference weight format (fp32 and bf16 with --framework hf; with --quantize, the dtype
    /// of what bitsandbytes leaves unquantized) [default: bf16].
    #[arg(long, value_parser = named::<WeightFormat>(), help_heading = ENGINE)]
    weights: Option<WeightFormat>,
    /// Inference KV-cache element width [default: bf16; with --framework hf the weights'].
    #[arg(long, value_parser = named::<KvDtype>(), help_heading = ENGINE)]
    kv_dtype: Option<KvDtype>,
    /// Quantize the linear layers as transformers loads them with bitsandbytes
    /// (BitsAndBytesConfig; implies --framework hf). int8: LLM.int8() — int8 weights with an
    /// fp32 scale a row, and each layer's input columns above 6.0 multiplied in fp16. nf4, fp4:
    /// two weights a byte with an fp32 absmax per 64, the whole weight dequantized for each
    /// layer's multiply over the prompt (bitsandbytes up to 0.49; 0.50's fused kernel skips
    /// that copy). The head, embeddings, norms and a mixture's experts keep --weights' dtype
    /// (fp32, or bf16 for any 16-bit load), as do the activations and the cache. Over bf16
    /// weights, int8, and nf4 or fp4 (stored as nf4 is) as transformers loads them by default
    /// (`--quantize nf4` alone: no double quantization, fp32 compute) or as QLoRA loads them
    /// (`--double-quant --compute-dtype bf16`) are replayed from transformers' and bitsandbytes'
    /// code as recorded where the family was; the rest is planned in closed form.
    #[arg(long, value_parser = named::<Quantize>(), help_heading = ENGINE)]
    quantize: Option<Quantize>,
    /// With --quantize nf4 or fp4, or a 4-bit LoRA base (--finetune qlora):
    /// bnb_4bit_use_double_quant — each block of 64 weights' absmax quantized again to a byte,
    /// with an fp32 absmax per 256 of them (0.127 bit a weight), or kept in fp32 (off: 0.5 bit
    /// a weight, and no absmax to dequantize before each layer's weight). QLoRA replays its
    /// recorded step with each layer's stored state and dequantization changed by bitsandbytes'
    /// rule. `--double-quant` alone is on [default: off with --quantize, transformers' default;
    /// on with --finetune qlora, QLoRA's].
    #[arg(long, num_args = 0..=1, default_missing_value = "on", value_name = "on|off",
          value_parser = clap::builder::PossibleValuesParser::new(["on", "off"]).map(|s| s == "on"),
          help_heading = ENGINE)]
    double_quant: Option<bool>,
    /// With --quantize nf4 or fp4: bnb_4bit_compute_dtype, the dtype each layer casts its
    /// input and dequantized weight to [default: fp32, transformers' default].
    #[arg(long, value_parser = named::<ComputeDtype>(), help_heading = ENGINE)]
    compute_dtype: Option<ComputeDtype>,
    /// With --framework hf: plan a forward that keeps every position's logits (an evaluation
    /// loop's model(input_ids)) instead of generate's first forward, which keeps the last
    /// position's.
    #[arg(long, help_heading = ENGINE)]
    all_logits: bool,
    /// With --framework hf: generate this many tokens after the prompt of --seq tokens
    /// (`model.generate(max_new_tokens=N)`, greedy, its cache growing a position a step)
    /// [default: 1, generate's first forward alone].
    #[arg(long, value_parser = tokens(), help_heading = ENGINE)]
    new_tokens: Option<u64>,
    /// vLLM: the share of the GPU's memory the engine may take, weights, profile run and KV
    /// cache together [default: 0.9].
    #[arg(long, value_parser = share, help_heading = ENGINE)]
    gpu_memory_utilization: Option<f64>,
    /// vLLM: tokens in one step, the length of its profile run's forward [default: 8192 on
    /// GPUs of 70 GiB or more but the A100, 2048 elsewhere, as `vllm serve`].
    #[arg(long, value_parser = tokens(), help_heading = ENGINE)]
    max_num_batched_tokens: Option<u64>,
    /// vLLM: sequences in one step, the rows its profile run samples [default: 1024 on GPUs
    /// of 70 GiB or more but the A100, 256 elsewhere, as `vllm serve`].
    #[arg(long, value_parser = tokens(), help_heading = ENGINE)]
    max_num_seqs: Option<u64>,
    /// vLLM: tokens per KV-cache block; a sequence takes whole blocks [default: 16].
    #[arg(long, value_parser = positive(), help_heading = ENGINE)]
    block_size: Option<u64>,
    /// SGLang: the share of the free memory at start-up the weights and the KV pool take;
    /// the rest is left for activations and CUDA graphs [default: SGLang's own, from the
    /// GPU's memory and --tp: 0.834 on one H100].
    #[arg(long, value_parser = share, help_heading = ENGINE)]
    mem_fraction_static: Option<f64>,
    /// Fit the plan to a memory snapshot of a smaller run of the same job (a pickle from
    /// torch.cuda.memory._dump_snapshot, recorded around one training step): what your own
    /// layers keep, what your optimizer allocates and what the script holds between steps,
    /// measured phase by phase. Repeat it with snapshots at two or more sequence lengths to
    /// fit eager attention's s × s matrices apart from what grows with the tokens.
    #[arg(long, value_name = "SNAPSHOT", conflicts_with = "recommend", help_heading = CALIBRATION)]
    pub calibrate: Vec<std::path::PathBuf>,
    /// The micro-batch each --calibrate run used, in the same order (one value: all of them;
    /// default: --batch).
    #[arg(long, value_parser = positive(), help_heading = CALIBRATION)]
    pub calibrate_batch: Vec<u64>,
    /// The sequence length each --calibrate run used, in the same order (one value: all of
    /// them; default: --seq).
    #[arg(long, value_parser = tokens(), help_heading = CALIBRATION)]
    pub calibrate_seq: Vec<u64>,
    /// Also find the largest micro-batch that fits (searched up to 2^40).
    #[arg(long, help_heading = OUTPUT)]
    pub max_batch: bool,
    /// Also find the longest sequence that fits at this batch (training or inference; up to
    /// the model's learned positions, or 2^24 tokens).
    #[arg(long, help_heading = OUTPUT)]
    pub max_seq: bool,
    /// Search precision, attention kernel, checkpointing, the tensor × pipeline × context ×
    /// data split of --gpus, ZeRO stage, offload and micro-batch (with gradient accumulation
    /// to --global-batch sequences per step) for the configurations that fit, fastest first.
    /// With --program: the allocator settings, checkpointing by layers and, from recordings at
    /// two micro-batches, the micro-batch; what the recording fixes is named, to record again.
    #[arg(long, help_heading = OUTPUT)]
    pub recommend: bool,
    /// Print the configuration for an engine (the best recommendation with --recommend).
    #[arg(long, value_parser = named::<Engine>(), help_heading = OUTPUT)]
    pub emit: Option<Engine>,
    /// Write the job's step program — every allocation and free of its steps, at the
    /// planned shape, the one the verdict came from — as a JSONL trace that `headroom
    /// replay` reads.
    #[arg(long, value_name = "FILE", help_heading = OUTPUT)]
    pub dump_program: Option<std::path::PathBuf>,
    /// Print one JSON object.
    #[arg(long, help_heading = OUTPUT)]
    pub json: bool,
}

/// A whole number of at least 1.
fn positive() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(1..)
}

/// A token count, up to [`MOST_TOKENS`].
fn tokens() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(1..=MOST_TOKENS)
}

/// A share in (0, 1].
fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 1.0 => Ok(x),
        Ok(x) => Err(format!("{x} is not in (0, 1]: the share of the GPU's memory the engine may take")),
        Err(_) => Err(format!("{s:?} is not a number (e.g. 0.9)")),
    }
}

fn checkpointing(s: &str) -> Result<Checkpointing, String> {
    Checkpointing::parse(s)
}

/// `--framework`: a training framework's name or a server's, each listed with its help.
fn framework() -> impl TypedValueParser<Value = String> {
    let mut seen = Vec::new();
    let mut values = Vec::new();
    let train = Framework::ALL.iter().map(|f| (f.arg(), f.help()));
    let serve = Server::ALL.iter().map(|s| (s.arg(), s.help()));
    for (name, help) in train.chain(serve) {
        if !seen.contains(&name) {
            seen.push(name);
            values.push(PossibleValue::new(name).help(help));
        }
    }
    PossibleValuesParser::new(values)
}

/// A flag that was given, by its name.
type Given = (&'static str, bool);

impl PlanArgs {
    /// What the command line fixed, which `--recommend` holds: precision, attention kernel,
    /// framework (other than auto) and offload (fine-tuning and the optimizer are the job's).
    pub fn held(&self) -> Held {
        Held {
            precision: self.precision,
            attention: self.attention,
            framework: self.framework.as_deref().and_then(Framework::from_arg).filter(|f| *f != Framework::Auto),
            offload: self.offload,
        }
    }

    /// Whether `--checkpoint` was given: a recording's search holds it.
    pub fn checkpoint_given(&self) -> bool {
        self.checkpoint.is_some()
    }

    /// Whether the job fine-tunes a pretrained model (`--finetune` given, full included).
    pub fn fine_tuning(&self) -> bool {
        self.finetune.is_some()
    }

    /// The flags given that only `--infer` reads.
    fn inference_flags(&self) -> [Given; 11] {
        [
            ("--new-tokens", self.new_tokens.is_some()),
            ("--weights", self.weights.is_some()),
            ("--kv-dtype", self.kv_dtype.is_some()),
            ("--quantize", self.quantize.is_some()),
            ("--compute-dtype", self.compute_dtype.is_some()),
            ("--all-logits", self.all_logits),
            ("--gpu-memory-utilization", self.gpu_memory_utilization.is_some()),
            ("--max-num-batched-tokens", self.max_num_batched_tokens.is_some()),
            ("--max-num-seqs", self.max_num_seqs.is_some()),
            ("--block-size", self.block_size.is_some()),
            ("--mem-fraction-static", self.mem_fraction_static.is_some()),
        ]
    }

    /// The flags given that only training reads.
    fn training_flags(&self) -> [Given; 31] {
        [
            ("--train", self.train),
            ("--target-seq", self.target_seq.is_some()),
            ("--program", !self.program.is_empty()),
            ("--accumulation", self.accumulation.is_some()),
            ("--global-batch", self.global_batch.is_some()),
            ("--precision", self.precision.is_some()),
            ("--optimizer", self.optimizer.is_some()),
            ("--optimizer-impl", self.optimizer_impl.is_some()),
            ("--head", self.head.is_some()),
            ("--finetune", self.finetune.is_some()),
            ("--lora-rank", self.lora_rank.is_some()),
            ("--lora-targets", self.lora_targets.is_some()),
            ("--base-weights", self.base_weights.is_some()),
            ("--compile", self.compile.is_some()),
            ("--vpp", self.vpp.is_some()),
            ("--pp-schedule", self.pp_schedule.is_some()),
            ("--pp-outputs", self.pp_outputs.is_some()),
            ("--no-sequence-parallel", self.no_sequence_parallel),
            ("--tp-comm-overlap", self.tp_comm_overlap),
            ("--zero", self.zero.is_some()),
            ("--dp-replicate", self.dp_replicate.is_some()),
            ("--checkpoint", self.checkpoint.is_some()),
            ("--use-cache", self.use_cache.is_some()),
            ("--loss-lives", self.loss_lives.is_some()),
            ("--built-on-device", self.built_on_device.is_some()),
            ("--offload", self.offload.is_some()),
            ("--alloc-conf", !self.alloc_conf.is_empty()),
            ("--policy", !self.policy.is_empty()),
            ("--calibrate", !self.calibrate.is_empty()),
            ("--max-batch", self.max_batch),
            ("--dump-program", self.dump_program.is_some()),
        ]
    }

    /// The training job the flags describe, as the library's request: over `base` (a
    /// --config file's job) where given, each flag given overriding it.
    pub fn train_request(&self, base: Option<&TrainRequest>) -> Result<TrainRequest> {
        if let Some((flag, _)) = self.inference_flags().iter().find(|(_, given)| *given) {
            bail!("{flag} applies to inference: add --infer (or leave it out for a training plan)");
        }
        if self.calibrate.is_empty() {
            for (flag, given) in [
                ("--calibrate-batch", !self.calibrate_batch.is_empty()),
                ("--calibrate-seq", !self.calibrate_seq.is_empty()),
            ] {
                if given {
                    bail!("{flag} gives a --calibrate snapshot's shape: add --calibrate SNAPSHOT");
                }
            }
        }
        let d = base.copied().unwrap_or_default();
        let framework = match self.framework.as_deref().map(|f| (f, Framework::from_arg(f))) {
            None => d.framework,
            Some((_, Some(f))) => f,
            Some((name, None)) => bail!(
                "--framework {name} plans inference: add --infer (training takes {})",
                Framework::ALL.iter().map(|f| f.arg()).collect::<Vec<_>>().join(", ")
            ),
        };
        Ok(TrainRequest {
            micro_batch: self.batch.unwrap_or(d.micro_batch),
            seq: self.seq.unwrap_or(d.seq),
            target_seq: self.target_seq.or(d.target_seq),
            accumulation: self.accumulation.unwrap_or(d.accumulation),
            gpus: self.gpus.unwrap_or(d.gpus),
            tensor: self.tp.unwrap_or(d.tensor),
            pipeline: self.pp.unwrap_or(d.pipeline),
            context: self.cp.unwrap_or(d.context),
            virtual_stages: self.vpp.or(d.virtual_stages),
            schedule: self.pp_schedule.or(d.schedule),
            stage_outputs: self.pp_outputs.or(d.stage_outputs),
            sequence_parallel: d.sequence_parallel && !self.no_sequence_parallel,
            tp_comm_overlap: d.tp_comm_overlap || self.tp_comm_overlap,
            zero: self.zero.or(d.zero),
            replicate: self.dp_replicate.unwrap_or(d.replicate),
            finetune: self.finetune.unwrap_or(d.finetune),
            lora_rank: self.lora_rank.or(d.lora_rank),
            lora_targets: self.lora_targets.or(d.lora_targets),
            base_weights: self.base_weights.or(d.base_weights),
            double_quant: self.double_quant.or(d.double_quant),
            use_cache: self.use_cache.or(d.use_cache),
            loss_lives: self.loss_lives.or(d.loss_lives),
            built_on_device: self.built_on_device.or(d.built_on_device),
            offload: self.offload.unwrap_or(d.offload),
            precision: self.precision.unwrap_or(d.precision),
            optimizer: self.optimizer.unwrap_or(d.optimizer),
            optimizer_impl: self.optimizer_impl.or(d.optimizer_impl),
            attention: self.attention.unwrap_or(d.attention),
            framework,
            head: self.head.unwrap_or(d.head),
            checkpointing: self.checkpoint.unwrap_or(d.checkpointing),
            compile: self.compile.unwrap_or(d.compile),
        })
    }

    /// The inference job the flags describe, as the library's request: over `base` (a
    /// --config file's job) where given, each flag given overriding it.
    pub fn infer_request(&self, base: Option<&InferRequest>) -> Result<InferRequest> {
        if let Some((flag, _)) = self.training_flags().iter().find(|(_, given)| *given) {
            bail!("{flag} applies to training: leave out --infer for a training plan");
        }
        for (flag, given) in [
            ("--recommend", self.recommend),
            ("--emit", self.emit.is_some()),
            ("--calibrate-batch", !self.calibrate_batch.is_empty()),
            ("--calibrate-seq", !self.calibrate_seq.is_empty()),
        ] {
            if given {
                bail!("{flag} applies to training: leave out --infer for a training plan");
            }
        }
        let d = base.copied().unwrap_or_default();
        let server = match self.framework.as_deref().map(|f| (f, Server::from_arg(f))) {
            None => d.server,
            Some((_, Some(s))) => s,
            Some((name, None)) => bail!(
                "--framework {name}: plans training; --infer takes {}",
                Server::ALL.iter().map(|s| s.arg()).collect::<Vec<_>>().join(", ")
            ),
        };
        Ok(InferRequest {
            server,
            batch: self.batch.unwrap_or(d.batch),
            seq: self.seq.unwrap_or(d.seq),
            gpus: self.gpus.unwrap_or(d.gpus),
            tensor: self.tp.or(d.tensor),
            pipeline: self.pp.unwrap_or(d.pipeline),
            context: self.cp.unwrap_or(d.context),
            weights: self.weights.unwrap_or(d.weights),
            kv_dtype: self.kv_dtype.or(d.kv_dtype),
            attention: self.attention.unwrap_or(d.attention),
            all_logits: d.all_logits || self.all_logits,
            new_tokens: self.new_tokens.unwrap_or(d.new_tokens),
            quantize: self.quantize.or(d.quantize),
            double_quant: self.double_quant.unwrap_or(d.double_quant),
            compute_dtype: self.compute_dtype.or(d.compute_dtype),
            gpu_memory_utilization: self.gpu_memory_utilization.or(d.gpu_memory_utilization),
            max_num_batched_tokens: self.max_num_batched_tokens.or(d.max_num_batched_tokens),
            max_num_seqs: self.max_num_seqs.or(d.max_num_seqs),
            block_size: self.block_size.or(d.block_size),
            mem_fraction_static: self.mem_fraction_static.or(d.mem_fraction_static),
        })
    }

    /// The allocator settings and policies to replay under, labelled as the user wrote them:
    /// every --alloc-conf under every --policy, the first the plan's.
    pub fn allocators(&self) -> Result<Vec<(String, Estimator)>> {
        let confs = if self.alloc_conf.is_empty() { vec![String::new()] } else { self.alloc_conf.clone() };
        let policies = if self.policy.is_empty() { vec![PolicyName::PyTorch] } else { self.policy.clone() };
        let mut out = Vec::new();
        for conf in &confs {
            for &policy in &policies {
                let estimator = Estimator::replaying(conf, policy).with_context(|| format!("--alloc-conf {conf:?}"))?;
                let label = match (conf.is_empty(), policy) {
                    (true, PolicyName::PyTorch) => "PyTorch's defaults".to_string(),
                    (true, p) => format!("--policy {p}"),
                    (false, PolicyName::PyTorch) => format!("PYTORCH_CUDA_ALLOC_CONF={conf}"),
                    (false, p) => format!("PYTORCH_CUDA_ALLOC_CONF={conf} --policy {p}"),
                };
                out.push((label, estimator));
            }
        }
        Ok(out)
    }
}
