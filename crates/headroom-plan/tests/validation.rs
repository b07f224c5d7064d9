//! The planner against published measurements and formulas
//! (research/estimation.md §1–§5, §8), each with a tolerance stated per
//! metric before the comparison:
//!
//! - closed-form figures (model states, per-layer activations, weights
//!   loaded): 1%, or the published figure's rounding where it is coarser;
//! - estimator outputs that count the same terms: 15% (their units and
//!   rounding of a "largest layer" differ);
//! - component sizes a paper reports without saying what they include: 15%;
//! - "does it fit": the plan must agree;
//! - the largest context that fits, as published: the plan's peak at that
//!   context within 15% of the card's memory (a few GiB of error in fixed
//!   terms would move the boundary by thousands of tokens);
//! - step time and MFU: 15% (the planner issue's goal for published step
//!   times, set before these rows were computed with the kernel model);
//! - a whole job's peak memory as its framework logs it (torchtitan's
//!   `max_reserved`: every tensor and the caching allocator's slack, no CUDA
//!   context): 15%, against the plan's `reserved_bytes`; torchtitan's FSDP2 runs,
//!   planned from FSDP2's and torchtitan's code (`builders::fsdp2`): 10%, the goal issue 34
//!   set for them before their program was written;
//! - a serving engine's start-up figures as it logs them (vLLM's profile peak
//!   and KV cache): 15%, as every other term that is not a closed form.
//!
//! Rows whose sources leave out an input the plan needs, or count a
//! different thing, are listed as indicative, with the reason. Rows that
//! miss are counted and shown as failures; `KNOWN_FAILURES` names them.
//!
//! The table in docs/VALIDATION.md is this test's output; regenerate it with
//! `HEADROOM_REGENERATE=1 cargo test -p headroom-plan --test validation`.

use headroom_plan::bnb::{Bnb, ComputeDtype, QuantType};
use headroom_plan::deepspeed;
use headroom_plan::engine::Engine;
use headroom_plan::estimate::Estimate;
use headroom_plan::gpu::{gpu, GpuSpec};
use headroom_plan::infer::{self, InferConfig, Runtime, WeightFormat};
use headroom_plan::job::{
    Attention, BaseWeights, Checkpointing, Finetune, Framework, LoraTargets, Offload, Optimizer, Precision, TrainConfig,
};
use headroom_plan::model::{preset, Family, Model};
use headroom_plan::parallel::{Parallelism, StageOutputs};
use headroom_plan::placement::model_states;
use headroom_plan::sglang::Sglang;
#[path = "support/plan.rs"]
mod plan;
use plan::estimate;
use std::path::PathBuf;

const GIB: f64 = (1u64 << 30) as f64;

/// The classes of row, each with its tolerance, declared before any comparison.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    /// A closed-form figure (model states, one layer's activations, weights loaded): 1%, or
    /// the rounding of the figure as published where that is coarser ("1.9 GB" is 1.85–1.95).
    ClosedForm,
    /// An estimator's output that counts the same terms: 15%.
    Estimator,
    /// A component size a paper reports without saying what it includes: 15%.
    Component,
    /// The largest context that fits, as published: the plan's peak there within 15% of the card.
    Boundary,
    /// Step time and MFU: 15% (the planner issue's goal).
    Time,
    /// A whole job's peak reserved memory as its framework logs it: 15%.
    JobPeak,
    /// torchtitan's peak reserved memory, planned from FSDP2's and torchtitan's code: 10%
    /// (issue 34's goal, declared before the program was written).
    Fsdp2Peak,
    /// A serving engine's start-up figures as it logs them (vLLM's profile peak and KV
    /// cache): 15%, as every term that is not a closed form.
    EngineLog,
}

impl Class {
    fn tolerance(self, published: &str) -> f64 {
        match self {
            Class::ClosedForm => {
                let decimals = published.split_once('.').map_or(0, |(_, d)| d.len()) as i32;
                let value: f64 = published.parse().expect("a published figure is a number");
                (0.5 * 10f64.powi(-decimals) / value).max(0.01)
            }
            Class::Estimator | Class::Component | Class::Boundary | Class::JobPeak | Class::EngineLog => 0.15,
            Class::Time => 0.15,
            Class::Fsdp2Peak => 0.10,
        }
    }
}

enum Check {
    /// |predicted / published − 1| within the class's tolerance.
    Within(Class),
    /// Published "fits" or "OOM" (true = fits): the plan must agree.
    Fits(bool),
    /// Not held to a tolerance: the source counts a different thing, said how.
    Indicative(&'static str),
}

/// Rows whose published figures the plan's coefficients were set against (the loss's logits
/// copies against Unsloth's boundaries, TP overlap against Megatron-Core's MFU); the others
/// were not looked at while choosing any coefficient.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    Tuning,
    Check,
}

/// The rows that miss their class's tolerance today, by setup, and why. The test fails if any
/// other row misses, or if one of these comes within its tolerance (then remove it here).
const KNOWN_FAILURES: &[(&str, &str)] = &[
    (
        "Qwen3-235B-A22B-FP8, TP 4, H100, vllm serve defaults",
        "vLLM's start-up took 2.0 GiB more than the plan counts on this mixture of experts (the same \
         weights under SGLang agree within 2%); the launch added LMCache's KV connector, and the plan's \
         profile run holds only fused_moe's three caches for the experts: what else is not known yet",
    ),
    (
        "530B, TP 8 × PP 35 × DP 8 on 2240 A100-40GB, batch 1920",
        "MT-NLG ran DeepSpeed's pipeline engine over Megatron's layers; the same model under Megatron's \
         own schedule (Narayanan Table 2) reached 1.3x its rate per GPU, and the plan, given one layout, \
         times both alike",
    ),
    (
        "530B, TP 8 × PP 35 × DP 10 on 2800 A100-40GB, batch 1920",
        "MT-NLG ran DeepSpeed's pipeline engine over Megatron's layers; the same model under Megatron's \
         own schedule (Narayanan Table 2) reached 1.3x its rate per GPU, and the plan, given one layout, \
         times both alike",
    ),
    (
        "530B, TP 8 × PP 35 × DP 12 on 3360 A100-40GB, batch 1920",
        "MT-NLG ran DeepSpeed's pipeline engine over Megatron's layers; the same model under Megatron's \
         own schedule (Narayanan Table 2) reached 1.3x its rate per GPU, and the plan, given one layout, \
         times both alike",
    ),
    (
        "16B, TP 4 × PP 1 × DP 48, batch 192, TP overlap",
        "Megatron-Core's MFU peaks at this width (49%); the plan's kernels give 41-42% from 1.7B to 32B \
         alike, and what lifts this run above its neighbours is not in it",
    ),
    (
        "T0_3B LoRA, ZeRO-3 offload, 1 A100 80GB, 8 × 64 tokens into a decoder of 4",
        "DeepSpeed's builder plans T5 in closed form, whose block under LoRA of the query and value \
         projections holds about half of what T5 v1.1's fp32 eager block keeps (its CPU step at T0-3B's \
         widths, docs/VALIDATION.md); the rows met ±15% while encoded with a decoder of 64 tokens that \
         the script never ran",
    ),
    (
        "mt0-xxl LoRA, ZeRO-3 offload, 1 A100 80GB, 8 × 64 tokens into a decoder of 4",
        "DeepSpeed's builder plans T5 in closed form, whose block under LoRA of the query and value \
         projections holds about half of what T5 v1.1's fp32 eager block keeps (its CPU step at T0-3B's \
         widths, docs/VALIDATION.md); the rows met ±15% while encoded with a decoder of 64 tokens that \
         the script never ran",
    ),
    (
        "Llama-3-8B, FSDP over 64 A100s, 1 × 8192",
        "FSDP's gathers and reduce-scatters across 8 nodes are taken as hidden under the compute they \
         overlap; the published MFU says a share of them is not",
    ),
];

struct Row {
    source: &'static str,
    setup: String,
    metric: &'static str,
    published: String,
    predicted: String,
    /// The published figure as the source writes it (its digits set a closed form's tolerance).
    published_text: String,
    error: Option<f64>,
    check: Check,
    used: Use,
}

impl Row {
    fn tolerance(&self) -> Option<f64> {
        match self.check {
            Check::Within(class) => Some(class.tolerance(&self.published_text)),
            _ => None,
        }
    }

