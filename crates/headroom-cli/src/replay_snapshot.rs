//! `headroom replay SNAPSHOT`: a PyTorch memory snapshot's trace replayed
//! from the state it began in, checked decision for decision (`--check`) and
//! re-run under other settings and device sizes (what-if).

use crate::out_file::write_atomically;
use crate::progress::LazyBar;
use crate::replay_args::{ReplayArgs, DEFAULT_CAPACITY};
use crate::Outcome;
use anyhow::{bail, Context, Result};
use headroom_alloc::units::format_size;
use headroom_alloc::PolicyName;
use headroom_alloc::{AllocatorConfig, Snapshot};
use headroom_trace::device_trace::DeviceTrace;
use headroom_trace::recorded_memory::{CapacitySource, RecordedMemory};
use headroom_trace::snapshot::{read_snapshot_file_with, MemorySnapshot};
use headroom_trace::snapshot_file::{write_snapshot, SnapshotFormat};
use headroom_trace::snapshot_replay::{check_from, Fidelity, Recorded};
use headroom_trace::what_if::{live_peak_bytes, what_if, Setup, StartFrom, WhatIf};
use serde_json::{json, Value};

/// One device: its fidelity (None when its state could not be rebuilt) and one what-if per setting.
struct DeviceRun {
    device: u32,
    entries: usize,
    start: Option<Start>,
    fidelity: Option<Fidelity>,
    /// Why the decisions could not be checked, when the what-ifs ran all the same.
    unchecked: Option<String>,
    /// The most bytes live at once: the least any allocator could reserve.
    live_peak: Option<u64>,
    /// The simulated device's memory, and where that figure came from.
    capacity: u64,
    capacity_source: CapacitySource,
    /// What the trace says of the recorded device (when the trace was checked).
    memory: Option<RecordedMemory>,
    /// The per-process limit replayed, when the recording showed one.
    memory_limit: Option<u64>,
    runs: Vec<Run>,
    /// Why this device was not replayed.
    skipped: Option<String>,
}

/// One what-if: a policy under one setting.
struct Run {
    policy: PolicyName,
    conf: String,
    what_if: WhatIf,
}

struct Start {
    reserved: u64,
    allocated: u64,
    live_blocks: usize,
    inferred_blocks: usize,
}

/// Replays every device asked for: checked against the recording where that
/// is asked for or needed, then once per policy and setting; prints the
/// table or the JSON object. Exit status 1 on an OOM or, with --check, a
/// decision that differed.
pub fn run(
    args: &ReplayArgs,
    given_capacity: Option<u64>,
    confs: &[(String, AllocatorConfig)],
    policies: &[PolicyName],
    start: StartFrom,
) -> Result<Outcome> {
    let mut bar = LazyBar::new("");
    let snap = read_snapshot_file_with(&args.trace, |done, total| bar.update("reading the snapshot", done, total))
        .with_context(|| format!("reading {}", args.trace.display()))?;
    bar.finish();
    let (recorded, settings_note) = snap.allocator_config();
    let devices = devices_asked(&snap, args.device)?;
    let settings_given = !confs.is_empty();
    let confs = labelled(confs, &recorded);
    let replay = Replay { args, snap: &snap, recorded: &recorded, given_capacity, confs: &confs, policies, start };
    let results = devices.iter().map(|&device| replay.device(device)).collect::<Result<Vec<_>>>()?;
    refuse_nothing_replayed(&results)?;
    let (merged, dropped) = merged_snapshot(&results);
    if let (Some(path), Some(s)) = (&args.snapshot_out, &merged) {
        write_atomically(path, |w| write_snapshot(s, SnapshotFormat::from_path(path), w))?;
    }

    let any_oom = results.iter().flat_map(|r| &r.runs).any(|r| !r.what_if.ooms.is_empty());
    // With --check, a device with a trace that could not be checked counts as not matching.
    let diverged =
        args.check && results.iter().any(|r| r.entries > 0 && r.fidelity.as_ref().is_none_or(|f| !f.is_exact()));
    let mut out = String::new();
    if args.json {
        let v = json!({
            "snapshot": args.trace.display().to_string(),
            "format": snap.format,
            "recorded_alloc_conf": snap.settings.as_ref().and_then(|s| s.conf.clone()),
            "start": start.name(),
            "notes": settings_note.iter().collect::<Vec<_>>(),
            "devices": results.iter().map(|r| device_json(r, args.check)).collect::<Vec<_>>(),
        });
        outln!(out, "{}", serde_json::to_string_pretty(&v)?);
    } else {
        let note = settings_note.as_deref();
        let written_ooms = merged.as_ref().map_or_else(Vec::new, first_ooms);
        let shown = Shown { results: &results, note, dropped, policies, start, settings_given, written_ooms };
        print_human(&mut out, args, &snap, shown);
    }
    Ok(Outcome::new(out, if any_oom || diverged { 1 } else { 0 }))
}

