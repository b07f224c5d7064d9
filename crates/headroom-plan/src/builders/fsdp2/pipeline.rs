//! torchtitan's FSDP2 step under pipeline parallelism: one pipeline rank's program, its
//! stages' actions in the order PyTorch's schedule runs them ([`crate::pipelining`]).
//!
//! | what | from the code |
//! |---|---|
//! | the layers split over `pp × v` stages, the embedding on the first, the final norm and output on the last, each counting as a layer | torchtitan `_generate_llm_fqn_per_model_part` (`pipeline_parallel_first/last_stage_less_layers = 1`) |
//! | each stage's blocks and its own module `fully_shard`-ed with `reshard_after_forward=False` (torchtitan's default under PP): gathered at the stage's first forward | `get_fsdp_reshard_after_forward_policy("default", pp_enabled=True)`; [TT-BENCH] `apply_fsdp` |
//! | every backward but the stage's last runs with `set_requires_gradient_sync(False)` and `set_reshard_after_backward(False)`: the parameters stay gathered and the unsharded gradients accumulate, upcast to `reduce_dtype` (fp32) once; the stage's last backward reduce-scatters them all | PyTorch `_PipelineStageBase.backward_maybe_with_nosync`, `FSDPParam.to_accumulated_grad_if_needed` |
//! | each micro-batch in flight holds its saved activations (under the checkpointing mode) and the stage's output in `fwd_cache`, until its backward; on the last stage the output is the logits, kept beside the loss's saved log-softmax | `forward_one_chunk`, `_maybe_compute_loss` |
//! | split backwards (zero bubble): `I` runs the recompute and the input gradients and keeps each linear's input for `W` | `stage_backward_input`, `stage_backward_weight` |
//! | a receive buffer per micro-batch for the stage's input (not on the first stage) and one for its output's gradient (not on the last), made at the first step and kept | `_prepare_forward_infra`, `_prepare_backward_infra`, `_make_tensor_from_meta` |
//! | where the outputs are collected for `step()` to return ([`StageOutputs`](crate::pipelining::StageOutputs)), each micro-batch's output kept to the next step's `clear_runtime_states`, and the last stage's concatenated when the schedule ends (torchtitan drops the result) | `forward_one_chunk`'s `output_chunks`, `_merge_outputs`, `merge_chunks` |

use super::{
    backward_transients, block_forward, block_keep, block_params, block_tensors, gather, input_gradient, keeps,
    loss_backward, loss_forward, output_input, post_backward, reshard, Group, Param, Shape, Sites,
};
use crate::builders::optimizer::{self, OptimizerParam, State};
use crate::builders::{Builder, Built, Context, Device, ProgramSource, RankLayout, RankProgram};
use crate::job::{Framework, Job, PipelineStage, Precision, TrainConfig};
use crate::model::Model;
use crate::pipelining::{peak_in_flight, rank_actions, stages_of_rank, Kind, StageOutputs};
use crate::program::{Law, Phase, Program, TensorId, Term};
use std::collections::HashMap;

/// What one stage holds: torchtitan's split of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageSplit {
    /// The token embedding (the first stage).
    pub embedding: bool,
    /// Transformer blocks.
    pub layers: u64,
    /// The final norm and the output projection (the last stage).
    pub head: bool,
}

/// torchtitan's `_generate_llm_fqn_per_model_part(num_stages, num_layers, 1, 1)`: the
/// embedding and the head each count as a layer; the effective layers are split evenly,
/// the first stages taking the remainder. Refuses what torchtitan refuses.
pub fn split(num_stages: u64, num_layers: u64) -> Result<Vec<StageSplit>, String> {
    if num_stages <= 1 {
        return Ok(vec![StageSplit { embedding: true, layers: num_layers, head: true }]);
    }
    let effective = num_layers + 2;
    if num_stages > effective {
        return Err(format!(
            "{num_stages} pipeline stages are more than the {num_layers} layers plus the embedding and the head \
             (torchtitan refuses: 'Number of stages cannot be greater than effective layers')"
        ));
    }
    let per = effective / num_stages;
    let extra = effective % num_stages;
    let mut left = num_layers;
    Ok((0..num_stages)
        .map(|i| {
            let mut n = per + u64::from(i < extra);
            let (embedding, head) = (i == 0, i + 1 == num_stages);
            n -= u64::from(embedding) + u64::from(head);
            let layers = n.min(left);
            left -= layers;
            StageSplit { embedding, layers, head }
        })
        .collect())
}

