//! torchtitan's training step under PyTorch's FSDP2 (`fully_shard`), as a program:
//! what one rank allocates, stream by stream, read from their code
//! (research/fsdp2-torchtitan-memory.md).
//!
//! | what | where it lives | from the code |
//! |---|---|---|
//! | each parameter's shard, ⌈dim0 / N⌉ rows in its own dtype (fp32 under `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`) | compute stream, the whole run | `FSDPParam._init_sharded_param` |
//! | a block's parameters gathered: the flat all-gather output (param dtype) and the cast of the local shards into it | the all-gather stream; freed when the next block is gathered (forward) or at once (backward) | `foreach_all_gather`, `AllGatherState` |
//! | the unsharded parameters, one tensor each | compute stream, from the block's pre-forward to its post-forward, again from its pre-backward to its post-backward; kept through the step for the root (embedding, final norm, output) and the last block, whose `reshard_after_forward` torchtitan sets False; kept for every block with `reshard_after_forward=False` (`--zero 2`) | `foreach_all_gather_copy_out`, `FSDPParamGroup.reshard` |
//! | backward's prefetch: the previous block's flat buffer | the all-gather stream, during the block's backward | `_backward_prefetch` |
//! | the unsharded gradients (param dtype), then the reduce-scatter input in `reduce_dtype`, one kept until the next block's | compute stream | `foreach_reduce`, `reduce_scatter_max_input_buffers = 1` |
//! | the sharded gradients (fp32): the reduce-scatter's output, one per block | the reduce-scatter stream, until `zero_grad` frees them at the next step's start | `foreach_reduce`, torchtitan's `train.py` |
//! | AdamW's two moments per shard, made by the first step; foreach's square root of the second moments during the step | compute stream | `torch.optim.AdamW` |
//! | the blocks' activations by torchtitan's checkpointing: none, `full` (the block's input), `selective` per op (the input, every other matrix multiply's output, the attention kernel's output and log-sum-exp) or every N-th block full | compute stream | `_apply_ac_to_transformer_block`, `_save_list` |
//! | the loss on the full vocabulary: bf16 logits, their fp32 copy and log-softmax's output in the forward (`del pred` drops the logits); the NLL's and log-softmax's fp32 gradients and the bf16 one in the backward | compute stream | `train.py`'s `loss_fn` |
//! | under tensor parallelism (always with sequence parallelism): each norm's output all-gathered over the sequence and saved by the projections; wo's and w2's partial sums before their reduce-scatter; the output gradient gathered and the input gradient's partial sums in the backward; the loss on the vocabulary shard by `loss_parallel`'s decompositions, in fp32 | compute stream | `apply_tp`, `SequenceParallel`, `PrepareModuleInput`; PyTorch `tensor/parallel/loss.py` |
//! | `torch.compile`'d blocks: no fp32 intermediates of the norms and the rotary embedding, no silu output; only what the backward reads is saved (not w2's or the reduce-scatters' outputs), the block's input in place of the norm's fp32 copy; a compiled loss keeps the bf16 logits and a log-sum-exp and writes a bf16 gradient | compute stream | `apply_compile`, `build_cross_entropy_loss` |
//! | torchao float8 with `enable_fsdp_float8_all_gather`: the blocks' linear weights gathered in fp8, their inputs gathered in fp8 under tensor parallelism | all-gather stream, compute stream | torchao `WeightWithDynamicFloat8CastTensor`, `Float8ColwiseParallel` |
//!
//! The caching allocator gives a freed block back only to its own stream, so the
//! all-gather and reduce-scatter pools are reserved apart from the compute stream's:
//! what `max_memory_reserved` (torchtitan's `memory:` log line) counts.

mod layers;
pub mod pipeline;

use layers::{
    backward_transients, block_forward, block_keep, block_tensors, input_gradient, keeps, loss_backward, loss_forward,
    output_input, Keep,
};

