//! The free path: a caller's free, the cross-stream events that delay it
//! (`record_stream`), the frees a graph capture defers, and the merge of a
//! block that has become reusable with its free neighbours.
//!
//! A free is two steps, as in PyTorch: `free_requested` (allocated stats drop
//! now) and `free_completed` (the block is reusable: active stats drop, the
//! block merges). Between them a block used on other streams waits for
//! events recorded on those streams; while a graph capture is underway
//! event queries are illegal, so such a free waits, unrecorded, until no
//! capture is (`needs_events_deferred_until_no_capture`), and then only the
//! streams recorded before the capture get events: the capture's own work is
//! ordered by the graph.

use crate::block::NIL;
use crate::caching::DeviceCachingAllocator;
use crate::device::{DeviceMemory, StreamId};
use crate::error::AllocError;
use crate::history::Action;
use crate::policy::Policy;
use crate::stats::{self, PoolKind};

impl<D: DeviceMemory, P: Policy> DeviceCachingAllocator<D, P> {
    /// Frees the allocation at `ptr`. If other streams used it
    /// (`record_stream`), it becomes reusable only once their work recorded
    /// so far has finished; during a graph capture, only once no capture is
    /// underway and then that work has finished.
    pub fn free(&mut self, ptr: u64) -> Result<(), AllocError> {
        if ptr == 0 {
            return Ok(());
        }
        let id = match self.active.remove(ptr) {
            Some(id) => id,
            None => self.allocated_block(ptr).ok_or(AllocError::InvalidPointer(ptr))?,
        };
        self.free_found::<false>(id, ptr)
    }

    /// `free` of block `id`, allocated at `ptr`, already out of the pointer map. Inlined
    /// into its two callers: as a call of its own between `free_block_id` and `free_block`
    /// it saved and restored registers for a few loads and stores at every free (`#[inline]`
    /// alone left it a call). `INLINE_BLOCK`: `free_block`'s body inlined here too, as
    /// `free_block_id` (a replay's free) has it; `free` (by address) keeps the call, with
    /// which its warm 4 KiB pair counts fewer instructions (docs/PERFORMANCE.md, "Replay
    /// passes, twenty-second round").
    #[inline(always)]
    pub(crate) fn free_found<const INLINE_BLOCK: bool>(&mut self, id: u32, ptr: u64) -> Result<(), AllocError> {
        self.policy.on_free(ptr);
        let b = &mut self.arena[id];
        debug_assert!(b.allocated);
        b.allocated = false;
        let (kind, size, requested, stream, owner) = (b.pool, b.size, b.requested_size, b.stream, b.owner);
        let pending = b.has_stream_uses;
        stats::decrease(&mut self.stats.allocation, kind, 1);
        stats::decrease(&mut self.stats.allocated_bytes, kind, size);
        self.trace_in(Action::FreeRequested, ptr, requested, stream, owner);
        if size >= self.config.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        if pending && !self.captures.is_empty() {
            // Querying an event recorded during a capture is illegal: the
            // events wait until no capture is underway.
            self.deferred.push(id);
        } else if pending {
            self.insert_events(id)?;
        } else if INLINE_BLOCK {
            self.free_block_inline(id);
        } else {
            self.free_block(id);
        }
        Ok(())
    }

    /// `recordStream`: marks the allocation at `ptr` as used by `stream`, so
    /// that freeing it waits for that stream's work. The allocation's own
    /// stream is ignored.
    pub fn record_stream(&mut self, ptr: u64, stream: StreamId) -> Result<(), AllocError> {
        if ptr == 0 {
            return Ok(());
        }
        let id = self.allocated_block(ptr).ok_or(AllocError::InvalidPointer(ptr))?;
        self.record_stream_found(id, stream);
        Ok(())
    }

    /// `record_stream` of allocated block `id`.
    pub(crate) fn record_stream_found(&mut self, id: u32, stream: StreamId) {
        let own = self.policy.stream_of(self.arena[id].stream);
        if stream == own {
            return;
        }
        self.arena[id].has_stream_uses = true;
        let uses = self.stream_uses.entry(id).or_default();
        if !uses.contains(&stream) {
            uses.push(stream);
        }
        if !self.captures.is_empty() {
            // Work a capture records on `stream` is ordered by its graph:
            // no event is needed for it once the capture is over.
            let during = self.capture_stream_uses.entry(id).or_default();
            if !during.contains(&stream) {
                during.push(stream);
            }
        }
    }

    fn insert_events(&mut self, id: u32) -> Result<(), AllocError> {
        self.arena[id].has_stream_uses = false;
        let streams = self.stream_uses.remove(&id).unwrap_or_default();
        for s in streams {
            let ev = self.device.record_event(s)?;
            self.arena[id].event_count += 1;
            self.events.entry(s).or_default().push_back((ev, id));
        }
        Ok(())
    }

