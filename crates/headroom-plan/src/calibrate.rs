//! Calibration: the job's step program fitted to a memory snapshot of the user's own smaller
//! run, so that other batches and sequence lengths of the same job are planned from what that
//! run really allocated.
//!
//! The planner knows what transformers and `torch.optim` allocate ([`crate::builders`]); it
//! cannot know what a user's own layers keep for the backward, what their optimizer makes, or
//! what their script keeps between steps. A snapshot recorded around a few steps measures
//! exactly those. Calibrating takes three steps:
//!
//! 1. **Whole steps** ([`find_steps`]). The trace's allocations, each with the phase its
//!    frames name, are cut into steps where an optimizer step ends: before the first step the
//!    model's construction; each step a forward and a backward (several, one per
//!    gradient-accumulation micro-step) and an optimizer step. A step is whole when the trace
//!    holds its beginning and its end: not the one a ring buffer cut (its backward frees
//!    tensors made before the trace), not one that ran out of memory. The step used is the
//!    last whole steady one (the first step makes the optimizer's state; it is used only
//!    where no other step is whole, and compared with the program's first step).
//! 2. **Compare** the recorded step with the job's program at the snapshot's batch and
//!    sequence, replayed through the allocator, term by term: what lives between steps, and
//!    what each phase (forward, backward, optimizer step) grows beyond it.
//! 3. **Correct the program** ([`Calibration`]): the phase's own tensors scaled (what the
//!    layers keep per token, what the optimizer's step makes) and, where the snapshots tell the
//!    laws apart, tensors of fitted laws added (per token × sequence from two lengths; bytes
//!    that do not grow with the batch from two batches). The calibrated plan is that program
//!    replayed, so it has a reserved figure and a verdict like any other.
//!
//! What the snapshot cannot vouch for is refused, not fitted: another model (the parameters
//! it built, or what it keeps between steps, are not the plan's), another precision (the
//! same, in bytes), another checkpointing (the forward keeps several times what the plan
//! keeps). A snapshot that ends in an out-of-memory error is evidence ([`OomEvidence`]): at
//! its shape or beyond, on a device no larger than the one it had, the plan does not fit.

pub use crate::calibration::{group, made_in, Calibration, Correction, OomEvidence};
use crate::estimate::Estimator;
use crate::job::{Framework, Job, TrainConfig};
use crate::program::{Law, Phase, Program, Term};
use headroom_alloc::{AllocError, Allocation, DeviceCachingAllocator, DeviceMemory, Oom, Policy, SimDevice};
use headroom_trace::walk::{Flow, Observer, Slot, Walk};
use std::fmt;

// The recording.

/// The phase an allocation's frames name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordedPhase {
    /// Building the model, moving it to the GPU, loading weights.
    Setup,
    Forward,
    Backward,
    Optimizer,
    /// Frames that name no phase (the user's own code between the model's calls).
    Other,
    /// No frames: the autograd engine's thread when recorded with Python stacks only.
    Unknown,
}

/// What one moment of a trace did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moment {
    Alloc {
        bytes: u64,
        phase: RecordedPhase,
    },
    /// `before_trace`: the block was live when the trace began.
    Free {
        bytes: u64,
        before_trace: bool,
    },
    /// A request the allocator could not serve: the rounded bytes asked, and what the device
    /// said was free.
    Oom {
        asked: u64,
        device_free: Option<u64>,
    },
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
    pub start_allocated: u64,
    pub start_reserved: u64,
    pub entries: Vec<Entry>,
}

// Steps.

/// Whether a step made the optimizer's state (the run keeps more after it than before).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    First,
    Steady,
}

impl StepKind {
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
    pub peaks: [u64; 3],
    /// The most reserved while it ran.
    pub reserved_peak: u64,
}

