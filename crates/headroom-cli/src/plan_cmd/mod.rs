//! `headroom plan`: will this model, at this batch and sequence length, with
//! this precision and optimizer, fit on this GPU — term by term.
//!
//! The flags are read into the library's requests ([`args`]); the library resolves and checks
//! the job, estimates it and answers the questions asked; [`text`] and [`json`] render the
//! answers record by record.

mod advice;
mod args;
mod calibration;
mod config;
mod infer_text;
mod json;
mod recorded;
mod text;

use crate::out_file::{check_output, write_atomically};
use crate::Outcome;
use anyhow::{anyhow, Context, Result};
pub use args::PlanArgs;
use headroom_plan::emit::emit;
use headroom_plan::estimate::{Estimate, Estimator};
use headroom_plan::gpu::GpuSpec;
use headroom_plan::infer::{self, InferConfig, InferEstimate};
use headroom_plan::job::Job;
use headroom_plan::model::Model;
use headroom_plan::names::Named;
use headroom_plan::recording::Recording;
use headroom_plan::remedy::{cache_saving, remedies, Asked, CacheSaving, Remedy};
use headroom_plan::request::TrainRequest;
use headroom_plan::search::{recommend, Recommendation, Search, SearchSpace};
use std::path::PathBuf;

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

/// A training plan: the estimate, and every other answer asked for.
struct TrainPlan<'a> {
    model: &'a Model,
    /// The recording the job replays (`--program`), where it brings one.
    recording: Option<&'a Recording>,
    gpu: &'a GpuSpec,
    estimate: Estimate,
    /// What the plan was replayed under.
    allocator: String,
    /// The same job under the other settings asked for.
    asked: Vec<(String, Estimate)>,
    /// The levers that would make a job that does not fit fit, each replayed.
    remedies: Vec<Remedy>,
    /// Where a job that fits reserves far more than it allocates: the allocator's cache.
    cache: Option<CacheSaving>,
    calibration: Option<calibration::Calibrated>,
    max_batch: Option<u64>,
    max_seq: Option<u64>,
    global_batch: u64,
    recommend: bool,
    search: Search,
    /// What the command line fixed, held by the search.
    held: headroom_plan::search::Held,
    engine_config: Option<EngineConfig>,
    context_note: Option<String>,
}

impl TrainPlan<'_> {
    /// The recording planned, where it is inference (its steps forwards without a backward:
    /// `record --infer`, `--generate`): the plan reads as inference, without training's terms.
    fn inference(&self) -> Option<&Recording> {
        self.recording.filter(|r| r.inference())
    }
}

/// An engine's configuration: for the plan asked about, or for a recommendation.
struct EngineConfig {
    engine: headroom_plan::emit::Engine,
    text: String,
    /// The recommendation's place among the configurations that fit, fastest first.
    pick: Option<(usize, Recommendation)>,
}

/// An inference plan.
struct InferPlan<'a> {
    config: InferConfig,
    model: &'a Model,
    gpu: &'a GpuSpec,
    estimate: InferEstimate,
    max_seq: Option<u64>,
    context_note: Option<String>,
}

