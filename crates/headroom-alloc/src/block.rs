//! Blocks, the arena that owns them, and the per-pool free sets.
//!
//! A segment is one device allocation (or, for expandable segments, one
//! virtual reservation); it is covered end to end by a doubly linked list of
//! blocks, in address order:
//!
//! ```text
//!  segment 0x7f0000000000, 20 MiB
//!  +-----------+--------------+------------------------------+
//!  | allocated |     free     |          allocated           |
//!  +-----------+--------------+------------------------------+
//!   prev=NIL     <- links ->                        next=NIL
//! ```
//!
//! Invariants (checked by [`crate::CachingAllocator::validate`]): the blocks of
//! a segment tile it exactly; two neighbours that are both free, not waiting
//! for events and equally mapped are always merged; a free mapped block is in
//! its pool's `blocks` set exactly once, an unmapped one in `unmapped`.

use crate::device::StreamId;
use crate::free_set::FreeSet;
use crate::stats::PoolKind;
use std::collections::BTreeMap;

/// "No block": the end of a segment's list.
pub(crate) const NIL: u32 = u32::MAX;

/// The owner of the default pools' blocks (PyTorch's `MempoolId_t` (0, 0)).
pub(crate) const DEFAULT_POOL: u32 = 0;

/// 64 bytes, aligned to 64: one cache line a block. A replay touches a few thousand
/// blocks in no order (the best fit's, its neighbours', the one freed), and at 72
/// bytes each spanned two lines (docs/PERFORMANCE.md, "Replay passes, ninth round").
#[derive(Clone, Debug)]
#[repr(align(64))]
pub(crate) struct Block {
    pub ptr: u64,
    /// Rounded size; what the stats count.
    pub size: u64,
    /// The caller's size at the last allocation (stale once freed, as in PyTorch).
    pub requested_size: u64,
    /// The stream the segment was allocated for; only this stream reuses it.
    pub stream: StreamId,
    pub pool: PoolKind,
    /// The private pool the block's segment belongs to (an index into the
    /// allocator's private pools), or [`DEFAULT_POOL`]. Blocks of different
    /// owners never share a segment or a free set.
    pub owner: u32,
    pub prev: u32,
    pub next: u32,
    pub allocated: bool,
    /// False only for the unmapped parts of expandable segments.
    pub mapped: bool,
    /// The expandable segment this block lies in, or `NIL`.
    pub expandable: u32,
    /// Cross-stream events still pending before the block may be reused;
    /// [`VACANT`] once the arena slot is vacant (no block waits on that many).
    pub event_count: u32,
    /// Other streams used the allocated block (`record_stream`); the list is
    /// kept beside the arena so that a block fits in one cache line.
    pub has_stream_uses: bool,
    /// The pool's search count when the block was last freed (GC age).
    pub gc_count_base: u64,
}

/// The `event_count` of a vacant arena slot: a liveness flag of its own would
/// take the block past one cache line.
const VACANT: u32 = u32::MAX;

const _: () = assert!(std::mem::size_of::<Block>() == 64);

impl Block {
    #[inline]
    pub fn new(ptr: u64, size: u64, stream: StreamId, pool: PoolKind, owner: u32) -> Self {
        Block {
            ptr,
            size,
            requested_size: 0,
            stream,
            pool,
            owner,
            prev: NIL,
            next: NIL,
            allocated: false,
            mapped: true,
            expandable: NIL,
            event_count: 0,
            has_stream_uses: false,
            gc_count_base: 0,
        }
    }

    /// False once the arena slot is vacant.
    #[inline]
    pub fn is_live(&self) -> bool {
        self.event_count != VACANT
    }

    #[inline]
    pub fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }

    #[inline]
    pub fn is_expandable(&self) -> bool {
        self.expandable != NIL
    }

    /// Free and not waiting for other streams: may be merged or reused.
    /// A freed block keeps its stream uses only while a graph capture defers
    /// its events (`needs_events_deferred_until_no_capture`).
    #[inline]
    pub fn is_reusable(&self) -> bool {
        !self.allocated && self.event_count == 0 && !self.has_stream_uses
    }
}

/// Owns every block; ids are stable while a block lives.
#[derive(Default, Debug, Clone)]
pub(crate) struct Arena {
    slots: Vec<Block>,
    vacant: Vec<u32>,
}

impl Arena {
    #[inline]
    pub fn insert(&mut self, b: Block) -> u32 {
        if let Some(id) = self.vacant.pop() {
            self.slots[id as usize] = b;
            id
        } else {
            self.slots.push(b);
            (self.slots.len() - 1) as u32
        }
    }

    #[inline]
    pub fn remove(&mut self, id: u32) {
        let b = &mut self.slots[id as usize];
        b.event_count = VACANT;
        self.vacant.push(id);
    }

    /// The live block `id`, if there is one.
    #[inline]
    pub fn get(&self, id: u32) -> Option<&Block> {
        self.slots.get(id as usize).filter(|b| b.is_live())
    }

    /// Every live block with its id, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Block)> {
        self.slots.iter().enumerate().filter(|(_, b)| b.is_live()).map(|(i, b)| (i as u32, b))
    }
}

// Indexing is unchecked. Invariant: every id indexed was handed out by `Arena::insert`
// (a slot's index, and slots are never dropped, so it stays below `slots.len()`), or is
// a live block's `prev` or `next` other than `NIL`, itself such an id; ids from outside
// the crate (`BlockId`) go through `Arena::get`, which checks. The checks cost a compare
// and a branch at each of the dozen or so blocks a warm pair indexes (docs/PERFORMANCE.md,
// "Warm malloc + free pair, twenty-first round"); debug builds keep them.
impl std::ops::Index<u32> for Arena {
    type Output = Block;
    #[inline(always)]
    fn index(&self, id: u32) -> &Block {
        debug_assert!((id as usize) < self.slots.len(), "block {id} was never handed out");
        // SAFETY: in bounds by the invariant above.
        unsafe { self.slots.get_unchecked(id as usize) }
    }
}

impl std::ops::IndexMut<u32> for Arena {
    #[inline(always)]
    fn index_mut(&mut self, id: u32) -> &mut Block {
        debug_assert!((id as usize) < self.slots.len(), "block {id} was never handed out");
        // SAFETY: in bounds by the invariant above.
        unsafe { self.slots.get_unchecked_mut(id as usize) }
    }
}

/// Free blocks of one pool (small or large) of one owner: the default pools, or a private pool's.
#[derive(Debug, Clone)]
pub(crate) struct BlockPool {
    /// Free mapped blocks by (stream, size, address): `lower_bound` is best fit.
    pub blocks: FreeSet,
    /// Unmapped parts of expandable segments by (stream, address).
    pub unmapped: BTreeMap<(StreamId, u64), u32>,
    /// Searches of this pool so far: the clock that ages blocks for GC.
    pub get_free_blocks_call_count: u64,
}

impl BlockPool {
    pub fn new() -> Self {
        BlockPool { blocks: FreeSet::default(), unmapped: BTreeMap::new(), get_free_blocks_call_count: 0 }
    }
}
