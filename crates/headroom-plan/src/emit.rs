//! Configurations for the engines people already run: a DeepSpeed
//! `ds_config.json`, a `torchrun` command with Hugging Face Trainer FSDP
//! arguments, an Accelerate config, Megatron-LM arguments and a torchtitan job
//! file, for one training configuration. What an engine's configuration cannot say is an
//! error that names the engine that can.

use crate::job::{BaseWeights, Checkpointing, Finetune, Framework, LoraTargets, Offload, Precision, TrainConfig};
use crate::model::{Family, Model};
use crate::parallel::GPUS_PER_NODE;
use serde_json::json;

mod architecture;
mod torchtitan;

/// The engines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    DeepSpeed,
    Fsdp,
    Accelerate,
    Megatron,
    Torchtitan,
}

crate::names::named!(Engine {
    DeepSpeed => ("deepspeed", "ds_config.json"),
    Fsdp => ("fsdp", "torchrun with Hugging Face Trainer FSDP arguments"),
    Accelerate => ("accelerate", "an Accelerate config"),
    Megatron => ("megatron", "Megatron-LM arguments (tensor, pipeline and context parallelism)"),
    Torchtitan => ("torchtitan", "torchtitan's job TOML (FSDP2, tensor, pipeline and context parallelism)"),
});

impl Engine {
    /// The framework whose code the engine's configuration runs: its own, or for
    /// Hugging Face's launchers transformers'. A job that asked for `auto` is planned as that
    /// framework; one that named its framework keeps it.
    pub fn framework(self, asked: Framework) -> Framework {
        if asked != Framework::Auto {
            return asked;
        }
        match self {
            Engine::DeepSpeed => Framework::DeepSpeed,
            Engine::Megatron => Framework::Megatron,
            Engine::Torchtitan => Framework::Torchtitan,
            Engine::Fsdp | Engine::Accelerate => Framework::HuggingFace,
        }
    }
}

fn mixed(p: Precision) -> &'static str {
    match p {
        Precision::Fp32 => "no",
        Precision::Fp8 => "fp8",
        _ => "bf16",
    }
}

/// TRL's command-line flags for the adapters (`trl sft` and scripts built on its `ModelConfig`).
fn peft_flags(model: &Model, cfg: &TrainConfig) -> Vec<String> {
    match cfg.finetune {
        Finetune::Full => vec![],
        Finetune::Lora { rank, targets, base } => {
            let mut v = vec![
                "--use_peft".to_string(),
                format!("--lora_r {rank}"),
                format!("--lora_alpha {}", 2 * rank),
                match targets {
                    LoraTargets::All => "--lora_target_modules all-linear".to_string(),
                    LoraTargets::QueryValue => format!("--lora_target_modules {}", query_value_modules(model)),
                },
            ];
            match base {
                BaseWeights::Nf4 | BaseWeights::Fp4 => {
                    v.push("--load_in_4bit".into());
                    if base == BaseWeights::Fp4 {
                        v.push("--bnb_4bit_quant_type fp4".into());
                    }
                    if cfg.double_quant {
                        v.push("--use_bnb_nested_quant".into());
                    }
                }
                BaseWeights::Int8 => v.push("--load_in_8bit".into()),
                BaseWeights::Native => {}
            }
            v
        }
    }
}

/// The module names of the query and value projections as peft's default targets name them
/// for the family (`TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`): the fused
/// query-key-value layer where transformers fuses them, as the planner counts the adapters
/// (`LoraTargets::adapted`).
fn query_value_modules(model: &Model) -> &'static str {
    match model.family {
        Family::Gpt2 => "c_attn",
        Family::NeoX | Family::Bloom => "query_key_value",
        Family::Bert => "query value",
        Family::T5 => "q v",
        Family::GatedDecoder if model.model_type == "phi3" => "qkv_proj",
        Family::GatedDecoder => "q_proj v_proj",
    }
}

