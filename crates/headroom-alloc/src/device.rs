//! The segment source: the narrow interface between the caching allocator and
//! a device (the simulated GPU in [`crate::sim`], or CUDA).
//!
//! The allocator asks a device for whole segments (`cudaMalloc`-like), for
//! virtual ranges and pages within them (the VMM calls behind expandable
//! segments), and for events on streams (to know when memory used by another
//! stream may be reused). Everything about carving segments into blocks lives
//! above this trait.

use std::fmt;

/// A stream, by the integer value of its handle (`cudaStream_t`); 0 is the
/// default stream. PyTorch orders free blocks by this value, and so does headroom.
pub type StreamId = u64;

/// A device event recorded on a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub u64);

/// What a device is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device memory in bytes (`totalGlobalMem`).
    pub total_bytes: u64,
    /// Granularity of VMM mappings, or `None` if the device cannot map pages.
    pub vmm_granularity: Option<u64>,
    /// A name for messages.
    pub name: String,
}

/// Why a device call failed, split by what the caller can do about it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// Not enough free device memory now; freeing cached memory may help.
    #[error("device out of memory: asked for {requested} bytes with {free} of {total} free")]
    OutOfMemory { requested: u64, free: u64, total: u64 },
    /// The request is larger than the device: nothing will make it fit.
    #[error("request of {requested} bytes can never fit on a device of {total} bytes")]
    NeverFits { requested: u64, total: u64 },
    /// The device does not support this operation (for example VMM mapping).
    #[error("unsupported by this device: {0}")]
    Unsupported(&'static str),
    /// The call was malformed (an unknown pointer, an unaligned range): a bug in the caller.
    #[error("invalid device call: {0}")]
    Invalid(String),
    /// The device failed for another reason (driver error, lost device).
    #[error("device failure: {0}")]
    Backend(String),
}

impl DeviceError {
    /// True for the two "no memory" outcomes that the allocator's out-of-memory
    /// ladder handles; other errors are returned to the caller at once.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, DeviceError::OutOfMemory { .. } | DeviceError::NeverFits { .. })
    }
}

/// Free and total device memory, as `cudaMemGetInfo` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    pub free: u64,
    pub total: u64,
}

impl fmt::Display for MemInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} free of {}", self.free, self.total)
    }
}

/// A source of device memory and stream events.
///
/// Implementations must be deterministic for a given sequence of calls when
/// they are simulations, so that replays reproduce.
pub trait DeviceMemory: Send {
    /// Static facts about the device.
    fn info(&self) -> DeviceInfo;

    /// Free and total memory now (`cudaMemGetInfo`).
    fn mem_get_info(&self) -> MemInfo;

    /// Allocates a segment of `size` bytes (`cudaMalloc`).
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError>;

    /// Returns a segment obtained from [`DeviceMemory::malloc`] (`cudaFree`).
    fn free(&mut self, ptr: u64, size: u64) -> Result<(), DeviceError>;

    /// Reserves `size` bytes of virtual address space, with no memory behind
    /// it (`cuMemAddressReserve`). `size` is a multiple of the VMM granularity.
    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError>;

    /// Releases a reservation whose pages are all unmapped (`cuMemAddressFree`).
    fn release_reservation(&mut self, va: u64, size: u64) -> Result<(), DeviceError>;

    /// Creates physical memory for `[va, va + size)` in pages of `page` bytes,
    /// each one physical allocation, and maps it (`cuMemCreate` + `cuMemMap` +
    /// `cuMemSetAccess` per page). `page` is any multiple of the VMM
    /// granularity: the whole range as one allocation when it is `size`.
    /// All or nothing: on failure no page of the range stays mapped.
    fn map(&mut self, va: u64, size: u64, page: u64) -> Result<(), DeviceError>;

    /// Unmaps and releases the pages of `[va, va + size)` (whole physical
    /// allocations of `page` bytes, as mapped), after the work on `stream`
    /// that may use them has finished (`cuMemUnmap` + `cuMemRelease`).
    fn unmap(&mut self, va: u64, size: u64, page: u64, stream: StreamId) -> Result<(), DeviceError>;

    /// Records an event on `stream` (`cudaEventRecord`).
    fn record_event(&mut self, stream: StreamId) -> Result<EventId, DeviceError>;

    /// True once the work before the event has finished (`cudaEventQuery`).
    fn query_event(&mut self, event: EventId) -> Result<bool, DeviceError>;

    /// Waits for the event (`cudaEventSynchronize`).
    fn synchronize_event(&mut self, event: EventId) -> Result<(), DeviceError>;

    /// Returns an event that is no longer needed.
    fn destroy_event(&mut self, event: EventId);

    /// Waits for all work on the device (`cudaDeviceSynchronize`): every event
    /// recorded so far completes.
    fn synchronize(&mut self) -> Result<(), DeviceError>;
}

impl<D: DeviceMemory + ?Sized> DeviceMemory for Box<D> {
    fn info(&self) -> DeviceInfo {
        (**self).info()
    }
    fn mem_get_info(&self) -> MemInfo {
        (**self).mem_get_info()
    }
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        (**self).malloc(size)
    }
    fn free(&mut self, ptr: u64, size: u64) -> Result<(), DeviceError> {
        (**self).free(ptr, size)
    }
    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError> {
        (**self).reserve(size)
    }
    fn release_reservation(&mut self, va: u64, size: u64) -> Result<(), DeviceError> {
        (**self).release_reservation(va, size)
    }
    fn map(&mut self, va: u64, size: u64, page: u64) -> Result<(), DeviceError> {
        (**self).map(va, size, page)
    }
    fn unmap(&mut self, va: u64, size: u64, page: u64, stream: StreamId) -> Result<(), DeviceError> {
        (**self).unmap(va, size, page, stream)
    }
    fn record_event(&mut self, stream: StreamId) -> Result<EventId, DeviceError> {
        (**self).record_event(stream)
    }
    fn query_event(&mut self, event: EventId) -> Result<bool, DeviceError> {
        (**self).query_event(event)
    }
    fn synchronize_event(&mut self, event: EventId) -> Result<(), DeviceError> {
        (**self).synchronize_event(event)
    }
    fn destroy_event(&mut self, event: EventId) {
        (**self).destroy_event(event)
    }
    fn synchronize(&mut self) -> Result<(), DeviceError> {
        (**self).synchronize()
    }
}