    /// `None` for indicative rows.
    fn passes(&self) -> Option<bool> {
        match self.check {
            Check::Within(_) => Some(self.error.zip(self.tolerance()).is_some_and(|(e, t)| e.abs() <= t)),
            Check::Fits(want) => Some(self.predicted == if want { "fits" } else { "OOM" }),
            Check::Indicative(_) => None,
        }
    }

    fn markdown(&self) -> String {
        let tol = match self.check {
            Check::Within(_) => format!("±{:.1}%", self.tolerance().unwrap_or(0.0) * 100.0),
            Check::Fits(_) => "agree".to_string(),
            Check::Indicative(why) => format!("indicative: {why}"),
        };
        let verdict = match self.passes() {
            Some(true) => "pass".to_string(),
            Some(false) => match KNOWN_FAILURES.iter().find(|(setup, _)| *setup == self.setup) {
                Some((_, why)) => format!("**FAIL**: {why}"),
                None => "**FAIL**".to_string(),
            },
            None => "–".to_string(),
        };
        let used = match self.used {
            Use::Tuning => "tuning",
            Use::Check => "check",
        };
        let err = self.error.map_or("–".to_string(), |e| format!("{:+.1}%", e * 100.0));
        format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            self.source, self.setup, self.metric, used, self.published, self.predicted, err, tol, verdict
        )
    }
}

fn number(
    source: &'static str,
    setup: impl Into<String>,
    metric: &'static str,
    published: &str,
    predicted: f64,
    unit: &str,
    check: Check,
) -> Row {
    let value: f64 = published.parse().expect("a published figure is a number");
    let digits = if value < 10.0 { 2 } else { 1 };
    Row {
        source,
        setup: setup.into(),
        metric,
        published: format!("{published} {unit}"),
        predicted: format!("{predicted:.digits$} {unit}"),
        published_text: published.to_string(),
        error: Some(predicted / value - 1.0),
        check,
        used: Use::Check,
    }
}

/// Marks a row as one the coefficients were set against.
fn tuning(mut row: Row) -> Row {
    row.used = Use::Tuning;
    row
}

fn fits(source: &'static str, setup: impl Into<String>, published_fits: bool, e_fits: bool) -> Row {
    Row {
        source,
        setup: setup.into(),
        metric: "fits on the GPU",
        published: if published_fits { "fits" } else { "OOM" }.into(),
        predicted: if e_fits { "fits" } else { "OOM" }.into(),
        published_text: String::new(),
        error: None,
        check: Check::Fits(published_fits),
        used: Use::Check,
    }
}

fn states(e: &Estimate) -> f64 {
    e.memory.breakdown.weights + e.memory.breakdown.gradients + e.memory.breakdown.optimizer
}

/// The published rows come from Megatron-LM and DeepSpeed papers and estimators, which count
/// every term at once with Korthikanti's activations: the Megatron model. (transformers' own
/// code is checked against measured steps: tests/ground_truth.rs.)
fn mixed(micro_batch: u64, seq: u64) -> TrainConfig {
    TrainConfig {
        attention: Attention::Flash,
        framework: Framework::Megatron,
        ..TrainConfig::new(micro_batch, seq, Precision::Mixed, Optimizer::AdamW)
    }
}

/// Mixed precision as DeepSpeed's ZeRO runs it (under transformers): 16-bit gradients.
fn deepspeed(micro_batch: u64, seq: u64) -> TrainConfig {
    TrainConfig { framework: Framework::HuggingFace, ..mixed(micro_batch, seq) }
}

fn model_state_rows(rows: &mut Vec<Row>) {
    // ZeRO Fig. 1: Ψ = 7.5B, K = 12, N_d = 64.
    for (stage, published) in [(0u8, "120"), (1, "31.4"), (2, "16.6"), (3, "1.9")] {
        let cfg = TrainConfig { parallel: Parallelism::data_parallel(64, stage), ..deepspeed(1, 1024) };
        let states = model_states(7_500_000_000, 4096, &cfg);
        rows.push(number(
            "ZeRO Fig. 1",
            format!("7.5B, 64 GPUs, ZeRO-{stage}"),
            "model states per GPU",
            published,
            states.total() / 1e9,
            "GB",
            Check::Within(Class::ClosedForm),
        ));
    }
    // Megatron-LM's README ("Distributed optimizer"): bytes a parameter with bf16 weights
    // and fp32 gradients, 18 without the distributed optimizer, 6 + 12/d with it (d = 8).
    for (zero, published, label) in [(0u8, "18", "without"), (1, "7.5", "with")] {
        let cfg = TrainConfig { parallel: Parallelism::data_parallel(8, zero), ..mixed(1, 2048) };
        let states = model_states(1_000_000_000, 4096, &cfg);
        rows.push(number(
            "Megatron-LM README",
            format!("1B, bf16 weights, fp32 gradients, 8 GPUs, {label} the distributed optimizer"),
            "model states per GPU",
            published,
            states.total() / 1e9,
            "GB",
            Check::Within(Class::ClosedForm),
        ));
    }
    // DeepSpeed's estimator, t5-3b on one node of 8 GPUs (GiB).
    let t5 = preset("t5-3b").unwrap();
    let a100 = gpu("a100-80gb").unwrap();
    let ds = |zero: u8, offload: Offload| {
        estimate(&t5, &a100, &TrainConfig { parallel: Parallelism::data_parallel(8, zero), offload, ..mixed(1, 512) })
    };
    // What the estimator counts: model states and ZeRO-3's gathered unit; not the cuBLAS workspace
    // or ZeRO-Offload's gradient bucket (5e8 16-bit values, or the gradients if fewer).
    let bucket = |offload: bool| if offload { (2.0 * t5.params() as f64).min(1e9) } else { 0.0 };
    let gathered = |e: &Estimate, offload: bool| {
        states(e) + e.memory.breakdown.temporary - 4.0 * (1 << 20) as f64 - bucket(offload)
    };
    let z2off = ds(2, Offload::Optimizer);
    rows.push(number(
        "DeepSpeed estimator",
        "t5-3b, 8 GPUs, ZeRO-2, optimizer offload",
        "model states per GPU",
        "5.31",
        states(&z2off) / GIB,
        "GiB",
        Check::Within(Class::ClosedForm),
    ));
    rows.push(number(
        "DeepSpeed estimator",
        "t5-3b, 8 GPUs, ZeRO-3, optimizer offload",
        "model states + gathered unit",
        "0.79",
        gathered(&ds(3, Offload::Optimizer), true) / GIB,
        "GiB",
        Check::Within(Class::Estimator),
    ));
    rows.push(number(
        "DeepSpeed estimator",
        "t5-3b, 8 GPUs, ZeRO-3",
        "model states + gathered unit",
        "6.10",
        gathered(&ds(3, Offload::None), false) / GIB,
        "GiB",
        Check::Within(Class::Estimator),
    ));
    rows.push(number(
        "DeepSpeed estimator",
        "t5-3b, 8 GPUs, ZeRO-2",
        "model states per GPU",
        "15.93",
        states(&ds(2, Offload::None)) / GIB,
        "GiB",
        Check::Indicative("the estimator budgets 4Ψ for unpartitioned 16-bit weights and gradients; ZeRO-2 keeps 2Ψ (ZeRO Table 1 holds the plan to the paper)"),
    ));
    rows.push(number(
        "DeepSpeed estimator",
        "t5-3b, 8 GPUs, ZeRO-3, optimizer and parameter offload",
        "gathered unit",
        "0.12",
        gathered(&ds(3, Offload::OptimizerAndParams), true) / GIB,
        "GiB",
        Check::Indicative("DeepSpeed counts the largest module (the 32.9M embedding); the plan gathers a whole block (58.7M), as FSDP's auto-wrap does"),
    ));
    // The LoRA paper §4.2: GPT-3 175B with r = 4 adapters on Wq and Wv needs 350 GB.
    let gpt3 = Model::gpt("gpt3-175b", 12288, 96, 96, 51200, 2048);
    let lora = TrainConfig {
        finetune: Finetune::Lora { rank: 4, targets: LoraTargets::QueryValue, base: BaseWeights::Native },
        ..mixed(1, 2048)
    };
    let e = estimate(&gpt3, &GpuSpec { memory_bytes: 1 << 50, ..a100 }, &lora);
    rows.push(number(
        "LoRA §4.2",
        "GPT-3 175B, LoRA r=4 on Wq, Wv",
        "model states, all GPUs",
        "350",
        states(&e) / 1e9,
        "GB",
        Check::Within(Class::Component),
    ));
    // QLoRA §2: LLaMA-7B's 4-bit base takes 5,048 MB (same shapes as Llama-2-7B).
    let llama7 = preset("llama-2-7b").unwrap();
    let q = TrainConfig {
        finetune: Finetune::Lora { rank: 64, targets: LoraTargets::All, base: BaseWeights::Nf4 },
        ..mixed(1, 512)
    };
    let e = estimate(&llama7, &a100, &q);
    let adapters = 2.0 * e.memory.trainable_params as f64;
    rows.push(number(
        "QLoRA §2",
        "LLaMA-7B, NF4 base (embeddings and norms fp32)",
        "frozen base",
        "5048",
        (e.memory.breakdown.weights - adapters) / 1e6,
        "MB",
        Check::Within(Class::Component),
    ));
    // The accelerate estimator doc: bert-base-cased loaded in fp32 measured 413.68 MB (MiB).
    let bert = preset("bert-base-cased").unwrap();
    rows.push(number(
        "accelerate doc (#41)",
        "bert-base-cased, fp32 load",
        "weights",
        "413.68",
        bert.params() as f64 * 4.0 / (1u64 << 20) as f64,
        "MiB",
        Check::Within(Class::ClosedForm),
    ));
    // vllm #11251: Llama-3-8B at TP 2 loads 7.51 GiB of weights per GPU.
    let l3 = preset("llama-3-8b").unwrap();
    let a100 = gpu("a100-40gb").unwrap();
    let cfg = InferConfig {
        runtime: Runtime::Vllm(Engine::vllm_defaults(&a100)),
        batch: 1,
        seq: 4096,
        weights: WeightFormat::Bf16,
        kv_bytes: 2.0,
        tensor: 2,
        quantize: None,
    };
    let e = infer::estimate(&l3, &a100, &cfg);
    rows.push(number(
        "vllm #11251",
        "Llama-3-8B, TP 2",
        "weights per GPU",
        "7.51",
        e.weights / GIB,
        "GiB",
        Check::Within(Class::ClosedForm),
    ));
}