    /// `insert_events_deferred_until_no_capture`: the frees a capture
    /// deferred get events on the streams recorded before it (those recorded
    /// during it are the graph's to order), or complete at once if none are left.
    pub(crate) fn insert_events_deferred_until_no_capture(&mut self) -> Result<(), AllocError> {
        debug_assert!(self.captures.is_empty());
        // Every request asks first; outside graph captures there is never anything to do.
        if self.deferred.is_empty() {
            return Ok(());
        }
        for id in std::mem::take(&mut self.deferred) {
            if let Some(during) = self.capture_stream_uses.remove(&id) {
                if let Some(uses) = self.stream_uses.get_mut(&id) {
                    uses.retain(|s| !during.contains(s));
                }
            }
            self.insert_events(id)?;
            if self.arena[id].event_count == 0 {
                self.free_block(id);
            }
        }
        Ok(())
    }

    /// `process_events`: completes the pending frees whose events are done,
    /// in record order per stream, stopping at a stream's first pending event.
    /// Only called with no capture underway (event queries are illegal during one).
    pub(crate) fn process_events(&mut self) -> Result<(), AllocError> {
        // Asked here, not only inside: every request comes this way, and the call alone
        // cost more than the question.
        if !self.deferred.is_empty() {
            self.insert_events_deferred_until_no_capture()?;
        }
        if self.events.is_empty() {
            return Ok(());
        }
        let streams: Vec<StreamId> = self.events.keys().copied().collect();
        for s in streams {
            while let Some(&(ev, id)) = self.events.get(&s).and_then(|q| q.front()) {
                if !self.device.query_event(ev)? {
                    break;
                }
                self.events.get_mut(&s).expect("queue exists").pop_front();
                self.device.destroy_event(ev);
                self.complete_event(id);
            }
            if self.events.get(&s).is_some_and(|q| q.is_empty()) {
                self.events.remove(&s);
            }
        }
        Ok(())
    }

    fn complete_event(&mut self, id: u32) {
        let b = &mut self.arena[id];
        b.event_count -= 1;
        if b.event_count == 0 {
            self.free_block(id);
        }
    }

    /// `synchronize_and_free_events`: waits for every outstanding event, or
    /// with `owner`, only those of that pool's blocks.
    pub(crate) fn synchronize_and_free_events(&mut self, owner: Option<u32>) -> Result<(), AllocError> {
        self.stats.num_sync_all_streams += 1;
        if self.captures.is_empty() {
            self.insert_events_deferred_until_no_capture()?;
        }
        let events = std::mem::take(&mut self.events);
        for (s, queue) in events {
            let mut kept = std::collections::VecDeque::new();
            for (ev, id) in queue {
                if owner.is_some_and(|o| self.arena[id].owner != o) {
                    kept.push_back((ev, id));
                    continue;
                }
                self.device.synchronize_event(ev)?;
                self.device.destroy_event(ev);
                self.complete_event(id);
            }
            if !kept.is_empty() {
                self.events.insert(s, kept);
            }
        }
        Ok(())
    }

    /// `free_block`: the block is reusable now; merge it with free neighbours.
    #[inline(never)]
    pub(crate) fn free_block(&mut self, id: u32) {
        self.free_block_inline(id);
    }

    /// [`Self::free_block`], inlined into `free_block_id`'s `free_found`, the caller of a
    /// replay's every free that waits for no event: as a call of its own it saved and
    /// restored registers at each.
    #[inline(always)]
    fn free_block_inline(&mut self, id: u32) {
        let b = &self.arena[id];
        debug_assert!(b.is_reusable());
        let (ptr, original_size, requested, stream, kind, owner, prev, next) =
            (b.ptr, b.size, b.requested_size, b.stream, b.pool, b.owner, b.prev, b.next);
        self.trace_in(Action::FreeCompleted, ptr, requested, stream, owner);
        let mut merged = Merged { blocks: 0, bytes: 0, vacated: None };
        // Asked here, not only inside: a segment of one block (every large warm pair) has no
        // neighbour, and the call alone cost more than the question. Two steps written out,
        // not a loop over `[prev, next]`, whose array iterator cost about 14 instructions a
        // free (docs/PERFORMANCE.md, "Replay passes, twentieth round").
        if prev != NIL {
            self.merge_neighbour(id, prev, &mut merged);
        }
        if next != NIL {
            self.merge_neighbour(id, next, &mut merged);
        }
        let Merged { blocks: mut net_blocks, bytes: mut net_bytes, vacated } = merged;
        match vacated {
            Some(entry) => self.insert_into_blocks_in_place_of(id, entry),
            None => self.insert_into_blocks(id),
        }
        let b = &self.arena[id];
        if b.is_split() {
            net_blocks += 1;
            net_bytes += b.size as i64;
        }
        let s = &mut self.stats;
        // Expandable segments are left out of inactive_split: their fully free
        // pages can always be released.
        if !b.is_expandable() {
            apply_net(&mut s.inactive_split, kind, net_blocks);
            apply_net(&mut s.inactive_split_bytes, kind, net_bytes);
        }
        stats::decrease(&mut s.active, kind, 1);
        stats::decrease(&mut s.active_bytes, kind, original_size);
        stats::decrease(&mut s.requested_bytes, kind, requested);
    }

