//! One walk of a program's allocator calls through the caching allocator: the
//! loop every replay runs — a JSONL trace ([`crate::replay`]), a snapshot's
//! requests and frees under other settings ([`crate::snapshot_replay`]), the
//! planner's step program and its calibration.
//!
//! The walk is mechanism only. It names each allocation by a dense *slot*
//! (a tensor of a step program, an `id` of a trace, an address of a
//! snapshot), keeps which slots are live and what the allocator handed each
//! out, and makes the calls. What a replay measures, and what it does when an
//! allocation fails, is its [`Observer`]'s: peaks by term for the planner,
//! every failure for a trace, the recorded device's refusals for a snapshot.
//! A replay's own events that are not allocator calls (a phase beginning, a
//! step ending, the recorded device refusing next) travel in the same stream
//! of operations as [`Op::Mark`]s, so they happen exactly between the calls
//! they fall between.
//!
//! A slot whose allocation failed is *failed*, not live: a later free of it
//! is skipped and counted (a program that catches `torch.OutOfMemoryError`
//! goes on, and its trace still frees what it tried to allocate), and it may
//! be allocated again.

use headroom_alloc::{
    AllocError, Allocation, BlockId, DeviceCachingAllocator, DeviceMemory, MempoolId, Oom, Policy, StreamId,
};

/// An allocation's name in a walk: an index into its table of live blocks.
pub type Slot = u32;

/// One operation of a walk. `M` is the replay's own marks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op<M> {
    /// `size` bytes on `stream`, in pool `pool` ([`headroom_alloc::DEFAULT_MEMPOOL`] for the default pools).
    Alloc {
        slot: Slot,
        size: u64,
        stream: StreamId,
        pool: MempoolId,
    },
    Free {
        slot: Slot,
    },
    /// The block is used on `stream` too (`Tensor.record_stream`).
    RecordStream {
        slot: Slot,
        stream: StreamId,
    },
    /// Every pending cross-stream event completes.
    CompleteEvents,
    /// `torch.cuda.empty_cache()`.
    EmptyCache,
    /// `empty_cache` of one released private pool.
    EmptyPool(MempoolId),
    /// A private pool's last user is gone.
    ReleasePool(MempoolId),
    /// `torch.cuda.set_per_process_memory_fraction`.
    SetFraction(f64),
    /// The replay's own event, handed to [`Observer::mark`] with the allocator.
    Mark(M),
}

/// What a walk does after an allocation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Go on with the next operation: the slot is failed.
    Continue,
    /// End the walk here.
    Stop,
}

/// What a replay measures as the walk goes. `at` is the operation's position
/// in the replay's own numbering (a trace's line, a snapshot's entry, a
/// program's operation), as the operations were given with it.
pub trait Observer<D: DeviceMemory, P: Policy> {
    /// The replay's own events.
    type Mark;

    /// A mark was reached. The allocator is the observer's to act on (a
    /// recorded device told to refuse the next request, events completed);
    /// an error it returns ends the walk.
    fn mark(
        &mut self,
        _at: usize,
        _mark: Self::Mark,
        _alloc: &mut DeviceCachingAllocator<D, P>,
    ) -> Result<(), AllocError> {
        Ok(())
    }

    /// `slot` was handed `block`.
    fn allocated(&mut self, _at: usize, _slot: Slot, _block: Allocation, _alloc: &DeviceCachingAllocator<D, P>) {}

    /// `slot`'s block, handed out as `block`, went back to the allocator.
    fn freed(&mut self, _at: usize, _slot: Slot, _block: Allocation) {}

    /// The allocation for `slot` failed for lack of memory.
    fn failed(&mut self, at: usize, slot: Slot, oom: Oom, alloc: &DeviceCachingAllocator<D, P>) -> Flow;

    /// A free of a slot whose allocation had failed.
    fn skipped_free(&mut self, _at: usize, _slot: Slot) {}
}

/// Why a walk stopped short: the operations do not make sense as a program,
/// or the allocator refused a call other than an allocation for lack of memory.
#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    #[error("slot {slot} is allocated while it is live")]
    AlreadyLive { at: usize, slot: Slot },
    #[error("slot {slot} is not live")]
    NotLive { at: usize, slot: Slot },
    /// The allocator's message is the whole story.
    #[error("{error}")]
    Alloc { at: usize, error: AllocError },
}

impl WalkError {
    /// The position of the operation, as the walk was given it.
    pub fn at(&self) -> usize {
        match *self {
            WalkError::AlreadyLive { at, .. } | WalkError::NotLive { at, .. } | WalkError::Alloc { at, .. } => at,
        }
    }
}

// A slot's state, kept in its pointer: real pointers are never these.
const EMPTY: u64 = u64::MAX;
const FAILED: u64 = u64::MAX - 1;

/// A slot: its block's address (or `EMPTY`, `FAILED`), size and the allocator's id.
/// One entry, not three vectors: the walk reads all three together, and a slot is
/// then one cache line, not three (docs/PERFORMANCE.md, "Replay passes, ninth round").
#[derive(Clone, Copy, Debug)]
struct Held {
    ptr: u64,
    size: u64,
    block: BlockId,
}

