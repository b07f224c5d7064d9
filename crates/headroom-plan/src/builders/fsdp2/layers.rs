//! What torchtitan's Llama block and loss make as they run, tensor by tensor, and what each
//! checkpointing mode keeps of it (see [`super`]'s table).

use super::{Shape, Sites};
use crate::job::{Attention, Checkpointing, TrainConfig};
use crate::program::{Law, Program, TensorId, Term};

/// What a block's forward makes, in order, and what each mode keeps of it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Made {
    pub(super) law: Law,
    /// Autograd saves it for the backward (what no checkpointing keeps).
    pub(super) saved: bool,
    /// torchtitan's per-op policy saves it (a listed op's output).
    op_saved: bool,
    /// Dropped as soon as the next tensor is made (a short transient) rather than at the
    /// end of the block.
    pub(super) transient: bool,
}

/// A Llama block's forward as torchtitan's `TransformerBlock` runs it, tensor by tensor:
/// `h = x + attention(attention_norm(x))`, `out = h + feed_forward(ffn_norm(h))`.
///
/// Under `torch.compile` each block is one graph: Inductor fuses the norms, the rotary
/// embedding and SwiGLU's product into kernels that make no fp32 intermediates, and
/// AOTAutograd's partitioner saves only what the backward reads, so an output the policy
/// marks `MUST_SAVE` that no backward needs (w2's, the reduce-scatters') is not kept.
pub(super) fn block_tensors(sh: &Shape, cfg: &TrainConfig) -> Vec<Made> {
    let m = sh.model;
    let t = sh.t;
    let compiled = sh.compiled;
    // torchtitan's tensor parallelism always runs with sequence parallelism: the hidden-width
    // tensors (norms, the residual stream) are split over the sequence, the projections'
    // outputs over their columns.
    let tp = t > 1.0;
    let h = m.hidden as f64 / t;
    let q = (m.heads * m.head_dim) as f64 / t;
    let kv = (m.kv_heads * m.head_dim) as f64 / t;
    let f = m.intermediate as f64 / t;
    let heads = m.heads as f64 / t;
    let a = sh.act;
    let mk = |elements: f64, bytes: f64, saved: bool, op_saved: bool, transient: bool| Made {
        law: sh.per_token(elements, bytes),
        saved,
        op_saved,
        transient,
    };
    // RMSNorm: `self._norm(x.float()).type_as(x) * self.weight`: eager saves the fp32 input
    // and the bf16 normalized tensor, the fp32 product a transient. Under sequence
    // parallelism the output is all-gathered over the sequence (`PrepareModuleInput` to
    // `Replicate`; Float8ColwiseParallel gathers it in fp8) and the gathered copy is what
    // the projections save.
    let norm = |v: &mut Vec<Made>| {
        if compiled {
            // The fused kernel's per-token reciprocal root, kept for its backward.
            v.push(mk(1.0, 4.0, true, false, false));
        } else {
            v.push(mk(h, 4.0, true, false, false));
            v.push(mk(h, 4.0, false, false, true));
            v.push(mk(h, a, true, false, false));
        }
        v.push(mk(h, a, !tp, false, false));
        if tp {
            let width = if sh.float8 { 1.0 } else { a };
            v.push(mk(m.hidden as f64, width, true, false, false));
        }
    };
    // A row-parallel projection's output: under sequence parallelism the full sequence's
    // partial sums, reduce-scattered (the reduce-scatter is on the policy's save list).
    let row_parallel = |v: &mut Vec<Made>, op_saved: bool| {
        if tp {
            let kept = op_saved && !compiled;
            v.push(mk(m.hidden as f64, a, false, kept, !kept));
            v.push(mk(h, a, false, !compiled, false));
        } else {
            v.push(mk(h, a, false, op_saved && !compiled, false));
        }
    };
    let mut v = Vec::new();
    norm(&mut v);
    // wq (1st mm: saved by the policy), wk (2nd: recomputed), wv (3rd: saved; SDPA saves its
    // repeated copy).
    v.push(mk(q, a, false, true, false));
    v.push(mk(kv, a, false, false, false));
    v.push(mk(kv, a, false, true, false));
    // Rotary embeddings in complex fp32: the upcast inputs are saved by the product.
    if !compiled {
        v.push(mk(q, 4.0, true, false, false));
        v.push(mk(q, 4.0, false, false, true));
    }
    v.push(mk(q, a, true, false, false)); // xq rotated, SDPA's query
    if !compiled {
        v.push(mk(kv, 4.0, true, false, false));
        v.push(mk(kv, 4.0, false, false, true));
    }
    // xk rotated.
    v.push(mk(kv, a, false, false, false));
    // repeat_kv copies keys and values to every query head.
    v.push(mk(q, a, true, false, false));
    v.push(mk(q, a, true, false, false));
    match cfg.attention {
        Attention::Eager => {
            // Scores and probabilities, b·h·s² each, per token of the rank.
            let s2 = Law { per_token_position: heads * a * sh.token, ..Law::default() };
            v.push(Made { law: s2, saved: true, op_saved: false, transient: false });
            v.push(Made { law: s2, saved: true, op_saved: false, transient: false });
            v.push(mk(q, a, true, false, false));
        }
        Attention::Sdpa | Attention::Flash => {
            // The kernel's output and log-sum-exp: on the save list.
            v.push(mk(q, a, true, true, false));
            v.push(mk(heads, 4.0, true, true, false));
        }
    }
    // Transposed to contiguous: wo's input, which a compiled backward makes again from the
    // attention output.
    v.push(mk(q, a, !compiled, false, false));
    // wo (4th mm: recomputed).
    row_parallel(&mut v, false);
    // h = x + attention: the second norm's input, which a compiled backward reads in place
    // of eager's fp32 copy.
    v.push(mk(h, a, compiled, false, false));
    norm(&mut v);
    let mlp = m.block_linears().len() - 4;
    if mlp == 3 {
        v.push(mk(f, a, true, true, false)); // w1 (5th: saved)
        if !compiled {
            v.push(mk(f, a, true, false, false)); // silu
        }
        v.push(mk(f, a, true, false, false)); // w3 (6th: recomputed)
        v.push(mk(f, a, true, false, false)); // silu · w3: w2's input
    } else {
        v.push(mk(f, a, true, true, false));
        v.push(mk(f, a, true, false, false));
    }
    row_parallel(&mut v, true); // w2 (7th: saved)
    v
}

