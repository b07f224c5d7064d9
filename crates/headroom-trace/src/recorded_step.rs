//! The recorded step: a device's trace as moments — each allocation with the phase its frames
//! name, each free, each refusal, and the totals after each — and the training steps found in
//! them.
//!
//! The inspector makes the [`Recording`] (it reads the frames); `headroom plan --calibrate`
//! finds the run's steps in it ([`find_steps`]) and fits its step program to the last steady
//! one; `headroom inspect` reads each phase's peak with the same rule of which phase a moment
//! is in ([`step_phase`]); the replay of a snapshot counts device calls per step from where
//! steps begin in the raw trace ([`step_starts`]). One rule says where a step begins for all
//! of them ([`StepBoundary`]).
//!
//! A training step ends with the optimizer's step. Before the first step a trace may hold the
//! model's construction; each step holds a forward and a backward (several, one per
//! gradient-accumulation micro-step) and an optimizer step. A step is whole when the trace
//! holds its beginning and its end: not the one a ring buffer cut (its backward frees tensors
//! made before the trace), not one that ran out of memory.
//!
//! The first steps differ from the rest: the first creates the optimizer's state and grows the
//! cache, the second meets a cache shaped by the first. From the third on a run is in its
//! steady state, where a caching allocator should ask the device for nothing it did not
//! already ask for.

use crate::phase::{ByPhase, Phase};
use crate::snapshot::{MemorySnapshot, TraceAction, TraceEvent};
use std::fmt;

/// What one moment of a trace did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moment {
    /// A block became the caller's; `phase` is what its frames name.
    Alloc { bytes: u64, phase: Phase },
    /// A block stopped being the caller's; `before_trace`: it was live when the trace began.
    Free { bytes: u64, before_trace: bool },
    /// A request the allocator could not serve: the rounded bytes asked and what the device
    /// said was free.
    Oom { asked: u64, device_free: Option<u64> },
}

/// One moment and the allocator's totals after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub moment: Moment,
    pub allocated: u64,
    pub reserved: u64,
}

/// A device's trace as moments (`headroom_inspect::recording` makes one from a snapshot).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recording {
    /// Allocated and reserved when the trace began.
    pub start_allocated: u64,
    pub start_reserved: u64,
    pub entries: Vec<Entry>,
    /// Whether any allocation carried frames (without them no phase can be told).
    pub has_frames: bool,
    /// Frees of blocks the trace never allocated (a trace inconsistent with its start).
    pub unmatched_frees: usize,
}

/// The phase of a training step a moment is in after an allocation whose frames name
/// `allocated`, from the step phase `now`; `None` where the allocation changes nothing (setup,
/// data loading, the user's own code: the loss, computed between the model's forward and the
/// backward, stays in the forward). An evaluation's forward is a forward. An allocation
/// without frames during a forward is the backward beginning: the autograd engine runs on
/// threads without Python frames.
pub fn step_phase(allocated: Phase, now: Phase) -> Option<Phase> {
    match allocated {
        Phase::Forward | Phase::Evaluation => Some(Phase::Forward),
        Phase::Backward => Some(Phase::Backward),
        Phase::Unknown if now == Phase::Forward => Some(Phase::Backward),
        Phase::OptimizerStep => Some(Phase::OptimizerStep),
        Phase::Setup | Phase::DataLoading | Phase::Other | Phase::Unknown => None,
    }
}

/// Where a training step begins, allocation by allocation: a step ends with its optimizer
/// step, so the first allocation after the optimizer step's that is not one of them begins the
/// next.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepBoundary {
    in_optimizer_step: bool,
}

impl StepBoundary {
    /// Whether the next allocation, the optimizer step's or not, begins a step.
    pub fn begins(&mut self, optimizer_step: bool) -> bool {
        let begins = self.in_optimizer_step && !optimizer_step;
        self.in_optimizer_step = optimizer_step;
        begins
    }
}

