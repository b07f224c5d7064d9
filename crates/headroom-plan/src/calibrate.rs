//! Calibration: the step's phases fitted to measurements of the user's own
//! smaller runs, so that other batches and sequence lengths of the same job
//! are predicted from what those runs really allocated.
//!
//! The planner knows what transformers and `torch.optim` keep ([`crate::step`]);
//! it cannot know what a user's own layers save for the backward, what their
//! optimizer allocates, or what the script keeps between steps. A memory
//! snapshot of a small run measures exactly those, phase by phase
//! (`headroom_inspect::step_phases`). Each term is fitted from the figure
//! that shows it alone:
//!
//! | fitted | from | applied |
//! |---|---|---|
//! | offset | allocated when the trace began, less the planner's weights, optimizer state and inputs | to every phase: bytes kept between steps that the planner does not model (or state it models that the run has not made yet) |
//! | activation scale | the forward's peak less where it began, over the planner's activations and logits there | to what grows with batch × sequence in every phase |
//! | attention scale | the same, for eager attention's s × s matrices, which grow with the square of the sequence | equal to the activation scale unless runs at two or more lengths separate the laws |
//! | backward and optimizer extras | each phase's peak less the phase as calibrated so far | added to that phase at every shape |
//!
//! From one run, the calibrated phases at its shape equal its measurement
//! exactly (tested); from several, the scales are a non-negative least-squares
//! fit over their forwards and the offset and extras their means. Elsewhere
//! the planner's own laws in batch and sequence carry the fit. A phase no run
//! entered (a forward-only snapshot has no backward) keeps the planner's
//! model, with the offset.

use crate::gpu::GpuSpec;
use crate::job::{PipelineStage, TrainConfig};
use crate::live::memory;
use crate::model::Model;
pub use crate::step::Calibration;
use crate::step::{base, PhasePeak, Phases};
use std::fmt;

/// What one trace of a training step measured, in bytes allocated (as
/// `torch.cuda.max_memory_allocated()` counts them).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measured {
    /// Allocated when the trace began.
    pub start: f64,
    /// Each phase's peak; `None` where the trace never entered the phase.
    pub forward: Option<f64>,
    pub backward: Option<f64>,
    pub optimizer: Option<f64>,
}

/// Why a measurement cannot calibrate the planner.
#[derive(Clone, Debug, PartialEq)]
pub enum CalibrationError {
    /// The configuration is not planned as phases (Megatron's every-term sum).
    NoPhaseModel,
    /// The trace never entered a forward pass.
    NoForward,
    /// The planner has no activations at that shape to scale.
    NothingToScale,
    /// The forward allocated no more than it began with, plus the planner's fixed temporaries.
    ForwardTooSmall { grown: f64 },
    /// The measured activations and the plan's are too far apart to be the same shape.
    ShapeMismatch { scale: f64 },
}

/// How far a calibration may scale the plan's activations. transformers' recipes and
/// Korthikanti's formula are a few tens of percent from any real layer; a factor beyond this
/// means the snapshot ran another batch or sequence than the one given (or another model).
pub const MAX_SCALE: f64 = 20.0;

impl fmt::Display for CalibrationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CalibrationError::NoPhaseModel => f.write_str(
                "calibration fits the step's phases, which this configuration is not planned as (--framework hf \
                 plans them: one model replica per GPU, full fine-tuning, no or full checkpointing)",
            ),
            CalibrationError::NoForward => f.write_str(
                "the trace never enters a forward pass (no allocation under a Module.forward frame): record the \
                 snapshot around a whole training step",
            ),
            CalibrationError::NothingToScale => {
                f.write_str("the plan has no activations at the snapshot's batch and sequence to fit")
            }
            CalibrationError::ShapeMismatch { scale } => write!(
                f,
                "the snapshot's forward holds {scale:.3}× the activations the plan has at that batch and sequence \
                 (a calibration may scale them between 1/{MAX_SCALE} and {MAX_SCALE}×): check --calibrate-batch and \
                 --calibrate-seq, and that the snapshot is of this model"
            ),
            CalibrationError::ForwardTooSmall { grown } => write!(
                f,
                "the snapshot's forward grew allocated memory by only {grown:.0} bytes over where it began: not a \
                 forward at the batch and sequence given (check --calibrate-batch and --calibrate-seq)"
            ),
        }
    }
}

