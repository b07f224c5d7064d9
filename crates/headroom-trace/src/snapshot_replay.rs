//! A snapshot's trace, replayed through headroom's allocator from the state
//! it began in ([`crate::start_state`]), two ways:
//!
//! - [`check_device`]: under the recorded settings, with the device saying
//!   yes and no where the recorded device did (new segments at the recorded
//!   addresses, failures where the trace shows a flush or an `oom`), every
//!   decision compared with the recorded one: each allocation's address,
//!   each `segment_alloc` / `segment_free` / `segment_map` / `segment_unmap`
//!   in order, the final segments and blocks;
//! - [`what_if_device`]: under any settings and any device size, the same
//!   requests and frees, with headroom deciding everything: peaks,
//!   fragmentation, device calls, and where it runs out of memory.
//!
//! The trace decides what the program asked for, never what the allocator
//! does: a what-if replay sees only the requests, frees and `empty_cache`
//! calls, in order, and the memory limit the program set ([`Recorded`]).
//! Under the recorded settings it is the recorded run: the device hands out
//! the recorded addresses ([`crate::replay_device`]) and refuses where the
//! recorded device refused, for as long as the replay's device calls are the
//! recorded ones — which, decision for decision, is all of them. A what-if
//! under other settings starts the same way and differs from there only by
//! what the settings change.

use crate::device_trace::DeviceTrace;
use crate::recorded_memory::{RecordedMemory, Refusal};
use crate::snapshot::{MemorySnapshot, TraceAction, TraceEvent};
use crate::snapshot_pools::RecordedPools;
use crate::start_allocator::{allocator_at, unsupported};
pub use crate::start_allocator::{ReplayDevice, SnapshotReplayError};
use crate::start_state::infer_start;
use crate::trace_requests::{Mark, TraceRequests};
use crate::walk::{Flow, Observer, Slot, Walk, WalkError};
use headroom_alloc::{AllocError, Allocation, AllocatorConfig, BlockState, DeviceCachingAllocator, Oom, PyTorchPolicy};

/// The first decision that differed, with the recorded entries around it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Divergence {
    /// Index of the entry in the device's trace.
    pub index: usize,
    pub message: String,
    /// A few entries before and after, as `index: action addr size`.
    pub context: Vec<String>,
}

/// How closely headroom's decisions matched one device's recorded ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fidelity {
    pub device: u32,
    pub alloc_matched: usize,
    pub alloc_total: usize,
    /// `segment_alloc`, `segment_free`, `segment_map`, `segment_unmap`: same action, address and size, in order.
    pub segment_matched: usize,
    pub segment_total: usize,
    /// Recorded `oom` entries where headroom ran out of memory too.
    pub oom_matched: usize,
    pub oom_total: usize,
    /// Blocks of the final segments with the same address, size and state (free or not).
    pub final_blocks_matched: usize,
    pub final_blocks_total: usize,
    /// Blocks live when the trace began (0 for a trace from an empty allocator).
    pub live_at_start: usize,
    /// Of those, the ones whose size was inferred.
    pub inferred_blocks: usize,
    pub first_divergence: Option<Divergence>,
    /// What the program did besides its requests and frees, and where the
    /// device refused: what a what-if replays beside the trace.
    pub recorded: Recorded,
}

/// What a recorded run did besides its requests and frees, as the check
/// found it: what every what-if replay of it repeats.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    /// Where the program called `empty_cache()` (the first release of each
    /// call), told apart from the allocator's own flushes by replay.
    pub empty_cache_calls: Vec<usize>,
    /// Requests the device (or a per-process limit) refused.
    pub refusals: Vec<Refusal>,
    /// The per-process limit on reserved memory the program set
    /// (`set_per_process_memory_fraction`), as far as the refusals tell
    /// ([`RecordedMemory::replayed_limit`]).
    pub memory_limit: Option<u64>,
    /// Which private pool the trace left to inference, and what it could
    /// not decide ([`RecordedPools::notes`]): empty where the trace names
    /// every pool or the run used none.
    pub pool_notes: Vec<String>,
}

