//! Each tensor's size law, fitted from the same step recorded at two or three shapes.
//!
//! One recording holds one shape's sizes, so each of its tensors is fixed bytes. Recorded again
//! at another batch or sequence length, the step makes the same tensors in the same order —
//! the same ids (`"<index> <when> <term> <site>"`), only the sizes differ — and each tensor's
//! sizes at the shapes recorded say how it grows: the law (bytes fixed, per token b·s, per
//! token and position b·s², per sequence b, per position s, per position squared s²) with the
//! fewest terms that gives every recorded size to the byte. Two shapes determine at most two
//! coefficients (fixed and per token where they differ in tokens); a third that varies the
//! sequence alone tells b·s² and s from b·s. Sizes are whole multiples of an element's bytes,
//! so a law that is exact is the norm; where none is, the nearest is kept and counted
//! ([`Recording::inexact`]).
//!
//! Recordings that are not the same step are refused, naming the first line that differs in
//! each file: a law fitted across two different programs would be wrong with confidence.

use crate::law_fit::{least_squares, Basis};
use crate::program::Law;
use crate::recording::{Recording, RecordingError};

/// The bases, simplest first: among laws of as many terms, the first exact one is kept.
const BASES: [Basis; 6] = [
    Basis::Fixed,
    Basis::PerToken,
    Basis::PerTokenPosition,
    Basis::PerSequence,
    Basis::PerPosition,
    Basis::PerPositionSquare,
];

/// The law of a tensor of `sizes` bytes at `shapes` (`(batch, seq)` each), and whether it
/// gives each size to the byte: the fewest terms of whole bytes each that do (a tensor's
/// bytes are whole multiples of its dimensions, as `b·(s − 1)·vocab` is `vocab·b·s − vocab·b`),
/// else the fewest terms that do, else the nearest.
pub fn fit_law(shapes: &[(u64, u64)], sizes: &[u64]) -> (Law, bool) {
    let points: Vec<(f64, f64)> = shapes.iter().map(|&(b, s)| (b as f64, s as f64)).collect();
    let y: Vec<f64> = sizes.iter().map(|&v| v as f64).collect();
    let miss = |law: &Law| -> u64 {
        points.iter().zip(sizes).map(|(&(b, s), &v)| law.bytes(b, s).abs_diff(v)).max().unwrap_or(0)
    };
    let mut fractional: Option<Law> = None;
    let mut nearest: Option<(u64, Law)> = None;
    for terms in 1..=points.len().min(BASES.len()) {
        for chosen in combinations(BASES.len(), terms) {
            let rows: Vec<Vec<f64>> =
                points.iter().map(|&(b, s)| chosen.iter().map(|&j| BASES[j].at(b, s)).collect()).collect();
            let Some(x) = least_squares(&rows, &y) else { continue };
            let law_of = |cs: &[f64]| chosen.iter().zip(cs).fold(Law::default(), |l, (&j, &c)| l + BASES[j].law(c));
            let whole: Vec<f64> = x.iter().map(|c| c.round()).collect();
            let near_whole = x.iter().zip(&whole).all(|(c, w)| (c - w).abs() <= 1e-6 * c.abs().max(1.0));
            if near_whole && miss(&law_of(&whole)) == 0 {
                return (law_of(&whole), true);
            }
            let law = law_of(&x);
            let m = miss(&law);
            if m == 0 {
                fractional.get_or_insert(law);
            } else if nearest.as_ref().is_none_or(|(n, _)| m < *n) {
                nearest = Some((m, law));
            }
        }
    }
    match (fractional, nearest) {
        (Some(law), _) => (law, true),
        (None, Some((_, law))) => (law, false),
        (None, None) => (Law::default(), sizes.iter().all(|&v| v == 0)),
    }
}

