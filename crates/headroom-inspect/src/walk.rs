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
use headroom_trace::walk::AddressSlots;
use rustc_hash::FxHashMap;
use std::sync::Arc;

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

/// No block: an entry that names none, or an address no live block has.
const NONE: u32 = u32::MAX;

/// Which block each entry names, resolved from the addresses once for every walk of the
/// trace: a block is a slot from its allocation to its free, and a freed slot is used
/// again ([`AddressSlots`]), so a walk keeps its live blocks in a short vector by slot and
/// looks nothing up by address. The report walks the trace five times from the same
/// start; each paid a hash map's insert, lookup and remove per allocation.
struct Blocks {
    /// By entry: the slot of the block it allocates or frees ([`NONE`] for a free of an
    /// address no live block has, and for entries that name no block).
    slot: Vec<u32>,
    /// Allocations at an address still live (the trace lost that block's free): the slot
    /// of the block each replaces, by entry.
    replaced: FxHashMap<usize, u32>,
    /// Slots used at once, at most.
    slots: usize,
}

/// The live blocks of a walk, by slot. Iterated in slot order, which for the blocks live
/// at the start is the order a hash map of them by address gave, as the report named
/// their sites in.
#[derive(Clone, Default)]
pub struct LiveBlocks {
    blocks: Vec<Option<Live>>,
    /// The address of each slot's block.
    addresses: Vec<u64>,
}

