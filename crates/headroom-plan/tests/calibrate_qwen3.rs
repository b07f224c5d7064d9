//! `plan --calibrate` on the snapshots a user records (../shared/gpu/qwen3-calibrate-case.json):
//! Qwen3-1.7B in bf16, recorded on an H200 from before the model was built through two steps
//! at 1×512 and 1×1024. Calibrated from each snapshot and from both, the plan at 4×2048 and
//! 2×4096 is within ±3% of the peak measured there, and the recorded step itself is reproduced
//! (allocated within 1%, reserved within 2%). The snapshot of an OOM makes its shape not fit. Skips with a message
//! where `../shared` is absent.

#[path = "../../../tests/support/skip.rs"]
mod skip;

use headroom_inspect::recording::{recording, trained_device};
use headroom_plan::calibrate::{calibrate, CalibrationError, Snapshot};
use headroom_plan::estimate::Estimator;
use headroom_plan::gpu::gpu;
use headroom_plan::job::{Attention, Job, Optimizer, Precision, TrainConfig};
use headroom_plan::model::Model;
use headroom_trace::phase::Phase;
use headroom_trace::recorded_step::{find_steps, StepKind, Steps};
use headroom_trace::snapshot::read_snapshot_file;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn shared() -> Option<PathBuf> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/gpu");
    d.join("qwen3-calibrate-case.json").is_file().then_some(d)
}

fn case(dir: &Path) -> (Model, Value) {
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("qwen3-calibrate-case.json")).unwrap()).unwrap();
    let model = Model::from_hf_config(&v["config"].to_string(), "qwen3-1.7b").unwrap();
    (model, v["measured"].clone())
}

fn job(b: u64, s: u64) -> TrainConfig {
    TrainConfig { attention: Attention::Sdpa, ..TrainConfig::new(b, s, Precision::Bf16, Optimizer::AdamW) }
}

/// The steps of a snapshot file's device that trained, as `headroom plan --calibrate` reads them.
fn steps(path: &Path) -> Steps {
    let snap = read_snapshot_file(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let device = trained_device(&snap).expect("a trace");
    find_steps(&recording(&snap, device)).expect("a whole step")
}

fn snap(dir: &Path, seq: u64) -> Snapshot {
    let path = dir.join(format!("snapshots/qwen3-1.7b-bf16-1x{seq}-two-steps.pickle.gz"));
    Snapshot { name: path.display().to_string(), batch: 1, seq, steps: steps(&path) }
}

#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn qwen3_plans_from_its_own_snapshots() {
    let Some(dir) = shared() else {
        skip::skip("../shared/gpu is absent (a fresh clone); the Qwen3 calibration case needs its snapshots");
        return;
    };
    let (model, measured) = case(&dir);
    let h200 = gpu("h200").unwrap();
    let (s512, s1024) = (snap(&dir, 512), snap(&dir, 1024));
    for s in [&s512, &s1024] {
        // Construction, the first step (which makes AdamW's state), the steady second: the second used.
        assert!(s.steps.construction.is_some(), "{}", s.name);
        let used = s.steps.used().unwrap();
        assert_eq!((used.number, used.kind, used.micro_steps), (2, StepKind::Steady, 1), "{}", s.name);
        assert_eq!(s.steps.whole.first().map(|w| w.kind), Some(StepKind::First));
    }
    let est = Estimator::default();
    for (name, snaps) in [("1x512", vec![s512.clone()]), ("1x1024", vec![s1024.clone()]), ("both", vec![s512, s1024])] {
        let fit = calibrate(&Job::new(&model, &h200, job(4, 2048)).unwrap(), &est, &snaps).unwrap();
        let (allocated, reserved) = fit.residual();
        assert!(allocated < 0.01, "{name}: the recorded step's allocated peak off by {:.2}%", allocated * 100.0);
        assert!(reserved < 0.02, "{name}: the recorded step's reserved peak off by {:.2}%", reserved * 100.0);
        let calibrated = Estimator { calibration: Some(fit.calibration), ..Estimator::default() };
        for (key, b, s) in [("4x2048", 4, 2048), ("2x4096", 2, 4096)] {
            let want = measured[format!("qwen3-1.7b-train-bf16-none-sdpa-{key}")]["peak_allocated"].as_f64().unwrap();
            let e = calibrated.estimate(&Job::new(&model, &h200, job(b, s)).unwrap()).unwrap();
            let err = e.memory.allocated_bytes / want - 1.0;
            eprintln!(
                "calibrated from {name}: {key} allocated {:.4e} vs {want:.4e} ({:+.2}%), reserved {:.4e}",
                e.memory.allocated_bytes,
                err * 100.0,
                e.memory.reserved_bytes
            );
            assert!(
                err.abs() < 0.03,
                "{name}: {key} planned {:.3e}, measured {want:.3e} ({:+.2}%)",
                e.memory.allocated_bytes,
                err * 100.0
            );
            assert!(e.verdict.fits);
        }
    }
}

