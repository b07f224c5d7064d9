//! Replay: push a trace through the caching allocator on a simulated GPU of a
//! given capacity, under given settings, and report what it cost.
//!
//! An allocation that runs out of memory is reported and the replay goes on
//! with the next operation, as a training script that catches
//! `torch.OutOfMemoryError` would; a later `free` of that allocation is
//! skipped and counted.

use crate::jsonl::{TraceId, TraceLine, TraceOp};
use headroom_alloc::{
    AllocError, AllocatorConfig, Backend, DeviceCachingAllocator, DeviceMemory, NamedPolicy, PolicyName, SimDevice,
    StreamId,
};
use rustc_hash::FxHashMap;
use rustc_hash::FxHashSet;
use std::collections::BTreeMap;

/// Why settings with `backend:cudaMallocAsync` are refused, for every replay.
pub const ASYNC_NOT_SIMULATED: &str =
    "backend:cudaMallocAsync (CUDA's stream-ordered pool) is not simulated; headroom replays PyTorch's native \
     caching allocator";

/// How to replay.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub config: AllocatorConfig,
    /// Device memory of the simulated GPU, in bytes.
    pub capacity: u64,
    /// Keep the allocator's history (for a snapshot with a trace), at most this many entries.
    pub history: Option<usize>,
    /// The allocation policy.
    pub policy: PolicyName,
}

/// One allocation that failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OomEvent {
    /// Line of the trace.
    pub line: usize,
    pub id: TraceId,
    pub size: u64,
    pub stream: StreamId,
    /// Which kind of failure: `out_of_memory`, `over_limit` or `never_fits`.
    pub kind: &'static str,
    /// The allocator's message (PyTorch's wording plus headroom's fragmentation figures).
    pub message: String,
}

/// What a replay measured.
#[derive(Clone, Debug)]
pub struct ReplayReport {
    pub operations: usize,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub final_allocated_bytes: u64,
    pub final_reserved_bytes: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    pub num_alloc_retries: u64,
    pub ooms: Vec<OomEvent>,
    /// Frees skipped because their allocation had failed.
    pub skipped_frees: usize,
    /// `torch.cuda.memory_stats()` at the end: PyTorch's 122 keys.
    pub stats: BTreeMap<String, i64>,
    /// Wall time of the replay on this host: the allocator's own work and the device calls.
    pub host_seconds: f64,
}

/// A trace that does not make sense as a program (the allocator itself never fails this way).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("line {line}: allocation `{id}` is already live (allocated at line {first})")]
    DuplicateId { line: usize, id: TraceId, first: usize },
    #[error("line {line}: `{id}` is not a live allocation")]
    UnknownId { line: usize, id: TraceId },
    /// The allocator refused a call (its message is the whole story, so it is not also a source).
    #[error("line {line}: {error}")]
    Alloc { line: usize, error: AllocError },
    /// The settings ask for an allocator headroom does not simulate.
    #[error("{0}")]
    Unsupported(String),
}

/// Replays `ops` on a simulated GPU of `opts.capacity` bytes; `progress` is called with
/// the number of operations done, now and then.
pub fn replay(
    ops: &[TraceLine],
    opts: &ReplayOptions,
    progress: impl FnMut(usize),
) -> Result<(ReplayReport, DeviceCachingAllocator<SimDevice, NamedPolicy>), ReplayError> {
    replay_on(SimDevice::new(opts.capacity), ops, opts, progress)
}

