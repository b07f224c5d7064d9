//! A size law fitted to what a run measured: least squares over a few basis laws (bytes fixed,
//! per token, per token × position) at the shapes measured, beside a scale of tensors the
//! program already has. The calibration ([`crate::calibrate`]) fits each phase's correction
//! with it; [`crate::recorded_laws`] solves each recorded tensor's law with its bases.

use crate::program::Law;

/// A basis function of a fitted law at a shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Basis {
    Fixed,
    PerToken,
    PerTokenPosition,
    PerSequence,
    PerPosition,
    PerPositionSquare,
}

impl Basis {
    /// Its value at micro-batch `b` and sequence `s`.
    pub(crate) fn at(self, b: f64, s: f64) -> f64 {
        match self {
            Basis::Fixed => 1.0,
            Basis::PerToken => b * s,
            Basis::PerTokenPosition => b * s * s,
            Basis::PerSequence => b,
            Basis::PerPosition => s,
            Basis::PerPositionSquare => s * s,
        }
    }

    /// The law of `c` bytes of it.
    pub(crate) fn law(self, c: f64) -> Law {
        match self {
            Basis::Fixed => Law::fixed(c),
            Basis::PerToken => Law::per_token(c),
            Basis::PerTokenPosition => Law { per_token_position: c, ..Law::default() },
            Basis::PerSequence => Law { per_sequence: c, ..Law::default() },
            Basis::PerPosition => Law { per_position: c, ..Law::default() },
            Basis::PerPositionSquare => Law { per_position_square: c, ..Law::default() },
        }
    }
}

/// Least squares of `y ≈ x₀·scaled + Σ cⱼ·basisⱼ` with every cⱼ ≥ 0 (added tensors cannot be
/// negative) and `x₀` free where `scaled` is given: each subset of the bases is solved and
/// the best that keeps its coefficients non-negative taken.
pub(crate) fn fit_law(points: &[(f64, f64, f64, f64)], scaled: bool, bases: &[Basis]) -> (f64, Vec<f64>) {
    // points: (b, s, scaled bytes, y).
    let n = bases.len();
    let mut best: Option<(f64, f64, Vec<f64>)> = None;
    for mask in 0u32..(1 << n) {
        let chosen: Vec<usize> = (0..n).filter(|j| mask & (1 << j) != 0).collect();
        let cols = chosen.len() + scaled as usize;
        if cols == 0 || cols > points.len() {
            continue;
        }
        let row = |&(b, s, sc, _): &(f64, f64, f64, f64)| -> Vec<f64> {
            let mut r = Vec::with_capacity(cols);
            if scaled {
                r.push(sc);
            }
            r.extend(chosen.iter().map(|&j| bases[j].at(b, s)));
            r
        };
        let rows: Vec<Vec<f64>> = points.iter().map(row).collect();
        let y: Vec<f64> = points.iter().map(|p| p.3).collect();
        let Some(x) = least_squares(&rows, &y) else { continue };
        let offset = scaled as usize;
        if x[offset..].iter().any(|&c| c < 0.0) {
            continue;
        }
        let err: f64 =
            rows.iter().zip(&y).map(|(r, y)| (r.iter().zip(&x).map(|(a, b)| a * b).sum::<f64>() - y).powi(2)).sum();
        // Fewer terms win a tie: a law is added only where it explains something.
        let err = err * (1.0 + 1e-9 * cols as f64);
        if best.as_ref().is_none_or(|b| err < b.0) {
            let mut cs = vec![0.0; n];
            for (k, &j) in chosen.iter().enumerate() {
                cs[j] = x[offset + k];
            }
            best = Some((err, if scaled { x[0] } else { 0.0 }, cs));
        }
    }
    best.map_or((0.0, vec![0.0; n]), |(_, x0, cs)| (x0, cs))
}

/// Solves the normal equations by Gaussian elimination; `None` when singular.
pub(crate) fn least_squares(rows: &[Vec<f64>], y: &[f64]) -> Option<Vec<f64>> {
    let n = rows.first()?.len();
    // Columns scaled to unit size: bytes, tokens and tokens² differ by many orders.
    let norms: Vec<f64> = (0..n)
        .map(|j| rows.iter().map(|r| r[j] * r[j]).sum::<f64>().sqrt())
        .map(|v| if v > 0.0 { v } else { 1.0 })
        .collect();
    let mut a = vec![vec![0.0; n + 1]; n];
    for (r, &yv) in rows.iter().zip(y) {
        for i in 0..n {
            for j in 0..n {
                a[i][j] += r[i] / norms[i] * r[j] / norms[j];
            }
            a[i][n] += r[i] / norms[i] * yv;
        }
    }
    for c in 0..n {
        let p = (c..n).max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs()))?;
        if a[p][c].abs() < 1e-9 {
            return None;
        }
        a.swap(c, p);
        let pivot = a[c].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != c {
                let k = row[c] / pivot[c];
                for (x, p) in row.iter_mut().zip(&pivot).skip(c) {
                    *x -= k * p;
                }
            }
        }
    }
    Some((0..n).map(|i| a[i][n] / a[i][i] / norms[i]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_law_fit_keeps_added_tensors_non_negative() {
        // y = −0.1·scaled + 2·b·s²: the scale may fall, the added law may not.
        let pts: Vec<_> = [(1.0, 100.0), (1.0, 200.0)]
            .iter()
            .map(|&(b, s): &(f64, f64)| (b, s, 1000.0 * b * s, -0.1 * 1000.0 * b * s + 2.0 * b * s * s))
            .collect();
        let (x0, cs) = fit_law(&pts, true, &[Basis::PerTokenPosition]);
        assert!((x0 + 0.1).abs() < 1e-9 && (cs[0] - 2.0).abs() < 1e-9, "{x0} {cs:?}");
        // Where the only fit wants a negative added law, it is left out.
        let pts: Vec<_> = pts.iter().map(|p| (p.0, p.1, p.2, -3.0 * p.0 * p.1 * p.1)).collect();
        let (_, cs) = fit_law(&pts, true, &[Basis::PerTokenPosition]);
        assert_eq!(cs[0], 0.0);
    }
}
