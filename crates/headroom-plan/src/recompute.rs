//! Activation checkpointing as a transform of a step program.
//!
//! `torch.utils.checkpoint` around a layer keeps none of what the layer's forward saves for
//! the backward: only the layer's input, which the layer before it made. When the backward
//! reaches the layer it runs the layer's forward again, and what that saves is then used and
//! freed by the layer's backward exactly as the first forward's tensors would have been. A
//! program built without checkpointing therefore becomes the checkpointed one by moving and
//! repeating its own operations, whoever built it:
//!
//! - **forward**: the tensors a wrapped layer's span made that live into the backward (what
//!   autograd saved) are freed where the span ends, all but the layer's output, which the next
//!   layer takes as its input and its checkpoint keeps: the last such tensor, unless the
//!   forward frees one of the span's tensors after the span (the output, where the next layer
//!   saved a copy of its own, as Llama's RMSNorm saves its input upcast);
//! - **backward**: just before the layer's backward begins — its first allocation of a tensor
//!   of the layer, or the first free of one the span saved, whichever comes first — the
//!   span's allocations and frees run again as new tensors, and the backward's frees of the
//!   saved tensors free the new ones.
//!
//! A span is a run of forward allocations of one layer's tensors ([`Tensor::layer`]); a
//! tensor of no layer (the embedding) ends it, and the forward's last layer ends where its
//! allocations outnumber the layer's before it (what follows is the head's, which a builder may
//! file under the last layer). Weights, gradients, optimizer state, workspaces and inputs are
//! never recomputed: only activations, logits and temporaries (autocast's weight copies are
//! made again by the recomputation).
//!
//! What this does not know: when, inside the recomputed span, each saved tensor is last used
//! by the forward. The first forward of a wrapped layer frees its saved tensors only at the
//! span's end, so a forward-phase peak can be over by up to one layer's saved bytes; under
//! PyTorch's checkpoint each is freed as soon as the operations that use it have run. The
//! backward, where checkpointed steps peak, is laid out as PyTorch runs it (within the
//! tolerances docs/VALIDATION.md holds it to, "Checkpointing as a transform of a step program").

use crate::program::{Op, Phase, Program, Tensor, TensorId, Term};

/// Which layers are wrapped in a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wrapped {
    /// Every layer (transformers' `gradient_checkpointing_enable()`).
    Every,
    /// Every `k`-th layer, counted from one: torchtitan's `ac_freq` (layers k, 2k, …).
    EveryK(u64),
}

impl Wrapped {
    fn wraps(self, layer: u32) -> bool {
        match self {
            Wrapped::Every => true,
            Wrapped::EveryK(k) => (u64::from(layer) + 1).is_multiple_of(k.max(1)),
        }
    }
}

/// Why a program cannot be checkpointed by layers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoLayers;

impl std::fmt::Display for NoLayers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no allocation of the step's forward names the layer that made it, so there is no layer to checkpoint: \
             record the step with its module paths (python -m headroom_gpu record writes them, e.g. \
             model.layers.3.mlp), or leave out --checkpoint"
        )
    }
}

impl std::error::Error for NoLayers {}

/// A run of one layer's forward operations.
struct Span {
    /// Index of its first and one past its last operation.
    ops: std::ops::Range<usize>,
    /// Its tensors that live into a backward, in the order made.
    saved: Vec<TensorId>,
    /// Whether the last of them is the layer's output, which its checkpoint keeps.
    output_saved: bool,
}

impl Span {
    /// The layer's output where the span saved it.
    fn output(&self) -> Option<TensorId> {
        self.saved.last().copied().filter(|_| self.output_saved)
    }

    /// What the span's checkpoint drops after the forward and makes again in the backward.
    fn dropped(&self) -> &[TensorId] {
        &self.saved[..self.saved.len() - usize::from(self.output_saved && !self.saved.is_empty())]
    }
}

