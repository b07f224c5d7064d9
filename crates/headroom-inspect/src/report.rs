//! One device of a snapshot explained: totals now and at the peak, what
//! was live at the peak by call site and role, fragmentation, leak suspects,
//! the OOM and its remedies, and recommendations with their evidence.

use crate::frames::Phase;
use crate::layout::{Fragmentation, Layout};
use crate::leaks::{self, LeakSuspect, Repetitions};
use crate::oom::{self, Remedy};
use crate::over_time::over_time;
use crate::recommend;
use crate::roles::Lifetimes;
use crate::sites::{group, RoleBytes, SiteBytes, SiteDetail, Sites};
use crate::step_phases::StepPhases;
use crate::timeline::{timeline, Point, Timeline};
use crate::walk::{Live, Totals, Walk};
use headroom_alloc::{AllocatorConfig, BlockState};
use headroom_trace::device_trace::DeviceTrace;
use headroom_trace::recorded_memory::{Bounds, RecordedMemory};
use headroom_trace::snapshot::{MemorySnapshot, TraceAction, TraceEvent};
use headroom_trace::snapshot_replay::{check_from, Fidelity, Recorded};
use headroom_trace::what_if::{block_sizes, state_before, what_if_device, WhatIf};
use rustc_hash::FxHashMap;
use serde::Serialize;

/// What to compute.
#[derive(Clone, Debug)]
pub struct InspectOptions {
    /// Name the ATen operator under each user frame.
    pub cpp: bool,
    /// Call sites listed at the peak.
    pub top: usize,
    /// Call sites given their own band in the timeline.
    pub series: usize,
    /// Each allocation's life ([`DeviceReport::allocations`]), which only the HTML report
    /// draws: a list as long as the trace's allocations while it is built.
    pub allocations: bool,
}

impl Default for InspectOptions {
    fn default() -> Self {
        InspectOptions { cpp: false, top: 20, series: 8, allocations: true }
    }
}

/// A recorded out-of-memory error, explained: its figures, where it happened, and the
/// remedies replayed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OomExplanation {
    /// Index of the `oom` entry in the device's trace.
    pub index: usize,
    pub time_us: Option<i64>,
    /// The request that failed (rounded, as PyTorch records it).
    pub requested_bytes: u64,
    /// The segment PyTorch asked the device for to serve it: its message's
    /// "Tried to allocate", and `headroom replay`'s.
    pub segment_bytes: u64,
    /// What the device said was free; `None` when not recorded.
    pub free_bytes: Option<u64>,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    /// Reserved but not allocated: cached memory that could not serve the request.
    pub reserved_unallocated_bytes: u64,
    /// The largest cached free block then (from the replayed state), when known.
    pub largest_free_block_bytes: Option<u64>,
    /// `reserved + free`: the memory the run could have had.
    pub capacity_bytes: Option<u64>,
    /// A per-process limit refused the request, not the device (which had
    /// more free than was asked for): the range the limit lies in. Remedies
    /// are replayed under its lower end.
    pub memory_limit: Option<Bounds>,
    pub phase: Phase,
    pub site: String,
    /// Further `oom` entries after this one.
    pub later_ooms: usize,
    pub remedies: Vec<Remedy>,
    /// The most the run asked to hold at once: live blocks plus the requests refused so far
    /// (each counted from its refusal to the trace's end, which cannot tell when the program
    /// would have freed it).
    pub demand_peak_bytes: u64,
}

/// Advice, with what it rests on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Recommendation {
    pub what: String,
    pub evidence: String,
}

/// One call site's live bytes over the timeline (at the timeline's points).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteSeries {
    pub site: String,
    /// The site's id in [`DeviceReport::sites`].
    pub id: u32,
    pub bytes: Vec<u64>,
}

