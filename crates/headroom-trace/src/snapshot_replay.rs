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

use crate::recorded_memory::{RecordedMemory, Refusal};
use crate::replay_device::{DeviceCall, RecordedDevice};
use crate::snapshot::{MemorySnapshot, TraceAction, TraceEvent};
use crate::snapshot_pools::RecordedPools;
use crate::start_state::{infer_start, InconsistentTrace, StartState};
use headroom_alloc::{
    AllocError, AllocatorConfig, Backend, BlockState, DeviceCachingAllocator, DeviceCosts, ExpandableLayout,
    FaultyDevice, LiveBlock, NamedPolicy, Policy, PolicyName, PyTorchPolicy, SimDevice,
};
use rustc_hash::FxHashMap;

/// The device a snapshot replays on: the simulated GPU, following the
/// recorded device's calls, and made to refuse where the recorded device refused.
pub type ReplayDevice = FaultyDevice<RecordedDevice>;

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

/// Why a device's trace cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotReplayError {
    #[error(transparent)]
    Inconsistent(#[from] InconsistentTrace),
    #[error("device {device}: {message}")]
    Unsupported { device: u32, message: String },
    #[error("device {device}: {message}")]
    Capacity { device: u32, message: String },
}

/// Settings headroom does not simulate, said why.
fn unsupported(device: u32, config: &AllocatorConfig) -> Option<SnapshotReplayError> {
    let message = if config.backend == Backend::CudaMallocAsync {
        crate::replay::ASYNC_NOT_SIMULATED.to_string()
    } else {
        return None;
    };
    Some(SnapshotReplayError::Unsupported { device, message })
}

/// Simulated device memory for a check replay without expandable segments:
/// beyond any GPU, so that the device fails only where the trace says it did.
const CHECK_CAPACITY: u64 = 1 << 50;

fn allocator_at<P: Policy>(
    start: &StartState,
    config: AllocatorConfig,
    policy: P,
    capacity: u64,
    device: u32,
    trace: &[TraceEvent],
    script: Option<Vec<DeviceCall>>,
) -> Result<DeviceCachingAllocator<ReplayDevice, P>, SnapshotReplayError> {
    let trace_end = DeviceCall::of_trace(trace).iter().map(|c| c.addr.saturating_add(c.size)).max().unwrap_or(0);
    if start.reserved_bytes() > capacity {
        return Err(SnapshotReplayError::Capacity {
            device,
            message: format!(
                "the trace begins with {} bytes reserved, more than the {capacity} bytes of the simulated device",
                start.reserved_bytes()
            ),
        });
    }
    let sim = SimDevice::new(capacity);
    let dev = match script {
        Some(calls) => RecordedDevice::following(sim, calls),
        None => RecordedDevice::new(sim),
    };
    let mut a = DeviceCachingAllocator::with_policy(FaultyDevice::new(dev), config, policy).with_device_index(device);
    let bad = |m: String| SnapshotReplayError::Unsupported { device, message: m };
    // The device's own addresses stay clear of every one the recording names,
    // which a replay may be told to use later.
    let named = trace_end.max(start.segments.iter().map(|s| s.address + s.size).max().unwrap_or(0));
    a.device_mut().inner_mut().sim_mut().keep_own_addresses_above(named);
    for s in start.segments.iter().filter(|s| !s.expandable) {
        a.device_mut().inner_mut().sim_mut().adopt_segment(s.address, s.size).map_err(|e| bad(e.to_string()))?;
        a.adopt_segment_in_pool(s.address, s.size, s.stream, s.pool, s.pool_id, &s.live)
            .map_err(|e| bad(e.to_string()))?;
    }
    for (layout, live) in expandable_reservations(&a, start) {
        let ExpandableLayout { base, va_size, page, ref runs, .. } = layout;
        a.device_mut()
            .inner_mut()
            .sim_mut()
            .adopt_reservation(base, va_size, page, runs)
            .map_err(|e| bad(e.to_string()))?;
        a.adopt_expandable_segment(&layout, &live).map_err(|e| {
            bad(format!("the expandable segment mapped at {base:#x} when the trace began cannot be rebuilt: {e}"))
        })?;
    }
    Ok(a)
}

