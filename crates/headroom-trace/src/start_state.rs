//! The allocator's state when a snapshot's trace begins.
//!
//! Most traces start mid-run: recording was turned on after the model was
//! loaded, or the ring buffer let the oldest entries go. The state at the
//! first entry is found by undoing the trace from the final segments
//! backwards: a `segment_alloc` had not happened yet, a `segment_free`'s
//! segment still existed, an `alloc`'s block was not live yet, a
//! `free_completed`'s block still was. In PyTorch's allocator free
//! neighbours always merge, so the segments and the live blocks are the
//! whole state.
//!
//! What the trace cannot say is the size of a block allocated before it
//! began and freed within it: the entry has only the caller's request. The
//! block is `round_size(request)`, except that in the large pool a remainder
//! of at most 1 MiB is not split off (`should_split`), so the block may reach
//! further, up to the next boundary: the next live block, the end of the
//! segment, or the lowest address the trace allocates above the block while
//! it is still live (an allocation at `x` means a free block began at `x`,
//! so the bytes below `x` were taken). A gap of at most 1 MiB up to that
//! boundary belongs to the block (research/replay-feasibility.md).
//!
//! Expandable segments are listed by their mapped runs. The runs mapped when
//! the trace began are the final ones with the trace's `segment_map`s undone
//! and its `segment_unmap`s redone; each becomes a [`StartSegment`] with
//! `expandable` set, and the replay rebuilds the reservations around them.
//! A run need not begin its reservation: pages below it may have been
//! unmapped before the trace began (a release unmaps whole free pages and
//! keeps the reservation while any page stays mapped), and PyTorch maps the
//! lowest unmapped pages of a stream's reservations first. So each run also
//! carries the lowest address the trace maps below it in what can only be its
//! own reservation (`reserved_from`).

use crate::memory_snapshot::{MemorySnapshot, TraceAction, TraceEvent};
use headroom_alloc::config::{SMALL_BUFFER, SMALL_SIZE};
use headroom_alloc::sizing;
use headroom_alloc::{AllocatorConfig, BlockState, LiveBlock, MempoolId, PoolKind, StreamId};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// A segment as it was when the trace began.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartSegment {
    pub address: u64,
    pub size: u64,
    pub stream: StreamId,
    pub pool: PoolKind,
    pub expandable: bool,
    /// Expandable runs: the lowest address the trace maps below the run, on the run's stream,
    /// pool id and page grid, while the reservation holding the run is still mapped and above
    /// the segment before it: the reservation reaches down at least that far. The run's own
    /// address where the trace maps nothing below it.
    pub reserved_from: u64,
    /// `segment_pool_id`: (0, 0), or a private pool's (CUDA graphs, `MemPool`).
    pub pool_id: MempoolId,
    /// Blocks live then, by address.
    pub live: Vec<LiveBlock>,
}

/// One device's state when its trace began.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartState {
    /// By address.
    pub segments: Vec<StartSegment>,
    /// Blocks whose size had to be inferred (allocated before the trace, freed in it).
    pub inferred_blocks: usize,
}

impl StartState {
    pub fn reserved_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size).sum()
    }
    pub fn allocated_bytes(&self) -> u64 {
        self.segments.iter().flat_map(|s| &s.live).map(|b| b.size).sum()
    }
    pub fn live_blocks(&self) -> usize {
        self.segments.iter().map(|s| s.live.len()).sum()
    }
    /// True when the trace starts from an empty allocator.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }
}

/// The trace contradicts its own final state: it is not one contiguous
/// recording of this allocator.
#[derive(Debug, thiserror::Error)]
#[error("device {device}: {message}")]
pub struct InconsistentTrace {
    pub device: u32,
    pub message: String,
}

struct Live {
    /// Known when the block is still live at the end.
    size: Option<u64>,
    requested: u64,
    /// Trace index of the free that ended it, for blocks freed within the trace.
    freed_at: Option<usize>,
}