/// One device of a snapshot, explained.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceReport {
    pub device: u32,
    pub trace_entries: usize,
    pub has_frames: bool,
    pub has_times: bool,
    /// At the moment the snapshot was taken (its segments).
    pub now: Totals,
    /// When the trace began (`None` without a trace).
    pub start: Option<Totals>,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// The entry at which allocated first reached its peak; `None` when the
    /// peak is the snapshot's moment (no trace) or the trace's start.
    pub peak_event_index: Option<usize>,
    pub peak_time_us: Option<i64>,
    /// The phase of the allocation that reached the peak.
    pub peak_phase: Option<Phase>,
    /// Each phase's peak (`None` without a trace or without frames).
    pub step_phases: Option<StepPhases>,
    /// Live at the peak by call site, largest first.
    pub top_sites: Vec<SiteBytes>,
    /// Sites live at the peak beyond `top_sites`.
    pub other_sites: usize,
    pub roles: Vec<RoleBytes>,
    /// Reserved minus allocated at the allocated peak.
    pub fragmentation_at_peak_bytes: u64,
    /// The segments at the peak as replayed (`None` when the state could not be rebuilt).
    pub segments_at_peak: Option<Fragmentation>,
    /// The snapshot's own segments.
    pub segments_now: Fragmentation,
    /// The private pools (CUDA graphs, `MemPool`s): what each holds now, and
    /// the requests it served; empty when the run used none.
    pub pools: Vec<crate::pools::PoolSummary>,
    /// The moment reserved exceeded allocated the most.
    pub most_fragmented: Option<Point>,
    pub largest_request_bytes: u64,
    pub repetitions: Option<Repetitions>,
    pub leak_suspects: Vec<LeakSuspect>,
    pub ooms_recorded: usize,
    pub oom: Option<OomExplanation>,
    /// Whether the replay matched the recording decision for decision.
    pub replay_exact: Option<bool>,
    pub recommendations: Vec<Recommendation>,
    /// One line for each part that cannot be computed, and why.
    pub unavailable: Vec<String>,
    pub notes: Vec<String>,
    #[serde(skip)]
    pub timeline: Timeline,
    #[serde(skip)]
    pub series: Vec<SiteSeries>,
    #[serde(skip)]
    pub layout_at_peak: Option<Layout>,
    #[serde(skip)]
    pub layout_now: Layout,
    /// The sites the timeline's bands, the site table and the segment maps
    /// name, by id, with a stack each: what the HTML report shows on pointing.
    #[serde(skip)]
    pub sites: Vec<(u32, SiteDetail)>,
    /// Each allocation of the trace: the HTML report's per-allocation view.
    #[serde(skip)]
    pub allocations: crate::allocations::Allocations,
}

/// Simulated device size when the run's own is unknown: larger than any GPU,
/// so a replay fails only where settings make it.
const UNBOUNDED: u64 = 1 << 50;

