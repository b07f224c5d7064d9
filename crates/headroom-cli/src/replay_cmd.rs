//! `headroom replay`: a JSONL trace, or a PyTorch memory snapshot's trace
//! (told apart by content; see [`crate::replay_snapshot`]), through the
//! caching allocator on a simulated GPU, under one or more
//! `PYTORCH_CUDA_ALLOC_CONF` settings.

use crate::out_file::{check_input, check_output, write_atomically};
use crate::progress::LazyBar;
use crate::replay_args::{ReplayArgs, DEFAULT_CAPACITY};
use crate::Outcome;
use anyhow::{anyhow, bail, Context, Result};
use headroom_alloc::units::{format_size, parse_size};
use headroom_alloc::{AllocatorConfig, Backend, PolicyName};
use headroom_trace::compressed;
use headroom_trace::jsonl::read_trace;
use headroom_trace::replay::{replay, ReplayOptions, ReplayReport, ASYNC_NOT_SIMULATED};
use headroom_trace::snapshot::looks_like_snapshot;
use headroom_trace::snapshot_file::{write_snapshot, SnapshotFormat};
use headroom_trace::what_if::StartFrom;
use serde_json::{json, Value};
use std::io::BufRead;

/// The most a simulated GPU may hold: 1 PiB, beyond any GPU by four orders
/// of magnitude, so that every byte count and address of a replay fits in
/// 64 bits (PyTorch's statistics are signed 64-bit).
const MAX_CAPACITY: u64 = 1 << 50;

