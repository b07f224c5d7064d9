//! Private pools: the memory of CUDA graphs and of `torch.cuda.MemPool`, kept
//! apart from the default pools as PyTorch keeps it (`PrivatePool` in
//! `CUDACachingAllocator.cpp`).
//!
//! A CUDA graph bakes the addresses its capture used into the graph, so
//! memory handed out during a capture must stay the graph's for as long as
//! the graph may replay, freed blocks included: during capture a block can
//! be freed and handed out again within the graph, but never to anyone
//! outside it. PyTorch gives each capture (or each `MemPool`) a private pool
//! with its own small and large free sets; allocations are diverted to it
//! while its capture is underway, as a filter on the request's stream says
//! (`torch.cuda.graph`: "is this stream capturing into this pool";
//! `torch.cuda.use_mem_pool`: "is this the thread that asked").
//!
//! ```text
//!  begin_allocate_to_pool(id, filter)    use_count += 1 (the pool is made with 1)
//!      malloc(size, stream)   -> the pool of the newest capture whose filter says yes
//!  end_allocate_to_pool(id)              requests go where they went before
//!  release_pool(id)                      use_count -= 1; at 0 the pool is freeable:
//!  empty_cache() / empty_cache_pool(id)  its unsplit cached segments go back, and
//!                                        the pool itself once it holds none
//! ```
//!
//! Invariants (checked by `validate`): a block's owner is the default pools
//! or a pool that exists; every block of a segment has the segment's owner;
//! a capture names a pool whose use count is at least 1; a deferred free is a
//! freed block that still carries its stream uses. The cached segments of a
//! pool still in use are never given back: not by a flush, garbage
//! collection, or a policy's reclaim.
//!
//! One deliberate difference: PyTorch deletes a freeable pool when a count
//! of its `cudaMalloc`s and maps, less its frees and unmaps, reaches zero; for
//! expandable segments that count can stay above zero after the last unmap
//! (several maps merge into a run that one unmap gives back), so the pool
//! lingers, empty. headroom deletes a freeable pool when it holds no segment.

use crate::block::{BlockPool, DEFAULT_POOL};
use crate::caching::DeviceCachingAllocator;
use crate::device::{DeviceMemory, StreamId};
use crate::error::AllocError;
use crate::mempool::{Capture, CaptureFilter, MempoolId, PrivatePool, PrivatePoolInfo, DEFAULT_MEMPOOL};
use crate::policy::Policy;

impl<D: DeviceMemory, P: Policy> DeviceCachingAllocator<D, P> {
    /// `beginAllocateToPool`: from now on, requests whose stream `filter`
    /// accepts go to the private pool `id` (made if it does not exist; its
    /// use count grows by one either way), the newest capture first.
    pub fn begin_allocate_to_pool(&mut self, id: MempoolId, filter: CaptureFilter) -> Result<(), AllocError> {
        if self.captures.iter().any(|c| c.id == id) {
            return Err(invalid(format!("beginAllocateToPool: already recording to mempool_id {id:?}")));
        }
        let owner = self.create_or_incref_pool(id)?;
        self.captures.push(Capture { id, owner, filter });
        Ok(())
    }

    /// `endAllocateToPool`: requests stop going to pool `id`.
    pub fn end_allocate_to_pool(&mut self, id: MempoolId) -> Result<(), AllocError> {
        let Some(i) = self.captures.iter().position(|c| c.id == id) else {
            return Err(invalid(format!("endAllocateToPool: not currently recording to mempool_id {id:?}")));
        };
        self.captures.remove(i);
        Ok(())
    }

    /// `createOrIncrefPool`: the pool `id`, made with a use count of 1 if it
    /// does not exist, its use count raised by one if it does. Returns its owner index.
    pub fn create_or_incref_pool(&mut self, id: MempoolId) -> Result<u32, AllocError> {
        if id == DEFAULT_MEMPOOL {
            return Err(invalid("mempool_id (0, 0) names the default pools, not a private pool".into()));
        }
        if let Some(&owner) = self.pool_owners.get(&id) {
            let pool = self.private.get_mut(&owner).expect("owners name live pools");
            if pool.use_count == 0 {
                return Err(invalid(format!("mempool_id {id:?} was released and may not be used again")));
            }
            pool.use_count += 1;
            return Ok(owner);
        }
        let owner = self.next_owner;
        self.next_owner += 1;
        self.pool_owners.insert(id, owner);
        self.private.insert(owner, PrivatePool { id, use_count: 1, small: BlockPool::new(), large: BlockPool::new() });
        Ok(owner)
    }

    /// `releasePool`: one user of pool `id` is gone (a graph reset, a
    /// `MemPool` deleted, a `use_mem_pool` block left). At 0 users its cached
    /// segments may go back: at the next flush, or [`Self::empty_cache_pool`].
    pub fn release_pool(&mut self, id: MempoolId) -> Result<(), AllocError> {
        let owner = self.owner_of(id)?;
        let pool = self.private.get_mut(&owner).expect("owners name live pools");
        if pool.use_count == 0 {
            return Err(invalid(format!("mempool_id {id:?} is already released")));
        }
        pool.use_count -= 1;
        Ok(())
    }