/// Explains `device` of `snap`.
pub fn inspect_device(snap: &MemorySnapshot, device: u32, opts: &InspectOptions) -> DeviceReport {
    let trace = snap.device_traces.get(device as usize).map_or(&[][..], Vec::as_slice);
    let (recorded, settings_note) = snap.allocator_config();
    let mut sites = Sites::new(&snap.stacks, opts.cpp);
    if trace.is_empty() {
        let mut r = at_snapshot(snap, device, &TraceFacts::default(), &mut sites, settings_note);
        r.pools = crate::pools::private_pools(snap, device);
        note_no_frames(&mut r);
        return without_trace(r, snap, device, &mut sites, opts, &recorded);
    }
    // The start state, inferred once: every replay and the walks start from it.
    let (dt, contradiction) = match DeviceTrace::with_pools(snap, device) {
        Ok(t) => (Some(t), None),
        Err(e) => (None, Some(e)),
    };
    std::thread::scope(|scope| {
        // The check (and the private pools it infers first) is a replay of the whole trace
        // that the snapshot's own figures, the walk's start and the timeline do not wait
        // for: it runs on a thread of its own meanwhile.
        let checking = dt.as_ref().map(|t| {
            let config = recorded.clone();
            scope.spawn(move || checked(t, config))
        });
        let facts = TraceFacts::of(trace);
        let mut r = at_snapshot(snap, device, &facts, &mut sites, settings_note);
        note_no_frames(&mut r);
        if !r.has_times {
            r.unavailable.push("times: the trace recorded none (PyTorch before 2.4); moments are entry indices".into());
        }
        note_times_backwards(&mut r, &facts);
        if let Some(e) = &contradiction {
            r.notes.push(format!(
                "the trace contradicts the snapshot's final segments ({e}); totals are counted from zero at the \
                 trace's start, and nothing is replayed"
            ));
        }
        let mut first = Walk::new(snap, device, dt.as_ref().map(|t| &t.start));
        // Pass 1: the timeline and its peaks, with the rounded requests' sizes; taken again
        // below where the check's replay knows blocks of other sizes.
        let mut w = first.clone();
        let mut tl = timeline(&mut w);
        // The expandable-segments what-if waits for the check only for what the check tells
        // it; where the trace gives it nothing to tell (see `told_nothing`), it begins now,
        // beside the check, and is used if the report asks for it.
        let early = dt.as_ref().filter(|_| early_what_if_worth(&facts, &recorded, &tl)).map(|t| {
            let mut c = recorded.clone();
            c.expandable_segments = true;
            scope.spawn(move || what_if_device(t, c, UNBOUNDED, &Recorded::default(), None, |_| {}).ok())
        });

        let check = checking.map(|h| h.join().expect("the check does not panic"));
        r.pools = match &dt {
            Some(t) => crate::pools::private_pools_of(snap, device, t.pools()),
            None => crate::pools::private_pools(snap, device),
        };
        let (memory, fidelity, sizes) = check_recording(&mut r, check);
        if !sizes.is_empty() {
            first = first.with_block_sizes(&sizes);
            w = first.clone();
            tl = timeline(&mut w);
        }
        let checked = (memory, fidelity);
        let oom_at = facts.first_oom;
        inspect_trace(
            r,
            &first,
            tl,
            w.unmatched_frees,
            dt.as_ref(),
            checked,
            &recorded,
            &mut sites,
            opts,
            early,
            oom_at,
        )
    })
}

/// Whether to begin the expandable-segments what-if before the check ends: the report
/// would ask for it (fragmentation worth removing, under settings without expandable
/// segments; the timeline with the rounded requests' sizes has at least the gap the
/// replay's exact sizes leave), and the check can tell it nothing: a trace that releases
/// no segment and records no OOM has no `empty_cache()` call, refusal or limit for a
/// what-if to repeat, and its device is unbounded (the rule `headroom replay` skips the
/// check by).
fn early_what_if_worth(facts: &TraceFacts, recorded: &AllocatorConfig, tl: &Timeline) -> bool {
    !recorded.expandable_segments && recommend::worth_defragmenting_in(tl) && !facts.releases_or_oom
}

/// What the report reads of every entry apart from the walks, taken in one pass: a trace of a
/// million entries is a hundred megabytes, and each pass over it reads them all again.
#[derive(Default)]
struct TraceFacts {
    has_times: bool,
    largest_request_bytes: u64,
    ooms: usize,
    first_oom: Option<usize>,
    /// A segment released, or an OOM recorded.
    releases_or_oom: bool,
    /// The first entry whose time is before the one before it: (entry, its time, that time).
    backwards: Option<(usize, i64, i64)>,
}

impl TraceFacts {
    fn of(trace: &[TraceEvent]) -> TraceFacts {
        let mut f = TraceFacts::default();
        let mut last: Option<i64> = None;
        for (i, e) in trace.iter().enumerate() {
            if let Some(t) = e.time_us {
                f.has_times = true;
                if f.backwards.is_none() {
                    if let Some(l) = last.filter(|&l| t < l) {
                        f.backwards = Some((i, t, l));
                    }
                    last = Some(t);
                }
            }
            match e.action {
                TraceAction::Alloc => f.largest_request_bytes = f.largest_request_bytes.max(e.size),
                TraceAction::Oom => {
                    f.largest_request_bytes = f.largest_request_bytes.max(e.size);
                    f.ooms += 1;
                    f.first_oom.get_or_insert(i);
                    f.releases_or_oom = true;
                }
                TraceAction::SegmentFree | TraceAction::SegmentUnmap => f.releases_or_oom = true,
                _ => {}
            }
        }
        f
    }
}

