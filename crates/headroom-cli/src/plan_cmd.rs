//! `headroom plan`: will this model, at this batch and sequence length, with
//! this precision and optimizer, fit on this GPU — term by term.

use crate::target_arg::Target;
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use headroom_alloc::units::format_size;
use headroom_plan::emit::{emit, Engine};
use headroom_plan::gpu::GpuSpec;
use headroom_plan::infer::{self, InferConfig, WeightFormat};
use headroom_plan::model::Model;
use headroom_plan::search::{recommend, SearchSpace};
use headroom_plan::train::{self, ActivationModel, Attention, Checkpointing, Optimizer, Precision, TrainConfig};
use serde_json::json;
use std::process::ExitCode;

/// Will it fit? Memory per GPU, term by term, for training or inference, and
/// the estimated step time.
///
/// Training terms: weights, gradients and optimizer state (by precision,
/// optimizer and ZeRO stage over --gpus), activations (by attention kernel
/// and checkpoint policy; `optimal` solves for the fastest schedule that fits
/// the GPU), logits, temporaries (cuBLAS workspace, ZeRO-3's gathered layer),
/// and the framework (CUDA context, NCCL). Inference: weights at their width,
/// the KV cache, the prefill activations, and how many sequences fit.
///
/// --model takes a preset (llama-3-8b, mistral-7b, qwen2.5-7b, gpt2, ...) or
/// the path of a Hugging Face config.json. Not modelled yet: tensor, pipeline
/// and context parallelism, LoRA/QLoRA, CPU offload, communication time.
///
/// Exit status: 0 if it fits, 1 if not, 2 on bad input.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  headroom plan --model llama-2-7b --gpu a100-80gb --train --batch 8 --seq 4096 --attention flash --checkpoint optimal\n  \
                        headroom plan --model llama-3-8b --gpu h100-sxm --gpus 8 --zero 3 --train --batch 4 --seq 8192 --max-batch\n  \
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
    #[arg(long, default_value_t = 1)]
    batch: u64,
    /// Sequence length in tokens.
    #[arg(long, default_value_t = 2048)]
    seq: u64,
    /// Data-parallel GPUs.
    #[arg(long, default_value_t = 1)]
    gpus: u64,
    /// ZeRO stage (FSDP: 2 = SHARD_GRAD_OP, 3 = FULL_SHARD).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=3))]
    zero: u8,
    #[arg(long, value_enum, default_value_t = PrecisionArg::Mixed)]
    precision: PrecisionArg,
    #[arg(long, value_enum, default_value_t = OptimizerArg::Adamw)]
    optimizer: OptimizerArg,
    #[arg(long, value_enum, default_value_t = AttentionArg::Sdpa)]
    attention: AttentionArg,
    /// none, full, selective, every-K (e.g. every-4), or optimal.
    #[arg(long, default_value = "none")]
    checkpoint: String,
    /// Also find the largest micro-batch that fits.
    #[arg(long)]
    max_batch: bool,
    /// Search precision, attention kernel, checkpointing, ZeRO stage and
    /// micro-batch (with gradient accumulation to --batch sequences per GPU
    /// per step) for the configurations that fit, fastest first.
    #[arg(long)]
    recommend: bool,
    /// Print the configuration for an engine (the best recommendation with --recommend).
    #[arg(long, value_enum)]
    emit: Option<EngineArg>,
    /// Inference weight format.
    #[arg(long, value_enum, default_value_t = WeightsArg::Bf16)]
    weights: WeightsArg,
    /// Inference KV-cache element width.
    #[arg(long, value_enum, default_value_t = KvArg::Bf16)]
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
enum EngineArg {
    /// ds_config.json
    Deepspeed,
    /// torchrun with Hugging Face Trainer FSDP arguments
    Fsdp,
    /// an Accelerate config
    Accelerate,
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

pub fn run(a: PlanArgs) -> Result<ExitCode> {
    let (model, gpu_spec) = a.target.resolve()?;
    if a.batch == 0 || a.seq == 0 || a.gpus == 0 {
        bail!("--batch, --seq and --gpus must be positive");
    }
    if a.infer {
        return plan_inference(&a, &model, &gpu_spec);
    }
    let cfg = TrainConfig {
        micro_batch: a.batch,
        seq: a.seq,
        precision: match a.precision {
            PrecisionArg::Mixed => Precision::Mixed,
            PrecisionArg::Amp => Precision::Amp,
            PrecisionArg::Bf16 => Precision::Bf16,
            PrecisionArg::Fp32 => Precision::Fp32,
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
        gpus: a.gpus,
        zero_stage: a.zero,
        coefficients: ActivationModel::default(),
    };
    let e = train::estimate(&model, &gpu_spec, &cfg);
    let max_batch = a.max_batch.then(|| train::max_micro_batch(&model, &gpu_spec, &cfg, 1 << 16));
    let (recs, tried) = if a.recommend {
        let space = SearchSpace::for_batch(a.batch, model.layers, a.gpus);
        recommend(&model, &gpu_spec, &cfg, a.batch, &space)
    } else {
        (Vec::new(), 0)
    };
    let emitted = a.emit.map(|engine| {
        let engine = match engine {
            EngineArg::Deepspeed => Engine::DeepSpeed,
            EngineArg::Fsdp => Engine::Fsdp,
            EngineArg::Accelerate => Engine::Accelerate,
        };
        match recs.first() {
            Some(r) => emit(engine, &r.config, r.accumulation),
            None => emit(engine, &cfg, 1),
        }
    });
    let b = &e.breakdown;
    if a.json {
        let out = json!({
            "model": model.name,
            "params": model.params(),
            "gpu": gpu_spec.name,
            "gpu_memory_bytes": gpu_spec.memory_bytes,
            "mode": "train",
            "fits": e.fits,
            "per_gpu_bytes": e.per_gpu_bytes,
            "breakdown": {
                "weights": b.weights, "gradients": b.gradients, "optimizer": b.optimizer,
                "activations": b.activations, "logits": b.logits, "kv_cache": 0.0,
                "temporary": b.temporary, "framework": b.framework,
            },
            "step_time_s": e.step_time_s,
            "tokens_per_s": e.tokens_per_s,
            "recompute_fraction": e.recompute_fraction,
            "max_batch": max_batch,
            "configurations_searched": tried,
            "recommendations": recs.iter().take(20).map(|r| json!({
                "precision": format!("{:?}", r.config.precision).to_lowercase(),
                "attention": format!("{:?}", r.config.attention).to_lowercase(),
                "checkpoint": checkpoint_name(r.config.checkpointing),
                "zero_stage": r.config.zero_stage,
                "micro_batch": r.config.micro_batch,
                "accumulation": r.accumulation,
                "per_gpu_bytes": r.estimate.per_gpu_bytes,
                "step_time_s": r.step_time_s,
                "tokens_per_s": (r.config.micro_batch * r.accumulation * a.seq * a.gpus) as f64 / r.step_time_s,
            })).collect::<Vec<_>>(),
            "engine_config": emitted,
            "note": e.note,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "{model} on {} ({}), training: micro-batch {} × {} tokens, {:?}, {:?}, {:?} attention, checkpointing {}{}",
            gpu_spec.name,
            format_size(gpu_spec.memory_bytes),
            a.batch,
            a.seq,
            cfg.precision,
            cfg.optimizer,
            cfg.attention,
            a.checkpoint,
            if a.gpus > 1 { format!(", {} GPUs, ZeRO-{}", a.gpus, a.zero) } else { String::new() }
        );
        println!();
        let terms = [
            ("weights", b.weights),
            ("gradients", b.gradients),
            ("optimizer", b.optimizer),
            ("activations", b.activations),
            ("logits", b.logits),
            ("temporary", b.temporary),
            ("framework", b.framework),
        ];
        print_terms(&terms, e.per_gpu_bytes, gpu_spec.memory_bytes, e.fits);
        if let Some(n) = &e.note {
            println!("{n}");
        }
        println!(
            "step time ≈ {:.3} s ({:.0} tokens/s{}), recomputing {:.0}% of a forward pass",
            e.step_time_s,
            e.tokens_per_s,
            if a.gpus > 1 { " over all GPUs, collectives not overlapped" } else { "" },
            e.recompute_fraction * 100.0
        );
        if let Some(m) = max_batch {
            println!("largest micro-batch that fits: {m}");
        }
        if a.recommend {
            println!();
            println!(
                "{} of {tried} configurations fit; fastest for {} sequences per GPU per step:",
                recs.len(),
                a.batch
            );
            println!(
                "  {:<6} {:<6} {:<10} {:>4} {:>6} {:>6} {:>12} {:>10} {:>10}",
                "prec", "attn", "checkpoint", "zero", "micro", "accum", "per GPU", "step (s)", "tokens/s"
            );
            for r in recs.iter().take(10) {
                println!(
                    "  {:<6} {:<6} {:<10} {:>4} {:>6} {:>6} {:>12} {:>10.3} {:>10.0}",
                    format!("{:?}", r.config.precision).to_lowercase(),
                    format!("{:?}", r.config.attention).to_lowercase(),
                    checkpoint_name(r.config.checkpointing),
                    r.config.zero_stage,
                    r.config.micro_batch,
                    r.accumulation,
                    format_size(r.estimate.per_gpu_bytes as u64),
                    r.step_time_s,
                    (r.config.micro_batch * r.accumulation * a.seq * a.gpus) as f64 / r.step_time_s
                );
            }
        }
        if let Some(text) = &emitted {
            println!();
            println!("{text}");
        }
    }
    Ok(if e.fits { ExitCode::SUCCESS } else { ExitCode::from(1) })
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
fn print_terms(terms: &[(&str, f64)], total: f64, capacity: u64, fits: bool) {
    let scale = (capacity as f64).max(total);
    for (name, bytes) in terms {
        let width = ((bytes / scale) * 40.0).round() as usize;
        println!("  {name:<12} {:>12}  {}", format_size(*bytes as u64), "█".repeat(width));
    }
    println!("  {:<12} {:>12}", "total", format_size(total as u64));
    println!();
    println!(
        "{}: {} of {} per GPU",
        if fits { "fits" } else { "does NOT fit" },
        format_size(total as u64),
        format_size(capacity)
    );
}

fn plan_inference(a: &PlanArgs, model: &Model, g: &GpuSpec) -> Result<ExitCode> {
    let cfg = InferConfig {
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
    if a.json {
        let out = json!({
            "model": model.name, "params": model.params(), "gpu": g.name, "gpu_memory_bytes": g.memory_bytes,
            "mode": "infer", "fits": e.fits, "per_gpu_bytes": e.per_gpu_bytes,
            "breakdown": {
                "weights": e.weights, "gradients": 0.0, "optimizer": 0.0, "activations": e.activations,
                "logits": e.logits, "kv_cache": e.kv_cache, "temporary": 0.0, "framework": e.framework,
            },
            "max_sequences": e.max_sequences, "max_tokens": e.max_tokens,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "{model} on {} ({}), inference: {} sequences × {} tokens",
            g.name,
            format_size(g.memory_bytes),
            a.batch,
            a.seq
        );
        println!();
        let terms = [
            ("weights", e.weights),
            ("kv cache", e.kv_cache),
            ("activations", e.activations),
            ("logits", e.logits),
            ("framework", e.framework),
        ];
        print_terms(&terms, e.per_gpu_bytes, g.memory_bytes, e.fits);
        println!("KV cache room: {} tokens, {} sequences of {} tokens", e.max_tokens, e.max_sequences, a.seq);
    }
    Ok(if e.fits { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
