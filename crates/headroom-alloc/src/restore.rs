//! Starting from a known state instead of from empty: a segment the device
//! already holds, with some of its blocks allocated.
//!
//! A snapshot's trace rarely starts at process start (recording begins after
//! the model is loaded, or the ring buffer wrapped), so a replay first puts
//! the allocator where the recorded one was when the trace began. The free
//! blocks are not given: in PyTorch's allocator free neighbours are always
//! merged, so the free blocks of a segment are exactly the gaps between its
//! allocated ones.
//!
//! An expandable segment is adopted as its reservation with the runs of it
//! that were mapped ([`DeviceCachingAllocator::adopt_expandable_segment`]):
//! its free blocks are the mapped gaps between live blocks, and what lies
//! between the runs is unmapped.

use crate::block::{Block, NIL};
use crate::caching::{DeviceCachingAllocator, ExpandableSegment, SegmentRec};
use crate::device::{DeviceMemory, StreamId};
use crate::error::AllocError;
use crate::mempool::{MempoolId, DEFAULT_MEMPOOL};
use crate::policy::Policy;
use crate::stats::{self, PoolKind};

/// An allocated block of a segment being adopted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    pub address: u64,
    /// Rounded size, as the allocator handed it out.
    pub size: u64,
    /// The caller's unrounded size.
    pub requested_size: u64,
}

impl<D: DeviceMemory, P: Policy> DeviceCachingAllocator<D, P> {
    /// Adopts the (non-expandable) segment `[address, address + size)`,
    /// which the device already holds, with `live` allocated and the gaps
    /// between them free and cached. `live` must be sorted by address, lie
    /// inside the segment and not overlap. Nothing changes on error.
    ///
    /// Adopted segments count as reserved, but not as device calls.
    pub fn adopt_segment(
        &mut self,
        address: u64,
        size: u64,
        stream: StreamId,
        pool: PoolKind,
        live: &[LiveBlock],
    ) -> Result<(), AllocError> {
        self.adopt_segment_in_pool(address, size, stream, pool, DEFAULT_MEMPOOL, live)
    }

    /// [`Self::adopt_segment`] into the pool `pool_id` (a private pool is made,
    /// with a use count of 1, if it does not exist).
    pub fn adopt_segment_in_pool(
        &mut self,
        address: u64,
        size: u64,
        stream: StreamId,
        pool: PoolKind,
        pool_id: MempoolId,
        live: &[LiveBlock],
    ) -> Result<(), AllocError> {
        let invalid = |m: String| Err(AllocError::InvalidArgument(m));
        if size == 0 {
            return invalid(format!("segment {address:#x} has no bytes"));
        }
        let end = address.checked_add(size).ok_or(AllocError::InvalidArgument("segment wraps".into()))?;
        if self.segments.range(..end).next_back().is_some_and(|(&b, s)| b + s.size > address) {
            return invalid(format!("segment {address:#x}+{size} overlaps a segment the allocator holds"));
        }
        // The pieces, in address order: (ptr, size, live block or None for a gap).
        let mut pieces: Vec<(u64, u64, Option<&LiveBlock>)> = Vec::with_capacity(2 * live.len() + 1);
        let mut at = address;
        for b in live {
            if b.size == 0 || b.address < at || b.address.checked_add(b.size).is_none_or(|e| e > end) {
                return invalid(format!(
                    "block {:#x}+{} is not inside segment {address:#x}+{size} after the blocks before it",
                    b.address, b.size
                ));
            }
            if b.address > at {
                pieces.push((at, b.address - at, None));
            }
            pieces.push((b.address, b.size, Some(b)));
            at = b.address + b.size;
        }
        if at < end {
            pieces.push((at, end - at, None));
        }

        let owner = self.owner_or_new(pool_id)?;
        let split = pieces.len() > 1;
        let ids = self.insert_chain(pieces.iter().map(|&(ptr, bsize, l)| {
            let mut b = Block::new(ptr, bsize, stream, pool, owner);
            adopt_live(&mut b, l);
            b
        }));
        self.total_allocated_memory += size;
        self.segments.insert(address, SegmentRec { size, stream, pool, owner });
        stats::increase(&mut self.stats.segment, pool, 1);
        stats::increase(&mut self.stats.reserved_bytes, pool, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        for (&id, &(ptr, bsize, l)) in ids.iter().zip(&pieces) {
            match l {
                Some(l) => {
                    if self.pointer_map {
                        self.active.insert(ptr, id);
                    }
                    let s = &mut self.stats;
                    stats::increase(&mut s.allocation, pool, 1);
                    stats::increase(&mut s.allocated_bytes, pool, bsize);
                    stats::increase(&mut s.active, pool, 1);
                    stats::increase(&mut s.active_bytes, pool, bsize);
                    stats::increase(&mut s.requested_bytes, pool, l.requested_size);
                    if bsize >= self.config.max_split_size {
                        self.stats.oversize_allocations.increase(1);
                    }
                }
                None => {
                    self.insert_into_blocks(id);
                    if split {
                        stats::increase(&mut self.stats.inactive_split, pool, 1);
                        stats::increase(&mut self.stats.inactive_split_bytes, pool, bsize);
                    }
                }
            }
        }
        Ok(())
    }
}

/// An expandable segment as it was: its reservation and what was mapped in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpandableLayout {
    /// The reservation.
    pub base: u64,
    pub va_size: u64,
    /// Its page: the unit mapped and unmapped.
    pub page: u64,
    pub stream: StreamId,
    pub pool: PoolKind,
    /// The pool it belongs to: [`DEFAULT_MEMPOOL`] or a private pool's id.
    pub pool_id: MempoolId,
    /// Mapped runs, `(address, size)`, by address, not touching one another.
    pub runs: Vec<(u64, u64)>,
}

