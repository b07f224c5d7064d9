//! `headroom plan`'s text for training: the configuration, a bar per term, the total and
//! whether it fits, then the step time, the search and the engine config (inference's: `infer_text`).

use super::{max_seq_searched, TrainPlan, MAX_BATCH_SEARCHED};
use headroom_alloc::units::format_size;
use headroom_plan::builders::{hf, Device, ProgramSource};
use headroom_plan::estimate::{Estimate, RunnerRecord, Timing};
use headroom_plan::job::{Finetune, Offload, PipelineStage};
use headroom_plan::model::Model;
use headroom_plan::names::Named;
use headroom_plan::parallel::{Parallelism, PipelineSchedule, StageOutputs};
use headroom_plan::program::Phase;
use headroom_plan::recording::Recording;
use headroom_plan::time::{Breakdown, TimeTerm};

pub(super) fn train(p: &TrainPlan) -> String {
    let e = &p.estimate;
    let cfg = &e.job;
    let mut out = String::new();
    outln!(out, "{}", job_line(p));
    if cfg.compile && !e.runner.compiled {
        outln!(
            out,
            "note: --compile: torch.compile's steps were recorded for transformers' decoders (one replica per GPU, full \
             fine-tuning) at fp32, bf16 and AMP without checkpointing and at fp32 with full checkpointing, not for this \
             job's; it is planned with the eager code's"
        );
    }
    if p.recording.is_some() && cfg.parallel.gpus() > 1 {
        outln!(
            out,
            "{} GPUs: the recording is one rank's step (record it as one rank of DDP or FSDP2 over a fake process \
             group for their gradient buckets and shards)",
            cfg.parallel.gpus()
        );
    } else if cfg.parallel.gpus() > 1 || cfg.offload != Offload::None {
        outln!(out, "{}", layout_line(&cfg.parallel, cfg.offload, cfg.deepspeed(), fsdp2(&e.runner)));
    }
    outln!(out, "{}", runner_line(&e.runner));
    if let Some(line) = cache_line(p) {
        outln!(out, "{line}");
    }
    if let Some(line) = loss_line(p) {
        outln!(out, "{line}");
    }
    outln!(out);
    let b = &e.memory.breakdown;
    let terms = [
        ("weights", b.weights),
        ("gradients", b.gradients),
        ("optimizer", b.optimizer),
        ("activations", b.activations),
        ("logits", b.logits),
        ("temporary", b.temporary),
        ("framework", b.framework),
    ];
    // Inference has neither gradients nor optimizer state: its bars are the terms it has.
    let training = |name: &&str| !matches!(*name, "gradients" | "optimizer");
    let terms: Vec<(&str, f64)> =
        terms.into_iter().filter(|(name, _)| p.inference().is_none() || training(name)).collect();
    terms_and_total(&mut out, &terms, e.memory.per_gpu_bytes, p.gpu.memory_bytes, e.verdict.fits);
    memory_lines(&mut out, p);
    super::recorded::additions_text(&mut out, p);
    if let Some(c) = &p.calibration {
        calibration_lines(&mut out, c);
    }
    pipeline_lines(&mut out, e);
    if e.memory.host_bytes > 0.0 {
        outln!(out, "host memory per node for the offloaded states: {}", format_size(e.memory.host_bytes as u64));
    }
    super::advice::lines(&mut out, p);
    if let Some(n) = &e.verdict.note {
        outln!(out, "{n}");
    }
    if let Some(n) = &p.context_note {
        outln!(out, "note: {n}");
    }
    match p.inference() {
        Some(r) => super::recorded::inference_time_lines(&mut out, e, r),
        None => step_time_lines(&mut out, e, !Recording::is_stand_in(p.model)),
    }
    if let Some(m) = p.max_batch {
        if m >= MAX_BATCH_SEARCHED {
            outln!(out, "largest micro-batch that fits: at least {m} (the search stops there)");
        } else {
            outln!(out, "largest micro-batch that fits: {m}");
        }
    }
    if let Some(s) = p.max_seq {
        max_seq_line(&mut out, p.model, s, &format!("at micro-batch {}", cfg.micro_batch));
    }
    if p.recommend && p.recording.is_some() {
        super::recorded::recommendations_text(&mut out, p);
    } else if p.recommend {
        recommendations(&mut out, p);
    }
    if let Some(ec) = &p.engine_config {
        engine_config(&mut out, ec);
    }
    out
}

