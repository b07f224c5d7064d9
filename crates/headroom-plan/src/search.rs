//! The recommendation search: every combination of precision, attention
//! kernel, checkpoint policy, parallel layout (tensor × pipeline × context ×
//! data, interleaving), ZeRO stage, CPU offload and micro-batch (with
//! gradient accumulation to reach the global batch), ranked by time per
//! optimizer step. Every configuration is screened by the closed-form pass
//! ([`Estimator::screen`]: its tensors, its step time); then, fastest first,
//! each is replayed through the allocator ([`Estimator::estimate`]) until as
//! many as asked are found to fit — what decides the verdict is the replay,
//! as for a single plan (the optimal checkpoint schedule, which runs a solver,
//! is offered through `headroom plan --checkpoint optimal` instead of inside
//! the search).
//!
//! A job that replays a recording (`--program`) has other levers: its precision, optimizer,
//! kernels and sharding are in the recorded tensors. [`recommend_recorded`] searches the
//! allocator's settings, checkpointing by layers made of the recording and, where its laws
//! were fitted from two micro-batches, the micro-batch with accumulation; every candidate is
//! replayed, ranked by the step time its kernels give where they give one.

use crate::emit::{self, Engine};
use crate::estimate::{by_step_time, Estimate, Estimator, Screened};
use crate::gpu::GpuSpec;
use crate::job::{Attention, Checkpointing, Framework, Job, Offload, Optimizer, OptimizerImpl, Precision, TrainConfig};
use crate::model::Model;
use crate::parallel::{Parallelism, GPUS_PER_NODE};
use crate::program::{Op, Phase, Program, Term};
use crate::recording::Recording;

/// What the search may vary.
#[derive(Clone, Debug)]
pub struct SearchSpace {
    pub precisions: Vec<Precision>,
    pub attentions: Vec<Attention>,
    pub checkpointing: Vec<Checkpointing>,
    /// Tensor, pipeline, context and data degrees and interleaving (the ZeRO stage is varied apart).
    pub layouts: Vec<Parallelism>,
    pub zero_stages: Vec<u8>,
    pub offloads: Vec<Offload>,
    /// Micro-batches to try (powers of two up to the global batch).
    pub micro_batches: Vec<u64>,
}

impl SearchSpace {
    /// The default space for `gpus` GPUs training `model` on sequences of
    /// `seq` tokens, `global_batch` sequences per optimizer step. Tensor
    /// parallelism stays inside a node; context parallelism is tried from
    /// 16K tokens on.
    pub fn for_job(model: &Model, gpu: &GpuSpec, gpus: u64, seq: u64, global_batch: u64) -> SearchSpace {
        let mut micro_batches = vec![];
        let mut b = 1u64;
        while b <= global_batch {
            micro_batches.push(b);
            let Some(next) = b.checked_mul(2) else { break };
            b = next;
        }
        let mut checkpointing =
            vec![Checkpointing::None, Checkpointing::Selective, Checkpointing::PerOp, Checkpointing::Full];
        checkpointing.extend((2..=model.layers.min(16)).map(Checkpointing::EveryK));
        let mut precisions = vec![Precision::Mixed, Precision::Bf16, Precision::Amp, Precision::Fp32];
        if gpu.fp8_flops.is_some() {
            precisions.push(Precision::Fp8);
        }
        let powers = |limit: u64| (0..).map(|i| 1u64 << i).take_while(move |&x| x <= limit);
        let contexts: Vec<u64> = if seq >= 16384 { powers(8).collect() } else { vec![1] };
        let mut layouts = vec![];
        for t in powers(GPUS_PER_NODE.min(gpus)) {
            for c in &contexts {
                for p in powers(gpus / t) {
                    let model_parallel = t * c * p;
                    if !gpus.is_multiple_of(model_parallel) {
                        continue;
                    }
                    for v in [1, 2] {
                        let layout = Parallelism {
                            data: gpus / model_parallel,
                            tensor: t,
                            pipeline: p,
                            context: *c,
                            sequence_parallel: true,
                            virtual_stages: v,
                            schedule: Default::default(),
                            stage_outputs: Default::default(),
                            tp_comm_overlap: false,
                            zero_stage: 0,
                            replicate: 1,
                        };
                        if layout.check(model, seq).is_ok() {
                            layouts.push(layout);
                        }
                    }
                }
            }
        }
        SearchSpace {
            precisions,
            // SDPA's flash kernel costs what FlashAttention does in this model: trying both would only duplicate rows.
            attentions: vec![Attention::Flash, Attention::Eager],
            checkpointing,
            layouts,
            zero_stages: if gpus > 1 { vec![0, 1, 2, 3] } else { vec![0] },
            offloads: vec![Offload::None, Offload::Optimizer, Offload::OptimizerAndParams],
            micro_batches,
        }
    }

