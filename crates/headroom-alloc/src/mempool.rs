//! What names a private pool and what one holds: the ids PyTorch gives CUDA
//! graphs and `MemPool`s, the pool's own free sets and users, and a capture
//! underway. The allocator keeps these as fields; what it does with them is
//! in `private_pool.rs`.

use crate::block::BlockPool;
use crate::device::StreamId;

/// PyTorch's `MempoolId_t`: (0, 0) names the default pools; CUDA graphs take
/// ids (n, 0), `torch.cuda.MemPool`s (0, n).
pub type MempoolId = (u64, u64);

/// The default pools' id.
pub const DEFAULT_MEMPOOL: MempoolId = (0, 0);

/// Says whether a request on a stream goes to the pool of the capture it
/// was given with (PyTorch's `std::function<bool(cudaStream_t)>`).
pub type CaptureFilter = Box<dyn Fn(StreamId) -> bool + Send>;

/// One private pool.
#[derive(Debug)]
pub(crate) struct PrivatePool {
    pub id: MempoolId,
    /// Captures and `MemPool`s using the pool; at 0 the pool is freeable.
    pub use_count: u32,
    pub small: BlockPool,
    pub large: BlockPool,
}

/// A capture underway: requests its filter accepts go to the pool `owner`.
pub(crate) struct Capture {
    pub id: MempoolId,
    pub owner: u32,
    pub filter: CaptureFilter,
}

/// What a private pool holds, for `inspect` and the plug-in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrivatePoolInfo {
    pub id: MempoolId,
    /// 0: released, its cached segments go back at the next flush.
    pub use_count: u32,
    /// Whether a capture is allocating to it now.
    pub capturing: bool,
    /// Segments (or mapped runs of expandable segments) and their bytes.
    pub segments: u64,
    pub reserved_bytes: u64,
    /// Bytes of its blocks handed out and not freed.
    pub allocated_bytes: u64,
}