/// The expandable segments the trace began with, rebuilt around the runs
/// mapped then, with their live blocks. A snapshot lists runs, not
/// reservations: consecutive runs of one stream and pool go into one
/// reservation starting at the first of them (growth maps a reservation from
/// its base up), of PyTorch's size for this device or, where the next
/// reservation's first run comes sooner, up to it — reservations never
/// overlap.
fn expandable_reservations<P: Policy>(
    a: &DeviceCachingAllocator<ReplayDevice, P>,
    start: &StartState,
) -> Vec<(ExpandableLayout, Vec<LiveBlock>)> {
    let mut out: Vec<(ExpandableLayout, Vec<LiveBlock>)> = Vec::new();
    for s in start.segments.iter().filter(|s| s.expandable) {
        match out.last_mut() {
            Some((l, live))
                if l.stream == s.stream
                    && l.pool == s.pool
                    && l.pool_id == s.pool_id
                    && s.address + s.size <= l.base + l.va_size =>
            {
                l.runs.push((s.address, s.size));
                live.extend(&s.live);
            }
            _ => {
                let (page, va_size) = a.expandable_reservation(s.pool);
                let layout = ExpandableLayout {
                    base: s.address,
                    va_size,
                    page,
                    stream: s.stream,
                    pool: s.pool,
                    pool_id: s.pool_id,
                    runs: vec![(s.address, s.size)],
                };
                out.push((layout, s.live.clone()));
            }
        }
    }
    for k in 1..out.len() {
        let next = out[k].0.base;
        let l = &mut out[k - 1].0;
        if l.base + l.va_size > next {
            l.va_size = (next - l.base) / l.page * l.page;
        }
    }
    out
}

/// Streams that stand for "another stream used this block" in a check: far
/// above any stream a snapshot names (CUDA stream handles are pointers).
const STAND_IN_STREAMS: u64 = 1 << 62;

fn describe(i: usize, e: &TraceEvent) -> String {
    format!("{i}: {} {:#x} {}", e.action.name(), e.addr, e.size)
}

fn context(trace: &[TraceEvent], i: usize) -> Vec<String> {
    let lo = i.saturating_sub(3);
    let hi = (i + 4).min(trace.len());
    (lo..hi).map(|j| describe(j, &trace[j])).collect()
}