/// The devices --device names, or every device of the snapshot.
fn devices_asked(snap: &MemorySnapshot, asked: Option<u32>) -> Result<Vec<u32>> {
    Ok(match asked {
        Some(d) if !snap.devices().contains(&d) => {
            bail!("--device {d}: the snapshot has no device {d} (it has {:?})", snap.devices())
        }
        Some(d) => vec![d],
        None => snap.devices(),
    })
}

/// The settings to replay under, as the table labels them: without
/// --alloc-conf, the recorded ones.
fn labelled(confs: &[(String, AllocatorConfig)], recorded: &AllocatorConfig) -> Vec<(String, AllocatorConfig)> {
    if confs.is_empty() {
        vec![("(recorded)".to_string(), recorded.clone())]
    } else {
        confs
            .iter()
            .map(|(c, cfg)| (if c.is_empty() { "(default)".to_string() } else { c.clone() }, cfg.clone()))
            .collect()
    }
}

/// What every device's replay shares.
struct Replay<'a> {
    args: &'a ReplayArgs,
    snap: &'a MemorySnapshot,
    /// The recorded settings: the start state is inferred and checked under them.
    recorded: &'a AllocatorConfig,
    given_capacity: Option<u64>,
    /// The settings to replay under, with their labels.
    confs: &'a [(String, AllocatorConfig)],
    policies: &'a [PolicyName],
    start: StartFrom,
}

