//! A torchtune recipe YAML: the model builder (`model._component_`, LoRA and QLoRA builders
//! included), the batch, accumulation, sequence length, dtype, checkpointing and optimizer.
//! What torchtune does that the planner cannot express — a chunked or fused loss, the
//! optimizer stepped inside the backward, activations offloaded to the CPU — is named, with
//! the recorder (`python -m headroom_gpu record`, docs/RECORDING.md) for planning the step as
//! it runs.

use super::fields::shown;
use super::{Asked, Fields, Format, ModelName, Read};
use crate::job::{Checkpointing, LoraTargets, Optimizer, OptimizerImpl, Precision};
use crate::request::{Compile, FinetuneMode, TrainRequest};
use serde_json::Value;

/// torchtune's model builders (after `lora_` or `qlora_`) and the preset each builds.
const MODELS: &[(&str, &str)] = &[
    ("llama3_1_8b", "llama-3.1-8b"),
    ("llama3_1_70b", "llama-3.1-70b"),
    ("llama3_1_405b", "llama-3.1-405b"),
    ("llama3_8b", "llama-3-8b"),
    ("llama3_70b", "llama-3-70b"),
    ("llama2_7b", "llama-2-7b"),
    ("llama2_13b", "llama-2-13b"),
    ("llama2_70b", "llama-2-70b"),
    ("mistral_7b", "mistral-7b"),
    ("qwen2_5_7b_instruct", "qwen2.5-7b"),
    ("gemma_2b", "gemma-2b"),
    ("gemma_7b", "gemma-7b"),
    ("phi3_mini", "phi-3-mini"),
];

const RECORD: &str = "record the step as it runs instead: python -m headroom_gpu record (docs/RECORDING.md)";

const NO_BEARING: &[&str] = &[
    "output_dir",
    "tokenizer._component_",
    "tokenizer.path",
    "checkpointer",
    "resume_from_checkpoint",
    "save_adapter_weights_only",
    "save_last_epoch_only",
    "epochs_to_save",
    "dataset",
    "seed",
    "shuffle",
    "optimizer.weight_decay",
    "optimizer.lr",
    "lr_scheduler",
    "epochs",
    "max_steps_per_epoch",
    "clip_grad_norm",
    "metric_logger",
    "log_every_n_steps",
    "log_peak_memory_stats",
    "log_level",
    "device",
    "profiler",
    "model.lora_alpha",
    "enable_activation_offloading",
    "optimizer_in_bwd",
];

/// Whether a YAML document is a torchtune recipe: its model is built by a `_component_`.
pub(super) fn looks_like(doc: &Value) -> bool {
    doc.pointer("/model/_component_").is_some_and(Value::is_string)
}

pub(super) fn read(text: &str) -> Result<Read, String> {
    let doc: Value = serde_norway::from_str(text).map_err(|e| format!("not YAML: {e}"))?;
    if !looks_like(&doc) {
        return Err("not a torchtune recipe: no model._component_".into());
    }
    let mut f = Fields::new(&doc);
    let mut r = TrainRequest::default();
    let model = model(&mut f, &mut r)?;
    r.micro_batch = f.positive("batch_size")?.unwrap_or(r.micro_batch);
    r.accumulation = f.positive("gradient_accumulation_steps")?.unwrap_or(r.accumulation);
    match f.take("tokenizer.max_seq_len") {
        Some(v) => {
            r.seq = super::fields::whole(&v).filter(|n| *n > 0).ok_or_else(|| {
                format!("tokenizer.max_seq_len: expected a positive whole number, found {}", shown(&v))
            })?
        }
        None => f.ignore(
            "tokenizer.max_seq_len",
            "null: samples are as long as the data's; planned at --seq (2048 unless given)",
        ),
    }
    r.precision = match f.str("dtype")?.as_deref() {
        None | Some("bf16") => Precision::Bf16,
        Some("fp32") => Precision::Fp32,
        Some(other) => return Err(format!("dtype: {other:?} is not bf16 or fp32")),
    };
    if f.bool("enable_activation_checkpointing")? == Some(true) {
        r.checkpointing = Checkpointing::Full;
    }
    if f.bool("compile")? == Some(true) {
        r.compile = Compile::All;
    }
    optimizer(&mut f, &mut r)?;
    unexpressible(&mut f)?;
    Ok(Read {
        format: Format::Torchtune,
        model: Some(model),
        asked: Asked::Train(r),
        ignored: f.finish(NO_BEARING, "torchtune"),
    })
}

