//! `CachingAllocator`: the thread-safe allocator (`Send + Sync`), one lock
//! around one device's [`DeviceCachingAllocator`], as in PyTorch (a mutex
//! there; here [`AllocLock`], released with a plain store).
//!
//! The lock is held across the device call. PyTorch does the same by
//! default and releases it around `cudaMalloc` only with
//! `release_lock_on_cudamalloc:True`, which then needs extra care (another
//! thread may free or split blocks of the same pool meanwhile). headroom
//! parses that setting and does not act on it: over the simulated device a
//! call takes nanoseconds, so holding the lock costs nothing, and one lock
//! keeps every invariant checkable after every call. A CUDA backend where
//! `cudaMalloc` stalls other threads is where releasing it would pay.

use crate::alloc_lock::{AllocGuard, AllocLock};
use crate::caching::{Allocation, DeviceCachingAllocator};
use crate::config::{AllocatorConfig, ConfigError};
use crate::device::{DeviceMemory, StreamId};
use crate::error::AllocError;
use crate::policy::{Policy, PyTorchPolicy};
use crate::snapshot::Snapshot;
use crate::validate::InvariantViolation;
use std::collections::BTreeMap;

/// A caching allocator that many threads can share.
pub struct CachingAllocator<D: DeviceMemory, P: Policy = PyTorchPolicy> {
    inner: AllocLock<DeviceCachingAllocator<D, P>>,
}

impl<D: DeviceMemory> CachingAllocator<D> {
    /// An allocator with `config` over `device`, making PyTorch's choices.
    pub fn new(device: D, config: AllocatorConfig) -> Self {
        CachingAllocator { inner: AllocLock::new(DeviceCachingAllocator::new(device, config)) }
    }
}

impl<D: DeviceMemory, P: Policy> CachingAllocator<D, P> {
    /// An allocator with `config` over `device`, making `policy`'s choices.
    pub fn with_policy(device: D, config: AllocatorConfig, policy: P) -> Self {
        CachingAllocator { inner: AllocLock::new(DeviceCachingAllocator::with_policy(device, config, policy)) }
    }

    /// Locks the allocator for several calls in a row, or for the calls not
    /// repeated here (history, callbacks, device control).
    pub fn lock(&self) -> AllocGuard<'_, DeviceCachingAllocator<D, P>> {
        self.inner.lock()
    }

    /// See [`DeviceCachingAllocator::malloc`].
    pub fn malloc(&self, size: u64, stream: StreamId) -> Result<Allocation, AllocError> {
        self.lock().malloc(size, stream)
    }

    /// See [`DeviceCachingAllocator::free`].
    pub fn free(&self, ptr: u64) -> Result<(), AllocError> {
        self.lock().free(ptr)
    }

    /// See [`DeviceCachingAllocator::record_stream`].
    pub fn record_stream(&self, ptr: u64, stream: StreamId) -> Result<(), AllocError> {
        self.lock().record_stream(ptr, stream)
    }

    /// See [`DeviceCachingAllocator::empty_cache`].
    pub fn empty_cache(&self) -> Result<(), AllocError> {
        self.lock().empty_cache()
    }

    /// See [`DeviceCachingAllocator::set_memory_fraction`].
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<(), AllocError> {
        self.lock().set_memory_fraction(fraction)
    }

    /// See [`DeviceCachingAllocator::set_allocator_settings`].
    pub fn set_allocator_settings(&self, conf: &str) -> Result<(), ConfigError> {
        self.lock().set_allocator_settings(conf)
    }

    /// See [`DeviceCachingAllocator::memory_stats`].
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        self.lock().memory_stats()
    }

    /// See [`DeviceCachingAllocator::memory_summary`].
    pub fn memory_summary(&self, abbreviated: bool) -> String {
        self.lock().memory_summary(abbreviated)
    }

    /// See [`DeviceCachingAllocator::snapshot`].
    pub fn snapshot(&self) -> Snapshot {
        self.lock().snapshot()
    }

    /// See [`DeviceCachingAllocator::validate`].
    pub fn validate(&self) -> Result<(), InvariantViolation> {
        self.lock().validate()
    }

    /// Runs `f` on the device (to complete events or inject faults in a simulation).
    pub fn with_device<R>(&self, f: impl FnOnce(&mut D) -> R) -> R {
        f(self.lock().device_mut())
    }

    /// The single-threaded allocator inside.
    pub fn into_inner(self) -> DeviceCachingAllocator<D, P> {
        self.inner.into_inner()
    }
}