impl Replay<'_> {
    /// One device: its start state, the check where one is wanted, and the what-ifs.
    fn device(&self, device: u32) -> Result<DeviceRun> {
        let entries = self.snap.device_traces.get(device as usize).map_or(0, Vec::len);
        let mut r = DeviceRun {
            device,
            entries,
            start: None,
            fidelity: None,
            unchecked: None,
            live_peak: None,
            capacity: self.given_capacity.unwrap_or(DEFAULT_CAPACITY),
            capacity_source: if self.given_capacity.is_some() {
                CapacitySource::Given
            } else {
                CapacitySource::Default
            },
            memory: None,
            memory_limit: None,
            runs: Vec::new(),
            skipped: None,
        };
        // The trace's index (each entry's slot among it) and private pools are made on a second
        // core beside the start state, once for the check and every what-if.
        let trace = match DeviceTrace::with_pools(self.snap, device) {
            Ok(t) => {
                let s = &t.start;
                r.start = Some(Start {
                    reserved: s.reserved_bytes(),
                    allocated: s.allocated_bytes(),
                    live_blocks: s.live_blocks(),
                    inferred_blocks: s.inferred_blocks,
                });
                t
            }
            Err(e) => {
                r.skipped = Some(e.to_string());
                return Ok(r);
            }
        };
        if entries == 0 {
            r.skipped = Some("its trace is empty (recorded without history): nothing to replay".into());
            return Ok(r);
        }
        // Only the check tells the allocator's own flushes from `empty_cache()` calls, and what a
        // refusal says of the device: a trace that releases no segment and records no OOM has
        // neither, and its what-ifs need nothing from a check the user did not ask for.
        let check = self.args.check || trace.index().releases(trace.trace());
        if check {
            self.check(&trace, &mut r);
        } else {
            let m = RecordedMemory::infer(&trace, &[]);
            (r.capacity, r.capacity_source) = m.capacity(self.given_capacity, DEFAULT_CAPACITY);
            r.memory_limit = m.replayed_limit();
            r.memory = Some(m);
        }
        if r.skipped.is_none() {
            self.what_ifs(&trace, &mut r, check)?;
        }
        Ok(r)
    }

    /// Checks the device's decisions against the recording, and learns from
    /// the check what the recorded device was.
    fn check(&self, t: &DeviceTrace, r: &mut DeviceRun) {
        let mut bar = LazyBar::new("entries");
        let phase = format!("device {}: checking", r.device);
        let entries = r.entries as u64;
        // The check's device size matters only to expandable segments, whose
        // reservations PyTorch sizes by it; the recorded device is not known yet.
        let check_capacity = self.given_capacity.unwrap_or(DEFAULT_CAPACITY);
        match check_from(t, self.recorded.clone(), check_capacity, |done| bar.update(&phase, done as u64, entries)) {
            Ok(f) => {
                let m = RecordedMemory::infer(t, &f.recorded.refusals);
                (r.capacity, r.capacity_source) = m.capacity(self.given_capacity, DEFAULT_CAPACITY);
                r.memory_limit = f.recorded.memory_limit;
                r.memory = Some(m);
                r.fidelity = Some(f);
            }
            // From an empty device the recorded segments are not needed: replay all the same.
            Err(e) if self.start == StartFrom::Fresh => r.unchecked = Some(e.to_string()),
            Err(e) => r.skipped = Some(e.to_string()),
        }
        bar.finish();
    }

    /// One replay per policy and setting, on the device the recording (or --capacity) tells.
    fn what_ifs(&self, t: &DeviceTrace, r: &mut DeviceRun, checked: bool) -> Result<()> {
        let (device, entries) = (r.device, r.entries as u64);
        let none = Recorded::default();
        let run = r.fidelity.as_ref().map_or(&none, |f| &f.recorded);
        if self.policies.len() > 1 || self.start == StartFrom::Fresh {
            r.live_peak = Some(live_peak_bytes(t, self.recorded));
        }
        let mut first = true;
        for &policy in self.policies {
            for (label, config) in self.confs {
                let history = (first && self.args.snapshot_out.is_some()).then_some(self.args.max_entries as usize);
                first = false;
                let mut bar = LazyBar::new("entries");
                let phase = format!("device {device}: replaying [{policy}, {label}]");
                let setup = Setup { config: config.clone(), policy, start: self.start };
                let w = what_if(t, setup, r.capacity, run, history, |done| bar.update(&phase, done as u64, entries));
                bar.finish();
                let w = match w {
                    // Without the check, the first replay is the one to find that the
                    // trace cannot be replayed: the device is skipped, as the check skips it.
                    Err(e) if !checked && r.runs.is_empty() && self.start == StartFrom::Recorded => {
                        r.skipped = Some(e.to_string());
                        return Ok(());
                    }
                    w => w.with_context(|| format!("replaying device {device} under {policy}, {label}"))?,
                };
                r.runs.push(Run { policy, conf: label.clone(), what_if: w });
            }
        }
        // A run that ran out is told apart: short of memory (more live at once than the
        // device holds) or of memory in one piece.
        if r.live_peak.is_none() && r.runs.iter().any(|run| !run.what_if.ooms.is_empty()) {
            r.live_peak = Some(live_peak_bytes(t, self.recorded));
        }
        Ok(())
    }
}

/// Nothing replayed is no answer: exit 0 would say every allocation was
/// served, and --snapshot-out would have nothing to write. Bad input (2),
/// with each device's reason, whatever the flags.
fn refuse_nothing_replayed(results: &[DeviceRun]) -> Result<()> {
    if !results.iter().all(|r| r.runs.is_empty()) {
        return Ok(());
    }
    if results.is_empty() {
        bail!(
            "nothing to replay: the snapshot has no segments and no trace on any device (taken before the \
             process used the GPU, or recorded without `_record_memory_history`)"
        );
    }
    let why: Vec<String> = results
        .iter()
        .map(|r| match r.skipped.as_deref() {
            Some(why) if why.starts_with("device ") => why.to_string(),
            why => format!("device {}: {}", r.device, why.unwrap_or("not replayed")),
        })
        .collect();
    bail!("nothing replayed: {}", why.join("; "));
}

