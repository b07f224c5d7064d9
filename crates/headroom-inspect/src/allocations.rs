//! Each allocation of the trace, from the moment it became the caller's to
//! the moment it stopped being it: what the HTML report draws as its own band
//! where the visible stretch of the timeline holds few enough of them
//! (PyTorch's memory_viz "active memory timeline").

use crate::sites::{SiteDetail, Sites};
use crate::walk::Live;
use crate::walk::Walk;
use headroom_trace::snapshot::TraceEvent;
use rustc_hash::FxHashMap;

/// One allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// The entry that allocated it; `None` when it was live when the trace began.
    pub entry: Option<usize>,
    /// The trace's time there (µs; times that go back held at the latest so far).
    pub time_us: Option<i64>,
    /// The entry that ended it (its free requested, or done, or its address
    /// allocated over); `None` when it is live at the trace's end.
    pub end_entry: Option<usize>,
    pub end_time_us: Option<i64>,
    /// Block bytes, as allocated counts them.
    pub size: u64,
    pub site: u32,
}

/// Allocations a report keeps at most: the largest. A trace of PyTorch's
/// usual 100,000 entries has about half as many; a longer one would make the
/// page grow without bound (about 26 bytes each).
pub const MAX_ALLOCATIONS: usize = 100_000;

/// A device's allocations, in the order they began, and the sites they name
/// that the report's other views do not ([`crate::report::DeviceReport::sites`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allocations {
    pub list: Vec<Allocation>,
    /// The smaller allocations left out beyond [`MAX_ALLOCATIONS`].
    pub dropped: usize,
    pub sites: Vec<(u32, SiteDetail)>,
}

/// The `n` largest of `list` (the earlier of equal ones), in their order, and how many were left out.
pub fn largest(mut list: Vec<Allocation>, n: usize) -> (Vec<Allocation>, usize) {
    if list.len() <= n {
        return (list, 0);
    }
    let dropped = list.len() - n;
    let mut keep = vec![false; list.len()];
    if n > 0 {
        // Which are kept is all that matters, not their order among themselves: a selection
        // of the n first by (size descending, index), not a sort of every allocation. The
        // index makes each key unique, so the n are the same as a sort's.
        let mut order: Vec<usize> = (0..list.len()).collect();
        order.select_nth_unstable_by_key(n - 1, |&j| (std::cmp::Reverse(list[j].size), j));
        for &j in &order[..n] {
            keep[j] = true;
        }
    }
    let mut k = 0;
    list.retain(|_| {
        k += 1;
        keep[k - 1]
    });
    (list, dropped)
}

/// Each allocation's life, taken entry by entry as a walk of the whole trace applies
/// them ([`crate::over_time`]), from the blocks live at its start.
pub struct Lives {
    list: Vec<Allocation>,
    /// By allocation entry: its place in `list` while it is the caller's ([`CLOSED`] else).
    open: Vec<u32>,
    /// The blocks live when the trace began, by address: their places in `list`.
    before: FxHashMap<u64, usize>,
    /// The latest time seen so far.
    last: Option<i64>,
}

const CLOSED: u32 = u32::MAX;

impl Lives {
    /// From `w` at the trace's start: its live blocks, by address, begin the list.
    pub fn new(w: &Walk, sites: &mut Sites) -> Lives {
        let mut lives =
            Lives { list: Vec::new(), open: vec![CLOSED; w.trace().len()], before: FxHashMap::default(), last: None };
        let mut start: Vec<_> = w.live.iter().filter(|(_, l)| !l.pending).map(|(a, &l)| (a, l)).collect();
        start.sort_unstable_by_key(|&(a, _)| a);
        for (addr, l) in start {
            lives.before.insert(addr, lives.list.len());
            let site = sites.of(&l);
            let a = Allocation { entry: None, time_us: None, end_entry: None, end_time_us: None, size: l.size, site };
            lives.list.push(a);
        }
        lives
    }

