//! The CPU ground truth: real PyTorch training steps of transformers models,
//! measured exactly on CPU by `scripts/validate/measure.py`
//! (`data/validation/cpu_ground_truth.json`), against the planner.
//!
//! Each case is a model from its `config.json`, a precision, optimizer,
//! attention kernel, checkpointing and batch × sequence; the step's peak of
//! live tensor bytes (what `torch.cuda.max_memory_allocated()` counts, less
//! what only a GPU has) and each phase's peak are compared with the planner's
//! `tensor_bytes` and phases. Tolerances are set here, before any comparison:
//! the model-state terms exactly, the peak and each phase within 3%.
//! Cases marked `tuning` are those read while the recipes and the phase
//! model were built; `check` cases were only compared.
//!
//! The inference forwards (transformers' `model(ids, use_cache=True)` under
//! `no_grad`) are compared with `plan --infer --framework hf`: its tensors
//! (weights and the forward's peak, without the CUDA context) within the same 3%.

use headroom_plan::builders::hf::cpu_peaks;
use headroom_plan::gpu::{gpu, GpuSpec};
use headroom_plan::infer::{self, InferConfig, Runtime, WeightFormat};
use headroom_plan::job::PipelineStage;
use headroom_plan::job::{
    Attention, Checkpointing, Framework, LossLife, Optimizer, OptimizerImpl, Precision, TrainConfig,
};
use headroom_plan::model::Head;
use headroom_plan::model::Model;
#[path = "support/plan.rs"]
mod plan;
use plan::estimate;
use serde_json::Value;

const PEAK_TOLERANCE: f64 = 0.03;

/// Cases whose peak misses the tolerance, and why. The test fails if any other case misses,
/// or if one of these comes within it (then remove it here).
const KNOWN_MISSES: &[(&str, &str)] = &[
    ("phi3/base amp adamw sdpa compiled b4×384", SHAPE_PLANNED),
    ("bloom/base fp32 adamw eager ckpt compiled b2×256", CHECKPOINTED_OVER),
    ("bloom/base fp32 adamw eager ckpt compiled b4×384", CHECKPOINTED_OVER),
    ("gemma/base fp32 adamw sdpa ckpt compiled b4×384", CHECKPOINTED_OVER),
];

const SHAPE_PLANNED: &str = "inductor plans each shape's graph apart: at 4 × 384 Phi-3's compiled AMP forward \
     holds AMP's bf16 copies of the output layer's and the MLPs' weights at its peak, which the graphs of the \
     recording shapes free before theirs";
const CHECKPOINTED_OVER: &str = "not explained yet: the compiled, checkpointed backward of BLOOM's (eager attention) \
     and Gemma's base config holds less at these shapes than its moments recorded at the recording shapes \
     scale to (4-6% over; their wide and deep configs are within)";

fn cases() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/validation/cpu_ground_truth.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["cases"].as_array().unwrap().clone()
}

fn config(c: &Value) -> TrainConfig {
    let precision = match c["precision"].as_str().unwrap() {
        "fp32" => Precision::Fp32,
        "bf16" => Precision::Bf16,
        "amp" => Precision::Amp,
        p => panic!("{p}"),
    };
    let optimizer = match c["optimizer"].as_str().unwrap() {
        "adamw" => Optimizer::AdamW,
        "sgd" => Optimizer::Sgd,
        "adafactor" => Optimizer::Adafactor,
        o => panic!("{o}"),
    };
    TrainConfig {
        attention: if c["attention"] == "eager" { Attention::Eager } else { Attention::Sdpa },
        checkpointing: if c["checkpointing"] == true { Checkpointing::Full } else { Checkpointing::None },
        head: match c["head"].as_str().unwrap() {
            "seq-cls" => Head::SeqCls,
            "masked-lm" => Head::MaskedLm,
            _ => Head::CausalLm,
        },
        compile: c["compiled"] == true,
        use_cache: use_cache(c),
        // measure.py's step function returns the loss as a number.
        loss_lives: LossLife::Function,
        // measure.py runs torch.optim's foreach implementation on CPU too.
        optimizer_impl: Some(OptimizerImpl::Foreach),
        ..TrainConfig::new(c["batch"].as_u64().unwrap(), c["seq"].as_u64().unwrap(), precision, optimizer)
    }
}

