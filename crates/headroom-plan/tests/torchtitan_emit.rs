//! `--emit torchtitan` writes the job file that, read back with `--config`, plans the same
//! job: each layout torchtitan runs survives the round trip field for field.

use headroom_plan::emit::{emit, Engine};
use headroom_plan::job::{Checkpointing, Framework, Optimizer, OptimizerImpl, Precision, TrainConfig};
use headroom_plan::job_file::{read, Asked};
use headroom_plan::model::preset;
use headroom_plan::parallel::PipelineSchedule;
use headroom_plan::request::{Compile, TrainRequest};

fn torchtitan(r: TrainRequest) -> TrainRequest {
    TrainRequest { framework: Framework::Torchtitan, ..r }
}

#[test]
fn a_job_file_read_back_plans_the_same_job() {
    let base = torchtitan(TrainRequest { gpus: 8, seq: 4096, ..TrainRequest::default() });
    let jobs = [
        base,
        TrainRequest { micro_batch: 2, accumulation: 4, checkpointing: Checkpointing::PerOp, ..base },
        TrainRequest { checkpointing: Checkpointing::EveryK(3), compile: Compile::Model, ..base },
        TrainRequest {
            gpus: 64,
            tensor: 8,
            pipeline: 2,
            micro_batch: 1,
            accumulation: 8,
            precision: Precision::Fp8,
            schedule: Some(PipelineSchedule::Interleaved1F1B),
            checkpointing: Checkpointing::Full,
            compile: Compile::All,
            optimizer_impl: Some(OptimizerImpl::Foreach),
            ..base
        },
        TrainRequest { gpus: 16, replicate: 2, context: 2, precision: Precision::Fp32, ..base },
        TrainRequest { gpus: 1, checkpointing: Checkpointing::None, ..base },
    ];
    for name in ["llama-3.1-8b", "llama-3.1-70b", "llama-2-7b"] {
        let model = preset(name).unwrap();
        for r in jobs {
            let cfg = r.config().unwrap();
            let text = emit(Engine::Torchtitan, &model, &cfg).unwrap_or_else(|e| panic!("{name} {r:?}: {e}"));
            let back = read("job.toml", &text, None).unwrap_or_else(|e| panic!("{text}\n{}", e.why));
            assert_eq!(back.model.as_ref().unwrap().name, name, "{text}");
            let Asked::Train(again) = back.asked else { panic!("{text}") };
            // An implementation left unnamed is the one the plan ran (foreach), named.
            let planned = TrainConfig { optimizer_impl: cfg.optimizer_impl.or(Some(OptimizerImpl::Foreach)), ..cfg };
            assert_eq!(again.config().unwrap(), planned, "{name}:\n{text}");
            // Every field of the file is one the reader follows.
            let ignored: Vec<_> =
                back.ignored.iter().filter(|i| i.field != "parallelism.pipeline_parallel_layers_per_stage").collect();
            assert!(ignored.is_empty(), "{ignored:?} in\n{text}");
        }
    }
}

#[test]
fn what_torchtitan_cannot_run_is_named() {
    let model = preset("llama-3.1-8b").unwrap();
    let plan = |r: TrainRequest| emit(Engine::Torchtitan, &model, &r.config().unwrap()).unwrap_err().to_string();
    let base = torchtitan(TrainRequest { gpus: 8, ..TrainRequest::default() });
    assert!(plan(TrainRequest { zero: Some(1), ..base }).contains("--zero 3"));
    assert!(plan(TrainRequest { checkpointing: Checkpointing::Selective, ..base }).contains("per-op"));
    assert!(plan(TrainRequest { optimizer: Optimizer::Sgd, ..base }).contains("AdamW"));
    assert!(plan(TrainRequest { precision: Precision::Bf16, ..base }).contains("--precision mixed"));
    let e = emit(Engine::Torchtitan, &preset("mistral-7b").unwrap(), &base.config().unwrap()).unwrap_err();
    assert!(e.to_string().contains("llama-3.1-8b: llama3 8B"), "{e}");
}
