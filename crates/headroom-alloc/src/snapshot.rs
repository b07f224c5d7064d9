//! The snapshot model of `torch.cuda.memory._snapshot()`: segments with their
//! blocks and states, the device traces, and the allocator settings. Writers
//! for PyTorch's pickle and for JSON live in `headroom-trace`.

use crate::block::NIL;
use crate::caching::DeviceCachingAllocator;
use crate::config::AllocatorConfig;
use crate::device::{DeviceMemory, StreamId};
use crate::history::{Action, TraceEntry};
use crate::policy::Policy;
use crate::stats::PoolKind;

/// A block's state, by PyTorch's strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Allocated to a caller.
    ActiveAllocated,
    /// Freed by the caller, waiting for other streams' work.
    ActivePendingFree,
    /// Free and cached.
    Inactive,
}

impl BlockState {
    /// PyTorch's string (`active_pending_free`, not the docstring's "active_awaiting_free").
    pub fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

/// One block of a segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockSnapshot {
    pub address: u64,
    pub size: u64,
    /// The unrounded size of the last allocation (stale for inactive blocks, as in PyTorch).
    pub requested_size: u64,
    pub state: BlockState,
}

/// One segment: a device allocation, or one contiguous mapped run of an expandable segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentSnapshot {
    pub device: u32,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub stream: StreamId,
    pub segment_type: PoolKind,
    /// `segment_pool_id`: [`crate::DEFAULT_MEMPOOL`], or the private pool's id.
    pub segment_pool_id: crate::MempoolId,
    pub is_expandable: bool,
    pub blocks: Vec<BlockSnapshot>,
}

/// The whole snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// Sorted by address.
    pub segments: Vec<SegmentSnapshot>,
    /// One trace per device, oldest first.
    pub device_traces: Vec<Vec<TraceEntry>>,
    pub allocator_settings: AllocatorConfig,
}

impl<D: DeviceMemory, P: Policy> DeviceCachingAllocator<D, P> {
    /// `torch.cuda.memory._snapshot()`. Records a `snapshot` trace entry when
    /// history is on, as PyTorch does.
    pub fn snapshot(&mut self) -> Snapshot {
        let active_bytes = self.stats.active_bytes.all().current as u64;
        self.trace(Action::Snapshot, 0, active_bytes, 0);
        let mut segments = Vec::new();
        let heads: Vec<u32> = self.arena.iter().filter(|(_, b)| b.prev == NIL).map(|(i, _)| i).collect();
        for mut id in heads {
            let mut run: Vec<u32> = Vec::new();
            loop {
                let b = &self.arena[id];
                if b.mapped {
                    run.push(id);
                } else if !run.is_empty() {
                    segments.push(self.segment_snapshot(&run));
                    run.clear();
                }
                if b.next == NIL {
                    break;
                }
                id = b.next;
            }
            if !run.is_empty() {
                segments.push(self.segment_snapshot(&run));
            }
        }
        segments.sort_by_key(|s| s.address);
        let trace = self.history.as_ref().map(|h| h.entries.iter().cloned().collect()).unwrap_or_default();
        Snapshot { segments, device_traces: vec![trace], allocator_settings: self.config.clone() }
    }

    fn segment_snapshot(&self, run: &[u32]) -> SegmentSnapshot {
        let first = &self.arena[run[0]];
        let mut s = SegmentSnapshot {
            device: self.device_index,
            address: first.ptr,
            total_size: 0,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: self.policy.stream_of(first.stream),
            segment_type: first.pool,
            segment_pool_id: self.mempool_id(first.owner),
            is_expandable: first.is_expandable(),
            blocks: Vec::with_capacity(run.len()),
        };
        for &id in run {
            let b = &self.arena[id];
            let state = if b.allocated {
                BlockState::ActiveAllocated
            } else if b.event_count > 0 || b.has_stream_uses {
                BlockState::ActivePendingFree
            } else {
                BlockState::Inactive
            };
            s.total_size += b.size;
            if state == BlockState::ActiveAllocated {
                s.allocated_size += b.size;
            }
            if state != BlockState::Inactive {
                s.active_size += b.size;
                s.requested_size += b.requested_size;
            }
            s.blocks.push(BlockSnapshot { address: b.ptr, size: b.size, requested_size: b.requested_size, state });
        }
        s
    }
}
