//! What a Hugging Face transformers training step holds, moment by moment,
//! in its forward and backward: the step recipes of
//! `data/recipes/hf_steps.json`.
//!
//! `scripts/validate/step_recipes.py` records a step of each family's code
//! (per precision, attention kernel, checkpointing and head) with PyTorch's
//! memory profiler at three shapes, and writes, for every allocation in the
//! top layer, the bottom layer and outside them, what is alive then beyond
//! the weights, optimizer state and inputs, in the model's dimensions:
//!
//! - `below`: what each layer under the current one holds (saved
//!   activations, or a checkpointed layer's input), for every such layer;
//! - `above`: what each layer whose backward is done holds (its gradients);
//! - `once`: the current layer's tensors, the loss's and the stream;
//! - for T5, `below_enc` and `above_enc`: the same for its encoder's blocks,
//!   apart from its decoder's (the main stack).
//!
//! Units are those of [`crate::recipe`] per token, `pos:`-prefixed ones per
//! position, and some of a fixed size: `layer` and `layer_enc` (bytes per
//! parameter of one layer of the main stack or of T5's encoder: its
//! gradients, or AMP's copies of its weights), `Vh`, `Ph`, `hh` and `Vb`
//! (the head's or embeddings' tables, a head's bias). What every layer holds grows or
//! shrinks linearly from the bottom layer to the top, so moments at the two
//! ends and outside the layers bound every other; the phase's peak is the
//! largest of them at the asked shape. The optimizer step is modelled in
//! [`crate::phases`].
//!
//! A step run through `torch.compile` (keys ending `/compiled`) runs its layers inside one
//! graph, where no allocation can be placed in a layer: `step_recipes.py --compiled`
//! records it at two depths and lines the two timelines up, so each moment found in both is
//! `once` plus `below` for every layer (`forward_compiled`, `backward_compiled`): what one
//! layer adds there, its saved tensors or its gradients, whichever the moment holds.

use crate::job::{Attention, Precision};
use crate::model::Head;
use crate::model::{Family, Model};
use crate::phases::PhasePeak;
use crate::program::Law;
use crate::recipe::{bundled, measured_code, measured_kernel, measured_precision, per_token, Terms};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// Where a moment is: in the top or bottom layer of the main stack (T5's decoder, every other
/// model's layers) or of T5's encoder, or outside them — at the head, between the stacks, at
/// the embeddings.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Where {
    ForwardEncTop,
    ForwardMid,
    ForwardTop,
    ForwardHead,
    BackwardHead,
    BackwardTop,
    BackwardBottom,
    BackwardMid,
    BackwardEncTop,
    BackwardEncBottom,
    BackwardEmbed,
    /// Anywhere in a compiled step's forward or backward: `below` counts every layer.
    ForwardCompiled,
    BackwardCompiled,
}

/// Layers holding `below` and `above` at a moment: (encoder's, main stack's) each.
struct Counts {
    below: (f64, f64),
    above: (f64, f64),
}

impl Where {
    /// How many layers of `encoder` and `main` hold their `below` and `above` at this moment.
    fn counts(self, encoder: f64, main: f64) -> Counts {
        let (below, above) = match self {
            Where::ForwardEncTop | Where::BackwardEncTop => ((encoder - 1.0, 0.0), (0.0, main)),
            Where::ForwardMid | Where::BackwardMid => ((encoder, 0.0), (0.0, main)),
            Where::ForwardTop | Where::BackwardTop => ((encoder, main - 1.0), (0.0, 0.0)),
            Where::ForwardHead | Where::BackwardHead | Where::ForwardCompiled | Where::BackwardCompiled => {
                ((encoder, main), (0.0, 0.0))
            }
            Where::BackwardBottom => ((encoder, 0.0), (0.0, main - 1.0)),
            Where::BackwardEncBottom => ((0.0, 0.0), (encoder - 1.0, main)),
            Where::BackwardEmbed => ((0.0, 0.0), (encoder, main)),
        };
        // In the forward no layer's backward is done.
        let above = if self.is_forward() { (0.0, 0.0) } else { above };
        Counts { below, above }
    }

    fn is_forward(self) -> bool {
        matches!(
            self,
            Where::ForwardEncTop | Where::ForwardMid | Where::ForwardTop | Where::ForwardHead | Where::ForwardCompiled
        )
    }
}

#[derive(Clone, Debug, Deserialize)]
struct Moment {
    #[serde(rename = "where")]
    at: Where,
    below: Terms,
    above: Terms,
    #[serde(default)]
    below_enc: Terms,
    #[serde(default)]
    above_enc: Terms,
    once: Terms,
}

