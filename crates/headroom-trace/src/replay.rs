//! Replay: push a trace through the caching allocator on a simulated GPU of a
//! given capacity, under given settings, and report what it cost.
//!
//! An allocation that runs out of memory is reported and the replay goes on
//! with the next operation, as a training script that catches
//! `torch.OutOfMemoryError` would; a later `free` of that allocation is
//! skipped and counted.

use crate::jsonl::{TraceId, TraceLine, TraceOp};
use crate::walk::{Flow, Observer, Op, Slot, Walk, WalkError};
use headroom_alloc::{
    AllocError, AllocatorConfig, Backend, DeviceCachingAllocator, DeviceMemory, NamedPolicy, Oom, Policy, PolicyName,
    SimDevice, DEFAULT_MEMPOOL,
};
use rustc_hash::FxHashMap;
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

/// One allocation that failed: the trace's line and `id`, and the failure
/// (its size, stream and kind in its report; its message as it displays).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OomEvent {
    pub line: usize,
    pub id: TraceId,
    pub oom: Oom,
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
    let slots = Slots::of(ops);
    let mut failures = Failures { ops, ooms: Vec::new(), skipped_frees: 0 };
    let walk_ops = ops.iter().zip(&slots.of_op).enumerate().map(|(i, (TraceLine { op, .. }, &slot))| {
        if i % 65536 == 0 {
            progress(i);
        }
        let op = match *op {
            TraceOp::Alloc { size, stream, .. } => Op::Alloc { slot, size, stream, pool: DEFAULT_MEMPOOL },
            TraceOp::AllocInPool { size, stream, pool, .. } => Op::Alloc { slot, size, stream, pool },
            TraceOp::Free { .. } => Op::Free { slot },
            TraceOp::RecordStream { stream, .. } => Op::RecordStream { slot, stream },
            TraceOp::CompleteEvents => Op::CompleteEvents,
            TraceOp::EmptyCache => Op::EmptyCache,
            TraceOp::EmptyPool { pool } => Op::EmptyPool(pool),
            // A pool no allocation named, or released already, is a mistake of the trace.
            TraceOp::ReleasePool { pool } => Op::ReleasePool(pool),
            TraceOp::SetFraction { value } => Op::SetFraction(value),
        };
        (i, op)
    });
    Walk::with_slots(slots.count).run(&mut a, walk_ops, &mut failures).map_err(|e| slots.error(ops, e))?;
    let Failures { ooms, skipped_frees, .. } = failures;
    progress(ops.len());
    let host_seconds = started.elapsed().as_secs_f64();
    let s = a.stats();
    let report = ReplayReport {
        operations: ops.len(),
        peak_allocated_bytes: s.allocated_bytes.all().peak as u64,
        peak_reserved_bytes: s.reserved_bytes.all().peak as u64,
        final_allocated_bytes: s.allocated_bytes.all().current as u64,
        final_reserved_bytes: s.reserved_bytes.all().current as u64,
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

/// Each operation's slot: every `id` is one slot for the whole trace.
struct Slots {
    of_op: Vec<Slot>,
    count: usize,
    /// For an `alloc` of an `id` allocated before and not freed since: the
    /// line of that allocation. The walk says whether it is live (it is not if
    /// it failed), and so whether the `alloc` is a mistake.
    earlier: FxHashMap<usize, usize>,
}

/// The slot of a `free` or `record_stream` of an `id` no `alloc` holds: the
/// walk finds it is not live.
const NO_SLOT: Slot = Slot::MAX;

impl Slots {
    fn of(ops: &[TraceLine]) -> Slots {
        let mut slot_of: FxHashMap<&str, Slot> = FxHashMap::default();
        // The line of each slot's allocation, while the trace holds it.
        let mut allocated_at: Vec<Option<usize>> = Vec::new();
        let mut earlier = FxHashMap::default();
        let mut of_op = Vec::with_capacity(ops.len());
        for (i, TraceLine { line, op }) in ops.iter().enumerate() {
            let slot = match op {
                TraceOp::Alloc { id, .. } | TraceOp::AllocInPool { id, .. } => {
                    let next = slot_of.len() as Slot;
                    let slot = *slot_of.entry(id.as_str()).or_insert(next);
                    if slot == next {
                        allocated_at.push(None);
                    }
                    if let Some(first) = allocated_at[slot as usize].replace(*line) {
                        earlier.insert(i, first);
                    }
                    slot
                }
                TraceOp::Free { id } | TraceOp::RecordStream { id, .. } => {
                    match slot_of.get(id.as_str()).copied().filter(|&s| allocated_at[s as usize].is_some()) {
                        Some(s) if matches!(op, TraceOp::Free { .. }) => {
                            allocated_at[s as usize] = None;
                            s
                        }
                        Some(s) => s,
                        None => NO_SLOT,
                    }
                }
                _ => 0,
            };
            of_op.push(slot);
        }
        Slots { of_op, count: slot_of.len(), earlier }
    }

    /// The walk's complaint as the trace's mistake.
    fn error(&self, ops: &[TraceLine], e: WalkError) -> ReplayError {
        let at = e.at();
        let TraceLine { line, op } = &ops[at];
        let line = *line;
        match (e, op) {
            (WalkError::Alloc { error, .. }, _) => ReplayError::Alloc { line, error },
            (WalkError::AlreadyLive { .. }, TraceOp::Alloc { id, .. } | TraceOp::AllocInPool { id, .. }) => {
                ReplayError::DuplicateId { line, id: id.clone(), first: self.earlier.get(&at).copied().unwrap_or(line) }
            }
            (
                _,
                TraceOp::Alloc { id, .. }
                | TraceOp::AllocInPool { id, .. }
                | TraceOp::Free { id }
                | TraceOp::RecordStream { id, .. },
            ) => ReplayError::UnknownId { line, id: id.clone() },
            (e, _) => ReplayError::Alloc { line, error: AllocError::InvalidArgument(e.to_string()) },
        }
    }
}

/// A trace's replay observes its failures: each is reported, and the trace goes on.
struct Failures<'a> {
    ops: &'a [TraceLine],
    ooms: Vec<OomEvent>,
    skipped_frees: usize,
}