fn model(f: &mut Fields, r: &mut TrainRequest) -> Result<ModelName, String> {
    let component = f.str("model._component_")?.unwrap_or_default();
    let builder = component.rsplit('.').next().unwrap_or("");
    let (mode, base) = if let Some(b) = builder.strip_prefix("qlora_") {
        (FinetuneMode::Qlora, b)
    } else if let Some(b) = builder.strip_prefix("lora_") {
        (FinetuneMode::Lora, b)
    } else {
        (FinetuneMode::Full, builder)
    };
    let Some((_, preset)) = MODELS.iter().find(|(b, _)| *b == base) else {
        return Err(format!(
            "model._component_: {component:?} builds a model the planner does not know; it knows {} (with lora_ or \
             qlora_ before them), or give --model with the model's config.json",
            MODELS.iter().map(|m| m.0).collect::<Vec<_>>().join(", ")
        ));
    };
    r.finetune = mode;
    if mode != FinetuneMode::Full {
        r.lora_rank = f.positive("model.lora_rank")?;
        lora_targets(f, r)?;
        if f.take("model.lora_dropout").and_then(|v| v.as_f64()).is_some_and(|p| p > 0.0) {
            f.ignore("model.lora_dropout", "dropout's masks on the adapters' inputs are not planned");
        }
    }
    Ok(ModelName { name: preset.to_string(), field: "model._component_".into() })
}

fn lora_targets(f: &mut Fields, r: &mut TrainRequest) -> Result<(), String> {
    let attn: Vec<String> = match f.take("model.lora_attn_modules") {
        None => Vec::new(),
        Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
        Some(v) => return Err(format!("model.lora_attn_modules: expected a list, found {}", shown(&v))),
    };
    let mlp = f.bool("model.apply_lora_to_mlp")?.unwrap_or(false);
    let has = |m: &str| attn.iter().any(|a| a == m);
    let all_attn = ["q_proj", "k_proj", "v_proj", "output_proj"].iter().all(|m| has(m));
    r.lora_targets = Some(if mlp || all_attn {
        if !(mlp && all_attn) {
            f.ignore(
                "model.lora_attn_modules",
                format!(
                    "{attn:?} with apply_lora_to_mlp {mlp}: planned as adapters on every linear layer (--lora-targets \
                     all), a little more than these"
                ),
            );
        }
        LoraTargets::All
    } else {
        if attn.iter().any(|a| a != "q_proj" && a != "v_proj") {
            f.ignore(
                "model.lora_attn_modules",
                format!("{attn:?}: planned as the query and value projections (--lora-targets qv)"),
            );
        }
        LoraTargets::QueryValue
    });
    if f.bool("model.apply_lora_to_output")? == Some(true) {
        f.ignore("model.apply_lora_to_output", "an adapter on the output projection is not planned");
    }
    Ok(())
}

