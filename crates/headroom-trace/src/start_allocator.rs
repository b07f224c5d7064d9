//! The allocator a snapshot's replay starts from: the state its trace began in
//! ([`crate::start_state`]) adopted segment by segment, expandable reservations rebuilt around
//! the runs mapped then, on a simulated device that follows the recorded device's calls.
//! The check and every what-if start here.

use crate::replay_device::{DeviceCall, RecordedDevice};
use crate::start_state::{InconsistentTrace, StartState};
use headroom_alloc::{
    AllocatorConfig, Backend, DeviceCachingAllocator, ExpandableLayout, FaultyDevice, LiveBlock, Policy, SimDevice,
};

/// The device a snapshot replays on: the simulated GPU, following the
/// recorded device's calls, and made to refuse where the recorded device refused.
pub type ReplayDevice = FaultyDevice<RecordedDevice>;

/// Why a device's trace cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotReplayError {
    #[error(transparent)]
    Inconsistent(#[from] InconsistentTrace),
    #[error("device {device}: {message}")]
    Unsupported { device: u32, message: String },
    #[error("device {device}: {message}")]
    Capacity { device: u32, message: String },
}

/// Settings headroom does not simulate, said why.
pub(crate) fn unsupported(device: u32, config: &AllocatorConfig) -> Option<SnapshotReplayError> {
    let message = if config.backend == Backend::CudaMallocAsync {
        crate::replay::ASYNC_NOT_SIMULATED.to_string()
    } else {
        return None;
    };
    Some(SnapshotReplayError::Unsupported { device, message })
}

/// The allocator as the trace began on `device`: `start` adopted on a device of `capacity`
/// bytes that follows `script` (the recorded device's calls) where one is given. The device
/// picks its own addresses above `calls_end`, the end of the highest range the trace's
/// device calls name ([`crate::trace_index::TraceIndex::calls_end`]).
pub(crate) fn allocator_at<P: Policy>(
    start: &StartState,
    config: AllocatorConfig,
    policy: P,
    capacity: u64,
    device: u32,
    calls_end: u64,
    script: Option<Vec<DeviceCall>>,
) -> Result<DeviceCachingAllocator<ReplayDevice, P>, SnapshotReplayError> {
    if start.reserved_bytes() > capacity {
        return Err(SnapshotReplayError::Capacity {
            device,
            message: format!(
                "the trace begins with {} bytes reserved, more than the {capacity} bytes of the simulated device",
                start.reserved_bytes()
            ),
        });
    }
    let sim = SimDevice::new(capacity);
    let dev = match script {
        Some(calls) => RecordedDevice::following(sim, calls),
        None => RecordedDevice::new(sim),
    };
    let mut a = DeviceCachingAllocator::with_policy(FaultyDevice::new(dev), config, policy).with_device_index(device);
    let bad = |m: String| SnapshotReplayError::Unsupported { device, message: m };
    // The device's own addresses stay clear of every one the recording names,
    // which a replay may be told to use later.
    let named = calls_end.max(start.segments.iter().map(|s| s.address + s.size).max().unwrap_or(0));
    a.device_mut().inner_mut().sim_mut().keep_own_addresses_above(named);
    for s in start.segments.iter().filter(|s| !s.expandable) {
        a.device_mut().inner_mut().sim_mut().adopt_segment(s.address, s.size).map_err(|e| bad(e.to_string()))?;
        a.adopt_segment_in_pool(s.address, s.size, s.stream, s.pool, s.pool_id, &s.live)
            .map_err(|e| bad(e.to_string()))?;
    }
    for (layout, live) in expandable_reservations(&a, start) {
        let ExpandableLayout { base, va_size, page, ref runs, .. } = layout;
        a.device_mut()
            .inner_mut()
            .sim_mut()
            .adopt_reservation(base, va_size, page, runs)
            .map_err(|e| bad(e.to_string()))?;
        a.adopt_expandable_segment(&layout, &live).map_err(|e| {
            bad(format!("the expandable segment mapped at {base:#x} when the trace began cannot be rebuilt: {e}"))
        })?;
    }
    Ok(a)
}

/// The expandable segments the trace began with, rebuilt around the runs
/// mapped then, with their live blocks. A snapshot lists runs, not
/// reservations: consecutive runs of one stream and pool go into one
/// reservation starting at the first of them (growth maps a reservation from
/// its base up) or, where the trace later maps pages below that run in the same
/// reservation ([`StartSegment::reserved_from`]), at the lowest of those,
/// which were unmapped when the trace began; of PyTorch's size for this device
/// or, where the next reservation's first run comes sooner, up to it —
/// reservations never overlap.
fn expandable_reservations<P: Policy>(
    a: &DeviceCachingAllocator<ReplayDevice, P>,
    start: &StartState,
) -> Vec<(ExpandableLayout, Vec<LiveBlock>)> {
    let mut out: Vec<(ExpandableLayout, Vec<LiveBlock>)> = Vec::new();
    for s in start.segments.iter().filter(|s| s.expandable) {
        match out.last_mut() {
            Some((l, live))
                if l.stream == s.stream
                    && l.pool == s.pool
                    && l.pool_id == s.pool_id
                    && s.address + s.size <= l.base + l.va_size =>
            {
                l.runs.push((s.address, s.size));
                live.extend(&s.live);
            }
            _ => {
                let (page, va_size) = a.expandable_reservation(s.pool);
                let from = s.reserved_from;
                let reaches =
                    from < s.address && (s.address - from).is_multiple_of(page) && from + va_size >= s.address + s.size;
                let layout = ExpandableLayout {
                    base: if reaches { from } else { s.address },
                    va_size,
                    page,
                    stream: s.stream,
                    pool: s.pool,
                    pool_id: s.pool_id,
                    runs: vec![(s.address, s.size)],
                };
                out.push((layout, s.live.clone()));
            }
        }
    }
    for k in 1..out.len() {
        let next = out[k].0.base;
        let l = &mut out[k - 1].0;
        if l.base + l.va_size > next {
            l.va_size = (next - l.base) / l.page * l.page;
        }
    }
    out
}
