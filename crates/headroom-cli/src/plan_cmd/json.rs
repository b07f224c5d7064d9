//! `headroom plan --json`: one object, keys in docs/JSON.md. Byte figures are
//! whole bytes; enum values are the library's stable names ([`Named`]).

use super::{max_seq_searched, InferPlan, TrainPlan, MAX_BATCH_SEARCHED};
use headroom_plan::builders::{Device, ProgramSource};
use headroom_plan::estimate::{Estimate, Memory, RunnerRecord, Timing, Verdict};
use headroom_plan::gpu::GpuSpec;
use headroom_plan::infer::{InferSource, Runtime};
use headroom_plan::job::TrainConfig;
use headroom_plan::model::Model;
use headroom_plan::names::Named;
use headroom_plan::parallel::Parallelism;
use headroom_plan::program::phase_name;
use headroom_plan::recording::Recording;
use headroom_plan::search::Recommendation;
use serde_json::{json, Map, Value};

/// A byte figure: the estimate is in real numbers, the answer in whole bytes.
fn bytes(x: f64) -> u64 {
    x.round() as u64
}

/// A byte figure that may be negative (a calibration's adjustments).
fn signed_bytes(x: f64) -> i64 {
    x.round() as i64
}

fn parallel(p: &Parallelism) -> Value {
    json!({
        "data": p.data, "tensor": p.tensor, "pipeline": p.pipeline, "context": p.context,
        "virtual_stages": p.virtual_stages, "pipeline_schedule": p.pipeline_schedule().class(),
        "pipeline_outputs": p.stage_outputs.arg(), "sequence_parallel": p.sequence_parallel && p.tensor > 1,
        "zero_stage": p.zero_stage, "replicate": p.replicate,
    })
}

/// One object of several records' keys.
fn merged(records: impl IntoIterator<Item = Value>) -> Value {
    let mut out = Map::new();
    for r in records {
        if let Value::Object(m) = r {
            out.extend(m);
        }
    }
    Value::Object(out)
}

pub(super) fn train(p: &TrainPlan) -> Value {
    let e = &p.estimate;
    let mut v = merged([
        job(p.model, p.gpu, &e.job),
        runner(&e.runner),
        json!({ "use_cache": use_cache(p.model, &e.job, &e.runner) }),
        loss_lives(p),
        memory(&e.memory, &e.verdict),
        e.time.as_ref().map_or_else(untimed, time),
        json!({
            "calibration": p.calibration.as_ref().map(calibration),
            "allocator": p.allocator,
            "alternatives": alternatives(p),
            "levers": super::advice::levers_json(p),
            "allocator_cache": super::advice::cache_json(p),
            "max_batch": p.max_batch,
            "max_batch_is_search_limit": p.max_batch.map(|m| m >= MAX_BATCH_SEARCHED),
            "max_seq": p.max_seq,
            "max_seq_is_search_limit": p.max_seq.map(|m| m >= max_seq_searched(p.model)),
            "configurations_searched": p.search.tried,
            "configurations_fit_by_tensors": p.search.fit_by_tensors,
            "configurations_replayed": p.search.replayed,
            "configurations_found": p.search.recommendations.len(),
            "recommendations": p.search.recommendations.iter().take(20).map(recommendation).collect::<Vec<_>>(),
            "engine_config": p.engine_config.as_ref().map(|e| e.text.clone()),
            "engine_config_rank": p.engine_config.as_ref().and_then(|e| e.pick.as_ref().map(|(rank, _)| *rank)),
            "context_note": p.context_note,
            "recording_additions": p.recording.map(|_| super::recorded::additions_json(p)),
            "record_again": (p.recommend && p.recording.is_some()).then_some(super::recorded::RECORD_AGAIN),
        }),
    ]);
    if let Some(r) = p.inference() {
        inference(&mut v, e, r);
    }
    if Recording::is_stand_in(p.model) {
        // What only a model's figures give: a recording's own model has none.
        v["trainable_params"] = Value::Null;
        v["mfu"] = Value::Null;
        if let Some(Value::Array(rows)) = v.get_mut("recommendations") {
            for r in rows {
                r["mfu"] = Value::Null;
            }
        }
    }
    v
}

