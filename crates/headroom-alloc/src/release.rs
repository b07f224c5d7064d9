//! Giving cached memory back to the device: `empty_cache`, the full flush of
//! the out-of-memory ladder, the oversize release, and garbage collection.
//! A private pool's memory goes back only once the pool is released
//! (`release_pool`): until then a graph may replay into it.

use crate::block::DEFAULT_POOL;
use crate::caching::DeviceCachingAllocator;
use crate::device::{DeviceMemory, StreamId};
use crate::error::AllocError;
use crate::history::Action;
use crate::mempool::{MempoolId, DEFAULT_MEMPOOL};
use crate::policy::{CachedSegment, Policy};
use crate::stats::{self, PoolKind};

impl<D: DeviceMemory, P: Policy> DeviceCachingAllocator<D, P> {
    /// `torch.cuda.empty_cache()`: waits for pending cross-stream frees, then
    /// returns every unsplit cached segment, and every fully free page of
    /// expandable segments, to the device.
    /// With a capture underway, only released private pools give memory back.
    pub fn empty_cache(&mut self) -> Result<(), AllocError> {
        self.release_cached_blocks(DEFAULT_MEMPOOL)
    }

    /// `release_cached_blocks(mempool_id)`: with the default id and no capture
    /// underway, every pending event waited for and the default pools
    /// released, in the policy's flush order, each in free-set order (stream,
    /// size, address), which is the order recorded traces show; then the
    /// released private pools (small, then large), each deleted once it holds
    /// no segment. With a private pool's id, only that pool, if released,
    /// after its own events.
    pub(crate) fn release_cached_blocks(&mut self, mempool_id: MempoolId) -> Result<(), AllocError> {
        if mempool_id == DEFAULT_MEMPOOL && self.captures.is_empty() {
            self.synchronize_and_free_events(None)?;
            for kind in self.policy.flush_order() {
                self.release_blocks(DEFAULT_POOL, kind)?;
            }
        }
        for (id, owner) in self.freeable_pools() {
            if mempool_id != DEFAULT_MEMPOOL {
                if id != mempool_id {
                    continue;
                }
                self.synchronize_and_free_events(Some(owner))?;
            }
            self.release_blocks(owner, PoolKind::Small)?;
            self.release_blocks(owner, PoolKind::Large)?;
            if !self.holds_segments(owner) {
                self.delete_pool(owner);
            }
        }
        Ok(())
    }

    fn release_blocks(&mut self, owner: u32, kind: PoolKind) -> Result<(), AllocError> {
        let ids: Vec<u32> = self.pool(owner, kind).blocks.ids();
        let mut to_unmap = Vec::new();
        for id in ids {
            let b = &self.arena[id];
            if b.is_expandable() {
                to_unmap.push(id);
            } else if !b.is_split() {
                self.release_block(id)?;
            }
        }
        for id in to_unmap {
            self.unmap_block(id)?;
            if !self.arena[id].is_split() {
                self.release_expandable_segment(id)?;
            }
        }
        Ok(())
    }

    /// `release_block`: returns an unsplit, non-expandable free block's segment
    /// to the device.
    pub(crate) fn release_block(&mut self, id: u32) -> Result<(), AllocError> {
        let b = &self.arena[id];
        debug_assert!(!b.is_expandable() && !b.is_split() && !b.allocated);
        let (ptr, size, stream, kind, owner) = (b.ptr, b.size, b.stream, b.pool, b.owner);
        self.stats.num_device_free += 1;
        self.trace_in(Action::SegmentFree, ptr, size, stream, owner);
        self.device.free(ptr, size)?;
        self.total_allocated_memory -= size;
        stats::decrease(&mut self.stats.segment, kind, 1);
        stats::decrease(&mut self.stats.reserved_bytes, kind, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        self.pool_mut(owner, kind).blocks.remove(stream, size, ptr);
        self.arena.remove(id);
        self.segments.remove(&ptr);
        Ok(())
    }

    /// `release_available_cached_blocks`: with `max_split_size` set, returns
    /// the smallest cached oversize block on `stream` that is at least as
    /// large as the request (or `max_split_size`); failing that, the largest
    /// oversize blocks downward until enough is released. True if it released
    /// enough.
    pub(crate) fn release_available_cached_blocks(
        &mut self,
        owner: u32,
        kind: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Result<bool, AllocError> {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return Ok(false);
        }
        let key_size = size.max(max_split);
        let pool = self.pool(owner, kind);
        match pool.blocks.first_at_least(stream, key_size) {
            Some((_, _, id)) if !self.arena[id].is_expandable() && !self.arena[id].is_split() => {
                self.release_block(id)?;
                Ok(true)
            }
            _ => {
                // Walk down from the largest block below the search key.
                let candidates: Vec<u32> = pool
                    .blocks
                    .below_descending(stream, key_size)
                    .into_iter()
                    .take_while(|&(size, _, _)| size >= max_split)
                    .map(|(_, _, id)| id)
                    .collect();
                let mut released = 0;
                for id in candidates {
                    if released >= key_size {
                        break;
                    }
                    let b = &self.arena[id];
                    if !b.is_expandable() && !b.is_split() {
                        released += b.size;
                        self.release_block(id)?;
                    }
                }
                Ok(released >= key_size)
            }
        }
    }

    /// `garbage_collect_cached_blocks`: gives back the unsplit cached segments
    /// of the default large pool the policy picks, when it sets a target. No
    /// synchronization.
    pub(crate) fn garbage_collect_cached_blocks(&mut self) -> Result<(), AllocError> {
        let reserved = self.total_allocated_memory;
        let Some(target) = self.policy.garbage_target(&self.config, reserved, self.allowed_memory_maximum) else {
            return Ok(());
        };
        let clock = self.large.get_free_blocks_call_count;
        let (ids, candidates): (Vec<u32>, Vec<CachedSegment>) = self
            .large
            .blocks
            .ids()
            .into_iter()
            .filter(|&id| !self.arena[id].is_split() && !self.arena[id].is_expandable())
            .map(|id| (id, CachedSegment { size: self.arena[id].size, age: clock - self.arena[id].gc_count_base }))
            .unzip();
        for i in self.policy.pick_garbage(target, &candidates) {
            self.release_block(ids[i])?;
        }
        Ok(())
    }
}
