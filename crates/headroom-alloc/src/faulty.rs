//! `FaultyDevice`: makes the device it wraps say no — the Nth allocation,
//! every allocation until told otherwise, or whatever memory another process
//! is pretended to hold — for any backend (RMM's failure adaptor). Tests use
//! it to drive the out-of-memory ladder; snapshot replays use it to repeat a
//! recorded device's refusals.

use crate::device::{DeviceError, DeviceInfo, DeviceMemory, EventId, MemInfo, StreamId};

/// A device that refuses allocations of `D` on request. See the module documentation.
#[derive(Clone, Debug)]
pub struct FaultyDevice<D> {
    inner: D,
    fail_in: Option<u64>,
    refuse: bool,
    external: u64,
}

impl<D: DeviceMemory> FaultyDevice<D> {
    pub fn new(inner: D) -> Self {
        FaultyDevice { inner, fail_in: None, refuse: false, external: 0 }
    }

    /// Makes the `n`th allocation from now (1 = the next; `malloc` and `map`
    /// both count) fail as out of memory.
    pub fn fail_nth_allocation(&mut self, n: u64) {
        self.fail_in = Some(n.max(1));
    }

    /// Forgets a failure [`FaultyDevice::fail_nth_allocation`] made due and
    /// that has not happened (no allocation was asked for since).
    pub fn cancel_failure(&mut self) {
        self.fail_in = None;
    }

    /// Makes every allocation (`malloc` and `map`) fail as out of memory
    /// until called with `false`.
    pub fn refuse_allocations(&mut self, yes: bool) {
        self.refuse = yes;
    }

    /// Pretends another process holds `bytes` of this device's memory: they
    /// are not free, and allocations that would need them fail.
    pub fn set_external_usage(&mut self, bytes: u64) {
        self.external = bytes;
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    pub fn inner_mut(&mut self) -> &mut D {
        &mut self.inner
    }

    /// Out of memory if a fault is due or `size` does not fit beside the external usage.
    fn check(&mut self, size: u64) -> Result<(), DeviceError> {
        let due = self.refuse
            || self.fail_in.as_mut().is_some_and(|n| {
                *n -= 1;
                *n == 0
            });
        if self.fail_in == Some(0) {
            self.fail_in = None;
        }
        let info = self.mem_get_info();
        if due || (size <= info.total && size > info.free && self.external > 0) {
            return Err(DeviceError::OutOfMemory { requested: size, free: info.free, total: info.total });
        }
        Ok(())
    }
}

impl<D: DeviceMemory> DeviceMemory for FaultyDevice<D> {
    fn info(&self) -> DeviceInfo {
        self.inner.info()
    }

    fn mem_get_info(&self) -> MemInfo {
        let m = self.inner.mem_get_info();
        MemInfo { free: m.free.saturating_sub(self.external), total: m.total }
    }

    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.check(size)?;
        self.inner.malloc(size)
    }

    fn free(&mut self, ptr: u64, size: u64) -> Result<(), DeviceError> {
        self.inner.free(ptr, size)
    }

    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.inner.reserve(size)
    }

    fn release_reservation(&mut self, va: u64, size: u64) -> Result<(), DeviceError> {
        self.inner.release_reservation(va, size)
    }

    fn map(&mut self, va: u64, size: u64, page: u64) -> Result<(), DeviceError> {
        self.check(size)?;
        self.inner.map(va, size, page)
    }

    fn unmap(&mut self, va: u64, size: u64, page: u64, stream: StreamId) -> Result<(), DeviceError> {
        self.inner.unmap(va, size, page, stream)
    }

    fn record_event(&mut self, stream: StreamId) -> Result<EventId, DeviceError> {
        self.inner.record_event(stream)
    }

    fn query_event(&mut self, event: EventId) -> Result<bool, DeviceError> {
        self.inner.query_event(event)
    }

    fn synchronize_event(&mut self, event: EventId) -> Result<(), DeviceError> {
        self.inner.synchronize_event(event)
    }

    fn destroy_event(&mut self, event: EventId) {
        self.inner.destroy_event(event)
    }
    fn synchronize(&mut self) -> Result<(), DeviceError> {
        self.inner.synchronize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counting::CountingDevice;
    use crate::sim::SimDevice;
    use crate::units::MIB;

    #[test]
    fn external_usage_and_the_nth_failure_over_any_device() {
        let mut d = CountingDevice::new(FaultyDevice::new(SimDevice::new(100 * MIB)));
        assert!(matches!(d.malloc(101 * MIB), Err(DeviceError::NeverFits { .. })));
        d.inner_mut().set_external_usage(90 * MIB);
        assert_eq!(d.mem_get_info().free, 10 * MIB);
        assert!(matches!(d.malloc(20 * MIB), Err(DeviceError::OutOfMemory { free, .. }) if free == 10 * MIB));
        d.inner_mut().set_external_usage(0);
        d.inner_mut().fail_nth_allocation(2);
        let p = d.malloc(20 * MIB).unwrap();
        assert!(d.malloc(20 * MIB).is_err());
        d.malloc(20 * MIB).unwrap();
        d.free(p, 20 * MIB).unwrap();
        assert_eq!(d.inner().inner().used_bytes(), 20 * MIB);
        assert_eq!(d.calls().failed_allocations, 3);
        assert_eq!(d.calls().malloc, 5);
        d.inner_mut().refuse_allocations(true);
        assert!(d.malloc(MIB * 2).is_err());
        d.inner_mut().refuse_allocations(false);
        d.malloc(MIB * 2).unwrap();
    }
}
