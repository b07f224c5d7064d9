//! # headroom-alloc
//!
//! A caching device allocator that makes PyTorch's `CUDACachingAllocator`
//! decisions, over any segment source: the simulated GPU [`SimDevice`] here
//! (a CUDA backend is planned, behind the same [`DeviceMemory`] trait).
//!
//! Three layers, as in RMM, cubecl and PyTorch:
//!
//! 1. the segment source, [`DeviceMemory`]: raw device ranges, VMM pages, events;
//! 2. the suballocator, [`DeviceCachingAllocator`]: pools, best fit, split,
//!    merge — the mechanism — with the open choices (the oversize rule, the
//!    out-of-memory ladder, garbage collection, the flush order) behind the
//!    [`Policy`] trait, PyTorch's by default ([`PolicyName`] lists the
//!    others), and [`sizing`]'s pure functions;
//! 3. statistics ([`DeviceStats`], PyTorch's 122 keys), history and snapshots.
//!
//! Device adaptors work over any backend: [`CountingDevice`] counts calls,
//! [`FaultyDevice`] injects out-of-memory failures.
//!
//! | PyTorch | headroom |
//! |---|---|
//! | `DeviceCachingAllocator` | [`DeviceCachingAllocator`] (one device, `&mut self`) |
//! | `NativeCachingAllocator` (thread-safe front) | [`CachingAllocator`] |
//! | `PYTORCH_CUDA_ALLOC_CONF` | [`AllocatorConfig::parse`] |
//! | `torch.cuda.memory_stats()` | [`DeviceCachingAllocator::memory_stats`] |
//! | `torch.cuda.memory_summary()` | [`DeviceCachingAllocator::memory_summary`] |
//! | `torch.cuda.memory._snapshot()` | [`DeviceCachingAllocator::snapshot`] |
//! | `Tensor.record_stream` | [`DeviceCachingAllocator::record_stream`] |
//! | `PrivatePool`, `MempoolId_t` | the private pools, [`MempoolId`] |
//! | `beginAllocateToPool` / `endAllocateToPool` | [`DeviceCachingAllocator::begin_allocate_to_pool`] / [`DeviceCachingAllocator::end_allocate_to_pool`] |
//! | `releasePool`, `emptyCache(mempool_id)` | [`DeviceCachingAllocator::release_pool`], [`DeviceCachingAllocator::empty_cache_pool`] |
//! | `torch.OutOfMemoryError` | [`AllocError`] with an [`OomReport`] |
//!
//! Glossary: a **segment** is one device allocation (or one virtual
//! reservation, for expandable segments); a **block** is a piece of a
//! segment, allocated or free; a **page** is the unit an expandable segment
//! maps (2 MiB small pool, 20 MiB large pool); the **small pool** serves
//! rounded requests up to 1 MiB, the **large pool** the rest; a **private
//! pool** (a CUDA graph's, a `torch.cuda.MemPool`'s) has a small and a large
//! pool of its own, whose segments no other pool's requests use.
//!
//! ```
//! use headroom_alloc::{AllocatorConfig, CachingAllocator, SimDevice, units::GIB};
//!
//! let alloc = CachingAllocator::new(SimDevice::new(80 * GIB), AllocatorConfig::default());
//! let a = alloc.malloc(3_000_000, 0).unwrap();      // a 20 MiB segment, split
//! alloc.free(a.ptr).unwrap();                        // cached, not returned
//! let stats = alloc.memory_stats();
//! assert_eq!(stats["reserved_bytes.all.current"], 20 << 20);
//! assert_eq!(stats["allocated_bytes.all.peak"], 3_000_320);
//! alloc.empty_cache().unwrap();
//! assert_eq!(alloc.memory_stats()["reserved_bytes.all.current"], 0);
//! ```

mod addr_map;
mod alloc_lock;
mod allocator;
mod best_fit;
mod block;
mod caching;
pub mod config;
mod counting;
pub mod device;
mod device_cost;
mod error;
mod expandable;
mod faulty;
mod free;
mod free_set;
mod history;
mod mempool;
mod page_history;
mod physical;
mod pointer_map;
pub mod policy;
mod private_pool;
mod release;
mod restore;
pub mod sim;
pub mod sizing;
mod snapshot;
pub mod stats;
mod summary;
pub mod units;
mod validate;

pub use alloc_lock::AllocGuard;
pub use allocator::CachingAllocator;
pub use caching::{Allocation, DeviceCachingAllocator, FreeMemoryCallback};
pub use config::{AllocatorConfig, Backend, ConfigError};
pub use counting::{CountingDevice, DeviceCalls};
pub use device::{DeviceError, DeviceInfo, DeviceMemory, EventId, MemInfo, StreamId};
pub use device_cost::DeviceCosts;
pub use error::{AllocError, Oom, OomKind, OomReport};
pub use faulty::FaultyDevice;
pub use history::{Action, TraceEntry};
pub use mempool::{CaptureFilter, MempoolId, PrivatePoolInfo, DEFAULT_MEMPOOL};
pub use pointer_map::BlockId;
pub use policy::{
    ExpandableFit, ExpandablePolicy, HeadroomPolicy, LifetimePolicy, NamedPolicy, PlannedPolicy, Policy, PolicyName,
    PyTorchPolicy,
};
pub use restore::{ExpandableLayout, LiveBlock};
pub use sim::SimDevice;
pub use snapshot::{BlockSnapshot, BlockState, SegmentSnapshot, Snapshot};
pub use stats::{DeviceStats, PoolKind, Stat};
pub use summary::memory_summary;
pub use validate::InvariantViolation;