use super::optimizer::{self, OptimizerParam, State};
use super::{Builder, Built, Context, Device, ProgramSource, RankProgram};
use crate::job::{Checkpointing, Finetune, Framework, Job, Offload, PipelineStage, Precision, TrainConfig};
use crate::model::{Family, Model};
use crate::program::{Law, Phase, Program, TensorId, Term};

/// FSDP2's communication streams, as the caching allocator keys its pools (the compute
/// stream is 0).
const ALL_GATHER: u64 = 1;
const REDUCE_SCATTER: u64 = 2;

/// Whether the job is torchtitan's FSDP2 step this module builds (one pipeline stage here,
/// more in [`pipeline`]): torchtitan's code, a dense Llama-style decoder (MoE layers' grouped
/// matrix multiplies are not modelled), parameters sharded (`--zero 2` or `3`) over more than
/// one GPU, full training without offload, and a checkpointing mode torchtitan has.
pub fn why_not(job: &Job) -> Result<(), String> {
    super::asked_for(job, Framework::Torchtitan)?;
    let (model, cfg) = (job.model, &job.train);
    let par = &cfg.parallel;
    if par.zero_stage < 2 || par.shard_degree() <= 1 {
        return Err("its FSDP2 program shards the parameters (--zero 2 or 3) over more than one GPU".into());
    }
    if cfg.finetune != Finetune::Full {
        return Err("torchtitan trains every parameter".into());
    }
    if cfg.offload != Offload::None {
        return Err("FSDP2's CPU offload is not modelled".into());
    }
    if cfg.checkpointing == Checkpointing::Optimal {
        return Err("torchtitan has no optimal checkpointing (none, full, per-op or every-K)".into());
    }
    if model.experts > 1 {
        return Err("a mixture of experts' grouped matrix multiplies are not modelled".into());
    }
    if model.family != Family::GatedDecoder || !model.gated_mlp {
        return Err(format!("its program is Llama's block; {} is another family", model.name));
    }
    Ok(())
}

/// torchtitan's step under FSDP2 without pipelining, as a program builder.
pub struct Fsdp2;

impl Builder for Fsdp2 {
    fn name(&self) -> &'static str {
        "torchtitan"
    }

    fn framework(&self) -> Framework {
        Framework::Torchtitan
    }

    fn serves(&self, job: &Job) -> Result<(), String> {
        why_not(job)?;
        if job.train.parallel.pipeline > 1 {
            return Err("pipelined: every rank is planned by torchtitan-pipeline".into());
        }
        Ok(())
    }

    fn build(&self, job: &Job, cx: &Context) -> Result<Built, String> {
        let workspace = job.gpu.arch.cublas_workspace_bytes() as f64;
        let program = program(job.model, &job.train, cx.device, workspace, cx.steps);
        Ok(Built {
            ranks: vec![RankProgram { program, stage: PipelineStage::Only, layout: None }],
            source: ProgramSource::Fsdp2,
            recompute_fraction: crate::closed_form::recompute_fraction(job),
            note: None,
            compiled: job.train.compile,
        })
    }
}

/// A parameter as FSDP2 stores it: its local (tensor-parallel) rows and columns.
#[derive(Clone, Copy, Debug)]
struct Param {
    rows: u64,
    cols: u64,
    /// A transformer block's linear weight: what torchao's float8 converts, and what its fp8
    /// all-gather gathers at one byte.
    linear: bool,
}

impl Param {
    /// Elements of its shard: dim 0 chunked over `n`, the first chunk's size ("0th always
    /// padded"), so tail ranks hold padding.
    fn shard(self, n: u64) -> f64 {
        (self.rows.div_ceil(n) * self.cols) as f64
    }
}

/// Bytes of the widths FSDP2 runs at.
#[derive(Clone, Copy, Debug)]
struct Widths {
    /// The sharded parameter and the optimizer's states (the original dtype).
    stored: f64,
    /// `param_dtype`: the gathered parameters, their gradients, the activations.
    compute: f64,
    /// `reduce_dtype`: the reduce-scatter and the sharded gradients.
    reduce: f64,
}

