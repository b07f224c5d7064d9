//! The allocator's totals entry by entry, counted from the trace itself.
//!
//! A walk starts from the state the trace began in (inferred from the final
//! segments, [`headroom_trace::start_state`]) and applies each entry as
//! PyTorch's statistics do: `alloc` adds to allocated, active and requested;
//! `free_requested` takes from allocated and requested (the block is no
//! longer the caller's); `free_completed` takes from active (its memory can
//! be reused); segment entries move reserved. Old traces' single `free` does
//! both.
//!
//! Allocated counts blocks, not requests, and the trace records requests.
//! A block's size is known exactly where it is still live in the final
//! segments, and otherwise from headroom's replay of the run when one is
//! given ([`Walk::with_block_sizes`]; the replay makes PyTorch's decisions,
//! unsplit remainders included). Without one it is the request rounded as
//! PyTorch rounds it, which misses a large-pool block's unsplit remainder
//! (at most 1 MiB).

use headroom_alloc::sizing::round_size;
use headroom_alloc::{AllocatorConfig, BlockState};
use headroom_trace::snapshot::{MemorySnapshot, StackId, TraceAction, TraceEvent};
use headroom_trace::start_state::StartState;
use rustc_hash::FxHashMap;

/// A live allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Live {
    /// Block bytes, as allocated counts them.
    pub size: u64,
    pub requested: u64,
    pub stack: StackId,
    /// The entry that allocated it; `None` when it was live when the trace began.
    pub since: Option<usize>,
    /// Freed by the caller but not yet reusable (`free_requested` seen).
    pub pending: bool,
}

/// Totals at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Totals {
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub active_bytes: u64,
    pub requested_bytes: u64,
}

/// Walks one device's trace, keeping the live allocations and the totals.
/// A clone walks again from where the original stands (the report's passes
/// each clone one built once: building reads the whole trace).
#[derive(Clone)]
pub struct Walk<'a> {
    trace: &'a [TraceEvent],
    config: AllocatorConfig,
    /// Exact block sizes of the allocations still live at the end, by entry.
    exact: FxHashMap<usize, u64>,
    pub live: FxHashMap<u64, Live>,
    pub totals: Totals,
    /// Entries applied so far: the next one is `trace[next]`.
    pub next: usize,
    /// Frees of addresses not live (a trace inconsistent with its start state).
    pub unmatched_frees: usize,
}

impl<'a> Walk<'a> {
    /// A walk of `device`'s trace from `start`. Blocks live at the start take
    /// their stacks from the final segments where they are still there.
    /// Without a start state (one could not be inferred) the walk starts from
    /// nothing, so its totals are relative to the trace's start.
    pub fn new(snap: &'a MemorySnapshot, device: u32, start: Option<&StartState>) -> Walk<'a> {
        let empty = StartState::default();
        let start = start.unwrap_or(&empty);
        let trace = snap.device_traces.get(device as usize).map_or(&[][..], Vec::as_slice);
        let config = snap.allocator_config().0;
        let mut final_blocks: FxHashMap<u64, (u64, StackId)> = FxHashMap::default();
        for s in snap.segments.iter().filter(|s| s.device == device) {
            for b in s.blocks.iter().filter(|b| b.state != BlockState::Inactive) {
                final_blocks.insert(b.address, (b.size, b.stack));
            }
        }
        // The last entry touching a finally-live address is the alloc that made it. Only
        // those addresses are followed, and the walk back ends once each has been met.
        let mut exact = FxHashMap::default();
        let mut seen = rustc_hash::FxHashSet::default();
        for (i, e) in trace.iter().enumerate().rev() {
            if seen.len() == final_blocks.len() {
                break;
            }
            if !is_block_entry(e.action) {
                continue;
            }
            if let Some(&(size, _)) = final_blocks.get(&e.addr) {
                if seen.insert(e.addr) && e.action == TraceAction::Alloc {
                    exact.insert(i, size);
                }
            }
        }
        let mut live = FxHashMap::default();
        let mut totals = Totals { reserved_bytes: start.reserved_bytes(), ..Default::default() };
        for b in start.segments.iter().flat_map(|s| &s.live) {
            let stack = final_blocks.get(&b.address).map_or(0, |f| f.1);
            live.insert(
                b.address,
                Live { size: b.size, requested: b.requested_size, stack, since: None, pending: false },
            );
            totals.allocated_bytes += b.size;
            totals.active_bytes += b.size;
            totals.requested_bytes += b.requested_size;
        }
        Walk { trace, config, exact, live, totals, next: 0, unmatched_frees: 0 }
    }

    /// Block sizes the replay handed out, by entry, where they differ from
    /// the rounded request ([`headroom_trace::what_if::block_sizes`]).
    pub fn with_block_sizes(mut self, sizes: &FxHashMap<usize, u64>) -> Walk<'a> {
        for (&i, &size) in sizes {
            self.exact.entry(i).or_insert(size);
        }
        self
    }

