//! What became of the pages the ladder reclaimed: the memory behind the
//! rule that a policy must not unmap what the run maps again.
//!
//! Reclaiming whole free pages before reserved memory passes its peak
//! (`Rung::ReclaimFreePages`) keeps the peak down, at the price of an unmap
//! now and a map when the memory is wanted again. Where a run repeats — a
//! training step — the same pages can be reclaimed and mapped again every
//! step: two device calls a step, each a driver call that can synchronise,
//! for memory the run needs at another moment of every step.
//!
//! So the history remembers, by address range, the pages reclaimed and not
//! mapped since, and the pages mapped again after a reclaim: those the run
//! has shown it wants back. The reclaim leaves the kept pages mapped for as
//! long as the policy's budget allows ([`crate::policy::Policy::keep_budget`]).

use std::collections::BTreeMap;

/// Disjoint half-open ranges, start -> end.
#[derive(Clone, Debug, Default)]
struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    /// The parts of ranges that lie in `[lo, hi)`, clipped to it, in address order.
    fn overlapping(&self, lo: u64, hi: u64) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> =
            self.0.range(..hi).rev().take_while(|(_, &e)| e > lo).map(|(&s, &e)| (s.max(lo), e.min(hi))).collect();
        v.reverse();
        v
    }

    /// Removes `[lo, hi)`; the parts of ranges outside it stay.
    fn remove(&mut self, lo: u64, hi: u64) {
        let hit: Vec<(u64, u64)> =
            self.0.range(..hi).rev().take_while(|(_, &e)| e > lo).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in hit {
            self.0.remove(&s);
            if s < lo {
                self.0.insert(s, lo);
            }
            if e > hi {
                self.0.insert(hi, e);
            }
        }
    }

    /// Adds `[lo, hi)`.
    fn add(&mut self, lo: u64, hi: u64) {
        self.remove(lo, hi);
        self.0.insert(lo, hi);
    }

    /// Whether any part of `[lo, hi)` is in the set.
    fn meets(&self, lo: u64, hi: u64) -> bool {
        self.0.range(..hi).next_back().is_some_and(|(_, &e)| e > lo)
    }
}

/// See the module documentation.
#[derive(Clone, Debug, Default)]
pub(crate) struct PageHistory {
    /// Reclaimed, not mapped since.
    reclaimed: Ranges,
    /// Mapped again after a reclaim.
    kept: Ranges,
}

impl PageHistory {
    /// The reclaim unmapped `[lo, hi)`.
    pub fn reclaimed(&mut self, lo: u64, hi: u64) {
        self.reclaimed.add(lo, hi);
    }

    /// `[lo, hi)` was mapped: the parts of it reclaimed before are kept from now on.
    pub fn mapped(&mut self, lo: u64, hi: u64) {
        for (a, b) in self.reclaimed.overlapping(lo, hi) {
            self.reclaimed.remove(a, b);
            self.kept.add(a, b);
        }
    }

    /// Whether any page of `[lo, hi)` is kept.
    pub fn keeps_any(&self, lo: u64, hi: u64) -> bool {
        self.kept.meets(lo, hi)
    }

    /// Forgets `[lo, hi)`: its addresses were given back and may be reserved again for anything.
    pub fn forget(&mut self, lo: u64, hi: u64) {
        self.reclaimed.remove(lo, hi);
        self.kept.remove(lo, hi);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_mapped_again_after_a_reclaim_are_kept() {
        let mut h = PageHistory::default();
        h.mapped(0, 10);
        assert!(!h.keeps_any(0, 10), "mapped, never reclaimed");
        h.reclaimed(0, 10);
        assert!(!h.keeps_any(0, 10));
        h.mapped(4, 6);
        assert!(h.keeps_any(0, 5) && h.keeps_any(5, 20));
        assert!(!h.keeps_any(0, 4) && !h.keeps_any(6, 10), "only what came back");
        h.mapped(6, 10);
        assert!(h.keeps_any(8, 9));
        h.forget(0, 10);
        assert!(!h.keeps_any(0, 10), "forgotten addresses start over");
    }

    #[test]
    fn ranges_split_and_join() {
        let mut r = Ranges::default();
        r.add(0, 100);
        r.remove(30, 70);
        assert_eq!(r.overlapping(0, 100), [(0, 30), (70, 100)]);
        assert_eq!(r.overlapping(25, 75), [(25, 30), (70, 75)]);
        r.add(20, 80);
        assert_eq!(r.overlapping(0, 100), [(0, 20), (20, 80), (80, 100)]);
        assert!(r.meets(99, 200) && !r.meets(100, 200));
    }
}
