//! Decision-for-decision fidelity on every real snapshot with a trace,
//! whether its trace starts from an empty allocator or mid-run, and the
//! what-if replay under the recorded settings equal to the recorded run.
//!
//! For each device trace of each fixture in `../shared/fixtures/pytorch-snapshots`
//! and each snapshot recorded on the project's GPU (`../shared/gpu/snapshots`, gzip),
//! the state when the trace began is inferred from the final segments, then
//! every recorded request is replayed through headroom's allocator under the
//! recorded settings and every decision compared: each allocation's address,
//! each segment allocated or released (in order, flushes included), and the
//! final segments and blocks. The goal is 100%; a divergence is a bug.
//!
//! Skips with a message where `../shared` is absent (a user's fresh clone).

#[path = "../../../tests/support/skip.rs"]
mod skip;

use headroom_alloc::AllocatorConfig;
use headroom_trace::device_trace::DeviceTrace;
use headroom_trace::recorded_memory::{recorded_peak_reserved, RecordedMemory};
use headroom_trace::snapshot::{read_snapshot_file, MemorySnapshot, TraceAction};
use headroom_trace::snapshot_replay::{check_device, check_device_with, check_from};
use headroom_trace::what_if::what_if_device;
use std::path::{Path, PathBuf};

/// The real snapshots: other people's (`fixtures`) and the project's GPU runs (`gpu`).
fn fixtures_dir() -> Option<(PathBuf, PathBuf)> {
    let shared = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared");
    let (f, g) = (shared.join("fixtures/pytorch-snapshots"), shared.join("gpu/snapshots"));
    (f.is_dir() && g.is_dir()).then_some((f, g))
}

/// Device traces with allocations: 47 in the fixtures, 7 recorded on the GPU.
const TRACES: usize = 47 + 7;

/// The what-if replays' device when the recording does not tell its size.
const DEFAULT_CAPACITY: u64 = 80 << 30;

#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn every_fixture_with_a_trace_replays_decision_for_decision() {
    let Some(dirs) = fixtures_dir() else {
        skip::skip("../shared/fixtures and ../shared/gpu are absent (only development checkouts have them)");
        return;
    };
    let (mut fixtures, mut allocs, mut segs, mut blocks, mut mid_run) = (0, 0, 0, 0, 0);
    let mut failures = Vec::new();
    for (name, snap, device) in traced(&dirs) {
        {
            let f = check_device(&snap, device, 80 << 30, |_| {}).unwrap_or_else(|e| panic!("{name}: {e}"));
            eprintln!(
                "{name} device {device}: {f}, live at start {} ({} sized by inference)",
                f.live_at_start, f.inferred_blocks
            );
            if let Some(d) = &f.first_divergence {
                eprintln!("  first divergence at entry {}: {}\n    {}", d.index, d.message, d.context.join("\n    "));
            }
            if !f.is_exact() {
                failures.push(name.clone());
            }
            fixtures += 1;
            allocs += f.alloc_total;
            segs += f.segment_total;
            blocks += f.final_blocks_total;
            mid_run += (f.live_at_start > 0) as usize;
        }
    }
    eprintln!(
        "{fixtures} device traces ({mid_run} starting mid-run): {allocs} allocations, {segs} segment events, {blocks} final blocks checked"
    );
    assert!(failures.is_empty(), "diverged: {failures:?}");
    assert_eq!(fixtures, TRACES, "device traces with allocations");
}

/// The what-if replay under the recorded settings is the recorded run, on
/// every real snapshot: the device hands out the recorded addresses and
/// refuses where the recorded one refused, the program's `empty_cache()`
/// calls are made where it made them, and so it makes every recorded device
/// call, reaches the recorded peak reserved (recounted from the trace's
/// segment events), ends with the snapshot's segments reserved and runs out
/// of memory where the recorded run did.
#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn the_baseline_is_the_recorded_run() {
    let Some(dirs) = fixtures_dir() else {
        skip::skip("../shared/fixtures and ../shared/gpu are absent (only development checkouts have them)");
        return;
    };
    let mut n = 0;
    for (name, snap, device) in traced(&dirs) {
        let t = DeviceTrace::new(&snap, device).unwrap_or_else(|e| panic!("{name}: {e}"));
        let recorded = snap.allocator_config().0;
        let f = check_from(&t, recorded.clone(), DEFAULT_CAPACITY, |_| {}).unwrap();
        let memory = RecordedMemory::infer(&t, &f.recorded.refusals);
        let (capacity, _) = memory.capacity(None, DEFAULT_CAPACITY);
        let w = what_if_device(&t, recorded, capacity, &f.recorded, None, |_| {})
            .unwrap_or_else(|e| panic!("{name} device {device}: {e}"));
        let trace = &snap.device_traces[device as usize];
        let count = |a: &[TraceAction]| trace.iter().filter(|e| a.contains(&e.action)).count() as u64;
        let calls = count(&[
            TraceAction::SegmentAlloc,
            TraceAction::SegmentFree,
            TraceAction::SegmentMap,
            TraceAction::SegmentUnmap,
        ]);
        let final_reserved: u64 = snap.segments.iter().filter(|s| s.device == device).map(|s| s.total_size).sum();
        let peak = recorded_peak_reserved(&t);
        eprintln!(
            "{name} device {device}: peak reserved {peak} recorded, {} replayed; device calls {}/{calls} followed{}",
            w.peak_reserved_bytes,
            w.device_calls_followed,
            memory.limit.map_or(String::new(), |l| format!("; limit {}..{}", l.at_least, l.below))
        );
        if name.starts_with("oom-cpp") {
            // Its OOM message (not in the snapshot) said "10.00 GiB allowed", with 129 GiB free.
            let l = memory.limit.expect("a per-process limit refused the request");
            assert!(l.at_least <= 10 << 30 && 10 << 30 < l.below, "{l:?}");
            assert_eq!(f.recorded.memory_limit, Some(l.at_least));
        } else {
            assert_eq!(memory.limit, None, "{name}: no limit where the device refused or nothing was refused");
        }
        assert_eq!(w.peak_reserved_bytes, peak, "{name} device {device}: peak reserved");
        assert_eq!(w.device_calls_followed as u64, calls, "{name} device {device}: device calls");
        assert_eq!(w.num_device_alloc, count(&[TraceAction::SegmentAlloc, TraceAction::SegmentMap]), "{name}");
        assert_eq!(w.num_device_free, count(&[TraceAction::SegmentFree, TraceAction::SegmentUnmap]), "{name}");
        assert_eq!(w.stats["reserved_bytes.all.current"] as u64, final_reserved, "{name}: the run's end");
        assert_eq!(w.ooms.len() as u64 + w.recorded_ooms_served as u64, 0, "{name}: OOMs where recorded, no others");
        n += 1;
    }
    assert_eq!(n, TRACES);
}

