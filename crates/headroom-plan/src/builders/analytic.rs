//! The closed-form builders: a step program laid out from the closed form
//! ([`crate::closed_form`]) for the jobs no program was recorded or read from code for —
//! transformers' code by its phases, DeepSpeed, Megatron-LM, torchtitan where its FSDP2
//! programs do not serve — and the table's entries that run them.
//!
//! The terms the closed form gives are laid out as a step allocates them, so that the
//! replay sees tensors of the sizes and lifetimes a real step has rather than one sum:
//!
//! - setup: the weights, one tensor per layer's share and the tables outside the layers;
//!   the persistent buffers (cuBLAS workspace, a framework's buckets);
//! - each micro-batch's forward: every layer's kept activations as that layer's tensors
//!   (what it saves for the backward), then the logits and the loss's tensors; the
//!   temporaries the step gathers (ZeRO-3's layer, AMP's copies) for as long as the forward;
//! - the backward: the loss's gradients; then layer by layer from the top, the layer's
//!   gradients made and its activations freed; a checkpointed layer's activations made again
//!   before its backward (the recompute) and freed after it;
//! - the optimizer step: the state made by the first step, its temporaries, then
//!   `zero_grad` freeing the gradients.
//!
//! Where the closed form models the step by phases ([`crate::phases`]), each phase's peak is
//! what the program holds at its peak: the forward's activations and logits, the
//! backward's, and the optimizer's temporaries.

use super::optimizer;
use super::{Builder, Built, Context, Device, ProgramSource, RankProgram};
use crate::closed_form::{self, StageMemory};
use crate::job::{Checkpointing, Finetune, Framework, Job, Offload, OptimizerImpl, PipelineStage, TrainConfig};
use crate::names::Named;
use crate::program::{Law, Phase, Program, TensorId, Term};