fn widths(precision: Precision) -> Widths {
    match precision {
        // torchtitan's default: fp32 parameters, bf16 compute, fp32 reductions. Float8 keeps
        // these; its fp8 all-gather is `Shape::gathered_width`'s, its casts are transients
        // inside each linear that the plan does not hold.
        Precision::Mixed | Precision::Fp8 => Widths { stored: 4.0, compute: 2.0, reduce: 4.0 },
        // fp32 parameters gathered in fp32, autocast's activations in 16 bits.
        Precision::Amp => Widths { stored: 4.0, compute: 4.0, reduce: 4.0 },
        Precision::Bf16 => Widths { stored: 2.0, compute: 2.0, reduce: 2.0 },
        Precision::Fp32 => Widths { stored: 4.0, compute: 4.0, reduce: 4.0 },
    }
}

/// One rank's view of the job: the shard world, tokens and the tensor-parallel split.
struct Shape<'a> {
    model: &'a Model,
    n: u64,
    t: f64,
    /// Tokens per (micro-batch × sequence) on this rank: 1 / context parallelism.
    token: f64,
    w: Widths,
    act: f64,
    /// Each block run through `torch.compile` (torchtitan's `apply_compile`).
    compiled: bool,
    /// The loss run through `torch.compile` (torchtitan since April 2025).
    compiled_loss: bool,
    /// torchao's float8 linears with `enable_fsdp_float8_all_gather`: the blocks' linear
    /// weights gathered in fp8, and under tensor parallelism their inputs too.
    float8: bool,
}

impl<'a> Shape<'a> {
    fn new(model: &'a Model, cfg: &TrainConfig) -> Self {
        let par = &cfg.parallel;
        Shape {
            model,
            n: par.shard_degree(),
            t: par.tensor.max(1) as f64,
            token: 1.0 / par.context.max(1) as f64,
            w: widths(cfg.precision),
            act: if cfg.precision == Precision::Fp32 { 4.0 } else { 2.0 },
            compiled: cfg.compile,
            compiled_loss: cfg.compile && cfg.compile_loss,
            float8: cfg.precision == Precision::Fp8,
        }
    }

    /// A tensor of `elements` per token of the rank's activations, in `bytes`.
    fn per_token(&self, elements: f64, bytes: f64) -> Law {
        Law::per_token(elements * bytes * self.token)
    }

    /// Bytes of an element of `x` gathered: fp8 for float8's linears, `param_dtype` else.
    fn gathered_width(&self, x: &Param) -> f64 {
        if self.float8 && x.linear {
            1.0
        } else {
            self.w.compute
        }
    }

    /// Bytes of a group's unsharded parameters (the flat all-gather output).
    fn gathered_bytes(&self, g: &Group) -> f64 {
        g.params.iter().map(|x| x.shard(self.n) * self.n as f64 * self.gathered_width(x)).sum()
    }
}

/// A block's parameters, each as a tensor-parallel rank holds it: the attention and MLP
/// projections (column-parallel ones split on their outputs, row-parallel on their inputs),
/// then the two norms, whole.
fn block_params(model: &Model, t: u64) -> Vec<Param> {
    let linears = model.block_linears();
    let mut out: Vec<Param> = linears
        .iter()
        .enumerate()
        .map(|(i, &(inp, outp))| {
            // nn.Linear's weight is (out, in); wo and the MLP's last are row-parallel.
            let row_parallel = i == 3 || i + 1 == linears.len();
            if row_parallel {
                Param { rows: outp, cols: inp / t, linear: true }
            } else {
                Param { rows: outp / t, cols: inp, linear: true }
            }
        })
        .collect();
    let linear_elements: u64 = linears.iter().map(|&(i, o)| i * o).sum();
    let rest = model.layer_params().saturating_sub(linear_elements);
    // The norms (and biases where a family has them), replicated under tensor parallelism.
    let norms = (rest / model.hidden.max(1)).max(1);
    for _ in 0..norms {
        out.push(Param { rows: model.hidden, cols: 1, linear: false });
    }
    out
}

