//! `Policy`: the choices the caching allocator leaves open, apart from the
//! mechanism that carries them out. The mechanism — pools, best fit, split,
//! merge, events, device calls, statistics — lives in
//! [`crate::DeviceCachingAllocator`]; a policy decides which cached block may
//! serve a request, what to try when none does, which cached segments garbage
//! collection gives back, and in which order a flush empties the pools.
//!
//! [`PyTorchPolicy`] makes PyTorch's choices and is the default. A new
//! policy is a new type beside it, never an edit of the mechanism; the
//! allocator is generic over it, so the choice costs no dynamic call on the
//! malloc path. Policies headroom ships:
//!
//! | name | type | what it changes |
//! |---|---|---|
//! | `pytorch` | [`PyTorchPolicy`] | nothing: PyTorch's decisions, exactly |
//! | `expandable` | [`ExpandablePolicy`] | expandable segments for every pool |
//! | `headroom` | [`HeadroomPolicy`] | expandable segments' growth and device calls, and whole free pages of the request's own pool given back where they replace growth past the peak, within a budget of unmaps |
//! | `tight` | [`TightPolicy`] | `headroom`'s, every free page given back before the peak grows: the lowest peak, for device calls every step |
//! | `lifetime` | [`LifetimePolicy`] | `headroom`'s, with long-lived and short-lived blocks kept apart |
//! | `planned` | [`PlannedPolicy`] | `headroom`'s, and a repeating step's blocks at offsets planned ahead |
//!
//! [`NamedPolicy`] picks one by name at run time (`headroom replay --policy`).
//! A policy sees only what the allocator sees when it decides: the request,
//! the cache and the statistics, never what comes next.
//!
//! A policy may also place a request apart from others of its stream: it maps
//! the request's stream to a *placement stream* ([`Policy::place`]), and the
//! mechanism keeps blocks of different placement streams in different
//! segments and free sets, as it keeps streams apart. Everything the outside
//! sees — traces, snapshots, `record_stream` — carries the request's own
//! stream ([`Policy::stream_of`]).

use crate::config::AllocatorConfig;
use crate::device::StreamId;
use crate::stats::PoolKind;

mod expandable;
mod headroom;
mod lifetime;
mod named;
mod planned;
mod pytorch;

pub use expandable::ExpandablePolicy;
pub use headroom::{HeadroomPolicy, TightPolicy};
pub use lifetime::LifetimePolicy;
pub use named::{NamedPolicy, PolicyName, UnknownPolicy};
pub use planned::PlannedPolicy;
pub use pytorch::PyTorchPolicy;

/// `headroom`'s decisions, for a policy that changes only where requests go
/// ([`LifetimePolicy`], [`PlannedPolicy`]): the body of its `impl Policy` beside its own
/// placement hooks.
macro_rules! headroom_decisions {
    () => {
        #[inline]
        fn may_serve(&self, config: &AllocatorConfig, rounded: u64, block_size: u64) -> bool {
            HeadroomPolicy.may_serve(config, rounded, block_size)
        }
        fn ladder(&self) -> &[Rung] {
            HeadroomPolicy.ladder()
        }
        fn garbage_target(&self, config: &AllocatorConfig, reserved: u64, limit: Option<u64>) -> Option<u64> {
            HeadroomPolicy.garbage_target(config, reserved, limit)
        }
        fn pick_garbage(&self, target: u64, candidates: &[CachedSegment]) -> Vec<usize> {
            HeadroomPolicy.pick_garbage(target, candidates)
        }
        fn flush_order(&self) -> [PoolKind; 2] {
            HeadroomPolicy.flush_order()
        }
        fn page_size(&self, config: &AllocatorConfig, pool: PoolKind) -> u64 {
            HeadroomPolicy.page_size(config, pool)
        }
        fn expandable_fit(&self) -> ExpandableFit {
            HeadroomPolicy.expandable_fit()
        }
        fn map_ahead(&self, config: &AllocatorConfig, pool: PoolKind, size: u64, room: u64) -> u64 {
            HeadroomPolicy.map_ahead(config, pool, size, room)
        }
        fn climb_ahead(&self, config: &AllocatorConfig, pool: PoolKind, reserved: u64) -> u64 {
            HeadroomPolicy.climb_ahead(config, pool, reserved)
        }
        fn configure(&self, config: &mut AllocatorConfig) {
            HeadroomPolicy.configure(config)
        }
        fn keep_budget(&self, peak: u64) -> u64 {
            HeadroomPolicy.keep_budget(peak)
        }
        fn reclaim_rule(&self, config: &AllocatorConfig) -> ReclaimRule {
            HeadroomPolicy.reclaim_rule(config)
        }
        fn allocation_size(&self, config: &AllocatorConfig, pool: PoolKind, climbing: bool) -> u64 {
            HeadroomPolicy.allocation_size(config, pool, climbing)
        }
    };
}
use headroom_decisions;

