//! The planner against training jobs measured on a real GPU: the dev grid of
//! `../shared/gpu/` (36 jobs on an H200 with torch 2.11: llama-1b, qwen2-0.5b and
//! gpt2-medium built from their configs, × 1×512 and 4×2048 × bf16, fp32 and AMP × no and
//! full checkpointing, SDPA, three steps of `torch.optim.AdamW` with torch's defaults).
//!
//! Each job is planned as `headroom plan` plans it — its step program replayed through
//! headroom's allocator on the H200's memory — and compared with what PyTorch reported:
//! `torch.cuda.max_memory_allocated()` and `max_memory_reserved()` over the three steps.
//! Tolerances and the figures to reach are the issue's, set before comparing: each within
//! ±5%; allocated on at least 34 of 36 jobs, reserved on at least 33; every verdict right
//! (every job ran). Tuning rows — the ones read while the GPU rules of the step programs were
//! built (SDPA's kernels, dropout's masks, cuBLAS's workspaces) — are reported apart from the
//! check rows, which were only compared.
//!
//! Beside that table, the same jobs compared like for like (`like_for_like`): planned as the grid
//! built its models (`built_on_device`: `from_config` under `torch.device("cuda")`), and replayed
//! as the grid's one process ran them (`grid_process`). Neither replaces the plain table: a user's
//! job runs in a fresh process, and most load their model. But the grid measured 35 of its 36
//! jobs in a process whose first job had made cuBLAS's workspaces, so a fresh process's plan of
//! those jobs is not what the GPU measured: the reserved figure to reach is held on the table
//! like for like ("both"), allocated on both tables.
//!
//! The jobs live beside the repository (`../shared/gpu`); where that is absent (a user's
//! fresh clone) the test says so and passes.
//!
//! `DEVGRID_TABLE=1 cargo test -p headroom-plan --test devgrid -- --nocapture` prints the
//! tables docs/VALIDATION.md shows; `HEADROOM_REGENERATE=1` writes them there.

use headroom_alloc::{Allocation, DeviceCachingAllocator, SimDevice};
use headroom_plan::estimate::{Estimate, Estimator};
use headroom_plan::gpu::{gpu, GpuSpec};
use headroom_plan::job::{Attention, Checkpointing, Optimizer, Precision, TrainConfig};
use headroom_plan::model::Model;
use headroom_plan::program::{Op, Program};
#[path = "support/plan.rs"]
mod plan;
use plan::estimate;
use serde_json::Value;
use std::path::{Path, PathBuf};

const TOLERANCE: f64 = 0.05;
const BEGIN: &str = "<!-- devgrid:begin -->\n";
const END: &str = "<!-- devgrid:end -->";
const PROCESS_BEGIN: &str = "<!-- devgrid-process:begin -->\n";
const PROCESS_END: &str = "<!-- devgrid-process:end -->";
const ALLOCATED_WITHIN: usize = 34;
const RESERVED_WITHIN: usize = 33;
/// Rows read while the GPU rules were built: the first two for SDPA's kernels, dropout's masks
/// and cuBLAS's workspaces; the checkpointed 4×2048 three for cuDNN's backward workspace and
/// CUDA's softmax backward (their allocator snapshots, docs/VALIDATION.md).
const TUNING: &[&str] = &[
    "llama-1b-train-bf16-none-sdpa-1x512",
    "llama-1b-train-bf16-none-sdpa-4x2048",
    "llama-1b-train-bf16-full-sdpa-4x2048",
    "llama-1b-train-fp32-full-sdpa-4x2048",
    "llama-1b-train-amp-full-sdpa-4x2048",
];

fn shared() -> Option<PathBuf> {
    let p = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/gpu"));
    p.join("devgrid-cases.json").exists().then_some(p)
}

/// (measured, planned) bytes.
type Pair = (f64, f64);

struct Row {
    name: String,
    tuning: bool,
    allocated: Pair,
    reserved: Pair,
    fits: bool,
    program: String,
    /// What the job found allocated as it began (the grid's process: the cuBLAS workspaces
    /// earlier jobs left).
    allocated_before: f64,
    /// The job as `plan` plans it, and as the grid built its model.
    plain: Estimate,
    on_device: Estimate,
    tokens: (u64, u64),
}

impl Row {
    fn err(pair: Pair) -> f64 {
        pair.1 / pair.0 - 1.0
    }
}

fn within(pair: Pair) -> bool {
    Row::err(pair).abs() <= TOLERANCE
}

