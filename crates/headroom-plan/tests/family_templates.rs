//! The families recorded into `data/programs/hf-families.json` (Mistral, Phi-3, Gemma,
//! Gemma-2, GPT-NeoX, BLOOM, Mixtral, Qwen3-MoE): each preset of theirs is planned by
//! replaying its own family's recorded step, and the jobs of those families that an H200 ran
//! (docs/VALIDATION.md, "The step recorder against the GPU") are check rows for the
//! recordings: no template was fitted to a GPU measurement.
//!
//! The tolerance is the dev grid's, set before the templates were compared: allocated and
//! reserved within ±5%.
//!
//! `FAMILY_TABLE=1 cargo test -p headroom-plan --test family_templates -- --nocapture`
//! prints the table docs/VALIDATION.md shows.

use headroom_plan::builders::ProgramSource;
use headroom_plan::gpu::{gpu, GpuSpec};
use headroom_plan::job::{Attention, Optimizer, Precision, TrainConfig};
use headroom_plan::model::{preset, Model};
#[path = "support/plan.rs"]
mod plan;
use plan::estimate;

const TOLERANCE: f64 = 0.05;
const GIB: f64 = (1u64 << 30) as f64;

/// The H200 of the recorder's GPU rows, with the memory they planned it at
/// (`scripts/gpu/validate_recorder.py`).
fn h200() -> GpuSpec {
    GpuSpec { memory_bytes: 150_109_880_320, ..gpu("h200").expect("h200 is a preset") }
}

fn preset_model(name: &str) -> Model {
    preset(name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The template a job replays, or why none: the builder and its source.
fn source(model: &Model, cfg: &TrainConfig) -> (String, ProgramSource) {
    let e = estimate(model, &h200(), cfg);
    (e.runner.builder.to_string(), e.runner.source.clone())
}

/// A preset of each recorded family, in bf16 with SDPA and in fp32 (GPT-NeoX's fp32 takes
/// SDPA's fused kernels, every other family here its math path with grouped key-value
/// heads or eager attention where transformers has no SDPA).
#[test]
fn each_recorded_family_replays_its_own_recording() {
    let jobs: &[(&str, Precision, &str)] = &[
        ("mistral-7b", Precision::Bf16, "mistral/causal-lm/bf16/sdpa/full"),
        ("phi-3-mini", Precision::Bf16, "phi3/causal-lm/bf16/sdpa/full"),
        ("gemma-2b", Precision::Bf16, "gemma/causal-lm/bf16/sdpa/full"),
        ("pythia-1b", Precision::Bf16, "gpt_neox/causal-lm/bf16/sdpa/full"),
        ("pythia-1b", Precision::Fp32, "gpt_neox/causal-lm/fp32/sdpa/full"),
        ("bloom-7b1", Precision::Bf16, "bloom/causal-lm/bf16/eager/full"),
        ("mixtral-8x7b", Precision::Bf16, "mixtral/causal-lm/bf16/sdpa/full"),
        ("qwen3-30b-a3b", Precision::Bf16, "qwen3_moe/causal-lm/bf16/sdpa/full"),
    ];
    for &(name, precision, key) in jobs {
        let model = if name == "qwen3-30b-a3b" { qwen3_30b_a3b() } else { preset_model(name) };
        let cfg = TrainConfig { attention: Attention::Sdpa, ..TrainConfig::new(1, 1024, precision, Optimizer::AdamW) };
        let (builder, source) = source(&model, &cfg);
        assert_eq!(builder, "transformers", "{name} {precision:?}");
        assert_eq!(source, ProgramSource::Template(key.to_string()), "{name} {precision:?}");
    }
}

/// Qwen3-30B-A3B's config.json (Qwen/Qwen3-30B-A3B): 128 experts 768 wide, 8 a token.
fn qwen3_30b_a3b() -> Model {
    Model::from_hf_config(
        r#"{"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
            "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
            "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
            "max_position_embeddings": 40960, "tie_word_embeddings": false}"#,
        "qwen3-30b-a3b",
    )
    .expect("qwen3-30b-a3b's config")
}

/// The mixtures of experts' templates scale every expert's weights by the model's experts
/// and their width, not by the recorded model's: twice the experts add to the replayed
/// weights and AdamW's two moments exactly the parameters they add, at 2 bytes each and 4
/// (a bf16 model's moments are bf16).
#[test]
fn a_mixture_of_experts_replays_every_expert_of_its_own() {
    for model in [preset_model("mixtral-8x7b"), qwen3_30b_a3b()] {
        let doubled = Model { experts: 2 * model.experts, ..model.clone() };
        let cfg =
            TrainConfig { attention: Attention::Sdpa, ..TrainConfig::new(1, 512, Precision::Bf16, Optimizer::AdamW) };
        let [e, e2] = [&model, &doubled].map(|m| estimate(m, &h200(), &cfg));
        for e in [&e, &e2] {
            assert!(matches!(e.runner.source, ProgramSource::Template(_)), "{}: {:?}", model.name, e.runner.source);
        }
        let added = (doubled.params() - model.params()) as f64;
        let (b, b2) = (&e.memory.breakdown, &e2.memory.breakdown);
        assert_eq!(b2.weights - b.weights, 2.0 * added, "{}: weights", model.name);
        assert_eq!(b2.optimizer - b.optimizer, 4.0 * added, "{}: AdamW's moments", model.name);
    }
}

/// A family recorded on its own is planned by its own recording, not by the one of the code
/// it shares (Gemma's): Gemma-2 runs eager attention whatever is asked, as transformers 5
/// has no SDPA path for it.
#[test]
fn a_family_with_recordings_of_its_own_is_not_planned_by_the_code_it_shares() {
    let gemma2 = Model::from_hf_config(
        r#"{"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
            "max_position_embeddings": 8192, "sliding_window": 4096, "query_pre_attn_scalar": 256}"#,
        "gemma-2-2b",
    )
    .expect("gemma-2-2b's config");
    for attention in [Attention::Eager, Attention::Sdpa] {
        let cfg = TrainConfig { attention, ..TrainConfig::new(1, 1024, Precision::Bf16, Optimizer::AdamW) };
        let (_, source) = source(&gemma2, &cfg);
        assert_eq!(source, ProgramSource::Template("gemma2/causal-lm/bf16/eager/full".into()), "{attention:?}");
    }
}

