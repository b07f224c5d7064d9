//! Allocated blocks by address (PyTorch's `allocated_blocks`), and the calls that
//! name a block by its [`BlockId`] instead, for a caller that keeps its own map.
//!
//! Why both: `free(ptr)` must find a block from its address, which costs a hash
//! insert for every request and a hash remove for every free. A replay's walk
//! already maps each recorded allocation to a slot of its own, where the block's
//! id can live beside its address; with the allocator's map turned off
//! ([`DeviceCachingAllocator::keep_pointer_map`]) a request and a free make no
//! hash call at all. The map is all or nothing: on, it holds every allocated
//! block; off, none, and a call by address finds its block by a walk of every
//! block (correct, but for rare calls only).

use crate::block::NIL;
use crate::caching::{Allocation, DeviceCachingAllocator};
use crate::device::{DeviceMemory, StreamId};
use crate::error::AllocError;
use crate::mempool::MempoolId;
use crate::policy::Policy;

/// A block handed out, as [`DeviceCachingAllocator::malloc_block_in_pool`] names it:
/// valid until the block is freed. The zero-byte request's is [`BlockId::NONE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockId(pub(crate) u32);

impl BlockId {
    /// No block: a zero-byte request's, or an address whose block is not known.
    pub const NONE: BlockId = BlockId(NIL);
}

impl<D: DeviceMemory, P: Policy> DeviceCachingAllocator<D, P> {
    /// Keeps (`true`, the default) or drops the map of allocated blocks by address.
    /// Turning it on rebuilds it from the blocks.
    pub fn keep_pointer_map(&mut self, on: bool) {
        if on == self.pointer_map {
            return;
        }
        self.pointer_map = on;
        self.active.clear();
        if on {
            let allocated = self.arena.iter().filter(|(_, b)| b.allocated).map(|(id, b)| (b.ptr, id));
            self.active.extend(allocated);
        } else {
            self.active.shrink_to_fit();
        }
    }

    /// The allocated block at `ptr`: from the map, or without it by a walk of every block.
    pub(crate) fn allocated_block(&self, ptr: u64) -> Option<u32> {
        if self.pointer_map {
            return self.active.get(ptr);
        }
        self.arena.iter().find(|(_, b)| b.allocated && b.ptr == ptr).map(|(id, _)| id)
    }

    /// The block allocated at `ptr`, if one is.
    pub fn block_id(&self, ptr: u64) -> Option<BlockId> {
        self.allocated_block(ptr).map(BlockId)
    }

    /// [`Self::malloc_in_pool`], with the block's id for [`Self::free_block_id`].
    pub fn malloc_block_in_pool(
        &mut self,
        size: u64,
        stream: StreamId,
        pool: MempoolId,
    ) -> Result<(Allocation, BlockId), AllocError> {
        let owner = self.owner_or_new(pool)?;
        self.malloc_block_in(size, stream, owner).map(|(a, id)| (a, BlockId(id)))
    }

    /// Block `id`, if it is allocated at `ptr`.
    #[inline]
    fn allocated_at(&self, id: BlockId, ptr: u64) -> Result<u32, AllocError> {
        match self.arena.get(id.0) {
            Some(b) if b.allocated && b.ptr == ptr => Ok(id.0),
            _ => Err(AllocError::InvalidPointer(ptr)),
        }
    }

    /// [`Self::free`] of the block `id` allocated at `ptr`, found without the map.
    pub fn free_block_id(&mut self, id: BlockId, ptr: u64) -> Result<(), AllocError> {
        if ptr == 0 {
            return Ok(());
        }
        let id = self.allocated_at(id, ptr)?;
        if self.pointer_map {
            self.active.remove(ptr);
        }
        self.free_found::<true>(id, ptr)
    }

    /// [`Self::record_stream`] of the block `id` allocated at `ptr`, found without the map.
    pub fn record_stream_block_id(&mut self, id: BlockId, ptr: u64, stream: StreamId) -> Result<(), AllocError> {
        if ptr == 0 {
            return Ok(());
        }
        let id = self.allocated_at(id, ptr)?;
        self.record_stream_found(id, stream);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::units::MIB;
    use crate::{AllocError, AllocatorConfig, BlockId, DeviceCachingAllocator, SimDevice, DEFAULT_MEMPOOL};

    fn allocator() -> DeviceCachingAllocator<SimDevice> {
        DeviceCachingAllocator::new(SimDevice::new(100 * MIB), AllocatorConfig::default())
    }

    #[test]
    fn without_the_map_a_block_is_freed_by_its_id_and_the_same_decisions_follow() {
        let (mut with, mut without) = (allocator(), allocator());
        without.keep_pointer_map(false);
        for a in [&mut with, &mut without] {
            let (x, xid) = a.malloc_block_in_pool(3 * MIB, 0, DEFAULT_MEMPOOL).unwrap();
            let (y, yid) = a.malloc_block_in_pool(MIB, 0, DEFAULT_MEMPOOL).unwrap();
            a.record_stream_block_id(yid, y.ptr, 7).unwrap();
            a.free_block_id(xid, x.ptr).unwrap();
            a.free_block_id(yid, y.ptr).unwrap();
            a.empty_cache().unwrap();
            a.malloc(2 * MIB, 0).unwrap();
            a.validate().unwrap();
        }
        assert_eq!(format!("{:?}", with.snapshot()), format!("{:?}", without.snapshot()));
        assert_eq!(with.memory_stats(), without.memory_stats());
    }

    #[test]
    fn a_wrong_id_or_address_is_an_error_not_a_free() {
        let mut a = allocator();
        let (x, xid) = a.malloc_block_in_pool(MIB, 0, DEFAULT_MEMPOOL).unwrap();
        let (y, _) = a.malloc_block_in_pool(MIB, 0, DEFAULT_MEMPOOL).unwrap();
        assert!(matches!(a.free_block_id(xid, y.ptr), Err(AllocError::InvalidPointer(p)) if p == y.ptr));
        assert!(matches!(a.free_block_id(BlockId::NONE, x.ptr), Err(AllocError::InvalidPointer(_))));
        a.free_block_id(xid, x.ptr).unwrap();
        assert!(a.free_block_id(xid, x.ptr).is_err(), "a second free of the same block");
        a.validate().unwrap();
    }

    #[test]
    fn turned_off_and_on_the_map_holds_every_allocated_block_again() {
        let mut a = allocator();
        let x = a.malloc(MIB, 0).unwrap();
        a.keep_pointer_map(false);
        let y = a.malloc(2 * MIB, 0).unwrap();
        a.validate().unwrap();
        // By address without the map: found by a walk of the blocks.
        assert_eq!(a.allocation_size(y.ptr), Some(2 * MIB));
        a.free(x.ptr).unwrap();
        a.keep_pointer_map(true);
        assert_eq!(a.block_id(y.ptr).map(|_| ()), Some(()));
        a.validate().unwrap();
        a.free(y.ptr).unwrap();
        assert!(a.free(y.ptr).is_err());
        a.validate().unwrap();
    }
}
