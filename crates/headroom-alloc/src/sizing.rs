//! PyTorch's sizing policy: how a request is rounded, which pool serves it,
//! how large a new segment is, and whether a found block is split.
//! Pure functions of the request and the configuration.

use crate::config::{AllocatorConfig, MIN_BLOCK_SIZE, MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE};
use crate::stats::PoolKind;

/// Requests of 1 EB or more are refused outright, as PyTorch refuses them.
pub(crate) const ONE_EXABYTE: u64 = 1 << 60;

/// `round_size`: at least 512 bytes; a multiple of 512, or of the
/// power-of-two division step where `roundup_power2_divisions` applies.
#[inline]
pub fn round_size(cfg: &AllocatorConfig, size: u64) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let divisions = cfg.divisions_for(size);
    if divisions > 1 && size > MIN_BLOCK_SIZE * divisions {
        roundup_power2_next_division(size, divisions)
    } else {
        size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
    }
}

/// Rounds `size` up to the next of `divisions` equal steps between the
/// powers of two around it (1200 with 4 divisions: steps of 256 from 1024 → 1280).
pub fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor2 = 1u64 << (63 - size.leading_zeros());
    let step = floor2 >> divisions.trailing_zeros();
    if step == 0 {
        return floor2 << 1;
    }
    size.div_ceil(step) * step
}

/// `get_pool`: rounded sizes up to 1 MiB (inclusive) go to the small pool.
pub fn pool_for(rounded: u64) -> PoolKind {
    if rounded <= SMALL_SIZE {
        PoolKind::Small
    } else {
        PoolKind::Large
    }
}

/// `get_allocation_size`: the size of a new segment for a rounded request.
pub fn allocation_size(cfg: &AllocatorConfig, rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        cfg.large_segment_size
    } else {
        rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

/// `should_split`: small-pool blocks (and every block while expandable
/// segments are on) split when at least 512 bytes remain; large blocks only
/// when the request is below `max_split_size` and more than 1 MiB remains —
/// so up to 1 MiB of a large block can be handed out as slack.
pub fn should_split(
    cfg: &AllocatorConfig,
    expandable_active: bool,
    pool: PoolKind,
    block_size: u64,
    rounded: u64,
) -> bool {
    let remaining = block_size - rounded;
    if pool == PoolKind::Small || expandable_active {
        remaining >= MIN_BLOCK_SIZE
    } else {
        rounded < cfg.max_split_size && remaining > SMALL_SIZE
    }
}

/// Page size of an expandable segment in `pool`.
pub fn expandable_page_size(cfg: &AllocatorConfig, pool: PoolKind) -> u64 {
    match pool {
        PoolKind::Small => SMALL_BUFFER,
        PoolKind::Large => cfg.large_segment_size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::MIB;

    #[test]
    fn rounding_examples_from_the_spec() {
        let d = AllocatorConfig::default();
        assert_eq!(round_size(&d, 1), 512);
        assert_eq!(round_size(&d, 513), 1024);
        assert_eq!(round_size(&d, 3_000_000), 3_000_320);
        let c = AllocatorConfig::parse("roundup_power2_divisions:4").unwrap();
        assert_eq!(roundup_power2_next_division(1200, 4), 1280);
        // Only applied above 512 * divisions: 1200 still rounds to 1536.
        assert_eq!(round_size(&c, 1200), 1536);
        assert_eq!(round_size(&c, 3_000_000), 3_145_728);
        assert_eq!(round_size(&c, 4 * MIB), 4 * MIB);
    }

    #[test]
    fn pools_and_segment_sizes() {
        let d = AllocatorConfig::default();
        assert_eq!(pool_for(MIB), PoolKind::Small);
        assert_eq!(pool_for(MIB + 512), PoolKind::Large);
        assert_eq!(allocation_size(&d, 512), 2 * MIB);
        assert_eq!(allocation_size(&d, 3_000_320), 20 * MIB);
        assert_eq!(allocation_size(&d, 12_583_424), 14_680_064);
        assert_eq!(allocation_size(&d, 10 * MIB), 10 * MIB);
    }

    #[test]
    fn split_thresholds() {
        let d = AllocatorConfig::default();
        assert!(should_split(&d, false, PoolKind::Small, 2 * MIB, 2 * MIB - 512));
        assert!(!should_split(&d, false, PoolKind::Small, 1024, 1024 - 511));
        assert!(!should_split(&d, false, PoolKind::Large, 20 * MIB, 19 * MIB));
        assert!(should_split(&d, false, PoolKind::Large, 20 * MIB, 19 * MIB - 512));
        assert!(should_split(&d, true, PoolKind::Large, 20 * MIB, 20 * MIB - 512));
        let c = AllocatorConfig::parse("max_split_size_mb:32").unwrap();
        assert!(!should_split(&c, false, PoolKind::Large, 64 * MIB, 40 * MIB));
    }
}
