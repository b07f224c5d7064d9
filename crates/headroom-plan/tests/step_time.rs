//! The planner's step time against training steps timed on a real GPU: the dev grid of
//! `../shared/gpu/` (36 jobs on an H200 with torch 2.11: llama-1b, qwen2-0.5b and
//! gpt2-medium built from their configs, × 1×512 and 4×2048 × bf16, fp32 and AMP × no and
//! full checkpointing, SDPA, `torch.optim.AdamW` at torch's defaults; `step_s` is the mean
//! of steps 2 and 3, synchronized before and after).
//!
//! The split between the rows the step-time model's constants were fitted on and the rows
//! only compared was fixed before anything was fitted: the tuning rows are the twelve bf16
//! jobs (three families, both shapes, with and without checkpointing), where the launch
//! rate and the checkpoint hooks' cost show alone; every fp32 and AMP job is a check — they
//! run other kernels (autocast's copies, fp32 matrix multiplies, the math path of SDPA for
//! grouped heads in fp32, an fp32 optimizer) that nothing was fitted to.
//!
//! Figures to reach, the issue's, set before comparing: within ±15% on at least 30 of the
//! 36 jobs, none off by more than 1.5× either way.

/// The rows the constants were fitted on.
const TUNING: &[&str] = &[
    "llama-1b-train-bf16-none-sdpa-1x512",
    "llama-1b-train-bf16-full-sdpa-1x512",
    "llama-1b-train-bf16-none-sdpa-4x2048",
    "llama-1b-train-bf16-full-sdpa-4x2048",
    "qwen2-0.5b-train-bf16-none-sdpa-1x512",
    "qwen2-0.5b-train-bf16-full-sdpa-1x512",
    "qwen2-0.5b-train-bf16-none-sdpa-4x2048",
    "qwen2-0.5b-train-bf16-full-sdpa-4x2048",
    "gpt2-medium-train-bf16-none-sdpa-1x512",
    "gpt2-medium-train-bf16-full-sdpa-1x512",
    "gpt2-medium-train-bf16-none-sdpa-4x2048",
    "gpt2-medium-train-bf16-full-sdpa-4x2048",
];
/// ±15%, on at least this many of the 36 jobs.
const TOLERANCE: f64 = 0.15;
const WITHIN: usize = 30;
/// No job planned more than this many times too fast or too slow.
const WORST_RATIO: f64 = 1.5;

#[path = "../../../tests/support/skip.rs"]
mod skip;

use headroom_plan::gpu::{gpu, GpuSpec};
use headroom_plan::job::{Attention, Checkpointing, Optimizer, Precision, TrainConfig};
use headroom_plan::model::Model;
use headroom_plan::names::Named;
use headroom_plan::time::{step_time_with, Host};
#[path = "support/plan.rs"]
mod plan;
use plan::estimate;
use serde_json::Value;
use std::path::{Path, PathBuf};

const BEGIN: &str = "<!-- step-time:begin -->\n";
const END: &str = "<!-- step-time:end -->";

fn shared() -> Option<PathBuf> {
    let p = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/gpu"));
    p.join("devgrid-measured.jsonl").exists().then_some(p)
}

/// One job of the grid, as `headroom plan` plans it.
struct Job {
    name: String,
    model: Model,
    cfg: TrainConfig,
    measured: f64,
}

impl Job {
    fn tuning(&self) -> bool {
        TUNING.contains(&self.name.as_str())
    }
}

/// The H200 the jobs ran on, with the memory torch reports for it.
fn h200(measured_total: u64) -> GpuSpec {
    GpuSpec { memory_bytes: measured_total, ..gpu("h200").expect("h200 is a preset") }
}