/// An inference recording's plan: `mode` `infer`, its forwards and decode steps, the step time
/// of its last timed forward (for a decode step, the tokens it makes a second), and training's
/// keys null.
fn inference(v: &mut Value, e: &Estimate, r: &Recording) {
    v["mode"] = json!("infer");
    v["forwards"] = json!(r.steps());
    v["decode_steps"] = json!(r.decode_steps());
    for key in [
        "accumulation",
        "global_batch",
        "finetune",
        "base_quantization",
        "offload",
        "trainable_params",
        "optimizer_impl",
        "mfu",
        "recompute_fraction",
    ] {
        v[key] = Value::Null;
    }
    v["phases"] = json!({ "forward": e.memory.phase_peaks.forward });
    if let Some(t) = &e.time {
        v["layer_time_s"]["backward"] = Value::Null;
        if r.decode_steps().is_some() {
            v["tokens_per_s"] = json!(e.job.micro_batch as f64 / t.step_time_s);
        }
    }
    if let Some(Value::Array(rows)) = v.get_mut("recommendations") {
        for row in rows {
            row["mfu"] = Value::Null;
            row["accumulation"] = Value::Null;
        }
    }
}

/// The job as planned.
fn job(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig) -> Value {
    json!({
        "model": model.name,
        // A recording planned without --model is its own model: no parameter count is known.
        "recorded_model": Recording::is_stand_in(model),
        "params": (!Recording::is_stand_in(model)).then(|| model.params()),
        "gpu": gpu.name,
        "gpu_memory_bytes": gpu.memory_bytes,
        "mode": "train",
        "gpus": cfg.parallel.gpus(),
        "parallel": parallel(&cfg.parallel),
        "accumulation": cfg.accumulation,
        "global_batch": cfg.global_batch(),
        "finetune": cfg.finetune.name(),
        "base_quantization": headroom_plan::placement::base_format(cfg).map(quantization),
        "offload": cfg.offload.name(),
    })
}

/// transformers' key-value cache as the plan assumed it and as its template was recorded, where
/// it moves the peak; null elsewhere.
fn use_cache(model: &Model, cfg: &TrainConfig, r: &RunnerRecord) -> Value {
    let ProgramSource::Template(key) = &r.source else { return Value::Null };
    headroom_plan::builders::hf::cache_assumed(model, cfg, key)
        .map_or(Value::Null, |c| json!({"asked": c.asked, "recorded": c.recorded}))
}

/// How long the loop keeps the loss, as planned (`--loss-lives`), and whether the recorded step's
/// loss holds anything after the backward for it to keep; a recording's loop is its own (null).
fn loss_lives(p: &TrainPlan) -> Value {
    let e = &p.estimate;
    match &e.runner.source {
        ProgramSource::Recording(_) => json!({ "loss_lives": null, "loss_held": null }),
        ProgramSource::Template(key) => json!({
            "loss_lives": e.job.loss_lives.name(),
            "loss_held": headroom_plan::builders::hf::loss_holds(p.model, &e.job, Device::Gpu(p.gpu), key),
        }),
        _ => json!({ "loss_lives": e.job.loss_lives.name(), "loss_held": null }),
    }
}

/// Who built the program.
fn runner(r: &RunnerRecord) -> Value {
    let source = match &r.source {
        ProgramSource::Template(key) => {
            json!({"source": r.source.name(), "template": key})
        }
        ProgramSource::Recording(file) => json!({"source": r.source.name(), "file": file}),
        ProgramSource::Fsdp2 | ProgramSource::Analytic => json!({"source": r.source.name()}),
    };
    json!({
        "runner": {
            "builder": r.builder,
            "framework": r.framework.name(),
            "source": r.source.detail(),
            "passed": r.passed.iter().map(|p| json!({"builder": p.builder, "why": p.why})).collect::<Vec<_>>(),
        },
        "framework": r.framework.name(),
        "program": source,
        "compile": r.compiled,
        "optimizer_impl": r.optimizer_impl.name(),
    })
}

