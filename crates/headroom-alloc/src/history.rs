//! The allocator's history: trace entries with PyTorch's action names, kept
//! in a ring buffer as `torch.cuda.memory._record_memory_history` keeps them.

use crate::device::StreamId;
use std::collections::VecDeque;

/// What happened, by PyTorch's trace action names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A block was handed to the caller (`size` = the caller's unrounded size).
    Alloc,
    /// The caller freed a block; allocated stats drop now.
    FreeRequested,
    /// The block is reusable (after any cross-stream events); active stats drop now.
    FreeCompleted,
    /// A segment was obtained from the device (`cudaMalloc`).
    SegmentAlloc,
    /// A segment was returned to the device (`cudaFree`).
    SegmentFree,
    /// Pages of an expandable segment were mapped.
    SegmentMap,
    /// Pages of an expandable segment were unmapped.
    SegmentUnmap,
    /// A snapshot was taken (`size` = active bytes then).
    Snapshot,
    /// An allocation failed (`size` = rounded request; `device_free` is set).
    Oom,
}

impl Action {
    /// The string PyTorch writes in `device_traces`.
    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::Oom => "oom",
        }
    }
}

/// One entry of a device trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    pub action: Action,
    /// Block, segment or range address; for `Oom`, PyTorch stores the device's free bytes here.
    pub addr: u64,
    pub size: u64,
    pub stream: StreamId,
    /// Time of the entry. headroom's simulated clock counts entries from 0
    /// unless the caller sets the time (see `DeviceCachingAllocator::set_time_us`).
    pub time_us: i64,
    /// Free device bytes, for `Oom` only.
    pub device_free: Option<u64>,
    /// The pool of the block or segment: [`crate::DEFAULT_MEMPOOL`], or a
    /// private pool's id (PyTorch's `TraceEntry::mempool_`).
    pub pool_id: crate::MempoolId,
}

/// Ring buffer of trace entries.
#[derive(Clone, Debug)]
pub(crate) struct History {
    pub max_entries: usize,
    pub entries: VecDeque<TraceEntry>,
    /// Entries pushed out of the front to keep `max_entries`.
    pub dropped: u64,
    /// Keep only the device calls (the segment actions).
    pub device_calls_only: bool,
}

impl History {
    pub fn new(max_entries: usize) -> Self {
        History { max_entries: max_entries.max(1), entries: VecDeque::new(), dropped: 0, device_calls_only: false }
    }

    /// Whether an entry of `action` is kept: every one, or only the device calls.
    #[inline]
    pub fn keeps(&self, action: Action) -> bool {
        !self.device_calls_only
            || matches!(action, Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap)
    }

    pub fn push(&mut self, e: TraceEntry) {
        if !self.keeps(e.action) {
            return;
        }
        if self.entries.len() == self.max_entries {
            self.entries.pop_front();
            self.dropped += 1;
        }
        self.entries.push_back(e);
    }
}