impl Fidelity {
    /// Every decision matched.
    pub fn is_exact(&self) -> bool {
        self.alloc_matched == self.alloc_total
            && self.segment_matched == self.segment_total
            && self.oom_matched == self.oom_total
            && self.final_blocks_matched == self.final_blocks_total
            && self.first_divergence.is_none()
    }
}

/// The counts, matched of total per kind: "alloc 6526/6526, segment events 0/0, …".
impl std::fmt::Display for Fidelity {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "alloc {}/{}, segment events {}/{}, OOMs {}/{}, final blocks {}/{}",
            self.alloc_matched,
            self.alloc_total,
            self.segment_matched,
            self.segment_total,
            self.oom_matched,
            self.oom_total,
            self.final_blocks_matched,
            self.final_blocks_total
        )
    }
}

/// Simulated device memory for a check replay without expandable segments:
/// beyond any GPU, so that the device fails only where the trace says it did.
const CHECK_CAPACITY: u64 = 1 << 50;

fn describe(i: usize, e: &TraceEvent) -> String {
    format!("{i}: {} {:#x} {}", e.action.name(), e.addr, e.size)
}

fn context(trace: &[TraceEvent], i: usize) -> Vec<String> {
    let lo = i.saturating_sub(3);
    let hi = (i + 4).min(trace.len());
    (lo..hi).map(|j| describe(j, &trace[j])).collect()
}

fn segment_action(a: headroom_alloc::Action) -> Option<TraceAction> {
    use headroom_alloc::Action as A;
    Some(match a {
        A::SegmentAlloc => TraceAction::SegmentAlloc,
        A::SegmentFree => TraceAction::SegmentFree,
        A::SegmentMap => TraceAction::SegmentMap,
        A::SegmentUnmap => TraceAction::SegmentUnmap,
        _ => return None,
    })
}

/// Replays `device`'s trace under the recorded settings and compares every
/// decision. `progress` is called with the entries done, now and then.
/// `capacity` is the device's memory: it matters only for expandable
/// segments, whose address reservations PyTorch sizes by it (elsewhere the
/// device fails exactly where the trace shows it did).
pub fn check_device(
    snap: &MemorySnapshot,
    device: u32,
    capacity: u64,
    progress: impl FnMut(usize),
) -> Result<Fidelity, SnapshotReplayError> {
    check_device_with(snap, device, snap.allocator_config().0, capacity, progress)
}

/// [`check_device`] under settings other than the recorded ones: the
/// decisions should then differ (the check's negative control).
pub fn check_device_with(
    snap: &MemorySnapshot,
    device: u32,
    config: AllocatorConfig,
    capacity: u64,
    progress: impl FnMut(usize),
) -> Result<Fidelity, SnapshotReplayError> {
    let start = infer_start(snap, device, &config)?;
    check_from(&DeviceTrace::from_start(snap, device, start), config, capacity, progress)
}