/// Every choice of `k` of `0..n`, each in increasing order, in lexicographic order.
fn combinations(n: usize, k: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut c: Vec<usize> = (0..k).collect();
    if k > n {
        return out;
    }
    loop {
        out.push(c.clone());
        let Some(i) = (0..k).rev().find(|&i| c[i] < n - k + i) else { return out };
        c[i] += 1;
        for j in i + 1..k {
            c[j] = c[j - 1] + 1;
        }
    }
}

fn refused(path: &str, line: usize, why: String) -> RecordingError {
    RecordingError { path: path.to_string(), line, why }
}

/// The first operation at which `b` is not the same step as `a`.
fn check_aligned(a: &Recording, b: &Recording) -> Result<(), RecordingError> {
    let same = "the recordings must be the same step (the same operations in the same order, with the same ids) \
                at different shapes";
    for (i, (x, y)) in a.events.iter().zip(&b.events).enumerate() {
        if x.1 != y.1 {
            return Err(refused(
                &b.path,
                y.0,
                format!("{} where {} line {} has {} (operation {}): {same}", y.1, a.path, x.0, x.1, i + 1),
            ));
        }
    }
    if a.events.len() != b.events.len() {
        let (short, long) = if a.events.len() < b.events.len() { (a, b) } else { (b, a) };
        let (line, what) = &long.events[short.events.len()];
        return Err(refused(
            &long.path,
            *line,
            format!(
                "{what} has no counterpart: {} ends after {} operations (line {}); {same}",
                short.path,
                short.events.len(),
                short.events.last().map_or(0, |e| e.0)
            ),
        ));
    }
    Ok(())
}

impl Recording {
    /// The step recorded in each of `recordings`, at two or three shapes, each file's shape
    /// read from its first line: one program whose tensors carry the laws their sizes follow.
    /// One recording is itself.
    pub fn fitted(mut recordings: Vec<Recording>) -> Result<Recording, RecordingError> {
        if recordings.len() == 1 {
            return Ok(recordings.remove(0));
        }
        let Some(first) = recordings.first() else {
            return Err(refused("--program", 0, "no recording given".into()));
        };
        let mut shapes = Vec::new();
        for r in &recordings {
            let &[shape] = r.shapes.as_slice() else {
                return Err(refused(
                    &r.path,
                    1,
                    "does not say the shape it was recorded at: give it a first line {\"op\":\"shape\",\"batch\":B,\
                     \"seq\":S} with its micro-batch and sequence length (python -m headroom_gpu record writes it)"
                        .into(),
                ));
            };
            if let Some(i) = shapes.iter().position(|&s| s == shape) {
                return Err(refused(
                    &r.path,
                    1,
                    format!(
                        "is recorded at batch {} × seq {}, as {} is: record the step at another shape",
                        shape.0, shape.1, recordings[i].path
                    ),
                ));
            }
            shapes.push(shape);
            check_aligned(first, r)?;
        }
        let mut program = first.program.clone();
        let mut inexact = 0;
        for (t, tensor) in program.tensors.iter_mut().enumerate() {
            let sizes: Vec<u64> = recordings.iter().map(|r| r.program.tensors[t].law.fixed as u64).collect();
            let (law, exact) = fit_law(&shapes, &sizes);
            tensor.law = law;
            inexact += usize::from(!exact);
        }
        let path = recordings.iter().map(|r| r.path.as_str()).collect::<Vec<_>>().join(", ");
        // Kernels time one shape: those of the first file that has any, said with its shape.
        let kernels = recordings.iter().find(|r| !r.kernels.is_empty()).map(|r| r.kernels.clone()).unwrap_or_default();
        let kernels_at = recordings.iter().find(|r| !r.kernels.is_empty()).and_then(|r| r.shapes.first().copied());
        let compiled = recordings.iter().any(|r| r.compiled);
        Ok(Recording { path, program, shapes, inexact, events: Vec::new(), kernels, kernels_at, compiled })
    }

