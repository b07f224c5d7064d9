//! Whether a recording's sizes can tell a tensor's size law from another that reads the same.
//!
//! The rule is `scripts/validate/law_ambiguity.py`'s (its docstring is the specification):
//! a recorder reads a law from bytes alone, at one model, so where two dimensions of the
//! recording stand in a ratio that two element widths also stand in, one size has two
//! readings. With 8 query heads over 4 key-value heads an fp32 key (`kv` × 4 bytes a token) is
//! as large as a bf16 query (`q` × 2): whichever the recorder took is right at the recording's
//! heads and wrong on a model whose heads are not twice its key-value heads (Llama 3 8B's 32
//! over 8). The recorders refuse such a law, and `tests/law_ambiguity.rs` holds every bundled
//! template to it: a recording at 15 heads over 5 (`step_programs.GQA`, whose ratios no element
//! widths share) has none.

use super::{LawKind, Parsed};
use std::collections::BTreeMap;

/// Units the heads' counts tie together, each with those it can be mistaken for: a query is
/// `heads` heads wide, a key or value `kv_heads` heads, each head `d`. Their ratios are a
/// model's own, so a law read in the wrong one is wrong on every model whose counts differ
/// from the recording's (other units' ratios can be structural: GPT-2's MLP is four times its
/// hidden size in every GPT-2).
const TIED: [(&str, &[&str]); 5] =
    [("q", &["kv", "d"]), ("kv", &["q", "d"]), ("d", &["q", "kv"]), ("heads", &["kv_heads"]), ("kv_heads", &["heads"])];
/// Element widths one tensor and another can differ by where 16-bit and 32-bit tensors meet
/// (AMP, LoRA's fp32 adapters over a bf16 base, fp32 norms and rotary tables): bf16, fp32.
const ELEMENT_BYTES: [f64; 2] = [2.0, 4.0];
/// At or below this many bytes a unit's worth the recorders read a law as bytes (`one`).
const SMALL: f64 = 16.0;
/// The model's other widths a head-tied one can share a size with at a recording.
const WIDTHS: [&str; 10] = ["h", "f", "kf", "kh", "V", "P", "qkv", "fs", "r", "Er"];
/// Families whose config gives a head no width of its own: a query, key and value are the
/// hidden size wide in every model of the family, so `h` read for `q` is right on all of them.
const HEAD_WIDTH_IS_HIDDEN: [&str; 4] = ["gpt2", "bert", "bloom", "gpt_neox"];

/// A reading of one term of a law: `per` bytes a `unit`.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    pub unit: &'static str,
    pub per: f64,
}

/// A tensor whose law has a term the recording cannot tell from another reading.
#[derive(Clone, Debug, PartialEq)]
pub struct RivalLaw {
    /// The tensor's index in the template.
    pub tensor: u32,
    /// The term's kind, as the template names it (`tok`, `seq`, `pos`, `fixed`, `tok32`).
    pub kind: &'static str,
    /// The reading the template holds.
    pub mine: Reading,
    /// The others that give the same bytes at the recording.
    pub rivals: Vec<Reading>,
}

/// The other readings of `nbytes` (one token's, position's or sequence's bytes, read as
/// `unit`) that the recording's dimensions `dims` cannot tell from it: each a unit tied to
/// `unit` of another size at the recording, one element of 2 or 4 bytes a unit.
pub fn rivals(nbytes: f64, dims: &BTreeMap<String, f64>, unit: &str) -> Vec<Reading> {
    let size = |u: &str| dims.get(u).copied().unwrap_or(0.0);
    let Some((_, others)) = TIED.iter().find(|(u, _)| *u == unit) else { return Vec::new() };
    if size(unit) == 0.0 || nbytes <= SMALL {
        return Vec::new();
    }
    let mut out = Vec::new();
    for &other in *others {
        let s = size(other);
        if s == 0.0 || s == size(unit) {
            continue;
        }
        for w in ELEMENT_BYTES {
            if (nbytes - w * s).abs() < 1e-6 {
                out.push(Reading { unit: other, per: w });
            }
        }
    }
    out
}

