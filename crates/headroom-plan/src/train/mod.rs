//! Training memory per GPU, term by term, and the step time.
//!
//! | term | formula | source (research/estimation.md) |
//! |---|---|---|
//! | weights, gradients, optimizer | bytes/param by precision and optimizer, for the parameters on the GPU's pipeline stage ÷ tensor parallelism, ÷ data parallelism for the ZeRO-sharded ones; LoRA: frozen base at its width plus adapters with full states; offloaded states leave the GPU | §1.1–§1.4 |
//! | activations | per layer sbh·(c₀ + c₁·f/h) at the activation width, plus the attention core: 5as²b (eager) or 4asb (SDPA/flash); ÷t (the replicated 10·sbh stays without sequence parallelism), ÷ context parallelism; × the micro-batches a 1F1B stage holds (first stage: L layers' worth), × 1 + (p−1)/(p·v) interleaved; by checkpoint policy | §2.1, §2.3, §2.5, §8.4 |
//! | logits | b·s·V/t on the last stage × the bytes the loss holds at its peak: Hugging Face's loss upcasts the 16-bit logits to fp32 and keeps both, log-softmax keeps its fp32 output, and the backward makes an fp32 gradient and its 16-bit copy: 2 + 4 + 4 + 4 + 2 = 16 bytes (12 in fp32) | §2.4 |
//! | temporary | cuBLAS workspace; ZeRO-3's gathered layer (4 × layer params), or under pipelining the stage's parameters gathered in 16 bits (FSDP2 keeps them from a micro-batch's forward to its backward); under DeepSpeed its gradient bucket and ZeRO-3's parameters still gathered at the turn to the backward ([`deepspeed`]); a dequantized QLoRA matrix; the offload gradient bucket | §1.4, §4.1 |
//! | framework | CUDA context; NCCL buffers with more than one GPU; the caching allocator's rounding and slack over the short-lived terms (activations, logits, temporaries) | §4.1, §9 |
//!
//! With pipeline parallelism the first stage (most activations) and the last
//! (the logits) are both estimated and the larger is the answer.
//!
//! Step time, per optimizer step of `accumulation` micro-batches: each layer's
//! kernels on the GPU's share (tensor and context parallelism split them, a
//! pipeline stage runs L/p layers) by class ([`crate::kernel`]): the matrix
//! multiplies by shape, at the part's measured matrix efficiency times the
//! share of its SMs their tiles keep busy, their backward as the input's and
//! the weight's gradients (the input's alone for a frozen LoRA base); attention
//! by kernel (a fused kernel at its measured share of the peak, the causal half
//! skipped; materialised scores as batched multiplies and a softmax's memory
//! traffic); norms, residual adds and activations by the bytes they move; the
//! logits and the loss on the last stage; plus what the checkpoint policy
//! recomputes, class by class;
//! the pipeline runs m + (p−1)/v micro-batch slots (the bubble); per
//! micro-batch, tensor parallelism's 4 all-reduces of sbh per layer (6 with
//! recomputation) on the critical path (beyond the GEMMs with
//! Transformer Engine's overlap), context parallelism's K/V
//! all-gathers (forward, backward) and gradient reduce-scatter beyond what
//! the attention hides, and the stage-to-stage sends; the data-parallel
//! collectives (all-reduce of the gradients for plain data parallelism and
//! ZeRO-1; ZeRO-2 reduce-scatters per micro-batch and gathers the weights
//! once; ZeRO-3 gathers the weights twice and reduce-scatters per
//! micro-batch) beyond the forward or backward they overlap; and the
//! optimizer step: memory-bound on the GPU (the weights, gradients and
//! states it updates read and written at 90% of the HBM bandwidth), or with
//! offload the host-link traffic and the CPU's step, not overlapped.

use crate::gpu::GpuSpec;
pub use crate::job::*;
pub use crate::live::Breakdown;
use crate::live::{memory, StageMemory};
pub use crate::model::Head;
use crate::model::Model;
use crate::parallel;
use crate::placement::share;
pub use crate::placement::{model_states, state_bytes_per_param, ModelStates};
pub use crate::program::Phase;
use crate::program::{Program, Term};
pub use crate::replay::OutOfMemory;
use crate::replay::{replay, ReplaySettings, Replayed};
use crate::step::{Calibration, Phases};
use crate::synth::{self, Device, StateScale};
use crate::time::{forward_flops, step_time, ForwardFlops};
use headroom_alloc::{AllocatorConfig, PolicyName};

pub use crate::deepspeed;

/// What a configuration needs and how fast it runs.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainEstimate {
    /// Bytes by term at the step's allocated peak; `framework` holds what the process keeps
    /// outside PyTorch's allocator and what the allocator reserves beyond its blocks.
    pub breakdown: Breakdown,
    /// What the job takes of the GPU at its peak: reserved memory plus what lives outside
    /// PyTorch (the CUDA context, NCCL, the driver's own).
    pub per_gpu_bytes: f64,
    /// Whether the replay of the job's program ran without running out of memory.
    pub fits: bool,
    /// The stage whose memory is reported.
    pub stage: PipelineStage,
    /// Under torchtitan with pipeline parallelism: every rank planned, and the one that
    /// peaks (whose figures the estimate reports).
    pub pipeline: Option<PipelineRanks>,
    /// Seconds per optimizer step.
    pub step_time_s: f64,
    /// Where the step's time goes: compute, memory-bound, launch, communication.
    pub step_time_breakdown: crate::time::Breakdown,
    /// Tokens per second over the whole job.
    pub tokens_per_s: f64,
    /// Model FLOPs (6N or 4N per token plus attention, no recomputation) per second over the GPUs' dense peak.
    pub mfu: f64,
    /// One layer's forward and backward for one micro-batch, seconds: its kernels,
    /// tensor-parallel all-reduces that are not overlapped, and what checkpointing
    /// recomputes (in the backward), as a per-layer profile shows them.
    pub layer_time_s: [f64; 2],
    /// Forward FLOPs recomputed, as a fraction of one forward pass.
    pub recompute_fraction: f64,
    /// Parameters with gradients (all of them, or the adapters).
    pub trainable_params: u64,
    /// Host memory per node the offloaded states take.
    pub host_bytes: f64,
    /// What PyTorch's `torch.cuda.max_memory_allocated()` would report: the replay's
    /// allocated peak (blocks as the allocator rounds them).
    pub allocated_bytes: f64,
    /// The same less what only a GPU has (cuBLAS workspaces): the tensors a step makes,
    /// what the CPU ground truth measures.
    pub tensor_bytes: f64,
    /// What `torch.cuda.max_memory_reserved()` would report: the replay's reserved peak.
    pub reserved_bytes: f64,
    /// What PyTorch's allocator can have of the GPU: its memory less what lives outside
    /// the allocator.
    pub capacity_bytes: f64,
    /// The phase of the step that peaks.
    pub phase: Option<Phase>,
    /// Each phase's allocated peak in a steady step.
    pub phases: Option<Phases>,
    /// Whose code the estimate models: [`Framework::HuggingFace`], [`Framework::DeepSpeed`],
    /// [`Framework::Megatron`] or [`Framework::Torchtitan`].
    pub framework: Framework,
    /// With `Checkpointing::Optimal`: the schedule's peak did not fit even with every layer recomputed.
    pub note: Option<String>,
    /// Whether the activations are `torch.compile`'s: asked for, and recorded for the job's
    /// family and precision without checkpointing, or torchtitan's compiled blocks.
    pub compiled: bool,
    /// Where the step program came from.
    pub program: ProgramSource,
    /// The allocation that ran out of memory, where the job does not fit.
    pub oom: Option<OutOfMemory>,
    /// AdamW's implementation the program ran.
    pub optimizer_impl: OptimizerImpl,
    /// Device allocations (`cudaMalloc`) the replay made.
    pub device_mallocs: u64,
    /// Requests served only after the allocator freed its cache (`num_alloc_retries`).
    pub alloc_retries: u64,
}