impl<D: DeviceMemory, P: Policy> DeviceCachingAllocator<D, P> {
    /// The page and reservation size a new expandable segment of `pool` gets
    /// (PyTorch's: 1.125 times the device, in whole pages).
    pub fn expandable_reservation(&self, pool: PoolKind) -> (u64, u64) {
        let page = self.policy.page_size(&self.config, pool);
        let total = self.device_total;
        (page, (total + total / 8).div_ceil(page) * page)
    }

    /// Adopts an expandable segment the device already holds (reserved, and
    /// mapped where `layout.runs` say), with `live` allocated and the other
    /// mapped bytes free and cached. Runs must start and end on page
    /// boundaries of the reservation; `live` must be sorted by address and
    /// lie inside runs. Nothing changes on error.
    ///
    /// Mapped runs count as reserved, not as device calls.
    pub fn adopt_expandable_segment(
        &mut self,
        layout: &ExpandableLayout,
        live: &[LiveBlock],
    ) -> Result<(), AllocError> {
        let invalid = |m: String| Err(AllocError::InvalidArgument(m));
        let ExpandableLayout { base, va_size, page, stream, pool, pool_id, ref runs } = *layout;
        let end = base.checked_add(va_size).ok_or(AllocError::InvalidArgument("reservation wraps".into()))?;
        if page == 0 || va_size % page != 0 {
            return invalid(format!("reservation {base:#x}+{va_size} is not in whole pages of {page}"));
        }
        let taken = self.expandable.values().any(|e| e.base < end && base < e.base + e.va_size)
            || self.segments.range(..end).next_back().is_some_and(|(&b, s)| b + s.size > base);
        if taken {
            return invalid(format!("reservation {base:#x}+{va_size} overlaps memory the allocator holds"));
        }
        // The pieces, in address order: (ptr, size, mapped, live block).
        let mut pieces: Vec<(u64, u64, bool, Option<&LiveBlock>)> =
            Vec::with_capacity(2 * live.len() + 2 * runs.len() + 1);
        let mut at = base;
        let mut blocks = live.iter().peekable();
        for &(start, len) in runs {
            let run_end = start.saturating_add(len);
            let aligned = (start - base.min(start)) % page == 0 && len % page == 0;
            if len == 0 || start < at || run_end > end || !aligned {
                return invalid(format!(
                    "mapped run {start:#x}+{len} is not whole pages of {page} in order inside {base:#x}+{va_size}"
                ));
            }
            if start > at {
                pieces.push((at, start - at, false, None));
            }
            at = start;
            while let Some(b) = blocks.next_if(|b| b.address < run_end) {
                if b.size == 0 || b.address < at || b.address.checked_add(b.size).is_none_or(|e| e > run_end) {
                    return invalid(format!(
                        "block {:#x}+{} is not inside a mapped run after the blocks before it",
                        b.address, b.size
                    ));
                }
                if b.address > at {
                    pieces.push((at, b.address - at, true, None));
                }
                pieces.push((b.address, b.size, true, Some(b)));
                at = b.address + b.size;
            }
            if at < run_end {
                pieces.push((at, run_end - at, true, None));
            }
            at = run_end;
        }
        if let Some(b) = blocks.next() {
            return invalid(format!("block {:#x} lies in no mapped run of {base:#x}+{va_size}", b.address));
        }
        if at < end {
            pieces.push((at, end - at, false, None));
        }

        let owner = self.owner_or_new(pool_id)?;
        let index = self.next_expandable;
        self.next_expandable += 1;
        self.expandable.insert(index, ExpandableSegment { base, va_size, page, stream, pool, owner });
        // An adopted reservation is one a request may grow in, like one the allocator made.
        self.largest_reservation = self.largest_reservation.max(va_size);
        let ids = self.insert_chain(pieces.iter().map(|&(ptr, size, mapped, l)| {
            let mut b = Block::new(ptr, size, stream, pool, owner);
            b.mapped = mapped;
            b.expandable = index;
            adopt_live(&mut b, l);
            b
        }));
        for (&id, &(ptr, size, mapped, l)) in ids.iter().zip(&pieces) {
            match (mapped, l) {
                (_, Some(l)) => {
                    if self.pointer_map {
                        self.active.insert(ptr, id);
                    }
                    let s = &mut self.stats;
                    stats::increase(&mut s.allocation, pool, 1);
                    stats::increase(&mut s.allocated_bytes, pool, size);
                    stats::increase(&mut s.active, pool, 1);
                    stats::increase(&mut s.active_bytes, pool, size);
                    stats::increase(&mut s.requested_bytes, pool, l.requested_size);
                    if size >= self.config.max_split_size {
                        self.stats.oversize_allocations.increase(1);
                    }
                }
                (true, None) => self.insert_into_blocks(id),
                (false, None) => {
                    self.pool_mut(owner, pool).unmapped.insert((stream, ptr), id);
                }
            }
        }
        let mapped: u64 = runs.iter().map(|r| r.1).sum();
        self.total_allocated_memory += mapped;
        stats::increase(&mut self.stats.reserved_bytes, pool, mapped);
        Ok(())
    }
}

