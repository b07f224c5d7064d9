//! A recorded tensor's size law in the model's units (`h`, `kv`, `V`, products such as `q*h`),
//! read from a template before a model gives the units their sizes.
//!
//! A sequence-to-sequence template recorded with its decoder at a length of its own (its
//! check's `target_seq`) writes its decoder's tensors in that length, `t`, apart from the
//! encoder's, `s`: the job's decoder length folds them into the planner's [`Law`] in `b` and
//! `s`, as the decoder's own length where the job gives one, or as `s` where the decoder is
//! as long as the encoder ([`DecoderLength`]).

use crate::model_units;
use crate::program::{Law, PADDED_COLUMNS, PADDED_POSITIONS};
use std::collections::BTreeMap;

/// A template's law in units, before a model gives the units their sizes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UnitLaw(pub(super) Vec<(LawKind, String, f64)>);

/// How a law's term grows: with nothing, the tokens, each token's positions, the sequences,
/// the positions, their square, or the tokens padded to 32 positions a sequence; and in a
/// decoder's length `t`: its tokens (b·t), its self-attention's pairs (b·t·t), the
/// cross-attention's pairs (b·t·s), its positions (t), their square (t·t), the
/// cross-attention's positions shared by the batch (t·s), and its tokens padded to 32
/// positions a sequence (the memory-efficient kernel's log-sum-exp over the decoder's queries).
/// The memory-efficient kernel's bias gradient pads the positions attended to up to a multiple
/// of 16: the encoder's pairs (b·s·⌈s/16⌉·16), the decoder's (b·t·⌈t/16⌉·16) and the
/// cross-attention's (b·t·⌈s/16⌉·16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LawKind {
    Fixed,
    Token,
    TokenPosition,
    Sequence,
    Position,
    PositionSquare,
    PaddedToken,
    TargetToken,
    TargetTokenTargetPosition,
    TargetTokenPosition,
    TargetPosition,
    TargetPositionSquare,
    TargetPositionPosition,
    TargetPaddedToken,
    TokenPaddedPosition,
    TargetTokenTargetPaddedPosition,
    TargetTokenPaddedPosition,
}

impl LawKind {
    /// Whether the term grows with the decoder's own length.
    fn in_target(self) -> bool {
        matches!(
            self,
            LawKind::TargetToken
                | LawKind::TargetTokenTargetPosition
                | LawKind::TargetTokenPosition
                | LawKind::TargetPosition
                | LawKind::TargetPositionSquare
                | LawKind::TargetPositionPosition
                | LawKind::TargetPaddedToken
                | LawKind::TargetTokenTargetPaddedPosition
                | LawKind::TargetTokenPaddedPosition
        )
    }
}

/// The decoder's length a law is resolved at.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DecoderLength {
    /// As long as the encoder's input, whatever `s` the law is evaluated at.
    Encoder,
    /// A length of its own, fixed by the job (`--target-seq`).
    Tokens(f64),
}

impl UnitLaw {
    pub(super) fn parse(raw: &BTreeMap<String, BTreeMap<String, f64>>) -> Result<UnitLaw, String> {
        let mut out = Vec::new();
        for (kind, units) in raw {
            let kind = match kind.as_str() {
                "fixed" => LawKind::Fixed,
                "tok" => LawKind::Token,
                "tok_s" => LawKind::TokenPosition,
                "seq" => LawKind::Sequence,
                "pos" => LawKind::Position,
                "pos_s" => LawKind::PositionSquare,
                "tok32" => LawKind::PaddedToken,
                "ttok" => LawKind::TargetToken,
                "ttok_t" => LawKind::TargetTokenTargetPosition,
                "ttok_s" => LawKind::TargetTokenPosition,
                "tpos" => LawKind::TargetPosition,
                "tpos_t" => LawKind::TargetPositionSquare,
                "tpos_s" => LawKind::TargetPositionPosition,
                "ttok32" => LawKind::TargetPaddedToken,
                "tok_s16" => LawKind::TokenPaddedPosition,
                "ttok_t16" => LawKind::TargetTokenTargetPaddedPosition,
                "ttok_s16" => LawKind::TargetTokenPaddedPosition,
                other => return Err(format!("unknown law kind `{other}`")),
            };
            for (u, c) in units {
                for part in u.split('*') {
                    if !model_units::UNITS.contains(&part) {
                        return Err(format!("unknown unit `{part}`"));
                    }
                }
                out.push((kind, u.clone(), *c));
            }
        }
        Ok(UnitLaw(out))
    }

    /// Whether any term grows with a decoder's own length.
    pub fn in_target(&self) -> bool {
        self.0.iter().any(|(kind, _, _)| kind.in_target())
    }