impl<D: DeviceMemory, P: Policy> Observer<D, P> for Failures<'_> {
    type Mark = std::convert::Infallible;

    fn failed(&mut self, at: usize, _: Slot, oom: Oom, _: &DeviceCachingAllocator<D, P>) -> Flow {
        let TraceLine { line, op } = &self.ops[at];
        // Only allocations fail.
        if let TraceOp::Alloc { id, .. } | TraceOp::AllocInPool { id, .. } = op {
            self.ooms.push(OomEvent { line: *line, id: id.clone(), oom });
        }
        Flow::Continue
    }

    fn skipped_free(&mut self, _: usize, _: Slot) {
        self.skipped_frees += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jsonl::read_trace;
    use headroom_alloc::units::{GIB, MIB};
    use headroom_alloc::OomKind;

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
        assert_eq!((r.ooms[0].line, r.ooms[0].oom.kind), (2, OomKind::OutOfMemory));
        assert!(r.ooms[0].oom.to_string().contains("Tried to allocate 60.00 MiB"));
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
        // An allocation that failed is not live: its `id` may be allocated again, and the
        // allocation that then holds it is the one a second `alloc` collides with.
        let t = read_trace(
            "{\"op\":\"alloc\",\"id\":1,\"size\":62914560}\n{\"op\":\"alloc\",\"id\":2,\"size\":62914560}\n\
             {\"op\":\"alloc\",\"id\":2,\"size\":1024}\n{\"op\":\"alloc\",\"id\":2,\"size\":1024}\n"
                .as_bytes(),
        )
        .unwrap();
        let e = replay(&t, &opts("", 100 * MIB), |_| {}).unwrap_err();
        assert_eq!(e.to_string(), "line 4: allocation `2` is already live (allocated at line 3)");
        let t = read_trace("{\"op\":\"free\",\"id\":9}\n".as_bytes()).unwrap();
        let e = replay(&t, &opts("", GIB), |_| {}).unwrap_err();
        assert_eq!(e.to_string(), "line 1: `9` is not a live allocation");
    }
}
