//! A device's trace read as a [`Walk`]'s operations: each recorded allocation a slot, named
//! by its address until it is freed, and what the recorded run did besides its requests and
//! frees carried between them as marks. The check ([`crate::snapshot_replay`]) and every
//! what-if ([`crate::what_if`]) walk this one reading; each observer acts on the marks it
//! needs and passes over the others.

use crate::entry_slots::Code;
use crate::memory_snapshot::{TraceAction, TraceEvent};
use crate::snapshot_pools::RecordedPools;
use crate::trace_index::{is_segment_event, TraceIndex};
use crate::walk::{Op, Slot};
use rustc_hash::FxHashMap;

/// Streams that stand for "another stream used this block": far above any stream a snapshot
/// names (CUDA stream handles are pointers).
pub(crate) const STAND_IN_STREAMS: u64 = 1 << 62;

/// What the recorded run did between its requests and frees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mark {
    /// A segment event: the device call the next decision should make.
    Segment,
    /// A step of the trace begins ([`crate::recorded_step::step_starts`]).
    StepBegins,
    /// The program called `empty_cache()` here (followed by the call itself).
    EmptyCache,
    /// A request comes; `failed`: the recorded run could not serve it (an `oom` entry).
    Request { failed: bool },
    /// The request was answered.
    Answered,
    /// A free comes (one that completes at once).
    Free,
    /// A free of an address no live block has.
    UnknownFree,
    /// The free that waited on `stream` completed: now, or (`at_next_request`) by the
    /// synchronisation a release begins with inside the next request.
    Completed { stream: u64, at_next_request: bool },
}

/// The slot a free of `code`, of the block at `address`, frees: `None` where no live block
/// has that address.
#[inline]
fn freed(adopted: &mut FxHashMap<u64, Slot>, code: Code, address: u64) -> Option<Slot> {
    match code {
        Code::Slot(slot) => Some(slot),
        Code::Open => adopted.remove(&address),
        _ => None,
    }
}

/// Whether the next of `marked` is entry `i`, and if so, on to the one after it.
#[inline]
fn next_is((marked, next): &mut (Vec<usize>, usize), i: usize) -> bool {
    let hit = marked.get(*next) == Some(&i);
    *next += usize::from(hit);
    hit
}

/// The trace's entries as a walk's operations, each at its entry's index.
pub(crate) struct TraceRequests<'a, F> {
    trace: &'a [TraceEvent],
    /// Each entry's slot, resolved by the index's walk: no map of addresses is probed here.
    index: &'a TraceIndex,
    pools: &'a RecordedPools,
    next: usize,
    /// Operations of the entry being read, in order, `queued[head..len]` still to come:
    /// an array, not a queue that allocates, since an entry makes at most six.
    queued: [Op<Mark>; 6],
    head: usize,
    len: usize,
    /// The blocks live when the trace began, by address, each with its slot (numbered after
    /// the trace's own), until freed or allocated over: the slots of the frees the index
    /// left open.
    adopted: FxHashMap<u64, Slot>,
    next_adopted: Slot,
    /// The stand-in stream of the next free requested that completes later.
    next_stand_in: u64,
    /// The entries to mark, ascending, each with the position of the next one to come: a
    /// comparison an entry, where a peekable iterator checked its peeked state first.
    step_starts: (Vec<usize>, usize),
    empty_cache_calls: (Vec<usize>, usize),
    /// Whether the marks only a comparison with the recorded run reads (`Segment`, `Free`,
    /// `UnknownFree`) are made: the check's, not a what-if's, which decides for itself
    /// and would pass over one mark or two of every entry.
    compared: bool,
    pub(crate) progress: F,
}

impl<'a, F: FnMut(usize)> TraceRequests<'a, F> {
    /// `step_starts` and `empty_cache_calls`: the entries to mark as such, ascending.
    pub(crate) fn new(
        trace: &'a [TraceEvent],
        index: &'a TraceIndex,
        pools: &'a RecordedPools,
        step_starts: Vec<usize>,
        empty_cache_calls: Vec<usize>,
        progress: F,
    ) -> Self {
        TraceRequests {
            trace,
            index,
            pools,
            next: 0,
            queued: [Op::CompleteEvents; 6],
            head: 0,
            len: 0,
            adopted: FxHashMap::default(),
            next_adopted: index.slot_count(),
            next_stand_in: STAND_IN_STREAMS,
            step_starts: (step_starts, 0),
            empty_cache_calls: (empty_cache_calls, 0),
            compared: true,
            progress,
        }
    }