impl RecordedStep {
    pub fn peak(&self) -> u64 {
        self.peaks.into_iter().fold(self.start, u64::max)
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
    /// The step calibration uses: the last whole steady step, else the last whole one.
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    Forward,
    Backward,
    Optimizer,
}

/// A step being read.
struct Open {
    first: usize,
    start: u64,
    at: At,
    forward: bool,
    backward: bool,
    optimizer: bool,
    micro: u32,
    peaks: [u64; 3],
    reserved: u64,
    /// Bytes made before the trace that its backward freed: what a step begun before the
    /// trace frees (its activations).
    freed_from_before: u64,
    /// Allocated when its optimizer step began.
    optimizer_began: Option<u64>,
    oom: bool,
}

/// The steps of `rec`. The phase of a moment is that of the last allocation whose frames
/// name one; an allocation without frames during a forward is the backward beginning (the
/// autograd engine's thread has no Python frames). A step begins at the first allocation
/// after an optimizer step's.
pub fn find_steps(rec: &Recording) -> Result<Steps, NoWholeStep> {
    let mut out = Steps::default();
    let mut open: Option<Open> = None;
    let mut closed: Vec<(Open, usize, u64)> = Vec::new();
    let mut setup: Option<u64> = None;
    let mut allocated = rec.start_allocated;
    let mut last_oom: Option<(Moment, u64, u64, usize)> = None;
    for (i, e) in rec.entries.iter().enumerate() {
        match e.moment {
            Moment::Alloc { phase, .. } => {
                let begins = match (&open, phase) {
                    (Some(o), _) => o.at == At::Optimizer && phase != RecordedPhase::Optimizer,
                    (None, RecordedPhase::Forward | RecordedPhase::Backward | RecordedPhase::Optimizer) => true,
                    (None, RecordedPhase::Unknown) => true,
                    (None, _) => false,
                };
                if open.is_none() && !begins && phase == RecordedPhase::Setup {
                    setup = Some(e.allocated.saturating_sub(rec.start_allocated));
                }
                if begins {
                    if let Some(o) = open.take() {
                        closed.push((o, i - 1, allocated));
                    }
                    open = Some(Open {
                        first: i,
                        start: allocated,
                        at: At::Forward,
                        forward: false,
                        backward: false,
                        optimizer: false,
                        micro: 0,
                        peaks: [0; 3],
                        reserved: e.reserved,
                        freed_from_before: 0,
                        optimizer_began: None,
                        oom: false,
                    });
                }
                if let Some(o) = open.as_mut() {
                    match phase {
                        RecordedPhase::Forward => {
                            if o.at != At::Forward || !o.forward {
                                o.micro += 1;
                            }
                            o.at = At::Forward;
                            o.forward = true;
                        }
                        RecordedPhase::Backward => {
                            o.at = At::Backward;
                            o.backward = true;
                        }
                        RecordedPhase::Unknown if o.at == At::Forward => {
                            o.at = At::Backward;
                            o.backward = true;
                        }
                        RecordedPhase::Optimizer => {
                            if o.optimizer_began.is_none() {
                                o.optimizer_began = Some(allocated);
                            }
                            o.at = At::Optimizer;
                            o.optimizer = true;
                        }
                        _ => {}
                    }
                }
            }
            Moment::Free { bytes, before_trace } => {
                if let Some(o) = open.as_mut() {
                    if before_trace && o.at == At::Backward {
                        o.freed_from_before += bytes;
                    }
                }
            }
            Moment::Oom { .. } => {
                if let Some(o) = open.as_mut() {
                    o.oom = true;
                }
                last_oom = Some((e.moment, e.allocated, e.reserved, closed.len()));
            }
        }
        allocated = e.allocated;
        if let Some(o) = open.as_mut() {
            let k = match o.at {
                At::Forward => 0,
                At::Backward => 1,
                At::Optimizer => 2,
            };
            o.peaks[k] = o.peaks[k].max(e.allocated);
            o.reserved = o.reserved.max(e.reserved);
        }
    }
    if let Some(o) = open.take() {
        closed.push((o, rec.entries.len().saturating_sub(1), allocated));
    }
    // What the construction left live when the first step began (a model built in fp32 and
    // cast peaks above what it keeps).
    out.construction =
        setup.map(|_| closed.first().map_or(allocated, |c| c.0.start).saturating_sub(rec.start_allocated));
    out.total = closed.len() as u32;
    if rec.entries.iter().all(|e| !matches!(e.moment, Moment::Alloc { .. })) {
        return Err(NoWholeStep("it allocates nothing".into()));
    }
    let mut missing: Vec<&str> = Vec::new();
    for (k, (o, last, end)) in closed.iter().enumerate() {
        let number = k as u32 + 1;
        let forward_grew = o.peaks[0].saturating_sub(o.start);
        // The first step read began with the trace: whole only if the trace holds its
        // beginning. Its backward freeing what was made before the trace (the forward's
        // activations) says the trace began inside it.
        if k == 0 && setup.is_none() && o.freed_from_before > forward_grew / 20 {
            out.began_mid_step = true;
            missing.push("the first step began before the trace");
            continue;
        }
        if o.oom {
            missing.push("a step ran out of memory");
            continue;
        }
        if !(o.forward && o.backward && o.optimizer) {
            missing.push(match (o.forward, o.backward, o.optimizer) {
                (false, _, _) => "a step without a forward",
                (true, false, _) => "a forward without a backward",
                (true, true, false) => "a backward without an optimizer step",
                _ => "a step cut short",
            });
            continue;
        }
        // Its optimizer step left more live than it found, by more than rounding: it made the
        // optimizer's state. (What the step as a whole leaves says less: a script that zeroes
        // the gradients at a step's start keeps them from one step to the next.)
        let made = o.optimizer_began.map_or(0, |b| end.saturating_sub(b));
        let first = made > o.start / 20 + (16 << 20);
        out.whole.push(RecordedStep {
            number,
            kind: if first { StepKind::First } else { StepKind::Steady },
            micro_steps: o.micro.max(1),
            entries: (o.first, *last),
            start: o.start,
            end: *end,
            peaks: [o.peaks[0].max(o.start), o.peaks[1].max(o.start), o.peaks[2].max(o.start)],
            reserved_peak: o.reserved,
        });
    }
    if let Some((Moment::Oom { asked, device_free }, allocated, reserved, step)) = last_oom {
        let o = closed.get(step).map(|c| &c.0);
        out.oom = Some(RecordedOom {
            step: step as u32 + 1,
            phase: match o.map(|o| o.at) {
                Some(At::Backward) => Phase::Backward,
                Some(At::Optimizer) => Phase::Optimizer,
                _ => Phase::Forward,
            },
            asked,
            device_free,
            allocated,
            reserved,
            grown: (allocated + asked).saturating_sub(o.map_or(rec.start_allocated, |o| o.start)),
        });
    }
    if out.whole.is_empty() && out.oom.is_none() {
        missing.dedup();
        let what =
            if closed.is_empty() { "no forward, backward or optimizer step".to_string() } else { missing.join("; ") };
        return Err(NoWholeStep(what));
    }
    Ok(out)
}

// The fit.

/// One snapshot: the shape it ran and its steps.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub name: String,
    pub batch: u64,
    pub seq: u64,
    pub steps: Steps,
}

/// A step's figures: allocated when it began and at each phase's peak, and the reserved peak.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Figures {
    pub start: f64,
    pub forward: f64,
    pub backward: f64,
    pub optimizer: f64,
    pub reserved: f64,
}

