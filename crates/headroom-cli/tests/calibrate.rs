//! `headroom plan --calibrate`: the plan's step program fitted to snapshots of the user's own
//! smaller runs.
//!
//! Every way the input can be wrong exits 2 with a message that names it: no trace, no
//! frames, no whole step, a snapshot of another model. On the snapshots of ../shared/gpu (Qwen3-1.7B recorded
//! on an H200 from before the model was built, and a run that ran out of memory) the
//! `calibration` object names the step used and each fitted term, and the plan lands within
//! 3% of the measured peak.
//!
//! On the real snapshots of ../shared/fixtures whose workloads are known
//! (cs336's Transformer LM at two or three sequence lengths each, the scripts that
//! recorded them read for batch, precision and optimizer): every shape
//! predicted uncalibrated, from the first snapshot, and from the first two,
//! against what each snapshot measured. The table in docs/VALIDATION.md is
//! this test's output: `HEADROOM_REGENERATE=1 cargo test -p headroom-cli --test
//! calibrate`. Skips with a message where `../shared` is absent.

#[path = "../../../tests/support/skip.rs"]
mod skip;

#[path = "../../headroom-inspect/tests/common/mod.rs"]
mod training_run;

use assert_cmd::Command;
use serde_json::Value;
use std::fmt::Write;
use std::path::{Path, PathBuf};
mod support;
use support::*;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn headroom(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::cargo_bin("headroom").unwrap().args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let (code, out, err) = headroom(&all);
    assert!(matches!(code, Some(0 | 1)), "{args:?} exited {code:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

/// `headroom inspect`'s phase peaks of a snapshot's first device.
fn step_phases(file: &str) -> Value {
    json(&["inspect", file])["snapshots"][0]["devices"][0]["step_phases"].clone()
}

fn b(v: &Value) -> f64 {
    v.as_u64().unwrap_or_else(|| panic!("{v} is not a byte count")) as f64
}

/// The plan's allocated bytes in `phase`, as the snapshot counts them (the replay's, cuBLAS
/// workspace included).
fn predicted_phase(plan: &Value, phase: &str) -> f64 {
    b(&plan["phases"][phase])
}

/// The plan's allocated peak over the phases the run went through (a forward-only run
/// has no backward or optimizer step to compare).
fn predicted_peak(plan: &Value, measured: &Value) -> f64 {
    [("forward", "forward_bytes"), ("backward", "backward_bytes"), ("optimizer", "optimizer_bytes")]
        .iter()
        .filter(|(_, m)| !measured[m].is_null())
        .map(|(p, _)| predicted_phase(plan, p))
        .fold(0.0, f64::max)
}

fn measured_peak(measured: &Value) -> f64 {
    ["start_bytes", "forward_bytes", "backward_bytes", "optimizer_bytes"]
        .iter()
        .filter_map(|k| measured[k].as_u64())
        .fold(0, u64::max) as f64
}

struct Scratch {
    _dir: tempfile::TempDir,
    small: String,
    no_frames: String,
    no_trace: String,
    forward_only: String,
}

fn scratch() -> Scratch {
    let dir = tempfile::tempdir().unwrap();
    // Four layers of 128 MiB: a few steps of a small model at a short sequence.
    let run = training_run::training_run_sized_json(3, 128 << 20);
    let small = dir.path().join("small-run.pickle");
    std::fs::write(&small, &run).unwrap();
    let mut v: Value = serde_json::from_slice(&run).unwrap();
    // The first forward alone: the trace cut before the backward's first allocation.
    let mut cut = v.clone();
    let entries = cut["device_traces"][0].as_array().unwrap().clone();
    let end = entries.iter().position(|e| e["frames"].to_string().contains("autograd")).unwrap_or(entries.len());
    cut["device_traces"][0] = Value::Array(entries[..end].to_vec());
    let forward_only = dir.path().join("forward-only.json");
    std::fs::write(&forward_only, serde_json::to_vec(&cut).unwrap()).unwrap();
    for e in v["device_traces"][0].as_array_mut().unwrap() {
        e["frames"] = serde_json::json!([]);
    }
    for s in v["segments"].as_array_mut().unwrap() {
        for b in s["blocks"].as_array_mut().unwrap() {
            b["frames"] = serde_json::json!([]);
        }
    }
    let no_frames = dir.path().join("no-frames.json");
    std::fs::write(&no_frames, serde_json::to_vec(&v).unwrap()).unwrap();
    v["device_traces"] = serde_json::json!([[]]);
    let no_trace = dir.path().join("no-trace.json");
    std::fs::write(&no_trace, serde_json::to_vec(&v).unwrap()).unwrap();
    let s = |p: &Path| p.display().to_string();
    Scratch {
        small: s(&small),
        no_frames: s(&no_frames),
        no_trace: s(&no_trace),
        forward_only: s(&forward_only),
        _dir: dir,
    }
}

/// cs336's Transformer LM (medium), the examples' model; `--seq` is last, to be replaced.
fn plan_args() -> Vec<String> {
    let model = repo().join("data/models/cs336-medium.json").display().to_string();
    [
        "plan",
        "--model",
        &model,
        "--gpu",
        "a100-80gb",
        "--precision",
        "fp32",
        "--attention",
        "eager",
        "--batch",
        "4",
        "--seq",
        "1024",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn what_cannot_calibrate_exits_2_and_says_why() {
    let s = scratch();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--calibrate", &s.no_trace], "has no trace"),
        (vec!["--calibrate", &s.no_frames], "recorded no frames"),
        (vec!["--calibrate", "missing.pickle"], "missing.pickle"),
        (vec!["--calibrate", &s.small, "--calibrate-seq", "128", "--calibrate-seq", "256"], "given 2 times for 1"),
        (vec!["--calibrate", &s.small, "--calibrate-seq", "2048"], "cannot calibrate it"),
        // A run of four layers of activations and no model: not the plan's model.
        (vec!["--calibrate", &s.small, "--calibrate-seq", "128"], "another model"),
        (
            vec!["--calibrate", &s.forward_only, "--calibrate-seq", "128"],
            "no whole training step (a forward without a backward)",
        ),
        (vec!["--calibrate", &s.small, "--framework", "megatron"], "not planned as"),
        (vec!["--calibrate", &s.small, "--framework", "megatron", "--calibrate-seq", "128"], "not planned as"),
        (vec!["--calibrate", &s.small, "--recommend"], "cannot be used with"),
        (vec!["--calibrate-seq", "128"], "--calibrate"),
        (vec!["--calibrate", &s.small, "--calibrate-batch", "0"], "--calibrate-batch"),
    ];
    for (extra, says) in cases {
        let owned = plan_args();
        let mut args: Vec<&str> = owned.iter().map(String::as_str).collect();
        args.extend(&extra);
        let (code, _, err) = headroom(&args);
        assert_eq!(code, Some(2), "{extra:?}: {err}");
        assert!(err.contains(says), "{extra:?} should say {says:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let (code, _, err) = headroom(&["plan", "--model", "gpt2", "--gpu", "l4", "--infer", "--calibrate", &s.small]);
    assert_eq!(code, Some(2), "{err}");
}

// The real snapshots.

fn fixtures_dir() -> Option<PathBuf> {
    let d = repo().join("../shared/fixtures/pytorch-snapshots");
    d.is_dir().then_some(d)
}

/// A workload recorded at three sequence lengths, each read from the script that recorded it.
struct Series {
    name: &'static str,
    model: &'static str,
    /// `(sequence, file)`, shortest first.
    runs: &'static [(u64, &'static str)],
}

const SERIES: [Series; 2] = [
    Series {
        name: "cs336 medium (0.42 B), a step after 5 warm-up steps",
        model: "data/models/cs336-medium.json",
        // The same script's 1024-token snapshot ran under bf16 autocast (its linear outputs
        // are 2 bytes an element): another job, left out.
        runs: &[
            (128, "Wedsonlin__assignment2-systems__8630bcfe__results_medium_128_training_memory_snapshot.pickle"),
            (256, "Wedsonlin__assignment2-systems__8630bcfe__results_medium_256_training_memory_snapshot.pickle"),
        ],
    },
    Series {
        name: "cs336 2.7B (3.4 B), the first step (optimizer state made in it)",
        model: "data/models/cs336-2.7b.json",
        runs: &[
            (128, "kkaitlyn111__cs336-a2-systems__c1c174d1__memory_files_memory_ctx128_fullstep_.pickle"),
            (256, "kkaitlyn111__cs336-a2-systems__c1c174d1__memory_files_memory_ctx256_fullstep_.pickle"),
            (512, "kkaitlyn111__cs336-a2-systems__c1c174d1__memory_files_memory_ctx512_fullstep_.pickle"),
        ],
    },
];

const BEGIN: &str = "<!-- calibration-table:begin -->\n";
const END: &str = "<!-- calibration-table:end -->";

fn error(predicted: f64, measured: f64) -> f64 {
    (predicted - measured) / measured * 100.0
}

#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn real_snapshots_predict_other_sequence_lengths() {
    let Some(dir) = fixtures_dir() else {
        skip::skip("../shared/fixtures is absent (a fresh clone); the calibration table needs its snapshots");
        return;
    };
    let model = |s: &Series| repo().join(s.model).display().to_string();
    let mut table = String::new();
    writeln!(
        table,
        "| workload | seq | measured peak / forward | uncalibrated | calibrated from the first | from the first two |\n|---|---:|---:|---:|---:|---:|"
    )
    .unwrap();
    // |error| of the check cells (shapes no calibration saw), by method: the peak, the forward.
    let mut checks: [Vec<f64>; 3] = Default::default();
    let mut forwards: [Vec<f64>; 3] = Default::default();
    for s in &SERIES {
        let files: Vec<String> = s.runs.iter().map(|(_, f)| dir.join(f).display().to_string()).collect();
        for (i, &(seq, _)) in s.runs.iter().enumerate() {
            let measured = step_phases(&files[i]);
            let m = measured_peak(&measured);
            let seq_s = seq.to_string();
            let m_s = model(s);
            let base = [
                "plan",
                "--model",
                &m_s,
                "--gpu",
                "h100-sxm",
                "--precision",
                "fp32",
                "--attention",
                "eager",
                "--optimizer",
                "adamw",
                "--batch",
                "4",
                "--seq",
                &seq_s,
            ];
            let mut cells = Vec::new();
            // Two snapshots leave a third shape to check only where the series has one.
            let methods = if s.runs.len() > 2 { &[0usize, 1, 2][..] } else { &[0, 1] };
            for (k, &used) in methods.iter().enumerate() {
                let mut args = base.to_vec();
                let seqs: Vec<String> = s.runs[..used].iter().map(|r| r.0.to_string()).collect();
                for j in 0..used {
                    args.extend(["--calibrate", &files[j], "--calibrate-seq", &seqs[j]]);
                }
                let plan = json(&args);
                let e = error(predicted_peak(&plan, &measured), m);
                let fwd = error(predicted_phase(&plan, "forward"), b(&measured["forward_bytes"]));
                if i < used {
                    // A calibration reproduces the snapshot it was fitted to: within 1% from one,
                    // by least squares from two.
                    if used == 1 {
                        assert!(e.abs() < 1.0, "{}: calibrated at its own shape, {e:+.3}%", files[i]);
                    }
                    cells.push(format!("fitted ({e:+.1}% / {fwd:+.1}%)"));
                } else {
                    checks[k].push(e.abs());
                    forwards[k].push(fwd.abs());
                    cells.push(format!("{e:+.1}% / {fwd:+.1}%"));
                }
            }
            cells.resize(3, "–".to_string());
            let gib = |x: f64| x / (1u64 << 30) as f64;
            let f = b(&measured["forward_bytes"]);
            writeln!(table, "| {} | {seq} | {:.2} / {:.2} GiB | {} |", s.name, gib(m), gib(f), cells.join(" | "))
                .unwrap();
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    writeln!(table, "\nCheck cells (shapes no calibration saw), median |error| of the peak / the forward:").unwrap();
    for (k, name) in ["uncalibrated", "from the first snapshot", "from the first two"].iter().enumerate() {
        let n = checks[k].len();
        let (p, f) = (median(&mut checks[k]), median(&mut forwards[k]));
        writeln!(table, "- {name}: {p:.1}% / {f:.1}% ({n} cells)").unwrap();
    }
    let path = repo().join("docs/VALIDATION.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let start = doc.find(BEGIN).expect("docs/VALIDATION.md has the calibration-table markers") + BEGIN.len();
    let end = doc.find(END).expect("end marker");
    let regenerate = std::env::var_os("HEADROOM_REGENERATE").is_some();
    if regenerate {
        std::fs::write(&path, format!("{}{}{}", &doc[..start], table, &doc[end..])).unwrap();
    }
    assert!(
        regenerate || doc[start..end] == table,
        "docs/VALIDATION.md's calibration table is stale: run HEADROOM_REGENERATE=1 cargo test -p headroom-cli --test calibrate\n{table}"
    );
}

/// A forward without a backward or an optimizer step holds no whole step: refused, saying so.
#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn a_forward_only_snapshot_is_refused() {
    let Some(dir) = fixtures_dir() else {
        skip::skip("../shared/fixtures is absent (a fresh clone)");
        return;
    };
    let file = dir.join("kkaitlyn111__cs336-a2-systems__c1c174d1__memory_files_memory_ctx128_forward_.pickle");
    let model = repo().join("data/models/cs336-2.7b.json").display().to_string();
    let f = file.display().to_string();
    let (code, _, err) = headroom(&[
        "plan",
        "--model",
        &model,
        "--gpu",
        "h100-sxm",
        "--precision",
        "fp32",
        "--batch",
        "4",
        "--seq",
        "256",
        "--calibrate",
        &f,
        "--calibrate-seq",
        "128",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no whole training step (a forward without a backward)"), "{err}");
}

fn gpu_dir() -> Option<PathBuf> {
    let d = repo().join("../shared/gpu");
    d.join("qwen3-calibrate-case.json").is_file().then_some(d)
}

/// The Qwen3 case from the command line: both snapshots, the step each used, the terms and
/// residuals in `--json`, the plan within 3% of the measured peak; text names them too.
#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn the_qwen3_case_from_the_command_line() {
    let Some(dir) = gpu_dir() else {
        skip::skip("../shared/gpu is absent (a fresh clone); the Qwen3 calibration case needs its snapshots");
        return;
    };
    let case: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("qwen3-calibrate-case.json")).unwrap()).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let model = scratch.path().join("qwen3.json");
    std::fs::write(&model, case["config"].to_string()).unwrap();
    let m = model.display().to_string();
    let snap =
        |seq: u64| dir.join(format!("snapshots/qwen3-1.7b-bf16-1x{seq}-two-steps.pickle.gz")).display().to_string();
    let (s512, s1024) = (snap(512), snap(1024));
    let args = [
        "plan",
        "--model",
        &m,
        "--gpu",
        "h200",
        "--precision",
        "bf16",
        "--attention",
        "sdpa",
        "--batch",
        "4",
        "--seq",
        "2048",
        "--calibrate",
        &s512,
        "--calibrate",
        &s1024,
        "--calibrate-batch",
        "1",
        "--calibrate-seq",
        "512",
        "--calibrate-seq",
        "1024",
    ];
    let plan = json(&args);
    let c = &plan["calibration"];
    for s in c["snapshots"].as_array().unwrap() {
        assert_eq!(s["step"]["number"], 2, "{s}");
        assert_eq!(s["step"]["kind"], "steady");
        assert_eq!(s["steps_found"], 2);
        assert!(s["construction_bytes"].as_u64().is_some());
        assert!(s["residual"]["allocated"].as_f64().unwrap().abs() < 0.01, "{s}");
    }
    let terms: Vec<&str> = c["terms"].as_array().unwrap().iter().map(|t| t["term"].as_str().unwrap()).collect();
    assert_eq!(terms, ["kept between steps", "forward", "backward", "optimizer step"]);
    for t in c["terms"].as_array().unwrap() {
        assert_eq!(t["recorded_bytes"].as_array().unwrap().len(), 2);
        assert_eq!(t["planned_bytes"].as_array().unwrap().len(), 2);
    }
    let want = case["measured"]["qwen3-1.7b-train-bf16-none-sdpa-4x2048"]["peak_allocated"].as_f64().unwrap();
    let got = b(&plan["allocated_bytes"]);
    assert!((got / want - 1.0).abs() < 0.03, "planned {got}, measured {want}");
    assert!(plan["reserved_bytes"].as_u64().unwrap() as f64 >= got);
    let (code, out, err) = headroom(&args);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("step 2 of 2 used (steady, 1 micro-step)"), "{out}");
    assert!(out.contains("residual on the recorded steps: allocated peak within"), "{out}");
    // Another model's snapshot is refused, saying why.
    let (code, _, err) =
        headroom(&["plan", "--model", "gpt2", "--gpu", "h200", "--seq", "512", "--batch", "1", "--calibrate", &s512]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("another model"), "{err}");
}

/// A run that ran out of memory at batch 4 under a 10 GiB limit: the OOM is said, and on a
/// GPU of that size the job does not fit.
#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn an_oom_snapshot_is_evidence() {
    let Some(dir) = gpu_dir() else {
        skip::skip("../shared/gpu is absent (a fresh clone); the OOM snapshot is there");
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let model = scratch.path().join("qwen2.json");
    std::fs::write(
        &model,
        r#"{"model_type":"qwen2","hidden_size":896,"intermediate_size":4864,"num_hidden_layers":24,
            "num_attention_heads":14,"num_key_value_heads":2,"vocab_size":151936,"max_position_embeddings":32768,
            "tie_word_embeddings":true,"rms_norm_eps":1e-6}"#,
    )
    .unwrap();
    let m = model.display().to_string();
    let f = dir.join("snapshots/oom-cpp-qwen2-0.5b-b4.pickle.gz").display().to_string();
    let args = [
        "plan",
        "--model",
        &m,
        "--gpu",
        "h200",
        "--gpu-memory",
        "11GiB",
        "--precision",
        "fp32",
        "--attention",
        "sdpa",
        "--batch",
        "4",
        "--seq",
        "1024",
        "--calibrate",
        &f,
    ];
    let (code, out, err) = headroom(&args);
    assert_eq!(code, Some(1), "does not fit: {err}\n{out}");
    assert!(out.contains("ran out of memory in step 3's forward: asked 1.16 GiB"), "{out}");
    assert!(out.contains("a per-process memory limit refused it"), "{out}");
    assert!(out.contains("OOM evidence: at micro-batch 4 × 1024 tokens or more"), "{out}");
    let plan = json(&args);
    assert_eq!(plan["fits"], false);
    assert_eq!(plan["calibration"]["oom_evidence"]["asked_bytes"], 1_244_659_712u64);
}

#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn calibration_refuses_another_models_snapshot_and_contradictory_shapes() {
    let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/pytorch-snapshots");
    let w = |len: u32| {
        fx.join(format!(
            "Wedsonlin__assignment2-systems__8630bcfe__results_medium_{len}_training_memory_snapshot.pickle"
        ))
    };
    let larger = fx.join("kkaitlyn111__cs336-a2-systems__c1c174d1__memory_files_memory_ctx128_fullstep_.pickle");
    let unrelated = fx.join("HugePandaCoder__octree-nca-groupeq__0cc72993__my_snapshot.pickle");
    if ![w(128), w(256), larger.clone(), unrelated.clone()].iter().all(|f| f.is_file()) {
        skip::skip("../shared/fixtures is absent: the sweep's calibration cases are real snapshots");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/models/cs336-medium.json");
    let job = [
        "plan",
        "--model",
        model.to_str().unwrap(),
        "--gpu",
        "h100-sxm",
        "--precision",
        "fp32",
        "--attention",
        "eager",
        "--batch",
        "4",
        "--seq",
        "512",
    ];
    let (w128, w256) = (w(128), w(256));
    let (w128, w256) = (w128.to_str().unwrap(), w256.to_str().unwrap());
    // S7: a larger model's snapshot and an unrelated program's.
    headroom_in(d, &[&job[..], &["--calibrate", larger.to_str().unwrap(), "--calibrate-seq", "128"]].concat())
        .expect(2, "a snapshot of another model");
    headroom_in(d, &[&job[..], &["--calibrate", unrelated.to_str().unwrap()]].concat())
        .expect(2, "no whole training step");
    // S8: two lengths given as one, and given swapped.
    headroom_in(d, &[&job[..], &["--calibrate", w128, "--calibrate", w256, "--calibrate-seq", "128"]].concat())
        .expect(2, "runs of one job at one shape make the same tensors");
    let swapped = ["--calibrate", w128, "--calibrate", w256, "--calibrate-seq", "256", "--calibrate-seq", "128"];
    headroom_in(d, &[&job[..], &swapped].concat()).expect(2, "a longer sequence keeps more");
    let right = ["--calibrate", w128, "--calibrate", w256, "--calibrate-seq", "128", "--calibrate-seq", "256"];
    headroom_in(d, &[&job[..], &right].concat()).expect(0, "fits");
}

/// A calibration snapshot's shape is bounded as the plan's is: `--calibrate-batch` ×
/// `--calibrate-seq` past 2^32 tokens is refused by name, never wrapped modulo 2^64 into a
/// small or empty micro-batch.
#[test]
fn a_calibration_shape_past_two_to_the_32_tokens_is_refused_not_wrapped() {
    let repo = repo();
    let (q, s) = (repo.join("data/models/qwen3-1.7b.json"), repo.join("data/snapshots/qwen3-1.7b-train.pickle.gz"));
    let job = [
        "plan",
        "--model",
        q.to_str().unwrap(),
        "--gpu",
        "h200",
        "--precision",
        "bf16",
        "--batch",
        "4",
        "--seq",
        "2048",
    ];
    let calibrate = ["--calibrate", s.to_str().unwrap()];
    for (shape, needle) in [
        (["512", "36028797018963969"], "is not in 1..=4294967296"),
        (["18446744073709551615", "18446744073709551615"], "is not in 1..=4294967296"),
        (["4294967296", "4294967296"], "is more than 2^32 tokens"),
        (["65536", "65537"], "is more than 2^32 tokens"),
    ] {
        let args = [&job[..], &calibrate, &["--calibrate-batch", shape[0], "--calibrate-seq", shape[1]]].concat();
        let (code, _, err) = headroom(&args);
        assert_eq!(code, Some(2), "{shape:?}: {err}");
        assert!(err.contains(needle), "{shape:?}: {err}");
    }
}
