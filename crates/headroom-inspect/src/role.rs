//! The roles a block can have — what it is for — with their names in the report and how
//! each is told ([`crate::roles`] tells them from lifetimes, [`crate::frames`] from frames alone).

use headroom_trace::phase::Phase;
use serde::Serialize;

/// What a live block is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Live when the trace began: its frames were never recorded.
    BeforeTrace,
    ParametersAndBuffers,
    /// Forward allocations kept into the backward: saved for it.
    Activations,
    /// Backward allocations kept past the backward: what the optimizer step reads.
    Gradients,
    OptimizerState,
    /// Freed in the pass that allocated them.
    Temporaries,
    Data,
    Other,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::BeforeTrace => "before_trace",
            Role::ParametersAndBuffers => "parameters_and_buffers",
            Role::Activations => "activations",
            Role::Gradients => "gradients",
            Role::OptimizerState => "optimizer_state",
            Role::Temporaries => "temporaries",
            Role::Data => "data",
            Role::Other => "other",
        }
    }

    /// How the role was inferred, for the report.
    pub fn how(self) -> &'static str {
        match self {
            Role::BeforeTrace => {
                "live when the trace began, so no frames: parameters, buffers and state created before recording started"
            }
            Role::ParametersAndBuffers => {
                "allocated while the model was built (a module's __init__, Module.to/_apply, a Parameter, \
                 load_state_dict, torch.load) and kept"
            }
            Role::Activations => "allocated in a forward pass and kept into the backward: saved for it",
            Role::Gradients => {
                "allocated by the autograd engine and kept past the backward (AccumulateGrad keeps the buffer the \
                 backward op made): what the optimizer step reads"
            }
            Role::OptimizerState => {
                "allocated inside an optimizer's step (torch/optim frames, or a user `step` in an optim file) and \
                 kept past it"
            }
            Role::Temporaries => "freed in the pass (forward, backward, optimizer step) that allocated it",
            Role::Data => "allocated under torch.utils.data frames",
            Role::Other => "frames match no rule above",
        }
    }

    /// What the frames alone suggest, where no lifetime is known: memory live
    /// at a snapshot's moment was kept by whoever allocated it.
    pub fn from_phase(phase: Phase) -> Role {
        match phase {
            Phase::Setup => Role::ParametersAndBuffers,
            Phase::Forward => Role::Activations,
            Phase::Backward => Role::Gradients,
            Phase::OptimizerStep => Role::OptimizerState,
            Phase::DataLoading => Role::Data,
            // Evaluation runs forward without saving for backward: its memory is not activations kept for one.
            Phase::Evaluation | Phase::Other | Phase::Unknown => Role::Other,
        }
    }
}