/// How `torchrun` launches `gpus` processes: (nodes, processes per node).
/// Every node runs the same number of processes (torchrun starts
/// `--nproc_per_node` on each), at most [`GPUS_PER_NODE`], a multiple of the
/// tensor-parallel degree so tensor-parallel groups stay inside a node as
/// the plan assumes; the fewest nodes that allow it.
fn launch(gpus: u64, tensor: u64) -> Result<(u64, u64), String> {
    let first = gpus.div_ceil(GPUS_PER_NODE).max(1);
    (first..=gpus.max(1))
        .filter(|n| gpus.is_multiple_of(*n))
        .map(|n| (n, gpus / n))
        .find(|&(_, per)| per <= GPUS_PER_NODE && per.is_multiple_of(tensor.max(1)))
        .ok_or_else(|| {
            format!(
                "{gpus} GPUs do not split into equal nodes of at most {GPUS_PER_NODE} with whole tensor-parallel \
                 groups of {tensor}; choose a number of GPUs that does"
            )
        })
}

/// Megatron's flags for stages of unequal size: the plan gives the first
/// and last stage ⌈L/p⌉ layers each and the middle stages the rest, evenly.
fn uneven_stages(layers: u64, stages: u64) -> Result<Option<String>, String> {
    if stages <= 1 || layers.is_multiple_of(stages) {
        return Ok(None);
    }
    let edge = layers.div_ceil(stages);
    if stages == 2 {
        return Ok(Some(format!("--decoder-first-pipeline-num-layers {edge}")));
    }
    let middle = layers.checked_sub(2 * edge).filter(|m| m.is_multiple_of(stages - 2));
    match middle {
        Some(_) => {
            Ok(Some(format!("--decoder-first-pipeline-num-layers {edge} --decoder-last-pipeline-num-layers {edge}")))
        }
        None => Err(format!(
            "{layers} layers over {stages} pipeline stages: with {edge} on the first and the last, the rest does not \
             split evenly over the middle stages as Megatron needs; choose a --pp that does"
        )),
    }
}

/// The configuration text for `engine` to train `model`.
pub fn emit(engine: Engine, model: &Model, cfg: &TrainConfig) -> Result<String, crate::CannotEmit> {
    emit_text(engine, model, cfg).map_err(crate::CannotEmit)
}

fn emit_text(engine: Engine, model: &Model, cfg: &TrainConfig) -> Result<String, String> {
    let par = &cfg.parallel;
    if engine == Engine::Torchtitan {
        return torchtitan::job_file(model, cfg);
    }
    if cfg.checkpointing == Checkpointing::PerOp {
        return Err(format!(
            "per-op checkpointing is torchtitan's (`selective_ac_option = \"op\"`); {engine:?} has no such policy: \
             plan with --checkpoint full or selective, or use --emit torchtitan"
        ));
    }
    if engine != Engine::Megatron && par.model_parallel() > 1 {
        return Err(format!(
            "{engine:?} configs do not set tensor, pipeline or context parallelism; use --emit megatron or torchtitan"
        ));
    }
    // ZeRO-Offload needs the optimizer partitioned (stage ≥ 2 in practice); parameters need stage 3.
    let zero = match cfg.offload {
        Offload::None => par.zero_stage,
        Offload::Optimizer => par.zero_stage.max(2),
        Offload::OptimizerAndParams => 3,
    };
    match engine {
        Engine::DeepSpeed => deepspeed(cfg, zero),
        Engine::Fsdp => fsdp(model, cfg, zero),
        Engine::Accelerate => accelerate(cfg, zero),
        Engine::Megatron => megatron(model, cfg),
        Engine::Torchtitan => unreachable!("written above"),
    }
}

/// A DeepSpeed `ds_config.json`.
fn deepspeed(cfg: &TrainConfig, zero: u8) -> Result<String, String> {
    let (ckpt, accumulation) = (cfg.checkpointing != Checkpointing::None, cfg.accumulation);
    if cfg.precision == Precision::Fp8 {
        return Err(
            "DeepSpeed's config has no fp8 mode (it comes from Transformer Engine); use --emit accelerate or megatron"
                .into(),
        );
    }
    let mut v = json!({
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "gradient_accumulation_steps": accumulation,
        "train_batch_size": cfg.global_batch(),
        "zero_optimization": {"stage": zero, "overlap_comm": true, "contiguous_gradients": true},
        "gradient_clipping": 1.0,
    });
    if cfg.offload != Offload::None {
        v["zero_optimization"]["offload_optimizer"] = json!({"device": "cpu", "pin_memory": true});
    }
    if cfg.offload == Offload::OptimizerAndParams {
        v["zero_optimization"]["offload_param"] = json!({"device": "cpu", "pin_memory": true});
    }
    if cfg.precision != Precision::Fp32 {
        v["bf16"] = json!({"enabled": true});
    }
    if ckpt {
        // The model enables checkpointing itself (gradient_checkpointing_enable());
        // DeepSpeed's section only tunes it.
        v["activation_checkpointing"] = json!({"partition_activations": false, "cpu_checkpointing": false});
    }
    Ok(serde_json::to_string_pretty(&v).expect("JSON"))
}