    /// The slot of the block live at `address` when the trace began.
    pub(crate) fn adopt(&mut self, address: u64) -> Slot {
        let slot = self.next_adopted;
        self.next_adopted += 1;
        self.adopted.insert(address, slot);
        slot
    }

    /// Leaves out the marks only a comparison with the recorded run reads.
    pub(crate) fn uncompared(mut self) -> Self {
        self.compared = false;
        self
    }

    /// Queues entry `i`'s operations.
    fn read(&mut self, i: usize) {
        let e = &self.trace[i];
        let ops = &mut self.queued;
        let mut n = 0;
        let mut push = |op| {
            ops[n] = op;
            n += 1;
        };
        if next_is(&mut self.step_starts, i) {
            push(Op::Mark(Mark::StepBegins));
        }
        if next_is(&mut self.empty_cache_calls, i) {
            push(Op::Mark(Mark::EmptyCache));
            push(Op::EmptyCache);
        }
        let compared = self.compared;
        let code = self.index.slot_code(i);
        match (e.action, code) {
            // Uncompared, a segment event makes nothing (the last arm).
            (a_, _) if compared && is_segment_event(a_) => push(Op::Mark(Mark::Segment)),
            (TraceAction::Alloc | TraceAction::Oom, Code::Slot(slot)) => {
                let failed = e.action == TraceAction::Oom;
                // A request the recorded run failed holds nothing: its block, if this run
                // serves it, is freed at once.
                if !failed && !self.adopted.is_empty() {
                    // The block live there at the start is no longer named by its address.
                    self.adopted.remove(&e.addr);
                }
                push(Op::Mark(Mark::Request { failed }));
                push(Op::Alloc { slot, size: e.size, stream: e.stream, pool: self.pools.pool_of(i, e) });
                push(Op::Mark(Mark::Answered));
                if failed {
                    push(Op::Free { slot });
                }
            }
            // A free whose completion comes later: the block waits on an event, as it did in
            // the recorded run, on a stream of its own, so it becomes reusable exactly when
            // the trace says.
            (TraceAction::FreeRequested, _) if code != Code::Nothing => {
                let stream = self.next_stand_in;
                self.next_stand_in += 1;
                match freed(&mut self.adopted, code, e.addr) {
                    Some(slot) => {
                        push(Op::RecordStream { slot, stream });
                        push(Op::Free { slot });
                    }
                    None if compared => push(Op::Mark(Mark::UnknownFree)),
                    None => {}
                }
            }
            // Completions right before segments are released, or before an OOM, come from
            // the synchronisation that releasing begins with (PyTorch's
            // synchronize_and_free_events): the events stay pending until then. Others were
            // found complete when the next request began (process_events). Had a block
            // completed there and been able to serve the request, nothing would have been
            // released, so the two readings differ in nothing else.
            (TraceAction::FreeCompleted, Code::Completed { k, at_next_request }) => {
                let stream = STAND_IN_STREAMS + u64::from(k);
                push(Op::Mark(Mark::Completed { stream, at_next_request }));
            }
            (TraceAction::FreeCompleted | TraceAction::Free, _) => {
                if compared {
                    push(Op::Mark(Mark::Free));
                }
                match freed(&mut self.adopted, code, e.addr) {
                    Some(slot) => push(Op::Free { slot }),
                    None if compared => push(Op::Mark(Mark::UnknownFree)),
                    None => {}
                }
            }
            _ => {}
        }
        (self.head, self.len) = (0, n);
    }
}

impl<F: FnMut(usize)> Iterator for TraceRequests<'_, F> {
    type Item = (usize, Op<Mark>);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.head < self.len {
                self.head += 1;
                return Some((self.next - 1, self.queued[self.head - 1]));
            }
            let i = self.next;
            if i >= self.trace.len() {
                return None;
            }
            if i.is_multiple_of(65536) {
                (self.progress)(i);
            }
            self.next += 1;
            self.read(i);
        }
    }
}