/// Which of a block's tensors it keeps for the backward under its checkpointing.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Keep {
    All,
    Ops,
    Input,
}

pub(super) fn keeps(m: &Made, keep: Keep) -> bool {
    match keep {
        Keep::All => m.saved,
        Keep::Ops => m.op_saved,
        Keep::Input => false,
    }
}

/// One block's forward: each of its tensors made in turn, a transient dropped at once, those
/// `keep` saves for the backward returned, the rest dropped once the block's output (h +
/// the MLP, the next block's input) is made. Returns (saved, output).
pub(super) fn block_forward(
    p: &mut Program,
    sh: &Shape,
    s: &Sites,
    made: &[Made],
    keep: Keep,
) -> (Vec<TensorId>, TensorId) {
    let (mut saved, mut dropped) = (Vec::new(), Vec::new());
    for t in made {
        let id = p.alloc(t.law, Term::Activations, s.act);
        if t.transient {
            p.free(id);
        } else if keeps(t, keep) {
            saved.push(id);
        } else {
            dropped.push(id);
        }
    }
    let out = p.alloc(sh.per_token(sh.model.hidden as f64 / sh.t, sh.act), Term::Activations, s.act);
    for id in dropped {
        p.free(id);
    }
    (saved, out)
}

/// torchtitan's checkpointing of block `i`: `full` wraps every block, `selective` per op
/// applies its policy to every block, `selective` N wraps every N-th (its counter starts
/// at 1). Megatron's selective (the attention core only) keeps everything here but the
/// scores, which flash attention never makes.
pub(super) fn block_keep(cfg: &TrainConfig, i: u64) -> Keep {
    match cfg.checkpointing {
        Checkpointing::None | Checkpointing::Selective | Checkpointing::Optimal => Keep::All,
        Checkpointing::Full => Keep::Input,
        Checkpointing::PerOp => Keep::Ops,
        Checkpointing::EveryK(k) => {
            if (i + 1).is_multiple_of(k.max(1)) {
                Keep::Input
            } else {
                Keep::All
            }
        }
    }
}

/// The output projection's input as its weight gradient keeps it: the final norm's output,
/// all-gathered over the sequence under tensor parallelism (`ColwiseParallel` with
/// `input_layouts=Shard(1)`).
pub(super) fn output_input(p: &mut Program, sh: &Shape, s: &Sites) -> TensorId {
    p.alloc(sh.per_token(sh.model.hidden as f64, sh.act), Term::Activations, s.act)
}