/// The root module's own parameters: the embedding (vocabulary rows split by tensor
/// parallelism), the final norm and, untied, the output projection.
fn root_params(model: &Model, t: u64) -> Vec<Param> {
    let mut out = vec![
        Param { rows: model.vocab / t, cols: model.hidden, linear: false },
        Param { rows: model.hidden, cols: 1, linear: false },
    ];
    if !model.tied_embeddings {
        out.push(Param { rows: model.vocab / t, cols: model.hidden, linear: false });
    }
    out
}

/// A group's parameters as the program holds them.
struct Group {
    params: Vec<Param>,
    /// The shards, made at setup.
    shards: Vec<TensorId>,
    /// The unsharded parameters while gathered.
    unsharded: Vec<TensorId>,
    /// The sharded gradient (the reduce-scatter's output), once made.
    grad: Option<TensorId>,
    /// Whether it is resharded after its forward.
    reshard_after_forward: bool,
}

impl Group {
    fn shard_elements(&self, n: u64) -> f64 {
        self.params.iter().map(|p| p.shard(n)).sum()
    }
}

/// The sites the program names.
struct Sites {
    shard: u32,
    gathered: u32,
    flat: u32,
    grads: u32,
    reduce: u32,
    act: u32,
    logits: u32,
    inputs: u32,
    workspace: u32,
}

/// The step program of torchtitan's FSDP2 job on `device`, `steps` optimizer steps of
/// `accumulation` micro-batches each.
pub fn program(model: &Model, cfg: &TrainConfig, device: Device, workspace: f64, steps: u32) -> Program {
    let par = &cfg.parallel;
    debug_assert!(par.pipeline <= 1, "pipelined jobs are pipeline::program's");
    let t = par.tensor.max(1);
    let sh = Shape::new(model, cfg);
    let (n, w) = (sh.n, sh.w);
    let mut p = Program::default();
    let s = Sites {
        shard: p.site("FSDP2 sharded parameters"),
        gathered: p.site("FSDP2 unsharded parameters"),
        flat: p.site("FSDP2 all-gather buffer"),
        grads: p.site("FSDP2 unsharded gradients"),
        reduce: p.site("FSDP2 reduce-scatter"),
        act: p.site("transformer block activations"),
        logits: p.site("output and cross-entropy loss"),
        inputs: p.site("token ids and labels"),
        workspace: p.site("cuBLAS workspace"),
    };
    p.mark(0, Phase::Setup);
    let reshard_blocks = par.zero_stage >= 3;
    let layers = model.layers.max(1);
    let mut root = Group {
        params: root_params(model, t),
        shards: vec![],
        unsharded: vec![],
        grad: None,
        // The root's parameters stay gathered from its forward to the end of its backward.
        reshard_after_forward: false,
    };
    let mut blocks: Vec<Group> = (0..layers)
        .map(|i| Group {
            params: block_params(model, t),
            shards: vec![],
            unsharded: vec![],
            grad: None,
            // torchtitan leaves the last block gathered: its backward comes right after.
            reshard_after_forward: reshard_blocks && i + 1 < layers,
        })
        .collect();
    for g in std::iter::once(&mut root).chain(blocks.iter_mut()) {
        g.shards =
            g.params.iter().map(|x| p.alloc(Law::fixed(x.shard(n) * w.stored), Term::Weights, s.shard)).collect();
    }
    if workspace > 0.0 {
        p.alloc(Law::fixed(workspace), Term::Workspace, s.workspace);
    }
    let mut state = State::default();
    let mut held_flat: Option<TensorId> = None;
    for step in 1..=steps {
        p.mark(step, Phase::Forward);
        // `optimizers.zero_grad()` (set_to_none) at the step's start.
        for g in std::iter::once(&mut root).chain(blocks.iter_mut()) {
            if let Some(id) = g.grad.take() {
                p.free(id);
            }
        }
        for _ in 0..super::micro_batches_built(cfg) {
            micro_batch(&mut p, &sh, &s, cfg, &mut root, &mut blocks, &mut held_flat, reshard_blocks);
        }
        p.mark(step, Phase::OptimizerStep);
        // torch.optim over the shards, in their stored dtype (no master copy: the shard is it).
        let opt_cfg = TrainConfig {
            precision: if cfg.precision == Precision::Bf16 { Precision::Bf16 } else { Precision::Fp32 },
            ..*cfg
        };
        let params: Vec<OptimizerParam> = std::iter::once(&root)
            .chain(blocks.iter())
            .flat_map(|g| g.params.iter().map(|x| OptimizerParam { law: Law::fixed(x.shard(n) * w.stored) }))
            .collect();
        let grads: Vec<Option<TensorId>> =
            std::iter::once(&root).chain(blocks.iter()).flat_map(|g| g.params.iter().map(move |_| g.grad)).collect();
        optimizer::step(&mut p, &mut state, &params, &grads, &opt_cfg, device);
    }
    p
}

