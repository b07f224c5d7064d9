//! headroom's allocation policies against PyTorch's on every real snapshot
//! with a trace, each replayed from an empty device (`StartFrom::Fresh`):
//! the blocks live when the trace began are placed by the policy under test,
//! then every request and free of the trace follows.
//!
//! Asserted on every fixture: no policy runs out of memory on an 80 GiB
//! device; no policy reserves less than the peak of live bytes (which would
//! mean the replay lost a block); `headroom` reserves no more than
//! `expandable` and makes at most 1.25 times its device calls (maps and
//! unmaps), except on the fixtures named in `MISSED`, with the reason (the
//! test fails on any other, and when a named one no longer misses); it
//! reserves no more than PyTorch's default wherever `expandable` does not
//! either; and after the second training step (the steady state) it makes
//! no more device calls than `tight` (every free page given back before the
//! peak grows).
//! The table in docs/VALIDATION.md is this test's output:
//! `HEADROOM_REGENERATE=1 cargo test -p headroom-trace --test policies`.
//!
//! Skips with a message where `../shared` is absent (a user's fresh clone).

#[path = "../../../tests/support/skip.rs"]
mod skip;

use headroom_alloc::PolicyName;
use headroom_trace::device_trace::DeviceTrace;
use headroom_trace::snapshot::{read_snapshot_file, TraceAction};
use headroom_trace::snapshot_replay::check_from;
use headroom_trace::what_if::{live_peak_bytes, what_if, Setup, StartFrom, WhatIf};
use std::fmt::Write;
use std::path::PathBuf;

/// Fixtures on which `headroom` misses the promise: its peak above
/// `expandable`'s, or more than 1.25 times its device calls. Giving whole
/// free pages back before the peak grows moves where later blocks land. The
/// two octree-NCA runs hold a few blocks of several GiB: on this 80 GiB device
/// the reclaim's placement strands one of them at a later peak (+15 and +13
/// points over live: 2.7 and 2.4 GiB), and the inference run pays 1.8 times
/// expandable's few calls for it; replayed as `headroom replay` does (the
/// recorded device's size, docs/PERFORMANCE.md) the first is 60 MiB below
/// expandable and the second 4 MiB above. The forward pass at context 512
/// peaks 8 MiB (four pages) above.
const MISSED: [&str; 3] = [
    "HugePandaCoder__octree-nca-groupeq__3e8aa21a__mem_snapshots_inference2_peso_oct.pickle",
    "HugePandaCoder__octree-nca-groupeq__d47727a2__my_snapshot.pickle",
    "kkaitlyn111__cs336-a2-systems__c1c174d1__memory_files_memory_ctx512_forward_.pickle",
];

/// Device calls after the second training step (the steady state); `None`
/// for a trace of fewer than three steps.
fn steady_calls(w: &WhatIf) -> Option<u64> {
    calls_after(w, 2)
}

/// Device calls after the first `steps` steps; `None` for a trace of no more steps.
fn calls_after(w: &WhatIf, steps: usize) -> Option<u64> {
    (w.calls_by_step.len() > steps).then(|| w.calls_by_step[steps..].iter().sum())
}

const CAPACITY: u64 = 80 << 30;
const BEGIN: &str = "<!-- policy-table:begin -->\n";
const END: &str = "<!-- policy-table:end -->";

fn fixtures_dir() -> Option<PathBuf> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/pytorch-snapshots");
    d.is_dir().then_some(d)
}

/// A training run, by the file's name: it records whole steps (forward,
/// backward, optimizer), not a forward or an inference.
fn is_training(name: &str) -> bool {
    name.contains("train") || name.contains("step")
}

struct Row {
    name: String,
    device: u32,
    live: u64,
    runs: Vec<WhatIf>,
}

impl Row {
    fn excess(&self, i: usize) -> f64 {
        if self.live == 0 {
            return 0.0;
        }
        (self.runs[i].peak_reserved_bytes as f64 / self.live as f64 - 1.0) * 100.0
    }
}

fn gib(b: u64) -> String {
    format!("{:.2}", b as f64 / (1u64 << 30) as f64)
}