/// The closed form's terms for one stage, laid out as a program of `steps` steps over
/// `layers` layers' worth of activations; the optimizer step's temporaries are those of the
/// implementation that runs, over `updated` (the bytes of each parameter the GPU's optimizer
/// steps over; none where the CPU steps).
pub fn program(
    cfg: &TrainConfig,
    m: &StageMemory,
    workspace: f64,
    layers: u64,
    steps: u32,
    updated: &[Law],
    device: Device,
) -> Program {
    let mut p = Program::default();
    let b = &m.breakdown;
    let layers = layers.max(1);
    let site = |p: &mut Program, s: &str| p.site(s);
    p.mark(0, Phase::Setup);
    // Weights: a layer's share each, the rest (embeddings, head) as one table.
    let w_site = site(&mut p, "weights");
    let per_layer_weights = b.weights * 0.9 / layers as f64;
    for _ in 0..layers {
        p.alloc(Law::fixed(per_layer_weights), Term::Weights, w_site);
    }
    p.alloc(Law::fixed(b.weights - per_layer_weights * layers as f64), Term::Weights, w_site);
    let ws_site = site(&mut p, "cuBLAS workspace");
    if workspace > 0.0 {
        p.alloc(Law::fixed(workspace), Term::Workspace, ws_site);
    }
    // The phases' terms, or the closed form's sum at once.
    let (fwd_act, fwd_logits, fwd_temp, bwd_grads, bwd_act, bwd_logits, bwd_temp) = match &m.phases {
        Some(ph) => (
            ph.forward.activations,
            ph.forward.logits,
            ph.forward.temporary,
            ph.backward.gradients,
            ph.backward.activations,
            ph.backward.logits,
            ph.backward.temporary,
        ),
        None => {
            let temp = (b.temporary - workspace).max(0.0);
            // The closed form's logits are the loss's every copy at its peak: held once.
            (b.activations, b.logits, temp, b.gradients, b.activations, 0.0, temp)
        }
    };
    let a_site = site(&mut p, "layer activations");
    let l_site = site(&mut p, "logits and loss");
    let t_site = site(&mut p, "temporaries");
    let g_site = site(&mut p, "gradients");
    let o_site = site(&mut p, "optimizer");
    let checkpointed = !matches!(cfg.checkpointing, Checkpointing::None);
    // Megatron's and DeepSpeed's gradients live in buffers made once; PyTorch's
    // `zero_grad(set_to_none=True)` (transformers, torchtitan) frees them every step.
    let persistent_grads = m.phases.is_none() && cfg.framework != Framework::Torchtitan || cfg.deepspeed();
    let mut kept_grads: Vec<TensorId> = Vec::new();
    if persistent_grads {
        for _ in 0..layers {
            kept_grads.push(p.alloc(Law::fixed(bwd_grads / layers as f64), Term::Gradients, g_site));
        }
    }
    let per_layer = fwd_act / layers as f64;
    let mut states: Vec<TensorId> = Vec::new();
    // The loss's tensors as shares of the closed form's logits: 16-bit logits, their fp32
    // upcast and log-softmax's output in the forward; the fp32 gradient and its 16-bit copy in
    // the backward (16 bytes a logit). In fp32 (and torchtitan's, which deletes the 16-bit
    // logits first) 12: two copies in the forward, the gradient in the backward.
    let sixteen = m.phases.is_none()
        && cfg.framework != Framework::Torchtitan
        && !matches!(cfg.precision, crate::job::Precision::Fp32);
    let (loss_forward, loss_backward): (&[f64], &[f64]) = match (m.phases.is_some(), sixteen) {
        (true, _) => (&[1.0], &[]),
        (false, true) => (&[2.0 / 16.0, 4.0 / 16.0, 4.0 / 16.0], &[4.0 / 16.0, 2.0 / 16.0]),
        (false, false) => (&[4.0 / 12.0, 4.0 / 12.0], &[4.0 / 12.0]),
    };
    // A phase's logits are the loss's tensors, each of its own width (the caching allocator
    // reuses the forward's blocks for the backward's only by size), and what the phase holds
    // beside them outside the layers as one block. The backward makes its gradients of the
    // logits whether or not its peak is at the loss: where it is not, its logits term is what
    // the peak holds elsewhere. A compiled step's loss is fused: its logits stay one block.
    // The terms are sums of the recipes' coefficients: compared within f64's rounding.
    let loss_tensors =
        m.phases.map(|ph| ph.loss).filter(|l| l.forward() > 0.0 && l.forward() <= fwd_logits * (1.0 + 1e-9));
    let loss_backward_outside = match loss_tensors {
        Some(l) if bwd_logits >= l.backward() * (1.0 - 1e-9) => (bwd_logits - l.backward(), true),
        _ => (bwd_logits, false),
    };
    // Temporaries a phase model names (AMP's weight copies) are made layer by layer and kept
    // for the forward, as autocast's cache keeps them; the others (ZeRO-3's gathered layer,
    // a dequantized base matrix, a bucket) are a layer's own, made and dropped around it.
    let cached_temps = m.phases.is_some();
    for step in 1..=steps {
        let mut grads: Vec<TensorId> = Vec::new();
        for micro in 0..super::micro_batches_built(cfg) {
            p.mark(step, Phase::Forward);
            let mut cache = Vec::new();
            let mut acts = Vec::with_capacity(layers as usize);
            for _ in 0..layers {
                if fwd_temp > 0.0 {
                    if cached_temps {
                        cache.push(p.alloc(Law::fixed(fwd_temp / layers as f64), Term::Temporary, t_site));
                    } else {
                        let t = p.alloc(Law::fixed(fwd_temp), Term::Temporary, t_site);
                        p.free(t);
                    }
                }
                acts.push(p.alloc(Law::fixed(per_layer), Term::Activations, a_site));
            }
            let alloc_logits = |p: &mut Program, bytes: f64| p.alloc(Law::fixed(bytes), Term::Logits, l_site);
            let (logits, log_softmax) = match loss_tensors {
                Some(l) => {
                    let (gone, log_softmax) = loss_forward_tensors(&mut p, &l, fwd_logits, l_site);
                    (gone, Some(log_softmax))
                }
                None => (loss_forward.iter().map(|k| alloc_logits(&mut p, fwd_logits * k)).collect(), None),
            };
            for t in cache {
                p.free(t);
            }
            p.mark(step, Phase::Backward);
            // Without a phase model the closed form's logits are every copy the loss holds at
            // its peak: the backward's gradients of the logits join the forward's copies, then
            // all go. With one, the phase model counts the backward's apart: the logits and
            // their upcast are gone with the forward's loss function, log-softmax's output is
            // saved for its backward, which makes both gradients beside it.
            let grads_of_logits: Vec<TensorId> =
                loss_backward.iter().map(|k| alloc_logits(&mut p, fwd_logits * k)).collect();
            for l in logits.into_iter().chain(grads_of_logits) {
                p.free(l);
            }
            let (outside, at_loss) = loss_backward_outside;
            let mut loss = None;
            if let (Some(l), Some(log_softmax)) = (loss_tensors, log_softmax) {
                loss = loss_gradients(&mut p, &l, log_softmax, if at_loss { outside } else { 0.0 }, l_site);
            }
            if !at_loss && outside > 0.0 {
                loss = Some(alloc_logits(&mut p, outside));
            }
            // Under checkpointing the backward holds one layer's full keep beside the kept inputs.
            let recompute = (checkpointed && bwd_act > fwd_act)
                .then(|| p.alloc(Law::fixed(bwd_act - fwd_act), Term::Activations, a_site));
            if let Some(l) = loss {
                p.free(l);
            }
            for act in acts.into_iter().rev() {
                if bwd_temp > 0.0 {
                    let t = p.alloc(Law::fixed(bwd_temp), Term::Temporary, t_site);
                    p.free(t);
                }
                if persistent_grads {
                    // Accumulated into the buffer.
                } else if micro == 0 {
                    grads.push(p.alloc(Law::fixed(bwd_grads / layers as f64), Term::Gradients, g_site));
                } else {
                    let g = p.alloc(Law::fixed(bwd_grads / layers as f64), Term::Gradients, g_site);
                    p.free(g);
                }
                p.free(act);
            }
            if let Some(r) = recompute {
                p.free(r);
            }
        }
        p.mark(step, Phase::OptimizerStep);
        if states.is_empty() && b.optimizer > 0.0 {
            for _ in 0..layers {
                states.push(p.alloc(Law::fixed(b.optimizer / layers as f64), Term::Optimizer, o_site));
            }
        }
        let site = optimizer::site(&mut p, cfg.optimizer);
        optimizer::temporaries(&mut p, updated, cfg, device, site);
        for g in grads {
            p.free(g);
        }
    }
    p
}

