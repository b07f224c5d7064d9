//! Expandable segments (`expandable_segments:True`): one virtual reservation
//! per stream and pool, 1.125× the device, whose pages are mapped as the pool
//! grows and unmapped when whole pages fall free. Allocations tile densely, so
//! slightly growing shapes stop leaving unusable slivers in many segments.
//!
//! ```text
//!  reservation (1.125 x device memory), pages of 2 MiB (small) or 20 MiB (large)
//!  +----------+----------+--------+---------------------------------------+
//!  | alloc'd  |  alloc'd |  free  |        unmapped (in pool.unmapped)    |
//!  +----------+----------+--------+---------------------------------------+
//!  |<-------- mapped pages ------>|
//! ```
//!
//! Growth maps `size` (the rounded request, not a segment size) starting at
//! the lowest unmapped address that, with the free block before it, has
//! room; each mapping is one `segment_map` and one device allocation, and
//! never changes the `segment` count.

use crate::block::{Block, NIL};
use crate::caching::{DeviceCachingAllocator, ExpandableSegment, Failure};
use crate::device::{DeviceMemory, StreamId};
use crate::error::AllocError;
use crate::history::Action;
use crate::policy::Policy;
use crate::stats::{self, PoolKind};

impl<D: DeviceMemory, P: Policy> DeviceCachingAllocator<D, P> {
    /// `try_allocate_expandable_block`: a free mapped block of at least
    /// `size` bytes, mapping pages as needed. `Ok(None)` when the device is
    /// out of memory.
    pub(crate) fn try_allocate_expandable_block(
        &mut self,
        kind: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Result<Option<u32>, AllocError> {
        let mut candidate = self.find_expandable_block(kind, stream, size)?;
        // The candidate is one of: unmapped -> end; unmapped -> free -> ...;
        // free -> unmapped -> ...
        if !self.arena[candidate].mapped {
            let n = self.arena[candidate].size.min(size);
            if !self.map_block(candidate, n)? {
                return Ok(None);
            }
        }
        while self.arena[candidate].size < size {
            let remaining = size - self.arena[candidate].size;
            let next = self.arena[candidate].next;
            let n = remaining.min(self.arena[next].size);
            // Mapping `next` merges it with `candidate` before it.
            if !self.map_block(next, n)? {
                return Ok(None);
            }
            candidate = next;
        }
        let b = &self.arena[candidate];
        let (s, size, ptr) = (b.stream, b.size, b.ptr);
        self.pool_mut(kind).blocks.remove(s, size, ptr);
        Ok(Some(candidate))
    }

    /// `find_expandable_block`: the lowest-address unmapped block on `stream`
    /// (or the free block just before it) from which `size` bytes of free or
    /// unmapped space run on; a new reservation if there is none.
    fn find_expandable_block(&mut self, kind: PoolKind, stream: StreamId, size: u64) -> Result<u32, AllocError> {
        if let Some(c) = self.expandable_candidate(kind, stream, size) {
            return Ok(c);
        }
        let page = self.policy.page_size(&self.config, kind);
        let total = self.device_total;
        let va_size = (total + total / 8).div_ceil(page) * page;
        let base = self.device.reserve(va_size)?;
        let index = self.expandable.len() as u32;
        self.expandable.push(Some(ExpandableSegment { base, va_size, page, stream, pool: kind }));
        let mut b = Block::new(base, va_size, stream, kind);
        b.mapped = false;
        b.expandable = index;
        let id = self.arena.insert(b);
        self.pool_mut(kind).unmapped.insert((stream, base), id);
        Ok(id)
    }

    /// The block [`Self::find_expandable_block`] would start from, if an
    /// existing reservation has room.
    fn expandable_candidate(&self, kind: PoolKind, stream: StreamId, size: u64) -> Option<u32> {
        let arena = &self.arena;
        let allocatable = |id: u32| id != NIL && arena[id].is_reusable();
        let pool = self.pool(kind);
        for (_, &id) in pool.unmapped.range((stream, 0)..(stream, u64::MAX)) {
            let mut c = id;
            if allocatable(arena[c].prev) {
                c = arena[c].prev;
            }
            let mut bytes = 0;
            let mut b = c;
            while bytes < size && allocatable(b) {
                bytes += arena[b].size;
                b = arena[b].next;
            }
            if bytes >= size {
                return Some(c);
            }
        }
        None
    }

    /// Bytes of pages [`Self::try_allocate_expandable_block`] would map to
    /// serve `size` bytes: what reserved memory would grow by.
    pub(crate) fn expandable_growth(&self, kind: PoolKind, stream: StreamId, size: u64) -> u64 {
        let page = self.policy.page_size(&self.config, kind);
        let Some(mut c) = self.expandable_candidate(kind, stream, size) else {
            return size.div_ceil(page) * page;
        };
        let (mut have, mut grow) = (0, 0);
        while have < size && c != NIL {
            let b = &self.arena[c];
            if b.mapped {
                have += b.size;
            } else {
                let n = (size - have).min(b.size).div_ceil(page) * page;
                grow += n;
                have += n;
            }
            c = b.next;
        }
        grow
    }

    /// Unmaps whole free pages of expandable segments, in either pool and on
    /// any stream, largest free blocks first, until at least `want` bytes
    /// are unmapped or none are left. The free blocks a request of `size`
    /// bytes on (`kind`, `stream`) would grow from are left alone: unmapping
    /// them would only make it map the same pages again.
    pub(crate) fn reclaim_free_pages(
        &mut self,
        kind: PoolKind,
        stream: StreamId,
        size: u64,
        want: u64,
    ) -> Result<u64, AllocError> {
        let mut keep = Vec::new();
        let mut c = self.expandable_candidate(kind, stream, size).unwrap_or(NIL);
        let mut have = 0;
        while have < size && c != NIL {
            keep.push(c);
            have += self.arena[c].size;
            c = self.arena[c].next;
        }
        let arena = &self.arena;
        let mut candidates: Vec<(u64, u32)> = [PoolKind::Small, PoolKind::Large]
            .into_iter()
            .flat_map(|k| self.pool(k).blocks.ids())
            .filter_map(|id| {
                let b = &arena[id];
                if !b.is_expandable() || keep.contains(&id) {
                    return None;
                }
                let seg = self.expandable[b.expandable as usize].expect("block of a live expandable segment");
                let begin = (b.ptr - seg.base).div_ceil(seg.page);
                let end = (b.ptr + b.size - seg.base) / seg.page;
                (end > begin).then(|| ((end - begin) * seg.page, id))
            })
            .collect();
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        let mut reclaimed = 0;
        for (bytes, id) in candidates {
            if reclaimed >= want {
                break;
            }
            self.unmap_block(id)?;
            reclaimed += bytes;
        }
        Ok(reclaimed)
    }

    /// `map_block`: maps the pages covering the first `size` bytes of unmapped
    /// block `id`, splits off what stays unmapped, and merges the mapped part
    /// with free neighbours. `Ok(false)` when the device is out of memory.
    fn map_block(&mut self, id: u32, size: u64) -> Result<bool, AllocError> {
        let b = &self.arena[id];
        debug_assert!(!b.mapped && size <= b.size);
        let seg = self.expandable[b.expandable as usize].expect("block of a live expandable segment");
        let (ptr, bsize, stream, kind) = (b.ptr, b.size, b.stream, b.pool);
        let begin = (ptr - seg.base) / seg.page;
        let end = (ptr + size - seg.base).div_ceil(seg.page);
        let (range_ptr, range_size) = (seg.base + begin * seg.page, (end - begin) * seg.page);
        debug_assert_eq!(range_ptr, ptr, "unmapped blocks start on page boundaries");
        match self.device.map(range_ptr, range_size, seg.page) {
            Ok(()) => {}
            Err(e) if e.is_out_of_memory() => {
                self.last_failure = Some(Failure::Device(e));
                return Ok(false);
            }
            Err(e) => return Err(e.into()),
        }
        self.pool_mut(kind).unmapped.remove(&(stream, ptr));
        self.arena[id].mapped = true;
        if range_size < bsize {
            let mut rest = Block::new(ptr + range_size, bsize - range_size, stream, kind);
            rest.mapped = false;
            rest.expandable = self.arena[id].expandable;
            rest.prev = id;
            rest.next = self.arena[id].next;
            let rest_id = self.arena.insert(rest);
            let next = self.arena[id].next;
            if next != NIL {
                self.arena[next].prev = rest_id;
            }
            self.arena[id].next = rest_id;
            self.arena[id].size = range_size;
            self.pool_mut(kind).unmapped.insert((stream, ptr + range_size), rest_id);
        }
        let (prev, next) = (self.arena[id].prev, self.arena[id].next);
        self.try_merge_blocks(id, prev);
        self.try_merge_blocks(id, next);
        self.insert_into_blocks(id);
        self.total_allocated_memory += range_size;
        stats::increase(&mut self.stats.reserved_bytes, kind, range_size);
        self.stats.num_device_alloc += 1;
        self.trace(Action::SegmentMap, range_ptr, range_size, stream);
        Ok(true)
    }

    /// `unmap_block`: unmaps the whole pages inside free block `id`; partial
    /// pages at either end stay mapped as free blocks.
    pub(crate) fn unmap_block(&mut self, id: u32) -> Result<(), AllocError> {
        let b = &self.arena[id];
        let seg = self.expandable[b.expandable as usize].expect("block of a live expandable segment");
        let (ptr, size, stream, kind, prev, next) = (b.ptr, b.size, b.stream, b.pool, b.prev, b.next);
        let begin = (ptr - seg.base).div_ceil(seg.page);
        let end = (ptr + size - seg.base) / seg.page;
        if begin >= end {
            return Ok(());
        }
        let (un_ptr, un_size) = (seg.base + begin * seg.page, (end - begin) * seg.page);
        self.device.unmap(un_ptr, un_size, seg.page, stream)?;
        self.pool_mut(kind).blocks.remove(stream, size, ptr);
        let before = un_ptr - ptr;
        if before > 0 {
            let mut f = Block::new(ptr, before, stream, kind);
            f.expandable = self.arena[id].expandable;
            f.prev = prev;
            f.next = id;
            let fid = self.arena.insert(f);
            if prev != NIL {
                self.arena[prev].next = fid;
            }
            self.arena[id].prev = fid;
            self.insert_into_blocks(fid);
        }
        let after = size - before - un_size;
        if after > 0 {
            let mut f = Block::new(un_ptr + un_size, after, stream, kind);
            f.expandable = self.arena[id].expandable;
            f.prev = id;
            f.next = next;
            let fid = self.arena.insert(f);
            if next != NIL {
                self.arena[next].prev = fid;
            }
            self.arena[id].next = fid;
            self.insert_into_blocks(fid);
        }
        let b = &mut self.arena[id];
        b.ptr = un_ptr;
        b.size = un_size;
        b.mapped = false;
        let (prev, next) = (b.prev, b.next);
        self.try_merge_blocks(id, prev);
        self.try_merge_blocks(id, next);
        let new_ptr = self.arena[id].ptr;
        self.pool_mut(kind).unmapped.insert((stream, new_ptr), id);
        self.total_allocated_memory -= un_size;
        stats::decrease(&mut self.stats.reserved_bytes, kind, un_size);
        self.stats.num_device_free += 1;
        self.trace(Action::SegmentUnmap, un_ptr, un_size, stream);
        Ok(())
    }

    /// Destroys an expandable segment whose single block is entirely unmapped.
    pub(crate) fn release_expandable_segment(&mut self, id: u32) -> Result<(), AllocError> {
        let b = &self.arena[id];
        let index = b.expandable as usize;
        let seg = self.expandable[index].expect("block of a live expandable segment");
        debug_assert!(!b.mapped && b.ptr == seg.base && b.size == seg.va_size);
        let (stream, kind) = (b.stream, b.pool);
        self.device.release_reservation(seg.base, seg.va_size)?;
        self.pool_mut(kind).unmapped.remove(&(stream, seg.base));
        self.arena.remove(id);
        self.expandable[index] = None;
        Ok(())
    }
}
