//! The planner as the tests ask it: a configuration estimated at PyTorch's allocator defaults,
//! its job checked first (a test's configuration is a valid job, or the test is wrong).

#![allow(dead_code)]

use headroom_plan::builders::runner;
use headroom_plan::closed_form::StageMemory;
use headroom_plan::estimate::{Estimate, Estimator};
use headroom_plan::gpu::GpuSpec;
use headroom_plan::job::{Job, PipelineStage, TrainConfig};
use headroom_plan::model::Model;

pub fn job<'a>(m: &'a Model, g: &'a GpuSpec, cfg: &TrainConfig) -> Job<'a> {
    Job::new(m, g, *cfg).unwrap_or_else(|e| panic!("{cfg:?}: {e}"))
}

pub fn estimate(m: &Model, g: &GpuSpec, cfg: &TrainConfig) -> Estimate {
    Estimator::default().estimate(&job(m, g, cfg)).unwrap_or_else(|e| panic!("{cfg:?}: {e}"))
}

/// The closed form's terms for `stage`, as the job's runner asks for them.
pub fn closed_form(m: &Model, g: &GpuSpec, cfg: &TrainConfig, stage: PipelineStage) -> StageMemory {
    let job = job(m, g, cfg);
    let (r, _) = runner(&job).unwrap_or_else(|e| panic!("{e}"));
    let job = Job { train: TrainConfig { framework: r.builder.framework(), ..job.train }, ..job };
    headroom_plan::closed_form::memory(&job, stage, r.builder.transformers_code(&job), 0.0)
}
