//! The spine: a training job's estimate, in the order it is made.
//!
//! 1. **Who runs it.** The first program builder of the table that serves the job runs it
//!    ([`crate::builders::runner`]); the job is planned as that builder's framework runs it.
//! 2. **Its programs.** The builder makes the step program of each pipeline rank it plans
//!    apart (one where every GPU runs the same); the user's calibration corrects them
//!    ([`crate::calibration`]).
//! 3. **Replayed** through headroom's allocator ([`crate::replay`]) on the memory PyTorch can
//!    have of the GPU: its memory less what lives outside the allocator. The rank whose replay
//!    reserves the most answers for the job. Optimal checkpointing's schedule is solved for
//!    the tensors; where its replay runs out, what the allocator's caching took beyond them is
//!    held back from the schedule's budget and the programs are built again.
//! 4. **Timed** ([`crate::time`]): the step's kernels, bubbles and collectives.
//! 5. **Judged**: it fits if its replay never ran out of memory. A job that runs out is
//!    replayed again on a device without limit, for what it would need term by term.
//!
//! The estimate keeps the program its verdict came from: `--dump-program` writes that one.
//! The closed form ([`crate::closed_form`]) enters only as the closed-form builders' input
//! and as the search's screen ([`Estimator::screen`]).

use crate::builders::{self, Built, Context, Device, NoRunner, Passed, ProgramSource, RankLayout, Runner};
use crate::calibration::Calibration;
use crate::closed_form::{self, Breakdown};
use crate::job::{Finetune, Framework, Job, Offload, OptimizerImpl, PipelineStage, Precision, TrainConfig};
use crate::parallel;
use crate::pipelining::PipelineSchedule;
use crate::placement::{forward_flops, ForwardFlops};
use crate::placement::{share, state_bytes_per_param};
use crate::program::{Phase, PhasePeaks, Program, Term};
use crate::replay::{replay, OutOfMemory, ReplaySettings, Replayed, When};
use crate::time::{step_time, StepTime};
use headroom_alloc::{AllocatorConfig, Backend, PolicyName};
use headroom_alloc::{Oom, OomKind, OomReport};
use std::sync::Arc;

/// How the planner turns a job into memory: the allocator its step programs are replayed
/// through, and the user's calibration.
#[derive(Clone, Debug)]
pub struct Estimator {
    /// `PYTORCH_CUDA_ALLOC_CONF`'s settings.
    pub alloc: AllocatorConfig,
    /// The allocation policy: PyTorch's, or one of headroom's.
    pub policy: PolicyName,
    /// The step's phases fitted to the user's own run ([`crate::calibrate`]).
    pub calibration: Option<Calibration>,
    /// Optimizer steps replayed: the first makes the optimizer's state, the later ones run
    /// with it (a third lets the cache settle as PyTorch's does).
    pub steps: u32,
}

impl Default for Estimator {
    fn default() -> Self {
        Estimator { alloc: AllocatorConfig::default(), policy: PolicyName::PyTorch, calibration: None, steps: 3 }
    }
}

impl Estimator {
    /// An estimator replaying under `PYTORCH_CUDA_ALLOC_CONF` settings `conf` and `policy`;
    /// refused where headroom's allocator does not run them (CUDA's asynchronous backend).
    pub fn replaying(conf: &str, policy: PolicyName) -> Result<Estimator, crate::InvalidConfig> {
        let alloc = AllocatorConfig::parse(conf).map_err(|e| crate::InvalidConfig(e.to_string()))?;
        if alloc.backend != Backend::Native {
            return Err(crate::InvalidConfig(
                "backend:cudaMallocAsync (CUDA's stream-ordered pool) is not simulated; headroom replays \
                 PyTorch's native caching allocator"
                    .into(),
            ));
        }
        Ok(Estimator { alloc, policy, ..Estimator::default() })
    }
}