/// The step time and where it goes, or why the estimate has none; the model FLOPs
/// utilization where the model's FLOPs are known (`mfu`: not for a recording's own model).
pub(super) fn step_time_lines(out: &mut String, e: &Estimate, mfu: bool) {
    let Some(t) = &e.time else {
        match e.runner.untimed {
            Some(why) => outln!(*out, "step time: not estimated ({why})"),
            None => outln!(*out, "step time: not estimated"),
        }
        return;
    };
    outln!(
        *out,
        "step time ≈ {:.3} s per optimizer step ({:.0} tokens/s{}{}), recomputing {:.0}% of a forward pass",
        t.step_time_s,
        t.tokens_per_s,
        if e.job.parallel.gpus() > 1 { " over all GPUs" } else { "" },
        if mfu { format!(", MFU {:.0}%", t.mfu * 100.0) } else { String::new() },
        t.recompute_fraction * 100.0
    );
    step_time_line(out, &t.breakdown);
}

/// The job as planned: the model, the GPU, the shape and the settings.
fn job_line(p: &TrainPlan) -> String {
    let (e, cfg) = (&p.estimate, &p.estimate.job);
    if let ProgramSource::Recording(file) = &e.runner.source {
        let what = match p.inference() {
            Some(r) => format!(
                "inference: {} sequences × {} tokens, {}",
                cfg.micro_batch,
                cfg.seq,
                super::recorded::forwards(r)
            ),
            None => format!("training: micro-batch {} × {} tokens, the step", cfg.micro_batch, cfg.seq),
        };
        return format!(
            "{} on {} ({}), {what} recorded in {file}",
            super::model_label(p.model),
            p.gpu.name,
            format_size(p.gpu.memory_bytes),
        );
    }
    format!(
        "{} on {} ({}), {}: micro-batch {} × {} tokens{}, {}, {}, {} attention, checkpointing {}{}",
        p.model,
        p.gpu.name,
        format_size(p.gpu.memory_bytes),
        match cfg.finetune {
            Finetune::Full => "training".to_string(),
            f => match headroom_plan::placement::base_format(cfg) {
                // QLoRA's own setup goes without saying; another 4-bit storage is named.
                Some(b @ headroom_plan::bnb::Bnb::FourBit { quant_type, double_quant, .. })
                    if quant_type != headroom_plan::bnb::QuantType::Nf4 || !double_quant =>
                {
                    format!(
                        "{} fine-tuning ({}; {} trainable parameters)",
                        f.name(),
                        b.describe(),
                        e.memory.trainable_params
                    )
                }
                _ => format!("{} fine-tuning ({} trainable parameters)", f.name(), e.memory.trainable_params),
            },
        },
        cfg.micro_batch,
        cfg.seq,
        match cfg.target_seq {
            Some(t) => format!(" into a decoder of {t}"),
            None => String::new(),
        } + &if cfg.accumulation > 1 { format!(" × {} accumulated", cfg.accumulation) } else { String::new() },
        cfg.precision.name(),
        cfg.optimizer.name(),
        cfg.attention.name(),
        cfg.checkpointing.spelling(),
        if e.runner.compiled { ", torch.compile" } else { "" },
    )
}

/// Whether the program is FSDP2's own (parameters, gradients and optimizer state sharded over
/// data × context), not ZeRO's closed form.
fn fsdp2(r: &RunnerRecord) -> bool {
    r.source == ProgramSource::Fsdp2
}