fn kind_name(kind: LawKind) -> &'static str {
    match kind {
        LawKind::Fixed => "fixed",
        LawKind::Token => "tok",
        LawKind::TokenPosition => "tok_s",
        LawKind::Sequence => "seq",
        LawKind::Position => "pos",
        LawKind::PositionSquare => "pos_s",
        LawKind::PaddedToken => "tok32",
        LawKind::TargetToken => "ttok",
        LawKind::TargetTokenTargetPosition => "ttok_t",
        LawKind::TargetTokenPosition => "ttok_s",
        LawKind::TargetPosition => "tpos",
        LawKind::TargetPositionSquare => "tpos_t",
        LawKind::TargetPositionPosition => "tpos_s",
        LawKind::TargetPaddedToken => "ttok32",
        LawKind::TokenPaddedPosition => "tok_s16",
        LawKind::TargetTokenTargetPaddedPosition => "ttok_t16",
        LawKind::TargetTokenPaddedPosition => "ttok_s16",
    }
}

impl Parsed {
    /// The head-tied widths (`q`, `kv`, `d`) the recording gave the size of another of the
    /// model's widths, each with that width (`law_ambiguity.py`'s `shared_widths`): a tensor
    /// that follows one reads as the other (a query's weight as `h*h` where the query was as
    /// wide as the hidden size), right at the recording and wrong on a model of `family` whose
    /// heads are not the hidden size over their count (Gemma's).
    pub fn shared_widths(&self, family: &str) -> Vec<(&'static str, &'static str)> {
        if HEAD_WIDTH_IS_HIDDEN.contains(&family) {
            return Vec::new();
        }
        let dims = &self.template.dims;
        let size = |u: &str| dims.get(u).copied().filter(|&s| s > 0.0);
        let mut out = Vec::new();
        for tied in ["q", "kv", "d"] {
            let Some(s) = size(tied) else { continue };
            out.extend(WIDTHS.iter().filter(|&&w| size(w) == Some(s)).map(|&w| (tied, w)));
        }
        out
    }