/// Why a job has no estimate.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// No program builder serves the job as its framework runs it.
    #[error(transparent)]
    NoRunner(#[from] NoRunner),
    /// The builder that serves the job could not build it: a gap in the planner, not the job.
    #[error("the {builder} program builder serves this job but could not build it: {why}")]
    Unbuilt { builder: &'static str, why: String },
}

/// What a training job needs and how fast it runs: a few records, in the spine's order.
#[derive(Clone, Debug)]
pub struct Estimate {
    /// The job as planned: its framework the runner's.
    pub job: TrainConfig,
    pub runner: RunnerRecord,
    pub memory: Memory,
    /// How fast the step runs, where the time model times the builder's programs
    /// ([`RunnerRecord::untimed`] says why not).
    pub time: Option<Timing>,
    pub verdict: Verdict,
    /// The program the verdict came from (the rank that peaks).
    pub program: Arc<Program>,
}

/// Who ran the job, and why the builders before it did not.
#[derive(Clone, Debug, PartialEq)]
pub struct RunnerRecord {
    /// The builder's name ([`builders::Builder::name`]).
    pub builder: &'static str,
    /// The framework whose code the programs model.
    pub framework: Framework,
    /// What the programs were made from.
    pub source: ProgramSource,
    /// Why the estimate has no timing, where the time model does not time the builder's
    /// programs ([`builders::Builder::untimed`]).
    pub untimed: Option<&'static str>,
    /// The builders asked before it, and their reasons.
    pub passed: Vec<Passed>,
    /// Whether the programs hold `torch.compile`'s graphs.
    pub compiled: bool,
    /// AdamW's implementation the programs run.
    pub optimizer_impl: OptimizerImpl,
}

/// What the replay measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Memory {
    /// Bytes by term at the step's allocated peak; `framework` holds what the process keeps
    /// outside PyTorch's allocator and what the allocator reserves beyond its blocks.
    pub breakdown: Breakdown,
    /// What the job takes of the GPU at its peak: reserved memory plus what lives outside
    /// PyTorch (the CUDA context, NCCL, the driver's own).
    pub per_gpu_bytes: f64,
    /// `torch.cuda.max_memory_allocated()`: the replay's allocated peak.
    pub allocated_bytes: f64,
    /// The same less what only a GPU has (cuBLAS workspaces): the tensors a step makes, what
    /// the CPU ground truth measures.
    pub tensor_bytes: f64,
    /// `torch.cuda.max_memory_reserved()`: the replay's reserved peak.
    pub reserved_bytes: f64,
    /// What lives outside PyTorch's allocator.
    pub outside_bytes: f64,
    /// What PyTorch's allocator can have of the GPU: its memory less what lives outside it.
    pub capacity_bytes: f64,
    /// The phase of the step that peaks.
    pub phase: Option<Phase>,
    /// Each phase's allocated peak in the last step replayed.
    pub phase_peaks: PhasePeaks,
    /// The allocation that ran out of memory, where the job does not fit.
    pub oom: Option<OutOfMemory>,
    /// Device allocations (`cudaMalloc`) the replay made.
    pub device_mallocs: u64,
    /// Requests served only after the allocator freed its cache (`num_alloc_retries`).
    pub alloc_retries: u64,
    /// The stage whose memory is reported.
    pub stage: PipelineStage,
    /// Where every pipeline rank is planned: each rank's peak, and the one that peaks.
    pub pipeline: Option<PipelineRanks>,
    /// Host memory per node the offloaded states take.
    pub host_bytes: f64,
    /// Parameters with gradients (all of them, or the adapters).
    pub trainable_params: u64,
}

/// How fast the step runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    /// Seconds per optimizer step.
    pub step_time_s: f64,
    /// Where the step's time goes: compute, memory-bound, launch, communication.
    pub breakdown: crate::time::Breakdown,
    /// Tokens per second over the whole job.
    pub tokens_per_s: f64,
    /// Model FLOPs (6N or 4N per token plus attention, no recomputation) per second over the
    /// GPUs' dense peak.
    pub mfu: f64,
    /// One layer's forward and backward for one micro-batch, seconds, as a profile shows them.
    pub layer_time_s: [f64; 2],
    /// Forward FLOPs recomputed, as a fraction of one forward pass.
    pub recompute_fraction: f64,
}