/// One family's step at one precision, attention kernel, checkpointing and head.
#[derive(Clone, Debug, Deserialize)]
pub struct StepRecipe {
    moments: Vec<Moment>,
}

fn recipes() -> &'static BTreeMap<String, StepRecipe> {
    static R: OnceLock<BTreeMap<String, StepRecipe>> = OnceLock::new();
    R.get_or_init(|| bundled(include_str!("../../../data/recipes/hf_steps.json"), "step recipes"))
}

/// The recipe for a transformers step of `model`, if its family's code was measured at this
/// precision, head and checkpointing (fp8 is not a transformers precision; flash attention
/// takes SDPA's; families without an SDPA path run eager); `compiled`: the step run through
/// `torch.compile`, where that was recorded.
pub fn step_recipe(
    model: &Model,
    precision: Precision,
    attention: Attention,
    checkpointed: bool,
    head: Head,
    compiled: bool,
) -> Option<&'static StepRecipe> {
    let precision = measured_precision(precision)?;
    let head = match head {
        Head::SeqCls => "seq-cls",
        _ if model.family == Family::T5 => "seq2seq-lm",
        Head::MaskedLm => "masked-lm",
        Head::CausalLm if model.generates() => "causal-lm",
        Head::CausalLm => "masked-lm",
    };
    let ck = if checkpointed { "ckpt" } else { "full" };
    let graph = if compiled { "/compiled" } else { "" };
    let key = |attn: &str| format!("{}/{head}/{precision}/{attn}/{ck}{graph}", measured_code(model));
    recipes().get(&key(measured_kernel(attention))).or_else(|| recipes().get(&key("eager")))
}

/// One moment's terms for one model: the size law of its tensors, the logits apart (the
/// closed form reports them as a term of their own). `per_token` holds no logits;
/// `per_token_position` and `per_position_square` are the s × s matrices; `fixed` the
/// fixed-size tensors (gradients, AMP's weight copies).
#[derive(Clone, Copy, Debug, Default)]
struct Poly {
    law: Law,
    /// Bytes per token of logits.
    logits: f64,
}

impl Poly {
    fn of(model: &Model, terms: &Terms) -> Poly {
        let (mut l, mut logits) = (Law::default(), 0.0);
        let h = model.hidden as f64;
        for (u, &c) in terms {
            let one = |unit: &str| {
                let mut t = Terms::new();
                t.insert(unit.to_string(), c);
                // At one position, an s × s unit is its bytes per token per position.
                per_token(model, &t, 1.0)
            };
            match u.as_str() {
                "layer" => l.fixed += c * model.stack_layer_params().1 as f64,
                "layer_enc" => l.fixed += c * model.stack_layer_params().0 as f64,
                "Vh" => l.fixed += c * model.vocab as f64 * h,
                "Ph" => l.fixed += c * model.max_position as f64 * h,
                "hh" => l.fixed += c * h * h,
                "Vb" => l.fixed += c * model.vocab as f64,
                "V" => logits += one("V"),
                "heads_s" | "s" => l.per_token_position += one(u),
                other => match other.strip_prefix("pos:") {
                    Some(unit @ ("heads_s" | "s")) => l.per_position_square += one(unit),
                    Some(unit) => l.per_position += one(unit),
                    None => l.per_token += one(other),
                },
            }
        }
        Poly { law: l, logits }
    }

    /// Whether every coefficient is at most `o`'s: never more bytes at any shape.
    fn below(&self, o: &Poly) -> bool {
        let (a, b) = (&self.law, &o.law);
        a.per_token <= b.per_token
            && a.per_token_position <= b.per_token_position
            && self.logits <= o.logits
            && a.per_position <= b.per_position
            && a.per_position_square <= b.per_position_square
            && a.fixed <= b.fixed
    }

    fn scaled(self, k: f64) -> Poly {
        Poly { law: self.law.scaled(k), logits: self.logits * k }
    }

    fn plus(self, o: Poly) -> Poly {
        Poly { law: self.law + o.law, logits: self.logits + o.logits }
    }
}

/// A recipe's moments resolved for one model and layer count.
struct Compiled {
    key: (usize, [u64; 16]),
    moments: Vec<(Where, Poly)>,
}