/// Who built the program, from what, and why the builders before it did not.
fn runner_line(r: &RunnerRecord) -> String {
    let mut line = match &r.source {
        ProgramSource::Recording(_) => return "program: the recording, replayed as recorded".into(),
        source => format!("program: {}, --framework {}", r.builder, r.framework.name()) + &recorded_as(source),
    };
    if !r.passed.is_empty() {
        let passed: Vec<String> = r.passed.iter().map(|p| format!("{}: {}", p.builder, p.why)).collect();
        line.push_str(&format!(" (passed over {})", passed.join("; ")));
    }
    line
}

/// What the plan assumed of transformers' key-value cache, where it moves the peak.
fn cache_line(p: &TrainPlan) -> Option<String> {
    let key =
        p.estimate.runner.source.detail().filter(|_| matches!(p.estimate.runner.source, ProgramSource::Template(_)))?;
    let c = hf::cache_assumed(p.model, &p.estimate.job, key)?;
    let on = |b: bool| if b { "on" } else { "off" };
    Some(if c.asked == c.recorded {
        format!(
            "key-value cache: {} in the training forward (--use-cache {}{}), as the step was recorded",
            on(c.asked),
            c.asked,
            if c.asked { ", transformers' default" } else { "" }
        )
    } else {
        format!(
            "key-value cache: {} asked (--use-cache {}), but only the step with it {} was recorded for this job: the \
             plan is off by the cache's copies of each layer's key and value",
            on(c.asked),
            c.asked,
            on(c.recorded)
        )
    })
}

/// How long the loop keeps the loss, where the recorded step's loss holds something after the
/// backward (the input embeddings' output and its gradient, under checkpointing with peft).
fn loss_line(p: &TrainPlan) -> Option<String> {
    let ProgramSource::Template(key) = &p.estimate.runner.source else { return None };
    let life = p.estimate.job.loss_lives;
    hf::loss_holds(p.model, &p.estimate.job, Device::Gpu(p.gpu), key).then(|| {
        format!("loss, and what its graph holds after the backward (--loss-lives {}): {}", life.name(), life.help())
    })
}

/// The recorded template the program was expanded from, where it was.
fn recorded_as(source: &ProgramSource) -> String {
    match source {
        ProgramSource::Template(key) => format!(", recorded as {key}"),
        _ => String::new(),
    }
}

/// Under pipelining: the rank or stage that peaks.
fn pipeline_lines(out: &mut String, e: &Estimate) {
    if let Some(pr) = &e.memory.pipeline {
        let r = &pr.ranks[pr.peak as usize];
        let l = &r.layout;
        let stages: Vec<String> = l.stages.iter().map(u64::to_string).collect();
        outln!(
            out,
            "(pipeline rank {} of {} peaks under {}: stage{} {}, {} blocks, {} micro-batch chunks in flight; {} reserved)",
            l.rank,
            pr.ranks.len(),
            pr.schedule.class(),
            if l.stages.len() > 1 { "s" } else { "" },
            stages.join(" and "),
            l.layers,
            l.in_flight,
            format_size(r.reserved_bytes as u64)
        );
        let each: Vec<String> =
            pr.ranks.iter().map(|r| format!("{} {}", r.layout.rank, format_size(r.reserved_bytes as u64))).collect();
        outln!(out, "  every rank's reserved peak: {}", each.join(", "));
    } else if e.job.parallel.pipeline > 1 {
        outln!(
            out,
            "(the {} pipeline stage: {})",
            e.memory.stage.name(),
            if e.memory.stage == PipelineStage::First {
                "the embedding and the most micro-batches in flight"
            } else {
                "the head and the logits"
            }
        );
    }
}