/// The trace entries at which steps 2, 3, … of `device`'s trace begin, in order.
///
/// This answers another question than [`find_steps`]: where steps begin in the raw trace,
/// whole or not, for a replay that counts device calls per step and reads no phases. An
/// allocation is the optimizer step's when a frame of its stack is in `torch/optim/`; a trace
/// recorded without frames, or without an optimizer, is one step.
pub fn step_starts(snap: &MemorySnapshot, device: u32) -> Vec<usize> {
    let Some(trace) = snap.device_traces.get(device as usize) else { return Vec::new() };
    let mut starts = StepStarts::new(snap);
    for (i, e) in trace.iter().enumerate() {
        starts.see(snap, i, e);
    }
    starts.starts
}

/// [`step_starts`] found entry by entry, so that a walk reading the trace for other things
/// finds them too ([`crate::trace_index::TraceIndex`]).
pub(crate) struct StepStarts {
    /// Whether each interned stack is the optimizer step's: each is read once.
    optimizer: Vec<Option<bool>>,
    boundary: StepBoundary,
    pub(crate) starts: Vec<usize>,
}

impl StepStarts {
    pub(crate) fn new(snap: &MemorySnapshot) -> Self {
        StepStarts {
            optimizer: vec![None; snap.stacks.stacks.len()],
            boundary: StepBoundary::default(),
            starts: Vec::new(),
        }
    }

    /// Entry `i`, `e`, of the trace, after every entry before it.
    #[inline]
    pub(crate) fn see(&mut self, snap: &MemorySnapshot, i: usize, e: &TraceEvent) {
        if e.action != TraceAction::Alloc {
            return;
        }
        let k = e.stack as usize;
        let o = match self.optimizer.get(k).copied().flatten() {
            Some(o) => o,
            None => {
                let o = snap.stacks.frames_of(e.stack).any(|(file, _, _)| file.contains("/torch/optim/"));
                if let Some(slot) = self.optimizer.get_mut(k) {
                    *slot = Some(o);
                }
                o
            }
        };
        if self.boundary.begins(o) {
            self.starts.push(i);
        }
    }
}

/// Whether a step made the optimizer's state (the run keeps more after it than before).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    First,
    Steady,
}

impl StepKind {
    /// The stable name JSON and text use.
    pub fn name(self) -> &'static str {
        match self {
            StepKind::First => "first",
            StepKind::Steady => "steady",
        }
    }
}

/// One whole step of a recording.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordedStep {
    /// 1-based, among the steps the trace holds (whole or not).
    pub number: u32,
    pub kind: StepKind,
    /// Forward and backward passes before its optimizer step (gradient accumulation's).
    pub micro_steps: u32,
    /// Its first and last entries in the recording.
    pub entries: (usize, usize),
    /// Allocated when it began and when it ended: what lives between steps.
    pub start: u64,
    pub end: u64,
    /// Allocated peaks of its forward, backward and optimizer step.
    pub peaks: ByPhase<u64>,
    /// The most reserved while it ran.
    pub reserved_peak: u64,
}

impl RecordedStep {
    /// Its allocated peak.
    pub fn peak(&self) -> u64 {
        self.peaks.max().max(self.start)
    }
}

/// The out-of-memory error a recording ends in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordedOom {
    /// The step it happened in (1-based, as [`RecordedStep::number`]).
    pub step: u32,
    pub phase: Phase,
    /// The rounded bytes asked.
    pub asked: u64,
    /// What the device said was free.
    pub device_free: Option<u64>,
    pub allocated: u64,
    pub reserved: u64,
    /// What its step had grown by beyond where the step began, the failed request included.
    pub grown: u64,
}

/// The steps a recording holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Steps {
    /// Allocated by the model's construction before the first step, where the trace has it.
    pub construction: Option<u64>,
    /// The trace began inside a step (a ring buffer that dropped its start): that step is not
    /// whole.
    pub began_mid_step: bool,
    /// Every step the trace holds, whole or not.
    pub total: u32,
    pub whole: Vec<RecordedStep>,
    pub oom: Option<RecordedOom>,
}

