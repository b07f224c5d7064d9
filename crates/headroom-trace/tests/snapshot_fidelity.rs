//! Decision-for-decision fidelity on every real snapshot with a trace,
//! whether its trace starts from an empty allocator or mid-run.
//!
//! For each device trace of each fixture in `../shared/fixtures/pytorch-snapshots`,
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
use headroom_trace::snapshot::{read_snapshot_file, MemorySnapshot, TraceAction};
use headroom_trace::snapshot_replay::{check_device, check_device_with, check_from, what_if_device, DeviceTrace};
use std::path::PathBuf;

fn fixtures_dir() -> Option<PathBuf> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/pytorch-snapshots");
    d.is_dir().then_some(d)
}

#[test]
fn every_fixture_with_a_trace_replays_decision_for_decision() {
    let Some(dir) = fixtures_dir() else {
        skip::skip("../shared/fixtures/pytorch-snapshots is absent (only development checkouts have it)");
        return;
    };
    let (mut fixtures, mut allocs, mut segs, mut blocks, mut mid_run) = (0, 0, 0, 0, 0);
    let mut failures = Vec::new();
    for (name, snap, device) in traced(&dir) {
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
    assert_eq!(fixtures, 47, "fixtures with allocations in their trace");
}

/// What-if runs on every fixture: under the recorded settings, expandable
/// segments, and a split limit with garbage collection. Under the recorded
/// settings it must end where the recorded run ended (the snapshot's own
/// segments) unless the recorded run's device was full: its flushes then
/// released segments that the what-if's 80 GiB device keeps.
#[test]
fn what_if_runs_on_every_fixture() {
    let Some(dir) = fixtures_dir() else {
        skip::skip("../shared/fixtures/pytorch-snapshots is absent (only development checkouts have it)");
        return;
    };
    let others = [
        AllocatorConfig::parse("expandable_segments:True").unwrap(),
        AllocatorConfig::parse("max_split_size_mb:64,garbage_collection_threshold:0.6").unwrap(),
    ];
    let (mut runs, mut same_end) = (0, 0);
    for (name, snap, device) in traced(&dir) {
        let t = DeviceTrace::new(&snap, device).unwrap_or_else(|e| panic!("{name}: {e}"));
        let recorded = snap.allocator_config().0;
        let f = check_from(&t, recorded.clone(), 80 << 30, |_| {}).unwrap();
        let ooms = snap.device_traces[device as usize].iter().filter(|e| e.action == TraceAction::Oom).count();
        let final_reserved: u64 = snap.segments.iter().filter(|s| s.device == device).map(|s| s.total_size).sum();
        let trace = &snap.device_traces[device as usize];
        let flushed = trace
            .windows(2)
            .any(|w| w[0].action == TraceAction::SegmentFree && w[1].action == TraceAction::SegmentAlloc);
        for (i, config) in std::iter::once(recorded).chain(others.iter().cloned()).enumerate() {
            let w = what_if_device(&t, config, 80 << 30, &f.empty_cache_calls, None, |_| {})
                .unwrap_or_else(|e| panic!("{name} device {device}, setting {i}: {e}"));
            runs += 1;
            assert!(w.peak_allocated_bytes <= w.peak_reserved_bytes, "{name}");
            assert!(w.peak_reserved_bytes <= 80 << 30, "{name}");
            if i == 0 && !flushed {
                let end = w.stats["reserved_bytes.all.current"] as u64;
                assert_eq!(end, final_reserved, "{name}: the recorded settings end where the run ended");
                assert_eq!(w.ooms.len(), ooms, "{name}");
                same_end += 1;
            }
        }
    }
    eprintln!("{runs} what-if runs; {same_end} runs without a flush end at the recorded segments");
    assert_eq!(runs, 3 * 47);
    assert_eq!(same_end, 40, "device traces whose recorded run never flushed its cache");
}

/// Every (fixture, snapshot, device) whose trace has allocations.
fn traced(dir: &std::path::Path) -> Vec<(String, MemorySnapshot, u32)> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    names.sort();
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
fn wrong_settings_are_caught() {
    let Some(dir) = fixtures_dir() else {
        skip::skip("../shared/fixtures/pytorch-snapshots is absent");
        return;
    };
    let runs = traced(&dir);
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