/// The forward's loss tensors ([`crate::phases::LossTensors`]) and what the phase's logits
/// term holds beyond them: the tensors that go with the loss function, and log-softmax's
/// output, which its backward reads.
fn loss_forward_tensors(
    p: &mut Program,
    l: &crate::phases::LossTensors,
    term: f64,
    site: u32,
) -> (Vec<TensorId>, TensorId) {
    let mut alloc = |bytes: f64| p.alloc(Law::fixed(bytes), Term::Logits, site);
    let mut gone: Vec<TensorId> = [l.logits, l.upcast].into_iter().filter(|&b| b > 0.0).map(&mut alloc).collect();
    let log_softmax = alloc(l.log_softmax);
    let outside = term - l.forward();
    if outside >= 1.0 {
        gone.push(alloc(outside));
    }
    (gone, log_softmax)
}

/// The backward's gradients of the logits, made beside log-softmax's output and `outside`
/// (what the backward's logits term holds beyond them at its peak), which stays alive and is
/// returned; the rest go as the loss's backward ends.
fn loss_gradients(
    p: &mut Program,
    l: &crate::phases::LossTensors,
    log_softmax: TensorId,
    outside: f64,
    site: u32,
) -> Option<TensorId> {
    let alloc = |p: &mut Program, bytes: f64| p.alloc(Law::fixed(bytes), Term::Logits, site);
    let nll = alloc(p, l.gradient);
    let of_log_softmax = alloc(p, l.gradient);
    let outside = (outside >= 1.0).then(|| alloc(p, outside));
    p.free(log_softmax);
    p.free(nll);
    // The upcast's backward casts the gradient back; the head's backward reads it.
    let downcast = (l.gradient_downcast > 0.0).then(|| alloc(p, l.gradient_downcast));
    p.free(of_log_softmax);
    if let Some(d) = downcast {
        p.free(d);
    }
    outside
}

/// Bytes per parameter element of the weights the optimizer steps over.
fn param_width(cfg: &TrainConfig) -> f64 {
    match cfg.precision {
        crate::job::Precision::Fp32 | crate::job::Precision::Amp => 4.0,
        _ => 2.0,
    }
}