/// One step of the climb when no cached block serves a request. The first
/// step that finds memory ends the climb; a request that reaches the end is
/// out of memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rung {
    /// Give back aged cached segments, as [`Policy::garbage_target`] and
    /// [`Policy::pick_garbage`] decide. Finds no memory by itself.
    CollectGarbage,
    /// Ask the device for a new segment (or new pages of an expandable one).
    Allocate,
    /// As [`Rung::Allocate`], but only if reserved memory stays at or below
    /// its peak so far: growth that would raise the high-water mark is left
    /// to the rungs after it.
    AllocateUnderPeak,
    /// Unmap whole free pages of the request's expandable segments, largest
    /// free blocks first, until as many bytes as the request are unmapped.
    /// Finds no memory by itself: the device memory it gives back lets the
    /// next rung map pages where the request fits, without raising reserved
    /// memory by more than the request.
    ReclaimFreePages,
    /// Give back cached oversize segments on the request's stream until as
    /// much as the request is released, and if enough was, allocate.
    ReleaseOversizeThenAllocate,
    /// Wait for pending cross-stream frees, give back every unsplit cached
    /// segment, and allocate (counted as a retry).
    FlushThenAllocate,
}

/// Where a request goes ([`Policy::place`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The placement stream.
    pub stream: StreamId,
    /// An exact place in the placement stream's arena, tried before any other.
    pub at: Option<ArenaSlot>,
}

impl Placement {
    /// Anywhere on `stream`.
    pub fn stream(stream: StreamId) -> Self {
        Placement { stream, at: None }
    }
}

/// A place in a placement stream's arena: its first expandable reservation in the
/// request's pool, `arena` bytes long. The request takes the bytes `offset` bytes in, if
/// nothing holds them (the mechanism maps their pages as growth would), and goes anywhere
/// on its own stream if something does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaSlot {
    pub offset: u64,
    pub arena: u64,
}

/// Where an expandable segment grows when several places have room for a
/// request: free space followed by unmapped space, or unmapped space alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpandableFit {
    /// The lowest address (PyTorch's `find_expandable_block`).
    LowestAddress,
    /// Where the fewest new pages must be mapped (ties: the lowest address).
    LeastGrowth,
}

/// What the ladder's reclaim ([`Rung::ReclaimFreePages`]) may give back.
///
/// Giving a page back is an unmap now and, if the run takes it again, a map
/// later: device calls that expandable segments, which never give back
/// before a flush, do not make. The rule bounds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReclaimRule {
    /// Only free pages of the request's own pool and stream: the pages its
    /// growth would otherwise map on top of, not another pool's, which that
    /// pool takes again at its next request.
    pub own_pool_only: bool,
    /// Free runs shorter than this stay mapped.
    pub min_run: u64,
    /// Give back nothing unless the runs given back cover all the growth the
    /// request needs: the request then maps its pages where the reclaim made
    /// room, instead of part there and part past the peak.
    pub all_or_nothing: bool,
    /// At most one unmap for every this many device allocations made so far
    /// (0: no bound).
    pub allocations_per_unmap: u64,
    /// After a reclaim, growth past the peak still maps ahead in whole steps
    /// of [`Policy::climb_ahead`].
    pub map_ahead_after: bool,
}

impl ReclaimRule {
    /// Any whole free page, as often as the peak needs: `tight`'s.
    pub const ANY: ReclaimRule = ReclaimRule {
        own_pool_only: false,
        min_run: 0,
        all_or_nothing: false,
        allocations_per_unmap: 0,
        map_ahead_after: false,
    };
}

/// An unsplit cached segment that garbage collection could give back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedSegment {
    pub size: u64,
    /// Searches of the pool since the segment was last freed.
    pub age: u64,
}

/// The allocator's open choices. See the module documentation. Every
/// choice defaults to PyTorch's, so a policy states only what it changes.
pub trait Policy: Send {
    /// Whether a free cached block of `block_size` bytes may serve a rounded
    /// request of `rounded` bytes. Only blocks at least `rounded` large are asked.
    #[inline]
    fn may_serve(&self, config: &AllocatorConfig, rounded: u64, block_size: u64) -> bool {
        PyTorchPolicy.may_serve(config, rounded, block_size)
    }

    /// What to try, in order, when no cached block serves a request.
    fn ladder(&self) -> &[Rung] {
        PyTorchPolicy.ladder()
    }

    /// Bytes garbage collection should reclaim now, or `None` for none.
    /// `limit` is the per-process memory limit, when a fraction is set.
    fn garbage_target(&self, config: &AllocatorConfig, reserved: u64, limit: Option<u64>) -> Option<u64> {
        PyTorchPolicy.garbage_target(config, reserved, limit)
    }