/// The key-value cache a case was measured with: its `use_cache`, where it says; a case without
/// it was measured before `measure.no_cache`, with the config's default (on).
fn use_cache(c: &Value) -> bool {
    c["use_cache"].as_bool().unwrap_or(true)
}

struct Row {
    label: String,
    /// The same case estimated as the sum of every term with Korthikanti's activations.
    megatron_error: f64,
    split: String,
    error: f64,
    phase_errors: [f64; 3],
    /// Measured less predicted, bytes, per phase; and tokens × vocabulary, vocabulary × hidden.
    residuals: [f64; 3],
    scales: [f64; 2],
    /// Whether a recorded step program planned it (else the closed form's phases).
    replayed: bool,
}

fn compare() -> Vec<Row> {
    let g = gpu("h100-sxm").unwrap();
    let mut rows = Vec::new();
    for c in cases().iter().filter(|c| c["mode"] == "train" && c.get("error").is_none()) {
        let m = Model::from_hf_config(&c["config"].to_string(), c["family"].as_str().unwrap()).unwrap();
        let cfg = config(c);
        let e = estimate(&m, &g, &cfg);
        let measured = c["peak_bytes"].as_f64().unwrap();
        let label = format!(
            "{}/{}{} {} {} {}{}{}{} b{}×{}",
            c["family"].as_str().unwrap(),
            c["size"].as_str().unwrap(),
            if c["head"] == "seq-cls" { " seq-cls" } else { "" },
            c["precision"].as_str().unwrap(),
            c["optimizer"].as_str().unwrap(),
            c["attention"].as_str().unwrap(),
            if c["checkpointing"] == true { " ckpt" } else { "" },
            if c["compiled"] == true { " compiled" } else { "" },
            // A case measured with the cache on beside its row without it, or without it beside
            // its row measured before `no_cache` (with it).
            match c["use_cache"].as_bool() {
                Some(true) => " use_cache",
                Some(false) => " no_cache",
                None => "",
            },
            c["batch"],
            c["seq"]
        );
        // The recorded step program run as the CPU runs it where one serves the job (its live
        // tensors, no allocator); the closed form's phases elsewhere.
        let cpu = cpu_peaks(&m, &cfg)
            .map(|(p, peak)| ([p.forward as f64, p.backward as f64, p.optimizer_step as f64], peak as f64));
        let replayed = cpu.is_some();
        let (phases, peak) = cpu.unwrap_or_else(|| {
            let s = closed_form_step(&m, &g, &cfg);
            s.unwrap_or_else(|| panic!("{label}: no phases"))
        });
        let summed =
            closed_form_total(&m, &g, &TrainConfig { framework: Framework::Megatron, optimizer_impl: None, ..cfg });
        let err = |p: f64, m: &Value| p / m.as_f64().unwrap() - 1.0;
        let res = |p: f64, m: &Value| m.as_f64().unwrap() - p;
        let _ = &e;
        rows.push(Row {
            split: c["split"].as_str().unwrap().to_string(),
            error: peak / measured - 1.0,
            megatron_error: summed / measured - 1.0,
            phase_errors: [
                err(phases[0], &c["phases"]["forward"]),
                err(phases[1], &c["phases"]["backward"]),
                err(phases[2], &c["phases"]["optimizer"]),
            ],
            residuals: [
                res(phases[0], &c["phases"]["forward"]),
                res(phases[1], &c["phases"]["backward"]),
                res(phases[2], &c["phases"]["optimizer"]),
            ],
            scales: [(cfg.micro_batch * cfg.seq * m.vocab) as f64, (m.vocab * m.hidden) as f64],
            replayed,
            label,
        });
        assert_eq!(
            m.params_with(cfg.head),
            c["params"].as_u64().unwrap(),
            "{}: parameters",
            rows.last().unwrap().label
        );
    }
    rows
}

