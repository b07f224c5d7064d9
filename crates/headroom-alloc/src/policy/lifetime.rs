//! `LifetimePolicy`: headroom's policy, with the blocks it expects to live long
//! kept apart from those it expects to die young.
//!
//! Short-lived churn (activations, temporaries) that shares segments with
//! long-lived blocks (parameters, optimizer state, caches) leaves free holes
//! between them that only a request of the right size can use. This policy
//! learns, from what it has seen freed, which request sizes live long, and
//! places those requests on a placement stream of their own: their own
//! expandable reservation and free sets, which short-lived requests never
//! touch.
//!
//! What it knows is what an allocator sees: sizes and the order of mallocs
//! and frees. A block's lifetime is counted in allocations made while it
//! lived; one that outlives [`LONG_AFTER`] allocations is long-lived. A size
//! is predicted long-lived when more of its blocks died old than young;
//! everything allocated before the first free (a model being loaded) is
//! long-lived; a size never seen freed is short-lived.
//!
//! Measured on every fixture, this does not beat [`super::HeadroomPolicy`] and
//! so is not part of it (docs/VALIDATION.md, "Allocation policies").

use super::{CachedSegment, ExpandableFit, HeadroomPolicy, Placement, Policy, ReclaimRule, Rung};
use crate::config::AllocatorConfig;
use crate::device::StreamId;
use crate::stats::PoolKind;
use rustc_hash::FxHashMap;

/// A block that outlives this many allocations is long-lived.
pub const LONG_AFTER: u64 = 10_000;

/// The bit that marks the long-lived placement stream of a stream. CUDA streams are
/// user-space pointers or small numbers, which never have it set.
const LONG_LANE: StreamId = 1 << 62;

/// How the blocks of one size died.
#[derive(Clone, Copy, Debug, Default)]
struct Deaths {
    young: u32,
    old: u32,
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct LifetimePolicy {
    /// Blocks that outlive this many allocations are long-lived.
    long_after: u64,
    /// Allocations so far: the clock lifetimes are counted on.
    tick: u64,
    /// Live blocks: the tick each was born at, and its size.
    live: FxHashMap<u64, (u64, u64)>,
    deaths: FxHashMap<u64, Deaths>,
    freed_any: bool,
}

impl Default for LifetimePolicy {
    fn default() -> Self {
        LifetimePolicy::long_after(LONG_AFTER)
    }
}

impl LifetimePolicy {
    /// The policy with blocks that outlive `allocations` allocations taken as long-lived.
    pub fn long_after(allocations: u64) -> Self {
        LifetimePolicy {
            long_after: allocations,
            tick: 0,
            live: FxHashMap::default(),
            deaths: FxHashMap::default(),
            freed_any: false,
        }
    }

    /// Whether a request of `rounded` bytes is expected to live long.
    pub fn predicts_long(&self, rounded: u64) -> bool {
        if !self.freed_any {
            return true;
        }
        self.deaths.get(&rounded).is_some_and(|d| d.old > d.young)
    }
}

impl Policy for LifetimePolicy {
    super::headroom_decisions!();

    fn place(&mut self, rounded: u64, stream: StreamId) -> Placement {
        Placement::stream(if self.predicts_long(rounded) { stream | LONG_LANE } else { stream })
    }

    fn stream_of(&self, placement: StreamId) -> StreamId {
        placement & !LONG_LANE
    }

    fn on_alloc(&mut self, ptr: u64, size: u64, _placed: StreamId) {
        self.live.insert(ptr, (self.tick, size));
        self.tick += 1;
    }

    fn on_free(&mut self, ptr: u64) {
        let Some((born, size)) = self.live.remove(&ptr) else { return };
        self.freed_any = true;
        let d = self.deaths.entry(size).or_default();
        if self.tick - born > self.long_after {
            d.old += 1;
        } else {
            d.young += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::MIB;

    #[test]
    fn sizes_that_died_old_are_placed_apart_and_the_stream_is_kept() {
        let mut p = LifetimePolicy::default();
        // Before any free, everything is long-lived: a model loading.
        assert_eq!(p.place(4 * MIB, 7).stream, 7 | LONG_LANE);
        assert_eq!(p.stream_of(7 | LONG_LANE), 7);
        p.on_alloc(0x1000, 4 * MIB, 0);
        p.on_alloc(0x2000, 2 * MIB, 0);
        p.on_free(0x2000);
        // A size seen dying young, and one never seen freed: short-lived.
        assert_eq!(p.place(2 * MIB, 7), Placement::stream(7));
        assert_eq!(p.place(6 * MIB, 7), Placement::stream(7));
        // The 4 MiB block outlives LONG_AFTER allocations: 4 MiB is long-lived from then on.
        for i in 0..LONG_AFTER {
            p.on_alloc(0x10_0000 + i, 512, 0);
            p.on_free(0x10_0000 + i);
        }
        p.on_free(0x1000);
        assert!(p.predicts_long(4 * MIB));
        assert!(!p.predicts_long(512));
        // A pointer it never handed out teaches it nothing.
        p.on_free(0xdead);
        assert_eq!(p.deaths.values().map(|d| d.old + d.young).sum::<u32>(), 2 + LONG_AFTER as u32);
    }
}
