//! Where a recorded training run's steps begin, for device calls per step.
//!
//! A training step ends with the optimizer's step, whose allocations carry
//! frames in `torch/optim/` (the optimizer's state on the first step, the
//! foreach implementation's temporaries on every one). A step ends where a
//! run of optimizer allocations does: the next allocation begins the next
//! step. A trace recorded without frames, or without an optimizer, is one
//! step.
//!
//! The first steps differ from the rest: the first creates the optimizer's
//! state and grows the cache, the second meets a cache shaped by the first.
//! From the third on a run is in its steady state, where a caching allocator
//! should ask the device for nothing it did not already ask for.

use crate::snapshot::{MemorySnapshot, TraceAction};

/// A frame of the optimizer's own code.
fn is_optimizer_file(file: &str) -> bool {
    file.contains("/torch/optim/")
}

/// The trace entries at which steps 2, 3, … of `device`'s trace begin: the
/// first allocation after each run of optimizer allocations, in order.
pub fn step_starts(snap: &MemorySnapshot, device: u32) -> Vec<usize> {
    let Some(trace) = snap.device_traces.get(device as usize) else { return Vec::new() };
    // Stacks are interned: classify each once.
    let mut optimizer: Vec<Option<bool>> = vec![None; snap.stacks.stacks.len()];
    let mut starts = Vec::new();
    let mut in_optimizer = false;
    for (i, e) in trace.iter().enumerate().filter(|(_, e)| e.action == TraceAction::Alloc) {
        let k = e.stack as usize;
        let o = match optimizer.get(k).copied().flatten() {
            Some(o) => o,
            None => {
                let o = snap.stacks.frames_of(e.stack).any(|(file, _, _)| is_optimizer_file(file));
                if let Some(slot) = optimizer.get_mut(k) {
                    *slot = Some(o);
                }
                o
            }
        };
        if in_optimizer && !o {
            starts.push(i);
        }
        in_optimizer = o;
    }
    starts
}
