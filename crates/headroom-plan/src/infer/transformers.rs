//! transformers' inference as a program: where a template serves the job, its code replayed as
//! recorded tensor by tensor ([`super::recorded`]); elsewhere the weights, then its peak
//! moment in closed form ([`crate::forward_recipe`]) — every layer's keys and values cached by
//! then, the ids and temporaries of the moment, the logits — with bitsandbytes' temporaries
//! inside a quantized layer.

use super::recorded;
use super::{allocate_cache, load_weights, replayed, InferConfig, InferSource, Runtime, Sized, Sizing};
use crate::estimate::largest;
use crate::forward_recipe::{ForwardPeak, ForwardRecipe};
use crate::gpu::GpuSpec;
use crate::model::{Family, Model};
use crate::program::{Law, Phase, Program, Term};
use crate::replay::{replay, ReplaySettings};
use headroom_alloc::PolicyName;

/// Whether `program` (laws in the batch) replays at `batch` within `capacity` bytes.
fn fits_at(program: &Program, batch: u64, capacity: u64) -> bool {
    let settings = ReplaySettings { capacity, config: Default::default(), policy: PolicyName::PyTorch };
    replay(program, &program.sizes(batch, 1), &settings).oom.is_none()
}

/// The job as its template's program: the prompt's forward at the request's batch and length,
/// and the decode steps its new tokens take ([`recorded::decode_pasts`]); the largest batch
/// that fits with [`Sizing::Full`].
pub(super) fn replayed_sized(model: &Model, gpu: &GpuSpec, cfg: &InferConfig, key: &str, sizing: Sizing) -> Sized {
    let new_tokens = match cfg.runtime {
        Runtime::Transformers { all_logits: false, new_tokens, .. } => new_tokens,
        _ => 1,
    };
    let pasts = recorded::generate_pasts(key, cfg.seq, new_tokens);
    let outside = gpu.arch.cuda_context_bytes() as f64;
    let capacity = (gpu.memory_bytes as f64 - outside).max(0.0) as u64;
    // One program for every batch: its laws are in the batch.
    let general = recorded::program(model, key, cfg.seq, &pasts, Some(gpu));
    let max_sequences = match sizing {
        Sizing::Verdict => 0,
        Sizing::Full => largest(1 << 40, |batch| fits_at(&general, batch, capacity)),
    };
    let mut p = general;
    let sizes = p.sizes(cfg.batch, 1);
    for (t, &bytes) in p.tensors.iter_mut().zip(&sizes) {
        t.law = Law::fixed(bytes as f64);
    }
    let peak = p.live_peak(&sizes);
    // The decoder's cache at the peak: its input's in the first forward (the prompt, or T5's
    // start token in generate, the prompt in its evaluation forward), or a decode step's past
    // and its token.
    let first = recorded::decoder_input(key, cfg.seq);
    let cached = match peak.step {
        0 | 1 => first,
        step => pasts.get(step as usize - 2).map_or(first, |past| past + 1),
    };
    // T5's decoder caches its cross-attention's keys and values over the encoder's input
    // beside its own.
    let cross = if model.family == Family::T5 { cfg.seq } else { 0 };
    let kv_cache = model.kv_bytes_per_token(cfg.weights.bytes_per_param()) * (cfg.batch * (cached + cross)) as f64;
    let weights = p
        .tensors
        .iter()
        .zip(p.sizes(1, 1))
        .filter(|(t, _)| t.term == Term::Weights)
        .map(|(_, bytes)| bytes as f64)
        .sum::<f64>();
    let logits = peak.by_term.get(Term::Logits) as f64;
    Sized {
        weights,
        kv_cache,
        activations: (peak.bytes as f64 - peak.by_term.get(Term::Weights) as f64 - kv_cache - logits).max(0.0),
        logits,
        outside,
        starts: true,
        serves: true,
        max_sequences,
        max_tokens: max_sequences.saturating_mul(cfg.seq),
        program: p,
        source: InferSource::Template(key.to_string()),
    }
}

pub(super) fn sized(
    model: &Model,
    gpu: &GpuSpec,
    cfg: &InferConfig,
    recipe: &ForwardRecipe,
    why: &'static str,
    sizing: Sizing,
) -> Sized {
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
    let max_sequences = match sizing {
        Sizing::Verdict => 0,
        Sizing::Full => largest(1 << 40, fits),
    };
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
        source: InferSource::ClosedForm(why),
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
