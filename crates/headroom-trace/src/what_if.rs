//! A snapshot's requests and frees under any settings, policy and device size,
//! with headroom deciding everything: peaks, fragmentation, device calls, and
//! where it runs out of memory ([`crate::snapshot_replay`] says what a what-if
//! repeats of the recorded run, and why it is the recorded run under the
//! recorded settings).
//!
//! The replay is a [`Walk`]: each recorded allocation is a slot, named by its
//! address until it is freed. What the recorded run did besides its requests
//! and frees travels between them as marks: where a step begins, where the
//! program called `empty_cache()`, where the recorded device refused, and when
//! a free that waited on another stream completed.

use crate::device_trace::DeviceTrace;
use crate::snapshot::{TraceAction, TraceEvent};
use crate::snapshot_pools::RecordedPools;
use crate::snapshot_replay::{first_line, Recorded, ReplayDevice, SnapshotReplayError};
use crate::start_allocator::{allocator_at, unsupported};
use crate::start_state::StartState;
use crate::trace_requests::{Mark, TraceRequests};
use crate::walk::{Flow, Observer, Slot, Walk};
use headroom_alloc::{
    AllocError, Allocation, AllocatorConfig, Backend, DeviceCachingAllocator, DeviceCosts, NamedPolicy, Oom, PolicyName,
};
use rustc_hash::FxHashMap;

/// Where a what-if replay ran out of memory: the index of the entry in the
/// device's trace, and the failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WhatIfOom {
    pub index: usize,
    pub oom: Oom,
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
    /// Reserved minus allocated when reserved peaked: memory held but not used. (Inspect's
    /// `fragmentation_at_peak_bytes` is the same difference at the allocated peak.)
    pub unallocated_at_reserved_peak_bytes: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    pub ooms: Vec<WhatIfOom>,
    /// Requests the recorded run could not serve (`oom` entries) that this one did.
    pub recorded_ooms_served: usize,
    /// The recorded device calls this replay made, in order, before its
    /// first own one: all of them when it is the recorded run.
    pub device_calls_followed: usize,
    /// Device calls (allocations and mappings, frees and unmappings) in each
    /// step of the trace ([`crate::steps`]; one entry for a trace that is
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
    w.peak_allocated_bytes = s.allocated_bytes.all().peak as u64;
    w.peak_reserved_bytes = w.peak_reserved_bytes.max(s.reserved_bytes.all().peak as u64);
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

/// What a replay reports as it goes: entries done, and each block handed out (entry, size).
struct Hooks<P, A> {
    progress: P,
    on_alloc: A,
}