/// Whether the job fits.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// The replay ran without running out of memory (and a schedule was found).
    pub fits: bool,
    /// What is left of the memory PyTorch can have, where it fits.
    pub margin_bytes: Option<f64>,
    /// With optimal checkpointing: why no schedule fits.
    pub note: Option<String>,
}

/// One pipeline rank's replay.
#[derive(Clone, Debug, PartialEq)]
pub struct RankPeak {
    pub layout: RankLayout,
    /// Its replay's reserved and allocated peaks, bytes.
    pub reserved_bytes: f64,
    pub allocated_bytes: f64,
}

/// Every pipeline rank's plan and the one that peaks.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineRanks {
    pub schedule: PipelineSchedule,
    /// The rank with the highest reserved peak (the first such).
    pub peak: u64,
    pub ranks: Vec<RankPeak>,
}

/// What [`Estimator::screen`] finds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Screened {
    /// The closed form's tensors at the peak, bytes.
    pub tensors: f64,
    /// Its step time, where the time model times the runner's programs.
    pub step_time_s: Option<f64>,
}

impl Estimate {
    /// Seconds per optimizer step, where the estimate is timed.
    pub fn step_time_s(&self) -> Option<f64> {
        self.time.as_ref().map(|t| t.step_time_s)
    }
}

/// Step times in order, fastest first; an untimed one after every timed one, and two untimed
/// ones equal (a stable sort keeps their order).
pub fn by_step_time(a: Option<f64>, b: Option<f64>) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (a, b) {
        (Some(a), Some(b)) => a.total_cmp(&b),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

/// A device larger than any job: 1 PiB.
const UNBOUNDED: u64 = 1 << 50;

/// The job as its runner plans it: its framework the one the runner models (`auto` resolved).
fn as_run<'a>(job: &Job<'a>, runner: Runner) -> Job<'a> {
    Job { train: TrainConfig { framework: runner.builder.framework(), ..job.train }, ..*job }
}

/// A build replayed: the programs, each rank's replay, and the one that peaks.
struct Run {
    built: Built,
    replays: Vec<Replayed>,
    peak: usize,
}

impl Run {
    fn replayed(&self) -> &Replayed {
        &self.replays[self.peak]
    }
}

impl Estimator {
    /// The job's estimate: see the module documentation.
    pub fn estimate(&self, job: &Job) -> Result<Estimate, PlanError> {
        let (runner, passed) = builders::runner(job)?;
        let job = as_run(job, runner);
        let capacity = job.capacity();
        let mut run = self.run_fitted(&job, runner, capacity)?;
        let mut oom = run.replayed().oom.clone();
        if oom.is_none() {
            // A snapshot that ran out of memory at this shape or a smaller one, on a device no
            // larger: the job does not fit, whatever the corrected program's replay says.
            oom = self.calibration_refuses(&job, capacity);
        }
        if oom.is_some() {
            // What it would need, term by term, beside where it ran out.
            let replays = self.replay_all(&job, &run.built, UNBOUNDED);
            run.peak = peak_rank(&replays);
            run.replays = replays;
        }
        let transformers = runner.builder.transformers_code(&job);
        let untimed = runner.builder.untimed(&job);
        let own = runner.builder.step_time(&job);
        let time = untimed.is_none().then(|| timing(&job, &run.built, transformers, own));
        let memory = self.memory(&job, &run, oom, capacity as f64);
        let fits = memory.oom.is_none() && run.built.note.is_none();
        let verdict = Verdict {
            fits,
            margin_bytes: fits.then_some(memory.capacity_bytes - memory.reserved_bytes),
            note: run.built.note.clone(),
        };
        let runner = RunnerRecord {
            builder: runner.builder.name(),
            framework: job.train.framework,
            source: run.built.source.clone(),
            untimed,
            passed,
            compiled: run.built.compiled,
            optimizer_impl: job.train.optimizer_implementation(Device::Gpu(job.gpu)),
        };
        let program = Arc::new(run.built.ranks.swap_remove(run.peak).program);
        Ok(Estimate { job: job.train, runner, memory, time, verdict, program })
    }

