//! The user's recordings: a job that brings its own step program (`--program`) is replayed as
//! recorded. Whatever ran the step — any model, any loss, any optimizer, any wrapper — its
//! allocations and frees are in the recording (`python -m headroom_gpu record` makes one under
//! fake tensors, with no GPU), so the builder has nothing to synthesize: the program is the
//! recording, and the plan replays it on the GPU's memory less what lives outside PyTorch,
//! under the allocator settings asked for, as it replays every other builder's program.
//!
//! Checkpointing by layers (`--checkpoint full` or `every-k`) is made of the recording by
//! [`crate::recompute`]: record a step without checkpointing once, and plan it with or without.
//!
//! What only a GPU has comes from the GPU's rules, as for the programs the planner builds: a
//! recording made without a GPU holds no cuBLAS workspace, so the plan adds the GPU's — one
//! at the first forward, for the forward's thread, and one at the first backward, for the
//! autograd engine's, kept for the life of the process. A recording that holds workspaces (a
//! program `--dump-program` wrote) keeps its own.
//!
//! A recording that holds the kernels its step ran (`kernel` lines) is timed from them, on the
//! job's GPU, by the planner's kernel model ([`crate::time::recorded`]) — with gradient
//! accumulation, which only `--recommend`'s rows have, its forward and backward once a
//! micro-batch and its optimizer step once; one that holds none,
//! or is planned with checkpointing it was not recorded with, is not timed. A step recorded
//! compiled holds none by design (its graphs' operators are not Inductor's kernels), and the plan
//! points to the same step recorded eagerly for a time.

use super::{Builder, Built, Context, Device, ProgramSource, RankProgram};
use crate::job::{Checkpointing, Framework, Job, PipelineStage};
use crate::program::{Law, Op, Phase, Program, Term};
use crate::recompute::{checkpoint_layers, Wrapped};
use crate::recording::Kernel;
use crate::time::recorded::recorded_step_time;
use crate::time::{Breakdown, Host, StepTime};

/// Its name in the estimate and in `--json`.
pub const NAME: &str = "recording";

/// The builder of jobs that bring a recording.
pub struct UserRecording;

impl Builder for UserRecording {
    fn name(&self) -> &'static str {
        NAME
    }

    /// No framework's code is modelled: the recording holds what the user's code did. The
    /// estimate names the job's framework as asked (`auto`; a recorded job refuses any other).
    fn framework(&self) -> Framework {
        Framework::Auto
    }

    /// A recording is timed from the kernels it recorded: one that holds none is not, and
    /// neither is one planned with checkpointing it was not recorded with (the kernels the
    /// backward would run again are not in it).
    fn untimed(&self, job: &Job) -> Option<&'static str> {
        match job.recording {
            Some(_) if job.train.parallel.gpus() > 1 => {
                Some("the recorded kernels hold no collectives: a step over several GPUs is not timed from them")
            }
            Some(r) if r.compiled => Some(
                "the step was recorded compiled, through Inductor's graphs run operator by operator, and the kernels \
                 Inductor would generate from them are not in the recording: record the step without --compile and \
                 plan that recording for a time estimate (the eager step's, which the compiled one usually beats); \
                 this recording's memory stands",
            ),
            Some(r) if r.kernels.is_empty() => {
                Some("the recording holds the step's allocations but not its kernels: record it again to time it")
            }
            Some(_) if job.train.checkpointing != Checkpointing::None => {
                Some("the recorded kernels are of the step without checkpointing, not of what the backward recomputes")
            }
            Some(r) if r.kernels_at.is_some_and(|at| at != (job.train.micro_batch, job.train.seq)) => Some(
                "the kernels were recorded at another shape: plan the shape they were recorded at to time the step",
            ),
            Some(_) => None,
            None => Some("the job brings no recorded program"),
        }
    }

    /// The recorded step's kernels on the job's GPU ([`crate::time::recorded`]); with gradient
    /// accumulation (a recommendation's rows), its forward and backward once a micro-batch
    /// and its optimizer step once.
    fn step_time(&self, job: &Job) -> Option<StepTime> {
        let r = job.recording?;
        let (kernels, layers, host) = (r.timed_kernels(), job.model.layers as f64, Host::default());
        let k = job.train.accumulation;
        if k <= 1 {
            return recorded_step_time(kernels, job.gpu, &host, layers);
        }
        let (optimizer, passes): (Vec<Kernel>, Vec<Kernel>) =
            kernels.iter().cloned().partition(|kn| kn.phase == Phase::OptimizerStep);
        let pass = recorded_step_time(&passes, job.gpu, &host, layers)?;
        let step = recorded_step_time(&optimizer, job.gpu, &host, layers);
        let (n, b) = (k as f64, &pass.breakdown);
        let o = step.map(|s| s.breakdown).unwrap_or_default();
        Some(StepTime {
            step: n * pass.step + step.map_or(0.0, |s| s.step),
            breakdown: Breakdown {
                compute: n * b.compute + o.compute,
                memory: n * b.memory + o.memory,
                launch: n * b.launch + o.launch,
                communication: 0.0,
            },
            ..pass
        })
    }

    fn only_when_brought(&self) -> bool {
        true
    }

    fn serves(&self, job: &Job) -> Result<(), String> {
        match job.recording {
            Some(_) => Ok(()),
            None => Err("the job brings no recorded program (--program)".into()),
        }
    }

    fn build(&self, job: &Job, cx: &Context) -> Result<Built, String> {
        let r = job.recording.ok_or("the job brings no recorded program (--program)")?;
        let wrapped = match job.train.checkpointing {
            Checkpointing::None => None,
            Checkpointing::Full => Some(Wrapped::Every),
            Checkpointing::EveryK(k) => Some(Wrapped::EveryK(k)),
            other => return Err(format!("--checkpoint {} is not made of a recording", other.spelling())),
        };
        let recorded = match wrapped {
            Some(w) => &checkpoint_layers(&r.program, w).map_err(|e| e.to_string())?,
            None => &r.program,
        };
        let program = match cx.device {
            Device::Gpu(gpu) => with_workspaces(recorded, gpu.arch.cublas_workspace_bytes()),
            Device::Cpu => recorded.clone(),
        };
        Ok(Built {
            ranks: vec![RankProgram { program, stage: PipelineStage::Only, layout: None }],
            source: ProgramSource::Recording(match wrapped {
                Some(_) => format!("{}, its layers checkpointed", r.describe()),
                None => r.describe(),
            }),
            recompute_fraction: 0.0,
            note: None,
            compiled: false,
        })
    }
}

