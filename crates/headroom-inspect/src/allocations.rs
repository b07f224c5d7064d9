//! Each allocation of the trace, from the moment it became the caller's to
//! the moment it stopped being it: what the HTML report draws as its own band
//! where the visible stretch of the timeline holds few enough of them
//! (PyTorch's memory_viz "active memory timeline").

use crate::sites::{SiteDetail, Sites};
use crate::walk::Walk;
use headroom_trace::snapshot::TraceAction;
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
    let mut order: Vec<usize> = (0..list.len()).collect();
    order.sort_by_key(|&j| (std::cmp::Reverse(list[j].size), j));
    let mut keep = vec![false; list.len()];
    for &j in &order[..n] {
        keep[j] = true;
    }
    let dropped = list.len() - n;
    let mut k = 0;
    list.retain(|_| {
        k += 1;
        keep[k - 1]
    });
    (list, dropped)
}

/// Walks the whole trace once, from the blocks live at its start.
pub fn allocations(mut w: Walk, sites: &mut Sites) -> Vec<Allocation> {
    let trace = w.trace();
    let mut list = Vec::new();
    // By the entry that allocated it (a block live at the start: by address), its place in `list`.
    let mut open: FxHashMap<usize, usize> = FxHashMap::default();
    let mut before: FxHashMap<u64, usize> = FxHashMap::default();
    let mut start: Vec<_> = w.live.iter().filter(|(_, l)| !l.pending).map(|(&a, &l)| (a, l)).collect();
    start.sort_unstable_by_key(|&(a, _)| a);
    for (addr, l) in start {
        before.insert(addr, list.len());
        let site = sites.of(&l);
        list.push(Allocation { entry: None, time_us: None, end_entry: None, end_time_us: None, size: l.size, site });
    }
    let mut last: Option<i64> = None;
    while w.next < trace.len() {
        let i = w.next;
        let e = &trace[i];
        if let Some(t) = e.time_us {
            last = Some(last.map_or(t, |l| l.max(t)));
        }
        let block = matches!(
            e.action,
            TraceAction::Alloc | TraceAction::FreeRequested | TraceAction::FreeCompleted | TraceAction::Free
        );
        w.step_with(|l, began| {
            if began {
                open.insert(i, list.len());
                let a = Allocation {
                    entry: Some(i),
                    time_us: last,
                    end_entry: None,
                    end_time_us: None,
                    size: l.size,
                    site: 0,
                };
                list.push(a);
            } else if block {
                let k = match l.since {
                    Some(s) => open.remove(&s),
                    None => before.remove(&e.addr),
                };
                if let Some(k) = k {
                    list[k].end_entry = Some(i);
                    list[k].end_time_us = last;
                }
            }
        });
        // The site of what began here, now that the walk holds it.
        if let Some(&k) = open.get(&i) {
            if let Some(l) = w.live.get(&e.addr) {
                list[k].site = sites.of(l);
            }
        }
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_trace::snapshot::{MemorySnapshot, TraceEvent};

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
        let list = allocations(Walk::new(&snap, 0, None), &mut sites);
        assert_eq!(list.len(), 2);
        assert_eq!((list[0].entry, list[0].time_us, list[0].size), (Some(1), Some(11), 1024));
        assert_eq!((list[0].end_entry, list[0].end_time_us), (Some(3), Some(13)), "ends when its free is requested");
        assert_eq!((list[1].entry, list[1].end_entry, list[1].size), (Some(2), None, 512), "live at the end");
        let (kept, dropped) = largest(list.clone(), 1);
        assert_eq!((kept, dropped), (vec![list[0]], 1), "the largest kept");
    }
}