/// The closed form's phases and peak, tensors only (no cuBLAS workspace): the planner's
/// model where no step program was recorded.
fn closed_form_step(m: &Model, g: &GpuSpec, cfg: &TrainConfig) -> Option<([f64; 3], f64)> {
    let s = plan::closed_form(m, g, cfg, PipelineStage::Only);
    let ph = s.phases?;
    let gpu_only = s.gpu_only;
    let p = [ph.forward.total, ph.backward.total, ph.optimizer.total];
    let peak = p.iter().copied().fold(0.0, f64::max);
    let _ = gpu_only;
    Some((p, peak))
}

/// Every term of the closed form summed, tensors only.
fn closed_form_total(m: &Model, g: &GpuSpec, cfg: &TrainConfig) -> f64 {
    let s = plan::closed_form(m, g, cfg, PipelineStage::Only);
    s.breakdown.total() - s.outside_allocator - s.gpu_only
}

#[test]
fn training_steps_match_the_cpu_ground_truth() {
    let rows = compare();
    let mut worst: Vec<&Row> = rows.iter().collect();
    worst.sort_by(|a, b| b.error.abs().partial_cmp(&a.error.abs()).unwrap());
    for r in worst.iter().take(40) {
        eprintln!(
            "{:<58} {:<6} peak {:+6.2}%  fwd {:+6.2}% bwd {:+6.2}% opt {:+6.2}%",
            r.label,
            r.split,
            r.error * 100.0,
            r.phase_errors[0] * 100.0,
            r.phase_errors[1] * 100.0,
            r.phase_errors[2] * 100.0
        );
        if std::env::var_os("GROUND_TRUTH_DETAIL").is_some() {
            let [bsv, vh] = r.scales;
            for (name, x) in ["fwd", "bwd", "opt"].iter().zip(r.residuals) {
                eprintln!("    {name} missing {x:>12.0} bytes = {:7.3} bsV = {:7.3} Vh", x / bsv, x / vh);
            }
        }
    }
    let within = rows.iter().filter(|r| r.error.abs() <= PEAK_TOLERANCE).count();
    for split in ["tuning", "check"] {
        let part: Vec<&Row> = rows.iter().filter(|r| r.split == split).collect();
        let ok = part.iter().filter(|r| r.error.abs() <= PEAK_TOLERANCE).count();
        eprintln!("{split}: {ok} of {} within ±3%", part.len());
    }
    eprintln!("{within} of {} within ±3%", rows.len());
    let replayed: Vec<&Row> = rows.iter().filter(|r| r.replayed).collect();
    eprintln!(
        "replayed from a recorded step program: {} of {} ({} within ±3%)",
        replayed.len(),
        rows.len(),
        replayed.iter().filter(|r| r.error.abs() <= PEAK_TOLERANCE).count()
    );
    for r in &replayed {
        eprintln!("  replayed: {:<58} peak {:+6.2}%", r.label, r.error * 100.0);
    }
    // The steps measured with the key-value cache set either way (`use_cache`), beside the
    // same jobs' rows measured before `no_cache` (with it).
    for r in rows.iter().filter(|r| r.label.contains(" no_cache") || r.label.contains(" use_cache")) {
        eprintln!(
            "  cache set: {:<58} {:<6} peak {:+6.2}%  fwd {:+6.2}% bwd {:+6.2}%",
            r.label,
            r.split,
            r.error * 100.0,
            r.phase_errors[0] * 100.0,
            r.phase_errors[1] * 100.0
        );
    }
    let mut summed: Vec<f64> = rows.iter().map(|r| r.megatron_error.abs()).collect();
    summed.sort_by(|a, b| a.partial_cmp(b).unwrap());
    eprintln!(
        "every term summed (--framework megatron): {} of {} within ±3%, median |error| {:.1}%",
        summed.iter().filter(|e| **e <= PEAK_TOLERANCE).count(),
        rows.len(),
        summed[summed.len() / 2] * 100.0
    );
    if std::env::var_os("GROUND_TRUTH_TABLE").is_some() {
        print_table(&rows);
    }
    let outside: Vec<&str> = rows.iter().filter(|r| r.error.abs() > PEAK_TOLERANCE).map(|r| r.label.as_str()).collect();
    let known = |l: &str| KNOWN_MISSES.iter().any(|(label, _)| *label == l);
    let unexpected: Vec<&&str> = outside.iter().filter(|l| !known(l)).collect();
    assert!(unexpected.is_empty(), "{within} of {} within ±3%; outside: {unexpected:?}", rows.len());
    let now_within: Vec<&str> = KNOWN_MISSES.iter().map(|(l, _)| *l).filter(|l| !outside.contains(l)).collect();
    assert!(now_within.is_empty(), "listed as missing but within ±3% (or gone): {now_within:?}");
    for (label, why) in KNOWN_MISSES {
        eprintln!("outside ±3%, known: {label}: {why}");
    }
}