    /// Configurations in the space.
    pub fn len(&self) -> usize {
        self.precisions.len()
            * self.attentions.len()
            * self.checkpointing.len()
            * self.layouts.len()
            * self.zero_stages.len()
            * self.offloads.len()
            * self.micro_batches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The space with what the user fixed held, not searched.
    pub fn holding(mut self, held: &Held) -> SearchSpace {
        if let Some(p) = held.precision {
            self.precisions = vec![p];
        }
        if let Some(a) = held.attention {
            self.attentions = vec![a];
        }
        if let Some(o) = held.offload {
            self.offloads = vec![o];
        } else if held.framework.is_some_and(|f| f != Framework::DeepSpeed) {
            // CPU offload is DeepSpeed's: another framework held runs none.
            self.offloads = vec![Offload::None];
        }
        self
    }
}

/// What the user gave on the command line, held by the search (the optimizer, fine-tuning
/// and sequence always come from the job).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Held {
    pub precision: Option<Precision>,
    pub attention: Option<Attention>,
    /// A framework named (not `auto`): every row runs it.
    pub framework: Option<Framework>,
    pub offload: Option<Offload>,
}

/// A configuration with every-k checkpointing's k left out: rows that differ only by it are
/// one row, the fastest.
fn distinct(c: &TrainConfig) -> TrainConfig {
    match c.checkpointing {
        Checkpointing::EveryK(_) => TrainConfig { checkpointing: Checkpointing::EveryK(0), ..*c },
        _ => *c,
    }
}

/// One configuration that fits.
#[derive(Clone, Debug)]
pub struct Recommendation {
    /// The configuration; its `accumulation` reaches the global batch.
    pub config: TrainConfig,
    pub estimate: Estimate,
    /// The allocator settings it was replayed under, as the user sets them, where the search
    /// varied them (a recording's: [`recommend_recorded`]).
    pub allocator: Option<String>,
}

/// What a search found.
#[derive(Clone, Debug, Default)]
pub struct Search {
    /// The fastest configurations that fit, replayed, fastest first.
    pub recommendations: Vec<Recommendation>,
    /// Configurations considered.
    pub tried: usize,
    /// Of them, those whose tensors alone fit (the closed-form pass): at most this many fit.
    pub fit_by_tensors: usize,
    /// Configurations replayed to find `recommendations` (and `engine_pick`).
    pub replayed: usize,
    /// The fastest configuration that fits and that the engine asked for can run, with its
    /// place (1-based) among the configurations that fit, fastest first.
    pub engine_pick: Option<(usize, Recommendation)>,
}