/// The replayed snapshots of every device, as one, and the trace entries they let go.
fn merged_snapshot(results: &[DeviceRun]) -> (Option<Snapshot>, u64) {
    let (mut merged, mut dropped) = (None, 0);
    for r in results {
        for w in r.runs.iter().map(|run| &run.what_if) {
            if let Some(s) = &w.snapshot {
                dropped += w.history_dropped;
                merge(&mut merged, s, r.device);
            }
        }
    }
    (merged, dropped)
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

/// Device calls after the second training step, when the trace holds more than two.
fn steady_calls(w: &WhatIf) -> Option<u64> {
    (w.calls_by_step.len() >= 3).then(|| w.calls_by_step[2..].iter().sum())
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
            "pool_notes": f.recorded.pool_notes,
            "first_divergence": f.first_divergence.as_ref().map(|d| json!({
                "index": d.index, "message": d.message, "context": d.context,
            })),
        }),
        _ => Value::Null,
    };
    json!({
        "device": r.device,
        "trace_entries": r.entries,
        "capacity_bytes": r.capacity,
        "capacity_source": r.capacity_source,
        "memory_limit_bytes": r.memory_limit,
        "recorded_memory": r.memory,
        "skipped": r.skipped,
        "start": r.start.as_ref().map(|s| json!({
            "reserved_bytes": s.reserved,
            "allocated_bytes": s.allocated,
            "live_blocks": s.live_blocks,
            "inferred_blocks": s.inferred_blocks,
        })),
        "fidelity": fidelity,
        "unchecked": r.unchecked,
        "live_peak_bytes": r.live_peak,
        "runs": r.runs.iter().map(|Run { policy, conf, what_if: w }| json!({
            "policy": policy.name(),
            "alloc_conf": conf,
            "peak_allocated_bytes": w.peak_allocated_bytes,
            "peak_reserved_bytes": w.peak_reserved_bytes,
            "unallocated_at_reserved_peak_bytes": w.unallocated_at_reserved_peak_bytes,
            "num_device_alloc": w.num_device_alloc,
            "num_device_free": w.num_device_free,
            "num_ooms": w.ooms.len(),
            "oom_ops": w.ooms.iter().map(|o| o.index).collect::<Vec<_>>(),
            "ooms": w.ooms.iter().map(|o| json!({"index": o.index, "size": o.oom.report.requested, "message": o.oom.to_string()})).collect::<Vec<_>>(),
            "recorded_ooms_served": w.recorded_ooms_served,
            "device_calls_followed": w.device_calls_followed,
            "calls_by_step": w.calls_by_step,
            "steady_state_calls": steady_calls(w),
            "device_ns": w.device_ns_by_step.iter().sum::<u64>(),
            "device_ns_by_step": w.device_ns_by_step,
            "pages_mapped": w.pages_mapped,
            "pages_unmapped": w.pages_unmapped,
            "stats": w.stats,
        })).collect::<Vec<_>>(),
    })
}

struct Shown<'a> {
    results: &'a [DeviceRun],
    note: Option<&'a str>,
    dropped: u64,
    policies: &'a [PolicyName],
    start: StartFrom,
    /// Whether --alloc-conf replaced the recorded settings in the rows.
    settings_given: bool,
    /// By device, the entry of the written snapshot's first OOM.
    written_ooms: Vec<(u32, usize)>,
}

/// Where each device's first OOM is in the snapshot --snapshot-out writes. Its trace
/// is the replay's own: its segment entries (the cache released and retried at an
/// OOM) are not the recorded ones, so its entries are numbered apart.
fn first_ooms(s: &Snapshot) -> Vec<(u32, usize)> {
    let oom = |t: &Vec<headroom_alloc::TraceEntry>| t.iter().position(|e| e.action == headroom_alloc::Action::Oom);
    s.device_traces.iter().enumerate().filter_map(|(d, t)| Some((d as u32, oom(t)?))).collect()
}

