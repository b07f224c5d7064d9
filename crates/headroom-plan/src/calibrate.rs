//! Calibration: the job's step program fitted to a memory snapshot of the user's own smaller
//! run, so that other batches and sequence lengths of the same job are planned from what that
//! run really allocated.
//!
//! The planner knows what transformers and `torch.optim` allocate ([`crate::builders`]); it
//! cannot know what a user's own layers keep for the backward, what their optimizer makes, or
//! what their script keeps between steps. A snapshot recorded around a few steps measures
//! exactly those. Calibrating takes three steps:
//!
//! 1. **Whole steps** (`headroom_trace::recorded_step::find_steps`, each [`Snapshot`]'s
//!    `steps`). The trace's allocations, each with the phase its frames name, are cut into
//!    steps where an optimizer step ends. The step used is the last whole steady one (the
//!    first step makes the optimizer's state; it is used only where no other step is whole,
//!    and compared with the program's first step).
//! 2. **Compare** the recorded step with the job's program at the snapshot's batch and
//!    sequence, replayed through the allocator, term by term: what lives between steps, and
//!    what each phase (forward, backward, optimizer step) grows beyond it.
//! 3. **Correct the program** ([`Calibration`]): the phase's own tensors scaled (what the
//!    layers keep per token, what the optimizer's step makes) and, where the snapshots tell the
//!    laws apart, tensors of fitted laws added (per token × sequence from two lengths; bytes
//!    that do not grow with the batch from two batches; `law_fit.rs` fits them). The
//!    calibrated plan is that program replayed, so it has a reserved figure and a verdict
//!    like any other.
//!
//! What the snapshot cannot vouch for is refused, not fitted: another model (the parameters
//! it built, or what it keeps between steps, are not the plan's), another precision (the
//! same, in bytes), another checkpointing (the forward keeps several times what the plan
//! keeps). A snapshot that ends in an out-of-memory error is evidence ([`OomEvidence`]): at
//! its shape or beyond, on a device no larger than the one it had, the plan does not fit.

pub use crate::calibration::{group, made_in, Calibration, Correction, OomEvidence};
use crate::calibration::{ByGroup, Group};
use crate::estimate::Estimator;
use crate::job::{Framework, Job, TrainConfig};
use crate::law_fit::{fit_law, Basis};
use crate::program::{Law, Phase, Program, Term};
use headroom_alloc::{AllocError, Allocation, DeviceCachingAllocator, DeviceMemory, Oom, Policy, SimDevice};
use headroom_trace::phase::ByPhase;
use headroom_trace::recorded_step::{RecordedOom, RecordedStep, StepKind, Steps};
use headroom_trace::walk::{Flow, Observer, Slot, Walk};
use std::fmt;

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
    pub phases: ByPhase<f64>,
    pub reserved: f64,
}

impl Figures {
    /// The allocated peak.
    pub fn peak(&self) -> f64 {
        self.start.max(self.phases.max())
    }

    fn of(s: &RecordedStep) -> Figures {
        Figures { start: s.start as f64, phases: s.peaks.map(|p| p as f64), reserved: s.reserved_peak as f64 }
    }

    /// What phase `phase` grew by beyond the step's start (nothing outside a step).
    fn grown(&self, phase: Phase) -> f64 {
        self.phases.get(phase).map_or(0.0, |p| p - self.start)
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
    /// At each phase's peak: the bytes of the group that phase scales.
    scaled: ByPhase<f64>,
    /// The optimizer state live when the step began.
    state: f64,
}

/// Replays `p` at `(b, s)` through PyTorch's allocator on an unbounded device and reads step
/// `step`'s figures.
fn measure(p: &Program, b: u64, s: u64, step: u32, est: &Estimator) -> Measured {
    let sizes = p.sizes(b, s);
    let made = made_in(p);
    let groups: Vec<Option<Group>> = p.tensors.iter().zip(&made).map(|(t, &m)| group(t, m)).collect();
    let device = SimDevice::new(1u64 << 50);
    let mut alloc = DeviceCachingAllocator::with_policy(device, est.alloc.clone(), est.policy.build());
    let mut m = Measuring {
        groups,
        step,
        at_step: 0,
        phase: Phase::Setup,
        started: false,
        live: ByGroup::default(),
        total: 0,
        out: Measured::default(),
    };
    // An unbounded device runs out of nothing, and a checked program makes no other mistake.
    let _ = Walk::with_slots(p.tensors.len()).run(&mut alloc, crate::replay::walk_ops(p, &sizes), &mut m);
    m.out
}

/// What [`measure`] watches: the bytes of each correctable group, and the step's figures.
struct Measuring {
    groups: Vec<Option<Group>>,
    step: u32,
    at_step: u32,
    phase: Phase,
    started: bool,
    live: ByGroup<u64>,
    total: u64,
    out: Measured,
}

impl Measuring {
    /// The phase's peak so far, if the walk is in the step measured.
    fn note(&mut self) {
        if self.at_step != self.step {
            return;
        }
        let out = &mut self.out;
        let (Some(peak), Some(scaled), Some(&own)) =
            (out.figures.phases.get_mut(self.phase), out.scaled.get_mut(self.phase), self.live.phases.get(self.phase))
        else {
            return;
        };
        if self.total as f64 >= *peak {
            *peak = self.total as f64;
            *scaled = own as f64;
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
            self.out.state = self.live.kept as f64;
        }
        self.note();
        Ok(())
    }

    fn allocated(&mut self, _: usize, t: Slot, block: Allocation, alloc: &DeviceCachingAllocator<D, P>) {
        self.total += block.size;
        if let Some(l) = self.groups[t as usize].and_then(|g| self.live.get_mut(g)) {
            *l += block.size;
        }
        self.note();
        // `max_memory_reserved` when the step ends: the run up to it, not the steps after.
        if self.at_step <= self.step {
            self.out.figures.reserved = self.out.figures.reserved.max(alloc.reserved_bytes() as f64);
        }
    }

