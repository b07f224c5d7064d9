//! What the real fixtures do not show together — call sites in every phase,
//! a leak, an OOM that a setting avoids — in a run made with headroom's
//! allocator, written as PyTorch's JSON snapshot with frames added to each
//! entry, and inspected as a user's file would be.

mod common;

use common::{training_run, Site};
use headroom_inspect::frames::{Phase, Role};
use headroom_inspect::recording::recording;
use headroom_inspect::step_phases::StepPhases;
use headroom_inspect::{inspect_device, InspectOptions};
use headroom_trace::recorded_step::{find_steps, step_starts};
use headroom_trace::snapshot::{read_snapshot, TraceAction};

#[test]
fn the_peak_is_explained_by_call_site_role_and_phase() {
    let snap = training_run(6, false);
    let r = inspect_device(&snap, 0, &InspectOptions::default());
    // Four layers of 8 MiB activations are live when backward starts, with the
    // optimizer state (2 x 4 MiB), the leak so far and the gradients.
    let top = &r.top_sites;
    let act = top.iter().find(|s| s.site.site.contains("model.py:10 in forward")).expect("the activation site");
    assert_eq!(act.role, Role::Activations);
    assert_eq!(act.phase, Phase::Forward);
    let opt = top.iter().find(|s| s.site.site.contains("adamw.py")).map(|s| s.role);
    assert_eq!(opt, None, "torch's own frames collapse into the user's: {top:?}");
    let opt = top.iter().find(|s| s.site.site.contains("train.py:30 in train_step")).expect("the optimizer site");
    assert_eq!((opt.role, opt.phase), (Role::OptimizerState, Phase::OptimizerStep));
    assert_eq!(opt.bytes, 8 << 20);
    let sum: u64 = r.roles.iter().map(|x| x.bytes).sum();
    assert_eq!(sum, r.peak_allocated_bytes);
    assert!(r.peak_phase.is_some());
}

#[test]
fn a_site_that_grows_every_step_is_a_leak_suspect() {
    let snap = training_run(6, false);
    let r = inspect_device(&snap, 0, &InspectOptions::default());
    let reps = r.repetitions.as_ref().expect("six steps repeat");
    assert_eq!(reps.starts.len(), 6);
    assert_eq!(r.leak_suspects.len(), 1, "{:?}", r.leak_suspects);
    let l = &r.leak_suspects[0];
    assert_eq!(l.site, "me/proj/metrics.py:7 in record");
    assert!(Site::Leak.file().ends_with("metrics.py"));
    assert_eq!(l.growth_per_repetition_bytes, 2 << 20);
    assert!(r.oom.is_none());
}

#[test]
fn the_oom_is_explained_and_a_setting_is_checked_to_avoid_it() {
    let snap = training_run(3, true);
    let r = inspect_device(&snap, 0, &InspectOptions::default());
    let o = r.oom.as_ref().expect("the run ran out of memory");
    assert_eq!(o.requested_bytes, 100 << 20);
    assert!(o.reserved_unallocated_bytes >= o.requested_bytes, "{o:?}");
    assert!(o.largest_free_block_bytes.unwrap() < o.requested_bytes);
    assert_eq!(o.site, "me/proj/train.py:50 in evaluate");
    assert_eq!(o.phase, Phase::Evaluation);
    // The 150 MiB block is oversize under max_split_size_mb:128: the 12 MiB
    // requests cannot split it, and it is released when the 100 MiB one fails.
    let split = o.remedies.iter().find(|m| m.setting == "max_split_size_mb:128").unwrap();
    assert_eq!(split.avoided, Some(true), "{split:?}");
    for m in o.remedies.iter().filter(|m| m.avoided == Some(true)) {
        assert!(r.recommendations.iter().any(|x| x.what.ends_with(&m.setting)), "{:?}", r.recommendations);
    }
    assert!(o.remedies.iter().any(|m| m.avoided.is_none()), "the batch remedy says it was not checked");
    // A setting replayed avoids it: the memory was there, in pieces.
    let verdict = r.recommendations.iter().find(|x| x.what.starts_with("the failure is")).expect("a verdict");
    assert_eq!(verdict.what, "the failure is fragmentation, not a lack of memory", "{verdict:?}");
    assert!(verdict.evidence.contains("max_split_size_mb:128"), "{verdict:?}");
}