/// The closed form's programs for the job: one for its only stage, or under pipelining one
/// for the first stage (the most micro-batches in flight) and one for the last (the logits).
fn build(job: &Job, cx: &Context, transformers: bool) -> Built {
    let cfg = &job.train;
    let stages: &[PipelineStage] =
        if cfg.parallel.pipeline > 1 { &[PipelineStage::First, PipelineStage::Last] } else { &[PipelineStage::Only] };
    let workspace = job.gpu.arch.cublas_workspace_bytes() as f64;
    let layers = job.model.layers.div_ceil(cfg.parallel.pipeline.max(1));
    let mut ranks = Vec::with_capacity(stages.len());
    let (mut recompute_fraction, mut note) = (0.0f64, None);
    for &stage in stages {
        let m = closed_form::memory(job, stage, transformers, cx.held_back);
        let updated: Vec<Law> = if cfg.offload == Offload::None {
            let width = param_width(cfg);
            crate::placement::updated_tensors(job.model, cfg, stage).iter().map(|&n| Law::fixed(n * width)).collect()
        } else {
            Vec::new()
        };
        let program = program(cfg, &m, workspace, layers, cx.steps, &updated, cx.device);
        recompute_fraction = recompute_fraction.max(m.recompute_fraction);
        note = note.or(m.note);
        ranks.push(RankProgram { program, stage, layout: None });
    }
    Built {
        ranks,
        source: ProgramSource::Analytic,
        recompute_fraction,
        note,
        compiled: transformers && closed_form::compiled_recipe(job.model, cfg),
    }
}

/// Whether transformers' code runs the job's layers as its recorded phases model them: one
/// model replica per GPU, full fine-tuning, no or full checkpointing, a recorded recipe.
fn transformers_phases(job: &Job) -> Result<(), String> {
    let cfg = &job.train;
    let par = &cfg.parallel;
    if cfg.finetune != Finetune::Full {
        return Err("adapters (peft) were not recorded: --framework auto plans them in closed form".into());
    }
    if par.tensor > 1 || par.pipeline > 1 || par.context > 1 {
        return Err("transformers runs one model replica per GPU: no tensor, pipeline or context parallelism".into());
    }
    if !matches!(cfg.checkpointing, Checkpointing::None | Checkpointing::Full) {
        return Err(format!("transformers checkpoints whole layers or none, not {}", cfg.checkpointing.spelling()));
    }
    if cfg.decoder_length_apart() {
        return Err(format!(
            "transformers' phases of {} were recorded with the decoder as long as the encoder: a decoder of \
             --target-seq {} apart from --seq {} is planned in closed form",
            job.model.model_type,
            cfg.decoder_seq(),
            cfg.seq
        ));
    }
    if closed_form::hf_recipe(job.model, cfg).is_none() {
        return Err(format!(
            "no recorded activations of {} at {} with {} attention",
            job.model.model_type,
            cfg.precision.name(),
            cfg.attention.name()
        ));
    }
    Ok(())
}

/// A framework with its own fused Adam: an explicit torch.optim implementation is not its.
fn fused_adam(job: &Job, framework: &str) -> Result<(), String> {
    match job.train.optimizer_impl {
        Some(i) if i != OptimizerImpl::Fused => {
            Err(format!("{framework} steps with its own fused Adam; --optimizer-impl {} is torch.optim's", i.name()))
        }
        _ => Ok(()),
    }
}

/// transformers' code by its recorded phases ([`crate::phases`]), for the jobs whose step
/// was not recorded tensor by tensor: data parallelism and ZeRO over whole replicas.
pub struct TransformersPhases;

impl Builder for TransformersPhases {
    fn name(&self) -> &'static str {
        "transformers-phases"
    }

    fn framework(&self) -> Framework {
        Framework::HuggingFace
    }

    fn transformers_code(&self, _job: &Job) -> bool {
        true
    }

    fn serves(&self, job: &Job) -> Result<(), String> {
        super::asked_for(job, Framework::HuggingFace)?;
        if job.train.offload != Offload::None {
            return Err(super::hf::OFFLOAD.into());
        }
        transformers_phases(job)
    }

    fn build(&self, job: &Job, cx: &Context) -> Result<Built, String> {
        Ok(build(job, cx, true))
    }
}

/// DeepSpeed's ZeRO engine over transformers' code ([`crate::deepspeed`]): its buffers beside
/// transformers' phases where they were recorded, Korthikanti et al.'s activations elsewhere.
pub struct DeepSpeed;

