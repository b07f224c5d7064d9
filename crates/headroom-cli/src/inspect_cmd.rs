//! `headroom inspect`: arguments, and the report as text; the analysis,
//! the HTML and the Chrome trace live in `headroom-inspect`.

use crate::out_file::{check_input, check_output, write_atomically};
use crate::progress::LazyBar;
use crate::Outcome;
use anyhow::{bail, Context, Result};
use clap::Args;
use headroom_alloc::units::format_size;
use headroom_inspect::report::DeviceReport;
use headroom_inspect::{chrome_trace, compare, html, inspect, Comparison, InspectOptions, Report};
use headroom_trace::snapshot::read_snapshot_file_with;
use std::path::{Path, PathBuf};

/// Explain a PyTorch memory snapshot: the peak by your own call sites,
/// fragmentation, leak suspects, and an OOM with the settings that would have
/// avoided it, each checked by replaying the run.
///
/// SNAPSHOT is the file `torch.cuda.memory._dump_snapshot()` writes (pickle,
/// or JSON; gzip-compressed or not). Record one with:
///
///   torch.cuda.memory._record_memory_history(max_entries=100000)
///   ... run a few steps (or until the OOM) ...
///   torch.cuda.memory._dump_snapshot("run.pickle")
///
/// Frames inside torch, the Python standard library and C++ collapse into the
/// innermost frame of your code; backward allocations, which carry no Python
/// frames, are named after their autograd node. Roles (parameters, activations,
/// gradients, optimizer state) and phases are inferred from the frames, and
/// the report says how.
///
/// Give several snapshots (one per rank, or before and after a change) to see
/// them side by side. Parts a snapshot cannot support (no trace, no frames,
/// no times) get one line each saying why.
///
/// Exit status: 0 when the report was made, 2 on bad input.
#[derive(Args, Debug)]
#[command(after_help = "Examples (from the repository's root; the snapshot ships in data/):\n  \
                  headroom inspect data/snapshots/qwen3-1.7b-train.pickle.gz\n  \
                  headroom inspect data/snapshots/qwen3-1.7b-train.pickle.gz --html report.html   # open it in any browser, offline\n  \
                  headroom inspect data/snapshots/qwen3-1.7b-train.pickle.gz --json\n  \
                  headroom inspect data/snapshots/qwen3-1.7b-train.pickle.gz --chrome-trace memory.json   # open in ui.perfetto.dev\n  \
                  headroom inspect data/snapshots/qwen3-1.7b-train.pickle.gz --top 5")]