impl Steps {
    /// The step a calibration uses: the last whole steady step, else the last whole one (the
    /// first step makes the optimizer's state; it serves only where no other step is whole).
    pub fn used(&self) -> Option<&RecordedStep> {
        self.whole.iter().rev().find(|s| s.kind == StepKind::Steady).or(self.whole.last())
    }
}

/// Why a recording has no whole step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoWholeStep(pub String);

impl fmt::Display for NoWholeStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the trace holds no whole training step ({}): record from before a step's forward through its \
             optimizer step (_record_memory_history() before the step, _dump_snapshot() after it)",
            self.0
        )
    }
}

impl std::error::Error for NoWholeStep {}

/// The steps of `rec`. A moment is in the phase [`step_phase`] says; a step begins at the
/// first allocation that names a phase of a step, and then where [`StepBoundary`] says.
pub fn find_steps(rec: &Recording) -> Result<Steps, NoWholeStep> {
    if rec.entries.iter().all(|e| !matches!(e.moment, Moment::Alloc { .. })) {
        return Err(NoWholeStep("it allocates nothing".into()));
    }
    let read = Reading::of(rec);
    let mut out = Steps {
        // What the construction left live when the first step began (a model built in fp32
        // and cast peaks above what it keeps).
        construction: read
            .setup
            .then(|| read.steps.first().map_or(read.end, |s| s.start).saturating_sub(rec.start_allocated)),
        total: read.steps.len() as u32,
        ..Steps::default()
    };
    let mut missing: Vec<&str> = Vec::new();
    for (k, s) in read.steps.iter().enumerate() {
        // The first step read began with the trace: whole only if the trace holds its
        // beginning.
        if k == 0 && !read.setup && s.began_before_trace() {
            out.began_mid_step = true;
            missing.push("the first step began before the trace");
            continue;
        }
        match s.whole(k as u32 + 1) {
            Ok(step) => out.whole.push(step),
            Err(why) => missing.push(why),
        }
    }
    out.oom = read.oom(rec.start_allocated);
    if out.whole.is_empty() && out.oom.is_none() {
        missing.dedup();
        let what = if read.steps.is_empty() {
            "no forward, backward or optimizer step".to_string()
        } else {
            missing.join("; ")
        };
        return Err(NoWholeStep(what));
    }
    Ok(out)
}

/// A step as the reading found it, whole or not.
struct StepRead {
    /// Its first and last entries.
    first: usize,
    last: usize,
    /// Allocated when it began and when it ended.
    start: u64,
    end: u64,
    /// The phase its latest moment is in.
    at: Phase,
    /// Which of its phases it entered.
    entered: ByPhase<bool>,
    micro: u32,
    peaks: ByPhase<u64>,
    reserved: u64,
    /// Bytes made before the trace that its backward freed: what a step begun before the
    /// trace frees (its activations).
    freed_from_before: u64,
    /// Allocated when its optimizer step began.
    optimizer_began: Option<u64>,
    oom: bool,
}

impl StepRead {
    fn new(first: usize, start: u64, reserved: u64) -> StepRead {
        StepRead {
            first,
            last: first,
            start,
            end: start,
            at: Phase::Forward,
            entered: ByPhase::default(),
            micro: 0,
            peaks: ByPhase::default(),
            reserved,
            freed_from_before: 0,
            optimizer_began: None,
            oom: false,
        }
    }

    /// An allocation whose frames name `phase`, with `allocated` before it.
    fn allocation(&mut self, phase: Phase, allocated: u64) {
        let Some(next) = step_phase(phase, self.at) else { return };
        match next {
            // A forward after anything but a forward is the next micro-step's.
            Phase::Forward if self.at != Phase::Forward || !self.entered.forward => self.micro += 1,
            Phase::OptimizerStep if self.optimizer_began.is_none() => self.optimizer_began = Some(allocated),
            _ => {}
        }
        self.at = next;
        if let Some(entered) = self.entered.get_mut(next) {
            *entered = true;
        }
    }

