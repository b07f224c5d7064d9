//! A device's trace read as a [`Walk`]'s operations: each recorded allocation a slot, named
//! by its address until it is freed, and what the recorded run did besides its requests and
//! frees carried between them as marks. The check ([`crate::snapshot_replay`]) and every
//! what-if ([`crate::what_if`]) walk this one reading; each observer acts on the marks it
//! needs and passes over the others.

use crate::entry_slots::Code;
use crate::memory_snapshot::{TraceAction, TraceEvent};
use crate::snapshot_pools::RecordedPools;
use crate::trace_index::{is_segment_event, TraceIndex};
use crate::walk::{Flow, Observer, Op, Slot, Walk, WalkError};
use headroom_alloc::{DeviceCachingAllocator, DeviceMemory, Policy};
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
    /// The request was answered; `addr`, `failed`: the entry's recorded address, and whether
    /// the recorded run failed it, carried for the check (which read them from the trace again).
    Answered { addr: u64, failed: bool },
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

/// The entry at which [`next_is`] can next say yes for `marked`, the entries before `from`
/// read: its next one if that is not before `from` (`usize::MAX` if it is, or if none is
/// left: entries are read in order, so one already passed is never met again).
#[inline]
fn next_at((marked, next): &(Vec<usize>, usize), from: usize) -> usize {
    marked.get(*next).copied().filter(|&m| m >= from).unwrap_or(usize::MAX)
}

/// The trace's entries as a walk's operations, each at its entry's index.
pub(crate) struct TraceRequests<'a, F> {
    entries: Entries<'a>,
    next: usize,
    /// What is left of the entry a walk stopped at (an error, or the observer's stop),
    /// `left[head..len]`, to be walked first when the walk goes on: an array, not a queue
    /// that allocates, since an entry makes at most six operations.
    left: [Op<Mark>; 6],
    head: usize,
    len: usize,
    pub(crate) progress: F,
}

/// What reads an entry into its operations: the trace, and what the reading keeps.
struct Entries<'a> {
    trace: &'a [TraceEvent],
    /// Each entry's slot, resolved by the index's walk: no map of addresses is probed here.
    index: &'a TraceIndex,
    pools: &'a RecordedPools,
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
    /// The first entry either list above may mark ([`next_at`]): one comparison an entry
    /// where asking both lists cost about a dozen instructions (docs/PERFORMANCE.md,
    /// "Replay passes, twentieth round").
    next_marked: usize,
    /// Whether the marks only a comparison with the recorded run reads (`Segment`, `Free`,
    /// `UnknownFree`) are made: the check's, not a what-if's, which decides for itself
    /// and would pass over one mark or two of every entry.
    compared: bool,
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
        let first = step_starts.first().copied().unwrap_or(usize::MAX);
        TraceRequests {
            entries: Entries {
                trace,
                index,
                pools,
                adopted: FxHashMap::default(),
                next_adopted: index.slot_count(),
                next_stand_in: STAND_IN_STREAMS,
                next_marked: first.min(empty_cache_calls.first().copied().unwrap_or(usize::MAX)),
                step_starts: (step_starts, 0),
                empty_cache_calls: (empty_cache_calls, 0),
                compared: true,
            },
            next: 0,
            left: [Op::CompleteEvents; 6],
            head: 0,
            len: 0,
            progress,
        }
    }

    /// The slot of the block live at `address` when the trace began.
    pub(crate) fn adopt(&mut self, address: u64) -> Slot {
        let e = &mut self.entries;
        let slot = e.next_adopted;
        e.next_adopted += 1;
        e.adopted.insert(address, slot);
        slot
    }

    /// Leaves out the marks only a comparison with the recorded run reads.
    pub(crate) fn uncompared(mut self) -> Self {
        self.entries.compared = false;
        self
    }

    /// Walks the entries through `alloc`, from where the last walk stopped, telling
    /// `observer`; stops as [`Walk::run`] does, and goes on from there when called again.
    /// Each operation goes to the walk as the entry is read, not through a queue and an
    /// iterator: the walk's step, inlined at each place an operation is made, knows which
    /// it is (docs/PERFORMANCE.md, "Replay passes, fourteenth round").
    pub(crate) fn walk<D, P, O>(
        &mut self,
        walk: &mut Walk,
        alloc: &mut DeviceCachingAllocator<D, P>,
        observer: &mut O,
    ) -> Result<(), WalkError>
    where
        D: DeviceMemory,
        P: Policy,
        O: Observer<D, P, Mark = Mark>,
    {
        while self.head < self.len {
            let op = self.left[self.head];
            self.head += 1;
            if walk.step(alloc, self.next - 1, op, observer)? == Flow::Stop {
                return Ok(());
            }
        }
        (self.head, self.len) = (0, 0);
        // The entries and their codes walked side by side from where the last walk stopped:
        // no index into either is checked against its length at each entry.
        let (trace, codes) = (self.entries.trace, self.entries.index.slot_codes());
        debug_assert!(codes.len() >= trace.len(), "a code for every entry");
        let from = self.next;
        for (k, (e, &c)) in trace[from..].iter().zip(&codes[from..]).enumerate() {
            let i = from + k;
            if i.is_multiple_of(65536) {
                (self.progress)(i);
            }
            // Set once a step errs or stops: the entry's operations after it are kept.
            let mut halted: Option<Result<(), WalkError>> = None;
            let (left, len) = (&mut self.left, &mut self.len);
            self.entries.read(
                i,
                e,
                c,
                #[inline(always)]
                |op| {
                    if halted.is_some() {
                        left[*len] = op;
                        *len += 1;
                        return;
                    }
                    match walk.step(alloc, i, op, observer) {
                        Ok(Flow::Continue) => {}
                        Ok(Flow::Stop) => halted = Some(Ok(())),
                        Err(e) => halted = Some(Err(e)),
                    }
                },
            );
            if let Some(out) = halted {
                self.next = i + 1;
                self.head = 0;
                return out;
            }
        }
        self.next = trace.len();
        Ok(())
    }
}

