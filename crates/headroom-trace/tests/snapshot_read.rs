//! Every real snapshot in `../shared/fixtures/pytorch-snapshots` reads, and
//! what is read agrees with the fixtures' catalogue (counted there by
//! Python's own unpickler): segments, reserved and allocated bytes, trace
//! events by action, whether entries carry times and frames, expandable
//! segments. Snapshots headroom writes read back as written, pickle and JSON.
//!
//! The fixture tests skip with a message where `../shared` is absent.

#[path = "../../../tests/support/skip.rs"]
mod skip;

use headroom_alloc::{AllocatorConfig, BlockState, DeviceCachingAllocator, SimDevice};
use headroom_trace::snapshot::{read_snapshot, read_snapshot_file, MemorySnapshot, TraceAction};
use headroom_trace::snapshot_file::{write_snapshot, SnapshotFormat};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn fixtures_dir() -> Option<PathBuf> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/pytorch-snapshots");
    d.is_dir().then_some(d)
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1 << 20) as f64)
}

fn actions(s: &MemorySnapshot) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for e in s.device_traces.iter().flatten() {
        *counts.entry(e.action.name()).or_default() += 1;
    }
    if counts.is_empty() {
        return "-".into();
    }
    counts.iter().map(|(k, v)| format!("{k}:{v}")).collect::<Vec<_>>().join(" ")
}

#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn every_fixture_reads_as_its_catalogue_says() {
    let Some(dir) = fixtures_dir() else {
        skip::skip("../shared/fixtures/pytorch-snapshots is absent (only development checkouts have it)");
        return;
    };
    let catalogue = std::fs::read_to_string(dir.join("CATALOG.md")).expect("CATALOG.md");
    let mut checked = 0;
    for row in catalogue.lines().filter(|l| l.starts_with("| ") && l.contains(".pickle")) {
        let c: Vec<&str> = row.split('|').map(str::trim).collect();
        let (name, segments, reserved, allocated, events, acts, time_us, frames, expandable) =
            (c[1], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[12]);
        let s = read_snapshot_file(&dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(s.segments.len().to_string(), segments, "{name}: segments");
        let total: u64 = s.segments.iter().map(|g| g.total_size).sum();
        assert_eq!(mib(total), reserved, "{name}: reserved");
        let alloc: u64 = s
            .segments
            .iter()
            .flat_map(|g| &g.blocks)
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .map(|b| b.size)
            .sum();
        assert_eq!(mib(alloc), allocated, "{name}: allocated");
        assert_eq!(s.device_traces.iter().map(Vec::len).sum::<usize>().to_string(), events, "{name}: events");
        assert_eq!(actions(&s), acts, "{name}: actions");
        let timed = s.device_traces.iter().flatten().any(|e| e.time_us.is_some());
        assert_eq!(if timed { "yes" } else { "no" }, time_us, "{name}: time_us");
        let framed = s.device_traces.iter().flatten().any(|e| e.stack != 0)
            || s.segments.iter().any(|g| g.stack != 0 || g.blocks.iter().any(|b| b.stack != 0));
        assert_eq!(if framed { "yes" } else { "no" }, frames, "{name}: frames");
        let exp = s.segments.iter().any(|g| g.is_expandable);
        assert_eq!(if exp { "yes" } else { "no" }, expandable, "{name}: expandable");
        // Blocks tile their segment.
        for g in &s.segments {
            assert_eq!(g.blocks.iter().map(|b| b.size).sum::<u64>(), g.total_size, "{name}: segment {:#x}", g.address);
        }
        checked += 1;
    }
    eprintln!("{checked} fixtures read and checked against CATALOG.md");
    let files = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "pickle"))
        .count();
    assert_eq!(checked, files, "every fixture has a catalogue row");
}

#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn frames_are_interned_and_resolve_to_source_lines() {
    let Some(dir) = fixtures_dir() else {
        skip::skip("../shared/fixtures/pytorch-snapshots is absent");
        return;
    };
    let s = read_snapshot_file(&dir.join("ZidongLiu__DeComFL__edd30e09__memory.pickle")).unwrap();
    let with_frames = s.device_traces[0].iter().filter(|e| e.stack != 0).count();
    assert!(with_frames > 20_000);
    // Far fewer distinct stacks than entries that carry one.
    assert!(s.stacks.stacks.len() * 10 < with_frames, "{} stacks", s.stacks.stacks.len());
    let alloc = s.device_traces[0].iter().find(|e| e.action == TraceAction::Alloc && e.stack != 0).unwrap();
    let frames: Vec<_> = s.stacks.frames_of(alloc.stack).collect();
    assert!(frames.iter().any(|(file, line, _)| file.ends_with(".py") && *line > 0), "{frames:?}");
}

#[test]
fn headroom_snapshots_read_back_in_both_encodings() {
    let mut a = DeviceCachingAllocator::new(SimDevice::new(1 << 36), AllocatorConfig::default());
    a.record_history(Some(1000));
    let x = a.malloc(3 << 20, 0).unwrap();
    let y = a.malloc(700, 7).unwrap();
    a.free(x.ptr).unwrap();
    let _ = a.malloc(30 << 20, 0).unwrap();
    a.free(y.ptr).unwrap();
    a.empty_cache().unwrap();
    let snap = a.snapshot();
    for format in [SnapshotFormat::Pickle, SnapshotFormat::Json] {
        let mut bytes = Vec::new();
        write_snapshot(&snap, format, &mut bytes).unwrap();
        let s = read_snapshot(&bytes[..]).unwrap();
        assert_eq!(s.segments.len(), snap.segments.len(), "{format:?}");
        for (r, w) in s.segments.iter().zip(&snap.segments) {
            assert_eq!(
                (r.address, r.total_size, r.stream, r.pool),
                (w.address, w.total_size, w.stream, Some(w.segment_type))
            );
            let rb: Vec<_> = r.blocks.iter().map(|b| (b.address, b.size, b.state)).collect();
            let wb: Vec<_> = w.blocks.iter().map(|b| (b.address, b.size, b.state)).collect();
            assert_eq!(rb, wb);
        }
        let read: Vec<_> = s.device_traces[0].iter().map(|e| (e.action.name(), e.addr, e.size, e.stream)).collect();
        let written: Vec<_> =
            snap.device_traces[0].iter().map(|e| (e.action.name(), e.addr, e.size, e.stream)).collect();
        assert_eq!(read, written, "{format:?}");
        assert!(s.settings.is_some());
    }
}

#[test]
fn bad_files_are_errors_that_say_what_is_wrong() {
    let err = |b: &[u8]| read_snapshot(b).unwrap_err().to_string();
    assert_eq!(err(b""), "not a memory snapshot: the file is empty");
    assert!(err(b"hello").contains("starts with byte 0x68"));
    assert!(err(b"\x80\x04K\x01.").contains("the top level is an int"));
    assert!(err(b"{\"segments\": 3}").contains("'segments' is an int"));
    assert!(err(b"{\"device_traces\": [[{\"action\": \"alloc\", \"size\": 1}]]}").contains("without 'addr'"));
    assert!(err(b"{\"device_traces\": [[{\"action\": \"alloc\", \"addr\": -1, \"size\": 1}]]}")
        .contains("'addr' is an int (-1)"));
    assert!(err(b"{\"segments\": [{\"blocks\": [{\"size\": 1, \"state\": \"gone\"}]}]}").contains("state \"gone\""));
    assert!(err(b"{\"segments\": [1, 2").contains("not valid JSON"));
}