fn jobs(dir: &Path) -> (GpuSpec, Vec<Job>) {
    let cases: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("devgrid-cases.json")).unwrap()).unwrap();
    let text = std::fs::read_to_string(dir.join("devgrid-measured.jsonl")).unwrap();
    let mut lines = text.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str::<Value>(l).unwrap());
    let header = lines.next().unwrap();
    let g = h200(header["header"]["total"].as_u64().unwrap());
    let measured: Vec<Value> = lines.collect();
    let jobs = cases
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let name = c["name"].as_str().unwrap();
            let m = measured.iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("{name}: not measured"));
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
                ..TrainConfig::new(
                    c["batch"].as_u64().unwrap(),
                    c["seq"].as_u64().unwrap(),
                    precision,
                    Optimizer::AdamW,
                )
            };
            Job { name: name.to_string(), model, cfg, measured: m["step_s"].as_f64().unwrap() }
        })
        .collect();
    (g, jobs)
}

/// planned / measured − 1.
fn err(planned: f64, measured: f64) -> f64 {
    planned / measured - 1.0
}

/// How many times too fast or too slow.
fn off_by(planned: f64, measured: f64) -> f64 {
    (planned / measured).max(measured / planned)
}

fn within(e: f64) -> bool {
    e.abs() <= TOLERANCE
}

fn table(rows: &[(&Job, headroom_plan::estimate::Estimate)]) -> String {
    let ms = |s: f64| s * 1e3;
    let mut s = String::new();
    s.push_str("| job | split | measured | planned | error | compute | memory-bound | launch | dominant |\n");
    s.push_str("|---|---|---:|---:|---:|---:|---:|---:|---|\n");
    for (j, e) in rows {
        let b = &e.time.as_ref().unwrap().breakdown;
        s.push_str(&format!(
            "| {} | {} | {:.1} ms | {:.1} ms | {:+.1}% | {:.1} | {:.1} | {:.1} | {} |\n",
            j.name,
            if j.tuning() { "tuning" } else { "check" },
            ms(j.measured),
            ms(e.time.as_ref().unwrap().step_time_s),
            err(e.time.as_ref().unwrap().step_time_s, j.measured) * 100.0,
            ms(b.compute),
            ms(b.memory),
            ms(b.launch),
            b.dominant().name(),
        ));
    }
    for (split, tuning) in [("tuning", true), ("check", false)] {
        let part: Vec<_> = rows.iter().filter(|(j, _)| j.tuning() == tuning).collect();
        let ok = part.iter().filter(|(j, e)| within(err(e.time.as_ref().unwrap().step_time_s, j.measured))).count();
        let worst =
            part.iter().map(|(j, e)| err(e.time.as_ref().unwrap().step_time_s, j.measured).abs()).fold(0.0, f64::max);
        let off =
            part.iter().map(|(j, e)| off_by(e.time.as_ref().unwrap().step_time_s, j.measured)).fold(1.0, f64::max);
        s.push_str(&format!(
            "\n{split}: within ±15% on {ok} of {}, worst {:.1}% ({off:.2}× off)",
            part.len(),
            worst * 100.0
        ));
    }
    let all = rows.iter().filter(|(j, e)| within(err(e.time.as_ref().unwrap().step_time_s, j.measured))).count();
    let mut errors: Vec<f64> =
        rows.iter().map(|(j, e)| err(e.time.as_ref().unwrap().step_time_s, j.measured).abs()).collect();
    errors.sort_by(f64::total_cmp);
    s.push_str(&format!(
        "\nall: within ±15% on {all} of {}, median error {:.1}%\n",
        rows.len(),
        errors[errors.len() / 2] * 100.0
    ));
    s
}

