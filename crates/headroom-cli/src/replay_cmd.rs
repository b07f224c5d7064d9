//! `headroom replay`: a JSONL trace through the caching allocator on a
//! simulated GPU, under one or more `PYTORCH_CUDA_ALLOC_CONF` settings.

use crate::bytes_arg::parse_bytes;
use anyhow::{bail, Context, Result};
use clap::Args;
use headroom_alloc::units::format_size;
use headroom_alloc::AllocatorConfig;
use headroom_trace::jsonl::read_trace;
use headroom_trace::replay::{replay, ReplayOptions, ReplayReport};
use headroom_trace::snapshot_file::{write_snapshot, SnapshotFormat};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;
use std::process::ExitCode;

/// Replay an allocation trace through headroom's caching allocator (PyTorch's
/// policy) on a simulated GPU, and report peak memory, device calls and OOMs.
///
/// The trace is JSON Lines, one operation per line (see docs/TRACE_FORMAT.md):
///
///   {"op":"alloc","id":1,"size":4096,"stream":0}
///   {"op":"free","id":1}
///
/// plus record_stream, complete_events, empty_cache and set_fraction. An
/// allocation that runs out of memory is reported with its line number and
/// the replay carries on, as a script that catches the error would.
///
/// Give --alloc-conf several times to compare settings side by side.
///
/// Exit status: 0 when every allocation succeeded, 1 when some ran out of
/// memory, 2 on bad input.
#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  headroom replay data/traces/gpt2-small-train.jsonl\n  \
                  headroom replay trace.jsonl --alloc-conf '' --alloc-conf expandable_segments:True\n  \
                  headroom replay trace.jsonl --capacity 24GiB --json\n  \
                  headroom replay trace.jsonl --snapshot-out snap.pickle   # open at pytorch.org/memory_viz")]
pub struct ReplayArgs {
    /// The trace to replay (JSONL).
    trace: PathBuf,

    /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax, e.g.
    /// "expandable_segments:True,max_split_size_mb:128". Repeat to compare.
    #[arg(long = "alloc-conf", value_name = "STR")]
    alloc_conf: Vec<String>,

    /// Memory of the simulated GPU: bytes, or with a unit (80GiB, 24GB).
    #[arg(long, value_name = "BYTES", default_value = "80GiB")]
    capacity: String,

    /// Print one JSON object (an object with "runs" when comparing settings).
    #[arg(long)]
    json: bool,

    /// Write the final allocator snapshot, with the whole trace of allocator
    /// events, as a PyTorch pickle (or JSON if the name ends in .json).
    /// With several --alloc-conf, the snapshot of the first.
    #[arg(long, value_name = "FILE")]
    snapshot_out: Option<PathBuf>,
}

