//! transformers' forward with a cache as a program: the weights, then its peak moment as
//! recorded ([`crate::forward_recipe`]) — every layer's keys and values cached by then, the
//! ids and temporaries of the moment, the logits — with bitsandbytes' temporaries inside a
//! quantized layer.

use super::{allocate_cache, load_weights, replayed, InferConfig, Sized};
use crate::estimate::largest;
use crate::forward_recipe::{ForwardPeak, ForwardRecipe};
use crate::gpu::GpuSpec;
use crate::model::Model;
use crate::program::{Law, Phase, Program, Term};

pub(super) fn sized(model: &Model, gpu: &GpuSpec, cfg: &InferConfig, recipe: &ForwardRecipe) -> Sized {
    let width = cfg.weights.bytes_per_param();
    let weights = match cfg.quantize {
        Some(q) => q.weight_bytes(model, width),
        None => model.params() as f64 * width,
    };
    let outside = gpu.arch.cuda_context_bytes() as f64;
    let capacity = (gpu.memory_bytes as f64 - outside).max(0.0) as u64;
    let at = |batch: u64| program(model, cfg, recipe, weights, batch);
    let (peak, p) = at(cfg.batch);
    let fits = |batch: u64| replayed(&at(batch).1, capacity).oom.is_none();
    // The peak grows with the batch, so the largest batch that fits is found by bisection.
    let max_sequences = largest(1 << 40, fits);
    Sized {
        weights,
        kv_cache: peak.kv_cache,
        activations: peak.total - peak.kv_cache - peak.logits,
        logits: peak.logits,
        outside,
        starts: true,
        serves: true,
        max_sequences,
        max_tokens: max_sequences.saturating_mul(cfg.seq),
        program: p,
    }
}

/// The peak moment over `batch` sequences, and the program that holds it.
fn program(
    model: &Model,
    cfg: &InferConfig,
    recipe: &ForwardRecipe,
    weights: f64,
    batch: u64,
) -> (ForwardPeak, Program) {
    let width = cfg.weights.bytes_per_param();
    let (b, s) = (batch as f64, cfg.seq as f64);
    let peak = match cfg.quantize {
        None => recipe.peak(model, b, s),
        Some(q) => {
            // A quantized layer's temporaries live inside a layer, beside what the layer's
            // moments hold; the head (left unquantized) has none.
            let extra = q.transient_bytes(model, b * s, width);
            let layer = recipe.peak_in(model, b, s, true);
            let layer = ForwardPeak { total: layer.total + extra, ..layer };
            let head = recipe.peak_in(model, b, s, false);
            if layer.total >= head.total {
                layer
            } else {
                head
            }
        }
    };
    let mut p = Program::default();
    p.mark(0, Phase::Setup);
    load_weights(&mut p, model, weights);
    p.mark(1, Phase::Forward);
    let cache = allocate_cache(&mut p, model, peak.kv_cache, 2, "the cache's keys and values");
    let site = p.site("ids and the moment's temporaries");
    let rest = p.alloc(Law::fixed(peak.total - peak.kv_cache - peak.logits), Term::Activations, site);
    let site = p.site("logits");
    let logits = p.alloc(Law::fixed(peak.logits), Term::Logits, site);
    for t in cache.into_iter().chain([rest, logits]) {
        p.free(t);
    }
    (peak, p)
}