fn activation_rows(rows: &mut Vec<Row>) {
    let big = GpuSpec { memory_bytes: 1 << 50, ..gpu("a100-80gb").unwrap() };
    let per_layer =
        |m: &Model, cfg: &TrainConfig| estimate(m, &big, cfg).memory.breakdown.activations / m.layers as f64;
    let gpt3 = Model::gpt("gpt3-175b", 12288, 96, 96, 51200, 2048);
    let eager = TrainConfig { attention: Attention::Eager, ..mixed(1, 2048) };
    let tp8 = |sp: bool, c: Checkpointing| TrainConfig {
        parallel: Parallelism { tensor: 8, sequence_parallel: sp, ..Parallelism::default() },
        checkpointing: c,
        ..eager
    };
    for (setup, published, cfg) in [
        ("GPT-3 175B, b=1, no parallelism", "2.87", eager),
        ("GPT-3 175B, TP 8 + SP", "0.359", tp8(true, Checkpointing::None)),
    ] {
        rows.push(number(
            "Korthikanti Table 2",
            setup,
            "activations per layer",
            published,
            per_layer(&gpt3, &cfg) / 1e9,
            "GB",
            Check::Within(Class::ClosedForm),
        ));
    }
    // Selective recomputation rebuilds one layer's s² tensors at a time: the plan holds 5as²b/t
    // on top of the table's 34·sbh/t per layer, and the table leaves it out.
    let (a, s, t) = (gpt3.heads as f64, 2048.0, 8.0);
    let recomputed_scores = 5.0 * a * s * s / t;
    rows.push(number(
        "Korthikanti Table 2",
        "GPT-3 175B, TP 8 + SP + selective",
        "activations per layer (less one layer's recomputed scores, 5as²b/t, which the table omits)",
        "0.107",
        (per_layer(&gpt3, &tp8(true, Checkpointing::Selective)) - recomputed_scores / gpt3.layers as f64) / 1e9,
        "GB",
        Check::Within(Class::ClosedForm),
    ));
    let m22 = Model::gpt("22b", 6144, 48, 64, 51200, 2048);
    let b4 = |c: TrainConfig| TrainConfig { micro_batch: 4, ..c };
    for (setup, published, cfg) in [
        ("22B, b=4, no parallelism", "7.08", b4(eager)),
        ("22B, b=4, TP 8 without SP", "1.33", b4(tp8(false, Checkpointing::None))),
    ] {
        rows.push(number(
            "Korthikanti Table 2",
            setup,
            "activations per layer",
            published,
            per_layer(&m22, &cfg) / 1e9,
            "GB",
            Check::Within(Class::ClosedForm),
        ));
    }
    // ZeRO §3.2: GPT-2 1.5B, b = 32, s = 1024: ~60 GB of activations, ~8 GB with checkpointing.
    let xl = preset("gpt2-xl").unwrap();
    let zero = |c: Checkpointing| estimate(&xl, &big, &TrainConfig { checkpointing: c, ..mixed(32, 1024) });
    rows.push(number(
        "ZeRO §3.2",
        "GPT-2 1.5B, 32 × 1024, full checkpointing",
        "activations",
        "8",
        zero(Checkpointing::Full).memory.breakdown.activations / 1e9,
        "GB",
        Check::Within(Class::Component),
    ));
    rows.push(number(
        "ZeRO §3.2",
        "GPT-2 1.5B, 32 × 1024, flash, no checkpointing",
        "activations",
        "60",
        zero(Checkpointing::None).memory.breakdown.activations / 1e9,
        "GB",
        Check::Indicative("ZeRO's footnote counts 12 values per b·s·h·L (24 bytes); Korthikanti's layer, which the plan follows, keeps 34"),
    ));
}

fn fit_rows(rows: &mut Vec<Row>) {
    let a100 = gpu("a100-80gb").unwrap();
    // The peft README (A100 80GB, fp32 weights as its examples load them).
    let fp32 = |m: &Model, finetune| {
        let cfg = TrainConfig { finetune, ..TrainConfig::new(1, 64, Precision::Fp32, Optimizer::AdamW) };
        estimate(m, &a100, &cfg).verdict.fits
    };
    let lora = Finetune::Lora { rank: 8, targets: LoraTargets::QueryValue, base: BaseWeights::Native };
    let mt0 = preset("mt0-xxl").unwrap();
    let bloom = preset("bloom-7b1").unwrap();
    rows.push(fits("peft README (#15)", "mt0-xxl full fine-tuning, A100 80GB", false, fp32(&mt0, Finetune::Full)));
    rows.push(fits("peft README (#16)", "mt0-xxl LoRA, A100 80GB", true, fp32(&mt0, lora)));
    rows.push(fits("peft README (#18)", "bloomz-7b1 full fine-tuning, A100 80GB", false, fp32(&bloom, Finetune::Full)));
    rows.push(fits("peft README (#18)", "bloomz-7b1 LoRA, A100 80GB", true, fp32(&bloom, lora)));
    // Unsloth's README: the longest context Hugging Face + FlashAttention 2 fits for QLoRA r = 32 on
    // every linear layer, batch 1, with gradient checkpointing.
    let qlora = |seq| TrainConfig {
        finetune: Finetune::Lora { rank: 32, targets: LoraTargets::All, base: BaseWeights::Nf4 },
        checkpointing: Checkpointing::Full,
        ..mixed(1, seq)
    };
    let card = |gib: u64| GpuSpec { memory_bytes: gib << 30, ..a100 };
    let l31 = preset("llama-3.1-8b").unwrap();
    let l70 = Model { name: "llama-3.3-70b".into(), max_position: 131072, ..preset("llama-3-70b").unwrap() };
    rows.push(fits(
        "Unsloth README (#32)",
        "Llama 3.1 8B QLoRA, 8 GB, 256 tokens",
        false,
        estimate(&l31, &card(8), &qlora(256)).verdict.fits,
    ));
    rows.push(fits(
        "Unsloth README (#33)",
        "Llama 3.3 70B QLoRA, 48 GB, 256 tokens",
        false,
        estimate(&l70, &card(48), &qlora(256)).verdict.fits,
    ));
    for (m, gib, tokens) in [
        (&l31, 12u64, 932u64),
        (&l31, 16, 2551),
        (&l31, 24, 5789),
        (&l31, 40, 12264),
        (&l31, 48, 15502),
        (&l31, 80, 28454),
        (&l70, 80, 6916),
    ] {
        let e = estimate(m, &card(gib), &qlora(tokens));
        rows.push(tuning(number(
            if m.name == "llama-3.1-8b" { "Unsloth README (#32)" } else { "Unsloth README (#33)" },
            format!(
                "{} QLoRA, {tokens} tokens (the longest that fits {gib} GB)",
                if m.name == "llama-3.1-8b" { "Llama 3.1 8B" } else { "Llama 3.3 70B" }
            ),
            "peak at the boundary vs the card",
            &gib.to_string(),
            e.memory.per_gpu_bytes / GIB,
            "GiB",
            Check::Within(Class::Boundary),
        )));
    }
}