/// `--emit`'s configuration, and which recommendation it is for.
fn engine_config(out: &mut String, ec: &super::EngineConfig) {
    outln!(out);
    if let Some((rank, r)) = &ec.pick {
        let l = &r.config.parallel;
        outln!(
            out,
            "{}'s configuration for the fastest configuration it runs that fits (number {rank} of those \
             that fit): {} {} attention, checkpointing {}, tp·pp·cp·dp {}·{}{}·{}·{}, ZeRO {}, micro-batch {} × {}:",
            ec.engine.name(),
            r.config.precision.name(),
            r.config.attention.name(),
            r.config.checkpointing.spelling(),
            l.tensor,
            l.pipeline,
            if l.virtual_stages > 1 { format!("v{}", l.virtual_stages) } else { String::new() },
            l.context,
            l.data,
            l.zero_stage,
            r.config.micro_batch,
            r.config.accumulation
        );
    }
    outln!(out, "{}", ec.text);
}

/// Which part of the step time dominates, and for a launch-bound step what users do about it.
pub(super) fn step_time_line(out: &mut String, b: &Breakdown) {
    let total = b.total().max(f64::MIN_POSITIVE);
    let pct = |x: f64| x / total * 100.0;
    outln!(
        out,
        "  of which compute {:.0}%, memory-bound {:.0}%, launch {:.0}%, communication {:.0}%: {}",
        pct(b.compute),
        pct(b.memory),
        pct(b.launch),
        pct(b.communication),
        match b.dominant() {
            TimeTerm::Launch =>
                "launch-bound — the GPU waits for the host to launch its kernels; a larger \
                                 micro-batch, CUDA graphs or torch.compile would run it faster",
            TimeTerm::Compute => "compute-bound",
            TimeTerm::Memory => "bound by memory traffic (norms, activations, casts, the loss, the optimizer step)",
            TimeTerm::Communication => "bound by communication",
        }
    );
}

/// A recommendation's step time, tokens per second and MFU columns; dashes where it is untimed.
fn time_columns(t: Option<&Timing>) -> String {
    match t {
        Some(t) => format!("{:>10.3} {:>10.0} {:>4.0}%", t.step_time_s, t.tokens_per_s, t.mfu * 100.0),
        None => format!("{:>10} {:>10} {:>5}", "-", "-", "-"),
    }
}