impl std::error::Error for CalibrationError {}

/// Fits `cfg` to snapshots of the same job, each with the batch and sequence
/// it ran (`shapes[i]` for `measured[i]`). The measurements are allocated
/// bytes, cuBLAS workspaces included; the phases are tensors only, with the
/// workspace beside them, so it is taken off first.
pub fn calibrate(
    model: &Model,
    gpu: &GpuSpec,
    cfg: &TrainConfig,
    runs: &[((u64, u64), Measured)],
) -> Result<Calibration, CalibrationError> {
    let plain = *cfg;
    let mut fitted = Vec::with_capacity(runs.len());
    for &((micro_batch, seq), m) in runs {
        // The closed form's phases: what the calibration scales.
        let planned = memory(model, gpu, &TrainConfig { micro_batch, seq, ..plain }, PipelineStage::Only, None);
        let phases = planned.phases.ok_or(CalibrationError::NoPhaseModel)?;
        let gpu_only = planned.gpu_only;
        let less = |x: f64| x - gpu_only;
        let tensors = Measured {
            start: less(m.start),
            forward: m.forward.map(less),
            backward: m.backward.map(less),
            optimizer: m.optimizer.map(less),
        };
        fitted.push((phases, tensors));
    }
    fit(&fitted)
}

/// What grows with batch × sequence in a phase, and what with the square of the sequence.
fn laws(p: &PhasePeak) -> (f64, f64) {
    (p.activations - p.attention + p.logits, p.attention)
}

fn mean(xs: impl Iterator<Item = f64>) -> Option<f64> {
    let (n, sum) = xs.fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
    (n > 0).then(|| sum / n as f64)
}

/// Fits the terms so that each run's phases — the planner's, uncalibrated,
/// at the shape that run measured — reproduce its measurement: exactly
/// for one run; for several, the scales by least squares over their
/// forwards (not negative) and the offset and extras as their means.
pub fn fit(runs: &[(Phases, Measured)]) -> Result<Calibration, CalibrationError> {
    // Per run: what the forward grew by beyond its start and fixed terms, and the two laws there.
    let mut points = Vec::with_capacity(runs.len());
    for (at, m) in runs {
        let f = &at.forward;
        let forward = m.forward.ok_or(CalibrationError::NoForward)?;
        let (linear, square) = laws(f);
        if linear + square <= 0.0 {
            return Err(CalibrationError::NothingToScale);
        }
        let grown = forward - m.start - f.gradients - f.temporary;
        if grown <= 0.0 {
            return Err(CalibrationError::ForwardTooSmall { grown: forward - m.start });
        }
        points.push((grown, linear, square));
    }
    let (activation_scale, attention_scale) = scales(&points);
    for scale in [activation_scale, attention_scale] {
        // A scale of 0 is the square law found absent, not a mismatch.
        if scale > MAX_SCALE || (scale > 0.0 && scale < 1.0 / MAX_SCALE) {
            return Err(CalibrationError::ShapeMismatch { scale });
        }
    }
    if activation_scale == 0.0 && attention_scale == 0.0 {
        return Err(CalibrationError::ShapeMismatch { scale: 0.0 });
    }
    let mut c = Calibration {
        offset: mean(runs.iter().map(|(at, m)| m.start - base(&at.forward))).unwrap_or(0.0),
        activation_scale,
        attention_scale,
        backward_extra: None,
        optimizer_extra: None,
    };
    let so_far: Vec<Phases> = runs.iter().map(|(at, _)| c.apply(at)).collect();
    let extra = |phase: fn(&Phases) -> f64, measured: fn(&Measured) -> Option<f64>| {
        mean(runs.iter().zip(&so_far).filter_map(|((_, m), p)| Some(measured(m)? - phase(p))))
    };
    c.backward_extra = extra(|p| p.backward.total, |m| m.backward);
    c.optimizer_extra = extra(|p| p.optimizer.total, |m| m.optimizer);
    Ok(c)
}

