//! `DeviceCachingAllocator`: one device's caching allocator — the mechanism of
//! PyTorch's (`c10/cuda/CUDACachingAllocator.cpp`) — over any [`DeviceMemory`],
//! making the choices of a [`Policy`] (PyTorch's by default).
//!
//! This type is single-threaded (`&mut self`); [`crate::CachingAllocator`]
//! wraps it in one lock, as PyTorch wraps each device's state in a mutex.
//!
//! The malloc path, in PyTorch's order:
//! 1. complete the frees whose cross-stream events have finished;
//! 2. round the request, pick the pool and the would-be segment size;
//! 3. best fit among the free blocks of the same stream (then once more
//!    after the free-memory callbacks, if they freed anything);
//! 4. otherwise climb the policy's ladder ([`Rung`]); PyTorch's: garbage-collect
//!    aged blocks (with a fraction and a GC threshold), allocate a segment;
//!    failing that, release just enough oversize blocks and retry; failing
//!    that, flush every unsplit cached block and retry;
//! 5. carve the block from the front of what was found, splitting off the rest
//!    when `should_split` says so.

use crate::block::{Arena, Block, BlockPool, DEFAULT_POOL, NIL};
use crate::config::AllocatorConfig;
use crate::device::{DeviceError, DeviceMemory, EventId, StreamId};
use crate::error::{AllocError, OomReport};
use crate::history::{Action, History, TraceEntry};
use crate::mempool::{Capture, PrivatePool};
use crate::page_history::PageHistory;
use crate::policy::{Placement, Policy, PyTorchPolicy, Rung};
use crate::sizing;
use crate::stats::{self, DeviceStats, PoolKind};
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, VecDeque};

/// Someone who holds device memory on the allocator's behalf and can let go
/// of some when memory runs short (PyTorch's `FreeCudaMemoryCallback`, used
/// for CUDA IPC). Called with the allocator busy: return the pointers to free
/// rather than freeing them.
pub trait FreeMemoryCallback: Send {
    /// Pointers (from this allocator) that may be freed now.
    fn release(&mut self) -> Vec<u64>;
}

/// A live allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub ptr: u64,
    /// The rounded size of the block handed out (what `allocated_bytes` counts).
    pub size: u64,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct SegmentRec {
    pub size: u64,
    pub stream: StreamId,
    pub pool: PoolKind,
    pub owner: u32,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct ExpandableSegment {
    pub base: u64,
    pub va_size: u64,
    pub page: u64,
    pub stream: StreamId,
    pub pool: PoolKind,
    pub owner: u32,
}

/// How far a device allocation grows an expandable segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Growth {
    /// The pages the request needs (PyTorch's).
    Exact,
    /// Past the peak with no free page given back: whole steps of the
    /// policy's `climb_ahead`, in its physical allocations for a climb.
    Ahead,
    /// What the policy's `map_ahead` asks while reserved memory stays at or
    /// below this peak, the pages the request needs up to it, and nothing past it.
    UnderPeak(u64),
}

/// Why the last attempt to get memory failed.
#[derive(Clone, Debug)]
pub(crate) enum Failure {
    OverLimit,
    Device(DeviceError),
}

