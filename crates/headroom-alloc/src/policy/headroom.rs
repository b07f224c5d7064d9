//! `HeadroomPolicy`: headroom's recommended policy. Expandable segments for
//! every pool with 2 MiB pages, and rules PyTorch lacks, under one promise:
//! no more reserved memory than PyTorch's expandable segments, and no more
//! than a quarter more device calls (maps and unmaps), on the real traces.
//!
//! The rule that keeps the promise: **what the policy gives back is paid for
//! by what the run will not take again.** Climbing past the peak, growth maps
//! what PyTorch's expandable segments map (the pages the request lacks, in
//! whole steps of its page size, [`HeadroomPolicy::climb_ahead`]), so growth
//! costs the calls theirs costs. Giving free pages back before the peak grows
//! ([`Rung::ReclaimFreePages`]) costs an unmap now and a map when the run
//! takes the pages again, so it is done only where it replaces growth
//! outright ([`HeadroomPolicy::reclaim_rule`]): with whole large pages of the
//! request's own pool and stream, which the request takes again at once (no
//! other pool's, which that pool maps again at its next request), only when
//! they cover all the growth (partial reclaims, measured, lowered the peak
//! where they ran but moved later blocks above expandable's peak on more
//! traces: docs/PERFORMANCE.md), and at most one unmap per 16 device
//! allocations. The unmaps are then at most a sixteenth of the calls growth
//! made, whatever the trace, and each saves the map growth past the peak
//! would have made.
//!
//! Why give back at all: with expandable segments, a request that no free
//! block fits maps new pages at the end of the reservation even when the
//! blocks freed in the middle add up to far more than it needs: their pages
//! stay mapped until a flush. Under this policy such a request, where the
//! rule allows, first unmaps whole free pages (largest free blocks first, as
//! many bytes as it would map) and maps its own from what that gave back.
//! Below the peak nothing changes, which keeps steady-state steps free of
//! device calls.
//!
//! But not the pages the run maps again. Where a run repeats, the pages one
//! moment of a step gives back are the pages another moment maps again: two
//! device calls a step, each a driver call that can synchronise, to hold the
//! peak a page or two lower. Pages mapped again after a reclaim are kept
//! ([`HeadroomPolicy::keep_budget`]): growth passes the peak instead, by at
//! most 1/32 of it in all; past that they go back as any other. The same
//! budget keeps a small-pool page the run maps again from taking the large
//! pool's free pages when it is wanted back at the peak (where a quarter of
//! reserved memory is free): those are another moment's of the same step.
//!
//! Device calls are batched where that costs no peak: below the peak growth
//! maps a quarter of the room left under it ([`HeadroomPolicy::map_ahead`]),
//! and while reserved memory climbs with nothing to give back, a request's
//! own pages are mapped in physical allocations of 20 MiB
//! ([`HeadroomPolicy::allocation_size`]).
//!
//! A segment grows where the fewest new pages are needed
//! ([`ExpandableFit::LeastGrowth`]), the end of an unmapped range that a free
//! block follows included: PyTorch grows at the lowest address and maps from
//! the front, which can leave most of a large free block cached beside the
//! pages it just mapped.
//!
//! [`TightPolicy`] gives back any whole free page of any pool before the peak
//! grows, as often as the peak needs, without keeping and batching, and
//! climbs 1/1024 of reserved memory at a time: the lowest peak, paid for in
//! device calls every step of a run that repeats (headroom's policy before
//! issue 31).

use super::{ExpandableFit, Policy, ReclaimRule, Rung};
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

    /// See the module documentation: whole large pages of the request's own
    /// pool and stream, all the growth or nothing, one unmap per 16 device
    /// allocations, and growth in whole steps after it as before.
    fn reclaim_rule(&self, config: &AllocatorConfig) -> ReclaimRule {
        ReclaimRule {
            own_pool_only: true,
            min_run: crate::sizing::expandable_page_size(config, PoolKind::Large),
            all_or_nothing: true,
            allocations_per_unmap: ALLOCATIONS_PER_UNMAP,
            map_ahead_after: true,
        }
    }

    /// The driver's 2 MiB mapping granularity in both pools: a large block
    /// then strands less than 2 MiB of a partly used page, not up to 20 MiB.
    /// More pages need not cost more device calls: one call maps a whole range.
    fn page_size(&self, _config: &AllocatorConfig, _pool: PoolKind) -> u64 {
        crate::config::SMALL_BUFFER
    }

    /// Below the peak, growth maps a quarter of the room left under it, and
    /// at least whole steps of PyTorch's page sizes (20 MiB in the large
    /// pool): that memory costs no peak, and the requests after it find it
    /// mapped, so a run that fills the room again after a reclaim (a step
    /// that maps its activations layer by layer) does it in a few device
    /// calls, each taking a quarter of what is left, not one per request.
    fn map_ahead(&self, config: &AllocatorConfig, pool: PoolKind, size: u64, room: u64) -> u64 {
        let page = crate::config::SMALL_BUFFER;
        size.next_multiple_of(crate::sizing::expandable_page_size(config, pool))
            .max((size + room / MAP_AHEAD_ROOM_DIVISOR).next_multiple_of(page))
    }

    /// Climbing past the peak, map the pages a request lacks in whole steps of
    /// PyTorch's page size (20 MiB in the large pool, 2 MiB in the small), as
    /// its expandable segments do: growth then costs the device calls theirs
    /// costs, and leaves no more mapped above the request than theirs.
    fn climb_ahead(&self, config: &AllocatorConfig, pool: PoolKind, _reserved: u64) -> u64 {
        crate::sizing::expandable_page_size(config, pool)
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
    /// a map a step for them, for a peak at most 3% higher than giving them
    /// back would hold; beyond that the low peak wins.
    fn keep_budget(&self, peak: u64) -> u64 {
        peak / KEEP_BUDGET_DIVISOR
    }

    /// While reserved memory climbs with nothing to give back (the first
    /// steps of a run), the request's own whole pages in physical allocations
    /// of PyTorch's large page, 20 MiB: a device call costs per allocation,
    /// so a block then maps in a tenth of the calls' time, as PyTorch's own
    /// expandable segments map it. At the peak and below, one allocation per
    /// page: there the reclaim must be free to give back any whole free page,
    /// and a block on part of a larger allocation would hold all of it.
    fn allocation_size(&self, config: &AllocatorConfig, pool: PoolKind, climbing: bool) -> u64 {
        if climbing {
            crate::sizing::expandable_page_size(config, pool)
        } else {
            self.page_size(config, pool)
        }
    }
}