/// peft's LoRA runs on one A100 80GB (its README's table, and its DeepSpeed example's log),
/// fp32 weights, batches of 8 tweets; the README gives no sequence length: 64 tokens is
/// taken, the length that puts the plain runs (tuning rows for it) near their figures.
/// T0_3B's and mt0-xxl's runs, plain and under ZeRO-3, train a decoder of the script's
/// `target_max_length` ([`PEFT_TARGET_TOKENS`]; docs/VALIDATION.md, "A decoder length of its
/// own").
fn deepspeed_rows(rows: &mut Vec<Row>) {
    let a100 = gpu("a100-80gb").unwrap();
    let lora = Finetune::Lora { rank: 8, targets: LoraTargets::QueryValue, base: BaseWeights::Native };
    let cfg = |zero3: bool| TrainConfig {
        finetune: lora,
        parallel: Parallelism::data_parallel(1, if zero3 { 3 } else { 0 }),
        offload: if zero3 { Offload::OptimizerAndParams } else { Offload::None },
        ..TrainConfig::new(8, 64, Precision::Fp32, Optimizer::AdamW)
    };
    // What is on the GPU before the first step (the example's log): the gradient bucket and
    // the tensors ZeRO-3 never partitions, all else on the host.
    let t0 = preset("t0-3b").unwrap();
    let ds = deepspeed::buffers(&t0, &cfg(true), 4.0);
    rows.push(number(
        "peft DeepSpeed example log",
        "T0_3B LoRA, ZeRO-3 offload, 1 A100 80GB",
        "allocated before training",
        "1916",
        (ds.reduce_bucket + ds.persistent) / (1u64 << 20) as f64,
        "MiB",
        Check::Within(Class::ClosedForm),
    ));
    for (model, plain, offloaded) in [
        ("t0-3b", "14.4", ("9404", 1u64 << 20, "MiB")),
        ("mt0-xxl", "56", ("22", 1_000_000_000, "GB")),
        ("bloom-7b1", "32", ("18.1", 1_000_000_000, "GB")),
    ] {
        let m = preset(model).unwrap();
        let name = match model {
            "t0-3b" => "T0_3B",
            "bloom-7b1" => "bloomz-7b1",
            other => other,
        };
        let seq2seq = m.family == Family::T5;
        let target_seq = seq2seq.then_some(PEFT_TARGET_TOKENS);
        // The README's runs predate T5's SDPA path in transformers (transformers#47014): its
        // attention was its own, eager.
        let attention = if seq2seq { Attention::Eager } else { cfg(false).attention };
        rows.push(tuning(number(
            "peft README",
            match target_seq {
                Some(t) => format!("{name} LoRA, 1 A100 80GB, 8 × 64 tokens into a decoder of {t}"),
                None => format!("{name} LoRA, 1 A100 80GB, 8 × 64 tokens"),
            },
            "peak allocated",
            plain,
            estimate(&m, &a100, &TrainConfig { target_seq, attention, ..cfg(false) }).memory.allocated_bytes / 1e9,
            "GB",
            Check::Within(Class::JobPeak),
        )));
        let (published, unit, unit_name) = offloaded;
        rows.push(number(
            if model == "t0-3b" { "peft DeepSpeed example log" } else { "peft README" },
            match target_seq {
                Some(t) => format!("{name} LoRA, ZeRO-3 offload, 1 A100 80GB, 8 × 64 tokens into a decoder of {t}"),
                None => format!("{name} LoRA, ZeRO-3 offload, 1 A100 80GB, 8 × 64 tokens"),
            },
            "peak allocated",
            published,
            estimate(&m, &a100, &TrainConfig { target_seq, ..cfg(true) }).memory.allocated_bytes / unit as f64,
            unit_name,
            Check::Within(Class::JobPeak),
        ));
    }
}

/// The decoder length of peft's sequence-to-sequence LoRA example
/// (`peft_lora_seq2seq_accelerate_ds_zero3_offload.py`): its labels, padded to
/// `target_max_length`, the longest of RAFT twitter_complaints' class names (`Unlabeled`,
/// `complaint`, `no complaint`) in tokens with the end-of-sequence token. T0's tokenizer is
/// not at hand offline: `Unlabeled` is taken as three SentencePiece pieces (`▁Un`, `label`,
/// `ed`), so four tokens (docs/VALIDATION.md gives the rows at three and five too).
const PEFT_TARGET_TOKENS: u64 = 4;

/// transformers' "Optimizing LLMs for Speed and Memory" guide: bigcode/octocoder (StarCoder's
/// 15.5B GPTBigCode) on one A100 40GB through `pipeline("text-generation")`, a 20-odd-token
/// prompt and `max_new_tokens=60`, `torch.cuda.max_memory_allocated()` after it (printed
/// / 1024³). Loaded three ways: `torch_dtype=torch.bfloat16`; `load_in_8bit=True` (LLM.int8(),
/// the rest in fp16, as transformers then loaded it); `load_in_4bit=True` (its defaults: fp4,
/// no double quantization, fp32 compute dtype). Check rows: nothing was set against them.
fn bnb_rows(rows: &mut Vec<Row>) {
    let a100 = gpu("a100-40gb").unwrap();
    let octocoder = Model::from_hf_config(include_str!("../../../data/models/octocoder.json"), "octocoder").unwrap();
    let fp4 = Bnb::FourBit { quant_type: QuantType::Fp4, double_quant: false, compute: ComputeDtype::Fp32 };
    for (setup, quantize, published) in [
        ("octocoder, bf16, A100 40GB, 80 tokens", None, "29.03"),
        ("octocoder, bitsandbytes int8, A100 40GB, 80 tokens", Some(Bnb::Int8), "15.22"),
        ("octocoder, bitsandbytes fp4 (fp32 compute), A100 40GB, 80 tokens", Some(fp4), "9.54"),
    ] {
        let cfg = InferConfig {
            runtime: Runtime::Transformers { attention: Attention::Sdpa, all_logits: false, new_tokens: 1 },
            batch: 1,
            seq: 80,
            weights: WeightFormat::Bf16,
            kv_bytes: 2.0,
            tensor: 1,
            quantize,
        };
        infer::check(&octocoder, &cfg).unwrap();
        let e = infer::estimate(&octocoder, &a100, &cfg);
        rows.push(number(
            "transformers LLM optimization guide",
            setup,
            "peak allocated",
            published,
            e.allocated_bytes / GIB,
            "GiB",
            Check::Within(Class::JobPeak),
        ));
    }
}

fn time_rows(rows: &mut Vec<Row>) {
    korthikanti_layer_rows(rows);
    megatron_2022_rows(rows);
    throughput_rows(rows);
    megatron_core_rows(rows);
    torchtitan_mfu_rows(rows);
}

/// Korthikanti et al. 2022 Table 4: one layer's forward and backward.
fn korthikanti_layer_rows(rows: &mut Vec<Row>) {
    let a100 = gpu("a100-80gb").unwrap();
    // Korthikanti Table 4: one layer of the 22B model (TP 8, micro-batch 4, s = 2048) on
    // A100s, its forward and backward as Megatron-LM of 2022 ran them (scores materialised).
    // The rows the kernels' sustained efficiency is set against.
    let m22 = Model::gpt("22B", 6144, 48, 64, 51200, 2048);
    let layer = |sp: bool, ckpt: Checkpointing| {
        let cfg = TrainConfig {
            checkpointing: ckpt,
            attention: Attention::Eager,
            parallel: Parallelism { tensor: 8, sequence_parallel: sp, ..Parallelism::default() },
            ..mixed(4, 2048)
        };
        estimate(&m22, &a100, &cfg).time.as_ref().unwrap().layer_time_s
    };
    let base = layer(false, Checkpointing::None);
    for (setup, metric, published, predicted) in [
        ("22B layer, TP 8, no recomputation", "forward time", "7.7", base[0]),
        ("22B layer, TP 8, no recomputation", "backward time", "11.9", base[1]),
        ("22B layer, TP 8 + SP", "forward + backward time", "19.0", layer(true, Checkpointing::None).iter().sum()),
        (
            "22B layer, TP 8, full recomputation",
            "forward + backward time",
            "27.2",
            layer(false, Checkpointing::Full).iter().sum(),
        ),
        (
            "22B layer, TP 8, selective recomputation",
            "forward + backward time",
            "20.9",
            layer(false, Checkpointing::Selective).iter().sum(),
        ),
        (
            "22B layer, TP 8 + SP, selective recomputation",
            "forward + backward time",
            "20.3",
            layer(true, Checkpointing::Selective).iter().sum(),
        ),
    ] {
        rows.push(tuning(number(
            "Korthikanti Table 4",
            setup,
            metric,
            published,
            predicted * 1e3,
            "ms",
            Check::Within(Class::Time),
        )));
    }
}

