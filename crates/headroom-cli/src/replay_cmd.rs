//! `headroom replay`: a JSONL trace, or a PyTorch memory snapshot's trace
//! (told apart by content; see [`crate::replay_snapshot`]), through the
//! caching allocator on a simulated GPU, under one or more
//! `PYTORCH_CUDA_ALLOC_CONF` settings.

use crate::out_file::{check_input, check_output, write_atomically};
use crate::progress::LazyBar;
use crate::Outcome;
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
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
use std::path::PathBuf;

/// Replay a recorded run through headroom's caching allocator (PyTorch's
/// policy, or headroom's own with --policy) on a simulated GPU, and report
/// peak memory, fragmentation, device calls and OOMs — under the recorded
/// settings or any others.
///
/// The input is either a PyTorch memory snapshot (the file
/// `torch.cuda.memory._dump_snapshot()` writes, pickle or JSON) or a
/// headroom trace in JSON Lines (see docs/TRACE_FORMAT.md), either of them
/// gzip-compressed or not:
///
///   {"op":"alloc","id":1,"size":4096,"stream":0}
///   {"op":"free","id":1}
///
/// A snapshot's trace usually starts mid-run; headroom rebuilds the
/// allocator's state at its first entry from the final segments, then
/// replays every request and free. --check compares each decision with the
/// recorded one (addresses, segments allocated and released, final blocks).
/// Without --alloc-conf a snapshot is replayed under its recorded settings,
/// and that replay is the recorded run: the simulated device hands out the
/// recorded segment addresses and refuses where the recorded device refused,
/// the program's empty_cache() calls are made where it made them, and the
/// device is the size the recording tells (held plus free at an OOM; a
/// per-process memory limit when the device had room the request was refused
/// all the same). Every other setting is replayed the same way and differs
/// only by what it changes.
///
/// Give --alloc-conf several times to compare settings side by side, and
/// --policy to compare allocation policies: `pytorch` (the default,
/// PyTorch's decisions), `expandable` (expandable segments for every pool),
/// `headroom` (expandable segments' growth and device calls, and whole free
/// pages of the request's own pool given back where they replace growth past
/// the peak), `tight` (every free page given back before the peak grows: the
/// lowest peak, for device calls every step). A snapshot replayed under --policy starts from
/// an empty device (--start fresh): each policy places the blocks live when
/// the trace began itself, and the table shows each run's peak reserved
/// against the peak of live bytes, which no allocator can go below. Each
/// run also shows its device calls' time on a GPU (published per-call costs;
/// docs/PERFORMANCE.md) and, for a training run of more than two steps (told
/// apart by the optimizer's frames), its device calls after the second step.
///
/// --backend cuda runs the same requests through the allocator on a real
/// GPU instead (real device calls; the host time each operation took),
/// from an empty device; without an NVIDIA driver it says so and exits 2.
///
/// Exit status: 0 when every allocation succeeded (and, with --check, every
/// decision matched), 1 when some ran out of memory (or a decision
/// differed), 2 on bad input.
#[derive(Args, Debug)]
#[command(after_help = "Examples (from the repository's root; the files ship in data/):\n  \
                  headroom replay data/traces/gpt2-small-train.jsonl\n  \
                  headroom replay data/snapshots/qwen3-1.7b-train.pickle --check\n  \
                  headroom replay data/snapshots/qwen3-1.7b-train.pickle --alloc-conf '' --alloc-conf expandable_segments:True --capacity 16.25GiB\n  \
                  headroom replay data/snapshots/qwen3-1.7b-train.pickle --policy pytorch --policy expandable --policy headroom\n  \
                  headroom replay data/traces/gpt2-small-train.jsonl --capacity 4GiB --json\n  \
                  headroom replay data/traces/gpt2-small-train.jsonl --snapshot-out snap.pickle   # open at pytorch.org/memory_viz")]
pub struct ReplayArgs {
    /// The run to replay: a PyTorch snapshot (.pickle or JSON) or a JSONL trace.
    pub trace: PathBuf,

    /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax, e.g.
    /// "expandable_segments:True,max_split_size_mb:128". Repeat to compare.
    #[arg(long = "alloc-conf", value_name = "STR")]
    alloc_conf: Vec<String>,

    /// Allocation policy: pytorch, expandable, headroom, tight, lifetime or planned.
    /// Repeat to compare; each runs under every --alloc-conf.
    #[arg(long = "policy", value_name = "NAME")]
    policy: Vec<PolicyName>,

    /// Snapshots: where the replay begins. `recorded`: in the segments the
    /// trace began with; `fresh`: from an empty device, the blocks live then
    /// allocated first by the policy under test. Default: fresh with
    /// --policy, recorded without.
    #[arg(long, value_name = "FROM", value_parser = ["recorded", "fresh"])]
    start: Option<String>,

    /// Memory of the simulated GPU: bytes, or with a unit (80GiB, 24GB) [default: a
    /// snapshot's recorded device, as its refusals and OOMs tell, else 80GiB].
    #[arg(long, value_name = "BYTES")]
    capacity: Option<String>,

    /// Where the allocator runs: `sim`, a simulated GPU of --capacity, or `cuda`, the real
    /// GPU --cuda-device (a snapshot's requests replayed from an empty device).
    #[arg(long, value_name = "NAME", default_value = "sim", value_parser = ["sim", "cuda"])]
    backend: String,

    /// With --backend cuda: the GPU, by CUDA ordinal.
    #[arg(long, value_name = "N", default_value_t = 0)]
    cuda_device: u32,

    /// Print one JSON object (an object with "runs" when comparing settings).
    #[arg(long)]
    pub json: bool,

    /// Snapshots: compare every decision with the recorded one, and report
    /// matched of total per kind with the first divergence.
    #[arg(long)]
    pub check: bool,

    /// Snapshots: replay only this device (default: every device).
    #[arg(long, value_name = "N")]
    pub device: Option<u32>,

    /// Write the final allocator snapshot, with the trace of allocator
    /// events, as a PyTorch pickle (or JSON if the name ends in .json).
    /// With several runs (--policy, --alloc-conf), the first one's. The file
    /// appears only once the whole replay succeeded.
    #[arg(long, value_name = "FILE")]
    pub snapshot_out: Option<PathBuf>,

    /// Trace entries the snapshot keeps: the most recent N, as PyTorch's
    /// `_record_memory_history(max_entries=N)` keeps them (memory grows
    /// with N, about 60 bytes an entry).
    #[arg(long, value_name = "N", default_value_t = 1_000_000, requires = "snapshot_out",
          value_parser = clap::value_parser!(u64).range(1..=1 << 32))]
    pub max_entries: u64,
}

/// The simulated GPU's memory when neither --capacity nor the recording says.
pub const DEFAULT_CAPACITY: u64 = 80 << 30;

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