/// Markdown for docs/VALIDATION.md: by family and precision, and every case outside ±3%.
fn print_table(rows: &[Row]) {
    let key = |r: &Row| {
        let mut it = r.label.split_whitespace();
        let fam = it.next().unwrap().split('/').next().unwrap().to_string();
        let mut prec = r.label.split_whitespace().find(|w| ["fp32", "bf16", "amp"].contains(w)).unwrap().to_string();
        if r.label.contains(" compiled") {
            prec.push_str(" compiled");
        }
        (fam, prec)
    };
    let mut groups: std::collections::BTreeMap<(String, String), Vec<&Row>> = Default::default();
    for r in rows {
        groups.entry(key(r)).or_default().push(r);
    }
    println!("| family | precision | cases (tuning + check) | within ±3% | median \\|error\\| | worst |");
    println!("|---|---|---:|---:|---:|---:|");
    for ((fam, prec), rs) in &groups {
        let mut errs: Vec<f64> = rs.iter().map(|r| r.error.abs()).collect();
        errs.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let worst = rs.iter().map(|r| r.error).fold(0.0f64, |a, e| if e.abs() > a.abs() { e } else { a });
        let tuning = rs.iter().filter(|r| r.split == "tuning").count();
        println!(
            "| {fam} | {prec} | {} ({tuning} + {}) | {} | {:.2}% | {:+.1}% |",
            rs.len(),
            rs.len() - tuning,
            rs.iter().filter(|r| r.error.abs() <= PEAK_TOLERANCE).count(),
            errs[errs.len() / 2] * 100.0,
            worst * 100.0
        );
    }
    println!();
    println!("| case | split | peak | forward | backward | optimizer |");
    println!("|---|---|---:|---:|---:|---:|");
    for r in rows.iter().filter(|r| r.error.abs() > PEAK_TOLERANCE) {
        println!(
            "| {} | {} | {:+.1}% | {:+.1}% | {:+.1}% | {:+.1}% |",
            r.label,
            r.split,
            r.error * 100.0,
            r.phase_errors[0] * 100.0,
            r.phase_errors[1] * 100.0,
            r.phase_errors[2] * 100.0
        );
    }
}