/// The recomputable terms: what a layer's forward makes for its own use (a wide MLP's
/// intermediates may be filed as logits, by their width).
fn recomputed(t: &Tensor) -> bool {
    matches!(t.term, Term::Activations | Term::Logits | Term::Temporary)
}

/// `program` with the layers `wrapped` names checkpointed (see the module's documentation).
pub fn checkpoint_layers(program: &Program, wrapped: Wrapped) -> Result<Program, NoLayers> {
    let n = program.tensors.len();
    let mut free_at = vec![usize::MAX; n];
    let mut phase_at = Vec::with_capacity(program.ops.len());
    let mut phase = Phase::Setup;
    for (i, op) in program.ops.iter().enumerate() {
        match *op {
            Op::Mark { phase: p, .. } => phase = p,
            Op::Free(t) => free_at[t as usize] = i,
            _ => {}
        }
        phase_at.push(phase);
    }
    let spans = spans(program, &free_at, &phase_at, wrapped);
    if !program.tensors.iter().any(|t| t.layer.is_some()) {
        return Err(NoLayers);
    }
    // Where each span's recomputation runs: before the layer's backward begins.
    let mut before: Vec<Vec<usize>> = vec![Vec::new(); program.ops.len() + 1];
    let mut drop_after: Vec<Vec<TensorId>> = vec![Vec::new(); program.ops.len()];
    for (k, span) in spans.iter().enumerate() {
        let kept = span.dropped();
        let Some(&first) = kept.first() else { continue };
        let layer = program.tensors[first as usize].layer;
        let first_free = kept.iter().map(|&t| free_at[t as usize]).min().unwrap_or(usize::MAX);
        let first_made = (span.ops.end..first_free.min(program.ops.len())).find(|&i| {
            phase_at[i] == Phase::Backward
                && matches!(program.ops[i], Op::Alloc(t) if program.tensors[t as usize].layer == layer)
        });
        before[first_made.unwrap_or(first_free)].push(k);
        drop_after[span.ops.end - 1].extend_from_slice(kept);
    }
    let mut out = Program { tensors: program.tensors.clone(), ops: Vec::new(), sites: program.sites.clone() };
    out.ops.reserve(program.ops.len() * 3 / 2);
    // The tensor a free names: the recomputed one, once a span has run again.
    let mut current: Vec<TensorId> = (0..n as TensorId).collect();
    for (i, op) in program.ops.iter().enumerate() {
        for &k in &before[i] {
            recompute(program, &spans[k], &mut out, &mut current);
        }
        match *op {
            Op::Free(t) if current[t as usize] == TensorId::MAX => {}
            Op::Free(t) => out.ops.push(Op::Free(current[t as usize])),
            other => out.ops.push(other),
        }
        for &t in &drop_after[i] {
            out.ops.push(Op::Free(t));
            // Freed here: the backward frees the recomputed tensor, or nothing if none was.
            current[t as usize] = TensorId::MAX;
        }
    }
    for &k in &before[program.ops.len()] {
        recompute(program, &spans[k], &mut out, &mut current);
    }
    Ok(out)
}

/// The forward spans of the wrapped layers whose tensors live into a backward.
fn spans(program: &Program, free_at: &[usize], phase_at: &[Phase], wrapped: Wrapped) -> Vec<Span> {
    let mut runs = layer_runs(program, phase_at);
    trim_last_layers(program, &mut runs);
    runs.into_iter()
        .filter(|r| wrapped.wraps(r.layer))
        .map(|r| {
            let saved = program.ops[r.ops.clone()]
                .iter()
                .filter_map(|op| match *op {
                    Op::Alloc(t) if program.tensors[t as usize].layer == Some(r.layer) => Some(t),
                    _ => None,
                })
                .filter(|&t| {
                    let f = free_at[t as usize];
                    recomputed(&program.tensors[t as usize]) && f != usize::MAX && phase_at[f] == Phase::Backward
                })
                .collect();
            // The layer's output is what it hands the next layer: a tensor the forward frees
            // after the span (the next layer kept a copy of its own, as Llama's norm upcasts its
            // input), or else the last one it saved.
            let own = |op: &Op| match *op {
                Op::Alloc(t) if program.tensors[t as usize].layer == Some(r.layer) => Some(t),
                _ => None,
            };
            let handed_on = program.ops[r.ops.clone()].iter().filter_map(own).any(|t| {
                let f = free_at[t as usize];
                f != usize::MAX && f >= r.ops.end && phase_at[f] == Phase::Forward
            });
            Span { ops: r.ops, saved, output_saved: !handed_on }
        })
        .collect()
}

