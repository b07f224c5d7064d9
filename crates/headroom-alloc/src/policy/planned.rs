//! `PlannedPolicy`: headroom's policy, and for a run that repeats its steps,
//! each step's large blocks at offsets packed ahead of time in one arena.
//!
//! Training and serving loops make the same requests in the same order step
//! after step. Once the policy has seen a sequence of request sizes repeat
//! (the last *p* allocations equal the *p* before them), it takes the earlier
//! of the two as the step, with each block's lifetime as it was seen, and
//! solves where each block would go in one arena so that no two blocks alive
//! at once overlap — the dynamic storage allocation problem, greedy by size
//! with lifetimes, as static memory planners do; a block alive across the end
//! of a step is checked against the next step's blocks too. From the next
//! allocation on, each request the plan expects is placed at its offset in the
//! arena (its own placement stream, so nothing else lands there). The moment
//! a request departs from the plan — another size, another stream — the plan
//! is dropped and the policy is `headroom`'s again until a step repeats anew;
//! a block whose place is taken (its predecessor freed late) goes wherever
//! `headroom` would put it.
//!
//! Planned: large-pool blocks whose lifetime was at most one step. The rest —
//! small blocks, and what a step keeps longer (state created once, caches) —
//! goes where `headroom` puts it. The policy sees only what came before: the
//! plan is made from steps that have happened.

use super::{ArenaSlot, CachedSegment, ExpandableFit, HeadroomPolicy, Placement, Policy, ReclaimRule, Rung};
use crate::config::AllocatorConfig;
use crate::device::StreamId;
use crate::sizing;
use crate::stats::PoolKind;
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::VecDeque;

/// The bit that marks the arena's placement stream of a stream. CUDA streams are
/// user-space pointers or small numbers, which never have it set.
const ARENA_LANE: StreamId = 1 << 61;

/// The longest step looked for, in allocations.
pub const MAX_PERIOD: u64 = 1 << 13;

/// The shortest: below it, a repeat is a loop inside a step, not a step.
const MIN_PERIOD: u64 = 4;

/// Periods followed at once while looking for a repeat.
const MAX_CANDIDATES: usize = 16;

/// One allocation as the policy saw it.
#[derive(Clone, Copy, Debug)]
struct Seen {
    size: u64,
    stream: StreamId,
    /// The allocation count when it was freed.
    died: Option<u64>,
}

/// One request of the step, and where the plan puts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    size: u64,
    stream: StreamId,
    /// Its offset in the arena; `None`: not planned.
    offset: Option<u64>,
}

#[derive(Clone, Debug)]
struct Plan {
    slots: Vec<Slot>,
    arena: u64,
    /// The slot the next request should match.
    next: usize,
}

/// See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct PlannedPolicy {
    /// Allocations so far.
    tick: u64,
    /// The last `2 × MAX_PERIOD` allocations; `history[0]` was allocation `first`.
    history: VecDeque<Seen>,
    first: u64,
    /// Live blocks: the allocation count each was born at.
    live: FxHashMap<u64, u64>,
    /// The request `place` saw last, which the next `on_alloc` records, and whether it
    /// was given a place in the arena.
    pending: Option<(u64, StreamId, bool)>,
    /// The allocation count each size was last requested at.
    last_of_size: FxHashMap<u64, u64>,
    /// Periods being followed, with how many allocations in a row have matched.
    candidates: Vec<(u64, u64)>,
    /// Periods found not worth a plan (too little of the step could be planned).
    rejected: FxHashSet<u64>,
    plan: Option<Plan>,
    /// Plans made and plans dropped so far.
    plans: u32,
    dropped: u32,
}

impl PlannedPolicy {
    /// Plans made so far, and how many of them were dropped when a request departed.
    pub fn plans(&self) -> (u32, u32) {
        (self.plans, self.dropped)
    }

    /// The arena of the plan in force: its bytes, and the requests of a step it places.
    pub fn arena(&self) -> Option<(u64, usize)> {
        self.plan.as_ref().map(|p| (p.arena, p.slots.iter().filter(|s| s.offset.is_some()).count()))
    }

    fn seen(&self, tick: u64) -> Option<&Seen> {
        tick.checked_sub(self.first).and_then(|i| self.history.get(i as usize))
    }

