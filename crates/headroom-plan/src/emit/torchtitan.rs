//! torchtitan's job TOML (`--job.config_file`, torchtitan 0.2's `ConfigManager`), in the
//! fields `job_file::torchtitan` reads back: the same file given to `--config` plans the
//! same job.

use crate::job::{Checkpointing, Finetune, Offload, Optimizer, OptimizerImpl, Precision, TrainConfig};
use crate::job_file::torchtitan::MODELS;
use crate::model::Model;

/// The job file for `cfg` on `model`.
pub(super) fn job_file(model: &Model, cfg: &TrainConfig) -> Result<String, String> {
    let par = &cfg.parallel;
    let Some(&(name, flavor, _)) = MODELS.iter().find(|m| m.2 == model.name) else {
        return Err(format!(
            "torchtitan builds its own models by name and flavor; {} is not one ({})",
            model.name,
            MODELS.iter().map(|(n, f, p)| format!("{p}: {n} {f}")).collect::<Vec<_>>().join(", ")
        ));
    };
    refuse(cfg)?;
    let replicate = par.replicate.max(1);
    let shard = par.data / replicate;
    // torchtitan shards with FSDP2 over the data-parallel GPUs of each replica and the
    // context-parallel ones (ZeRO-3), or holds whole replicas where there is one of each.
    let zero = if shard * par.context > 1 { 3 } else { 0 };
    if par.zero_stage != zero {
        return Err(format!(
            "torchtitan's FSDP2 {}; this plan has ZeRO-{}: plan with --zero {zero} (or --emit deepspeed)",
            if zero == 3 { "shards parameters, gradients and optimizer (ZeRO-3)" } else { "has nothing to shard over" },
            par.zero_stage
        ));
    }
    let mut t = format!("[model]\nname = \"{name}\"\nflavor = \"{flavor}\"\n");
    if cfg.precision == Precision::Fp8 {
        // The name torchtitan 0.2 registers torchao's float8 linears under.
        t += "converters = [\"quantize.linear.float8\"]\n";
    }
    // Pipelined, the local batch is split into micro-batches; otherwise the global batch
    // says how many local batches one step accumulates.
    let (local, global) = if par.pipeline > 1 {
        (cfg.micro_batch * cfg.accumulation, None)
    } else {
        (cfg.micro_batch, (cfg.accumulation > 1).then(|| cfg.micro_batch * cfg.accumulation * par.data))
    };
    t += &format!("\n[training]\nlocal_batch_size = {local}\n");
    if let Some(g) = global {
        t += &format!("global_batch_size = {g}\n");
    }
    t += &format!(
        "seq_len = {}\nmixed_precision_param = \"{}\"\n",
        cfg.seq,
        if cfg.precision == Precision::Fp32 { "float32" } else { "bfloat16" }
    );
    t += &format!(
        "\n[parallelism]\ndata_parallel_replicate_degree = {replicate}\ndata_parallel_shard_degree = {shard}\n\
         tensor_parallel_degree = {}\npipeline_parallel_degree = {}\ncontext_parallel_degree = {}\n",
        par.tensor, par.pipeline, par.context
    );
    if par.pipeline > 1 {
        t += &format!(
            "pipeline_parallel_schedule = \"{}\"\npipeline_parallel_microbatch_size = {}\n",
            par.schedule.class(),
            cfg.micro_batch
        );
        if par.schedule.looped() {
            let stages = par.pipeline * par.virtual_stages.max(1);
            t += &format!("pipeline_parallel_layers_per_stage = {}\n", model.layers.div_ceil(stages));
        }
    }
    let (mode, option) = match cfg.checkpointing {
        Checkpointing::None => ("none", None),
        Checkpointing::Full => ("full", None),
        Checkpointing::PerOp => ("selective", Some("op".to_string())),
        Checkpointing::EveryK(k) => ("selective", Some(k.to_string())),
        // Refused above.
        Checkpointing::Selective | Checkpointing::Optimal => unreachable!(),
    };
    t += &format!("\n[activation_checkpoint]\nmode = \"{mode}\"\n");
    if let Some(o) = option {
        t += &format!("selective_ac_option = \"{o}\"\n");
    }
    t += &format!("\n[compile]\nenable = {}\n", cfg.compile);
    if cfg.compile {
        t += if cfg.compile_loss { "components = [\"model\", \"loss\"]\n" } else { "components = [\"model\"]\n" };
    }
    // The implementation the plan ran: named, or torch's default on CUDA tensors (foreach),
    // not torchtitan's default (fused).
    let implementation = match cfg.optimizer_impl.unwrap_or(OptimizerImpl::Foreach) {
        OptimizerImpl::Fused => "fused",
        OptimizerImpl::Foreach => "foreach",
        OptimizerImpl::ForLoop => "for-loop",
    };
    t += &format!("\n[optimizer]\nname = \"AdamW\"\nimplementation = \"{implementation}\"\n");
    Ok(t)
}

/// What torchtitan's job file cannot ask for.
fn refuse(cfg: &TrainConfig) -> Result<(), String> {
    let why = if matches!(cfg.finetune, Finetune::Lora { .. }) {
        "torchtitan trains all parameters; for LoRA use --emit deepspeed, fsdp or accelerate"
    } else if cfg.offload != Offload::None {
        "the planner plans torchtitan without CPU offload; use --emit deepspeed"
    } else if cfg.optimizer != Optimizer::AdamW {
        "torchtitan's job file is planned with AdamW; plan with --optimizer adamw"
    } else if matches!(cfg.precision, Precision::Amp | Precision::Bf16) {
        "torchtitan keeps fp32 weights under FSDP2's bf16 mixed precision; plan with --precision mixed, fp32 or fp8"
    } else if cfg.checkpointing == Checkpointing::Selective {
        "Megatron's selective checkpointing (attention recomputed) is not torchtitan's; plan with --checkpoint \
         per-op, full, none or every-K"
    } else if cfg.checkpointing == Checkpointing::Optimal {
        "torchtitan checkpoints every block, every K-th block or by op; plan with --checkpoint full, every-K, per-op or none"
    } else if cfg.parallel.tp_comm_overlap {
        "the planned tensor-parallel overlap is Transformer Engine's (Megatron); use --emit megatron"
    } else {
        return Ok(());
    };
    Err(why.into())
}