/// What-if runs under other settings on every real snapshot: expandable
/// segments, and a split limit with garbage collection, on the device the
/// recording tells of.
#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn what_if_runs_on_every_fixture() {
    let Some(dirs) = fixtures_dir() else {
        skip::skip("../shared/fixtures and ../shared/gpu are absent (only development checkouts have them)");
        return;
    };
    let others = [
        AllocatorConfig::parse("expandable_segments:True").unwrap(),
        AllocatorConfig::parse("max_split_size_mb:64,garbage_collection_threshold:0.6").unwrap(),
    ];
    let mut runs = 0;
    for (name, snap, device) in traced(&dirs) {
        let t = DeviceTrace::new(&snap, device).unwrap_or_else(|e| panic!("{name}: {e}"));
        let f = check_from(&t, snap.allocator_config().0, DEFAULT_CAPACITY, |_| {}).unwrap();
        let (capacity, _) = RecordedMemory::infer(&t, &f.recorded.refusals).capacity(None, DEFAULT_CAPACITY);
        for (i, config) in others.iter().cloned().enumerate() {
            let w = what_if_device(&t, config, capacity, &f.recorded, None, |_| {})
                .unwrap_or_else(|e| panic!("{name} device {device}, setting {i}: {e}"));
            runs += 1;
            assert!(w.peak_allocated_bytes <= w.peak_reserved_bytes, "{name}");
            assert!(w.peak_reserved_bytes <= capacity, "{name}");
        }
    }
    eprintln!("{runs} what-if runs");
    assert_eq!(runs, 2 * TRACES);
}

/// Every (snapshot, device) whose trace has allocations, the fixtures'
/// then the GPU's (read compressed, as they are stored).
fn traced((fixtures, gpu): &(PathBuf, PathBuf)) -> Vec<(String, MemorySnapshot, u32)> {
    let list = |dir: &Path, ext: &str| {
        let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(ext))
            .collect();
        names.sort();
        names
    };
    let mut names = list(fixtures, ".pickle");
    names.extend(list(gpu, ".pickle.gz"));
    let mut out = Vec::new();
    for path in names {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let snap = read_snapshot_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        for device in snap.devices() {
            let traced = snap
                .device_traces
                .get(device as usize)
                .is_some_and(|t| t.iter().any(|e| e.action == TraceAction::Alloc));
            if traced {
                out.push((name.clone(), snap.clone(), device));
            }
        }
    }
    out
}

/// The check can fail: replayed under settings the runs did not use, the
/// decisions differ from the recorded ones.
#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn wrong_settings_are_caught() {
    let Some(dirs) = fixtures_dir() else {
        skip::skip("../shared/fixtures and ../shared/gpu are absent");
        return;
    };
    let runs = traced(&dirs);
    for conf in ["roundup_power2_divisions:4", "max_split_size_mb:40"] {
        let config = AllocatorConfig::parse(conf).unwrap();
        let (mut exact, mut matched, mut total) = (0, 0, 0);
        for (_, snap, device) in &runs {
            // Refusing the trace (its blocks no longer fit the start state) counts as caught too.
            if let Ok(f) = check_device_with(snap, *device, config.clone(), 80 << 30, |_| {}) {
                exact += f.is_exact() as usize;
                matched += f.alloc_matched;
                total += f.alloc_total;
            }
        }
        eprintln!("{conf}: {exact} of {} traces exact, allocations {matched}/{total}", runs.len());
        assert!(exact < runs.len(), "{conf}: the check did not notice the wrong settings");
    }
}
