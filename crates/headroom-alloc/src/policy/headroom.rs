//! `HeadroomPolicy`: headroom's recommended policy. Expandable segments for
//! every pool with 2 MiB pages, and two rules PyTorch lacks.
//!
//! Reserved memory does not grow past its high-water mark while whole free
//! pages sit mapped elsewhere. With expandable segments, a request that no
//! free block fits maps new pages at the end of the reservation even when
//! the blocks freed in the middle add up to far more than it needs: their
//! pages stay mapped until a flush. Under this policy a request that would
//! raise the peak first unmaps whole free pages (largest free blocks first,
//! as many bytes as it would map) and maps its own from what that gave back,
//! so the peak tracks the pages that hold live bytes. Below the peak nothing
//! changes, which keeps steady-state steps free of device calls.
//!
//! A segment grows where the fewest new pages are needed
//! ([`ExpandableFit::LeastGrowth`]), the end of an unmapped range that a free
//! block follows included: PyTorch grows at the lowest address and maps from
//! the front, which can leave most of a large free block cached beside the
//! pages it just mapped.

use super::{ExpandableFit, Policy, Rung};
use crate::config::AllocatorConfig;
use crate::stats::PoolKind;

/// See the module documentation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeadroomPolicy;

const HEADROOM_LADDER: [Rung; 6] = [
    Rung::CollectGarbage,
    Rung::AllocateUnderPeak,
    Rung::ReclaimFreePages,
    Rung::Allocate,
    Rung::ReleaseOversizeThenAllocate,
    Rung::FlushThenAllocate,
];

impl Policy for HeadroomPolicy {
    fn ladder(&self) -> &[Rung] {
        &HEADROOM_LADDER
    }

    /// The driver's 2 MiB mapping granularity in both pools: a large block
    /// then strands less than 2 MiB of a partly used page, not up to 20 MiB.
    /// More pages cost no more device calls here: one call maps a whole range.
    fn page_size(&self, _config: &AllocatorConfig, _pool: PoolKind) -> u64 {
        crate::config::SMALL_BUFFER
    }

    /// Below the peak, growth in PyTorch's page sizes (20 MiB in the large
    /// pool): those pages cost no peak and spare the next requests a device
    /// call. Growth that raises the peak maps only the pages the request needs.
    fn map_ahead(&self, config: &AllocatorConfig, pool: PoolKind) -> u64 {
        crate::sizing::expandable_page_size(config, pool)
    }

    /// Climbing past the peak with nothing to reuse, map ahead by 1/1024 of
    /// what is reserved (at most PyTorch's page size): the pages left unused
    /// at the top stay under 0.1% of reserved memory, and a run that climbs
    /// through many small requests does not pay a device call for each.
    fn climb_ahead(&self, config: &AllocatorConfig, pool: PoolKind, reserved: u64) -> u64 {
        let page = crate::config::SMALL_BUFFER;
        (reserved / 1024).next_multiple_of(page).min(crate::sizing::expandable_page_size(config, pool))
    }

    /// Grow where the fewest new pages are needed: a request that fits in a
    /// free block with unmapped space after it should not map a fresh range
    /// elsewhere and leave that block cached.
    fn expandable_fit(&self) -> ExpandableFit {
        ExpandableFit::LeastGrowth
    }

    fn configure(&self, config: &mut AllocatorConfig) {
        config.expandable_segments = true;
    }

    /// Up to 1/32 of the peak: a run that keeps mapping the same pages again
    /// after each reclaim (a training step's) then stops paying an unmap and
    /// a map a step for them, for a peak at most 3% higher; beyond that the
    /// low peak wins.
    fn keep_budget(&self, peak: u64) -> u64 {
        peak / KEEP_BUDGET_DIVISOR
    }
}

/// See [`HeadroomPolicy::keep_budget`].
const KEEP_BUDGET_DIVISOR: u64 = 32;
