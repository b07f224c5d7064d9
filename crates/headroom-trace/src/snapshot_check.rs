//! Whether a snapshot's segments can be the state of one allocator: each
//! segment tiled by its blocks, no two segments of a device on the same
//! bytes. PyTorch's own snapshots always are; a file that is not was edited
//! or corrupted, and every figure read from it would be wrong without a
//! word (allocated above reserved, the same bytes counted twice), so it is
//! refused with the segment named.

use crate::memory_snapshot::{MemorySnapshot, Segment};
use headroom_alloc::units::format_size;

/// The first inconsistency among `snap`'s segments, as a message naming it.
pub fn check_segments(snap: &MemorySnapshot) -> Result<(), String> {
    for (i, s) in snap.segments.iter().enumerate() {
        check_segment(i, s)?;
    }
    let mut order: Vec<usize> = (0..snap.segments.len()).collect();
    order.sort_by_key(|&i| (snap.segments[i].device, snap.segments[i].address));
    for pair in order.windows(2) {
        let (i, j) = (pair[0], pair[1]);
        let (a, b) = (&snap.segments[i], &snap.segments[j]);
        if a.device != b.device {
            continue;
        }
        // Checked above: neither end passes 2^64.
        let a_end = a.address + a.total_size;
        if a.address == b.address && a.total_size == b.total_size {
            return Err(format!(
                "segments {} and {} are the same segment ({} at {:#x} on device {}), listed twice",
                i.min(j),
                i.max(j),
                format_size(a.total_size),
                a.address,
                a.device
            ));
        }
        if b.address < a_end {
            return Err(format!(
                "segments {i} ({:#x}–{a_end:#x}) and {j} ({:#x}–{:#x}) of device {} overlap: one allocator never \
                 holds the same bytes twice",
                a.address,
                b.address,
                b.address + b.total_size,
                a.device
            ));
        }
    }
    Ok(())
}

fn check_segment(i: usize, s: &Segment) -> Result<(), String> {
    let what = || format!("segment {i} ({:#x} on device {})", s.address, s.device);
    let Some(end) = s.address.checked_add(s.total_size) else {
        return Err(format!("{}: its total_size of {} bytes runs past the 64-bit address space", what(), s.total_size));
    };
    let mut at = s.address;
    for (k, b) in s.blocks.iter().enumerate() {
        if b.address != at {
            return Err(format!(
                "{}: block {k} is at {:#x}, but the blocks before it end at {at:#x} (a segment's blocks tile it, \
                 in address order)",
                what(),
                b.address
            ));
        }
        at = match at.checked_add(b.size).filter(|&e| e <= end) {
            Some(e) => e,
            None => {
                return Err(format!(
                    "{}: block {k} ({} bytes at {:#x}) runs past the segment's end at {end:#x} (total_size {})",
                    what(),
                    b.size,
                    b.address,
                    s.total_size
                ))
            }
        };
    }
    if at != end {
        let sum = at - s.address;
        return Err(format!(
            "{}: its blocks add up to {} ({sum} bytes) but its total_size is {} ({} bytes)",
            what(),
            format_size(sum),
            format_size(s.total_size),
            s.total_size
        ));
    }
    Ok(())
}