    /// Which of `candidates` (the cached large-pool segments, in free-set
    /// order) to give back to reclaim `target` bytes, in release order, as
    /// indices into `candidates`.
    fn pick_garbage(&self, target: u64, candidates: &[CachedSegment]) -> Vec<usize> {
        PyTorchPolicy.pick_garbage(target, candidates)
    }

    /// The order in which a flush (`empty_cache`, the ladder's last rung) empties the pools.
    fn flush_order(&self) -> [PoolKind; 2] {
        PyTorchPolicy.flush_order()
    }

    /// The page of a new expandable segment of `pool`: the unit it maps and
    /// unmaps. PyTorch's: 2 MiB in the small pool, `large_segment_size` in the large.
    fn page_size(&self, config: &AllocatorConfig, pool: PoolKind) -> u64 {
        crate::sizing::expandable_page_size(config, pool)
    }

    /// Where an expandable segment grows; see [`ExpandableFit`].
    fn expandable_fit(&self) -> ExpandableFit {
        ExpandableFit::LowestAddress
    }

    /// Under [`Rung::AllocateUnderPeak`], the bytes growth of an expandable
    /// segment maps for a rounded request of `size` bytes, `room` bytes being
    /// left under the peak: mapping ahead lets the requests after it find
    /// their pages mapped, one device call for many. The mechanism maps whole
    /// pages, and only the request's where this would pass the peak. `size`
    /// by default: no mapping ahead.
    fn map_ahead(&self, _config: &AllocatorConfig, _pool: PoolKind, size: u64, _room: u64) -> u64 {
        size
    }

    /// When growth raises reserved memory past its peak and the ladder
    /// found no free page to reuse ([`Rung::ReclaimFreePages`] reclaimed
    /// nothing), it maps whole multiples of this many bytes; `reserved` is the
    /// memory reserved now. The page size by default: no mapping ahead.
    fn climb_ahead(&self, config: &AllocatorConfig, pool: PoolKind, _reserved: u64) -> u64 {
        self.page_size(config, pool)
    }

    /// How far growth may pass the peak (`peak` bytes reserved at most so
    /// far), in all, rather than reclaim the free pages the run kept mapping
    /// again after earlier reclaims ([`Rung::ReclaimFreePages`]): each such
    /// reclaim costs an unmap now and a map when the run wants them back.
    /// Past the budget the reclaim gives them back as it gives back any
    /// other, so the peak is at most this much above what reclaiming
    /// everything would hold it to at that point. 0 by default: reclaim
    /// whatever the peak needs.
    fn keep_budget(&self, _peak: u64) -> u64 {
        0
    }

    /// The largest physical allocation (one `cuMemCreate`) growth makes of the
    /// whole pages inside the request it grows for; `climbing` when reserved
    /// memory passes its peak and the ladder gave no page back. A device call
    /// costs per allocation, not per byte, so larger allocations map a large
    /// block in fewer calls' time; but an allocation is unmapped whole or not
    /// at all, so its pages can be given back only once every block on them
    /// is free. Pages the request shares with other blocks, or maps ahead for
    /// them, are one allocation apiece whatever this says. The page by
    /// default: one allocation per page, as PyTorch maps them.
    fn allocation_size(&self, config: &AllocatorConfig, pool: PoolKind, _climbing: bool) -> u64 {
        self.page_size(config, pool)
    }

    /// Which free pages [`Rung::ReclaimFreePages`] may give back, and how
    /// often; see [`ReclaimRule`]. Any whole free page, by default.
    fn reclaim_rule(&self, _config: &AllocatorConfig) -> ReclaimRule {
        ReclaimRule::ANY
    }

    /// Settings the policy relies on, applied over the user's when the
    /// allocator starts and whenever settings change at run time.
    fn configure(&self, _config: &mut AllocatorConfig) {}

    /// Where a rounded request of `rounded` bytes on `stream` goes: its placement stream
    /// (the blocks that may serve it and the segments it may grow are that stream's), and
    /// optionally an exact place in that stream's arena. The request's own stream, anywhere
    /// in it, by default.
    #[inline]
    fn place(&mut self, _rounded: u64, stream: StreamId) -> Placement {
        Placement::stream(stream)
    }

    /// The request's stream behind a placement stream [`Policy::place`] returned.
    #[inline]
    fn stream_of(&self, placement: StreamId) -> StreamId {
        placement
    }

    /// A block of `size` bytes was handed out at `ptr`, on placement stream `placed` (the
    /// caller's own when the place [`Policy::place`] asked for could not be had).
    #[inline]
    fn on_alloc(&mut self, _ptr: u64, _size: u64, _placed: StreamId) {}

    /// The block at `ptr` was freed (its memory may still wait for other streams).
    #[inline]
    fn on_free(&mut self, _ptr: u64) {}
}