/// [`check_device_with`] from a start state already inferred under `config`.
pub fn check_from(
    t: &DeviceTrace,
    config: AllocatorConfig,
    capacity: u64,
    progress: impl FnMut(usize),
) -> Result<Fidelity, SnapshotReplayError> {
    let (snap, device, start, trace) = (t.snap, t.device, &t.start, t.trace());
    if let Some(e) = unsupported(device, &config) {
        return Err(e);
    }
    let maps = t.index().maps(trace);
    let capacity = if maps { capacity } else { CHECK_CAPACITY };
    let pools = t.pools();
    let calls_end = t.index().calls_end(trace);
    let mut a = allocator_at(start, config.clone(), PyTorchPolicy, capacity, device, calls_end, None)?;
    a.record_device_calls();
    let mut checker = Checker {
        trace,
        config,
        pools,
        f: Fidelity {
            device,
            alloc_matched: 0,
            alloc_total: 0,
            segment_matched: 0,
            segment_total: 0,
            oom_matched: 0,
            oom_total: 0,
            final_blocks_matched: 0,
            final_blocks_total: 0,
            live_at_start: start.live_blocks(),
            inferred_blocks: start.inferred_blocks,
            first_divergence: None,
            recorded: Recorded::default(),
        },
        pending: Vec::new(),
        clusters: Default::default(),
        request: None,
        answer: None,
        // The first answer clears whatever the start state left told.
        told: true,
    };
    let mut ops = TraceRequests::new(trace, t.index(), pools, Vec::new(), Vec::new(), progress);
    let mut walk = Walk::default();
    for b in start.segments.iter().flat_map(|s| &s.live) {
        let size = a.allocation_size(b.address).unwrap_or(0);
        walk.adopt(ops.adopt(b.address), Allocation { ptr: b.address, size }, &a);
    }
    // The walk holds every block's id from here: the allocator's map of addresses would be
    // a second map of the same allocations.
    a.keep_pointer_map(false);
    // A call the allocator refused is a decision that differed; the check goes on.
    while let Err(e) = ops.walk(&mut walk, &mut a, &mut checker) {
        checker.refused(e);
    }
    a.keep_pointer_map(true);
    if !checker.pending.is_empty() {
        checker.empty_cache(&mut a, trace.len().saturating_sub(1));
    }
    (ops.progress)(trace.len());
    let mut f = checker.f;
    f.recorded.pool_notes = pools.notes().to_vec();
    f.recorded.memory_limit = RecordedMemory::infer(t, &f.recorded.refusals).replayed_limit();
    final_layout(&mut f, &mut a, snap, trace.len());
    Ok(f)
}

/// Compares the final segments' blocks with headroom's.
fn final_layout(f: &mut Fidelity, a: &mut DeviceCachingAllocator<ReplayDevice>, snap: &MemorySnapshot, end: usize) {
    let mut ours: Vec<(u64, u64, bool)> = a
        .snapshot()
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter().map(|b| (b.address, b.size, b.state == BlockState::Inactive)))
        .collect();
    ours.sort_unstable();
    for s in snap.segments.iter().filter(|s| s.device == f.device) {
        for b in &s.blocks {
            f.final_blocks_total += 1;
            let key = (b.address, b.size, b.state == BlockState::Inactive);
            if ours.binary_search(&key).is_ok() {
                f.final_blocks_matched += 1;
            } else if f.first_divergence.is_none() {
                f.first_divergence = Some(Divergence {
                    index: end,
                    message: format!(
                        "final block {:#x} of {} bytes ({}) is not in headroom's final state",
                        b.address,
                        b.size,
                        b.state.name()
                    ),
                    context: Vec::new(),
                });
            }
        }
    }
    if ours.len() != f.final_blocks_total && f.first_divergence.is_none() {
        f.first_divergence = Some(Divergence {
            index: end,
            message: format!("headroom ends with {} blocks, the snapshot with {}", ours.len(), f.final_blocks_total),
            context: Vec::new(),
        });
    }
}

/// The check's observer: it stands in for the recorded device, and compares each decision.
struct Checker<'a> {
    trace: &'a [TraceEvent],
    config: AllocatorConfig,
    pools: &'a RecordedPools,
    f: Fidelity,
    /// Segment events recorded since the last request, with their indices.
    pending: Vec<usize>,
    /// Extents of the expandable segments' mapped ranges seen so far, low -> high.
    clusters: std::collections::BTreeMap<u64, u64>,
    /// The request underway: the entry's index.
    request: Option<usize>,
    /// How the allocator answered it: the block's address, or the first line of its error.
    answer: Option<Result<u64, String>>,
    /// Whether a segment event told the device an address since its addresses were last
    /// cleared: most requests follow none, and clearing two empty queues at each answer cost
    /// about six instructions (docs/PERFORMANCE.md, "Replay passes, twenty-first round").
    told: bool,
}

type CheckAllocator = DeviceCachingAllocator<ReplayDevice>;

/// A segment event headroom's allocator made: (action, address, size).
type SegmentCall = (TraceAction, u64, u64);