pub fn run(a: PlanArgs) -> Result<Outcome> {
    let file = config::load(&a)?;
    let file = file.as_ref();
    let recording = recording(&a)?;
    // A recording brings its own tensors: without --model it is planned as its own model.
    let (model, gpu) = match (&recording, &a.target.model) {
        (Some(r), None) => (r.stand_in_model(), a.target.gpu()?),
        _ => config::target(&a, file)?,
    };
    if a.infer || file.is_some_and(|f| f.infer().is_some()) {
        let request = a.infer_request(file.and_then(config::Loaded::infer))?;
        let config = request.resolve(&model, &gpu)?;
        let estimate = infer::estimate(&model, &gpu, &config);
        let max_seq = a.max_seq.then(|| infer::max_seq(&model, &gpu, &config, max_seq_searched(&model)));
        let context_note = context_note(&model, request.seq);
        let plan = InferPlan { config, model: &model, gpu: &gpu, estimate, max_seq, context_note };
        let out = if a.json {
            let mut v = json::infer(&plan);
            config::json(file, &mut v);
            format!("{}\n", serde_json::to_string_pretty(&v)?)
        } else {
            infer_text::infer(&plan) + &config::text_lines(file)
        };
        // An engine that starts serves what its pool holds at once and queues the rest.
        return Ok(Outcome::new(out, if plan.estimate.starts { 0 } else { 1 }));
    }
    let mut request = a.train_request(file.and_then(config::Loaded::train))?;
    if let Some(&(b, s)) = recording.as_ref().and_then(|r| r.shapes.first()) {
        // The shape recorded first, unless another is asked for.
        request.micro_batch = a.batch.unwrap_or(b);
        request.seq = a.seq.unwrap_or(s);
    }
    let job = match &recording {
        Some(r) => request.resolve_recorded(&model, &gpu, r)?,
        None => request.resolve(&model, &gpu)?,
    };
    if let Some(path) = &a.dump_program {
        let mut inputs: Vec<PathBuf> = a.calibrate.clone();
        inputs.extend(a.target.model.as_ref().map(PathBuf::from));
        inputs.extend(a.config.clone());
        inputs.extend(a.hf_args.clone());
        inputs.extend(a.program.clone());
        check_output(path, &inputs.iter().map(PathBuf::as_path).collect::<Vec<_>>()).context("--dump-program")?;
    }
    let mut allocators = a.allocators()?;
    // Fitted with the allocator the plan replays with first.
    let calibration = match allocators.first() {
        Some((_, e)) if !a.calibrate.is_empty() => Some(calibration::calibrated(&a, &job, e)?),
        _ => None,
    };
    for (_, e) in &mut allocators {
        e.calibration = calibration.as_ref().map(|c| c.fit.calibration);
    }
    let (allocator, estimator) = allocators.remove(0);
    let estimate = estimator.estimate(&job)?;
    let asked = allocators.into_iter().map(|(label, e)| Ok((label, e.estimate(&job)?))).collect::<Result<Vec<_>>>()?;
    if let Some(path) = &a.dump_program {
        let p = &estimate.program;
        let (b, s) = (job.train.micro_batch, job.train.seq);
        let text = format!("{{\"op\":\"shape\",\"batch\":{b},\"seq\":{s}}}\n") + &p.to_jsonl(&p.sizes(b, s));
        write_atomically(path, |w| w.write_all(text.as_bytes())).context("--dump-program")?;
    }
    let global_batch = a.global_batch.unwrap_or(job.train.global_batch());
    let search = match &recording {
        _ if !a.recommend => Search::default(),
        Some(r) => recorded::search(&a, r, &job, global_batch)?,
        None => search(&a, file, &request, &job, &estimator, global_batch),
    };
    let plan = TrainPlan {
        model: &model,
        recording: recording.as_ref(),
        gpu: &gpu,
        remedies: remedies(
            &Asked {
                request: &request,
                model: &model,
                gpu: &gpu,
                estimator: &estimator,
                fine_tuning: a.fine_tuning() || config::fine_tuning(file),
                recording: recording.as_ref(),
            },
            &estimate,
        ),
        cache: cache_saving(&job, &estimator, &estimate),
        max_batch: a.max_batch.then(|| estimator.max_micro_batch(&job, MAX_BATCH_SEARCHED)),
        max_seq: a.max_seq.then(|| estimator.max_seq(&job, max_seq_searched(&model))),
        engine_config: engine_config(&a, &job, &search)?,
        estimate,
        allocator,
        asked,
        calibration,
        global_batch,
        recommend: a.recommend,
        search,
        held: config::held(&a, file),
        context_note: context_note(&model, request.seq),
    };
    let out = if a.json {
        let mut v = json::train(&plan);
        config::json(file, &mut v);
        format!("{}\n", serde_json::to_string_pretty(&v)?)
    } else {
        text::train(&plan) + &config::text_lines(file)
    };
    Ok(Outcome::new(out, if plan.estimate.verdict.fits { 0 } else { 1 }))
}

/// `--program`, each file read and, where there are several, each tensor's size law fitted
/// from them; with `--max-batch` or `--max-seq`, the shapes must vary that way.
fn recording(a: &PlanArgs) -> Result<Option<Recording>> {
    if a.program.is_empty() {
        return Ok(None);
    }
    let files = a.program.iter().map(|p| Recording::read(p)).collect::<Result<Vec<_>, _>>().context("--program")?;
    let r = Recording::fitted(files).context("--program")?;
    for (asked, batch, flag) in [(a.max_batch, true, "--max-batch"), (a.max_seq, false, "--max-seq")] {
        if asked {
            r.grows_with(batch, flag).map_err(|why| anyhow!(why))?;
        }
    }
    Ok(Some(r))
}

/// `--recommend`: the configurations that fit, fastest first, and the fastest `--emit`'s
/// engine runs.
fn search(
    a: &PlanArgs,
    file: Option<&config::Loaded>,
    request: &TrainRequest,
    job: &Job,
    estimator: &Estimator,
    global_batch: u64,
) -> Search {
    let held = config::held(a, file);
    let space = SearchSpace::for_job(job.model, job.gpu, request.gpus, request.seq, global_batch).holding(&held);
    recommend(job, global_batch, &space, estimator, RECOMMENDATIONS_SHOWN, a.emit)
}

/// `--emit`: the engine's configuration for the plan, or with `--recommend` for the fastest
/// configuration that fits and that it runs.
fn engine_config(a: &PlanArgs, job: &Job, search: &Search) -> Result<Option<EngineConfig>> {
    let Some(engine) = a.emit else { return Ok(None) };
    if !a.recommend {
        let text = emit(engine, job.model, &job.train).map_err(|why| anyhow!("--emit: {why}"))?;
        return Ok(Some(EngineConfig { engine, text, pick: None }));
    }
    let Some((rank, r)) = &search.engine_pick else {
        anyhow::bail!(
            "--emit {}: none of the configurations that fit is one {} runs (the fastest {} were replayed); \
             for the plan asked about: {}",
            engine.name(),
            engine.name(),
            search.replayed,
            emit(engine, job.model, &job.train).err().map_or("it runs (drop --recommend)".into(), |e| e.to_string())
        );
    };
    let text = emit(engine, job.model, &r.config).map_err(|why| anyhow!("--emit: {why}"))?;
    Ok(Some(EngineConfig { engine, text, pick: Some((*rank, r.clone())) }))
}

/// The model as the plan names it: a catalog model (or a config.json's) with its parameters;
/// a recording planned without `--model`, by the name the recording gives it.
fn model_label(model: &Model) -> String {
    if Recording::is_stand_in(model) {
        format!("{} (the recorded model: its tensors are the recording's, no catalog model named)", model.name)
    } else {
        model.to_string()
    }
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