fn is_segment_event(a: TraceAction) -> bool {
    matches!(
        a,
        TraceAction::SegmentAlloc | TraceAction::SegmentFree | TraceAction::SegmentMap | TraceAction::SegmentUnmap
    )
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

/// Whether the free requested at entry `i` completes later than it is
/// requested (the block was used on another stream: its memory waits for an
/// event), rather than at once, in the entry that follows.
fn completes_later(trace: &[TraceEvent], i: usize) -> bool {
    !matches!(trace.get(i + 1), Some(n) if n.action == TraceAction::FreeCompleted && n.addr == trace[i].addr)
}

/// Whether the delayed free that completes at entry `i` was completed by the
/// synchronisation a release begins with (PyTorch's
/// `synchronize_and_free_events`, inside the next request, after its cache
/// lookup failed): completions right before segments are released, or
/// before an OOM. Others were found complete when the next request began
/// (`process_events`). Had a block completed there and been able to serve the
/// request, nothing would have been released, so the two readings differ in
/// nothing else.
fn completed_by_a_release(trace: &[TraceEvent], i: usize) -> bool {
    let burst_end = trace[i + 1..].iter().position(|n| n.action != TraceAction::FreeCompleted);
    burst_end.is_some_and(|k| {
        matches!(trace[i + 1 + k].action, TraceAction::SegmentFree | TraceAction::SegmentUnmap | TraceAction::Oom)
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
    check_from(&DeviceTrace { snap, device, start }, config, capacity, progress)
}

/// One device's trace in a snapshot, with the allocator's state when the
/// trace began: inferred once, then checked and replayed under any settings.
pub struct DeviceTrace<'a> {
    pub snap: &'a MemorySnapshot,
    pub device: u32,
    pub start: StartState,
}

impl<'a> DeviceTrace<'a> {
    /// The start state inferred under the snapshot's recorded settings.
    pub fn new(snap: &'a MemorySnapshot, device: u32) -> Result<Self, InconsistentTrace> {
        let start = infer_start(snap, device, &snap.allocator_config().0)?;
        Ok(DeviceTrace { snap, device, start })
    }

    fn trace(&self) -> &'a [TraceEvent] {
        self.snap.device_traces.get(self.device as usize).map_or(&[], Vec::as_slice)
    }
}

/// [`check_device_with`] from a start state already inferred under `config`.
pub fn check_from(
    t: &DeviceTrace,
    config: AllocatorConfig,
    capacity: u64,
    mut progress: impl FnMut(usize),
) -> Result<Fidelity, SnapshotReplayError> {
    let (snap, device, start, trace) = (t.snap, t.device, &t.start, t.trace());
    if let Some(e) = unsupported(device, &config) {
        return Err(e);
    }
    let maps = trace.iter().any(|e| e.action == TraceAction::SegmentMap);
    // What a refused request asked for: a segment of PyTorch's size for it; and
    // the most a device call for it could need — with expandable segments a
    // mapping of it spans whole pages, one more where it starts inside one.
    let asked_for = |rounded: u64| {
        let asked = headroom_alloc::sizing::allocation_size(&config, rounded);
        let page = headroom_alloc::sizing::expandable_page_size(&config, headroom_alloc::sizing::pool_for(rounded));
        (asked, if config.expandable_segments { rounded.next_multiple_of(page) + page } else { asked })
    };
    let capacity = if maps { capacity } else { CHECK_CAPACITY };
    let pools = RecordedPools::of(snap, device);
    let mut a = allocator_at(start, config.clone(), PyTorchPolicy, capacity, device, trace, None)?;
    a.record_device_calls();
    let mut f = Fidelity {
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
    };
    let diverge = |f: &mut Fidelity, i: usize, message: String| {
        if f.first_divergence.is_none() {
            f.first_divergence = Some(Divergence { index: i, message, context: context(trace, i) });
        }
    };
    // Recorded address -> headroom's, for the blocks allocated in the trace where the two
    // differ (after a divergence), so that frees stay paired; empty while decisions match.
    let mut ptrs: FxHashMap<u64, u64> = FxHashMap::default();
    let ours = |ptrs: &mut FxHashMap<u64, u64>, recorded: u64| {
        if ptrs.is_empty() {
            recorded
        } else {
            ptrs.remove(&recorded).unwrap_or(recorded)
        }
    };
    // Segment events recorded since the last request, with their indices.
    let mut pending: Vec<usize> = Vec::new();
    // Frees requested but completed later (the block was used on another
    // stream): recorded address -> the stand-in stream whose event holds it.
    let mut delayed: FxHashMap<u64, u64> = FxHashMap::default();
    let mut next_stand_in = STAND_IN_STREAMS;
    // Where the burst of completions being read ends: the first entry after it.
    let mut burst_until = 0;
    // Extents of the expandable segments' mapped ranges seen so far, low -> high.
    let mut clusters: std::collections::BTreeMap<u64, u64> = Default::default();

    // Compares headroom's segment events since the last call with `pending`.
    let compare = |a: &mut DeviceCachingAllocator<ReplayDevice>,
                   f: &mut Fidelity,
                   pending: &mut Vec<usize>,
                   at: usize| {
        let ours: Vec<(TraceAction, u64, u64)> =
            a.drain_history().filter_map(|e| segment_action(e.action).map(|x| (x, e.addr, e.size))).collect();
        f.segment_total += pending.len();
        let mut first_bad = None;
        for (k, &i) in pending.iter().enumerate() {
            let r = &trace[i];
            match ours.get(k) {
                Some(&(act, addr, size)) if act == r.action && addr == r.addr && size == r.size => {
                    f.segment_matched += 1
                }
                Some(&(act, addr, size)) => {
                    first_bad.get_or_insert((
                        i,
                        format!("recorded {}, headroom {} {addr:#x} {size}", describe(i, r), act.name()),
                    ));
                }
                None => {
                    first_bad
                        .get_or_insert((i, format!("recorded {}, headroom made no such device call", describe(i, r))));
                }
            }
        }
        if first_bad.is_none() && ours.len() > pending.len() {
            let (act, addr, size) = ours[pending.len()];
            first_bad = Some((
                at,
                format!("headroom made a device call the recorded run did not: {} {addr:#x} {size}", act.name()),
            ));
        }
        pending.clear();
        first_bad
    };

    for (i, e) in trace.iter().enumerate() {
        if i % 65536 == 0 {
            progress(i);
        }
        match e.action {
            a_ if is_segment_event(a_) => {
                if e.action == TraceAction::SegmentAlloc {
                    a.device_mut().inner_mut().sim_mut().push_next_address(e.addr);
                }
                // A map that does not touch the ranges mapped so far opens a new
                // expandable segment: its reservation starts there.
                if e.action == TraceAction::SegmentMap {
                    let end = e.addr.saturating_add(e.size);
                    match clusters.range(..=e.addr).next_back().map(|(&lo, &hi)| (lo, hi)) {
                        Some((lo, hi)) if e.addr <= hi => {
                            clusters.insert(lo, hi.max(end));
                        }
                        _ => {
                            if !a.device().inner().sim().is_reserved(e.addr) {
                                a.device_mut().inner_mut().sim_mut().push_next_reservation(e.addr);
                            }
                            clusters.insert(e.addr, end);
                        }
                    }
                }
                pending.push(i);
            }
            TraceAction::Alloc | TraceAction::Oom => {
                let new = pending
                    .iter()
                    .any(|&j| matches!(trace[j].action, TraceAction::SegmentAlloc | TraceAction::SegmentMap));
                let release = pending
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
                    let asked = pending
                        .iter()
                        .filter(|&&j| matches!(trace[j].action, TraceAction::SegmentAlloc | TraceAction::SegmentMap))
                        .map(|&j| trace[j].size)
                        .sum();
                    let refusal = Refusal {
                        index: i,
                        reserved: a.reserved_bytes(),
                        asked,
                        needs_at_most: asked,
                        device_free: None,
                    };
                    f.recorded.refusals.push(refusal);
                    a.device_mut().fail_nth_allocation(1);
                } else if release {
                    // The releases of `empty_cache()` first, then the request's own segment.
                    let split = pending
                        .iter()
                        .position(|&j| matches!(trace[j].action, TraceAction::SegmentAlloc | TraceAction::SegmentMap))
                        .unwrap_or(pending.len());
                    let mut released: Vec<usize> = pending.drain(..split).collect();
                    f.recorded.empty_cache_calls.extend(released.first());
                    pools.release_freed(&mut a, trace, released.iter().copied());
                    if a.empty_cache().is_err() {
                        diverge(&mut f, i, "empty_cache failed".into());
                    }
                    if let Some((j, m)) = compare(&mut a, &mut f, &mut released, i) {
                        diverge(&mut f, j, m);
                    }
                }
                let r = a.malloc_in_pool(e.size, e.stream, pools.pool_of(e));
                a.device_mut().refuse_allocations(false);
                a.device_mut().inner_mut().sim_mut().clear_next_addresses();
                if e.action == TraceAction::Oom && a.release_unmapped_segments().is_err() {
                    diverge(&mut f, i, "releasing the reservation a failed request made failed".into());
                }
                if e.action == TraceAction::Oom {
                    // Reserved after the flush that preceded the failure, as PyTorch reports it.
                    let reserved = a.reserved_bytes();
                    let (asked, needs_at_most) = asked_for(e.size);
                    let device_free = e.device_free;
                    f.recorded.refusals.push(Refusal { index: i, reserved, asked, needs_at_most, device_free });
                }
                if let Some((j, m)) = compare(&mut a, &mut f, &mut pending, i) {
                    diverge(&mut f, j, m);
                }
                match (e.action, r) {
                    (TraceAction::Alloc, Ok(b)) => {
                        f.alloc_total += 1;
                        if b.ptr == e.addr {
                            f.alloc_matched += 1;
                        } else {
                            diverge(&mut f, i, format!("recorded address {:#x}, headroom chose {:#x}", e.addr, b.ptr));
                        }
                        if b.ptr != e.addr {
                            ptrs.insert(e.addr, b.ptr);
                        } else if !ptrs.is_empty() {
                            ptrs.remove(&e.addr);
                        }
                    }
                    (TraceAction::Alloc, Err(err)) => {
                        f.alloc_total += 1;
                        diverge(
                            &mut f,
                            i,
                            format!("the recorded run allocated here; headroom failed: {}", first_line(&err)),
                        );
                    }
                    (_, Err(_)) => {
                        f.oom_total += 1;
                        f.oom_matched += 1;
                    }
                    (_, Ok(b)) => {
                        f.oom_total += 1;
                        diverge(
                            &mut f,
                            i,
                            format!("the recorded run ran out of memory here; headroom served it at {:#x}", b.ptr),
                        );
                        let _ = a.free(b.ptr);
                    }
                }
            }
            // A free whose completion comes later: the block waits on an event,
            // as it did in the recorded run, on a stream of its own, so it
            // becomes reusable exactly when the trace says.
            TraceAction::FreeRequested if completes_later(trace, i) => {
                let ptr = ours(&mut ptrs, e.addr);
                let stream = next_stand_in;
                next_stand_in += 1;
                let freed = a.record_stream(ptr, stream).and_then(|()| a.free(ptr));
                if let Err(err) = freed {
                    diverge(&mut f, i, format!("free of {:#x}: {err}", e.addr));
                }
                delayed.insert(e.addr, stream);
                a.drain_history().for_each(drop);
            }
            TraceAction::FreeCompleted if delayed.contains_key(&e.addr) => {
                let stream = delayed.remove(&e.addr).expect("checked");
                // Completions right before segments are released, or before an
                // OOM, come from the synchronisation that releasing begins with
                // (PyTorch's synchronize_and_free_events): the events stay
                // pending until then. Others were found complete when the next
                // request began (process_events). Had a block completed there
                // and been able to serve the request, nothing would have been
                // released, so the two readings differ in nothing else.
                // Found once per burst: a burst of n completions is then read once, not n times.
                if burst_until <= i {
                    burst_until =
                        i + 1 + trace[i + 1..].iter().take_while(|n| n.action == TraceAction::FreeCompleted).count();
                }
                let releases_next = trace.get(burst_until).is_some_and(|n| {
                    matches!(n.action, TraceAction::SegmentFree | TraceAction::SegmentUnmap | TraceAction::Oom)
                });
                if !releases_next {
                    a.device_mut().inner_mut().sim_mut().complete_events_on(stream);
                }
            }
            TraceAction::FreeCompleted | TraceAction::Free => {
                if !pending.is_empty() {
                    f.recorded.empty_cache_calls.push(pending[0]);
                    pools.release_freed(&mut a, trace, pending.iter().copied());
                    if a.empty_cache().is_err() {
                        diverge(&mut f, i, "empty_cache failed".into());
                    }
                    if let Some((j, m)) = compare(&mut a, &mut f, &mut pending, i) {
                        diverge(&mut f, j, m);
                    }
                }
                let ptr = ours(&mut ptrs, e.addr);
                if let Err(err) = a.free(ptr) {
                    diverge(&mut f, i, format!("free of {:#x}: {err}", e.addr));
                }
                a.drain_history().for_each(drop);
            }
            _ => {}
        }
    }
    if !pending.is_empty() {
        f.recorded.empty_cache_calls.push(pending[0]);
        let at = trace.len().saturating_sub(1);
        pools.release_freed(&mut a, trace, pending.iter().copied());
        if a.empty_cache().is_err() {
            diverge(&mut f, at, "empty_cache failed".into());
        }
        if let Some((j, m)) = compare(&mut a, &mut f, &mut pending, at) {
            diverge(&mut f, j, m);
        }
    }
    progress(trace.len());
    f.recorded.memory_limit = RecordedMemory::infer(t, &f.recorded.refusals).replayed_limit();

    // The final layout.
    let mut ours: Vec<(u64, u64, bool)> = a
        .snapshot()
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter().map(|b| (b.address, b.size, b.state == BlockState::Inactive)))
        .collect();
    ours.sort_unstable();
    for s in snap.segments.iter().filter(|s| s.device == device) {
        for b in &s.blocks {
            f.final_blocks_total += 1;
            let key = (b.address, b.size, b.state == BlockState::Inactive);
            if ours.binary_search(&key).is_ok() {
                f.final_blocks_matched += 1;
            } else if f.first_divergence.is_none() {
                f.first_divergence = Some(Divergence {
                    index: trace.len(),
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
            index: trace.len(),
            message: format!("headroom ends with {} blocks, the snapshot with {}", ours.len(), f.final_blocks_total),
            context: Vec::new(),
        });
    }
    Ok(f)
}

fn first_line(e: &AllocError) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

/// Where a what-if replay ran out of memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WhatIfOom {
    /// Index of the entry in the device's trace.
    pub index: usize,
    pub size: u64,
    pub message: String,
}

