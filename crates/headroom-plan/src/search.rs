//! The recommendation search: every combination of precision, attention
//! kernel, checkpoint policy, ZeRO stage and micro-batch (with gradient
//! accumulation to reach the global batch) that fits, ranked by estimated
//! throughput. Each configuration is a closed-form estimate (the optimal
//! checkpoint schedule, which runs a solver, is offered through `headroom plan
//! --checkpoint optimal` instead of inside the search).

use crate::gpu::GpuSpec;
use crate::model::Model;
use crate::train::{comm_time, estimate, Attention, Checkpointing, Precision, TrainConfig, TrainEstimate};

/// What the search may vary.
#[derive(Clone, Debug)]
pub struct SearchSpace {
    pub precisions: Vec<Precision>,
    pub attentions: Vec<Attention>,
    pub checkpointing: Vec<Checkpointing>,
    pub zero_stages: Vec<u8>,
    /// Micro-batches to try (powers of two up to the global batch).
    pub micro_batches: Vec<u64>,
}

impl SearchSpace {
    /// The default space for a global batch per data-parallel GPU.
    pub fn for_batch(per_gpu_batch: u64, layers: u64, gpus: u64) -> SearchSpace {
        let mut mb = vec![];
        let mut b = 1;
        while b <= per_gpu_batch {
            mb.push(b);
            b *= 2;
        }
        let mut ckpt = vec![Checkpointing::None, Checkpointing::Selective, Checkpointing::Full];
        ckpt.extend((2..=layers.min(16)).map(Checkpointing::EveryK));
        SearchSpace {
            precisions: vec![Precision::Mixed, Precision::Bf16, Precision::Amp, Precision::Fp32],
            attentions: vec![Attention::Flash, Attention::Sdpa, Attention::Eager],
            checkpointing: ckpt,
            zero_stages: if gpus > 1 { vec![0, 1, 2, 3] } else { vec![0] },
            micro_batches: mb,
        }
    }

    /// Configurations in the space.
    pub fn len(&self) -> usize {
        self.precisions.len()
            * self.attentions.len()
            * self.checkpointing.len()
            * self.zero_stages.len()
            * self.micro_batches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One configuration that fits.
#[derive(Clone, Debug)]
pub struct Recommendation {
    pub config: TrainConfig,
    /// Micro-batches accumulated per optimizer step.
    pub accumulation: u64,
    /// Seconds per optimizer step: the micro-batches and the communication.
    pub step_time_s: f64,
    /// The estimate of one micro-batch.
    pub estimate: TrainEstimate,
}

/// Every configuration of `space` around `base` (optimizer, sequence, GPUs
/// and coefficients come from it) that fits, fastest first; ties favour less
/// memory. `per_gpu_batch` sequences per GPU per optimizer step.
pub fn recommend(
    model: &Model,
    gpu: &GpuSpec,
    base: &TrainConfig,
    per_gpu_batch: u64,
    space: &SearchSpace,
) -> (Vec<Recommendation>, usize) {
    let mut out = Vec::new();
    let mut tried = 0;
    for &precision in &space.precisions {
        for &attention in &space.attentions {
            for &checkpointing in &space.checkpointing {
                for &zero_stage in &space.zero_stages {
                    for &micro_batch in &space.micro_batches {
                        tried += 1;
                        if !per_gpu_batch.is_multiple_of(micro_batch) {
                            continue;
                        }
                        let config =
                            TrainConfig { micro_batch, precision, attention, checkpointing, zero_stage, ..*base };
                        let e = estimate(model, gpu, &config);
                        if e.fits {
                            let accumulation = per_gpu_batch / micro_batch;
                            let compute = e.step_time_s - comm_time(model, gpu, &config, 1);
                            let step_time_s =
                                compute * accumulation as f64 + comm_time(model, gpu, &config, accumulation);
                            out.push(Recommendation { config, accumulation, step_time_s, estimate: e });
                        }
                    }
                }
            }
        }
    }
    // The same tokens per optimizer step: rank by time per step. On a tie, fewer
    // accumulation steps (larger micro-batches run closer to peak than the
    // model credits), then less memory.
    out.sort_by(|a, b| {
        a.step_time_s
            .total_cmp(&b.step_time_s)
            .then(a.accumulation.cmp(&b.accumulation))
            .then(a.estimate.per_gpu_bytes.total_cmp(&b.estimate.per_gpu_bytes))
    });
    (out, tried)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::gpu;
    use crate::model::preset;
    use crate::train::{ActivationModel, Optimizer};

    #[test]
    fn best_fits_and_beats_the_rest() {
        let m = preset("llama-2-7b").unwrap();
        let g = gpu("a100-80gb").unwrap();
        let base = TrainConfig {
            micro_batch: 1,
            seq: 4096,
            precision: Precision::Mixed,
            optimizer: Optimizer::AdamW,
            attention: Attention::Sdpa,
            checkpointing: Checkpointing::None,
            gpus: 1,
            zero_stage: 0,
            coefficients: ActivationModel::default(),
        };
        let space = SearchSpace::for_batch(16, m.layers, 1);
        let (recs, tried) = recommend(&m, &g, &base, 16, &space);
        assert_eq!(tried, space.len());
        assert!(!recs.is_empty());
        let best = &recs[0];
        assert!(best.estimate.fits);
        assert_eq!(best.config.micro_batch * best.accumulation, 16);
        for r in &recs {
            assert!(best.step_time_s <= r.step_time_s + 1e-12);
        }
        // Full fp32 Adam on 7B does not fit an 80 GB GPU at all.
        assert!(recs.iter().all(|r| r.config.precision != Precision::Fp32));
    }
}
