//! The private pools of a recorded run (CUDA graphs, `torch.cuda.MemPool`),
//! as a replay needs them: which pool each recorded request went to, and
//! when a pool was released.
//!
//! # Which pool a request went to
//!
//! A request went to the pool of the segment it was placed in, as that
//! segment was at the time: an address is reused, so a segment is known by
//! its life (from its `segment_alloc` to its `segment_free`), never by its
//! address alone. A segment's pool is, in this order of authority:
//!
//! 1. named: the `pool_id` of its `segment_alloc` (newer traces, and
//!    headroom's), or the `segment_pool_id` of the final segment it is;
//!    where any entry of the trace names a private pool the entries are
//!    taken at their word and nothing below is inferred;
//! 2. elsewhere (fit): the request that made it could have been served from
//!    a segment of the default pools (same stream, same small or large
//!    pool, a free stretch large enough once the largest remainder PyTorch
//!    leaves unsplit, 1 MiB in a large segment, is set aside). PyTorch looks
//!    in the request's own pool before it asks the device
//!    (`get_free_block` before `alloc_block`), so the request went to
//!    another pool: a private one, and the segment holding that free
//!    stretch is not that pool's. A request the device refused first (its
//!    segment comes right after a flush) is not read so, and blocks whose
//!    frees completed right before the request's segment are not counted as
//!    free: those completions may have come from a flush's synchronisation,
//!    after the search. The pool is the one the same stream's
//!    last private request went to (a capture diverts a stream), else the
//!    last private request's, else a pool the trace does not name, given
//!    the first id PyTorch gives a `MemPool`, (0, 1), or the next free one;
//! 3. window: the request that made it came, on its stream, between two
//!    requests of the same private pool, with none of that stream's requests
//!    between them in a segment of the default pools: a capture diverts
//!    every request of its stream for as long as it lasts;
//! 4. release: it was given back in one burst of releases with segments of
//!    the default pools, and a private pool's segment was given back
//!    between it and them. PyTorch releases the default pools' segments of
//!    one flush together (`release_cached_blocks`: large, then small), and
//!    a private pool's apart from them (before, by `MemPool`'s destructor,
//!    which calls `emptyCache(id)`; after, by the flush's walk of the
//!    released pools), so a segment with a private one between it and the
//!    default ones is not the default pools': it is the pool of the private
//!    segment next to it;
//! 5. otherwise the default pools. Where such a segment was made while a
//!    private pool was in use (between its first request and its release),
//!    the trace does not say which pool it was: the check says so in its
//!    notes ([`RecordedPools::notes`]) rather than diverging without a word.
//!
//! Expandable segments are not inferred: their maps are named or default.
//!
//! # When a pool was released
//!
//! A pool's release is not an entry of its own: a recorded burst of
//! releases that gives back a private pool's segment shows that the pool
//! had been released before it, so the replay releases it there. What
//! this rests on, in PyTorch 2.11's `CUDACachingAllocator.cpp`: `releasePool`
//! (a graph's `reset()`, a `MemPool`'s destructor) only lowers the pool's
//! use count, and at 0 makes it freeable; `release_cached_blocks` (the
//! program's `empty_cache()`, the flush before a retry) gives back the
//! default pools' unsplit free segments, large then small, then each
//! freeable pool's, small then large, each set in (stream, size, address)
//! order; `emptyCache(id)` gives back only pool `id`'s, and a `MemPool`'s
//! destructor calls it right after `releasePool`. So a burst that begins
//! with a private pool's segments, before any of the default pools', is
//! replayed as that pool emptied on its own first and then the program's
//! `empty_cache()`: for a `MemPool` that is what ran; for a graph's
//! `reset()` and `empty_cache()` the default pools then had nothing to give
//! back before the pool's segments, and the two give back the same
//! segments in the same order.

use crate::memory_snapshot::{MemorySnapshot, TraceAction, TraceEvent};
use crate::trace_index::TraceIndex;
use headroom_alloc::sizing::{pool_for, round_size};
use headroom_alloc::{
    AllocatorConfig, DeviceCachingAllocator, DeviceMemory, MempoolId, Policy, PoolKind, DEFAULT_MEMPOOL,
};
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, HashMap};

