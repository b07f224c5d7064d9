//! `HeadroomPolicy`: headroom's recommended policy. Expandable segments for
//! every pool, and one rule PyTorch lacks: reserved memory does not grow
//! past its high-water mark while whole free pages sit mapped elsewhere.
//!
//! With expandable segments, a request that no free block fits maps new
//! pages at the end of the reservation even when the blocks freed in the
//! middle add up to far more than it needs: their pages stay mapped until a
//! flush. Under this policy a request that would raise the peak first
//! unmaps whole free pages (largest free blocks first, as many bytes as the
//! request) and maps its own from what that gave back, so the peak tracks
//! the pages that hold live bytes. Below the peak nothing changes, which
//! keeps steady-state steps free of device calls.

use super::{Policy, Rung};
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

    fn configure(&self, config: &mut AllocatorConfig) {
        config.expandable_segments = true;
    }
}