    /// One neighbour's part of `free_block`'s merge: `src` absorbed into `id` if it may be,
    /// counted in `merged`, and its free-set entry left for the merged block to take over,
    /// or removed where another's was left already.
    #[inline(always)]
    fn merge_neighbour(&mut self, id: u32, src: u32, merged: &mut Merged) {
        let Some((subsumed, entry)) = self.absorb(id, src) else { return };
        if subsumed > 0 {
            merged.blocks -= 1;
            merged.bytes -= subsumed as i64;
        }
        if let Some((size, ptr)) = entry.and_then(|e| merged.vacated.replace(e)) {
            let b = &self.arena[id];
            let (stream, kind, owner) = (b.stream, b.pool, b.owner);
            self.pool_mut(owner, kind).blocks.remove(stream, size, ptr);
        }
    }

    /// `try_merge_blocks`: absorbs neighbour `src` into `dst` if `src` is free,
    /// not waiting for events, and equally mapped. `dst` must not be in a
    /// free set. Returns the bytes absorbed.
    pub(crate) fn try_merge_blocks(&mut self, dst: u32, src: u32) -> u64 {
        let Some((size, entry)) = self.absorb(dst, src) else { return 0 };
        if let Some((s_size, s_ptr)) = entry {
            let d = &self.arena[dst];
            let (stream, kind, owner) = (d.stream, d.pool, d.owner);
            self.pool_mut(owner, kind).blocks.remove(stream, s_size, s_ptr);
        }
        size
    }

    /// As [`Self::try_merge_blocks`], but a mapped `src`'s free-set entry (its
    /// size and address, on `dst`'s stream) is returned, not removed: the caller
    /// removes it, or has the merged block take it over. None if nothing merged.
    /// Inlined: `free_block` calls it for each neighbour of every free, and as a call of
    /// its own it saved and restored registers for a few loads and compares.
    #[inline(always)]
    fn absorb(&mut self, dst: u32, src: u32) -> Option<(u64, Option<(u64, u64)>)> {
        if src == NIL {
            return None;
        }
        let s = &self.arena[src];
        if !s.is_reusable() || s.mapped != self.arena[dst].mapped {
            return None;
        }
        let (s_ptr, s_size, s_prev, s_next, s_mapped, s_stream) = (s.ptr, s.size, s.prev, s.next, s.mapped, s.stream);
        let (kind, owner) = (s.pool, s.owner);
        debug_assert_eq!(s_stream, self.arena[dst].stream, "a segment's blocks share its stream");
        if self.arena[dst].prev == src {
            let d = &mut self.arena[dst];
            d.ptr = s_ptr;
            d.prev = s_prev;
            if s_prev != NIL {
                self.arena[s_prev].next = dst;
            }
        } else {
            self.arena[dst].next = s_next;
            if s_next != NIL {
                self.arena[s_next].prev = dst;
            }
        }
        self.arena[dst].size += s_size;
        let entry = if s_mapped {
            Some((s_size, s_ptr))
        } else {
            self.pool_mut(owner, kind).unmapped.remove(&(s_stream, s_ptr));
            None
        };
        self.arena.remove(src);
        Some((s_size, entry))
    }

    /// As [`Self::insert_into_blocks`], in place of the entry (size, ptr) on the
    /// block's stream, which goes: the two moves of a remove and an insert made one.
    fn insert_into_blocks_in_place_of(&mut self, id: u32, (old_size, old_ptr): (u64, u64)) {
        let b = &self.arena[id];
        let (kind, owner, stream, size, ptr) = (b.pool, b.owner, b.stream, b.size, b.ptr);
        // One look-up of the pool for its clock and its free set.
        let pool = self.pool_mut(owner, kind);
        let clock = pool.get_free_blocks_call_count;
        let replaced = pool.blocks.replace(stream, (old_size, old_ptr), (size, ptr), id);
        self.arena[id].gc_count_base = clock;
        debug_assert_eq!(replaced, Some(true), "block {ptr:#x}: the entry it takes over was not free, or it was");
    }

    /// Puts a free mapped block into its pool's free set and restarts its GC age.
    pub(crate) fn insert_into_blocks(&mut self, id: u32) {
        let b = &self.arena[id];
        let (kind, owner, stream, size, ptr) = (b.pool, b.owner, b.stream, b.size, b.ptr);
        let pool = self.pool_mut(owner, kind);
        let clock = pool.get_free_blocks_call_count;
        let inserted = pool.blocks.insert(stream, size, ptr, id);
        self.arena[id].gc_count_base = clock;
        debug_assert!(inserted, "block {ptr:#x} was already free");
    }
}

/// What `free_block`'s merge has done so far: the net change in split blocks and their
/// bytes, and the free-set entry (size, address) of a neighbour absorbed, left for the
/// merged block to take over.
struct Merged {
    blocks: i64,
    bytes: i64,
    vacated: Option<(u64, u64)>,
}

/// Applies a net change (of split blocks or their bytes) to a statistic.
fn apply_net(a: &mut stats::StatArray, kind: PoolKind, net: i64) {
    if net > 0 {
        stats::increase(a, kind, net as u64);
    } else if net < 0 {
        stats::decrease(a, kind, (-net) as u64);
    }
}
