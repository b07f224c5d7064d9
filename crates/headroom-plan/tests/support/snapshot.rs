//! A snapshot file read as the planner's calibration reads it: the device whose trace is
//! longest, as moments (`headroom_inspect::recording`) in the planner's terms. What `headroom
//! plan --calibrate` does, for the tests and the bench.

#![allow(dead_code)]

use headroom_inspect::frames::Phase as FramePhase;
use headroom_inspect::recording::{self, Moment as M};
use headroom_plan::calibrate::{find_steps, Entry, Moment, RecordedPhase, Recording, Steps};
use headroom_trace::snapshot::{read_snapshot_file, MemorySnapshot};
use std::path::Path;

pub fn read(path: &Path) -> MemorySnapshot {
    read_snapshot_file(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn moments(snap: &MemorySnapshot) -> Recording {
    let device = snap.devices().into_iter().max_by_key(|&d| snap.device_traces.get(d as usize).map_or(0, Vec::len));
    let r = recording::recording(snap, device.unwrap_or(0));
    let phase = |p: FramePhase| match p {
        FramePhase::Setup => RecordedPhase::Setup,
        FramePhase::Forward | FramePhase::Evaluation => RecordedPhase::Forward,
        FramePhase::Backward => RecordedPhase::Backward,
        FramePhase::OptimizerStep => RecordedPhase::Optimizer,
        FramePhase::DataLoading | FramePhase::Other => RecordedPhase::Other,
        FramePhase::Unknown => RecordedPhase::Unknown,
    };
    Recording {
        start_allocated: r.start_allocated,
        start_reserved: r.start_reserved,
        entries: r
            .entries
            .iter()
            .map(|e| Entry {
                moment: match e.moment {
                    M::Alloc { bytes, phase: p } => Moment::Alloc { bytes, phase: phase(p) },
                    M::Free { bytes, before_trace } => Moment::Free { bytes, before_trace },
                    M::Oom { asked, device_free } => Moment::Oom { asked, device_free },
                },
                allocated: e.allocated,
                reserved: e.reserved,
            })
            .collect(),
    }
}

pub fn steps(snap: &MemorySnapshot) -> Steps {
    find_steps(&moments(snap)).expect("a whole step")
}