fn print_human(out: &mut String, args: &ReplayArgs, snap: &MemorySnapshot, shown: Shown) {
    let recorded = match (&snap.settings, snap.settings.as_ref().and_then(|s| s.conf.as_deref())) {
        (_, Some("")) => "PYTORCH_CUDA_ALLOC_CONF unset".to_string(),
        (_, Some(c)) => format!("PYTORCH_CUDA_ALLOC_CONF={}", headroom_inspect::printable::printable(c)),
        (Some(_), None) => "PYTORCH_CUDA_ALLOC_CONF not recorded, settings from its fields".to_string(),
        (None, None) => "settings not recorded".to_string(),
    };
    outln!(
        out,
        "{}: PyTorch memory snapshot ({}), {} device(s), {recorded}",
        args.trace.display(),
        snap.format,
        shown.results.len(),
    );
    if let Some(n) = shown.note {
        outln!(out, "note: {n}");
    }
    for r in shown.results {
        outln!(out);
        print_device(out, args, r, &shown);
    }
    if let Some(p) = &args.snapshot_out {
        outln!(out);
        outln!(out, "replayed snapshot written to {} (open it at https://pytorch.org/memory_viz)", p.display());
        for (d, i) in &shown.written_ooms {
            outln!(
                out,
                "device {d}'s first OOM is entry {i} there: the same request, numbered among the replay's own \
                 segment entries"
            );
        }
        if shown.dropped > 0 {
            outln!(
                out,
                "it keeps the last {} trace entries per device; {} earlier ones were let go",
                args.max_entries,
                shown.dropped
            );
        }
    }
}

/// One device: where its trace began, the device it was replayed on, its
/// runs, and with --check how its decisions compared.
fn print_device(out: &mut String, args: &ReplayArgs, r: &DeviceRun, shown: &Shown) {
    let Some(start) = &r.start else {
        outln!(out, "device {}: not replayed: {}", r.device, r.skipped.as_deref().unwrap_or("?"));
        return;
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
        return;
    }
    if let Some(why) = &r.unchecked {
        outln!(out, "  decisions not checked ({why}); replayed from an empty device all the same");
    }
    print_replayed_on(out, r);
    if shown.start == StartFrom::Fresh {
        outln!(out, "  each run places the blocks live at the start itself, in address order (--start fresh)");
    }
    let named = shown.policies.len() > 1 || shown.policies[0] != PolicyName::PyTorch;
    print_runs(out, r, named);
    if args.check {
        if let Some(f) = &r.fidelity {
            print_fidelity(out, f, shown);
        }
    }
}

/// The simulated device, where its size came from, and the memory limit replayed.
fn print_replayed_on(out: &mut String, r: &DeviceRun) {
    outln!(
        out,
        "  replayed on a simulated GPU of {} ({}){}",
        format_size(r.capacity),
        r.capacity_source.describe(),
        r.memory
            .as_ref()
            .map_or(String::new(), |m| format!("; the recorded run reserved at most {}", format_size(m.peak_reserved)))
    );
    if let (Some(limit), Some(b)) = (r.memory_limit, r.memory.as_ref().and_then(|m| m.limit)) {
        outln!(
            out,
            "  under a per-process memory limit (set_per_process_memory_fraction): a request was refused with \
             more free on the device than it asked for; the limit is at least {} and below {}, replayed at {}",
            format_size(b.at_least),
            format_size(b.below),
            format_size(limit)
        );
    }
}