/// A stage on this rank, as the program holds it.
struct Stage {
    split: StageSplit,
    /// The chunk's own module (embedding, or final norm and output), `fully_shard`-ed apart.
    root: Group,
    blocks: Vec<Group>,
    /// The unsharded gradients accumulated over micro-batches, per group (root first).
    accumulated: Vec<Vec<TensorId>>,
    /// Per micro-batch in flight: every tensor its backward frees, and per block the
    /// tensors kept (to know what the recompute makes).
    in_flight: HashMap<u64, Vec<TensorId>>,
    /// Per micro-batch in flight on the last stage: what the loss keeps for its backward.
    loss: HashMap<u64, Vec<TensorId>>,
    /// The receive buffers, one per micro-batch, made when the schedule first runs and kept:
    /// the stage's inputs (not on the first stage) and its outputs' gradients (not on the
    /// last), PyTorch's `args_recv_info` and `grad_recv_info`.
    recv: Vec<TensorId>,
    grad_recv: Vec<TensorId>,
    /// Per micro-batch between its I and its W: the linears' inputs.
    weight_inputs: HashMap<u64, Vec<TensorId>>,
    /// Backwards (B, or W when split) done this step.
    weights_done: u64,
    /// The outputs collected in `output_chunks` this step, where
    /// [`StageOutputs`](crate::pipelining::StageOutputs) keeps them.
    outputs: Vec<TensorId>,
}

impl Stage {
    /// A stage as it is built, before any step: its parameters grouped as `fully_shard` wraps
    /// them, tensor-parallel over `t`.
    fn new(model: &Model, t: u64, split: StageSplit) -> Stage {
        Stage {
            split,
            root: group(root_params(model, t, split)),
            blocks: (0..split.layers).map(|_| group(block_params(model, t))).collect(),
            accumulated: vec![],
            in_flight: HashMap::new(),
            loss: HashMap::new(),
            recv: vec![],
            grad_recv: vec![],
            weight_inputs: HashMap::new(),
            weights_done: 0,
            outputs: vec![],
        }
    }

    fn groups(&self) -> impl Iterator<Item = &Group> {
        std::iter::once(&self.root).chain(self.blocks.iter())
    }
}

fn group(params: Vec<Param>) -> Group {
    Group { params, shards: vec![], unsharded: vec![], grad: None, reshard_after_forward: false }
}

/// The stage's own module's parameters: the embedding (vocabulary rows split by tensor
/// parallelism), or the final norm and the output projection.
fn root_params(model: &Model, t: u64, s: StageSplit) -> Vec<Param> {
    let mut out = vec![];
    if s.embedding {
        out.push(Param { rows: model.vocab / t, cols: model.hidden, linear: false });
    }
    if s.head {
        out.push(Param { rows: model.hidden, cols: 1, linear: false });
        out.push(Param { rows: model.vocab / t, cols: model.hidden, linear: false });
    }
    out
}

/// torchtitan's step under FSDP2 and pipeline parallelism, every rank by its schedule, as a
/// program builder.
pub struct Pipelined;

impl Builder for Pipelined {
    fn name(&self) -> &'static str {
        "torchtitan-pipeline"
    }

    fn framework(&self) -> Framework {
        Framework::Torchtitan
    }

    fn serves(&self, job: &Job) -> Result<(), String> {
        super::why_not(job)?;
        let par = &job.train.parallel;
        if par.pipeline <= 1 {
            return Err("one pipeline stage".into());
        }
        layout(&job.train, job.model)?;
        let v = if par.pipeline_schedule().looped() { par.virtual_stages.max(1) } else { 1 };
        rank_actions(par.pipeline_schedule(), par.pipeline, v, built_micro_batches(&job.train), 0)?;
        Ok(())
    }

    fn build(&self, job: &Job, cx: &Context) -> Result<Built, String> {
        let (cfg, par) = (&job.train, &job.train.parallel);
        let schedule = par.pipeline_schedule();
        let v = if schedule.looped() { par.virtual_stages.max(1) } else { 1 };
        let (stages_of, splits) = layout(cfg, job.model)?;
        let last = par.pipeline * v - 1;
        let workspace = job.gpu.arch.cublas_workspace_bytes() as f64;
        let mut ranks = Vec::with_capacity(par.pipeline as usize);
        for rank in 0..par.pipeline {
            let program = program(job.model, cfg, cx.device, workspace, cx.steps, rank)?;
            let actions = rank_actions(schedule, par.pipeline, v, built_micro_batches(cfg), rank)?;
            let stages = stages_of[rank as usize].clone();
            let stage = if stages.contains(&0) {
                PipelineStage::First
            } else if stages.contains(&last) {
                PipelineStage::Last
            } else {
                PipelineStage::Middle
            };
            let layout = RankLayout {
                rank,
                layers: stages.iter().map(|&i| splits[i as usize].layers).sum(),
                stages,
                in_flight: peak_in_flight(&actions),
            };
            ranks.push(RankProgram { program, stage, layout: Some(layout) });
        }
        Ok(Built {
            ranks,
            source: ProgramSource::Fsdp2,
            recompute_fraction: crate::closed_form::recompute_fraction(job),
            note: None,
            compiled: cfg.compile,
        })
    }
}