/// The largest remainder PyTorch leaves unsplit at the end of a large block (`kSmallSize`).
const LARGE_UNSPLIT: u64 = 1 << 20;

/// How a segment's pool was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    /// The trace or the final state names it.
    Named,
    /// Its request could have been served from the default pools.
    Fit,
    /// Its request came between two of one pool's on its stream.
    Window,
    /// A private pool's segment was released between it and the default pools'.
    Release,
    /// A segment of the default pools that a request went past: not that request's pool.
    NotThatPool,
    /// Nothing says: the default pools.
    Presumed,
}

/// One segment's life in the trace.
#[derive(Clone, Debug)]
struct Life {
    addr: u64,
    end: u64,
    /// Its `segment_alloc` (None: it was there when the trace began).
    from: Option<usize>,
    /// Its `segment_free` (None: it is there at the end).
    until: Option<usize>,
    stream: u64,
    /// The pool kind of the request that made it (small or large).
    kind: Option<PoolKind>,
    /// The request that made it.
    maker: Option<usize>,
    pool: MempoolId,
    why: Why,
    /// Made by a map of an expandable segment.
    mapped: bool,
}

impl Life {
    fn holds(&self, addr: u64, i: usize) -> bool {
        self.addr <= addr && addr < self.end && self.from.is_none_or(|f| f < i) && self.until.is_none_or(|u| i <= u)
    }
}

/// The private-pool segments of a device's trace, each over its life.
#[derive(Clone, Debug, Default)]
pub struct RecordedPools {
    /// The lives of the segments of private pools.
    private: Vec<Life>,
    notes: Vec<String>,
}

impl RecordedPools {
    /// The private-pool segments `device`'s snapshot and trace name, or its trace shows.
    pub fn of(snap: &MemorySnapshot, device: u32) -> Self {
        RecordedPools::of_index(snap, device, &TraceIndex::of(snap, device))
    }

    /// [`RecordedPools::of`], from the trace's index made already.
    pub fn of_index(snap: &MemorySnapshot, device: u32, index: &TraceIndex) -> Self {
        let trace = snap.device_traces.get(device as usize).map_or(&[][..], |t| &t[..]);
        let (mut lives, named_in_trace) = lives(snap, device, trace, index);
        let mut notes = Vec::new();
        if !named_in_trace && !lives.is_empty() {
            let config = snap.allocator_config().0;
            infer_by_fit(&mut lives, trace, &config);
            // The other rules extend a private pool the trace already shows.
            if lives.iter().any(|l| l.pool != DEFAULT_MEMPOOL) {
                infer_by_window(&mut lives, trace);
                infer_by_release(&mut lives, trace);
                notes = undecided(&lives, trace);
            }
            for l in lives.iter().filter(|l| matches!(l.why, Why::Fit | Why::Window | Why::Release)) {
                let how = match l.why {
                    Why::Fit => "its request could have been served from the default pools",
                    Why::Window => "its request came between two of that pool's on its stream",
                    _ => "a segment of that pool was released between it and the default pools'",
                };
                notes.push(format!(
                    "segment {:#x} ({} bytes, entry {}) inferred in private pool {:?}: {how}",
                    l.addr,
                    l.end - l.addr,
                    l.from.map_or_else(|| "before the trace".to_string(), |f| f.to_string()),
                    l.pool
                ));
            }
        }
        let private = lives.into_iter().filter(|l| l.pool != DEFAULT_MEMPOOL).collect();
        RecordedPools { private, notes }
    }

    /// Whether the run used any private pool.
    pub fn any(&self) -> bool {
        !self.private.is_empty()
    }