impl Figures {
    pub fn peak(&self) -> f64 {
        self.start.max(self.forward).max(self.backward).max(self.optimizer)
    }

    fn of(s: &RecordedStep) -> Figures {
        Figures {
            start: s.start as f64,
            forward: s.peaks[0] as f64,
            backward: s.peaks[1] as f64,
            optimizer: s.peaks[2] as f64,
            reserved: s.reserved_peak as f64,
        }
    }
}

/// One fitted term: what the recorded step held and what the program held, per snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct FittedTerm {
    /// "kept between steps", "forward", "backward", "optimizer step".
    pub name: &'static str,
    pub recorded: Vec<f64>,
    /// The uncalibrated program's.
    pub planned: Vec<f64>,
    pub correction: Correction,
}

/// A snapshot as the fit used it.
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotFit {
    pub name: String,
    pub batch: u64,
    pub seq: u64,
    /// The step used, `None` where only the OOM was used.
    pub step: Option<RecordedStep>,
    pub steps_found: u32,
    pub whole_steps: usize,
    pub construction: Option<u64>,
    pub began_mid_step: bool,
    pub oom: Option<RecordedOom>,
    pub recorded: Option<Figures>,
    pub uncalibrated: Option<Figures>,
    pub calibrated: Option<Figures>,
    /// Why the step was not fitted, where it was not.
    pub note: Option<String>,
}

/// A calibration and what it was fitted from.
#[derive(Clone, Debug, PartialEq)]
pub struct Fit {
    pub calibration: Calibration,
    pub snapshots: Vec<SnapshotFit>,
    pub terms: Vec<FittedTerm>,
}

impl Fit {
    /// The largest relative error of the calibrated step against the recorded one, allocated
    /// peak and reserved peak, over the snapshots fitted.
    pub fn residual(&self) -> (f64, f64) {
        self.snapshots.iter().fold((0.0f64, 0.0f64), |(a, r), s| match (s.recorded, s.calibrated) {
            (Some(m), Some(c)) => (a.max(rel(c.peak(), m.peak()).abs()), r.max(rel(c.reserved, m.reserved).abs())),
            _ => (a, r),
        })
    }
}

fn rel(x: f64, of: f64) -> f64 {
    if of == 0.0 {
        0.0
    } else {
        (x - of) / of
    }
}

/// Why the snapshots cannot calibrate the plan.
#[derive(Clone, Debug, PartialEq)]
pub enum CalibrationError {
    /// The configuration's step is not one replica's (Megatron's layers, sharded states).
    NoPhaseModel,
    /// The snapshot's model is not the plan's: what it built or keeps is not what the plan
    /// holds.
    AnotherModel { snapshot: String, what: &'static str, recorded: f64, planned: f64 },
    /// The forward keeps far more or less than the plan's at that shape.
    ShapeMismatch { snapshot: String, phase: &'static str, scale: f64 },
    /// Nothing to fit: every snapshot's steps ran shapes the snapshot does not tell.
    NothingToFit(String),
    /// Two snapshots disagree about one job: at one shape they grow by different amounts, or
    /// the one said to run longer sequences grows by less.
    Contradictory(String),
    /// A snapshot's shape is not one the job can run.
    Shape { snapshot: String, why: String },
}

/// How far two snapshots of one job at one shape may differ in what their forward adds
/// before they are taken for different jobs (or shapes given wrongly). Runs of one job at one
/// shape make the same tensors; the allocator's rounding moves the peak by far less.
const SAME_SHAPE_TOLERANCE: f64 = 0.05;

/// How far a phase's own tensors may be scaled. transformers' recorded steps are within a few
/// percent of a GPU's; a user's own layers within tens of percent. Twice more or less is
/// another job: checkpointing (the plan's checkpointed forward keeps a third of what the
/// run's uncheckpointed one does), another precision, or another batch or sequence than the
/// one given.
pub const MAX_SCALE: f64 = 2.0;

/// A difference between the recorded step and the program smaller than this share of the
/// recorded peak is left alone: block rounding and the allocator's remainders differ by that
/// much, and a correction of odd size changes how blocks are reused (reserved memory) for
/// nothing.
const DEADBAND: f64 = 0.002;

/// How far what the run keeps between steps may be from the plan's before the snapshot is
/// taken for another model's.
const KEPT_TOLERANCE: f64 = 0.2;

impl fmt::Display for CalibrationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gib = |x: f64| x / (1u64 << 30) as f64;
        match self {
            CalibrationError::NoPhaseModel => f.write_str(
                "calibration fits the step of one model replica per GPU, which this configuration is not planned as \
                 (--framework hf plans them: one GPU, full fine-tuning, no offload)",
            ),
            CalibrationError::AnotherModel { what, recorded, planned, .. } => write!(
                f,
                "{what} {:.2} GiB where this plan's job has {:.2} GiB: a snapshot of another model, \
                 precision or optimizer than the plan's cannot calibrate it (check --model, --precision, --optimizer)",
                gib(*recorded),
                gib(*planned)
            ),
            CalibrationError::ShapeMismatch { phase, scale, .. } => write!(
                f,
                "its {phase} holds {scale:.2}× what the plan's program holds at that batch and sequence \
                 (a calibration may scale it between 1/{MAX_SCALE} and {MAX_SCALE}×): another checkpointing or \
                 precision than the plan's, or another shape (check --calibrate-batch and --calibrate-seq)"
            ),
            CalibrationError::NothingToFit(why) | CalibrationError::Contradictory(why) => f.write_str(why),
            CalibrationError::Shape { snapshot, why } => {
                write!(f, "{snapshot}: its shape (--calibrate-batch, --calibrate-seq): {why}")
            }
        }
    }
}