/// Every configuration of `space` around `base`'s (optimizer, fine-tuning, sequence and
/// framework come from it; a framework other than `auto` is every row's) that reaches `global_batch` sequences per optimizer step:
/// screened by the closed form, ranked by time per step (ties favour fewer accumulation
/// steps, then the numerically safer precision, then less memory), then replayed in that
/// order until `wanted` distinct ones are found to fit (rows that differ only by every-k's k
/// are one, the fastest; a configuration that fits only with AdamW's fused
/// implementation, where none was named, is kept with it) — and, with `engine`, on until the fastest that fits
/// and that `engine` runs is found, planned as that engine runs it (or `ENGINE_SEARCH_LIMIT`
/// more have been replayed).
pub fn recommend(
    base: &Job,
    global_batch: u64,
    space: &SearchSpace,
    estimator: &Estimator,
    wanted: usize,
    engine: Option<Engine>,
) -> Search {
    let mut screened = Vec::new();
    let mut tried = 0;
    for layout in &space.layouts {
        for &zero_stage in &space.zero_stages {
            let parallel = Parallelism { zero_stage, ..*layout };
            // ZeRO shards over the data-parallel (and context-parallel) GPUs: over one it is
            // the unsharded job, shown once.
            if zero_stage > 0 && parallel.shard_degree() <= 1 {
                continue;
            }
            for &offload in &space.offloads {
                for &micro_batch in &space.micro_batches {
                    let candidates = space.precisions.len() * space.attentions.len() * space.checkpointing.len();
                    tried += candidates;
                    let Some(per_step) = micro_batch.checked_mul(parallel.data) else { continue };
                    if !global_batch.is_multiple_of(per_step) {
                        continue;
                    }
                    let accumulation = global_batch / per_step;
                    for &precision in &space.precisions {
                        for &attention in &space.attentions {
                            for &checkpointing in &space.checkpointing {
                                let config = TrainConfig {
                                    micro_batch,
                                    accumulation,
                                    precision,
                                    attention,
                                    checkpointing,
                                    parallel,
                                    offload,
                                    ..base.train
                                };
                                // Selective recomputation only drops the s² scores, which flash kernels never keep.
                                let redundant =
                                    checkpointing == Checkpointing::Selective && attention != Attention::Eager;
                                if redundant {
                                    continue;
                                }
                                let Ok(job) = base.with(config) else { continue };
                                if let Some(s) = estimator.screen(&job) {
                                    screened.push((config, s));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    screened.sort_by(screened_order);
    let mut out = Search { tried, fit_by_tensors: screened.len(), ..Search::default() };
    let mut fitting = 0;
    let limit = wanted + ENGINE_SEARCH_LIMIT;
    for (config, _) in screened {
        let shown = out.recommendations.iter().any(|r| distinct(&r.config) == distinct(&config));
        let need_rows = out.recommendations.len() < wanted && !shown;
        // The engine's configurations are looked for among those it accepts only, each planned
        // as that engine runs it: a row it cannot run is not replayed for it.
        let for_engine = engine
            .filter(|&e| {
                out.engine_pick.is_none() && out.replayed < limit && emit::emit(e, base.model, &config).is_ok()
            })
            .map(|e| TrainConfig { framework: e.framework(base.train.framework), ..config });
        if !need_rows && for_engine.is_none() {
            let rows_done = out.recommendations.len() >= wanted;
            if rows_done && (out.engine_pick.is_some() || engine.is_none() || out.replayed >= limit) {
                break;
            }
            continue;
        }
        out.replayed += 1;
        let mut row_fits = false;
        if need_rows {
            if let Some(r) = fitting_row(base, estimator, config) {
                fitting += 1;
                row_fits = true;
                if for_engine == Some(config) {
                    out.engine_pick = Some((fitting, r.clone()));
                }
                out.recommendations.push(r);
            }
        }
        // Its place among those that fit: this one's, where the row is planned the same way.
        if let Some(c) = for_engine.filter(|_| out.engine_pick.is_none()) {
            if let Some(r) = fitting_row(base, estimator, c) {
                out.engine_pick = Some((if row_fits { fitting } else { fitting + 1 }, r));
            }
        }
    }
    out
}

/// The screen's ranking: the fastest first, an untimed configuration after every timed one;
/// ties favour fewer accumulation steps, then the safer precision, then fewer tensors (the
/// sort is stable: configurations equal in all keep the search's order).
fn screened_order((a, sa): &(TrainConfig, Screened), (b, sb): &(TrainConfig, Screened)) -> std::cmp::Ordering {
    let safety = |p: Precision| match p {
        Precision::Mixed => 0,
        Precision::Fp8 => 1,
        Precision::Amp => 2,
        Precision::Fp32 => 3,
        Precision::Bf16 => 4,
    };
    by_step_time(sa.step_time_s, sb.step_time_s)
        .then(a.accumulation.cmp(&b.accumulation))
        .then(safety(a.precision).cmp(&safety(b.precision)))
        .then(sa.tensors.total_cmp(&sb.tensors))
}

/// `config` replayed, where it fits: as asked, or where AdamW's default implementation keeps
/// a copy of the second moments the fused one does not, with the fused one (the row says so).
fn fitting_row(base: &Job, estimator: &Estimator, config: TrainConfig) -> Option<Recommendation> {
    let estimate_of = |config: TrainConfig| base.with(config).ok().and_then(|j| estimator.estimate(&j).ok());
    let estimate = estimate_of(config)?;
    let framework = base.train.framework;
    if framework != Framework::Auto && estimate.runner.framework != framework {
        return None;
    }
    if estimate.verdict.fits {
        return Some(Recommendation { config, estimate, allocator: None });
    }
    let may_fuse = config.optimizer == Optimizer::AdamW
        && config.optimizer_impl.is_none()
        && estimate.runner.optimizer_impl != OptimizerImpl::Fused;
    if !may_fuse {
        return None;
    }
    let fused = TrainConfig { optimizer_impl: Some(OptimizerImpl::Fused), ..config };
    estimate_of(fused)
        .filter(|e| e.verdict.fits && (framework == Framework::Auto || e.runner.framework == framework))
        .map(|estimate| Recommendation { config: fused, estimate, allocator: None })
}

/// What a recording's search varies: the levers a recorded step has. Its precision, optimizer,
/// attention kernel and sharding are the recording's own (record it again to change them).
#[derive(Clone, Debug)]
pub struct RecordedSpace {
    /// The allocator settings to replay under, each labelled as the user sets it; the job's
    /// first.
    pub allocators: Vec<(String, Estimator)>,
    /// Checkpointing by layers, made of the recording ([`crate::recompute`]).
    pub checkpointing: Vec<Checkpointing>,
    /// Micro-batches to try, each accumulated to the global batch.
    pub micro_batches: Vec<u64>,
}

impl RecordedSpace {
    /// The levers `recording` has at `global_batch` sequences a step, checkpointing held where
    /// `held` names it: the allocator settings given; checkpointing by layers where the
    /// recording names layers and its kernels do not say it was recorded with checkpointing;
    /// and, where its laws were fitted from two micro-batches, every power of two that divides
    /// the global batch (else the recorded one). An inference recording has neither
    /// checkpointing nor accumulation: its levers are the allocator's settings.
    pub fn for_recording(
        recording: &Recording,
        allocators: Vec<(String, Estimator)>,
        held: Option<Checkpointing>,
        micro_batch: u64,
        global_batch: u64,
    ) -> RecordedSpace {
        let layers = recording.layers();
        let checkpointing = match held {
            Some(c) => vec![c],
            None if layers > 0 && !recording.recomputes() && !recording.inference() => {
                let mut c = vec![Checkpointing::None, Checkpointing::Full];
                c.extend((2..layers.min(17)).map(Checkpointing::EveryK));
                c
            }
            None => vec![Checkpointing::None],
        };
        // Inference has no optimizer step to accumulate micro-batches for: the batch is the recorded one.
        let micro_batches = if recording.grows_with(true, "").is_ok() && !recording.inference() {
            (0..64)
                .map(|i| 1u64 << i)
                .take_while(|&b| b <= global_batch)
                .filter(|&b| global_batch.is_multiple_of(b))
                .collect()
        } else {
            vec![micro_batch].into_iter().filter(|&b| global_batch.is_multiple_of(b)).collect()
        };
        RecordedSpace { allocators, checkpointing, micro_batches }
    }

    /// Configurations in the space.
    pub fn len(&self) -> usize {
        self.allocators.len() * self.checkpointing.len() * self.micro_batches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The gradients a recorded step holds when its optimizer step begins: what gradient
/// accumulation keeps through the later micro-batches' forward and backward, which a recording
/// of one micro-batch does not hold.
pub fn held_gradients(program: &Program, micro_batch: u64, seq: u64) -> f64 {
    let sizes = program.sizes(micro_batch, seq);
    let mut live = vec![false; program.tensors.len()];
    for op in &program.ops {
        match *op {
            Op::Alloc(t) => live[t as usize] = true,
            Op::Free(t) => live[t as usize] = false,
            Op::Mark { step: 1, phase: Phase::OptimizerStep } => {
                return program
                    .tensors
                    .iter()
                    .zip(&sizes)
                    .zip(&live)
                    .filter(|((t, _), &l)| l && t.term == Term::Gradients)
                    .map(|((_, &b), _)| b as f64)
                    .sum();
            }
            _ => {}
        }
    }
    0.0
}

/// How much of the forward a checkpointing policy recomputes, least first: the order in
/// which configurations the recording cannot time are tried.
fn recompute_rank(c: Checkpointing) -> u64 {
    match c {
        Checkpointing::None => 0,
        Checkpointing::EveryK(k) => u64::MAX / 2 - k,
        _ => u64::MAX,
    }
}

/// `--recommend` for a job that replays a recording (`base.recording`): every configuration
/// of `space` that reaches `global_batch` sequences a step, replayed in order — those the
/// recording's kernels time (its recorded shape, without checkpointing made of it; with
/// accumulation, its forward and backward once a micro-batch) fastest first, then those it
/// cannot time, by less recomputation, then fewer accumulation steps, then the allocator
/// settings in the order given — until `wanted`
/// are found to fit (rows that differ only by every-k's k are one, the first). A
/// configuration that accumulates fits only where its margin also holds the gradients the
/// optimizer reads ([`held_gradients`]), which one recorded micro-batch does not hold through
/// the next micro-batch's forward.
pub fn recommend_recorded(base: &Job, global_batch: u64, space: &RecordedSpace, wanted: usize) -> Search {
    let Some(recording) = base.recording else { return Search::default() };
    let (mut rows, mut tried) = (Vec::new(), 0);
    for (i, (label, estimator)) in space.allocators.iter().enumerate() {
        for &micro_batch in &space.micro_batches {
            let per_step = micro_batch.saturating_mul(base.train.parallel.data);
            if !global_batch.is_multiple_of(per_step) {
                continue;
            }
            let accumulation = global_batch / per_step;
            for &checkpointing in &space.checkpointing {
                if recording.refuses_shape(micro_batch, base.train.seq).is_some() {
                    continue;
                }
                let config = TrainConfig { micro_batch, accumulation, checkpointing, ..base.train };
                tried += 1;
                let Ok(job) = base.with(config) else { continue };
                // Tensors that alone exceed what PyTorch can have never fit: not replayed.
                let Some(screened) = estimator.screen(&job) else { continue };
                rows.push((screened.step_time_s, checkpointing, accumulation, i, label, estimator, job));
            }
        }
    }
    rows.sort_by(|a, b| {
        by_step_time(a.0, b.0)
            .then(recompute_rank(a.1).cmp(&recompute_rank(b.1)))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
    });
    let mut out = Search { tried, fit_by_tensors: rows.len(), ..Search::default() };
    for (_, _, accumulation, _, label, estimator, job) in rows {
        if out.recommendations.len() >= wanted {
            break;
        }
        let config = job.train;
        let shown = out
            .recommendations
            .iter()
            .any(|r| distinct(&r.config) == distinct(&config) && r.allocator.as_deref() == Some(label.as_str()));
        if shown {
            continue;
        }
        out.replayed += 1;
        let Ok(estimate) = estimator.estimate(&job) else { continue };
        let held = if accumulation > 1 {
            held_gradients(&estimate.program, job.train.micro_batch, job.train.seq)
        } else {
            0.0
        };
        let fits = estimate.verdict.fits && estimate.verdict.margin_bytes.unwrap_or(0.0) >= held;
        if fits {
            out.recommendations.push(Recommendation { config, estimate, allocator: Some(label.clone()) });
        }
    }
    out
}

/// Configurations replayed beyond the shown rows while looking for the engine's.
pub const ENGINE_SEARCH_LIMIT: usize = 2000;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::gpu;
    use crate::job::Optimizer;
    use crate::model::preset;

    #[test]
    fn the_screen_ranks_untimed_configurations_after_timed_ones_and_keeps_ties_in_order() {
        let config = |micro_batch| TrainConfig::new(micro_batch, 4096, Precision::Mixed, Optimizer::AdamW);
        let screened = |micro_batch, step_time_s| (config(micro_batch), Screened { tensors: 1.0, step_time_s });
        let mut rows = [screened(1, None), screened(2, Some(2.0)), screened(3, None), screened(4, Some(1.0))];
        rows.sort_by(screened_order);
        let order: Vec<u64> = rows.iter().map(|(c, _)| c.micro_batch).collect();
        assert_eq!(order, [4, 2, 1, 3]);
        assert_eq!(by_step_time(Some(f64::MAX), None), std::cmp::Ordering::Less);
        assert_eq!(by_step_time(None, None), std::cmp::Ordering::Equal);
    }

    #[test]
    fn best_fits_and_beats_the_rest() {
        let m = preset("llama-2-7b").unwrap();
        let g = gpu("a100-80gb").unwrap();
        let base = Job::new(&m, &g, TrainConfig::new(1, 4096, Precision::Mixed, Optimizer::AdamW)).unwrap();
        let space = SearchSpace::for_job(&m, &g, 1, 4096, 16);
        let found = recommend(&base, 16, &space, &Estimator::default(), 20, None);
        let recs = &found.recommendations;
        assert_eq!(found.tried, space.len());
        assert!(found.fit_by_tensors >= recs.len() && found.replayed >= recs.len());
        assert_eq!(recs.len(), 20);
        let best = &recs[0];
        assert!(best.estimate.verdict.fits);
        assert_eq!(best.config.global_batch(), 16);
        for r in recs {
            assert!(r.estimate.verdict.fits, "every row is replayed and fits");
            assert!(best.estimate.step_time_s().unwrap() <= r.estimate.step_time_s().unwrap() + 1e-12);
        }
        // Full fp32 Adam on 7B needs 16 bytes a parameter: 108 GB, more than the GPU, unless offloaded.
        assert!(recs.iter().all(|r| r.config.precision != Precision::Fp32 || r.config.offload != Offload::None));
    }

    #[test]
    fn a_model_too_big_for_data_parallelism_gets_model_parallel_layouts() {
        let m = preset("llama-2-70b").unwrap();
        let g = gpu("a100-80gb").unwrap();
        let base = Job::new(&m, &g, TrainConfig::new(1, 4096, Precision::Mixed, Optimizer::AdamW)).unwrap();
        let mut space = SearchSpace::for_job(&m, &g, 64, 4096, 512);
        space.offloads = vec![Offload::None];
        space.zero_stages = vec![0, 1];
        let recs = recommend(&base, 512, &space, &Estimator::default(), 20, None).recommendations;
        // 70B replicas need 4Ψ + 12Ψ/d = 276+ GB with ZeRO-1: only layouts that split the model fit.
        assert!(!recs.is_empty());
        assert!(recs.iter().all(|r| r.config.parallel.model_parallel() > 1), "{:?}", recs[0].config.parallel);
        assert!(recs.iter().all(|r| r.config.parallel.gpus() == 64 && r.config.global_batch() == 512));
    }

    /// ZeRO over one data-parallel GPU is the unsharded job: one row, not one per stage; and
    /// torchtitan, which has no ZeRO-1, is never offered it.
    #[test]
    fn zero_stages_only_where_they_shard() {
        let m = preset("llama-3-8b").unwrap();
        let g = gpu("h100-sxm").unwrap();
        let base = TrainConfig {
            framework: crate::job::Framework::Torchtitan,
            ..TrainConfig::new(1, 8192, Precision::Bf16, Optimizer::AdamW)
        };
        let space = SearchSpace::for_job(&m, &g, 8, 8192, 128);
        let found = recommend(&Job::new(&m, &g, base).unwrap(), 128, &space, &Estimator::default(), 20, None);
        assert_eq!(found.recommendations.len(), 20);
        for r in &found.recommendations {
            let p = &r.config.parallel;
            assert!(p.zero_stage == 0 || p.shard_degree() > 1, "{p:?}");
            assert!(p.zero_stage != 1, "{p:?}");
        }
        assert!(found.tried < space.len(), "the stages over one GPU were not screened");
        let zero1 = TrainConfig { parallel: Parallelism { data: 8, zero_stage: 1, ..Parallelism::default() }, ..base };
        let e = zero1.check(&m, &g).unwrap_err();
        assert!(e.to_string().contains("no ZeRO stage 1"), "{e}");
    }
}
