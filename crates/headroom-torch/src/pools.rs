//! The three hooks PyTorch's `CUDAPluggableAllocator` calls for private
//! pools, set with `set_begin_allocate_to_pool`, `set_end_allocate_to_pool_fn`
//! and `set_release_pool` (`headroom_gpu.torch_allocator.use` sets them): a
//! `torch.cuda.graph` capture, `torch.cuda.use_mem_pool(pool)` and a
//! `reduce-overhead` compile allocate into the pool while its capture is
//! underway, and the pool's memory goes back once its last user releases it.
//!
//! PyTorch calls them as C++ functions of these types:
//!
//! ```text
//! void begin(int device, MempoolId_t id, std::function<bool(cudaStream_t)> filter);
//! void end(int device, MempoolId_t id);
//! void release(int device, MempoolId_t id);
//! ```
//!
//! `MempoolId_t` is a `std::pair` of two 64-bit integers: trivially copyable,
//! it travels as two integer arguments. The filter has a destructor, so the
//! hook receives a pointer to PyTorch's copy; the C++ shim (`cpp/filter.cpp`)
//! moves it to the heap, and the allocator keeps it as an opaque pointer.
//!
//! With PyTorch's own allocator a `torch.cuda.MemPool` holds one use of its
//! pool from its construction (`createOrIncrefPool`), which a pluggable
//! allocator is never told of; `~MemPool` releases it all the same. So a
//! pool of a `MemPool`'s ids, (0, n), is made with that use counted: its
//! memory stays the pool's until the `MemPool` is gone, as with PyTorch's.

use crate::{complain, guarded, plugin};
use headroom_alloc::MempoolId;
use std::ffi::{c_int, c_void};

extern "C" {
    fn headroom_filter_take(f: *mut c_void) -> *mut c_void;
    fn headroom_filter_call(f: *mut c_void, stream: *mut c_void) -> bool;
    fn headroom_filter_drop(f: *mut c_void);
}

/// A filter taken from PyTorch, owned.
struct Filter(*mut c_void);

// SAFETY: PyTorch's filters compare a stream's capture id or the calling
// thread with values they captured; PyTorch itself calls them from whichever
// thread allocates, under its allocator's lock, as headroom does under its own.
unsafe impl Send for Filter {}

impl Filter {
    fn accepts(&self, stream: u64) -> bool {
        // SAFETY: `self.0` came from `headroom_filter_take` and lives until `self` drops.
        unsafe { headroom_filter_call(self.0, stream as *mut c_void) }
    }
}

impl Drop for Filter {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from `headroom_filter_take` and is dropped once.
        unsafe { headroom_filter_drop(self.0) }
    }
}

/// `torch.cuda.MemPool` ids are (0, n); graphs' are (n, 0).
fn is_mempool(id: MempoolId) -> bool {
    id.0 == 0 && id.1 != 0
}

/// `CUDAPluggableAllocator`'s begin-allocate-to-pool hook.
///
/// # Safety
/// `filter` points to a live `std::function<bool(cudaStream_t)>`, which this
/// function moves from (PyTorch's copy, made for the call).
#[no_mangle]
pub unsafe extern "C" fn headroom_begin_allocate_to_pool(device: c_int, id0: u64, id1: u64, filter: *mut c_void) {
    // SAFETY: the caller's promise; the moved-from copy stays PyTorch's to destroy.
    let filter = Filter(unsafe { headroom_filter_take(filter) });
    guarded("headroom_begin_allocate_to_pool", (), move || {
        let Some(p) = plugin() else { return };
        let id = (id0, id1);
        let result = p.device(device).and_then(|a| {
            let mut a = a.lock();
            if is_mempool(id) && a.pool_use_count(id).is_none() {
                // The MemPool's own use, which PyTorch's createOrIncrefPool would have counted.
                a.create_or_incref_pool(id).map_err(|e| e.to_string())?;
            }
            a.begin_allocate_to_pool(id, Box::new(move |stream| filter.accepts(stream))).map_err(|e| e.to_string())
        });
        if let Err(e) = result {
            complain(&format!("begin_allocate_to_pool {id:?} on device {device}: {e}"));
        }
    })
}

/// `CUDAPluggableAllocator`'s end-allocate-to-pool hook.
#[no_mangle]
pub extern "C" fn headroom_end_allocate_to_pool(device: c_int, id0: u64, id1: u64) {
    pool_call("headroom_end_allocate_to_pool", device, (id0, id1), |a, id| a.end_allocate_to_pool(id));
}

/// `CUDAPluggableAllocator`'s release-pool hook: one user of the pool is gone;
/// at none its cached memory goes back at the next `empty_cache`.
#[no_mangle]
pub extern "C" fn headroom_release_pool(device: c_int, id0: u64, id1: u64) {
    pool_call("headroom_release_pool", device, (id0, id1), |a, id| a.release_pool(id));
}

/// Runs `f` on `device`'s allocator, saying on stderr why it failed.
fn pool_call(
    what: &str,
    device: c_int,
    id: MempoolId,
    f: impl FnOnce(
        &mut headroom_alloc::DeviceCachingAllocator<Box<dyn headroom_alloc::DeviceMemory>, headroom_alloc::NamedPolicy>,
        MempoolId,
    ) -> Result<(), headroom_alloc::AllocError>,
) {
    guarded(what, (), || {
        let Some(p) = plugin() else { return };
        if let Err(e) = p.device(device).and_then(|a| f(&mut a.lock(), id).map_err(|e| e.to_string())) {
            complain(&format!("{what} {id:?} on device {device}: {e}"));
        }
    })
}