impl std::error::Error for CalibrationError {}

/// The program's figures at one shape, and the bytes of each correctable group at each
/// phase's peak.
#[derive(Clone, Copy, Debug, Default)]
struct Measured {
    figures: Figures,
    /// At the forward, backward and optimizer peaks: the bytes of the group that phase scales.
    scaled: [f64; 3],
    /// The optimizer state live when the step began.
    state: f64,
}

/// Replays `p` at `(b, s)` through PyTorch's allocator on an unbounded device and reads step
/// `step`'s figures.
fn measure(p: &Program, b: u64, s: u64, step: u32, est: &Estimator) -> Measured {
    let sizes = p.sizes(b, s);
    let made = made_in(p);
    let groups: Vec<Option<usize>> = p.tensors.iter().zip(&made).map(|(t, &m)| group(t, m)).collect();
    let device = SimDevice::new(1u64 << 50);
    let mut alloc = DeviceCachingAllocator::with_policy(device, est.alloc.clone(), est.policy.build());
    let mut m = Measuring {
        groups,
        step,
        at_step: 0,
        phase: Phase::Setup,
        started: false,
        live: [0; 4],
        total: 0,
        out: Measured::default(),
    };
    // An unbounded device runs out of nothing, and a checked program makes no other mistake.
    let _ = Walk::with_slots(p.tensors.len()).run(&mut alloc, crate::replay::walk_ops(p, &sizes), &mut m);
    m.out
}

/// What [`measure`] watches: the bytes of each correctable group, and the step's figures.
struct Measuring {
    groups: Vec<Option<usize>>,
    step: u32,
    at_step: u32,
    phase: Phase,
    started: bool,
    live: [u64; 4],
    total: u64,
    out: Measured,
}

impl Measuring {
    /// The phase's peak so far, if the walk is in the step measured.
    fn note(&mut self) {
        if self.at_step != self.step {
            return;
        }
        let k = match self.phase {
            Phase::Forward => 0,
            Phase::Backward => 1,
            Phase::Optimizer => 2,
            Phase::Setup => return,
        };
        let out = &mut self.out;
        let peak = [&mut out.figures.forward, &mut out.figures.backward, &mut out.figures.optimizer];
        if self.total as f64 >= *peak[k] {
            *peak[k] = self.total as f64;
            out.scaled[k] = self.live[k] as f64;
        }
    }
}

impl<D: DeviceMemory, P: Policy> Observer<D, P> for Measuring {
    type Mark = (u32, Phase);

    fn mark(
        &mut self,
        _: usize,
        (st, ph): (u32, Phase),
        _: &mut DeviceCachingAllocator<D, P>,
    ) -> Result<(), AllocError> {
        (self.at_step, self.phase) = (st, ph);
        if st == self.step && !self.started && ph != Phase::Setup {
            self.started = true;
            self.out.figures.start = self.total as f64;
            self.out.state = self.live[3] as f64;
        }
        self.note();
        Ok(())
    }

    fn allocated(&mut self, _: usize, t: Slot, block: Allocation, alloc: &DeviceCachingAllocator<D, P>) {
        self.total += block.size;
        if let Some(g) = self.groups[t as usize] {
            self.live[g] += block.size;
        }
        self.note();
        // `max_memory_reserved` when the step ends: the run up to it, not the steps after.
        if self.at_step <= self.step {
            self.out.figures.reserved = self.out.figures.reserved.max(alloc.reserved_bytes() as f64);
        }
    }

    fn freed(&mut self, _: usize, t: Slot, block: Allocation) {
        self.total -= block.size;
        if let Some(g) = self.groups[t as usize] {
            self.live[g] -= block.size;
        }
    }

    fn failed(&mut self, _: usize, _: Slot, _: Oom, _: &DeviceCachingAllocator<D, P>) -> Flow {
        Flow::Continue
    }
}

/// A basis function of a fitted law at a shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Basis {
    Fixed,
    PerToken,
    PerTokenPosition,
}

impl Basis {
    fn at(self, b: f64, s: f64) -> f64 {
        match self {
            Basis::Fixed => 1.0,
            Basis::PerToken => b * s,
            Basis::PerTokenPosition => b * s * s,
        }
    }

    fn law(self, c: f64) -> Law {
        match self {
            Basis::Fixed => Law::fixed(c),
            Basis::PerToken => Law::per_token(c),
            Basis::PerTokenPosition => Law { per_token_position: c, ..Law::default() },
        }
    }
}

