//! Program builders: who runs a job, as a table.
//!
//! Each builder makes the step programs of the jobs one framework's code runs, from what that
//! code allocates, and says of every other job why it does not serve it — as vLLM v1 maps each
//! KV-cache spec to the manager made for it. [`runner`] asks them in the table's order; the
//! first that serves runs the job, and the reasons the ones before it gave travel with the
//! estimate. A job whose framework was named explicitly and that no builder of that framework
//! serves is refused with every reason: it never becomes another framework's job.
//!
//! | builder | framework | serves | the program |
//! |---|---|---|---|
//! | `recording` | the user's own | a job that brings its recorded step (`--program`) | [`recorded`]: the recording, replayed as recorded |
//! | `transformers` | transformers | one GPU, full fine-tuning, no or full checkpointing, eager, a recorded family, precision, attention and checkpointing (`data/programs/`: Llama, Qwen2, Qwen3, GPT-2, Mistral, Phi-3, Gemma, Gemma-2, GPT-NeoX, BLOOM, Mixtral, Qwen3-MoE, BERT, T5, Qwen2-MoE, Gemma 3; which combinations, docs/VALIDATION.md) | [`hf`]: transformers' step recorded tensor by tensor, expanded to the model |
//! | `torchtitan-pipeline` | torchtitan | FSDP2 over pipeline stages, a dense Llama-style decoder | [`fsdp2::pipeline`]: every pipeline rank by its schedule |
//! | `torchtitan` | torchtitan | FSDP2 without pipelining, a dense Llama-style decoder | [`fsdp2`]: one rank, stream by stream |
//! | `transformers-phases` | transformers | one replica per GPU (data parallel, ZeRO), full fine-tuning, no or full checkpointing | [`analytic`] over transformers' recorded phases |
//! | `deepspeed` | DeepSpeed | asked for, or implied by CPU offload | [`analytic`] with DeepSpeed's buffers |
//! | `megatron` | Megatron-LM | anything else (asked for, or by `auto`) | [`analytic`] over Korthikanti et al.'s activations |
//! | `torchtitan-closed-form` | torchtitan | what its FSDP2 programs do not | [`analytic`] with torchtitan's loss |
//!
//! Beside them: [`optimizer`], the optimizer step every builder lays out the same way.

pub mod analytic;
pub mod fsdp2;
pub mod hf;
pub mod optimizer;
pub mod recorded;

pub use crate::job::Device;
use crate::job::{Framework, Job, PipelineStage};
use crate::names::Named;
use crate::program::Program;
use std::fmt;

/// How ZeRO and offload shrink what one GPU keeps of the weights, gradients and optimizer
/// state (1 for a whole replica; 0 for what is offloaded).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StateScale {
    pub weights: f64,
    pub gradients: f64,
    pub optimizer: f64,
}

impl Default for StateScale {
    fn default() -> Self {
        StateScale { weights: 1.0, gradients: 1.0, optimizer: 1.0 }
    }
}

/// Micro-batches a program holds of a step's gradient accumulation. The first makes the
/// gradients and every later one adds its own and drops it: the allocator meets the same
/// requests again and again, so a step of more is replayed as this many. Past the eighth a
/// micro-batch moves the replay's figures by a few of the allocator's blocks at most (its
/// cache settles; `tests/estimate.rs` holds the bound), and the work of a plan no longer
/// grows with `--accumulation`.
pub const MICRO_BATCHES_BUILT: u64 = 8;

/// Micro-batches of `cfg`'s step a program holds: [`MICRO_BATCHES_BUILT`] at most.
pub fn micro_batches_built(cfg: &crate::job::TrainConfig) -> u64 {
    cfg.accumulation.clamp(1, MICRO_BATCHES_BUILT)
}

/// What a build is asked for beside the job.
#[derive(Clone, Copy, Debug)]
pub struct Context<'g> {
    pub device: Device<'g>,
    /// Optimizer steps the program holds: the first makes the optimizer's state, the later
    /// ones run with it.
    pub steps: u32,
    /// Bytes of the GPU kept from optimal checkpointing's budget: what the allocator's
    /// caching takes beyond the tensors, found by replaying ([`crate::estimate`]).
    pub held_back: f64,
}

/// One program of a build: a pipeline rank's, or the job's where every GPU runs the same.
#[derive(Clone, Debug)]
pub struct RankProgram {
    pub program: Program,
    /// Which stages the rank holds.
    pub stage: PipelineStage,
    /// Under a pipeline whose every rank is planned: the rank and what it holds.
    pub layout: Option<RankLayout>,
}

/// A pipeline rank's share of the model and of the schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct RankLayout {
    /// The rank in the pipeline group.
    pub rank: u64,
    /// The global stage indices it holds (one, `rank + k·pp` looped, `rank` and
    /// `2·pp-1-rank` in a V).
    pub stages: Vec<u64>,
    /// Transformer blocks on it.
    pub layers: u64,
    /// The most micro-batch chunks its schedule holds at once.
    pub in_flight: u64,
}

