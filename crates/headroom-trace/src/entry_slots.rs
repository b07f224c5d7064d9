//! Each trace entry's allocation slot, resolved once for every replay of the trace.
//!
//! A replay names each recorded allocation by a dense slot, and the trace names it by its
//! address. Finding the slot of an address took a probe of a hash table at every request and
//! free of every pass, a table too large for the first-level cache (13% of a what-if's time,
//! docs/PERFORMANCE.md, "Replay passes, tenth round"). The slots depend only on the trace, so
//! the trace index's one walk finds them and every pass reads one `u32` an entry instead.
//!
//! What the trace cannot say is which blocks were live when it began: that is the start
//! state's, inferred beside the index. So a free of an address at which the trace holds no
//! block is left *open* ([`Code::Open`]): the pass asks the blocks it adopted from the start
//! state, a few thousand at most, which forget an address once the trace allocates there (the
//! block live at the start is then no longer named by it).
//!
//! The frees that complete later (the block was used on another stream) are resolved here too:
//! which free requested each completion belongs to, and whether it completes at the next
//! request's synchronisation ([`crate::trace_requests`]).

use crate::address_slots::AddressSlots;
use crate::memory_snapshot::{TraceAction, TraceEvent};
use crate::walk::Slot;
use rustc_hash::FxHashMap;

/// What a pass does with an entry's slot, decoded from its `u32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Code {
    /// The entry's allocation is this slot.
    Slot(Slot),
    /// A free of an address at which the trace holds no block: a block live at the start, or none.
    Open,
    /// A free requested that completes at once, in the entry after it: nothing to do here.
    Nothing,
    /// The completion of the `k`-th free requested that completed later (counting from 0);
    /// `at_next_request`: by the synchronisation a release begins with in the next request.
    Completed { k: u32, at_next_request: bool },
}

// A trace would need 2^30 allocations live at once, or 2^29 frees that complete later (tens
// of gigabytes of entries), to reach the tags.
const TAG: u32 = 3 << 30;
const SPECIAL: u32 = 1 << 30;
const COMPLETED: u32 = 2 << 30;
const AT_NEXT_REQUEST: u32 = 1 << 29;
const OPEN: u32 = SPECIAL;
const NOTHING: u32 = SPECIAL | 1;

impl Code {
    #[inline]
    pub(crate) fn of(c: u32) -> Code {
        match c & TAG {
            0 => Code::Slot(c),
            COMPLETED => Code::Completed { k: c & (AT_NEXT_REQUEST - 1), at_next_request: c & AT_NEXT_REQUEST != 0 },
            _ if c == NOTHING => Code::Nothing,
            _ => Code::Open,
        }
    }
}

/// The slot codes of a trace, made entry by entry in order ([`EntrySlots::see`]).
#[derive(Default)]
pub(crate) struct EntrySlots {
    named: AddressSlots,
    pub(crate) codes: Vec<u32>,
    /// Frees requested that complete later: address -> their number among them.
    delayed: FxHashMap<u64, u32>,
    next_delayed: u32,
    /// Where the burst of completions being read ends: the first entry after it.
    burst_until: usize,
}

/// Whether the free requested at entry `i` completes later than it is requested (the block
/// was used on another stream: its memory waits for an event), rather than at once, in the
/// entry that follows.
fn completes_later(trace: &[TraceEvent], i: usize) -> bool {
    !matches!(trace.get(i + 1), Some(n) if n.action == TraceAction::FreeCompleted && n.addr == trace[i].addr)
}

impl EntrySlots {
    pub(crate) fn with_capacity(n: usize) -> Self {
        EntrySlots { codes: Vec::with_capacity(n), ..Default::default() }
    }

    /// Entry `i` of `trace`, after every entry before it.
    #[inline]
    pub(crate) fn see(&mut self, trace: &[TraceEvent], i: usize) {
        let e = &trace[i];
        let code = match e.action {
            TraceAction::Alloc => self.named.allocated(e.addr),
            // A request the recorded run failed holds nothing: its slot is given back at once.
            TraceAction::Oom => {
                let slot = self.named.take();
                self.named.give_back(slot);
                slot
            }
            TraceAction::FreeRequested if completes_later(trace, i) => {
                self.delayed.insert(e.addr, self.next_delayed);
                self.next_delayed += 1;
                self.freed(e.addr)
            }
            TraceAction::FreeRequested => NOTHING,
            TraceAction::FreeCompleted if self.delayed.contains_key(&e.addr) => {
                let k = self.delayed.remove(&e.addr).unwrap_or_default();
                // Completions right before segments are released, or before an OOM, come from
                // the synchronisation that releasing begins with: found once per burst.
                if self.burst_until <= i {
                    self.burst_until =
                        i + 1 + trace[i + 1..].iter().take_while(|n| n.action == TraceAction::FreeCompleted).count();
                }
                let at_next_request = trace.get(self.burst_until).is_some_and(|n| {
                    matches!(n.action, TraceAction::SegmentFree | TraceAction::SegmentUnmap | TraceAction::Oom)
                });
                COMPLETED | k | if at_next_request { AT_NEXT_REQUEST } else { 0 }
            }
            TraceAction::FreeCompleted | TraceAction::Free => self.freed(e.addr),
            _ => NOTHING,
        };
        self.codes.push(code);
    }