/// Whether the check told the what-ifs nothing: the early what-if, replayed on an unbounded
/// device with nothing recorded to repeat, is then the one the check's findings would run.
fn told_nothing(replay_capacity: u64, recorded: &Recorded) -> bool {
    // The pools' notes are the report's, not the replay's.
    let repeated = Recorded { pool_notes: Vec::new(), ..recorded.clone() };
    replay_capacity == UNBOUNDED && repeated == Recorded::default()
}

/// The report's passes over the trace, from the timeline on, and the replays
/// at the peak, at the OOM and under expandable segments.
#[allow(clippy::too_many_arguments)]
fn inspect_trace(
    mut r: DeviceReport,
    first: &Walk,
    tl: Timeline,
    unmatched_frees: usize,
    dt: Option<&DeviceTrace>,
    (memory, fidelity): (RecordedMemory, Option<Fidelity>),
    recorded: &AllocatorConfig,
    sites: &mut Sites,
    opts: &InspectOptions,
    mut early: Option<std::thread::ScopedJoinHandle<Option<WhatIf>>>,
    oom_at: Option<usize>,
) -> DeviceReport {
    let trace = first.trace();
    // Replays run on the device the recording tells of, unbounded where it tells nothing.
    let replay_capacity = memory.capacity(None, UNBOUNDED).0;
    let walk = || first.clone();
    if unmatched_frees > 0 {
        r.notes.push(format!("{unmatched_frees} frees of blocks the trace never allocated were skipped"));
    }
    set_peaks(&mut r, &tl, trace, sites);

    // The replays the report still needs — the state at the peak, and the same run under
    // expandable segments where fragmentation is worth removing — depend on the walks no
    // further, and the walks below not on them: they run beside each other.
    let at_peak = tl_peak_next(&r);
    let (state_at_peak, expandable_check) = std::thread::scope(|scope| {
        // Each replay on a thread of its own: the one at the peak is short where the peak
        // comes early, the expandable one always whole, and the walks take a core meanwhile.
        let (state, expandable) = match (dt, &fidelity) {
            (Some(t), Some(f)) => {
                let config = recorded.clone();
                let state = scope.spawn(move || state_before(t, config, replay_capacity, &f.recorded, at_peak).ok());
                let wanted = !recorded.expandable_segments && recommend::worth_defragmenting(&r);
                let usable = early.take().filter(|_| wanted && told_nothing(replay_capacity, &f.recorded));
                let expandable = (wanted && usable.is_none()).then(|| {
                    let mut c = recorded.clone();
                    c.expandable_segments = true;
                    scope.spawn(move || what_if_device(t, c, replay_capacity, &f.recorded, None, |_| {}).ok())
                });
                (Some(state), expandable.map(Ok).or(usable.map(Err)))
            }
            _ => (None, None),
        };
        let peak_sites = walks(&mut r, &walk, &tl, sites, opts);
        let joined = "the replays beside the walks do not panic";
        let state = state.and_then(|h| h.join().expect(joined));
        let expandable = expandable.and_then(|h| match h {
            Ok(now) => now.join().expect(joined),
            Err(early) => early.join().expect(joined),
        });
        (state.map(|s| (s, peak_sites)), expandable)
    });
    r.timeline = tl;
    if let Some((s, peak_sites)) = state_at_peak {
        let l = Layout::replayed(&s.segments, &peak_sites);
        r.segments_at_peak = Some(l.fragmentation());
        r.layout_at_peak = Some(l);
    }
    if let Some(i) = oom_at {
        let mut w = walk();
        if i > 0 {
            w.run_through(i - 1);
        }
        let mut o = oom_at_entry(&r, trace, i, &w.totals, sites, &memory, recorded);
        o.demand_peak_bytes = demand_peak(walk());
        let bounded = o.capacity_bytes.is_some() || o.memory_limit.is_some();
        match (dt, &fidelity) {
            (Some(t), Some(f)) if bounded => {
                replay_remedies(&mut o, t, recorded, replay_capacity, &f.recorded, r.ooms_recorded);
            }
            _ if !bounded => r.unavailable.push(
                "OOM remedies: the `oom` entry does not record the device's free memory (or records more than any \
                 GPU has), so the device size is unknown"
                    .into(),
            ),
            _ => {}
        }
        r.oom = Some(o);
    }
    recommend::recommend(&mut r, recorded, expandable_check.map(|w| w.peak_reserved_bytes));
    name_sites(&mut r, sites);
    r
}

