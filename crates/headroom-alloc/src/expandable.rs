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
//!
//! Each page is a physical allocation of its own (one `cuMemCreate`), as
//! PyTorch maps them, unless the policy puts the whole pages inside the
//! request that growth maps for in larger ones ([`Policy::allocation_size`]);
//! those are kept in `allocations`, and every unmap gives back whole
//! allocations only: a free block's pages on an allocation that a live block
//! shares stay mapped.

use crate::block::{Block, DEFAULT_POOL, NIL};
use crate::caching::{DeviceCachingAllocator, ExpandableSegment, Failure};
use crate::device::{DeviceMemory, StreamId};
use crate::error::AllocError;
use crate::history::Action;
use crate::policy::{ArenaSlot, ExpandableFit, Policy, ReclaimRule};
use crate::stats::{self, PoolKind};

/// What a mapping is for: the request that growth maps pages for, and how
/// large a physical allocation of the pages inside it may be
/// ([`Policy::allocation_size`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct MapFor {
    /// The request's bytes, `[start, end)`; empty where none is known.
    pub own: (u64, u64),
    /// The largest physical allocation of the request's whole pages.
    pub allocation: u64,
}

/// A small-pool page the run maps again is kept by passing the peak only
/// where at least this fraction (1/4) of reserved memory is free: see
/// `reclaim_free_pages`.
const TRADE_FREE_DIVISOR: u64 = 4;

impl MapFor {
    /// One physical allocation per page, for no request in particular.
    const PAGES: MapFor = MapFor { own: (0, 0), allocation: 0 };
}

/// Where an expandable segment grows for a request.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Grow {
    /// From this block (free, then unmapped; or unmapped), mapping each
    /// unmapped block's front as needed: PyTorch's way.
    From(u32),
    /// Map the last `bytes` of this unmapped block, joining the free block after it.
    Tail { unmapped: u32, bytes: u64 },
}