/// Non-negative least squares of `grown ≈ k·linear + q·square` over the
/// points. One point, or points that cannot tell the two laws apart (no
/// eager attention, or every run at one sequence length), give one scale
/// for both.
fn scales(points: &[(f64, f64, f64)]) -> (f64, f64) {
    let one_scale = || {
        let (g, v) =
            points.iter().fold((0.0, 0.0), |(g, v), &(grown, l, q)| (g + grown * (l + q), v + (l + q) * (l + q)));
        let k = g / v;
        (k, k)
    };
    let (mut sll, mut slq, mut sqq, mut sgl, mut sgq) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(g, l, q) in points {
        sll += l * l;
        slq += l * q;
        sqq += q * q;
        sgl += g * l;
        sgq += g * q;
    }
    let det = sll * sqq - slq * slq;
    // Collinear within rounding: the runs do not separate the laws.
    if points.len() < 2 || det <= 1e-9 * sll * sqq {
        return one_scale();
    }
    let k = (sgl * sqq - sgq * slq) / det;
    let q = (sll * sgq - slq * sgl) / det;
    match (k >= 0.0, q >= 0.0) {
        (true, true) => (k, q),
        // The best fit with one law at zero is the other law alone.
        (false, _) => (0.0, sgq / sqq),
        (_, false) => (sgl / sll, 0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(
        base: f64,
        gradients: f64,
        (activations, attention): (f64, f64),
        logits: f64,
        temporary: f64,
    ) -> PhasePeak {
        PhasePeak {
            total: base + gradients + activations + logits + temporary,
            gradients,
            activations,
            attention,
            logits,
            temporary,
            calibration: 0.0,
        }
    }

    /// Weights and state 100; per micro-batch of `b` × `s`, activations of 0.1 a token
    /// and attention of 0.001 a token per position, logits of 0.025 a token.
    fn planned(b: f64, s: f64) -> Phases {
        let (act, att, logits) = (0.1 * b * s, 0.001 * b * s * s, 0.025 * b * s);
        Phases {
            forward: phase(100.0, 0.0, (act + att, att), logits, 5.0),
            backward: phase(100.0, 0.0, (act + att, att), 2.0 * logits, 5.0),
            optimizer: phase(100.0, 30.0, (0.0, 0.0), 0.0, 30.0),
        }
    }

    /// A run whose layers keep 1.5× the plan's per-token activations and logits, half its
    /// attention matrices, and 20 bytes more throughout; its backward holds 7 more, its
    /// optimizer 10 less.
    fn run(b: f64, s: f64) -> Measured {
        let (act, att, logits) = (0.15 * b * s, 0.0005 * b * s * s, 0.0375 * b * s);
        Measured {
            start: 120.0,
            forward: Some(120.0 + act + att + logits + 5.0),
            backward: Some(120.0 + act + att + 2.0 * logits + 5.0 + 7.0),
            optimizer: Some(120.0 + 30.0 + 30.0 - 10.0),
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
    }

    #[test]
    fn one_run_is_reproduced_exactly_at_its_own_shape() {
        let c = fit(&[(planned(2.0, 100.0), run(2.0, 100.0))]).unwrap();
        let p = c.apply(&planned(2.0, 100.0));
        let m = run(2.0, 100.0);
        assert!(close(p.forward.total, m.forward.unwrap()));
        assert!(close(p.backward.total, m.backward.unwrap()));
        assert!(close(p.optimizer.total, m.optimizer.unwrap()));
        assert!(close(c.offset, 20.0));
        // One run cannot tell the laws apart: one scale for both.
        assert_eq!(c.activation_scale, c.attention_scale);
    }

    #[test]
    fn two_sequence_lengths_separate_the_laws_and_predict_a_third() {
        let runs = [(planned(2.0, 100.0), run(2.0, 100.0)), (planned(2.0, 200.0), run(2.0, 200.0))];
        let c = fit(&runs).unwrap();
        assert!(close(c.activation_scale, 1.5) && close(c.attention_scale, 0.5), "{c:?}");
        assert!(close(c.backward_extra.unwrap(), 7.0) && close(c.optimizer_extra.unwrap(), -10.0), "{c:?}");
        let (p, m) = (c.apply(&planned(4.0, 800.0)), run(4.0, 800.0));
        assert!(close(p.forward.total, m.forward.unwrap()), "{} vs {:?}", p.forward.total, m.forward);
        assert!(close(p.backward.total, m.backward.unwrap()));
        assert!(close(p.optimizer.total, m.optimizer.unwrap()));
    }

    #[test]
    fn without_attention_matrices_two_runs_fit_one_scale() {
        let flat = |b: f64, s: f64| {
            let mut p = planned(b, s);
            for ph in [&mut p.forward, &mut p.backward] {
                *ph = phase(100.0, 0.0, (0.1 * b * s, 0.0), ph.logits, 5.0);
            }
            p
        };
        let m = |b: f64, s: f64| Measured {
            start: 100.0,
            forward: Some(105.0 + 0.25 * b * s),
            backward: None,
            optimizer: None,
        };
        let c = fit(&[(flat(1.0, 100.0), m(1.0, 100.0)), (flat(1.0, 300.0), m(1.0, 300.0))]).unwrap();
        assert!(close(c.activation_scale, 2.0) && close(c.attention_scale, 2.0), "{c:?}");
    }

    #[test]
    fn a_forward_only_trace_leaves_the_other_phases_to_the_plan() {
        let m = Measured {
            start: 100.0,
            forward: Some(planned(2.0, 100.0).forward.total),
            backward: None,
            optimizer: None,
        };
        let c = fit(&[(planned(2.0, 100.0), m)]).unwrap();
        assert!(close(c.offset, 0.0) && close(c.activation_scale, 1.0), "{c:?}");
        assert_eq!((c.backward_extra, c.optimizer_extra), (None, None));
        let (p, q) = (c.apply(&planned(3.0, 50.0)), planned(3.0, 50.0));
        assert!(close(p.backward.total, q.backward.total) && close(p.optimizer.total, q.optimizer.total));
    }

    #[test]
    fn the_scales_are_never_negative() {
        // Longer sequences that grew less than linearly: the square law cannot be negative.
        let points = [(100.0, 100.0, 10.0), (150.0, 200.0, 40.0)];
        let (k, q) = scales(&points);
        assert!(k >= 0.0 && q == 0.0, "{k} {q}");
    }

    #[test]
    fn refuses_what_cannot_be_fitted() {
        let no_forward = Measured { start: 100.0, forward: None, backward: Some(1.0), optimizer: None };
        assert_eq!(fit(&[(planned(1.0, 10.0), no_forward)]), Err(CalibrationError::NoForward));
        let flat = Measured { start: 100.0, forward: Some(104.0), backward: None, optimizer: None };
        assert!(matches!(fit(&[(planned(1.0, 10.0), flat)]), Err(CalibrationError::ForwardTooSmall { .. })));
        let m = Measured { start: 100.0, forward: Some(150.0), backward: None, optimizer: None };
        assert_eq!(fit(&[(planned(0.0, 10.0), m)]), Err(CalibrationError::NothingToScale));
        // A snapshot of another shape: a thousand times the plan's activations, or a thousandth.
        for forward in [105.0 + 1000.0 * 50.0, 105.0 + 0.05] {
            let m = Measured { start: 100.0, forward: Some(forward), backward: None, optimizer: None };
            assert!(matches!(fit(&[(planned(1.0, 500.0), m)]), Err(CalibrationError::ShapeMismatch { .. })));
        }
    }
}
