//! Configurations for the engines people already run: a DeepSpeed
//! `ds_config.json`, a `torchrun` command with Hugging Face Trainer FSDP
//! arguments, and an Accelerate config, for one training configuration.

use crate::train::{Checkpointing, Precision, TrainConfig};
use serde_json::json;

/// The engines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    DeepSpeed,
    Fsdp,
    Accelerate,
}

fn mixed(p: Precision) -> &'static str {
    match p {
        Precision::Fp32 => "no",
        _ => "bf16",
    }
}

/// The configuration text for `engine`; `accumulation` micro-batches per optimizer step.
pub fn emit(engine: Engine, cfg: &TrainConfig, accumulation: u64) -> String {
    let ckpt = cfg.checkpointing != Checkpointing::None;
    match engine {
        Engine::DeepSpeed => {
            let mut v = json!({
                "train_micro_batch_size_per_gpu": cfg.micro_batch,
                "gradient_accumulation_steps": accumulation,
                "train_batch_size": cfg.micro_batch * accumulation * cfg.gpus.max(1),
                "zero_optimization": {"stage": cfg.zero_stage, "overlap_comm": true, "contiguous_gradients": true},
                "gradient_clipping": 1.0,
            });
            if cfg.precision != Precision::Fp32 {
                v["bf16"] = json!({"enabled": true});
            }
            if ckpt {
                // The model enables checkpointing itself (gradient_checkpointing_enable());
                // DeepSpeed's section only tunes it.
                v["activation_checkpointing"] = json!({"partition_activations": false, "cpu_checkpointing": false});
            }
            serde_json::to_string_pretty(&v).expect("JSON")
        }
        Engine::Fsdp => {
            let sharding = match cfg.zero_stage {
                3 => "full_shard",
                1 | 2 => "shard_grad_op",
                _ => "no_shard",
            };
            let mut args = vec![
                format!("torchrun --nproc_per_node {} train.py", cfg.gpus.max(1)),
                format!("--fsdp \"{sharding} auto_wrap\""),
                format!("--per_device_train_batch_size {}", cfg.micro_batch),
                format!("--gradient_accumulation_steps {accumulation}"),
            ];
            if cfg.precision != Precision::Fp32 {
                args.push("--bf16".into());
            }
            if ckpt {
                args.push("--gradient_checkpointing".into());
            }
            args.join(" \\\n  ")
        }
        Engine::Accelerate => {
            let (kind, extra) = match cfg.zero_stage {
                0 if cfg.gpus <= 1 => ("NO", String::new()),
                0 => ("MULTI_GPU", String::new()),
                s => (
                    "DEEPSPEED",
                    format!(
                        "deepspeed_config:\n  zero_stage: {s}\n  gradient_accumulation_steps: {accumulation}\n  gradient_clipping: 1.0\n"
                    ),
                ),
            };
            format!(
                "compute_environment: LOCAL_MACHINE\ndistributed_type: {kind}\nmixed_precision: {}\nnum_machines: 1\nnum_processes: {}\n{extra}",
                mixed(cfg.precision),
                cfg.gpus.max(1)
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::{ActivationModel, Attention, Optimizer};

    #[test]
    fn configs_carry_the_plan() {
        let cfg = TrainConfig {
            micro_batch: 4,
            seq: 4096,
            precision: Precision::Bf16,
            optimizer: Optimizer::AdamW,
            attention: Attention::Flash,
            checkpointing: Checkpointing::Full,
            gpus: 8,
            zero_stage: 3,
            coefficients: ActivationModel::default(),
        };
        let ds: serde_json::Value = serde_json::from_str(&emit(Engine::DeepSpeed, &cfg, 2)).unwrap();
        assert_eq!(ds["train_batch_size"], 64);
        assert_eq!(ds["zero_optimization"]["stage"], 3);
        assert_eq!(ds["bf16"]["enabled"], true);
        let fsdp = emit(Engine::Fsdp, &cfg, 2);
        assert!(
            fsdp.contains("full_shard auto_wrap")
                && fsdp.contains("--gradient_checkpointing")
                && fsdp.contains("--nproc_per_node 8")
        );
        let acc = emit(Engine::Accelerate, &cfg, 2);
        assert!(acc.contains("distributed_type: DEEPSPEED") && acc.contains("zero_stage: 3"));
    }
}
