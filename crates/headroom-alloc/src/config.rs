//! Allocator settings, and `PYTORCH_CUDA_ALLOC_CONF` parsing with PyTorch's rules.
//!
//! The string form is `key:value,key:value`, list values in `[...]`, booleans
//! exactly `True`/`False`. Whitespace is dropped, unknown keys are errors.
//! Each parse starts from the defaults, as PyTorch's does for the keys that
//! matter to the device allocator.

use crate::units::MIB;
use std::fmt;

/// Requests are rounded up to a multiple of this (`kMinBlockSize`).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Largest rounded request served from the small pool (`kSmallSize`).
pub const SMALL_SIZE: u64 = MIB;
/// Segment size of the small pool, and its expandable page size (`kSmallBuffer`).
pub const SMALL_BUFFER: u64 = 2 * MIB;
/// Default large-pool segment size for requests in (1 MiB, 10 MiB) (`kLargeBuffer`).
pub const LARGE_BUFFER: u64 = 20 * MIB;
/// Requests at or above this get a segment of their own, rounded to 2 MiB (`kMinLargeAlloc`).
pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Rounding of segments for requests of 10 MiB and more (`kRoundLarge`).
pub const ROUND_LARGE: u64 = 2 * MIB;
/// Number of power-of-two intervals `roundup_power2_divisions` can set (1 MiB to 64 GiB).
pub const ROUNDUP_POWER2_INTERVALS: usize = 16;

/// The allocator's settings. `Default` is PyTorch's default configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocatorConfig {
    /// Blocks of this size or more are "oversize": never split, and only reused
    /// by requests of at least this size. `u64::MAX` means unlimited.
    pub max_split_size: u64,
    /// How much larger than an oversize request a cached oversize block may be
    /// and still serve it.
    pub max_non_split_rounding_size: u64,
    /// Segment size for requests in (1 MiB, 10 MiB), and the large pool's
    /// expandable page size.
    pub large_segment_size: u64,
    /// Divisions per power-of-two interval; entry k covers `[2^k MiB, 2^(k+1) MiB)`,
    /// entry 0 also everything below, entry 15 everything above.
    pub roundup_power2_divisions: [u64; ROUNDUP_POWER2_INTERVALS],
    /// Fraction of the memory limit above which cached blocks are garbage
    /// collected; 0 disables. Needs a memory fraction.
    pub garbage_collection_threshold: f64,
    /// Grow one segment per stream and pool by mapping pages, instead of
    /// allocating a segment per request.
    pub expandable_segments: bool,
    /// Parsed and reported; headroom holds its lock across device calls (see `CachingAllocator`).
    pub release_lock_on_cudamalloc: bool,
    /// Initial per-process memory fraction; 1.0 means no limit.
    pub per_process_memory_fraction: f64,
    /// Parsed and reported in snapshots (pinned host allocator).
    pub pinned_use_cuda_host_register: bool,
    /// Parsed and reported in snapshots (pinned host allocator).
    pub pinned_num_register_threads: u64,
    /// Parsed and reported in snapshots (`graph_capture_record_stream_reuse`).
    pub graph_capture_record_stream_reuse: bool,
    /// `backend` key: headroom simulates the native allocator only.
    pub backend: Backend,
    /// The string this configuration was parsed from ("" for the default).
    pub raw: String,
}

/// The `backend` key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// PyTorch's caching allocator, which headroom reproduces.
    Native,
    /// CUDA's stream-ordered allocator: parsed (snapshots record it), not simulated.
    CudaMallocAsync,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: u64::MAX,
            max_non_split_rounding_size: LARGE_BUFFER,
            large_segment_size: LARGE_BUFFER,
            roundup_power2_divisions: [0; ROUNDUP_POWER2_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            release_lock_on_cudamalloc: false,
            per_process_memory_fraction: 1.0,
            pinned_use_cuda_host_register: false,
            pinned_num_register_threads: 1,
            graph_capture_record_stream_reuse: false,
            backend: Backend::Native,
            raw: String::new(),
        }
    }
}

/// A `PYTORCH_CUDA_ALLOC_CONF` string that PyTorch would reject.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The key being parsed when the error was found, if any.
    pub key: Option<String>,
    /// What is wrong, in PyTorch's words where it has them.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.key {
            Some(k) => write!(f, "invalid allocator setting `{k}`: {}", self.message),
            None => write!(f, "invalid allocator settings: {}", self.message),
        }
    }
}