    /// The tensors whose law has a rival reading at the recording's dimensions, parameters and
    /// gradients left out (their laws come from their shapes): `law_ambiguity.py`'s `audit`.
    pub fn rival_laws(&self) -> Vec<RivalLaw> {
        let dims = &self.template.dims;
        let mut out = Vec::new();
        for (i, t) in self.template.tensors.iter().enumerate() {
            if t.param.is_some() || t.grad.is_some() {
                continue;
            }
            let terms = &self.laws[t.law_index].0;
            for (kind, unit, per) in terms {
                // A pair's law (`tok_s`, `pos_s`, the decoder's and cross-attention's, and each
                // padded to 16 positions attended to) is per head already or bytes; a kind with
                // more than one term is a sum the recorder solved for, not one reading.
                if matches!(
                    kind,
                    LawKind::TokenPosition
                        | LawKind::PositionSquare
                        | LawKind::TargetTokenTargetPosition
                        | LawKind::TargetTokenPosition
                        | LawKind::TargetPositionSquare
                        | LawKind::TargetPositionPosition
                        | LawKind::TokenPaddedPosition
                        | LawKind::TargetTokenTargetPaddedPosition
                        | LawKind::TargetTokenPaddedPosition
                ) || terms.iter().filter(|(k, _, _)| k == kind).count() != 1
                    || unit.contains('*')
                    || unit == "one"
                {
                    continue;
                }
                let Some(&(unit, _)) = TIED.iter().find(|(u, _)| u == unit) else { continue };
                let found = rivals(per * dims.get(unit).copied().unwrap_or(0.0), dims, unit);
                if !found.is_empty() {
                    out.push(RivalLaw {
                        tensor: i as u32,
                        kind: kind_name(*kind),
                        mine: Reading { unit, per: *per },
                        rivals: found,
                    });
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(heads: f64, kv_heads: f64, d: f64) -> BTreeMap<String, f64> {
        [("heads", heads), ("kv_heads", kv_heads), ("d", d), ("q", heads * d), ("kv", kv_heads * d), ("h", 256.0)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    /// The docstring's cases: at 8 heads over 4 an fp32 key is a bf16 query; at 12 over 4 half
    /// a bf16 key (rotate_half's) is an fp32 head; at 15 over 5 of 40 neither.
    #[test]
    fn the_recording_heads_decide_whether_a_size_reads_two_ways() {
        let llama = dims(8.0, 4.0, 48.0);
        assert_eq!(rivals(4.0 * 192.0, &llama, "kv"), vec![Reading { unit: "q", per: 2.0 }]);
        let twelve = dims(12.0, 4.0, 40.0);
        assert_eq!(rivals(160.0, &twelve, "kv"), vec![Reading { unit: "d", per: 4.0 }]);
        let gqa = dims(15.0, 5.0, 40.0);
        for unit in ["q", "kv", "d"] {
            for per in [0.5, 1.0, 2.0, 4.0, 8.0] {
                assert!(rivals(per * gqa[unit], &gqa, unit).is_empty(), "{unit} {per}");
            }
        }
        // A few bytes a token are read as bytes, and an untied unit has no rival.
        assert!(rivals(16.0, &dims(8.0, 4.0, 2.0), "d").is_empty());
        assert!(rivals(512.0, &llama, "h").is_empty());
    }

    fn parsed(dims: serde_json::Value, laws: serde_json::Value, tensors: serde_json::Value) -> Parsed {
        let raw = serde_json::json!({
            "dims": dims, "params": [["w", "h*h", 1.0, 2.0, -1]], "laws": laws, "sites": ["aten::to"],
            "tensors": tensors, "setup": [], "step": [],
            "check": {"layers": 7, "batch": 2, "seq": 56, "setup": {"events": 0, "peak": 0, "digest": ""},
                      "step": {"events": 0, "peak": 0, "digest": ""}},
        });
        Parsed::parse(&raw.to_string()).expect("a well-formed template")
    }

    /// The audit skips parameters and gradients, pairs' laws, sums of terms and products of
    /// units, and flags a single-unit term a tied unit of another size reads as well.
    #[test]
    fn the_audit_flags_a_single_term_law_with_a_rival() {
        let p = parsed(
            serde_json::json!({"heads": 8.0, "kv_heads": 4.0, "d": 48.0, "q": 384.0, "kv": 192.0, "h": 256.0}),
            serde_json::json!([{"tok": {"kv": 4.0}}, {"tok": {"q": 2.0}}, {"tok_s": {"heads": 4.0}},
                               {"tok": {"kv": 4.0, "h": 2.0}}, {"tok": {"q*h": 2.0}}, {"tok": {"h": 4.0}},
                               {"fixed": {"h*h": 2.0}}]),
            serde_json::json!([
                [0, 3, 0, -1, -1, "", -1],
                [1, 3, 0, -1, -1, "", -1],
                [2, 3, 0, -1, -1, "", -1],
                [3, 3, 0, -1, -1, "", -1],
                [4, 3, 0, -1, -1, "", -1],
                [5, 3, 0, -1, -1, "", -1],
                [0, 3, 0, 0, -1, "", -1],
                [0, 3, 0, -1, 0, "", -1]
            ]),
        );
        let found = p.rival_laws();
        assert_eq!(found.iter().map(|r| r.tensor).collect::<Vec<_>>(), vec![0, 1], "{found:?}");
        assert_eq!(found[0].kind, "tok");
        assert_eq!(found[0].mine, Reading { unit: "kv", per: 4.0 });
        assert_eq!(found[1].rivals, vec![Reading { unit: "kv", per: 4.0 }]);
    }
}