/// One device's trace under other settings.
#[derive(Clone, Debug, PartialEq)]
pub struct WhatIf {
    pub device: u32,
    pub operations: usize,
    /// Bytes reserved and allocated when the trace began: as recorded, or as
    /// the allocator placed the live blocks ([`StartFrom::Fresh`]).
    pub start_reserved_bytes: u64,
    pub start_allocated_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Reserved minus allocated when reserved peaked: memory held but not used.
    pub fragmentation_at_peak_bytes: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    pub ooms: Vec<WhatIfOom>,
    /// Requests the recorded run could not serve (`oom` entries) that this one did.
    pub recorded_ooms_served: usize,
    /// The recorded device calls this replay made, in order, before its
    /// first own one: all of them when it is the recorded run.
    pub device_calls_followed: usize,
    /// Device calls (allocations and mappings, frees and unmappings) in each
    /// step of the trace ([`crate::recorded_step::step_starts`]; one entry for a trace that is
    /// one step).
    pub calls_by_step: Vec<u64>,
    /// What those calls take on a GPU ([`DeviceCosts::PUBLISHED`]), per step, in nanoseconds.
    pub device_ns_by_step: Vec<u64>,
    /// Pages mapped and unmapped, over the run.
    pub pages_mapped: u64,
    pub pages_unmapped: u64,
    /// `torch.cuda.memory_stats()` at the end.
    pub stats: std::collections::BTreeMap<String, i64>,
    /// The replayed run as a snapshot, when history was asked for.
    pub snapshot: Option<headroom_alloc::Snapshot>,
    /// Trace entries the snapshot's history let go of.
    pub history_dropped: u64,
}

