//! What each block became: a parameter, a gradient, optimizer state, an
//! activation or a temporary.
//!
//! Frames tell where a block was allocated ([`crate::frames`]); what it is
//! for is told by how long it lived. A training step runs in passes — the
//! forward, the backward, the optimizer step — and a moment belongs to the
//! pass of the last allocation whose frames name one (the rule
//! [`crate::step_phases`] reads a step by). A block freed in the pass that
//! made it was that pass's temporary. One that outlived its pass was kept
//! for what came after: a forward's block kept into the backward is an
//! activation saved for it, a backward's kept past it is a gradient (the
//! optimizer step reads it), an optimizer step's kept past it is optimizer
//! state. A block allocated while the model is built (a module's
//! `__init__`, `Module.to`/`_apply`, loading weights) and kept is a
//! parameter or buffer. Without a trace there are no lifetimes, and the
//! frames alone say.

use crate::frames::{Phase, StackInfo};
use crate::walk::Live;
use headroom_trace::recorded_step::step_phase;
use headroom_trace::snapshot::{TraceAction, TraceEvent};
use rustc_hash::FxHashMap;
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

/// The passes of a trace and when each allocation was freed: what a block
/// became.
pub struct Lifetimes {
    /// By entry: the pass the moment after it belongs to, and that pass's phase.
    pass: Vec<(u32, Phase)>,
    /// By allocation entry: the entry that freed it, where the trace frees it.
    freed: FxHashMap<usize, usize>,
}

impl Lifetimes {
    /// Reads `trace` once; `phase` is what an allocation's frames name.
    pub fn new(trace: &[TraceEvent], mut phase: impl FnMut(&TraceEvent) -> Phase) -> Lifetimes {
        let mut pass = Vec::with_capacity(trace.len());
        let mut freed = FxHashMap::default();
        let mut by_addr: FxHashMap<u64, usize> = FxHashMap::default();
        // Before any allocation names a pass the moments are a forward's, as step_phases reads them.
        let (mut now, mut id) = (Phase::Forward, 0u32);
        for (i, e) in trace.iter().enumerate() {
            match e.action {
                TraceAction::Alloc => {
                    by_addr.insert(e.addr, i);
                    if let Some(p) = step_phase(phase(e), now).filter(|&p| p != now) {
                        now = p;
                        id += 1;
                    }
                }
                TraceAction::FreeRequested | TraceAction::Free => {
                    if let Some(a) = by_addr.remove(&e.addr) {
                        freed.insert(a, i);
                    }
                }
                _ => {}
            }
            pass.push((id, now));
        }
        Lifetimes { pass, freed }
    }

    /// What `live` became, its frames saying `info`.
    pub fn role(&self, live: &Live, info: &StackInfo) -> Role {
        let Some((a, &(made_in, moment))) = live.since.and_then(|a| Some((a, self.pass.get(a)?))) else {
            return info.role;
        };
        let kept = self.freed.get(&a).and_then(|&f| self.pass.get(f)).is_none_or(|&(freed_in, _)| freed_in != made_in);
        let phase = match info.phase {
            // Recorded with Python stacks only, the autograd engine's allocations carry no frames.
            Phase::Unknown if moment == Phase::Backward => Phase::Backward,
            p => p,
        };
        match (phase, kept) {
            (Phase::Setup | Phase::Forward | Phase::Backward | Phase::OptimizerStep | Phase::Evaluation, false) => {
                Role::Temporaries
            }
            (p, _) => Role::from_phase(p),
        }
    }
}