/// One device's caching allocator. See the module documentation.
pub struct DeviceCachingAllocator<D: DeviceMemory, P: Policy = PyTorchPolicy> {
    pub(crate) device: D,
    pub(crate) policy: P,
    pub(crate) device_index: u32,
    pub(crate) device_total: u64,
    pub(crate) vmm_supported: bool,
    pub(crate) config: AllocatorConfig,
    pub(crate) arena: Arena,
    pub(crate) small: BlockPool,
    pub(crate) large: BlockPool,
    /// Private pools by owner index (PyTorch's `graph_pools`), and the index of each id.
    pub(crate) private: BTreeMap<u32, PrivatePool>,
    pub(crate) pool_owners: BTreeMap<crate::MempoolId, u32>,
    pub(crate) next_owner: u32,
    /// Captures allocating to private pools, oldest first (`captures_underway`).
    pub(crate) captures: Vec<Capture>,
    /// Blocks freed during a capture that wait for events until none is
    /// underway (`needs_events_deferred_until_no_capture`).
    pub(crate) deferred: Vec<u32>,
    /// The streams recorded on a block while a capture was underway
    /// (`block_to_cudagraph_stream_uses`).
    pub(crate) capture_stream_uses: FxHashMap<u32, Vec<StreamId>>,
    /// Allocated blocks by address (PyTorch's `allocated_blocks`); blocks
    /// waiting for cross-stream events are reachable through `events`.
    pub(crate) active: crate::addr_map::AddrMap,
    /// Whether `active` is kept: a caller that frees by [`crate::BlockId`] alone (a
    /// replay's walk) turns it off, and `active` stays empty until it is turned on.
    pub(crate) pointer_map: bool,
    /// The streams recorded on allocated blocks (`record_stream`), by block.
    pub(crate) stream_uses: FxHashMap<u32, Vec<StreamId>>,
    /// Non-expandable segments by base address.
    pub(crate) segments: BTreeMap<u64, SegmentRec>,
    /// Live expandable segments by creation number: iterated in creation order, as PyTorch
    /// walks its vector (which erases released ones), and never over the released ones.
    pub(crate) expandable: BTreeMap<u32, ExpandableSegment>,
    /// The creation number the next expandable segment takes.
    pub(crate) next_expandable: u32,
    /// The largest reservation ever made: no request larger can grow in one.
    pub(crate) largest_reservation: u64,
    /// Physical allocations of expandable segments that span more than one
    /// page, start -> end ([`Policy::allocation_size`]); every other mapped
    /// page is a physical allocation of its own.
    pub(crate) allocations: crate::physical::Allocations,
    /// What became of the pages the ladder's reclaim unmapped.
    pub(crate) page_history: PageHistory,
    /// Bytes by which growth passed the peak while kept pages could have
    /// been reclaimed instead: spent from the policy's `keep_budget`.
    pub(crate) kept_excess: u64,
    /// Per stream, in record order: the events a pending free waits for.
    pub(crate) events: BTreeMap<StreamId, VecDeque<(EventId, u32)>>,
    /// Bytes currently obtained from the device (= reserved).
    pub(crate) total_allocated_memory: u64,
    pub(crate) allowed_memory_maximum: Option<u64>,
    /// Whether searches age blocks for garbage collection (a limit and a threshold set): kept
    /// where those change, not asked at each best fit.
    pub(crate) gc_clock: bool,
    pub(crate) stats: DeviceStats,
    pub(crate) history: Option<History>,
    pub(crate) clock: i64,
    pub(crate) explicit_time: Option<i64>,
    pub(crate) last_failure: Option<Failure>,
    callbacks: Vec<Box<dyn FreeMemoryCallback>>,
}

impl<D: DeviceMemory> DeviceCachingAllocator<D> {
    /// An allocator with `config` over `device`, as device number 0, making PyTorch's choices.
    pub fn new(device: D, config: AllocatorConfig) -> Self {
        Self::with_policy(device, config, PyTorchPolicy)
    }
}