/// The H200 the jobs ran on, with the memory torch reports for it.
fn h200(measured_total: u64) -> GpuSpec {
    GpuSpec { memory_bytes: measured_total, ..gpu("h200").expect("h200 is a preset") }
}

/// The jobs in the order the grid's process ran them (the order of its measurements).
fn rows(dir: &Path) -> Vec<Row> {
    let cases: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("devgrid-cases.json")).unwrap()).unwrap();
    let text = std::fs::read_to_string(dir.join("devgrid-measured.jsonl")).unwrap();
    let mut lines = text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap());
    let header = lines.next().unwrap();
    let g = h200(header["header"]["total"].as_u64().unwrap());
    let mut out = Vec::new();
    for m in lines {
        let name = m["name"].as_str().unwrap();
        let c =
            cases.as_array().unwrap().iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("{name}: no case"));
        let model = Model::from_hf_config(&c["config"].to_string(), c["model"].as_str().unwrap()).unwrap();
        let precision = match c["precision"].as_str().unwrap() {
            "bf16" => Precision::Bf16,
            "fp32" => Precision::Fp32,
            "amp" => Precision::Amp,
            p => panic!("{p}"),
        };
        let cfg = TrainConfig {
            attention: Attention::Sdpa,
            checkpointing: if c["checkpoint"] == "full" { Checkpointing::Full } else { Checkpointing::None },
            ..TrainConfig::new(c["batch"].as_u64().unwrap(), c["seq"].as_u64().unwrap(), precision, Optimizer::AdamW)
        };
        let e = estimate(&model, &g, &cfg);
        let on_device = estimate(&model, &g, &TrainConfig { built_on_device: true, ..cfg });
        out.push(Row {
            name: name.to_string(),
            tuning: TUNING.contains(&name),
            allocated: (m["peak_allocated"].as_f64().unwrap(), e.memory.allocated_bytes),
            reserved: (m["peak_reserved"].as_f64().unwrap(), e.memory.reserved_bytes),
            fits: e.verdict.fits,
            program: e.runner.source.detail().map_or_else(|| e.runner.builder.to_string(), str::to_string),
            allocated_before: m["allocated_before"].as_f64().unwrap(),
            tokens: (cfg.micro_batch, cfg.seq),
            plain: e,
            on_device,
        });
    }
    assert_eq!(out.len(), cases.as_array().unwrap().len(), "every job of the grid measured");
    out
}

/// A job replayed in the grid's process: its peaks, and what it found allocated as it began.
#[derive(Clone, Copy)]
struct InProcess {
    allocated: f64,
    reserved: f64,
    held_before: f64,
}

/// The grid's one process as `scripts/gpu/validate_plan.py` ran it: the jobs in order through
/// one allocator, each after `torch.cuda.empty_cache()` and `reset_peak_memory_stats()`, and
/// each job's tensors freed at its end (`del model, …`). cuBLAS keeps a workspace per handle and
/// stream for the life of the process (the forward's thread's, the autograd engine's): the
/// first job's stay allocated where that job made them, in its segments, which `empty_cache`
/// keeps, and a later job makes none of its own.
fn grid_process(jobs: &[(&Program, Vec<u64>)], capacity: u64) -> Vec<InProcess> {
    let est = Estimator::default();
    let mut alloc =
        DeviceCachingAllocator::with_policy(SimDevice::new(capacity), est.alloc.clone(), est.policy.build());
    let mut workspaces: Vec<Allocation> = Vec::new();
    let mut out = Vec::new();
    for (p, sizes) in jobs {
        alloc.empty_cache().expect("empty_cache");
        alloc.reset_peak_stats();
        let held_before = alloc.stats().allocated_bytes.all().current as f64;
        let mut live: Vec<Option<Allocation>> = vec![None; p.tensors.len()];
        let mut made = 0;
        for op in &p.ops {
            match *op {
                Op::Alloc(t) => {
                    let x = &p.tensors[t as usize];
                    let workspace = p.sites[x.site as usize] == "cuBLAS workspace";
                    if workspace {
                        made += 1;
                        if made <= workspaces.len() {
                            continue;
                        }
                    }
                    let block = alloc.malloc(sizes[t as usize], x.stream).expect("every job ran");
                    if workspace {
                        workspaces.push(block);
                    } else {
                        live[t as usize] = Some(block);
                    }
                }
                Op::Free(t) => {
                    if let Some(a) = live[t as usize].take() {
                        alloc.free(a.ptr).expect("free");
                    }
                }
                Op::EmptyCache => alloc.empty_cache().expect("empty_cache"),
                Op::Mark { .. } => {}
            }
        }
        let s = alloc.stats();
        out.push(InProcess {
            allocated: s.allocated_bytes.all().peak as f64,
            reserved: s.reserved_bytes.all().peak as f64,
            held_before,
        });
        for a in live.into_iter().flatten() {
            alloc.free(a.ptr).expect("free");
        }
    }
    out
}