    /// The law in bytes for a model whose units are `units`, its decoder `decoder` long.
    pub fn resolve(&self, units: &dyn Fn(&str) -> f64, decoder: DecoderLength) -> Law {
        let mut law = Law::default();
        for (kind, u, c) in &self.0 {
            let v = c * u.split('*').map(units).product::<f64>();
            match (kind, decoder) {
                (LawKind::Fixed, _) => law.fixed += v,
                (LawKind::Token, _) => law.per_token += v,
                (LawKind::TokenPosition, _) => law.per_token_position += v,
                (LawKind::Sequence, _) => law.per_sequence += v,
                (LawKind::Position, _) => law.per_position += v,
                (LawKind::PositionSquare, _) => law.per_position_square += v,
                (LawKind::PaddedToken, _) => law.per_padded_token += v,
                (LawKind::TargetToken, DecoderLength::Encoder) => law.per_token += v,
                (LawKind::TargetTokenTargetPosition | LawKind::TargetTokenPosition, DecoderLength::Encoder) => {
                    law.per_token_position += v
                }
                (LawKind::TargetPosition, DecoderLength::Encoder) => law.per_position += v,
                (LawKind::TargetPositionSquare | LawKind::TargetPositionPosition, DecoderLength::Encoder) => {
                    law.per_position_square += v
                }
                (LawKind::TargetToken, DecoderLength::Tokens(t)) => law.per_sequence += v * t,
                (LawKind::TargetTokenTargetPosition, DecoderLength::Tokens(t)) => law.per_sequence += v * t * t,
                (LawKind::TargetTokenPosition, DecoderLength::Tokens(t)) => law.per_token += v * t,
                (LawKind::TargetPosition, DecoderLength::Tokens(t)) => law.fixed += v * t,
                (LawKind::TargetPositionSquare, DecoderLength::Tokens(t)) => law.fixed += v * t * t,
                (LawKind::TargetPositionPosition, DecoderLength::Tokens(t)) => law.per_position += v * t,
                (LawKind::TargetPaddedToken, DecoderLength::Encoder) => law.per_padded_token += v,
                (LawKind::TargetPaddedToken, DecoderLength::Tokens(t)) => {
                    law.per_sequence += v * (t / PADDED_POSITIONS).ceil() * PADDED_POSITIONS
                }
                (
                    LawKind::TokenPaddedPosition
                    | LawKind::TargetTokenTargetPaddedPosition
                    | LawKind::TargetTokenPaddedPosition,
                    DecoderLength::Encoder,
                ) => law.per_token_padded_position += v,
                (LawKind::TokenPaddedPosition, DecoderLength::Tokens(_)) => law.per_token_padded_position += v,
                (LawKind::TargetTokenTargetPaddedPosition, DecoderLength::Tokens(t)) => {
                    law.per_sequence += v * t * (t / PADDED_COLUMNS).ceil() * PADDED_COLUMNS
                }
                (LawKind::TargetTokenPaddedPosition, DecoderLength::Tokens(t)) => {
                    law.per_sequence_padded_position += v * t
                }
            }
        }
        law
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(kind: &str) -> UnitLaw {
        let raw = BTreeMap::from([(kind.to_string(), BTreeMap::from([("one".to_string(), 4.0)]))]);
        UnitLaw::parse(&raw).expect("a known kind")
    }

    /// Each decoder-length term at b = 2, s = 56, t = 24: the decoder's own length where the
    /// job gives one, the encoder's where it does not, whatever `s` the law is then read at.
    #[test]
    fn a_decoder_term_reads_the_job_s_decoder_length() {
        let (b, s, t) = (2.0, 56.0, 24.0);
        for (kind, own, as_encoder) in [
            ("ttok", b * t, b * s),
            ("ttok_t", b * t * t, b * s * s),
            ("ttok_s", b * t * s, b * s * s),
            ("tpos", t, s),
            ("tpos_t", t * t, s * s),
            ("tpos_s", t * s, s * s),
            // The memory-efficient kernel's log-sum-exp over the decoder's queries: 24 and 56
            // positions padded to 32 and 64.
            ("ttok32", b * 32.0, b * 64.0),
            // The memory-efficient kernel's bias gradient, its last dimension padded to 16:
            // 24 positions to 32, 56 to 64.
            ("ttok_t16", b * t * 32.0, b * s * 64.0),
            ("ttok_s16", b * t * 64.0, b * s * 64.0),
        ] {
            let law = parsed(kind);
            assert!(law.in_target(), "{kind}");
            let one = |_: &str| 1.0;
            assert_eq!(law.resolve(&one, DecoderLength::Tokens(t)).bytes(b, s), (4.0 * own) as u64, "{kind}");
            assert_eq!(law.resolve(&one, DecoderLength::Encoder).bytes(b, s), (4.0 * as_encoder) as u64, "{kind}");
        }
        assert!(!parsed("tok").in_target());
        // The encoder's own pairs so padded, whatever the decoder.
        let law = parsed("tok_s16");
        assert!(!law.in_target());
        for decoder in [DecoderLength::Tokens(t), DecoderLength::Encoder] {
            assert_eq!(law.resolve(&|_| 1.0, decoder).bytes(b, s), (4.0 * b * s * 64.0) as u64);
        }
    }
}