/// Replays the first `until` entries of the trace.
fn replay_prefix(
    t: &DeviceTrace,
    setup: Setup,
    capacity: u64,
    recorded: &Recorded,
    history: Option<usize>,
    until: usize,
    hooks: Hooks<impl FnMut(usize), impl FnMut(usize, u64)>,
) -> Result<(DeviceCachingAllocator<ReplayDevice, NamedPolicy>, WhatIf), SnapshotReplayError> {
    let Hooks { progress, on_alloc } = hooks;
    let (device, trace) = (t.device, t.trace());
    let trace = &trace[..until.min(trace.len())];
    let Setup { config, policy, start: start_from } = setup;
    let (mut a, start) = start(t, config, policy, capacity, start_from)?;
    a.record_history(history);
    if let Some(limit) = recorded.memory_limit {
        // The program's limit, and a fraction the settings ask for if it is lower.
        let lower = a.memory_limit().map_or(limit, |l| l.min(limit));
        a.set_memory_limit(Some(lower));
    }
    let pools = t.pools();
    let mut walk = Walk::default();
    let mut ops = TraceRequests::new(
        trace,
        t.index(),
        pools,
        t.index().step_starts().to_vec(),
        recorded.empty_cache_calls.clone(),
        progress,
    )
    .uncompared();
    for (address, block) in start {
        walk.adopt(ops.adopt(address), block, &a);
    }
    // The walk holds every block's id from here: the allocator's map of addresses would be
    // a second map of the same allocations.
    a.keep_pointer_map(false);
    let mut w = WhatIf {
        device,
        operations: trace.len(),
        start_reserved_bytes: a.reserved_bytes(),
        start_allocated_bytes: a.stats().allocated_bytes.all().current as u64,
        peak_allocated_bytes: 0,
        peak_reserved_bytes: 0,
        unallocated_at_reserved_peak_bytes: 0,
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
    note_peak(&a, &mut w);
    let mut watch = Watch {
        trace,
        pools,
        refusals: recorded.refusals.iter().map(|r| r.index).collect(),
        next_refusal: 0,
        request: None,
        at_next_request: Vec::new(),
        // From nothing: with a fresh start, placing the blocks live when the trace began is the first step's.
        step_began: (0, 0),
        on_alloc,
        w,
    };
    ops.walk(&mut walk, &mut a, &mut watch)
        .map_err(|e| SnapshotReplayError::Unsupported { device, message: format!("entry {}: {e}", e.at()) })?;
    a.keep_pointer_map(true);
    watch.end_step(&a);
    let mut w = watch.w;
    let calls = a.device().inner().calls();
    (w.pages_mapped, w.pages_unmapped) = (calls.pages_mapped, calls.pages_unmapped);
    (ops.progress)(trace.len());
    Ok((a, w))
}

/// The allocator a what-if replays through.
type WhatIfAllocator = DeviceCachingAllocator<ReplayDevice, NamedPolicy>;

/// The allocator as the trace began, and the blocks live then (recorded address, block).
fn start(
    t: &DeviceTrace,
    config: AllocatorConfig,
    policy: PolicyName,
    capacity: u64,
    from: StartFrom,
) -> Result<(WhatIfAllocator, Vec<(u64, Allocation)>), SnapshotReplayError> {
    let (device, start) = (t.device, &t.start);
    let mut live: Vec<_> =
        start.segments.iter().flat_map(|s| s.live.iter().map(move |b| (b, s.stream, s.pool_id))).collect();
    live.sort_unstable_by_key(|(b, _, _)| b.address);
    match from {
        StartFrom::Recorded => {
            if let Some(e) = unsupported(device, &config) {
                return Err(e);
            }
            let (index, trace) = (t.index(), t.trace());
            let script = index.device_calls(trace);
            let a =
                allocator_at(start, config, policy.build(), capacity, device, index.calls_end(trace), Some(script))?;
            let blocks = live
                .iter()
                .map(|(b, _, _)| {
                    (b.address, Allocation { ptr: b.address, size: a.allocation_size(b.address).unwrap_or(0) })
                })
                .collect();
            Ok((a, blocks))
        }
        StartFrom::Fresh => {
            if config.backend == Backend::CudaMallocAsync {
                return Err(SnapshotReplayError::Unsupported {
                    device,
                    message: crate::replay::ASYNC_NOT_SIMULATED.to_string(),
                });
            }
            let mut a = allocator_at(&StartState::default(), config, policy.build(), capacity, device, 0, None)?;
            let mut blocks = Vec::with_capacity(live.len());
            for (b, stream, pool) in live {
                let got = a.malloc_in_pool(b.requested_size.max(1), stream, pool).map_err(|e| {
                    SnapshotReplayError::Capacity {
                        device,
                        message: format!(
                            "the blocks live when the trace began do not fit on the simulated device: {}",
                            first_line(&e)
                        ),
                    }
                })?;
                blocks.push((b.address, got));
            }
            Ok((a, blocks))
        }
    }
}

fn note_peak(a: &DeviceCachingAllocator<ReplayDevice, NamedPolicy>, w: &mut WhatIf) {
    let reserved = a.reserved_bytes();
    if reserved > w.peak_reserved_bytes {
        w.peak_reserved_bytes = reserved;
        w.unallocated_at_reserved_peak_bytes = reserved - a.stats().allocated_bytes.all().current as u64;
    }
}

/// What a what-if replay watches, and how it stands in for the recorded device.
struct Watch<'a, A> {
    trace: &'a [TraceEvent],
    pools: &'a RecordedPools,
    /// Entries the recorded device refused, in order.
    refusals: Vec<usize>,
    next_refusal: usize,
    /// The request being answered: whether the recorded run failed it, and
    /// whether the device is refusing it as the recorded one did.
    request: Option<(bool, bool)>,
    /// Completions a release brought in the recorded run: done once the next
    /// request has run, whether or not this run released anything.
    at_next_request: Vec<u64>,
    /// Device calls and their time when the current step began.
    step_began: (u64, u64),
    on_alloc: A,
    w: WhatIf,
}

