//! What a Hugging Face transformers forward with a cache holds, moment by
//! moment: the inference recipes of `data/recipes/hf_inference.json`.
//!
//! `model(input_ids, use_cache=True)` under `torch.no_grad()` — an
//! evaluation loop's forward, every position's logits — allocates the same
//! sequence of tensors at every shape. `scripts/validate/infer_recipes.py`
//! records that sequence with PyTorch's memory profiler for each family's
//! code, precision and attention kernel, and writes, for every allocation in
//! the last layer and after it, what is alive then (the weights and the ids
//! aside), in the model's dimensions (the units of [`crate::recipe`]):
//!
//! - `per_layer`: what each earlier layer left behind (its keys and values);
//! - `once`: the rest, per token, with `heads_s` and `s` for s × s matrices
//!   (eager attention's scores; the causal mask);
//! - `once_per_position`: what does not grow with the batch (rotary tables);
//! - `once_per_sequence`: what grows with the batch alone (`generate`'s
//!   last-position logits).
//!
//! Each family's forward is recorded twice: keeping every position's logits
//! (an evaluation loop's `model(input_ids)`) and the last position's
//! (`generate`'s first forward, `logits_to_keep=1`).
//!
//! The peak is the largest moment at the asked shape: eager attention's
//! scores win at long sequences, the logits at large vocabularies, as they
//! do in PyTorch. Invariant: every moment's bytes are a sum of non-negative
//! terms, so a larger batch or sequence never lowers the peak.

use crate::job::Attention;
use crate::model::Model;
use crate::recipe::{bundled, measured_code, measured_kernel, per_token, Terms};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// One allocation's moment: what is alive right after it.
#[derive(Clone, Debug, Deserialize)]
struct Moment {
    /// In the last layer (earlier layers' caches: all but one) or after it (all of them).
    in_last_layer: bool,
    per_layer: Terms,
    once: Terms,
    once_per_position: Terms,
    #[serde(default)]
    once_per_sequence: Terms,
}

/// One family's forward at one precision and attention kernel.
#[derive(Clone, Debug, Deserialize)]
pub struct ForwardRecipe {
    moments: Vec<Moment>,
}

fn recipes() -> &'static BTreeMap<String, ForwardRecipe> {
    static R: OnceLock<BTreeMap<String, ForwardRecipe>> = OnceLock::new();
    R.get_or_init(|| bundled(include_str!("../../../data/recipes/hf_inference.json"), "inference recipes"))
}

/// The recipe for `model`'s forward with 16-bit (`bf16`) or fp32 weights, keeping every
/// position's logits (`all_logits`, an evaluation loop) or the last one's (`generate`'s
/// first forward), if transformers' code for its family was measured. Families without an
/// SDPA path run eager.
pub fn forward_recipe(
    model: &Model,
    bf16: bool,
    attention: Attention,
    all_logits: bool,
) -> Option<&'static ForwardRecipe> {
    let key = |attn: &str| {
        let last = if all_logits { "" } else { "/last" };
        format!("{}/{}/{attn}{last}", measured_code(model), if bf16 { "bf16" } else { "fp32" })
    };
    recipes().get(&key(measured_kernel(attention))).or_else(|| recipes().get(&key("eager")))
}

/// The forward's peak, in bytes beyond the weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ForwardPeak {
    /// Everything alive at the peak: ids, cache, logits and temporaries.
    pub total: f64,
    /// Of `total`, the keys and values cached by then.
    pub kv_cache: f64,
    /// Of `total`, the vocabulary logits (alive when the peak is at the head).
    pub logits: f64,
    /// Whether the peak falls inside the last layer (else at the final norm and head).
    pub in_layer: bool,
}

impl ForwardRecipe {
    /// The peak of a forward over `batch` sequences of `seq` tokens.
    pub fn peak(&self, model: &Model, batch: f64, seq: f64) -> ForwardPeak {
        self.peak_where(model, batch, seq, |_| true)
    }

    /// The peak among the moments inside the last layer (`true`) or after it (`false`): a
    /// quantized linear layer's temporaries add to the first, not to the head's.
    pub fn peak_in(&self, model: &Model, batch: f64, seq: f64, in_layer: bool) -> ForwardPeak {
        self.peak_where(model, batch, seq, |m| m.in_last_layer == in_layer)
    }