    pub fn trace(&self) -> &'a [TraceEvent] {
        self.trace
    }

    /// Applies the next entry; false at the end of the trace.
    pub fn step(&mut self) -> bool {
        let Some(e) = self.trace.get(self.next) else { return false };
        let i = self.next;
        self.next += 1;
        let t = &mut self.totals;
        match e.action {
            TraceAction::Alloc => {
                let size = self.exact.get(&i).copied().unwrap_or_else(|| round_size(&self.config, e.size));
                t.allocated_bytes += size;
                t.active_bytes += size;
                t.requested_bytes += e.size;
                let old = self
                    .live
                    .insert(e.addr, Live { size, requested: e.size, stack: e.stack, since: Some(i), pending: false });
                // An alloc over a live address: the trace lost that block's free.
                if let Some(old) = old {
                    self.unmatched_frees += 1;
                    remove(t, &old);
                }
            }
            TraceAction::FreeRequested => match self.live.get_mut(&e.addr) {
                Some(l) if !l.pending => {
                    l.pending = true;
                    t.allocated_bytes -= l.size;
                    t.requested_bytes -= l.requested;
                }
                _ => self.unmatched_frees += 1,
            },
            TraceAction::FreeCompleted | TraceAction::Free => match self.live.remove(&e.addr) {
                Some(l) => remove(t, &l),
                None => self.unmatched_frees += 1,
            },
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => t.reserved_bytes += e.size,
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => {
                t.reserved_bytes = t.reserved_bytes.saturating_sub(e.size)
            }
            _ => {}
        }
        true
    }

    /// [`Walk::step`], telling `change` of each allocation that becomes the
    /// caller's (`true`: allocated) or stops being it (`false`: its free
    /// requested or done, or its address allocated over). What a call site
    /// holds at any moment is the sum of its changes, kept without looking at
    /// every live block again.
    pub fn step_with(&mut self, mut change: impl FnMut(&Live, bool)) -> bool {
        let Some(e) = self.trace.get(self.next) else { return false };
        if is_block_entry(e.action) {
            if let Some(l) = self.live.get(&e.addr).filter(|l| !l.pending) {
                change(l, false);
            }
        }
        self.step();
        if e.action == TraceAction::Alloc {
            if let Some(l) = self.live.get(&e.addr) {
                change(l, true);
            }
        }
        true
    }

    /// Applies entries up to and including `index`.
    pub fn run_through(&mut self, index: usize) {
        while self.next <= index && self.step() {}
    }
}

fn remove(t: &mut Totals, l: &Live) {
    if !l.pending {
        t.allocated_bytes -= l.size;
        t.requested_bytes -= l.requested;
    }
    t.active_bytes -= l.size;
}

fn is_block_entry(a: TraceAction) -> bool {
    matches!(a, TraceAction::Alloc | TraceAction::FreeRequested | TraceAction::FreeCompleted | TraceAction::Free)
}