/// Where a job's step program came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProgramSource {
    /// transformers' step recorded tensor by tensor, under this key.
    Recorded(String),
    /// The closed-form terms laid out as a step ([`crate::synth::analytic`]).
    Analytic,
    /// torchtitan's step under FSDP2, built from their code ([`crate::synth::fsdp2`]).
    Fsdp2,
}

/// How the planner turns a job into memory: the allocator the step program is replayed
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

/// Estimates one configuration on one GPU model with PyTorch's allocator at its defaults.
/// The configuration should pass [`TrainConfig::check`]; anything else gets a best-effort
/// answer.
pub fn estimate(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig) -> TrainEstimate {
    Estimator::default().estimate(model, gpu, cfg)
}

/// Whether the configuration fits the GPU ([`Estimator::fits`] at PyTorch's defaults).
pub fn fits(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig) -> bool {
    Estimator::default().fits(model, gpu, cfg)
}

/// The longest sequence that fits (0 if none does), up to `limit` tokens.
pub fn max_seq(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig, limit: u64) -> u64 {
    Estimator::default().max_seq(model, gpu, cfg, limit)
}

/// The largest micro-batch that fits (0 if none does), up to `limit`.
pub fn max_micro_batch(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig, limit: u64) -> u64 {
    Estimator::default().max_micro_batch(model, gpu, cfg, limit)
}

/// A training step as the CPU the templates were recorded on runs it, from its recorded
/// program: the live peak of a steady step's forward, backward and optimizer step, and of the
/// step (tensors only, as the CPU ground truth measures them). `None` where no template
/// serves the job.
pub fn cpu_step(model: &Model, cfg: &TrainConfig) -> Option<([f64; 3], f64)> {
    let hf = synth::hf::program(model, cfg, Device::Cpu, 2, &StateScale::default()).ok()?;
    let sizes = hf.program.sizes(cfg.micro_batch, cfg.seq);
    let (phases, peak) = hf.program.step_peaks(&sizes, 2);
    Some((phases.map(|x| x as f64), peak as f64))
}

/// Bytes the process holds on the GPU outside PyTorch's allocator.
pub fn outside_allocator(gpu: &GpuSpec, cfg: &TrainConfig) -> f64 {
    gpu.arch.driver_reserved_bytes() as f64
        + gpu.arch.training_context_bytes() as f64
        + if cfg.parallel.gpus() > 1 { parallel::NCCL_BYTES } else { 0.0 }
}