impl AllocatorConfig {
    /// Parses a `PYTORCH_CUDA_ALLOC_CONF` string, starting from the defaults.
    pub fn parse(conf: &str) -> Result<Self, ConfigError> {
        let mut cfg = AllocatorConfig::default();
        cfg.apply(conf)?;
        Ok(cfg)
    }

    /// Applies a settings string on top of this configuration, as
    /// `torch._C._accelerator_setAllocatorSettings` does: `max_split_size`,
    /// `roundup_power2_divisions` and `garbage_collection_threshold` are reset
    /// to their defaults first, other keys keep their values unless named.
    /// On error the configuration is unchanged.
    pub fn apply(&mut self, conf: &str) -> Result<(), ConfigError> {
        let mut next = self.clone();
        next.max_split_size = u64::MAX;
        next.roundup_power2_divisions = [0; ROUNDUP_POWER2_INTERVALS];
        next.garbage_collection_threshold = 0.0;
        let tokens = lex(conf);
        // `large_segment_size_mb` is read first because the default of
        // `max_non_split_rounding_mb` follows it.
        let mut p = Parser { tokens: &tokens, i: 0 };
        while p.i < tokens.len() {
            let key = p.next_key()?;
            if key == "large_segment_size_mb" {
                p.expect(":", key)?;
                let mb = p.uint(key)?;
                if mb <= MIN_LARGE_ALLOC / MIB {
                    return Err(err(key, format!("must be greater than 10, got {mb}")));
                }
                let bytes = mb.checked_mul(MIB).ok_or_else(|| {
                    err(key, format!("{mb} MiB is more than 2^64 bytes (at most {})", u64::MAX / MIB))
                })?;
                next.large_segment_size = bytes;
                next.max_non_split_rounding_size = bytes;
            } else {
                p.skip_value();
            }
            p.separator(key)?;
        }
        let mut p = Parser { tokens: &tokens, i: 0 };
        while p.i < tokens.len() {
            let key = p.next_key()?;
            next.parse_key(key, &mut p)?;
            p.separator(key)?;
        }
        if next.expandable_segments && !next.large_segment_size.is_multiple_of(SMALL_BUFFER) {
            // Pages of the large pool are this size, and the driver maps whole
            // multiples of its 2 MiB granularity (PyTorch fails in cuMemCreate).
            return Err(err(
                "large_segment_size_mb",
                format!(
                    "{} MiB is not a multiple of 2 MiB, the mapping granularity expandable segments need",
                    next.large_segment_size / MIB
                ),
            ));
        }
        next.raw = conf.to_string();
        *self = next;
        Ok(())
    }

    /// The keys of the settings string that do not change the device
    /// allocator's decisions: the lock around `cudaMalloc` (a simulated
    /// device has no other threads), the pinned host allocator's keys, and
    /// keys that only matter under CUDA graph capture or at an OOM's throw.
    pub fn keys_without_effect(&self) -> Vec<String> {
        let tokens = lex(&self.raw);
        let mut keys: Vec<String> = Vec::new();
        let mut expect_key = true;
        let mut depth = 0;
        for t in &tokens {
            match t.as_str() {
                "[" => depth += 1,
                "]" => depth -= 1,
                "," if depth == 0 => expect_key = true,
                ":" | "," => {}
                k if expect_key && depth == 0 => {
                    expect_key = false;
                    let inert = k.starts_with("pinned_")
                        || matches!(
                            k,
                            "release_lock_on_cudamalloc"
                                | "release_lock_on_hipmalloc"
                                | "graph_capture_record_stream_reuse"
                                | "throw_on_cudamalloc_oom"
                        );
                    if inert && !keys.iter().any(|x| x == k) {
                        keys.push(k.to_string());
                    }
                }
                _ => {}
            }
        }
        keys
    }