    /// Whether the job fits: the memory half of [`Estimator::estimate`], for searches. The
    /// closed form's tensors alone past the GPU's memory never fit; everything else is
    /// replayed.
    pub fn fits(&self, job: &Job) -> bool {
        let Ok((runner, _)) = builders::runner(job) else { return false };
        let job = as_run(job, runner);
        let capacity = job.capacity();
        if self.calibration.is_some() {
            // The corrected program alone decides; the closed form knows nothing of the run.
            if self.calibration_refuses(&job, capacity).is_some() {
                return false;
            }
        } else if job.recording.is_none() && !self.screen_fits(&job, runner, capacity as f64) {
            // A recording is its own program: the closed form knows nothing of it.
            return false;
        }
        self.run_fitted(&job, runner, capacity)
            .is_ok_and(|run| run.replayed().oom.is_none() && run.built.note.is_none())
    }

    /// The closed form alone (no replay): the configuration's tensors at their peak and its
    /// step time, or `None` where no builder serves it or its tensors alone exceed what
    /// PyTorch can have of the GPU (reserved memory is never less than allocated). Searches
    /// rank by it and replay only the configurations they report.
    pub fn screen(&self, job: &Job) -> Option<Screened> {
        let (runner, _) = builders::runner(job).ok()?;
        let job = as_run(job, runner);
        let capacity = job.capacity() as f64;
        let transformers = runner.builder.transformers_code(&job);
        let mut tensors = 0.0f64;
        let mut recompute = 0.0f64;
        for &stage in stages(&job.train) {
            let m = closed_form::memory(&job, stage, transformers, 0.0);
            let t = m.breakdown.total() - m.outside_allocator;
            if m.note.is_some() || t > capacity {
                return None;
            }
            if t >= tensors {
                tensors = t;
                recompute = m.recompute_fraction;
            }
        }
        let timed = runner.builder.untimed(&job).is_none();
        let step = || runner.builder.step_time(&job).unwrap_or_else(|| step_time(&job, recompute, transformers)).step;
        Some(Screened { tensors, step_time_s: timed.then(step) })
    }

    /// The longest sequence that fits (0 if none does), up to `limit` tokens.
    pub fn max_seq(&self, job: &Job, limit: u64) -> u64 {
        largest(limit, |seq| job.with(TrainConfig { seq, ..job.train }).is_ok_and(|j| self.fits(&j)))
    }

    /// The largest micro-batch that fits (0 if none does), up to `limit`.
    pub fn max_micro_batch(&self, job: &Job, limit: u64) -> u64 {
        largest(limit, |b| job.with(TrainConfig { micro_batch: b, ..job.train }).is_ok_and(|j| self.fits(&j)))
    }

    fn screen_fits(&self, job: &Job, runner: Runner, capacity: f64) -> bool {
        let transformers = runner.builder.transformers_code(job);
        stages(&job.train).iter().all(|&stage| {
            let m = closed_form::memory(job, stage, transformers, 0.0);
            m.note.is_none() && m.breakdown.total() - m.outside_allocator <= capacity
        })
    }

    /// The runner's programs replayed; under optimal checkpointing, built again with what the
    /// allocator's caching takes held back from the schedule's budget until the replay fits
    /// (a few times at most).
    fn run_fitted(&self, job: &Job, runner: Runner, capacity: u64) -> Result<Run, PlanError> {
        let mut run = self.run(job, runner, capacity, 0.0)?;
        if job.train.checkpointing != crate::job::Checkpointing::Optimal {
            return Ok(run);
        }
        let mut held_back = 0.0;
        for _ in 0..4 {
            let Some(oom) = &run.replayed().oom else { break };
            let short = (oom.oom.report.alloc_size as f64 - oom.oom.report.device_free as f64).max(0.0);
            held_back += short.max(0.02 * capacity as f64);
            let again = self.run(job, runner, capacity, held_back)?;
            if again.built.note.is_some() {
                break;
            }
            run = again;
        }
        Ok(run)
    }

