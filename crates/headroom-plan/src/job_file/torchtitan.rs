//! torchtitan's job TOML (`torchtitan/config/job_config.py`): `[model]`, `[training]`,
//! `[parallelism]`, `[activation_checkpoint]`, `[compile]`, `[optimizer]`, and torchao's float8
//! as a model converter. Where the file is silent, torchtitan's own defaults hold (a local
//! batch of 8, selective checkpointing of every other block, the fused AdamW), not the
//! planner's.

use super::fields::shown;
use super::{Asked, Fields, Format, ModelName, Read};
use crate::job::{Checkpointing, Framework, Optimizer, OptimizerImpl, Precision};
use crate::names::Named;
use crate::parallel::PipelineSchedule;
use crate::request::{Compile, TrainRequest};
use serde_json::Value;

/// torchtitan's `(model.name, model.flavor)` and the preset each is.
pub(crate) const MODELS: &[(&str, &str, &str)] = &[
    ("llama3", "8B", "llama-3.1-8b"),
    ("llama3", "70B", "llama-3.1-70b"),
    ("llama3", "405B", "llama-3.1-405b"),
    ("llama2", "7B", "llama-2-7b"),
    ("llama2", "13B", "llama-2-13b"),
    ("llama2", "70B", "llama-2-70b"),
];

/// Sections and fields with no bearing on a step's memory.
const NO_BEARING: &[&str] = &[
    "job",
    "profiling",
    "metrics",
    "lr_scheduler",
    "checkpoint",
    "validation",
    "comm",
    "fault_tolerance",
    "memory_estimation",
    "experimental",
    "model.tokenizer_path",
    "model.hf_assets_path",
    "optimizer.lr",
    "optimizer.eps",
    "optimizer.beta1",
    "optimizer.beta2",
    "optimizer.weight_decay",
    "training.max_norm",
    "training.steps",
    "training.dataset",
    "training.dataset_path",
    "training.seed",
    "training.deterministic",
    "training.gc_freq",
    "parallelism.pipeline_parallel_layers_per_stage",
    "parallelism.disable_loss_parallel",
];

pub(super) fn read(text: &str) -> Result<Read, String> {
    let doc: Value = toml::from_str(text).map_err(|e| format!("not TOML: {}", e.message()))?;
    let mut f = Fields::new(&doc);
    if !["model", "training", "parallelism"].iter().any(|s| f.has(s)) {
        return Err("not a torchtitan job file: it has no [model], [training] or [parallelism] table".into());
    }
    let model = model(&mut f)?;
    let mut r = TrainRequest { framework: Framework::Torchtitan, ..TrainRequest::default() };
    training(&mut f, &mut r)?;
    parallelism(&mut f, &mut r)?;
    checkpointing(&mut f, &mut r)?;
    compile_and_optimizer(&mut f, &mut r)?;
    Ok(Read {
        format: Format::Torchtitan,
        model: Some(model),
        asked: Asked::Train(r),
        ignored: f.finish(NO_BEARING, "torchtitan"),
    })
}

fn model(f: &mut Fields) -> Result<ModelName, String> {
    let name = f.str("model.name")?.unwrap_or_else(|| "llama3".into());
    let flavor = f.str("model.flavor")?.unwrap_or_else(|| "debugmodel".into());
    let preset = MODELS.iter().find(|(n, fl, _)| *n == name && fl.eq_ignore_ascii_case(&flavor)).map(|m| m.2);
    let Some(preset) = preset else {
        return Err(format!(
            "model.name {name:?}, model.flavor {flavor:?}: not a model the planner knows; it plans {} (or give \
             --model with the model's config.json)",
            MODELS.iter().map(|(n, fl, _)| format!("{n} {fl}")).collect::<Vec<_>>().join(", ")
        ));
    };
    Ok(ModelName { name: preset.into(), field: "model.flavor".into() })
}

/// Whether `converters` names torchao's float8 training.
fn float8(f: &mut Fields) -> Result<bool, String> {
    let Some(v) = f.take("model.converters") else { return Ok(false) };
    let names: Vec<String> = match &v {
        Value::String(s) => s.split(',').map(|s| s.trim().to_string()).collect(),
        Value::Array(a) => a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
        v => return Err(format!("model.converters: expected a list of names, found {}", shown(v))),
    };
    let mut fp8 = false;
    for n in names.iter().filter(|n| !n.is_empty()) {
        if n == "float8" || n == "quantize.linear.float8" {
            fp8 = true;
        } else {
            f.ignore(format!("model.converters {n:?}"), "a converter the planner does not model");
        }
    }
    Ok(fp8)
}

