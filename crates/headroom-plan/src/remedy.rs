//! What would make a job that does not fit fit, where one setting does: each setting tried by
//! estimating the job again under it. The allocator's expandable segments (where its
//! fragmentation is the difference) and AdamW's fused implementation (where foreach's copy of
//! the second moments is).

use crate::estimate::{Estimate, Estimator};
use crate::job::{Job, Optimizer, OptimizerImpl, TrainConfig};
use headroom_alloc::AllocatorConfig;

/// A setting under which the job fits, as the user would write it, and the estimate under it.
#[derive(Clone, Debug)]
pub struct Remedy {
    pub setting: String,
    pub estimate: Estimate,
}

/// The settings that make `job` fit, where `estimate` (its estimate under `estimator`) says
/// it does not.
pub fn remedies(job: &Job, estimator: &Estimator, estimate: &Estimate) -> Vec<Remedy> {
    let mut out = Vec::new();
    if estimate.verdict.fits {
        return out;
    }
    if !estimator.alloc.expandable_segments {
        if let Ok(alloc) = AllocatorConfig::parse("expandable_segments:True") {
            let e = Estimator { alloc, ..estimator.clone() }.estimate(job);
            if let Some(e) = e.ok().filter(|e| e.verdict.fits) {
                out.push(Remedy { setting: "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into(), estimate: e });
            }
        }
    }
    // A recording's optimizer is the one recorded: only the allocator's settings change it.
    let recorded = job.recording.is_some();
    if !recorded && job.train.optimizer == Optimizer::AdamW && estimate.runner.optimizer_impl != OptimizerImpl::Fused {
        let fused = job.with(TrainConfig { optimizer_impl: Some(OptimizerImpl::Fused), ..job.train });
        if let Some(e) = fused.ok().and_then(|j| estimator.estimate(&j).ok()).filter(|e| e.verdict.fits) {
            out.push(Remedy { setting: "--optimizer-impl fused".into(), estimate: e });
        }
    }
    out
}