pub fn run(args: ReplayArgs) -> Result<Outcome> {
    let cuda = args.backend == "cuda";
    if !cuda && args.cuda_device != 0 {
        bail!("--cuda-device chooses the GPU of --backend cuda");
    }
    if cuda && args.capacity.is_some() {
        bail!("--capacity sizes the simulated GPU; --backend cuda runs on the real one, with its own memory");
    }
    let given_capacity = args.capacity.as_deref().map(parse_capacity).transpose()?;
    let capacity = given_capacity.unwrap_or(DEFAULT_CAPACITY);
    let confs = if args.alloc_conf.is_empty() { vec![String::new()] } else { args.alloc_conf.clone() };
    let configs = confs
        .iter()
        .map(|c| AllocatorConfig::parse(c).with_context(|| format!("--alloc-conf {c:?}")))
        .collect::<Result<Vec<_>>>()?;
    for (c, config) in confs.iter().zip(&configs) {
        if config.backend != Backend::Native {
            bail!("--alloc-conf {c:?}: {ASYNC_NOT_SIMULATED}");
        }
    }
    if let Some(out) = &args.snapshot_out {
        check_output(out, &[&args.trace]).context("--snapshot-out")?;
    }
    check_input(&args.trace)?;
    if args.trace.is_dir() {
        bail!("{} is a directory; give a snapshot or a trace file", args.trace.display());
    }
    // Decompressed as it is read when gzip; the prefix tells a snapshot from a JSONL trace.
    let mut input = compressed::open(&args.trace).with_context(|| format!("opening {}", args.trace.display()))?;
    let prefix = input.fill_buf().with_context(|| format!("reading {}", args.trace.display()))?;
    let prefix = prefix[..prefix.len().min(512)].to_vec();
    let policies = if args.policy.is_empty() { vec![PolicyName::PyTorch] } else { args.policy.clone() };
    let snapshot_input = looks_like_snapshot(&prefix);
    if cuda && (args.check || args.start.as_deref() == Some("recorded")) {
        bail!(
            "--backend cuda replays a run's requests from an empty device, where addresses are the GPU's own: \
             --check and --start recorded apply to the simulator"
        );
    }
    if snapshot_input && !cuda {
        let given: Vec<(String, AllocatorConfig)> =
            if args.alloc_conf.is_empty() { Vec::new() } else { confs.iter().cloned().zip(configs).collect() };
        let start = match args.start.as_deref() {
            Some("fresh") => StartFrom::Fresh,
            Some(_) => StartFrom::Recorded,
            None if args.policy.is_empty() => StartFrom::Recorded,
            None => StartFrom::Fresh,
        };
        return crate::replay_snapshot::run(&args, given_capacity, &given, &policies, start);
    }
    // The GPU first: without one there is nothing to read the input for.
    let gpu = cuda.then(|| crate::replay_cuda::open(args.cuda_device)).transpose()?;
    let ops = if snapshot_input {
        crate::replay_cuda::snapshot_ops(&args.trace, args.device)?
    } else {
        if args.check || args.device.is_some() || args.start.is_some() {
            bail!("--check, --device and --start apply to snapshots; {} is a JSONL trace", args.trace.display());
        }
        read_trace(input).with_context(|| format!("reading {}", args.trace.display()))?
    };

    let mut runs = Vec::new();
    let mut snapshot = None;
    let named = policies.len() > 1 || policies[0] != PolicyName::PyTorch;
    let runs_asked = policies.iter().flat_map(|&p| configs.iter().zip(&confs).map(move |(c, s)| (p, c, s)));
    for (i, (policy, config, conf)) in runs_asked.enumerate() {
        let want_snapshot = i == 0 && args.snapshot_out.is_some();
        let notes = config.keys_without_effect();
        let history = want_snapshot.then_some(args.max_entries as usize);
        let opts = ReplayOptions { config: config.clone(), capacity, history, policy };
        let mut bar = LazyBar::new("ops");
        let phase = format!("replaying [{policy}, {conf}]");
        let progress = |done: usize| bar.update(&phase, done as u64, ops.len() as u64);
        let replayed = match &gpu {
            None => replay(&ops, &opts, progress)
                .map(|(r, mut a)| (r, want_snapshot.then(|| (a.snapshot(), a.history_dropped())))),
            Some(g) => crate::replay_cuda::replay(g, &ops, &opts, progress, want_snapshot)?,
        };
        let (report, snap) = replayed.with_context(|| format!("replaying {}", args.trace.display()))?;
        bar.finish();
        if snap.is_some() {
            snapshot = snap;
        }
        let label = match (named, conf.is_empty()) {
            (false, _) => conf.clone(),
            (true, true) => policy.to_string(),
            (true, false) => format!("{policy} [{conf}]"),
        };
        runs.push(Run { policy, conf: conf.clone(), label, report, notes });
    }
    // Written only now, so that a later setting that fails leaves no file behind.
    if let (Some(path), Some((snap, _))) = (&args.snapshot_out, &snapshot) {
        write_atomically(path, |w| write_snapshot(snap, SnapshotFormat::from_path(path), w))?;
    }
    let dropped = snapshot.as_ref().map_or(0, |(_, d)| *d);

    let mut out = String::new();
    if args.json {
        let objs: Vec<Value> = runs.iter().map(|r| report_json(r, capacity, gpu.as_ref())).collect();
        let out_value =
            if objs.len() == 1 { objs.into_iter().next().expect("one run") } else { json!({ "runs": objs }) };
        outln!(out, "{}", serde_json::to_string_pretty(&out_value)?);
    } else {
        let on = match &gpu {
            None => format!("a simulated GPU of {}", format_size(capacity)),
            Some(g) => format!("{} (CUDA device {}, {})", g.name, g.ordinal, format_size(g.total_bytes)),
        };
        print_human(&mut out, &args, &on, &runs, ops.len(), dropped);
    }
    let any_oom = runs.iter().any(|r| !r.report.ooms.is_empty());
    Ok(Outcome::new(out, if any_oom { 1 } else { 0 }))
}

/// One policy's replay under one setting.
struct Run {
    policy: PolicyName,
    conf: String,
    /// What the table calls it.
    label: String,
    report: ReplayReport,
    /// Keys of the setting that do not change the device allocator's decisions.
    notes: Vec<String>,
}

fn parse_capacity(s: &str) -> Result<u64> {
    let n = parse_size(s).map_err(|e| anyhow!("--capacity: {e}"))?;
    if n < (2 << 20) {
        bail!("--capacity {s:?} is smaller than one 2 MiB segment");
    }
    if n > MAX_CAPACITY {
        bail!("--capacity {s:?} is more than the largest simulated GPU, 1 PiB");
    }
    Ok(n)
}