/// What the replay measured, and the verdict.
fn memory(m: &Memory, v: &Verdict) -> Value {
    let b = &m.breakdown;
    json!({
        "trainable_params": m.trainable_params,
        "fits": v.fits,
        "per_gpu_bytes": bytes(m.per_gpu_bytes),
        "pipeline_stage": m.stage.name(),
        "pipeline_ranks": m.pipeline.as_ref().map(|pr| json!({
            "schedule": pr.schedule.class(),
            "peak_rank": pr.peak,
            "ranks": pr.ranks.iter().map(|r| json!({
                "rank": r.layout.rank, "stages": r.layout.stages, "layers": r.layout.layers,
                "in_flight": r.layout.in_flight, "reserved_bytes": bytes(r.reserved_bytes),
                "allocated_bytes": bytes(r.allocated_bytes),
            })).collect::<Vec<_>>(),
        })),
        "breakdown": {
            "weights": bytes(b.weights), "gradients": bytes(b.gradients), "optimizer": bytes(b.optimizer),
            "activations": bytes(b.activations), "logits": bytes(b.logits), "kv_cache": 0,
            "temporary": bytes(b.temporary), "framework": bytes(b.framework),
        },
        "host_bytes": bytes(m.host_bytes),
        "allocated_bytes": bytes(m.allocated_bytes),
        "tensor_bytes": bytes(m.tensor_bytes),
        "reserved_bytes": bytes(m.reserved_bytes),
        "capacity_bytes": bytes(m.capacity_bytes),
        "margin_bytes": v.margin_bytes.map(bytes),
        "oom": m.oom.as_ref().map(|o| json!({
            "step": o.at.step, "phase": phase_name(o.at.phase), "requested_bytes": o.oom.report.requested,
            "asked_bytes": o.oom.report.alloc_size, "device_free_bytes": o.oom.report.device_free,
            "allocated_bytes": o.oom.report.allocated, "reserved_bytes": o.oom.report.reserved,
            "term": o.term.name(), "site": o.site,
        })),
        "device_mallocs": m.device_mallocs,
        "alloc_retries": m.alloc_retries,
        "peak_phase": m.phase.map(phase_name),
        "phases": m.phase_peaks.iter().map(|(ph, &b)| (phase_name(ph).to_string(), json!(b))).collect::<Map<_, _>>(),
        "note": v.note,
    })
}

/// How fast the step runs.
fn time(t: &Timing) -> Value {
    json!({
        "step_time_s": t.step_time_s,
        "layer_time_s": { "forward": t.layer_time_s[0], "backward": t.layer_time_s[1] },
        "step_time_breakdown": {
            "compute_s": t.breakdown.compute,
            "memory_bound_s": t.breakdown.memory,
            "launch_s": t.breakdown.launch,
            "communication_s": t.breakdown.communication,
            "dominant": t.breakdown.dominant().name(),
            "launch_bound": t.breakdown.launch_bound(),
        },
        "tokens_per_s": t.tokens_per_s,
        "mfu": t.mfu,
        "recompute_fraction": t.recompute_fraction,
    })
}

/// An untimed estimate's time: the same keys, null.
fn untimed() -> Value {
    json!({
        "step_time_s": null, "layer_time_s": null, "step_time_breakdown": null, "tokens_per_s": null, "mfu": null,
        "recompute_fraction": null,
    })
}

/// The job under the further settings asked for.
fn alternatives(p: &TrainPlan) -> Vec<Value> {
    let one = |setting: &str, asked: bool, e: &Estimate| {
        json!({
            "setting": setting, "asked": asked, "fits": e.verdict.fits,
            "reserved_bytes": bytes(e.memory.reserved_bytes), "allocated_bytes": bytes(e.memory.allocated_bytes),
            "per_gpu_bytes": bytes(e.memory.per_gpu_bytes),
        })
    };
    p.asked.iter().map(|(label, e)| one(label, true, e)).collect()
}

