//! The physical allocations (one `cuMemCreate` each) of expandable segments
//! that span more than one page, kept as runs: a run `[start, end)` is tiled
//! by allocations of `unit` bytes from `start`. Every other mapped page is an
//! allocation of its own and is not kept.
//!
//! Runs, not one entry per allocation: the state follows the mappings the
//! allocator made, not the bytes they map, so mapping a petabyte in 20 MiB
//! allocations costs one entry, not fifty million.

use std::collections::BTreeMap;

/// See the module documentation.
#[derive(Clone, Debug, Default)]
pub(crate) struct Allocations(BTreeMap<u64, (u64, u64)>);

impl Allocations {
    /// Records allocations of `unit` bytes tiling `[start, end)`.
    pub fn insert_run(&mut self, start: u64, end: u64, unit: u64) {
        debug_assert!(end > start && unit > 0 && (end - start).is_multiple_of(unit));
        self.0.insert(start, (end, unit));
    }

    /// The run holding `x` strictly inside, as (start, end, unit).
    fn across(&self, x: u64) -> Option<(u64, u64, u64)> {
        self.0.range(..x).next_back().filter(|(_, &(e, _))| e > x).map(|(&s, &(e, u))| (s, e, u))
    }

    /// The part of `[lo, hi)` that whole allocations cover: an allocation
    /// reaching across either end is left out, since it is unmapped whole or
    /// not at all.
    pub fn whole(&self, lo: u64, hi: u64) -> (u64, u64) {
        let lo = self.across(lo).map_or(lo, |(s, _, u)| s + (lo - s).next_multiple_of(u));
        let hi = self.across(hi).map_or(hi, |(s, _, u)| s + (hi - s) / u * u);
        (lo, hi.max(lo))
    }

    /// Removes the allocations inside `[lo, hi)`, whose ends must fall on
    /// allocation bounds, and returns them as runs (start, end, unit), in
    /// address order; the parts of runs outside it stay.
    pub fn take(&mut self, lo: u64, hi: u64) -> Vec<(u64, u64, u64)> {
        for x in [lo, hi] {
            if let Some((s, e, u)) = self.across(x) {
                debug_assert!((x - s).is_multiple_of(u), "{x:#x} cuts a physical allocation");
                self.0.insert(s, (x, u));
                self.0.insert(x, (e, u));
            }
        }
        let inside: Vec<(u64, u64, u64)> = self.0.range(lo..hi).map(|(&s, &(e, u))| (s, e, u)).collect();
        for &(s, _, _) in &inside {
            self.0.remove(&s);
        }
        inside
    }

    /// Whether any allocation meets `[lo, hi)`.
    pub fn meets(&self, lo: u64, hi: u64) -> bool {
        self.0.range(..hi).next_back().is_some_and(|(_, &(e, _))| e > lo)
    }

    /// Every run, (start, end, unit), in address order.
    pub fn runs(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.0.iter().map(|(&s, &(e, u))| (s, e, u))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_cut_only_on_allocation_bounds() {
        let mut a = Allocations::default();
        a.insert_run(100, 400, 100);
        assert_eq!(a.whole(150, 350), (200, 300));
        assert_eq!(a.whole(0, 1000), (0, 1000));
        assert_eq!(a.take(200, 300), vec![(200, 300, 100)]);
        assert_eq!(a.runs().collect::<Vec<_>>(), vec![(100, 200, 100), (300, 400, 100)]);
        assert!(a.meets(150, 160) && !a.meets(200, 300));
    }

    /// The regression behind the hostile-input finding A4: a petabyte mapped in
    /// 20 MiB allocations is one run, not an entry per allocation.
    #[test]
    fn state_follows_the_mappings_not_the_bytes_mapped() {
        let mut a = Allocations::default();
        let unit = 20 << 20;
        a.insert_run(0, unit * (50 << 20), unit);
        assert_eq!(a.runs().count(), 1);
        assert_eq!(a.take(unit, 3 * unit), vec![(unit, 3 * unit, unit)]);
        assert_eq!(a.runs().count(), 2);
    }
}