/// Step 0: four 8 MiB activations, a 2 MiB leak (forward 34 MiB), a gradient beside them
/// (backward 42 MiB), the optimizer's 2 × 4 MiB state beside the leak (10 MiB). Step 1
/// begins at 10 MiB: forward 44 MiB, backward 52 MiB, and its optimizer allocates nothing.
const STEP_PHASES: StepPhases = StepPhases {
    start_bytes: 0,
    forward_bytes: Some(44 << 20),
    backward_bytes: Some(52 << 20),
    optimizer_bytes: Some(10 << 20),
};

#[test]
fn each_phase_of_the_step_has_its_own_peak() {
    let r = inspect_device(&training_run(2, false), 0, &InspectOptions::default());
    assert_eq!(r.step_phases, Some(STEP_PHASES));
    assert_eq!(STEP_PHASES.peak_bytes(), r.peak_allocated_bytes);
}

#[test]
fn a_backward_recorded_without_frames_is_still_the_backward() {
    // `stacks="python"`: the autograd engine's allocations have no frames at all.
    let mut v: serde_json::Value = serde_json::from_slice(&common::training_run_json(2, false)).unwrap();
    for e in v["device_traces"][0].as_array_mut().unwrap() {
        if e["frames"].to_string().contains("torch::autograd") {
            e["frames"] = serde_json::json!([]);
        }
    }
    let snap = read_snapshot(std::io::Cursor::new(serde_json::to_vec(&v).unwrap())).unwrap();
    let r = inspect_device(&snap, 0, &InspectOptions::default());
    assert_eq!(r.step_phases, Some(STEP_PHASES));
}

#[test]
fn without_frames_there_are_no_phases() {
    let mut v: serde_json::Value = serde_json::from_slice(&common::training_run_json(2, false)).unwrap();
    for e in v["device_traces"][0].as_array_mut().unwrap() {
        e["frames"] = serde_json::json!([]);
    }
    for s in v["segments"].as_array_mut().unwrap() {
        for b in s["blocks"].as_array_mut().unwrap() {
            b["frames"] = serde_json::json!([]);
        }
    }
    let snap = read_snapshot(std::io::Cursor::new(serde_json::to_vec(&v).unwrap())).unwrap();
    let r = inspect_device(&snap, 0, &InspectOptions::default());
    assert_eq!(r.step_phases, None);
}

/// The steps a calibration cuts from the recording begin where the snapshot replay counts
/// device calls per step from: the phases the frames name and the optimizer's files say the
/// same. The run makes the optimizer's state in its first step only, so the steps after it
/// run together into one without an optimizer step.
#[test]
fn the_recording_and_the_raw_trace_agree_on_where_steps_begin() {
    let snap = training_run(4, false);
    let steps = find_steps(&recording(&snap, 0)).unwrap();
    let starts = step_starts(&snap, 0);
    assert_eq!((steps.total, starts.len()), (2, 1));
    assert_eq!(steps.whole.iter().map(|s| s.number).collect::<Vec<_>>(), [1]);
    // The second step begins at the first activation after the optimizer's state.
    let trace = &snap.device_traces[0];
    let before = &trace[..starts[0]];
    assert!(before
        .iter()
        .rev()
        .find(|e| e.action == TraceAction::Alloc)
        .is_some_and(|e| { snap.stacks.frames_of(e.stack).any(|(file, _, _)| file.ends_with("optim/adamw.py")) }));
}