fn recommendation(r: &Recommendation) -> Value {
    json!({
        "precision": r.config.precision.name(),
        "attention": r.config.attention.name(),
        "checkpoint": r.config.checkpointing.spelling(),
        "framework": r.estimate.runner.framework.name(),
        "parallel": parallel(&r.config.parallel),
        "zero_stage": r.config.parallel.zero_stage,
        "offload": r.config.offload.name(),
        "micro_batch": r.config.micro_batch,
        "optimizer_impl": r.estimate.runner.optimizer_impl.name(),
        "accumulation": r.config.accumulation,
        "per_gpu_bytes": bytes(r.estimate.memory.per_gpu_bytes),
        "step_time_s": r.estimate.time.as_ref().map(|t| t.step_time_s),
        "tokens_per_s": r.estimate.time.as_ref().map(|t| t.tokens_per_s),
        "mfu": r.estimate.time.as_ref().map(|t| t.mfu),
        "allocator": r.allocator,
    })
}

pub(super) fn infer(p: &InferPlan) -> Value {
    let e = &p.estimate;
    json!({
        "model": p.model.name, "params": p.model.params(), "gpu": p.gpu.name, "gpu_memory_bytes": p.gpu.memory_bytes,
        "mode": "infer", "gpus": p.config.tensor, "fits": e.fits, "starts": e.starts, "per_gpu_bytes": bytes(e.per_gpu_bytes),
        "allocated_bytes": bytes(e.allocated_bytes), "tensor_bytes": bytes(e.tensor_bytes),
        "framework": match p.config.runtime {
            Runtime::Vllm(_) => "vllm",
            Runtime::Sglang(_) => "sglang",
            Runtime::Transformers { .. } => "hf",
        },
        "engine": match p.config.runtime {
            Runtime::Vllm(v) => Some(json!({
                "gpu_memory_utilization": v.gpu_memory_utilization,
                "max_num_batched_tokens": v.max_num_batched_tokens,
                "max_num_seqs": v.max_num_seqs,
                "block_size": v.block_size,
                "kv_cache_bytes": signed_bytes(e.kv_cache),
                "profile_peak_bytes": bytes(e.activations),
            })),
            Runtime::Sglang(s) => Some(json!({
                "mem_fraction_static": s.mem_fraction_static,
                "kv_cache_bytes": signed_bytes(e.kv_cache),
                "reserve_bytes": bytes(e.activations),
            })),
            Runtime::Transformers { .. } => None,
        },
        "attention": match p.config.runtime {
            Runtime::Vllm(_) | Runtime::Sglang(_) => None,
            Runtime::Transformers { attention, .. } => Some(attention.name()),
        },
        "logits": match p.config.runtime {
            Runtime::Vllm(_) | Runtime::Sglang(_) => None,
            Runtime::Transformers { all_logits, .. } => Some(if all_logits { "all" } else { "last" }),
        },
        "new_tokens": match p.config.runtime {
            Runtime::Vllm(_) | Runtime::Sglang(_) => None,
            Runtime::Transformers { new_tokens, .. } => Some(new_tokens),
        },
        "planned_from": match &e.source {
            InferSource::Engine => json!({ "source": "engine" }),
            InferSource::Template(key) => {
                let mut v = json!({ "source": "template", "template": key });
                if let Some(assumed) = headroom_plan::infer::recorded::assumed(key) {
                    v["assumed"] = json!(assumed);
                }
                v
            }
            InferSource::ClosedForm(why) => json!({ "source": "closed_form", "why": why }),
        },
        "weights": p.config.weights.name(),
        "quantize": p.config.quantize.map(quantization),
        "reserved_bytes": bytes(e.reserved_bytes),
        "breakdown": {
            "weights": bytes(e.weights), "gradients": 0, "optimizer": 0, "activations": bytes(e.activations),
            "logits": bytes(e.logits), "kv_cache": bytes(e.kv_cache), "temporary": 0, "framework": bytes(e.framework),
        },
        "max_sequences": e.max_sequences, "max_tokens": e.max_tokens,
        "max_seq": p.max_seq, "max_seq_is_search_limit": p.max_seq.map(|m| m >= max_seq_searched(p.model)),
        "context_note": p.context_note,
    })
}