/// What the snapshot's own segments tell of `device`, at the moment it was
/// taken: the report before the trace is read.
fn at_snapshot(
    snap: &MemorySnapshot,
    device: u32,
    facts: &TraceFacts,
    sites: &mut Sites,
    settings_note: Option<String>,
) -> DeviceReport {
    let trace = snap.device_traces.get(device as usize).map_or(&[][..], Vec::as_slice);
    let layout_now = Layout::recorded(&snap.segments, device, |stack| sites.of_stack(stack));
    let segments_now = layout_now.fragmentation();
    let mut now = Totals { reserved_bytes: segments_now.reserved_bytes, ..Default::default() };
    for b in snap.segments.iter().filter(|s| s.device == device).flat_map(|s| &s.blocks) {
        match b.state {
            BlockState::ActiveAllocated => {
                now.allocated_bytes += b.size;
                now.active_bytes += b.size;
                now.requested_bytes += b.requested_size;
            }
            BlockState::ActivePendingFree => now.active_bytes += b.size,
            BlockState::Inactive => {}
        }
    }
    DeviceReport {
        device,
        trace_entries: trace.len(),
        has_frames: !snap.stacks.frames.is_empty(),
        has_times: facts.has_times,
        now,
        start: None,
        peak_allocated_bytes: now.allocated_bytes,
        peak_reserved_bytes: now.reserved_bytes,
        peak_event_index: None,
        peak_time_us: None,
        peak_phase: None,
        step_phases: None,
        top_sites: Vec::new(),
        other_sites: 0,
        roles: Vec::new(),
        fragmentation_at_peak_bytes: now.reserved_bytes.saturating_sub(now.allocated_bytes),
        segments_at_peak: None,
        segments_now,
        // Filled in from the private pools the check infers.
        pools: Vec::new(),
        most_fragmented: None,
        largest_request_bytes: facts.largest_request_bytes,
        repetitions: None,
        leak_suspects: Vec::new(),
        ooms_recorded: facts.ooms,
        oom: None,
        replay_exact: None,
        recommendations: Vec::new(),
        unavailable: Vec::new(),
        notes: settings_note.into_iter().collect(),
        timeline: Timeline::default(),
        series: Vec::new(),
        layout_at_peak: None,
        layout_now,
        sites: Vec::new(),
        allocations: Default::default(),
    }
}

/// The report of a snapshot recorded without a trace: every figure is for
/// the moment it was taken.
fn without_trace(
    mut r: DeviceReport,
    snap: &MemorySnapshot,
    device: u32,
    sites: &mut Sites,
    opts: &InspectOptions,
    recorded: &AllocatorConfig,
) -> DeviceReport {
    r.unavailable.push(
        "peak over time, fragmentation over time, leaks and OOMs: the snapshot has no trace (recorded without \
         `_record_memory_history`), so every figure is for the moment it was taken"
            .into(),
    );
    // Without a trace the snapshot's moment is the only one, and nothing predates it.
    let live: Vec<Live> = snap
        .segments
        .iter()
        .filter(|s| s.device == device)
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .map(|b| Live { size: b.size, requested: b.requested_size, stack: b.stack, since: Some(0), pending: false })
        .collect();
    fill_sites(&mut r, group(live.iter(), sites, None), opts.top);
    recommend::recommend(&mut r, recorded, None);
    name_sites(&mut r, sites);
    r
}