fn report_json(run: &Run, capacity: u64, gpu: Option<&crate::replay_cuda::Gpu>) -> Value {
    let r = &run.report;
    json!({
        "policy": run.policy.name(),
        "alloc_conf": run.conf,
        "backend": if gpu.is_some() { "cuda" } else { "sim" },
        "device_name": gpu.map(|g| g.name.clone()),
        "capacity_bytes": gpu.map_or(capacity, |g| g.total_bytes),
        "host_seconds": r.host_seconds,
        "host_ns_per_op": r.host_seconds * 1e9 / r.operations.max(1) as f64,
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
            "line": o.line, "id": o.id, "size": o.oom.report.requested, "stream": o.oom.report.stream,
            "kind": o.oom.kind.name(), "message": o.oom.to_string(),
        })).collect::<Vec<_>>(),
        "skipped_frees": r.skipped_frees,
        "keys_without_effect": run.notes,
        "stats": r.stats,
    })
}

fn print_human(out: &mut String, args: &ReplayArgs, on: &str, runs: &[Run], ops: usize, dropped: u64) {
    outln!(out, "{}: {} operations on {on}", args.trace.display(), ops);
    let label = |r: &Run| if r.label.is_empty() { "(default)".to_string() } else { r.label.clone() };
    let named = runs.iter().any(|r| r.label != r.conf);
    let head = if named { "policy [PYTORCH_CUDA_ALLOC_CONF]" } else { "PYTORCH_CUDA_ALLOC_CONF" };
    let width = runs.iter().map(|r| label(r).len()).max().unwrap_or(0).max(head.len());
    outln!(out);
    outln!(
        out,
        "{:<width$}  {:>12}  {:>12}  {:>8}  {:>8}  {:>8}  {:>5}",
        head,
        "peak alloc",
        "peak reserved",
        "overhead",
        "mallocs",
        "frees",
        "OOMs"
    );
    for run in runs {
        let r = &run.report;
        let overhead = if r.peak_allocated_bytes > 0 {
            format!("{:+.1}%", (r.peak_reserved_bytes as f64 / r.peak_allocated_bytes as f64 - 1.0) * 100.0)
        } else {
            "-".to_string()
        };
        outln!(
            out,
            "{:<width$}  {:>12}  {:>12}  {:>8}  {:>8}  {:>8}  {:>5}",
            label(run),
            format_size(r.peak_allocated_bytes),
            format_size(r.peak_reserved_bytes),
            overhead,
            r.num_device_alloc,
            r.num_device_free,
            r.ooms.len()
        );
    }
    if args.backend == "cuda" {
        outln!(out);
        for run in runs {
            let r = &run.report;
            outln!(
                out,
                "{}: {:.3} s on the host, {:.0} ns an operation (the allocator and its device calls)",
                label(run),
                r.host_seconds,
                r.host_seconds * 1e9 / r.operations.max(1) as f64
            );
        }
    }
    for run in runs.iter().filter(|r| !r.notes.is_empty()) {
        outln!(out);
        outln!(
            out,
            "note: in {:?}, {} do not change the device allocator's decisions (they concern its lock, the pinned \
             host allocator or CUDA graphs); replayed as without them",
            run.conf,
            run.notes.join(", ")
        );
    }
    for run in runs.iter().filter(|r| !r.report.ooms.is_empty()) {
        let r = &run.report;
        outln!(out);
        let lines: Vec<String> = r.ooms.iter().take(10).map(|o| o.line.to_string()).collect();
        let more = if r.ooms.len() > 10 { format!(" and {} more", r.ooms.len() - 10) } else { String::new() };
        outln!(out, "{}: {} allocations failed, at lines {}{more}", label(run), r.ooms.len(), lines.join(", "));
        let first = &r.ooms[0];
        outln!(out, "first failure (line {}, {} bytes):\n{}", first.line, first.oom.report.requested, first.oom);
        if r.skipped_frees > 0 {
            outln!(out, "({} frees of failed allocations were skipped)", r.skipped_frees);
        }
    }
    if let Some(p) = &args.snapshot_out {
        outln!(out);
        outln!(out, "snapshot written to {} (open it at https://pytorch.org/memory_viz)", p.display());
        if dropped > 0 {
            outln!(
                out,
                "it keeps the last {} trace entries; {dropped} earlier ones were let go (--max-entries)",
                args.max_entries
            );
        }
    }
}