impl Checker<'_> {
    /// Records the first divergence. The message is made only for that one: a replay that
    /// departs from the recording departs at most of its requests, and formatting each
    /// message took a quarter of such a check's time.
    fn diverge(&mut self, i: usize, message: impl FnOnce() -> String) {
        if self.f.first_divergence.is_none() {
            self.f.first_divergence =
                Some(Divergence { index: i, message: message(), context: context(self.trace, i) });
        }
    }

    /// A call the allocator refused: the answer to the request underway, or a
    /// free that failed.
    fn refused(&mut self, e: WalkError) {
        let i = e.at();
        match (self.request, &e) {
            (Some(r), WalkError::Alloc { error, .. }) if r == i && self.answer.is_none() => {
                self.answer = Some(Err(first_line(error)))
            }
            _ => self.diverge(i, || format!("free of {:#x}: {e}", self.trace[i].addr)),
        }
    }

    /// What a refused request asked for: a segment of PyTorch's size for it; and
    /// the most a device call for it could need — with expandable segments a
    /// mapping of it spans whole pages, one more where it starts inside one.
    fn asked_for(&self, rounded: u64) -> (u64, u64) {
        let config = &self.config;
        let asked = headroom_alloc::sizing::allocation_size(config, rounded);
        let page = headroom_alloc::sizing::expandable_page_size(config, headroom_alloc::sizing::pool_for(rounded));
        (asked, if config.expandable_segments { rounded.next_multiple_of(page) + page } else { asked })
    }

    /// Compares headroom's segment events since the last call with `pending`,
    /// recording the first that differs.
    fn compare(&mut self, a: &mut CheckAllocator, mut pending: Vec<usize>, at: usize) {
        // Most requests make no device call and were recorded making none: nothing to compare.
        // Draining the empty history into a list for them was most of this function's cost.
        if pending.is_empty() && a.history_len() == 0 {
            if self.pending.is_empty() {
                self.pending = pending;
            }
            return;
        }
        let trace = self.trace;
        let ours: Vec<SegmentCall> =
            a.drain_history().filter_map(|e| segment_action(e.action).map(|x| (x, e.addr, e.size))).collect();
        self.f.segment_total += pending.len();
        // The first call that differs (with headroom's call there, if it made one), or
        // headroom's first call past the recorded ones; described only where it is the
        // replay's first divergence.
        let mut first_bad: Option<(usize, Option<SegmentCall>)> = None;
        for (k, &i) in pending.iter().enumerate() {
            let r = &trace[i];
            match ours.get(k) {
                Some(&(act, addr, size)) if act == r.action && addr == r.addr && size == r.size => {
                    self.f.segment_matched += 1
                }
                made => {
                    first_bad.get_or_insert((i, made.copied()));
                }
            }
        }
        let extra = ours.get(pending.len()).copied();
        pending.clear();
        if self.pending.is_empty() {
            // The buffer is kept for the next request's events.
            self.pending = pending;
        }
        match (first_bad, extra) {
            (Some((j, Some((act, addr, size)))), _) => self.diverge(j, || {
                format!("recorded {}, headroom {} {addr:#x} {size}", describe(j, &trace[j]), act.name())
            }),
            (Some((j, None)), _) => {
                self.diverge(j, || format!("recorded {}, headroom made no such device call", describe(j, &trace[j])))
            }
            (None, Some((act, addr, size))) => self.diverge(at, || {
                format!("headroom made a device call the recorded run did not: {} {addr:#x} {size}", act.name())
            }),
            (None, None) => {}
        }
    }

    /// The program's `empty_cache()`, which released the segments recorded since the last request.
    #[inline(never)]
    fn empty_cache(&mut self, a: &mut CheckAllocator, at: usize) {
        let released = std::mem::take(&mut self.pending);
        self.f.recorded.empty_cache_calls.extend(released.first());
        self.pools.release_freed(a, self.trace, released.iter().copied());
        if a.empty_cache().is_err() {
            self.diverge(at, || "empty_cache failed".into());
        }
        self.compare(a, released, at);
    }

    /// A free of an address no live block has: a decision that differed.
    #[inline(never)]
    fn unknown_free(&mut self, i: usize) {
        let addr = self.trace[i].addr;
        self.diverge(i, || format!("free of {addr:#x}: {}", AllocError::InvalidPointer(addr)));
    }

    /// A segment event: the device is told the address the next call should get.
    #[inline(never)]
    fn segment(&mut self, a: &mut CheckAllocator, i: usize) {
        let e = &self.trace[i];
        if e.action == TraceAction::SegmentAlloc {
            a.device_mut().inner_mut().sim_mut().push_next_address(e.addr);
            self.told = true;
        }
        // A map that does not touch the ranges mapped so far opens a new
        // expandable segment: its reservation starts there.
        if e.action == TraceAction::SegmentMap {
            let end = e.addr.saturating_add(e.size);
            match self.clusters.range(..=e.addr).next_back().map(|(&lo, &hi)| (lo, hi)) {
                Some((lo, hi)) if e.addr <= hi => {
                    self.clusters.insert(lo, hi.max(end));
                }
                _ => {
                    if !a.device().inner().sim().is_reserved(e.addr) {
                        a.device_mut().inner_mut().sim_mut().push_next_reservation(e.addr);
                        self.told = true;
                    }
                    self.clusters.insert(e.addr, end);
                }
            }
        }
        self.pending.push(i);
    }

    /// Before a request: the device told to refuse where the recorded one did,
    /// and the releases of the program's `empty_cache()` made. Inlined where the mark is
    /// made: most requests come after no segment event and were served, and for them this
    /// is a store; the rest is a call ([`Self::request_after_events`]). `failed`: the entry is
    /// an OOM, as the mark says (not read again from the trace).
    #[inline(always)]
    fn request(&mut self, a: &mut CheckAllocator, i: usize, failed: bool) {
        if !self.pending.is_empty() || failed {
            return self.request_after_events(a, i);
        }
        (self.request, self.answer) = (Some(i), None);
    }

    /// [`Self::request`] after segment events, or of a request the recorded run failed.
    #[inline(never)]
    fn request_after_events(&mut self, a: &mut CheckAllocator, i: usize) {
        let (trace, e) = (self.trace, &self.trace[i]);
        let is_new = |j: &usize| matches!(trace[*j].action, TraceAction::SegmentAlloc | TraceAction::SegmentMap);
        let new = self.pending.iter().any(is_new);
        let release = self
            .pending
            .iter()
            .any(|&j| matches!(trace[j].action, TraceAction::SegmentFree | TraceAction::SegmentUnmap));
        // Segments released before this request come from the allocator's
        // own flush (the device said no; it releases every cached segment and
        // asks again) or from the program's `empty_cache()`. A flush happens
        // only when the cache cannot serve the request.
        let own_flush = release && new && !a.serves_from_cache(e.size, e.stream);
        if e.action == TraceAction::Oom {
            a.device_mut().refuse_allocations(true);
        } else if own_flush {
            // Asked again after the flush, the device granted what it had refused.
            let asked = self.pending.iter().filter(|j| is_new(j)).map(|&j| trace[j].size).sum();
            let refusal =
                Refusal { index: i, reserved: a.reserved_bytes(), asked, needs_at_most: asked, device_free: None };
            self.f.recorded.refusals.push(refusal);
            a.device_mut().fail_nth_allocation(1);
        } else if release {
            // The releases of `empty_cache()` first, then the request's own segment.
            let split = self.pending.iter().position(is_new).unwrap_or(self.pending.len());
            let rest = self.pending.split_off(split);
            self.empty_cache(a, i);
            self.pending.extend(rest);
        }
        (self.request, self.answer) = (Some(i), None);
    }

    /// After a request: its device calls and its block compared with the recorded ones.
    /// Inlined where the mark is made: most requests make no device call, were recorded
    /// making none, and got the recorded address, and for them the comparison is a few
    /// loads; the rest is a call ([`Self::answered_in_full`]). Both leave the same state.
    /// `addr` and `failed`: the entry's recorded address, and whether it is an OOM, as the
    /// mark carries them (not read again from the trace).
    #[inline(always)]
    fn answered(&mut self, a: &mut CheckAllocator, i: usize, addr: u64, failed: bool) {
        let matched = matches!(self.answer, Some(Ok(ptr)) if ptr == addr);
        if !(matched && !failed && self.pending.is_empty() && a.history_len() == 0) {
            return self.answered_in_full(a, i);
        }
        a.device_mut().refuse_allocations(false);
        if self.told {
            a.device_mut().inner_mut().sim_mut().clear_next_addresses();
            self.told = false;
        }
        (self.request, self.answer) = (None, None);
        self.f.alloc_total += 1;
        self.f.alloc_matched += 1;
    }

    /// [`Self::answered`], for any request.
    #[inline(never)]
    fn answered_in_full(&mut self, a: &mut CheckAllocator, i: usize) {
        let e = &self.trace[i];
        a.device_mut().refuse_allocations(false);
        a.device_mut().inner_mut().sim_mut().clear_next_addresses();
        self.told = false;
        if e.action == TraceAction::Oom {
            if a.release_unmapped_segments().is_err() {
                self.diverge(i, || "releasing the reservation a failed request made failed".into());
            }
            // Reserved after the flush that preceded the failure, as PyTorch reports it.
            let reserved = a.reserved_bytes();
            let (asked, needs_at_most) = self.asked_for(e.size);
            let device_free = e.device_free;
            self.f.recorded.refusals.push(Refusal { index: i, reserved, asked, needs_at_most, device_free });
        }
        let pending = std::mem::take(&mut self.pending);
        self.compare(a, pending, i);
        let answer = self.answer.take();
        self.request = None;
        match (e.action, answer) {
            (TraceAction::Alloc, Some(Ok(ptr))) => {
                self.f.alloc_total += 1;
                if ptr == e.addr {
                    self.f.alloc_matched += 1;
                } else {
                    self.diverge(i, || format!("recorded address {:#x}, headroom chose {ptr:#x}", e.addr));
                }
            }
            (TraceAction::Alloc, failure) => {
                self.f.alloc_total += 1;
                let why = failure.and_then(Result::err).unwrap_or_default();
                self.diverge(i, || format!("the recorded run allocated here; headroom failed: {why}"));
            }
            (_, Some(Ok(ptr))) => {
                self.f.oom_total += 1;
                self.diverge(i, || format!("the recorded run ran out of memory here; headroom served it at {ptr:#x}"));
            }
            (_, _) => {
                self.f.oom_total += 1;
                self.f.oom_matched += 1;
            }
        }
    }
}

