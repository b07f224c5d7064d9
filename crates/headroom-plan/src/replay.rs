//! A step program run through headroom's caching allocator: the memory a job reserves,
//! where it peaks, and whether it runs out.
//!
//! The allocator is headroom-alloc's, which makes PyTorch's `CUDACachingAllocator`
//! decisions exactly (or another policy's, or under other `PYTORCH_CUDA_ALLOC_CONF`
//! settings), over a simulated GPU whose capacity is what PyTorch can have of the real
//! one: its memory less what the process holds outside the allocator (the CUDA context,
//! NCCL). An allocation the device cannot serve goes through PyTorch's out-of-memory
//! path — free the cached blocks, retry — and fails only when that fails too: the job
//! runs out of memory exactly where the replay does.

use crate::program::{ByTerm, Op, Phase, PhasePeaks, Program};
use headroom_alloc::{AllocError, AllocatorConfig, DeviceCachingAllocator, PolicyName, SimDevice};

/// How to replay: the device's memory for PyTorch and the allocator's settings.
#[derive(Clone, Debug)]
pub struct ReplaySettings {
    /// Bytes the caching allocator may obtain from the device.
    pub capacity: u64,
    pub config: AllocatorConfig,
    pub policy: PolicyName,
}

/// Where in the program something happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct When {
    /// 1-based; 0 before the first step.
    pub step: u32,
    pub phase: Phase,
    /// Index of the operation.
    pub op: usize,
}

/// The allocation that ran out of memory.
#[derive(Clone, Debug, PartialEq)]
pub struct OutOfMemory {
    pub at: When,
    /// The tensor's bytes.
    pub requested: u64,
    /// The segment asked of the device (PyTorch's "Tried to allocate").
    pub asked: u64,
    /// Free on the device then, after the cache was flushed.
    pub device_free: u64,
    pub allocated: u64,
    pub reserved: u64,
    /// The term and site of the tensor.
    pub term: crate::program::Term,
    pub site: String,
}

/// What the replay measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Replayed {
    /// `torch.cuda.max_memory_allocated()`: the most bytes handed out, as blocks.
    pub peak_allocated: u64,
    /// `torch.cuda.max_memory_reserved()`.
    pub peak_reserved: u64,
    /// Live bytes by term at the allocated peak (block sizes).
    pub at_peak: ByTerm,
    /// When the allocated peak happened.
    pub peak_at: When,
    /// When reserved memory last grew to its peak.
    pub reserved_peak_at: When,
    /// The allocated peak of each phase of the last step replayed (0 for a phase the program
    /// does not have).
    pub phase_peaks: PhasePeaks,
    /// Device allocations (`cudaMalloc`, or page maps) and frees.
    pub device_mallocs: u64,
    pub device_frees: u64,
    /// Requests served only after the allocator freed its cache and asked the device again
    /// (`num_alloc_retries`): each synchronizes the GPU.
    pub alloc_retries: u64,
    /// The first allocation that failed; the replay stops there.
    pub oom: Option<OutOfMemory>,
}

impl Replayed {
    /// Reserved but not allocated at the reserved peak's height: the allocator's rounding,
    /// split blocks and cache.
    pub fn cached(&self) -> u64 {
        self.peak_reserved.saturating_sub(self.peak_allocated)
    }
}

/// Replays `program` at `sizes` (one per tensor, [`Program::sizes`]).
pub fn replay(program: &Program, sizes: &[u64], settings: &ReplaySettings) -> Replayed {
    let device = SimDevice::new(settings.capacity);
    let mut alloc = DeviceCachingAllocator::with_policy(device, settings.config.clone(), settings.policy.build());
    let mut ptrs = vec![u64::MAX; program.tensors.len()];
    let mut blocks = vec![0u64; program.tensors.len()];
    let mut live = ByTerm::default();
    let mut total = 0u64;
    let mut at = When { step: 0, phase: Phase::Setup, op: 0 };
    let mut out = Replayed {
        peak_allocated: 0,
        peak_reserved: 0,
        at_peak: ByTerm::default(),
        peak_at: at,
        reserved_peak_at: at,
        phase_peaks: PhasePeaks::default(),
        device_mallocs: 0,
        alloc_retries: 0,
        device_frees: 0,
        oom: None,
    };
    let last_step = program
        .ops
        .iter()
        .filter_map(|o| if let Op::Mark { step, .. } = o { Some(*step) } else { None })
        .max()
        .unwrap_or(0);
    for (i, op) in program.ops.iter().enumerate() {
        at.op = i;
        match *op {
            Op::Mark { step, phase } => {
                at.step = step;
                at.phase = phase;
                // A phase holds at least what it began with.
                if step == last_step {
                    out.phase_peaks.raise(phase, total);
                }
            }
            Op::Alloc(t) => {
                let tensor = &program.tensors[t as usize];
                match alloc.malloc(sizes[t as usize], tensor.stream) {
                    Ok(a) => {
                        ptrs[t as usize] = a.ptr;
                        blocks[t as usize] = a.size;
                        live.add(tensor.term, a.size);
                        total += a.size;
                        if total > out.peak_allocated {
                            out.peak_allocated = total;
                            out.at_peak = live;
                            out.peak_at = at;
                        }
                        if at.step == last_step {
                            out.phase_peaks.raise(at.phase, total);
                        }
                        let reserved = alloc.reserved_bytes();
                        if reserved > out.peak_reserved {
                            out.peak_reserved = reserved;
                            out.reserved_peak_at = at;
                        }
                    }
                    Err(e) => {
                        let report = e.oom_report().cloned();
                        let site = program.sites.get(tensor.site as usize).cloned().unwrap_or_default();
                        out.oom = Some(match report {
                            Some(r) => OutOfMemory {
                                at,
                                requested: sizes[t as usize],
                                asked: r.alloc_size,
                                device_free: r.device_free,
                                allocated: r.allocated,
                                reserved: r.reserved,
                                term: tensor.term,
                                site,
                            },
                            // Not a lack of memory (the simulator has no other failure):
                            // reported as one that asks for everything.
                            None => OutOfMemory {
                                at,
                                requested: sizes[t as usize],
                                asked: sizes[t as usize],
                                device_free: 0,
                                allocated: total,
                                reserved: alloc.reserved_bytes(),
                                term: tensor.term,
                                site: format!("{site} ({})", describe(&e)),
                            },
                        });
                        break;
                    }
                }
            }
            Op::EmptyCache => {
                // Nothing else can fail: a simulated device gives every segment back.
                let _ = alloc.empty_cache();
            }
            Op::Free(t) => {
                let ptr = ptrs[t as usize];
                if ptr == u64::MAX {
                    continue;
                }
                // A program is checked before it is replayed: a free of a live tensor cannot fail.
                let _ = alloc.free(ptr);
                ptrs[t as usize] = u64::MAX;
                let n = blocks[t as usize];
                live.sub(program.tensors[t as usize].term, n);
                total -= n;
            }
        }
    }
    let stats = alloc.stats();
    out.peak_reserved = out.peak_reserved.max(stats.reserved_bytes[0].peak.max(0) as u64);
    out.device_mallocs = stats.num_device_alloc.max(0) as u64;
    out.device_frees = stats.num_device_free.max(0) as u64;
    out.alloc_retries = stats.num_alloc_retries.max(0) as u64;
    out
}

fn describe(e: &AllocError) -> String {
    e.to_string()
}