/// `torchrun` with the Hugging Face Trainer's FSDP arguments.
fn fsdp(model: &Model, cfg: &TrainConfig, zero: u8) -> Result<String, String> {
    let (par, ckpt, accumulation) = (&cfg.parallel, cfg.checkpointing != Checkpointing::None, cfg.accumulation);
    let sharding = match zero {
        3 => "full_shard",
        1 | 2 => "shard_grad_op",
        _ => "no_shard",
    };
    let offload = match cfg.offload {
        Offload::None => "",
        Offload::OptimizerAndParams => " offload",
        Offload::Optimizer => {
            return Err(
                "FSDP offloads the parameters with the optimizer; use --offload params, or --emit deepspeed".into()
            )
        }
    };
    if cfg.precision == Precision::Fp8 {
        return Err("the Trainer's FSDP flags have no fp8 mode; use --emit accelerate or megatron".into());
    }
    let (nodes, per_node) = launch(par.gpus(), 1)?;
    let mut args = vec![
        if nodes > 1 {
            format!("torchrun --nnodes {nodes} --nproc_per_node {per_node} train.py")
        } else {
            format!("torchrun --nproc_per_node {per_node} train.py")
        },
        format!("--fsdp \"{sharding} auto_wrap{offload}\""),
        format!("--per_device_train_batch_size {}", cfg.micro_batch),
        format!("--gradient_accumulation_steps {accumulation}"),
    ];
    if cfg.precision != Precision::Fp32 {
        args.push("--bf16".into());
    }
    if ckpt {
        args.push("--gradient_checkpointing".into());
    }
    args.extend(peft_flags(model, cfg));
    Ok(args.join(" \\\n  "))
}

/// An Accelerate config.
fn accelerate(cfg: &TrainConfig, zero: u8) -> Result<String, String> {
    let (par, accumulation) = (&cfg.parallel, cfg.accumulation);
    let (kind, extra) = match zero {
        0 if par.gpus() <= 1 => ("NO", String::new()),
        0 => ("MULTI_GPU", String::new()),
        s => (
            "DEEPSPEED",
            format!(
                "deepspeed_config:\n  zero_stage: {s}\n  gradient_accumulation_steps: {accumulation}\n  gradient_clipping: 1.0\n  offload_optimizer_device: {}\n  offload_param_device: {}\n",
                if cfg.offload == Offload::None { "none" } else { "cpu" },
                if cfg.offload == Offload::OptimizerAndParams { "cpu" } else { "none" },
            ),
        ),
    };
    let (nodes, _) = launch(par.gpus(), 1)?;
    Ok(format!(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: {kind}\nmixed_precision: {}\nnum_machines: {nodes}\nnum_processes: {}\n{extra}",
        mixed(cfg.precision),
        par.gpus()
    ))
}

