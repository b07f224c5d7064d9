//! `PyTorchPolicy`: the choices `c10/cuda/CUDACachingAllocator.cpp` makes.

use super::{CachedSegment, Policy, Rung};
use crate::config::AllocatorConfig;
use crate::stats::PoolKind;

/// PyTorch's choices (`c10/cuda/CUDACachingAllocator.cpp`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyTorchPolicy;

/// `malloc`'s climb: `garbage_collect_cached_blocks` (a no-op without a
/// fraction and a threshold), `alloc_block`, `release_available_cached_blocks`
/// and `alloc_block`, `release_cached_blocks` and `alloc_block` as a retry.
const PYTORCH_LADDER: [Rung; 4] =
    [Rung::CollectGarbage, Rung::Allocate, Rung::ReleaseOversizeThenAllocate, Rung::FlushThenAllocate];

impl Policy for PyTorchPolicy {
    /// The oversize rule: blocks of `max_split_size` or more serve only
    /// requests of at least that size, and at most `max_non_split_rounding_size`
    /// larger than them; smaller requests take smaller blocks only.
    #[inline]
    fn may_serve(&self, config: &AllocatorConfig, rounded: u64, block_size: u64) -> bool {
        if rounded < config.max_split_size {
            block_size < config.max_split_size
        } else {
            block_size < rounded.saturating_add(config.max_non_split_rounding_size)
        }
    }

    fn ladder(&self) -> &[Rung] {
        &PYTORCH_LADDER
    }

    /// Above `garbage_collection_threshold` of the limit, what lies above it.
    fn garbage_target(&self, config: &AllocatorConfig, reserved: u64, limit: Option<u64>) -> Option<u64> {
        let allowed = limit?;
        if config.garbage_collection_threshold <= 0.0 {
            return None;
        }
        let threshold = (config.garbage_collection_threshold * allowed as f64) as u64;
        (reserved > threshold).then(|| reserved - threshold)
    }

    /// Pass after pass, every segment at least as old as the average age of
    /// those left, until the target is reclaimed or a pass frees nothing.
    fn pick_garbage(&self, target: u64, candidates: &[CachedSegment]) -> Vec<usize> {
        let mut taken = vec![false; candidates.len()];
        let mut order = Vec::new();
        let mut total_age: u64 = candidates.iter().map(|c| c.age).sum();
        let mut count = candidates.len() as u64;
        let mut reclaimed = 0u64;
        let mut freed_any = true;
        while reclaimed < target && freed_any && count > 0 {
            let threshold = total_age as f64 / count as f64;
            freed_any = false;
            for (i, c) in candidates.iter().enumerate() {
                if !taken[i] && c.age as f64 >= threshold {
                    taken[i] = true;
                    order.push(i);
                    freed_any = true;
                    reclaimed += c.size;
                    total_age -= c.age;
                    count -= 1;
                }
            }
        }
        order
    }

    /// The large pool first, then the small one, which is the order recorded traces show.
    fn flush_order(&self) -> [PoolKind; 2] {
        [PoolKind::Large, PoolKind::Small]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AllocatorConfig;
    use crate::units::MIB;

    #[test]
    fn oversize_blocks_serve_only_requests_close_to_their_size() {
        let cfg = AllocatorConfig::parse("max_split_size_mb:40,max_non_split_rounding_mb:32").unwrap();
        let p = PyTorchPolicy;
        assert!(p.may_serve(&cfg, 10 * MIB, 30 * MIB));
        assert!(!p.may_serve(&cfg, 10 * MIB, 50 * MIB), "a small request never takes an oversize block");
        assert!(p.may_serve(&cfg, 50 * MIB, 80 * MIB));
        assert!(!p.may_serve(&cfg, 50 * MIB, 82 * MIB), "more than the rounding larger");
    }

    #[test]
    fn garbage_collection_takes_the_oldest_first_pass_by_pass() {
        let seg = |size, age| CachedSegment { size, age };
        let c = [seg(10, 1), seg(20, 9), seg(30, 5), seg(40, 2)];
        // Average age 4.25: the 9 and the 5 go, reclaiming 50.
        assert_eq!(PyTorchPolicy.pick_garbage(40, &c), vec![1, 2]);
        // Not enough: the next pass (average 1.5) takes the 2.
        assert_eq!(PyTorchPolicy.pick_garbage(60, &c), vec![1, 2, 3]);
        let cfg = AllocatorConfig::parse("garbage_collection_threshold:0.5").unwrap();
        assert_eq!(PyTorchPolicy.garbage_target(&cfg, 70, Some(100)), Some(20));
        assert_eq!(PyTorchPolicy.garbage_target(&cfg, 70, None), None);
        assert_eq!(PyTorchPolicy.garbage_target(&cfg, 40, Some(100)), None);
    }
}