/// Korthikanti et al. 2022 Table 5: whole iterations of Megatron-LM's largest runs.
fn megatron_2022_rows(rows: &mut Vec<Row>) {
    let a100 = gpu("a100-80gb").unwrap();
    // Korthikanti Table 5: A100-80GB, s = 2048, V = 51,200, no data parallelism; iteration time.
    for (name, h, l, a, p, v, global, selective, full) in [
        ("22B", 6144u64, 48u64, 64u64, 1u64, 1u64, 4u64, "1.10", "1.42"),
        ("175B", 12288, 96, 96, 8, 3, 64, "13.75", "18.13"),
        ("530B", 20480, 105, 128, 35, 3, 280, "37.83", "49.05"),
        ("1T", 25600, 128, 160, 64, 1, 512, "71.49", "94.42"),
    ] {
        let m = Model::gpt(name, h, l, a, 51200, 2048);
        let micro = if name == "22B" { 4 } else { 1 };
        for (ckpt, published) in [(Checkpointing::Selective, selective), (Checkpointing::Full, full)] {
            // Megatron-LM of 2022: the scores materialised (its fused softmax), no flash kernel.
            let cfg = TrainConfig {
                accumulation: global / micro,
                checkpointing: ckpt,
                attention: Attention::Eager,
                parallel: Parallelism { tensor: 8, pipeline: p, virtual_stages: v, ..Parallelism::default() },
                ..mixed(micro, 2048)
            };
            let e = estimate(&m, &a100, &cfg);
            rows.push(number(
                "Korthikanti Table 5",
                format!(
                    "{name}, TP 8 × PP {p}{}, {} checkpointing",
                    if v > 1 { format!(" (interleaved, {v})") } else { String::new() },
                    if ckpt == Checkpointing::Full { "full" } else { "SP + selective" }
                ),
                "iteration time",
                published,
                e.time.as_ref().unwrap().step_time_s,
                "s",
                Check::Within(Class::Time),
            ));
        }
    }
}

/// Runs that published throughput per GPU, compared as iteration times.
fn throughput_rows(rows: &mut Vec<Row>) {
    // Runs that report throughput per GPU, on A100s, s = 2048, V = 51,200, micro-batch 1,
    // full recomputation, 1F1B without interleaving: Narayanan et al. 2021 Table 2 (PTD-P,
    // A100-80GB; TFLOP/s per GPU by their count of 96·B·s·L·h²·(1 + s/6h + V/16Lh)) and
    // MT-NLG (Smith et al. 2022 §2.4: A100-40GB, TFLOP/s per GPU by the same count).
    // Compared as iteration times: the count over the GPUs' published rate.
    for (source, name, h, l, a, p, gpus, batch, tflops, card) in [
        ("Narayanan Table 2", "175B", 12288u64, 96u64, 96u64, 12u64, 384u64, 1536u64, 153.0, "a100-80gb"),
        ("Narayanan Table 2", "175B", 12288, 96, 96, 12, 768, 1536, 149.0, "a100-80gb"),
        ("Narayanan Table 2", "175B", 12288, 96, 96, 12, 1536, 1536, 141.0, "a100-80gb"),
        ("Narayanan Table 2", "530B", 20480, 105, 128, 35, 560, 2240, 171.0, "a100-80gb"),
        ("Narayanan Table 2", "530B", 20480, 105, 128, 35, 1120, 2240, 167.0, "a100-80gb"),
        ("Narayanan Table 2", "530B", 20480, 105, 128, 35, 2240, 2240, 159.0, "a100-80gb"),
        ("MT-NLG", "530B", 20480, 105, 128, 35, 2240, 1920, 126.0, "a100-40gb"),
        ("MT-NLG", "530B", 20480, 105, 128, 35, 2800, 1920, 121.0, "a100-40gb"),
        ("MT-NLG", "530B", 20480, 105, 128, 35, 3360, 1920, 113.0, "a100-40gb"),
    ] {
        let m = Model::gpt(name, h, l, a, 51200, 2048);
        let data = gpus / (8 * p);
        let cfg = TrainConfig {
            accumulation: batch / data,
            checkpointing: Checkpointing::Full,
            attention: Attention::Eager,
            parallel: Parallelism { data, tensor: 8, pipeline: p, zero_stage: 0, ..Parallelism::default() },
            ..mixed(1, 2048)
        };
        let (hf, lf, sf, bf) = (h as f64, l as f64, 2048.0, batch as f64);
        let count = 96.0 * bf * sf * lf * hf * hf * (1.0 + sf / (6.0 * hf) + 51200.0 / (16.0 * lf * hf));
        let published = format!("{:.1}", count / (gpus as f64 * tflops * 1e12));
        let e = estimate(&m, &gpu(card).unwrap(), &cfg);
        rows.push(number(
            source,
            format!(
                "{name}, TP 8 × PP {p} × DP {data} on {gpus} {}, batch {batch}",
                if card == "a100-40gb" { "A100-40GB" } else { "A100s" }
            ),
            "iteration time",
            &published,
            e.time.as_ref().unwrap().step_time_s,
            "s",
            Check::Within(Class::Time),
        ));
    }
}

/// Megatron-Core's published MFU on H100s.
fn megatron_core_rows(rows: &mut Vec<Row>) {
    let h100 = gpu("h100-sxm").unwrap();
    // Megatron-Core on H100 (s = 4096, V = 131,072): MFU.
    for (name, a, h, l, t, p, gpus, batch, mfu) in [
        ("1.7B", 16u64, 2048u64, 24u64, 1u64, 1u64, 48u64, 192u64, "41"),
        ("7.1B", 32, 4096, 30, 2, 1, 96, 192, "47"),
        ("16B", 48, 6144, 32, 4, 1, 192, 192, "49"),
        ("32B", 56, 7168, 48, 8, 1, 384, 192, "46"),
        ("70B", 64, 8192, 84, 8, 2, 768, 384, "42"),
        ("177B", 96, 12288, 96, 8, 6, 2304, 1152, "44"),
    ] {
        let m = Model::gpt(name, h, l, a, 131072, 4096);
        let data = gpus / (t * p);
        let cfg = TrainConfig {
            accumulation: batch / data,
            checkpointing: Checkpointing::Selective,
            parallel: Parallelism {
                data,
                tensor: t,
                pipeline: p,
                zero_stage: 1,
                tp_comm_overlap: t > 1,
                ..Parallelism::default()
            },
            ..mixed(1, 4096)
        };
        let e = estimate(&m, &h100, &cfg);
        rows.push(tuning(number(
            "Megatron-Core, H100",
            format!("{name}, TP {t} × PP {p} × DP {data}, batch {batch}{}", if t > 1 { ", TP overlap" } else { "" }),
            "MFU",
            mfu,
            e.time.as_ref().unwrap().mfu * 100.0,
            "%",
            Check::Within(Class::Time),
        )));
    }
}