/// Least squares of `y ≈ x₀·scaled + Σ cⱼ·basisⱼ` with every cⱼ ≥ 0 (added tensors cannot be
/// negative) and `x₀` free where `scaled` is given: each subset of the bases is solved and
/// the best that keeps its coefficients non-negative taken.
fn fit_law(points: &[(f64, f64, f64, f64)], scaled: bool, bases: &[Basis]) -> (f64, Vec<f64>) {
    // points: (b, s, scaled bytes, y).
    let n = bases.len();
    let mut best: Option<(f64, f64, Vec<f64>)> = None;
    for mask in 0u32..(1 << n) {
        let chosen: Vec<usize> = (0..n).filter(|j| mask & (1 << j) != 0).collect();
        let cols = chosen.len() + scaled as usize;
        if cols == 0 || cols > points.len() {
            continue;
        }
        let row = |&(b, s, sc, _): &(f64, f64, f64, f64)| -> Vec<f64> {
            let mut r = Vec::with_capacity(cols);
            if scaled {
                r.push(sc);
            }
            r.extend(chosen.iter().map(|&j| bases[j].at(b, s)));
            r
        };
        let rows: Vec<Vec<f64>> = points.iter().map(row).collect();
        let y: Vec<f64> = points.iter().map(|p| p.3).collect();
        let Some(x) = least_squares(&rows, &y) else { continue };
        let offset = scaled as usize;
        if x[offset..].iter().any(|&c| c < 0.0) {
            continue;
        }
        let err: f64 =
            rows.iter().zip(&y).map(|(r, y)| (r.iter().zip(&x).map(|(a, b)| a * b).sum::<f64>() - y).powi(2)).sum();
        // Fewer terms win a tie: a law is added only where it explains something.
        let err = err * (1.0 + 1e-9 * cols as f64);
        if best.as_ref().is_none_or(|b| err < b.0) {
            let mut cs = vec![0.0; n];
            for (k, &j) in chosen.iter().enumerate() {
                cs[j] = x[offset + k];
            }
            best = Some((err, if scaled { x[0] } else { 0.0 }, cs));
        }
    }
    best.map_or((0.0, vec![0.0; n]), |(_, x0, cs)| (x0, cs))
}

/// Solves the normal equations by Gaussian elimination; `None` when singular.
fn least_squares(rows: &[Vec<f64>], y: &[f64]) -> Option<Vec<f64>> {
    let n = rows.first()?.len();
    // Columns scaled to unit size: bytes, tokens and tokens² differ by many orders.
    let norms: Vec<f64> = (0..n)
        .map(|j| rows.iter().map(|r| r[j] * r[j]).sum::<f64>().sqrt())
        .map(|v| if v > 0.0 { v } else { 1.0 })
        .collect();
    let mut a = vec![vec![0.0; n + 1]; n];
    for (r, &yv) in rows.iter().zip(y) {
        for i in 0..n {
            for j in 0..n {
                a[i][j] += r[i] / norms[i] * r[j] / norms[j];
            }
            a[i][n] += r[i] / norms[i] * yv;
        }
    }
    for c in 0..n {
        let p = (c..n).max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs()))?;
        if a[p][c].abs() < 1e-9 {
            return None;
        }
        a.swap(c, p);
        let pivot = a[c].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != c {
                let k = row[c] / pivot[c];
                for (x, p) in row.iter_mut().zip(&pivot).skip(c) {
                    *x -= k * p;
                }
            }
        }
    }
    Some((0..n).map(|i| a[i][n] / a[i][i] / norms[i]).collect())
}

/// A snapshot fitted: its program, batch and sequence, the program's step compared, the
/// recorded step's figures, and its index among the snapshots.
type Used = (Program, u64, u64, u32, Figures, usize);

/// Fits `cfg`'s program to the snapshots. `est` is the estimator the plan replays with (its
/// allocator settings and steps); its own calibration is ignored.
pub fn calibrate(job: &Job, est: &Estimator, snapshots: &[Snapshot]) -> Result<Fit, CalibrationError> {
    let cfg = &job.train;
    let runs_transformers = crate::builders::runner(job)
        .is_ok_and(|(r, _)| r.builder.framework() == Framework::HuggingFace && r.builder.transformers_code(job));
    if !runs_transformers || cfg.parallel.gpus() > 1 {
        return Err(CalibrationError::NoPhaseModel);
    }
    let plain = Estimator { calibration: None, ..est.clone() };
    let mut fits: Vec<SnapshotFit> = Vec::new();
    let mut evidence: Option<OomEvidence> = None;
    // Per fitted snapshot: its program, shape, the program's step to compare, and the record.
    let mut used: Vec<Used> = Vec::new();
    for snap in snapshots {
        let (fit, u) = read_snapshot(job, &plain, snap, fits.len(), &mut evidence)?;
        used.extend(u);
        fits.push(fit);
    }
    if used.is_empty() && evidence.is_none() {
        return Err(CalibrationError::NothingToFit("no snapshot holds a whole step to fit".into()));
    }
    contradictions(&used, &fits)?;
    let mut cal = Calibration { oom: evidence, ..Calibration::default() };
    if !used.is_empty() {
        fit_corrections(&mut cal, &used, &plain);
        let scale = cal.forward.scale;
        if !(1.0 / MAX_SCALE..=MAX_SCALE).contains(&scale) {
            let name = used.first().map_or(String::new(), |u| fits[u.5].name.clone());
            return Err(CalibrationError::ShapeMismatch { snapshot: name, phase: "forward", scale });
        }
    }
    let terms = report(&cal, &used, &mut fits, &plain);
    Ok(Fit { calibration: cal, snapshots: fits, terms })
}