fn optimizer(f: &mut Fields, r: &mut TrainRequest) -> Result<(), String> {
    let component = f.str("optimizer._component_")?.unwrap_or_else(|| "torch.optim.AdamW".into());
    let name = component.rsplit('.').next().unwrap_or("");
    match name {
        "AdamW" | "Adam" => {
            r.optimizer = Optimizer::AdamW;
            r.optimizer_impl = match f.bool("optimizer.fused")? {
                Some(true) => Some(OptimizerImpl::Fused),
                _ => match f.bool("optimizer.foreach")? {
                    Some(false) => Some(OptimizerImpl::ForLoop),
                    _ => None,
                },
            };
        }
        "AdamW8bit" | "PagedAdamW8bit" | "Adam8bit" | "PagedAdam8bit" => r.optimizer = Optimizer::Adam8bit,
        "SGD" => {
            let momentum = f.f64("optimizer.momentum")?.unwrap_or(0.0);
            r.optimizer = if momentum > 0.0 { Optimizer::SgdMomentum } else { Optimizer::Sgd };
        }
        "Adafactor" => r.optimizer = Optimizer::Adafactor,
        _ => f.ignore("optimizer._component_", format!("{component:?}: planned as AdamW")),
    }
    Ok(())
}

/// What torchtune runs that the planner cannot express, named with the recorder.
fn unexpressible(f: &mut Fields) -> Result<(), String> {
    if let Some(loss) = f.str("loss._component_")? {
        let name = loss.rsplit('.').next().unwrap_or("");
        if name != "CrossEntropyLoss" {
            f.ignore(
                "loss._component_",
                format!("{name}: a chunked or fused cross-entropy, whose logits the planner plans whole; {RECORD}"),
            );
        }
    }
    if f.bool("optimizer_in_bwd")? == Some(true) {
        f.ignore("optimizer_in_bwd", format!("the optimizer stepped inside the backward is not planned; {RECORD}"));
    }
    if f.bool("enable_activation_offloading")? == Some(true) {
        f.ignore("enable_activation_offloading", format!("activations offloaded to the CPU are not planned; {RECORD}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = include_str!("../../../../data/configs/torchtune-llama3_1-8B_lora_single_device.yaml");

    fn train(text: &str) -> (TrainRequest, Read) {
        let read = read(text).unwrap();
        (*read.train().unwrap_or_else(|| panic!("{:?}", read.asked)), read)
    }

    #[test]
    fn torchtune_s_llama_3_1_lora_recipe_reads_as_its_job() {
        let (r, read) = train(FILE);
        assert_eq!(read.model.as_ref().unwrap().name, "llama-3.1-8b");
        assert_eq!((r.finetune, r.lora_rank, r.lora_targets), (FinetuneMode::Lora, Some(8), Some(LoraTargets::All)));
        assert_eq!((r.micro_batch, r.accumulation, r.seq), (2, 8, 2048));
        assert_eq!((r.precision, r.checkpointing), (Precision::Bf16, Checkpointing::Full));
        assert_eq!(r.optimizer_impl, Some(OptimizerImpl::Fused));
        let why = |f: &str| read.ignored.iter().find(|i| i.field == f).map(|i| i.why.clone()).unwrap();
        assert!(why("loss._component_").contains("headroom_gpu record"));
        assert!(why("tokenizer.max_seq_len").contains("null"));
        assert!(why("model.lora_attn_modules").contains("every linear layer"));
    }

    #[test]
    fn what_the_planner_cannot_express_points_to_the_recorder() {
        let text = "model:\n  _component_: torchtune.models.llama3_1.qlora_llama3_1_8b\n  lora_attn_modules: ['q_proj', 'v_proj']\n\
                    tokenizer:\n  max_seq_len: 4096\nloss:\n  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss\n\
                    optimizer_in_bwd: True\nenable_activation_offloading: True\n";
        let (r, read) = train(text);
        assert_eq!((r.finetune, r.lora_targets, r.seq), (FinetuneMode::Qlora, Some(LoraTargets::QueryValue), 4096));
        for field in ["loss._component_", "optimizer_in_bwd", "enable_activation_offloading"] {
            let i = read.ignored.iter().find(|i| i.field == field).unwrap();
            assert!(i.why.contains("python -m headroom_gpu record"), "{field}: {}", i.why);
        }
    }

    #[test]
    fn unknown_builders_are_refused_by_field() {
        let e = read("model:\n  _component_: torchtune.models.clip.clip_vision_encoder\n").unwrap_err();
        assert!(e.contains("model._component_"), "{e}");
    }
}
