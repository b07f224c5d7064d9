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
use headroom_alloc::{
    AllocError, Allocation, AllocatorConfig, DeviceCachingAllocator, DeviceMemory, Oom, OomKind, OomReport, Policy,
    PolicyName, SimDevice, DEFAULT_MEMPOOL,
};
use headroom_trace::walk::{self, Flow, Observer, Slot, Walk};

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

/// The allocation that ran out of memory: where in the program, the tensor's term and site,
/// and the allocator's failure (the tensor's bytes as `requested`, the segment asked of the
/// device as `alloc_size`, PyTorch's "Tried to allocate"; free, allocated and reserved then,
/// after the cache was flushed).
#[derive(Clone, Debug, PartialEq)]
pub struct OutOfMemory {
    pub at: When,
    pub term: crate::program::Term,
    pub site: String,
    pub oom: Oom,
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
    let last_step = program
        .ops
        .iter()
        .filter_map(|o| if let Op::Mark { step, .. } = o { Some(*step) } else { None })
        .max()
        .unwrap_or(0);
    let at = When { step: 0, phase: Phase::Setup, op: 0 };
    let mut peaks = Peaks {
        program,
        last_step,
        at,
        live: ByTerm::default(),
        total: 0,
        out: Replayed {
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
        },
    };
    let walked = Walk::with_slots(program.tensors.len()).run(&mut alloc, walk_ops(program, sizes), &mut peaks);
    let Peaks { mut out, at, total, .. } = peaks;
    if let Err(e) = walked {
        // A program is checked before it is replayed, and the simulator fails only for lack of
        // memory: reported as a failure that asks for everything, should it happen.
        let op = e.at();
        let (requested, term, site) = match program.ops.get(op) {
            Some(&(Op::Alloc(t) | Op::Free(t))) => {
                let tensor = &program.tensors[t as usize];
                let site = program.sites.get(tensor.site as usize).cloned().unwrap_or_default();
                (sizes[t as usize], tensor.term, site)
            }
            _ => (0, crate::program::Term::Temporary, String::new()),
        };
        let report = OomReport {
            requested,
            rounded: requested,
            alloc_size: requested,
            device_total: settings.capacity,
            allocated: total,
            reserved: alloc.reserved_bytes(),
            ..OomReport::default()
        };
        let oom = Oom { kind: OomKind::OutOfMemory, report };
        out.oom = Some(OutOfMemory { at: When { op, ..at }, term, site: format!("{site} ({e})"), oom });
    }
    let stats = alloc.stats();
    out.peak_reserved = out.peak_reserved.max(stats.reserved_bytes.all().peak.max(0) as u64);
    out.device_mallocs = stats.num_device_alloc.max(0) as u64;
    out.device_frees = stats.num_device_free.max(0) as u64;
    out.alloc_retries = stats.num_alloc_retries.max(0) as u64;
    out
}

/// A program's operations as a walk's: a tensor is a slot, its size the one asked.
pub(crate) fn walk_ops<'a>(
    program: &'a Program,
    sizes: &'a [u64],
) -> impl Iterator<Item = (usize, walk::Op<(u32, Phase)>)> + 'a {
    program.ops.iter().enumerate().map(move |(i, op)| {
        let op = match *op {
            Op::Alloc(t) => walk::Op::Alloc {
                slot: t,
                size: sizes[t as usize],
                stream: program.tensors[t as usize].stream,
                pool: DEFAULT_MEMPOOL,
            },
            Op::Free(t) => walk::Op::Free { slot: t },
            Op::EmptyCache => walk::Op::EmptyCache,
            Op::Mark { step, phase } => walk::Op::Mark((step, phase)),
        };
        (i, op)
    })
}

/// What [`replay`] watches: the live bytes by term, their peaks, and the first failure.
struct Peaks<'a> {
    program: &'a Program,
    last_step: u32,
    at: When,
    live: ByTerm,
    total: u64,
    out: Replayed,
}

impl<D: DeviceMemory, P: Policy> Observer<D, P> for Peaks<'_> {
    type Mark = (u32, Phase);

    fn mark(
        &mut self,
        op: usize,
        (step, phase): (u32, Phase),
        _: &mut DeviceCachingAllocator<D, P>,
    ) -> Result<(), AllocError> {
        self.at = When { step, phase, op };
        // A phase holds at least what it began with.
        if step == self.last_step {
            self.out.phase_peaks.raise(phase, self.total);
        }
        Ok(())
    }

    fn allocated(&mut self, op: usize, t: Slot, block: Allocation, alloc: &DeviceCachingAllocator<D, P>) {
        self.at.op = op;
        let out = &mut self.out;
        self.live.add(self.program.tensors[t as usize].term, block.size);
        self.total += block.size;
        if self.total > out.peak_allocated {
            out.peak_allocated = self.total;
            out.at_peak = self.live;
            out.peak_at = self.at;
        }
        if self.at.step == self.last_step {
            out.phase_peaks.raise(self.at.phase, self.total);
        }
        let reserved = alloc.reserved_bytes();
        if reserved > out.peak_reserved {
            out.peak_reserved = reserved;
            out.reserved_peak_at = self.at;
        }
    }

    fn freed(&mut self, _: usize, t: Slot, block: Allocation) {
        self.live.sub(self.program.tensors[t as usize].term, block.size);
        self.total -= block.size;
    }

    fn failed(&mut self, op: usize, t: Slot, oom: Oom, _: &DeviceCachingAllocator<D, P>) -> Flow {
        self.at.op = op;
        let tensor = &self.program.tensors[t as usize];
        let site = self.program.sites.get(tensor.site as usize).cloned().unwrap_or_default();
        self.out.oom = Some(OutOfMemory { at: self.at, term: tensor.term, site, oom });
        Flow::Stop
    }
}
