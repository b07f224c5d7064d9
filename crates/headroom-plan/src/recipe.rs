//! What Hugging Face transformers keeps for the backward, per token: the
//! activation recipes of `data/recipes/hf_activations.json`.
//!
//! `scripts/validate/recipes.py` runs one forward with the loss of each
//! family's code, at each precision (fp32, bf16, AMP) and attention kernel
//! (eager, SDPA), under `torch.autograd.graph.saved_tensors_hooks`, and
//! writes every distinct storage autograd saves as bytes per token per unit
//! of the model's dimensions — so the recipe holds for any size of the
//! family, which the check-only cases of the CPU ground truth test
//! (`crates/headroom-plan/tests/ground_truth.rs`). A recipe has
//!
//! - per layer, and outside the layers (embeddings, final norm, head, loss):
//!   bytes per token per unit (`h`, `f`, `q` = heads × head dim, `kv`, `qkv` = q + 2 kv,
//!   `kf`/`kh` = MLP width or hidden size × experts per token, `heads`,
//!   `kv_heads`, `d` = head dim, `V`, `E`, `k`, `one`), and `heads_s` for
//!   eager attention's s × s matrices (bytes per token per head per position);
//! - per position, once (rotary tables shared by every layer);
//! - weight copies: AMP's 16-bit copies of the linear layers' weights, as
//!   bytes per weight;
//! - the same per layer with gradient checkpointing (the layer's input).
//!
//! `recipes.py --compiled` records the same for the step run through `torch.compile`
//! (fp32 decoders, keys ending `/compiled`): what AOTAutograd's partitioner saves, a layer's
//! share told apart by recording one layer more, since module hooks do not run inside the
//! compiled graph.

use crate::job::{Attention, Precision};
use crate::model::{Family, Model};
use crate::model_units;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::OnceLock;

pub(crate) type Terms = BTreeMap<String, f64>;

/// One family's recipe at one precision and attention kernel.
#[derive(Clone, Debug, Deserialize)]
pub struct Recipe {
    layer: Terms,
    outside: Terms,
    layer_per_position: Terms,
    outside_per_position: Terms,
    layer_weight_copy: f64,
    outside_weight_copy: f64,
    layer_checkpointed: Terms,
    layer_checkpointed_per_position: Terms,
    layer_checkpointed_weight_copy: f64,
}

/// The `recipes` of a recipe file bundled into the binary (`data/recipes/*.json`, each
/// `{"about": ..., "recipes": {key: recipe}}`); a test parses every one.
pub(crate) fn bundled<T: DeserializeOwned>(text: &str, what: &str) -> BTreeMap<String, T> {
    #[derive(Deserialize)]
    struct File<T> {
        recipes: BTreeMap<String, T>,
    }
    serde_json::from_str::<File<T>>(text).unwrap_or_else(|e| panic!("the bundled {what} do not parse: {e}")).recipes
}

fn recipes() -> &'static BTreeMap<String, Recipe> {
    static R: OnceLock<BTreeMap<String, Recipe>> = OnceLock::new();
    R.get_or_init(|| bundled(include_str!("../../../data/recipes/hf_activations.json"), "recipes"))
}

/// The recipe for `model` at `precision` and `attention`, if transformers' code for its
/// family was measured (fp8 is not a transformers precision; flash attention takes SDPA's).
/// `compiled`: what `torch.compile`'s partitioner saves instead, where it was recorded
/// (fp32 decoders); elsewhere the eager code's.
pub fn recipe(model: &Model, precision: Precision, attention: Attention, compiled: bool) -> Option<&'static Recipe> {
    let family = measured_code(model);
    let precision = measured_precision(precision)?;
    let key = |attn: &str| format!("{family}/{precision}/{attn}");
    let compiled_key = |attn: &str| compiled.then(|| format!("{}/compiled", key(attn)));
    // Families without an SDPA path in transformers run eager whatever is asked.
    [measured_kernel(attention), "eager"]
        .iter()
        .find_map(|attn| compiled_key(attn).and_then(|k| recipes().get(&k)))
        .or_else(|| recipes().get(&key(measured_kernel(attention))))
        .or_else(|| recipes().get(&key("eager")))
}

