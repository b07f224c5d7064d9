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
pub use crate::role::Role;
use crate::walk::{Live, Walk};
use headroom_trace::recorded_step::step_phase;
use headroom_trace::snapshot::{TraceAction, TraceEvent};

/// The passes of a trace and when each allocation was freed: what a block
/// became.
pub struct Lifetimes {
    /// By entry: the pass the moment after it belongs to, and that pass's phase.
    pass: Vec<(u32, Phase)>,
    /// By allocation entry: the entry that freed it ([`NOT_FREED`] where the trace does not,
    /// or the entry allocates nothing). A vector over the entries: half an allocation's
    /// entry in a hash map, and no hashing.
    freed: Vec<u32>,
}

const NOT_FREED: u32 = u32::MAX;

impl Lifetimes {
    /// Reads the trace of `walk`, which stands at its start, once; `phase` is what an
    /// allocation's frames name.
    pub fn new(walk: &Walk, mut phase: impl FnMut(&TraceEvent) -> Phase) -> Lifetimes {
        let trace = walk.trace();
        let mut pass = Vec::with_capacity(trace.len());
        let mut freed = vec![NOT_FREED; trace.len()];
        // By slot, the allocation whose free is still to be requested: the walk's slots name
        // the blocks, so no address is looked up.
        let mut by_slot = vec![NOT_FREED; walk.slots()];
        // Before any allocation names a pass the moments are a forward's, as step_phases reads them.
        let (mut now, mut id) = (Phase::Forward, 0u32);
        for (i, e) in trace.iter().enumerate() {
            match e.action {
                TraceAction::Alloc => {
                    if let Some(s) = walk.slot_named(i) {
                        by_slot[s] = i as u32;
                    }
                    if let Some(p) = step_phase(phase(e), now).filter(|&p| p != now) {
                        now = p;
                        id += 1;
                    }
                }
                TraceAction::FreeRequested | TraceAction::Free => {
                    if let Some(s) = walk.slot_named(i) {
                        let a = std::mem::replace(&mut by_slot[s], NOT_FREED);
                        if a != NOT_FREED {
                            freed[a as usize] = i as u32;
                        }
                    }
                }
                _ => {}
            }
            pass.push((id, now));
        }
        Lifetimes { pass, freed }
    }

    /// The phase of the moment just after entry `i`: the step's phase [`crate::step_phases`]
    /// reads each entry's memory into.
    pub fn phase_after(&self, i: usize) -> Phase {
        self.pass[i].1
    }

    /// What `live` became, its frames saying `info`.
    pub fn role(&self, live: &Live, info: &StackInfo) -> Role {
        let Some((a, &(made_in, moment))) = live.since.and_then(|a| Some((a, self.pass.get(a)?))) else {
            return info.role;
        };
        let freed = self.freed.get(a).copied().filter(|&f| f != NOT_FREED);
        let kept = freed.and_then(|f| self.pass.get(f as usize)).is_none_or(|&(freed_in, _)| freed_in != made_in);
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