pub struct InspectArgs {
    /// Snapshot files (pickle or JSON, as `torch.cuda.memory._dump_snapshot` writes them).
    #[arg(required = true, value_name = "SNAPSHOT")]
    pub snapshots: Vec<PathBuf>,
    /// Only this device (every device the snapshot mentions by default).
    #[arg(long, value_name = "N")]
    pub device: Option<u32>,
    /// Print the report as JSON (keys documented in docs/INSPECT.md).
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML report with plots (opens offline).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Also write memory counters and allocations as Chrome trace-event JSON (Perfetto, chrome://tracing).
    #[arg(long, value_name = "FILE")]
    pub chrome_trace: Option<PathBuf>,
    /// Name the ATen operator under each call site (needs C++ frames: `_record_memory_history(stacks="all")`).
    #[arg(long)]
    pub cpp: bool,
    /// Call sites listed at the peak.
    #[arg(long, default_value_t = 20, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub top: u64,
}

pub fn run(args: InspectArgs) -> Result<Outcome> {
    let inputs: Vec<&Path> = args.snapshots.iter().map(PathBuf::as_path).collect();
    for input in &inputs {
        check_input(input)?;
    }
    for out in [&args.html, &args.chrome_trace].into_iter().flatten() {
        check_output(out, &inputs)?;
    }
    if args.html.is_some() && args.html == args.chrome_trace {
        bail!("--html and --chrome-trace name the same file; give each its own");
    }
    // Each allocation's life is drawn by the HTML report alone.
    let opts = InspectOptions {
        cpp: args.cpp,
        top: args.top as usize,
        allocations: args.html.is_some(),
        ..Default::default()
    };
    let mut reports = Vec::new();
    let mut snaps = Vec::new();
    for path in &args.snapshots {
        let mut bar = LazyBar::new("");
        let snap = read_snapshot_file_with(path, |done, total| bar.update("reading the snapshot", done, total))
            .with_context(|| format!("reading {}", path.display()))?;
        bar.finish();
        let devices = match args.device {
            Some(d) if !snap.devices().contains(&d) => {
                bail!("--device {d}: {} has no device {d} (it has {:?})", path.display(), snap.devices())
            }
            Some(d) => vec![d],
            None => snap.devices(),
        };
        reports.push(inspect(&path.display().to_string(), &snap, &devices, &opts));
        if args.chrome_trace.is_some() {
            snaps.push((path.display().to_string(), snap, devices));
        }
    }
    let comparison =
        (reports.len() > 1 || reports.iter().map(|r| r.devices.len()).sum::<usize>() > 1).then(|| compare(&reports));
    if let Some(path) = &args.html {
        let page = html::render(&reports, comparison.as_ref());
        write_atomically(path, |w| w.write_all(page.as_bytes()))?;
    }
    if let Some(path) = &args.chrome_trace {
        write_atomically(path, |w| {
            // One file for every snapshot: each device keeps its own track.
            let mut w = std::io::BufWriter::new(w);
            let inputs: Vec<(&str, &_, &[u32])> =
                snaps.iter().map(|(name, snap, devices)| (name.as_str(), snap, devices.as_slice())).collect();
            chrome_trace::write_chrome_trace(&inputs, args.cpp, &mut w)?;
            std::io::Write::flush(&mut w)
        })?;
    }
    let mut out = String::new();
    let empty: Vec<&str> = reports.iter().filter(|r| r.devices.is_empty()).map(|r| r.snapshot.as_str()).collect();
    if args.json {
        let v = serde_json::json!({ "snapshots": reports, "comparison": comparison });
        outln!(out, "{}", serde_json::to_string_pretty(&v)?);
    } else {
        for name in empty {
            outln!(out, "{name}: the snapshot is empty: no segments and no trace on any device (taken before the process used the GPU)");
            outln!(out);
        }
        for r in &reports {
            for d in &r.devices {
                print_device(&mut out, r, d);
            }
        }
        if let Some(c) = &comparison {
            print_comparison(&mut out, c);
        }
        for (what, path) in [("HTML report", &args.html), ("Chrome trace", &args.chrome_trace)] {
            if let Some(p) = path {
                outln!(out, "{what} written to {}", p.display());
            }
        }
    }
    Ok(Outcome::new(out, 0))
}

fn print_device(out: &mut String, r: &Report, d: &DeviceReport) {
    outln!(out, "{} ({}), device {}: {} trace entries", r.snapshot, r.format, d.device, d.trace_entries);
    let when = match (d.peak_event_index, d.peak_time_us, d.timeline.points.iter().find_map(|p| p.time_us)) {
        (Some(i), Some(t), Some(t0)) => format!(" at entry {i} ({:.3} s into the trace)", (t - t0) as f64 / 1e6),
        (Some(i), _, _) => format!(" at entry {i}"),
        (None, _, _) if d.trace_entries == 0 => " (the snapshot's moment: no trace)".into(),
        (None, _, _) => " (when the trace began)".into(),
    };
    let phase = d.peak_phase.map_or(String::new(), |p| format!(", in the {} phase", p.name()));
    outln!(out, "  peak allocated  {}{when}{phase}", format_size(d.peak_allocated_bytes));
    if let Some(s) = &d.step_phases {
        outln!(out, "  by phase        began at {}; peaks: {}", format_size(s.start_bytes), s.peaks_text());
    }
    outln!(out, "  peak reserved   {}", format_size(d.peak_reserved_bytes));
    outln!(
        out,
        "  now             {} allocated, {} reserved, {} active, {} requested",
        format_size(d.now.allocated_bytes),
        format_size(d.now.reserved_bytes),
        format_size(d.now.active_bytes),
        format_size(d.now.requested_bytes)
    );
    let f = d.segments_at_peak.as_ref().unwrap_or(&d.segments_now);
    let at = if d.segments_at_peak.is_some() { "at the peak" } else { "now" };
    outln!(
        out,
        "  fragmentation   {} reserved but unallocated at the peak; {at}: largest free block {}, {} free in split segments (empty_cache() cannot return it)",
        format_size(d.fragmentation_at_peak_bytes),
        format_size(f.largest_free_block_bytes),
        format_size(f.inactive_split_bytes)
    );
    for p in &d.pools {
        outln!(
            out,
            "  private pool    ({}, {}): {} segments, {} reserved, {} allocated now; {} requests served",
            p.id.0,
            p.id.1,
            p.segments,
            format_size(p.reserved_bytes),
            format_size(p.allocated_bytes),
            p.requests
        );
    }
    if !d.top_sites.is_empty() {
        outln!(out);
        outln!(out, "  Live at the peak, by call site:");
        for s in &d.top_sites {
            outln!(out, "    {:>10}  {}  [{}, {}]", format_size(s.bytes), s.site.site, s.role.name(), s.phase.name());
        }
        if d.other_sites > 0 {
            outln!(out, "    ({} more sites; --top to list more)", d.other_sites);
        }
        outln!(out, "  By role:");
        for x in &d.roles {
            outln!(out, "    {:>10}  {:<22} {}", format_size(x.bytes), x.role.name(), x.how);
        }
    }
    if let Some(reps) = &d.repetitions {
        outln!(out);
        outln!(
            out,
            "  Leak suspects ({} repetitions, each beginning at an allocation by {}):",
            reps.starts.len(),
            reps.marker_site
        );
        if d.leak_suspects.is_empty() {
            outln!(out, "    none: no call site grows from one repetition to the next");
        }
        for l in d.leak_suspects.iter().take(10) {
            outln!(out, "    +{:>9} per repetition  {}", format_size(l.growth_per_repetition_bytes), l.site);
        }
    }
    if let Some(o) = &d.oom {
        outln!(out);
        outln!(
            out,
            "  Out of memory at entry {} ({} phase, {}): requested {} (PyTorch's \"Tried to allocate {}\": the segment it asked the device for), {} free on the device, {} reserved of which {} unallocated, largest cached free block {}{}",
            o.index,
            o.phase.name(),
            o.site,
            format_size(o.requested_bytes),
            format_size(o.segment_bytes),
            o.free_bytes.map_or("?".into(), format_size),
            format_size(o.reserved_bytes),
            format_size(o.reserved_unallocated_bytes),
            o.largest_free_block_bytes.map_or("?".into(), format_size),
            if o.later_ooms > 0 { format!(" ({} more OOMs after it)", o.later_ooms) } else { String::new() }
        );
        if let Some(l) = o.memory_limit {
            outln!(
                out,
                "    refused by a per-process memory limit, not the device (set_per_process_memory_fraction): the \
                 limit is at least {} (the run reserved that much) and below {}; remedies replayed under {}",
                format_size(l.at_least),
                format_size(l.below),
                format_size(l.at_least)
            );
        }
        for m in &o.remedies {
            let verdict = match m.avoided {
                Some(true) => "avoided",
                Some(false) => "not avoided",
                None => "not checked",
            };
            outln!(out, "    {:<58} {verdict:<12} {}", m.setting, m.note);
        }
    }
    if !d.recommendations.is_empty() {
        outln!(out);
        outln!(out, "  Recommendations:");
        for m in &d.recommendations {
            outln!(out, "    - {}", m.what);
            outln!(out, "      because {}", m.evidence);
        }
    }
    if !d.unavailable.is_empty() || !d.notes.is_empty() {
        outln!(out);
        for u in &d.unavailable {
            outln!(out, "  not available: {u}");
        }
        for n in &d.notes {
            outln!(out, "  note: {n}");
        }
    }
    outln!(out);
}

fn print_comparison(out: &mut String, c: &Comparison) {
    outln!(out, "Side by side:");
    outln!(out, "  {:>12} {:>12} {:>12}  snapshot (device)", "peak alloc", "peak resv", "frag@peak");
    for (i, r) in c.rows.iter().enumerate() {
        outln!(
            out,
            "  {:>12} {:>12} {:>12}  {} ({}){}",
            format_size(r.peak_allocated_bytes),
            format_size(r.peak_reserved_bytes),
            format_size(r.fragmentation_at_peak_bytes),
            r.snapshot,
            r.device,
            if i == c.peaks { "  <- peaks" } else { "" }
        );
    }
    for a in &c.against_first {
        let d = a.peak_allocated_difference_bytes;
        outln!(
            out,
            "  {} ({}) against the first: {}{} at the peak",
            c.rows[a.row].snapshot,
            c.rows[a.row].device,
            if d >= 0 { "+" } else { "-" },
            format_size(d.unsigned_abs())
        );
        for s in a.sites.iter().take(5) {
            let x = s.difference_bytes;
            outln!(out, "    {}{:>10}  {}", if x >= 0 { "+" } else { "-" }, format_size(x.unsigned_abs()), s.site);
        }
    }
}