fn recommendations(out: &mut String, p: &TrainPlan) {
    outln!(out);
    let (found, shown) = (p.search.recommendations.len(), p.search.recommendations.len().min(10));
    outln!(
        out,
        "{} of {} configurations fit by their tensors{}; replayed fastest first, {found} distinct ones found to fit \
         for {} sequences per step on {} GPUs (every-k's k shown once); the fastest {shown} of them:",
        p.search.fit_by_tensors,
        p.search.tried,
        super::advice::held(&p.held, &p.estimate.job),
        p.global_batch,
        p.estimate.job.parallel.gpus()
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
    for r in p.search.recommendations.iter().take(10) {
        let l = &r.config.parallel;
        outln!(
            out,
            "  {:<6} {:<6} {:<10} {:<9} {:>13} {:>4} {:>8} {:>6} {:>6} {:>12} {}",
            r.config.precision.name(),
            r.config.attention.name(),
            r.config.checkpointing.spelling(),
            r.estimate.runner.framework.name(),
            format!(
                "{}·{}{}·{}·{}",
                l.tensor,
                l.pipeline,
                if l.virtual_stages > 1 { format!("v{}", l.virtual_stages) } else { String::new() },
                l.context,
                l.data
            ),
            l.zero_stage,
            r.config.offload.name(),
            r.config.micro_batch,
            r.config.accumulation,
            format_size(r.estimate.memory.per_gpu_bytes as u64),
            time_columns(r.estimate.time.as_ref())
        );
    }
    let fused = p.search.recommendations.iter().take(10).filter(|r| r.config.optimizer_impl.is_some()).count();
    if fused > 0 && p.estimate.job.optimizer_impl.is_none() {
        outln!(
            out,
            "  ({fused} of these fit only with AdamW's fused implementation: --optimizer-impl fused, or transformers' \
             Trainer, which picks it)"
        );
    }
}

/// `--max-seq`'s answer, saying when it reaches the search's end or the trained context.
pub(super) fn max_seq_line(out: &mut String, model: &Model, seq: u64, at: &str) {
    if seq == 0 {
        outln!(out, "longest sequence that fits {at}: none (not even 1 token)");
    } else if seq >= max_seq_searched(model) {
        let end = if model.learned_positions() { "its learned positions end there" } else { "the search stops there" };
        outln!(out, "longest sequence that fits {at}: at least {seq} tokens ({end})");
    } else {
        let beyond = if seq > model.max_position {
            format!(", beyond {}'s context of {} tokens", model.name, model.max_position)
        } else {
            String::new()
        };
        outln!(out, "longest sequence that fits {at}: {seq} tokens{beyond}");
    }
}

fn layout_line(p: &Parallelism, offload: Offload, deepspeed: bool, fsdp2: bool) -> String {
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
            "pipeline {} ({}{})",
            p.pipeline,
            match p.pipeline_schedule() {
                PipelineSchedule::Schedule1F1B => "1F1B".into(),
                s => format!("{}, {} chunks a rank", s.class(), p.virtual_stages),
            },
            match p.stage_outputs {
                StageOutputs::None => "",
                StageOutputs::LastStage => "; the last stage keeps its outputs for the step",
                StageOutputs::EveryStage => "; every stage keeps its outputs for the step",
            }
        ));
    }
    if p.context > 1 {
        parts.push(format!("context {}", p.context));
    }
    let engine = if deepspeed { "DeepSpeed " } else { "" };
    if fsdp2 {
        // The program is FSDP2's own (parameters, gradients and optimizer state sharded
        // over data × context), not ZeRO's closed form.
        let hsdp = if p.replicate > 1 { format!(" in {} HSDP replicas", p.replicate) } else { String::new() };
        parts.push(format!(
            "data {}: FSDP2 (fully_shard) as torchtitan runs it, sharded over {} GPUs{hsdp}, reshard_after_forward={}",
            p.data,
            p.shard_degree(),
            // torchtitan's default policy under pipelining keeps the stage gathered.
            if p.zero_stage >= 3 && p.pipeline <= 1 { "True" } else { "False" }
        ));
    } else {
        parts.push(format!("data {} with {engine}ZeRO-{}", p.data, p.zero_stage));
    }
    if offload != Offload::None {
        parts.push(format!("offloading the {} to the CPU", offload.name().replace('+', " and ")));
    }
    parts.join(", ")
}

/// A bar per term, the total, and whether it fits.
/// A byte figure with its sign (a calibration may take bytes away).
fn signed_size(x: f64) -> String {
    if x < 0.0 {
        format!("-{}", format_size((-x).round() as u64))
    } else {
        format_size(x.round() as u64)
    }
}