/// torchtitan's published MFU on A100s.
fn torchtitan_mfu_rows(rows: &mut Vec<Row>) {
    let a100 = gpu("a100-80gb").unwrap();
    // torchtitan: Llama-3-8B, FSDP on 64 A100-80GB, batch 1 × 8192, selective checkpointing: 57–58% MFU.
    let l3 = preset("llama-3-8b").unwrap();
    let cfg = TrainConfig {
        checkpointing: Checkpointing::Selective,
        parallel: Parallelism::data_parallel(64, 3),
        ..mixed(1, 8192)
    };
    let e = estimate(&l3, &a100, &cfg);
    rows.push(number(
        "torchtitan",
        "Llama-3-8B, FSDP over 64 A100s, 1 × 8192",
        "MFU",
        "57.5",
        e.time.as_ref().unwrap().mfu * 100.0,
        "%",
        Check::Within(Class::Time),
    ));
    // The same page: Llama-2-13B, 2 × 4096, without checkpointing and with torchtitan's
    // per-op selective checkpointing.
    let l2 = preset("llama-2-13b").unwrap();
    for (ckpt, label, published) in
        [(Checkpointing::None, "no checkpointing", "61.1"), (Checkpointing::PerOp, "per-op checkpointing", "54.1")]
    {
        let cfg = TrainConfig { checkpointing: ckpt, parallel: Parallelism::data_parallel(64, 3), ..mixed(2, 4096) };
        let e = estimate(&l2, &a100, &cfg);
        rows.push(number(
            "torchtitan",
            format!("Llama-2-13B, FSDP over 64 A100s, 2 × 4096, {label}"),
            "MFU",
            published,
            e.time.as_ref().unwrap().mfu * 100.0,
            "%",
            Check::Within(Class::Time),
        ));
    }
}

/// Llama 3.1 405B's config.json fields.
const LLAMA_405B: &str = r#"{"model_type": "llama", "hidden_size": 16384, "intermediate_size": 53248,
    "num_hidden_layers": 126, "num_attention_heads": 128, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "tie_word_embeddings": false}"#;

/// How a torchtitan row ran: torch.compile (its blocks, and from April 2025 its loss) and
/// torchao's float8 linears.
#[derive(Clone, Copy)]
struct Titan {
    compile: bool,
    compile_loss: bool,
    float8: bool,
}

const EAGER: Titan = Titan { compile: false, compile_loss: false, float8: false };
/// December 2024 (torchtitan 9dec370): `apply_compile` compiles each block; the loss is eager.
const BLOCKS: Titan = Titan { compile: true, compile_loss: false, float8: false };
const BLOCKS_FLOAT8: Titan = Titan { compile: true, compile_loss: false, float8: true };
/// June 2025 (torchtitan e7c0cae): `build_cross_entropy_loss` compiles the loss too.
const BLOCKS_LOSS_FLOAT8: Titan = Titan { compile: true, compile_loss: true, float8: true };

/// PyTorch 1963fc8 (December 2024), before #153383: every pipeline stage keeps each
/// micro-batch's output in `output_chunks` for the step.
const DEC_2024: StageOutputs = StageOutputs::EveryStage;

/// torchtitan's Llama 3.1 benchmarks (benchmarks/llama3_h100_202412_torchtitan.md, December 2024):
/// FSDP2 with bf16 parameters and fp32 reductions, sequence 8192 unless said, on 96 GB H100s;
/// "Memory" is the peak of `torch.cuda.max_memory_reserved()` over the GPUs. torch.compile's
/// blocks and loss and torchao's float8 (its fp8 all-gather) are planned; async TP's
/// symmetric-memory buffers and context parallelism's ring buffers are not, so runs with
/// either are indicative.
///
/// Chosen before the FSDP2 program's figures were computed: the 8-GPU FSDP run is a tuning
/// row (research/fsdp2-torchtitan-memory.md drew its per-rank model against it, and the
/// program follows that model), the 128-GPU run is check-only; both are held to 10%. Chosen
/// before the compiled program's figures were computed: the 8-GPU compile run is a tuning row
/// (its drop from the eager run was read while the compiled block was built), every other
/// compiled run is check-only, held to the same 10%.
fn torchtitan_rows(rows: &mut Vec<Row>) {
    let h100 = GpuSpec { memory_bytes: 96 << 30, ..gpu("h100-sxm").unwrap() };
    let l8 = preset("llama-3.1-8b").unwrap();
    let l70 = preset("llama-3-70b").unwrap();
    let l405 = Model::from_hf_config(LLAMA_405B, "llama-3.1-405b").unwrap();
    let async_tp = Check::Indicative("async TP's symmetric-memory buffers are not modeled");
    let pipelined = Check::Indicative("async TP is not modeled, and the runs' allocator settings are not published");
    let ring = Check::Indicative("context parallelism's ring-attention buffers are not modeled");
    let held = || Check::Within(Class::Fsdp2Peak);
    #[allow(clippy::too_many_arguments)]
    let mut row = |model: &Model,
                   setup: String,
                   par: Parallelism,
                   batch: u64,
                   acc: u64,
                   seq: u64,
                   ckpt,
                   how: Titan,
                   published,
                   check| {
        let cfg = TrainConfig {
            accumulation: acc,
            checkpointing: ckpt,
            parallel: par,
            attention: Attention::Flash,
            framework: Framework::Torchtitan,
            compile: how.compile,
            compile_loss: how.compile_loss,
            ..TrainConfig::new(batch, seq, if how.float8 { Precision::Fp8 } else { Precision::Mixed }, Optimizer::AdamW)
        };
        let e = estimate(model, &h100, &cfg);
        let r = number("torchtitan", setup, "peak reserved", published, e.memory.reserved_bytes / GIB, "GiB", check);
        rows.push(r);
    };
    for (gpus, t1) in [(8u64, ["82.4", "77.0", "76.8"]), (128, ["67.0", "62.0", "61.8"])] {
        for (k, (label, how)) in
            [("FSDP", EAGER), ("FSDP + compile", BLOCKS), ("FSDP + compile + float8", BLOCKS_FLOAT8)]
                .into_iter()
                .enumerate()
        {
            row(
                &l8,
                format!("Llama 3.1 8B, {label} over {gpus} GPUs, 2 × 8192, per-op checkpointing"),
                Parallelism::data_parallel(gpus, 3),
                2,
                1,
                8192,
                Checkpointing::PerOp,
                how,
                t1[k],
                held(),
            );
        }
    }
    for (cp, published) in [(1u64, "83.9"), (2, "84.2"), (4, "84.0"), (8, "84.5")] {
        row(
            &l8,
            format!(
                "Llama 3.1 8B, FSDP {} × CP {cp} + compile + float8, 1 × {}, full checkpointing",
                8 / cp,
                32768 * cp
            ),
            Parallelism { data: 8 / cp, context: cp, zero_stage: 3, ..Parallelism::default() },
            1,
            1,
            32768 * cp,
            Checkpointing::Full,
            BLOCKS_FLOAT8,
            published,
            if cp == 1 { held() } else { again(&ring) },
        );
    }
    for (label, published) in [("2D", "71.9"), ("2D + AsyncTP", "67.6")] {
        row(
            &l70,
            format!("Llama 3.1 70B, {label} (FSDP 32 × TP 8) + compile + float8, 16 × 8192, full checkpointing"),
            Parallelism { data: 32, tensor: 8, zero_stage: 3, ..Parallelism::default() },
            16,
            1,
            8192,
            Checkpointing::Full,
            BLOCKS_FLOAT8,
            published,
            if label == "2D" { held() } else { again(&async_tp) },
        );
    }
    // Table 5's local batch of 32 runs as torchtitan 9dec370's default of one micro-batch per
    // pipeline stage (`pipeline_parallel_microbatches` unset: `n_microbatches = pp`), 8 of
    // 4 × 8192; the published TPS agree (1F1B's bubble (pp-1)/8 against interleaved's
    // (pp-1)/16 gives 1.30×, measured 1.28×; 32 micro-batches would give 1.10×).
    for (label, v, published) in [("1F1B", 1u64, "82.5"), ("interleaved 1F1B", 2, "72.7")] {
        row(
            &l405,
            format!(
                "Llama 3.1 405B, FSDP 8 × TP 8 × PP 8 {label} + compile + float8, 8 micro-batches of 4 × 8192, full checkpointing"
            ),
            Parallelism { data: 8, tensor: 8, pipeline: 8, virtual_stages: v, zero_stage: 3, stage_outputs: DEC_2024, ..Parallelism::default() },
            4,
            8,
            8192,
            Checkpointing::Full,
            BLOCKS_FLOAT8,
            published,
            again(&pipelined),
        );
    }
    for (cp, published) in [(1u64, "75.3"), (2, "75.9"), (4, "77.1"), (8, "84.9")] {
        row(
            &l405,
            format!(
                "Llama 3.1 405B, FSDP {} × TP 8 × PP 8 × CP {cp} + compile + float8, 8 micro-batches of {}",
                8 / cp,
                32768 * cp
            ),
            Parallelism {
                data: 8 / cp,
                tensor: 8,
                pipeline: 8,
                context: cp,
                zero_stage: 3,
                stage_outputs: DEC_2024,
                ..Parallelism::default()
            },
            1,
            8,
            32768 * cp,
            Checkpointing::Full,
            BLOCKS_FLOAT8,
            published,
            again(&pipelined),
        );
    }
    // The 405B runs under pipelining: chosen before the pipelined program's figures were
    // computed, the 1F1B run is the tuning row (looked at while the program was built), the
    // interleaved and context-parallel runs check-only; all stay indicative (no tolerance).
    for setup in [
        "Llama 3.1 8B, FSDP over 8 GPUs, 2 × 8192, per-op checkpointing",
        "Llama 3.1 8B, FSDP + compile over 8 GPUs, 2 × 8192, per-op checkpointing",
        "Llama 3.1 405B, FSDP 8 × TP 8 × PP 8 1F1B + compile + float8, 8 micro-batches of 4 × 8192, full checkpointing",
    ] {
        if let Some(r) = rows.iter_mut().find(|r| r.setup == setup) {
            r.used = Use::Tuning;
        }
    }
    trainy_rows(rows);
    forum_pipeline_rows(rows);
}