/// Where a what-if replay begins.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StartFrom {
    /// In the segments the trace began with, as recorded: they exist
    /// already, whatever the settings or the policy.
    #[default]
    Recorded,
    /// From an empty device: the blocks live when the trace began are
    /// allocated first, in address order, by the allocator under test. This
    /// is how policies are compared: each places every block itself.
    Fresh,
}

impl StartFrom {
    pub fn name(self) -> &'static str {
        match self {
            StartFrom::Recorded => "recorded",
            StartFrom::Fresh => "fresh",
        }
    }
}

/// What a what-if replay runs: the settings, the policy and where it starts.
#[derive(Clone, Debug)]
pub struct Setup {
    pub config: AllocatorConfig,
    pub policy: PolicyName,
    pub start: StartFrom,
}

impl Setup {
    /// PyTorch's policy under `config`, from the recorded segments.
    pub fn recorded(config: AllocatorConfig) -> Self {
        Setup { config, policy: PolicyName::PyTorch, start: StartFrom::Recorded }
    }
}

/// Replays `device`'s requests and frees under `config` on a device of
/// `capacity` bytes, with what [`check_device`] found the program did
/// besides ([`Recorded`]: its `empty_cache()` calls, the device's refusals,
/// its memory limit). The state when the trace began is kept as recorded
/// (those segments exist already, whatever the settings). With `history`,
/// the result carries the replayed run as a snapshot keeping that many trace
/// entries.
pub fn what_if_device(
    t: &DeviceTrace,
    config: AllocatorConfig,
    capacity: u64,
    recorded: &Recorded,
    history: Option<usize>,
    progress: impl FnMut(usize),
) -> Result<WhatIf, SnapshotReplayError> {
    what_if(t, Setup::recorded(config), capacity, recorded, history, progress)
}

