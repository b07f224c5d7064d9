//! Allocation errors, split by what the caller can do about them.

use crate::device::{DeviceError, StreamId};
use crate::units::format_size;
use std::fmt;

/// Everything known when an allocation failed: PyTorch's OOM message fields,
/// plus the fragmentation figures PyTorch users have asked for (pytorch#29554).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OomReport {
    pub device: u32,
    pub stream: StreamId,
    /// The caller's size.
    pub requested: u64,
    /// The rounded block size.
    pub rounded: u64,
    /// The segment size that was asked of the device; PyTorch's "Tried to allocate".
    pub alloc_size: u64,
    pub device_total: u64,
    pub device_free: u64,
    /// The per-process limit, when a memory fraction is set.
    pub allowed: Option<u64>,
    /// `allocated_bytes.all.current`.
    pub allocated: u64,
    /// `reserved_bytes.all.current`.
    pub reserved: u64,
    /// The largest free cached block, on any stream.
    pub largest_free_block: u64,
    /// Cached bytes that cannot be released because their segments are split
    /// (`inactive_split_bytes.all.current`).
    pub split_fragment_bytes: u64,
    /// Free cached blocks of private pools (CUDA graphs, `MemPool`s): only
    /// their pools may use them, so PyTorch counts them as allocated.
    pub free_in_private_pools: u64,
}

impl OomReport {
    /// Reserved by the allocator but not allocated to anyone.
    pub fn reserved_unallocated(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated).saturating_sub(self.free_in_private_pools)
    }
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.requested >= crate::sizing::ONE_EXABYTE {
            // PyTorch refuses these before looking at the device, with this message.
            return write!(f, "CUDA out of memory. Tried to allocate more than 1EB memory.");
        }
        write!(
            f,
            "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} is free. ",
            format_size(self.alloc_size),
            self.device,
            format_size(self.device_total),
            format_size(self.device_free)
        )?;
        if let Some(a) = self.allowed {
            write!(f, "{} allowed; ", format_size(a))?;
        }
        let private = match self.free_in_private_pools {
            0 => String::new(),
            p => format!("with {} allocated in private pools (e.g., CUDA Graphs), ", format_size(p)),
        };
        write!(
            f,
            "Of the allocated memory {} is allocated by PyTorch, {private}and {} is reserved by PyTorch but unallocated. \
             If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
             to avoid fragmentation.  See documentation for Memory Management  \
             (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
            format_size(self.allocated + self.free_in_private_pools),
            format_size(self.reserved_unallocated())
        )?;
        write!(
            f,
            "\nheadroom: largest free block {}; {} of the reserved-but-unallocated memory is in split segments \
             that empty_cache cannot release.",
            format_size(self.largest_free_block),
            format_size(self.split_fragment_bytes)
        )
    }
}

/// Why an allocation or call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// The request is larger than the device (or 1 EB or more): nothing will make it fit.
    #[error("{0}")]
    NeverFits(Box<OomReport>),
    /// Out of device memory now, after the cache was flushed: free tensors and retry.
    #[error("{0}")]
    OutOfMemory(Box<OomReport>),
    /// The per-process memory fraction forbids it; raise the fraction or free memory.
    #[error("{0}")]
    OverLimit(Box<OomReport>),
    /// The pointer was not allocated by this allocator, or was already freed.
    #[error("pointer {0:#x} was not allocated by this allocator or is already freed")]
    InvalidPointer(u64),
    /// An argument out of its range (a fraction outside [0, 1], say).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The device failed for a reason other than lack of memory.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

impl AllocError {
    /// The out-of-memory report, for the three out-of-memory variants.
    pub fn oom_report(&self) -> Option<&OomReport> {
        match self {
            AllocError::NeverFits(r) | AllocError::OutOfMemory(r) | AllocError::OverLimit(r) => Some(r),
            _ => None,
        }
    }

    /// Which lack of memory it was, for the three out-of-memory variants.
    pub fn oom_kind(&self) -> Option<OomKind> {
        match self {
            AllocError::NeverFits(_) => Some(OomKind::NeverFits),
            AllocError::OutOfMemory(_) => Some(OomKind::OutOfMemory),
            AllocError::OverLimit(_) => Some(OomKind::OverLimit),
            _ => None,
        }
    }

    /// The out-of-memory error as a record of its own: its kind and report.
    pub fn into_oom(self) -> Result<Oom, AllocError> {
        match self {
            AllocError::NeverFits(r) => Ok(Oom { kind: OomKind::NeverFits, report: *r }),
            AllocError::OutOfMemory(r) => Ok(Oom { kind: OomKind::OutOfMemory, report: *r }),
            AllocError::OverLimit(r) => Ok(Oom { kind: OomKind::OverLimit, report: *r }),
            e => Err(e),
        }
    }
}

/// Which lack of memory refused an allocation: what the caller can do differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OomKind {
    /// Out of device memory now, after the cache was flushed.
    OutOfMemory,
    /// The per-process memory fraction forbids it.
    OverLimit,
    /// Larger than the device, or 1 EB or more.
    NeverFits,
}

impl OomKind {
    /// The name traces and `--json` use: `out_of_memory`, `over_limit`, `never_fits`.
    pub fn name(self) -> &'static str {
        match self {
            OomKind::OutOfMemory => "out_of_memory",
            OomKind::OverLimit => "over_limit",
            OomKind::NeverFits => "never_fits",
        }
    }
}

/// An allocation refused for lack of memory: the one record every replay
/// keeps of it, beside where it happened in the replay's own terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Oom {
    pub kind: OomKind,
    pub report: OomReport,
}

impl fmt::Display for Oom {
    /// PyTorch's message with headroom's fragmentation figures.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.report.fmt(f)
    }
}
