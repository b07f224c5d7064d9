//! `headroom replay SNAPSHOT`: a PyTorch memory snapshot's trace replayed
//! from the state it began in, checked decision for decision (`--check`) and
//! re-run under other settings and device sizes (what-if).

use crate::out_file::write_atomically;
use crate::progress::LazyBar;
use crate::replay_cmd::ReplayArgs;
use crate::Outcome;
use anyhow::{bail, Context, Result};
use headroom_alloc::units::format_size;
use headroom_alloc::{AllocatorConfig, Snapshot};
use headroom_trace::snapshot::{read_snapshot_file_with, MemorySnapshot};
use headroom_trace::snapshot_file::{write_snapshot, SnapshotFormat};
use headroom_trace::snapshot_replay::{check_from, what_if_device, DeviceTrace, Fidelity, WhatIf};
use serde_json::{json, Value};

/// One device: its fidelity (None when its state could not be rebuilt) and one what-if per setting.
struct DeviceRun {
    device: u32,
    entries: usize,
    start: Option<Start>,
    fidelity: Option<Fidelity>,
    runs: Vec<(String, WhatIf)>,
    /// Why this device was not replayed.
    skipped: Option<String>,
}

struct Start {
    reserved: u64,
    allocated: u64,
    live_blocks: usize,
    inferred_blocks: usize,
}