fn training(f: &mut Fields, r: &mut TrainRequest) -> Result<(), String> {
    let local = match f.positive("training.local_batch_size")? {
        Some(b) => b,
        // Before torchtitan named it local_batch_size (2025).
        None => f.positive("training.batch_size")?.unwrap_or(8),
    };
    r.micro_batch = local;
    r.seq = f.positive("training.seq_len")?.unwrap_or(2048);
    if let Some(k) = f.positive("training.gradient_accumulation_steps")? {
        r.accumulation = k;
    }
    let fp8 = float8(f)?;
    r.precision = match f.str("training.mixed_precision_param")?.as_deref() {
        _ if fp8 => Precision::Fp8,
        None | Some("bfloat16") => Precision::Mixed,
        Some("float32") => Precision::Fp32,
        Some(other) => return Err(format!("training.mixed_precision_param: {other:?} is not bfloat16 or float32")),
    };
    if !fp8 {
        for section in ["float8", "quantize.linear.float8"] {
            f.not_honoured(section, "applies with model.converters = [\"float8\"], which this file does not set");
        }
    } else {
        f.not_honoured("float8", "the planner's float8 is torchtitan's default recipe with its fp8 all-gather");
        f.not_honoured("quantize", "the planner's float8 is torchtitan's default recipe with its fp8 all-gather");
    }
    if let Some(p) = f.str("training.mixed_precision_reduce")? {
        if p != "float32" {
            f.ignore("training.mixed_precision_reduce", format!("{p:?}: the planner reduces in float32"));
        }
    }
    // Before [compile] (2025): the blocks compiled, the loss eager.
    if f.bool("training.compile")? == Some(true) {
        r.compile = Compile::Model;
    }
    Ok(())
}

fn degree(f: &mut Fields, path: &str) -> Result<u64, String> {
    match f.take(path) {
        None => Ok(1),
        Some(v) => match v.as_i64() {
            Some(n) if n >= 1 => Ok(n as u64),
            _ => Err(format!("{path}: expected a positive degree, found {}", shown(&v))),
        },
    }
}

fn parallelism(f: &mut Fields, r: &mut TrainRequest) -> Result<(), String> {
    r.replicate = degree(f, "parallelism.data_parallel_replicate_degree")?;
    r.tensor = degree(f, "parallelism.tensor_parallel_degree")?;
    r.pipeline = degree(f, "parallelism.pipeline_parallel_degree")?;
    r.context = degree(f, "parallelism.context_parallel_degree")?;
    // -1 (the default): every GPU left over, which --gpus says.
    let shard = match f.take("parallelism.data_parallel_shard_degree") {
        None => None,
        Some(v) => match v.as_i64() {
            Some(-1) => None,
            Some(n) if n >= 1 => Some(n as u64),
            _ => {
                return Err(format!(
                    "parallelism.data_parallel_shard_degree: expected -1 or a positive degree, found {}",
                    shown(&v)
                ))
            }
        },
    };
    let model_parallel = r.tensor * r.pipeline * r.context;
    r.gpus = match shard {
        Some(s) => r.replicate * s * model_parallel,
        None => r.replicate * model_parallel,
    };
    global_batch(f, r, shard.map(|s| r.replicate * s))?;
    let schedule = f.str("parallelism.pipeline_parallel_schedule")?;
    let micro = f.positive("parallelism.pipeline_parallel_microbatch_size")?;
    if r.pipeline == 1 {
        for (field, set) in [
            ("parallelism.pipeline_parallel_schedule", schedule.is_some()),
            ("parallelism.pipeline_parallel_microbatch_size", micro.is_some()),
        ] {
            if set {
                f.ignore(field, "applies with pipeline_parallel_degree above 1");
            }
        }
        return Ok(());
    }
    let class = schedule.unwrap_or_else(|| "1F1B".into());
    let known = PipelineSchedule::ALL.iter().find(|s| s.class().eq_ignore_ascii_case(&class));
    let Some(&s) = known else {
        return Err(format!(
            "parallelism.pipeline_parallel_schedule: {class:?} is not a schedule the planner runs ({})",
            PipelineSchedule::ALL.iter().map(|s| s.class()).collect::<Vec<_>>().join(", ")
        ));
    };
    r.schedule = Some(s);
    // The local batch split into micro-batches of pipeline_parallel_microbatch_size.
    let micro = micro.unwrap_or(1);
    if !r.micro_batch.is_multiple_of(micro) {
        return Err(format!(
            "parallelism.pipeline_parallel_microbatch_size {micro} does not divide training.local_batch_size {}",
            r.micro_batch
        ));
    }
    r.accumulation *= r.micro_batch / micro;
    r.micro_batch = micro;
    Ok(())
}