    /// Entry `i` (`e`), about to be applied, ends `ended` where it ends a block that
    /// was the caller's (read before the entry is applied).
    pub fn before(&mut self, i: usize, e: &TraceEvent, ended: Option<&Live>) {
        if let Some(t) = e.time_us {
            self.last = Some(self.last.map_or(t, |l| l.max(t)));
        }
        let Some(l) = ended else { return };
        let k = match l.since {
            Some(s) => Some(std::mem::replace(&mut self.open[s], CLOSED)).filter(|&k| k != CLOSED).map(|k| k as usize),
            None => self.before.remove(&e.addr),
        };
        if let Some(k) = k {
            self.list[k].end_entry = Some(i);
            self.list[k].end_time_us = self.last;
        }
    }

    /// Entry `i` allocated `l`, of `site` (read after the entry is applied).
    pub fn allocated(&mut self, i: usize, l: &Live, site: u32) {
        self.open[i] = self.list.len() as u32;
        let a =
            Allocation { entry: Some(i), time_us: self.last, end_entry: None, end_time_us: None, size: l.size, site };
        self.list.push(a);
    }

    /// In the order they began.
    pub fn finish(self) -> Vec<Allocation> {
        self.list
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::Timeline;
    use headroom_trace::snapshot::{MemorySnapshot, TraceAction};

    fn event(action: TraceAction, addr: u64, size: u64, t: i64) -> TraceEvent {
        TraceEvent { action, addr, size, stream: 0, time_us: Some(t), device_free: None, stack: 0, pool_id: (0, 0) }
    }

    #[test]
    fn each_allocation_from_its_alloc_to_its_free() {
        let mut snap = MemorySnapshot::default();
        snap.stacks.stacks.push(Box::new([]));
        snap.device_traces = vec![vec![
            event(TraceAction::SegmentAlloc, 0, 2 << 20, 10),
            event(TraceAction::Alloc, 0, 1000, 11),
            event(TraceAction::Alloc, 1024, 512, 12),
            event(TraceAction::FreeRequested, 0, 1000, 13),
            event(TraceAction::FreeCompleted, 0, 1000, 14),
        ]];
        let mut sites = Sites::new(&snap.stacks, false);
        let list =
            crate::over_time::over_time(Walk::new(&snap, 0, None), &Timeline::default(), &[], &mut sites, None, true)
                .allocations;
        assert_eq!(list.len(), 2);
        assert_eq!((list[0].entry, list[0].time_us, list[0].size), (Some(1), Some(11), 1024));
        assert_eq!((list[0].end_entry, list[0].end_time_us), (Some(3), Some(13)), "ends when its free is requested");
        assert_eq!((list[1].entry, list[1].end_entry, list[1].size), (Some(2), None, 512), "live at the end");
        let (kept, dropped) = largest(list.clone(), 1);
        assert_eq!((kept, dropped), (vec![list[0]], 1), "the largest kept");
    }

    /// The selection keeps what a sort of every allocation kept: the largest, the earlier of
    /// equal ones, in their order.
    #[test]
    fn the_largest_as_a_sort_keeps_them() {
        let list: Vec<Allocation> = (0..500u64)
            .map(|j| Allocation {
                entry: Some(j as usize),
                time_us: None,
                end_entry: None,
                end_time_us: None,
                // Few distinct sizes: many ties, which the earlier must win.
                size: (j * 7919 % 13) << 10,
                site: 0,
            })
            .collect();
        for n in [0, 1, 2, 12, 13, 100, 250, 499, 500, 600] {
            let mut order: Vec<usize> = (0..list.len()).collect();
            order.sort_by_key(|&j| (std::cmp::Reverse(list[j].size), j));
            let mut kept: Vec<usize> = order.into_iter().take(n).collect();
            kept.sort_unstable();
            let by_sort: Vec<Allocation> = kept.into_iter().map(|j| list[j]).collect();
            let (got, dropped) = largest(list.clone(), n);
            assert_eq!(got, by_sort, "n = {n}");
            assert_eq!(dropped, list.len().saturating_sub(n));
        }
    }
}
