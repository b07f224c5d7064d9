//! `headroom plan`: will this model, at this batch and sequence length, with
//! this precision and optimizer, fit on this GPU — term by term.

use crate::target_arg::Target;
use crate::Outcome;
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use headroom_alloc::units::format_size;
use headroom_plan::emit::{emit, Engine};
use headroom_plan::gpu::GpuSpec;
use headroom_plan::infer::{self, InferConfig, WeightFormat};
use headroom_plan::model::Model;
use headroom_plan::parallel::Parallelism;
use headroom_plan::search::{recommend, SearchSpace};
use headroom_plan::step::Phase;
use headroom_plan::train::{
    self, ActivationModel, Attention, BaseWeights, Checkpointing, Finetune, Framework, Head, LoraTargets, Offload,
    Optimizer, PipelineStage, Precision, TrainConfig,
};
use serde_json::json;

/// Will it fit? Memory per GPU, term by term, for training or inference, and
/// the estimated step time.
///
/// Training terms: weights, gradients and optimizer state (by precision,
/// optimizer, ZeRO stage, LoRA and offload), activations (by attention
/// kernel, parallel layout and checkpoint policy; `optimal` solves for the
/// fastest schedule that fits the GPU), logits and the loss, temporaries
/// (cuBLAS workspace, ZeRO-3's gathered layer, QLoRA's dequantized matrix,
/// the offload bucket), and the framework (CUDA context, NCCL, the
/// allocator's slack). Where transformers runs the job (--framework auto:
/// one model replica per GPU, full fine-tuning, no or full checkpointing),
/// activations come from recipes measured on its code and the peak is the
/// largest phase of the step — forward at the loss, backward, optimizer step
/// — as real steps show (docs/VALIDATION.md); elsewhere every term is summed
/// with Korthikanti's activations (Megatron). Inference: weights at their
/// width, the KV cache, the prefill activations, and how many sequences fit.
///
/// Parallelism: --gpus with --tp, --pp (--vpp), --cp; the rest is data
/// parallel with --zero. Fine-tuning: --finetune lora|qlora. Offload:
/// --offload optimizer|params. Step time counts FLOPs at 50% of the GPU's
/// dense peak, pipeline bubbles and collectives over NVLink or the network.
///
/// --model takes a preset (llama-3-8b, mistral-7b, qwen2.5-7b, gpt2, t5-base,
/// bert-base-uncased, pythia-1b, ...) or the path of a Hugging Face config.json.
///
/// Exit status: 0 if it fits, 1 if not, 2 on bad input.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  headroom plan --model llama-2-7b --gpu a100-80gb --train --batch 8 --seq 4096 --attention flash --checkpoint optimal\n  \
                        headroom plan --model llama-3-8b --gpu h100-sxm --gpus 8 --zero 3 --train --batch 4 --seq 8192 --max-batch\n  \
                        headroom plan --model llama-3-70b --gpu h100-sxm --gpus 64 --tp 8 --pp 2 --zero 1 --batch 1 --accumulation 16 --seq 8192 --checkpoint selective\n  \
                        headroom plan --model llama-3.1-8b --gpu rtx-4090 --finetune qlora --lora-rank 32 --seq 4096 --checkpoint full\n  \
                        headroom plan --model llama-2-70b --gpu a100-80gb --gpus 64 --batch 1 --global-batch 512 --recommend --emit megatron\n  \
                        headroom plan --model ./config.json --gpu l4 --infer --seq 4096 --batch 16 --weights int4 --json"
)]
pub struct PlanArgs {
    #[command(flatten)]
    target: Target,
    /// Estimate training (the default).
    #[arg(long, conflicts_with = "infer")]
    train: bool,
    /// Estimate inference.
    #[arg(long)]
    infer: bool,
    /// Micro-batch (training) or concurrent sequences (inference).
    #[arg(long, default_value_t = 1, value_parser = positive())]
    batch: u64,
    /// Sequence length in tokens.
    #[arg(long, default_value_t = 2048, value_parser = positive())]
    seq: u64,
    /// GPUs in the job (at most 2^20); data parallelism is what tensor × pipeline × context parallelism leaves.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    gpus: u64,
    /// Tensor-parallel GPUs (Megatron; keep it inside a node).
    #[arg(long, default_value_t = 1, value_parser = positive())]
    tp: u64,
    /// Pipeline stages (1F1B). Where they do not divide the layers, the
    /// first and last stage hold ⌈layers / pp⌉ and the middle ones the rest
    /// (Megatron's --decoder-first/last-pipeline-num-layers).
    #[arg(long, default_value_t = 1, value_parser = positive())]
    pp: u64,
    /// Model chunks per pipeline stage: more than 1 is the interleaved schedule.
    #[arg(long, conflicts_with = "infer", default_value_t = 1, value_parser = positive())]
    vpp: u64,
    /// Context-parallel GPUs (the sequence split across GPUs).
    #[arg(long, default_value_t = 1, value_parser = positive())]
    cp: u64,
    /// Turn off Megatron's sequence parallelism (on by default with --tp).
    #[arg(long, conflicts_with = "infer")]
    no_sequence_parallel: bool,
    /// Overlap tensor-parallel communication with the GEMMs (Transformer Engine, Megatron's --tp-comm-overlap).
    #[arg(long, conflicts_with = "infer")]
    tp_comm_overlap: bool,
    /// ZeRO stage over the data-parallel GPUs (FSDP: 2 = SHARD_GRAD_OP, 3 = FULL_SHARD).
    #[arg(long, conflicts_with = "infer", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=3))]
    zero: u8,
    /// Micro-batches per optimizer step (gradient accumulation; the pipeline's micro-batches).
    #[arg(long, conflicts_with = "infer", default_value_t = 1, value_parser = positive())]
    accumulation: u64,
    /// Sequences per optimizer step over all GPUs for --recommend (default: batch × accumulation × data-parallel GPUs).
    #[arg(long, conflicts_with = "infer", value_parser = positive())]
    global_batch: Option<u64>,
    /// Full fine-tuning, LoRA adapters over a frozen base, or QLoRA (LoRA over a 4-bit NF4 base).
    #[arg(long, conflicts_with = "infer", value_enum, default_value_t = FinetuneArg::Full)]
    finetune: FinetuneArg,
    /// LoRA rank.
    #[arg(long, conflicts_with = "infer", default_value_t = 16, value_parser = positive())]
    lora_rank: u64,
    /// Linear layers that get adapters: every one, or the query and value projections.
    #[arg(long, conflicts_with = "infer", value_enum, default_value_t = LoraTargetsArg::All)]
    lora_targets: LoraTargetsArg,
    /// Storage of the frozen base under LoRA (qlora implies nf4).
    #[arg(long, conflicts_with = "infer", value_enum)]
    base_weights: Option<BaseWeightsArg>,
    /// CPU offload (DeepSpeed ZeRO-Offload): the optimizer, or the optimizer and the parameters (needs --zero 3).
    #[arg(long, conflicts_with = "infer", value_enum, default_value_t = OffloadArg::None)]
    offload: OffloadArg,
    #[arg(long, conflicts_with = "infer", value_enum, default_value_t = PrecisionArg::Mixed)]
    precision: PrecisionArg,
    #[arg(long, conflicts_with = "infer", value_enum, default_value_t = OptimizerArg::Adamw)]
    optimizer: OptimizerArg,
    #[arg(long, conflicts_with = "infer", value_enum, default_value_t = AttentionArg::Sdpa)]
    attention: AttentionArg,
    /// Whose code runs the step. auto: Hugging Face transformers where it can run the job
    /// (one model replica per GPU, full fine-tuning, no or full checkpointing; activations
    /// from its measured recipes, the peak from the step's phases), Megatron-LM otherwise.
    #[arg(long, conflicts_with = "infer", value_enum, default_value_t = FrameworkArg::Auto)]
    framework: FrameworkArg,
    /// The output layer and loss: vocabulary logits for every position (causal-lm,
    /// masked-lm) or a classifier (seq-cls).
    #[arg(long, conflicts_with = "infer", value_enum, default_value_t = HeadArg::CausalLm)]
    head: HeadArg,
    /// none, full, selective, every-K (e.g. every-4), or optimal.
    #[arg(long, conflicts_with = "infer", default_value = "none")]
    checkpoint: String,
    /// Also find the largest micro-batch that fits (searched up to 2^40).
    #[arg(long, conflicts_with = "infer")]
    max_batch: bool,
    /// Search precision, attention kernel, checkpointing, the tensor ×
    /// pipeline × context × data split of --gpus, ZeRO stage, offload and
    /// micro-batch (with gradient accumulation to --global-batch sequences
    /// per step) for the configurations that fit, fastest first.
    #[arg(long, conflicts_with = "infer")]
    recommend: bool,
    /// Print the configuration for an engine (the best recommendation with --recommend).
    #[arg(long, conflicts_with = "infer", value_enum)]
    emit: Option<EngineArg>,
    /// Inference weight format.
    #[arg(long, requires = "infer", value_enum, default_value_t = WeightsArg::Bf16)]
    weights: WeightsArg,
    /// Inference KV-cache element width.
    #[arg(long, requires = "infer", value_enum, default_value_t = KvArg::Bf16)]
    kv_dtype: KvArg,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum PrecisionArg {
    /// 16-bit weights and gradients, fp32 master copy in the optimizer.
    Mixed,
    /// torch.autocast: fp32 weights, 16-bit activations.
    Amp,
    Bf16,
    Fp32,
    /// Transformer Engine fp8 (Hopper, Ada, Blackwell, MI300).
    Fp8,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum FinetuneArg {
    Full,
    Lora,
    Qlora,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LoraTargetsArg {
    All,
    Qv,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum BaseWeightsArg {
    /// The training precision's width.
    Native,
    Int8,
    Nf4,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum OffloadArg {
    None,
    Optimizer,
    /// The optimizer and the parameters.
    Params,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum OptimizerArg {
    Adamw,
    Sgd,
    SgdMomentum,
    Adafactor,
    Adam8bit,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum AttentionArg {
    Eager,
    Sdpa,
    Flash,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum FrameworkArg {
    Auto,
    /// Hugging Face transformers
    Hf,
    /// Megatron-LM
    Megatron,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum HeadArg {
    CausalLm,
    MaskedLm,
    SeqCls,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum EngineArg {
    /// ds_config.json
    Deepspeed,
    /// torchrun with Hugging Face Trainer FSDP arguments
    Fsdp,
    /// an Accelerate config
    Accelerate,
    /// Megatron-LM arguments (tensor, pipeline and context parallelism)
    Megatron,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum WeightsArg {
    Bf16,
    Fp8,
    Int8,
    Int4,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum KvArg {
    Bf16,
    Fp8,
}

/// A whole number of at least 1.
fn positive() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(1..)
}

fn parse_checkpointing(s: &str) -> Result<Checkpointing> {
    Ok(match s {
        "none" => Checkpointing::None,
        "full" => Checkpointing::Full,
        "selective" => Checkpointing::Selective,
        "optimal" => Checkpointing::Optimal,
        other => match other.strip_prefix("every-").map(str::parse::<u64>) {
            Some(Ok(k)) if k > 0 => Checkpointing::EveryK(k),
            _ => bail!("--checkpoint {other:?}: expected none, full, selective, every-K or optimal"),
        },
    })
}

/// The largest micro-batch `--max-batch` tries; an answer of this many is "at least".
const MAX_BATCH_SEARCHED: u64 = 1 << 40;

pub fn run(a: PlanArgs) -> Result<Outcome> {
    let (model, gpu_spec) = a.target.resolve()?;
    if a.infer {
        return plan_inference(&a, &model, &gpu_spec);
    }
    check_positions(&model, a.seq)?;
    let cfg = train_config(&a)?;
    if let Err(why) = cfg.check(&model, &gpu_spec) {
        bail!("{why}");
    }
    if let Finetune::Lora { rank, .. } = cfg.finetune {
        let smallest = model.block_linears().iter().map(|&(i, o)| i.min(o)).min().unwrap_or(0);
        if rank > smallest {
            bail!("--lora-rank {rank} is more than the smallest adapted dimension, {smallest} (a full-rank update)");
        }
    }
    let e = train::estimate(&model, &gpu_spec, &cfg);
    let max_batch = a.max_batch.then(|| train::max_micro_batch(&model, &gpu_spec, &cfg, MAX_BATCH_SEARCHED));
    let global_batch = a.global_batch.unwrap_or(cfg.global_batch());
    let (recs, tried) = if a.recommend {
        let space = SearchSpace::for_job(&model, &gpu_spec, a.gpus, a.seq, global_batch);
        recommend(&model, &gpu_spec, &cfg, global_batch, &space)
    } else {
        (Vec::new(), 0)
    };
    let emitted = a
        .emit
        .map(|engine| {
            let engine = match engine {
                EngineArg::Deepspeed => Engine::DeepSpeed,
                EngineArg::Fsdp => Engine::Fsdp,
                EngineArg::Accelerate => Engine::Accelerate,
                EngineArg::Megatron => Engine::Megatron,
            };
            // The fastest recommendation this engine can express, or the configuration asked about.
            match recs.iter().find_map(|r| emit(engine, &model, &r.config).ok()) {
                Some(text) => Ok(text),
                None => emit(engine, &model, &cfg),
            }
        })
        .transpose()
        .map_err(|why| anyhow::anyhow!("--emit: {why}"))?;
    let b = &e.breakdown;
    let par = &cfg.parallel;
    let mut out = String::new();
    let context_note = context_note(&model, a.seq);
    let recommendations = recs
        .iter()
        .take(20)
        .map(|r| {
            json!({
                "precision": format!("{:?}", r.config.precision).to_lowercase(),
                "attention": format!("{:?}", r.config.attention).to_lowercase(),
                "checkpoint": checkpoint_name(r.config.checkpointing),
                "framework": r.estimate.framework.name(),
                "parallel": parallel_json(&r.config.parallel),
                "zero_stage": r.config.parallel.zero_stage,
                "offload": offload_name(r.config.offload),
                "micro_batch": r.config.micro_batch,
                "accumulation": r.config.accumulation,
                "per_gpu_bytes": r.estimate.per_gpu_bytes,
                "step_time_s": r.estimate.step_time_s,
                "tokens_per_s": r.estimate.tokens_per_s,
                "mfu": r.estimate.mfu,
            })
        })
        .collect::<Vec<_>>();
    let phases_json = e
        .phases
        .map(|p| json!({ "forward": p.forward.total, "backward": p.backward.total, "optimizer": p.optimizer.total }));
    if a.json {
        let v = json!({
            "model": model.name,
            "params": model.params(),
            "gpu": gpu_spec.name,
            "gpu_memory_bytes": gpu_spec.memory_bytes,
            "mode": "train",
            "gpus": par.gpus(),
            "parallel": parallel_json(par),
            "accumulation": cfg.accumulation,
            "global_batch": cfg.global_batch(),
            "finetune": finetune_name(cfg.finetune),
            "offload": offload_name(cfg.offload),
            "trainable_params": e.trainable_params,
            "fits": e.fits,
            "per_gpu_bytes": e.per_gpu_bytes,
            "pipeline_stage": format!("{:?}", e.stage).to_lowercase(),
            "breakdown": {
                "weights": b.weights, "gradients": b.gradients, "optimizer": b.optimizer,
                "activations": b.activations, "logits": b.logits, "kv_cache": 0.0,
                "temporary": b.temporary, "framework": b.framework,
            },
            "host_bytes": e.host_bytes,
            "allocated_bytes": e.allocated_bytes,
            "tensor_bytes": e.tensor_bytes,
            "framework": e.framework.name(),
            "peak_phase": e.phase.map(|p| p.name()),
            "phases": phases_json,
            "step_time_s": e.step_time_s,
            "tokens_per_s": e.tokens_per_s,
            "mfu": e.mfu,
            "recompute_fraction": e.recompute_fraction,
            "max_batch": max_batch,
            "max_batch_is_search_limit": max_batch.map(|m| m >= MAX_BATCH_SEARCHED),
            "configurations_searched": tried,
            "recommendations": recommendations,
            "engine_config": emitted,
            "note": e.note,
            "context_note": context_note,
        });
        outln!(out, "{}", serde_json::to_string_pretty(&v)?);
    } else {
        outln!(
            out,
            "{model} on {} ({}), {}: micro-batch {} × {} tokens{}, {:?}, {:?}, {:?} attention, checkpointing {}",
            gpu_spec.name,
            format_size(gpu_spec.memory_bytes),
            match cfg.finetune {
                Finetune::Full => "training".to_string(),
                _ =>
                    format!("{} fine-tuning ({} trainable parameters)", finetune_name(cfg.finetune), e.trainable_params),
            },
            a.batch,
            a.seq,
            if cfg.accumulation > 1 { format!(" × {} accumulated", cfg.accumulation) } else { String::new() },
            cfg.precision,
            cfg.optimizer,
            cfg.attention,
            a.checkpoint,
        );
        if par.gpus() > 1 || cfg.offload != Offload::None {
            outln!(out, "{}", layout_line(par, cfg.offload));
        }
        outln!(out);
        let terms = [
            ("weights", b.weights),
            ("gradients", b.gradients),
            ("optimizer", b.optimizer),
            ("activations", b.activations),
            ("logits", b.logits),
            ("temporary", b.temporary),
            ("framework", b.framework),
        ];
        print_terms(&mut out, &terms, e.per_gpu_bytes, gpu_spec.memory_bytes, e.fits);
        outln!(
            out,
            "tensors alone (torch.cuda.max_memory_allocated): {}; the framework term is the CUDA context, NCCL and the allocator's slack",
            format_size(e.allocated_bytes as u64)
        );
        if let (Some(phase), Some(p)) = (e.phase, e.phases) {
            outln!(
                out,
                "the peak is in the {} (transformers' code: forward {}, backward {}, optimizer step {}, tensors only)",
                match phase {
                    Phase::Forward => "forward, at the loss",
                    Phase::Backward => "backward",
                    Phase::Optimizer => "optimizer step",
                },
                format_size(p.forward.total as u64),
                format_size(p.backward.total as u64),
                format_size(p.optimizer.total as u64)
            );
        }
        if par.pipeline > 1 {
            outln!(
                out,
                "(the {} pipeline stage: {})",
                format!("{:?}", e.stage).to_lowercase(),
                if e.stage == PipelineStage::First {
                    "the embedding and the most micro-batches in flight"
                } else {
                    "the head and the logits"
                }
            );
        }
        if e.host_bytes > 0.0 {
            outln!(out, "host memory per node for the offloaded states: {}", format_size(e.host_bytes as u64));
        }
        if let Some(n) = &e.note {
            outln!(out, "{n}");
        }
        if let Some(n) = &context_note {
            outln!(out, "note: {n}");
        }
        outln!(
            out,
            "step time ≈ {:.3} s per optimizer step ({:.0} tokens/s{}, MFU {:.0}%), recomputing {:.0}% of a forward pass",
            e.step_time_s,
            e.tokens_per_s,
            if par.gpus() > 1 { " over all GPUs" } else { "" },
            e.mfu * 100.0,
            e.recompute_fraction * 100.0
        );
        if let Some(m) = max_batch {
            if m >= MAX_BATCH_SEARCHED {
                outln!(out, "largest micro-batch that fits: at least {m} (the search stops there)");
            } else {
                outln!(out, "largest micro-batch that fits: {m}");
            }
        }
        if a.recommend {
            outln!(out);
            outln!(
                out,
                "{} of {tried} configurations fit; fastest for {global_batch} sequences per step on {} GPUs:",
                recs.len(),
                a.gpus
            );
            outln!(
                out,
                "  {:<6} {:<6} {:<10} {:<9} {:>13} {:>4} {:>8} {:>6} {:>6} {:>12} {:>10} {:>10} {:>5}",
                "prec",
                "attn",
                "checkpoint",
                "framework",
                "tp·pp·cp·dp",
                "zero",
                "offload",
                "micro",
                "accum",
                "per GPU",
                "step (s)",
                "tokens/s",
                "MFU"
            );
            for r in recs.iter().take(10) {
                let p = &r.config.parallel;
                outln!(
                    out,
                    "  {:<6} {:<6} {:<10} {:<9} {:>13} {:>4} {:>8} {:>6} {:>6} {:>12} {:>10.3} {:>10.0} {:>4.0}%",
                    format!("{:?}", r.config.precision).to_lowercase(),
                    format!("{:?}", r.config.attention).to_lowercase(),
                    checkpoint_name(r.config.checkpointing),
                    r.estimate.framework.name(),
                    format!(
                        "{}·{}{}·{}·{}",
                        p.tensor,
                        p.pipeline,
                        if p.virtual_stages > 1 { format!("v{}", p.virtual_stages) } else { String::new() },
                        p.context,
                        p.data
                    ),
                    p.zero_stage,
                    offload_name(r.config.offload),
                    r.config.micro_batch,
                    r.config.accumulation,
                    format_size(r.estimate.per_gpu_bytes as u64),
                    r.estimate.step_time_s,
                    r.estimate.tokens_per_s,
                    r.estimate.mfu * 100.0
                );
            }
        }
        if let Some(text) = &emitted {
            outln!(out);
            outln!(out, "{text}");
        }
    }
    Ok(Outcome::new(out, if e.fits { 0 } else { 1 }))
}

fn train_config(a: &PlanArgs) -> Result<TrainConfig> {
    let model_parallel = a.tp.checked_mul(a.pp).and_then(|x| x.checked_mul(a.cp)).unwrap_or(u64::MAX);
    if !a.gpus.is_multiple_of(model_parallel) || model_parallel > a.gpus {
        bail!("--gpus {} is not a multiple of tp × pp × cp = {}", a.gpus, a.tp as u128 * a.pp as u128 * a.cp as u128);
    }
    let data = a.gpus / model_parallel;
    if a.batch.checked_mul(a.accumulation).and_then(|x| x.checked_mul(data)).is_none() {
        bail!(
            "the global batch, --batch {} × --accumulation {} × {data} data-parallel GPUs, is more than 2^64 sequences",
            a.batch,
            a.accumulation
        );
    }
    let finetune = match a.finetune {
        FinetuneArg::Full => {
            if a.base_weights.is_some() {
                bail!("--base-weights applies to --finetune lora or qlora");
            }
            Finetune::Full
        }
        FinetuneArg::Lora | FinetuneArg::Qlora => Finetune::Lora {
            rank: a.lora_rank,
            targets: match a.lora_targets {
                LoraTargetsArg::All => LoraTargets::All,
                LoraTargetsArg::Qv => LoraTargets::QueryValue,
            },
            base: match (a.base_weights, a.finetune) {
                (Some(BaseWeightsArg::Native), _) => BaseWeights::Native,
                (Some(BaseWeightsArg::Int8), _) => BaseWeights::Int8,
                (Some(BaseWeightsArg::Nf4), _) | (None, FinetuneArg::Qlora) => BaseWeights::Nf4,
                (None, _) => BaseWeights::Native,
            },
        },
    };
    Ok(TrainConfig {
        micro_batch: a.batch,
        seq: a.seq,
        accumulation: a.accumulation,
        precision: match a.precision {
            PrecisionArg::Mixed => Precision::Mixed,
            PrecisionArg::Amp => Precision::Amp,
            PrecisionArg::Bf16 => Precision::Bf16,
            PrecisionArg::Fp32 => Precision::Fp32,
            PrecisionArg::Fp8 => Precision::Fp8,
        },
        optimizer: match a.optimizer {
            OptimizerArg::Adamw => Optimizer::AdamW,
            OptimizerArg::Sgd => Optimizer::Sgd,
            OptimizerArg::SgdMomentum => Optimizer::SgdMomentum,
            OptimizerArg::Adafactor => Optimizer::Adafactor,
            OptimizerArg::Adam8bit => Optimizer::Adam8bit,
        },
        attention: match a.attention {
            AttentionArg::Eager => Attention::Eager,
            AttentionArg::Sdpa => Attention::Sdpa,
            AttentionArg::Flash => Attention::Flash,
        },
        checkpointing: parse_checkpointing(&a.checkpoint)?,
        parallel: Parallelism {
            data,
            tensor: a.tp,
            pipeline: a.pp,
            context: a.cp,
            sequence_parallel: !a.no_sequence_parallel,
            virtual_stages: a.vpp,
            tp_comm_overlap: a.tp_comm_overlap,
            zero_stage: a.zero,
        },
        finetune,
        offload: match a.offload {
            OffloadArg::None => Offload::None,
            OffloadArg::Optimizer => Offload::Optimizer,
            OffloadArg::Params => Offload::OptimizerAndParams,
        },
        coefficients: ActivationModel::default(),
        framework: match a.framework {
            FrameworkArg::Auto => Framework::Auto,
            FrameworkArg::Hf => Framework::HuggingFace,
            FrameworkArg::Megatron => Framework::Megatron,
        },
        head: match a.head {
            HeadArg::CausalLm => Head::CausalLm,
            HeadArg::MaskedLm => Head::MaskedLm,
            HeadArg::SeqCls => Head::SeqCls,
        },
    })
}

/// Learned position tables end at `max_position`: no longer sequence exists.
fn check_positions(model: &Model, seq: u64) -> Result<()> {
    if model.learned_positions() && seq > model.max_position {
        bail!(
            "--seq {seq}: {} has {} learned positions, and no sequence may be longer",
            model.name,
            model.max_position
        );
    }
    Ok(())
}

/// A sequence beyond the context a model was trained for (rotary and ALiBi
/// models run it; whether it works is the model's business, not memory's).
fn context_note(model: &Model, seq: u64) -> Option<String> {
    (seq > model.max_position).then(|| {
        format!(
            "--seq {seq} is beyond {}'s context of {} tokens (max_position_embeddings)",
            model.name, model.max_position
        )
    })
}

fn parallel_json(p: &Parallelism) -> serde_json::Value {
    json!({
        "data": p.data, "tensor": p.tensor, "pipeline": p.pipeline, "context": p.context,
        "virtual_stages": p.virtual_stages, "sequence_parallel": p.sequence_parallel && p.tensor > 1,
        "zero_stage": p.zero_stage,
    })
}

fn layout_line(p: &Parallelism, offload: Offload) -> String {
    let mut parts = vec![format!("{} GPUs", p.gpus())];
    if p.tensor > 1 {
        parts.push(format!(
            "tensor {}{}",
            p.tensor,
            if p.sequence_parallel { " with sequence parallelism" } else { "" }
        ));
    }
    if p.pipeline > 1 {
        parts.push(format!(
            "pipeline {} ({})",
            p.pipeline,
            if p.virtual_stages > 1 { format!("interleaved, {} chunks", p.virtual_stages) } else { "1F1B".into() }
        ));
    }
    if p.context > 1 {
        parts.push(format!("context {}", p.context));
    }
    parts.push(format!("data {} with ZeRO-{}", p.data, p.zero_stage));
    if offload != Offload::None {
        parts.push(format!("offloading the {} to the CPU", offload_name(offload).replace('+', " and ")));
    }
    parts.join(", ")
}

fn finetune_name(f: Finetune) -> &'static str {
    match f {
        Finetune::Full => "full",
        Finetune::Lora { base: BaseWeights::Nf4, .. } => "qlora",
        Finetune::Lora { base: BaseWeights::Int8, .. } => "lora-int8",
        Finetune::Lora { .. } => "lora",
    }
}

fn offload_name(o: Offload) -> &'static str {
    match o {
        Offload::None => "none",
        Offload::Optimizer => "optimizer",
        Offload::OptimizerAndParams => "optimizer+params",
    }
}

fn checkpoint_name(c: Checkpointing) -> String {
    match c {
        Checkpointing::None => "none".into(),
        Checkpointing::Full => "full".into(),
        Checkpointing::Selective => "selective".into(),
        Checkpointing::EveryK(k) => format!("every-{k}"),
        Checkpointing::Optimal => "optimal".into(),
    }
}

/// A bar per term, the total, and whether it fits.
fn print_terms(out: &mut String, terms: &[(&str, f64)], total: f64, capacity: u64, fits: bool) {
    let scale = (capacity as f64).max(total);
    for (name, bytes) in terms {
        let width = ((bytes / scale) * 40.0).round() as usize;
        outln!(out, "  {name:<12} {:>12}  {}", format_size(*bytes as u64), "█".repeat(width));
    }
    outln!(out, "  {:<12} {:>12}", "total", format_size(total as u64));
    outln!(out);
    outln!(
        out,
        "{}: {} of {} per GPU",
        if fits { "fits" } else { "does NOT fit" },
        format_size(total as u64),
        format_size(capacity)
    );
}

fn plan_inference(a: &PlanArgs, model: &Model, g: &GpuSpec) -> Result<Outcome> {
    if !model.generates() {
        bail!("{} is an encoder: --infer plans generation with a KV cache; plan its training instead", model.name);
    }
    check_positions(model, a.seq)?;
    if a.pp > 1 || a.cp > 1 || a.gpus != a.tp {
        bail!("--infer plans one tensor-parallel group: set --gpus equal to --tp (and no --pp or --cp)");
    }
    if !model.heads.is_multiple_of(a.tp) {
        bail!("--tp {} does not divide the {} attention heads", a.tp, model.heads);
    }
    let cfg = InferConfig {
        tensor: a.tp,
        batch: a.batch,
        seq: a.seq,
        prefill_chunk: 2048,
        weights: match a.weights {
            WeightsArg::Bf16 => WeightFormat::Bf16,
            WeightsArg::Fp8 => WeightFormat::Fp8,
            WeightsArg::Int8 => WeightFormat::Int8,
            WeightsArg::Int4 => WeightFormat::Int4,
        },
        kv_bytes: match a.kv_dtype {
            KvArg::Bf16 => 2.0,
            KvArg::Fp8 => 1.0,
        },
    };
    let e = infer::estimate(model, g, &cfg);
    let mut out = String::new();
    if a.json {
        let v = json!({
            "model": model.name, "params": model.params(), "gpu": g.name, "gpu_memory_bytes": g.memory_bytes,
            "mode": "infer", "gpus": a.tp, "fits": e.fits, "per_gpu_bytes": e.per_gpu_bytes,
            "breakdown": {
                "weights": e.weights, "gradients": 0.0, "optimizer": 0.0, "activations": e.activations,
                "logits": e.logits, "kv_cache": e.kv_cache, "temporary": 0.0, "framework": e.framework,
            },
            "max_sequences": e.max_sequences, "max_tokens": e.max_tokens,
            "context_note": context_note(model, a.seq),
        });
        outln!(out, "{}", serde_json::to_string_pretty(&v)?);
    } else {
        outln!(
            out,
            "{model} on {} ({}), inference: {} sequences × {} tokens",
            g.name,
            format_size(g.memory_bytes),
            a.batch,
            a.seq
        );
        outln!(out);
        let terms = [
            ("weights", e.weights),
            ("kv cache", e.kv_cache),
            ("activations", e.activations),
            ("logits", e.logits),
            ("framework", e.framework),
        ];
        print_terms(&mut out, &terms, e.per_gpu_bytes, g.memory_bytes, e.fits);
        outln!(out, "KV cache room: {} tokens, {} sequences of {} tokens", e.max_tokens, e.max_sequences, a.seq);
        if let Some(n) = context_note(model, a.seq) {
            outln!(out, "note: {n}");
        }
    }
    Ok(Outcome::new(out, if e.fits { 0 } else { 1 }))
}
