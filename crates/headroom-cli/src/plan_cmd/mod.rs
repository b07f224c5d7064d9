//! `headroom plan`: will this model, at this batch and sequence length, with
//! this precision and optimizer, fit on this GPU — term by term.
//!
//! The arguments and the configurations they describe are in [`args`]; the
//! estimate is the library's; [`text`] and [`json`] render it.

mod args;
mod calibration;
mod json;
mod text;

use crate::Outcome;
use anyhow::Result;
pub use args::PlanArgs;
use headroom_plan::emit::emit;
use headroom_plan::gpu::GpuSpec;
use headroom_plan::infer::{self, InferConfig, InferEstimate};
use headroom_plan::model::Model;
use headroom_plan::search::{recommend, Recommendation, SearchSpace};
use headroom_plan::train::{self, BaseWeights, Checkpointing, Finetune, TrainConfig, TrainEstimate};

/// The largest micro-batch `--max-batch` tries; an answer of this many is "at least".
const MAX_BATCH_SEARCHED: u64 = 1 << 40;

/// The longest sequence `--max-seq` tries: the learned positions, or 16 M tokens.
fn max_seq_searched(model: &Model) -> u64 {
    if model.learned_positions() {
        model.max_position
    } else {
        1 << 24
    }
}

/// A training plan: what was asked, and every answer.
struct TrainPlan<'a> {
    args: &'a PlanArgs,
    model: Model,
    gpu: GpuSpec,
    cfg: TrainConfig,
    estimate: TrainEstimate,
    calibration: Option<calibration::Calibrated>,
    max_batch: Option<u64>,
    max_seq: Option<u64>,
    global_batch: u64,
    recommendations: Vec<Recommendation>,
    searched: usize,
    engine_config: Option<String>,
    context_note: Option<String>,
}

/// An inference plan.
struct InferPlan<'a> {
    args: &'a PlanArgs,
    config: InferConfig,
    model: Model,
    gpu: GpuSpec,
    estimate: InferEstimate,
    max_seq: Option<u64>,
    context_note: Option<String>,
}

pub fn run(a: PlanArgs) -> Result<Outcome> {
    let (model, gpu) = a.target.resolve()?;
    if a.infer {
        a.check_inference(&model)?;
        let cfg: InferConfig = a.infer_config(&gpu)?;
        infer::check(&model, &cfg)?;
        let estimate = infer::estimate(&model, &gpu, &cfg);
        let max_seq = a.max_seq.then(|| infer::max_seq(&model, &gpu, &cfg, max_seq_searched(&model)));
        let context_note = context_note(&model, a.seq);
        let plan = InferPlan { args: &a, config: cfg, model, gpu, estimate, max_seq, context_note };
        let out = if a.json {
            format!("{}\n", serde_json::to_string_pretty(&json::infer(&plan))?)
        } else {
            text::infer(&plan)
        };
        return Ok(Outcome::new(out, if plan.estimate.fits { 0 } else { 1 }));
    }
    args::check_positions(&model, a.seq)?;
    let mut cfg = a.train_config()?;
    if let Err(why) = cfg.check(&model, &gpu) {
        anyhow::bail!("{why}");
    }
    if let Finetune::Lora { rank, .. } = cfg.finetune {
        let smallest = model.block_linears().iter().map(|&(i, o)| i.min(o)).min().unwrap_or(0);
        if rank > smallest {
            anyhow::bail!(
                "--lora-rank {rank} is more than the smallest adapted dimension, {smallest} (a full-rank update)"
            );
        }
    }
    let calibration = (!a.calibrate.is_empty()).then(|| calibration::calibrated(&a, &model, &gpu, &cfg)).transpose()?;
    // One per process: the configurations refer to it.
    cfg.coefficients.calibration = calibration.as_ref().map(|c| &*Box::leak(Box::new(c.fit)));
    let estimate = train::estimate(&model, &gpu, &cfg);
    let max_batch = a.max_batch.then(|| train::max_micro_batch(&model, &gpu, &cfg, MAX_BATCH_SEARCHED));
    let max_seq = a.max_seq.then(|| train::max_seq(&model, &gpu, &cfg, max_seq_searched(&model)));
    let global_batch = a.global_batch.unwrap_or(cfg.global_batch());
    let (recommendations, searched) = if a.recommend {
        let space = SearchSpace::for_job(&model, &gpu, a.gpus, a.seq, global_batch);
        recommend(&model, &gpu, &cfg, global_batch, &space)
    } else {
        (Vec::new(), 0)
    };
    let engine_config = a
        .emit
        .map(|engine| {
            // The fastest recommendation this engine can express, or the configuration asked about.
            match recommendations.iter().find_map(|r| emit(engine, &model, &r.config).ok()) {
                Some(text) => Ok(text),
                None => emit(engine, &model, &cfg),
            }
        })
        .transpose()
        .map_err(|why| anyhow::anyhow!("--emit: {why}"))?;
    let context_note = context_note(&model, a.seq);
    let plan = TrainPlan {
        args: &a,
        model,
        gpu,
        cfg,
        estimate,
        calibration,
        max_batch,
        max_seq,
        global_batch,
        recommendations,
        searched,
        engine_config,
        context_note,
    };
    let out =
        if a.json { format!("{}\n", serde_json::to_string_pretty(&json::train(&plan))?) } else { text::train(&plan) };
    Ok(Outcome::new(out, if plan.estimate.fits { 0 } else { 1 }))
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

/// `--finetune`'s name for what runs, with the base's storage.
fn finetune_name(f: Finetune) -> &'static str {
    match f {
        Finetune::Full => "full",
        Finetune::Lora { base: BaseWeights::Nf4, .. } => "qlora",
        Finetune::Lora { base: BaseWeights::Int8, .. } => "lora-int8",
        Finetune::Lora { .. } => "lora",
    }
}

/// `--checkpoint`'s spelling of a policy.
fn checkpoint_name(c: Checkpointing) -> String {
    match c {
        Checkpointing::None => "none".into(),
        Checkpointing::Full => "full".into(),
        Checkpointing::Selective => "selective".into(),
        Checkpointing::PerOp => "per-op".into(),
        Checkpointing::EveryK(k) => format!("every-{k}"),
        Checkpointing::Optimal => "optimal".into(),
    }
}
