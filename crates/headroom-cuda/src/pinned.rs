//! Page-locked host memory, and copies between it and the device that run
//! asynchronously on a stream (what `pin_memory=True` and `non_blocking=True`
//! give a PyTorch user).

use crate::device::CudaDevice;
use crate::driver::backend;
use cudarc::driver::result;
use headroom_alloc::{DeviceError, StreamId};

/// A page-locked host buffer of bytes.
pub struct PinnedBuffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain host memory owned by this value; the driver may be asked to
// copy from or to it from any thread.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    /// `len` bytes of page-locked memory, zeroed.
    pub fn new(device: &mut CudaDevice, len: usize) -> Result<PinnedBuffer, DeviceError> {
        device.bind()?;
        // SAFETY: a fresh allocation of `len` bytes (at least one, so the pointer is not null).
        let ptr = unsafe { result::malloc_host(len.max(1), 0) }.map_err(|e| backend("cuMemHostAlloc", e))? as *mut u8;
        // SAFETY: `ptr` holds `len` writable bytes.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(PinnedBuffer { ptr, len })
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` initialised bytes for the buffer's life.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably once.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Queues a copy of the whole buffer to device address `dst` on `stream`. The buffer
    /// must not change until the stream has run the copy (an event recorded after it).
    pub fn copy_to_device(&self, device: &mut CudaDevice, dst: u64, stream: StreamId) -> Result<(), DeviceError> {
        let s = device.stream(stream)?;
        // SAFETY: `dst` is device memory of at least `len` bytes the caller owns; the source
        // stays alive and unchanged until the copy has run (the caller's promise above).
        unsafe { result::memcpy_htod_async(dst, self.as_slice(), s) }.map_err(|e| backend("cuMemcpyHtoDAsync", e))
    }

    /// Queues a copy of `len` bytes from device address `src` into the buffer on `stream`;
    /// read the buffer only once the stream has run it.
    pub fn copy_from_device(&mut self, device: &mut CudaDevice, src: u64, stream: StreamId) -> Result<(), DeviceError> {
        let s = device.stream(stream)?;
        // SAFETY: as for `copy_to_device`, the other way.
        unsafe { result::memcpy_dtoh_async(self.as_mut_slice(), src, s) }.map_err(|e| backend("cuMemcpyDtoHAsync", e))
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by `cuMemHostAlloc` in `new`, freed once.
        let _ = unsafe { result::free_host(self.ptr as *mut std::ffi::c_void) };
    }
}