/// One snapshot as the fit uses it: its record, and the step to fit with the program at its
/// shape, where it has one; its out-of-memory error joins `evidence`.
fn read_snapshot(
    job: &Job,
    plain: &Estimator,
    snap: &Snapshot,
    index: usize,
    evidence: &mut Option<OomEvidence>,
) -> Result<(SnapshotFit, Option<Used>), CalibrationError> {
    let cfg = &job.train;
    let mut used = None;
    let st = &snap.steps;
    let mut fit = SnapshotFit {
        name: snap.name.clone(),
        batch: snap.batch,
        seq: snap.seq,
        step: None,
        steps_found: st.total,
        whole_steps: st.whole.len(),
        construction: st.construction,
        began_mid_step: st.began_mid_step,
        oom: st.oom,
        recorded: None,
        uncalibrated: None,
        calibrated: None,
        note: None,
    };
    let mut step = st.used().copied();
    if let (Some(s), Some(o)) = (step, st.oom) {
        // The shape given is the run's last: the OOM's. A step before it that grew much less
        // in its forward ran a smaller shape, which the snapshot does not tell.
        let grown = s.peaks[0].saturating_sub(s.start);
        if o.grown as f64 > 1.15 * grown as f64 {
            fit.note = Some(format!(
                "its whole steps ran a smaller shape than the one that ran out of memory (step {}'s forward grew \
                 {:.2} GiB, step {}'s {:.2} GiB before it failed): not fitted",
                s.number,
                gib(grown as f64),
                o.step,
                gib(o.grown as f64)
            ));
            step = None;
        }
    }
    if let Some(o) = st.oom {
        // What PyTorch could have had: what it held, and less than the request beyond.
        let capacity = o.reserved + o.device_free.unwrap_or(o.asked).min(o.asked.saturating_sub(1));
        let e = OomEvidence {
            batch: snap.batch,
            seq: snap.seq,
            asked: o.asked,
            device_free: o.device_free,
            allocated: o.allocated,
            reserved: o.reserved,
            capacity,
            phase: o.phase,
        };
        // The smallest shape that ran out is the strongest evidence.
        let tokens = |e: &OomEvidence| e.batch as u128 * e.seq as u128;
        if evidence.is_none_or(|old| tokens(&e) < tokens(&old)) {
            *evidence = Some(e);
        }
    }
    if let Some(s) = step {
        let at = TrainConfig { micro_batch: snap.batch, seq: snap.seq, accumulation: s.micro_steps as u64, ..*cfg };
        let at = job.with(at).map_err(|e| CalibrationError::Shape { snapshot: snap.name.clone(), why: e.0 })?;
        let program = plain
            .estimate(&at)
            .map_err(|e| CalibrationError::Shape { snapshot: snap.name.clone(), why: e.to_string() })?
            .program;
        let compared = if s.kind == StepKind::First { 1 } else { plain.steps.max(2) };
        let rec = Figures::of(&s);
        let m = measure(&program, snap.batch, snap.seq, compared, plain);
        // Another model: the parameters it built, or what it keeps between steps.
        let weights: f64 = weights_of(&program, snap.batch, snap.seq);
        if let Some(built) = st.construction {
            if weights > 0.0 && (built as f64 / weights - 1.0).abs() > 0.1 {
                return Err(CalibrationError::AnotherModel {
                    snapshot: snap.name.clone(),
                    what: "the model it built holds",
                    recorded: built as f64,
                    planned: weights,
                });
            }
        }
        if m.figures.start > 0.0 && (rec.start / m.figures.start - 1.0).abs() > KEPT_TOLERANCE {
            return Err(CalibrationError::AnotherModel {
                snapshot: snap.name.clone(),
                what: "the run keeps between steps",
                recorded: rec.start,
                planned: m.figures.start,
            });
        }
        fit.step = Some(s);
        fit.recorded = Some(rec);
        fit.uncalibrated = Some(m.figures);
        used = Some(((*program).clone(), snap.batch, snap.seq, compared, rec, index));
    } else if fit.note.is_none() && st.oom.is_some() {
        fit.note = Some("no whole step before its OOM: the OOM alone is used".into());
    }
    Ok((fit, used))
}

/// The corrections, fitted in two passes: what lives between steps, then each phase's growth
/// beyond the step's start in order (what one phase keeps moves the next).
fn fit_corrections(cal: &mut Calibration, used: &[Used], plain: &Estimator) {
    let distinct = |f: fn(&Used) -> u64| {
        let mut v: Vec<u64> = used.iter().map(f).collect();
        v.sort_unstable();
        v.dedup();
        v.len()
    };
    let (seqs, batches) = (distinct(|u| u.2), distinct(|u| u.1));
    // What each phase may add besides scaling its own tensors: per token × sequence where
    // two lengths tell it from per token, bytes that do not grow with the batch where two
    // batches tell them apart.
    let mut phase_bases = Vec::new();
    if seqs >= 2 {
        phase_bases.push(Basis::PerTokenPosition);
    }
    if batches >= 2 {
        phase_bases.push(Basis::Fixed);
    }
    let kept_bases: Vec<Basis> = if batches >= 2 { vec![Basis::Fixed, Basis::PerToken] } else { vec![Basis::Fixed] };
    for _pass in 0..2 {
        fit_kept(cal, used, plain, &kept_bases);
        for k in 0..3 {
            fit_phase(cal, used, plain, &phase_bases, k);
        }
    }
}

fn measure_all(cal: &Calibration, used: &[Used], plain: &Estimator) -> Vec<Measured> {
    used.iter().map(|(p, b, s, step, _, _)| measure(&cal.apply_program(p), *b, *s, *step, plain)).collect()
}

/// What lives between steps: bytes added where the run keeps more, the optimizer's state
/// scaled where it keeps less.
fn fit_kept(cal: &mut Calibration, used: &[Used], plain: &Estimator, bases: &[Basis]) {
    // What lives between steps.
    let m = measure_all(cal, used, plain);
    let pts: Vec<(f64, f64, f64, f64)> =
        used.iter().zip(&m).map(|(u, m)| (u.1 as f64, u.2 as f64, m.state, u.4.start - m.figures.start)).collect();
    // Differences within rounding are no evidence: left as planned.
    if pts.iter().any(|p| p.3.abs() > DEADBAND * used[0].4.start) {
        let (_, cs) = fit_law(&pts, false, bases);
        let add = bases.iter().zip(&cs).fold(Law::default(), |l, (b, &c)| add_law(l, b.law(c)));
        cal.kept.law = add_law(cal.kept.law, add);
        // Less kept than planned: the optimizer's state is what a script most often keeps
        // less of (another optimizer's, or none yet).
        let short: Vec<(f64, f64, f64, f64)> = pts.iter().map(|p| (p.0, p.1, p.2, p.3.min(0.0))).collect();
        if short.iter().any(|p| p.3 < 0.0 && p.2 > 0.0) {
            let (x0, _) = fit_law(&short, true, &[]);
            cal.kept.scale = (cal.kept.scale * (1.0 + x0)).max(0.0);
        }
    }
}

