//! `headroom plan --infer`'s text: the serving configuration, a bar per term, the total and
//! whether it fits, what planned it, and the engine's own settings.

use super::text::{max_seq_line, terms_and_total, terms_only};
use super::InferPlan;
use headroom_alloc::units::format_size;
use headroom_plan::infer::{InferSource, Runtime};
use headroom_plan::names::Named;

/// What planned transformers' inference: its recorded program, or the closed form and why.
fn planned_from(out: &mut String, source: &InferSource) {
    match source {
        InferSource::Template(key) => {
            outln!(out, "planned by replaying transformers' code as recorded tensor by tensor ({key})");
            if let Some(assumed) = headroom_plan::infer::recorded::assumed(key) {
                outln!(out, "  {assumed}")
            }
        }
        InferSource::ClosedForm(why) => {
            outln!(out, "planned from its peak moment in closed form (no recorded program: {why})")
        }
        InferSource::Engine => {}
    }
}

pub(super) fn infer(p: &InferPlan) -> String {
    let (c, e) = (&p.config, &p.estimate);
    let mut out = String::new();
    outln!(
        out,
        "{} on {} ({}), inference: {} sequences × {} tokens, {}",
        p.model,
        p.gpu.name,
        format_size(p.gpu.memory_bytes),
        c.batch,
        c.seq,
        match p.config.runtime {
            Runtime::Vllm(v) => format!(
                "vLLM (gpu_memory_utilization {}, {} tokens and {} sequences a step)",
                v.gpu_memory_utilization, v.max_num_batched_tokens, v.max_num_seqs
            ),
            Runtime::Sglang(s) => format!("SGLang (mem_fraction_static {})", s.mem_fraction_static),
            Runtime::Transformers { attention, all_logits, new_tokens } => format!(
                "{} ({} weights{}, {} attention)",
                if all_logits && !p.model.generates() {
                    "transformers' forward, every position's logits".to_string()
                } else if all_logits {
                    "transformers' forward with a cache, every position's logits".to_string()
                } else if new_tokens == 1 {
                    "transformers' generate, its first forward".to_string()
                } else {
                    format!("transformers' generate of {new_tokens} tokens")
                },
                p.config.weights.name(),
                p.config.quantize.map_or_else(String::new, |q| format!(", linear layers {}", q.describe())),
                attention.name()
            ),
        }
    );
    outln!(out);
    // A pool the budget leaves nothing for is not allocated: the shortfall is said below.
    let pool = e.kv_cache.max(0.0);
    let terms = match p.config.runtime {
        Runtime::Vllm(_) => vec![
            ("weights", e.weights),
            ("kv cache", pool),
            ("profile peak", e.activations),
            ("framework", e.framework),
        ],
        Runtime::Sglang(_) => {
            vec![("weights", e.weights), ("kv cache", pool), ("reserve", e.activations), ("framework", e.framework)]
        }
        Runtime::Transformers { .. } => vec![
            ("weights", e.weights),
            ("kv cache", e.kv_cache),
            ("activations", e.activations),
            ("logits", e.logits),
            ("framework", e.framework),
        ],
    };
    match p.config.runtime {
        Runtime::Vllm(v) => {
            terms_only(&mut out, &terms, e.per_gpu_bytes, p.gpu.memory_bytes);
            let total = headroom_plan::engine::reported_total(p.gpu);
            let budget = v.gpu_memory_utilization * total;
            if e.kv_cache <= 0.0 {
                // The total is what it would need; the budget is what it has.
                // A shortfall, said as one: a negative pool is no figure a reader can use.
                let left = if e.kv_cache < 0.0 {
                    format!(
                        "falls {} short of them, with nothing for the KV cache",
                        format_size((-e.kv_cache).round() as u64)
                    )
                } else {
                    "leaves nothing for the KV cache".to_string()
                };
                outln!(
                    out,
                    "does NOT start: vLLM would not start: its budget, {} × the {} CUDA reports = {}, less the \
                     weights ({}), the profile run's peak and {} outside PyTorch, {left}",
                    v.gpu_memory_utilization,
                    format_size(total as u64),
                    format_size(budget as u64),
                    format_size(e.weights as u64),
                    format_size(headroom_plan::engine::non_torch_bytes(c.tensor) as u64),
                );
            } else {
                outln!(
                    out,
                    "{}: vLLM takes {} of {} per GPU: its budget, {} × the {} CUDA reports, and the context",
                    if e.starts { "starts" } else { "does NOT start" },
                    format_size(e.per_gpu_bytes as u64),
                    format_size(p.gpu.memory_bytes),
                    v.gpu_memory_utilization,
                    format_size(total as u64),
                );
                let pool = format!("{} tokens in blocks of {}", e.max_tokens, v.block_size);
                super::advice::pool_line(&mut out, "KV cache", &pool, e.max_sequences, c.seq, c.batch, true);
            }
        }
        Runtime::Sglang(s) => {
            terms_only(&mut out, &terms, e.per_gpu_bytes, p.gpu.memory_bytes);
            let verdict = if e.starts { "starts" } else { "does NOT start" };
            outln!(
                out,
                "{verdict}: SGLang takes {} of {} per GPU: the weights and the KV pool {} of the {} free at \
                 start-up, the reserve the rest, for activations and CUDA graphs",
                format_size(e.per_gpu_bytes as u64),
                format_size(p.gpu.memory_bytes),
                s.mem_fraction_static,
                // The pool and the reserve are what the share leaves of the free memory.
                format_size((e.weights + e.kv_cache + e.activations) as u64),
            );
            if e.kv_cache <= 0.0 {
                outln!(
                    out,
                    "SGLang would not start: the weights exceed its share by {} (raise --mem-fraction-static, or \
                     split the model with --tp)",
                    format_size((-e.kv_cache).round() as u64)
                );
            } else {
                let pool = format!("{} tokens", e.max_tokens);
                super::advice::pool_line(&mut out, "KV pool", &pool, e.max_sequences, c.seq, c.batch, false);
            }
        }
        Runtime::Transformers { .. } if e.max_sequences == 0 => {
            planned_from(&mut out, &e.source);
            terms_and_total(&mut out, &terms, e.per_gpu_bytes, p.gpu.memory_bytes, e.fits);
            outln!(out, "largest batch that fits: none (not one sequence of {} tokens)", c.seq)
        }
        Runtime::Transformers { .. } => {
            planned_from(&mut out, &e.source);
            terms_and_total(&mut out, &terms, e.per_gpu_bytes, p.gpu.memory_bytes, e.fits);
            outln!(out, "largest batch that fits: {} sequences of {} tokens", e.max_sequences, c.seq)
        }
    }
    if let Some(s) = p.max_seq {
        max_seq_line(&mut out, p.model, s, &format!("for {} sequences", c.batch));
    }
    if let Some(n) = &p.context_note {
        outln!(out, "note: {n}");
    }
    out
}