impl Estimator {
    /// One configuration: its step program replayed through the allocator on the GPU's
    /// memory, and its step time.
    pub fn estimate(&self, model: &Model, gpu: &GpuSpec, cfg: &TrainConfig) -> TrainEstimate {
        // A calibration corrects the step program ([`Estimator::program`]), not the closed form.
        let cal = None;
        let mut best: Option<(StageMemory, PipelineStage)> = None;
        for &stage in stages(cfg) {
            let m = memory(model, gpu, cfg, stage, cal);
            if best.as_ref().is_none_or(|b| m.breakdown.total() > b.0.breakdown.total()) {
                best = Some((m, stage));
            }
        }
        let (mut m, stage) = best.expect("at least one stage");
        let outside = outside_allocator(gpu, cfg);
        let capacity = (gpu.memory_bytes as f64 - outside).max(0.0);
        let mut memory = self.replayed(model, gpu, cfg, stage, &m, capacity);
        if cfg.checkpointing == Checkpointing::Optimal {
            // The schedule is solved for the tensors; what the allocator's caching takes
            // beyond them is known only by replaying. Hold that back from the schedule's
            // budget and solve again, a few times at most.
            let mut held_back = 0.0;
            for _ in 0..4 {
                let Some(oom) = &memory.replayed.oom else { break };
                let short = (oom.asked as f64 - oom.device_free as f64).max(0.0);
                held_back += short.max(0.02 * capacity);
                let again = crate::live::memory_within(model, gpu, cfg, stage, cal, held_back);
                if again.note.is_some() {
                    break;
                }
                m = again;
                memory = self.replayed(model, gpu, cfg, stage, &m, capacity);
            }
        }
        let par = &cfg.parallel;
        let trainable_params = (share(model, cfg, PipelineStage::Only).trainable * par.tensor as f64).round() as u64;
        let timing = step_time(model, gpu, cfg, m.recompute_fraction);
        let time = timing.step;
        let tokens = cfg.micro_batch as f64 * cfg.seq as f64 * cfg.accumulation as f64 * par.data as f64;
        let ForwardFlops { linear: lin, attention: attn, head } = forward_flops(model, cfg);
        let passes = if matches!(cfg.finetune, Finetune::Lora { .. }) { 2.0 } else { 3.0 };
        let model_flops = passes * (lin + attn + head) * (cfg.accumulation * par.data) as f64;
        let peak = match cfg.precision {
            Precision::Fp32 => gpu.fp32_flops,
            Precision::Fp8 => gpu.fp8_flops.unwrap_or(gpu.bf16_flops),
            _ => gpu.bf16_flops,
        };
        let sh = share(model, cfg, stage);
        let d = par.shard_degree() as f64;
        // The fp32 master, the optimizer's states and fp32 gradients of the GPU's shard; with
        // the parameters offloaded, their 16-bit copy too.
        let offloaded_states =
            (state_bytes_per_param(model.hidden, Precision::Mixed, cfg.optimizer).optimizer + 4.0) * sh.trainable;
        let host_per_gpu = match cfg.offload {
            Offload::None => 0.0,
            Offload::Optimizer => offloaded_states / d,
            Offload::OptimizerAndParams => {
                (offloaded_states + 2.0 * (sh.trainable + sh.frozen_linear + sh.frozen_other)) / d
            }
        };
        // A job that runs out is replayed again on a device without limit: what it would
        // need, term by term, beside where it ran out.
        let mut oom = memory.replayed.oom.clone();
        if oom.is_none() {
            // A snapshot that ran out of memory at this shape or a smaller one, on a device no
            // larger: the job does not fit, whatever the corrected program's replay says.
            if let Some(e) = self.calibration.as_ref().and_then(|c| c.refuses(cfg.micro_batch, cfg.seq, capacity)) {
                oom = Some(OutOfMemory {
                    at: crate::replay::When { step: 0, phase: e.phase, op: 0 },
                    requested: e.asked,
                    asked: e.asked,
                    device_free: e.device_free.unwrap_or(0),
                    allocated: e.allocated,
                    reserved: e.reserved,
                    term: Term::Activations,
                    site: format!("the calibration snapshot's own OOM at micro-batch {} × {} tokens", e.batch, e.seq),
                });
            }
        }
        if memory.replayed.oom.is_some() {
            memory = self.replayed(model, gpu, cfg, stage, &m, UNBOUNDED);
        }
        let r = &memory.replayed;
        let by = |t: Term| r.at_peak.get(t) as f64;
        let breakdown = Breakdown {
            weights: by(Term::Weights),
            gradients: by(Term::Gradients),
            optimizer: by(Term::Optimizer),
            activations: by(Term::Activations) + by(Term::Inputs),
            logits: by(Term::Logits),
            temporary: by(Term::Temporary) + by(Term::Workspace),
            framework: outside + r.cached() as f64,
            calibration: 0.0,
        };
        let phase_total = |k: usize| crate::step::PhasePeak { total: r.phase_peaks[k] as f64, ..Default::default() };
        let phases = Phases { forward: phase_total(0), backward: phase_total(1), optimizer: phase_total(2) };
        let (breakdown, allocated, tensors, reserved) = (
            breakdown,
            r.peak_allocated as f64,
            (r.peak_allocated - r.at_peak.get(Term::Workspace)) as f64,
            r.peak_reserved as f64,
        );
        let pipeline = memory.ranks.clone();
        // The stage class of the rank that peaks: its first stage, its last, or neither.
        let stage = match &pipeline {
            Some(pr) => {
                let held = &pr.ranks[pr.peak as usize].stages;
                let last = pr.ranks.iter().flat_map(|r| r.stages.iter()).copied().max().unwrap_or(0);
                if held.contains(&0) {
                    PipelineStage::First
                } else if held.contains(&last) {
                    PipelineStage::Last
                } else {
                    PipelineStage::Middle
                }
            }
            None => stage,
        };
        TrainEstimate {
            breakdown,
            per_gpu_bytes: reserved + outside,
            fits: oom.is_none() && m.note.is_none(),
            stage,
            pipeline,
            step_time_s: time,
            step_time_breakdown: timing.breakdown,
            layer_time_s: [timing.layer_forward, timing.layer_backward],
            tokens_per_s: tokens / time,
            mfu: model_flops / (time * par.gpus() as f64 * peak),
            recompute_fraction: m.recompute_fraction,
            trainable_params,
            host_bytes: host_per_gpu * par.gpus().min(parallel::GPUS_PER_NODE) as f64,
            allocated_bytes: allocated,
            tensor_bytes: tensors,
            reserved_bytes: reserved,
            capacity_bytes: capacity,
            phase: Some(r.peak_at.phase).filter(|p| *p != Phase::Setup),
            phases: Some(phases),
            framework: match (&memory.source, m.phases.is_some(), cfg.framework) {
                _ if cfg.deepspeed() => Framework::DeepSpeed,
                (ProgramSource::Recorded(_), _, _) | (_, true, _) => Framework::HuggingFace,
                (_, false, Framework::Torchtitan) => Framework::Torchtitan,
                (_, false, _) => Framework::Megatron,
            },
            note: m.note.clone(),
            // torchtitan's program models its compiled blocks and loss itself.
            compiled: crate::live::compiled_recipe(model, cfg)
                || (cfg.compile && matches!(memory.source, ProgramSource::Fsdp2)),
            program: memory.source.clone(),
            oom,
            optimizer_impl: crate::synth::optimizer::implementation(cfg, Device::Gpu(gpu)),
            device_mallocs: r.device_mallocs,
            alloc_retries: r.alloc_retries,
        }
    }

    /// The job's step program for `stage`, and where it came from.
    pub fn program(
        &self,
        model: &Model,
        gpu: &GpuSpec,
        cfg: &TrainConfig,
        stage: PipelineStage,
        m: &StageMemory,
    ) -> (Program, ProgramSource) {
        let (program, source) = self.synthesized_rank(model, gpu, cfg, stage, m, 0);
        match &self.calibration {
            // The user's run corrects the program: its memory comes from replaying that.
            Some(c) => (c.apply_program(&program), source),
            None => (program, source),
        }
    }

    /// Whether torchtitan's pipelined FSDP2 program plans the job, one program per rank.
    fn pipelined_fsdp2(&self, model: &Model, cfg: &TrainConfig) -> bool {
        self.calibration.is_none() && cfg.parallel.pipeline > 1 && synth::fsdp2::runs(model, cfg)
    }