pub fn run(args: ReplayArgs) -> Result<ExitCode> {
    let capacity = parse_capacity(&args.capacity)?;
    let confs = if args.alloc_conf.is_empty() { vec![String::new()] } else { args.alloc_conf.clone() };
    let configs = confs
        .iter()
        .map(|c| AllocatorConfig::parse(c).with_context(|| format!("--alloc-conf {c:?}")))
        .collect::<Result<Vec<_>>>()?;

    let file = File::open(&args.trace).with_context(|| format!("opening {}", args.trace.display()))?;
    let ops = read_trace(BufReader::new(file)).with_context(|| format!("reading {}", args.trace.display()))?;

    let mut runs = Vec::new();
    for (i, config) in configs.into_iter().enumerate() {
        let want_snapshot = i == 0 && args.snapshot_out.is_some();
        let opts = ReplayOptions { config, capacity, history: want_snapshot.then_some(usize::MAX) };
        let bar = progress_bar(ops.len() as u64, &confs[i]);
        let (report, mut alloc) = replay(&ops, &opts, |done| bar.set_position(done as u64))
            .with_context(|| format!("replaying {}", args.trace.display()))?;
        bar.finish_and_clear();
        if let (true, Some(path)) = (want_snapshot, &args.snapshot_out) {
            let snap = alloc.snapshot();
            let mut f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
            write_snapshot(&snap, SnapshotFormat::from_path(path), &mut f)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        runs.push((confs[i].clone(), report));
    }

    if args.json {
        let objs: Vec<Value> = runs.iter().map(|(c, r)| report_json(c, capacity, r)).collect();
        let out = if objs.len() == 1 { objs.into_iter().next().expect("one run") } else { json!({ "runs": objs }) };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_human(&args, capacity, &runs, ops.len());
    }
    let any_oom = runs.iter().any(|(_, r)| !r.ooms.is_empty());
    Ok(if any_oom { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

fn parse_capacity(s: &str) -> Result<u64> {
    check_capacity(parse_bytes(s).map_err(|e| anyhow::anyhow!("--capacity: {e}"))?, s)
}

fn check_capacity(n: u64, s: &str) -> Result<u64> {
    if n < (2 << 20) {
        bail!("--capacity {s:?} is smaller than one 2 MiB segment");
    }
    Ok(n)
}

fn progress_bar(len: u64, conf: &str) -> ProgressBar {
    // Large traces take seconds; small ones finish before a bar would draw.
    if len < 2_000_000 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg} {bar:40} {pos}/{len} ops ({eta})").unwrap_or(ProgressStyle::default_bar()),
    );
    bar.set_message(format!("replaying [{conf}]"));
    bar
}

fn report_json(conf: &str, capacity: u64, r: &ReplayReport) -> Value {
    json!({
        "alloc_conf": conf,
        "capacity_bytes": capacity,
        "operations": r.operations,
        "peak_allocated_bytes": r.peak_allocated_bytes,
        "peak_reserved_bytes": r.peak_reserved_bytes,
        "final_allocated_bytes": r.final_allocated_bytes,
        "final_reserved_bytes": r.final_reserved_bytes,
        "num_device_alloc": r.num_device_alloc,
        "num_device_free": r.num_device_free,
        "num_alloc_retries": r.num_alloc_retries,
        "num_ooms": r.ooms.len(),
        "oom_ops": r.ooms.iter().map(|o| o.line).collect::<Vec<_>>(),
        "ooms": r.ooms.iter().map(|o| json!({
            "line": o.line, "id": o.id, "size": o.size, "stream": o.stream, "kind": o.kind, "message": o.message,
        })).collect::<Vec<_>>(),
        "skipped_frees": r.skipped_frees,
        "stats": r.stats,
    })
}

fn print_human(args: &ReplayArgs, capacity: u64, runs: &[(String, ReplayReport)], ops: usize) {
    println!("{}: {} operations on a simulated GPU of {}", args.trace.display(), ops, format_size(capacity));
    let label = |c: &str| if c.is_empty() { "(default)".to_string() } else { c.to_string() };
    let width = runs.iter().map(|(c, _)| label(c).len()).max().unwrap_or(0).max(16);
    println!();
    println!(
        "{:<width$}  {:>12}  {:>12}  {:>8}  {:>8}  {:>8}  {:>5}",
        "PYTORCH_CUDA_ALLOC_CONF", "peak alloc", "peak reserved", "overhead", "mallocs", "frees", "OOMs"
    );
    for (c, r) in runs {
        let overhead = if r.peak_allocated_bytes > 0 {
            format!("{:+.1}%", (r.peak_reserved_bytes as f64 / r.peak_allocated_bytes as f64 - 1.0) * 100.0)
        } else {
            "-".to_string()
        };
        println!(
            "{:<width$}  {:>12}  {:>12}  {:>8}  {:>8}  {:>8}  {:>5}",
            label(c),
            format_size(r.peak_allocated_bytes),
            format_size(r.peak_reserved_bytes),
            overhead,
            r.num_device_alloc,
            r.num_device_free,
            r.ooms.len()
        );
    }
    for (c, r) in runs.iter().filter(|(_, r)| !r.ooms.is_empty()) {
        println!();
        let lines: Vec<String> = r.ooms.iter().take(10).map(|o| o.line.to_string()).collect();
        let more = if r.ooms.len() > 10 { format!(" and {} more", r.ooms.len() - 10) } else { String::new() };
        println!("{}: {} allocations failed, at lines {}{more}", label(c), r.ooms.len(), lines.join(", "));
        println!("first failure (line {}, {} bytes):\n{}", r.ooms[0].line, r.ooms[0].size, r.ooms[0].message);
        if r.skipped_frees > 0 {
            println!("({} frees of failed allocations were skipped)", r.skipped_frees);
        }
    }
    if let Some(p) = &args.snapshot_out {
        println!();
        println!("snapshot written to {} (open it at https://pytorch.org/memory_viz)", p.display());
    }
}