/// The runs' table (`named`: its rows are policies, not only settings), what
/// its columns mean, and each run's OOMs.
fn print_runs(out: &mut String, r: &DeviceRun, named: bool) {
    let label = |run: &Run| if named { format!("{} [{}]", run.policy, run.conf) } else { run.conf.clone() };
    let width = r.runs.iter().map(|run| label(run).len()).max().unwrap_or(0).max(24);
    let head = if named { "policy [PYTORCH_CUDA_ALLOC_CONF]" } else { "PYTORCH_CUDA_ALLOC_CONF" };
    let width = width.max(head.len());
    let vs_live = r.live_peak.is_some();
    outln!(
        out,
        "  {:<width$}  {:>12}  {:>13}  {:>12}{}  {:>7}  {:>7}  {:>4}  {:>9}  {:>12}",
        head,
        "peak alloc",
        "peak reserved",
        "unallocated",
        if vs_live { "   vs live" } else { "" },
        "mallocs",
        "frees",
        "OOMs",
        "device ms",
        "steady calls"
    );
    for run in &r.runs {
        let w = &run.what_if;
        let over = match r.live_peak {
            Some(l) if l > 0 => format!("  {:>+8.1}%", (w.peak_reserved_bytes as f64 / l as f64 - 1.0) * 100.0),
            Some(_) => format!("  {:>9}", "-"),
            None => String::new(),
        };
        outln!(
            out,
            "  {:<width$}  {:>12}  {:>13}  {:>12}{over}  {:>7}  {:>7}  {:>4}  {:>9.1}  {:>12}",
            label(run),
            format_size(w.peak_allocated_bytes),
            format_size(w.peak_reserved_bytes),
            format_size(w.unallocated_at_reserved_peak_bytes),
            w.num_device_alloc,
            w.num_device_free,
            w.ooms.len(),
            w.device_ns_by_step.iter().sum::<u64>() as f64 / 1e6,
            steady_calls(w).map_or("-".to_string(), |c| c.to_string())
        );
    }
    let steps = r.runs.first().map_or(0, |run| run.what_if.calls_by_step.len());
    outln!(
        out,
        "  unallocated: reserved minus allocated when reserved peaked; device ms: the device calls' time on a GPU at \
         published per-call costs (docs/PERFORMANCE.md); steady calls: device calls after the second training step ({})",
        if steps >= 3 {
            format!("{steps} steps, told apart by the optimizer's frames")
        } else {
            format!("the trace holds {steps} step(s)")
        }
    );
    if let Some(l) = r.live_peak {
        outln!(
            out,
            "  live bytes peaked at {}: no allocator reserves less (\"vs live\" is the excess)",
            format_size(l)
        );
    }
    for (label, w) in r.runs.iter().filter(|r| !r.what_if.ooms.is_empty()).map(|run| (label(run), &run.what_if)) {
        let at: Vec<String> = w.ooms.iter().take(10).map(|o| o.index.to_string()).collect();
        let more = if w.ooms.len() > 10 { format!(" and {} more", w.ooms.len() - 10) } else { String::new() };
        outln!(out, "  {label}: out of memory at trace entries {}{more}", at.join(", "));
        let first = &w.ooms[0];
        outln!(
            out,
            "    first: entry {}, a request of {}: {}",
            first.index,
            format_size(first.oom.report.requested),
            first.oom.to_string().lines().next().unwrap_or_default()
        );
        if let Some(short) = r.live_peak.and_then(|l| l.checked_sub(r.capacity)).filter(|&s| s > 0) {
            outln!(
                out,
                "    a lack of memory: live bytes peak {} above the {} device, which no setting changes",
                format_size(short),
                format_size(r.capacity)
            );
        }
    }
}

/// How the check's decisions compared with the recorded ones, and the first that differed.
fn print_fidelity(out: &mut String, f: &Fidelity, shown: &Shown) {
    let exact = if f.is_exact() { " — every decision as recorded" } else { "" };
    // The check is always PyTorch's policy from the recorded state; under
    // --policy or --start fresh the rows above are other runs, and say so.
    let plain = shown.policies == [PolicyName::PyTorch] && shown.start == StartFrom::Recorded && !shown.settings_given;
    if !plain {
        outln!(
            out,
            "  --check replays PyTorch's policy from the recorded state under the recorded settings, \
             apart from the rows above:"
        );
    }
    outln!(out, "  fidelity: {f}{exact}");
    for n in &f.recorded.pool_notes {
        outln!(out, "  private pools: {n}");
    }
    if let Some(d) = &f.first_divergence {
        outln!(out, "  first divergence at entry {}: {}", d.index, d.message);
        for c in &d.context {
            outln!(out, "    {c}");
        }
    }
}