/// A run of forward operations that allocate only one layer's tensors.
struct Run {
    layer: u32,
    ops: std::ops::Range<usize>,
    /// Whether a phase mark ends it: the last layer of a forward.
    last: bool,
}

/// The forward's runs of one layer's allocations, each ended by another layer's, a tensor of
/// no layer or a phase mark.
fn layer_runs(program: &Program, phase_at: &[Phase]) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut open: Option<(u32, usize)> = None;
    for (i, op) in program.ops.iter().enumerate() {
        let next = match *op {
            Op::Mark { .. } => None,
            Op::Alloc(t) if phase_at[i] == Phase::Forward => match program.tensors[t as usize].layer {
                Some(l) if open.is_some_and(|(o, _)| o == l) => continue,
                Some(l) if recomputed(&program.tensors[t as usize]) => Some(l),
                Some(_) => continue,
                None => None,
            },
            _ => continue,
        };
        if let Some((layer, start)) = open.take() {
            runs.push(Run { layer, ops: start..i, last: matches!(op, Op::Mark { .. }) });
        }
        open = next.map(|l| (l, i));
    }
    if let Some((layer, start)) = open {
        runs.push(Run { layer, ops: start..program.ops.len(), last: true });
    }
    runs
}

/// A builder may file what follows the last layer — the final norm, the head, the loss — under
/// that layer, as a recording of the step does when the model's last module call is the
/// layer's: the last layer's run then ends where its allocations outnumber the layer's before
/// it, a layer of the same code.
fn trim_last_layers(program: &Program, runs: &mut [Run]) {
    let allocs =
        |r: &std::ops::Range<usize>| program.ops[r.clone()].iter().filter(|o| matches!(o, Op::Alloc(_))).count();
    for k in 1..runs.len() {
        let (before, run) = (&runs[k - 1], &runs[k]);
        if !run.last || before.layer + 1 != run.layer {
            continue;
        }
        let most = allocs(&before.ops);
        let mut seen = 0;
        let end = run.ops.clone().find(|&i| {
            seen += usize::from(matches!(program.ops[i], Op::Alloc(_)));
            seen > most
        });
        if let Some(end) = end {
            runs[k].ops.end = end;
        }
    }
}