/// Micro-batches of a pipelined step a rank's program holds. The schedule reaches its steady
/// state within a few rounds of `pp` micro-batches, after which every rank repeats the same
/// forwards and backwards: a longer step is built to four rounds (at least
/// [`super::super::MICRO_BATCHES_BUILT`]), a whole number of rounds as the looped schedules
/// need, and what each further micro-batch keeps for the step is added as one tensor. Where
/// the stages collect their outputs for the step, those outputs are made among the
/// schedule's other tensors and shape its cache, so every micro-batch is built, up to
/// [`OUTPUTS_BUILT`] (a bound on the work, far past any memory that holds them).
pub fn built_micro_batches(cfg: &TrainConfig) -> u64 {
    let pp = cfg.parallel.pipeline.max(1);
    let steady = (4 * pp).max(super::super::MICRO_BATCHES_BUILT).div_ceil(pp) * pp;
    let built = if cfg.parallel.stage_outputs == StageOutputs::None { steady } else { OUTPUTS_BUILT.max(steady) };
    cfg.accumulation.clamp(1, built)
}

/// The most micro-batches built one by one where the stages collect their outputs.
pub const OUTPUTS_BUILT: u64 = 1024;

/// The global stage indices of every rank, and each one's split.
pub fn layout(cfg: &TrainConfig, model: &Model) -> Result<(Vec<Vec<u64>>, Vec<StageSplit>), String> {
    let par = &cfg.parallel;
    let schedule = par.pipeline_schedule();
    let v = if schedule.looped() { par.virtual_stages.max(1) } else { 1 };
    let splits = split(par.pipeline * v, model.layers)?;
    let ranks = (0..par.pipeline).map(|r| stages_of_rank(schedule, par.pipeline, v, r)).collect();
    Ok((ranks, splits))
}