/// See [`HeadroomPolicy::keep_budget`].
const KEEP_BUDGET_DIVISOR: u64 = 32;

/// See [`HeadroomPolicy::reclaim_rule`]: unmaps stay within 1/16 of the
/// device allocations, so giving back costs at most 1/16 more calls than
/// growth, and a map taken again for each at most 1/8.
const ALLOCATIONS_PER_UNMAP: u64 = 16;

/// See [`HeadroomPolicy::map_ahead`].
const MAP_AHEAD_ROOM_DIVISOR: u64 = 4;

/// `headroom`'s decisions with every free page given back before the peak
/// grows, nothing mapped ahead under the peak past PyTorch's page sizes, and
/// a physical allocation per page: the lowest peak of the two, and device
/// calls every step where a run maps again what it gave back. See the module
/// documentation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TightPolicy;

impl Policy for TightPolicy {
    fn ladder(&self) -> &[Rung] {
        HeadroomPolicy.ladder()
    }
    fn page_size(&self, config: &AllocatorConfig, pool: PoolKind) -> u64 {
        HeadroomPolicy.page_size(config, pool)
    }
    /// Whole steps of PyTorch's page sizes below the peak, no more.
    fn map_ahead(&self, config: &AllocatorConfig, pool: PoolKind, size: u64, _room: u64) -> u64 {
        size.next_multiple_of(crate::sizing::expandable_page_size(config, pool))
    }
    /// 1/1024 of what is reserved (at most PyTorch's page size): the pages left
    /// unused at the top stay under 0.1% of reserved memory.
    fn climb_ahead(&self, config: &AllocatorConfig, pool: PoolKind, reserved: u64) -> u64 {
        let page = crate::config::SMALL_BUFFER;
        (reserved / 1024).next_multiple_of(page).min(crate::sizing::expandable_page_size(config, pool))
    }
    fn expandable_fit(&self) -> ExpandableFit {
        HeadroomPolicy.expandable_fit()
    }
    fn configure(&self, config: &mut AllocatorConfig) {
        HeadroomPolicy.configure(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn map_ahead_takes_a_quarter_of_the_room_under_the_peak() {
        let c = AllocatorConfig::default();
        // No room: PyTorch's 20 MiB steps in the large pool, 2 MiB in the small.
        assert_eq!(HeadroomPolicy.map_ahead(&c, PoolKind::Large, 3 * MIB, 0), 20 * MIB);
        assert_eq!(HeadroomPolicy.map_ahead(&c, PoolKind::Small, MIB, 0), 2 * MIB);
        // 1 GiB of room: the request and a quarter of it, in whole pages.
        assert_eq!(HeadroomPolicy.map_ahead(&c, PoolKind::Large, 3 * MIB, 1024 * MIB), 260 * MIB);
        assert_eq!(HeadroomPolicy.map_ahead(&c, PoolKind::Small, MIB, 1024 * MIB), 258 * MIB);
        assert_eq!(TightPolicy.map_ahead(&c, PoolKind::Large, 3 * MIB, 1024 * MIB), 20 * MIB);
    }

    #[test]
    fn large_allocations_only_while_climbing() {
        let c = AllocatorConfig::default();
        assert_eq!(HeadroomPolicy.allocation_size(&c, PoolKind::Large, true), 20 * MIB);
        assert_eq!(HeadroomPolicy.allocation_size(&c, PoolKind::Large, false), 2 * MIB);
        assert_eq!(TightPolicy.allocation_size(&c, PoolKind::Large, true), 2 * MIB);
        assert_eq!(HeadroomPolicy.keep_budget(64 * MIB), 2 * MIB);
        assert_eq!(TightPolicy.keep_budget(64 * MIB), 0);
    }
}
