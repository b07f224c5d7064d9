//! A DeepSpeed config JSON as transformers' Trainer hands it to DeepSpeed: ZeRO's stage and
//! offload, fp16 / bf16, the batch sizes; its `"auto"` values are filled from
//! `TrainingArguments` (`--hf-args`, as JSON), as transformers' `HfTrainerDeepSpeedConfig`
//! fills them, and so are what the DeepSpeed file leaves to the Trainer (the optimizer, the
//! checkpointing).

use super::fields::shown;
use super::{Asked, Fields, Format, Read};
use crate::job::{Checkpointing, Framework, Offload, Optimizer, OptimizerImpl, Precision};
use crate::request::TrainRequest;
use serde_json::Value;

const NO_BEARING: &[&str] = &[
    "scheduler",
    "steps_per_print",
    "wall_clock_breakdown",
    "gradient_clipping",
    "optimizer.params",
    "fp16.loss_scale",
    "fp16.loss_scale_window",
    "fp16.initial_scale_power",
    "fp16.hysteresis",
    "fp16.min_loss_scale",
    "zero_optimization.offload_optimizer.pin_memory",
    "zero_optimization.offload_param.pin_memory",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save",
    "tensorboard",
    "wandb",
    "csv_monitor",
    "flops_profiler",
    "comms_logger",
    "zero_allow_untested_optimizer",
];

/// ZeRO's buckets and thresholds: the planner plans DeepSpeed's defaults.
const BUCKETS: &[&str] = &[
    "overlap_comm",
    "contiguous_gradients",
    "sub_group_size",
    "reduce_bucket_size",
    "allgather_bucket_size",
    "allgather_partitions",
    "reduce_scatter",
    "round_robin_gradients",
    "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
];

/// `TrainingArguments` with no bearing on memory.
const HF_NO_BEARING: &[&str] = &[
    "output_dir",
    "overwrite_output_dir",
    "learning_rate",
    "num_train_epochs",
    "max_steps",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "lr_scheduler_type",
    "warmup_ratio",
    "warmup_steps",
    "logging_dir",
    "logging_steps",
    "logging_strategy",
    "save_steps",
    "save_strategy",
    "save_total_limit",
    "eval_steps",
    "eval_strategy",
    "evaluation_strategy",
    "per_device_eval_batch_size",
    "seed",
    "report_to",
    "run_name",
    "deepspeed",
    "do_train",
    "do_eval",
];

/// transformers' Trainer's defaults, where `--hf-args` does not say.
const HF_BATCH: u64 = 8;

/// A value that may be `"auto"`: absent, `"auto"` (transformers fills it), or set.
enum Given<T> {
    Absent,
    Auto,
    Set(T),
}

fn auto_u64(f: &mut Fields, path: &str) -> Result<Given<u64>, String> {
    match f.take(path) {
        None => Ok(Given::Absent),
        Some(Value::String(s)) if s == "auto" => Ok(Given::Auto),
        Some(v) => match super::fields::whole(&v).filter(|n| *n > 0) {
            Some(n) => Ok(Given::Set(n)),
            None => Err(format!("{path}: expected a positive whole number or \"auto\", found {}", shown(&v))),
        },
    }
}

fn auto_bool(f: &mut Fields, path: &str) -> Result<Given<bool>, String> {
    match f.take(path) {
        None => Ok(Given::Absent),
        Some(Value::String(s)) if s == "auto" => Ok(Given::Auto),
        Some(Value::Bool(b)) => Ok(Given::Set(b)),
        Some(v) => Err(format!("{path}: expected true, false or \"auto\", found {}", shown(&v))),
    }
}

/// The `TrainingArguments` `--hf-args` gives, where given.
struct HfArgs {
    name: String,
    fields: Fields,
}

impl HfArgs {
    fn parse((name, text): (&str, &str)) -> Result<HfArgs, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("--hf-args {name}: not JSON: {e}"))?;
        if !v.is_object() {
            return Err(format!("--hf-args {name}: not TrainingArguments (expected a JSON object)"));
        }
        Ok(HfArgs { name: name.to_string(), fields: Fields::new(&v) })
    }

    fn err(&self, e: String) -> String {
        format!("--hf-args {}: {e}", self.name)
    }
}

/// The value of `"auto"` `field`, from `TrainingArguments` `hf_field` (transformers' default
/// where they do not say); refused without `--hf-args`.
fn filled<T>(
    hf: &mut Option<HfArgs>,
    field: &str,
    hf_field: &str,
    get: impl Fn(&mut Fields, &str) -> Result<Option<T>, String>,
    default: T,
) -> Result<T, String> {
    let Some(h) = hf.as_mut() else {
        return Err(format!(
            "{field} is \"auto\": transformers fills it from TrainingArguments ({hf_field}); give them with --hf-args \
             FILE (TrainingArguments as JSON)"
        ));
    };
    let v = get(&mut h.fields, hf_field).map_err(|e| h.err(e))?;
    Ok(v.unwrap_or(default))
}