    /// What the trace left to inference, and what it could not decide.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The private pools seen, in id order.
    pub fn ids(&self) -> Vec<MempoolId> {
        let mut ids: Vec<MempoolId> = self.private.iter().map(|l| l.pool).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The pool the recorded entry `i`, `e`, went to.
    pub fn pool_of(&self, i: usize, e: &TraceEvent) -> MempoolId {
        if e.pool_id != DEFAULT_MEMPOOL {
            return e.pool_id;
        }
        self.pool_at(e.addr, i)
    }

    /// The pool of the segment holding `addr` at entry `i` (the default pools if none of the private ones does).
    pub fn pool_at(&self, addr: u64, i: usize) -> MempoolId {
        self.private.iter().find(|l| l.holds(addr, i)).map_or(DEFAULT_MEMPOOL, |l| l.pool)
    }

    /// Releases, in `a`, every pool whose segment the recorded segment events
    /// `indices` of `trace` give back: the recorded run had released it. The
    /// pools whose segments lead the burst, before any of the default pools',
    /// are emptied here, each on its own (`emptyCache(id)`); the caller's
    /// `empty_cache()` gives back the rest.
    pub fn release_freed<D: DeviceMemory, P: Policy>(
        &self,
        a: &mut DeviceCachingAllocator<D, P>,
        trace: &[TraceEvent],
        indices: impl IntoIterator<Item = usize>,
    ) {
        if !self.any() {
            return;
        }
        let mut leading = true;
        for i in indices {
            let e = &trace[i];
            if !matches!(e.action, TraceAction::SegmentFree | TraceAction::SegmentUnmap) {
                continue;
            }
            let id = self.pool_of(i, e);
            if id == DEFAULT_MEMPOOL {
                leading = false;
                continue;
            }
            let mut released = false;
            while a.pool_use_count(id).is_some_and(|n| n > 0) {
                // Cannot fail: the pool exists and is in use.
                let _ = a.release_pool(id);
                released = true;
            }
            if leading && released {
                // Cannot fail: the pool exists.
                let _ = a.empty_cache_pool(id);
            }
        }
    }

    /// The segment events of the release burst that starts at `from`.
    pub fn burst(trace: &[TraceEvent], from: usize) -> impl Iterator<Item = usize> + '_ {
        (from..trace.len())
            .take_while(|&i| matches!(trace[i].action, TraceAction::SegmentFree | TraceAction::SegmentUnmap))
    }
}

/// Whether entry `i` of `trace` may be the request that made a segment: the entry before it
/// is a `segment_alloc` (or map) at its address. PyTorch records a segment's allocation
/// right before the request it was made for.
#[inline]
fn follows_its_segment(trace: &[TraceEvent], i: usize) -> bool {
    i.checked_sub(1).is_some_and(|p| {
        let (s, e) = (&trace[p], &trace[i]);
        matches!(s.action, TraceAction::SegmentAlloc | TraceAction::SegmentMap) && s.addr == e.addr
    })
}

/// Every segment's life in `trace`, with the pool the trace or the final state names; and
/// whether any entry names a private pool. Read from the segment events alone (`index`):
/// the request that made a segment is the entry right after its `segment_alloc`.
fn lives(snap: &MemorySnapshot, device: u32, trace: &[TraceEvent], index: &TraceIndex) -> (Vec<Life>, bool) {
    let mut lives: Vec<Life> = Vec::new();
    let mut open: BTreeMap<u64, usize> = BTreeMap::new();
    let new = |addr: u64, size: u64, from, e: &TraceEvent, mapped| Life {
        addr,
        end: addr.saturating_add(size),
        from,
        until: None,
        stream: e.stream,
        kind: None,
        maker: None,
        pool: e.pool_id,
        why: if e.pool_id != DEFAULT_MEMPOOL { Why::Named } else { Why::Presumed },
        mapped,
    };
    let named_in_trace = index.names_a_pool();
    for &i in index.segment_events() {
        let e = &trace[i];
        match e.action {
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => {
                open.insert(e.addr, lives.len());
                lives.push(new(e.addr, e.size, Some(i), e, e.action == TraceAction::SegmentMap));
                // The segment just pushed, the open one at this address.
                let m = i + 1;
                if trace.get(m).is_some_and(|r| r.action == TraceAction::Alloc) && follows_its_segment(trace, m) {
                    let r = &trace[m];
                    if let Some(l) = lives.last_mut().filter(|l| r.addr < l.end && l.maker.is_none()) {
                        l.maker = Some(m);
                        l.kind = Some(pool_for(r.size.div_ceil(512) * 512));
                    }
                }
            }
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => match open.remove(&e.addr) {
                Some(k) => lives[k].until = Some(i),
                None => {
                    let mut l = new(e.addr, e.size, None, e, e.action == TraceAction::SegmentUnmap);
                    l.until = Some(i);
                    lives.push(l);
                }
            },
            _ => {}
        }
    }
    for s in snap.segments.iter().filter(|s| s.device == device) {
        let id = (s.pool_id.0 as u64, s.pool_id.1 as u64);
        let found = open.range(..=s.address).next_back().map(|(_, &k)| k).filter(|&k| s.address < lives[k].end);
        match found {
            Some(k) => {
                if id != DEFAULT_MEMPOOL || lives[k].why == Why::Presumed {
                    lives[k].pool = id;
                    lives[k].why = Why::Named;
                }
            }
            None => lives.push(Life {
                addr: s.address,
                end: s.address.saturating_add(s.total_size),
                from: None,
                until: None,
                stream: s.stream,
                kind: s.pool,
                maker: None,
                pool: id,
                why: Why::Named,
                mapped: s.is_expandable,
            }),
        }
    }
    (lives, named_in_trace)
}