/// `training.global_batch_size`: the local batches one step accumulates over the
/// data-parallel GPUs, where the file gives their number (`data_parallel_shard_degree`).
fn global_batch(f: &mut Fields, r: &mut TrainRequest, data: Option<u64>) -> Result<(), String> {
    let Some(g) = f.take("training.global_batch_size") else { return Ok(()) };
    let Some(global) = g.as_i64().and_then(|g| u64::try_from(g).ok()).filter(|&g| g > 0) else {
        return Ok(());
    };
    let Some(data) = data else {
        f.ignore(
            "training.global_batch_size",
            "its accumulation depends on the data-parallel degree (data_parallel_shard_degree = -1): give \
             --accumulation",
        );
        return Ok(());
    };
    let step = r.micro_batch * data;
    if !global.is_multiple_of(step) {
        return Err(format!(
            "training.global_batch_size {global} is not a whole number of local batches of {} over {data} \
             data-parallel GPUs",
            r.micro_batch
        ));
    }
    r.accumulation *= global / step;
    Ok(())
}

fn checkpointing(f: &mut Fields, r: &mut TrainRequest) -> Result<(), String> {
    let mode = f.str("activation_checkpoint.mode")?.unwrap_or_else(|| "selective".into());
    let given = f.take("activation_checkpoint.selective_ac_option");
    let option = match &given {
        None => "2".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => shown(v),
    };
    r.checkpointing = match mode.as_str() {
        "none" => Checkpointing::None,
        "full" => Checkpointing::Full,
        "selective" if option == "op" => Checkpointing::PerOp,
        "selective" => match option.parse::<u64>() {
            Ok(1) => Checkpointing::Full,
            Ok(k) if k > 1 => Checkpointing::EveryK(k),
            _ => {
                return Err(format!(
                    "activation_checkpoint.selective_ac_option: {option:?} is not \"op\" or a positive number of blocks"
                ))
            }
        },
        other => {
            return Err(format!(
                "activation_checkpoint.mode: {other:?} is not none, full or selective (the ones the planner models)"
            ))
        }
    };
    if mode != "selective" && given.is_some() {
        // Read above; it applies to selective mode alone.
        f.ignore("activation_checkpoint.selective_ac_option", "applies with mode = \"selective\"");
    }
    f.not_honoured("activation_checkpoint", "a checkpointing setting the planner does not model");
    Ok(())
}