pub(super) fn read(text: &str, hf_args: Option<(&str, &str)>) -> Result<Read, String> {
    let doc: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let mut f = Fields::new(&doc);
    let keys = ["zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size", "fp16", "bf16"];
    if !keys.iter().any(|k| f.has(k)) {
        return Err(format!("not a DeepSpeed config: it has none of {}", keys.join(", ")));
    }
    let mut hf = hf_args.map(HfArgs::parse).transpose()?;
    let mut r = TrainRequest { framework: Framework::DeepSpeed, ..TrainRequest::default() };
    batches(&mut f, &mut hf, &mut r)?;
    r.precision = precision(&mut f, &mut hf)?;
    zero(&mut f, &mut r)?;
    optimizer(&mut f, &mut hf, &mut r)?;
    f.not_honoured(
        "activation_checkpointing",
        "DeepSpeed's checkpointing API, which transformers' models do not call (gradient_checkpointing in \
         TrainingArguments is what checkpoints)",
    );
    let mut ignored = f.finish(NO_BEARING, "DeepSpeed");
    if let Some(mut h) = hf {
        let name = h.name.clone();
        if let Some(true) = h.fields.bool("gradient_checkpointing").map_err(|e| h.err(e))? {
            r.checkpointing = Checkpointing::Full;
        }
        for i in h.fields.finish(HF_NO_BEARING, "TrainingArguments") {
            ignored.push(super::Ignored { field: format!("{name}: {}", i.field), why: i.why });
        }
    }
    Ok(Read { format: Format::DeepSpeed, model: None, asked: Asked::Train(r), ignored })
}

fn batches(f: &mut Fields, hf: &mut Option<HfArgs>, r: &mut TrainRequest) -> Result<(), String> {
    let per_device = |f: &mut Fields, p: &str| f.positive(p);
    let micro_field = "train_micro_batch_size_per_gpu";
    r.micro_batch = match auto_u64(f, micro_field)? {
        Given::Set(n) => n,
        Given::Auto => filled(hf, micro_field, "per_device_train_batch_size", per_device, HF_BATCH)?,
        Given::Absent if hf.is_some() => filled(hf, micro_field, "per_device_train_batch_size", per_device, HF_BATCH)?,
        Given::Absent => r.micro_batch,
    };
    let acc_field = "gradient_accumulation_steps";
    r.accumulation = match auto_u64(f, acc_field)? {
        Given::Set(n) => n,
        Given::Auto => filled(hf, acc_field, acc_field, per_device, 1)?,
        Given::Absent if hf.is_some() => filled(hf, acc_field, acc_field, per_device, 1)?,
        Given::Absent => r.accumulation,
    };
    match auto_u64(f, "train_batch_size")? {
        Given::Set(n) => {
            let step = r.micro_batch * r.accumulation;
            if !n.is_multiple_of(step) {
                return Err(format!(
                    "train_batch_size {n} is not a multiple of the micro-batch {} × accumulation {}",
                    r.micro_batch, r.accumulation
                ));
            }
            r.gpus = n / step;
        }
        Given::Auto => f.ignore("train_batch_size", "\"auto\": the micro-batches of every GPU (--gpus)"),
        Given::Absent => {}
    }
    Ok(())
}

fn precision(f: &mut Fields, hf: &mut Option<HfArgs>) -> Result<Precision, String> {
    // The Trainer's own flags, which fill "auto" and stand where the file has neither section.
    let mut trainer = [false, false];
    if let Some(h) = hf.as_mut() {
        for (i, key) in ["fp16", "bf16"].iter().enumerate() {
            trainer[i] = h.fields.bool(key).map_err(|e| h.err(e))?.unwrap_or(false);
        }
    }
    let sections = f.has("fp16") || f.has("bf16");
    let mut half = !sections && trainer.iter().any(|t| *t);
    for (i, key) in ["fp16", "bf16"].iter().enumerate() {
        let field = format!("{key}.enabled");
        half |= match auto_bool(f, &field)? {
            Given::Set(b) => b,
            Given::Auto if hf.is_none() => filled(hf, &field, key, |f, p| f.bool(p), false)?,
            Given::Auto => trainer[i],
            // A section with no `enabled` is off, as DeepSpeed reads it.
            Given::Absent => false,
        };
    }
    // 16-bit weights and gradients, DeepSpeed's fp32 master copy in the optimizer.
    Ok(if half { Precision::Mixed } else { Precision::Fp32 })
}

fn offload_device(f: &mut Fields, path: &str) -> Result<bool, String> {
    match f.str(path)?.as_deref() {
        None | Some("none") => Ok(false),
        Some("cpu") => Ok(true),
        Some("nvme") => {
            f.ignore(path, "\"nvme\": planned as \"cpu\", either way off the GPU");
            Ok(true)
        }
        Some(other) => Err(format!("{path}: {other:?} is not none, cpu or nvme")),
    }
}

