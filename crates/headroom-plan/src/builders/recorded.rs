//! The user's recordings: a job that brings its own step program (`--program`) is replayed as
//! recorded. Whatever ran the step — any model, any loss, any optimizer, any wrapper — its
//! allocations and frees are in the recording (`python -m headroom_gpu record` makes one under
//! fake tensors, with no GPU), so the builder has nothing to synthesize: the program is the
//! recording, and the plan replays it on the GPU's memory less what lives outside PyTorch,
//! under the allocator settings asked for, as it replays every other builder's program.

use super::{Builder, Built, Context, RankProgram};
use crate::job::{Framework, Job, PipelineStage};

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

    fn only_when_brought(&self) -> bool {
        true
    }

    fn serves(&self, job: &Job) -> Result<(), String> {
        match job.recording {
            Some(_) => Ok(()),
            None => Err("the job brings no recorded program (--program)".into()),
        }
    }

    fn build(&self, job: &Job, _cx: &Context) -> Result<Built, String> {
        let r = job.recording.ok_or("the job brings no recorded program (--program)")?;
        Ok(Built {
            ranks: vec![RankProgram { program: r.program.clone(), stage: PipelineStage::Only, layout: None }],
            source: Some(r.describe()),
            recompute_fraction: 0.0,
            note: None,
            compiled: false,
        })
    }
}