    /// Whether the trace began inside it: its backward freed, beyond rounding, what was made
    /// before the trace (the forward's activations).
    fn began_before_trace(&self) -> bool {
        let forward_grew = self.peaks.forward.saturating_sub(self.start);
        self.freed_from_before > forward_grew / 20
    }

    /// The step numbered `number`, if whole; else what it lacks.
    fn whole(&self, number: u32) -> Result<RecordedStep, &'static str> {
        if self.oom {
            return Err("a step ran out of memory");
        }
        let e = self.entered;
        if !(e.forward && e.backward && e.optimizer_step) {
            return Err(match (e.forward, e.backward) {
                (false, _) => "a step without a forward",
                (true, false) => "a forward without a backward",
                (true, true) => "a backward without an optimizer step",
            });
        }
        // Its optimizer step left more live than it found, by more than rounding: it made the
        // optimizer's state. (What the step as a whole leaves says less: a script that zeroes
        // the gradients at a step's start keeps them from one step to the next.)
        let made = self.optimizer_began.map_or(0, |b| self.end.saturating_sub(b));
        let first = made > self.start / 20 + (16 << 20);
        Ok(RecordedStep {
            number,
            kind: if first { StepKind::First } else { StepKind::Steady },
            micro_steps: self.micro.max(1),
            entries: (self.first, self.last),
            start: self.start,
            end: self.end,
            peaks: self.peaks.map(|p| p.max(self.start)),
            reserved_peak: self.reserved,
        })
    }
}

/// A recording read once, cut into steps.
struct Reading {
    steps: Vec<StepRead>,
    /// Whether the trace holds the model's construction: setup allocations before the first
    /// step.
    setup: bool,
    /// Allocated after the last entry.
    end: u64,
    /// The last out-of-memory error and the index of the step it is in.
    last_oom: Option<(usize, Entry)>,
}

impl Reading {
    fn of(rec: &Recording) -> Reading {
        let mut r = Reading { steps: Vec::new(), setup: false, end: rec.start_allocated, last_oom: None };
        let mut open: Option<StepRead> = None;
        let mut boundary = StepBoundary::default();
        for (i, e) in rec.entries.iter().enumerate() {
            match e.moment {
                Moment::Alloc { phase, .. } => {
                    let after_optimizer_step = boundary.begins(phase == Phase::OptimizerStep);
                    let begins = match open {
                        Some(_) => after_optimizer_step,
                        None => step_phase(phase, Phase::Forward).is_some(),
                    };
                    r.setup |= open.is_none() && !begins && phase == Phase::Setup;
                    if begins {
                        if let Some(o) = open.take() {
                            r.close(o, i - 1);
                        }
                        open = Some(StepRead::new(i, r.end, e.reserved));
                    }
                    if let Some(o) = open.as_mut() {
                        o.allocation(phase, r.end);
                    }
                }
                Moment::Free { bytes, before_trace } => {
                    if let Some(o) = open.as_mut().filter(|o| before_trace && o.at == Phase::Backward) {
                        o.freed_from_before = o.freed_from_before.saturating_add(bytes);
                    }
                }
                Moment::Oom { .. } => {
                    if let Some(o) = open.as_mut() {
                        o.oom = true;
                    }
                    r.last_oom = Some((r.steps.len(), *e));
                }
            }
            r.end = e.allocated;
            if let Some(o) = open.as_mut() {
                o.peaks.raise(o.at, e.allocated);
                o.reserved = o.reserved.max(e.reserved);
            }
        }
        if let Some(o) = open.take() {
            r.close(o, rec.entries.len().saturating_sub(1));
        }
        r
    }

    /// Ends `step` at entry `last`, with what is allocated now.
    fn close(&mut self, mut step: StepRead, last: usize) {
        step.last = last;
        step.end = self.end;
        self.steps.push(step);
    }