/// Pipeline rank `rank`'s step program, `steps` optimizer steps of `cfg.accumulation`
/// micro-batches each.
pub fn program(
    model: &Model,
    cfg: &TrainConfig,
    device: Device,
    workspace: f64,
    steps: u32,
    rank: u64,
) -> Result<Program, String> {
    let par = &cfg.parallel;
    let schedule = par.pipeline_schedule();
    let v = if schedule.looped() { par.virtual_stages.max(1) } else { 1 };
    let (ranks, splits) = layout(cfg, model)?;
    let n_mb = built_micro_batches(cfg);
    let actions = rank_actions(schedule, par.pipeline, v, n_mb, rank)?;
    let sh = Shape::new(model, cfg);
    let mut p = Program::default();
    let s = Sites {
        shard: p.site("FSDP2 sharded parameters"),
        gathered: p.site("FSDP2 unsharded parameters"),
        flat: p.site("FSDP2 all-gather buffer"),
        grads: p.site("FSDP2 unsharded gradients (accumulated over micro-batches)"),
        reduce: p.site("FSDP2 reduce-scatter"),
        act: p.site("micro-batches in flight: saved activations"),
        logits: p.site("output and cross-entropy loss"),
        inputs: p.site("token ids and labels"),
        workspace: p.site("cuBLAS workspace"),
    };
    p.mark(0, Phase::Setup);
    let indices = &ranks[rank as usize];
    let mut stages: HashMap<u64, Stage> =
        indices.iter().map(|&i| (i, Stage::new(model, par.tensor.max(1), splits[i as usize]))).collect();
    let mut order: Vec<u64> = stages.keys().copied().collect();
    order.sort_unstable();
    for i in &order {
        let st = stages.get_mut(i).expect("stage");
        for g in std::iter::once(&mut st.root).chain(st.blocks.iter_mut()) {
            g.shards = g
                .params
                .iter()
                .map(|x| p.alloc(Law::fixed(x.shard(sh.n) * sh.w.stored), Term::Weights, s.shard))
                .collect();
        }
    }
    if workspace > 0.0 {
        p.alloc(Law::fixed(workspace), Term::Workspace, s.workspace);
    }
    let mut state = State::default();
    let mut rs_input: Option<TensorId> = None;
    for step in 1..=steps {
        p.mark(step, Phase::Forward);
        if step == 1 {
            receive_buffers(&mut p, model, cfg, &sh, &order, &mut stages);
        }
        // `optimizers.zero_grad()` at the step's start frees the sharded gradients, and the
        // schedule's `clear_runtime_states` the outputs the last step collected.
        for st in stages.values_mut() {
            st.weights_done = 0;
            for id in std::mem::take(&mut st.outputs) {
                p.free(id);
            }
            for g in std::iter::once(&mut st.root).chain(st.blocks.iter_mut()) {
                if let Some(id) = g.grad.take() {
                    p.free(id);
                }
            }
        }
        let mut in_backward = false;
        for a in &actions {
            let st = stages.get_mut(&a.stage).expect("the schedule's stage is on this rank");
            match a.kind {
                Kind::Forward => forward(&mut p, &sh, &s, cfg, st, a.microbatch),
                Kind::Backward | Kind::BackwardInput => {
                    if !in_backward {
                        p.mark(step, Phase::Backward);
                        in_backward = true;
                    }
                    let split = a.kind == Kind::BackwardInput;
                    backward(&mut p, &sh, &s, cfg, st, a.microbatch, split);
                    if !split {
                        weights_done(&mut p, &sh, &s, st, n_mb, &mut rs_input);
                    }
                }
                Kind::BackwardWeight => {
                    weight_backward(&mut p, &sh, &s, st, a.microbatch);
                    weights_done(&mut p, &sh, &s, st, n_mb, &mut rs_input);
                }
            }
        }
        if let Some(last) = rs_input.take() {
            p.free(last);
        }
        merge_outputs(&mut p, model, cfg, &sh, &s, &order, &mut stages);
        p.mark(step, Phase::OptimizerStep);
        let opt_cfg = TrainConfig {
            precision: if cfg.precision == Precision::Bf16 { Precision::Bf16 } else { Precision::Fp32 },
            ..*cfg
        };
        let groups: Vec<&Group> = order.iter().flat_map(|i| stages[i].groups()).collect();
        let params: Vec<OptimizerParam> = groups
            .iter()
            .flat_map(|g| g.params.iter().map(|x| OptimizerParam { law: Law::fixed(x.shard(sh.n) * sh.w.stored) }))
            .collect();
        let grads: Vec<Option<TensorId>> = groups.iter().flat_map(|g| g.params.iter().map(move |_| g.grad)).collect();
        optimizer::step(&mut p, &mut state, &params, &grads, &opt_cfg, device);
    }
    Ok(p)
}

/// The micro-batches a step runs beyond those built: what each keeps for the whole step
/// (its receive buffers, its output where the stage collects them) is held as one tensor.
fn beyond_built(cfg: &TrainConfig) -> u64 {
    cfg.accumulation.max(1) - built_micro_batches(cfg)
}

/// `_prepare_forward_infra` and `_prepare_backward_infra`: a receive buffer per micro-batch,
/// the stage's input (its sequence shard under tensor parallelism), each as the schedule's
/// first step makes it. (A V schedule's two stages on one rank pass their tensor directly and
/// drop one such buffer; it is kept here.)
fn receive_buffers(
    p: &mut Program,
    model: &Model,
    cfg: &TrainConfig,
    sh: &Shape,
    order: &[u64],
    stages: &mut HashMap<u64, Stage>,
) {
    let (n_mb, beyond) = (built_micro_batches(cfg), beyond_built(cfg));
    let io = sh.per_token(model.hidden as f64 / sh.t, sh.act);
    let site = p.site("pipeline receive buffers");
    for i in order {
        let st = stages.get_mut(i).expect("stage");
        if !st.split.embedding {
            st.recv = (0..n_mb).map(|_| p.alloc(io, Term::Activations, site)).collect();
            if beyond > 0 {
                p.alloc(io.scaled(beyond as f64), Term::Activations, site);
            }
        }
        if !st.split.head {
            st.grad_recv = (0..n_mb).map(|_| p.alloc(io, Term::Activations, site)).collect();
            if beyond > 0 {
                p.alloc(io.scaled(beyond as f64), Term::Activations, site);
            }
        }
    }
}