    fn synthesized_rank(
        &self,
        model: &Model,
        gpu: &GpuSpec,
        cfg: &TrainConfig,
        stage: PipelineStage,
        m: &StageMemory,
        rank: u64,
    ) -> (Program, ProgramSource) {
        let workspace = gpu.arch.cublas_workspace_bytes() as f64;
        if self.pipelined_fsdp2(model, cfg) {
            if let Ok(program) =
                synth::fsdp2::pipeline::program(model, cfg, Device::Gpu(gpu), workspace, self.steps, rank)
            {
                return (program, ProgramSource::Fsdp2);
            }
        }
        if self.recorded_program_runs(cfg, stage) {
            if let Ok(hf) = synth::hf::program(model, cfg, Device::Gpu(gpu), self.steps, &StateScale::default()) {
                return (hf.program, ProgramSource::Recorded(hf.key));
            }
        }
        if self.calibration.is_none() && cfg.parallel.pipeline <= 1 && synth::fsdp2::runs(model, cfg) {
            let program = synth::fsdp2::program(model, cfg, Device::Gpu(gpu), workspace, self.steps);
            return (program, ProgramSource::Fsdp2);
        }
        let layers = model.layers.div_ceil(cfg.parallel.pipeline.max(1));
        (synth::analytic::program(cfg, m, workspace, layers, self.steps), ProgramSource::Analytic)
    }

    /// The step program of the stage (under torchtitan's pipelining, the rank) that peaks, as
    /// [`Estimator::estimate`] replays it.
    pub fn step_program(&self, model: &Model, gpu: &GpuSpec, cfg: &TrainConfig) -> Program {
        let cal = None;
        let (m, stage) = stages(cfg)
            .iter()
            .map(|&stage| (memory(model, gpu, cfg, stage, cal), stage))
            .max_by(|a, b| a.0.breakdown.total().total_cmp(&b.0.breakdown.total()))
            .expect("at least one stage");
        if self.pipelined_fsdp2(model, cfg) {
            // Every pipeline rank runs its own program: the one whose replay reserves the most.
            let settings = ReplaySettings { capacity: u64::MAX, config: self.alloc.clone(), policy: self.policy };
            let peak = (0..cfg.parallel.pipeline)
                .map(|rank| self.synthesized_rank(model, gpu, cfg, PipelineStage::First, &m, rank).0)
                .max_by_key(|p| replay(p, &p.sizes(cfg.micro_batch, cfg.seq), &settings).peak_reserved);
            if let Some(program) = peak {
                return program;
            }
        }
        self.program(model, gpu, cfg, stage, &m).0
    }

    /// Whether transformers' recorded step is the job's program: one whole replica per GPU
    /// running transformers' code eagerly, no or full checkpointing.
    fn recorded_program_runs(&self, cfg: &TrainConfig, stage: PipelineStage) -> bool {
        let par = &cfg.parallel;
        stage == PipelineStage::Only
            && matches!(cfg.framework, Framework::Auto | Framework::HuggingFace)
            && !cfg.deepspeed()
            && cfg.finetune == Finetune::Full
            && !cfg.compile
            && par.gpus() == 1
            && cfg.offload == Offload::None
            && matches!(cfg.checkpointing, Checkpointing::None | Checkpointing::Full)
    }

    fn replayed(
        &self,
        model: &Model,
        gpu: &GpuSpec,
        cfg: &TrainConfig,
        stage: PipelineStage,
        m: &StageMemory,
        capacity: f64,
    ) -> Memory {
        let settings = ReplaySettings { capacity: capacity as u64, config: self.alloc.clone(), policy: self.policy };
        if self.pipelined_fsdp2(model, cfg) {
            if let Some(memory) = self.replayed_ranks(model, gpu, cfg, m, &settings) {
                return memory;
            }
        }
        let (program, source) = self.program(model, gpu, cfg, stage, m);
        let sizes = program.sizes(cfg.micro_batch, cfg.seq);
        Memory { replayed: replay(&program, &sizes, &settings), source, ranks: None }
    }

    /// Every pipeline rank's program replayed; the one whose reserved peak is highest
    /// answers for the job (torchtitan's benchmarks report the maximum over the GPUs).
    fn replayed_ranks(
        &self,
        model: &Model,
        gpu: &GpuSpec,
        cfg: &TrainConfig,
        m: &StageMemory,
        settings: &ReplaySettings,
    ) -> Option<Memory> {
        let par = &cfg.parallel;
        let schedule = par.pipeline_schedule();
        let v = if schedule.looped() { par.virtual_stages.max(1) } else { 1 };
        let (stages_of, splits) = synth::fsdp2::pipeline::layout(cfg, model).ok()?;
        let mut best: Option<(Replayed, u64)> = None;
        let mut ranks = Vec::new();
        for rank in 0..par.pipeline {
            let (program, _) = self.synthesized_rank(model, gpu, cfg, PipelineStage::First, m, rank);
            let sizes = program.sizes(cfg.micro_batch, cfg.seq);
            let r = replay(&program, &sizes, settings);
            let actions =
                crate::pipelining::rank_actions(schedule, par.pipeline, v, cfg.accumulation.max(1), rank).ok()?;
            let stages = stages_of[rank as usize].clone();
            ranks.push(RankPeak {
                rank,
                layers: stages.iter().map(|&i| splits[i as usize].layers).sum(),
                stages,
                in_flight: crate::pipelining::peak_in_flight(&actions),
                reserved_bytes: r.peak_reserved as f64,
                allocated_bytes: r.peak_allocated as f64,
            });
            if best.as_ref().is_none_or(|(b, _)| r.peak_reserved > b.peak_reserved) {
                best = Some((r, rank));
            }
        }
        let (replayed, peak) = best?;
        Some(Memory { replayed, source: ProgramSource::Fsdp2, ranks: Some(PipelineRanks { schedule, peak, ranks }) })
    }

    /// The closed-form pass alone (no replay): the configuration's tensors at their peak
    /// and its step time, or `None` where its tensors alone exceed what PyTorch can have of
    /// the GPU (reserved memory is never less than allocated). Searches rank by it and
    /// replay only the configurations they report.
    pub fn screen(&self, model: &Model, gpu: &GpuSpec, cfg: &TrainConfig) -> Option<Screened> {
        let capacity = (gpu.memory_bytes as f64 - outside_allocator(gpu, cfg)).max(0.0);
        let mut tensors = 0.0f64;
        let mut recompute = 0.0f64;
        for &stage in stages(cfg) {
            let m = memory(model, gpu, cfg, stage, None);
            let t = m.breakdown.total() - m.outside_allocator;
            if m.note.is_some() || t > capacity {
                return None;
            }
            if t >= tensors {
                tensors = t;
                recompute = m.recompute_fraction;
            }
        }
        Some(Screened { tensors, step_time_s: step_time(model, gpu, cfg, recompute).step })
    }