fn gib(x: f64) -> f64 {
    x / (1u64 << 30) as f64
}

fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    s.push_str(
        "| job | split | allocated measured | planned | error | reserved measured | planned | error | verdict |\n",
    );
    s.push_str("|---|---|---:|---:|---:|---:|---:|---:|---|\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {:.2} | {:.2} | {:+.1}% | {:.2} | {:.2} | {:+.1}% | ran, plan: {} |\n",
            r.name,
            if r.tuning { "tuning" } else { "check" },
            gib(r.allocated.0),
            gib(r.allocated.1),
            Row::err(r.allocated) * 100.0,
            gib(r.reserved.0),
            gib(r.reserved.1),
            Row::err(r.reserved) * 100.0,
            if r.fits { "fits" } else { "does NOT fit" }
        ));
    }
    for (split, tuning) in [("tuning", true), ("check", false)] {
        let part: Vec<&Row> = rows.iter().filter(|r| r.tuning == tuning).collect();
        let a = part.iter().filter(|r| within(r.allocated)).count();
        let v = part.iter().filter(|r| within(r.reserved)).count();
        s.push_str(&format!("\n{split}: allocated within ±5% on {a} of {n}, reserved on {v} of {n}", n = part.len()));
    }
    s.push('\n');
    s
}

/// The jobs' programs, at their sizes, as `grid_process` replays them.
fn programs(rows: &[Row], on_device: bool) -> Vec<(&Program, Vec<u64>)> {
    rows.iter()
        .map(|r| {
            let e = if on_device { &r.on_device } else { &r.plain };
            (&*e.program, e.program.sizes(r.tokens.0, r.tokens.1))
        })
        .collect()
}

/// The jobs like for like, as a table: reserved as planned (the plain table's), with the model
/// built on the device as the grid built it, in the grid's process, and both; allocated with
/// both; and what each job found allocated as it began, in the replay and on the GPU. With it,
/// how many jobs "both" plans within ±5%: reserved, allocated.
fn like_for_like(rows: &[Row]) -> (String, usize, usize) {
    let capacity = rows[0].plain.memory.capacity_bytes as u64;
    assert!(rows.iter().all(|r| r.plain.memory.capacity_bytes as u64 == capacity), "one device");
    let process = grid_process(&programs(rows, false), capacity);
    let both = grid_process(&programs(rows, true), capacity);
    let columns: Vec<[Pair; 5]> = rows
        .iter()
        .zip(process.iter().zip(&both))
        .map(|(r, (p, b))| {
            let measured = r.reserved.0;
            [
                r.reserved,
                (measured, r.on_device.memory.reserved_bytes),
                (measured, p.reserved),
                (measured, b.reserved),
                (r.allocated.0, b.allocated),
            ]
        })
        .collect();
    let mut s = String::new();
    s.push_str(
        "| job | split | reserved measured | planned | built on device | in the grid's process | both | allocated, both | held before (MiB): replay / GPU |\n",
    );
    s.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for ((r, c), b) in rows.iter().zip(&columns).zip(&both) {
        let e = |pair: Pair| format!("{:.2} ({:+.1}%)", gib(pair.1), Row::err(pair) * 100.0);
        s.push_str(&format!(
            "| {} | {} | {:.2} | {} | {} | {} | {} | {} | {:.3} / {:.3} |\n",
            r.name,
            if r.tuning { "tuning" } else { "check" },
            gib(r.reserved.0),
            e(c[0]),
            e(c[1]),
            e(c[2]),
            e(c[3]),
            e(c[4]),
            b.held_before / (1u64 << 20) as f64,
            r.allocated_before / (1u64 << 20) as f64,
        ));
    }
    let names = ["planned", "built on device", "in the grid's process", "both"];
    for (split, tuning) in [("tuning", true), ("check", false)] {
        let part: Vec<&[Pair; 5]> =
            rows.iter().zip(&columns).filter(|(r, _)| r.tuning == tuning).map(|(_, c)| c).collect();
        let counts: Vec<String> = names
            .iter()
            .enumerate()
            .map(|(i, name)| format!("{name} {}", part.iter().filter(|c| within(c[i])).count()))
            .collect();
        let allocated = part.iter().filter(|c| within(c[4])).count();
        s.push_str(&format!(
            "\n{split}: reserved within ±5% on, of {n}: {}; allocated with both on {allocated}",
            counts.join(", "),
            n = part.len()
        ));
    }
    s.push('\n');
    let reserved = columns.iter().filter(|c| within(c[3])).count();
    let allocated = columns.iter().filter(|c| within(c[4])).count();
    (s, reserved, allocated)
}