pub fn run(args: &ReplayArgs, capacity: u64, confs: &[(String, AllocatorConfig)]) -> Result<Outcome> {
    let mut bar = LazyBar::new("");
    let snap = read_snapshot_file_with(&args.trace, |done, total| bar.update("reading the snapshot", done, total))
        .with_context(|| format!("reading {}", args.trace.display()))?;
    bar.finish();
    let (recorded, settings_note) = snap.allocator_config();
    let devices = match args.device {
        Some(d) if !snap.devices().contains(&d) => {
            bail!("--device {d}: the snapshot has no device {d} (it has {:?})", snap.devices())
        }
        Some(d) => vec![d],
        None => snap.devices(),
    };
    // Without --alloc-conf, the recorded settings.
    let confs: Vec<(String, AllocatorConfig)> = if confs.is_empty() {
        vec![("(recorded)".to_string(), recorded.clone())]
    } else {
        confs
            .iter()
            .map(|(c, cfg)| (if c.is_empty() { "(default)".to_string() } else { c.clone() }, cfg.clone()))
            .collect()
    };

    let mut results = Vec::new();
    let mut merged: Option<Snapshot> = None;
    let mut dropped = 0;
    for &device in &devices {
        let entries = snap.device_traces.get(device as usize).map_or(0, Vec::len);
        let mut r = DeviceRun { device, entries, start: None, fidelity: None, runs: Vec::new(), skipped: None };
        let trace = match DeviceTrace::new(&snap, device) {
            Ok(t) => {
                let s = &t.start;
                r.start = Some(Start {
                    reserved: s.reserved_bytes(),
                    allocated: s.allocated_bytes(),
                    live_blocks: s.live_blocks(),
                    inferred_blocks: s.inferred_blocks,
                });
                Some(t)
            }
            Err(e) => {
                r.skipped = Some(e.to_string());
                None
            }
        };
        if r.skipped.is_none() && entries == 0 {
            r.skipped = Some("its trace is empty (recorded without history): nothing to replay".into());
        }
        if let (None, Some(t)) = (&r.skipped, &trace) {
            let mut bar = LazyBar::new("entries");
            let phase = format!("device {device}: checking");
            match check_from(t, recorded.clone(), capacity, |done| bar.update(&phase, done as u64, entries as u64)) {
                Ok(f) => r.fidelity = Some(f),
                Err(e) => r.skipped = Some(e.to_string()),
            }
            bar.finish();
        }
        if let (Some(f), Some(t)) = (&r.fidelity, &trace) {
            for (i, (label, config)) in confs.iter().enumerate() {
                let history = (i == 0 && args.snapshot_out.is_some()).then_some(args.max_entries as usize);
                let mut bar = LazyBar::new("entries");
                let phase = format!("device {device}: replaying [{label}]");
                let w = what_if_device(t, config.clone(), capacity, &f.empty_cache_calls, history, |done| {
                    bar.update(&phase, done as u64, entries as u64)
                })
                .with_context(|| format!("replaying device {device} under {label}"))?;
                bar.finish();
                if let Some(s) = &w.snapshot {
                    dropped += w.history_dropped;
                    merge(&mut merged, s, device);
                }
                r.runs.push((label.clone(), w));
            }
        }
        results.push(r);
    }
    if let (Some(path), Some(s)) = (&args.snapshot_out, &merged) {
        write_atomically(path, |w| write_snapshot(s, SnapshotFormat::from_path(path), w))?;
    }

    let any_oom = results.iter().flat_map(|r| &r.runs).any(|(_, w)| !w.ooms.is_empty());
    // With --check, a device with a trace that could not be checked counts as not matching.
    let diverged =
        args.check && results.iter().any(|r| r.entries > 0 && r.fidelity.as_ref().is_none_or(|f| !f.is_exact()));
    let mut out = String::new();
    if args.json {
        let v = json!({
            "snapshot": args.trace.display().to_string(),
            "format": snap.format,
            "recorded_alloc_conf": snap.settings.as_ref().and_then(|s| s.conf.clone()),
            "capacity_bytes": capacity,
            "notes": settings_note.iter().collect::<Vec<_>>(),
            "devices": results.iter().map(|r| device_json(r, args.check)).collect::<Vec<_>>(),
        });
        outln!(out, "{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_human(&mut out, args, &snap, capacity, &results, settings_note.as_deref(), dropped);
    }
    Ok(Outcome::new(out, if any_oom || diverged { 1 } else { 0 }))
}

/// Adds one device's replayed snapshot to the snapshot written with --snapshot-out.
fn merge(into: &mut Option<Snapshot>, s: &Snapshot, device: u32) {
    let m = into.get_or_insert_with(|| Snapshot {
        segments: Vec::new(),
        device_traces: Vec::new(),
        allocator_settings: s.allocator_settings.clone(),
    });
    m.segments.extend(s.segments.iter().cloned());
    let d = device as usize;
    if m.device_traces.len() <= d {
        m.device_traces.resize_with(d + 1, Vec::new);
    }
    m.device_traces[d] = s.device_traces.first().cloned().unwrap_or_default();
}

fn device_json(r: &DeviceRun, check: bool) -> Value {
    let fidelity = match (&r.fidelity, check) {
        (Some(f), true) => json!({
            "alloc_matched": f.alloc_matched,
            "alloc_total": f.alloc_total,
            "segment_matched": f.segment_matched,
            "segment_total": f.segment_total,
            "oom_matched": f.oom_matched,
            "oom_total": f.oom_total,
            "final_blocks_matched": f.final_blocks_matched,
            "final_blocks_total": f.final_blocks_total,
            "exact": f.is_exact(),
            "first_divergence": f.first_divergence.as_ref().map(|d| json!({
                "index": d.index, "message": d.message, "context": d.context,
            })),
        }),
        _ => Value::Null,
    };
    json!({
        "device": r.device,
        "trace_entries": r.entries,
        "skipped": r.skipped,
        "start": r.start.as_ref().map(|s| json!({
            "reserved_bytes": s.reserved,
            "allocated_bytes": s.allocated,
            "live_blocks": s.live_blocks,
            "inferred_blocks": s.inferred_blocks,
        })),
        "fidelity": fidelity,
        "runs": r.runs.iter().map(|(label, w)| json!({
            "alloc_conf": label,
            "peak_allocated_bytes": w.peak_allocated_bytes,
            "peak_reserved_bytes": w.peak_reserved_bytes,
            "fragmentation_at_peak_bytes": w.fragmentation_at_peak_bytes,
            "num_device_alloc": w.num_device_alloc,
            "num_device_free": w.num_device_free,
            "num_ooms": w.ooms.len(),
            "oom_ops": w.ooms.iter().map(|o| o.index).collect::<Vec<_>>(),
            "ooms": w.ooms.iter().map(|o| json!({"index": o.index, "size": o.size, "message": o.message})).collect::<Vec<_>>(),
            "recorded_ooms_served": w.recorded_ooms_served,
            "stats": w.stats,
        })).collect::<Vec<_>>(),
    })
}

fn print_human(
    out: &mut String,
    args: &ReplayArgs,
    snap: &MemorySnapshot,
    capacity: u64,
    results: &[DeviceRun],
    note: Option<&str>,
    dropped: u64,
) {
    let recorded = match snap.settings.as_ref().and_then(|s| s.conf.as_deref()) {
        Some("") => "PYTORCH_CUDA_ALLOC_CONF unset".to_string(),
        Some(c) => format!("PYTORCH_CUDA_ALLOC_CONF={c}"),
        None => "settings not recorded".to_string(),
    };
    outln!(
        out,
        "{}: PyTorch memory snapshot ({}), {} device(s), {recorded}; replayed on a simulated GPU of {}",
        args.trace.display(),
        snap.format,
        results.len(),
        format_size(capacity)
    );
    if let Some(n) = note {
        outln!(out, "note: {n}");
    }
    for r in results {
        outln!(out);
        let Some(start) = &r.start else {
            outln!(out, "device {}: not replayed: {}", r.device, r.skipped.as_deref().unwrap_or("?"));
            continue;
        };
        let began = if start.live_blocks == 0 && start.reserved == 0 {
            "from an empty allocator".to_string()
        } else {
            format!(
                "mid-run: {} reserved, {} allocated in {} live blocks ({} sized by inference)",
                format_size(start.reserved),
                format_size(start.allocated),
                start.live_blocks,
                start.inferred_blocks
            )
        };
        outln!(out, "device {}: {} trace entries, starting {began}", r.device, r.entries);
        if let Some(why) = &r.skipped {
            outln!(out, "  not replayed: {why}");
            continue;
        }
        let width = r.runs.iter().map(|(l, _)| l.len()).max().unwrap_or(0).max(24);
        outln!(
            out,
            "  {:<width$}  {:>12}  {:>13}  {:>12}  {:>7}  {:>7}  {:>4}",
            "PYTORCH_CUDA_ALLOC_CONF",
            "peak alloc",
            "peak reserved",
            "frag at peak",
            "mallocs",
            "frees",
            "OOMs"
        );
        for (label, w) in &r.runs {
            outln!(
                out,
                "  {:<width$}  {:>12}  {:>13}  {:>12}  {:>7}  {:>7}  {:>4}",
                label,
                format_size(w.peak_allocated_bytes),
                format_size(w.peak_reserved_bytes),
                format_size(w.fragmentation_at_peak_bytes),
                w.num_device_alloc,
                w.num_device_free,
                w.ooms.len()
            );
        }
        for (label, w) in r.runs.iter().filter(|(_, w)| !w.ooms.is_empty()) {
            let at: Vec<String> = w.ooms.iter().take(10).map(|o| o.index.to_string()).collect();
            let more = if w.ooms.len() > 10 { format!(" and {} more", w.ooms.len() - 10) } else { String::new() };
            outln!(out, "  {label}: out of memory at trace entries {}{more}", at.join(", "));
            outln!(out, "    first: {}", w.ooms[0].message.lines().next().unwrap_or_default());
        }
        if args.check {
            if let Some(f) = &r.fidelity {
                let exact = if f.is_exact() { " — every decision as recorded" } else { "" };
                outln!(out, "  fidelity: {f}{exact}");
                if let Some(d) = &f.first_divergence {
                    outln!(out, "  first divergence at entry {}: {}", d.index, d.message);
                    for c in &d.context {
                        outln!(out, "    {c}");
                    }
                }
            }
        }
    }
    if let Some(p) = &args.snapshot_out {
        outln!(out);
        outln!(out, "replayed snapshot written to {} (open it at https://pytorch.org/memory_viz)", p.display());
        if dropped > 0 {
            outln!(
                out,
                "it keeps the last {} trace entries per device; {dropped} earlier ones were let go",
                args.max_entries
            );
        }
    }
}