/// PyTorch's clock only moves forward; a trace whose times do not was
/// edited or merged, and its "seconds into the trace" can be negative.
fn note_times_backwards(r: &mut DeviceReport, facts: &TraceFacts) {
    if let Some((i, t, last)) = facts.backwards {
        r.notes.push(format!(
            "times go backwards at entry {i} ({t} µs after {last} µs): moments are placed by entry, and times are \
             shown as recorded"
        ));
    }
}

/// What the check's replay tells, as its thread hands it over: how closely
/// the replay followed the recording, the device the recorded run had (what
/// it held plus what was free at its OOM) and any per-process limit, and the
/// block sizes the replay handed out where it matched the recording.
struct Checked {
    fidelity: Fidelity,
    memory: RecordedMemory,
    /// A device size an `oom` entry gave that no GPU has (then taken as unknown).
    device_past_any: Option<u64>,
    sizes: FxHashMap<usize, u64>,
}

/// Checks the replay against the recording: all the report's replays rest on it.
fn checked(t: &DeviceTrace, recorded: AllocatorConfig) -> Result<Checked, String> {
    // The check's device size matters only to expandable reservations, sized by it.
    let fidelity = check_from(t, recorded.clone(), UNBOUNDED, |_| {}).map_err(|e| e.to_string())?;
    let mut memory = RecordedMemory::infer(t, &fidelity.recorded.refusals);
    // A `device_free` past any GPU would make a device of exabytes: its size is
    // then unknown, as without one.
    let device_past_any = memory.device.filter(|&d| d > UNBOUNDED);
    if device_past_any.is_some() {
        memory.device = None;
    }
    // Block sizes as the replay handed them out, where it matches the recording.
    let sizes = if fidelity.is_exact() {
        let capacity = memory.capacity(None, UNBOUNDED).0;
        block_sizes(t, recorded, capacity, &fidelity.recorded).unwrap_or_default()
    } else {
        FxHashMap::default()
    };
    Ok(Checked { fidelity, memory, device_past_any, sizes })
}

/// The check's outcome in the report (`None`: the trace's start state could not be rebuilt).
fn check_recording(
    r: &mut DeviceReport,
    check: Option<Result<Checked, String>>,
) -> (RecordedMemory, Option<Fidelity>, FxHashMap<usize, u64>) {
    let c = match check {
        Some(Ok(c)) => c,
        Some(Err(e)) => {
            r.unavailable.push(format!("segments at the peak and OOM remedies: {e}"));
            return Default::default();
        }
        None => {
            r.unavailable.push(
                "segments at the peak and OOM remedies: the state the trace began in could not be rebuilt".into(),
            );
            return Default::default();
        }
    };
    let f = c.fidelity;
    r.replay_exact = Some(f.is_exact());
    if !f.is_exact() {
        r.notes.push(format!(
            "the replay departs from the recording ({f}): segments at the peak and remedies are \
             headroom's model of the run, not the run"
        ));
    }
    if let Some(d) = c.device_past_any {
        r.notes.push(format!(
            "an `oom` entry says the device had {d} bytes, more than any GPU has (1 PiB): the device's \
             size is taken as unknown"
        ));
    }
    (c.memory, Some(f), c.sizes)
}

/// Says so where the snapshot recorded no frames.
fn note_no_frames(r: &mut DeviceReport) {
    if !r.has_frames {
        r.unavailable.push(
            "call sites, phases and roles: the snapshot recorded no frames (`_record_memory_history(stacks=...)` \
             off, or a PyTorch older than 2.1)"
                .into(),
        );
    }
}