    fn freed(&mut self, _: usize, t: Slot, block: Allocation) {
        self.total -= block.size;
        if let Some(l) = self.groups[t as usize].and_then(|g| self.live.get_mut(g)) {
            *l -= block.size;
        }
    }

    fn failed(&mut self, _: usize, _: Slot, _: Oom, _: &DeviceCachingAllocator<D, P>) -> Flow {
        Flow::Continue
    }
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
        let scale = cal.corrections.phases.forward.scale;
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
        let grown = s.peaks.forward.saturating_sub(s.start);
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
        let e = OomEvidence { batch: snap.batch, seq: snap.seq, capacity, oom: o };
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
        for phase in Phase::STEP {
            fit_phase(cal, used, plain, &phase_bases, phase);
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
        let add = bases.iter().zip(&cs).fold(Law::default(), |l, (b, &c)| l + b.law(c));
        cal.corrections.kept.law = cal.corrections.kept.law + add;
        // Less kept than planned: the optimizer's state is what a script most often keeps
        // less of (another optimizer's, or none yet).
        let short: Vec<(f64, f64, f64, f64)> = pts.iter().map(|p| (p.0, p.1, p.2, p.3.min(0.0))).collect();
        if short.iter().any(|p| p.3 < 0.0 && p.2 > 0.0) {
            let (x0, _) = fit_law(&short, true, &[]);
            cal.corrections.kept.scale = (cal.corrections.kept.scale * (1.0 + x0)).max(0.0);
        }
    }
}

/// `phase`'s growth beyond the step's start: its own tensors scaled where they are a good part
/// of it, tensors of the bases added.
fn fit_phase(cal: &mut Calibration, used: &[Used], plain: &Estimator, phase_bases: &[Basis], phase: Phase) {
    let m = measure_all(cal, used, plain);
    let own = |m: &Measured| m.scaled.get(phase).copied().unwrap_or(0.0);
    let pts: Vec<(f64, f64, f64, f64)> = used
        .iter()
        .zip(&m)
        .map(|(u, m)| (u.1 as f64, u.2 as f64, own(m), u.4.grown(phase) - m.figures.grown(phase)))
        .collect();
    // A phase's own tensors are scaled only where they are a good part of what it
    // grew by: scaling a few hundred megabytes to explain a difference elsewhere
    // would scale them wrongly where they are most of the phase (the backward's
    // gradients of the logits at a long sequence). A fifth, not a quarter: the first
    // step's optimizer phase has grown by the gradients and the Adam state it makes
    // (three parameter sizes), and a foreach step's temporaries (one more) are exactly a
    // quarter of that.
    let scalable = m.iter().all(|m| own(m) > 0.2 * m.figures.grown(phase).max(0.0));
    // Differences within rounding are no evidence: left as planned.
    let small = pts.iter().all(|p| p.3.abs() <= DEADBAND * used[0].4.peak());
    if small {
        return;
    }
    let bases: Vec<Basis> = if scalable {
        phase_bases.to_vec()
    } else {
        vec![if phase == Phase::OptimizerStep { Basis::Fixed } else { Basis::PerToken }]
    };
    let (x0, cs) = fit_law(&pts, scalable, &bases);
    let Some(c) = cal.corrections.phases.get_mut(phase) else { return };
    if scalable {
        // The forward's own tensors are what the layers keep: any scale within bounds
        // (beyond them the job is another, refused below); the optimizer's are its
        // temporaries, which another implementation may not make at all. The
        // backward's peak holds little of its own beside what the forward kept and the
        // gradients: at most half of that is taken away, the rest left as the fit's
        // residual.
        let x0 = if phase == Phase::Backward { x0.max(-0.5) } else { x0 };
        c.scale = (c.scale * (1.0 + x0)).max(0.0);
    }
    c.law = bases.iter().zip(&cs).fold(c.law, |l, (b, &v)| l + b.law(v));
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
    let c = &cal.corrections;
    vec![
        FittedTerm {
            name: "kept between steps",
            recorded: recorded_of(&|f| f.start),
            planned: planned_of(&|f| f.start),
            correction: c.kept,
        },
        FittedTerm {
            name: "forward",
            recorded: recorded_of(&|f| f.grown(Phase::Forward)),
            planned: planned_of(&|f| f.grown(Phase::Forward)),
            correction: c.phases.forward,
        },
        FittedTerm {
            name: "backward",
            recorded: recorded_of(&|f| f.grown(Phase::Backward)),
            planned: planned_of(&|f| f.grown(Phase::Backward)),
            correction: c.phases.backward,
        },
        FittedTerm {
            name: "optimizer step",
            recorded: recorded_of(&|f| f.grown(Phase::OptimizerStep)),
            planned: planned_of(&|f| f.grown(Phase::OptimizerStep)),
            correction: c.phases.optimizer_step,
        },
    ]
}

/// Refuses snapshots that cannot all be the plan's job at the shapes given: two at one shape
/// whose forwards add different amounts, or, at one batch, a longer sequence adding less.
fn contradictions(used: &[Used], fits: &[SnapshotFit]) -> Result<(), CalibrationError> {
    let grew = |u: &Used| u.4.grown(Phase::Forward);
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

/// The weights the program builds.
fn weights_of(p: &Program, b: u64, s: u64) -> f64 {
    let sizes = p.sizes(b, s);
    p.tensors.iter().zip(&sizes).filter(|(t, _)| t.term == Term::Weights).map(|(_, &n)| n as f64).sum()
}
