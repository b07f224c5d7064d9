//! peft's LoRA steps measured on CPU (`scripts/validate/lora_truth.py`,
//! `data/validation/lora_cpu_truth.json`) against the planner's replay of the recorded LoRA
//! templates (`data/programs/hf-lora.json`), as the CPU runs it: the step's live peak and each
//! phase's, within the CPU ground truth's 3% (tests/ground_truth.rs), set before any
//! comparison. Every case is a check row, at a depth, shape and rank the templates were not
//! recorded at. The adapters the planner's program trains are peft's exactly: their gradients'
//! bytes are four (fp32, as peft keeps a 16-bit base's adapters) times the trainable
//! parameters peft counts (`get_nb_trainable_parameters`) on each case's config.
//!
//! `cargo test -p headroom-plan --test lora_truth -- --nocapture` prints the table
//! docs/VALIDATION.md shows.

use headroom_plan::builders::hf::program;
use headroom_plan::builders::{Device, StateScale};
use headroom_plan::job::{
    Attention, BaseWeights, Checkpointing, Finetune, LoraTargets, Optimizer, OptimizerImpl, Precision, TrainConfig,
};
use headroom_plan::model::Model;
use headroom_plan::program::Term;
use serde_json::Value;

#[path = "support/phase_peaks.rs"]
mod phase_peaks;

const PEAK_TOLERANCE: f64 = 0.03;

fn cases() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/validation/lora_cpu_truth.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("the measured cases")).expect("JSON");
    v["cases"].as_array().expect("cases").clone()
}

fn config(c: &Value) -> TrainConfig {
    let precision = if c["precision"] == "bf16" { Precision::Bf16 } else { Precision::Fp32 };
    TrainConfig {
        attention: if c["attention"] == "eager" { Attention::Eager } else { Attention::Sdpa },
        checkpointing: if c["checkpointing"] == true { Checkpointing::Full } else { Checkpointing::None },
        finetune: Finetune::Lora {
            rank: c["rank"].as_u64().expect("rank"),
            targets: if c["targets"] == "qv" { LoraTargets::QueryValue } else { LoraTargets::All },
            base: BaseWeights::Native,
        },
        // torch.optim's foreach implementation, as the script runs it on CPU.
        optimizer_impl: Some(OptimizerImpl::Foreach),
        ..TrainConfig::new(
            c["batch"].as_u64().expect("batch"),
            c["seq"].as_u64().expect("seq"),
            precision,
            Optimizer::AdamW,
        )
    }
}

#[test]
fn lora_steps_replayed_match_peft_s_on_cpu() {
    let mut misses = Vec::new();
    println!("| case | measured peak | planned | diff | forward | backward | optimizer step |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for c in cases() {
        let family = c["family"].as_str().expect("family");
        let m = Model::from_hf_config(&c["config"].to_string(), family).expect("config");
        let cfg = config(&c);
        let label = format!(
            "{family} L{} {} {}{} r={} {} {}×{}",
            c["layers"],
            c["precision"].as_str().unwrap_or(""),
            c["attention"].as_str().unwrap_or("sdpa"),
            if c["checkpointing"] == true { " ckpt" } else { "" },
            c["rank"],
            c["targets"].as_str().unwrap_or(""),
            c["batch"],
            c["seq"]
        );
        if let Err(miss) = phase_peaks::within(&label, &c, &m, &cfg, PEAK_TOLERANCE) {
            misses.push(miss);
        }
    }
    assert!(misses.is_empty(), "outside ±{}%: {misses:?}", 100.0 * PEAK_TOLERANCE);
}

/// The program's trainable parameters, from the gradients one step makes: peft's count.
#[test]
fn adapters_planned_are_the_parameters_peft_trains() {
    let mut wrong = Vec::new();
    for c in cases() {
        let family = c["family"].as_str().expect("family");
        let m = Model::from_hf_config(&c["config"].to_string(), family).expect("config");
        let cfg = config(&c);
        let Ok(hf) = program(&m, &cfg, Device::Cpu, 1, &StateScale::default()) else {
            wrong.push(format!("{family}: no LoRA template serves it"));
            continue;
        };
        let sizes = hf.program.sizes(cfg.micro_batch, cfg.seq);
        let gradients: u64 =
            hf.program.tensors.iter().zip(&sizes).filter(|(t, _)| t.term == Term::Gradients).map(|(_, &b)| b).sum();
        let peft = c["trainable_parameters"].as_u64().expect("peft's trainable parameters");
        if gradients != 4 * peft {
            wrong.push(format!(
                "{} r={} {}: {} planned, {peft} peft's",
                hf.key,
                c["rank"],
                c["targets"],
                gradients / 4
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:?}");
}