    /// The code of a free of `address`: its slot, or open where the trace holds no block there.
    #[inline]
    fn freed(&mut self, address: u64) -> u32 {
        self.named.freed(address).unwrap_or(OPEN)
    }

    /// The slots the trace's own allocations use: `0..count`.
    pub(crate) fn count(&self) -> Slot {
        self.named.count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address_slots::AddressSlots;
    use proptest::prelude::*;

    fn entry(action: TraceAction, addr: u64) -> TraceEvent {
        TraceEvent { action, addr, size: 512, stream: 0, time_us: None, device_free: None, stack: 0, pool_id: (0, 0) }
    }

    /// Which allocation each entry frees, as the map of addresses with the start's blocks in
    /// it found it: `Some(origin)` (the index of the allocating entry, or `!address` for a
    /// block live at the start), `None` for a free of no live block. Requests name their own.
    fn by_map(trace: &[TraceEvent], start: &[u64]) -> Vec<Option<u64>> {
        let mut slots = AddressSlots::default();
        let mut origin = std::collections::HashMap::new();
        for &a in start {
            origin.insert(slots.allocated(a), !a);
        }
        let mut delayed = std::collections::HashSet::new();
        (0..trace.len())
            .map(|i| {
                let e = &trace[i];
                match e.action {
                    TraceAction::Alloc => {
                        origin.insert(slots.allocated(e.addr), i as u64);
                        Some(i as u64)
                    }
                    TraceAction::FreeRequested if completes_later(trace, i) => {
                        delayed.insert(e.addr);
                        slots.freed(e.addr).map(|s| origin[&s])
                    }
                    TraceAction::FreeCompleted if delayed.remove(&e.addr) => None,
                    TraceAction::FreeCompleted | TraceAction::Free => slots.freed(e.addr).map(|s| origin[&s]),
                    _ => None,
                }
            })
            .collect()
    }

    /// The same, from the codes and the start's blocks adopted after them.
    fn by_codes(trace: &[TraceEvent], start: &[u64]) -> Vec<Option<u64>> {
        let mut slots = EntrySlots::default();
        (0..trace.len()).for_each(|i| slots.see(trace, i));
        let mut origin = std::collections::HashMap::new();
        let mut adopted = std::collections::HashMap::new();
        for (k, &a) in start.iter().enumerate() {
            let s = slots.count() + k as Slot;
            adopted.insert(a, s);
            origin.insert(s, !a);
        }
        (0..trace.len())
            .map(|i| match (trace[i].action, Code::of(slots.codes[i])) {
                (TraceAction::Alloc, Code::Slot(s)) => {
                    adopted.remove(&trace[i].addr);
                    origin.insert(s, i as u64);
                    Some(i as u64)
                }
                (_, Code::Slot(s)) => Some(origin[&s]),
                (_, Code::Open) => adopted.remove(&trace[i].addr).map(|s| origin[&s]),
                _ => None,
            })
            .collect()
    }

    proptest! {
        /// Every free frees the allocation the map of addresses said it did, whichever
        /// blocks were live at the start: frees of addresses named first, twice, after being
        /// allocated over, completed later, and the one address the table cannot hold.
        #[test]
        fn each_free_frees_what_the_map_of_addresses_found(
            ops in proptest::collection::vec((0u8..6, 0u64..40), 1..400),
            start in proptest::collection::btree_set(0u64..40, 0..12),
        ) {
            let address = |k: u64| if k == 39 { u64::MAX } else { k * 512 };
            let mut trace = Vec::new();
            for (what, k) in ops {
                let a = address(k);
                match what {
                    0 | 1 => trace.push(entry(TraceAction::Alloc, a)),
                    2 => trace.push(entry(TraceAction::Free, a)),
                    3 => {
                        trace.push(entry(TraceAction::FreeRequested, a));
                        trace.push(entry(TraceAction::FreeCompleted, a));
                    }
                    4 => trace.push(entry(TraceAction::FreeRequested, a)),
                    _ => trace.push(entry(TraceAction::FreeCompleted, a)),
                }
            }
            let start: Vec<u64> = start.into_iter().map(address).collect();
            prop_assert_eq!(by_codes(&trace, &start), by_map(&trace, &start));
        }
    }

    #[test]
    fn the_codes_read_back() {
        for c in [Code::Slot(0), Code::Slot(SPECIAL - 1), Code::Open, Code::Nothing] {
            let raw = match c {
                Code::Slot(s) => s,
                Code::Open => OPEN,
                _ => NOTHING,
            };
            assert_eq!(Code::of(raw), c);
        }
        let k = AT_NEXT_REQUEST - 1;
        assert_eq!(Code::of(COMPLETED | k | AT_NEXT_REQUEST), Code::Completed { k, at_next_request: true });
        assert_eq!(Code::of(COMPLETED | 7), Code::Completed { k: 7, at_next_request: false });
    }
}