    /// Whether the configuration fits the GPU: the memory half of [`Estimator::estimate`],
    /// for searches. The closed form's tensors alone past the GPU's memory never fit;
    /// everything else is replayed.
    pub fn fits(&self, model: &Model, gpu: &GpuSpec, cfg: &TrainConfig) -> bool {
        if cfg.checkpointing == Checkpointing::Optimal {
            // The schedule is solved again until the replay fits: the estimate's own answer.
            return self.estimate(model, gpu, cfg).fits;
        }
        let outside = outside_allocator(gpu, cfg);
        let capacity = (gpu.memory_bytes as f64 - outside).max(0.0);
        if let Some(c) = &self.calibration {
            // The corrected program alone decides; the closed form knows nothing of the run.
            return c.refuses(cfg.micro_batch, cfg.seq, capacity).is_none()
                && stages(cfg).iter().all(|&stage| {
                    let m = memory(model, gpu, cfg, stage, None);
                    m.note.is_none() && self.replayed(model, gpu, cfg, stage, &m, capacity).replayed.oom.is_none()
                });
        }
        stages(cfg).iter().all(|&stage| {
            let m = memory(model, gpu, cfg, stage, None);
            let tensors = m.breakdown.total() - m.outside_allocator;
            m.note.is_none()
                && tensors <= capacity
                && self.replayed(model, gpu, cfg, stage, &m, capacity).replayed.oom.is_none()
        })
    }

    /// The longest sequence that fits (0 if none does), up to `limit` tokens.
    pub fn max_seq(&self, model: &Model, gpu: &GpuSpec, cfg: &TrainConfig, limit: u64) -> u64 {
        largest(limit, |seq| self.fits(model, gpu, &TrainConfig { seq, ..*cfg }))
    }

    /// The largest micro-batch that fits (0 if none does), up to `limit`.
    pub fn max_micro_batch(&self, model: &Model, gpu: &GpuSpec, cfg: &TrainConfig, limit: u64) -> u64 {
        largest(limit, |b| self.fits(model, gpu, &TrainConfig { micro_batch: b, ..*cfg }))
    }
}

/// A device larger than any job: 1 PiB.
const UNBOUNDED: f64 = (1u64 << 50) as f64;

/// What [`Estimator::screen`] finds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Screened {
    /// The closed form's tensors at the peak, bytes.
    pub tensors: f64,
    pub step_time_s: f64,
}

/// A replay and its program's source.
struct Memory {
    replayed: Replayed,
    source: ProgramSource,
    /// Under torchtitan's pipelined program: every rank's peak, `replayed` the highest.
    ranks: Option<PipelineRanks>,
}

/// One pipeline rank of torchtitan's pipelined FSDP2 program, replayed.
#[derive(Clone, Debug, PartialEq)]
pub struct RankPeak {
    /// The rank in the pipeline group.
    pub rank: u64,
    /// The global stage indices it holds (one, `rank + k·pp` looped, `rank` and
    /// `2·pp-1-rank` in a V).
    pub stages: Vec<u64>,
    /// Transformer blocks on it.
    pub layers: u64,
    /// The most micro-batch chunks its schedule holds at once.
    pub in_flight: u64,
    /// Its replay's reserved and allocated peaks, bytes.
    pub reserved_bytes: f64,
    pub allocated_bytes: f64,
}

/// Every pipeline rank's plan and the one that peaks.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineRanks {
    pub schedule: crate::pipelining::PipelineSchedule,
    /// The rank with the highest reserved peak (the first such).
    pub peak: u64,
    pub ranks: Vec<RankPeak>,
}