    fn parse_key(&mut self, key: &str, p: &mut Parser<'_>) -> Result<(), ConfigError> {
        let large_mb = self.large_segment_size / MIB;
        match key {
            "large_segment_size_mb" => p.skip_value(),
            "max_split_size_mb" => {
                p.expect(":", key)?;
                let mb = p.uint(key)?;
                if mb < large_mb {
                    return Err(err(key, format!("too small, must be at least {large_mb}, got {mb}")));
                }
                self.max_split_size = mb.saturating_mul(MIB);
            }
            "max_non_split_rounding_mb" => {
                p.expect(":", key)?;
                let mb = p.uint(key)?;
                if mb < large_mb {
                    return Err(err(key, format!("too small, must be at least {large_mb}, got {mb}")));
                }
                self.max_non_split_rounding_size = mb.saturating_mul(MIB);
            }
            "garbage_collection_threshold" => {
                p.expect(":", key)?;
                let v = p.float(key)?;
                if !(v > 0.0 && v < 1.0) {
                    return Err(err(key, format!("must be in (0.0, 1.0), got {v}")));
                }
                self.garbage_collection_threshold = v;
            }
            "roundup_power2_divisions" => self.parse_divisions(p)?,
            "expandable_segments" => {
                p.expect(":", key)?;
                self.expandable_segments = p.boolean(key)?;
            }
            "release_lock_on_cudamalloc" | "release_lock_on_hipmalloc" => {
                p.expect(":", key)?;
                self.release_lock_on_cudamalloc = p.boolean(key)?;
            }
            "graph_capture_record_stream_reuse" => {
                p.expect(":", key)?;
                self.graph_capture_record_stream_reuse = p.boolean(key)?;
            }
            "per_process_memory_fraction" => {
                p.expect(":", key)?;
                let v = p.float(key)?;
                if !(0.0..=1.0).contains(&v) {
                    return Err(err(key, format!("must be in [0.0, 1.0], got {v}")));
                }
                self.per_process_memory_fraction = v;
            }
            "pinned_use_cuda_host_register" | "pinned_use_hip_host_register" => {
                p.expect(":", key)?;
                self.pinned_use_cuda_host_register = p.boolean(key)?;
            }
            "pinned_num_register_threads" => {
                p.expect(":", key)?;
                let v = p.uint(key)?;
                if !v.is_power_of_two() || v > 128 {
                    return Err(err(key, format!("must be a power of 2 no larger than 128, got {v}")));
                }
                self.pinned_num_register_threads = v;
            }
            "pinned_use_background_threads" | "throw_on_cudamalloc_oom" => {
                p.expect(":", key)?;
                p.boolean(key)?;
            }
            "pinned_reserve_segment_size_mb" | "pinned_max_round_threshold_mb" | "pinned_max_cached_size_mb" => {
                p.expect(":", key)?;
                let v = p.uint(key)?;
                if v == 0 && key == "pinned_reserve_segment_size_mb" {
                    return Err(err(key, "must be greater than 0".to_string()));
                }
            }
            "backend" => {
                p.expect(":", key)?;
                let v = p.token(key)?;
                self.backend = match v {
                    "native" => Backend::Native,
                    "cudaMallocAsync" => Backend::CudaMallocAsync,
                    other => {
                        return Err(err(
                            key,
                            format!("unknown allocator backend `{other}`: expected native or cudaMallocAsync"),
                        ))
                    }
                };
            }
            other => {
                return Err(ConfigError {
                    key: Some(other.to_string()),
                    message: "unrecognized key in CUDA allocator config".to_string(),
                })
            }
        }
        Ok(())
    }

    fn parse_divisions(&mut self, p: &mut Parser<'_>) -> Result<(), ConfigError> {
        let key = "roundup_power2_divisions";
        p.expect(":", key)?;
        if p.peek() == Some("[") {
            p.i += 1;
            let mut first = true;
            let mut last_index = 0usize;
            loop {
                let boundary = p.token(key)?;
                p.expect(":", key)?;
                let divisions = p.uint(key)?;
                if divisions != 0 && !divisions.is_power_of_two() {
                    return Err(err(key, format!("divisions must be 0 or a power of 2, got {divisions}")));
                }
                if boundary == ">" {
                    for d in &mut self.roundup_power2_divisions[(last_index + 1).min(ROUNDUP_POWER2_INTERVALS)..] {
                        *d = divisions;
                    }
                } else {
                    let mb: u64 = boundary
                        .parse()
                        .map_err(|_| err(key, format!("interval `{boundary}` is not a number of MiB")))?;
                    if !mb.is_power_of_two() {
                        return Err(err(key, format!("intervals must be powers of 2 MiB, got {mb}")));
                    }
                    let index = mb.trailing_zeros() as usize;
                    if index >= ROUNDUP_POWER2_INTERVALS {
                        return Err(err(key, format!("interval {mb} MiB is beyond the largest (32768 MiB)")));
                    }
                    if first {
                        for d in &mut self.roundup_power2_divisions[..index] {
                            *d = divisions;
                        }
                        first = false;
                    }
                    self.roundup_power2_divisions[index] = divisions;
                    last_index = index;
                }
                match p.token(key)? {
                    "," => continue,
                    "]" => break,
                    t => return Err(err(key, format!("expected `,` or `]`, found `{t}`"))),
                }
            }
        } else {
            let d = p.uint(key)?;
            if !d.is_power_of_two() {
                return Err(err(key, format!("divisions must be a power of 2, got {d}")));
            }
            self.roundup_power2_divisions = [d; ROUNDUP_POWER2_INTERVALS];
        }
        Ok(())
    }