/// Whether `torch.compile`'s recipe was recorded for this job.
pub fn has_compiled(model: &Model, precision: Precision, attention: Attention) -> bool {
    let Some(precision) = measured_precision(precision) else { return false };
    let family = measured_code(model);
    [measured_kernel(attention), "eager"]
        .iter()
        .any(|attn| recipes().contains_key(&format!("{family}/{precision}/{attn}/compiled")))
}

/// The precision a recipe was recorded at for `precision` (mixed precision computes in
/// bf16); none for fp8, which transformers does not run.
pub(crate) fn measured_precision(precision: Precision) -> Option<&'static str> {
    match precision {
        Precision::Fp32 => Some("fp32"),
        Precision::Bf16 | Precision::Mixed => Some("bf16"),
        Precision::Amp => Some("amp"),
        Precision::Fp8 => None,
    }
}

/// The attention kernel a recipe was recorded with: flash attention keeps what SDPA keeps.
pub(crate) fn measured_kernel(attention: Attention) -> &'static str {
    match attention {
        Attention::Eager => "eager",
        Attention::Sdpa | Attention::Flash => "sdpa",
    }
}

/// The transformers code whose measurements hold for `model`: its own, or the code it shares
/// its layers' allocations with.
pub(crate) fn measured_code(model: &Model) -> &'static str {
    match model.model_type {
        "qwen3" => "qwen2",
        "gemma2" => "gemma",
        "mt5" => "t5",
        other => other,
    }
}

/// Bytes per token of `terms` at sequence length `seq`: `heads_s` and `s` are s × s matrices
/// with and without a head axis (bytes per element); `q_rep`, keys and values repeated per
/// query head.
pub(crate) fn per_token(model: &Model, terms: &Terms, seq: f64) -> f64 {
    terms
        .iter()
        .map(|(u, c)| match u.as_str() {
            "heads_s" => c * model.heads as f64 * seq,
            "s" => c * seq,
            // transformers' repeat_kv copies keys and values per query head only between one
            // key-value head (a view) and one per head (no copy).
            "q_rep" if model.kv_heads > 1 && model.kv_heads < model.heads => c * model_units::unit(model, "q"),
            "q_rep" => 0.0,
            _ => c * model_units::unit(model, u),
        })
        .sum()
}

/// Whether [`per_token`] sizes unit `u`: one of the model's, or one of its own.
#[cfg(test)]
pub(crate) fn is_known_unit(u: &str) -> bool {
    model_units::UNITS.contains(&u) || ["heads_s", "s", "q_rep"].contains(&u)
}

/// The part of [`per_token`] that grows with the sequence: eager attention's s × s matrices.
fn attention_per_token(model: &Model, terms: &Terms, seq: f64) -> f64 {
    terms.get("heads_s").map_or(0.0, |c| c * model.heads as f64 * seq)
}

/// Parameters of one block's linear layers (every expert's).
fn layer_linear_params(model: &Model) -> f64 {
    model.block_linears().iter().map(|&(i, o)| (i * o) as f64).sum()
}

/// What a micro-batch keeps, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Saved {
    /// One layer (a block; for T5 an encoder and a decoder block together).
    pub per_layer: f64,
    /// Everything the layers keep together.
    pub layers: f64,
    /// Of `layers`, eager attention's s × s matrices (0 with SDPA).
    pub attention: f64,
    /// Embeddings, final norm, head and loss.
    pub outside: f64,
    /// AMP's 16-bit copies of the weights.
    pub weight_copies: f64,
}