/// Whether a free stretch of `gap` bytes in a segment of `kind` would have served a rounded request of `rounded`.
fn fits(config: &AllocatorConfig, kind: PoolKind, gap: u64, rounded: u64) -> bool {
    let usable = if kind == PoolKind::Large { gap.saturating_sub(LARGE_UNSPLIT) } else { gap };
    let max_split = config.max_split_size;
    usable >= rounded
        && !(rounded < max_split && gap >= max_split)
        && !(rounded >= max_split && gap >= rounded + config.large_segment_size)
}

/// Rule 2: a request that made a segment while a default-pool segment had room for it went elsewhere.
fn infer_by_fit(lives: &mut [Life], trace: &[TraceEvent], config: &AllocatorConfig) {
    // The blocks allocated (or waiting on events) now, by address: their rounded sizes.
    // Hashed, not ordered: a request that made a segment (one in thousands) sorts them.
    let mut blocks: FxHashMap<u64, u64> = FxHashMap::default();
    let mut live: BTreeMap<u64, usize> = BTreeMap::new();
    // How many of `live` are private pools' segments: none, and no request needs a lookup.
    let mut live_private = 0usize;
    let made_at: FxHashMap<usize, usize> =
        lives.iter().enumerate().filter_map(|(k, l)| l.from.map(|f| (f, k))).collect();
    // The last private request's pool, per stream and overall.
    let mut last_on: HashMap<u64, MempoolId> = HashMap::new();
    let mut last = None;
    let mut next_id = (0u64, 1u64);
    // Completions since the last request or free: they may have come from the
    // synchronisation of a flush, or from the request's own search, and are
    // not counted as free for it.
    let mut recent: Vec<(u64, u64)> = Vec::new();
    // Past the last request that made a segment the rule may place, the walk would only keep
    // its books: a rule's verdict on a segment changes only segments made before it.
    let Some(until) =
        lives.iter().filter(|l| l.from.is_some() && l.why == Why::Presumed && !l.mapped).filter_map(|l| l.maker).max()
    else {
        return;
    };
    for (i, e) in trace[..=until].iter().enumerate() {
        if !matches!(
            e.action,
            TraceAction::FreeCompleted
                | TraceAction::SegmentFree
                | TraceAction::SegmentAlloc
                | TraceAction::SegmentUnmap
                | TraceAction::SegmentMap
                | TraceAction::Alloc
        ) {
            recent.clear();
        }
        match e.action {
            TraceAction::SegmentAlloc => {
                if let Some(&k) = made_at.get(&i) {
                    live_private += usize::from(lives[k].pool != DEFAULT_MEMPOOL);
                    if let Some(old) = live.insert(e.addr, k) {
                        live_private -= usize::from(lives[old].pool != DEFAULT_MEMPOOL);
                    }
                }
            }
            TraceAction::SegmentFree => {
                if let Some(old) = live.remove(&e.addr) {
                    live_private -= usize::from(lives[old].pool != DEFAULT_MEMPOOL);
                }
            }
            TraceAction::Alloc => {
                let rounded = round_size(config, e.size);
                let maker = if follows_its_segment(trace, i) {
                    made_at.get(&(i - 1)).copied().filter(|&k| lives[k].maker == Some(i))
                } else {
                    None
                };
                if let Some(k) = maker {
                    // After a flush (segments released right before the request's own) the
                    // completions just before it came from the flush's synchronisation: the
                    // search for a free block had not seen them, so nothing is inferred.
                    let flushed =
                        i >= 2 && matches!(trace[i - 2].action, TraceAction::SegmentFree | TraceAction::SegmentUnmap);
                    if lives[k].why == Why::Presumed && !lives[k].mapped && !flushed {
                        let kind = pool_for(rounded);
                        let mut sorted: Option<Vec<(u64, u64)>> = None;
                        let room = live.values().copied().find(|&o| {
                            let l = &lives[o];
                            o != k
                                && l.pool == DEFAULT_MEMPOOL
                                && !l.mapped
                                && l.stream == e.stream
                                && l.kind == Some(kind)
                                && fits(
                                    config,
                                    kind,
                                    largest_gap(
                                        sorted.get_or_insert_with(|| by_address(&blocks, &recent)),
                                        l.addr,
                                        l.end,
                                    ),
                                    rounded,
                                )
                        });
                        if let Some(o) = room {
                            let pool = last_on.get(&(e.stream)).copied().or(last).unwrap_or_else(|| {
                                let taken: Vec<MempoolId> = lives.iter().map(|l| l.pool).collect();
                                while taken.contains(&next_id) {
                                    next_id.1 += 1;
                                }
                                next_id
                            });
                            if live.values().any(|&v| v == k) {
                                live_private +=
                                    usize::from(lives[k].pool == DEFAULT_MEMPOOL && pool != DEFAULT_MEMPOOL);
                            }
                            lives[k].pool = pool;
                            lives[k].why = Why::Fit;
                            if lives[o].why == Why::Presumed {
                                lives[o].why = Why::NotThatPool;
                            }
                        }
                    }
                }
                let pool = if live_private == 0 {
                    DEFAULT_MEMPOOL
                } else {
                    live.range(..=e.addr)
                        .next_back()
                        .map(|(_, &k)| &lives[k])
                        .filter(|l| e.addr < l.end)
                        .map_or(DEFAULT_MEMPOOL, |l| l.pool)
                };
                if pool != DEFAULT_MEMPOOL {
                    last_on.insert(e.stream, pool);
                    last = Some(pool);
                }
                blocks.insert(e.addr, rounded);
                recent.clear();
            }
            TraceAction::FreeCompleted => {
                recent.extend(blocks.remove_entry(&e.addr));
            }
            TraceAction::Free => {
                blocks.remove(&e.addr);
            }
            _ => {}
        }
    }
}