    /// Divisions that apply to a request of `size` bytes.
    pub fn divisions_for(&self, size: u64) -> u64 {
        let log2 = 63 - size.max(1).leading_zeros() as i64;
        let index = (log2 - 20).clamp(0, ROUNDUP_POWER2_INTERVALS as i64 - 1) as usize;
        self.roundup_power2_divisions[index]
    }
}

fn err(key: &str, message: String) -> ConfigError {
    ConfigError { key: Some(key.to_string()), message }
}

/// Splits on `,`, `:`, `[` and `]` (kept as tokens) and drops whitespace.
fn lex(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            ',' | ':' | '[' | ']' => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                out.push(c.to_string());
            }
            c if c.is_whitespace() => {}
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

struct Parser<'a> {
    tokens: &'a [String],
    i: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<&'a str> {
        self.tokens.get(self.i).map(|s| s.as_str())
    }

    fn next_key(&mut self) -> Result<&'a str, ConfigError> {
        let t = self.peek().unwrap_or_default();
        self.i += 1;
        if matches!(t, "," | ":" | "[" | "]") {
            return Err(ConfigError { key: None, message: format!("expected a key, found `{t}`") });
        }
        Ok(t)
    }

    fn token(&mut self, key: &str) -> Result<&'a str, ConfigError> {
        let t = self.peek().ok_or_else(|| err(key, "missing value".to_string()))?;
        self.i += 1;
        Ok(t)
    }

    fn expect(&mut self, what: &str, key: &str) -> Result<(), ConfigError> {
        match self.peek() {
            Some(t) if t == what => {
                self.i += 1;
                Ok(())
            }
            Some(t) => Err(err(key, format!("expected `{what}`, found `{t}`"))),
            None => Err(err(key, format!("expected `{what}` and a value"))),
        }
    }

    fn uint(&mut self, key: &str) -> Result<u64, ConfigError> {
        let t = self.token(key)?;
        t.parse().map_err(|_| err(key, format!("expected a non-negative integer, got `{t}`")))
    }

    fn float(&mut self, key: &str) -> Result<f64, ConfigError> {
        let t = self.token(key)?;
        t.parse().map_err(|_| err(key, format!("expected a number, got `{t}`")))
    }

    fn boolean(&mut self, key: &str) -> Result<bool, ConfigError> {
        match self.token(key)? {
            "True" => Ok(true),
            "False" => Ok(false),
            t => Err(err(key, format!("expected True or False, got `{t}`"))),
        }
    }

    /// Skips `:value` or `:[...]`.
    fn skip_value(&mut self) {
        if self.peek() == Some(":") {
            self.i += 1;
        }
        if self.peek() == Some("[") {
            while let Some(t) = self.peek() {
                self.i += 1;
                if t == "]" {
                    break;
                }
            }
        } else if self.peek().is_some() {
            self.i += 1;
        }
    }

    fn separator(&mut self, key: &str) -> Result<(), ConfigError> {
        match self.peek() {
            None => Ok(()),
            Some(",") => {
                self.i += 1;
                Ok(())
            }
            Some(t) => Err(err(key, format!("expected `,` before `{t}`"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_string_is_default_config() {
        assert_eq!(AllocatorConfig::parse("").unwrap(), AllocatorConfig::default());
    }

    #[test]
    fn parses_every_device_key() {
        let c = AllocatorConfig::parse(
            "max_split_size_mb:128, garbage_collection_threshold:0.6,expandable_segments:True,\
             roundup_power2_divisions:4,max_non_split_rounding_mb:64,release_lock_on_cudamalloc:True",
        )
        .unwrap();
        assert_eq!(c.max_split_size, 128 * MIB);
        assert_eq!(c.garbage_collection_threshold, 0.6);
        assert!(c.expandable_segments);
        assert_eq!(c.roundup_power2_divisions, [4; 16]);
        assert_eq!(c.max_non_split_rounding_size, 64 * MIB);
        assert!(c.release_lock_on_cudamalloc);
    }

    #[test]
    fn division_list_fills_below_first_and_after_last() {
        let c = AllocatorConfig::parse("roundup_power2_divisions:[64:8,256:4,1024:4,>:1]").unwrap();
        let d = c.roundup_power2_divisions;
        assert_eq!(&d[..7], &[8; 7]); // 64 MiB is index 6; the first pair fills below it
        assert_eq!(d[7], 0);
        assert_eq!(d[8], 4);
        assert_eq!(d[9], 0);
        assert_eq!(d[10], 4);
        assert_eq!(&d[11..], &[1; 5]);
        assert_eq!(c.divisions_for(100 * MIB), 8); // [64, 128) MiB is the 64 MiB entry
        assert_eq!(c.divisions_for(200 * MIB), 0);
        assert_eq!(c.divisions_for(300 * MIB), 4);
        assert_eq!(c.divisions_for(1000), 8);
    }

    #[test]
    fn large_segment_size_resets_rounding_tolerance_whatever_the_order() {
        let c = AllocatorConfig::parse("max_split_size_mb:40,large_segment_size_mb:32").unwrap();
        assert_eq!(c.large_segment_size, 32 * MIB);
        assert_eq!(c.max_non_split_rounding_size, 32 * MIB);
        assert_eq!(c.max_split_size, 40 * MIB);
        let e = AllocatorConfig::parse("max_split_size_mb:24,large_segment_size_mb:32").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("max_split_size_mb"));
    }

    #[test]
    fn rejects_bad_input_with_the_key_named() {
        for (s, key) in [
            ("max_split_size_mb:10", "max_split_size_mb"),
            ("expandable_segments:true", "expandable_segments"),
            ("garbage_collection_threshold:1.0", "garbage_collection_threshold"),
            ("roundup_power2_divisions:3", "roundup_power2_divisions"),
            ("roundup_power2_divisions:[100:4]", "roundup_power2_divisions"),
            ("no_such_key:1", "no_such_key"),
            ("backend:magic", "backend"),
            ("max_split_size_mb", "max_split_size_mb"),
            ("max_split_size_mb:-5", "max_split_size_mb"),
            ("large_segment_size_mb:17592186044416", "large_segment_size_mb"),
            ("large_segment_size_mb:18446744073709551615", "large_segment_size_mb"),
            ("large_segment_size_mb:21,expandable_segments:True", "large_segment_size_mb"),
            ("expandable_segments:True,large_segment_size_mb:17592186044417", "large_segment_size_mb"),
        ] {
            let e = AllocatorConfig::parse(s).unwrap_err();
            assert_eq!(e.key.as_deref(), Some(key), "{s}: {e}");
        }
    }

    #[test]
    fn large_segments_up_to_the_largest_size_and_whole_pages_when_expandable() {
        let c = AllocatorConfig::parse("large_segment_size_mb:17592186044415").unwrap();
        assert_eq!(c.large_segment_size, u64::MAX / MIB * MIB);
        let c = AllocatorConfig::parse("large_segment_size_mb:22,expandable_segments:True").unwrap();
        assert_eq!(c.large_segment_size, 22 * MIB);
        assert!(AllocatorConfig::parse("large_segment_size_mb:21").is_ok(), "odd sizes are fine without pages");
    }

    #[test]
    fn keys_that_do_not_change_device_decisions_are_named() {
        let c = AllocatorConfig::parse(
            "release_lock_on_cudamalloc:True,roundup_power2_divisions:[256:4,>:1],pinned_num_register_threads:8,\
             expandable_segments:True,pinned_use_cuda_host_register:True",
        )
        .unwrap();
        assert_eq!(
            c.keys_without_effect(),
            ["release_lock_on_cudamalloc", "pinned_num_register_threads", "pinned_use_cuda_host_register"]
        );
        assert!(AllocatorConfig::parse("expandable_segments:True").unwrap().keys_without_effect().is_empty());
    }

    #[test]
    fn apply_resets_the_keys_pytorch_resets_and_keeps_the_rest() {
        let mut c = AllocatorConfig::parse("max_split_size_mb:64,expandable_segments:True").unwrap();
        c.apply("garbage_collection_threshold:0.5").unwrap();
        assert_eq!(c.max_split_size, u64::MAX);
        assert!(c.expandable_segments);
        let before = c.clone();
        assert!(c.apply("expandable_segments:maybe").is_err());
        assert_eq!(c, before);
    }
}
