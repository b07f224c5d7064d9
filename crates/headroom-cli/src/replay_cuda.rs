//! `headroom replay --backend cuda`: the allocator on a real GPU. Each run
//! gets a fresh device, so every policy and setting starts from empty; a
//! snapshot's requests are replayed as the trace that made them
//! ([`headroom_trace::snapshot_ops`]).

use crate::progress::LazyBar;
use anyhow::{bail, Context, Result};
use headroom_alloc::{DeviceMemory, Snapshot};
use headroom_cuda::{CudaDevice, Streams};
use headroom_trace::device_trace::DeviceTrace;
use headroom_trace::jsonl::TraceLine;
use headroom_trace::replay::{replay_on, ReplayError, ReplayOptions, ReplayReport};
use headroom_trace::snapshot::read_snapshot_file_with;
use headroom_trace::snapshot_ops::fresh_ops;
use std::path::Path;

/// The GPU the runs use.
pub struct Gpu {
    pub ordinal: u32,
    pub name: String,
    pub total_bytes: u64,
}

/// Checks that device `ordinal` can be used, before anything is read or run.
pub fn open(ordinal: u32) -> Result<Gpu> {
    let d = CudaDevice::new(ordinal, Streams::Labels).map_err(|why| anyhow::anyhow!("--backend cuda: {why}"))?;
    let info = d.info();
    Ok(Gpu { ordinal, name: info.name, total_bytes: info.total_bytes })
}

/// A replay's report, and with `want_snapshot` the allocator's snapshot and the entries it let go.
type Replayed = Result<(ReplayReport, Option<(Snapshot, u64)>), ReplayError>;

/// One run on a fresh device.
pub fn replay(
    gpu: &Gpu,
    ops: &[TraceLine],
    opts: &ReplayOptions,
    progress: impl FnMut(usize),
    want_snapshot: bool,
) -> Result<Replayed> {
    let d = CudaDevice::new(gpu.ordinal, Streams::Labels).map_err(|why| anyhow::anyhow!("--backend cuda: {why}"))?;
    Ok(replay_on(d, ops, opts, progress)
        .map(|(r, mut a)| (r, want_snapshot.then(|| (a.snapshot(), a.history_dropped())))))
}

/// The requests of one device of the snapshot at `path` (`device`, or its only device with a trace).
pub fn snapshot_ops(path: &Path, device: Option<u32>) -> Result<Vec<TraceLine>> {
    let mut bar = LazyBar::new("");
    let snap = read_snapshot_file_with(path, |done, total| bar.update("reading the snapshot", done, total))
        .with_context(|| format!("reading {}", path.display()))?;
    bar.finish();
    let traced: Vec<u32> = snap
        .devices()
        .into_iter()
        .filter(|&d| snap.device_traces.get(d as usize).is_some_and(|t| !t.is_empty()))
        .collect();
    let device = match (device, traced.as_slice()) {
        (Some(d), _) if traced.contains(&d) => d,
        (Some(d), _) => bail!("--device {d}: {} has no trace for device {d} (it has {traced:?})", path.display()),
        (None, [d]) => *d,
        (None, []) => bail!("{} has no trace to replay (recorded without _record_memory_history)", path.display()),
        (None, many) => bail!("{} has traces for devices {many:?}: choose one with --device", path.display()),
    };
    let t = DeviceTrace::new(&snap, device).map_err(|e| anyhow::anyhow!("{}: device {device}: {e}", path.display()))?;
    Ok(fresh_ops(&t))
}