/// Allocated and reserved memory as the replay of the job's program gives them, the margin
/// or where the job runs out, and what would make it fit.
fn memory_lines(out: &mut String, p: &TrainPlan) {
    let (e, m) = (&p.estimate, &p.estimate.memory);
    outln!(
        out,
        "allocated {} (torch.cuda.max_memory_allocated), reserved {} (max_memory_reserved), {} outside PyTorch \
         (CUDA context, driver{}); replayed through PyTorch's caching allocator under {}",
        format_size(m.allocated_bytes as u64),
        format_size(m.reserved_bytes as u64),
        format_size(m.outside_bytes.max(0.0) as u64),
        if e.job.parallel.gpus() > 1 { ", NCCL" } else { "" },
        p.allocator
    );
    let phase_name = |ph: Phase| if ph == Phase::Setup { "model's setup".to_string() } else { ph.to_string() };
    if let Some(o) = &m.oom {
        outln!(
            out,
            "runs out of memory {}: asks for {} ({} of {}) with {} free, {} reserved and {} allocated",
            if o.at.phase == Phase::Setup {
                "while the model is built".to_string()
            } else {
                format!("in step {}'s {}", o.at.step, phase_name(o.at.phase))
            },
            format_size(o.oom.report.alloc_size),
            o.term.name(),
            if o.site.is_empty() { "the step" } else { &o.site },
            format_size(o.oom.report.device_free),
            format_size(o.oom.report.reserved),
            format_size(o.oom.report.allocated)
        );
    } else if e.verdict.fits && m.alloc_retries > 0 {
        // Reserved memory reached the device: the margin is the cache PyTorch gave back.
        outln!(
            out,
            "fits only by freeing the allocator's cache: {} requests retried after emptying it \
             (num_alloc_retries; each synchronizes the GPU and costs step time); `--alloc-conf` and \
             `--policy` replay it under other settings",
            m.alloc_retries
        );
    } else if let Some(margin) = e.verdict.margin_bytes {
        outln!(
            out,
            "margin: {} of the {} PyTorch can have",
            format_size(margin.max(0.0) as u64),
            format_size(m.capacity_bytes as u64)
        );
    }
    if let Some(phase) = m.phase {
        let code = match e.runner.source {
            ProgramSource::Template(_) => "transformers' code as recorded, ",
            ProgramSource::Fsdp2 => "FSDP2 as torchtitan runs it, ",
            ProgramSource::Analytic | ProgramSource::Recording(_) => "",
        };
        let ph = &m.phase_peaks;
        if p.inference().is_some() {
            outln!(
                out,
                "the peak is in the {} (allocated: forward {}; inference, no backward or optimizer step)",
                phase_name(phase),
                format_size(ph.forward)
            );
        } else {
            outln!(
                out,
                "the peak is in the {} ({code}allocated: forward {}, backward {}, optimizer step {})",
                phase_name(phase),
                format_size(ph.forward),
                format_size(ph.backward),
                format_size(ph.optimizer_step)
            );
        }
    }
    for (label, r) in &p.asked {
        let verdict = if r.verdict.fits {
            format!("fits, {} reserved", format_size(r.memory.reserved_bytes as u64))
        } else {
            "does NOT fit".to_string()
        };
        outln!(out, "under {label}: {verdict} ({} per GPU)", format_size(r.memory.per_gpu_bytes as u64));
    }
}

pub(super) fn terms_and_total(out: &mut String, terms: &[(&str, f64)], total: f64, capacity: u64, fits: bool) {
    terms_only(out, terms, total, capacity);
    outln!(
        out,
        "{}: {} of {} per GPU",
        if fits { "fits" } else { "does NOT fit" },
        format_size(total as u64),
        format_size(capacity)
    );
}

/// The terms as bars, and their total.
pub(super) fn terms_only(out: &mut String, terms: &[(&str, f64)], total: f64, capacity: u64) {
    let scale = (capacity as f64).max(total);
    for (name, bytes) in terms {
        // A term larger than the total (vLLM's profile peak at absurd settings) fills the bar, no more.
        let width = ((bytes.max(0.0) / scale).min(1.0) * 40.0).round() as usize;
        outln!(out, "  {name:<12} {:>12}  {}", signed_size(*bytes), "█".repeat(width));
    }
    outln!(out, "  {:<12} {:>12}", "total", format_size(total as u64));
    outln!(out);
}