thread_local! {
    // The search estimates hundreds of thousands of configurations of one model over a few
    // dozen recipes (precision × attention × checkpointing): resolving each recipe's units
    // once keeps an estimate to a few hundred multiplications.
    static COMPILED: std::cell::RefCell<Vec<Compiled>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Recipes resolved at once per thread; past this the oldest is dropped.
const COMPILED_KEPT: usize = 64;

impl StepRecipe {
    fn compiled<R>(&self, model: &Model, layers: f64, f: impl FnOnce(&[(Where, Poly)]) -> R) -> R {
        // Every field the units and a layer's parameters are made of (cheaper to compare than
        // to recompute the parameters).
        let dims = [
            model.family as u64,
            model.hidden,
            model.intermediate,
            model.heads,
            model.kv_heads,
            model.head_dim,
            model.vocab,
            model.experts,
            model.experts_per_token,
            model.max_position,
            model.layers,
            model.decoder_layers,
            model.relative_buckets,
            u64::from(model.gated_mlp) | u64::from(model.qkv_bias) << 1 | u64::from(model.tied_embeddings) << 2,
            model.sliding_window.unwrap_or(0),
            layers.to_bits(),
        ];
        let key = (self as *const StepRecipe as usize, dims);
        // T5's encoder blocks come first; every other model has only the main stack.
        let encoder = if model.family == Family::T5 { (model.layers - model.decoder_layers) as f64 } else { 0.0 };
        COMPILED.with(|c| {
            let mut c = c.borrow_mut();
            let found = c.iter().position(|c| c.key == key);
            let at = match found {
                Some(at) => at,
                None => {
                    let all: Vec<(Where, Poly)> = self
                        .moments
                        .iter()
                        .map(|m| {
                            let n = m.at.counts(encoder, layers - encoder);
                            let p = Poly::of(model, &m.below_enc)
                                .scaled(n.below.0)
                                .plus(Poly::of(model, &m.below).scaled(n.below.1))
                                .plus(Poly::of(model, &m.above_enc).scaled(n.above.0))
                                .plus(Poly::of(model, &m.above).scaled(n.above.1))
                                .plus(Poly::of(model, &m.once));
                            (m.at, p)
                        })
                        .collect();
                    // Resolved to bytes, most moments are below another of their phase at every
                    // shape: only those that can be the peak stay.
                    let moments = all
                        .iter()
                        .enumerate()
                        .filter(|&(i, (at, p))| {
                            !all.iter().enumerate().any(|(j, (o_at, o))| {
                                j != i && o_at.is_forward() == at.is_forward() && p.below(o) && (!o.below(p) || j < i)
                            })
                        })
                        .map(|(_, m)| *m)
                        .collect();
                    if c.len() == COMPILED_KEPT {
                        c.remove(0);
                    }
                    c.push(Compiled { key, moments });
                    c.len() - 1
                }
            };
            f(&c[at].moments)
        })
    }

    /// The forward's and the backward's peaks over `batch` sequences of `seq` tokens with
    /// `layers` layers, on top of `base` (weights, optimizer state, inputs). The recipes were
    /// recorded on one process, every gradient whole: `gradient_scale` is the share of them
    /// this GPU keeps (ZeRO's shards, offload), 1 for a whole replica.
    pub fn peaks(
        &self,
        model: &Model,
        batch: f64,
        seq: f64,
        layers: f64,
        base: f64,
        gradient_scale: f64,
    ) -> (PhasePeak, PhasePeak) {
        let tokens = batch * seq;
        let mut forward = PhasePeak { total: base, ..PhasePeak::default() };
        let mut backward = forward;
        self.compiled(model, layers, |moments| {
            for &(at, p) in moments {
                let l = &p.law;
                let attention = tokens * l.per_token_position * seq + seq * l.per_position_square * seq;
                let logits = tokens * p.logits;
                let activations = tokens * l.per_token + seq * l.per_position + attention;
                // In the forward, fixed tensors are AMP's 16-bit weight copies; in the
                // backward, gradients.
                let (gradients, temporary) =
                    if at.is_forward() { (0.0, l.fixed) } else { (l.fixed * gradient_scale, 0.0) };
                let total = base + activations + logits + gradients + temporary;
                let slot = if at.is_forward() { &mut forward } else { &mut backward };
                if total > slot.total {
                    *slot = PhasePeak { total, gradients, activations, attention, logits, temporary };
                }
            }
        });
        (forward, backward)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::preset;

    #[test]
    fn recipes_exist_and_their_peaks_grow_with_the_shape() {
        for name in
            ["llama-3-8b", "mistral-7b", "gemma-2b", "phi-3-mini", "mixtral-8x7b", "gpt2", "pythia-1b", "bloom-7b1"]
        {
            let m = preset(name).unwrap();
            for p in [Precision::Fp32, Precision::Bf16, Precision::Amp] {
                for a in [Attention::Eager, Attention::Sdpa] {
                    for ck in [false, true] {
                        let r = step_recipe(&m, p, a, ck, Head::CausalLm, false).unwrap_or_else(|| panic!("{name}"));
                        let l = m.layers as f64;
                        let (f1, b1) = r.peaks(&m, 1.0, 512.0, l, 0.0, 1.0);
                        let (f2, b2) = r.peaks(&m, 2.0, 1024.0, l, 0.0, 1.0);
                        // Never lower for a larger shape (equal where every gradient decides).
                        assert!(
                            f1.total > 0.0 && f2.total > f1.total && b2.total >= b1.total,
                            "{name} {p:?} {a:?} {ck}"
                        );
                        // Every gradient exists by the end of the backward.
                        assert!(
                            b1.total
                                >= 0.99 * m.layer_params() as f64 * l * if p == Precision::Bf16 { 2.0 } else { 4.0 }
                        );
                    }
                }
            }
        }
        // torch.compile'd steps, recorded for every decoder (GPT-NeoX's bf16 step does not
        // compile on CPU) without checkpointing, and at fp32 with it: the same, from moments
        // that count every layer, with negative terms among them.
        for name in [
            "llama-3-8b",
            "mistral-7b",
            "gemma-2b",
            "gemma-7b",
            "phi-3-mini",
            "mixtral-8x7b",
            "gpt2",
            "gpt2-xl",
            "pythia-1b",
            "bloom-7b1",
        ] {
            let m = preset(name).unwrap();
            for (p, ck) in
                [(Precision::Fp32, false), (Precision::Bf16, false), (Precision::Amp, false), (Precision::Fp32, true)]
            {
                let r = step_recipe(&m, p, Attention::Sdpa, ck, Head::CausalLm, true);
                if name == "pythia-1b" && p == Precision::Bf16 {
                    assert!(r.is_none(), "{name} {p:?}: a compiled step where none was recorded");
                    continue;
                }
                let r = r.unwrap_or_else(|| panic!("{name} {p:?} {ck}: no compiled step"));
                // Measured on CPU (89 steps compiled and not), a compiled step's backward holds
                // beyond the weights and state at most 1.06 of the eager code's: a real model's
                // compiled plan may not stray far past that, as a table outside the layers
                // (a gradient of the head's size) counted once per layer would.
                let eager = step_recipe(&m, p, Attention::Sdpa, ck, Head::CausalLm, false).unwrap();
                let (_, eb) = eager.peaks(&m, 1.0, 2048.0, m.layers as f64, 0.0, 1.0);
                let (_, cb) = r.peaks(&m, 1.0, 2048.0, m.layers as f64, 0.0, 1.0);
                assert!(
                    cb.total <= 1.15 * eb.total,
                    "{name} {p:?} {ck}: compiled backward {:.3e} against eager {:.3e}",
                    cb.total,
                    eb.total
                );
                let l = m.layers as f64;
                let (f1, b1) = r.peaks(&m, 1.0, 512.0, l, 0.0, 1.0);
                let (f2, b2) = r.peaks(&m, 2.0, 1024.0, l, 0.0, 1.0);
                assert!(f1.total > 0.0 && f2.total > f1.total && b2.total >= b1.total, "{name} {p:?} compiled");
                let g = if p == Precision::Bf16 { 2.0 } else { 4.0 };
                assert!(b1.total >= 0.99 * m.layer_params() as f64 * l * g, "{name} {p:?} compiled: every gradient");
                // A deeper model never holds less at the same shape.
                let (f3, b3) = r.peaks(&m, 1.0, 512.0, l + 1.0, 0.0, 1.0);
                assert!(f3.total > f1.total && b3.total > b1.total, "{name} {p:?} compiled: one layer more");
            }
        }
        // T5's two stacks: by the end of the backward, every block's gradients.
        let t5 = preset("t5-base").unwrap();
        let r = step_recipe(&t5, Precision::Fp32, Attention::Eager, false, Head::CausalLm, false).unwrap();
        let (f, b) = r.peaks(&t5, 8.0, 512.0, t5.layers as f64, 0.0, 1.0);
        let (enc, dec) = t5.stack_layer_params();
        assert!(f.total > 0.0 && b.total >= 0.99 * 4.0 * (enc + dec) as f64 * t5.decoder_layers as f64);
    }
}
