//! QLoRA jobs an H200 ran (`scripts/gpu/validate_templates.py`, 2026-11-29; torch 2.11, peft
//! 0.21, bitsandbytes 0.50) planned by replaying the recorded QLoRA templates: check rows,
//! chosen before they ran, nothing fitted to them (docs/VALIDATION.md, "QLoRA and NF4 inference
//! on an H200"). The tolerance is the dev grid's, set before any comparison: allocated and
//! reserved within ±5%. BERT's and GPT-2's rows, without checkpointing, hold every layer's
//! dropout masks (one byte an element on a GPU); Qwen3-MoE's reserved memory follows peft's
//! `empty_cache` after its fp32 casts.
//!
//! `cargo test -p headroom-plan --test qlora_gpu -- --nocapture` prints the rows.

use headroom_plan::gpu::{gpu, GpuSpec};
use headroom_plan::job::{
    Attention, BaseWeights, Checkpointing, Finetune, LoraTargets, Optimizer, Precision, TrainConfig,
};
use headroom_plan::model::Model;
#[path = "support/plan.rs"]
mod plan;
use plan::estimate;

const TOLERANCE: f64 = 0.05;
const GIB: f64 = (1u64 << 30) as f64;

/// The job's config: a preset, or Qwen3-30B-A3B's cut to 4 layers as the job ran it.
fn config(name: &str) -> String {
    if name == "qwen3-30b-a3b-4l" {
        return r#"{"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
            "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
            "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_hidden_layers": 4,
            "vocab_size": 151936, "max_position_embeddings": 32768, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "norm_topk_prob": true, "tie_word_embeddings": false}"#
            .to_string();
    }
    let path = format!("{}/../../data/models/presets/{name}.json", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).expect("the preset")
}

/// (job, config, batch, sequence, checkpointed, GPU allocated bytes, GPU reserved bytes): the
/// H200's `max_memory_allocated` and `max_memory_reserved` over three AdamW steps.
const JOBS: [(&str, &str, u64, u64, bool, f64, f64); 3] = [
    ("bert-large qlora r16 no-ckpt 8x512", "bert-large-uncased", 8, 512, false, 8_679_356_416.0, 8_719_958_016.0),
    ("gpt2 qlora r16 no-ckpt 4x1024", "gpt2", 4, 1024, false, 7_091_795_968.0, 7_962_886_144.0),
    ("qwen3-30b-a3b(4L) qlora r16 2x1024", "qwen3-30b-a3b-4l", 2, 1024, true, 17_781_272_064.0, 19_998_441_472.0),
];

#[test]
fn qlora_jobs_on_the_h200_replay_their_recorded_steps() {
    let h200 = GpuSpec { memory_bytes: 150_109_880_320, ..gpu("h200").expect("h200 is a preset") };
    let mut misses = Vec::new();
    for (name, preset, batch, seq, checkpointed, allocated, reserved) in JOBS {
        let model = Model::from_hf_config(&config(preset), preset).expect("the config");
        let cfg = TrainConfig {
            attention: Attention::Sdpa,
            checkpointing: if checkpointed { Checkpointing::Full } else { Checkpointing::None },
            finetune: Finetune::Lora { rank: 16, targets: LoraTargets::All, base: BaseWeights::Nf4 },
            double_quant: true,
            ..TrainConfig::new(batch, seq, Precision::Bf16, Optimizer::AdamW)
        };
        let e = estimate(&model, &h200, &cfg);
        let (a, r) = (e.memory.allocated_bytes, e.memory.reserved_bytes);
        let (ea, er) = (a / allocated - 1.0, r / reserved - 1.0);
        println!(
            "| {name} | `{}` | {:.2} GiB | {:.2} GiB | {:+.2}% | {:.2} GiB | {:.2} GiB | {:+.2}% |",
            e.runner.source.detail().unwrap_or(""),
            allocated / GIB,
            a / GIB,
            100.0 * ea,
            reserved / GIB,
            r / GIB,
            100.0 * er
        );
        if ea.abs() > TOLERANCE || er.abs() > TOLERANCE {
            misses.push(format!("{name}: allocated {:+.2}%, reserved {:+.2}%", 100.0 * ea, 100.0 * er));
        }
    }
    assert!(misses.is_empty(), "outside ±{}%: {misses:?}", 100.0 * TOLERANCE);
}
