//! accelerate's config YAML (`accelerate config`, `accelerate launch --config_file`): the
//! processes, the mixed precision, and the FSDP or DeepSpeed section. It names no model and no
//! batch: those are the script's (`--model`, `--batch`, `--seq`).

use super::fields::shown;
use super::{Asked, Fields, Format, Read};
use crate::job::{Checkpointing, Framework, Offload, Precision};
use crate::request::TrainRequest;
use serde_json::Value;

const NO_BEARING: &[&str] = &[
    "compute_environment",
    "debug",
    "downcast_bf16",
    "enable_cpu_affinity",
    "gpu_ids",
    "machine_rank",
    "main_process_ip",
    "main_process_port",
    "main_training_function",
    "num_machines",
    "rdzv_backend",
    "same_network",
    "tpu_env",
    "tpu_use_cluster",
    "tpu_use_sudo",
    "use_cpu",
    "fsdp_config.fsdp_auto_wrap_policy",
    "fsdp_config.fsdp_transformer_layer_cls_to_wrap",
    "fsdp_config.fsdp_cpu_ram_efficient_loading",
    "fsdp_config.fsdp_state_dict_type",
    "fsdp_config.fsdp_sync_module_states",
    "fsdp_config.fsdp_use_orig_params",
    "fsdp_config.fsdp_version",
    "deepspeed_config.zero3_init_flag",
    "deepspeed_config.zero3_save_16bit_model",
    "deepspeed_config.deepspeed_multinode_launcher",
    "deepspeed_config.gradient_clipping",
];

/// Whether a YAML document is accelerate's config.
pub(super) fn looks_like(doc: &Value) -> bool {
    doc.get("distributed_type").is_some_and(Value::is_string)
        || (doc.get("num_processes").is_some() && doc.get("compute_environment").is_some())
}

pub(super) fn read(text: &str) -> Result<Read, String> {
    let doc: Value = serde_norway::from_str(text).map_err(|e| format!("not YAML: {e}"))?;
    if !looks_like(&doc) {
        return Err("not accelerate's config: no distributed_type".into());
    }
    let mut f = Fields::new(&doc);
    let mut r = TrainRequest::default();
    if let Some(n) = f.positive("num_processes")? {
        r.gpus = n;
    }
    let kind = f.str("distributed_type")?.unwrap_or_else(|| "NO".into());
    // torch.autocast over fp32 weights, save where a sharding engine keeps 16-bit copies.
    let sharded = matches!(kind.as_str(), "FSDP" | "DEEPSPEED");
    r.precision = match f.str("mixed_precision")?.as_deref() {
        None | Some("no") => Precision::Fp32,
        Some("bf16" | "fp16") if sharded => Precision::Mixed,
        Some("bf16" | "fp16") => Precision::Amp,
        Some("fp8") => Precision::Fp8,
        Some(other) => return Err(format!("mixed_precision: {other:?} is not no, fp16, bf16 or fp8")),
    };
    match kind.as_str() {
        "NO" | "MULTI_GPU" => {
            f.not_honoured("fsdp_config", "distributed_type is not FSDP");
            f.not_honoured("deepspeed_config", "distributed_type is not DEEPSPEED");
        }
        "FSDP" => fsdp(&mut f, &mut r)?,
        "DEEPSPEED" => deepspeed(&mut f, &mut r)?,
        other => {
            return Err(format!("distributed_type: {other:?} is not NO, MULTI_GPU, FSDP or DEEPSPEED (the GPU ones)"))
        }
    }
    Ok(Read {
        format: Format::Accelerate,
        model: None,
        asked: Asked::Train(r),
        ignored: f.finish(NO_BEARING, "accelerate"),
    })
}