/// `program` with a cuBLAS workspace of `bytes` allocated as step 1's forward and its backward
/// begin, where it holds none of its own.
fn with_workspaces(program: &Program, bytes: u64) -> Program {
    if program.tensors.iter().any(|t| t.term == Term::Workspace) {
        return program.clone();
    }
    let mut out = Program {
        tensors: program.tensors.clone(),
        ops: Vec::with_capacity(program.ops.len() + 2),
        sites: program.sites.clone(),
    };
    let site = out.site("cuBLAS workspace");
    let mut wanted = [Phase::Forward, Phase::Backward];
    for &op in &program.ops {
        out.ops.push(op);
        if let Op::Mark { step: 1, phase } = op {
            if let Some(w) = wanted.iter_mut().find(|w| **w == phase) {
                // Made once: a later mark of the same phase finds none wanted.
                *w = Phase::Setup;
                out.alloc(Law::fixed(bytes as f64), Term::Workspace, site);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recording_gets_the_gpus_workspaces_once_and_a_dumped_program_keeps_its_own() {
        let mut p = Program::default();
        let s = p.site("m");
        p.mark(0, Phase::Setup);
        p.alloc(Law::fixed(8.0), Term::Weights, s);
        for step in 1..=2 {
            p.mark(step, Phase::Forward);
            let a = p.alloc(Law::fixed(4.0), Term::Activations, s);
            p.mark(step, Phase::Backward);
            p.free(a);
        }
        let w = with_workspaces(&p, 1 << 25);
        assert!(w.check().is_ok());
        let spaces: Vec<usize> = w
            .ops
            .iter()
            .enumerate()
            .filter(|(_, o)| matches!(o, Op::Alloc(t) if w.tensors[*t as usize].term == Term::Workspace))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(spaces.len(), 2);
        assert_eq!(w.ops[spaces[0] - 1], Op::Mark { step: 1, phase: Phase::Forward });
        assert_eq!(w.ops[spaces[1] - 1], Op::Mark { step: 1, phase: Phase::Backward });
        assert_eq!(w.sizes(1, 1).iter().sum::<u64>(), 8 + 4 + 4 + (2 << 25));
        assert_eq!(with_workspaces(&w, 1 << 25), w);
    }
}