/// torchtitan on H200s, published by Trainy.
fn trainy_rows(rows: &mut Vec<Row>) {
    let l8 = preset("llama-3.1-8b").unwrap();
    // benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md (torchtitan e7c0cae, June 2025):
    // llama3_8b.toml (8192 tokens, selective per-op checkpointing, fused AdamW) with local
    // batch 2, torch.compile (blocks and loss) and float8 with its fp8 all-gather, on 4 and 8
    // nodes of H200s.
    let h200 = gpu("h200").unwrap();
    for (gpus, published) in [(32u64, "47.96"), (64, "46.97")] {
        let how = BLOCKS_LOSS_FLOAT8;
        let cfg = TrainConfig {
            checkpointing: Checkpointing::PerOp,
            parallel: Parallelism::data_parallel(gpus, 3),
            attention: Attention::Flash,
            framework: Framework::Torchtitan,
            optimizer_impl: Some(headroom_plan::job::OptimizerImpl::Fused),
            compile: how.compile,
            compile_loss: how.compile_loss,
            ..TrainConfig::new(2, 8192, Precision::Fp8, Optimizer::AdamW)
        };
        let e = estimate(&l8, &h200, &cfg);
        rows.push(number(
            "torchtitan (Trainy, H200)",
            format!("Llama 3.1 8B, FSDP + compile + float8 over {gpus} H200s, 2 × 8192, per-op checkpointing"),
            "peak reserved",
            published,
            e.memory.reserved_bytes / GIB,
            "GiB",
            Check::Within(Class::Fsdp2Peak),
        ));
    }
}

/// torchtitan's pipeline as a user measured it.
fn forum_pipeline_rows(rows: &mut Vec<Row>) {
    // A user's measurement on the PyTorch forums ("Question about GPU memory usage when using
    // pipeline parallelism training under larger micro batch count", July 2025; the post
    // behind PyTorch #159251): torchtitan v0.1.0's llama3_8b.toml cut to 16 layers, FSDP 2 ×
    // PP 2 (1F1B) on 4 GPUs, 4096 tokens, full checkpointing, fused AdamW (v0.1.0's default),
    // PyTorch 2.9.0.dev20250725,
    // `run_train.sh` (expandable segments), peak `max_memory_reserved` of pipeline ranks 0
    // and 1. Micro-batches of one sequence (torchtitan's default
    // `pipeline_parallel_microbatch_size`; the post's snapshot shows each output as
    // 4096 × 128256), so the local batch is the micro-batch count. The GPU is not named: an
    // 80 GB H100 is assumed, and no figure comes near its capacity. PyTorch 2.9 keeps the
    // last stage's outputs (`StageOutputs::LastStage`). All eight are check rows, taken as
    // found, computed with the program as it stood.
    let forum = headroom_plan::estimate::Estimator {
        alloc: headroom_alloc::AllocatorConfig::parse("expandable_segments:True").unwrap(),
        ..Default::default()
    };
    let l16 = Model::from_hf_config(
        r#"{"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 131072, "tie_word_embeddings": false}"#,
        "llama-3-8b-16-layers",
    )
    .unwrap();
    let h100_80 = gpu("h100-sxm").unwrap();
    for (n, published) in
        [(2u64, ["35.75", "40.30"]), (4, ["35.80", "42.27"]), (8, ["35.94", "48.27"]), (16, ["36.20", "65.47"])]
    {
        let cfg = TrainConfig {
            accumulation: n,
            checkpointing: Checkpointing::Full,
            parallel: Parallelism {
                data: 2,
                pipeline: 2,
                zero_stage: 3,
                stage_outputs: StageOutputs::LastStage,
                ..Parallelism::default()
            },
            attention: Attention::Flash,
            framework: Framework::Torchtitan,
            optimizer_impl: Some(headroom_plan::job::OptimizerImpl::Fused),
            ..TrainConfig::new(1, 4096, Precision::Mixed, Optimizer::AdamW)
        };
        let e = forum.estimate(&plan::job(&l16, &h100_80, &cfg)).unwrap();
        let ranks = e.memory.pipeline.expect("a pipelined plan names its ranks").ranks;
        for (rank, published) in published.iter().enumerate() {
            rows.push(number(
                "torchtitan PP (PyTorch forums)",
                format!(
                    "Llama 3 8B cut to 16 layers, FSDP 2 × PP 2 1F1B, {n} micro-batches of 1 × 4096, full checkpointing: pipeline rank {rank}{}",
                    if rank == 1 { " (the last stage)" } else { "" }
                ),
                "peak reserved",
                published,
                ranks[rank].reserved_bytes / GIB,
                "GiB",
                Check::Within(Class::Fsdp2Peak),
            ));
        }
    }
}

const QWEN3_0_6B: &str = r#"{"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": true}"#;

const QWEN3_32B: &str = r#"{"model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 25600,
    "num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": false}"#;

/// Qwen/Qwen3-235B-A22B-FP8's and Qwen/Qwen3-30B-A3B's config.json (the fields the plan reads).
const QWEN3_235B_A22B: &str = r#"{"model_type": "qwen3_moe", "hidden_size": 4096, "intermediate_size": 12288,
    "moe_intermediate_size": 1536, "num_hidden_layers": 94, "num_attention_heads": 64, "num_key_value_heads": 4,
    "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936,
    "max_position_embeddings": 40960, "tie_word_embeddings": false, "decoder_sparse_step": 1, "mlp_only_layers": []}"#;
const QWEN3_30B_A3B: &str = r#"{"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936,
    "max_position_embeddings": 40960, "tie_word_embeddings": false, "decoder_sparse_step": 1, "mlp_only_layers": []}"#;

/// SGLang's start-up logs: the weights it loaded and the KV pool its share left.
fn sglang_rows(rows: &mut Vec<Row>) {
    let h100 = gpu("h100-sxm").unwrap();
    // vllm #21348: `sglang.launch_server --tp 4 --mem-fraction-static 0.93` on four H100s,
    // "KV Cache is allocated. #tokens: 367404".
    let q235 = Model::from_hf_config(QWEN3_235B_A22B, "qwen3-235b-a22b-fp8").unwrap();
    let cfg = InferConfig {
        runtime: Runtime::Sglang(Sglang { mem_fraction_static: 0.93 }),
        batch: 1,
        seq: 40960,
        weights: WeightFormat::Fp8,
        kv_bytes: 2.0,
        tensor: 4,
        quantize: None,
    };
    rows.push(number(
        "SGLang log (vllm #21348)",
        "Qwen3-235B-A22B-FP8, TP 4, H100, mem-fraction-static 0.93",
        "KV pool tokens",
        "367404",
        infer::estimate(&q235, &h100, &cfg).max_tokens as f64,
        "tokens",
        Check::Within(Class::EngineLog),
    ));
    // The same issue's vLLM run, `vllm serve --tensor-parallel-size 4` at its defaults (and
    // LMCache's KV connector): "Available KV cache memory: 8.11 GiB".
    let vllm = InferConfig { runtime: Runtime::Vllm(Engine::vllm_defaults(&h100)), ..cfg };
    rows.push(number(
        "vLLM log (vllm #21348)",
        "Qwen3-235B-A22B-FP8, TP 4, H100, vllm serve defaults",
        "KV cache",
        "8.11",
        infer::estimate(&q235, &h100, &vllm).kv_cache / GIB,
        "GiB",
        Check::Within(Class::EngineLog),
    ));
    // sglang #18263: "Load weight end. type=Qwen3MoeForCausalLM, ... mem usage=56.98 GB" (GiB).
    let q30 = Model::from_hf_config(QWEN3_30B_A3B, "qwen3-30b-a3b").unwrap();
    rows.push(number(
        "SGLang log (sglang #18263)",
        "Qwen3-30B-A3B, bf16, one GPU",
        "weights loaded",
        "56.98",
        WeightFormat::Bf16.weight_bytes(&q30) / GIB,
        "GiB",
        Check::Within(Class::ClosedForm),
    ));
}