    /// Whether the recordings tell how the step grows with the micro-batch (`batch`) or with
    /// the sequence length: they hold two of them. Otherwise what to record, for `flag`.
    pub fn grows_with(&self, batch: bool, flag: &str) -> Result<(), String> {
        let (what, whats, arg) = if batch {
            ("micro-batch", "micro-batches", "--batch")
        } else {
            ("sequence length", "sequence lengths", "--seq")
        };
        let values: Vec<u64> = self.shapes.iter().map(|&(b, s)| if batch { b } else { s }).collect();
        match values.as_slice() {
            [] | [_] => Err(format!(
                "{flag}: --program {} holds one shape's sizes, so how the step grows with the {what} is not known: \
                 record the step at two or three shapes (python -m headroom_gpu record {arg} …; two {whats} among \
                 them) and pass each with --program",
                self.path
            )),
            [v, rest @ ..] if rest.iter().all(|x| x == v) => Err(format!(
                "{flag}: every recording is at {arg} {v}, so how the step grows with the {what} is not known: record \
                 it at another {what} too and pass it with --program"
            )),
            _ => Ok(()),
        }
    }

    /// Why the recording cannot plan micro-batch `b` and sequence `s`, where it cannot: a shape
    /// none of its recordings varies towards.
    pub fn refuses_shape(&self, b: u64, s: u64) -> Option<String> {
        let batch = self.shapes.iter().any(|&(rb, _)| rb == b) || self.grows_with(true, "").is_ok();
        let seq = self.shapes.iter().any(|&(_, rs)| rs == s) || self.grows_with(false, "").is_ok();
        if self.shapes.is_empty() || (batch && seq) {
            return None;
        }
        let flag = if batch { format!("--seq {s}") } else { format!("--batch {b}") };
        let recorded: Vec<String> = self.shapes.iter().map(|&(b, s)| format!("--batch {b} --seq {s}")).collect();
        Some(format!("{} (recorded at {})", self.grows_with(!batch, &flag).err()?, recorded.join("; ")))
    }

    /// What the fitted laws are made of, for [`Recording::describe`]: the shapes, and the
    /// tensors not exact; `None` for one recording.
    pub fn fitted_from(&self) -> Option<String> {
        if self.shapes.len() < 2 {
            return None;
        }
        let shapes: Vec<String> = self.shapes.iter().map(|(b, s)| format!("{b} × {s}")).collect();
        let inexact = match self.inexact {
            0 => String::new(),
            n => format!(", {n} tensors' sizes not to the byte (the nearest law kept)"),
        };
        Some(format!("size laws fitted from batch × seq {}{inexact}", shapes.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combinations_come_simplest_first() {
        assert_eq!(combinations(3, 2), vec![vec![0, 1], vec![0, 2], vec![1, 2]]);
        assert_eq!(combinations(6, 3).len(), 20);
    }

    #[test]
    fn each_law_is_fitted_exactly_from_three_shapes() {
        let shapes = [(1, 512), (2, 512), (1, 1024)];
        let laws = [
            Law::fixed(4096.0),
            Law::per_token(1536.0),
            Law::fixed(512.0) + Law::per_token(2.0),
            Law { per_token_position: 2.0, ..Law::default() },
            Law { per_position: 64.0, ..Law::default() },
            Law::per_token(4.0 * 50257.0) + Law { per_sequence: -4.0 * 50257.0, ..Law::default() },
        ];
        for law in laws {
            let sizes: Vec<u64> = shapes.iter().map(|&(b, s)| law.bytes(b as f64, s as f64)).collect();
            let (fitted, exact) = fit_law(&shapes, &sizes);
            assert!(exact, "{law:?}");
            assert_eq!(fitted, law);
        }
    }

    #[test]
    fn two_shapes_fit_fixed_and_per_token() {
        let law = Law::fixed(1000.0) + Law::per_token(6.0);
        let shapes = [(1, 512), (4, 512)];
        let sizes: Vec<u64> = shapes.iter().map(|&(b, s)| law.bytes(b as f64, s as f64)).collect();
        assert_eq!(fit_law(&shapes, &sizes), (law, true));
    }
}