impl Entries<'_> {
    /// Hands entry `i`'s operations to `push`, in order: `e` is the entry, `c` its slot code.
    /// One `match` on the action, where a match on the pair tested for a segment event first
    /// at every entry (docs/PERFORMANCE.md, "Replay passes, nineteenth round"), each arm
    /// decoding the code as far as it reads it: decoded whole before the `match`, it cost every
    /// entry about seven instructions ("twenty-first round").
    #[inline(always)]
    fn read(&mut self, i: usize, e: &TraceEvent, c: u32, mut push: impl FnMut(Op<Mark>)) {
        if i == self.next_marked {
            if next_is(&mut self.step_starts, i) {
                push(Op::Mark(Mark::StepBegins));
            }
            if next_is(&mut self.empty_cache_calls, i) {
                push(Op::Mark(Mark::EmptyCache));
                push(Op::EmptyCache);
            }
            self.next_marked = next_at(&self.step_starts, i + 1).min(next_at(&self.empty_cache_calls, i + 1));
        }
        let compared = self.compared;
        match e.action {
            TraceAction::Alloc | TraceAction::Oom => {
                let Code::Slot(slot) = Code::of(c) else { return };
                let failed = e.action == TraceAction::Oom;
                // A request the recorded run failed holds nothing: its block, if this run
                // serves it, is freed at once.
                if !failed && !self.adopted.is_empty() {
                    // The block live there at the start is no longer named by its address.
                    self.adopted.remove(&e.addr);
                }
                push(Op::Mark(Mark::Request { failed }));
                push(Op::Alloc { slot, size: e.size, stream: e.stream, pool: self.pools.pool_of(i, e) });
                push(Op::Mark(Mark::Answered { addr: e.addr, failed }));
                if failed {
                    push(Op::Free { slot });
                }
            }
            // A free whose completion comes later: the block waits on an event, as it did in
            // the recorded run, on a stream of its own, so it becomes reusable exactly when
            // the trace says.
            TraceAction::FreeRequested => {
                let code = Code::of(c);
                if code == Code::Nothing {
                    return;
                }
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
            TraceAction::FreeCompleted | TraceAction::Free => {
                // Completions right before segments are released, or before an OOM, come
                // from the synchronisation that releasing begins with (PyTorch's
                // synchronize_and_free_events): the events stay pending until then. Others
                // were found complete when the next request began (process_events). Had a
                // block completed there and been able to serve the request, nothing would
                // have been released, so the two readings differ in nothing else.
                let code = Code::of(c);
                if let (TraceAction::FreeCompleted, Code::Completed { k, at_next_request }) = (e.action, code) {
                    let stream = STAND_IN_STREAMS + u64::from(k);
                    push(Op::Mark(Mark::Completed { stream, at_next_request }));
                    return;
                }
                if compared {
                    push(Op::Mark(Mark::Free));
                }
                match freed(&mut self.adopted, code, e.addr) {
                    Some(slot) => push(Op::Free { slot }),
                    None if compared => push(Op::Mark(Mark::UnknownFree)),
                    None => {}
                }
            }
            // Uncompared, a segment event makes nothing.
            a_ if compared && is_segment_event(a_) => push(Op::Mark(Mark::Segment)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory_snapshot::{MemorySnapshot, Stacks};
    use headroom_alloc::units::MIB;
    use headroom_alloc::{AllocError, Allocation, AllocatorConfig, Oom, SimDevice};

    /// Logs what it is told, and refuses the marks of the entries in `refuse` once each.
    struct Log {
        seen: Vec<String>,
        refuse: Vec<usize>,
    }

    impl<D: DeviceMemory, P: Policy> Observer<D, P> for Log {
        type Mark = Mark;
        fn mark(&mut self, i: usize, m: Mark, _: &mut DeviceCachingAllocator<D, P>) -> Result<(), AllocError> {
            self.seen.push(format!("{i} {m:?}"));
            match self.refuse.iter().position(|&r| r == i) {
                Some(at) => {
                    self.refuse.remove(at);
                    Err(AllocError::InvalidPointer(i as u64))
                }
                None => Ok(()),
            }
        }
        fn allocated(&mut self, i: usize, slot: Slot, b: Allocation, _: &DeviceCachingAllocator<D, P>) {
            self.seen.push(format!("{i} alloc {slot} {}", b.size));
        }
        fn freed(&mut self, i: usize, slot: Slot, _: Allocation) {
            self.seen.push(format!("{i} free {slot}"));
        }
        fn failed(&mut self, _: usize, _: Slot, _: Oom, _: &DeviceCachingAllocator<D, P>) -> Flow {
            Flow::Continue
        }
    }

    fn entry(action: TraceAction, addr: u64) -> TraceEvent {
        TraceEvent { action, addr, size: MIB, stream: 0, time_us: None, device_free: None, stack: 0, pool_id: (0, 0) }
    }

    /// Walks the trace, called again after each error as the check does; the log and the errors' entries.
    fn walked(trace: Vec<TraceEvent>, refuse: Vec<usize>) -> (Vec<String>, Vec<usize>) {
        // `stacks[0]`, the empty stack, is every snapshot's.
        let stacks = Stacks { stacks: vec![Box::default()], ..Default::default() };
        let snap = MemorySnapshot { device_traces: vec![trace], stacks, ..Default::default() };
        let index = TraceIndex::of(&snap, 0);
        let pools = RecordedPools::default();
        let trace = &snap.device_traces[0];
        let mut ops = TraceRequests::new(trace, &index, &pools, Vec::new(), Vec::new(), |_| {});
        let mut a = DeviceCachingAllocator::new(SimDevice::new(100 * MIB), AllocatorConfig::default());
        let (mut walk, mut log) = (Walk::default(), Log { seen: Vec::new(), refuse });
        let mut errors = Vec::new();
        while let Err(e) = ops.walk(&mut walk, &mut a, &mut log) {
            errors.push(e.at());
        }
        (log.seen, errors)
    }

    #[test]
    fn a_walk_stopped_by_an_error_goes_on_with_the_rest_of_its_entry() {
        let trace = vec![
            entry(TraceAction::Alloc, 0x1000),
            entry(TraceAction::Alloc, 0x2000),
            entry(TraceAction::FreeRequested, 0x1000),
            entry(TraceAction::FreeCompleted, 0x1000),
        ];
        let (whole, none) = walked(trace.clone(), Vec::new());
        assert!(none.is_empty());
        let want = [
            "0 Request { failed: false }",
            "0 alloc 0 1048576",
            "0 Answered { addr: 4096, failed: false }",
            "1 Request { failed: false }",
            "1 alloc 1 1048576",
            "1 Answered { addr: 8192, failed: false }",
            "3 Free",
            "3 free 0",
        ];
        assert_eq!(whole, want);
        // The request's mark refused: its allocation and answer still come, then the rest.
        let (refused, errors) = walked(trace.clone(), vec![1, 3]);
        assert_eq!(errors, [1, 3]);
        assert_eq!(refused, whole);
    }
}