    /// Follows the periods the newest allocation (count `n`, `size` bytes) extends, and
    /// plans the shortest that has repeated a whole step.
    fn look_for_a_step(&mut self, n: u64, size: u64) {
        let history = (&self.history, self.first);
        let size_at = |t: u64| t.checked_sub(history.1).and_then(|i| history.0.get(i as usize)).map(|s| s.size);
        self.candidates.retain_mut(|(p, run)| {
            let matched = n.checked_sub(*p).and_then(size_at) == Some(size);
            *run += 1;
            matched
        });
        if let Some(&last) = self.last_of_size.get(&size) {
            let p = n - last;
            let fresh = !self.candidates.iter().any(|&(q, _)| q == p) && !self.rejected.contains(&p);
            if (MIN_PERIOD..=MAX_PERIOD).contains(&p) && fresh && self.candidates.len() < MAX_CANDIDATES {
                self.candidates.push((p, 1));
            }
        }
        self.last_of_size.insert(size, n);
        let whole = self.candidates.iter().filter(|&&(p, run)| run >= p).map(|&(p, _)| p).min();
        if let Some(p) = whole {
            self.candidates.clear();
            match self.make_plan(n, p) {
                Some(plan) => {
                    self.plans += 1;
                    self.plan = Some(plan);
                }
                None => {
                    self.rejected.insert(p);
                }
            }
        }
    }

    /// The plan for the steps after allocation `n`, from the step of `p` allocations that
    /// began `2p - 1` allocations before it (the one whose blocks have had a step to die),
    /// or `None` if less than half its bytes could be planned.
    fn make_plan(&self, n: u64, p: u64) -> Option<Plan> {
        let base = n + 1 - 2 * p;
        let mut slots = Vec::with_capacity(p as usize);
        // (slot, size, first, end): alive from allocation `first` to `end` of the step.
        let mut items = Vec::new();
        let (mut all, mut planned) = (0u64, 0u64);
        for j in 0..p {
            let s = *self.seen(base + j)?;
            slots.push(Slot { size: s.size, stream: s.stream, offset: None });
            all += s.size;
            let lifetime = s.died.map(|d| d - (base + j));
            if sizing::pool_for(s.size) == PoolKind::Large && lifetime.is_some_and(|l| l <= p) {
                items.push((j as usize, s.size, j, j + lifetime.unwrap_or(0)));
                planned += s.size;
            }
        }
        if 2 * planned < all {
            return None;
        }
        let (offsets, arena) = pack(&mut items, p);
        for (j, off) in offsets {
            slots[j].offset = Some(off);
        }
        Some(Plan { slots, arena, next: 0 })
    }
}

/// Offsets for blocks alive over `[first, end)` of a step of `p` allocations, repeated
/// step after step (a block alive past the step's end meets the next step's first
/// blocks): largest first, each at the lowest offset clear of every placed block it meets.
/// Returns each slot's offset and the arena's size.
fn pack(items: &mut [(usize, u64, u64, u64)], p: u64) -> (Vec<(usize, u64)>, u64) {
    items.sort_by(|a, b| b.1.cmp(&a.1).then((b.3 - b.2).cmp(&(a.3 - a.2))).then(a.0.cmp(&b.0)));
    let meets = |a: &(usize, u64, u64, u64), b: &(usize, u64, u64, u64)| {
        // Steps before and after: a block lives at most one step.
        [0i64, -(p as i64), p as i64].iter().any(|&m| {
            let (bs, be) = (b.2 as i64 + m, b.3 as i64 + m);
            (a.2 as i64) < be && bs < a.3 as i64
        })
    };
    let mut placed: Vec<((usize, u64, u64, u64), u64)> = Vec::with_capacity(items.len());
    let mut arena = 0;
    let mut taken = Vec::new();
    for it in items.iter() {
        taken.clear();
        taken.extend(placed.iter().filter(|(q, _)| meets(it, q)).map(|(q, off)| (*off, off + q.1)));
        taken.sort_unstable();
        let mut off = 0;
        for &(a, b) in &taken {
            if off + it.1 <= a {
                break;
            }
            off = off.max(b);
        }
        arena = arena.max(off + it.1);
        placed.push((*it, off));
    }
    (placed.into_iter().map(|(it, off)| (it.0, off)).collect(), arena)
}

impl Policy for PlannedPolicy {
    super::headroom_decisions!();

    fn place(&mut self, rounded: u64, stream: StreamId) -> Placement {
        self.pending = Some((rounded, stream, false));
        let Some(plan) = self.plan.as_mut() else { return Placement::stream(stream) };
        let slot = plan.slots[plan.next];
        if slot.size != rounded || slot.stream != stream {
            self.plan = None;
            self.dropped += 1;
            return Placement::stream(stream);
        }
        plan.next = (plan.next + 1) % plan.slots.len();
        match slot.offset {
            Some(offset) => {
                let at = Some(ArenaSlot { offset, arena: plan.arena });
                self.pending = Some((rounded, stream, true));
                Placement { stream: stream | ARENA_LANE, at }
            }
            None => Placement::stream(stream),
        }
    }

    fn stream_of(&self, placement: StreamId) -> StreamId {
        placement & !ARENA_LANE
    }