/// `_merge_outputs`: the last stage's collected logits concatenated into one tensor, which
/// torchtitan's loop drops at once.
fn merge_outputs(
    p: &mut Program,
    model: &Model,
    cfg: &TrainConfig,
    sh: &Shape,
    s: &Sites,
    order: &[u64],
    stages: &mut HashMap<u64, Stage>,
) {
    let (n_mb, beyond) = (built_micro_batches(cfg), beyond_built(cfg));
    for i in order {
        let st = stages.get_mut(i).expect("stage");
        let collected = st.outputs.len() as u64 / n_mb;
        if beyond > 0 && collected > 0 {
            // The outputs of the micro-batches not built, collected as the others were.
            let each = if st.split.head { model.vocab as f64 / sh.t } else { model.hidden as f64 / sh.t };
            let rest = sh.per_token(each * beyond as f64, sh.act);
            let site = if st.split.head { s.logits } else { s.act };
            let term = if st.split.head { Term::Logits } else { Term::Activations };
            st.outputs.push(p.alloc(rest, term, site));
        }
        if st.split.head && collected > 0 {
            let all = (collected * cfg.accumulation.max(1)) as f64;
            let logits = sh.per_token(model.vocab as f64 / sh.t * all, sh.act);
            let merged = p.alloc(logits, Term::Logits, s.logits);
            p.free(merged);
        }
    }
}

/// Elements of a group's parameters gathered.
fn unsharded(sh: &Shape, g: &Group) -> f64 {
    g.shard_elements(sh.n) * sh.n as f64
}

/// One micro-batch's forward through the stage.
fn forward(p: &mut Program, sh: &Shape, s: &Sites, cfg: &TrainConfig, st: &mut Stage, mb: u64) {
    let m = sh.model;
    let (h, a) = (m.hidden as f64 / sh.t, sh.act);
    // `reshard_after_forward=False`: the first forward gathers every group of the stage,
    // and they stay gathered to the stage's last backward.
    if st.blocks.first().is_some_and(|g| g.unsharded.is_empty()) || st.root.unsharded.is_empty() {
        let mut held: Option<TensorId> = None;
        for g in std::iter::once(&mut st.root).chain(st.blocks.iter_mut()) {
            if g.params.is_empty() || !g.unsharded.is_empty() {
                continue;
            }
            let flat = gather(p, sh, s, g);
            // The previous group's flat buffer is dropped once this one is copied out.
            if let Some(old) = held.replace(flat) {
                p.free(old);
            }
        }
        if let Some(old) = held {
            p.free(old);
        }
    }
    let mut keep_all = Vec::new();
    if st.split.embedding {
        keep_all.push(p.alloc(sh.per_token(16.0, 1.0), Term::Inputs, s.inputs));
    }
    // The stage's input: the embedding's output, or the activation received from the
    // previous stage into its buffer.
    let received = st.recv.get(mb as usize).copied();
    let mut x = match received {
        Some(buffer) => buffer,
        None => p.alloc(sh.per_token(h, a), Term::Activations, s.act),
    };
    let made = block_tensors(sh, cfg);
    for i in 0..st.blocks.len() {
        let keep = block_keep(cfg, i as u64);
        let (saved, out) = block_forward(p, sh, s, &made, keep);
        keep_all.extend(saved);
        // A checkpointed or compiled block keeps its input; without checkpointing eager
        // autograd keeps the norm's fp32 copy instead (the stage's own input stays in
        // `fwd_cache`).
        if i == 0 && received.is_some() {
            // The receive buffer outlives the micro-batch.
        } else if keep == super::Keep::All && i > 0 && !sh.compiled {
            p.free(x);
        } else {
            keep_all.push(x);
        }
        x = out;
    }
    if st.split.head {
        // The final norm's saved fp32 input and bf16 product, then its output.
        keep_all.push(p.alloc(sh.per_token(h, 4.0), Term::Activations, s.act));
        let tmp = p.alloc(sh.per_token(h, 4.0), Term::Activations, s.act);
        p.free(tmp);
        keep_all.push(p.alloc(sh.per_token(h, a), Term::Activations, s.act));
        keep_all.push(output_input(p, sh, s));
        p.free(x);
        // The logits are the stage's output, kept in `fwd_cache` to the backward (no
        // `del pred` under the schedule), beside what the loss keeps.
        let v = m.vocab as f64 / sh.t;
        let logits = p.alloc(sh.per_token(v, a), Term::Logits, s.logits);
        if cfg.parallel.stage_outputs.kept(true) {
            st.outputs.push(logits);
        } else {
            keep_all.push(logits);
        }
        st.loss.insert(mb, loss_forward(p, sh, s, logits, false));
    } else {
        // The output sent to the next stage, kept in `fwd_cache` to the backward, or in
        // `output_chunks` to the next step.
        if cfg.parallel.stage_outputs.kept(false) {
            st.outputs.push(x);
        } else {
            keep_all.push(x);
        }
    }
    st.in_flight.insert(mb, keep_all);
}

