//! `torch.cuda.memory_summary()` text, character for character.

use crate::stats::{DeviceStats, Stat, StatArray};

const WIDTH: usize = 75;

/// Divides `value` by `step` while the column's reference value `pref` (the
/// "all" row's) stays at or above `threshold`, as PyTorch's `_format_size`
/// and `_format_count` do; returns the value and its unit.
fn scaled(mut value: i64, pref: i64, units: &[&'static str], threshold: f64, step: i64) -> (i64, &'static str) {
    let mut unit = units[0];
    let mut pref = pref as f64;
    for u in &units[1..] {
        if pref < threshold {
            break;
        }
        unit = u;
        value = value.div_euclid(step);
        pref /= step as f64;
    }
    (value, unit)
}

/// PyTorch's `_format_size`.
fn format_size(value: i64, pref: i64) -> String {
    let (v, unit) = scaled(value, pref, &["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"], 768.0 * 1024.0, 1024);
    format!("{v:6} {unit}")
}

/// PyTorch's `_format_count`.
fn format_count(value: i64, pref: i64) -> String {
    let (v, unit) = scaled(value, pref, &[" ", "K", "M"], 750.0 * 1000.0, 1000);
    format!("{v:7} {unit} ")
}

type Formatter = fn(i64, i64) -> String;

fn row(name: &str, s: &Stat, pref: &Stat, f: Formatter) -> String {
    format!(
        " {name:<21} | {} | {} | {} | {} ",
        f(s.current, pref.current),
        f(s.peak, pref.peak),
        f(s.allocated, pref.allocated),
        f(s.freed, pref.freed)
    )
}

/// The text `torch.cuda.memory_summary(device, abbreviated)` prints for these stats.
pub fn memory_summary(stats: &DeviceStats, device: u32, abbreviated: bool) -> String {
    let metrics: [(&StatArray, &str, Formatter); 9] = [
        (&stats.allocated_bytes, "Allocated memory", format_size),
        (&stats.active_bytes, "Active memory", format_size),
        (&stats.requested_bytes, "Requested memory", format_size),
        (&stats.reserved_bytes, "GPU reserved memory", format_size),
        (&stats.inactive_split_bytes, "Non-releasable memory", format_size),
        (&stats.allocation, "Allocations", format_count),
        (&stats.active, "Active allocs", format_count),
        (&stats.segment, "GPU reserved segments", format_count),
        (&stats.inactive_split, "Non-releasable allocs", format_count),
    ];
    let mut lines = vec![
        "=".repeat(WIDTH),
        format!(" {:16} PyTorch CUDA memory summary, device ID {device:<17} ", ""),
        "-".repeat(WIDTH),
        format!(
            "  {:9} CUDA OOMs: {:<12} | {:6} cudaMalloc retries: {:<8}  ",
            "", stats.num_ooms, "", stats.num_alloc_retries
        ),
        "=".repeat(WIDTH),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string(),
    ];
    for (array, name, f) in metrics {
        lines.push("-".repeat(WIDTH));
        let all = array.all();
        lines.push(row(name, &all, &all, f));
        if !abbreviated {
            lines.push(row("      from large pool", &array.large_pool(), &all, f));
            lines.push(row("      from small pool", &array.small_pool(), &all, f));
        }
    }
    for (s, name) in
        [(&stats.oversize_allocations, "Oversize allocations"), (&stats.oversize_segments, "Oversize GPU segments")]
    {
        lines.push("-".repeat(WIDTH));
        lines.push(row(name, s, s, format_count));
    }
    lines.push("=".repeat(WIDTH));
    format!("|{}|\n", lines.join("|\n|"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::PoolKind;

    #[test]
    fn every_line_is_75_wide_and_units_follow_the_all_row() {
        let mut s = DeviceStats::default();
        crate::stats::increase(&mut s.allocated_bytes, PoolKind::Large, 3 * 1024 * 1024 * 1024);
        crate::stats::increase(&mut s.allocated_bytes, PoolKind::Small, 512);
        crate::stats::increase(&mut s.allocation, PoolKind::Small, 800_000);
        let text = memory_summary(&s, 0, false);
        for line in text.lines() {
            assert_eq!(line.chars().count(), WIDTH + 2, "{line:?}");
        }
        assert!(text.contains("| Allocated memory      |   3072 MiB |   3072 MiB |   3072 MiB |      0 B   |"));
        // 512 bytes in the small pool print as 0 MiB because the unit is the "all" row's.
        assert!(text.contains("|       from small pool |      0 MiB |"));
        assert!(text.contains("| Allocations           |     800 K  |"));
        assert!(text.contains("PyTorch CUDA memory summary, device ID 0"));
        assert_eq!(memory_summary(&s, 0, true).lines().count(), 6 + 9 * 2 + 2 * 2 + 1);
    }
}