/// `doc` with the text between `begin` and `end` replaced, or checked.
fn section(doc: &str, begin: &str, end: &str, text: &str) -> Result<String, String> {
    let start = doc.find(begin).ok_or(format!("docs/VALIDATION.md has no {begin}"))? + begin.len();
    let stop = doc.find(end).ok_or(format!("docs/VALIDATION.md has no {end}"))?;
    if std::env::var_os("HEADROOM_REGENERATE").is_some() {
        return Ok(format!("{}{}{}", &doc[..start], text, &doc[stop..]));
    }
    if doc[start..stop] != *text {
        return Err(format!(
            "docs/VALIDATION.md's table after {} is stale: run HEADROOM_REGENERATE=1 cargo test -p headroom-plan --test devgrid",
            begin.trim()
        ));
    }
    Ok(doc.to_string())
}

#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn the_dev_grid_as_the_gpu_measured_it() {
    let Some(dir) = shared() else {
        eprintln!("skipped: ../shared/gpu (the GPU's measurements) is not beside this checkout");
        return;
    };
    let rows = rows(&dir);
    assert_eq!(rows.len(), 36, "every job of the grid");
    let text = table(&rows);
    let (process, reserved_both, allocated_both) = like_for_like(&rows);
    if std::env::var_os("DEVGRID_TABLE").is_some() {
        println!("{text}\n{process}");
        for r in &rows {
            println!("{}: {}", r.name, r.program);
        }
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/VALIDATION.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let doc = section(&doc, BEGIN, END, &text).unwrap_or_else(|e| panic!("{e}"));
    let doc = section(&doc, PROCESS_BEGIN, PROCESS_END, &process).unwrap_or_else(|e| panic!("{e}"));
    if std::env::var_os("HEADROOM_REGENERATE").is_some() {
        std::fs::write(&path, doc).unwrap();
    }
    let allocated = rows.iter().filter(|r| within(r.allocated)).count();
    let reserved = rows.iter().filter(|r| within(r.reserved)).count();
    let wrong: Vec<&str> = rows.iter().filter(|r| !r.fits).map(|r| r.name.as_str()).collect();
    assert!(wrong.is_empty(), "every job ran; planned not to fit: {wrong:?}");
    assert!(allocated >= ALLOCATED_WITHIN, "allocated within ±5% on {allocated} of 36:\n{text}");
    assert!(
        allocated_both >= ALLOCATED_WITHIN,
        "allocated like for like within ±5% on {allocated_both} of 36:\n{process}"
    );
    assert!(reserved_both >= RESERVED_WITHIN, "reserved like for like within ±5% on {reserved_both} of 36:\n{process}");
    eprintln!("reserved within ±5% on {reserved} of 36 planned in a fresh process, {reserved_both} like for like");
}

/// The grid's process replayed: the first job finds nothing allocated, each later one the two
/// cuBLAS workspaces the first made (the GPU's `allocated_before` holds them too), and a job
/// alone in the replay peaks where the plan's own replay of it does, but for those
/// workspaces' places.
#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn the_grid_process_holds_the_first_jobs_workspaces() {
    let Some(dir) = shared() else {
        eprintln!("skipped: ../shared/gpu (the GPU's measurements) is not beside this checkout");
        return;
    };
    let rows = rows(&dir);
    let jobs = programs(&rows, false);
    let capacity = rows[0].plain.memory.capacity_bytes as u64;
    let process = grid_process(&jobs, capacity);
    let workspaces = 2.0 * gpu("h200").unwrap().arch.cublas_workspace_bytes() as f64;
    assert_eq!(process[0].held_before, 0.0);
    assert!(process[1..].iter().all(|p| p.held_before == workspaces), "two workspaces held");
    // Alone, the first job is the plan's own replay of it.
    let first = grid_process(&jobs[..1], capacity)[0];
    assert_eq!((first.allocated, first.reserved), (rows[0].allocated.1, rows[0].reserved.1));
}