    /// The use count of pool `id`, if it exists (`MemPool.use_count()`).
    pub fn pool_use_count(&self, id: MempoolId) -> Option<u32> {
        self.pool_owners.get(&id).map(|o| self.private[o].use_count)
    }

    /// `emptyCache(mempool_id)`: with [`DEFAULT_MEMPOOL`], `empty_cache()`;
    /// with a released pool's id, that pool's events waited for and its
    /// unsplit cached segments given back (and every other released pool's).
    /// A pool still in use keeps its memory.
    pub fn empty_cache_pool(&mut self, id: MempoolId) -> Result<(), AllocError> {
        self.release_cached_blocks(id)
    }

    /// Whether a capture is diverting requests to a private pool.
    pub fn captures_underway(&self) -> bool {
        !self.captures.is_empty()
    }

    /// Allocates `size` bytes on `stream` in pool `id` (made with a use
    /// count of 1 if it does not exist), whatever the captures underway say:
    /// a replay, which knows the pool each recorded request went to.
    pub fn malloc_in_pool(
        &mut self,
        size: u64,
        stream: StreamId,
        id: MempoolId,
    ) -> Result<crate::Allocation, AllocError> {
        let owner = self.owner_or_new(id)?;
        self.malloc_in(size, stream, owner)
    }

    /// The owner index of pool `id`, which is made (with a use count of 1)
    /// if it does not exist: what a replay or an adopted segment names. Inlined to the
    /// comparison that answers for the default pools (a replay's every request asks, and
    /// the call cost more than the answer); a private pool's look-up is a call.
    #[inline]
    pub(crate) fn owner_or_new(&mut self, id: MempoolId) -> Result<u32, AllocError> {
        if id == DEFAULT_MEMPOOL {
            return Ok(DEFAULT_POOL);
        }
        self.private_owner_or_new(id)
    }

    /// [`Self::owner_or_new`] of a private pool.
    fn private_owner_or_new(&mut self, id: MempoolId) -> Result<u32, AllocError> {
        match self.pool_owners.get(&id) {
            Some(&o) => Ok(o),
            None => self.create_or_incref_pool(id),
        }
    }

    /// Every private pool, by id.
    pub fn private_pools(&self) -> Vec<PrivatePoolInfo> {
        let mut out: Vec<PrivatePoolInfo> = self
            .private
            .iter()
            .map(|(&owner, p)| {
                let mut info = PrivatePoolInfo {
                    id: p.id,
                    use_count: p.use_count,
                    capturing: self.captures.iter().any(|c| c.owner == owner),
                    segments: 0,
                    reserved_bytes: 0,
                    allocated_bytes: 0,
                };
                for (_, b) in self.arena.iter().filter(|(_, b)| b.owner == owner && b.mapped) {
                    let prev_mapped = b.prev != crate::block::NIL && self.arena[b.prev].mapped;
                    info.segments += u64::from(!prev_mapped);
                    info.reserved_bytes += b.size;
                    info.allocated_bytes += if b.allocated { b.size } else { 0 };
                }
                info
            })
            .collect();
        out.sort_by_key(|p| p.id);
        out
    }

    /// The pool a request on `stream` goes to: the newest capture whose
    /// filter accepts the stream, else the default pools.
    pub(crate) fn owner_for(&self, stream: StreamId) -> u32 {
        self.captures.iter().rev().find(|c| (c.filter)(stream)).map_or(DEFAULT_POOL, |c| c.owner)
    }

    /// The id of owner index `owner`.
    pub(crate) fn mempool_id(&self, owner: u32) -> MempoolId {
        if owner == DEFAULT_POOL {
            DEFAULT_MEMPOOL
        } else {
            self.private.get(&owner).map_or(DEFAULT_MEMPOOL, |p| p.id)
        }
    }

    fn owner_of(&self, id: MempoolId) -> Result<u32, AllocError> {
        self.pool_owners.get(&id).copied().ok_or_else(|| invalid(format!("no private pool has mempool_id {id:?}")))
    }

    /// Whether any segment (or reservation) belongs to `owner`.
    pub(crate) fn holds_segments(&self, owner: u32) -> bool {
        self.segments.values().any(|s| s.owner == owner) || self.expandable.values().any(|s| s.owner == owner)
    }

    /// Released pools (use count 0), in id order: PyTorch's `graph_pools_freeable`.
    pub(crate) fn freeable_pools(&self) -> Vec<(MempoolId, u32)> {
        let mut v: Vec<(MempoolId, u32)> =
            self.private.iter().filter(|(_, p)| p.use_count == 0).map(|(&o, p)| (p.id, o)).collect();
        v.sort_unstable();
        v
    }

    /// Forgets a released pool that holds no segment.
    pub(crate) fn delete_pool(&mut self, owner: u32) {
        if let Some(p) = self.private.remove(&owner) {
            self.pool_owners.remove(&p.id);
        }
    }
}

fn invalid(m: String) -> AllocError {
    AllocError::InvalidArgument(m)
}