/// The pipeline stages whose memory is estimated: the one GPU's, or the first and last stage's.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::gpu;
    use crate::live::{layer_activations, memory, LayerActivations, GIB};
    use crate::model::preset;
    use crate::parallel::Parallelism;

    /// ZeRO's Table 1: per-device model states in GB (1e9 bytes), mixed-precision Adam (K = 12).
    #[test]
    fn zero_table_1_exactly() {
        type Column = (u64, [f64; 3]);
        let rows: [(u64, [Column; 4]); 3] = [
            (
                7_500_000_000,
                [
                    (16, [35.6, 21.6, 7.5]),
                    (64, [31.4, 16.6, 1.88]),
                    (256, [30.4, 15.4, 0.47]),
                    (1024, [30.1, 15.1, 0.12]),
                ],
            ),
            (
                128_000_000_000,
                [
                    (16, [608.0, 368.0, 128.0]),
                    (64, [536.0, 284.0, 32.0]),
                    (256, [518.0, 263.0, 8.0]),
                    (1024, [513.0, 257.0, 2.0]),
                ],
            ),
            (
                1_000_000_000_000,
                [
                    (16, [4750.0, 2875.0, 1000.0]),
                    (64, [4187.0, 2218.0, 250.0]),
                    (256, [4046.0, 2054.0, 62.5]),
                    (1024, [4011.0, 2013.0, 15.6]),
                ],
            ),
        ];
        for (params, cols) in rows {
            for (dp, want) in cols {
                for (stage, paper) in [1u8, 2, 3].into_iter().zip(want) {
                    let cfg = TrainConfig { parallel: Parallelism::data_parallel(dp, stage), ..base() };
                    let ModelStates { weights: w, gradients: g, optimizer: o } = model_states(params, 4096, &cfg);
                    let states = (w + g + o) / 1e9;
                    // The paper rounds to 3 significant figures (1 decimal for the small ones).
                    let tol = (paper * 0.006).max(0.006);
                    assert!(
                        (states - paper).abs() <= tol,
                        "{params} params, DP {dp}, stage {stage}: {states} vs {paper}"
                    );
                }
            }
        }
    }

    fn base() -> TrainConfig {
        TrainConfig {
            seq: 2048,
            attention: Attention::Eager,
            ..TrainConfig::new(1, 2048, Precision::Mixed, Optimizer::AdamW)
        }
    }

    fn gpt(name: &str, h: u64, l: u64, a: u64) -> Model {
        Model::gpt(name, h, l, a, 51200, 2048)
    }

    /// Korthikanti et al.: GPT-3 175B (a = 96, s = 2048, h = 12288, b = 1): sbh(34 + 5as/h) = 2.87 GB a layer, unparallelised.
    #[test]
    fn korthikanti_per_layer_figures() {
        let gpt3 = gpt("gpt3", 12288, 96, 96);
        let LayerActivations { kept: eager, core, .. } = layer_activations(&gpt3, &base());
        assert!((eager / 1e9 - 2.87).abs() < 0.01, "{eager}");
        // Selective recomputation leaves 34·sbh = 0.86 GB.
        assert!(((eager - core) / 1e9 - 0.856).abs() < 0.01);
        let flash = layer_activations(&gpt3, &TrainConfig { attention: Attention::Flash, ..base() }).kept;
        assert!(flash < eager / 3.0);
        // Table 2 under 8-way tensor parallelism: sequence parallel (34 + 5as/h)·sbh/t = 0.359 GB;
        // with selective recomputation 34·sbh/t = 0.107 GB; full recomputation keeps 2sbh = 0.050 GB.
        let tp = |sp: bool| TrainConfig {
            parallel: Parallelism { tensor: 8, sequence_parallel: sp, ..Parallelism::default() },
            ..base()
        };
        let LayerActivations { kept: with_sp, core: core_sp, .. } = layer_activations(&gpt3, &tp(true));
        assert!((with_sp / 1e9 - 0.359).abs() < 0.002, "{with_sp}");
        assert!(((with_sp - core_sp) / 1e9 - 0.107).abs() < 0.001);
        let input = layer_activations(&gpt3, &tp(false)).input;
        assert!((input / 1e9 - 0.050).abs() < 0.001);
        // Without sequence parallelism, 22B at b = 4: sbh(10 + 24/t + 5as/(ht)) = 1.33 GB.
        let m22 = gpt("22b", 6144, 48, 64);
        let tp_only = layer_activations(&m22, &TrainConfig { micro_batch: 4, ..tp(false) }).kept;
        assert!((tp_only / 1e9 - 1.33).abs() < 0.01, "{tp_only}");
        let unsplit = layer_activations(&m22, &TrainConfig { micro_batch: 4, ..base() }).kept;
        assert!((unsplit / 1e9 - 7.08).abs() < 0.01, "{unsplit}");
    }

    /// Korthikanti §4.2.3: the first 1F1B stage holds p micro-batches of L/p layers — L layers' worth, whatever p —
    /// and the interleaved schedule (1 + (p−1)/(p·v)) times that; fewer micro-batches than stages hold fewer.
    #[test]
    fn pipeline_first_stage_holds_a_whole_model_of_activations() {
        let m = gpt("175b", 12288, 96, 96);
        let g = GpuSpec { memory_bytes: 1 << 50, ..crate::gpu::gpu("a100-80gb").unwrap() };
        let at = |p: u64, v: u64, m_: u64| {
            let cfg = TrainConfig {
                accumulation: m_,
                parallel: Parallelism { tensor: 8, pipeline: p, virtual_stages: v, ..Parallelism::default() },
                ..base()
            };
            memory(&m, &g, &cfg, if p > 1 { PipelineStage::First } else { PipelineStage::Only }, None)
                .breakdown
                .activations
        };
        let one = at(1, 1, 64);
        assert!((at(8, 1, 64) / one - 1.0).abs() < 1e-9);
        assert!((at(8, 3, 64) / one - (1.0 + 7.0 / 24.0)).abs() < 1e-9);
        assert!((at(8, 1, 2) / one - 0.25).abs() < 1e-9);
        // The last stage holds the logits and one micro-batch.
        let cfg = TrainConfig {
            accumulation: 64,
            parallel: Parallelism { tensor: 8, pipeline: 8, ..Parallelism::default() },
            ..base()
        };
        let last = memory(&m, &g, &cfg, PipelineStage::Last, None).breakdown;
        assert!(last.logits > 0.0 && (last.activations / one - 1.0 / 8.0).abs() < 1e-9);
        assert_eq!(memory(&m, &g, &cfg, PipelineStage::First, None).breakdown.logits, 0.0);
        // Weights: a stage holds its layers and its embedding, ÷ t.
        let e = estimate(&m, &g, &cfg);
        let per_stage = (12.0 * 12288f64.powi(2) * 12.0 + 51200.0 * 12288.0) / 8.0;
        assert!((e.breakdown.weights / (2.0 * per_stage) - 1.0).abs() < 0.01);
    }

    #[test]
    fn fits_is_the_memory_half_of_estimate() {
        let m = crate::model::preset("llama-2-70b").unwrap();
        let g = crate::gpu::gpu("a100-80gb").unwrap();
        let mut seen = [0, 0];
        for (t, p, zero, b, ckpt) in [
            (1, 1, 3, 1, Checkpointing::Full),
            (8, 1, 1, 1, Checkpointing::None),
            (8, 4, 1, 1, Checkpointing::Selective),
            (4, 8, 0, 2, Checkpointing::Full),
            (2, 2, 3, 4, Checkpointing::EveryK(4)),
            (8, 8, 1, 8, Checkpointing::None),
        ] {
            let cfg = TrainConfig {
                accumulation: 16,
                checkpointing: ckpt,
                parallel: Parallelism { data: 4, tensor: t, pipeline: p, zero_stage: zero, ..Parallelism::default() },
                ..TrainConfig::new(b, 4096, Precision::Mixed, Optimizer::AdamW)
            };
            let e = estimate(&m, &g, &cfg);
            assert_eq!(fits(&m, &g, &cfg), e.fits, "{cfg:?}");
            seen[e.fits as usize] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0, "both outcomes covered: {seen:?}");
    }

    #[test]
    fn bubbles_and_collectives_cost_time() {
        let m = crate::model::preset("llama-2-70b").unwrap();
        let g = crate::gpu::gpu("h100-sxm").unwrap();
        let cfg = |p: u64, v: u64, acc: u64| TrainConfig {
            accumulation: acc,
            attention: Attention::Flash,
            parallel: Parallelism { tensor: 8, pipeline: p, virtual_stages: v, ..Parallelism::default() },
            ..TrainConfig::new(1, 4096, Precision::Mixed, Optimizer::AdamW)
        };
        let t = |c: TrainConfig| estimate(&m, &g, &c).step_time_s;
        // 1F1B: (m + p − 1) slots of 1/p of the work; interleaving shrinks the bubble to (p−1)/v.
        let (p4, p4v2) = (t(cfg(4, 1, 8)), t(cfg(4, 2, 8)));
        assert!(p4v2 < p4);
        // Each micro-batch more is one slot more; what is left of 11 slots is the optimizer step.
        let per_slot = (t(cfg(4, 1, 16)) - p4) / 8.0;
        assert!((t(cfg(4, 1, 24)) - t(cfg(4, 1, 16)) - 8.0 * per_slot).abs() / p4 < 1e-9);
        let optimizer = p4 - 11.0 * per_slot;
        assert!(optimizer > 0.0 && optimizer < 0.05 * p4, "{optimizer} of {p4}");
        // Tensor parallelism across nodes is slower than inside one.
        let inside = estimate(&m, &g, &cfg(1, 1, 1));
        assert!(inside.mfu < 0.5 && inside.mfu > 0.3, "{}", inside.mfu);
    }

    #[test]
    fn zero_shards_over_the_data_and_context_gpus() {
        // torchtitan's Table 2 layouts: 8 GPUs as FSDP 8 × CP 1 down to FSDP 1 × CP 8, each
        // at a sequence that grows with CP, so every GPU holds the same tokens.
        let m = crate::model::preset("llama-3.1-8b").unwrap();
        let g = crate::gpu::gpu("h100-sxm").unwrap();
        let cfg = |cp: u64| TrainConfig {
            attention: Attention::Flash,
            checkpointing: Checkpointing::Full,
            parallel: Parallelism { data: 8 / cp, context: cp, zero_stage: 3, ..Parallelism::default() },
            ..TrainConfig::new(1, 32768 * cp, Precision::Mixed, Optimizer::AdamW)
        };
        let psi = m.params();
        let states = |c: &TrainConfig| {
            let s = model_states(psi, m.hidden, c);
            s.weights + s.gradients + s.optimizer
        };
        assert!((states(&cfg(1)) - 16.0 * psi as f64 / 8.0).abs() < 1.0, "16 bytes a parameter over 8 GPUs");
        // With context parallelism the step is Megatron's (transformers cannot split a sequence).
        let two = estimate(&m, &g, &cfg(2));
        for cp in [2, 4, 8] {
            assert!((states(&cfg(cp)) - states(&cfg(1))).abs() < 1.0, "CP {cp}: the states stay sharded 8 ways");
            // The same tokens on every GPU, the same states: the same memory.
            let e = estimate(&m, &g, &cfg(cp));
            assert!((e.per_gpu_bytes - two.per_gpu_bytes).abs() / two.per_gpu_bytes < 0.01, "CP {cp}");
        }
    }

    #[test]
    fn per_op_checkpointing_keeps_what_torchtitan_saves() {
        let m = crate::model::preset("llama-3.1-8b").unwrap();
        let g = crate::gpu::gpu("h100-sxm").unwrap();
        let with = |checkpointing| {
            let cfg = TrainConfig {
                attention: Attention::Flash,
                checkpointing,
                parallel: Parallelism::data_parallel(8, 3),
                // Megatron's accounting for all three (transformers has no per-op policy).
                framework: Framework::Megatron,
                ..TrainConfig::new(2, 8192, Precision::Mixed, Optimizer::AdamW)
            };
            estimate(&m, &g, &cfg)
        };
        let (full, per_op, selective) =
            (with(Checkpointing::Full), with(Checkpointing::PerOp), with(Checkpointing::Selective));
        // A Llama block, by hand: the input (h), wq (h), wv (kv), w1 (f), w2 (h) and the
        // attention output (h) in bf16, and flash attention's fp32 log-sum-exp per head.
        let tokens = 2.0 * 8192.0;
        let (h, kv, f) = (4096.0, 1024.0, 14336.0);
        let kept = tokens * ((h + h + kv + f + h + h) * 2.0 + 4.0 * 32.0);
        let input = tokens * h * 2.0;
        // Both keep one layer's full set beside the rest while it is recomputed.
        let per_layer = full.breakdown.activations - 32.0 * input;
        assert!((per_op.breakdown.activations - per_layer - 32.0 * kept).abs() < 1.0);
        assert!(full.breakdown.activations < per_op.breakdown.activations);
        assert!(per_op.breakdown.activations < selective.breakdown.activations);
        // It recomputes wk, wo and w3: between selective (nothing, with flash) and full.
        assert!(selective.recompute_fraction < per_op.recompute_fraction);
        assert!(per_op.recompute_fraction < full.recompute_fraction);
    }

    #[test]
    fn fsdp_under_pipelining_keeps_the_stage_gathered() {
        let m = crate::model::preset("llama-3-70b").unwrap();
        let g = crate::gpu::gpu("h100-sxm").unwrap();
        let with = |zero_stage| {
            let cfg = TrainConfig {
                accumulation: 8,
                attention: Attention::Flash,
                checkpointing: Checkpointing::Full,
                parallel: Parallelism { data: 4, pipeline: 4, zero_stage, ..Parallelism::default() },
                ..TrainConfig::new(1, 4096, Precision::Mixed, Optimizer::AdamW)
            };
            memory(&m, &g, &cfg, PipelineStage::First, None).breakdown.temporary
        };
        // A quarter of the model, gathered in bf16, beside the shard ZeRO-3 keeps.
        let gathered = with(3) - with(1);
        let quarter = 2.0 * m.params() as f64 / 4.0;
        assert!(gathered > 0.9 * quarter && gathered < 1.2 * quarter, "{gathered} vs {quarter}");
    }

    #[test]
    fn torchtitans_loss_holds_twelve_bytes_a_logit() {
        let m = crate::model::preset("llama-3.1-8b").unwrap();
        let g = crate::gpu::gpu("h100-sxm").unwrap();
        let logits = |framework| {
            let cfg = TrainConfig {
                framework,
                attention: Attention::Flash,
                checkpointing: Checkpointing::PerOp,
                parallel: Parallelism::data_parallel(8, 3),
                ..TrainConfig::new(2, 8192, Precision::Mixed, Optimizer::AdamW)
            };
            let e = estimate(&m, &g, &cfg);
            assert_eq!(e.framework, framework);
            e.breakdown.logits
        };
        let per_token = 2.0 * 8192.0 * m.vocab as f64;
        assert_eq!(logits(Framework::Torchtitan), 12.0 * per_token);
        assert_eq!(logits(Framework::Megatron), 16.0 * per_token);
    }

    #[test]
    fn lora_keeps_a_frozen_base_and_trains_adapters() {
        let m = crate::model::preset("llama-2-7b").unwrap();
        let g = crate::gpu::gpu("a100-80gb").unwrap();
        let lora = |base| TrainConfig {
            finetune: Finetune::Lora { rank: 64, targets: LoraTargets::All, base },
            attention: Attention::Flash,
            ..TrainConfig::new(1, 512, Precision::Mixed, Optimizer::AdamW)
        };
        let e = estimate(&m, &g, &lora(BaseWeights::Native));
        // The closed form's terms: what placement gives; the replay's peak holds the same
        // tensors in allocator blocks.
        let closed = |c: &TrainConfig| memory(&m, &g, c, PipelineStage::Only, None).breakdown;
        let cf = closed(&lora(BaseWeights::Native));
        // r = 64 on every linear layer: 64 × (4·(4096+4096) + 3·(4096+11008)) × 32 layers.
        assert_eq!(e.trainable_params, 64 * (4 * 8192 + 3 * 15104) * 32);
        let base16 = 2.0 * m.params() as f64;
        assert!((cf.weights - base16 - 2.0 * e.trainable_params as f64).abs() < 1e3);
        assert_eq!(cf.gradients, 2.0 * e.trainable_params as f64);
        assert!((e.breakdown.weights / cf.weights - 1.0).abs() < 1e-3, "{} vs {}", e.breakdown.weights, cf.weights);
        // QLoRA: linears as bitsandbytes stores NF4 with double quantization (4.127 bits a
        // weight, QLoRA §3), fp32 embeddings and norms.
        let q = closed(&lora(BaseWeights::Nf4));
        let linears = 32.0 * (4.0 * 4096.0 * 4096.0 + 3.0 * 4096.0 * 11008.0);
        let nf4 = crate::placement::base_format(&lora(BaseWeights::Nf4)).unwrap();
        let stored: f64 = m.block_linears().iter().map(|&(k, n)| nf4.stored_bytes(k, n)).sum::<f64>() * 32.0;
        let want = stored + (m.params() as f64 - linears) * 4.0 + 2.0 * e.trainable_params as f64;
        assert!((q.weights / want - 1.0).abs() < 1e-9);
        assert!((stored * 8.0 / linears - 4.127).abs() < 1e-3, "{} bits", stored * 8.0 / linears);
        // No weight gradients for the base: 4N instead of 6N per token.
        let full = estimate(&m, &g, &TrainConfig { finetune: Finetune::Full, ..lora(BaseWeights::Native) });
        assert!(e.step_time_s < full.step_time_s * 0.75);
    }

    /// DeepSpeed's memory estimator (research/estimation.md §1.4), t5-3b on one node of 8 GPUs, GiB:
    /// ZeRO-2 with optimizer offload 2Ψ = 5.31; ZeRO-3 with optimizer offload 2Ψ/8 + the gathered layer;
    /// with the parameters offloaded too, none but the few DeepSpeed never partitions.
    #[test]
    fn offload_moves_the_optimizer_to_the_host() {
        let m = crate::model::preset("t5-3b").unwrap();
        let g = crate::gpu::gpu("a100-80gb").unwrap();
        let cfg = |zero, offload| TrainConfig {
            parallel: Parallelism::data_parallel(8, zero),
            offload,
            ..TrainConfig::new(1, 512, Precision::Mixed, Optimizer::AdamW)
        };
        // The closed form's terms (what the replay's program is laid out from).
        let states = |c: &TrainConfig| {
            let b = memory(&m, &g, c, PipelineStage::Only, None).breakdown;
            (b.weights + b.gradients + b.optimizer) / GIB
        };
        let z2 = estimate(&m, &g, &cfg(2, Offload::Optimizer));
        assert!((states(&cfg(2, Offload::Optimizer)) - 5.31).abs() < 0.01);
        assert!((states(&cfg(3, Offload::Optimizer)) - 5.31 / 8.0).abs() < 0.01);
        let all = states(&cfg(3, Offload::OptimizerAndParams));
        // Only what DeepSpeed never partitions stays: the norms and position tables, whole.
        let kept = deepspeed::buffers(&m, &cfg(3, Offload::OptimizerAndParams), 2.0).persistent;
        assert!(kept > 0.0 && kept < (1 << 20) as f64, "{kept}");
        assert!((all * GIB / kept - 1.0).abs() < 1e-9);
        // The host holds the fp32 master, both moments and fp32 gradients: 16 bytes a parameter per node.
        assert!((z2.host_bytes / (16.0 * m.params() as f64) - 1.0).abs() < 1e-9);
        assert!(z2.step_time_s > estimate(&m, &g, &cfg(2, Offload::None)).step_time_s);
    }

    #[test]
    fn fp8_saves_linear_inputs_in_one_byte_and_runs_faster() {
        let m = crate::model::preset("llama-3-8b").unwrap();
        let g = crate::gpu::gpu("h100-sxm").unwrap();
        let cfg = |p| TrainConfig { attention: Attention::Flash, ..TrainConfig::new(2, 4096, p, Optimizer::AdamW) };
        let bf16 = estimate(&m, &g, &cfg(Precision::Mixed));
        let fp8 = estimate(&m, &g, &cfg(Precision::Fp8));
        assert!(fp8.breakdown.activations < bf16.breakdown.activations);
        assert!(fp8.breakdown.weights > bf16.breakdown.weights);
        assert!(fp8.step_time_s < 0.7 * bf16.step_time_s);
        let a100 = crate::gpu::gpu("a100-80gb").unwrap();
        assert!(cfg(Precision::Fp8).check(&m, &a100).unwrap_err().0.contains("fp8"));
    }

    #[test]
    fn policies_trade_memory_for_time_and_optimal_fits_between() {
        let m = preset("llama-2-7b").unwrap();
        let g = gpu("a100-80gb").unwrap();
        let cfg = |c| TrainConfig {
            micro_batch: 8,
            seq: 4096,
            precision: Precision::Bf16,
            attention: Attention::Flash,
            checkpointing: c,
            ..base()
        };
        let none = estimate(&m, &g, &cfg(Checkpointing::None));
        let full = estimate(&m, &g, &cfg(Checkpointing::Full));
        let optimal = estimate(&m, &g, &cfg(Checkpointing::Optimal));
        assert!(
            !none.fits && full.fits && optimal.fits,
            "{} {} {} {:?} {:?} {:?}",
            none.fits,
            full.fits,
            optimal.fits,
            full.oom,
            optimal.oom,
            optimal.note
        );
        assert!(full.breakdown.activations < none.breakdown.activations);
        assert!(optimal.step_time_s <= full.step_time_s && optimal.step_time_s >= none.step_time_s);
        assert!(optimal.per_gpu_bytes <= g.memory_bytes as f64);
        let most = max_micro_batch(&m, &g, &cfg(Checkpointing::Full), 1024);
        assert!(
            most >= 8 && !estimate(&m, &g, &TrainConfig { micro_batch: most + 1, ..cfg(Checkpointing::Full) }).fits
        );
    }
}
