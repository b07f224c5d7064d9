//! An out-of-memory error explained from the trace, and the settings that
//! would have avoided it, each checked by replaying the run.
//!
//! The device the run had is what the allocator held plus what the device
//! said was free at the failure (`reserved + device_free`): memory taken by
//! other processes and the CUDA context is outside both. When the device had
//! more free than the request asked for, it was not the device that refused
//! but a per-process limit (`set_per_process_memory_fraction`), and every
//! remedy is replayed under that limit
//! ([`headroom_trace::recorded_memory`]): on the whole device every one
//! would "avoid" an OOM that only the limit caused. A remedy avoided the OOM
//! when the replay under it serves every request the recorded run could not,
//! and fails none it served.

use headroom_alloc::units::format_size;
use headroom_alloc::AllocatorConfig;
use headroom_trace::device_trace::DeviceTrace;
use headroom_trace::recorded_memory::Bounds;
use headroom_trace::snapshot_replay::Recorded;
use headroom_trace::what_if::what_if_device;
use serde::Serialize;

/// One setting tried against a recorded OOM.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Remedy {
    /// What to set: a `PYTORCH_CUDA_ALLOC_CONF` string, or a change to the program.
    pub setting: String,
    /// `None` when it could not be checked (see `note`).
    pub avoided: Option<bool>,
    /// The replayed run's peaks under the setting.
    pub peak_reserved_bytes: Option<u64>,
    pub peak_allocated_bytes: Option<u64>,
    pub note: String,
}

/// The settings tried, beside the recorded ones: each changes one policy
/// that decides whether cached memory can serve a request. `limited`: the
/// program set a per-process memory limit already.
pub fn candidates(recorded: &AllocatorConfig, limited: bool) -> Vec<(String, AllocatorConfig)> {
    let mut out = Vec::new();
    let mut add = |setting: &str| {
        let mut c = recorded.clone();
        if c.apply(setting).is_ok() {
            out.push((setting.to_string(), c));
        }
    };
    if !recorded.expandable_segments {
        add("expandable_segments:True");
    }
    if recorded.max_split_size == u64::MAX {
        add("max_split_size_mb:128");
        add("max_split_size_mb:512");
    }
    if recorded.garbage_collection_threshold == 0.0 {
        // Garbage collection acts only under a per-process memory fraction: the program's, or one set for it.
        add(if limited {
            "garbage_collection_threshold:0.8"
        } else {
            "garbage_collection_threshold:0.8,per_process_memory_fraction:0.99"
        });
    }
    out
}

/// Replays the trace under each candidate on a device of `capacity` bytes,
/// with what the program did besides its requests (`run`: its
/// `empty_cache()` calls, its memory limit).
pub fn remedies(
    t: &DeviceTrace,
    recorded: &AllocatorConfig,
    capacity: u64,
    run: &Recorded,
    recorded_ooms: usize,
) -> Vec<Remedy> {
    let mut out: Vec<Remedy> = candidates(recorded, run.memory_limit.is_some())
        .into_iter()
        .map(|(setting, config)| match what_if_device(t, config, capacity, run, None, |_| {}) {
            Ok(w) => {
                let avoided = w.ooms.is_empty() && w.recorded_ooms_served == recorded_ooms;
                let note = if avoided {
                    "every request served, the recorded failures included".to_string()
                } else if let Some(o) = w.ooms.first() {
                    format!("still out of memory at entry {} ({} bytes)", o.index, o.oom.report.requested)
                } else {
                    format!("{} of {recorded_ooms} failed requests served", w.recorded_ooms_served)
                };
                Remedy {
                    setting,
                    avoided: Some(avoided),
                    peak_reserved_bytes: Some(w.peak_reserved_bytes),
                    peak_allocated_bytes: Some(w.peak_allocated_bytes),
                    note,
                }
            }
            Err(e) => Remedy {
                setting,
                avoided: None,
                peak_reserved_bytes: None,
                peak_allocated_bytes: None,
                note: format!("not replayed: {e}"),
            },
        })
        .collect();
    out.push(Remedy {
        setting: "a smaller batch".into(),
        avoided: None,
        peak_reserved_bytes: None,
        peak_allocated_bytes: None,
        note: "not checked: a snapshot does not record the batch size, so the requests at a smaller one cannot be \
               derived (try `headroom plan` with the model)"
            .into(),
    });
    out
}

/// Judges each remedy on the least memory the recording allows (`low`) and
/// the most (`high`, the same settings in the same order): avoided on the
/// least is avoided on every device the recording allows, and failing on the
/// most fails on every one; between, the recording cannot tell.
pub fn within_bounds(low: Vec<Remedy>, high: Vec<Remedy>, bounds: Bounds) -> Vec<Remedy> {
    low.into_iter()
        .zip(high)
        .map(|(lo, hi)| match (lo.avoided, hi.avoided) {
            (Some(false), Some(true)) => Remedy {
                avoided: None,
                note: format!(
                    "avoided if the memory was {}, not if it was {}: the recording tells only that it lay between",
                    format_size(bounds.below - 1),
                    format_size(bounds.at_least)
                ),
                ..hi
            },
            (Some(false), _) => Remedy {
                note: format!(
                    "{}, even with {} (the most the recording allows)",
                    lo.note,
                    format_size(bounds.below - 1)
                ),
                ..lo
            },
            _ => lo,
        })
        .collect()
}
