//! A recorded tensor's size law in the model's units (`h`, `kv`, `V`, products such as `q*h`),
//! read from a template before a model gives the units their sizes.

use crate::model_units;
use crate::program::Law;
use std::collections::BTreeMap;

/// A template's law in units, before a model gives the units their sizes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UnitLaw(pub(super) Vec<(LawKind, String, f64)>);

/// How a law's term grows: with nothing, the tokens, each token's positions, the sequences,
/// the positions, their square, or the tokens padded to 32 positions a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LawKind {
    Fixed,
    Token,
    TokenPosition,
    Sequence,
    Position,
    PositionSquare,
    PaddedToken,
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

    /// The law in bytes for a model whose units are `units`.
    pub fn resolve(&self, units: &dyn Fn(&str) -> f64) -> Law {
        let mut law = Law::default();
        for (kind, u, c) in &self.0 {
            let v = c * u.split('*').map(units).product::<f64>();
            match kind {
                LawKind::Fixed => law.fixed += v,
                LawKind::Token => law.per_token += v,
                LawKind::TokenPosition => law.per_token_position += v,
                LawKind::Sequence => law.per_sequence += v,
                LawKind::Position => law.per_position += v,
                LawKind::PositionSquare => law.per_position_square += v,
                LawKind::PaddedToken => law.per_padded_token += v,
            }
        }
        law
    }
}