impl Observer<ReplayDevice, PyTorchPolicy> for Checker<'_> {
    type Mark = Mark;

    /// Inlined into the walk, where each mark is a constant: a call for each of the three
    /// marks of a request, and the `match` inside it, cost more than what most of them do
    /// (docs/PERFORMANCE.md, "Replay passes, twentieth round").
    #[inline(always)]
    fn mark(&mut self, i: usize, mark: Mark, a: &mut CheckAllocator) -> Result<(), AllocError> {
        match mark {
            Mark::Segment => self.segment(a, i),
            Mark::Request { failed } => self.request(a, i, failed),
            Mark::Answered { addr, failed } => self.answered(a, i, addr, failed),
            // A free after segments were released since the last request: the program's
            // `empty_cache()` released them.
            Mark::Free if !self.pending.is_empty() => self.empty_cache(a, i),
            Mark::UnknownFree => self.unknown_free(i),
            Mark::Completed { stream, at_next_request: false } => {
                a.device_mut().inner_mut().sim_mut().complete_events_on(stream)
            }
            // Completed by the release the next request begins with: the events stay pending,
            // and the recorded segment frees say where.
            Mark::Completed { at_next_request: true, .. } | Mark::Free | Mark::StepBegins | Mark::EmptyCache => {}
        }
        Ok(())
    }

    fn allocated(&mut self, _: usize, _: Slot, b: Allocation, _: &CheckAllocator) {
        self.answer = Some(Ok(b.ptr));
    }

    fn failed(&mut self, _: usize, _: Slot, oom: Oom, _: &CheckAllocator) -> Flow {
        self.answer = Some(Err(oom.to_string().lines().next().unwrap_or_default().to_string()));
        Flow::Continue
    }
}

pub(crate) fn first_line(e: &AllocError) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}