    fn peak_where(&self, model: &Model, batch: f64, seq: f64, keep: impl Fn(&Moment) -> bool) -> ForwardPeak {
        let tokens = batch * seq;
        // int64 ids, alive throughout (the profile counts them with the weights).
        let ids = tokens * 8.0;
        let layers = model.layers as f64;
        let mut best: Option<ForwardPeak> = None;
        for m in self.moments.iter().filter(|m| keep(m)) {
            let before = if m.in_last_layer { layers - 1.0 } else { layers };
            let cache = before * tokens * per_token(model, &m.per_layer, seq);
            let once = tokens * per_token(model, &m.once, seq)
                + seq * per_token(model, &m.once_per_position, seq)
                + batch * per_token(model, &m.once_per_sequence, seq);
            let vocab = model.vocab as f64;
            let logits = tokens * m.once.get("V").map_or(0.0, |c| c * vocab)
                + batch * m.once_per_sequence.get("V").map_or(0.0, |c| c * vocab);
            let total = ids + cache + once;
            if best.is_none_or(|b| total > b.total) {
                best = Some(ForwardPeak { total, kv_cache: cache, logits, in_layer: m.in_last_layer });
            }
        }
        best.unwrap_or(ForwardPeak { total: ids, kv_cache: 0.0, logits: 0.0, in_layer: false })
    }

    /// The cache of every layer once the forward is done.
    pub fn full_cache(&self, model: &Model, batch: f64, seq: f64) -> f64 {
        self.moments
            .iter()
            .find(|m| !m.in_last_layer)
            .map_or(0.0, |m| model.layers as f64 * batch * seq * per_token(model, &m.per_layer, seq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::preset;

    #[test]
    fn every_unit_a_forward_recipe_names_is_known() {
        for (key, r) in recipes() {
            for m in &r.moments {
                for u in
                    [&m.per_layer, &m.once, &m.once_per_position, &m.once_per_sequence].iter().flat_map(|t| t.keys())
                {
                    assert!(crate::recipe::is_known_unit(u), "{key} names an unknown unit `{u}`");
                }
            }
        }
    }

    #[test]
    fn every_generating_family_has_a_forward_and_it_grows_with_the_shape() {
        for name in [
            "llama-3-8b",
            "mistral-7b",
            "qwen2.5-7b",
            "gemma-2b",
            "phi-3-mini",
            "mixtral-8x7b",
            "gpt2",
            "pythia-1b",
            "bloom-7b1",
        ] {
            let m = preset(name).unwrap();
            for bf16 in [false, true] {
                for a in [Attention::Eager, Attention::Sdpa] {
                    let r = forward_recipe(&m, bf16, a, true).unwrap_or_else(|| panic!("{name} {bf16} {a:?}"));
                    let small = r.peak(&m, 1.0, 512.0);
                    let longer = r.peak(&m, 1.0, 1024.0);
                    let wider = r.peak(&m, 2.0, 512.0);
                    assert!(small.total > 0.0 && longer.total > small.total && wider.total > small.total, "{name}");
                    assert!(small.kv_cache + small.logits <= small.total, "{name}: {small:?}");
                    assert!(r.full_cache(&m, 1.0, 512.0) >= small.kv_cache, "{name}");
                }
            }
        }
        assert!(forward_recipe(&preset("bert-base-uncased").unwrap(), false, Attention::Sdpa, true).is_none());
    }

    #[test]
    fn eager_attention_peaks_in_the_layer_at_long_sequences_and_the_head_peaks_at_short_ones() {
        let m = preset("llama-3-8b").unwrap();
        let r = forward_recipe(&m, true, Attention::Eager, true).unwrap();
        assert!(r.peak(&m, 1.0, 16384.0).in_layer);
        assert!(!r.peak(&m, 1.0, 128.0).in_layer);
        // The cache at the end holds every layer's keys and values: 128 KiB a token in bf16.
        assert_eq!(r.full_cache(&m, 1.0, 1000.0), 1000.0 * 131072.0);
    }
}