/// [`what_if_device`] under any policy, from the recorded segments or from
/// an empty device.
pub fn what_if(
    t: &DeviceTrace,
    setup: Setup,
    capacity: u64,
    recorded: &Recorded,
    history: Option<usize>,
    progress: impl FnMut(usize),
) -> Result<WhatIf, SnapshotReplayError> {
    let (mut a, mut w) =
        replay_prefix(t, setup, capacity, recorded, history, usize::MAX, Hooks { progress, on_alloc: |_, _| {} })?;
    let s = a.stats();
    w.peak_allocated_bytes = s.allocated_bytes[0].peak as u64;
    w.peak_reserved_bytes = w.peak_reserved_bytes.max(s.reserved_bytes[0].peak as u64);
    w.num_device_alloc = s.num_device_alloc as u64;
    w.num_device_free = s.num_device_free as u64;
    w.device_calls_followed = a.device().inner().calls_followed();
    w.stats = a.memory_stats();
    if history.is_some() {
        w.snapshot = Some(a.snapshot());
        w.history_dropped = a.history_dropped();
    }
    Ok(w)
}

/// The most bytes the program held at once: every live request rounded as
/// `config` rounds it (`round_size`), over the trace from the blocks live
/// when it began. No allocator can reserve less; a policy's peak reserved
/// is measured against it.
pub fn live_peak_bytes(t: &DeviceTrace, config: &AllocatorConfig) -> u64 {
    let round = |size: u64| headroom_alloc::sizing::round_size(config, size);
    let mut live: FxHashMap<u64, u64> = FxHashMap::default();
    for b in t.start.segments.iter().flat_map(|s| &s.live) {
        live.insert(b.address, round(b.requested_size.max(1)));
    }
    let mut now: u64 = live.values().sum();
    let mut peak = now;
    for e in t.trace() {
        match e.action {
            TraceAction::Alloc => {
                let size = round(e.size);
                now += size;
                if let Some(old) = live.insert(e.addr, size) {
                    now -= old;
                }
                peak = peak.max(now);
            }
            TraceAction::FreeCompleted | TraceAction::Free => {
                if let Some(size) = live.remove(&e.addr) {
                    now -= size;
                }
            }
            _ => {}
        }
    }
    peak
}

/// The allocator's segments and blocks just before entry `index` of the
/// device's trace (after the whole trace for an index past its end), replayed
/// as [`what_if_device`] replays: what `torch.cuda.memory._snapshot()` would
/// have shown at that moment.
pub fn state_before(
    t: &DeviceTrace,
    config: AllocatorConfig,
    capacity: u64,
    recorded: &Recorded,
    index: usize,
) -> Result<headroom_alloc::Snapshot, SnapshotReplayError> {
    let (mut a, _) = replay_prefix(
        t,
        Setup::recorded(config),
        capacity,
        recorded,
        None,
        index,
        Hooks { progress: |_| {}, on_alloc: |_, _| {} },
    )?;
    Ok(a.snapshot())
}

/// The block each `alloc` entry was handed in the replay, by entry index:
/// the request rounded, or more where the allocator left a remainder unsplit
/// (at most 1 MiB in the large pool, or an oversize block). Only blocks that
/// differ from `round_size(request)` are listed.
pub fn block_sizes(
    t: &DeviceTrace,
    config: AllocatorConfig,
    capacity: u64,
    recorded: &Recorded,
) -> Result<FxHashMap<usize, u64>, SnapshotReplayError> {
    let trace = t.trace();
    let round = config.clone();
    let mut out = FxHashMap::default();
    let on_alloc = |i: usize, size: u64| {
        if size != headroom_alloc::sizing::round_size(&round, trace[i].size) {
            out.insert(i, size);
        }
    };
    let setup = Setup::recorded(config);
    replay_prefix(t, setup, capacity, recorded, None, usize::MAX, Hooks { progress: |_| {}, on_alloc })?;
    Ok(out)
}