/// Phase `k`'s growth beyond the step's start (0 forward, 1 backward, 2 optimizer step): its own
/// tensors scaled where they are a good part of it, tensors of the bases added.
fn fit_phase(cal: &mut Calibration, used: &[Used], plain: &Estimator, phase_bases: &[Basis], k: usize) {
    let m = measure_all(cal, used, plain);
    let pts: Vec<(f64, f64, f64, f64)> = used
        .iter()
        .zip(&m)
        .map(|(u, m)| {
            let (rec, plan) = match k {
                0 => (u.4.forward, m.figures.forward),
                1 => (u.4.backward, m.figures.backward),
                _ => (u.4.optimizer, m.figures.optimizer),
            };
            (u.1 as f64, u.2 as f64, m.scaled[k], (rec - u.4.start) - (plan - m.figures.start))
        })
        .collect();
    // A phase's own tensors are scaled only where they are a good part of what it
    // grew by: scaling a few hundred megabytes to explain a difference elsewhere
    // would scale them wrongly where they are most of the phase (the backward's
    // gradients of the logits at a long sequence).
    let scalable = used.iter().zip(&m).all(|(u, m)| {
        let grew = match k {
            0 => m.figures.forward,
            1 => m.figures.backward,
            _ => m.figures.optimizer,
        } - m.figures.start;
        let _ = u;
        m.scaled[k] > 0.25 * grew.max(0.0)
    });
    // Differences within rounding are no evidence: left as planned.
    let small = pts.iter().all(|p| p.3.abs() <= DEADBAND * used[0].4.peak());
    if small {
        return;
    }
    let bases: Vec<Basis> =
        if scalable { phase_bases.to_vec() } else { vec![if k == 2 { Basis::Fixed } else { Basis::PerToken }] };
    let (x0, cs) = fit_law(&pts, scalable, &bases);
    let c = cal.phase_mut(k);
    if scalable {
        // The forward's own tensors are what the layers keep: any scale within bounds
        // (beyond them the job is another, refused below); the optimizer's are its
        // temporaries, which another implementation may not make at all. The
        // backward's peak holds little of its own beside what the forward kept and the
        // gradients: at most half of that is taken away, the rest left as the fit's
        // residual.
        let x0 = if k == 1 { x0.max(-0.5) } else { x0 };
        c.scale = (c.scale * (1.0 + x0)).max(0.0);
    }
    c.law = bases.iter().zip(&cs).fold(c.law, |l, (b, &v)| add_law(l, b.law(v)));
}

/// The report: each snapshot's step as the calibrated program holds it, and each term
/// recorded, planned (uncalibrated) and its correction.
fn report(cal: &Calibration, used: &[Used], fits: &mut [SnapshotFit], plain: &Estimator) -> Vec<FittedTerm> {
    let calibrated = measure_all(cal, used, plain);
    for (u, m) in used.iter().zip(&calibrated) {
        fits[u.5].calibrated = Some(m.figures);
    }
    let recorded_of = |f: &dyn Fn(&Figures) -> f64| -> Vec<f64> { used.iter().map(|u| f(&u.4)).collect() };
    let planned_of = |f: &dyn Fn(&Figures) -> f64| -> Vec<f64> {
        used.iter().map(|u| fits[u.5].uncalibrated.map_or(0.0, |p| f(&p))).collect()
    };
    vec![
        FittedTerm {
            name: "kept between steps",
            recorded: recorded_of(&|f| f.start),
            planned: planned_of(&|f| f.start),
            correction: cal.kept,
        },
        FittedTerm {
            name: "forward",
            recorded: recorded_of(&|f| f.forward - f.start),
            planned: planned_of(&|f| f.forward - f.start),
            correction: cal.forward,
        },
        FittedTerm {
            name: "backward",
            recorded: recorded_of(&|f| f.backward - f.start),
            planned: planned_of(&|f| f.backward - f.start),
            correction: cal.backward,
        },
        FittedTerm {
            name: "optimizer step",
            recorded: recorded_of(&|f| f.optimizer - f.start),
            planned: planned_of(&|f| f.optimizer - f.start),
            correction: cal.optimizer,
        },
    ]
}

