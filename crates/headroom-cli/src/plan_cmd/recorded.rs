//! What `plan --program` answers beyond a plan: `--recommend` over the levers a recording has,
//! what the plan adds to a recording that the recording cannot see, and how an inference
//! recording's steps and time read.
//!
//! A recording's levers are the allocator's settings (each `--alloc-conf` and `--policy` given,
//! `expandable_segments:True`, headroom's policy), checkpointing by layers made of it, and, where
//! its laws were fitted from two micro-batches, the micro-batch with accumulation to the global
//! batch ([`recommend_recorded`]). Everything else that shapes a step — precision, optimizer,
//! attention kernel, adapters, sharding — is in the recorded tensors: the plan says to record
//! the step again with it.

use super::{PlanArgs, TrainPlan, RECOMMENDATIONS_SHOWN};
use anyhow::{anyhow, bail, Context, Result};
use headroom_alloc::units::format_size;
use headroom_alloc::PolicyName;
use headroom_plan::estimate::{Estimate, Estimator};
use headroom_plan::job::Job;
use headroom_plan::parallel::NCCL_BYTES;
use headroom_plan::program::Term;
use headroom_plan::recording::Recording;
use headroom_plan::search::{recommend_recorded, RecordedSpace, Search};
use serde_json::{json, Value};

/// What a recording cannot change, and how to change it: record the step again with it.
pub(super) const RECORD_AGAIN: [&str; 5] = [
    "precision: record the step with the model in that dtype or under autocast",
    "optimizer: record it with that optimizer (fused AdamW, 8-bit AdamW, SGD, ...)",
    "attention kernel: record it with that attn_implementation",
    "adapters: record it with peft's LoRA or QLoRA applied (--lora)",
    "sharding over GPUs: record one rank of FSDP2 over a fake process group",
];

/// The allocator settings a recording's search replays under: those asked, then
/// `expandable_segments:True` and headroom's policy where none asked has them.
fn allocators(a: &PlanArgs) -> Result<Vec<(String, Estimator)>> {
    let mut out = a.allocators()?;
    let first_conf = a.alloc_conf.first().cloned().unwrap_or_default();
    if !a.alloc_conf.iter().any(|c| c.contains("expandable_segments:True")) {
        let conf = if first_conf.is_empty() {
            "expandable_segments:True".to_string()
        } else {
            format!("{first_conf},expandable_segments:True")
        };
        let e = Estimator::replaying(&conf, PolicyName::PyTorch).with_context(|| format!("--alloc-conf {conf:?}"))?;
        out.push((format!("PYTORCH_CUDA_ALLOC_CONF={conf}"), e));
    }
    if !a.policy.contains(&PolicyName::Headroom) {
        let e = Estimator::replaying(&first_conf, PolicyName::Headroom)
            .with_context(|| format!("--alloc-conf {first_conf:?}"))?;
        let label = if first_conf.is_empty() {
            "--policy headroom".to_string()
        } else {
            format!("PYTORCH_CUDA_ALLOC_CONF={first_conf} --policy headroom")
        };
        out.push((label, e));
    }
    Ok(out)
}

/// `--recommend` with `--program`: the fastest configurations of the recording's levers that fit.
pub(super) fn search(a: &PlanArgs, recording: &Recording, job: &Job, global_batch: u64) -> Result<Search> {
    if recording.inference() && a.global_batch.is_some() {
        bail!(
            "--global-batch is the sequences of an optimizer step, and --program {} is inference (forwards, no \
             optimizer step): leave it out; --recommend replays the recorded batch under each allocator setting",
            recording.path
        );
    }
    let held = a.checkpoint_given().then_some(job.train.checkpointing);
    let space = RecordedSpace::for_recording(recording, allocators(a)?, held, job.train.micro_batch, global_batch);
    let data = job.train.parallel.data;
    if !space.micro_batches.iter().any(|&b| global_batch.is_multiple_of(b.saturating_mul(data))) {
        let varies = recording.grows_with(true, "--recommend").map_err(|why| {
            anyhow!(
                "--global-batch {global_batch} is not a multiple of the {} sequences a step of micro-batch {} over {data} \
                 GPU(s) takes, and {why}",
                job.train.micro_batch.saturating_mul(data),
                job.train.micro_batch
            )
        });
        varies?;
        bail!("--global-batch {global_batch}: no power-of-two micro-batch over {data} GPU(s) reaches it");
    }
    Ok(recommend_recorded(job, global_batch, &space, RECOMMENDATIONS_SHOWN))
}