/// Replays the first `until` entries of the trace.
/// What a replay reports as it goes: entries done, and each block handed out (entry, size).
struct Hooks<P, A> {
    progress: P,
    on_alloc: A,
}

fn replay_prefix(
    t: &DeviceTrace,
    setup: Setup,
    capacity: u64,
    recorded: &Recorded,
    history: Option<usize>,
    until: usize,
    hooks: Hooks<impl FnMut(usize), impl FnMut(usize, u64)>,
) -> Result<(DeviceCachingAllocator<ReplayDevice, NamedPolicy>, WhatIf), SnapshotReplayError> {
    let Hooks { mut progress, mut on_alloc } = hooks;
    let (device, start, trace) = (t.device, &t.start, t.trace());
    let trace = &trace[..until.min(trace.len())];
    let Setup { config, policy, start: start_from } = setup;
    let mut ptrs: FxHashMap<u64, u64> = FxHashMap::default();
    let pools = RecordedPools::of(t.snap, device);
    let mut a = match start_from {
        StartFrom::Recorded => {
            if let Some(e) = unsupported(device, &config) {
                return Err(e);
            }
            let script = DeviceCall::of_trace(t.trace());
            allocator_at(start, config, policy.build(), capacity, device, t.trace(), Some(script))?
        }
        StartFrom::Fresh => {
            if config.backend == Backend::CudaMallocAsync {
                return Err(SnapshotReplayError::Unsupported {
                    device,
                    message: crate::replay::ASYNC_NOT_SIMULATED.to_string(),
                });
            }
            let empty = StartState::default();
            let mut a = allocator_at(&empty, config, policy.build(), capacity, device, &[], None)?;
            let mut blocks: Vec<_> =
                start.segments.iter().flat_map(|s| s.live.iter().map(|b| (b, s.stream, s.pool_id))).collect();
            blocks.sort_unstable_by_key(|(b, _, _)| b.address);
            for (b, stream, pool) in blocks {
                let got = a.malloc_in_pool(b.requested_size.max(1), stream, pool).map_err(|e| {
                    SnapshotReplayError::Capacity {
                        device,
                        message: format!(
                            "the blocks live when the trace began do not fit on the simulated device: {}",
                            first_line(&e)
                        ),
                    }
                })?;
                ptrs.insert(b.address, got.ptr);
            }
            a
        }
    };
    a.record_history(history);
    if let Some(limit) = recorded.memory_limit {
        // The program's limit, and a fraction the settings ask for if it is lower.
        let lower = a.memory_limit().map_or(limit, |l| l.min(limit));
        a.set_memory_limit(Some(lower));
    }
    let mut next_call = recorded.empty_cache_calls.iter().peekable();
    let mut refusals = recorded.refusals.iter().map(|r| r.index).peekable();
    // Whether the device refused entry `i` in the recorded run, while this
    // replay is still the recorded run: it then refuses too.
    let mut refused_here = |a: &DeviceCachingAllocator<ReplayDevice, NamedPolicy>, i: usize| {
        while refusals.next_if(|&r| r < i).is_some() {}
        refusals.next_if_eq(&i).is_some() && a.device().inner().is_following()
    };
    let mut failed: rustc_hash::FxHashSet<u64> = Default::default();
    // Frees that complete later than requested, as in the check: recorded
    // address -> the stand-in stream whose event holds the block; and those
    // whose completion the next request's release brings, completed after it.
    let mut delayed: FxHashMap<u64, u64> = FxHashMap::default();
    let mut at_next_request: Vec<u64> = Vec::new();
    let mut next_stand_in = STAND_IN_STREAMS;
    let mut w = WhatIf {
        device,
        operations: trace.len(),
        start_reserved_bytes: a.reserved_bytes(),
        start_allocated_bytes: a.stats().allocated_bytes[0].current as u64,
        peak_allocated_bytes: 0,
        peak_reserved_bytes: 0,
        fragmentation_at_peak_bytes: 0,
        num_device_alloc: 0,
        num_device_free: 0,
        ooms: Vec::new(),
        recorded_ooms_served: 0,
        device_calls_followed: 0,
        calls_by_step: Vec::new(),
        device_ns_by_step: Vec::new(),
        pages_mapped: 0,
        pages_unmapped: 0,
        stats: Default::default(),
        snapshot: None,
        history_dropped: 0,
    };
    let note_peak = |a: &DeviceCachingAllocator<ReplayDevice, NamedPolicy>, w: &mut WhatIf| {
        let reserved = a.reserved_bytes();
        if reserved > w.peak_reserved_bytes {
            w.peak_reserved_bytes = reserved;
            w.fragmentation_at_peak_bytes = reserved - a.stats().allocated_bytes[0].current as u64;
        }
    };
    note_peak(&a, &mut w);
    // Where steps begin, and the device calls and time when the current one began.
    let mut step_starts = crate::recorded_step::step_starts(t.snap, t.device).into_iter().peekable();
    let tally = |a: &DeviceCachingAllocator<ReplayDevice, NamedPolicy>| {
        let s = a.stats();
        let calls = (s.num_device_alloc + s.num_device_free) as u64;
        (calls, DeviceCosts::PUBLISHED.time_ns(&a.device().inner().calls()))
    };
    // From nothing: with a fresh start, placing the blocks live when the trace began is the first step's.
    let mut step_began = (0, 0);
    let mut end_step = |a: &DeviceCachingAllocator<ReplayDevice, NamedPolicy>, w: &mut WhatIf| {
        let now = tally(a);
        w.calls_by_step.push(now.0 - step_began.0);
        w.device_ns_by_step.push(now.1 - step_began.1);
        step_began = now;
    };
    // Completions a release brought in the recorded run are done once the
    // next request has run, whether or not this run released anything.
    let complete = |a: &mut DeviceCachingAllocator<ReplayDevice, NamedPolicy>, streams: &mut Vec<u64>| {
        for s in streams.drain(..) {
            a.device_mut().inner_mut().sim_mut().complete_events_on(s);
        }
    };
    for (i, e) in trace.iter().enumerate() {
        if i % 65536 == 0 {
            progress(i);
        }
        if step_starts.next_if_eq(&i).is_some() {
            end_step(&a, &mut w);
        }
        if next_call.peek().is_some_and(|&&c| c == i) {
            next_call.next();
            pools.release_freed(&mut a, trace, RecordedPools::burst(trace, i));
            let _ = a.empty_cache();
        }
        match e.action {
            TraceAction::Alloc => {
                let refused = refused_here(&a, i);
                if refused {
                    // The allocator releases its cache and asks again, as the recorded one did.
                    a.device_mut().fail_nth_allocation(1);
                }
                let r = a.malloc_in_pool(e.size, e.stream, pools.pool_of(e));
                if refused {
                    a.device_mut().cancel_failure();
                }
                complete(&mut a, &mut at_next_request);
                match r {
                    Ok(b) => {
                        on_alloc(i, b.size);
                        ptrs.insert(e.addr, b.ptr);
                        failed.remove(&e.addr);
                        note_peak(&a, &mut w);
                    }
                    Err(err) => {
                        failed.insert(e.addr);
                        w.ooms.push(WhatIfOom { index: i, size: e.size, message: err.to_string() });
                    }
                }
            }
            TraceAction::Oom => {
                let refused = refused_here(&a, i);
                a.device_mut().refuse_allocations(refused);
                a.device_mut().inner_mut().replaying_a_failure(refused);
                let r = a.malloc_in_pool(e.size, e.stream, pools.pool_of(e));
                a.device_mut().refuse_allocations(false);
                a.device_mut().inner_mut().replaying_a_failure(false);
                if refused {
                    // As the check does: the reservation a failed request made is given back.
                    let _ = a.release_unmapped_segments();
                }
                complete(&mut a, &mut at_next_request);
                if let Ok(b) = r {
                    note_peak(&a, &mut w);
                    w.recorded_ooms_served += 1;
                    let _ = a.free(b.ptr);
                }
            }
            // The block waits for an event on a stream of its own, which
            // completes where the recording says its free did.
            TraceAction::FreeRequested if completes_later(trace, i) && !failed.contains(&e.addr) => {
                let ptr = ptrs.remove(&e.addr).unwrap_or(e.addr);
                let stream = next_stand_in;
                next_stand_in += 1;
                if a.record_stream(ptr, stream).and_then(|()| a.free(ptr)).is_ok() {
                    delayed.insert(e.addr, stream);
                }
            }
            TraceAction::FreeCompleted if delayed.contains_key(&e.addr) => {
                let stream = delayed.remove(&e.addr).expect("checked");
                if completed_by_a_release(trace, i) {
                    at_next_request.push(stream);
                } else {
                    a.device_mut().inner_mut().sim_mut().complete_events_on(stream);
                }
            }
            TraceAction::FreeCompleted | TraceAction::Free => {
                if failed.remove(&e.addr) {
                    continue;
                }
                let ptr = ptrs.remove(&e.addr).unwrap_or(e.addr);
                // A free the recorded run made of a block this one never held
                // cannot happen with a consistent start state; skip it if it does.
                let _ = a.free(ptr);
            }
            _ => {}
        }
    }
    end_step(&a, &mut w);
    let calls = a.device().inner().calls();
    (w.pages_mapped, w.pages_unmapped) = (calls.pages_mapped, calls.pages_unmapped);
    progress(trace.len());
    Ok((a, w))
}