/// Gathers `g`: the cast of the local shards and the flat buffer on the all-gather stream,
/// then the unsharded parameters copied out on the compute stream.
fn gather(p: &mut Program, sh: &Shape, s: &Sites, g: &mut Group) -> TensorId {
    let (cast, flat) = all_gather(p, sh, s, g);
    p.free(cast);
    copy_out(p, sh, s, g);
    flat
}

/// The all-gather's input (the local shards cast to the gathered dtype) and its output, on
/// the all-gather stream.
fn all_gather(p: &mut Program, sh: &Shape, s: &Sites, g: &Group) -> (TensorId, TensorId) {
    let bytes = sh.gathered_bytes(g);
    let cast = p.alloc_on(Law::fixed(bytes / sh.n as f64), Term::Temporary, s.flat, ALL_GATHER);
    let flat = p.alloc_on(Law::fixed(bytes), Term::Temporary, s.flat, ALL_GATHER);
    (cast, flat)
}

fn copy_out(p: &mut Program, sh: &Shape, s: &Sites, g: &mut Group) {
    g.unsharded = g
        .params
        .iter()
        .map(|x| p.alloc(Law::fixed(x.shard(sh.n) * sh.n as f64 * sh.gathered_width(x)), Term::Weights, s.gathered))
        .collect();
}

fn reshard(p: &mut Program, g: &mut Group) {
    for id in g.unsharded.drain(..) {
        p.free(id);
    }
}

/// After a group's backward: its unsharded gradients upcast into the reduce-scatter input
/// (compute stream), the sharded gradient made on the reduce-scatter stream (accumulated
/// into the existing one in later micro-batches), the parameters resharded.
fn post_backward(
    p: &mut Program,
    sh: &Shape,
    s: &Sites,
    g: &mut Group,
    grads: Vec<TensorId>,
    rs_input: &mut Option<TensorId>,
) {
    reshard(p, g);
    // One reduce-scatter input is retained: the previous one is dropped before this one.
    if let Some(prev) = rs_input.take() {
        p.free(prev);
    }
    let local = g.shard_elements(sh.n);
    let input = p.alloc(Law::fixed(local * sh.n as f64 * sh.w.reduce), Term::Temporary, s.reduce);
    for id in grads {
        p.free(id);
    }
    let out = p.alloc_on(Law::fixed(local * sh.w.reduce), Term::Gradients, s.reduce, REDUCE_SCATTER);
    match g.grad {
        None => g.grad = Some(out),
        // Accumulated into the gradient already there.
        Some(_) => p.free(out),
    }
    *rs_input = Some(input);
}

/// What a micro-batch's forward left each block for its backward: what it saved, its input
/// where the block keeps it, and the mode that decided.
type Kept = (Vec<TensorId>, Option<TensorId>, Keep);