/// What the plan adds to the recording, each with its bytes and where it goes: the cuBLAS
/// workspaces (into the replay, where the recording holds none) and NCCL's buffers with more
/// than one GPU (outside PyTorch's allocator).
pub(super) fn additions(p: &TrainPlan) -> Vec<(String, u64, &'static str)> {
    let e = &p.estimate;
    let mut out = Vec::new();
    let workspaces: u64 = e
        .program
        .tensors
        .iter()
        .zip(e.program.sizes(e.job.micro_batch, e.job.seq))
        .filter(|(t, _)| t.term == Term::Workspace)
        .map(|(_, b)| b)
        .sum();
    let recorded_own = p.recording.is_some_and(|r| r.program.tensors.iter().any(|t| t.term == Term::Workspace));
    if workspaces > 0 && !recorded_own {
        // Inference has no backward: the forward's thread's workspace alone.
        let which = if p.inference().is_some() {
            "'s cuBLAS workspace (the forward's thread's)"
        } else {
            "'s cuBLAS workspaces (one for the forward's thread, one for the backward's)"
        };
        out.push((format!("{}{which}", p.gpu.name), workspaces, "replayed with the step"));
    }
    if e.job.parallel.gpus() > 1 {
        out.push((
            format!("NCCL's buffers over {} GPUs", e.job.parallel.gpus()),
            NCCL_BYTES as u64,
            "outside PyTorch's allocator",
        ));
    }
    out
}

/// The additions, as the text says them.
pub(super) fn additions_text(out: &mut String, p: &TrainPlan) {
    for (what, bytes, into) in additions(p) {
        outln!(*out, "added to the recording: {what}, {} ({into})", format_size(bytes));
    }
}

/// The additions, as `--json` gives them.
pub(super) fn additions_json(p: &TrainPlan) -> Value {
    let rows: Vec<Value> = additions(p)
        .into_iter()
        .map(|(what, bytes, into)| json!({"what": what, "bytes": bytes, "where": into}))
        .collect();
    Value::Array(rows)
}

/// An inference recording's recommendations: its levers alone (the allocator; the batch is
/// the recording's), without training's checkpointing and accumulation columns.
fn inference_rows(out: &mut String, p: &TrainPlan) {
    outln!(*out, "  {:<52} {:>9} {:>12} {:>10} {:>10}", "allocator", "sequences", "per GPU", "step (s)", "tokens/s");
    for r in p.search.recommendations.iter().take(10) {
        let time = match &r.estimate.time {
            Some(t) => format!("{:>10.3} {:>10.0}", t.step_time_s, t.tokens_per_s),
            None => format!("{:>10} {:>10}", "-", "-"),
        };
        outln!(
            *out,
            "  {:<52} {:>9} {:>12} {time}",
            r.allocator.as_deref().unwrap_or(""),
            r.config.micro_batch,
            format_size(r.estimate.memory.per_gpu_bytes as u64),
        );
    }
    if p.search.recommendations.iter().take(10).any(|r| r.allocator.as_deref().is_some_and(|a| a.contains("--policy")))
    {
        outln!(
            *out,
            "  (--policy: headroom's allocator in PyTorch's place, loaded before the first CUDA tensor with \
             headroom_gpu.torch_allocator.use(policy=...))"
        );
    }
    outln!(*out, "what the recording fixes — record it again to plan another:");
    for r in RECORD_AGAIN.iter().filter(|r| !r.starts_with("optimizer")) {
        outln!(*out, "  {r}");
    }
}