impl Builder for DeepSpeed {
    fn name(&self) -> &'static str {
        "deepspeed"
    }

    fn framework(&self) -> Framework {
        Framework::DeepSpeed
    }

    fn transformers_code(&self, job: &Job) -> bool {
        transformers_phases(job).is_ok()
    }

    fn serves(&self, job: &Job) -> Result<(), String> {
        super::asked_for(job, Framework::DeepSpeed)?;
        if job.train.framework == Framework::Auto && job.train.offload == Offload::None {
            return Err("--framework auto picks DeepSpeed for CPU offload (--offload)".into());
        }
        fused_adam(job, "DeepSpeed")
    }

    fn build(&self, job: &Job, cx: &Context) -> Result<Built, String> {
        Ok(build(job, cx, transformers_phases(job).is_ok()))
    }
}

/// Megatron-LM's layers in closed form: Korthikanti et al.'s activations, its fp32 main
/// gradients and distributed optimizer, Transformer Engine's kernels.
pub struct Megatron;

impl Builder for Megatron {
    fn name(&self) -> &'static str {
        "megatron"
    }

    fn framework(&self) -> Framework {
        Framework::Megatron
    }

    fn serves(&self, job: &Job) -> Result<(), String> {
        super::asked_for(job, Framework::Megatron)?;
        fused_adam(job, "Megatron-LM")
    }

    fn build(&self, job: &Job, cx: &Context) -> Result<Built, String> {
        Ok(build(job, cx, false))
    }
}

/// torchtitan where its FSDP2 programs do not serve (no sharding, a mixture of experts, another
/// family): Megatron's accounting of the layers with torchtitan's loss.
pub struct Torchtitan;

impl Builder for Torchtitan {
    fn name(&self) -> &'static str {
        "torchtitan-closed-form"
    }

    fn framework(&self) -> Framework {
        Framework::Torchtitan
    }

    fn serves(&self, job: &Job) -> Result<(), String> {
        super::asked_for(job, Framework::Torchtitan)
    }

    fn build(&self, job: &Job, cx: &Context) -> Result<Built, String> {
        Ok(build(job, cx, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Attention, Optimizer, Precision};
    use crate::parallel::Parallelism;
    use crate::program::Op;
    use crate::replay::{replay, ReplaySettings};
    use headroom_alloc::PolicyName;

    /// A phase's logits laid out as the loss's tensors, each of its width: the backward's fp32
    /// gradients of the logits take the forward's fp32 upcast's block, so the caching allocator
    /// reserves at most the 16-bit logits' block and one fp32 gradient's beyond what the step
    /// allocates. README's ZeRO-3 job, whose backward peaks at the loss: laid out as one block a
    /// phase, the backward's 12 bytes a logit could not reuse the forward's 10 and reserved them
    /// beside it (10 bytes a logit beyond what it allocated).
    #[test]
    fn the_backward_s_gradients_of_the_logits_reuse_the_forward_s_blocks() {
        let m = crate::model::preset("llama-3-8b").unwrap();
        let g = crate::gpu::gpu("h100-sxm").unwrap();
        let cfg = TrainConfig {
            attention: Attention::Flash,
            checkpointing: Checkpointing::Full,
            parallel: Parallelism::data_parallel(8, 3),
            ..TrainConfig::new(1, 8192, Precision::Mixed, Optimizer::AdamW)
        };
        let job = Job::new(&m, &g, cfg).unwrap();
        let stage = closed_form::memory(&job, PipelineStage::Only, true, 0.0);
        let loss = stage.phases.expect("transformers' phases").loss;
        let n = 8192.0 * m.vocab as f64;
        assert_eq!(
            (loss.logits, loss.upcast, loss.log_softmax, loss.gradient, loss.gradient_downcast),
            (2.0 * n, 4.0 * n, 4.0 * n, 4.0 * n, 2.0 * n)
        );
        let p = program(&job.train, &stage, 0.0, m.layers, 1, &[], Device::Gpu(&g));
        let sizes = p.sizes(1, 1);
        let logits: Vec<u64> = p
            .ops
            .iter()
            .filter_map(|op| match *op {
                Op::Alloc(t) if p.tensors[t as usize].term == Term::Logits => Some(sizes[t as usize]),
                _ => None,
            })
            .collect();
        let n = n as u64;
        assert_eq!(logits, [2 * n, 4 * n, 4 * n, 4 * n, 4 * n, 2 * n]);
        let settings = ReplaySettings { capacity: 1 << 40, config: Default::default(), policy: PolicyName::PyTorch };
        let r = replay(&p, &sizes, &settings);
        assert!(
            r.peak_reserved - r.peak_allocated < 6 * n,
            "{} reserved, {} allocated",
            r.peak_reserved,
            r.peak_allocated
        );
    }
}