/// One micro-batch's forward and backward.
#[allow(clippy::too_many_arguments)]
fn micro_batch(
    p: &mut Program,
    sh: &Shape,
    s: &Sites,
    cfg: &TrainConfig,
    root: &mut Group,
    blocks: &mut [Group],
    held_flat: &mut Option<TensorId>,
    reshard_blocks: bool,
) {
    let inputs = p.alloc(sh.per_token(16.0, 1.0), Term::Inputs, s.inputs);
    // The root is gathered first (its pre-forward) and kept to the end of the backward.
    if root.unsharded.is_empty() {
        let flat = gather(p, sh, s, root);
        if let Some(old) = held_flat.replace(flat) {
            p.free(old);
        }
    }
    let made = block_tensors(sh, cfg);
    let (mut kept, x) = blocks_forward(p, sh, s, cfg, blocks, held_flat, &made);
    if let Some(old) = held_flat.take() {
        p.free(old);
    }
    let (dx, mut root_grads) = head(p, sh, s, root, x);
    let mut rs_input: Option<TensorId> = None;
    let dx = blocks_backward(p, sh, s, blocks, &made, &mut kept, dx, reshard_blocks, &mut rs_input);
    // The embedding's backward: a dense gradient of the table.
    let gradient = |p: &mut Program, x: &Param| {
        p.alloc(Law::fixed(x.shard(sh.n) * sh.n as f64 * sh.w.compute), Term::Gradients, s.grads)
    };
    root_grads.push(gradient(p, &root.params[0]));
    p.free(dx);
    for x in &root.params[1..root.params.len().min(2)] {
        root_grads.push(gradient(p, x));
    }
    p.free(inputs);
    post_backward(p, sh, s, root, root_grads, &mut rs_input);
    if let Some(last) = rs_input.take() {
        p.free(last);
    }
    // Gradients of later micro-batches accumulate: the blocks not resharded stay gathered
    // only within one micro-batch's forward and backward.
    for g in blocks.iter_mut() {
        reshard(p, g);
    }
}

/// The blocks' forwards, each gathered first (the previous group's flat buffer dropped once
/// this one is copied out): what each keeps, and the last one's output.
fn blocks_forward(
    p: &mut Program,
    sh: &Shape,
    s: &Sites,
    cfg: &TrainConfig,
    blocks: &mut [Group],
    held_flat: &mut Option<TensorId>,
    made: &[layers::Made],
) -> (Vec<Kept>, TensorId) {
    // The embedding's output: the first block's input. Hidden-width tensors are split over
    // the sequence under tensor parallelism.
    let mut x = p.alloc(sh.per_token(sh.model.hidden as f64 / sh.t, sh.act), Term::Activations, s.act);
    let mut kept: Vec<Kept> = Vec::with_capacity(blocks.len());
    for (i, g) in blocks.iter_mut().enumerate() {
        if g.unsharded.is_empty() {
            let flat = gather(p, sh, s, g);
            if let Some(old) = held_flat.replace(flat) {
                p.free(old);
            }
        }
        let keep = block_keep(cfg, i as u64);
        let (saved, out) = block_forward(p, sh, s, made, keep);
        if g.reshard_after_forward {
            reshard(p, g);
        }
        // Under no checkpointing eager autograd saves the norm's fp32 copy of the input, not
        // the input itself; a checkpointed or compiled block keeps its input.
        let input = if keep == Keep::All && !sh.compiled {
            p.free(x);
            None
        } else {
            Some(x)
        };
        kept.push((saved, input, keep));
        x = out;
    }
    (kept, x)
}

