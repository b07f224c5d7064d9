//! The allocator's invariants, checked by a full recount (O(blocks)).
//!
//! 1. The blocks of each segment are linked both ways and tile it exactly;
//!    segments do not overlap.
//! 2. No two neighbouring blocks are both reusable and equally mapped (they
//!    would have been merged).
//! 3. A free mapped block is in its pool's free set under its own key; an
//!    unmapped block is in the unmapped set; an allocated block is in the
//!    allocated map; the sets hold nothing else. Only allocated blocks carry
//!    stream uses.
//! 4. Each pending block's event count equals its queued events.
//! 5. Every statistic's `current` equals a recount, no peak is below its
//!    current, the peak of "all" (the one part of "all" kept, not summed) lies
//!    between the larger pool peak and the sum of both, and allocated ≤
//!    reserved ≤ device memory.
//! 6. Each physical allocation of several pages lies in one expandable
//!    segment on its pages' bounds, overlaps no other, and is mapped
//!    throughout (no unmapped block meets it).
//! 7. Private pools: every block of a segment has the segment's owner, the
//!    default pools or a pool that exists, and sits in that owner's sets;
//!    pools and their ids name each other; a capture names a pool in use
//!    (use count at least 1); a free deferred by a capture is a freed block
//!    that still carries its stream uses, and only such a block does.

use crate::block::{DEFAULT_POOL, NIL};
use crate::caching::DeviceCachingAllocator;
use crate::device::DeviceMemory;
use crate::policy::Policy;
use crate::stats::{PoolKind, StatArray};
use std::collections::HashMap;

/// A broken invariant, described.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("allocator invariant violated: {0}")]
pub struct InvariantViolation(pub String);

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(InvariantViolation(format!($($fmt)+)));
        }
    };
}

type RecountField = fn(&Recount) -> i64;

#[derive(Default, Clone, Copy)]
struct Recount {
    allocation: i64,
    allocated_bytes: i64,
    active: i64,
    active_bytes: i64,
    requested_bytes: i64,
    segment: i64,
    reserved_bytes: i64,
    inactive_split: i64,
    inactive_split_bytes: i64,
}