/// The H200 rows: (preset, batch, sequence, precision, allocated GiB, reserved GiB) as
/// docs/VALIDATION.md gives them (two decimals).
const GPU_ROWS: &[(&str, u64, u64, Precision, f64, f64)] = &[
    ("gemma-2b", 2, 1024, Precision::Bf16, 26.19, 29.86),
    ("phi-3-mini", 1, 1024, Precision::Bf16, 35.65, 38.83),
    ("pythia-1b", 4, 1024, Precision::Bf16, 12.55, 14.46),
    ("pythia-1b", 2, 1024, Precision::Fp32, 18.92, 19.94),
];

#[test]
fn recorded_families_against_the_h200() {
    let mut misses = Vec::new();
    if std::env::var_os("FAMILY_TABLE").is_some() {
        println!("| job | template | allocated measured | planned | error | reserved measured | planned | error |");
        println!("|---|---|---:|---:|---:|---:|---:|---:|");
    }
    for &(name, batch, seq, precision, allocated, reserved) in GPU_ROWS {
        let model = preset_model(name);
        let cfg =
            TrainConfig { attention: Attention::Sdpa, ..TrainConfig::new(batch, seq, precision, Optimizer::AdamW) };
        let e = estimate(&model, &h200(), &cfg);
        let key = e.runner.source.detail().unwrap_or("none").to_string();
        if !matches!(e.runner.source, ProgramSource::Template(_)) {
            misses.push(format!("{name} {precision:?} {batch}×{seq}: no recording replayed"));
            continue;
        }
        let (a, r) = (e.memory.allocated_bytes / GIB, e.memory.reserved_bytes / GIB);
        let (ea, er) = (a / allocated - 1.0, r / reserved - 1.0);
        if std::env::var_os("FAMILY_TABLE").is_some() {
            println!(
                "| {name} {precision:?} {batch}×{seq} | `{key}` | {allocated:.2} | {a:.2} | {:+.1}% | {reserved:.2} | {r:.2} | {:+.1}% |",
                ea * 100.0,
                er * 100.0
            );
        }
        if ea.abs() > TOLERANCE || er.abs() > TOLERANCE {
            misses.push(format!(
                "{name} {precision:?} {batch}×{seq}: allocated {:+.2}%, reserved {:+.2}%",
                ea * 100.0,
                er * 100.0
            ));
        }
    }
    assert!(misses.is_empty(), "outside ±5%: {misses:?}");
}