fn zero(f: &mut Fields, r: &mut TrainRequest) -> Result<(), String> {
    let stage = f.u64("zero_optimization.stage")?.unwrap_or(0);
    if stage > 3 {
        return Err(format!("zero_optimization.stage: {stage} is not 0, 1, 2 or 3"));
    }
    r.zero = Some(stage as u8);
    let optimizer = offload_device(f, "zero_optimization.offload_optimizer.device")?;
    let params = offload_device(f, "zero_optimization.offload_param.device")?;
    r.offload = match (optimizer, params) {
        (true, true) => Offload::OptimizerAndParams,
        (true, false) => Offload::Optimizer,
        (false, true) => {
            f.ignore(
                "zero_optimization.offload_param.device",
                "the parameters offloaded without the optimizer: the planner offloads them together; planned with \
                 neither",
            );
            Offload::None
        }
        (false, false) => Offload::None,
    };
    for b in BUCKETS {
        f.not_honoured(&format!("zero_optimization.{b}"), "the planner plans DeepSpeed's default buckets");
    }
    Ok(())
}

/// transformers' `optim` names.
fn hf_optimizer(name: &str) -> Option<(Optimizer, Option<OptimizerImpl>)> {
    Some(match name {
        "adamw_torch" | "adamw_hf" => (Optimizer::AdamW, Some(OptimizerImpl::Foreach)),
        "adamw_torch_fused" => (Optimizer::AdamW, Some(OptimizerImpl::Fused)),
        "adafactor" => (Optimizer::Adafactor, None),
        "adamw_bnb_8bit" | "adamw_8bit" | "paged_adamw_8bit" => (Optimizer::Adam8bit, None),
        "sgd" => (Optimizer::Sgd, None),
        _ => return None,
    })
}

fn optimizer(f: &mut Fields, hf: &mut Option<HfArgs>, r: &mut TrainRequest) -> Result<(), String> {
    let hf_optim = match hf.as_mut() {
        Some(h) => h.fields.str("optim").map_err(|e| h.err(e))?,
        None => None,
    };
    if let Some(kind) = f.str("optimizer.type")? {
        // DeepSpeed's own optimizer runs, not the Trainer's.
        if !matches!(kind.to_ascii_lowercase().as_str(), "adam" | "adamw") {
            f.ignore("optimizer.type", format!("{kind:?}: planned as DeepSpeed's Adam"));
        }
        if let (Some(o), Some(h)) = (hf_optim, hf.as_ref()) {
            let field = format!("{}: optim", h.name);
            f.ignore(field, format!("{o:?}: the DeepSpeed config's optimizer runs instead"));
        }
        return Ok(());
    }
    if let Some(o) = hf_optim {
        match hf_optimizer(&o) {
            Some((opt, imp)) => {
                r.optimizer = opt;
                r.optimizer_impl = imp;
            }
            None => f.ignore(
                format!("{}: optim", hf.as_ref().map_or("", |h| h.name.as_str())),
                format!("{o:?}: planned as AdamW"),
            ),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = include_str!("../../../../data/configs/deepspeed-ds_config_zero3.json");
    const HF: &str = include_str!("../../../../data/configs/hf-training-args.json");

    fn train(read: &Read) -> TrainRequest {
        match read.asked {
            Asked::Train(r) => r,
            _ => panic!("inference"),
        }
    }

    #[test]
    fn transformers_zero3_offload_config_reads_as_its_job() {
        let read = read(FILE, Some(("args.json", HF))).unwrap();
        let r = train(&read);
        assert_eq!(r.zero, Some(3));
        assert_eq!(r.offload, Offload::OptimizerAndParams);
        assert_eq!(r.precision, Precision::Mixed);
        assert_eq!((r.micro_batch, r.accumulation), (1, 4));
        assert_eq!(r.checkpointing, Checkpointing::Full);
        assert_eq!(r.framework, Framework::DeepSpeed);
        let why = |f: &str| read.ignored.iter().find(|i| i.field == f).map(|i| i.why.clone()).unwrap();
        assert!(why("zero_optimization.stage3_max_live_parameters").contains("default buckets"));
        assert!(why("args.json: optim").contains("DeepSpeed config's optimizer"));
        assert_eq!(why("scheduler.type"), super::super::NO_BEARING);
    }

    #[test]
    fn auto_values_need_the_training_arguments() {
        let text = r#"{"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}}"#;
        let e = read(text, None).unwrap_err();
        assert!(e.contains("train_micro_batch_size_per_gpu") && e.contains("--hf-args"), "{e}");
        let r = train(&read(text, Some(("a.json", r#"{"per_device_train_batch_size": 4}"#))).unwrap());
        assert_eq!((r.micro_batch, r.zero), (4, Some(2)));
        let defaults = train(&read(text, Some(("a.json", "{}"))).unwrap());
        assert_eq!(defaults.micro_batch, HF_BATCH);
    }

    #[test]
    fn the_global_batch_gives_the_gpus_and_other_json_is_refused() {
        let text = r#"{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
                      "bf16": {"enabled": true}}"#;
        let r = train(&read(text, None).unwrap());
        assert_eq!((r.gpus, r.precision), (8, Precision::Mixed));
        assert!(read(r#"{"name": "x"}"#, None).unwrap_err().contains("not a DeepSpeed config"));
        assert!(read(r#"{"zero_optimization": {"stage": 5}}"#, None).unwrap_err().contains("zero_optimization.stage"));
    }
}
