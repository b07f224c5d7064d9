//! `headroom plan --calibrate SNAPSHOT`: the plan fitted to memory snapshots
//! of smaller runs of the same job. Each snapshot's trace gives its phases'
//! peaks (`headroom_inspect::step_phases`); the library fits the terms the
//! planner cannot know (`headroom_plan::calibrate`).

use super::PlanArgs;
use crate::progress::LazyBar;
use anyhow::{bail, Context, Result};
use headroom_inspect::{inspect_device, InspectOptions};
use headroom_plan::calibrate::{calibrate, Calibration, Measured};
use headroom_plan::gpu::GpuSpec;
use headroom_plan::model::Model;
use headroom_plan::train::TrainConfig;
use headroom_trace::snapshot::read_snapshot_file_with;
use std::path::Path;

/// One snapshot, where it ran and what it measured.
pub(super) struct Run {
    pub file: String,
    pub device: u32,
    pub batch: u64,
    pub seq: u64,
    pub measured: Measured,
}

/// A calibration and what it was fitted to.
pub(super) struct Calibrated {
    pub runs: Vec<Run>,
    pub fit: Calibration,
}

/// `--calibrate-batch` or `--calibrate-seq` for the `i`th of `n` snapshots:
/// one value each, one for all, or the plan's own.
fn nth(flag: &str, values: &[u64], i: usize, n: usize, default: u64) -> Result<u64> {
    match values.len() {
        0 => Ok(default),
        1 => Ok(values[0]),
        k if k == n => Ok(values[i]),
        k => bail!("{flag} is given {k} times for {n} --calibrate snapshots: give it once, or once for each"),
    }
}

/// Reads each `--calibrate` snapshot, measures its step's phases and fits
/// `cfg` to all of them.
pub(super) fn calibrated(a: &PlanArgs, model: &Model, gpu: &GpuSpec, cfg: &TrainConfig) -> Result<Calibrated> {
    let n = a.calibrate.len();
    let mut runs = Vec::with_capacity(n);
    for (i, path) in a.calibrate.iter().enumerate() {
        let batch = nth("--calibrate-batch", &a.calibrate_batch, i, n, a.batch)?;
        let seq = nth("--calibrate-seq", &a.calibrate_seq, i, n, a.seq)?;
        super::args::check_positions(model, seq).context("--calibrate-seq")?;
        let (device, measured) = measure(path)?;
        runs.push(Run { file: path.display().to_string(), device, batch, seq, measured });
    }
    let shaped: Vec<_> = runs.iter().map(|r| ((r.batch, r.seq), r.measured)).collect();
    let fit = calibrate(model, gpu, cfg, &shaped).map_err(|why| {
        let shapes: Vec<String> = runs.iter().map(|r| format!("{} ({} × {} tokens)", r.file, r.batch, r.seq)).collect();
        anyhow::anyhow!("--calibrate {}: {why}", shapes.join(", "))
    })?;
    Ok(Calibrated { runs, fit })
}

/// The phases' peaks of the device whose trace is longest: the one the run trained on.
fn measure(path: &Path) -> Result<(u32, Measured)> {
    let file = path.display();
    let mut bar = LazyBar::new("");
    let snap = read_snapshot_file_with(path, |done, total| bar.update("reading the snapshot", done, total))
        .with_context(|| format!("--calibrate: reading {file}"))?;
    bar.finish();
    let Some(device) = snap
        .devices()
        .into_iter()
        .filter(|&d| snap.device_traces.get(d as usize).is_some_and(|t| !t.is_empty()))
        .max_by_key(|&d| snap.device_traces[d as usize].len())
    else {
        bail!(
            "--calibrate: {file} has no trace, only the moment it was taken; record the step with \
             torch.cuda.memory._record_memory_history() before it and _dump_snapshot() after"
        );
    };
    let Some(p) = inspect_device(&snap, device, &InspectOptions::default()).step_phases else {
        bail!(
            "--calibrate: {file} recorded no frames, so its forward, backward and optimizer step cannot be told \
             apart; record it with _record_memory_history(stacks=\"python\") (the default)"
        );
    };
    let measured = Measured {
        start: p.start_bytes as f64,
        forward: p.forward_bytes.map(|b| b as f64),
        backward: p.backward_bytes.map(|b| b as f64),
        optimizer: p.optimizer_bytes.map(|b| b as f64),
    };
    Ok((device, measured))
}