#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn the_dev_grid_steps_as_the_gpu_timed_them() {
    let Some(dir) = shared() else {
        skip::skip("../shared/gpu (the GPU's measurements) is not beside this checkout");
        return;
    };
    let (g, jobs) = jobs(&dir);
    assert_eq!(jobs.len(), 36, "every job of the grid");
    let rows: Vec<_> = jobs.iter().map(|j| (j, estimate(&j.model, &g, &j.cfg))).collect();
    let text = table(&rows);
    if std::env::var_os("STEP_TIME_TABLE").is_some() {
        println!("{text}");
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/VALIDATION.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let start = doc.find(BEGIN).expect("docs/VALIDATION.md has the step-time markers") + BEGIN.len();
    let end = doc.find(END).expect("end marker");
    if std::env::var_os("HEADROOM_REGENERATE").is_some() {
        std::fs::write(&path, format!("{}{}{}", &doc[..start], text, &doc[end..])).unwrap();
    } else {
        assert!(
            doc[start..end] == text,
            "docs/VALIDATION.md's step-time table is stale: run HEADROOM_REGENERATE=1 cargo test -p headroom-plan --test step_time"
        );
    }
    let ok = rows.iter().filter(|(j, e)| within(err(e.time.as_ref().unwrap().step_time_s, j.measured))).count();
    assert!(ok >= WITHIN, "within ±15% on {ok} of 36, {WITHIN} wanted:\n{text}");
    for (j, e) in &rows {
        assert!(
            off_by(e.time.as_ref().unwrap().step_time_s, j.measured) <= WORST_RATIO,
            "{}: planned {:.1} ms, measured {:.1} ms\n{text}",
            j.name,
            e.time.as_ref().unwrap().step_time_s * 1e3,
            j.measured * 1e3
        );
        // The breakdown adds up to the step.
        let b = &e.time.as_ref().unwrap().breakdown;
        assert!(
            (b.total() - e.time.as_ref().unwrap().step_time_s).abs() <= 1e-9 * e.time.as_ref().unwrap().step_time_s,
            "{}: {b:?}",
            j.name
        );
    }
}

/// How the host rates of [`Host::default`] were found: the rates that minimise the tuning
/// rows' squared log errors, over a grid of per-operator costs wider than their published
/// range (2–50 µs).
/// `HEADROOM_FIT=1 cargo test -p headroom-plan --test step_time -- --nocapture fit`
/// prints them and the check rows' figures at them; without it the test checks that the
/// rates in the code are the grid's best.
#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn fit() {
    let Some(dir) = shared() else {
        skip::skip("../shared/gpu (the GPU's measurements) is not beside this checkout");
        return;
    };
    let (g, jobs) = jobs(&dir);
    let loss = |host: &Host, tuning: bool| -> f64 {
        jobs.iter()
            .filter(|j| j.tuning() == tuning)
            .map(|j| (step_time_with(&plan::job(&j.model, &g, &j.cfg), 0.0, true, host).step / j.measured).ln().powi(2))
            .sum()
    };
    let micro = |i: u32, step: f64| f64::from(i) * step * 1e-6;
    let mut best = (f64::MAX, Host::default());
    for python in (10..=50).map(|i| micro(i, 1.0)) {
        for engine in (4..=48).map(|i| micro(i, 0.5)) {
            for hook in (0..=20).map(|i| micro(i, 2.5)) {
                let host = Host { python_op: python, engine_op: engine, checkpoint_hook: hook };
                let l = loss(&host, true);
                if l < best.0 {
                    best = (l, host);
                }
            }
        }
    }
    let (_, fitted) = best;
    if std::env::var_os("HEADROOM_FIT").is_some() {
        println!("fitted on the tuning rows: {fitted:?}");
        for j in &jobs {
            let t = step_time_with(&plan::job(&j.model, &g, &j.cfg), 0.0, true, &fitted).step;
            println!(
                "{:<45} {:>6} {:8.1} ms {:8.1} ms {:+6.1}%",
                j.name,
                if j.tuning() { "tuning" } else { "check" },
                j.measured * 1e3,
                t * 1e3,
                err(t, j.measured) * 100.0
            );
        }
    }
    let code = Host::default();
    assert!(
        (code.python_op - fitted.python_op).abs() < 1e-9
            && (code.engine_op - fitted.engine_op).abs() < 1e-9
            && (code.checkpoint_hook - fitted.checkpoint_hook).abs() < 1e-9,
        "Host::default() is not the tuning rows' fit: {code:?} against {fitted:?}"
    );
}