/// Replays `ops` on `device` (a real GPU, say); `opts.capacity` is the simulator's only.
/// `complete_events` waits for the device.
pub fn replay_on<D: DeviceMemory>(
    device: D,
    ops: &[TraceLine],
    opts: &ReplayOptions,
    mut progress: impl FnMut(usize),
) -> Result<(ReplayReport, DeviceCachingAllocator<D, NamedPolicy>), ReplayError> {
    if opts.config.backend == Backend::CudaMallocAsync {
        return Err(ReplayError::Unsupported(ASYNC_NOT_SIMULATED.into()));
    }
    let started = std::time::Instant::now();
    let mut a = DeviceCachingAllocator::with_policy(device, opts.config.clone(), opts.policy.build());
    a.record_history(opts.history);
    let mut live: FxHashMap<&str, (u64, usize)> = FxHashMap::default();
    let mut failed: FxHashSet<&str> = FxHashSet::default();
    let mut ooms = Vec::new();
    let mut skipped_frees = 0;
    for (i, TraceLine { line, op }) in ops.iter().enumerate() {
        let line = *line;
        if i % 65536 == 0 {
            progress(i);
        }
        let wrap = |error| ReplayError::Alloc { line, error };
        match op {
            TraceOp::Alloc { id, size, stream } | TraceOp::AllocInPool { id, size, stream, .. } => {
                if let Some(&(_, first)) = live.get(id.as_str()) {
                    return Err(ReplayError::DuplicateId { line, id: id.clone(), first });
                }
                let pool = match op {
                    TraceOp::AllocInPool { pool, .. } => *pool,
                    _ => headroom_alloc::DEFAULT_MEMPOOL,
                };
                match a.malloc_in_pool(*size, *stream, pool) {
                    Ok(b) => {
                        failed.remove(id.as_str());
                        live.insert(id, (b.ptr, line));
                    }
                    Err(e) => {
                        let kind = match &e {
                            AllocError::OutOfMemory(_) => "out_of_memory",
                            AllocError::OverLimit(_) => "over_limit",
                            AllocError::NeverFits(_) => "never_fits",
                            _ => return Err(wrap(e)),
                        };
                        failed.insert(id);
                        ooms.push(OomEvent {
                            line,
                            id: id.clone(),
                            size: *size,
                            stream: *stream,
                            kind,
                            message: e.to_string(),
                        });
                    }
                }
            }
            TraceOp::Free { id } => match live.remove(id.as_str()) {
                Some((ptr, _)) => a.free(ptr).map_err(wrap)?,
                None if failed.remove(id.as_str()) => skipped_frees += 1,
                None => return Err(ReplayError::UnknownId { line, id: id.clone() }),
            },
            TraceOp::RecordStream { id, stream } => match live.get(id.as_str()) {
                Some(&(ptr, _)) => a.record_stream(ptr, *stream).map_err(wrap)?,
                None if failed.contains(id.as_str()) => {}
                None => return Err(ReplayError::UnknownId { line, id: id.clone() }),
            },
            TraceOp::CompleteEvents => {
                a.device_mut().synchronize().map_err(|e| ReplayError::Alloc { line, error: AllocError::Device(e) })?
            }
            TraceOp::EmptyCache => a.empty_cache().map_err(wrap)?,
            TraceOp::EmptyPool { pool } => a.empty_cache_pool(*pool).map_err(wrap)?,
            TraceOp::ReleasePool { pool } => {
                // A pool no allocation named, or released already, is a mistake of the trace.
                a.release_pool(*pool).map_err(wrap)?
            }
            TraceOp::SetFraction { value } => a.set_memory_fraction(*value).map_err(wrap)?,
        }
    }
    progress(ops.len());
    let host_seconds = started.elapsed().as_secs_f64();
    let s = a.stats();
    let report = ReplayReport {
        operations: ops.len(),
        peak_allocated_bytes: s.allocated_bytes[0].peak as u64,
        peak_reserved_bytes: s.reserved_bytes[0].peak as u64,
        final_allocated_bytes: s.allocated_bytes[0].current as u64,
        final_reserved_bytes: s.reserved_bytes[0].current as u64,
        num_device_alloc: s.num_device_alloc as u64,
        num_device_free: s.num_device_free as u64,
        num_alloc_retries: s.num_alloc_retries as u64,
        ooms,
        skipped_frees,
        stats: a.memory_stats(),
        host_seconds,
    };
    Ok((report, a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jsonl::read_trace;
    use headroom_alloc::units::{GIB, MIB};

    fn opts(conf: &str, capacity: u64) -> ReplayOptions {
        ReplayOptions {
            config: AllocatorConfig::parse(conf).unwrap(),
            capacity,
            history: None,
            policy: PolicyName::PyTorch,
        }
    }

    #[test]
    fn oom_is_reported_and_the_replay_carries_on() {
        let t = read_trace(
            "{\"op\":\"alloc\",\"id\":1,\"size\":62914560}\n{\"op\":\"alloc\",\"id\":2,\"size\":62914560}\n\
             {\"op\":\"free\",\"id\":2}\n{\"op\":\"free\",\"id\":1}\n{\"op\":\"alloc\",\"id\":3,\"size\":62914560}\n"
                .as_bytes(),
        )
        .unwrap();
        let (r, _) = replay(&t, &opts("", 100 * MIB), |_| {}).unwrap();
        assert_eq!(r.ooms.len(), 1);
        assert_eq!((r.ooms[0].line, r.ooms[0].kind), (2, "out_of_memory"));
        assert!(r.ooms[0].message.contains("Tried to allocate 60.00 MiB"));
        assert_eq!(r.skipped_frees, 1);
        assert_eq!(r.peak_reserved_bytes, 60 * MIB);
        assert_eq!(r.num_device_alloc, 1, "id 3 reuses the cached block");
        assert_eq!(r.stats.len(), 122);
    }

    #[test]
    fn program_errors_name_the_line() {
        let t =
            read_trace("{\"op\":\"alloc\",\"id\":1,\"size\":1}\n{\"op\":\"alloc\",\"id\":1,\"size\":1}\n".as_bytes())
                .unwrap();
        let e = replay(&t, &opts("", GIB), |_| {}).unwrap_err();
        assert_eq!(e.to_string(), "line 2: allocation `1` is already live (allocated at line 1)");
        let t = read_trace("{\"op\":\"free\",\"id\":9}\n".as_bytes()).unwrap();
        let e = replay(&t, &opts("", GIB), |_| {}).unwrap_err();
        assert_eq!(e.to_string(), "line 1: `9` is not a live allocation");
    }
}