/// The loss's forward, `cross_entropy(pred.flatten(0, 1).float(), labels)` on `logits`:
/// what it keeps for its backward. Eager: log-softmax's fp32 output (the fp32 upcast a
/// transient). Compiled: one fused kernel keeping each token's maximum and log-sum-exp, and
/// the graph saves its input, so `del pred` (`del_pred`) no longer frees the logits
/// (`scripts/validate/compiled_saves.py` reads what Inductor's partition keeps).
pub(super) fn loss_forward(p: &mut Program, sh: &Shape, s: &Sites, logits: TensorId, del_pred: bool) -> Vec<TensorId> {
    let v = sh.model.vocab as f64 / sh.t;
    let a = sh.act;
    if sh.compiled_loss {
        // Each token's maximum and log of the summed exponentials.
        let lse = p.alloc(sh.per_token(2.0, 4.0), Term::Logits, s.logits);
        return if del_pred { vec![lse, logits] } else { vec![lse] };
    }
    let upcast = (a < 4.0).then(|| p.alloc(sh.per_token(v, 4.0), Term::Logits, s.logits));
    let log_softmax = if sh.t > 1.0 {
        // loss_parallel's `_log_softmax` on the vocabulary shard runs the decomposition:
        // `shifted = x - max`, `exp(shifted)` summed, `shifted - log(sum)`, each in fp32.
        let shifted = p.alloc(sh.per_token(v, 4.0), Term::Logits, s.logits);
        let exp = p.alloc(sh.per_token(v, 4.0), Term::Logits, s.logits);
        p.free(exp);
        let out = p.alloc(sh.per_token(v, 4.0), Term::Logits, s.logits);
        p.free(shifted);
        out
    } else {
        p.alloc(sh.per_token(v, 4.0), Term::Logits, s.logits)
    };
    if let Some(u) = upcast {
        p.free(u);
    }
    if del_pred {
        p.free(logits);
    }
    vec![log_softmax]
}

/// The loss's backward: the logits' gradient in their dtype, returned; what the forward kept
/// is freed. Eager makes nll_loss's fp32 gradient, then log-softmax's beside its saved output,
/// then casts it back; under tensor parallelism torchtitan's `loss_parallel` runs PyTorch's
/// decompositions on the vocabulary shard instead; the compiled loss writes the gradient in
/// one kernel.
pub(super) fn loss_backward(p: &mut Program, sh: &Shape, s: &Sites, kept: Vec<TensorId>) -> TensorId {
    let v = sh.model.vocab as f64 / sh.t;
    let a = sh.act;
    if sh.compiled_loss {
        let d_logits = p.alloc(sh.per_token(v, a), Term::Logits, s.logits);
        for id in kept {
            p.free(id);
        }
        return d_logits;
    }
    let d_log_softmax = if sh.t > 1.0 {
        // loss_parallel fuses both backwards: `(zeros_like(x) with -1 at the targets +
        // exp(x)) * grad_output`, every operand an fp32 tensor of the shard.
        let one_hot = p.alloc(sh.per_token(v, 4.0), Term::Logits, s.logits);
        let exp = p.alloc(sh.per_token(v, 4.0), Term::Logits, s.logits);
        let sum = p.alloc(sh.per_token(v, 4.0), Term::Logits, s.logits);
        p.free(exp);
        let d = p.alloc(sh.per_token(v, 4.0), Term::Logits, s.logits);
        p.free(sum);
        p.free(one_hot);
        d
    } else {
        let nll = p.alloc(sh.per_token(v, 4.0), Term::Logits, s.logits);
        let d = p.alloc(sh.per_token(v, 4.0), Term::Logits, s.logits);
        p.free(nll);
        d
    };
    for id in kept {
        p.free(id);
    }
    if a < 4.0 {
        let d = p.alloc(sh.per_token(v, a), Term::Logits, s.logits);
        p.free(d_log_softmax);
        d
    } else {
        d_log_softmax
    }
}

/// What a block's backward allocates beside its recompute and its weights' gradients: the
/// gradients through the MLP, two of its width at once, and under sequence parallelism the
/// output's gradient all-gathered over the sequence and the input gradient's partial sums
/// before their reduce-scatter. The caller frees them once the weights' gradients are made.
pub(super) fn backward_transients(p: &mut Program, sh: &Shape, s: &Sites) -> Vec<TensorId> {
    let f = sh.model.intermediate as f64 / sh.t;
    let mut out = vec![
        p.alloc(sh.per_token(f, sh.act), Term::Activations, s.act),
        p.alloc(sh.per_token(f, sh.act), Term::Activations, s.act),
    ];
    if sh.t > 1.0 {
        for _ in 0..2 {
            out.push(p.alloc(sh.per_token(sh.model.hidden as f64, sh.act), Term::Activations, s.act));
        }
    }
    out
}

/// The block input's gradient, through the first norm's backward (in fp32 when eager).
pub(super) fn input_gradient(p: &mut Program, sh: &Shape, s: &Sites) -> TensorId {
    let h = sh.model.hidden as f64 / sh.t;
    let tmp = (!sh.compiled).then(|| p.alloc(sh.per_token(h, 4.0), Term::Activations, s.act));
    let din = p.alloc(sh.per_token(h, sh.act), Term::Activations, s.act);
    if let Some(t) = tmp {
        p.free(t);
    }
    din
}