impl<A: FnMut(usize, u64)> Watch<'_, A> {
    /// Whether the device refused entry `i` in the recorded run, while this
    /// replay is still the recorded run: it then refuses too.
    fn refused_here(&mut self, a: &DeviceCachingAllocator<ReplayDevice, NamedPolicy>, i: usize) -> bool {
        while self.refusals.get(self.next_refusal).is_some_and(|&r| r < i) {
            self.next_refusal += 1;
        }
        let here = self.refusals.get(self.next_refusal) == Some(&i);
        if here {
            self.next_refusal += 1;
        }
        here && a.device().inner().is_following()
    }

    fn end_step(&mut self, a: &DeviceCachingAllocator<ReplayDevice, NamedPolicy>) {
        let s = a.stats();
        let now = (
            (s.num_device_alloc + s.num_device_free) as u64,
            DeviceCosts::PUBLISHED.time_ns(&a.device().inner().calls()),
        );
        self.w.calls_by_step.push(now.0 - self.step_began.0);
        self.w.device_ns_by_step.push(now.1 - self.step_began.1);
        self.step_began = now;
    }
}

impl<A: FnMut(usize, u64)> Observer<ReplayDevice, NamedPolicy> for Watch<'_, A> {
    type Mark = Mark;

    /// Inlined into the walk, where each mark is a constant. Most requests were served in
    /// the recorded run with no refusal there, and their two marks are a store each here;
    /// as a call each, with the whole `match` inside, they cost more than the rest of the
    /// observer (docs/PERFORMANCE.md, "Replay passes, twentieth round"). The rest is
    /// [`Watch::mark_in_full`], which leaves the same state for those two.
    #[inline(always)]
    fn mark(
        &mut self,
        i: usize,
        mark: Mark,
        a: &mut DeviceCachingAllocator<ReplayDevice, NamedPolicy>,
    ) -> Result<(), AllocError> {
        match mark {
            // `refused_here` would find no refusal at `i` and move past none.
            Mark::Request { failed: false } if self.refusals.get(self.next_refusal).is_none_or(|&r| r > i) => {
                self.request = Some((false, false));
            }
            Mark::Answered { .. } if self.request == Some((false, false)) && self.at_next_request.is_empty() => {
                self.request = None;
            }
            // What the check compares; a what-if decides for itself (and is not given them).
            Mark::Segment | Mark::Free | Mark::UnknownFree => {}
            _ => self.mark_in_full(i, mark, a),
        }
        Ok(())
    }

    fn allocated(&mut self, i: usize, _: Slot, b: Allocation, a: &DeviceCachingAllocator<ReplayDevice, NamedPolicy>) {
        note_peak(a, &mut self.w);
        match self.request {
            Some((true, _)) => self.w.recorded_ooms_served += 1,
            _ => (self.on_alloc)(i, b.size),
        }
    }

    fn failed(&mut self, i: usize, _: Slot, oom: Oom, _: &DeviceCachingAllocator<ReplayDevice, NamedPolicy>) -> Flow {
        if let Some((false, _)) = self.request {
            self.w.ooms.push(WhatIfOom { index: i, oom });
        }
        Flow::Continue
    }
}

impl<A: FnMut(usize, u64)> Watch<'_, A> {
    /// Any mark: [`Observer::mark`]'s every case.
    #[inline(never)]
    fn mark_in_full(&mut self, i: usize, mark: Mark, a: &mut DeviceCachingAllocator<ReplayDevice, NamedPolicy>) {
        match mark {
            Mark::StepBegins => self.end_step(a),
            Mark::EmptyCache => self.pools.release_freed(a, self.trace, RecordedPools::burst(self.trace, i)),
            Mark::Request { failed } => {
                let refused = self.refused_here(a, i);
                if failed {
                    a.device_mut().refuse_allocations(refused);
                    a.device_mut().inner_mut().replaying_a_failure(refused);
                } else if refused {
                    // The allocator releases its cache and asks again, as the recorded one did.
                    a.device_mut().fail_nth_allocation(1);
                }
                self.request = Some((failed, refused));
            }
            Mark::Answered { .. } => {
                match self.request.take() {
                    Some((true, refused)) => {
                        a.device_mut().refuse_allocations(false);
                        a.device_mut().inner_mut().replaying_a_failure(false);
                        if refused {
                            // As the check does: the reservation a failed request made is given back.
                            let _ = a.release_unmapped_segments();
                        }
                    }
                    Some((false, true)) => a.device_mut().cancel_failure(),
                    _ => {}
                }
                for s in self.at_next_request.drain(..) {
                    a.device_mut().inner_mut().sim_mut().complete_events_on(s);
                }
            }
            Mark::Completed { stream, at_next_request: true } => self.at_next_request.push(stream),
            Mark::Segment | Mark::Free | Mark::UnknownFree => {}
            Mark::Completed { stream, at_next_request: false } => {
                a.device_mut().inner_mut().sim_mut().complete_events_on(stream)
            }
        }
    }
}