/// The final norm, the output projection and the loss, forward and backward, after the last
/// block's output `x`: the gradient of that output, and the root's gradients made so far.
fn head(p: &mut Program, sh: &Shape, s: &Sites, root: &Group, x: TensorId) -> (TensorId, Vec<TensorId>) {
    let m = sh.model;
    let (h, a) = (m.hidden as f64 / sh.t, sh.act);
    // The final norm (saved: its fp32 input and bf16 normalized tensor) and its output,
    // the output projection's input.
    let norm_fp32 = p.alloc(sh.per_token(h, 4.0), Term::Activations, s.act);
    let tmp = p.alloc(sh.per_token(h, 4.0), Term::Activations, s.act);
    p.free(tmp);
    let norm_saved = [norm_fp32, p.alloc(sh.per_token(h, a), Term::Activations, s.act)];
    let normed = output_input(p, sh, s);
    // The loss on the full vocabulary, then `del pred`.
    let logits = p.alloc(sh.per_token(m.vocab as f64 / sh.t, a), Term::Logits, s.logits);
    let loss = loss_forward(p, sh, s, logits, true);
    // Later micro-batches' forwards are counted in the backward phase: phases never go back.
    if let (step, Phase::Forward) = current(p) {
        p.mark(step, Phase::Backward);
    }
    let d_logits = loss_backward(p, sh, s, loss);
    // The output projection's backward: its input's gradient and its weight's (unsharded).
    let mut root_grads = Vec::new();
    let dx = p.alloc(sh.per_token(h, a), Term::Activations, s.act);
    if !m.tied_embeddings {
        let out_w = root.params[2];
        root_grads.push(p.alloc(Law::fixed(out_w.shard(sh.n) * sh.n as f64 * sh.w.compute), Term::Gradients, s.grads));
    }
    p.free(d_logits);
    p.free(normed);
    // The final norm's backward, in fp32.
    let tmp = p.alloc(sh.per_token(h, 4.0), Term::Activations, s.act);
    let dnorm = p.alloc(sh.per_token(h, a), Term::Activations, s.act);
    p.free(tmp);
    p.free(dx);
    for id in norm_saved {
        p.free(id);
    }
    p.free(x);
    (dnorm, root_grads)
}

/// The blocks' backwards from the top: each copied out of its prefetched buffer (or gathered
/// now), the previous block's all-gather issued, what the forward did not keep recomputed,
/// the gradients made and reduce-scattered. Returns the first block's input gradient.
#[allow(clippy::too_many_arguments)]
fn blocks_backward(
    p: &mut Program,
    sh: &Shape,
    s: &Sites,
    blocks: &mut [Group],
    made: &[layers::Made],
    kept: &mut Vec<Kept>,
    mut dx: TensorId,
    reshard_blocks: bool,
    rs_input: &mut Option<TensorId>,
) -> TensorId {
    let mut prefetched: Option<TensorId> = None;
    for i in (0..blocks.len()).rev() {
        let (saved, input, keep) = kept.pop().expect("one kept set per block");
        if blocks[i].unsharded.is_empty() {
            match prefetched.take() {
                Some(flat) => {
                    copy_out(p, sh, s, &mut blocks[i]);
                    p.free(flat);
                }
                None => {
                    let flat = gather(p, sh, s, &mut blocks[i]);
                    p.free(flat);
                }
            }
        }
        if i > 0 && reshard_blocks && blocks[i - 1].reshard_after_forward {
            let (cast, flat) = all_gather(p, sh, s, &blocks[i - 1]);
            prefetched = Some(flat);
            p.free(cast);
        }
        let recomputed: Vec<TensorId> = made
            .iter()
            .filter(|t| t.saved && !t.transient && !keeps(t, keep))
            .map(|t| p.alloc(t.law, Term::Activations, s.act))
            .collect();
        // The gradients through the MLP (two of its width at once), the fp32 norms', and each
        // projection's weight gradient.
        let transients = backward_transients(p, sh, s);
        let grads: Vec<TensorId> = blocks[i]
            .params
            .iter()
            .map(|x| p.alloc(Law::fixed(x.shard(sh.n) * sh.n as f64 * sh.w.compute), Term::Gradients, s.grads))
            .collect();
        for id in transients {
            p.free(id);
        }
        let din = input_gradient(p, sh, s);
        p.free(dx);
        dx = din;
        for id in recomputed.into_iter().chain(saved) {
            p.free(id);
        }
        if let Some(x) = input {
            p.free(x);
        }
        post_backward(p, sh, s, &mut blocks[i], grads, rs_input);
    }
    dx
}

/// The step and phase the program is in.
fn current(p: &Program) -> (u32, Phase) {
    p.ops
        .iter()
        .rev()
        .find_map(|o| match *o {
            crate::program::Op::Mark { step, phase } => Some((step, phase)),
            _ => None,
        })
        .unwrap_or((0, Phase::Setup))
}