#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn headroom_policy_against_pytorch_on_every_fixture() {
    let Some(dir) = fixtures_dir() else {
        skip::skip("../shared/fixtures/pytorch-snapshots is absent (only development checkouts have it)");
        return;
    };
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    paths.sort();
    let mut rows = Vec::new();
    for path in paths {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let snap = read_snapshot_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        for device in snap.devices() {
            let trace = snap.device_traces.get(device as usize).map_or(&[][..], Vec::as_slice);
            if !trace.iter().any(|e| e.action == TraceAction::Alloc) {
                continue;
            }
            let t = DeviceTrace::new(&snap, device).unwrap_or_else(|e| panic!("{name}: {e}"));
            let recorded = snap.allocator_config().0;
            let calls = check_from(&t, recorded.clone(), CAPACITY, |_| {}).map(|f| f.recorded).unwrap_or_default();
            let live = live_peak_bytes(&t, &recorded);
            let runs: Vec<WhatIf> = PolicyName::ALL
                .iter()
                .map(|&policy| {
                    let setup = Setup { config: recorded.clone(), policy, start: StartFrom::Fresh };
                    what_if(&t, setup, CAPACITY, &calls, None, |_| {})
                        .unwrap_or_else(|e| panic!("{name}: {policy}: {e}"))
                })
                .collect();
            for (policy, w) in PolicyName::ALL.iter().zip(&runs) {
                assert!(w.ooms.is_empty(), "{name} device {device}: {policy} ran out of memory: {:?}", w.ooms[0]);
                assert!(
                    w.peak_reserved_bytes >= live,
                    "{name} device {device}: {policy} reserved {} at its peak, less than the {live} bytes live",
                    w.peak_reserved_bytes
                );
            }
            rows.push(Row { name: name.clone(), device, live, runs });
        }
    }
    assert_eq!(rows.len(), 47, "device traces with allocations");

    // The figures are `headroom`'s; `lifetime` and `planned` are measured beside it (the
    // table) and held only to the invariants above.
    let (pytorch, expandable, headroom, tight) = (0, 1, 2, 3);
    assert_eq!(
        PolicyName::ALL[..4],
        [PolicyName::PyTorch, PolicyName::Expandable, PolicyName::Headroom, PolicyName::Tight]
    );
    let mut missed = Vec::new();
    for r in &rows {
        let [p, e, h] = [pytorch, expandable, headroom].map(|i| r.runs[i].peak_reserved_bytes);
        let calls = |i: usize| r.runs[i].num_device_alloc + r.runs[i].num_device_free;
        assert!(h <= p || e > p, "{} device {}: headroom peaks at {h} B, PyTorch's default at {p} B", r.name, r.device);
        if h > e || 4 * calls(headroom) > 5 * calls(expandable) {
            missed.push(r.name.as_str());
        }
        let [st, sh] = [tight, headroom].map(|i| steady_calls(&r.runs[i]).unwrap_or(0));
        assert!(sh <= st, "{}: headroom makes {sh} device calls after the second step, tight {st}", r.name);
    }
    let unexpected: Vec<_> = missed.iter().filter(|n| !MISSED.contains(n)).collect();
    assert!(unexpected.is_empty(), "headroom misses expandable's peak or 1.25 times its calls on {unexpected:?}");
    let gone: Vec<_> = MISSED.iter().filter(|n| !missed.contains(n)).collect();
    assert!(gone.is_empty(), "listed in MISSED but no longer missing: {gone:?}");

    let text = table(&rows);
    eprintln!("{text}");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/VALIDATION.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let start = doc.find(BEGIN).expect("docs/VALIDATION.md has the policy-table markers") + BEGIN.len();
    let end = doc.find(END).expect("end marker");
    let regenerate = std::env::var_os("HEADROOM_REGENERATE").is_some();
    if regenerate {
        std::fs::write(&path, format!("{}{}{}", &doc[..start], text, &doc[end..])).unwrap();
    }
    assert!(
        regenerate || doc[start..end] == text,
        "docs/VALIDATION.md's policy table is stale: run HEADROOM_REGENERATE=1 cargo test -p headroom-trace --test policies"
    );
}

fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    let names = PolicyName::ALL.map(|p| p.name());
    let n = names.len();
    writeln!(
        s,
        "| fixture | dev | train | live peak GiB | {} | device calls {} |",
        names.map(|n| format!("`{n}` over live")).join(" | "),
        names.join(" / ")
    )
    .unwrap();
    writeln!(s, "|---|---|---|---|{}---|", "---|".repeat(n)).unwrap();
    for r in rows {
        let calls: Vec<String> =
            r.runs.iter().map(|w| format!("{}+{}", w.num_device_alloc, w.num_device_free)).collect();
        let excess: Vec<String> = (0..n).map(|i| format!("{:+.1}%", r.excess(i))).collect();
        writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            r.name.trim_end_matches(".pickle"),
            r.device,
            if is_training(&r.name) { "yes" } else { "" },
            gib(r.live),
            excess.join(" | "),
            calls.join(" / ")
        )
        .unwrap();
    }
    let mean = |f: &dyn Fn(&Row) -> bool, i: usize| {
        let sel: Vec<&Row> = rows.iter().filter(|r| f(r) && r.live > 0).collect();
        (sel.iter().map(|r| r.excess(i)).sum::<f64>() / sel.len() as f64, sel.len())
    };
    let per_policy = |figure: &dyn Fn(usize) -> String| -> String {
        names.iter().enumerate().map(|(i, name)| format!("{name} {}", figure(i))).collect::<Vec<_>>().join(", ")
    };
    writeln!(s).unwrap();
    for (label, f) in [
        ("all fixtures", &(|_: &Row| true) as &dyn Fn(&Row) -> bool),
        ("training fixtures", &|r: &Row| is_training(&r.name)),
    ] {
        let (_, count) = mean(f, 0);
        writeln!(
            s,
            "Mean peak reserved over live, {label} ({count}): {}.",
            per_policy(&|i| format!("{:+.1}%", mean(f, i).0))
        )
        .unwrap();
        // Weighted by size: the peaks summed over the live bytes summed.
        let live: u64 = rows.iter().filter(|r| f(r)).map(|r| r.live).sum();
        let over = |i: usize| {
            let peaks: u64 = rows.iter().filter(|r| f(r)).map(|r| r.runs[i].peak_reserved_bytes).sum();
            (peaks as f64 / live as f64 - 1.0) * 100.0
        };
        writeln!(
            s,
            "Summed over those runs (peaks over live bytes): {}.",
            per_policy(&|i| format!("{:+.1}%", over(i)))
        )
        .unwrap();
        writeln!(s).unwrap();
    }
    let stepped: Vec<&Row> = rows.iter().filter(|r| steady_calls(&r.runs[0]).is_some()).collect();
    writeln!(
        s,
        "Device calls after the second training step, on the {} traces of more than two steps ({}): {}.",
        stepped.len(),
        stepped.iter().map(|r| r.name.trim_end_matches(".pickle")).collect::<Vec<_>>().join(", "),
        per_policy(&|i| stepped.iter().map(|r| steady_calls(&r.runs[i]).unwrap_or(0)).sum::<u64>().to_string())
    )
    .unwrap();
    let total = |i: usize, free: bool| -> u64 {
        rows.iter().map(|r| if free { r.runs[i].num_device_free } else { r.runs[i].num_device_alloc }).sum()
    };
    writeln!(
        s,
        "Device calls over all fixtures (allocations or maps + frees or unmaps): {}.",
        per_policy(&|i| format!("{}+{}", total(i, false), total(i, true)))
    )
    .unwrap();
    s
}

/// What the lower peak buys: the forward pass of a small transformer
/// (cs336, 0.98 GiB live at its peak) on a 1 GiB device runs out of memory
/// 29 times under PyTorch's policy and not once under `headroom`.
#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn a_run_that_pytorch_cannot_fit_fits_under_headroom() {
    let Some(dir) = fixtures_dir() else {
        skip::skip("../shared/fixtures/pytorch-snapshots is absent (only development checkouts have it)");
        return;
    };
    let path = dir.join("kkaitlyn111__cs336-a2-systems__46eae3f8__memory_small_forward.pickle");
    let snap = read_snapshot_file(&path).unwrap();
    let t = DeviceTrace::new(&snap, 0).unwrap();
    let recorded = snap.allocator_config().0;
    let calls = check_from(&t, recorded.clone(), CAPACITY, |_| {}).unwrap().recorded;
    let run = |policy| {
        let setup = Setup { config: recorded.clone(), policy, start: StartFrom::Fresh };
        what_if(&t, setup, 1 << 30, &calls, None, |_| {}).unwrap()
    };
    let (pytorch, headroom) = (run(PolicyName::PyTorch), run(PolicyName::Headroom));
    assert_eq!(pytorch.ooms.len(), 29, "{:?}", pytorch.ooms.first());
    assert!(headroom.ooms.is_empty(), "{:?}", headroom.ooms.first());
    assert!(headroom.peak_reserved_bytes <= 1 << 30);
}