/// The blocks of `blocks` and `recent` (those of `recent` in place of any of `blocks` at
/// the same address), by address.
fn by_address(blocks: &FxHashMap<u64, u64>, recent: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> =
        blocks.iter().filter(|(a, _)| !recent.iter().any(|r| r.0 == **a)).map(|(&a, &s)| (a, s)).collect();
    let mut recent = recent.to_vec();
    recent.reverse();
    recent.sort_by_key(|r| r.0);
    recent.dedup_by_key(|r| r.0);
    all.extend(recent);
    all.sort_unstable_by_key(|b| b.0);
    all
}

/// The largest stretch of `[start, end)` no block of `blocks` (sorted by address) covers.
fn largest_gap(blocks: &[(u64, u64)], start: u64, end: u64) -> u64 {
    let (mut at, mut best) = (start, 0);
    let from = blocks.partition_point(|b| b.0 < start);
    for &(b, size) in blocks[from..].iter().take_while(|b| b.0 < end) {
        best = best.max(b.saturating_sub(at));
        at = at.max(b + size);
    }
    best.max(end.saturating_sub(at))
}

/// The life holding `addr` at entry `i`.
fn life_at(lives: &[Life], addr: u64, i: usize) -> Option<usize> {
    lives.iter().position(|l| l.holds(addr, i))
}