const UNHELD: Held = Held { ptr: EMPTY, size: 0, block: BlockId::NONE };

/// The live blocks of a walk, by slot. Slots are dense: the table grows to the
/// highest slot named. Each slot holds its block's id beside its address, so that
/// a free or a `record_stream` names the block to the allocator without its map
/// of addresses: one map of a replay's allocations, where there were two.
#[derive(Clone, Debug, Default)]
pub struct Walk {
    held: Vec<Held>,
}

impl Walk {
    /// A walk of about `slots` slots.
    pub fn with_slots(slots: usize) -> Self {
        Walk { held: vec![UNHELD; slots] }
    }

    /// `slot` holds `block` already: a block live when the recording began,
    /// which the allocator adopted (its id looked up at `alloc`'s map of addresses,
    /// which must be kept until then).
    pub fn adopt<D: DeviceMemory, P: Policy>(
        &mut self,
        slot: Slot,
        block: Allocation,
        alloc: &DeviceCachingAllocator<D, P>,
    ) {
        self.reach(slot);
        let id = alloc.block_id(block.ptr).unwrap_or(BlockId::NONE);
        self.held[slot as usize] = Held { ptr: block.ptr, size: block.size, block: id };
    }

    /// The block `slot` holds, if it is live.
    pub fn live(&self, slot: Slot) -> Option<Allocation> {
        let h = self.held.get(slot as usize)?;
        (h.ptr < FAILED).then_some(Allocation { ptr: h.ptr, size: h.size })
    }

    /// The slot's address, or `EMPTY` past the table.
    #[inline]
    fn ptr(&self, slot: Slot) -> u64 {
        self.held.get(slot as usize).map_or(EMPTY, |h| h.ptr)
    }

    /// Grows the table to hold `slot`: inlined to the one comparison of the usual
    /// case (the slot is there), the growth apart.
    #[inline]
    fn reach(&mut self, slot: Slot) {
        if self.held.len() <= slot as usize {
            self.grow(slot);
        }
    }

    #[cold]
    fn grow(&mut self, slot: Slot) {
        self.held.resize(slot as usize + 1, UNHELD);
    }