/// A segment by address: (size, stream, pool if recorded, expandable, pool id).
type Seg = (u64, StreamId, Option<PoolKind>, bool, MempoolId);

/// Who owns an expandable range: (end, stream, pool if recorded, pool id) by start.
type Owners = BTreeMap<u64, (u64, StreamId, Option<PoolKind>, MempoolId)>;

/// What the final segments say, then the trace undone: segments by address,
/// blocks live by address, and the mapped ranges of expandable segments
/// (start -> end).
struct Undone {
    segs: BTreeMap<u64, Seg>,
    // Hashed while walking (a million inserts and removes in a long trace), sorted after.
    live: FxHashMap<u64, Live>,
    mapped: BTreeMap<u64, u64>,
    /// The entries that map or unmap pages, last first: found by the walk that undoes the
    /// trace, so that the owners of expandable ranges and the reservations below the runs
    /// read a few of them, not another walk of millions of entries.
    paged: Vec<usize>,
}

/// The state of `device` when its trace began, under `config` (the recorded settings).
pub fn infer_start(
    snap: &MemorySnapshot,
    device: u32,
    config: &AllocatorConfig,
) -> Result<StartState, InconsistentTrace> {
    let fail = |message: String| InconsistentTrace { device, message };
    let empty = Vec::new();
    let trace = snap.device_traces.get(device as usize).unwrap_or(&empty);
    let mut undone = final_state(snap, device);
    undo_trace(trace, &mut undone).map_err(fail)?;
    let Undone { mut segs, live, mapped, paged } = undone;
    let paged: Vec<&TraceEvent> = paged.iter().rev().map(|&i| &trace[i]).collect();
    let owners = expandable_owners(snap, device, &paged);
    // What remains mapped was mapped before the trace began: each run is a
    // segment of its own, owned by whoever holds (or later holds) its start.
    segs.retain(|_, s| !s.3);
    add_mapped_runs(&mut segs, &mapped, &owners, trace, config).map_err(fail)?;
    let barrier = barriers(trace, &live);
    let mut state = place_blocks(&segs, live, &barrier, config).map_err(fail)?;
    reservations_below(&mut state.segments, &paged, config);
    Ok(state)
}

/// The segments, live blocks and mapped ranges the snapshot ends with.
fn final_state(snap: &MemorySnapshot, device: u32) -> Undone {
    let mut u =
        Undone { segs: BTreeMap::new(), live: FxHashMap::default(), mapped: BTreeMap::new(), paged: Vec::new() };
    for s in snap.segments.iter().filter(|s| s.device == device) {
        if s.is_expandable {
            add_range(&mut u.mapped, s.address, s.address + s.total_size);
        }
        let pool_id = (s.pool_id.0 as u64, s.pool_id.1 as u64);
        u.segs.insert(s.address, (s.total_size, s.stream, s.pool, s.is_expandable, pool_id));
        for b in s.blocks.iter().filter(|b| b.state != BlockState::Inactive) {
            u.live.insert(b.address, Live { size: Some(b.size), requested: b.requested_size, freed_at: None });
        }
    }
    u
}

/// Who owns each expandable range, from the final runs and `paged`, the trace's maps and
/// unmaps in order.
fn expandable_owners(snap: &MemorySnapshot, device: u32, paged: &[&TraceEvent]) -> Owners {
    let mut owners = Owners::new();
    for s in snap.segments.iter().filter(|s| s.device == device && s.is_expandable) {
        let pool_id = (s.pool_id.0 as u64, s.pool_id.1 as u64);
        owners.insert(s.address, (s.address + s.total_size, s.stream, s.pool, pool_id));
    }
    for e in paged {
        owners.entry(e.addr).or_insert((e.addr.saturating_add(e.size), e.stream, None, e.pool_id));
    }
    owners
}