impl<D: DeviceMemory, P: Policy> DeviceCachingAllocator<D, P> {
    /// Puts one segment's blocks, given in address order, into the arena linked as the
    /// segment's chain (`prev`/`next`), and returns their ids in the same order.
    fn insert_chain(&mut self, blocks: impl ExactSizeIterator<Item = Block>) -> Vec<u32> {
        let mut prev = NIL;
        let mut ids = Vec::with_capacity(blocks.len());
        for mut b in blocks {
            b.prev = prev;
            let id = self.arena.insert(b);
            if prev != NIL {
                self.arena[prev].next = id;
            }
            prev = id;
            ids.push(id);
        }
        ids
    }
}

/// Marks `b` as the live block `l` describes, or leaves it free where there is none.
fn adopt_live(b: &mut Block, l: Option<&LiveBlock>) {
    if let Some(l) = l {
        b.allocated = true;
        b.requested_size = l.requested_size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::MIB;
    use crate::{AllocatorConfig, SimDevice};

    fn allocator() -> DeviceCachingAllocator<SimDevice> {
        DeviceCachingAllocator::new(SimDevice::new(1 << 40), AllocatorConfig::default())
    }

    #[test]
    fn an_adopted_segment_behaves_as_one_the_allocator_made() {
        // The same state reached two ways: by allocating, and by adopting.
        let mut made = allocator();
        made.device_mut().push_next_address(0x1000_0000);
        let a = made.malloc(3 * MIB, 0).unwrap();
        let b = made.malloc(5 * MIB, 0).unwrap();
        let c = made.malloc(4 * MIB, 0).unwrap();
        made.free(b.ptr).unwrap();

        let mut adopted = allocator();
        adopted.device_mut().adopt_segment(0x1000_0000, 20 * MIB).unwrap();
        let live = [
            LiveBlock { address: a.ptr, size: a.size, requested_size: 3 * MIB },
            LiveBlock { address: c.ptr, size: c.size, requested_size: 4 * MIB },
        ];
        adopted.adopt_segment(0x1000_0000, 20 * MIB, 0, PoolKind::Large, &live).unwrap();
        adopted.validate().unwrap();
        for key in ["allocated_bytes.all.current", "reserved_bytes.all.current", "inactive_split_bytes.all.current"] {
            assert_eq!(made.memory_stats()[key], adopted.memory_stats()[key], "{key}");
        }
        // Both now serve the same request from the same gap, and free into one block.
        assert_eq!(made.malloc(5 * MIB, 0).unwrap().ptr, adopted.malloc(5 * MIB, 0).unwrap().ptr);
        adopted.free(a.ptr).unwrap();
        adopted.free(c.ptr).unwrap();
        adopted.validate().unwrap();
        assert_eq!(adopted.stats().num_device_alloc, 0, "adopting is not a device call");
    }

    /// An expandable segment with a hole unmapped in the middle, reached by
    /// allocating and by adopting its reservation and runs: the same state,
    /// the same next decision.
    #[test]
    fn an_adopted_expandable_segment_behaves_as_one_the_allocator_made() {
        let config = AllocatorConfig::parse("expandable_segments:True").unwrap();
        let mut made = DeviceCachingAllocator::new(SimDevice::new(1 << 30), config.clone());
        let a = made.malloc(30 * MIB, 0).unwrap();
        let b = made.malloc(50 * MIB, 0).unwrap();
        let c = made.malloc(30 * MIB, 0).unwrap();
        made.free(b.ptr).unwrap();
        made.empty_cache().unwrap();
        let snap = made.snapshot();
        let runs: Vec<(u64, u64)> = snap.segments.iter().map(|s| (s.address, s.total_size)).collect();
        assert_eq!(runs.len(), 2, "the hole between the runs was unmapped: {runs:?}");
        let live: Vec<LiveBlock> =
            [a, c].iter().map(|x| LiveBlock { address: x.ptr, size: x.size, requested_size: 30 * MIB }).collect();

        let mut adopted = DeviceCachingAllocator::new(SimDevice::new(1 << 30), config);
        let (page, va_size) = adopted.expandable_reservation(PoolKind::Large);
        let layout = ExpandableLayout {
            base: runs[0].0,
            va_size,
            page,
            stream: 0,
            pool: PoolKind::Large,
            pool_id: DEFAULT_MEMPOOL,
            runs,
        };
        adopted.device_mut().adopt_reservation(layout.base, va_size, page, &layout.runs).unwrap();
        adopted.adopt_expandable_segment(&layout, &live).unwrap();
        adopted.validate().unwrap();
        for key in ["allocated_bytes.all.current", "reserved_bytes.all.current", "active_bytes.all.current"] {
            assert_eq!(made.memory_stats()[key], adopted.memory_stats()[key], "{key}");
        }
        // Both grow the free block before the hole into it, and map the same page.
        assert_eq!(made.malloc(15 * MIB, 0).unwrap().ptr, adopted.malloc(15 * MIB, 0).unwrap().ptr);
        assert_eq!(made.reserved_bytes(), adopted.reserved_bytes());
        adopted.validate().unwrap();
        // A run off the page grid is refused, and changes nothing.
        let mut other = DeviceCachingAllocator::new(SimDevice::new(1 << 30), AllocatorConfig::default());
        let bad = ExpandableLayout { runs: vec![(layout.base + MIB, page)], ..layout };
        assert!(other.adopt_expandable_segment(&bad, &[]).is_err());
        assert_eq!(other.reserved_bytes(), 0);
        other.validate().unwrap();
    }

    #[test]
    fn bad_layouts_are_refused_and_change_nothing() {
        let mut a = allocator();
        let outside = [LiveBlock { address: 0x2000_0000 + 19 * MIB, size: 2 * MIB, requested_size: 1 }];
        assert!(a.adopt_segment(0x2000_0000, 20 * MIB, 0, PoolKind::Large, &outside).is_err());
        let overlapping = [
            LiveBlock { address: 0x2000_0000, size: 2 * MIB, requested_size: 1 },
            LiveBlock { address: 0x2000_0000 + MIB, size: 2 * MIB, requested_size: 1 },
        ];
        assert!(a.adopt_segment(0x2000_0000, 20 * MIB, 0, PoolKind::Large, &overlapping).is_err());
        assert_eq!(a.reserved_bytes(), 0);
        a.validate().unwrap();
        a.adopt_segment(0x2000_0000, 20 * MIB, 0, PoolKind::Large, &[]).unwrap();
        assert!(a.adopt_segment(0x2000_0000 + 10 * MIB, 20 * MIB, 0, PoolKind::Large, &[]).is_err());
    }
}
