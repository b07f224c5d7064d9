//! `headroom inspect`: a PyTorch memory snapshot explained.
//!
//! What was live at the peak and which line of the user's code put it
//! there; whether memory was used or lost to fragmentation; what grows from
//! one step to the next; why an OOM happened and which settings would have
//! avoided it, each checked by replaying the run. Figures are counted from
//! the trace ([`walk`]); the allocator's layout at a moment comes from
//! headroom's replay of the run ([`headroom_trace::snapshot_replay`]).
//!
//! The report renders as JSON (its fields are the documented keys), as an
//! offline HTML page ([`html`]) and as a Chrome trace ([`chrome_trace`]).

pub mod allocations;
pub mod chrome_trace;
pub mod compare;
pub mod frames;
pub mod html;
pub mod layout;
pub mod leaks;
pub mod oom;
pub mod over_time;
pub mod page_data;
pub mod pools;
pub mod printable;
mod recommend;
pub mod recording;
pub mod report;
pub mod role;
pub mod roles;
pub mod sites;
pub mod step_phases;
pub mod timeline;
pub mod walk;

pub use compare::{compare, Comparison};
pub use report::{inspect_device, DeviceReport, InspectOptions};

use headroom_trace::snapshot::MemorySnapshot;
use serde::Serialize;

/// A snapshot explained, device by device.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The file, as the user named it.
    pub snapshot: String,
    /// How the file was encoded ("pickle protocol 4", "JSON", ...).
    pub format: String,
    pub recorded_alloc_conf: Option<String>,
    pub devices: Vec<DeviceReport>,
}

/// Explains each of `devices` of `snap` (every device it mentions when empty).
pub fn inspect(name: &str, snap: &MemorySnapshot, devices: &[u32], opts: &InspectOptions) -> Report {
    let all = snap.devices();
    let devices = if devices.is_empty() { &all[..] } else { devices };
    Report {
        snapshot: name.to_string(),
        format: snap.format.clone(),
        recorded_alloc_conf: snap.settings.as_ref().and_then(|s| s.conf.clone()),
        devices: devices.iter().map(|&d| inspect_device(snap, d, opts)).collect(),
    }
}