fn fsdp(f: &mut Fields, r: &mut TrainRequest) -> Result<(), String> {
    let strategy = match f.take("fsdp_config.fsdp_sharding_strategy") {
        None => "FULL_SHARD".to_string(),
        // accelerate's older files number them, as FSDP's enum: 1 FULL_SHARD, 2 SHARD_GRAD_OP, 3 NO_SHARD.
        Some(Value::Number(n)) => match n.as_u64() {
            Some(1) => "FULL_SHARD".into(),
            Some(2) => "SHARD_GRAD_OP".into(),
            Some(3) => "NO_SHARD".into(),
            Some(4) => "HYBRID_SHARD".into(),
            _ => return Err(format!("fsdp_config.fsdp_sharding_strategy: {n} is not 1 to 4")),
        },
        Some(Value::String(s)) => s,
        Some(v) => return Err(format!("fsdp_config.fsdp_sharding_strategy: {}", shown(&v))),
    };
    r.zero = Some(match strategy.as_str() {
        "FULL_SHARD" => 3,
        "SHARD_GRAD_OP" => 2,
        "NO_SHARD" => 0,
        "HYBRID_SHARD" | "HYBRID_SHARD_ZERO2" => {
            f.ignore(
                "fsdp_config.fsdp_sharding_strategy",
                format!("{strategy}: planned as sharding over every GPU; the replicas across nodes are not planned"),
            );
            if strategy == "HYBRID_SHARD" {
                3
            } else {
                2
            }
        }
        other => return Err(format!("fsdp_config.fsdp_sharding_strategy: {other:?} is not an FSDP sharding strategy")),
    });
    if f.bool("fsdp_config.fsdp_offload_params")? == Some(true) {
        r.offload = Offload::OptimizerAndParams;
    }
    if f.bool("fsdp_config.fsdp_activation_checkpointing")? == Some(true) {
        r.checkpointing = Checkpointing::Full;
    }
    for field in ["fsdp_config.fsdp_backward_prefetch", "fsdp_config.fsdp_forward_prefetch"] {
        f.not_honoured(field, "FSDP's prefetching holds a further layer's parameters: planned at its default");
    }
    f.not_honoured("deepspeed_config", "distributed_type is not DEEPSPEED");
    Ok(())
}

fn deepspeed(f: &mut Fields, r: &mut TrainRequest) -> Result<(), String> {
    r.framework = Framework::DeepSpeed;
    if let Some(path) = f.str("deepspeed_config.deepspeed_config_file")? {
        return Err(format!(
            "deepspeed_config.deepspeed_config_file: the job is {path}'s: plan that file with --config (and --hf-args)"
        ));
    }
    let stage = f.u64("deepspeed_config.zero_stage")?.unwrap_or(0);
    if stage > 3 {
        return Err(format!("deepspeed_config.zero_stage: {stage} is not 0, 1, 2 or 3"));
    }
    r.zero = Some(stage as u8);
    let device = |f: &mut Fields, p: &str| -> Result<bool, String> {
        match f.str(p)?.as_deref() {
            None | Some("none") => Ok(false),
            Some("cpu" | "nvme") => Ok(true),
            Some(other) => Err(format!("{p}: {other:?} is not none, cpu or nvme")),
        }
    };
    let optimizer = device(f, "deepspeed_config.offload_optimizer_device")?;
    let params = device(f, "deepspeed_config.offload_param_device")?;
    r.offload = match (optimizer, params) {
        (true, true) => Offload::OptimizerAndParams,
        (true, false) => Offload::Optimizer,
        _ => Offload::None,
    };
    if params && !optimizer {
        f.ignore(
            "deepspeed_config.offload_param_device",
            "the parameters offloaded without the optimizer: not planned",
        );
    }
    if let Some(k) = f.positive("deepspeed_config.gradient_accumulation_steps")? {
        r.accumulation = k;
    }
    f.not_honoured("fsdp_config", "distributed_type is not FSDP");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = include_str!("../../../../data/configs/accelerate-fsdp.yaml");

    fn train(text: &str) -> (TrainRequest, Read) {
        let read = read(text).unwrap();
        (*read.train().unwrap_or_else(|| panic!("{:?}", read.asked)), read)
    }

    #[test]
    fn accelerate_s_fsdp_template_reads_as_its_job() {
        let (r, read) = train(FILE);
        assert!(read.model.is_none());
        assert_eq!((r.gpus, r.zero, r.precision), (2, Some(3), Precision::Mixed));
        assert_eq!((r.offload, r.checkpointing), (Offload::None, Checkpointing::None));
        let why = |f: &str| read.ignored.iter().find(|i| i.field == f).map(|i| i.why.clone()).unwrap();
        assert!(why("fsdp_config.fsdp_backward_prefetch").contains("prefetch"));
        assert_eq!(why("fsdp_config.fsdp_use_orig_params"), super::super::NO_BEARING);
    }

    #[test]
    fn multi_gpu_and_deepspeed_sections_are_read() {
        let (r, _) = train("distributed_type: MULTI_GPU\nmixed_precision: bf16\nnum_processes: 8\n");
        assert_eq!((r.gpus, r.precision, r.zero), (8, Precision::Amp, None));
        let ds = "distributed_type: DEEPSPEED\nnum_processes: 4\ndeepspeed_config:\n  zero_stage: 2\n  \
                  offload_optimizer_device: cpu\n  gradient_accumulation_steps: 4\n";
        let (r, _) = train(ds);
        assert_eq!(
            (r.zero, r.offload, r.accumulation, r.framework),
            (Some(2), Offload::Optimizer, 4, Framework::DeepSpeed)
        );
        let file = "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n";
        assert!(read(file).unwrap_err().contains("deepspeed_config_file"));
        assert!(read("distributed_type: TPU\n").unwrap_err().contains("distributed_type"));
    }
}