/// One micro-batch's backward through the stage: B, or I alone (`split`).
fn backward(p: &mut Program, sh: &Shape, s: &Sites, cfg: &TrainConfig, st: &mut Stage, mb: u64, split: bool) {
    let m = sh.model;
    let (h, a) = (m.hidden as f64 / sh.t, sh.act);
    let f = m.intermediate as f64 / sh.t;
    let q = (m.heads * m.head_dim) as f64 / sh.t;
    let saved = st.in_flight.remove(&mb).expect("a backward after its forward");
    let mut held_for_w = Vec::new();
    let mut dx = if st.split.head {
        let loss = st.loss.remove(&mb).expect("the loss's backward after its forward");
        let d_logits = loss_backward(p, sh, s, loss);
        let dx = p.alloc(sh.per_token(h, a), Term::Activations, s.act);
        if split {
            // The output projection's weight gradient waits for W: its input is kept.
            held_for_w.push(p.alloc(sh.per_token(h, a), Term::Activations, s.act));
        } else {
            let out_w = st.root.params[st.root.params.len() - 1];
            let grad = p.alloc(Law::fixed(out_w.shard(sh.n) * sh.n as f64 * sh.w.compute), Term::Gradients, s.grads);
            accumulate(p, sh, s, st, 0, vec![grad]);
        }
        p.free(d_logits);
        dx
    } else {
        // The gradient received from the next stage, in its buffer (freed by no one).
        st.grad_recv[mb as usize]
    };
    let mut dx_buffer = (!st.split.head).then_some(dx);
    let made = block_tensors(sh, cfg);
    for i in (0..st.blocks.len()).rev() {
        let keep = block_keep(cfg, i as u64);
        let recomputed: Vec<TensorId> = made
            .iter()
            .filter(|t| t.saved && !t.transient && !keeps(t, keep))
            .map(|t| p.alloc(t.law, Term::Activations, s.act))
            .collect();
        let transients = backward_transients(p, sh, s);
        if split {
            // What each projection's weight gradient reads: the two norms' outputs (gathered
            // over the sequence under tensor parallelism), the attention output (wo's input)
            // and w2's input.
            let normed = if sh.t > 1.0 { m.hidden as f64 } else { h };
            for width in [normed, normed, q, f] {
                held_for_w.push(p.alloc(sh.per_token(width, a), Term::Activations, s.act));
            }
        } else {
            let g = &st.blocks[i];
            let grads = vec![p.alloc(Law::fixed(unsharded(sh, g) * sh.w.compute), Term::Gradients, s.grads)];
            accumulate(p, sh, s, st, i + 1, grads);
        }
        for id in transients {
            p.free(id);
        }
        let din = input_gradient(p, sh, s);
        if dx_buffer.take() != Some(dx) {
            p.free(dx);
        }
        dx = din;
        for id in recomputed {
            p.free(id);
        }
    }
    for id in saved {
        p.free(id);
    }
    if st.split.embedding && !split {
        let emb = &st.root;
        let grad =
            p.alloc(Law::fixed(emb.params[0].shard(sh.n) * sh.n as f64 * sh.w.compute), Term::Gradients, s.grads);
        accumulate(p, sh, s, st, 0, vec![grad]);
    }
    // The input gradient, sent to the previous stage.
    if dx_buffer != Some(dx) {
        p.free(dx);
    }
    if split {
        st.weight_inputs.insert(mb, held_for_w);
    }
}