/// The peaks the timeline found, and the phase of the allocation that reached the peak.
fn set_peaks(r: &mut DeviceReport, tl: &Timeline, trace: &[TraceEvent], sites: &mut Sites) {
    r.start = Some(tl.start.totals);
    r.peak_allocated_bytes = tl.peak.totals.allocated_bytes;
    r.peak_reserved_bytes = tl.peak_reserved.totals.reserved_bytes;
    r.peak_event_index = tl.peak.index;
    r.peak_time_us = tl.peak.time_us;
    r.fragmentation_at_peak_bytes = tl.peak.totals.reserved_bytes.saturating_sub(tl.peak.totals.allocated_bytes);
    r.most_fragmented = Some(tl.most_fragmented);
    if let Some(i) = tl.peak.index {
        r.peak_phase = Some(sites.info(trace[i].stack).phase);
    }
}

/// The OOM at entry `i` as recorded, with the totals just before it; its
/// remedies are replayed apart.
fn oom_at_entry(
    r: &DeviceReport,
    trace: &[TraceEvent],
    i: usize,
    before: &Totals,
    sites: &mut Sites,
    memory: &RecordedMemory,
    config: &AllocatorConfig,
) -> OomExplanation {
    let e = &trace[i];
    let info = sites.info(e.stack).clone();
    let rounded = headroom_alloc::sizing::round_size(config, e.size);
    OomExplanation {
        index: i,
        time_us: e.time_us,
        requested_bytes: e.size,
        segment_bytes: headroom_alloc::sizing::allocation_size(config, rounded),
        free_bytes: e.device_free.filter(|&f| f <= UNBOUNDED),
        allocated_bytes: before.allocated_bytes,
        reserved_bytes: before.reserved_bytes,
        reserved_unallocated_bytes: before.reserved_bytes.saturating_sub(before.allocated_bytes),
        largest_free_block_bytes: None,
        capacity_bytes: memory.device,
        memory_limit: memory.limit,
        phase: info.phase,
        site: info.site.site,
        later_ooms: r.ooms_recorded - 1,
        remedies: Vec::new(),
        demand_peak_bytes: 0,
    }
}

/// The most the run asked to hold at once: allocated, plus every request refused so far.
fn demand_peak(mut w: Walk) -> u64 {
    let (mut refused, mut peak) = (0u64, w.totals.allocated_bytes);
    while let Some(e) = w.trace().get(w.next) {
        if e.action == TraceAction::Oom {
            refused += e.size;
        }
        w.step();
        peak = peak.max(w.totals.allocated_bytes + refused);
    }
    peak
}

/// The state just before the OOM, replayed for its largest free block, and
/// each remedy replayed on the device the recording tells of.
fn replay_remedies(
    o: &mut OomExplanation,
    t: &DeviceTrace,
    config: &AllocatorConfig,
    replay_capacity: u64,
    recorded: &Recorded,
    ooms_recorded: usize,
) {
    if let Ok(s) = state_before(t, config.clone(), replay_capacity, recorded, o.index) {
        o.largest_free_block_bytes =
            Some(Layout::replayed(&s.segments, &Default::default()).fragmentation().largest_free_block_bytes);
    }
    o.remedies = oom::remedies(t, config, replay_capacity, recorded, ooms_recorded);
    // Where the recording bounds the memory without telling it, a remedy is judged on
    // the least and the most it allows: a verdict that differs between them is no verdict.
    if let (None, Some(b)) = (o.capacity_bytes, o.memory_limit) {
        if b.below > b.at_least + 1 {
            let most = b.below - 1;
            let upper = Recorded { memory_limit: Some(most), ..recorded.clone() };
            let high = oom::remedies(t, config, replay_capacity.max(most), &upper, ooms_recorded);
            o.remedies = oom::within_bounds(std::mem::take(&mut o.remedies), high, b);
        }
    }
}

