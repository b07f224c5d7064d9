//! Every real snapshot in ../shared/fixtures inspects, and its figures agree
//! with recounts that do not share the inspector's code: reserved from the
//! segment entries undone from the final segments, the end of the walk with
//! the final segments, and the allocated peak with the statistics of
//! headroom's replay of the run (which matches PyTorch decision for decision
//! on these fixtures).

#[path = "../../../tests/support/skip.rs"]
mod skip;

use headroom_inspect::{inspect_device, InspectOptions};
use headroom_trace::device_trace::DeviceTrace;
use headroom_trace::snapshot::{read_snapshot_file, MemorySnapshot, TraceAction};
use headroom_trace::snapshot_replay::check_from;
use headroom_trace::what_if::what_if_device;
use std::path::PathBuf;

fn fixtures() -> Option<Vec<PathBuf>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/pytorch-snapshots");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        skip::skip(&format!("{} is absent (a fresh clone without ../shared)", dir.display()));
        return None;
    };
    let mut v: Vec<PathBuf> =
        entries.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "pickle")).collect();
    v.sort();
    Some(v)
}

/// Reserved bytes at each entry, from the final segments and the segment entries alone.
fn reserved_peak(snap: &MemorySnapshot, device: u32) -> u64 {
    let trace = snap.device_traces.get(device as usize).map_or(&[][..], Vec::as_slice);
    let end: u64 = snap.segments.iter().filter(|s| s.device == device).map(|s| s.total_size).sum();
    let delta = |a: TraceAction, size: u64| -> i128 {
        match a {
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => size as i128,
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => -(size as i128),
            _ => 0,
        }
    };
    let total: i128 = trace.iter().map(|e| delta(e.action, e.size)).sum();
    let mut r = end as i128 - total;
    let mut peak = r;
    for e in trace {
        r += delta(e.action, e.size);
        peak = peak.max(r);
    }
    peak as u64
}

#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn every_fixture_inspects_and_its_peaks_agree_with_recounts() {
    let Some(files) = fixtures() else { return };
    let (mut devices, mut with_trace, mut replay_checked, mut allocated_exact) = (0, 0, 0, 0);
    for f in &files {
        let snap = read_snapshot_file(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for d in snap.devices() {
            devices += 1;
            let r = inspect_device(&snap, d, &InspectOptions::default());
            let name = f.file_name().unwrap().to_string_lossy();
            assert!(r.peak_allocated_bytes >= r.now.allocated_bytes, "{name}: the peak is below the final state");
            assert!(r.peak_reserved_bytes >= r.now.reserved_bytes, "{name}");
            if r.trace_entries == 0 {
                assert_eq!(r.peak_allocated_bytes, r.now.allocated_bytes, "{name}");
                assert!(!r.unavailable.is_empty(), "{name}: a snapshot without a trace says what it cannot tell");
                continue;
            }
            with_trace += 1;
            assert_eq!(r.peak_reserved_bytes, reserved_peak(&snap, d), "{name}: peak reserved");
            // The walk ends where the snapshot's segments say it does.
            let end = r.timeline.end.totals;
            assert_eq!(end.reserved_bytes, r.now.reserved_bytes, "{name}: reserved at the end");
            assert_eq!(end.allocated_bytes, r.now.allocated_bytes, "{name}: allocated at the end");
            assert_eq!(end.requested_bytes, r.now.requested_bytes, "{name}: requested at the end");
            // The sites at the peak account for every allocated byte then.
            let listed: u64 = r.top_sites.iter().map(|s| s.bytes).sum();
            let by_role: u64 = r.roles.iter().map(|s| s.bytes).sum();
            assert_eq!(by_role, r.peak_allocated_bytes, "{name}: roles sum to the peak");
            assert!(listed <= r.peak_allocated_bytes, "{name}");
            // Against the allocator's own count, replayed.
            let t = DeviceTrace::new(&snap, d).unwrap();
            let (config, _) = snap.allocator_config();
            if let Ok(fid) = check_from(&t, config.clone(), 1 << 50, |_| {}) {
                if fid.is_exact() {
                    let w = what_if_device(&t, config, 1 << 50, &fid.recorded, None, |_| {}).unwrap();
                    replay_checked += 1;
                    // Block sizes come from the replay where it is exact; the walk's own
                    // accounting of them must reach the allocator's own peak.
                    assert_eq!(r.peak_allocated_bytes, w.peak_allocated_bytes, "{name}: peak allocated");
                    allocated_exact += 1;
                }
            }
        }
    }
    eprintln!(
        "{} fixtures, {devices} devices ({with_trace} with a trace); allocated peak equal to the replay's on \
         {allocated_exact} of {replay_checked}",
        files.len()
    );
    assert!(with_trace >= 40, "only {with_trace} devices with a trace");
}