impl<D: DeviceMemory, P: Policy> DeviceCachingAllocator<D, P> {
    /// `try_allocate_expandable_block`: a free mapped block of at least
    /// `size` bytes, mapping pages as needed. `Ok(None)` when the device is
    /// out of memory. `planned` is where [`Self::plan_growth`] said to grow,
    /// when it was asked just before (saving a second search). The request
    /// is the block's first `request` bytes (the rest is mapped ahead for
    /// others); `climbing` when growth passes the peak with no page given
    /// back. Both go to the policy's [`Policy::allocation_size`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn try_allocate_expandable_block(
        &mut self,
        owner: u32,
        kind: PoolKind,
        stream: StreamId,
        size: u64,
        request: u64,
        climbing: bool,
        planned: Option<Grow>,
    ) -> Result<Option<u32>, AllocError> {
        let grow = match planned {
            Some(g) => g,
            None => self.find_expandable_block(owner, kind, stream, size)?,
        };
        let allocation = self.policy.allocation_size(&self.config, kind, climbing);
        // The block handed out starts where growth does: at the candidate, or
        // at the tail it maps.
        let start = match grow {
            Grow::From(c) => self.arena[c].ptr,
            Grow::Tail { unmapped, bytes } => self.arena[unmapped].ptr + self.arena[unmapped].size - bytes,
        };
        let map_for = MapFor { own: (start, start + request), allocation };
        let mut candidate = match grow {
            Grow::From(c) => c,
            Grow::Tail { unmapped, bytes } => {
                let Some(id) = self.map_block_tail(unmapped, bytes, map_for)? else {
                    return Ok(None);
                };
                id
            }
        };
        // The candidate is one of: unmapped -> end; unmapped -> free -> ...;
        // free -> unmapped -> ...
        if !self.arena[candidate].mapped {
            let n = self.arena[candidate].size.min(size);
            if !self.map_block(candidate, n, map_for)? {
                return Ok(None);
            }
        }
        while self.arena[candidate].size < size {
            let remaining = size - self.arena[candidate].size;
            let next = self.arena[candidate].next;
            let n = remaining.min(self.arena[next].size);
            // Mapping `next` merges it with `candidate` before it.
            if !self.map_block(next, n, map_for)? {
                return Ok(None);
            }
            candidate = next;
        }
        let b = &self.arena[candidate];
        let (s, size, ptr) = (b.stream, b.size, b.ptr);
        self.pool_mut(owner, kind).blocks.remove(s, size, ptr);
        Ok(Some(candidate))
    }

    /// `find_expandable_block`: where to grow (see
    /// [`Self::expandable_candidate`]); a new reservation if no existing one
    /// has room.
    fn find_expandable_block(
        &mut self,
        owner: u32,
        kind: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Result<Grow, AllocError> {
        if let Some(g) = self.expandable_candidate(owner, kind, stream, size) {
            return Ok(g);
        }
        Ok(Grow::From(self.new_reservation(owner, kind, stream)?))
    }

    /// A new reservation for `owner`'s (`kind`, `stream`), all unmapped: its one block's id.
    fn new_reservation(&mut self, owner: u32, kind: PoolKind, stream: StreamId) -> Result<u32, AllocError> {
        let page = self.policy.page_size(&self.config, kind);
        let total = self.device_total;
        let va_size = (total + total / 8).div_ceil(page) * page;
        let base = self.device.reserve(va_size)?;
        let index = self.next_expandable;
        self.next_expandable += 1;
        self.expandable.insert(index, ExpandableSegment { base, va_size, page, stream, pool: kind, owner });
        self.largest_reservation = self.largest_reservation.max(va_size);
        let mut b = Block::new(base, va_size, stream, kind, owner);
        b.mapped = false;
        b.expandable = index;
        let id = self.arena.insert(b);
        self.pool_mut(owner, kind).unmapped.insert((stream, base), id);
        Ok(id)
    }

    /// The free block at `slot` of `stream`'s arena — its first reservation in `kind` —
    /// covering `size` bytes from there, taken out of the free set with what lay before it
    /// split off; `Ok(None)` if none covers it (the request then goes anywhere on its own
    /// stream). A fresh arena is mapped whole, only where reserved memory stays within its
    /// peak so far, after giving back whole free pages elsewhere if need be; pages of an
    /// arena given back since are not mapped again (its slots there are not to be had).
    pub(crate) fn carve_at(
        &mut self,
        kind: PoolKind,
        stream: StreamId,
        slot: ArenaSlot,
        size: u64,
    ) -> Result<Option<u32>, AllocError> {
        let seg = self.expandable.values().find(|s| s.stream == stream && s.pool == kind && s.owner == DEFAULT_POOL);
        let seg = match seg.copied() {
            Some(seg) => seg,
            None => {
                let id = self.new_reservation(DEFAULT_POOL, kind, stream)?;
                *self.expandable.get(&self.arena[id].expandable).expect("the reservation just made")
            }
        };
        if slot.offset.saturating_add(size) > seg.va_size {
            return Ok(None);
        }
        // A fresh arena is mapped whole, where that passes no peak: the plan's blocks then
        // find their pages mapped, and the pages the first steps left cached go back at once.
        // If even giving back every free byte could not make room, nothing is tried.
        let fresh = self.pool(DEFAULT_POOL, kind).unmapped.get(&(stream, seg.base)).copied();
        if let Some(head) = fresh.filter(|&id| self.arena[id].size == seg.va_size) {
            let arena = slot.arena.max(slot.offset + size).next_multiple_of(seg.page).min(seg.va_size);
            let peak = self.stats.reserved_bytes.all().peak.max(0) as u64;
            let allocated = self.stats.allocated_bytes.all().current.max(0) as u64;
            if allocated + arena > peak {
                return Ok(None);
            }
            let over = (self.total_allocated_memory + arena).saturating_sub(peak);
            if over > 0 {
                // The arena's own rule: any whole free page, as the plan needs it.
                self.reclaim_free_pages(DEFAULT_POOL, kind, stream, over, ReclaimRule::ANY)?;
            }
            // The arena is carved into many blocks: one physical allocation per page.
            if self.total_allocated_memory + arena > peak || !self.map_block(head, arena, MapFor::PAGES)? {
                return Ok(None);
            }
        }
        let (at, end) = (seg.base + slot.offset, seg.base + slot.offset + size);
        let Some((bsize, bptr, id)) = self.pool(DEFAULT_POOL, kind).blocks.find_containing(stream, at, end) else {
            return Ok(None);
        };
        self.pool_mut(DEFAULT_POOL, kind).blocks.remove(stream, bsize, bptr);
        if bptr < at {
            self.link_free_before(id, bptr, at - bptr);
            let b = &mut self.arena[id];
            b.ptr = at;
            b.size -= at - bptr;
        }
        Ok(Some(id))
    }

    /// Links a free mapped block over `[ptr, ptr + len)` in front of block `id`, which the
    /// caller then starts at `ptr + len`, and puts it in the free set.
    fn link_free_before(&mut self, id: u32, ptr: u64, len: u64) {
        let b = &self.arena[id];
        let (prev, stream, kind) = (b.prev, b.stream, b.pool);
        let mut f = Block::new(ptr, len, stream, kind, b.owner);
        f.expandable = b.expandable;
        f.prev = prev;
        f.next = id;
        let fid = self.arena.insert(f);
        if prev != NIL {
            self.arena[prev].next = fid;
        }
        self.arena[id].prev = fid;
        self.insert_into_blocks(fid);
    }

    /// Where an existing reservation can grow to hold `size` bytes, if one
    /// has room. PyTorch's choice ([`ExpandableFit::LowestAddress`]): the
    /// lowest unmapped block (or the free block just before it) from which
    /// `size` bytes of free or unmapped space run on, mapped from its front.
    /// [`ExpandableFit::LeastGrowth`] weighs every such place, and also the
    /// end of an unmapped block whose next block is free, and takes the one
    /// that maps the fewest pages.
    fn expandable_candidate(&self, owner: u32, kind: PoolKind, stream: StreamId, size: u64) -> Option<Grow> {
        // Every place below lies within one reservation. A request larger than
        // any (one that fails, and makes a new reservation each time it is
        // tried: PyTorch's behaviour too) would otherwise scan them all, every time.
        if size > self.largest_reservation {
            return None;
        }
        let arena = &self.arena;
        let allocatable = |id: u32| id != NIL && arena[id].is_reusable();
        let fit = self.policy.expandable_fit();
        let page = self.policy.page_size(&self.config, kind);
        let mut best: Option<(u64, Grow)> = None;
        let consider = |best: &mut Option<(u64, Grow)>, grow: u64, g: Grow| {
            if best.is_none_or(|(b, _)| grow < b) {
                *best = Some((grow, g));
            }
        };
        for (_, &id) in self.pool(owner, kind).unmapped.range((stream, 0)..(stream, u64::MAX)) {
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
            if fit == ExpandableFit::LeastGrowth {
                let (u, f) = (&arena[id], arena[id].next);
                if allocatable(f) && arena[f].mapped && arena[f].size < size {
                    let tail = (size - arena[f].size).div_ceil(page) * page;
                    if tail <= u.size {
                        consider(&mut best, tail, Grow::Tail { unmapped: id, bytes: tail });
                    }
                }
            }
            if bytes < size {
                continue;
            }
            match fit {
                ExpandableFit::LowestAddress => return Some(Grow::From(c)),
                ExpandableFit::LeastGrowth => consider(&mut best, self.chain_growth(c, size, page), Grow::From(c)),
            }
        }
        best.map(|(_, g)| g)
    }

    /// Bytes of pages mapped to serve `size` bytes from the chain starting at
    /// `c`, as [`Self::try_allocate_expandable_block`] maps them: each
    /// unmapped block from its front, as much as is still missing.
    fn chain_growth(&self, mut c: u32, size: u64, page: u64) -> u64 {
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

    /// Where [`Self::try_allocate_expandable_block`] would grow to serve
    /// `size` bytes (`None`: a new reservation), and the bytes of pages it
    /// would map: what reserved memory would grow by.
    pub(crate) fn plan_growth(&self, owner: u32, kind: PoolKind, stream: StreamId, size: u64) -> (Option<Grow>, u64) {
        let page = self.policy.page_size(&self.config, kind);
        let g = self.expandable_candidate(owner, kind, stream, size);
        let bytes = match g {
            Some(Grow::From(c)) => self.chain_growth(c, size, page),
            Some(Grow::Tail { bytes, .. }) => bytes,
            None => size.div_ceil(page) * page,
        };
        (g, bytes)
    }

    /// Unmaps whole free pages of expandable segments (whole physical
    /// allocations: see [`Self::whole_allocations`]), in either pool and on
    /// any stream, largest free runs first, until as many bytes as a
    /// request of `size` bytes on (`kind`, `stream`) would map are unmapped,
    /// or none are left. The free blocks that request would grow from are
    /// left alone: unmapping them would only make it map the same pages
    /// again. Free blocks holding pages the run mapped again after an earlier
    /// reclaim (`page_history.rs`) are given back last, and only where the
    /// peak needs them: if growth would pass the peak by no more than what is
    /// left of the policy's budget for keeping them ([`Policy::keep_budget`]),
    /// it passes it and they stay; past the budget they are given back as any
    /// other, so keeping never costs more peak than the budget. Each reclaim
    /// of such a page is an unmap now and a map when the run wants it back,
    /// every step of a training run. A small-pool page the run maps again is
    /// itself kept the same way, where a quarter of reserved memory is free
    /// (see the comment inside). Returns the bytes unmapped.
    pub(crate) fn reclaim_free_pages(
        &mut self,
        owner: u32,
        kind: PoolKind,
        stream: StreamId,
        size: u64,
        rule: ReclaimRule,
    ) -> Result<u64, AllocError> {
        let (grow, want) = self.plan_growth(owner, kind, stream, size);
        let mut keep = Vec::new();
        let mut c = match grow {
            Some(Grow::From(c)) => c,
            Some(Grow::Tail { unmapped, .. }) => unmapped,
            None => NIL,
        };
        let mut have = 0;
        while have < size && c != NIL {
            keep.push(c);
            have += self.arena[c].size;
            c = self.arena[c].next;
        }
        let peak = self.stats.reserved_bytes.all().peak.max(0) as u64;
        let budget_left = self.policy.keep_budget(peak).saturating_sub(self.kept_excess);
        // A small-pool page the run maps again after a reclaim, wanted back at
        // the peak while a quarter of reserved memory sits free: what the
        // reclaim would give back for it are the large pool's pages of another
        // moment of the step, which that moment maps again, and the two trade
        // places every step (an unmap and a map each, each step). Passing the
        // peak by the page instead, from the keeping budget, ends the trade
        // where it starts. With less free, the run holds what it has mapped:
        // it is climbing, and the page would spend the budget on the climb.
        if kind == PoolKind::Small && budget_left > 0 {
            let excess = (self.total_allocated_memory + want).saturating_sub(peak);
            let free =
                self.total_allocated_memory.saturating_sub(self.stats.allocated_bytes.all().current.max(0) as u64);
            if excess <= budget_left
                && free >= self.total_allocated_memory / TRADE_FREE_DIVISOR
                && self.growth_pages(grow, want).is_some_and(|(lo, hi)| self.page_history.keeps_any(lo, hi))
            {
                self.kept_excess += excess;
                return Ok(0);
            }
        }
        let arena = &self.arena;
        // (bytes, start, end, pool, stream): each free block's whole pages;
        // blocks holding kept pages apart while the budget for keeping lasts.
        let mut candidates: Vec<(u64, u64, u64, PoolKind, StreamId)> = Vec::new();
        let mut held: Vec<(u64, u64, u64, PoolKind, StreamId)> = Vec::new();
        // Only the default pools' pages: a private pool's free blocks are a graph's,
        // whose replays use their addresses.
        for id in [PoolKind::Small, PoolKind::Large].into_iter().flat_map(|k| self.pool(DEFAULT_POOL, k).blocks.ids()) {
            let b = &arena[id];
            if !b.is_expandable() || keep.contains(&id) {
                continue;
            }
            let seg = *self.expandable.get(&b.expandable).expect("block of a live expandable segment");
            let begin = seg.base + (b.ptr - seg.base).div_ceil(seg.page) * seg.page;
            let end = seg.base + (b.ptr + b.size - seg.base) / seg.page * seg.page;
            let (begin, end) = self.whole_allocations(begin, end.max(begin));
            if end <= begin {
                continue;
            }
            if (rule.own_pool_only && (b.pool != kind || b.stream != stream)) || end - begin < rule.min_run {
                continue;
            }
            let run = (end - begin, begin, end, b.pool, b.stream);
            if budget_left > 0 && self.page_history.keeps_any(begin, end) {
                held.push(run);
            } else {
                candidates.push(run);
            }
        }
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        if rule.all_or_nothing {
            // The runs it would take, largest first, and whether the unmap budget covers them.
            let mut have = 0;
            let mut taken = 0;
            for c in &candidates {
                if have >= want {
                    break;
                }
                have += c.0;
                taken += 1;
            }
            if have < want || taken as u64 > self.unmaps_allowed(&rule) {
                return Ok(0);
            }
        }
        let mut reclaimed = self.reclaim_runs(&candidates, want, &rule)?;
        if reclaimed < want && !held.is_empty() {
            // What growth would pass the peak by with the kept pages kept:
            // within what is left of the budget they stay, and the excess is
            // spent from it; beyond it they go back as any other would.
            let excess = (self.total_allocated_memory + want).saturating_sub(peak);
            if excess <= budget_left {
                self.kept_excess += excess;
            } else {
                held.sort_unstable_by(|a, b| b.cmp(a));
                reclaimed += self.reclaim_runs(&held, want - reclaimed, &rule)?;
            }
        }
        Ok(reclaimed)
    }

    /// The address range growth `grow` would map `want` bytes at: the tail of
    /// the unmapped block, or the front of the first unmapped block of the chain.
    /// `None` for a new reservation, which has no history.
    fn growth_pages(&self, grow: Option<Grow>, want: u64) -> Option<(u64, u64)> {
        match grow? {
            Grow::Tail { unmapped, bytes } => {
                let b = &self.arena[unmapped];
                Some((b.ptr + b.size - bytes, b.ptr + b.size))
            }
            Grow::From(mut c) => {
                while c != NIL && self.arena[c].mapped {
                    c = self.arena[c].next;
                }
                (c != NIL).then(|| (self.arena[c].ptr, self.arena[c].ptr + want.max(1)))
            }
        }
    }

    /// Unmap calls the policy's reclaim rule allows now: at most one for every
    /// `allocations_per_unmap` device allocations made so far.
    fn unmaps_allowed(&self, rule: &ReclaimRule) -> u64 {
        let (maps, unmaps) = (self.stats.num_device_alloc.max(0) as u64, self.stats.num_device_free.max(0) as u64);
        match rule.allocations_per_unmap {
            0 => u64::MAX,
            n => (maps / n).saturating_sub(unmaps),
        }
    }

    /// Unmaps `runs` (bytes, start, end, pool, stream), in order, until
    /// `want` bytes are unmapped. Returns the bytes unmapped.
    fn reclaim_runs(
        &mut self,
        runs: &[(u64, u64, u64, PoolKind, StreamId)],
        want: u64,
        rule: &ReclaimRule,
    ) -> Result<u64, AllocError> {
        let mut reclaimed = 0;
        for &(bytes, start, end, pool, stream) in runs {
            if reclaimed >= want || self.unmaps_allowed(rule) == 0 {
                break;
            }
            // Earlier unmaps split blocks: find the one holding the run now.
            let found = self.pool(DEFAULT_POOL, pool).blocks.find_containing(stream, start, end);
            let Some((_, _, id)) = found else { continue };
            self.unmap_range(id, start, end)?;
            self.page_history.reclaimed(start, end);
            reclaimed += bytes;
        }
        Ok(reclaimed)
    }

    /// `map_block`: maps the pages covering the first `size` bytes of unmapped
    /// block `id`, splits off what stays unmapped, and merges the mapped part
    /// with free neighbours. `Ok(false)` when the device is out of memory.
    fn map_block(&mut self, id: u32, size: u64, map_for: MapFor) -> Result<bool, AllocError> {
        let b = &self.arena[id];
        debug_assert!(!b.mapped && size <= b.size);
        let seg = *self.expandable.get(&b.expandable).expect("block of a live expandable segment");
        let (ptr, bsize, stream, kind, owner) = (b.ptr, b.size, b.stream, b.pool, b.owner);
        let begin = (ptr - seg.base) / seg.page;
        let end = (ptr + size - seg.base).div_ceil(seg.page);
        let (range_ptr, range_size) = (seg.base + begin * seg.page, (end - begin) * seg.page);
        debug_assert_eq!(range_ptr, ptr, "unmapped blocks start on page boundaries");
        if !self.device_map(range_ptr, range_size, seg, map_for)? {
            return Ok(false);
        }
        self.pool_mut(owner, kind).unmapped.remove(&(stream, ptr));
        self.arena[id].mapped = true;
        if range_size < bsize {
            let mut rest = Block::new(ptr + range_size, bsize - range_size, stream, kind, owner);
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
            self.pool_mut(owner, kind).unmapped.insert((stream, ptr + range_size), rest_id);
        }
        let (prev, next) = (self.arena[id].prev, self.arena[id].next);
        self.try_merge_blocks(id, prev);
        self.try_merge_blocks(id, next);
        self.insert_into_blocks(id);
        self.count_mapped(owner, kind, stream, range_ptr, range_size);
        Ok(true)
    }

    /// Maps the last `bytes` of unmapped block `id` (whole pages, at its
    /// page-aligned end) and merges them with the free block after it.
    /// `Ok(None)` when the device is out of memory; else the mapped block,
    /// in the free set.
    fn map_block_tail(&mut self, id: u32, bytes: u64, map_for: MapFor) -> Result<Option<u32>, AllocError> {
        let b = &self.arena[id];
        debug_assert!(!b.mapped && bytes > 0 && bytes <= b.size);
        let seg = *self.expandable.get(&b.expandable).expect("block of a live expandable segment");
        let (ptr, size, stream, kind, next, owner) = (b.ptr, b.size, b.stream, b.pool, b.next, b.owner);
        let at = ptr + size - bytes;
        debug_assert_eq!((at - seg.base) % seg.page, 0, "unmapped blocks end on page boundaries");
        if !self.device_map(at, bytes, seg, map_for)? {
            return Ok(None);
        }
        let mut t = Block::new(at, bytes, stream, kind, owner);
        t.expandable = self.arena[id].expandable;
        t.next = next;
        let tid = if bytes == size {
            self.pool_mut(owner, kind).unmapped.remove(&(stream, ptr));
            t.prev = self.arena[id].prev;
            self.arena[id] = t;
            id
        } else {
            t.prev = id;
            let tid = self.arena.insert(t);
            self.arena[id].size = size - bytes;
            self.arena[id].next = tid;
            tid
        };
        if next != NIL {
            self.arena[next].prev = tid;
        }
        let prev = self.arena[tid].prev;
        self.try_merge_blocks(tid, prev);
        self.try_merge_blocks(tid, next);
        self.insert_into_blocks(tid);
        self.count_mapped(owner, kind, stream, at, bytes);
        Ok(Some(tid))
    }

    /// Maps `size` bytes at `va` (whole pages of `seg`): one physical
    /// allocation per page, except the whole pages inside the request
    /// `map_for` is for, which go in allocations of up to `map_for.allocation`
    /// bytes, cut where the segment's multiples of that size fall (so that
    /// any one stays within the block it was made for). All or nothing;
    /// `Ok(false)` when the device is out of memory (remembered for the OOM
    /// report).
    fn device_map(&mut self, va: u64, size: u64, seg: ExpandableSegment, map_for: MapFor) -> Result<bool, AllocError> {
        let (page, end) = (seg.page, va + size);
        let unit = map_for.allocation;
        // Offsets in the segment, where its pages are counted from.
        let up = |x: u64, to: u64| seg.base + (x.max(seg.base) - seg.base).next_multiple_of(to);
        let down = |x: u64, to: u64| seg.base + (x.max(seg.base) - seg.base) / to * to;
        let (lo, hi) = (up(map_for.own.0, page).max(va), down(map_for.own.1, page).min(end));
        // (address, bytes, allocation size): pages, then the request's allocations (one
        // short of a unit where `lo` falls inside one, whole units, one short again to
        // `hi`), then pages. Each part is one device call and one run, however many
        // allocations it holds.
        let mut parts = vec![(va, size, page)];
        if unit > page && hi > lo + page {
            let (first, last) = ((down(lo, unit) + unit).min(hi), down(hi, unit).max(lo));
            parts = vec![(va, lo - va, page), (lo, first - lo, first - lo)];
            if last > first {
                parts.push((first, last - first, unit));
            }
            if hi > last.max(first) {
                parts.push((last.max(first), hi - last.max(first), hi - last.max(first)));
            }
            parts.push((hi, end - hi, page));
        }
        parts.retain(|p| p.1 > 0);
        for (i, &(at, len, allocation)) in parts.iter().enumerate() {
            if let Err(e) = self.device.map(at, len, allocation) {
                // All or nothing: the parts mapped before it go again.
                for &(at, len, allocation) in &parts[..i] {
                    self.device.unmap(at, len, allocation, self.policy.stream_of(seg.stream))?;
                }
                if e.is_out_of_memory() {
                    self.last_failure = Some(Failure::Device(e));
                    return Ok(false);
                }
                return Err(e.into());
            }
        }
        for (at, len, allocation) in parts {
            if allocation > page {
                self.allocations.insert_run(at, at + len, allocation);
            }
        }
        Ok(true)
    }

    /// The part of the page-aligned range `[lo, hi)` that whole physical
    /// allocations cover: a multi-page allocation reaching across either end
    /// is left out, since an allocation is unmapped whole or not at all.
    pub(crate) fn whole_allocations(&self, lo: u64, hi: u64) -> (u64, u64) {
        self.allocations.whole(lo, hi)
    }

    /// Unmaps `[lo, hi)`, whole physical allocations: one device call per
    /// run of single-page allocations and one per run of multi-page ones.
    fn device_unmap(&mut self, lo: u64, hi: u64, page: u64, stream: StreamId) -> Result<(), AllocError> {
        let mut at = lo;
        for (s, e, unit) in self.allocations.take(lo, hi) {
            if s > at {
                self.device.unmap(at, s - at, page, stream)?;
            }
            self.device.unmap(s, e - s, unit, stream)?;
            at = e;
        }
        if hi > at {
            self.device.unmap(at, hi - at, page, stream)?;
        }
        Ok(())
    }

    /// Counts `size` bytes newly mapped at `va`: reserved memory, the
    /// device-call statistic and the trace's `segment_map`.
    fn count_mapped(&mut self, owner: u32, kind: PoolKind, stream: StreamId, va: u64, size: u64) {
        self.page_history.mapped(va, va + size);
        self.total_allocated_memory += size;
        stats::increase(&mut self.stats.reserved_bytes, kind, size);
        self.stats.num_device_alloc += 1;
        self.trace_in(Action::SegmentMap, va, size, stream, owner);
    }

    /// `unmap_block`: unmaps the whole pages inside free block `id`; partial
    /// pages at either end, and a physical allocation that reaches past
    /// either end, stay mapped as free blocks.
    pub(crate) fn unmap_block(&mut self, id: u32) -> Result<(), AllocError> {
        let b = &self.arena[id];
        let seg = *self.expandable.get(&b.expandable).expect("block of a live expandable segment");
        let begin = (b.ptr - seg.base).div_ceil(seg.page);
        let end = (b.ptr + b.size - seg.base) / seg.page;
        if begin >= end {
            return Ok(());
        }
        let (lo, hi) = self.whole_allocations(seg.base + begin * seg.page, seg.base + end * seg.page);
        if lo >= hi {
            return Ok(());
        }
        self.unmap_range(id, lo, hi)
    }

    /// Unmaps the whole pages `[un_ptr, un_end)` of free block `id`, whole
    /// physical allocations; what lies before and after them in the block
    /// stays mapped as free blocks.
    fn unmap_range(&mut self, id: u32, un_ptr: u64, un_end: u64) -> Result<(), AllocError> {
        let b = &self.arena[id];
        let seg = *self.expandable.get(&b.expandable).expect("block of a live expandable segment");
        let (ptr, size, stream, kind, next, owner) = (b.ptr, b.size, b.stream, b.pool, b.next, b.owner);
        debug_assert!(ptr <= un_ptr && un_ptr < un_end && un_end <= ptr + size);
        debug_assert!((un_ptr - seg.base).is_multiple_of(seg.page) && (un_end - seg.base).is_multiple_of(seg.page));
        let un_size = un_end - un_ptr;
        self.device_unmap(un_ptr, un_end, seg.page, self.policy.stream_of(stream))?;
        self.pool_mut(owner, kind).blocks.remove(stream, size, ptr);
        let before = un_ptr - ptr;
        if before > 0 {
            self.link_free_before(id, ptr, before);
        }
        let after = size - before - un_size;
        if after > 0 {
            let mut f = Block::new(un_ptr + un_size, after, stream, kind, owner);
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
        self.pool_mut(owner, kind).unmapped.insert((stream, new_ptr), id);
        self.total_allocated_memory -= un_size;
        stats::decrease(&mut self.stats.reserved_bytes, kind, un_size);
        self.stats.num_device_free += 1;
        self.trace_in(Action::SegmentUnmap, un_ptr, un_size, stream, owner);
        Ok(())
    }

    /// Gives back every expandable segment with nothing mapped in it (its
    /// address reservation). PyTorch keeps one that a failed request reserved
    /// until it is used; a replay gives it back, so that the reservation the
    /// recording maps into next is made where the recording says.
    pub fn release_unmapped_segments(&mut self) -> Result<(), AllocError> {
        let empty: Vec<u32> = self
            .expandable
            .values()
            .filter_map(|seg| {
                let id = *self.pool(seg.owner, seg.pool).unmapped.get(&(seg.stream, seg.base))?;
                (self.arena[id].size == seg.va_size).then_some(id)
            })
            .collect();
        for id in empty {
            self.release_expandable_segment(id)?;
        }
        Ok(())
    }

    /// Destroys an expandable segment whose single block is entirely unmapped.
    pub(crate) fn release_expandable_segment(&mut self, id: u32) -> Result<(), AllocError> {
        let b = &self.arena[id];
        let index = b.expandable;
        let seg = *self.expandable.get(&index).expect("block of a live expandable segment");
        debug_assert!(!b.mapped && b.ptr == seg.base && b.size == seg.va_size);
        let (stream, kind, owner) = (b.stream, b.pool, b.owner);
        self.device.release_reservation(seg.base, seg.va_size)?;
        // Its pages' history goes with it: the addresses may be reserved again for anything.
        self.page_history.forget(seg.base, seg.base + seg.va_size);
        self.pool_mut(owner, kind).unmapped.remove(&(stream, seg.base));
        self.arena.remove(id);
        self.expandable.remove(&index);
        Ok(())
    }
}