/// The passes over the trace after the timeline: what is live at the peak, then in one
/// walk the largest sites' bands, the allocations and the phases of each step, then what
/// grows from one repetition to the next. Returns the site of each block live at the
/// peak, by address.
fn walks<'a>(
    r: &mut DeviceReport,
    walk: &impl Fn() -> Walk<'a>,
    tl: &Timeline,
    sites: &mut Sites,
    opts: &InspectOptions,
) -> rustc_hash::FxHashMap<u64, u32> {
    // The passes of a step, and what each block became (frames name the passes). Sites are
    // named here in the trace's order, first of all the walks.
    let lifetimes = r.has_frames.then(|| Lifetimes::new(&walk(), |e| sites.info(e.stack).phase));

    // The leak search takes a core of its own beside the walks below, where the replay at
    // the peak leaves one mostly idle. It names sites in a copy of the table: the walks below
    // name every site it would (each allocation's, and the blocks' live at the start), so the
    // table numbers them as before, and its suspects carry site names, not numbers.
    std::thread::scope(|scope| {
        let (mut own, mut w) = (sites.clone(), walk());
        let leaking = scope.spawn(move || leaks::search(&mut w, &mut own));

        // Live at the peak, each block's role what it became.
        let mut w = walk();
        if let Some(i) = tl.peak.index {
            w.run_through(i);
        }
        fill_sites(r, group(w.live.values(), sites, lifetimes.as_ref()), opts.top);
        let peak_sites = w.live.iter().map(|(a, l)| (a, sites.of(l))).collect();

        // The largest sites' bands under the timeline, each allocation, each phase's peak.
        let chosen: Vec<u32> = r.top_sites.iter().take(opts.series).map(|s| s.id).collect();
        let o = over_time(walk(), tl, &chosen, sites, lifetimes.as_ref(), opts.allocations);
        r.series = o.series;
        r.step_phases = o.step_phases;
        (r.allocations.list, r.allocations.dropped) =
            crate::allocations::largest(o.allocations, crate::allocations::MAX_ALLOCATIONS);

        // Repetitions and what grows across them.
        match leaking.join().expect("the leak search does not panic") {
            Ok((reps, s)) => {
                r.leak_suspects = s;
                r.repetitions = Some(reps);
            }
            Err(why) => r.unavailable.push(why),
        }
        peak_sites
    })
}

/// The sites the report's views name, each with what pointing at it shows.
fn name_sites(r: &mut DeviceReport, sites: &Sites) {
    let layouts = r.layout_at_peak.iter().chain(std::iter::once(&r.layout_now));
    let blocks = layouts.flat_map(|l| &l.segments).flat_map(|s| &s.blocks).filter_map(|b| b.site);
    let mut ids: Vec<u32> =
        r.top_sites.iter().map(|s| s.id).chain(r.series.iter().map(|s| s.id)).chain(blocks).collect();
    ids.sort_unstable();
    ids.dedup();
    // A site live at the peak shows the role its blocks became there.
    r.sites = ids
        .into_iter()
        .map(|id| {
            let mut d = sites.detail(id);
            if let Some(s) = r.top_sites.iter().find(|s| s.id == id) {
                d.role = s.role;
            }
            (id, d)
        })
        .collect();
    let mut rest: Vec<u32> = r.allocations.list.iter().map(|a| a.site).collect();
    rest.sort_unstable();
    rest.dedup();
    rest.retain(|id| r.sites.binary_search_by_key(id, |s| s.0).is_err());
    r.allocations.sites = rest.into_iter().map(|id| (id, sites.detail(id))).collect();
}

/// The entry just after the peak: the replayed state there is the state at the peak.
fn tl_peak_next(r: &DeviceReport) -> usize {
    r.peak_event_index.map_or(0, |i| i + 1)
}

fn fill_sites(r: &mut DeviceReport, (all, roles): (Vec<SiteBytes>, Vec<RoleBytes>), top: usize) {
    r.other_sites = all.len().saturating_sub(top);
    r.top_sites = all.into_iter().take(top).collect();
    r.roles = roles;
}
