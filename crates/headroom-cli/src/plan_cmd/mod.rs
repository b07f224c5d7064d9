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
use anyhow::{Context, Result};
pub use args::PlanArgs;
use headroom_plan::emit::emit;
use headroom_plan::gpu::GpuSpec;
use headroom_plan::infer::{self, InferConfig, InferEstimate};
use headroom_plan::model::Model;
use headroom_plan::names::Named;
use headroom_plan::search::{recommend, Search, SearchSpace};
use headroom_plan::train::{
    BaseWeights, Checkpointing, Estimator, Finetune, Optimizer, OptimizerImpl, TrainConfig, TrainEstimate,
};

/// Recommendations replayed and shown (the text shows the first ten).
const RECOMMENDATIONS_SHOWN: usize = 20;

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
    /// What the plan was replayed under.
    allocator: String,
    /// The same job under the other settings asked for, and those that change the verdict.
    alternatives: Vec<Alternative>,
    calibration: Option<calibration::Calibrated>,
    max_batch: Option<u64>,
    max_seq: Option<u64>,
    global_batch: u64,
    search: Search,
    engine_config: Option<EngineConfig>,
    context_note: Option<String>,
}

/// An engine's configuration: for the plan asked about, or for a recommendation.
struct EngineConfig {
    text: String,
    /// The recommendation's place among the configurations that fit, fastest first.
    rank: Option<usize>,
    recommendation: Option<headroom_plan::search::Recommendation>,
}

/// The job under another allocator setting, policy or optimizer implementation.
struct Alternative {
    /// What changed, as the user would write it.
    label: String,
    /// Asked for with --alloc-conf or --policy, or tried because it changes the verdict.
    asked: bool,
    estimate: TrainEstimate,
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
    let cfg = a.train_config()?;
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
    let mut allocators = a.allocators()?;
    // Fitted with the allocator the plan replays with first.
    let calibration = match allocators.first() {
        Some((_, e)) if !a.calibrate.is_empty() => Some(calibration::calibrated(&a, &model, &gpu, &cfg, e)?),
        _ => None,
    };
    for (_, e) in &mut allocators {
        e.calibration = calibration.as_ref().map(|c| c.fit.calibration);
    }
    let (allocator, estimator) = allocators.remove(0);
    let estimate = estimator.estimate(&model, &gpu, &cfg);
    let mut alternatives: Vec<Alternative> = allocators
        .into_iter()
        .map(|(label, e)| Alternative { label, asked: true, estimate: e.estimate(&model, &gpu, &cfg) })
        .collect();
    if !estimate.fits {
        alternatives.extend(remedies(&model, &gpu, &cfg, &estimator, &estimate));
    }
    if let Some(path) = &a.dump_program {
        let program = estimator.step_program(&model, &gpu, &cfg);
        std::fs::write(path, program.to_jsonl(&program.sizes(cfg.micro_batch, cfg.seq)))
            .with_context(|| format!("--dump-program {}", path.display()))?;
    }
    let max_batch = a.max_batch.then(|| estimator.max_micro_batch(&model, &gpu, &cfg, MAX_BATCH_SEARCHED));
    let max_seq = a.max_seq.then(|| estimator.max_seq(&model, &gpu, &cfg, max_seq_searched(&model)));
    let global_batch = a.global_batch.unwrap_or(cfg.global_batch());
    let search = if a.recommend {
        let space = SearchSpace::for_job(&model, &gpu, a.gpus, a.seq, global_batch);
        let accepts = |c: &TrainConfig| a.emit.is_some_and(|engine| emit(engine, &model, c).is_ok());
        let engine: Option<&dyn Fn(&TrainConfig) -> bool> = a.emit.map(|_| &accepts as &dyn Fn(&TrainConfig) -> bool);
        recommend(&model, &gpu, &cfg, global_batch, &space, &estimator, RECOMMENDATIONS_SHOWN, engine)
    } else {
        Search::default()
    };
    let engine_config = match (a.emit, a.recommend) {
        (None, _) => None,
        // The fastest configuration that fits that this engine runs, and which one it is.
        (Some(engine), true) => match &search.engine_pick {
            Some((rank, r)) => Some(EngineConfig {
                text: emit(engine, &model, &r.config).map_err(|why| anyhow::anyhow!("--emit: {why}"))?,
                rank: Some(*rank),
                recommendation: Some(r.clone()),
            }),
            None => anyhow::bail!(
                "--emit {}: none of the configurations that fit is one {} runs (the fastest {} were replayed); \
                 for the plan asked about: {}",
                engine.name(),
                engine.name(),
                search.replayed,
                emit(engine, &model, &cfg).err().map_or("it runs (drop --recommend)".into(), |e| e.to_string())
            ),
        },
        (Some(engine), false) => Some(EngineConfig {
            text: emit(engine, &model, &cfg).map_err(|why| anyhow::anyhow!("--emit: {why}"))?,
            rank: None,
            recommendation: None,
        }),
    };
    let context_note = context_note(&model, a.seq);
    let plan = TrainPlan {
        args: &a,
        model,
        gpu,
        cfg,
        estimate,
        allocator,
        alternatives,
        calibration,
        max_batch,
        max_seq,
        global_batch,
        search,
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

/// What would make a job that does not fit fit, where one setting does: expandable
/// segments (the allocator's fragmentation is the difference), and AdamW's fused
/// implementation (foreach's copy of the second moments is the difference).
fn remedies(
    model: &Model,
    gpu: &GpuSpec,
    cfg: &TrainConfig,
    estimator: &Estimator,
    estimate: &TrainEstimate,
) -> Vec<Alternative> {
    let mut out = Vec::new();
    if !estimator.alloc.expandable_segments {
        if let Ok(alloc) = headroom_alloc::AllocatorConfig::parse("expandable_segments:True") {
            let e = Estimator { alloc, ..estimator.clone() }.estimate(model, gpu, cfg);
            if e.fits {
                out.push(Alternative {
                    label: "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into(),
                    asked: false,
                    estimate: e,
                });
            }
        }
    }
    if cfg.optimizer == Optimizer::AdamW && estimate.optimizer_impl != OptimizerImpl::Fused {
        let fused = TrainConfig { optimizer_impl: Some(OptimizerImpl::Fused), ..*cfg };
        let e = estimator.estimate(model, gpu, &fused);
        if e.fits {
            out.push(Alternative { label: "--optimizer-impl fused".into(), asked: false, estimate: e });
        }
    }
    out
}
