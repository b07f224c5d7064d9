//! Every model type `--model` accepts, in every training recipe the command line expresses
//! for transformers on one GPU — full fine-tuning, LoRA and QLoRA over every linear layer or
//! the query and value projections, in bf16, fp32 and AMP, with SDPA or eager attention asked,
//! with and without checkpointing — is planned by replaying a step recorded from its own
//! family's code: a template of its own model type, not the closed form and not another
//! family's recording (Qwen3's step is not Qwen2's: its query and key norms; nor Gemma-2's
//! Gemma's: its softcapping and its norms around each block's halves).
//!
//! So is its inference with transformers (`--infer --framework hf`): generate's prefill and
//! decode steps and the evaluation forward (`--all-logits`; an encoder's only one), over bf16
//! and fp32 weights, with SDPA or eager attention asked, and over bitsandbytes' LLM.int8() and
//! 4-bit layers at bf16.
//!
//! T5 is held here with either MLP: v1.0's (t5-base, tied) and v1.1's (T0-3B, as flan-t5's and
//! mT5's checkpoints: a gated MLP and an output layer of its own).
//!
//! The 4-bit inference loads are QLoRA's (double quantization, bf16 compute) and transformers'
//! defaults (`BitsAndBytesConfig(load_in_4bit=True)`: neither), each over NF4 and FP4.
//!
//! The lookups are the planner's own (`hf::key`, `infer::recorded::key`), on an H200; that each
//! template expands and replays as recorded is `program_templates`' (`cargo test -p
//! headroom-plan --lib`).

use headroom_plan::bnb::{Bnb, ComputeDtype, QuantType};
use headroom_plan::builders::hf;
use headroom_plan::gpu::gpu;
use headroom_plan::infer::{recorded, InferConfig, Runtime, WeightFormat};
use headroom_plan::job::{
    Attention, BaseWeights, Checkpointing, Device, Finetune, LoraTargets, Optimizer, Precision, TrainConfig,
};
use headroom_plan::model::{preset, Model};
#[path = "support/hub_configs.rs"]
mod hub_configs;
use hub_configs::{GEMMA_2_2B, QWEN3_30B_A3B};

/// A model of each type, its catalog preset or a config.json as the Hub ships it.
fn models() -> Vec<Model> {
    let config = |text: &str, name: &str| Model::from_hf_config(text, name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut out: Vec<Model> = [
        "llama-3-8b",
        "mistral-7b",
        "mixtral-8x7b",
        "qwen2.5-7b",
        "gemma-2b",
        "phi-3-mini",
        "gpt2",
        "pythia-1b",
        "bloom-7b1",
        "bert-base-uncased",
        "t5-base",
        "t0-3b",
    ]
    .iter()
    .map(|name| preset(name).unwrap_or_else(|e| panic!("{name}: {e}")))
    .collect();
    out.push(config(include_str!("../../../data/models/qwen3-1.7b.json"), "qwen3-1.7b"));
    out.push(config(include_str!("../../../data/models/qwen1.5-moe-a2.7b.json"), "qwen1.5-moe-a2.7b"));
    out.push(config(include_str!("../../../data/models/gemma-3-1b.json"), "gemma-3-1b"));
    out.push(config(GEMMA_2_2B, "gemma-2-2b"));
    out.push(config(QWEN3_30B_A3B, "qwen3-30b-a3b"));
    out
}

#[test]
fn every_training_recipe_of_every_model_type_replays_its_own_familys_step() {
    let h200 = gpu("h200").expect("h200 is a preset");
    let lora = |targets, base| Finetune::Lora { rank: 16, targets, base };
    let finetunes = [
        Finetune::Full,
        lora(LoraTargets::All, BaseWeights::Native),
        lora(LoraTargets::QueryValue, BaseWeights::Native),
        lora(LoraTargets::All, BaseWeights::Nf4),
        lora(LoraTargets::QueryValue, BaseWeights::Nf4),
    ];
    let mut misses = Vec::new();
    let mut jobs = 0;
    for model in models() {
        let own = format!("{}/", model.model_type);
        for finetune in finetunes {
            for precision in [Precision::Bf16, Precision::Fp32, Precision::Amp] {
                for attention in [Attention::Sdpa, Attention::Eager] {
                    for checkpointing in [Checkpointing::None, Checkpointing::Full] {
                        let cfg = TrainConfig {
                            finetune,
                            attention,
                            checkpointing,
                            ..TrainConfig::new(1, 512, precision, Optimizer::AdamW)
                        };
                        jobs += 1;
                        let job = format!("{} {finetune:?} {precision:?} {attention:?} {checkpointing:?}", model.name);
                        match hf::key(&model, &cfg, Device::Gpu(&h200)) {
                            Ok(key) if key.starts_with(&own) => {}
                            Ok(key) => misses.push(format!("{job}: replays another family's step, {key}")),
                            Err(why) => misses.push(format!("{job}: {why}")),
                        }
                    }
                }
            }
        }
    }
    assert_eq!(jobs, 17 * 5 * 3 * 2 * 2);
    assert!(misses.is_empty(), "{} of {jobs} jobs:\n{}", misses.len(), misses.join("\n"));
}

#[test]
fn every_inference_of_every_model_type_replays_its_own_familys_recording() {
    let qlora = |quant_type| Bnb::FourBit { quant_type, double_quant: true, compute: ComputeDtype::Bf16 };
    let defaults = |quant_type| Bnb::FourBit { quant_type, double_quant: false, compute: ComputeDtype::Fp32 };
    let mut misses = Vec::new();
    let mut jobs = 0;
    for model in models() {
        let own = format!("{}/", model.model_type);
        for all_logits in [false, true] {
            // An encoder's inference is its forward alone (BERT's masked LM).
            if !all_logits && !model.generates() {
                continue;
            }
            for (weights, quantize) in [
                (WeightFormat::Bf16, None),
                (WeightFormat::Fp32, None),
                (WeightFormat::Bf16, Some(Bnb::Int8)),
                (WeightFormat::Bf16, Some(qlora(QuantType::Nf4))),
                (WeightFormat::Bf16, Some(qlora(QuantType::Fp4))),
                (WeightFormat::Bf16, Some(defaults(QuantType::Nf4))),
                (WeightFormat::Bf16, Some(defaults(QuantType::Fp4))),
            ] {
                for attention in [Attention::Sdpa, Attention::Eager] {
                    let cfg = InferConfig {
                        runtime: Runtime::Transformers { attention, all_logits, new_tokens: 16 },
                        batch: 1,
                        // Within Gemma 3 1B's sliding window of 512 with the new tokens: a cache
                        // past a window is refused, as its recording has none.
                        seq: 256,
                        weights,
                        kv_bytes: 2.0,
                        tensor: 1,
                        quantize,
                    };
                    jobs += 1;
                    let mode = if all_logits { "forward" } else { "generate" };
                    let job = format!("{} {mode} {weights:?} {quantize:?} {attention:?}", model.name);
                    match recorded::key(&model, &cfg) {
                        Ok(key) if key.starts_with(&own) => {}
                        Ok(key) => misses.push(format!("{job}: replays another family's recording, {key}")),
                        Err(why) => misses.push(format!("{job}: {why}")),
                    }
                }
            }
        }
    }
    assert_eq!(jobs, (16 * 2 + 1) * 7 * 2);
    assert!(misses.is_empty(), "{} of {jobs} jobs:\n{}", misses.len(), misses.join("\n"));
}
