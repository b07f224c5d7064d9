//! # headroom-trace
//!
//! Allocation traces and what to do with them:
//!
//! - [`compressed`]: inputs read through gzip when they are compressed;
//! - [`jsonl`]: headroom's plain trace format, one operation per line, that
//!   anyone can write to drive the allocator;
//! - [`phase`]: the phases of a step (setup, forward, backward, optimizer step, …): one
//!   vocabulary for the inspector, the planner and the recorded step;
//! - [`recorded_step`]: a device's trace as moments and the training steps found in them —
//!   where a step begins, which phase a moment is in, which steps are whole;
//! - [`replay`]: a trace pushed through the caching allocator on a simulated
//!   GPU under any `PYTORCH_CUDA_ALLOC_CONF`, with peaks, device calls and
//!   out-of-memory errors reported;
//! - [`snapshot_file`]: snapshots written as PyTorch's pickle (protocol 4)
//!   or JSON, which PyTorch's memory viewer opens;
//! - [`synth`]: synthetic workloads (a transformer training loop).
//!
//! ```
//! use headroom_trace::{jsonl::read_trace, replay::{replay, ReplayOptions}};
//! use headroom_alloc::AllocatorConfig;
//!
//! let trace = read_trace(&b"{\"op\":\"alloc\",\"id\":1,\"size\":3000000}\n{\"op\":\"free\",\"id\":1}\n"[..]).unwrap();
//! let opts = ReplayOptions { config: AllocatorConfig::default(), capacity: 80 << 30, history: None, policy: headroom_alloc::PolicyName::PyTorch };
//! let (report, _allocator) = replay(&trace, &opts, |_| {}).unwrap();
//! assert_eq!(report.peak_reserved_bytes, 20 << 20);
//! ```

mod address_slots;
pub mod compressed;
pub mod device_trace;
mod entry_slots;
pub mod jsonl;
pub mod memory_snapshot;
pub mod phase;
pub mod pickle;
mod prefault;
pub mod py;
pub mod recorded_memory;
pub mod recorded_step;
pub mod replay;
pub mod replay_device;
pub mod snapshot;
mod snapshot_builder;
pub mod snapshot_check;
pub mod snapshot_file;
mod snapshot_json;
pub mod snapshot_ops;
pub mod snapshot_pools;
pub mod snapshot_replay;
pub mod start_allocator;
pub mod start_state;
pub mod synth;
pub mod trace_index;
mod trace_requests;
pub mod walk;
pub mod what_if;