/// Refuses snapshots that cannot all be the plan's job at the shapes given: two at one shape
/// whose forwards add different amounts, or, at one batch, a longer sequence adding less.
fn contradictions(used: &[Used], fits: &[SnapshotFit]) -> Result<(), CalibrationError> {
    let grew = |u: &Used| u.4.forward - u.4.start;
    for (i, a) in used.iter().enumerate() {
        for b in &used[i + 1..] {
            // The file names: the command line already lists each snapshot with its shape.
            let name = |u: &Used| {
                let n = &fits[u.5].name;
                n.rsplit(['/', '\\']).next().unwrap_or(n).to_string()
            };
            let (na, nb) = (name(a), name(b));
            let (ga, gb) = (grew(a), grew(b));
            if (a.1, a.2) == (b.1, b.2) {
                if (ga - gb).abs() > SAME_SHAPE_TOLERANCE * ga.max(gb) {
                    return Err(CalibrationError::Contradictory(format!(
                        "{na} and {nb} are both said to run {} × {} tokens, but their forwards add \
                         {:.2} and {:.2} GiB: runs of one job at one shape make the same tensors (check \
                         --calibrate-batch and --calibrate-seq, given in the order of --calibrate)",
                        a.1,
                        a.2,
                        gib(ga),
                        gib(gb)
                    )));
                }
            } else if a.1 == b.1 && a.2 != b.2 {
                let (short, long) = if a.2 < b.2 { ((na, a), (nb, b)) } else { ((nb, b), (na, a)) };
                if grew(long.1) < grew(short.1) * (1.0 - SAME_SHAPE_TOLERANCE) {
                    return Err(CalibrationError::Contradictory(format!(
                        "{} is said to run {} tokens and {} {}, but its forward adds {:.2} GiB against \
                         {:.2}: a longer sequence keeps more (check --calibrate-seq, given in the order of --calibrate)",
                        long.0,
                        long.1 .2,
                        short.0,
                        short.1 .2,
                        gib(grew(long.1)),
                        gib(grew(short.1))
                    )));
                }
            }
        }
    }
    Ok(())
}

fn gib(x: f64) -> f64 {
    x / (1u64 << 30) as f64
}

fn add_law(a: Law, b: Law) -> Law {
    Law {
        fixed: a.fixed + b.fixed,
        per_token: a.per_token + b.per_token,
        per_token_position: a.per_token_position + b.per_token_position,
        per_sequence: a.per_sequence + b.per_sequence,
        per_position: a.per_position + b.per_position,
        per_position_square: a.per_position_square + b.per_position_square,
    }
}

/// The weights the program builds.
fn weights_of(p: &Program, b: u64, s: u64) -> f64 {
    let sizes = p.sizes(b, s);
    p.tensors.iter().zip(&sizes).filter(|(t, _)| t.term == Term::Weights).map(|(_, &n)| n as f64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A recording built moment by moment.
    struct Rec(Recording, u64);

    impl Rec {
        fn new(start: u64) -> Rec {
            Rec(Recording { start_allocated: start, start_reserved: start, entries: Vec::new() }, start)
        }
        fn alloc(&mut self, bytes: u64, phase: RecordedPhase) -> &mut Rec {
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
                self.alloc(acts, RecordedPhase::Forward);
                self.alloc(acts / 2, RecordedPhase::Unknown);
                self.free(acts / 2, false).free(acts, false);
            }
            if state > 0 {
                self.alloc(state, RecordedPhase::Optimizer);
            }
            self.alloc(8 * MIB, RecordedPhase::Optimizer).free(8 * MIB, false)
        }
    }

    #[test]
    fn steps_are_found_and_the_last_steady_one_used() {
        let mut r = Rec::new(0);
        r.alloc(1024 * MIB, RecordedPhase::Setup);
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
        assert_eq!(used.peaks[0], 3172 * MIB);
        assert_eq!(used.peaks[1], 3222 * MIB);
        assert_eq!(used.peaks[2], 3080 * MIB);
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
        r.alloc(50 * MIB, RecordedPhase::Unknown).free(50 * MIB, false).free(400 * MIB, true);
        r.alloc(8 * MIB, RecordedPhase::Optimizer).free(8 * MIB, false);
        r.step(400 * MIB, 0, 1);
        let s = find_steps(&r.0).unwrap();
        assert!(s.began_mid_step);
        assert_eq!((s.total, s.whole.len(), s.used().unwrap().number), (2, 1, 2));
    }

    #[test]
    fn without_a_whole_step_the_recording_is_refused_saying_what_is_missing() {
        let mut forward_only = Rec::new(1024 * MIB);
        forward_only.alloc(100 * MIB, RecordedPhase::Forward).free(100 * MIB, false);
        let e = find_steps(&forward_only.0).unwrap_err();
        assert!(e.to_string().contains("a forward without a backward"), "{e}");
        let mut no_optimizer = Rec::new(1024 * MIB);
        no_optimizer.alloc(100 * MIB, RecordedPhase::Forward).alloc(10 * MIB, RecordedPhase::Backward);
        assert!(find_steps(&no_optimizer.0).unwrap_err().to_string().contains("without an optimizer step"));
        let e = find_steps(&Recording::default()).unwrap_err();
        assert!(e.to_string().contains("allocates nothing"), "{e}");
    }

    #[test]
    fn an_oom_ends_its_step_and_is_kept() {
        let mut r = Rec::new(1024 * MIB);
        r.step(100 * MIB, 0, 1);
        r.alloc(300 * MIB, RecordedPhase::Forward);
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

    #[test]
    fn the_law_fit_keeps_added_tensors_non_negative() {
        // y = −0.1·scaled + 2·b·s²: the scale may fall, the added law may not.
        let pts: Vec<_> = [(1.0, 100.0), (1.0, 200.0)]
            .iter()
            .map(|&(b, s): &(f64, f64)| (b, s, 1000.0 * b * s, -0.1 * 1000.0 * b * s + 2.0 * b * s * s))
            .collect();
        let (x0, cs) = fit_law(&pts, true, &[Basis::PerTokenPosition]);
        assert!((x0 + 0.1).abs() < 1e-9 && (cs[0] - 2.0).abs() < 1e-9, "{x0} {cs:?}");
        // Where the only fit wants a negative added law, it is left out.
        let pts: Vec<_> = pts.iter().map(|p| (p.0, p.1, p.2, -3.0 * p.0 * p.1 * p.1)).collect();
        let (_, cs) = fit_law(&pts, true, &[Basis::PerTokenPosition]);
        assert_eq!(cs[0], 0.0);
    }
}
