//! `headroom plan --calibrate SNAPSHOT`: the plan's step program fitted to memory snapshots of
//! smaller runs of the same job. Each snapshot's trace is read as moments
//! (`headroom_inspect::recording`), its whole steps found
//! (`headroom_trace::recorded_step::find_steps`) and the last steady one compared with the
//! job's program at the snapshot's shape (`headroom_plan::calibrate`).

use super::PlanArgs;
use crate::progress::LazyBar;
use anyhow::{bail, Context, Result};
use headroom_inspect::recording;
use headroom_plan::calibrate::{calibrate, Fit, Snapshot};
use headroom_plan::estimate::Estimator;
use headroom_plan::job::Job;
use headroom_trace::recorded_step::{find_steps, Recording};
use headroom_trace::snapshot::read_snapshot_file_with;
use std::path::Path;

/// One snapshot: its file and the device read.
pub(super) struct Run {
    pub file: String,
    pub device: u32,
}

/// A calibration and what it was fitted to.
pub(super) struct Calibrated {
    pub runs: Vec<Run>,
    pub fit: Fit,
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

/// Reads each `--calibrate` snapshot, finds its steps and fits the job's program to them.
pub(super) fn calibrated(a: &PlanArgs, job: &Job, est: &Estimator) -> Result<Calibrated> {
    let n = a.calibrate.len();
    let mut runs = Vec::with_capacity(n);
    let mut snapshots = Vec::with_capacity(n);
    for (i, path) in a.calibrate.iter().enumerate() {
        let batch = nth("--calibrate-batch", &a.calibrate_batch, i, n, job.train.micro_batch)?;
        let seq = nth("--calibrate-seq", &a.calibrate_seq, i, n, job.train.seq)?;
        let file = path.display().to_string();
        let (device, rec) = read(path)?;
        let steps = find_steps(&rec).map_err(|why| anyhow::anyhow!("--calibrate {file}: {why}"))?;
        snapshots.push(Snapshot { name: file.clone(), batch, seq, steps });
        runs.push(Run { file, device });
    }
    let fit = calibrate(job, est, &snapshots).map_err(|why| {
        let shapes: Vec<String> =
            snapshots.iter().map(|s| format!("{} ({} × {} tokens)", s.name, s.batch, s.seq)).collect();
        anyhow::anyhow!("--calibrate {}: {why}", shapes.join(", "))
    })?;
    Ok(Calibrated { runs, fit })
}

/// The moments of the device whose trace is longest: the one the run trained on.
pub(super) fn read(path: &Path) -> Result<(u32, Recording)> {
    let file = path.display();
    let mut bar = LazyBar::new("");
    let snap = read_snapshot_file_with(path, |done, total| bar.update("reading the snapshot", done, total))
        .with_context(|| format!("--calibrate: reading {file}"))?;
    bar.finish();
    let Some(device) = recording::trained_device(&snap) else {
        bail!(
            "--calibrate: {file} has no trace, only the moment it was taken; record the step with \
             torch.cuda.memory._record_memory_history() before it and _dump_snapshot() after"
        );
    };
    let r = recording::recording(&snap, device);
    if !r.has_frames {
        bail!(
            "--calibrate: {file} recorded no frames, so its forward, backward and optimizer step cannot be told \
             apart; record it with _record_memory_history(stacks=\"python\") (the default)"
        );
    }
    Ok((device, r))
}
