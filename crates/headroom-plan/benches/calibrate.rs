//! Calibrating and planning one job from a memory snapshot, as `headroom plan --calibrate`
//! does after reading the file: the trace read as moments, its steps found, the job's program
//! fitted to the step used, and the calibrated plan replayed. Qwen3-1.7B's 1×512 snapshot
//! (../shared/gpu, 6.6 MB unpickled) and the same trace twice over (13 MB) for a larger file;
//! reading and unpickling the file is timed apart.
//!
//! `cargo bench -p headroom-plan --bench calibrate`; figures in docs/PERFORMANCE.md.

use criterion::{criterion_group, criterion_main, Criterion};
use headroom_inspect::recording::{recording, trained_device};
use headroom_plan::calibrate::{calibrate, Snapshot};
use headroom_plan::estimate::Estimator;
use headroom_plan::gpu::gpu;
use headroom_plan::job::{Attention, Job, Optimizer, Precision, TrainConfig};
use headroom_plan::model::Model;
use headroom_trace::recorded_step::find_steps;
use headroom_trace::snapshot::read_snapshot_file;
use std::path::PathBuf;
use std::time::Duration;

fn bench(c: &mut Criterion) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/gpu");
    let path = dir.join("snapshots/qwen3-1.7b-bf16-1x512-two-steps.pickle.gz");
    if !path.is_file() {
        eprintln!("skipped: {} is absent", path.display());
        return;
    }
    let case: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("qwen3-calibrate-case.json")).unwrap()).unwrap();
    let model = Model::from_hf_config(&case["config"].to_string(), "qwen3-1.7b").unwrap();
    let h200 = gpu("h200").unwrap();
    let job =
        TrainConfig { attention: Attention::Sdpa, ..TrainConfig::new(4, 2048, Precision::Bf16, Optimizer::AdamW) };
    let mut g = c.benchmark_group("calibrate");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(5));
    g.bench_function("read_qwen3_snapshot_6.6MB", |b| b.iter(|| read_snapshot_file(&path).unwrap()));
    let snap = read_snapshot_file(&path).unwrap();
    // The trace twice over: a run of four steps, about 13 MB unpickled.
    let mut doubled = snap.clone();
    let again = doubled.device_traces[0].clone();
    doubled.device_traces[0].extend(again);
    for (name, s) in [("qwen3_6.6MB", &snap), ("qwen3_doubled_13MB", &doubled)] {
        g.bench_function(format!("calibrate_and_plan_{name}"), |b| {
            b.iter(|| {
                let rec = recording(s, trained_device(s).unwrap_or(0));
                let steps = find_steps(&rec).unwrap();
                let snaps = [Snapshot { name: "qwen3".into(), batch: 1, seq: 512, steps }];
                let fit = calibrate(&Job::new(&model, &h200, job).unwrap(), &Estimator::default(), &snaps).unwrap();
                let est = Estimator { calibration: Some(fit.calibration), ..Estimator::default() };
                est.estimate(&Job::new(&model, &h200, job).unwrap())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