#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn what_the_snapshot_cannot_vouch_for_is_refused() {
    let Some(dir) = shared() else {
        skip::skip("../shared/gpu is absent (a fresh clone); the Qwen3 calibration case needs its snapshots");
        return;
    };
    let (model, _) = case(&dir);
    let h200 = gpu("h200").unwrap();
    let s = vec![snap(&dir, 512)];
    let est = Estimator::default();
    // Another precision: the model it built is half the plan's.
    let fp32 = TrainConfig { precision: Precision::Fp32, ..job(1, 512) };
    let e = calibrate(&Job::new(&model, &h200, fp32).unwrap(), &est, &s).unwrap_err();
    assert!(matches!(e, CalibrationError::AnotherModel { .. }), "{e}");
    // Another model.
    let other = headroom_plan::model::preset("llama-3-8b").unwrap();
    assert!(matches!(
        calibrate(&Job::new(&other, &h200, job(1, 512)).unwrap(), &est, &s),
        Err(CalibrationError::AnotherModel { .. })
    ));
    // Checkpointing the run did not do: the forward keeps a third of what was recorded.
    let ckpt = TrainConfig { checkpointing: headroom_plan::job::Checkpointing::Full, ..job(1, 512) };
    let e = calibrate(&Job::new(&model, &h200, ckpt).unwrap(), &est, &s).unwrap_err();
    assert!(matches!(e, CalibrationError::ShapeMismatch { .. }) && e.to_string().contains("checkpointing"), "{e}");
    // The shape given is not the one recorded.
    let mut wrong = s.clone();
    wrong[0].batch = 4;
    assert!(matches!(
        calibrate(&Job::new(&model, &h200, job(1, 512)).unwrap(), &est, &wrong),
        Err(CalibrationError::ShapeMismatch { .. })
    ));
}

/// Qwen2-0.5B-sized, fp32, batch doubling at 1024 tokens under a 10 GiB per-process limit
/// until batch 4 ran out of memory in its forward.
#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn an_oom_snapshot_makes_its_shape_not_fit() {
    let Some(dir) = shared() else {
        skip::skip("../shared/gpu is absent (a fresh clone); the OOM snapshot is there");
        return;
    };
    let path = dir.join("snapshots/oom-cpp-qwen2-0.5b-b4.pickle.gz");
    let steps = steps(&path);
    let oom = steps.oom.expect("the run ends in an OOM");
    assert_eq!(oom.phase, Phase::Forward);
    assert_eq!(oom.asked, 1_244_659_712, "1.16 GiB asked");
    assert!(oom.device_free.unwrap() > oom.asked, "a per-process limit refused it, not the device");
    let model = Model::from_hf_config(
        r#"{"model_type":"qwen2","hidden_size":896,"intermediate_size":4864,"num_hidden_layers":24,
            "num_attention_heads":14,"num_key_value_heads":2,"vocab_size":151936,"max_position_embeddings":32768,
            "tie_word_embeddings":true,"rms_norm_eps":1e-6}"#,
        "qwen2-0.5b",
    )
    .unwrap();
    let cfg =
        TrainConfig { attention: Attention::Sdpa, ..TrainConfig::new(4, 1024, Precision::Fp32, Optimizer::AdamW) };
    let h200 = gpu("h200").unwrap();
    let snaps = [Snapshot { name: "oom".into(), batch: 4, seq: 1024, steps }];
    let fit = calibrate(&Job::new(&model, &h200, cfg).unwrap(), &Estimator::default(), &snaps).unwrap();
    let e = fit.calibration.oom.expect("the OOM is evidence");
    assert!(e.capacity < 11 << 30 && e.capacity > 10 << 30, "{}", e.capacity);
    // The steps before it ran batches 1 and 2: not fitted as batch 4.
    assert!(fit.snapshots[0].step.is_none() && fit.snapshots[0].note.is_some());
    let est = Estimator { calibration: Some(fit.calibration), ..Estimator::default() };
    // On a GPU of the recorded limit the job does not fit, whatever the replay says, and the
    // plan says what was asked and what was free.
    let small = headroom_plan::gpu::GpuSpec { memory_bytes: e.capacity, ..h200 };
    let planned = est.estimate(&Job::new(&model, &small, cfg).unwrap()).unwrap();
    assert!(!planned.verdict.fits);
    assert!(planned.memory.oom.as_ref().is_some_and(|o| o.oom.report.alloc_size > 0));
    assert!(!est.fits(&Job::new(&model, &small, cfg).unwrap()));
    // On the whole H200 the evidence does not apply.
    assert!(est.estimate(&Job::new(&model, &h200, cfg).unwrap()).unwrap().verdict.fits);
}