    /// Runs `ops` (each with its position) through `alloc`, telling `observer`.
    /// Stops at the first error, or where the observer says so.
    pub fn run<D, P, O>(
        &mut self,
        alloc: &mut DeviceCachingAllocator<D, P>,
        ops: impl IntoIterator<Item = (usize, Op<O::Mark>)>,
        observer: &mut O,
    ) -> Result<(), WalkError>
    where
        D: DeviceMemory,
        P: Policy,
        O: Observer<D, P>,
    {
        for (at, op) in ops {
            if self.step(alloc, at, op, observer)? == Flow::Stop {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Runs one operation: [`Walk::run`]'s body, for a reader that hands each operation to
    /// the walk as it reads it. Inlined where the operation is made, the `match` on it
    /// folds away: a trace's reader calls the allocator or the observer directly, where an
    /// iterator made each operation, queued it and matched it again (docs/PERFORMANCE.md,
    /// "Replay passes, fourteenth round").
    #[inline(always)]
    pub fn step<D, P, O>(
        &mut self,
        alloc: &mut DeviceCachingAllocator<D, P>,
        at: usize,
        op: Op<O::Mark>,
        observer: &mut O,
    ) -> Result<Flow, WalkError>
    where
        D: DeviceMemory,
        P: Policy,
        O: Observer<D, P>,
    {
        let wrap = |error| WalkError::Alloc { at, error };
        match op {
            Op::Alloc { slot, size, stream, pool } => {
                self.reach(slot);
                let s = slot as usize;
                if self.held[s].ptr < FAILED {
                    return Err(WalkError::AlreadyLive { at, slot });
                }
                match alloc.malloc_block_in_pool(size, stream, pool) {
                    Ok((block, id)) => {
                        self.held[s] = Held { ptr: block.ptr, size: block.size, block: id };
                        observer.allocated(at, slot, block, alloc);
                    }
                    Err(error) => {
                        let oom = error.into_oom().map_err(wrap)?;
                        self.held[s].ptr = FAILED;
                        return Ok(observer.failed(at, slot, oom, alloc));
                    }
                }
            }
            Op::Free { slot } => match self.ptr(slot) {
                EMPTY => return Err(WalkError::NotLive { at, slot }),
                FAILED => {
                    self.held[slot as usize].ptr = EMPTY;
                    observer.skipped_free(at, slot);
                }
                ptr => {
                    let h = &mut self.held[slot as usize];
                    // Not live after a free, whether or not the allocator took it.
                    h.ptr = EMPTY;
                    let (size, block) = (h.size, h.block);
                    match block {
                        // Adopted where the allocator had no block: by address, as before ids.
                        BlockId::NONE => alloc.free(ptr),
                        id => alloc.free_block_id(id, ptr),
                    }
                    .map_err(wrap)?;
                    observer.freed(at, slot, Allocation { ptr, size });
                }
            },
            Op::RecordStream { slot, stream } => match self.ptr(slot) {
                EMPTY => return Err(WalkError::NotLive { at, slot }),
                FAILED => {}
                ptr => match self.held[slot as usize].block {
                    BlockId::NONE => alloc.record_stream(ptr, stream),
                    id => alloc.record_stream_block_id(id, ptr, stream),
                }
                .map_err(wrap)?,
            },
            Op::CompleteEvents => alloc.device_mut().synchronize().map_err(|e| wrap(AllocError::Device(e)))?,
            Op::EmptyCache => alloc.empty_cache().map_err(wrap)?,
            Op::EmptyPool(pool) => alloc.empty_cache_pool(pool).map_err(wrap)?,
            Op::ReleasePool(pool) => alloc.release_pool(pool).map_err(wrap)?,
            Op::SetFraction(f) => alloc.set_memory_fraction(f).map_err(wrap)?,
            Op::Mark(m) => observer.mark(at, m, alloc).map_err(wrap)?,
        }
        Ok(Flow::Continue)
    }
}

pub use crate::address_slots::AddressSlots;

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_alloc::units::MIB;
    use headroom_alloc::{AllocatorConfig, SimDevice, DEFAULT_MEMPOOL};

    /// Records what it was told.
    #[derive(Default)]
    struct Log(Vec<String>);

    impl<D: DeviceMemory, P: Policy> Observer<D, P> for Log {
        type Mark = &'static str;
        fn mark(&mut self, at: usize, m: &'static str, _: &mut DeviceCachingAllocator<D, P>) -> Result<(), AllocError> {
            self.0.push(format!("{at} mark {m}"));
            Ok(())
        }
        fn allocated(&mut self, at: usize, slot: Slot, b: Allocation, _: &DeviceCachingAllocator<D, P>) {
            self.0.push(format!("{at} alloc {slot} {}", b.size));
        }
        fn freed(&mut self, at: usize, slot: Slot, b: Allocation) {
            self.0.push(format!("{at} free {slot} {}", b.size));
        }
        fn failed(&mut self, at: usize, slot: Slot, oom: Oom, _: &DeviceCachingAllocator<D, P>) -> Flow {
            self.0.push(format!("{at} failed {slot} {}", oom.report.rounded));
            Flow::Continue
        }
        fn skipped_free(&mut self, at: usize, slot: Slot) {
            self.0.push(format!("{at} skipped {slot}"));
        }
    }

    fn alloc(slot: Slot, size: u64) -> Op<&'static str> {
        Op::Alloc { slot, size, stream: 0, pool: DEFAULT_MEMPOOL }
    }

    #[test]
    fn a_failed_slot_is_skipped_when_freed_and_may_be_allocated_again() {
        let mut a = DeviceCachingAllocator::new(SimDevice::new(100 * MIB), AllocatorConfig::default());
        let ops = [
            alloc(0, 60 * MIB),
            Op::Mark("between"),
            alloc(1, 60 * MIB),
            Op::Free { slot: 1 },
            Op::Free { slot: 0 },
            alloc(1, 60 * MIB),
        ];
        let mut log = Log::default();
        Walk::default().run(&mut a, ops.into_iter().enumerate(), &mut log).unwrap();
        let want = ["0 alloc 0 62914560", "1 mark between", "2 failed 1 62914560", "3 skipped 1", "4 free 0 62914560"];
        assert_eq!(log.0[..5], want);
        assert_eq!(log.0[5], "5 alloc 1 62914560");
    }

    #[test]
    fn a_program_that_makes_no_sense_stops_where_it_stops_making_it() {
        let mut a = DeviceCachingAllocator::new(SimDevice::new(100 * MIB), AllocatorConfig::default());
        let mut walk = Walk::default();
        let e = walk.run(&mut a, [(7, alloc(3, MIB)), (8, alloc(3, MIB))], &mut Log::default()).unwrap_err();
        assert!(matches!(e, WalkError::AlreadyLive { at: 8, slot: 3 }), "{e:?}");
        let e = walk.run(&mut a, [(9, Op::Free { slot: 4 })], &mut Log::default()).unwrap_err();
        assert!(matches!(e, WalkError::NotLive { at: 9, slot: 4 }), "{e:?}");
        assert_eq!(walk.live(3).map(|b| b.size), Some(MIB), "the first stays live");
    }

    #[test]
    fn an_adopted_block_is_freed_through_the_walk() {
        let mut a = DeviceCachingAllocator::new(SimDevice::new(100 * MIB), AllocatorConfig::default());
        let b = a.malloc(MIB, 0).unwrap();
        let mut walk = Walk::default();
        walk.adopt(5, b, &a);
        let mut log = Log::default();
        walk.run(&mut a, [(0, Op::Free { slot: 5 })], &mut log).unwrap();
        assert_eq!(log.0, ["0 free 5 1048576"]);
        assert_eq!(a.stats().allocated_bytes.all().current, 0);
    }
}
