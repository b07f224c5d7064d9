//! What the plan says to do: the levers that make a job that does not fit fit, and the
//! allocator's cache where a job that fits reserves far more than it allocates — as text
//! and as JSON.

use super::TrainPlan;
use headroom_alloc::units::format_size;
use headroom_plan::job::{Finetune, TrainConfig};
use headroom_plan::names::Named;
use headroom_plan::search::Held;
use serde_json::{json, Value};

fn size(x: f64) -> String {
    format_size(x.max(0.0).round() as u64)
}

/// The levers, fastest first, and the cache note.
pub(super) fn lines(out: &mut String, p: &TrainPlan) {
    if !p.remedies.is_empty() {
        let fit = p.remedies.iter().filter(|r| r.fits()).count();
        if fit == 0 {
            outln!(out, "no lever planned again makes it fit; what each saves (least memory first):");
        } else {
            outln!(out, "what makes it fit, each planned again with the change (those that fit fastest first, then the others least memory first):");
        }
        let width = p.remedies.iter().map(|r| r.flags.len()).max().unwrap_or(0);
        for r in &p.remedies {
            let (e, m) = (&r.estimate, &r.estimate.memory);
            outln!(
                out,
                "  {:<width$}  {}: {} per GPU ({} reserved){}",
                r.flags,
                if r.fits() { "fits" } else { "does NOT fit" },
                size(m.per_gpu_bytes),
                size(m.reserved_bytes),
                e.step_time_s().map_or(String::new(), |t| format!(", step {t:.3} s")),
            );
        }
    }
    if let Some(c) = &p.cache {
        let m = &c.expandable.memory;
        outln!(
            out,
            "the caching allocator's cache holds {} reserved but not allocated (most of the framework term): \
             reserved {} against {} allocated; with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
             (--alloc-conf expandable_segments:True), replayed, reserved falls to {} ({} allocated, {} per GPU)",
            size(c.reserved_bytes - c.allocated_bytes),
            size(c.reserved_bytes),
            size(c.allocated_bytes),
            size(m.reserved_bytes),
            size(m.allocated_bytes),
            size(m.per_gpu_bytes),
        );
    }
}

/// The levers as JSON, in the text's order.
pub(super) fn levers_json(p: &TrainPlan) -> Vec<Value> {
    p.remedies
        .iter()
        .map(|r| {
            let m = &r.estimate.memory;
            json!({
                "lever": r.lever.name(), "flags": r.flags, "fits": r.fits(),
                "per_gpu_bytes": m.per_gpu_bytes.round() as u64,
                "reserved_bytes": m.reserved_bytes.round() as u64,
                "allocated_bytes": m.allocated_bytes.round() as u64,
                "step_time_s": r.estimate.step_time_s(),
            })
        })
        .collect()
}

/// The allocator's cache note as JSON, or null.
pub(super) fn cache_json(p: &TrainPlan) -> Value {
    p.cache.as_ref().map_or(Value::Null, |c| {
        let m = &c.expandable.memory;
        json!({
            "reserved_bytes": c.reserved_bytes.round() as u64,
            "allocated_bytes": c.allocated_bytes.round() as u64,
            "setting": "expandable_segments:True",
            "expandable_reserved_bytes": m.reserved_bytes.round() as u64,
            "expandable_allocated_bytes": m.allocated_bytes.round() as u64,
            "expandable_per_gpu_bytes": m.per_gpu_bytes.round() as u64,
        })
    })
}

/// What `--recommend` held as the command line gave it, for its heading.
pub(super) fn held(h: &Held, job: &TrainConfig) -> String {
    let mut parts = Vec::new();
    if let Some(p) = h.precision {
        parts.push(format!("precision {}", p.name()));
    }
    if let Some(a) = h.attention {
        parts.push(format!("attention {}", a.name()));
    }
    if let Some(f) = h.framework {
        parts.push(format!("framework {}", f.name()));
    }
    if let Some(o) = h.offload {
        parts.push(format!("offload {}", o.name()));
    }
    if job.finetune != Finetune::Full {
        parts.push(format!("fine-tuning {}", job.finetune.name()));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" (holding {})", parts.join(", "))
    }
}

/// A serving engine's pool: how many sequences of `--seq` tokens it holds at once, against
/// the `--batch` asked.
pub(super) fn pool_line(out: &mut String, name: &str, pool: &str, held: u64, seq: u64, batch: u64, vllm: bool) {
    let against = if held == 0 && vllm {
        " — vLLM would not start: not one sequence of --seq tokens (its max_model_len) fits".to_string()
    } else if held < batch {
        format!(" — fewer than the --batch {batch} asked: the engine starts and the others wait in its queue")
    } else {
        format!(", the --batch {batch} asked among them")
    };
    outln!(out, "{name}: {pool}; it holds {held} sequences of {seq} tokens at once{against}");
}
