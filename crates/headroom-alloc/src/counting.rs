//! `CountingDevice`: counts every call made of the device it wraps, for any
//! backend (RMM's statistics adaptor). Tests assert how often the allocator
//! asks the device; benchmarks report device calls per operation.

use crate::device::{DeviceError, DeviceInfo, DeviceMemory, EventId, MemInfo, StreamId};

/// How many calls of each kind a [`CountingDevice`] has passed on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCalls {
    pub malloc: u64,
    pub free: u64,
    pub reserve: u64,
    pub release_reservation: u64,
    pub map: u64,
    pub unmap: u64,
    /// Physical allocations mapped and unmapped: the pages of the size each
    /// `map` or `unmap` call names (a run mapped as one allocation counts once).
    pub pages_mapped: u64,
    pub pages_unmapped: u64,
    pub record_event: u64,
    pub query_event: u64,
    pub synchronize_event: u64,
    /// `malloc` and `map` calls the device answered with out of memory.
    pub failed_allocations: u64,
}

/// A device that counts the calls it passes on to `D`.
#[derive(Clone, Debug)]
pub struct CountingDevice<D> {
    inner: D,
    calls: DeviceCalls,
}

impl<D: DeviceMemory> CountingDevice<D> {
    pub fn new(inner: D) -> Self {
        CountingDevice { inner, calls: DeviceCalls::default() }
    }

    /// Call counts so far.
    pub fn calls(&self) -> DeviceCalls {
        self.calls
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    pub fn inner_mut(&mut self) -> &mut D {
        &mut self.inner
    }

    fn count_failure<T>(&mut self, r: Result<T, DeviceError>) -> Result<T, DeviceError> {
        if r.as_ref().is_err_and(DeviceError::is_out_of_memory) {
            self.calls.failed_allocations += 1;
        }
        r
    }
}

impl<D: DeviceMemory> DeviceMemory for CountingDevice<D> {
    fn info(&self) -> DeviceInfo {
        self.inner.info()
    }

    fn mem_get_info(&self) -> MemInfo {
        self.inner.mem_get_info()
    }

    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.calls.malloc += 1;
        let r = self.inner.malloc(size);
        self.count_failure(r)
    }

    fn free(&mut self, ptr: u64, size: u64) -> Result<(), DeviceError> {
        self.calls.free += 1;
        self.inner.free(ptr, size)
    }

    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.calls.reserve += 1;
        self.inner.reserve(size)
    }

    fn release_reservation(&mut self, va: u64, size: u64) -> Result<(), DeviceError> {
        self.calls.release_reservation += 1;
        self.inner.release_reservation(va, size)
    }

    fn map(&mut self, va: u64, size: u64, page: u64) -> Result<(), DeviceError> {
        self.calls.map += 1;
        let r = self.inner.map(va, size, page);
        if r.is_ok() {
            self.calls.pages_mapped += size / page;
        }
        self.count_failure(r)
    }

    fn unmap(&mut self, va: u64, size: u64, page: u64, stream: StreamId) -> Result<(), DeviceError> {
        self.calls.unmap += 1;
        let r = self.inner.unmap(va, size, page, stream);
        if r.is_ok() {
            self.calls.pages_unmapped += size / page;
        }
        r
    }

    fn record_event(&mut self, stream: StreamId) -> Result<EventId, DeviceError> {
        self.calls.record_event += 1;
        self.inner.record_event(stream)
    }

    fn query_event(&mut self, event: EventId) -> Result<bool, DeviceError> {
        self.calls.query_event += 1;
        self.inner.query_event(event)
    }

    fn synchronize_event(&mut self, event: EventId) -> Result<(), DeviceError> {
        self.calls.synchronize_event += 1;
        self.inner.synchronize_event(event)
    }

    fn destroy_event(&mut self, event: EventId) {
        self.inner.destroy_event(event)
    }
    fn synchronize(&mut self) -> Result<(), DeviceError> {
        self.inner.synchronize()
    }
}