fn compile_and_optimizer(f: &mut Fields, r: &mut TrainRequest) -> Result<(), String> {
    let components = match f.take("compile.components") {
        None => vec!["model".to_string(), "loss".to_string()],
        Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
        Some(v) => return Err(format!("compile.components: expected a list, found {}", shown(&v))),
    };
    if f.bool("compile.enable")? == Some(true) {
        let (model, loss) = (components.iter().any(|c| c == "model"), components.iter().any(|c| c == "loss"));
        r.compile = match (model, loss) {
            (true, true) => Compile::All,
            (true, false) => Compile::Model,
            _ => {
                f.ignore("compile.components", "the loss compiled alone: the planner plans it eager");
                Compile::Off
            }
        };
    }
    match f.str("optimizer.name")?.as_deref() {
        None | Some("AdamW" | "Adam") => r.optimizer = Optimizer::AdamW,
        Some(other) => f.ignore(
            "optimizer.name",
            format!("{other:?}: planned as AdamW, the optimizer the planner has of torchtitan's"),
        ),
    }
    r.optimizer_impl = Some(match f.str("optimizer.implementation")?.as_deref() {
        None | Some("fused") => OptimizerImpl::Fused,
        Some("foreach") => OptimizerImpl::Foreach,
        Some("for-loop") => OptimizerImpl::ForLoop,
        Some(other) => return Err(format!("optimizer.implementation: {other:?} is not fused, foreach or for-loop")),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = include_str!("../../../../data/configs/torchtitan-llama3_8b.toml");

    fn train(text: &str) -> (TrainRequest, Read) {
        let read = read(text).unwrap();
        (*read.train().unwrap_or_else(|| panic!("{:?}", read.asked)), read)
    }

    #[test]
    fn torchtitan_s_published_8b_file_reads_as_its_job() {
        let (r, read) = train(FILE);
        assert_eq!(read.model.as_ref().unwrap().name, "llama-3.1-8b");
        assert_eq!((r.micro_batch, r.seq, r.gpus), (1, 8192, 1));
        assert_eq!(r.checkpointing, Checkpointing::PerOp);
        assert_eq!(r.framework, Framework::Torchtitan);
        assert_eq!(r.precision, Precision::Mixed);
        assert_eq!(r.optimizer_impl, Some(OptimizerImpl::Fused));
        assert_eq!(r.compile, Compile::Off);
        let named = |f: &str| read.ignored.iter().find(|i| i.field == f).map(|i| i.why.clone());
        assert!(named("quantize.linear.float8.filter_fqns").unwrap().contains("converters"));
        assert_eq!(named("optimizer.lr").unwrap(), super::super::NO_BEARING);
        assert_eq!(named("training.max_norm").unwrap(), super::super::NO_BEARING);
    }

    #[test]
    fn degrees_schedules_and_float8_are_read() {
        let text = "[model]\nname = \"llama3\"\nflavor = \"70B\"\nconverters = [\"float8\"]\n[training]\n\
                    local_batch_size = 4\nseq_len = 4096\n[parallelism]\ndata_parallel_shard_degree = 4\n\
                    tensor_parallel_degree = 8\npipeline_parallel_degree = 2\n\
                    pipeline_parallel_schedule = \"Interleaved1F1B\"\n[activation_checkpoint]\nmode = \"full\"\n\
                    [compile]\nenable = true\ncomponents = [\"model\"]\n";
        let (r, read) = train(text);
        assert_eq!(read.model.unwrap().name, "llama-3.1-70b");
        assert_eq!((r.gpus, r.tensor, r.pipeline), (64, 8, 2));
        assert_eq!((r.micro_batch, r.accumulation), (1, 4));
        assert_eq!(r.schedule, Some(PipelineSchedule::Interleaved1F1B));
        assert_eq!((r.precision, r.checkpointing, r.compile), (Precision::Fp8, Checkpointing::Full, Compile::Model));
        assert!(r.config().is_ok());
    }

    #[test]
    fn the_global_batch_is_local_batches_accumulated_over_the_data_parallel_gpus() {
        let file = |shard: i64, global: u64| {
            format!(
                "[model]\nflavor = \"8B\"\n[training]\nlocal_batch_size = 2\nglobal_batch_size = {global}\n\
                 [parallelism]\ndata_parallel_shard_degree = {shard}\n"
            )
        };
        let (r, got) = train(&file(8, 64));
        assert_eq!((r.micro_batch, r.accumulation, r.gpus), (2, 4, 8));
        assert!(got.ignored.iter().all(|i| i.field != "training.global_batch_size"));
        // The data-parallel GPUs are --gpus' to say.
        let (r, got) = train(&file(-1, 64));
        assert_eq!(r.accumulation, 1);
        assert!(got.ignored.iter().any(|i| i.field == "training.global_batch_size"));
        assert!(read(&file(8, 60)).unwrap_err().contains("not a whole number of local batches"));
    }

    #[test]
    fn torchtitan_s_defaults_hold_where_the_file_is_silent() {
        let (r, _) = train("[model]\nflavor = \"8B\"\n");
        assert_eq!((r.micro_batch, r.seq), (8, 2048));
        assert_eq!(r.checkpointing, Checkpointing::EveryK(2));
    }

    #[test]
    fn unknown_flavors_and_non_torchtitan_files_are_refused_by_field() {
        assert!(read("[model]\nflavor = \"debugmodel\"\n").unwrap_err().contains("model.flavor"));
        assert!(read("[package]\nname = \"x\"\n").unwrap_err().contains("not a torchtitan job file"));
        assert!(read("[model]\nflavor = \"8B\"\n[training]\nseq_len = \"long\"\n")
            .unwrap_err()
            .contains("training.seq_len"));
    }
}