/// The inference forwards: `plan --infer --framework hf` against each measured peak.
#[test]
fn inference_forwards_match_the_cpu_ground_truth() {
    let g = gpu("h100-sxm").unwrap();
    let mut rows = Vec::new();
    for c in cases().iter().filter(|c| c["mode"] == "infer" && c.get("error").is_none()) {
        let m = Model::from_hf_config(&c["config"].to_string(), c["family"].as_str().unwrap()).unwrap();
        let attention = if c["attention"] == "eager" { Attention::Eager } else { Attention::Sdpa };
        let cfg = InferConfig {
            runtime: Runtime::Transformers {
                attention,
                all_logits: c.get("logits").is_none_or(|l| l == "all"),
                new_tokens: 1,
            },
            batch: c["batch"].as_u64().unwrap(),
            seq: c["seq"].as_u64().unwrap(),
            weights: if c["precision"] == "bf16" { WeightFormat::Bf16 } else { WeightFormat::Fp32 },
            kv_bytes: 2.0,
            tensor: 1,
            quantize: None,
        };
        infer::check(&m, &cfg).unwrap();
        let e = infer::estimate(&m, &g, &cfg);
        let label = format!(
            "{}/{} {} {} b{}×{}{}",
            c["family"].as_str().unwrap(),
            c["size"].as_str().unwrap(),
            c["precision"].as_str().unwrap(),
            c["attention"].as_str().unwrap(),
            c["batch"],
            c["seq"],
            if c["logits"] == "last" { " generate" } else { "" }
        );
        assert_eq!(m.params(), c["params"].as_u64().unwrap(), "{label}: parameters");
        // Tensors only, as the CPU measured them (a CPU run has no caching allocator). Where a
        // template plans the job, its program on the CPU (no GPU workspace) from the call on.
        // The CPU ran its fused SDPA kernel where a GPU takes the math path (fp32 with grouped
        // key-value heads, `…/sdpa-math`): those are held to the closed form, as before the
        // math path was recorded (`tests/infer_truth.rs` holds its templates to CPU runs on it).
        let planned = match infer::recorded::key(&m, &cfg) {
            Ok(key) if !key.ends_with("/sdpa-math") => {
                let p = infer::recorded::program(&m, &key, cfg.seq, &[], None);
                infer::recorded::call_peak(&p, &p.sizes(cfg.batch, 1)) as f64
            }
            Ok(_) => infer::closed_form_verdict(&m, &g, &cfg).tensor_bytes,
            Err(_) => e.tensor_bytes,
        };
        let error = planned / c["peak_bytes"].as_f64().unwrap() - 1.0;
        rows.push((label, c["split"].as_str().unwrap().to_string(), error));
    }
    let measured = cases().iter().filter(|c| c["mode"] == "infer").count();
    assert!(
        rows.len() == measured && measured >= 153,
        "every inference forward is compared: {} of {measured}",
        rows.len()
    );
    let mut worst: Vec<&InferRow> = rows.iter().collect();
    worst.sort_by(|a, b| b.2.abs().partial_cmp(&a.2.abs()).unwrap());
    for (label, split, error) in worst.iter().take(20) {
        eprintln!("{label:<40} {split:<6} peak {:+6.2}%", error * 100.0);
    }
    for split in ["tuning", "check"] {
        let part: Vec<_> = rows.iter().filter(|r| r.1 == split).collect();
        let ok = part.iter().filter(|r| r.2.abs() <= PEAK_TOLERANCE).count();
        eprintln!("inference {split}: {ok} of {} within ±3%", part.len());
    }
    if std::env::var_os("GROUND_TRUTH_TABLE").is_some() {
        print_inference_table(&rows);
    }
    let outside: Vec<_> = rows.iter().filter(|r| r.2.abs() > PEAK_TOLERANCE).collect();
    assert!(outside.is_empty(), "inference forwards outside ±3%: {outside:?}");
}

/// One inference forward: its label, split and error.
type InferRow = (String, String, f64);

/// Markdown for docs/VALIDATION.md: the inference forwards by family and precision.
fn print_inference_table(rows: &[InferRow]) {
    let mut groups: std::collections::BTreeMap<(String, String), Vec<&InferRow>> = Default::default();
    for r in rows {
        let mut words = r.0.split_whitespace();
        let family = words.next().unwrap().split('/').next().unwrap().to_string();
        groups.entry((family, words.next().unwrap().to_string())).or_default().push(r);
    }
    println!("| family | weights | forwards (tuning + check) | within ±3% | median \\|error\\| | worst |");
    println!("|---|---|---:|---:|---:|---:|");
    for ((family, precision), rs) in &groups {
        let mut errs: Vec<f64> = rs.iter().map(|r| r.2.abs()).collect();
        errs.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let worst = rs.iter().map(|r| r.2).fold(0.0f64, |a, e| if e.abs() > a.abs() { e } else { a });
        let tuning = rs.iter().filter(|r| r.1 == "tuning").count();
        println!(
            "| {family} | {precision} | {} ({tuning} + {}) | {} | {:.2}% | {:+.2}% |",
            rs.len(),
            rs.len() - tuning,
            rs.iter().filter(|r| r.2.abs() <= PEAK_TOLERANCE).count(),
            errs[errs.len() / 2] * 100.0,
            worst * 100.0
        );
    }
}
