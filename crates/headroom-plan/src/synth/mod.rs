//! Synthesis: a job's step program, from what its framework's code allocates.
//!
//! - [`hf`]: transformers' training step from its recorded template, expanded to the
//!   model's depth and shape, with a GPU's kernels where they differ from the CPU's;
//! - [`fsdp2`]: torchtitan's step under PyTorch's FSDP2, stream by stream;
//! - [`optimizer`]: the optimizer step of the implementation that runs.

pub mod analytic;
pub mod fsdp2;
pub mod hf;
pub mod optimizer;

use crate::gpu::GpuSpec;
use std::fmt;

/// Where the program runs.
#[derive(Clone, Copy, Debug)]
pub enum Device<'a> {
    /// A GPU: its kernels' own buffers, cuBLAS workspaces, its SDPA kernels.
    Gpu(&'a GpuSpec),
    /// The CPU the templates were recorded on, as the CPU ground truth measures it.
    Cpu,
}

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

/// Why a job has no program of this kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthError {
    /// No recording serves the job (another synthesis must make it).
    NoTemplate(&'static str),
}

impl fmt::Display for SynthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SynthError::NoTemplate(why) => write!(f, "no recorded step program: {why}"),
        }
    }
}

impl std::error::Error for SynthError {}