/// `plan --json`'s `calibration`: each snapshot's step used and figures, each fitted term.
fn calibration(c: &super::calibration::Calibrated) -> Value {
    use headroom_plan::calibrate::{Correction, Figures};
    let figures = |f: &Figures| {
        json!({
            "start_bytes": bytes(f.start), "forward_bytes": bytes(f.phases.forward),
            "backward_bytes": bytes(f.phases.backward), "optimizer_bytes": bytes(f.phases.optimizer_step),
            "peak_bytes": bytes(f.peak()), "reserved_bytes": bytes(f.reserved),
        })
    };
    let correction = |c: &Correction| {
        json!({
            "scale": c.scale,
            "added": {
                "fixed_bytes": c.law.fixed, "per_token_bytes": c.law.per_token,
                "per_token_position_bytes": c.law.per_token_position,
            },
        })
    };
    let rel = |x: f64, of: f64| if of > 0.0 { (x - of) / of } else { 0.0 };
    let (allocated, reserved) = c.fit.residual();
    json!({
        "snapshots": c.runs.iter().zip(&c.fit.snapshots).map(|(r, s)| json!({
            "snapshot": r.file, "device": r.device, "batch": s.batch, "seq": s.seq,
            "steps_found": s.steps_found, "whole_steps": s.whole_steps,
            "construction_bytes": s.construction, "began_mid_step": s.began_mid_step,
            "step": s.step.map(|st| json!({
                "number": st.number, "kind": st.kind.name(), "micro_steps": st.micro_steps,
                "first_entry": st.entries.0, "last_entry": st.entries.1,
            })),
            "recorded": s.recorded.as_ref().map(figures),
            "uncalibrated": s.uncalibrated.as_ref().map(figures),
            "calibrated": s.calibrated.as_ref().map(figures),
            "residual": match (s.recorded, s.calibrated) {
                (Some(m), Some(k)) => json!({"allocated": rel(k.peak(), m.peak()), "reserved": rel(k.reserved, m.reserved)}),
                _ => Value::Null,
            },
            "oom": s.oom.map(|o| json!({
                "step": o.step, "phase": phase_name(o.phase), "asked_bytes": o.asked, "device_free_bytes": o.device_free,
                "allocated_bytes": o.allocated, "reserved_bytes": o.reserved,
            })),
            "note": s.note,
        })).collect::<Vec<_>>(),
        "terms": c.fit.terms.iter().map(|t| json!({
            "term": t.name,
            "recorded_bytes": t.recorded.iter().map(|&x| signed_bytes(x)).collect::<Vec<_>>(),
            "planned_bytes": t.planned.iter().map(|&x| signed_bytes(x)).collect::<Vec<_>>(),
            "correction": correction(&t.correction),
        })).collect::<Vec<_>>(),
        "residual": {"allocated": allocated, "reserved": reserved},
        "oom_evidence": c.fit.calibration.oom.map(|e| json!({
            "batch": e.batch, "seq": e.seq, "asked_bytes": e.oom.asked, "device_free_bytes": e.oom.device_free,
            "allocated_bytes": e.oom.allocated, "reserved_bytes": e.oom.reserved, "capacity_bytes": e.capacity,
            "phase": phase_name(e.oom.phase),
        })),
    })
}

/// bitsandbytes' quantization: its format, and a 4-bit one's double quantization and compute dtype.
fn quantization(q: headroom_plan::bnb::Bnb) -> Value {
    match q {
        headroom_plan::bnb::Bnb::Int8 => json!({ "format": "int8" }),
        headroom_plan::bnb::Bnb::FourBit { double_quant, compute, .. } => json!({
            "format": q.format(), "double_quant": double_quant, "compute_dtype": compute.name(),
        }),
    }
}