    fn run(&self, job: &Job, runner: Runner, capacity: u64, held_back: f64) -> Result<Run, PlanError> {
        let cx = Context { device: Device::Gpu(job.gpu), steps: self.steps, held_back };
        let mut built =
            runner.builder.build(job, &cx).map_err(|why| PlanError::Unbuilt { builder: runner.builder.name(), why })?;
        if let Some(c) = &self.calibration {
            // The user's run corrects the program: its memory comes from replaying that.
            for r in &mut built.ranks {
                r.program = c.apply_program(&r.program);
            }
        }
        let replays = self.replay_all(job, &built, capacity);
        Ok(Run { peak: peak_rank(&replays), built, replays })
    }

    fn replay_all(&self, job: &Job, built: &Built, capacity: u64) -> Vec<Replayed> {
        let settings = ReplaySettings { capacity, config: self.alloc.clone(), policy: self.policy };
        let (b, s) = (job.train.micro_batch, job.train.seq);
        built.ranks.iter().map(|r| replay(&r.program, &r.program.sizes(b, s), &settings)).collect()
    }

    /// The calibration snapshot's own out-of-memory error, as this job's, where it refuses it.
    fn calibration_refuses(&self, job: &Job, capacity: u64) -> Option<OutOfMemory> {
        let c = self.calibration.as_ref()?;
        let e = c.refuses(job.train.micro_batch, job.train.seq, capacity as f64)?;
        // The recorded failure's figures; what a snapshot does not record is left 0.
        let report = OomReport {
            requested: e.oom.asked,
            rounded: e.oom.asked,
            alloc_size: e.oom.asked,
            device_total: capacity,
            device_free: e.oom.device_free.unwrap_or(0),
            allocated: e.oom.allocated,
            reserved: e.oom.reserved,
            ..OomReport::default()
        };
        Some(OutOfMemory {
            at: When { step: 0, phase: e.oom.phase, op: 0 },
            term: Term::Activations,
            site: format!("the calibration snapshot's own OOM at micro-batch {} × {} tokens", e.batch, e.seq),
            oom: Oom { kind: OomKind::OutOfMemory, report },
        })
    }

    fn memory(&self, job: &Job, run: &Run, oom: Option<OutOfMemory>, capacity: f64) -> Memory {
        let (model, cfg) = (job.model, &job.train);
        let r = run.replayed();
        let outside = job.outside_allocator();
        let by = |t: Term| r.at_peak.get(t) as f64;
        let breakdown = Breakdown {
            weights: by(Term::Weights),
            gradients: by(Term::Gradients),
            optimizer: by(Term::Optimizer),
            activations: by(Term::Activations) + by(Term::Inputs),
            logits: by(Term::Logits),
            temporary: by(Term::Temporary) + by(Term::Workspace),
            framework: outside + r.cached() as f64,
        };
        let rank = &run.built.ranks[run.peak];
        let pipeline = rank.layout.as_ref().map(|_| PipelineRanks {
            schedule: cfg.parallel.pipeline_schedule(),
            peak: run.peak as u64,
            ranks: run
                .built
                .ranks
                .iter()
                .zip(&run.replays)
                .filter_map(|(rp, r)| {
                    Some(RankPeak {
                        layout: rp.layout.clone()?,
                        reserved_bytes: r.peak_reserved as f64,
                        allocated_bytes: r.peak_allocated as f64,
                    })
                })
                .collect(),
        });
        let reserved = r.peak_reserved as f64;
        Memory {
            breakdown,
            per_gpu_bytes: reserved + outside,
            allocated_bytes: r.peak_allocated as f64,
            tensor_bytes: (r.peak_allocated - r.at_peak.get(Term::Workspace)) as f64,
            reserved_bytes: reserved,
            outside_bytes: outside,
            capacity_bytes: capacity,
            phase: Some(r.peak_at.phase).filter(|p| *p != Phase::Setup),
            phase_peaks: r.phase_peaks,
            oom,
            device_mallocs: r.device_mallocs,
            alloc_retries: r.alloc_retries,
            stage: rank.stage,
            pipeline,
            host_bytes: host_bytes(job, rank.stage),
            trainable_params: (share(model, cfg, PipelineStage::Only).trainable * cfg.parallel.tensor as f64).round()
                as u64,
        }
    }
}