/// Megatron-LM's `pretrain_gpt.py` arguments.
fn megatron(model: &Model, cfg: &TrainConfig) -> Result<String, String> {
    let par = &cfg.parallel;
    if matches!(cfg.finetune, Finetune::Lora { .. }) {
        return Err("Megatron-LM trains all parameters; for LoRA use --emit deepspeed, fsdp or accelerate".into());
    }
    if cfg.offload == Offload::OptimizerAndParams {
        return Err("Megatron-LM does not offload parameters; use --emit deepspeed".into());
    }
    if par.zero_stage >= 2 {
        return Err(format!(
            "Megatron-LM's distributed optimizer shards the optimizer state only (ZeRO-1), not ZeRO-{}'s \
                 gradients{}; use --emit deepspeed, fsdp or accelerate, or plan with --zero 1",
            par.zero_stage,
            if par.zero_stage == 3 { " and weights" } else { "" }
        ));
    }
    let (nodes, per_node) = launch(par.gpus(), par.tensor)?;
    let uneven = uneven_stages(model.layers, par.pipeline)?;
    let mut args = vec![
        // Megatron-LM refuses tensor or context parallelism before Blackwell without it.
        format!(
            "{}torchrun --nproc_per_node {per_node} --nnodes {nodes} pretrain_gpt.py",
            if par.tensor > 1 || par.context > 1 { "CUDA_DEVICE_MAX_CONNECTIONS=1 " } else { "" }
        ),
        format!("--tensor-model-parallel-size {}", par.tensor),
        format!("--pipeline-model-parallel-size {}", par.pipeline),
        format!("--context-parallel-size {}", par.context),
        format!("--micro-batch-size {}", cfg.micro_batch),
        format!("--global-batch-size {}", cfg.global_batch()),
        format!("--seq-length {}", cfg.seq),
    ];
    args.extend(architecture::flags(model, cfg.seq, par.tensor)?);
    if let Some(flags) = uneven {
        args.push(flags);
    }
    if par.virtual_stages > 1 {
        args.push(format!(
            "--num-layers-per-virtual-pipeline-stage {}",
            model.layers / (par.pipeline * par.virtual_stages)
        ));
    }
    if par.sequence_parallel && par.tensor > 1 {
        args.push("--sequence-parallel".into());
    }
    if par.tp_comm_overlap {
        args.push("--tp-comm-overlap".into());
    }
    if par.zero_stage >= 1 {
        args.push("--use-distributed-optimizer".into());
    }
    match cfg.precision {
        Precision::Fp32 => {}
        Precision::Fp8 => args.push("--bf16 --fp8-format hybrid".into()),
        _ => args.push("--bf16".into()),
    }
    match cfg.checkpointing {
        // Per-op is refused above.
        Checkpointing::None | Checkpointing::PerOp => {}
        Checkpointing::Selective => args.push("--recompute-granularity selective".into()),
        Checkpointing::Full | Checkpointing::Optimal => {
            args.push("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1".into())
        }
        Checkpointing::EveryK(k) => {
            args.push(format!("--recompute-granularity full --recompute-method uniform --recompute-num-layers {k}"))
        }
    }
    if cfg.offload == Offload::Optimizer {
        // Megatron's hybrid-device optimizer runs on the precision-aware one's code path.
        args.push("--optimizer-cpu-offload --use-precision-aware-optimizer".into());
    }
    Ok(args.join(" \\\n  "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Attention, Optimizer};
    use crate::parallel::Parallelism;

    fn m() -> Model {
        crate::model::preset("llama-3-8b").unwrap()
    }

    fn cfg() -> TrainConfig {
        TrainConfig {
            attention: Attention::Flash,
            checkpointing: Checkpointing::Full,
            accumulation: 2,
            parallel: Parallelism::data_parallel(8, 3),
            ..TrainConfig::new(4, 4096, Precision::Bf16, Optimizer::AdamW)
        }
    }

    #[test]
    fn configs_carry_the_plan() {
        let cfg = cfg();
        let ds: serde_json::Value = serde_json::from_str(&emit(Engine::DeepSpeed, &m(), &cfg).unwrap()).unwrap();
        assert_eq!(ds["train_batch_size"], 64);
        assert_eq!(ds["zero_optimization"]["stage"], 3);
        assert_eq!(ds["bf16"]["enabled"], true);
        let fsdp = emit(Engine::Fsdp, &m(), &cfg).unwrap();
        assert!(
            fsdp.contains("full_shard auto_wrap")
                && fsdp.contains("--gradient_checkpointing")
                && fsdp.contains("--nproc_per_node 8")
        );
        let acc = emit(Engine::Accelerate, &m(), &cfg).unwrap();
        assert!(acc.contains("distributed_type: DEEPSPEED") && acc.contains("zero_stage: 3"));
    }

    #[test]
    fn launches_match_the_plan_s_gpus_and_stages() {
        assert_eq!(launch(8, 1), Ok((1, 8)));
        assert_eq!(launch(12, 1), Ok((2, 6)));
        assert_eq!(launch(12, 4), Ok((3, 4)));
        assert_eq!(launch(64, 8), Ok((8, 8)));
        assert_eq!(launch(13, 1), Ok((13, 1)));
        assert!(launch(12, 8).is_err());
        let twelve = TrainConfig { parallel: Parallelism::data_parallel(12, 1), ..cfg() };
        let mega = emit(Engine::Megatron, &m(), &twelve).unwrap();
        assert!(mega.contains("--nproc_per_node 6 --nnodes 2"), "{mega}");
        let fsdp = emit(Engine::Fsdp, &m(), &TrainConfig { parallel: Parallelism::data_parallel(64, 3), ..cfg() });
        assert!(fsdp.unwrap().contains("torchrun --nnodes 8 --nproc_per_node 8"));
        assert!(emit(Engine::Megatron, &m(), &cfg()).unwrap_err().0.contains("ZeRO-1"));
        let pp3 = TrainConfig {
            parallel: Parallelism { data: 1, pipeline: 3, zero_stage: 1, ..Parallelism::default() },
            ..cfg()
        };
        let mega = emit(Engine::Megatron, &m(), &pp3).unwrap();
        assert!(
            mega.contains("--decoder-first-pipeline-num-layers 11 --decoder-last-pipeline-num-layers 11"),
            "{mega}"
        );
        assert_eq!(uneven_stages(32, 2), Ok(None));
        assert_eq!(uneven_stages(33, 2), Ok(Some("--decoder-first-pipeline-num-layers 17".into())));
        assert!(uneven_stages(11, 4).is_err());
    }

    #[test]
    fn offload_lora_and_model_parallelism_reach_the_engines_that_have_them() {
        let offload = TrainConfig { offload: Offload::Optimizer, parallel: Parallelism::data_parallel(8, 1), ..cfg() };
        let ds: serde_json::Value = serde_json::from_str(&emit(Engine::DeepSpeed, &m(), &offload).unwrap()).unwrap();
        assert_eq!(ds["zero_optimization"]["stage"], 2);
        assert_eq!(ds["zero_optimization"]["offload_optimizer"]["device"], "cpu");
        assert!(emit(Engine::Fsdp, &m(), &offload).unwrap_err().0.contains("--offload params"));
        let qlora = TrainConfig {
            finetune: Finetune::Lora { rank: 16, targets: LoraTargets::All, base: BaseWeights::Nf4 },
            ..cfg()
        };
        let fsdp = emit(Engine::Fsdp, &m(), &qlora).unwrap();
        assert!(fsdp.contains("--lora_r 16") && fsdp.contains("--load_in_4bit"));
        assert!(emit(Engine::Megatron, &m(), &qlora).is_err());
        // The query and value projections by the names the family's modules have: a fused
        // query-key-value layer where transformers fuses them, as peft's defaults target it.
        let qv = TrainConfig {
            finetune: Finetune::Lora { rank: 8, targets: LoraTargets::QueryValue, base: BaseWeights::Native },
            ..cfg()
        };
        for (preset, modules) in [
            ("llama-3-8b", "q_proj v_proj"),
            ("gpt2", "c_attn"),
            ("pythia-1b", "query_key_value"),
            ("bloom-7b1", "query_key_value"),
            ("phi-3-mini", "qkv_proj"),
        ] {
            let model = crate::model::preset(preset).unwrap();
            let fsdp = emit(Engine::Fsdp, &model, &qv).unwrap();
            assert!(fsdp.ends_with(&format!("--lora_target_modules {modules}")), "{preset}: {fsdp}");
        }
        let tp = TrainConfig {
            parallel: Parallelism { data: 4, tensor: 8, pipeline: 2, zero_stage: 1, ..Parallelism::default() },
            ..cfg()
        };
        assert!(emit(Engine::DeepSpeed, &m(), &tp).unwrap_err().0.contains("--emit megatron"));
        let mega = emit(Engine::Megatron, &m(), &tp).unwrap();
        for flag in [
            "CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun",
            "--nnodes 8",
            "--tensor-model-parallel-size 8",
            "--pipeline-model-parallel-size 2",
            "--global-batch-size 32",
            "--sequence-parallel",
            "--use-distributed-optimizer",
            "--recompute-granularity full",
            "--num-layers 32",
            "--num-query-groups 8",
        ] {
            assert!(mega.contains(flag), "{flag} in {mega}");
        }
    }
}