/// W: every group's weight gradients from the inputs I kept.
fn weight_backward(p: &mut Program, sh: &Shape, s: &Sites, st: &mut Stage, mb: u64) {
    let held = st.weight_inputs.remove(&mb).expect("W after its I");
    for i in 0..=st.blocks.len() {
        let g = if i == 0 { &st.root } else { &st.blocks[i - 1] };
        if g.params.is_empty() {
            continue;
        }
        let grad = p.alloc(Law::fixed(unsharded(sh, g) * sh.w.compute), Term::Gradients, s.grads);
        accumulate(p, sh, s, st, i, vec![grad]);
    }
    for id in held {
        p.free(id);
    }
}

/// A group's unsharded gradients of one micro-batch, accumulated without a reduction
/// (`set_requires_gradient_sync(False)`): the first upcast to `reduce_dtype` by
/// `to_accumulated_grad_if_needed`, later ones added into it and freed.
fn accumulate(p: &mut Program, sh: &Shape, s: &Sites, st: &mut Stage, i: usize, grads: Vec<TensorId>) {
    if st.accumulated.len() <= i {
        st.accumulated.resize(i + 1, vec![]);
    }
    let g = if i == 0 { &st.root } else { &st.blocks[i - 1] };
    if !st.accumulated[i].is_empty() {
        for id in grads {
            p.free(id);
        }
    } else if sh.w.reduce != sh.w.compute {
        let acc = p.alloc(Law::fixed(unsharded(sh, g) * sh.w.reduce), Term::Gradients, s.grads);
        for id in grads {
            p.free(id);
        }
        st.accumulated[i] = vec![acc];
    } else {
        st.accumulated[i] = grads;
    }
}

/// After a stage's backward: on its last micro-batch's (`last_backward`), FSDP2's
/// post-backward runs for every group with the gradient sync back on: the accumulated
/// gradients copied into the reduce-scatter input, the sharded gradient made on the
/// reduce-scatter stream, the parameters resharded.
fn weights_done(p: &mut Program, sh: &Shape, s: &Sites, st: &mut Stage, n_mb: u64, rs_input: &mut Option<TensorId>) {
    st.weights_done += 1;
    if st.weights_done < n_mb {
        return;
    }
    let accumulated = std::mem::take(&mut st.accumulated);
    for (i, acc) in accumulated.into_iter().enumerate() {
        let g = if i == 0 { &mut st.root } else { &mut st.blocks[i - 1] };
        if acc.is_empty() {
            reshard(p, g);
        } else {
            post_backward(p, sh, s, g, acc, rs_input);
        }
    }
    for g in std::iter::once(&mut st.root).chain(st.blocks.iter_mut()) {
        reshard(p, g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torchtitans_split_counts_the_embedding_and_the_head_as_layers() {
        // Llama 3.1 405B (126 layers) over 8 stages: 128 effective, 16 a stage.
        let s = split(8, 126).unwrap();
        assert_eq!(s[0], StageSplit { embedding: true, layers: 15, head: false });
        assert!(s[1..7].iter().all(|x| *x == StageSplit { embedding: false, layers: 16, head: false }));
        assert_eq!(s[7], StageSplit { embedding: false, layers: 15, head: true });
        // 16 stages (interleaved, 2 a rank): 8 each, the ends 7.
        let s = split(16, 126).unwrap();
        assert_eq!((s[0].layers, s[1].layers, s[15].layers), (7, 8, 7));
        assert_eq!(s.iter().map(|x| x.layers).sum::<u64>(), 126);
        // Uneven: 32 layers + 2 over 5 stages = 7, 7, 7, 7, 6 effective.
        let s = split(5, 32).unwrap();
        assert_eq!(s.iter().map(|x| x.layers).collect::<Vec<_>>(), vec![6, 7, 7, 7, 5]);
        assert!(split(35, 32).unwrap_err().contains("more than the 32 layers"));
    }
}