/// What a builder made of a job.
#[derive(Clone, Debug)]
pub struct Built {
    /// One program per rank planned apart; the one whose replay reserves the most answers
    /// for the job.
    pub ranks: Vec<RankProgram>,
    /// What the programs were made from.
    pub source: ProgramSource,
    /// Forward FLOPs the backward recomputes, as a fraction of one forward.
    pub recompute_fraction: f64,
    /// Why nothing fits, where a solver found no schedule (optimal checkpointing).
    pub note: Option<String>,
    /// Whether the programs hold `torch.compile`'s graphs rather than the eager code's.
    pub compiled: bool,
}

/// What a builder's programs were made from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProgramSource {
    /// A recorded template of the framework's step, expanded to the model: its key.
    Template(String),
    /// FSDP2's programs, laid out stream by stream.
    Fsdp2,
    /// Phases laid out from the closed form's terms.
    Analytic,
    /// The user's own recording, replayed as recorded: its file, as described (its path, its
    /// allocations and steps).
    Recording(String),
}

impl ProgramSource {
    /// Its stable name in `--json`.
    pub fn name(&self) -> &'static str {
        match self {
            ProgramSource::Template(_) => "recorded",
            ProgramSource::Fsdp2 => "fsdp2",
            ProgramSource::Analytic => "analytic",
            ProgramSource::Recording(_) => "recording",
        }
    }

    /// The template's key or the recording's file, where it has one.
    pub fn detail(&self) -> Option<&str> {
        match self {
            ProgramSource::Template(s) | ProgramSource::Recording(s) => Some(s),
            ProgramSource::Fsdp2 | ProgramSource::Analytic => None,
        }
    }
}

/// A builder: which jobs it serves, and their programs.
pub trait Builder: Sync {
    /// Its name in the estimate and in `--json`.
    fn name(&self) -> &'static str;

    /// The framework whose code it models: the one the estimate reports.
    fn framework(&self) -> Framework;

    /// Whether transformers' own modelling code runs the job's layers (its kernels were
    /// recorded, [`crate::time::eager_step`]).
    fn transformers_code(&self, _job: &Job) -> bool {
        false
    }

    /// Why the job's programs are not timed, where they are not: their estimates then have no
    /// timing, and say this instead.
    fn untimed(&self, _job: &Job) -> Option<&'static str> {
        None
    }

    /// The job's step time made from the builder's own inputs (a recording's kernels), where it
    /// has one; `None` where the planner's time model ([`crate::time`]) times the job.
    fn step_time(&self, _job: &Job) -> Option<crate::time::StepTime> {
        None
    }

    /// Whether it serves only jobs that bring their own program (a recording): to every other
    /// job it has nothing to say, and its reason is not reported.
    fn only_when_brought(&self) -> bool {
        false
    }

    /// Whether it builds the job's programs; why not, if it does not.
    fn serves(&self, job: &Job) -> Result<(), String>;

    /// The job's programs. Called only for a job it serves; an error is a gap between
    /// [`Builder::serves`] and the build, reported as such.
    fn build(&self, job: &Job, cx: &Context) -> Result<Built, String>;
}

/// The table, in the order builders are asked.
pub static BUILDERS: &[&dyn Builder] = &[
    &recorded::UserRecording,
    &hf::Recorded,
    &fsdp2::pipeline::Pipelined,
    &fsdp2::Fsdp2,
    &analytic::TransformersPhases,
    &analytic::DeepSpeed,
    &analytic::Megatron,
    &analytic::Torchtitan,
];

/// A builder the job was not given to, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Passed {
    pub builder: &'static str,
    pub why: String,
}

/// The builder that runs a job, and why the ones before it in the table did not.
#[derive(Clone, Copy)]
pub struct Runner {
    pub builder: &'static dyn Builder,
}

impl fmt::Debug for Runner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.builder.name())
    }
}

/// No builder serves the job: every builder of the framework asked for, with its reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct NoRunner {
    pub framework: Framework,
    pub reasons: Vec<Passed>,
}

impl fmt::Display for NoRunner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no program builder plans this job as --framework {} runs it", self.framework.name())?;
        for p in &self.reasons {
            write!(f, "; {}: {}", p.builder, p.why)?;
        }
        if self.framework != Framework::Auto {
            f.write_str(" (--framework auto lets another framework's code plan it)")?;
        }
        Ok(())
    }
}

/// The first builder of the table that serves `job`, and the reasons of those before it.
pub fn runner(job: &Job) -> Result<(Runner, Vec<Passed>), NoRunner> {
    let mut passed = Vec::new();
    for &b in BUILDERS {
        match b.serves(job) {
            Ok(()) => return Ok((Runner { builder: b }, passed)),
            Err(_) if b.only_when_brought() => {}
            // The builders of other frameworks than the one asked for have nothing to say.
            Err(why) if asked_for(job, b.framework()).is_ok() => passed.push(Passed { builder: b.name(), why }),
            Err(_) => {}
        }
    }
    Err(NoRunner { framework: job.train.framework, reasons: passed })
}

/// Whether the job's framework lets `framework`'s builders run it: the one asked for, or for
/// `auto` transformers where it runs the job, DeepSpeed with offload and Megatron-LM else
/// (torchtitan is never picked for a user: its code is not a drop-in).
pub(crate) fn asked_for(job: &Job, framework: Framework) -> Result<(), String> {
    let asked = job.train.framework;
    let auto = asked == Framework::Auto && framework != Framework::Torchtitan;
    if asked == framework || auto {
        Ok(())
    } else {
        Err(format!("the job asks for --framework {}", asked.name()))
    }
}