impl<D: DeviceMemory, P: Policy> DeviceCachingAllocator<D, P> {
    /// Checks every invariant; see the module documentation. Oversize counts
    /// are checked against the `max_split_size` in force, so they can differ
    /// after the setting is changed at run time, as PyTorch's do.
    #[allow(
        clippy::too_many_lines,
        reason = "the invariants read as one list, each beside the totals it checks, in the module documentation's order"
    )]
    pub fn validate(&self) -> Result<(), InvariantViolation> {
        let mut pools = [Recount::default(); 2];
        let idx = |k: PoolKind| if k == PoolKind::Small { 0 } else { 1 };
        let mut oversize_allocs = 0i64;
        let mut oversize_segs = 0i64;
        let mut reached = 0usize;
        let (mut n_free, mut n_unmapped, mut n_active, mut n_uses) = (0usize, 0usize, 0usize, 0usize);
        let mut n_deferred = 0usize;
        let mut extents: Vec<(u64, u64)> = Vec::new();
        let max_split = self.config.max_split_size;

        let mut queued: HashMap<u32, u32> = HashMap::new();
        for q in self.events.values() {
            for &(_, id) in q {
                *queued.entry(id).or_default() += 1;
            }
        }

        let heads: Vec<u32> = self.arena.iter().filter(|(_, b)| b.prev == NIL).map(|(i, _)| i).collect();
        for head in heads {
            let h = &self.arena[head];
            let (stream, kind, exp, owner) = (h.stream, h.pool, h.expandable, h.owner);
            ensure!(
                owner == DEFAULT_POOL || self.private.contains_key(&owner),
                "segment {:#x} belongs to pool {owner}, which does not exist",
                h.ptr
            );
            let r = &mut pools[idx(kind)];
            let mut total = 0u64;
            let mut id = head;
            let mut prev = NIL;
            loop {
                let b = &self.arena[id];
                reached += 1;
                ensure!(b.is_live(), "block {id} is linked but vacant");
                ensure!(b.prev == prev, "block {:#x}: prev link broken", b.ptr);
                ensure!(
                    b.stream == stream && b.pool == kind && b.expandable == exp && b.owner == owner,
                    "block {:#x} differs from its segment",
                    b.ptr
                );
                ensure!(b.size > 0, "block {:#x} is empty", b.ptr);
                if prev != NIL {
                    let p = &self.arena[prev];
                    ensure!(p.ptr + p.size == b.ptr, "gap or overlap between {:#x}+{} and {:#x}", p.ptr, p.size, b.ptr);
                    ensure!(
                        !(p.is_reusable() && b.is_reusable() && p.mapped == b.mapped),
                        "free neighbours {:#x} and {:#x} are not merged",
                        p.ptr,
                        b.ptr
                    );
                }
                total += b.size;
                let deferred = !b.allocated && b.has_stream_uses;
                let pending = !b.allocated && (b.event_count > 0 || deferred);
                n_uses += b.has_stream_uses as usize;
                n_deferred += deferred as usize;
                ensure!(
                    b.has_stream_uses == self.stream_uses.contains_key(&id)
                        && (!deferred || self.deferred.contains(&id)),
                    "block {:#x}: stream uses out of step",
                    b.ptr
                );
                ensure!(
                    queued.get(&id).copied().unwrap_or(0) == b.event_count,
                    "block {:#x} counts {} events, {} are queued",
                    b.ptr,
                    b.event_count,
                    queued.get(&id).copied().unwrap_or(0)
                );
                if !b.mapped {
                    n_unmapped += 1;
                    ensure!(!b.allocated && b.event_count == 0, "unmapped block {:#x} is in use", b.ptr);
                    ensure!(
                        self.pool(owner, kind).unmapped.get(&(b.stream, b.ptr)) == Some(&id),
                        "unmapped block {:#x} is missing from the unmapped set",
                        b.ptr
                    );
                } else if b.allocated || pending {
                    if b.allocated {
                        n_active += 1;
                        ensure!(
                            !self.pointer_map || self.active.get(b.ptr) == Some(id),
                            "allocated block {:#x} is missing from the allocated map",
                            b.ptr
                        );
                    }
                    r.active += 1;
                    r.active_bytes += b.size as i64;
                    r.requested_bytes += b.requested_size as i64;
                    if b.allocated {
                        r.allocation += 1;
                        r.allocated_bytes += b.size as i64;
                        if b.size >= max_split {
                            oversize_allocs += 1;
                        }
                    }
                } else {
                    n_free += 1;
                    ensure!(
                        self.pool(owner, kind).blocks.get(b.stream, b.size, b.ptr) == Some(id),
                        "free block {:#x} is missing from the free set",
                        b.ptr
                    );
                    if exp == NIL && b.is_split() {
                        r.inactive_split += 1;
                        r.inactive_split_bytes += b.size as i64;
                    }
                }
                if b.mapped && exp != NIL {
                    r.reserved_bytes += b.size as i64;
                }
                if b.next == NIL {
                    break;
                }
                prev = id;
                id = b.next;
                ensure!(self.arena[id].prev == prev, "block {:#x}: next link broken", b.ptr);
            }
            if exp == NIL {
                let seg = self.segments.get(&h.ptr);
                ensure!(seg.is_some(), "segment {:#x} is not registered", h.ptr);
                let seg = seg.expect("checked");
                ensure!(seg.size == total, "segment {:#x} of {} bytes has blocks of {}", h.ptr, seg.size, total);
                ensure!(
                    seg.stream == stream && seg.pool == kind && seg.owner == owner,
                    "segment {:#x} stream or pool differs",
                    h.ptr
                );
                r.segment += 1;
                r.reserved_bytes += total as i64;
                if total >= max_split {
                    oversize_segs += 1;
                }
            } else {
                let seg = self.expandable.get(&exp).copied();
                ensure!(seg.is_some(), "expandable segment {exp} is gone but has blocks");
                let seg = seg.expect("checked");
                ensure!(seg.base == h.ptr && seg.va_size == total, "expandable segment {:#x} is not tiled", seg.base);
                ensure!(
                    seg.stream == stream && seg.pool == kind && seg.owner == owner,
                    "expandable segment {:#x} stream or pool differs",
                    seg.base
                );
            }
            extents.push((h.ptr, total));
        }
        ensure!(
            reached == self.arena.iter().count(),
            "{} blocks are not reachable from a segment",
            self.arena.iter().count() - reached
        );
        ensure!(self.segments.len() == pools[0].segment as usize + pools[1].segment as usize, "stale segment records");
        let owners: Vec<u32> = std::iter::once(DEFAULT_POOL).chain(self.private.keys().copied()).collect();
        let kinds = [PoolKind::Small, PoolKind::Large];
        let sets = || owners.iter().flat_map(|&o| kinds.map(|k| self.pool(o, k)));
        let free_entries: usize = sets().map(|p| p.blocks.len()).sum();
        let unmapped_entries: usize = sets().map(|p| p.unmapped.len()).sum();
        ensure!(free_entries == n_free, "free sets hold {free_entries} entries for {n_free} free blocks");
        ensure!(
            unmapped_entries == n_unmapped,
            "unmapped sets hold {unmapped_entries} entries for {n_unmapped} unmapped blocks"
        );
        ensure!(n_deferred == self.deferred.len(), "{} deferred frees for {n_deferred} blocks", self.deferred.len());
        ensure!(self.pool_owners.len() == self.private.len(), "pool ids and pools differ in number");
        for (&o, p) in &self.private {
            ensure!(self.pool_owners.get(&p.id) == Some(&o), "pool {:?} is not found by its id", p.id);
        }
        for c in &self.captures {
            ensure!(
                self.private.get(&c.owner).is_some_and(|p| p.id == c.id && p.use_count > 0),
                "the capture into {:?} names a pool not in use",
                c.id
            );
        }
        ensure!(
            self.active.len() == if self.pointer_map { n_active } else { 0 },
            "allocated map holds {} entries for {} allocated blocks",
            self.active.len(),
            n_active
        );
        ensure!(self.stream_uses.len() == n_uses, "stale record_stream entries");
        extents.sort_unstable();
        for w in extents.windows(2) {
            ensure!(w[0].0 + w[0].1 <= w[1].0, "segments {:#x} and {:#x} overlap", w[0].0, w[1].0);
        }
        let mut last_end = 0;
        for (s, e, unit) in self.allocations.runs() {
            ensure!(
                unit > 0 && (e - s) % unit == 0,
                "physical allocations {s:#x}..{e:#x} are not whole units of {unit}"
            );
            ensure!(s >= last_end, "physical allocations overlap at {s:#x}");
            last_end = e;
            let seg = self.expandable.values().find(|g| g.base <= s && s < g.base + g.va_size);
            ensure!(seg.is_some(), "physical allocation {s:#x} lies in no expandable segment");
            let g = seg.expect("checked");
            ensure!(
                e <= g.base + g.va_size && (s - g.base).is_multiple_of(g.page) && (e - g.base).is_multiple_of(g.page),
                "physical allocation {s:#x}..{e:#x} is not whole pages of its segment"
            );
        }
        for set in sets() {
            for &id in set.unmapped.values() {
                let b = &self.arena[id];
                let meets = self.allocations.meets(b.ptr, b.ptr + b.size);
                ensure!(!meets, "unmapped block {:#x} lies in a physical allocation", b.ptr);
            }
        }

        let s = &self.stats;
        let checks: [(&str, &StatArray, RecountField); 9] = [
            ("allocation", &s.allocation, |r| r.allocation),
            ("allocated_bytes", &s.allocated_bytes, |r| r.allocated_bytes),
            ("active", &s.active, |r| r.active),
            ("active_bytes", &s.active_bytes, |r| r.active_bytes),
            ("requested_bytes", &s.requested_bytes, |r| r.requested_bytes),
            ("segment", &s.segment, |r| r.segment),
            ("reserved_bytes", &s.reserved_bytes, |r| r.reserved_bytes),
            ("inactive_split", &s.inactive_split, |r| r.inactive_split),
            ("inactive_split_bytes", &s.inactive_split_bytes, |r| r.inactive_split_bytes),
        ];
        for (name, a, f) in checks {
            let (small, large) = (f(&pools[0]), f(&pools[1]));
            let (s_pool, l_pool, all) = (a.small_pool(), a.large_pool(), a.all());
            ensure!(s_pool.current == small, "{name}.small_pool.current is {}, recount {small}", s_pool.current);
            ensure!(l_pool.current == large, "{name}.large_pool.current is {}, recount {large}", l_pool.current);
            for (p, st) in a.to_array().iter().enumerate() {
                ensure!(st.peak >= st.current, "{name}[{p}] peak below current: {st:?}");
            }
            // "all" is the pools' sum, its peak kept apart: at least either pool's
            // peak (the other's current is never negative) and at most their sum.
            ensure!(
                all.peak >= s_pool.peak.max(l_pool.peak) && all.peak <= s_pool.peak + l_pool.peak,
                "{name}.all.peak {} outside the pools' peaks {} and {}",
                all.peak,
                s_pool.peak,
                l_pool.peak
            );
        }
        ensure!(
            s.oversize_allocations.current == oversize_allocs,
            "oversize_allocations is {}, recount {oversize_allocs}",
            s.oversize_allocations.current
        );
        ensure!(
            s.oversize_segments.current == oversize_segs,
            "oversize_segments is {}, recount {oversize_segs}",
            s.oversize_segments.current
        );
        let reserved = s.reserved_bytes.all().current;
        ensure!(
            self.total_allocated_memory as i64 == reserved,
            "total_allocated_memory {} != reserved {reserved}",
            self.total_allocated_memory
        );
        ensure!(s.allocated_bytes.all().current <= reserved, "allocated exceeds reserved");
        ensure!(reserved as u64 <= self.device_total, "reserved exceeds the device");
        Ok(())
    }
}