/// Rule 3: a request between two of one private pool's on its stream went to that pool.
fn infer_by_window(lives: &mut [Life], trace: &[TraceEvent]) {
    // Per stream, its requests in order: (life, maker of that life).
    let mut on: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, e) in trace.iter().enumerate().filter(|(_, e)| e.action == TraceAction::Alloc) {
        if let Some(k) = life_at(lives, e.addr, i) {
            on.entry(e.stream).or_default().push(k);
        }
    }
    for ks in on.values() {
        let mut prev: Option<(usize, MempoolId)> = None;
        for (n, &k) in ks.iter().enumerate() {
            let l = &lives[k];
            if l.pool != DEFAULT_MEMPOOL {
                prev = Some((n, l.pool));
                continue;
            }
            if l.why != Why::Presumed {
                prev = None;
                continue;
            }
            let Some((_, pool)) = prev else { continue };
            // The next request of this stream that is not in a presumed segment.
            let next = ks[n + 1..].iter().map(|&k2| &lives[k2]).find(|l2| l2.why != Why::Presumed);
            if next.is_some_and(|l2| l2.pool == pool) && l.maker.is_some() && !l.mapped {
                lives[k].pool = pool;
                lives[k].why = Why::Window;
            }
        }
    }
}

/// Rule 4: a segment released with a private pool's between it and the default pools' was that pool's.
fn infer_by_release(lives: &mut [Life], trace: &[TraceEvent]) {
    let mut i = 0;
    while i < trace.len() {
        let burst: Vec<usize> = RecordedPools::burst(trace, i).collect();
        if burst.is_empty() {
            i += 1;
            continue;
        }
        i += burst.len();
        let ks: Vec<Option<usize>> = burst.iter().map(|&j| lives.iter().position(|l| l.until == Some(j))).collect();
        let class = |lives: &[Life], k: Option<usize>| {
            k.map(|k| &lives[k]).map(|l| match (l.pool == DEFAULT_MEMPOOL, l.why) {
                (false, _) => Some(l.pool),
                (true, Why::Presumed) => None,
                (true, _) => Some(DEFAULT_MEMPOOL),
            })
        };
        for n in 0..ks.len() {
            let Some(k) = ks[n] else { continue };
            if lives[k].why != Why::Presumed || lives[k].mapped {
                continue;
            }
            // Looking each way: the first private segment, then a default one beyond it.
            for dir in [-1isize, 1] {
                let mut m = n as isize + dir;
                let mut private = None;
                let mut decided = None;
                while m >= 0 && (m as usize) < ks.len() {
                    match class(lives, ks[m as usize]).flatten() {
                        Some(p) if p != DEFAULT_MEMPOOL => {
                            private.get_or_insert(p);
                        }
                        Some(_) => {
                            decided = private;
                            break;
                        }
                        None => {}
                    }
                    m += dir;
                }
                if let Some(p) = decided {
                    lives[k].pool = p;
                    lives[k].why = Why::Release;
                    break;
                }
            }
        }
    }
}

/// The segments the rules left in the default pools though a private pool was in use when they were made.
fn undecided(lives: &[Life], trace: &[TraceEvent]) -> Vec<String> {
    let mut notes = Vec::new();
    // Each private segment's first request.
    let private: Vec<(&Life, Option<usize>)> = lives
        .iter()
        .filter(|p| p.pool != DEFAULT_MEMPOOL)
        .map(|p| {
            let after = p.from.map_or(0, |f| f + 1);
            let end = p.until.unwrap_or(trace.len()).min(trace.len());
            let first = (after..end).find(|&i| trace[i].action == TraceAction::Alloc && p.holds(trace[i].addr, i));
            (p, first)
        })
        .collect();
    for l in lives.iter().filter(|l| l.why == Why::Presumed && !l.mapped) {
        let Some(from) = l.from else { continue };
        let during = private
            .iter()
            .find(|(p, first)| first.is_some_and(|f| f < from) && p.until.is_none_or(|u| from < u))
            .map(|(p, _)| *p);
        if let Some(p) = during {
            notes.push(format!(
                "segment {:#x} ({} bytes, entry {from}) was made while private pool {:?} was in use; the trace does not say which pool it was: replayed in the default pools",
                l.addr,
                l.end - l.addr,
                p.pool
            ));
        }
    }
    notes
}