/// The rank whose replay reserves the most (the first such): torchtitan's benchmarks report
/// the maximum over the GPUs.
fn peak_rank(replays: &[Replayed]) -> usize {
    let mut best = 0;
    for (i, r) in replays.iter().enumerate() {
        if r.peak_reserved > replays[best].peak_reserved {
            best = i;
        }
    }
    best
}

/// Host memory per node the offloaded states take: the fp32 master, the optimizer's states and
/// fp32 gradients of each GPU's shard; with the parameters offloaded, their 16-bit copy too.
fn host_bytes(job: &Job, stage: PipelineStage) -> f64 {
    let (model, cfg) = (job.model, &job.train);
    let par = &cfg.parallel;
    let sh = share(model, cfg, stage);
    let d = par.shard_degree() as f64;
    let states = (state_bytes_per_param(model.hidden, Precision::Mixed, cfg.optimizer).optimizer + 4.0) * sh.trainable;
    let per_gpu = match cfg.offload {
        Offload::None => 0.0,
        Offload::Optimizer => states / d,
        Offload::OptimizerAndParams => (states + 2.0 * (sh.trainable + sh.frozen_linear + sh.frozen_other)) / d,
    };
    per_gpu * par.gpus().min(parallel::GPUS_PER_NODE) as f64
}

/// The step's time, throughput and model FLOPs utilization: of `own`, the builder's own step
/// time, where it has one, or the time model's.
fn timing(job: &Job, built: &Built, transformers: bool, own: Option<StepTime>) -> Timing {
    let (model, gpu, cfg) = (job.model, job.gpu, &job.train);
    let par = &cfg.parallel;
    let t = own.unwrap_or_else(|| step_time(job, built.recompute_fraction, transformers));
    let tokens = cfg.micro_batch as f64 * cfg.seq as f64 * cfg.accumulation as f64 * par.data as f64;
    let ForwardFlops { linear, attention, head } = forward_flops(model, cfg);
    let passes = if matches!(cfg.finetune, Finetune::Lora { .. }) { 2.0 } else { 3.0 };
    let model_flops = passes * (linear + attention + head) * (cfg.accumulation * par.data) as f64;
    let peak = match cfg.precision {
        Precision::Fp32 => gpu.fp32_flops,
        Precision::Fp8 => gpu.fp8_flops.unwrap_or(gpu.bf16_flops),
        _ => gpu.bf16_flops,
    };
    Timing {
        step_time_s: t.step,
        breakdown: t.breakdown,
        tokens_per_s: tokens / t.step,
        mfu: model_flops / (t.step * par.gpus() as f64 * peak),
        layer_time_s: [t.layer_forward, t.layer_backward],
        recompute_fraction: built.recompute_fraction,
    }
}

/// The pipeline stages the closed form estimates: the one GPU's, or the first and last stage's.
fn stages(cfg: &TrainConfig) -> &'static [PipelineStage] {
    if cfg.parallel.pipeline > 1 {
        &[PipelineStage::First, PipelineStage::Last]
    } else {
        &[PipelineStage::Only]
    }
}

/// The largest n in 1..=limit for which `fits(n)`, 0 if none: doubling, then bisection
/// (what fits is taken as monotone in n).
pub(crate) fn largest(limit: u64, fits: impl Fn(u64) -> bool) -> u64 {
    if limit == 0 || !fits(1) {
        return 0;
    }
    let (mut lo, mut hi) = (1u64, 2u64);
    while hi <= limit && fits(hi) {
        lo = hi;
        if hi == u64::MAX {
            return lo;
        }
        hi = hi.saturating_mul(2);
    }
    let mut hi = hi.min(limit.saturating_add(1));
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// One configuration at PyTorch's allocator defaults ([`Estimator::estimate`]).
pub fn estimate(job: &Job) -> Result<Estimate, PlanError> {
    Estimator::default().estimate(job)
}
