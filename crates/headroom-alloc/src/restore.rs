//! Starting from a known state instead of from empty: a segment the device
//! already holds, with some of its blocks allocated.
//!
//! A snapshot's trace rarely starts at process start (recording begins after
//! the model is loaded, or the ring buffer wrapped), so a replay first puts
//! the allocator where the recorded one was when the trace began. The free
//! blocks are not given: in PyTorch's allocator free neighbours are always
//! merged, so the free blocks of a segment are exactly the gaps between its
//! allocated ones.

use crate::block::{Block, NIL};
use crate::caching::{DeviceCachingAllocator, SegmentRec};
use crate::device::{DeviceMemory, StreamId};
use crate::error::AllocError;
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

        let split = pieces.len() > 1;
        let mut prev = NIL;
        let mut ids = Vec::with_capacity(pieces.len());
        for &(ptr, bsize, l) in &pieces {
            let mut b = Block::new(ptr, bsize, stream, pool);
            b.prev = prev;
            if let Some(l) = l {
                b.allocated = true;
                b.requested_size = l.requested_size;
            }
            let id = self.arena.insert(b);
            if prev != NIL {
                self.arena[prev].next = id;
            }
            prev = id;
            ids.push(id);
        }
        self.total_allocated_memory += size;
        self.segments.insert(address, SegmentRec { size, stream, pool });
        stats::increase(&mut self.stats.segment, pool, 1);
        stats::increase(&mut self.stats.reserved_bytes, pool, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        for (&id, &(ptr, bsize, l)) in ids.iter().zip(&pieces) {
            match l {
                Some(l) => {
                    self.active.insert(ptr, id);
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