impl Recipe {
    /// What a micro-batch of `batch` sequences of `seq` tokens keeps for the backward,
    /// `layers` blocks of the model on this GPU (all of them without pipeline stages),
    /// each keeping only its input when `checkpointed`.
    pub fn saved(&self, model: &Model, batch: f64, seq: f64, layers: f64, checkpointed: bool) -> Saved {
        let tokens = batch * seq;
        // A T5 recipe layer is one encoder and one decoder block.
        let blocks = if model.family == Family::T5 { layers / 2.0 } else { layers };
        let (layer, pos, copy) = if checkpointed {
            (&self.layer_checkpointed, &self.layer_checkpointed_per_position, self.layer_checkpointed_weight_copy)
        } else {
            (&self.layer, &self.layer_per_position, self.layer_weight_copy)
        };
        let per_layer = tokens * per_token(model, layer, seq);
        let shared = seq * per_token(model, pos, seq);
        let outside =
            tokens * per_token(model, &self.outside, seq) + seq * per_token(model, &self.outside_per_position, seq);
        let head_params = (model.vocab * model.hidden) as f64;
        Saved {
            per_layer,
            layers: per_layer * blocks + shared,
            attention: tokens * attention_per_token(model, layer, seq) * blocks
                + seq * attention_per_token(model, pos, seq),
            outside,
            weight_copies: copy * layer_linear_params(model) * blocks + self.outside_weight_copy * head_params,
        }
    }

    /// Whether the recipe's attention keeps no s × s matrix (an SDPA kernel ran).
    pub fn has_sdpa(&self) -> bool {
        !self.layer.contains_key("heads_s")
    }

    /// Bytes of the loss's log-softmax per logit: 4 where transformers upcasts 16-bit
    /// logits to fp32 for the loss (its causal and masked LM losses), 2 where it does not (T5).
    pub fn loss_bytes(&self) -> f64 {
        self.outside.get("V").copied().unwrap_or(4.0)
    }

    /// What the outside keeps without the vocabulary-wide loss (a classifier's head).
    pub fn outside_without_vocabulary(&self, model: &Model, batch: f64, seq: f64) -> f64 {
        let terms: Terms = self.outside.iter().filter(|(u, _)| *u != "V").map(|(u, c)| (u.clone(), *c)).collect();
        batch * seq * per_token(model, &terms, seq) + seq * per_token(model, &self.outside_per_position, seq)
    }

    /// One layer's full keep, for the layer a checkpointed backward recomputes.
    pub fn layer_full(&self, model: &Model, batch: f64, seq: f64) -> f64 {
        batch * seq * per_token(model, &self.layer, seq) + seq * per_token(model, &self.layer_per_position, seq)
    }

    /// Of [`Recipe::layer_full`], eager attention's s × s matrices.
    pub fn layer_full_attention(&self, model: &Model, batch: f64, seq: f64) -> f64 {
        batch * seq * attention_per_token(model, &self.layer, seq)
            + seq * attention_per_token(model, &self.layer_per_position, seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::preset;

    /// A unit outside the model's would be sized as 1: every unit a recipe names is one of
    /// the model's, or one of [`per_token`]'s own.
    #[test]
    fn every_unit_a_recipe_names_is_known() {
        for (key, r) in recipes() {
            let terms = [
                &r.layer,
                &r.outside,
                &r.layer_per_position,
                &r.outside_per_position,
                &r.layer_checkpointed,
                &r.layer_checkpointed_per_position,
            ];
            for u in terms.iter().flat_map(|t| t.keys()) {
                assert!(is_known_unit(u), "{key} names an unknown unit `{u}`");
            }
        }
    }

    #[test]
    fn every_family_has_a_recipe_and_units_resolve() {
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
            "bert-base-uncased",
            "t5-base",
        ] {
            let m = preset(name).unwrap();
            for p in [Precision::Fp32, Precision::Bf16, Precision::Amp] {
                for a in [Attention::Eager, Attention::Sdpa] {
                    let r = recipe(&m, p, a, false).unwrap_or_else(|| panic!("{name} {p:?} {a:?}"));
                    let s = r.saved(&m, 1.0, 512.0, m.layers as f64, false);
                    assert!(s.per_layer > 0.0 && s.outside > 0.0, "{name} {p:?} {a:?}: {s:?}");
                    let c = r.saved(&m, 1.0, 512.0, m.layers as f64, true);
                    assert!(c.layers < s.layers, "{name}: checkpointing keeps less");
                    // torch.compile's partitioner keeps no more than the eager code, where recorded.
                    if has_compiled(&m, p, a) {
                        let k = recipe(&m, p, a, true).unwrap().saved(&m, 1.0, 512.0, m.layers as f64, false);
                        assert!(k.layers <= s.layers, "{name} {p:?} {a:?}: compiled {k:?} vs {s:?}");
                    }
                }
            }
        }
    }
}