/// The span's operations again, as new tensors, into `out`; the saved ones become what the
/// backward frees.
fn recompute(program: &Program, span: &Span, out: &mut Program, current: &mut [TensorId]) {
    let output = span.output();
    let layer = span.saved.first().and_then(|&t| program.tensors[t as usize].layer);
    // In the order made: the frees below keep the program's order, which the allocator's
    // decisions depend on.
    let mut again: Vec<(TensorId, TensorId)> = Vec::new();
    for op in &program.ops[span.ops.clone()] {
        match *op {
            Op::Alloc(t) if Some(t) != output && program.tensors[t as usize].layer == layer => {
                let x = &program.tensors[t as usize];
                if !recomputed(x) {
                    continue;
                }
                out.tensors.push(x.clone());
                let id = (out.tensors.len() - 1) as TensorId;
                out.ops.push(Op::Alloc(id));
                again.push((t, id));
            }
            Op::Free(t) => {
                if let Some(k) = again.iter().position(|&(was, _)| was == t) {
                    out.ops.push(Op::Free(again.remove(k).1));
                }
            }
            _ => {}
        }
    }
    // What is still live is what the backward frees; a tensor of the span the first forward
    // freed after the span (a transient the next layer dropped) is dropped at once.
    for (t, id) in again {
        if span.saved.contains(&t) {
            current[t as usize] = id;
        } else {
            out.ops.push(Op::Free(id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::Law;

    /// Two layers, each saving `a` (freed in the backward) and making a transient `x`; the
    /// head's logits between the forward and the backward.
    fn two_layers() -> Program {
        let mut p = Program::default();
        let s = p.site("layer");
        p.mark(1, Phase::Forward);
        let mut saved = Vec::new();
        for l in 0..2 {
            let x = p.alloc(Law::fixed(100.0), Term::Activations, s);
            let a = p.alloc(Law::fixed(10.0), Term::Activations, s);
            p.free(x);
            let out = p.alloc(Law::fixed(1.0), Term::Activations, s);
            for t in [x, a, out] {
                p.tensors[t as usize].layer = Some(l);
            }
            saved.push((a, out));
        }
        let logits = p.alloc(Law::fixed(1.0), Term::Logits, s);
        p.mark(1, Phase::Backward);
        p.free(logits);
        for &(a, out) in saved.iter().rev() {
            let g = p.alloc(Law::fixed(5.0), Term::Activations, s);
            p.tensors[g as usize].layer = p.tensors[a as usize].layer;
            p.free(a);
            p.free(out);
            p.free(g);
        }
        p.check().unwrap();
        p
    }

    #[test]
    fn a_checkpointed_layer_frees_what_it_saved_and_makes_it_again_before_its_backward() {
        let p = two_layers();
        let c = checkpoint_layers(&p, Wrapped::Every).unwrap();
        c.check().unwrap();
        let sizes = c.sizes(1, 1);
        // Forward: each layer's `a` freed at its span's end; outputs kept.
        let (peaks, _) = c.step_peaks(&sizes, 1);
        let (before, _) = p.step_peaks(&p.sizes(1, 1), 1);
        assert_eq!(before.forward, 1 + 10 + 100 + 10);
        assert_eq!(peaks.forward, 1 + 100 + 10);
        assert_eq!(live_at_backward(&c), 1 + 1 + 1);
        // Backward: each layer's transient and `a` made again, one layer at a time.
        assert_eq!(c.allocations(), p.allocations() + 4);
        assert_eq!(peaks.backward, 2 + 100 + 10);
        // Every tensor is freed: the backward frees the recomputed copies.
        assert_eq!(c.live_peak(&sizes).bytes, peaks.max());
        let mut live = 0i64;
        for op in &c.ops {
            match *op {
                Op::Alloc(t) => live += sizes[t as usize] as i64,
                Op::Free(t) => live -= sizes[t as usize] as i64,
                _ => {}
            }
        }
        assert_eq!(live, 0);
    }

    #[test]
    fn every_kth_layer_is_the_kth_counted_from_one() {
        let p = two_layers();
        let c = checkpoint_layers(&p, Wrapped::EveryK(2)).unwrap();
        c.check().unwrap();
        assert_eq!(c.allocations(), p.allocations() + 2);
        // Layer 0 keeps its `a`; layer 1 (the second) frees its own.
        assert_eq!(live_at_backward(&p), 2 * 11 + 1);
        assert_eq!(live_at_backward(&c), 11 + 1 + 1);
    }

    fn live_at_backward(p: &Program) -> u64 {
        let sizes = p.sizes(1, 1);
        let mut live = 0;
        for op in &p.ops {
            match *op {
                Op::Alloc(t) => live += sizes[t as usize],
                Op::Free(t) => live -= sizes[t as usize],
                Op::Mark { phase: Phase::Backward, .. } => return live,
                _ => {}
            }
        }
        live
    }

    #[test]
    fn a_program_that_names_no_layer_is_refused() {
        let mut p = two_layers();
        p.tensors.iter_mut().for_each(|t| t.layer = None);
        assert_eq!(checkpoint_layers(&p, Wrapped::Every), Err(NoLayers));
    }
}
