//! The LoRA job an H200 ran (docs/VALIDATION.md, "The step recorder against the GPU":
//! Qwen3-1.7B, bf16, 4 × 2048 tokens, peft's LoRA r = 16 over every linear layer, AdamW, SDPA)
//! planned by replaying the recorded LoRA template: a check row, nothing fitted to it. The
//! tolerance is the dev grid's, set before the comparison: allocated and reserved within ±5%.
//!
//! `cargo test -p headroom-plan --test lora_gpu -- --nocapture` prints the row.

use headroom_plan::builders::ProgramSource;
use headroom_plan::gpu::{gpu, GpuSpec};
use headroom_plan::job::{Attention, BaseWeights, Finetune, LoraTargets, Optimizer, Precision, TrainConfig};
use headroom_plan::model::Model;
#[path = "support/plan.rs"]
mod plan;
use plan::estimate;

const TOLERANCE: f64 = 0.05;
const GIB: f64 = (1u64 << 30) as f64;

/// Measured on the H200 (`scripts/gpu/validate_recorder.py`), GiB to two decimals.
const ALLOCATED_GIB: f64 = 49.88;
const RESERVED_GIB: f64 = 52.63;

#[test]
fn qwen3_lora_on_the_h200_replays_its_recorded_step() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/models/qwen3-1.7b.json");
    let model = Model::from_hf_config(&std::fs::read_to_string(path).expect("the config"), "qwen3-1.7b")
        .expect("qwen3-1.7b's config");
    let h200 = GpuSpec { memory_bytes: 150_109_880_320, ..gpu("h200").expect("h200 is a preset") };
    let cfg = TrainConfig {
        attention: Attention::Sdpa,
        finetune: Finetune::Lora { rank: 16, targets: LoraTargets::All, base: BaseWeights::Native },
        ..TrainConfig::new(4, 2048, Precision::Bf16, Optimizer::AdamW)
    };
    let e = estimate(&model, &h200, &cfg);
    assert!(matches!(e.runner.source, ProgramSource::Template(_)), "{:?}", e.runner.source);
    let (a, r) = (e.memory.allocated_bytes / GIB, e.memory.reserved_bytes / GIB);
    let (ea, er) = (a / ALLOCATED_GIB - 1.0, r / RESERVED_GIB - 1.0);
    println!(
        "| qwen3-1.7b bf16 4×2048 LoRA r=16 | `{}` | {ALLOCATED_GIB:.2} | {a:.2} | {:+.1}% | {RESERVED_GIB:.2} | {r:.2} | {:+.1}% |",
        e.runner.source.detail().unwrap_or(""),
        100.0 * ea,
        100.0 * er
    );
    assert!(
        ea.abs() <= TOLERANCE && er.abs() <= TOLERANCE,
        "allocated {:+.2}%, reserved {:+.2}%",
        100.0 * ea,
        100.0 * er
    );
}