    fn on_alloc(&mut self, ptr: u64, size: u64, placed: StreamId) {
        let (size, stream, in_arena) = self.pending.take().unwrap_or((size, 0, false));
        // Its place was taken (a block the plan had freed by now is still alive), or the
        // arena could not be mapped without a new peak: the plan is dropped.
        if in_arena && placed & ARENA_LANE == 0 && self.plan.take().is_some() {
            self.dropped += 1;
        }
        let n = self.tick;
        self.live.insert(ptr, n);
        self.history.push_back(Seen { size, stream, died: None });
        if self.history.len() as u64 > 2 * MAX_PERIOD {
            self.history.pop_front();
            self.first += 1;
        }
        if self.plan.is_none() {
            self.look_for_a_step(n, size);
        }
        self.tick += 1;
    }

    fn on_free(&mut self, ptr: u64) {
        let Some(born) = self.live.remove(&ptr) else { return };
        let tick = self.tick;
        if let Some(i) = born.checked_sub(self.first) {
            if let Some(s) = self.history.get_mut(i as usize) {
                s.died = Some(tick);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::MIB;

    /// Blocks alive at once never share bytes, within a step or across its end.
    #[test]
    fn packed_blocks_alive_together_never_overlap() {
        // (slot, size, first, end) in a step of 6 allocations; slot 5 lives into the next step.
        let mut items = vec![
            (0, 4 * MIB, 0, 2),
            (1, 2 * MIB, 1, 3),
            (2, 4 * MIB, 2, 4),
            (3, 8 * MIB, 3, 5),
            (4, 2 * MIB, 4, 6),
            (5, 2 * MIB, 5, 8),
        ];
        let spans: Vec<_> = items.clone();
        let (offsets, arena) = pack(&mut items, 6);
        let at = |j: usize| offsets.iter().find(|o| o.0 == j).unwrap().1;
        for a in &spans {
            for b in &spans {
                if a.0 >= b.0 {
                    continue;
                }
                let together =
                    [0i64, -6, 6].iter().any(|&m| (a.2 as i64) < b.3 as i64 + m && (b.2 as i64 + m) < a.3 as i64);
                let apart = at(a.0) + a.1 <= at(b.0) || at(b.0) + b.1 <= at(a.0);
                assert!(!together || apart, "slots {} and {} overlap", a.0, b.0);
            }
            assert!(at(a.0) + a.1 <= arena);
        }
        // The most alive at one moment (slots 2 and 3: 12 MiB) bounds the arena from
        // below; largest-first reaches the bound here.
        assert_eq!(arena, 12 * MIB);
    }

    #[test]
    fn a_repeated_step_is_planned_and_a_departure_drops_the_plan() {
        let mut p = PlannedPolicy::default();
        let step = [4 * MIB, 8 * MIB, 2 * MIB, 6 * MIB, 4 * MIB];
        let mut ptr = 0x1000u64;
        let mut run_step = |p: &mut PlannedPolicy| -> Vec<Placement> {
            let mut placed = Vec::new();
            let mut live = Vec::new();
            for &s in &step {
                let at = p.place(s, 0);
                placed.push(at);
                p.on_alloc(ptr, s, at.stream);
                live.push(ptr);
                ptr += 1;
                if live.len() == 2 {
                    p.on_free(live.remove(0));
                }
            }
            for q in live {
                p.on_free(q);
            }
            placed
        };
        assert!(run_step(&mut p).iter().all(|pl| pl.at.is_none()));
        run_step(&mut p);
        run_step(&mut p);
        // A step's sizes seen twice over: the plan is made, and places every request after.
        assert_eq!(p.plans(), (1, 0));
        let third = run_step(&mut p);
        assert!(third.iter().all(|pl| pl.at.is_some() && pl.stream == ARENA_LANE), "{third:?}");
        let (arena, planned) = p.arena().unwrap();
        assert_eq!(planned, 5);
        // Two blocks alive at once at most: the largest pair, 4 + 8 MiB.
        assert_eq!(arena, 12 * MIB);
        assert_eq!(p.stream_of(third[0].stream), 0);
        // Another size where the plan expects 4 MiB: dropped, placed as headroom would.
        assert_eq!(p.place(3 * MIB, 0), Placement::stream(0));
        assert_eq!(p.plans(), (1, 1));
        assert!(p.arena().is_none());
    }

    #[test]
    fn a_place_that_could_not_be_had_drops_the_plan() {
        let mut p = PlannedPolicy::default();
        let mut ptr = 0x1000u64;
        for _ in 0..3 {
            for s in [4 * MIB, 8 * MIB, 2 * MIB, 6 * MIB] {
                let at = p.place(s, 0);
                p.on_alloc(ptr, s, at.stream);
                p.on_free(ptr);
                ptr += 1;
            }
        }
        let (made, _) = p.plans();
        assert_eq!(made, 1);
        // The plan gives the next request a place in the arena, and the block lands
        // elsewhere: the mechanism could not carve it.
        let at = p.place(4 * MIB, 0);
        assert!(at.at.is_some());
        p.on_alloc(ptr, 4 * MIB, 0);
        assert_eq!(p.plans(), (1, 1));
        assert!(p.arena().is_none());
    }
}