    /// The out-of-memory error the recording ends in, in its step.
    fn oom(&self, start_allocated: u64) -> Option<RecordedOom> {
        let (k, Entry { moment: Moment::Oom { asked, device_free }, allocated, reserved }) = self.last_oom? else {
            return None;
        };
        let step = self.steps.get(k);
        Some(RecordedOom {
            step: k as u32 + 1,
            phase: step.map_or(Phase::Forward, |s| s.at),
            asked,
            device_free,
            allocated,
            reserved,
            grown: allocated.saturating_add(asked).saturating_sub(step.map_or(start_allocated, |s| s.start)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A recording built moment by moment.
    struct Rec(Recording, u64);

    impl Rec {
        fn new(start: u64) -> Rec {
            Rec(Recording { start_allocated: start, start_reserved: start, ..Recording::default() }, start)
        }
        fn alloc(&mut self, bytes: u64, phase: Phase) -> &mut Rec {
            self.1 += bytes;
            self.0.entries.push(Entry { moment: Moment::Alloc { bytes, phase }, allocated: self.1, reserved: self.1 });
            self
        }
        fn free(&mut self, bytes: u64, before_trace: bool) -> &mut Rec {
            self.1 -= bytes;
            self.0.entries.push(Entry {
                moment: Moment::Free { bytes, before_trace },
                allocated: self.1,
                reserved: self.1,
            });
            self
        }
        /// One step: `acts` of forward activations, their gradients, an optimizer state made
        /// once (`state`) and a temporary.
        fn step(&mut self, acts: u64, state: u64, micro: u32) -> &mut Rec {
            for _ in 0..micro {
                self.alloc(acts, Phase::Forward);
                self.alloc(acts / 2, Phase::Unknown);
                self.free(acts / 2, false).free(acts, false);
            }
            if state > 0 {
                self.alloc(state, Phase::OptimizerStep);
            }
            self.alloc(8 * MIB, Phase::OptimizerStep).free(8 * MIB, false)
        }
    }

    #[test]
    fn steps_are_found_and_the_last_steady_one_used() {
        let mut r = Rec::new(0);
        r.alloc(1024 * MIB, Phase::Setup);
        r.step(100 * MIB, 2048 * MIB, 1).step(100 * MIB, 0, 1).step(100 * MIB, 0, 1);
        let s = find_steps(&r.0).unwrap();
        assert_eq!(s.construction, Some(1024 * MIB));
        assert_eq!(s.total, 3);
        assert_eq!(
            s.whole.iter().map(|w| w.kind).collect::<Vec<_>>(),
            [StepKind::First, StepKind::Steady, StepKind::Steady]
        );
        let used = s.used().unwrap();
        assert_eq!(used.number, 3);
        assert_eq!(used.start, 3072 * MIB);
        assert_eq!(used.peaks.forward, 3172 * MIB);
        assert_eq!(used.peaks.backward, 3222 * MIB);
        assert_eq!(used.peaks.optimizer_step, 3080 * MIB);
        assert_eq!(used.peak(), 3222 * MIB);
    }

    #[test]
    fn gradient_accumulation_is_one_step_of_micro_steps() {
        let mut r = Rec::new(1024 * MIB);
        r.step(100 * MIB, 0, 4).step(100 * MIB, 0, 4);
        let s = find_steps(&r.0).unwrap();
        assert_eq!(s.whole.len(), 2);
        assert!(s.whole.iter().all(|w| w.micro_steps == 4), "{s:?}");
    }

    #[test]
    fn a_ring_buffer_begins_at_its_first_whole_step() {
        // The trace begins inside a backward: it frees activations made before it.
        let mut r = Rec::new(2048 * MIB);
        r.alloc(50 * MIB, Phase::Unknown).free(50 * MIB, false).free(400 * MIB, true);
        r.alloc(8 * MIB, Phase::OptimizerStep).free(8 * MIB, false);
        r.step(400 * MIB, 0, 1);
        let s = find_steps(&r.0).unwrap();
        assert!(s.began_mid_step);
        assert_eq!((s.total, s.whole.len(), s.used().unwrap().number), (2, 1, 2));
    }

    #[test]
    fn without_a_whole_step_the_recording_is_refused_saying_what_is_missing() {
        let mut forward_only = Rec::new(1024 * MIB);
        forward_only.alloc(100 * MIB, Phase::Forward).free(100 * MIB, false);
        let e = find_steps(&forward_only.0).unwrap_err();
        assert!(e.to_string().contains("a forward without a backward"), "{e}");
        let mut no_optimizer = Rec::new(1024 * MIB);
        no_optimizer.alloc(100 * MIB, Phase::Forward).alloc(10 * MIB, Phase::Backward);
        assert!(find_steps(&no_optimizer.0).unwrap_err().to_string().contains("without an optimizer step"));
        let e = find_steps(&Recording::default()).unwrap_err();
        assert!(e.to_string().contains("allocates nothing"), "{e}");
        let mut setup_only = Rec::new(0);
        setup_only.alloc(100 * MIB, Phase::Setup).alloc(10 * MIB, Phase::DataLoading);
        let e = find_steps(&setup_only.0).unwrap_err();
        assert!(e.to_string().contains("no forward, backward or optimizer step"), "{e}");
    }

    #[test]
    fn an_oom_ends_its_step_and_is_kept() {
        let mut r = Rec::new(1024 * MIB);
        r.step(100 * MIB, 0, 1);
        r.alloc(300 * MIB, Phase::Forward);
        r.0.entries.push(Entry {
            moment: Moment::Oom { asked: 512 * MIB, device_free: Some(100 * MIB) },
            allocated: r.1,
            reserved: r.1,
        });
        let s = find_steps(&r.0).unwrap();
        assert_eq!(s.whole.len(), 1);
        let o = s.oom.unwrap();
        assert_eq!((o.step, o.phase, o.asked, o.grown), (2, Phase::Forward, 512 * MIB, 812 * MIB));
    }

    /// The recording carries every phase the frames name; the steps read an evaluation's
    /// forward as a forward, and data loading between steps as neither a step nor a phase.
    #[test]
    fn evaluation_is_a_forward_and_data_loading_no_phase() {
        let mut r = Rec::new(1024 * MIB);
        r.alloc(4 * MIB, Phase::DataLoading);
        r.alloc(100 * MIB, Phase::Evaluation).alloc(50 * MIB, Phase::Unknown).free(50 * MIB, false);
        r.free(100 * MIB, false).alloc(8 * MIB, Phase::OptimizerStep).free(8 * MIB, false);
        r.alloc(4 * MIB, Phase::DataLoading);
        r.step(100 * MIB, 0, 1);
        let s = find_steps(&r.0).unwrap();
        assert_eq!((s.total, s.whole.len(), s.construction), (2, 2, None));
        let first = s.whole[0];
        assert_eq!((first.entries.0, first.peaks.forward, first.peaks.backward), (1, 1128 * MIB, 1178 * MIB));
        // Data loading after an optimizer step begins the next step, as any allocation does.
        assert_eq!(s.whole[1].entries.0, 7);
    }

    #[test]
    fn a_step_begins_after_the_optimizer_steps_allocations() {
        let mut b = StepBoundary::default();
        let begins: Vec<bool> = [false, true, true, false, false, true, false].iter().map(|&o| b.begins(o)).collect();
        assert_eq!(begins, [false, false, false, true, false, false, true]);
    }

    #[test]
    fn a_moment_is_in_the_phase_its_last_labelled_allocation_names() {
        assert_eq!(step_phase(Phase::Unknown, Phase::Forward), Some(Phase::Backward));
        assert_eq!(step_phase(Phase::Unknown, Phase::OptimizerStep), None);
        assert_eq!(step_phase(Phase::Evaluation, Phase::Backward), Some(Phase::Forward));
        assert_eq!(step_phase(Phase::Other, Phase::Forward), None);
        assert_eq!(step_phase(Phase::OptimizerStep, Phase::Backward), Some(Phase::OptimizerStep));
    }
}