/// vLLM's start-up logs on H100 80 GB (llm-d/llm-d-benchmark,
/// config_explorer/empirical-vllm-memory-results.md): `vllm serve` with its defaults
/// (gpu_memory_utilization 0.9; on this GPU 8,192 tokens and 1,024 sequences a step),
/// max-model-len 16,000 unless said, bf16 unless said. The log's figures per GPU: weights
/// loaded, the profile run's peak, and the KV cache the rest leaves. The memory outside
/// PyTorch is set from two of them (0.13 GiB on one GPU: Llama-3.1-8B; 0.55 GiB on two:
/// Llama-3.3-70B-FP8), which makes their KV rows tuning rows; the profile's peak and the
/// weights are computed, not set, on every row.
fn engine_rows(rows: &mut Vec<Row>) {
    let h100 = gpu("h100-sxm").unwrap();
    let serve = |seq: u64, weights: WeightFormat, tensor: u64| InferConfig {
        runtime: Runtime::Vllm(Engine::vllm_defaults(&h100)),
        batch: 1,
        seq,
        weights,
        kv_bytes: 2.0,
        tensor,
        quantize: None,
    };
    let l31 = preset("llama-3.1-8b").unwrap();
    let l70 = Model { name: "llama-3.3-70b".into(), max_position: 131072, ..preset("llama-3-70b").unwrap() };
    let q06 = Model::from_hf_config(QWEN3_0_6B, "qwen3-0.6b").unwrap();
    let q32 = Model::from_hf_config(QWEN3_32B, "qwen3-32b").unwrap();
    let source = "llm-d vLLM logs";
    for (m, name, weights, tensor, published, kv_tuned) in [
        (&l31, "Llama-3.1-8B", WeightFormat::Bf16, 1, ["14.99", "4.76", "51.38"], true),
        (&q06, "Qwen3-0.6B", WeightFormat::Bf16, 1, ["1.12", "5.56", "64.45"], false),
        (&q32, "Qwen3-32B", WeightFormat::Bf16, 1, ["61.03", "5.64", "4.45"], false),
        (&l70, "Llama-3.3-70B-FP8, TP 2", WeightFormat::Fp8, 2, ["33.88", "4.84", "32.0"], true),
    ] {
        let e = infer::estimate(m, &h100, &serve(16000, weights, tensor));
        let setup = format!("{name}, H100, vllm serve defaults");
        rows.push(number(
            source,
            setup.clone(),
            "weights per GPU",
            published[0],
            e.weights / GIB,
            "GiB",
            Check::Within(Class::ClosedForm),
        ));
        rows.push(number(
            source,
            setup.clone(),
            "profile run's peak",
            published[1],
            e.activations / GIB,
            "GiB",
            Check::Within(Class::EngineLog),
        ));
        let kv =
            number(source, setup, "KV cache", published[2], e.kv_cache / GIB, "GiB", Check::Within(Class::EngineLog));
        rows.push(if kv_tuned { tuning(kv) } else { kv });
    }
    // The engine starts when its cache holds one sequence of max-model-len tokens.
    for (m, name, weights, tensor, seq, started) in [
        (&l31, "Llama-3.1-8B", WeightFormat::Bf16, 1, 16000, true),
        (&q06, "Qwen3-0.6B", WeightFormat::Bf16, 1, 32000, true),
        (&q32, "Qwen3-32B", WeightFormat::Bf16, 1, 16000, true),
        (&q32, "Qwen3-32B", WeightFormat::Bf16, 1, 32000, false),
        (&l70, "Llama-3.3-70B-FP8, TP 2", WeightFormat::Fp8, 2, 16000, true),
        (&l70, "Llama-3.3-70B-FP8, one GPU", WeightFormat::Fp8, 1, 16000, false),
    ] {
        let e = infer::estimate(m, &h100, &serve(seq, weights, tensor));
        rows.push(Row {
            metric: "the engine starts",
            ..fits(source, format!("{name}, H100, max-model-len {seq}"), started, e.fits)
        });
    }
}

/// The same indicative reason again (`Check` is not `Copy`: its reasons are borrowed text).
fn again(c: &Check) -> Check {
    match c {
        Check::Indicative(why) => Check::Indicative(why),
        _ => unreachable!("only indicative checks are repeated"),
    }
}

fn table() -> (String, Vec<Row>) {
    let mut rows = vec![];
    model_state_rows(&mut rows);
    activation_rows(&mut rows);
    fit_rows(&mut rows);
    deepspeed_rows(&mut rows);
    bnb_rows(&mut rows);
    time_rows(&mut rows);
    torchtitan_rows(&mut rows);
    engine_rows(&mut rows);
    sglang_rows(&mut rows);
    let mut text = String::from(
        "| source | setup | metric | used for | published | predicted | error | tolerance | verdict |\n\
         |---|---|---|---|---:|---:|---:|---|---|\n",
    );
    for r in &rows {
        text.push_str(&r.markdown());
        text.push('\n');
    }
    text.push('\n');
    for (name, used) in [("tuning", Use::Tuning), ("check-only", Use::Check)] {
        let held: Vec<&Row> = rows.iter().filter(|r| r.used == used && r.passes().is_some()).collect();
        let pass = held.iter().filter(|r| r.passes() == Some(true)).count();
        text.push_str(&format!("{name} rows: {pass} of {} within their class's tolerance\n", held.len()));
    }
    (text, rows)
}

const BEGIN: &str = "<!-- plan-validation:begin -->\n";
const END: &str = "<!-- plan-validation:end -->";

#[test]
fn published_rows_are_held_to_their_class_tolerance_and_the_docs_show_them() {
    let (text, rows) = table();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/VALIDATION.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let start = doc.find(BEGIN).expect("docs/VALIDATION.md has the plan-validation markers") + BEGIN.len();
    let end = doc.find(END).expect("end marker");
    let regenerate = std::env::var_os("HEADROOM_REGENERATE").is_some();
    if regenerate {
        std::fs::write(&path, format!("{}{}{}", &doc[..start], text, &doc[end..])).unwrap();
    }
    let failed: Vec<&Row> = rows.iter().filter(|r| r.passes() == Some(false)).collect();
    let known = |r: &Row| KNOWN_FAILURES.iter().any(|(setup, _)| *setup == r.setup);
    let unexpected: Vec<String> = failed.iter().filter(|r| !known(r)).map(|r| r.markdown()).collect();
    assert!(unexpected.is_empty(), "rows outside their class's tolerance:\n{}", unexpected.join("\n"));
    let now_pass: Vec<&str> = KNOWN_FAILURES
        .iter()
        .filter(|(setup, _)| !failed.iter().any(|r| r.setup == *setup))
        .map(|(setup, _)| *setup)
        .collect();
    assert!(now_pass.is_empty(), "listed as failing but within tolerance (or gone): {now_pass:?}");
    let held = rows.iter().filter(|r| r.passes().is_some()).count();
    eprintln!("{held} rows held to a tolerance, {} outside it (listed with their reasons)", failed.len());
    assert!(held >= 40, "{held} rows held to a tolerance");
    assert!(
        regenerate || doc[start..end] == text,
        "docs/VALIDATION.md's planner table is stale: run HEADROOM_REGENERATE=1 cargo test -p headroom-plan --test validation"
    );
}

/// The tolerance rule itself: a closed form is held to 1% or to the published rounding.
#[test]
fn a_closed_form_is_held_to_its_published_digits() {
    assert!((Class::ClosedForm.tolerance("1.9") - 0.05 / 1.9).abs() < 1e-12);
    assert_eq!(Class::ClosedForm.tolerance("120"), 0.01);
    assert_eq!(Class::ClosedForm.tolerance("413.68"), 0.01);
    // A row 2% off a figure published to three digits fails.
    let row = number("t", "t", "t", "31.4", 31.4 * 1.02, "GB", Check::Within(Class::ClosedForm));
    assert_eq!(row.passes(), Some(false));
}
