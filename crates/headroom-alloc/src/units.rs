//! Byte units and the two ways PyTorch prints byte counts.

/// 1 KiB.
pub const KIB: u64 = 1 << 10;
/// 1 MiB.
pub const MIB: u64 = 1 << 20;
/// 1 GiB.
pub const GIB: u64 = 1 << 30;

/// Formats a byte count the way PyTorch's OOM message does (`format_size` in
/// `CUDACachingAllocator.cpp`): whole bytes up to 1024, then two decimals of
/// the largest unit that keeps the value above one.
pub fn format_size(bytes: u64) -> String {
    if bytes <= 1024 {
        format!("{bytes} bytes")
    } else if bytes <= MIB {
        format!("{:.2} KiB", bytes as f64 / KIB as f64)
    } else if bytes <= GIB {
        format!("{:.2} MiB", bytes as f64 / MIB as f64)
    } else {
        format!("{:.2} GiB", bytes as f64 / GIB as f64)
    }
}

/// Bytes of each unit, lower case; SI units are powers of 1000, `…ib` of 1024
/// (a bare `k`, `m`, … is SI, as in `bytesize`).
const UNITS: [(&str, u128); 19] = [
    ("b", 1),
    ("k", 1_000),
    ("kb", 1_000),
    ("kib", 1 << 10),
    ("m", 1_000_000),
    ("mb", 1_000_000),
    ("mib", 1 << 20),
    ("g", 1_000_000_000),
    ("gb", 1_000_000_000),
    ("gib", 1 << 30),
    ("t", 1_000_000_000_000),
    ("tb", 1_000_000_000_000),
    ("tib", 1 << 40),
    ("pb", 1_000_000_000_000_000),
    ("pib", 1 << 50),
    ("eb", 1_000_000_000_000_000_000),
    ("eib", 1 << 60),
    ("p", 1_000_000_000_000_000),
    ("e", 1_000_000_000_000_000_000),
];

/// Parses a byte count as people write it: whole bytes (`4096`), or a number,
/// fractions allowed, and a unit (`80GiB`, `24GB`, `1.5GiB`); fractions of a
/// byte are dropped. Written here rather than taken from `bytesize`, whose
/// parser saturates values past 2^64 − 1 to 16 EiB without a word and
/// reports a number too large as an unknown unit: a size typed wrong must be
/// refused with what is wrong with it.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let text = || s.to_string();
    if t.is_empty() {
        return Err(SizeError::Empty);
    }
    if t.starts_with('-') {
        return Err(SizeError::Negative(text()));
    }
    let split = t.find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E').unwrap_or(t.len());
    // An `e` that ends the string or starts the unit (`1e`, `2EiB`) is the exabyte unit, not an exponent.
    let split = match t[..split].rfind(['e', 'E']) {
        Some(i) if !t[i + 1..].starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+') => i,
        _ => split,
    };
    let (number, unit) = (t[..split].trim(), t[split..].trim());
    let scale = if unit.is_empty() {
        1
    } else {
        let u = unit.to_ascii_lowercase();
        match UNITS.iter().find(|(name, _)| *name == u) {
            Some(&(_, scale)) => scale,
            None => return Err(SizeError::UnknownUnit { text: text(), unit: unit.to_string() }),
        }
    };
    if number.is_empty() {
        return Err(SizeError::NoNumber(text()));
    }
    let too_big = || SizeError::TooLarge(text());
    if number.bytes().all(|b| b.is_ascii_digit()) {
        let n: u128 = number.parse().map_err(|_| too_big())?;
        return u64::try_from(n.checked_mul(scale).ok_or_else(too_big)?).map_err(|_| too_big());
    }
    let x: f64 = number.parse().map_err(|_| SizeError::NotASize(text()))?;
    if !x.is_finite() {
        return Err(SizeError::NotFinite(text()));
    }
    let bytes = x * scale as f64;
    if bytes >= 18_446_744_073_709_551_616.0 {
        return Err(too_big());
    }
    Ok(bytes as u64)
}

/// A size that [`parse_size`] refuses, with the text as typed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("a size is needed (write bytes, or e.g. 80GiB, 24GB)")]
    Empty,
    #[error("{0:?} is negative; a size is at least 0 bytes")]
    Negative(String),
    #[error("{text:?}: unknown unit `{unit}` (use B, KB, MB, GB, TB, PB, EB or KiB, MiB, GiB, TiB, PiB, EiB)")]
    UnknownUnit { text: String, unit: String },
    #[error("{0:?} has no number before its unit")]
    NoNumber(String),
    #[error("{0:?} is more than the largest size, 2^64 − 1 bytes (16 EiB)")]
    TooLarge(String),
    #[error("{0:?} is not a size (write bytes, or e.g. 80GiB, 24GB)")]
    NotASize(String),
    #[error("{0:?} is not a finite size")]
    NotFinite(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_size_matches_pytorch_thresholds() {
        assert_eq!(format_size(512), "512 bytes");
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1536), "1.50 KiB");
        assert_eq!(format_size(MIB), "1024.00 KiB");
        assert_eq!(format_size(20 * MIB), "20.00 MiB");
        assert_eq!(format_size(GIB), "1024.00 MiB");
        assert_eq!(format_size(80 * GIB), "80.00 GiB");
    }

    #[test]
    fn units_fractions_and_plain_bytes() {
        for (s, want) in [
            ("4096", 4096),
            ("80GiB", 80 << 30),
            ("80 GiB", 80 << 30),
            ("24GB", 24_000_000_000),
            ("1.5GiB", 3 << 29),
            ("0.5KiB", 512),
            ("2k", 2000),
            ("1e3", 1000),
            ("2E", 2_000_000_000_000_000_000),
            ("1.5e3KiB", 1_536_000),
            ("18446744073709551615", u64::MAX),
        ] {
            assert_eq!(parse_size(s), Ok(want), "{s}");
        }
    }

    #[test]
    fn every_mistake_is_named() {
        for (s, needle) in [
            ("", "a size is needed"),
            ("-1", "negative"),
            ("99999999999999999999999", "2^64"),
            ("16EiB", "2^64"),
            ("17EiB", "2^64"),
            ("1000EiB", "2^64"),
            ("18446744073709551616", "2^64"),
            ("1e30", "2^64"),
            ("12 parsecs", "unknown unit `parsecs`"),
            ("GiB", "no number"),
            ("lots", "unknown unit"),
            ("1.2.3GiB", "not a size"),
            ("inf", "unknown unit"),
            ("NaN", "unknown unit"),
        ] {
            let e = parse_size(s).unwrap_err();
            assert!(e.to_string().contains(needle), "{s:?}: {e}");
        }
    }
}