/// Undoes the trace from its last entry to its first. Expandable segments
/// are listed as their mapped runs; a run that was extended or shrunk within
/// the trace is followed by address afterwards.
fn undo_trace(trace: &[TraceEvent], u: &mut Undone) -> Result<(), String> {
    for (i, e) in trace.iter().enumerate().rev() {
        match e.action {
            TraceAction::Alloc => {
                u.live.remove(&e.addr);
            }
            TraceAction::FreeCompleted | TraceAction::Free => {
                u.live.insert(e.addr, Live { size: None, requested: e.size, freed_at: Some(i) });
            }
            // The guard removes the segment; the arm is the case where there was none.
            TraceAction::SegmentAlloc if u.segs.remove(&e.addr).is_none() => {
                return Err(format!(
                    "entry {i}: segment_alloc of {:#x}, which is not a segment later (a gap in the trace?)",
                    e.addr
                ));
            }
            TraceAction::SegmentFree => {
                u.segs.insert(e.addr, (e.size, e.stream, None, false, e.pool_id));
            }
            // Expandable segments: the mapped ranges, undone the same way.
            TraceAction::SegmentMap => {
                u.paged.push(i);
                if !remove_range(&mut u.mapped, e.addr, e.addr.saturating_add(e.size)) {
                    return Err(format!("entry {i}: segment_map of {:#x}, which is not mapped later", e.addr));
                }
            }
            TraceAction::SegmentUnmap => {
                u.paged.push(i);
                add_range(&mut u.mapped, e.addr, e.addr.saturating_add(e.size));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Each run mapped when the trace began, as a segment of its own.
fn add_mapped_runs(
    segs: &mut BTreeMap<u64, Seg>,
    mapped: &BTreeMap<u64, u64>,
    owners: &Owners,
    trace: &[TraceEvent],
    config: &AllocatorConfig,
) -> Result<(), String> {
    // Runs that touch are one mapped run (one was mapped, or unmapped, in pieces).
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for (&start, &end) in mapped {
        match runs.last_mut() {
            Some(last) if last.1 == start => last.1 = end,
            _ => runs.push((start, end)),
        }
    }
    for (start, end) in runs {
        let owner = owners.range(..=start).next_back().filter(|(_, o)| o.0 > start).map(|(_, o)| *o);
        let owner = owner.or_else(|| owners.range(start..end).next().map(|(_, o)| *o));
        let Some((_, stream, pool, pool_id)) = owner else {
            return Err(format!("expandable range {start:#x} mapped when the trace began belongs to no segment"));
        };
        // A run the final segments no longer show: its pool is that of the blocks it held.
        let pool = pool.or_else(|| {
            let held = |a| matches!(a, TraceAction::Alloc | TraceAction::FreeRequested | TraceAction::FreeCompleted);
            let block = trace.iter().find(|e| held(e.action) && (start..end).contains(&e.addr));
            block.map(|e| sizing::pool_for(sizing::round_size(config, e.size)))
        });
        // Nor blocks: a large pool maps and unmaps whole large pages only, so a run, or a
        // map or unmap in it, that is not is the small pool's.
        let pool = pool.or_else(|| {
            let large_page = sizing::expandable_page_size(config, PoolKind::Large);
            let paged = |e: &TraceEvent| matches!(e.action, TraceAction::SegmentMap | TraceAction::SegmentUnmap);
            let small = !(end - start).is_multiple_of(large_page)
                || trace
                    .iter()
                    .any(|e| paged(e) && (start..end).contains(&e.addr) && !e.size.is_multiple_of(large_page));
            small.then_some(PoolKind::Small)
        });
        segs.insert(start, (end - start, stream, pool, true, pool_id));
    }
    Ok(())
}

/// Barriers from the trace: for each block allocated before the trace and
/// freed in it, the lowest address allocated above it while it lived.
fn barriers(trace: &[TraceEvent], live: &FxHashMap<u64, Live>) -> BTreeMap<u64, u64> {
    let mut barrier: BTreeMap<u64, u64> = BTreeMap::new();
    // By the entry that frees each, followed with a cursor as the trace is read forwards.
    let mut unknown: Vec<(usize, u64)> =
        live.iter().filter(|(_, l)| l.size.is_none()).map(|(&a, l)| (l.freed_at.unwrap_or(0), a)).collect();
    if unknown.is_empty() {
        return barrier;
    }
    unknown.sort_unstable();
    let mut still_live: BTreeMap<u64, ()> = unknown.iter().map(|&(_, a)| (a, ())).collect();
    let mut gone = unknown.iter().peekable();
    for (i, e) in trace.iter().enumerate() {
        while let Some((_, a)) = gone.next_if(|&&(f, _)| f == i) {
            still_live.remove(a);
        }
        // Past the last of them, no allocation is above a block still to be placed.
        if still_live.is_empty() {
            break;
        }
        if e.action == TraceAction::Alloc {
            if let Some((&below, _)) = still_live.range(..e.addr).next_back() {
                let b = barrier.entry(below).or_insert(u64::MAX);
                *b = (*b).min(e.addr);
            }
        }
    }
    barrier
}

/// The live blocks placed in their segments, by address, with the sizes the
/// trace did not record inferred.
fn place_blocks(
    segs: &BTreeMap<u64, Seg>,
    live: FxHashMap<u64, Live>,
    barrier: &BTreeMap<u64, u64>,
    config: &AllocatorConfig,
) -> Result<StartState, String> {
    let mut state = StartState::default();
    let mut live: Vec<(u64, Live)> = live.into_iter().collect();
    live.sort_unstable_by_key(|&(a, _)| a);
    let mut blocks = live.into_iter().peekable();
    for (&address, &(size, stream, pool, expandable, pool_id)) in segs {
        let pool = pool.unwrap_or(if size == SMALL_BUFFER && !expandable { PoolKind::Small } else { PoolKind::Large });
        let end = address + size;
        let mut seg =
            StartSegment { address, size, stream, pool, expandable, pool_id, reserved_from: address, live: Vec::new() };
        while let Some((a, _)) = blocks.peek() {
            if *a < address {
                let a = *a;
                return Err(format!("block {a:#x}, live when the trace began, lies in no segment"));
            }
            if *a >= end {
                break;
            }
            let (a, l) = blocks.next().expect("peeked");
            seg.live.push(LiveBlock { address: a, size: l.size.unwrap_or(0), requested_size: l.requested });
        }
        state.inferred_blocks += infer_sizes(&mut seg, barrier, config);
        let mut at = address;
        for b in &seg.live {
            if b.address < at || b.address + b.size > end {
                return Err(format!(
                    "block {:#x} of {} bytes, live when the trace began, overlaps another or its segment's end",
                    b.address, b.size
                ));
            }
            at = b.address + b.size;
        }
        state.segments.push(seg);
    }
    if let Some((a, _)) = blocks.next() {
        return Err(format!("block {a:#x}, live when the trace began, lies in no segment"));
    }
    Ok(state)
}

/// Sets each expandable run's `reserved_from`. A map below a run, on the run's
/// stream and page grid, while bytes of the run's reservation are still
/// mapped, falls in the run's reservation or in one of the same stream below
/// it; the latter would hold a run of its own when the trace began (it was
/// mapped), and maps are looked for only above the segment before the run.
/// Another owner's maps and unmaps below the run raise that floor above them:
/// reservations never overlap. (A reservation of the stream opened in the trace
/// below the run begins a whole reservation's size below it, too far down for
/// the run's reservation to reach; the replay then keeps the run's address.) `calls`: the
/// trace's maps and unmaps, in order.
fn reservations_below(segments: &mut [StartSegment], calls: &[&TraceEvent], config: &AllocatorConfig) {
    if !segments.iter().any(|s| s.expandable) {
        return;
    }
    for k in 0..segments.len() {
        if !segments[k].expandable {
            continue;
        }
        let floor = k.checked_sub(1).map_or(0, |j| segments[j].address + segments[j].size);
        segments[k].reserved_from = lowest_map_below(&segments[k], floor, calls, config);
    }
}

/// [`reservations_below`] for one run, the segment below it ending at `floor`.
fn lowest_map_below(s: &StartSegment, mut floor: u64, calls: &[&TraceEvent], config: &AllocatorConfig) -> u64 {
    let page = sizing::expandable_page_size(config, s.pool);
    let large_page = sizing::expandable_page_size(config, PoolKind::Large);
    let end = s.address + s.size;
    // Bytes of the run's stream mapped in [floor, end): while there are some, the
    // reservation has not been released (it is, once every page of it is unmapped).
    let mut mapped = s.size;
    let mut below = Vec::new();
    for e in calls {
        let (a, b) = (e.addr.max(floor), e.addr.saturating_add(e.size).min(end));
        if a >= b {
            continue;
        }
        let is_map = e.action == TraceAction::SegmentMap;
        if e.stream != s.stream || e.pool_id != s.pool_id {
            if e.addr < s.address {
                floor = floor.max(e.addr.saturating_add(e.size).min(s.address));
            }
            continue;
        }
        if !is_map {
            mapped = mapped.saturating_sub(b - a);
            if mapped == 0 {
                break;
            }
            continue;
        }
        // A small-pool map is one 2 MiB page (its blocks are at most 1 MiB), never a whole
        // number of large pages: the size says which pool's reservation was grown.
        let pool = if e.size.is_multiple_of(large_page) { PoolKind::Large } else { PoolKind::Small };
        let on_grid = pool == s.pool && e.addr < s.address && (s.address - e.addr).is_multiple_of(page);
        if on_grid && e.addr >= floor {
            below.push(e.addr);
        }
        mapped += b - a;
    }
    below.into_iter().filter(|&a| a >= floor).min().unwrap_or(s.address)
}

/// Sizes of the blocks of `seg` the trace freed, now that their neighbours
/// are known; returns how many there were.
fn infer_sizes(seg: &mut StartSegment, barrier: &BTreeMap<u64, u64>, config: &AllocatorConfig) -> usize {
    let end = seg.address + seg.size;
    let mut inferred = 0;
    for j in 0..seg.live.len() {
        if seg.live[j].size != 0 {
            continue;
        }
        inferred += 1;
        let b = seg.live[j];
        let mut size = sizing::round_size(config, b.requested_size).max(1);
        let next = seg.live.get(j + 1).map_or(end, |n| n.address);
        let bound = next.min(barrier.get(&b.address).copied().unwrap_or(u64::MAX));
        let gap = bound.saturating_sub(b.address + size);
        // Expandable segments split whatever remains (512 bytes and up), as the small pool does.
        if seg.pool == PoolKind::Large && !seg.expandable && gap > 0 && gap <= SMALL_SIZE {
            size += gap;
        }
        seg.live[j].size = size;
    }
    inferred
}

/// Adds `[start, end)` to a set of disjoint ranges.
fn add_range(set: &mut BTreeMap<u64, u64>, start: u64, end: u64) {
    remove_range(set, start, end);
    set.insert(start, end);
}

/// Removes `[start, end)` from a set of disjoint ranges; false if any part of it was not there.
fn remove_range(set: &mut BTreeMap<u64, u64>, start: u64, end: u64) -> bool {
    let overlapping: Vec<(u64, u64)> =
        set.range(..end).rev().take_while(|(_, &e)| e > start).map(|(&s, &e)| (s, e)).collect();
    let covered: u64 = overlapping.iter().map(|&(s, e)| e.min(end) - s.max(start)).sum();
    for &(s, e) in &overlapping {
        set.remove(&s);
        if s < start {
            set.insert(s, start);
        }
        if e > end {
            set.insert(end, e);
        }
    }
    covered == end - start
}