impl<D: DeviceMemory, P: Policy> DeviceCachingAllocator<D, P> {
    /// An allocator with `config` over `device`, as device number 0, making `policy`'s choices.
    pub fn with_policy(device: D, mut config: AllocatorConfig, policy: P) -> Self {
        policy.configure(&mut config);
        let info = device.info();
        let mut a = DeviceCachingAllocator {
            device,
            policy,
            device_index: 0,
            device_total: info.total_bytes,
            vmm_supported: info.vmm_granularity.is_some(),
            config,
            arena: Arena::default(),
            small: BlockPool::new(),
            large: BlockPool::new(),
            private: BTreeMap::new(),
            pool_owners: BTreeMap::new(),
            next_owner: DEFAULT_POOL + 1,
            captures: Vec::new(),
            deferred: Vec::new(),
            capture_stream_uses: FxHashMap::default(),
            active: Default::default(),
            pointer_map: true,
            stream_uses: FxHashMap::default(),
            segments: BTreeMap::new(),
            expandable: BTreeMap::new(),
            next_expandable: 0,
            largest_reservation: 0,
            allocations: Default::default(),
            page_history: PageHistory::default(),
            kept_excess: 0,
            events: BTreeMap::new(),
            total_allocated_memory: 0,
            allowed_memory_maximum: None,
            gc_clock: false,
            stats: DeviceStats::default(),
            history: None,
            clock: 0,
            explicit_time: None,
            last_failure: None,
            callbacks: Vec::new(),
        };
        let f = a.config.per_process_memory_fraction;
        a.apply_fraction(f);
        a
    }

    /// Sets the device number reported in messages and snapshots.
    pub fn with_device_index(mut self, index: u32) -> Self {
        self.device_index = index;
        self
    }

