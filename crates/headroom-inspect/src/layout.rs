//! Fragmentation measured on the segments at one moment: what is reserved
//! but not allocated, the largest request that could still be served
//! without a new segment, and the free bytes `empty_cache()` cannot return
//! because they share a segment with a live block.

use headroom_alloc::{BlockState, SegmentSnapshot};
use headroom_trace::snapshot::{Segment, StackId};
use rustc_hash::FxHashMap;
use serde::Serialize;

/// One block as the segment map draws it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarBlock {
    pub address: u64,
    pub size: u64,
    pub state: BlockState,
    /// The call site holding it (an id of [`crate::sites::Sites`]), where known.
    pub site: Option<u32>,
}

/// One segment as the segment map draws it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentBar {
    pub address: u64,
    pub size: u64,
    pub expandable: bool,
    /// Its blocks, by address.
    pub blocks: Vec<BarBlock>,
}

/// Fragmentation measures of one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Fragmentation {
    pub segments: usize,
    pub reserved_bytes: u64,
    /// Active blocks, pending frees included.
    pub active_bytes: u64,
    /// Reserved minus active: cached, free, and not the caller's.
    pub free_bytes: u64,
    /// The largest free block: the largest request the cache could serve
    /// without asking the device (within its pool).
    pub largest_free_block_bytes: u64,
    /// Free bytes in segments that also hold an active block: split blocks
    /// that `empty_cache()` cannot return.
    pub inactive_split_bytes: u64,
    /// Free bytes in segments with no active block: `empty_cache()` returns these.
    pub releasable_bytes: u64,
}

/// Segments a segment map draws, the largest first: the static map and the
/// script's redraw show the same ones.
pub const MAP_SEGMENTS: usize = 48;

/// The segments of one moment, for measuring and drawing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    pub segments: Vec<SegmentBar>,
}

impl Layout {
    /// The segments a snapshot recorded for `device`, each active block
    /// named after the site of its recorded stack (`site_of`).
    pub fn recorded<'a>(
        segments: impl IntoIterator<Item = &'a Segment>,
        device: u32,
        mut site_of: impl FnMut(StackId) -> u32,
    ) -> Layout {
        let mut segments: Vec<SegmentBar> = segments
            .into_iter()
            .filter(|s| s.device == device)
            .map(|s| SegmentBar {
                address: s.address,
                size: s.total_size,
                expandable: s.is_expandable,
                blocks: s
                    .blocks
                    .iter()
                    .map(|b| BarBlock {
                        address: b.address,
                        size: b.size,
                        state: b.state,
                        site: (b.state != BlockState::Inactive && b.stack != 0).then(|| site_of(b.stack)),
                    })
                    .collect(),
            })
            .collect();
        segments.sort_by_key(|s| s.address);
        Layout { segments }
    }

    /// The segments of a replayed allocator; `sites` names the live blocks by
    /// address (the replay's addresses are the recorded ones where it matches).
    pub fn replayed(segments: &[SegmentSnapshot], sites: &FxHashMap<u64, u32>) -> Layout {
        Layout {
            segments: segments
                .iter()
                .map(|s| SegmentBar {
                    address: s.address,
                    size: s.total_size,
                    expandable: s.is_expandable,
                    blocks: s
                        .blocks
                        .iter()
                        .map(|b| BarBlock {
                            address: b.address,
                            size: b.size,
                            state: b.state,
                            site: (b.state != BlockState::Inactive).then(|| sites.get(&b.address).copied()).flatten(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// The [`MAP_SEGMENTS`] largest segments (by address among equals),
    /// and how many there are in all.
    pub fn map_segments(&self) -> (Vec<&SegmentBar>, usize) {
        let mut segs: Vec<&SegmentBar> = self.segments.iter().collect();
        segs.sort_by(|a, b| b.size.cmp(&a.size).then(a.address.cmp(&b.address)));
        let total = segs.len();
        segs.truncate(MAP_SEGMENTS);
        (segs, total)
    }

    pub fn fragmentation(&self) -> Fragmentation {
        let mut f = Fragmentation { segments: self.segments.len(), ..Default::default() };
        for s in &self.segments {
            f.reserved_bytes += s.size;
            let free: u64 = s.blocks.iter().filter(|b| b.state == BlockState::Inactive).map(|b| b.size).sum();
            let active = s.size.saturating_sub(free);
            f.active_bytes += active;
            f.free_bytes += free;
            if active > 0 {
                f.inactive_split_bytes += free;
            } else {
                f.releasable_bytes += free;
            }
            let largest =
                s.blocks.iter().filter(|b| b.state == BlockState::Inactive).map(|b| b.size).max().unwrap_or(0);
            f.largest_free_block_bytes = f.largest_free_block_bytes.max(largest);
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(at: u64, list: &[(u64, BlockState)]) -> Vec<BarBlock> {
        let mut address = at;
        list.iter()
            .map(|&(size, state)| {
                let b = BarBlock { address, size, state, site: None };
                address += size;
                b
            })
            .collect()
    }

    #[test]
    fn split_free_bytes_are_told_apart_from_releasable_ones() {
        let l = Layout {
            segments: vec![
                SegmentBar {
                    address: 0,
                    size: 20 << 20,
                    expandable: false,
                    blocks: blocks(0, &[(4 << 20, BlockState::ActiveAllocated), (16 << 20, BlockState::Inactive)]),
                },
                SegmentBar {
                    address: 1 << 30,
                    size: 2 << 20,
                    expandable: false,
                    blocks: blocks(1 << 30, &[(2 << 20, BlockState::Inactive)]),
                },
            ],
        };
        let f = l.fragmentation();
        assert_eq!(f.reserved_bytes, 22 << 20);
        assert_eq!(f.active_bytes, 4 << 20);
        assert_eq!(f.free_bytes, 18 << 20);
        assert_eq!(f.inactive_split_bytes, 16 << 20);
        assert_eq!(f.releasable_bytes, 2 << 20);
        assert_eq!(f.largest_free_block_bytes, 16 << 20);
    }
}
