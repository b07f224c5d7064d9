//! # headroom-cuda
//!
//! headroom's device trait ([`headroom_alloc::DeviceMemory`]) over a real GPU,
//! through the CUDA driver API, so that the same caching allocator that runs
//! on the simulator runs on the hardware.
//!
//! cudarc binds the driver at run time (dlopen of `libcuda.so`): this crate
//! builds and its tests run on machines with no CUDA at all, where
//! [`CudaDevice::new`] returns [`Unavailable::NoDriver`]. cudarc panics on
//! the first driver call when the library is missing, so [`driver::available`]
//! looks for it before any call, and every way in goes through it.
//!
//! What the allocator asks for maps onto the driver as PyTorch's
//! `CUDACachingAllocator` maps it ([`device`]): segments from `cuMemAlloc`;
//! expandable segments from the VMM calls (`cuMemAddressReserve`, then per
//! page `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`; unmapping waits for the
//! stream first, as `ExpandableSegment::unmapHandles` does); events recorded
//! on streams, pooled and reused. [`pinned`] holds page-locked host buffers
//! with asynchronous copies.

pub mod device;
pub mod driver;
pub mod pinned;

pub use device::{CudaDevice, Streams};
pub use driver::{available, Unavailable};
pub use pinned::PinnedBuffer;