/// A recording's recommendations, as the text shows them.
pub(super) fn recommendations_text(out: &mut String, p: &TrainPlan) {
    outln!(*out);
    let (found, shown) = (p.search.recommendations.len(), p.search.recommendations.len().min(10));
    if p.inference().is_some() {
        outln!(
            *out,
            "{} configurations of the recording's levers (allocator settings) for {} sequences a forward; {} \
             replayed, {found} found to fit; the fastest {shown} of them:",
            p.search.tried,
            p.estimate.job.micro_batch,
            p.search.replayed,
        );
        inference_rows(out, p);
        return;
    } else {
        outln!(
        *out,
        "{} configurations of the recording's levers (allocator settings, checkpointing by layers, micro-batch) for \
         {} sequences per step, {} of them fit by their tensors; {} replayed, {found} found to fit (every-k's k shown \
         once); the fastest {shown} of them:",
        p.search.tried,
        p.global_batch,
        p.search.fit_by_tensors,
        p.search.replayed,
    );
    }
    outln!(
        *out,
        "  {:<52} {:<10} {:>6} {:>6} {:>12} {:>10} {:>10}",
        "allocator",
        "checkpoint",
        "micro",
        "accum",
        "per GPU",
        "step (s)",
        "tokens/s"
    );
    for r in p.search.recommendations.iter().take(10) {
        let time = match &r.estimate.time {
            Some(t) => format!("{:>10.3} {:>10.0}", t.step_time_s, t.tokens_per_s),
            None => format!("{:>10} {:>10}", "-", "-"),
        };
        outln!(
            *out,
            "  {:<52} {:<10} {:>6} {:>6} {:>12} {time}",
            r.allocator.as_deref().unwrap_or(""),
            r.config.checkpointing.spelling(),
            r.config.micro_batch,
            r.config.accumulation,
            format_size(r.estimate.memory.per_gpu_bytes as u64),
        );
    }
    let untimed = p.search.recommendations.iter().take(10).find(|r| r.estimate.time.is_none());
    if let Some(why) = untimed.and_then(|r| r.estimate.runner.untimed) {
        outln!(
            *out,
            "  (- : not timed: {why}; those rows are ranked by less recomputation, then fewer accumulation steps)"
        );
    }
    if p.search.recommendations.iter().any(|r| r.config.accumulation > 1) {
        outln!(
            *out,
            "  (a row that accumulates fits with its margin holding the gradients the optimizer reads, which gradient \
             accumulation keeps through the later micro-batches and one recorded micro-batch does not)"
        );
    }
    if p.search.recommendations.iter().take(10).any(|r| r.allocator.as_deref().is_some_and(|a| a.contains("--policy")))
    {
        outln!(
            *out,
            "  (--policy: headroom's allocator in PyTorch's place, loaded before the first CUDA tensor with \
             headroom_gpu.torch_allocator.use(policy=...))"
        );
    }
    outln!(*out, "what the recording fixes — record the step again to plan another:");
    for r in RECORD_AGAIN {
        outln!(*out, "  {r}");
    }
}

/// An inference recording's time: its last timed forward (a decode step, for generate's), the
/// tokens it takes in or, decoding, the tokens it makes; no MFU, whose FLOPs are a training
/// step's.
pub(super) fn inference_time_lines(out: &mut String, e: &Estimate, r: &Recording) {
    let Some(t) = &e.time else { return super::text::step_time_lines(out, e, false) };
    let step = r.timed_kernels().first().map_or(0, |k| k.step);
    let (what, tokens) = match r.decode_steps() {
        Some(_) => ("decode step", format!("{:.0} new tokens/s", e.job.micro_batch as f64 / t.step_time_s)),
        None => ("forward", format!("{:.0} tokens/s", t.tokens_per_s)),
    };
    outln!(*out, "step time ≈ {:.3} s per {what} (step {step} of the recording, its kernels; {tokens})", t.step_time_s);
    super::text::step_time_line(out, &t.breakdown);
}

/// What an inference recording's steps are: generate's prefill and decode steps, or forwards.
pub(super) fn forwards(r: &Recording) -> String {
    let plural = |n: u32| if n == 1 { "" } else { "s" };
    match r.decode_steps() {
        Some(n) => format!("generate's prefill and {n} decode step{}", plural(n)),
        None => format!("{} forward{} without gradients", r.steps(), plural(r.steps())),
    }
}