    /// The settings in force.
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// The device, for inspection.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The device, to drive it (complete events, inject faults).
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    /// The statistics.
    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    /// `torch.cuda.memory_stats()`: PyTorch's 122 keys.
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        self.stats.to_map(self.config.max_split_size)
    }

    /// `torch.cuda.memory_summary()`.
    pub fn memory_summary(&self, abbreviated: bool) -> String {
        crate::summary::memory_summary(&self.stats, self.device_index, abbreviated)
    }

    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }

    /// `torch.cuda.reset_accumulated_memory_stats()`.
    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }

    /// Starts (or, with `None`, stops) recording the history, keeping at most
    /// `max_entries` entries (`torch.cuda.memory._record_memory_history`).
    pub fn record_history(&mut self, max_entries: Option<usize>) {
        self.history = max_entries.map(History::new);
    }

    /// Records only the device calls — `segment_alloc`, `segment_free`, `segment_map`,
    /// `segment_unmap` — without limit: what a replay compares with a recorded run's as it
    /// goes, without the cost of an entry for every request and free.
    pub fn record_device_calls(&mut self) {
        self.history = Some(History { device_calls_only: true, ..History::new(usize::MAX) });
    }

    /// Takes the history's entries so far, oldest first, leaving it recording
    /// (a replay compares them with a recorded trace as it goes).
    pub fn drain_history(&mut self) -> impl Iterator<Item = TraceEntry> + '_ {
        self.history.iter_mut().flat_map(|h| h.entries.drain(..))
    }

    /// Trace entries the history holds now (0 without history): a replay that finds none
    /// since its last [`Self::drain_history`] knows without draining that no call was made.
    pub fn history_len(&self) -> usize {
        self.history.as_ref().map_or(0, |h| h.entries.len())
    }

    /// Trace entries the history has let go of to keep its `max_entries` (0 without history).
    pub fn history_dropped(&self) -> u64 {
        self.history.as_ref().map_or(0, |h| h.dropped)
    }

    /// Sets the time stamped on the next trace entries (microseconds); without
    /// it entries carry a counter.
    pub fn set_time_us(&mut self, t: i64) {
        self.explicit_time = Some(t);
    }

    /// Registers a callback asked to free memory before the allocator asks the device for more.
    pub fn attach_free_memory_callback(&mut self, cb: Box<dyn FreeMemoryCallback>) {
        self.callbacks.push(cb);
    }

    /// `torch.cuda.set_per_process_memory_fraction`: limits reserved memory to
    /// `fraction` of the device. 1.0 removes the limit.
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Result<(), AllocError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(AllocError::InvalidArgument(format!("memory fraction {fraction} is outside [0, 1]")));
        }
        self.apply_fraction(fraction);
        Ok(())
    }

    fn apply_fraction(&mut self, fraction: f64) {
        self.allowed_memory_maximum =
            (fraction < 1.0).then(|| (fraction * self.device.mem_get_info().total as f64) as u64);
        self.refresh_gc_clock();
    }

    fn refresh_gc_clock(&mut self) {
        self.gc_clock = self.allowed_memory_maximum.is_some() && self.config.garbage_collection_threshold > 0.0;
    }

    /// Limits reserved memory to `bytes` (`None`: no limit), as a fraction
    /// does: the limit a recorded run's fraction set, when it is known in
    /// bytes and not as a fraction of a device whose size is not.
    pub fn set_memory_limit(&mut self, bytes: Option<u64>) {
        self.allowed_memory_maximum = bytes;
        self.refresh_gc_clock();
    }

    /// The reserved-memory limit, if a fraction is set.
    pub fn memory_limit(&self) -> Option<u64> {
        self.allowed_memory_maximum
    }

    /// Applies a `PYTORCH_CUDA_ALLOC_CONF` string at run time
    /// (`torch._C._accelerator_setAllocatorSettings`).
    pub fn set_allocator_settings(&mut self, conf: &str) -> Result<(), crate::config::ConfigError> {
        let applied = self.config.apply(conf);
        self.refresh_gc_clock();
        applied?;
        self.policy.configure(&mut self.config);
        self.refresh_gc_clock();
        Ok(())
    }

    /// The policy making the allocator's choices.
    pub fn policy(&self) -> &P {
        &self.policy
    }

    pub(crate) fn expandable_active(&self) -> bool {
        self.config.expandable_segments && self.vmm_supported
    }

    /// The free sets of `owner`'s pool of `kind`: the default pools' or a private pool's.
    #[inline]
    pub(crate) fn pool_mut(&mut self, owner: u32, kind: PoolKind) -> &mut BlockPool {
        let pools = match owner {
            DEFAULT_POOL => (&mut self.small, &mut self.large),
            _ => {
                let p = self.private.get_mut(&owner).expect("a block's owner is a live pool");
                (&mut p.small, &mut p.large)
            }
        };
        match kind {
            PoolKind::Small => pools.0,
            PoolKind::Large => pools.1,
        }
    }

    /// See [`Self::pool_mut`].
    #[inline]
    pub(crate) fn pool(&self, owner: u32, kind: PoolKind) -> &BlockPool {
        let pools = match owner {
            DEFAULT_POOL => (&self.small, &self.large),
            _ => {
                let p = &self.private[&owner];
                (&p.small, &p.large)
            }
        };
        match kind {
            PoolKind::Small => pools.0,
            PoolKind::Large => pools.1,
        }
    }

    /// Records a trace entry of the default pools.
    #[inline]
    pub(crate) fn trace(&mut self, action: Action, addr: u64, size: u64, stream: StreamId) {
        self.trace_in(action, addr, size, stream, DEFAULT_POOL);
    }

    /// Records a trace entry of `owner`'s pool (PyTorch's `record_trace` with its `mempool_id`).
    #[inline]
    pub(crate) fn trace_in(&mut self, action: Action, addr: u64, size: u64, stream: StreamId, owner: u32) {
        let Some(h) = self.history.as_ref() else { return };
        let clock = self.clock;
        // The clock counts every entry, kept or not: a kept entry's time is its place in the whole history.
        self.clock += 1;
        if !h.keeps(action) {
            // A history of device calls only, for a request or a free: the entry, its pool
            // looked up and its stream mapped, would be made only to be dropped.
            return;
        }
        let time_us = self.explicit_time.unwrap_or(clock);
        let stream = self.policy.stream_of(stream);
        let pool_id = self.mempool_id(owner);
        if let Some(h) = self.history.as_mut() {
            h.push(TraceEntry { action, addr, size, stream, time_us, device_free: None, pool_id });
        }
    }

    /// Allocates `size` bytes for use on `stream`.
    ///
    /// A zero-byte request touches nothing and returns the null pointer, as
    /// PyTorch's allocator does (it never reaches the device allocator with
    /// size 0); freeing or recording a stream on the null pointer is a no-op.
    ///
    /// While a capture is underway ([`Self::begin_allocate_to_pool`]), a
    /// request its filter accepts goes to the capture's private pool.
    pub fn malloc(&mut self, size: u64, stream: StreamId) -> Result<Allocation, AllocError> {
        let owner = if self.captures.is_empty() { DEFAULT_POOL } else { self.owner_for(stream) };
        self.malloc_in(size, stream, owner)
    }

    /// `malloc` into `owner`'s pools.
    pub(crate) fn malloc_in(&mut self, size: u64, stream: StreamId, owner: u32) -> Result<Allocation, AllocError> {
        self.malloc_block_in(size, stream, owner).map(|(a, _)| a)
    }

    /// `malloc_in`, with the block handed out ([`NIL`] for a zero-byte request).
    pub(crate) fn malloc_block_in(
        &mut self,
        size: u64,
        stream: StreamId,
        owner: u32,
    ) -> Result<(Allocation, u32), AllocError> {
        if size == 0 {
            return Ok((Allocation { ptr: 0, size: 0 }, NIL));
        }
        if size >= sizing::ONE_EXABYTE {
            let rounded = size;
            return Err(AllocError::NeverFits(Box::new(self.oom_report(size, rounded, size, stream))));
        }
        // Event queries are illegal during a capture: pending frees wait.
        if self.captures.is_empty() {
            self.process_events()?;
        }
        let rounded = sizing::round_size(&self.config, size);
        let kind = sizing::pool_for(rounded);
        let alloc_size = sizing::allocation_size(&self.config, rounded);
        // From here on `place` (the policy's placement stream) decides which blocks and segments serve the request;
        // `stream` is what the caller and the OOM report see. A private pool's requests are placed on their own stream:
        // a graph's memory is laid out as it was asked for, not as a policy plans the default pools.
        let placement =
            if owner == DEFAULT_POOL { self.policy.place(rounded, stream) } else { Placement::stream(stream) };
        let mut place = placement.stream;
        let mut found = None;
        // Set when the free set kept the found block's remainder in its place (`Take::Shrink`).
        let mut shrunk = None;
        if let Some(slot) = placement.at {
            if kind == PoolKind::Large && self.expandable_active() {
                found = self.carve_at(kind, place, slot, rounded)?;
            }
            // Not to be had: the request goes wherever its own stream's would.
            if found.is_none() {
                place = self.policy.stream_of(place);
            }
        }
        if found.is_none() {
            (found, shrunk) = self.get_free_block(owner, kind, place, rounded).unzip();
        }
        if found.is_none() && self.trigger_free_memory_callbacks()? {
            (found, shrunk) = self.get_free_block(owner, kind, place, rounded).unzip();
        }
        let shrunk = shrunk.unwrap_or(false);
        let mut rung = 0;
        // Set when the ladder found no free pages to reclaim: growth then cannot strand any, and may map ahead.
        // Asked only when the ladder is climbed: under a policy named at run time each question is a `match`,
        // and most requests find a cached block (docs/PERFORMANCE.md, "Replay passes, nineteenth round").
        let (mut nothing_to_reclaim, ahead_after_reclaim) = if found.is_none() {
            (
                !self.policy.ladder().contains(&Rung::ReclaimFreePages),
                self.policy.reclaim_rule(&self.config).map_ahead_after,
            )
        } else {
            (false, false)
        };
        while found.is_none() {
            let Some(&step) = self.policy.ladder().get(rung) else { break };
            rung += 1;
            found = match step {
                Rung::CollectGarbage => {
                    self.garbage_collect_cached_blocks()?;
                    None
                }
                Rung::Allocate => {
                    let growth = if nothing_to_reclaim || ahead_after_reclaim { Growth::Ahead } else { Growth::Exact };
                    self.alloc_block(owner, kind, place, rounded, alloc_size, false, growth)?
                }
                Rung::AllocateUnderPeak => {
                    let peak = self.stats.reserved_bytes.all().peak.max(0) as u64;
                    self.alloc_block(owner, kind, place, rounded, alloc_size, false, Growth::UnderPeak(peak))?
                }
                Rung::ReclaimFreePages => {
                    let rule = self.policy.reclaim_rule(&self.config);
                    nothing_to_reclaim = self.reclaim_free_pages(owner, kind, place, rounded, rule)? == 0;
                    None
                }
                Rung::ReleaseOversizeThenAllocate => {
                    if self.release_available_cached_blocks(owner, kind, place, rounded)? {
                        self.alloc_block(owner, kind, place, rounded, alloc_size, false, Growth::Exact)?
                    } else {
                        None
                    }
                }
                // A flush synchronizes every stream, which a capture forbids: PyTorch
                // skips this rung while one is underway.
                Rung::FlushThenAllocate if !self.captures.is_empty() => None,
                Rung::FlushThenAllocate => {
                    self.release_cached_blocks(crate::DEFAULT_MEMPOOL)?;
                    self.alloc_block(owner, kind, place, rounded, alloc_size, true, Growth::Exact)?
                }
            };
        }
        let Some(id) = found else {
            return Err(self.out_of_memory(size, rounded, alloc_size, stream));
        };
        // A remainder the free set kept is a split the best fit already judged: not judged again.
        debug_assert!(
            !shrunk || sizing::should_split(&self.config, self.expandable_active(), kind, self.arena[id].size, rounded),
            "the free set kept a remainder of a block not split"
        );
        let split =
            shrunk || sizing::should_split(&self.config, self.expandable_active(), kind, self.arena[id].size, rounded);
        let (a, block) = self.alloc_found_block(id, place, rounded, size, split, shrunk);
        self.policy.on_alloc(a.ptr, a.size, place);
        Ok((a, block))
    }

    fn out_of_memory(&mut self, size: u64, rounded: u64, alloc_size: u64, stream: StreamId) -> AllocError {
        let free = self.device.mem_get_info().free;
        if let Some(h) = self.history.as_mut() {
            let time_us = self.explicit_time.unwrap_or(self.clock);
            self.clock += 1;
            h.push(TraceEntry {
                action: Action::Oom,
                addr: free,
                size: rounded,
                stream,
                time_us,
                device_free: Some(free),
                pool_id: crate::DEFAULT_MEMPOOL,
            });
        }
        self.stats.num_ooms += 1;
        let report = Box::new(self.oom_report(size, rounded, alloc_size, stream));
        match self.last_failure.take() {
            _ if alloc_size > self.device_total => AllocError::NeverFits(report),
            Some(Failure::OverLimit) => AllocError::OverLimit(report),
            Some(Failure::Device(DeviceError::NeverFits { .. })) => AllocError::NeverFits(report),
            _ => AllocError::OutOfMemory(report),
        }
    }

    fn oom_report(&self, size: u64, rounded: u64, alloc_size: u64, stream: StreamId) -> OomReport {
        let largest = [&self.small, &self.large].iter().filter_map(|p| p.blocks.largest()).max().unwrap_or(0);
        // PyTorch counts the free blocks of private pools as allocated: only their pools may use them.
        let in_private_pools: u64 = self
            .private
            .values()
            .flat_map(|p| [&p.small, &p.large])
            .flat_map(|bp| bp.blocks.ids())
            .map(|id| self.arena[id].size)
            .sum();
        OomReport {
            device: self.device_index,
            stream,
            requested: size,
            rounded,
            alloc_size,
            device_total: self.device_total,
            device_free: self.device.mem_get_info().free,
            allowed: self.allowed_memory_maximum,
            allocated: self.stats.allocated_bytes.all().current as u64,
            reserved: self.stats.reserved_bytes.all().current as u64,
            largest_free_block: largest,
            split_fragment_bytes: self.stats.inactive_split_bytes.all().current as u64,
            free_in_private_pools: in_private_pools,
        }
    }

    fn trigger_free_memory_callbacks(&mut self) -> Result<bool, AllocError> {
        if self.callbacks.is_empty() {
            return Ok(false);
        }
        let mut ptrs = Vec::new();
        for cb in &mut self.callbacks {
            ptrs.extend(cb.release());
        }
        let freed = !ptrs.is_empty();
        for p in ptrs {
            self.free(p)?;
        }
        // Frees that wait for events did not make memory reusable yet; PyTorch
        // retries the search all the same when a callback reports progress.
        Ok(freed)
    }

    /// Whether a request of `size` bytes on `stream` would be served now from
    /// a cached block, with no device call.
    pub fn serves_from_cache(&self, size: u64, stream: StreamId) -> bool {
        let rounded = sizing::round_size(&self.config, size);
        let owner = if self.captures.is_empty() { DEFAULT_POOL } else { self.owner_for(stream) };
        self.pick_free_block(owner, sizing::pool_for(rounded), stream, rounded).is_some()
    }

    /// `alloc_block`: a new segment from the device, or new pages of an
    /// expandable segment, grown as `growth` says. `Ok(None)` when out of
    /// memory, or when reserved memory would pass the peak given with
    /// [`Growth::UnderPeak`] (which is not a failure: the ladder goes on).
    #[allow(clippy::too_many_arguments)]
    fn alloc_block(
        &mut self,
        owner: u32,
        kind: PoolKind,
        stream: StreamId,
        size: u64,
        alloc_size: u64,
        is_retry: bool,
        growth: Growth,
    ) -> Result<Option<u32>, AllocError> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        let mut map = size;
        let mut planned = None;
        if self.expandable_active() {
            // Growth maps ahead of the request where that costs little (as the policy says; PyTorch's: never): below
            // the peak, or when no free page is left to reuse. The requests after it find the pages mapped.
            let reserved = self.total_allocated_memory;
            match growth {
                Growth::Exact => {}
                Growth::Ahead => {
                    let step = self.policy.climb_ahead(&self.config, kind, reserved);
                    if step > self.policy.page_size(&self.config, kind) {
                        // The pages the request lacks, rounded up to whole steps: what
                        // PyTorch's expandable segments map with a page of `step`.
                        let (_, lacking) = self.plan_growth(owner, kind, stream, size);
                        map = size + (lacking.next_multiple_of(step) - lacking);
                    }
                }
                Growth::UnderPeak(c) => {
                    map = self.policy.map_ahead(&self.config, kind, size, c.saturating_sub(reserved)).max(size);
                }
            }
            if let Growth::UnderPeak(c) = growth {
                let (at, bytes) = self.plan_growth(owner, kind, stream, size);
                if reserved + bytes > c {
                    return Ok(None);
                }
                planned = at;
                if map != size {
                    let (ahead_at, ahead_bytes) = self.plan_growth(owner, kind, stream, map);
                    if reserved + ahead_bytes <= c {
                        planned = ahead_at;
                    } else {
                        map = size;
                    }
                }
            }
        } else if matches!(growth, Growth::UnderPeak(c) if self.total_allocated_memory + alloc_size > c) {
            return Ok(None);
        }
        if let Some(allowed) = self.allowed_memory_maximum {
            if self.total_allocated_memory + alloc_size > allowed {
                self.last_failure = Some(Failure::OverLimit);
                return Ok(None);
            }
        }
        if self.expandable_active() {
            let climbing = growth == Growth::Ahead;
            return self.try_allocate_expandable_block(owner, kind, stream, map, size, climbing, planned);
        }
        let ptr = match self.device.malloc(alloc_size) {
            Ok(p) => p,
            Err(e) if e.is_out_of_memory() => {
                self.last_failure = Some(Failure::Device(e));
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        self.total_allocated_memory += alloc_size;
        let id = self.arena.insert(Block::new(ptr, alloc_size, stream, kind, owner));
        stats::increase(&mut self.stats.segment, kind, 1);
        stats::increase(&mut self.stats.reserved_bytes, kind, alloc_size);
        if alloc_size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.segments.insert(ptr, SegmentRec { size: alloc_size, stream, pool: kind, owner });
        self.trace_in(Action::SegmentAlloc, ptr, alloc_size, stream, owner);
        Ok(Some(id))
    }

    /// `alloc_found_block`: hands out the front of block `id`, splitting the rest off.
    /// `in_set`: the free set holds the rest already ([`Self::get_free_block`]).
    fn alloc_found_block(
        &mut self,
        id: u32,
        stream: StreamId,
        size: u64,
        orig_size: u64,
        split: bool,
        in_set: bool,
    ) -> (Allocation, u32) {
        let (kind, owner) = (self.arena[id].pool, self.arena[id].owner);
        let already_split = self.arena[id].is_split();
        let expandable = self.arena[id].is_expandable();
        let block = if split {
            let rem = id;
            let mut b = Block::new(self.arena[rem].ptr, size, stream, kind, owner);
            b.expandable = self.arena[rem].expandable;
            b.prev = self.arena[rem].prev;
            b.next = rem;
            let new = self.arena.insert(b);
            let prev = self.arena[new].prev;
            if prev != NIL {
                self.arena[prev].next = new;
            }
            let r = &mut self.arena[rem];
            r.prev = new;
            r.ptr += size;
            r.size -= size;
            let rem_size = r.size;
            if in_set {
                // As `insert_into_blocks` does: the remainder's GC age restarts.
                self.arena[rem].gc_count_base = self.pool(owner, kind).get_free_blocks_call_count;
            } else {
                self.insert_into_blocks(rem);
            }
            if !expandable {
                if already_split {
                    // An inactive split block shrinks by `size`.
                    stats::decrease(&mut self.stats.inactive_split_bytes, kind, size);
                } else {
                    // A new inactive split block of `rem_size` appears.
                    stats::increase(&mut self.stats.inactive_split_bytes, kind, rem_size);
                    stats::increase(&mut self.stats.inactive_split, kind, 1);
                }
            }
            new
        } else {
            if already_split && !expandable {
                let s = self.arena[id].size;
                stats::decrease(&mut self.stats.inactive_split_bytes, kind, s);
                stats::decrease(&mut self.stats.inactive_split, kind, 1);
            }
            id
        };
        let b = &mut self.arena[block];
        b.allocated = true;
        b.requested_size = orig_size;
        let (ptr, bsize) = (b.ptr, b.size);
        if self.pointer_map {
            self.active.insert(ptr, block);
        }
        let s = &mut self.stats;
        stats::increase(&mut s.allocation, kind, 1);
        stats::increase(&mut s.allocated_bytes, kind, bsize);
        stats::increase(&mut s.active, kind, 1);
        stats::increase(&mut s.active_bytes, kind, bsize);
        stats::increase(&mut s.requested_bytes, kind, orig_size);
        if bsize >= self.config.max_split_size {
            self.stats.oversize_allocations.increase(1);
        }
        self.trace_in(Action::Alloc, ptr, orig_size, stream, owner);
        (Allocation { ptr, size: bsize }, block)
    }

    /// Rounded size of the live allocation at `ptr`.
    pub fn allocation_size(&self, ptr: u64) -> Option<u64> {
        self.allocated_block(ptr).map(|id| self.arena[id].size)
    }

    /// Bytes currently obtained from the device.
    pub fn reserved_bytes(&self) -> u64 {
        self.total_allocated_memory
    }
}

impl<D: DeviceMemory, P: Policy> std::fmt::Debug for DeviceCachingAllocator<D, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceCachingAllocator")
            .field("device_index", &self.device_index)
            .field("config", &self.config.raw)
            .field("reserved_bytes", &self.total_allocated_memory)
            .field("allocated_bytes", &self.stats.allocated_bytes.all().current)
            .field("blocks", &self.arena.iter().count())
            .finish()
    }
}