fn calibration_lines(out: &mut String, c: &super::calibration::Calibrated) {
    use headroom_plan::calibrate::{Correction, Figures};
    let gib = |x: f64| format_size(x.max(0.0) as u64);
    let figures = |f: &Figures| {
        format!(
            "kept {}, forward {}, backward {}, optimizer step {}; reserved {}",
            gib(f.start),
            gib(f.phases.forward),
            gib(f.phases.backward),
            gib(f.phases.optimizer_step),
            gib(f.reserved)
        )
    };
    for (r, s) in c.runs.iter().zip(&c.fit.snapshots) {
        let step = match &s.step {
            Some(st) => format!(
                "step {} of {} used ({}, {} micro-step{})",
                st.number,
                s.steps_found,
                st.kind.name(),
                st.micro_steps,
                if st.micro_steps == 1 { "" } else { "s" }
            ),
            None => "no step used".to_string(),
        };
        let mut found = Vec::new();
        if let Some(b) = s.construction {
            found.push(format!("the model's construction ({})", gib(b as f64)));
        }
        if s.began_mid_step {
            found.push("a first step begun before the trace (not whole)".to_string());
        }
        let found = if found.is_empty() { String::new() } else { format!("; recorded {}", found.join(", ")) };
        outln!(
            out,
            "calibrated from {}, device {} (micro-batch {} × {} tokens): {step}{found}",
            r.file,
            r.device,
            s.batch,
            s.seq
        );
        if let Some(note) = &s.note {
            outln!(out, "  {note}");
        }
        if let (Some(m), Some(u), Some(k)) = (&s.recorded, &s.uncalibrated, &s.calibrated) {
            outln!(out, "  recorded     {}", figures(m));
            outln!(out, "  planned      {}", figures(u));
            let pct = |x: f64, of: f64| if of > 0.0 { (x - of) / of * 100.0 } else { 0.0 };
            outln!(
                out,
                "  calibrated   {} (residual: allocated peak {:+.2}%, reserved {:+.2}%)",
                figures(k),
                pct(k.peak(), m.peak()),
                pct(k.reserved, m.reserved)
            );
        }
        if let Some(o) = &s.oom {
            let free = match o.device_free {
                Some(f) if f >= o.asked => {
                    format!("{} free on the device (a per-process memory limit refused it)", gib(f as f64))
                }
                Some(f) => format!("{} free on the device", gib(f as f64)),
                None => "the device's free memory not recorded".to_string(),
            };
            outln!(
                out,
                "  ran out of memory in step {}'s {}: asked {} with {} allocated, {} reserved, {free}",
                o.step,
                o.phase,
                gib(o.asked as f64),
                gib(o.allocated as f64),
                gib(o.reserved as f64)
            );
        }
    }
    let law = |c: &Correction| {
        let l = &c.law;
        let mut parts = Vec::new();
        if c.scale != 1.0 {
            parts.push(format!("own tensors ×{:.3}", c.scale));
        }
        if l.fixed != 0.0 {
            parts.push(format!("+{}", gib(l.fixed)));
        }
        if l.per_token != 0.0 {
            parts.push(format!("+{:.0} B a token", l.per_token));
        }
        if l.per_token_position != 0.0 {
            parts.push(format!("+{:.2} B a token × position", l.per_token_position));
        }
        if parts.is_empty() {
            "as planned".to_string()
        } else {
            parts.join(" ")
        }
    };
    if c.fit.snapshots.iter().any(|s| s.step.is_some()) {
        outln!(out, "  fitted (recorded / planned, each snapshot):");
        for t in &c.fit.terms {
            let pairs: Vec<String> =
                t.recorded.iter().zip(&t.planned).map(|(r, p)| format!("{} / {}", gib(*r), gib(*p))).collect();
            outln!(out, "    {:<20} {:<40} {}", t.name, pairs.join(", "), law(&t.correction));
        }
        let (a, r) = c.fit.residual();
        outln!(
            out,
            "  residual on the recorded step{}: allocated peak within {:.2}%, reserved within {:.2}%",
            if c.fit.snapshots.len() > 1 { "s" } else { "" },
            a * 100.0,
            r * 100.0
        );
    }
    if let Some(e) = &c.fit.calibration.oom {
        outln!(
            out,
            "  OOM evidence: at micro-batch {} × {} tokens or more, with at most {} for PyTorch, the job does not fit",
            e.batch,
            e.seq,
            gib(e.capacity as f64)
        );
    }
}
