//! Length distributions for synthetic workloads: `fixed:N` (or just `N`),
//! `uniform:A-B`, `normal:MEAN,STD`, and `sharegpt`, a log-normal with the
//! mean lengths of the ShareGPT traces in the PagedAttention paper (prompt
//! 161.31 tokens, output 337.99 tokens; Kwon et al. 2023, Fig. 11). The paper
//! gives no medians or spread; headroom uses σ = 1.0 for the log-normal, a
//! heavy tail like the paper's histograms. Every draw is clamped to at least 1.

use rand::Rng;
use rand_distr::{Distribution, LogNormal, Normal};
use std::fmt;

/// Mean prompt length of ShareGPT (Kwon et al. 2023).
pub const SHAREGPT_PROMPT_MEAN: f64 = 161.31;
/// Mean output length of ShareGPT (Kwon et al. 2023).
pub const SHAREGPT_OUTPUT_MEAN: f64 = 337.99;
const SHAREGPT_SIGMA: f64 = 1.0;

/// A distribution of token counts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LengthDist {
    Fixed(usize),
    Uniform(usize, usize),
    Normal { mean: f64, std: f64 },
    LogNormal { mean: f64, sigma: f64 },
}

/// Which ShareGPT mean `sharegpt` stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Prompt,
    Output,
}

/// A length distribution [`LengthDist::parse`] refuses, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad length distribution `{text}`: {why} (use N, fixed:N, uniform:A-B, normal:MEAN,STD or sharegpt)")]
pub struct BadLengthDist {
    pub text: String,
    pub why: String,
}

impl LengthDist {
    /// Parses the forms of the module documentation.
    pub fn parse(s: &str, role: Role) -> Result<Self, BadLengthDist> {
        let s = s.trim();
        let bad = |why: &str| BadLengthDist { text: s.to_string(), why: why.to_string() };
        let num = |t: &str| match t.trim().parse::<f64>() {
            Ok(x) if x.is_finite() => Ok(x),
            Ok(_) => Err(bad(&format!("`{t}` is not a finite number"))),
            Err(_) => Err(bad(&format!("`{t}` is not a number"))),
        };
        let tokens = |t: &str| {
            t.trim().parse::<usize>().map_err(|_| match t.trim().parse::<f64>() {
                Ok(_) => bad(&format!("`{t}` is not a whole number of tokens (write it in digits, e.g. 4096)")),
                Err(_) => bad(&format!("`{t}` is not a number")),
            })
        };
        let (kind, arg) = s.split_once(':').unwrap_or(if s.eq_ignore_ascii_case("sharegpt") {
            ("sharegpt", "")
        } else {
            ("fixed", s)
        });
        let d = match kind.to_ascii_lowercase().as_str() {
            "fixed" => LengthDist::Fixed(tokens(arg)?),
            "uniform" => {
                let (a, b) = arg.split_once('-').ok_or_else(|| bad("uniform needs A-B"))?;
                let (a, b) = (tokens(a)?, tokens(b)?);
                if a > b {
                    return Err(bad("A must not exceed B"));
                }
                LengthDist::Uniform(a, b)
            }
            "normal" => {
                let (m, sd) = arg.split_once(',').ok_or_else(|| bad("normal needs MEAN,STD"))?;
                let (mean, std) = (num(m)?, num(sd)?);
                if std.is_nan() || std < 0.0 || mean.is_nan() || mean <= 0.0 {
                    return Err(bad("MEAN must be positive and STD non-negative"));
                }
                LengthDist::Normal { mean, std }
            }
            "sharegpt" if !arg.trim().is_empty() => return Err(bad("sharegpt takes no argument")),
            "sharegpt" => LengthDist::LogNormal {
                mean: if role == Role::Prompt { SHAREGPT_PROMPT_MEAN } else { SHAREGPT_OUTPUT_MEAN },
                sigma: SHAREGPT_SIGMA,
            },
            other => return Err(bad(&format!("unknown kind `{other}`"))),
        };
        match d {
            LengthDist::Fixed(0) | LengthDist::Uniform(0, 0) => Err(bad("lengths must be at least 1")),
            d => Ok(d),
        }
    }

    /// One draw, at least 1.
    pub fn sample<R: Rng>(&self, rng: &mut R) -> usize {
        let x = match *self {
            LengthDist::Fixed(n) => n as f64,
            LengthDist::Uniform(a, b) => rng.random_range(a..=b) as f64,
            LengthDist::Normal { mean, std } => Normal::new(mean, std).expect("valid normal").sample(rng),
            LengthDist::LogNormal { mean, sigma } => {
                // E[X] = exp(mu + sigma^2 / 2) = mean.
                let mu = mean.ln() - sigma * sigma / 2.0;
                LogNormal::new(mu, sigma).expect("valid log-normal").sample(rng)
            }
        };
        (x.round() as i64).max(1) as usize
    }
}

impl fmt::Display for LengthDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LengthDist::Fixed(n) => write!(f, "fixed:{n}"),
            LengthDist::Uniform(a, b) => write!(f, "uniform:{a}-{b}"),
            LengthDist::Normal { mean, std } => write!(f, "normal:{mean},{std}"),
            LengthDist::LogNormal { mean, sigma } => write!(f, "lognormal(mean {mean}, sigma {sigma})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn parses_and_samples_with_the_right_mean() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        assert_eq!(LengthDist::parse("128", Role::Prompt).unwrap(), LengthDist::Fixed(128));
        assert_eq!(LengthDist::parse("uniform:10-20", Role::Prompt).unwrap(), LengthDist::Uniform(10, 20));
        let d = LengthDist::parse("sharegpt", Role::Output).unwrap();
        let n = 200_000;
        let mean = (0..n).map(|_| d.sample(&mut rng) as f64).sum::<f64>() / n as f64;
        assert!((mean - SHAREGPT_OUTPUT_MEAN).abs() / SHAREGPT_OUTPUT_MEAN < 0.02, "{mean}");
        for bad in [
            "uniform:5",
            "normal:1",
            "gauss:3",
            "0",
            "uniform:9-3",
            "normal:-1,2",
            "1.5",
            "1e30",
            "uniform:1-1e12",
            "normal:inf,1",
            "normal:1e30,nan",
            "sharegpt:3",
            "99999999999999999999999",
        ] {
            assert!(LengthDist::parse(bad, Role::Prompt).is_err(), "{bad}");
        }
    }
}