impl LiveBlocks {
    /// Each live block, with its address.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Live)> {
        self.blocks.iter().zip(&self.addresses).filter_map(|(l, &a)| l.as_ref().map(|l| (a, l)))
    }

    pub fn values(&self) -> impl Iterator<Item = &Live> {
        self.blocks.iter().flatten()
    }

    fn at(&self, slot: u32) -> Option<&Live> {
        self.blocks.get(slot as usize).and_then(Option::as_ref)
    }
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
    /// The entries `exact` holds, as bits: most allocations have none, and skip the lookup.
    has_exact: Vec<u64>,
    blocks: Arc<Blocks>,
    pub live: LiveBlocks,
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
        let mut at_start: FxHashMap<u64, Live> = FxHashMap::default();
        let mut totals = Totals { reserved_bytes: start.reserved_bytes(), ..Default::default() };
        for b in start.segments.iter().flat_map(|s| &s.live) {
            let stack = final_blocks.get(&b.address).map_or(0, |f| f.1);
            at_start.insert(
                b.address,
                Live { size: b.size, requested: b.requested_size, stack, since: None, pending: false },
            );
            totals.allocated_bytes += b.size;
            totals.active_bytes += b.size;
            totals.requested_bytes += b.requested_size;
        }
        // The blocks live at the start take the first slots, in the order their map gives.
        let mut slots = AddressSlots::default();
        let mut live = LiveBlocks::default();
        for (&a, &l) in &at_start {
            let s = slots.allocated(a) as usize;
            live.blocks.resize(live.blocks.len().max(s + 1), None);
            live.addresses.resize(live.blocks.len(), 0);
            (live.blocks[s], live.addresses[s]) = (Some(l), a);
        }
        let (blocks, last) = resolve(trace, slots);
        // The last entry naming a finally-live block's slot is the alloc that made it, where
        // that is an alloc (otherwise its free was requested since, or it predates the trace).
        let mut exact = FxHashMap::default();
        let mut slots_at_end = blocks.1;
        for (&a, &(size, _)) in &final_blocks {
            if let Some(s) = slots_at_end.freed(a) {
                let i = last.get(s as usize).copied().unwrap_or(NONE);
                if i != NONE && trace[i as usize].action == TraceAction::Alloc {
                    exact.insert(i as usize, size);
                }
            }
        }
        let blocks = blocks.0;
        live.blocks.resize(live.blocks.len().max(blocks.slots), None);
        live.addresses.resize(live.blocks.len(), 0);
        let mut w = Walk {
            trace,
            config,
            exact: FxHashMap::default(),
            has_exact: vec![0; trace.len().div_ceil(64)],
            blocks: Arc::new(blocks),
            live,
            totals,
            next: 0,
            unmatched_frees: 0,
        };
        w.add_exact(&exact);
        w
    }

    /// Block sizes the replay handed out, by entry, where they differ from
    /// the rounded request ([`headroom_trace::what_if::block_sizes`]).
    pub fn with_block_sizes(mut self, sizes: &FxHashMap<usize, u64>) -> Walk<'a> {
        self.add_exact(sizes);
        self
    }

    /// Sizes by entry, each kept where the entry has none yet.
    fn add_exact(&mut self, sizes: &FxHashMap<usize, u64>) {
        for (&i, &size) in sizes {
            self.exact.entry(i).or_insert(size);
            if let Some(word) = self.has_exact.get_mut(i / 64) {
                *word |= 1 << (i % 64);
            }
        }
    }

    pub fn trace(&self) -> &'a [TraceEvent] {
        self.trace
    }

    /// The block size entry `i` allocates.
    #[inline]
    fn size_at(&self, i: usize, e: &TraceEvent) -> u64 {
        let marked = self.has_exact.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0);
        match marked.then(|| self.exact.get(&i)).flatten() {
            Some(&size) => size,
            None => round_size(&self.config, e.size),
        }
    }

    /// The live block the next entry names, before it is applied: the block it frees, or
    /// for an allocation the one still live at its address that it replaces.
    pub fn named_by_next(&self) -> Option<&Live> {
        let i = self.next;
        let e = self.trace.get(i)?;
        let slot = match e.action {
            TraceAction::Alloc if self.blocks.replaced.is_empty() => return None,
            TraceAction::Alloc => *self.blocks.replaced.get(&i)?,
            TraceAction::FreeRequested | TraceAction::FreeCompleted | TraceAction::Free => self.blocks.slot[i],
            _ => return None,
        };
        self.live.at(slot)
    }

    /// The slot of the block entry `i` allocates or frees (`None` for a free of an address
    /// no live block has, and for entries that name no block). Slots are below [`Walk::slots`].
    pub fn slot_named(&self, i: usize) -> Option<usize> {
        self.blocks.slot.get(i).filter(|&&s| s != NONE).map(|&s| s as usize)
    }

    /// Slots the walk's blocks take, at most.
    pub fn slots(&self) -> usize {
        self.live.blocks.len()
    }

    /// The block entry `i`, an allocation already applied, made (while it is live).
    pub fn allocated_by(&self, i: usize) -> Option<&Live> {
        let l = self.live.at(*self.blocks.slot.get(i)?)?;
        (l.since == Some(i)).then_some(l)
    }

    /// Applies the next entry; false at the end of the trace.
    #[inline]
    pub fn step(&mut self) -> bool {
        let Some(e) = self.trace.get(self.next) else { return false };
        let i = self.next;
        self.next += 1;
        let slot = self.blocks.slot[i];
        match e.action {
            TraceAction::Alloc => {
                let size = self.size_at(i, e);
                let t = &mut self.totals;
                t.allocated_bytes += size;
                t.active_bytes += size;
                t.requested_bytes += e.size;
                // An alloc over a live address: the trace lost that block's free.
                let old = if self.blocks.replaced.is_empty() { None } else { self.blocks.replaced.get(&i) };
                if let Some(&old) = old {
                    if let Some(old) = self.live.blocks[old as usize].take() {
                        self.unmatched_frees += 1;
                        remove(t, &old);
                    }
                }
                let s = slot as usize;
                self.live.blocks[s] =
                    Some(Live { size, requested: e.size, stack: e.stack, since: Some(i), pending: false });
                self.live.addresses[s] = e.addr;
            }
            TraceAction::FreeRequested => match self.live.blocks.get_mut(slot as usize).and_then(Option::as_mut) {
                Some(l) if !l.pending => {
                    l.pending = true;
                    self.totals.allocated_bytes -= l.size;
                    self.totals.requested_bytes -= l.requested;
                }
                _ => self.unmatched_frees += 1,
            },
            TraceAction::FreeCompleted | TraceAction::Free => {
                match self.live.blocks.get_mut(slot as usize).and_then(Option::take) {
                    Some(l) => remove(&mut self.totals, &l),
                    None => self.unmatched_frees += 1,
                }
            }
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => self.totals.reserved_bytes += e.size,
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => {
                self.totals.reserved_bytes = self.totals.reserved_bytes.saturating_sub(e.size)
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
        let i = self.next;
        if i >= self.trace.len() {
            return false;
        }
        if let Some(l) = self.named_by_next().filter(|l| !l.pending) {
            change(l, false);
        }
        self.step();
        if let Some(l) = self.allocated_by(i) {
            change(l, true);
        }
        true
    }

    /// Applies entries up to and including `index`.
    pub fn run_through(&mut self, index: usize) {
        while self.next <= index && self.step() {}
    }
}

/// Each entry's block slot, from the slots of the blocks live at the start; with the slots
/// still live at the end, and by slot the last entry that named it.
fn resolve(trace: &[TraceEvent], mut slots: AddressSlots) -> ((Blocks, AddressSlots), Vec<u32>) {
    let mut slot = vec![NONE; trace.len()];
    let mut replaced = FxHashMap::default();
    let mut last: Vec<u32> = Vec::new();
    let mut used = 0;
    for (i, e) in trace.iter().enumerate() {
        let s = match e.action {
            TraceAction::Alloc => {
                if let Some(old) = slots.freed(e.addr) {
                    replaced.insert(i, old);
                }
                slots.allocated(e.addr)
            }
            TraceAction::FreeRequested => slots.slot_of(e.addr).unwrap_or(NONE),
            TraceAction::FreeCompleted | TraceAction::Free => slots.freed(e.addr).unwrap_or(NONE),
            _ => NONE,
        };
        if s != NONE {
            let k = s as usize;
            slot[i] = s;
            if k >= used {
                used = k + 1;
                last.resize(used, NONE);
            }
            last[k] = i as u32;
        }
    }
    ((Blocks { slot, replaced, slots: used }, slots), last)
}

fn remove(t: &mut Totals, l: &Live) {
    if !l.pending {
        t.allocated_bytes -= l.size;
        t.requested_bytes -= l.requested;
    }
    t.active_bytes -= l.size;
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_alloc::{LiveBlock, PoolKind};
    use headroom_trace::start_state::StartSegment;

    /// The walk as it kept its blocks before the slots: a map by address.
    #[derive(Default)]
    struct ByAddress {
        live: FxHashMap<u64, Live>,
        totals: Totals,
        unmatched: usize,
    }

    impl ByAddress {
        fn step(&mut self, i: usize, e: &TraceEvent, size: u64) {
            let t = &mut self.totals;
            match e.action {
                TraceAction::Alloc => {
                    t.allocated_bytes += size;
                    t.active_bytes += size;
                    t.requested_bytes += e.size;
                    let new = Live { size, requested: e.size, stack: e.stack, since: Some(i), pending: false };
                    if let Some(old) = self.live.insert(e.addr, new) {
                        self.unmatched += 1;
                        remove(t, &old);
                    }
                }
                TraceAction::FreeRequested => match self.live.get_mut(&e.addr) {
                    Some(l) if !l.pending => {
                        l.pending = true;
                        t.allocated_bytes -= l.size;
                        t.requested_bytes -= l.requested;
                    }
                    _ => self.unmatched += 1,
                },
                TraceAction::FreeCompleted | TraceAction::Free => match self.live.remove(&e.addr) {
                    Some(l) => remove(t, &l),
                    None => self.unmatched += 1,
                },
                _ => {}
            }
        }
    }

    fn event(action: TraceAction, addr: u64, size: u64) -> TraceEvent {
        TraceEvent { action, addr, size, stream: 0, time_us: None, device_free: None, stack: 0, pool_id: (0, 0) }
    }

    /// Entry by entry, the same totals, unmatched frees, live blocks and blocks named as a map
    /// by address keeps: through blocks live at the start, allocations over live addresses,
    /// frees requested twice, frees of addresses never allocated, and old traces' `free`,
    /// on few addresses so that each is used again and again.
    #[test]
    fn slots_walk_as_a_map_by_address() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let actions = [TraceAction::Alloc, TraceAction::FreeRequested, TraceAction::FreeCompleted, TraceAction::Free];
        let mut snap = MemorySnapshot::default();
        snap.stacks.stacks.push(Box::new([]));
        let trace: Vec<TraceEvent> = (0..20_000)
            .map(|_| {
                let action = actions[next(4) as usize];
                // u64::MAX: the one address the slots' table keeps apart.
                let addr = match next(41) {
                    40 => u64::MAX,
                    a => a * 512,
                };
                event(action, addr, 1 + next(5000))
            })
            .collect();
        snap.device_traces = vec![trace.clone()];
        let live: Vec<LiveBlock> = (0..30)
            .map(|k| LiveBlock { address: k * 1024, size: 512 * (k + 1), requested_size: 500 * (k + 1) })
            .collect();
        let start = StartState {
            segments: vec![StartSegment {
                address: 0,
                size: 1 << 30,
                stream: 0,
                pool: PoolKind::Large,
                expandable: false,
                reserved_from: 0,
                pool_id: Default::default(),
                live: live.clone(),
            }],
            inferred_blocks: 0,
        };
        let mut w = Walk::new(&snap, 0, Some(&start));
        let mut model = ByAddress { totals: w.totals, ..Default::default() };
        for b in &live {
            let l = Live { size: b.size, requested: b.requested_size, stack: 0, since: None, pending: false };
            model.live.insert(b.address, l);
        }
        let config = snap.allocator_config().0;
        for (i, e) in trace.iter().enumerate() {
            let named = match e.action {
                TraceAction::Alloc | TraceAction::FreeRequested | TraceAction::FreeCompleted | TraceAction::Free => {
                    model.live.get(&e.addr).copied()
                }
                _ => None,
            };
            assert_eq!(w.named_by_next().copied(), named, "entry {i}, before");
            model.step(i, e, round_size(&config, e.size));
            assert!(w.step());
            if e.action == TraceAction::Alloc {
                assert_eq!(w.allocated_by(i).copied(), model.live.get(&e.addr).copied(), "entry {i}, after");
            }
            assert_eq!((w.totals, w.unmatched_frees), (model.totals, model.unmatched), "entry {i}");
        }
        let mut got: Vec<(u64, Live)> = w.live.iter().map(|(a, l)| (a, *l)).collect();
        let mut want: Vec<(u64, Live)> = model.live.into_iter().collect();
        got.sort_unstable_by_key(|&(a, _)| a);
        want.sort_unstable_by_key(|&(a, _)| a);
        assert_eq!(got, want);
        assert!(!w.step());
    }
}
