//! transformers' training job as a program: its recorded template
//! ([`crate::program_template`]) expanded to the model's depth and shape, with what a GPU
//! does otherwise than the CPU it was recorded on.
//!
//! Expansion: a template keeps the first [`EDGE`] and last [`EDGE`] layers of each stack as
//! recorded and repeats the middle layer's events for every layer between, ascending in
//! the forward and descending in the backward. An event touches a tensor of its own layer
//! or of one up to [`EDGE`] layers away (relative: transformers frees a layer's output two
//! layers later), or of a layer farther away (the recorded layer stands for its own). Where
//! the layer an event reaches is a replica of the middle one, the tensor it names is the
//! middle layer's in the recorded layer's place (`Template::analog`).
//!
//! On a GPU ([`Device::Gpu`]):
//! - SDPA runs the kernel PyTorch picks for the dtype and head layout
//!   (research/sdpa-backends.md): a fused kernel keeps what the CPU's fused kernel keeps
//!   (the output and its log-sum-exp); fp32 with grouped key-value heads takes the math path,
//!   recorded on CPU as its own template (`sdpa-math`), whose s × s probabilities it keeps;
//! - dropout keeps a one-byte mask where the CPU keeps its noise in the activations' dtype;
//! - cuBLAS takes a workspace at the first matrix multiply of the forward and another for the
//!   backward's thread, kept for the life of the process.
//! - under autocast, `pow` runs in fp32 (CUDA's autocast lists it, the CPU's does not), so
//!   the tanh GELU of GPT-2's MLP keeps fp32 tensors where the CPU kept bf16 ones
//!   ([`autocast_fp32_pow`]).
//!
//! Tied embeddings: a template recorded with an untied head plans a tied model by dropping
//! the head's weight; the head's gradient, made first in the backward, is the shared one,
//! and the embedding's gradient, made last, is added to it — in place in fp32, out of place
//! in 16 bits (one more table for a moment), as PyTorch's `AccumulateGrad` does.

use super::optimizer::{self, OptimizerParam};
use super::{Builder, Built, Context, Device, RankProgram, StateScale};
use crate::job::{Attention, Checkpointing, Finetune, Framework, Job, Offload, PipelineStage, Precision, TrainConfig};
use crate::model::Head;
use crate::model::{Family, Model};
use crate::program::{Law, Phase, Program, TensorId, Term};
use crate::program_template::{self, unit, EventT, Kernel, Layer, Template, EDGE, RECORDED_LAYERS};
use crate::recipe::{measured_code, measured_precision};
use std::collections::HashMap;

/// A concrete layer: (stack, index).
type Concrete = (u8, u32);

/// The template key for a job, and whether SDPA takes the math path.
pub fn key(model: &Model, cfg: &TrainConfig, device: Device) -> Result<String, String> {
    if cfg.compile {
        return Err("torch.compile's steps were recorded as moments, not tensor by tensor".to_string());
    }
    if cfg.finetune != crate::job::Finetune::Full {
        return Err("adapters were not recorded tensor by tensor".to_string());
    }
    let precision =
        measured_precision(cfg.precision).ok_or_else(|| "fp8 is not a transformers precision".to_string())?;
    let checkpointed = match cfg.checkpointing {
        Checkpointing::None => false,
        Checkpointing::Full => true,
        _ => return Err("transformers checkpoints whole layers or none".to_string()),
    };
    let head = match cfg.head {
        Head::SeqCls => return Err("no classification step was recorded".to_string()),
        _ if model.family == Family::T5 => "seq2seq-lm",
        Head::MaskedLm => "masked-lm",
        Head::CausalLm if model.generates() => "causal-lm",
        Head::CausalLm => "masked-lm",
    };
    let attention = match cfg.attention {
        Attention::Eager => "eager",
        Attention::Sdpa | Attention::Flash if sdpa_math(model, cfg.precision, device) => "sdpa-math",
        Attention::Sdpa | Attention::Flash => "sdpa",
    };
    let ck = if checkpointed { "ckpt" } else { "full" };
    // A family's own recording where it has one for the job; else the code it shares.
    let families = [program_family(model), measured_code(model)];
    let key = |family: &str, attn: &str| format!("{family}/{head}/{precision}/{attn}/{ck}");
    // Families without an SDPA path in transformers run eager whatever is asked.
    families
        .iter()
        .flat_map(|f| [key(f, attention), key(f, "eager")])
        .find(|k| program_template::template(k).is_some())
        .ok_or_else(|| "this family, precision, attention and checkpointing were not recorded".to_string())
}

/// The transformers code whose recording holds for `model`.
fn program_family(model: &Model) -> &'static str {
    match model.model_type {
        "qwen3" if program_template::keys().any(|k| k.starts_with("qwen3/")) => "qwen3",
        "gemma2" if program_template::keys().any(|k| k.starts_with("gemma2/")) => "gemma2",
        _ => measured_code(model),
    }
}

/// Whether a GPU runs SDPA as its composite math path: no fused kernel takes fp32 with
/// grouped key-value heads (flash and cuDNN need 16 bits; PyTorch 2.11's memory-efficient
/// kernel needs as many key-value heads as heads), and transformers passes `enable_gqa`
/// when there is no mask (research/sdpa-backends.md §1, §3).
pub fn sdpa_math(model: &Model, precision: Precision, device: Device) -> bool {
    matches!(device, Device::Gpu(_)) && precision == Precision::Fp32 && model.kv_heads < model.heads
}

/// Bytes an activation element takes in the job's precision.
fn activation_bytes(p: Precision) -> f64 {
    if p == Precision::Fp32 {
        4.0
    } else {
        2.0
    }
}

/// Whether the model trains with dropout: transformers' GPT-2, BERT and T5 configs default
/// to 0.1; the other families here to 0.
pub fn has_dropout(model: &Model) -> bool {
    matches!(model.family, Family::Gpt2 | Family::Bert | Family::T5)
}

struct Expander<'t> {
    layers: [u32; 2],
    /// An edge layer's tensor → the middle layer's tensor made in its place. A tensor made in
    /// one layer and freed in the next (a layer's output, freed once the next layer's residual
    /// add has used it) is freed by an event of the next layer that names the recorded
    /// previous layer's tensor; where that previous layer is a replica of the middle one, the
    /// tensor it made is the middle layer's, and the event must name that one.
    analog: &'t HashMap<u32, u32>,
}

impl<'t> Expander<'t> {
    fn new(t: &'t Template, layers: [u32; 2]) -> Expander<'t> {
        Expander { layers, analog: &t.analog }
    }

    /// Whether concrete layer `c` of `stack` is a replica of the middle layer.
    fn is_replica(&self, stack: u8, c: u32) -> bool {
        (EDGE..self.layers[stack as usize].saturating_sub(EDGE)).contains(&c)
    }

    fn concrete(&self, n: u8, stack: u8, j: Option<u32>) -> u32 {
        let n = n as u32;
        if n < EDGE {
            n
        } else if n >= RECORDED_LAYERS - EDGE {
            self.layers[stack as usize] - (RECORDED_LAYERS - n)
        } else {
            j.unwrap_or(EDGE)
        }
    }

    /// Which instance of template tensor `tensor`, of home layer `h`, an event at `ctx`
    /// (replica `j` where `ctx` is the middle layer) touches: the tensor made there (the
    /// middle layer's where the layer is one of its replicas) and its concrete layer.
    fn instance(&self, tensor: u32, h: Option<Layer>, ctx: Option<Layer>, j: Option<u32>) -> (u32, Option<Concrete>) {
        let Some(h) = h else { return (tensor, None) };
        let layer = match ctx {
            Some(c) if c.stack == h.stack && (h.n as i64 - c.n as i64).unsigned_abs() <= EDGE as u64 => {
                let here = self.concrete(c.n, c.stack, j) as i64;
                (here + h.n as i64 - c.n as i64) as u32
            }
            _ => self.concrete(h.n, h.stack, None),
        };
        let tensor = match self.analog.get(&tensor) {
            Some(&m) if !h.is_middle() && self.is_replica(h.stack, layer) => m,
            _ => tensor,
        };
        (tensor, Some((h.stack, layer)))
    }

    /// The events of a section expanded: (event, replica of the middle layer).
    fn expand(&self, events: &[EventT]) -> Vec<(EventT, Option<u32>)> {
        let mut out = Vec::with_capacity(events.len() * 2);
        let mut i = 0;
        while i < events.len() {
            let e = events[i];
            let Some(ctx) = e.layer.filter(|l| l.is_middle()) else {
                out.push((e, None));
                i += 1;
                continue;
            };
            let mut end = i;
            while end < events.len() && events[end].layer == Some(ctx) {
                end += 1;
            }
            let outer = |e: &EventT| e.layer.filter(|l| l.stack == ctx.stack && !l.is_middle()).map(|l| l.n);
            let before = events[..i].iter().rev().find_map(outer);
            let after = events[end..].iter().find_map(outer);
            let ascending = match (before, after) {
                (Some(b), _) => b < ctx.n,
                (None, Some(a)) => a > ctx.n,
                (None, None) => true,
            };
            let replicas = EDGE..self.layers[ctx.stack as usize] - EDGE;
            let run = &events[i..end];
            let mut push = |j: u32| out.extend(run.iter().map(|&e| (e, Some(j))));
            if ascending {
                replicas.for_each(&mut push);
            } else {
                replicas.rev().for_each(&mut push);
            }
            i = end;
        }
        out
    }
}

/// What [`program`] builds.
pub struct HfProgram {
    pub program: Program,
    /// The template it was made from.
    pub key: String,
}

/// The job's program: the model built, then `steps` optimizer steps of `cfg.accumulation`
/// micro-batches each, `zero_grad(set_to_none=True)` after each step.
pub fn program(
    model: &Model,
    cfg: &TrainConfig,
    device: Device,
    steps: u32,
    scale: &StateScale,
) -> Result<HfProgram, String> {
    let key = key(model, cfg, device)?;
    let parsed = program_template::template(&key).ok_or_else(|| "not recorded".to_string())?;
    let mut t = parsed.resolved(&|u| unit(model, u));
    if matches!(device, Device::Gpu(_)) && cfg.precision == Precision::Amp {
        autocast_fp32_pow(&mut t);
    }
    let layers = stack_layers(model);
    let stacks_used = t.tensors.iter().filter_map(|x| x.home).map(|h| h.stack).collect::<Vec<_>>();
    for s in stacks_used {
        if layers[s as usize] < 2 * EDGE {
            return Err("fewer layers a stack than the template keeps at its ends".to_string());
        }
    }
    let ex = Expander::new(&t, layers);
    let mut b = Expansion::new(model, cfg, device, &t, &ex, scale);
    b.build(&key, steps)?;
    Ok(HfProgram { program: b.p, key })
}

/// Why transformers' builders leave CPU offload to DeepSpeed's.
pub(super) const OFFLOAD: &str =
    "CPU offload is planned as DeepSpeed's ZeRO-Offload (--framework deepspeed); FSDP's offload is not modelled";

/// transformers' recorded step as a program builder: one model replica on one GPU, running
/// transformers' code eagerly with full fine-tuning and no or full checkpointing, where the
/// family, precision and attention were recorded.
pub struct Recorded;

impl Builder for Recorded {
    fn name(&self) -> &'static str {
        "transformers"
    }

    fn framework(&self) -> Framework {
        Framework::HuggingFace
    }

    fn transformers_code(&self, _job: &Job) -> bool {
        true
    }

    fn serves(&self, job: &Job) -> Result<(), String> {
        super::asked_for(job, Framework::HuggingFace)?;
        let cfg = &job.train;
        if cfg.offload != Offload::None {
            return Err(OFFLOAD.into());
        }
        if cfg.parallel.gpus() > 1 {
            return Err("its recorded step is one GPU's; with more, the phases plan it".into());
        }
        if cfg.finetune != Finetune::Full {
            return Err("adapters were not recorded tensor by tensor".into());
        }
        key(job.model, cfg, Device::Gpu(job.gpu))?;
        let stacks = if job.model.family == Family::T5 { 2 } else { 1 };
        if stack_layers(job.model)[..stacks].iter().any(|&n| n < 2 * EDGE) {
            return Err("fewer layers a stack than the template keeps at its ends".into());
        }
        Ok(())
    }

    fn build(&self, job: &Job, cx: &Context) -> Result<Built, String> {
        let hf = program(job.model, &job.train, cx.device, cx.steps, &StateScale::default())?;
        Ok(Built {
            ranks: vec![RankProgram { program: hf.program, stage: PipelineStage::Only, layout: None }],
            source: Some(hf.key),
            recompute_fraction: crate::closed_form::recompute_fraction(job),
            note: None,
            compiled: false,
        })
    }
}

/// A training step as the CPU the templates were recorded on runs it, from its recorded
/// program: the live peak of a steady step's forward, backward and optimizer step, and of the
/// step (tensors only, as the CPU ground truth measures them). `None` where no template
/// serves the job.
pub fn cpu_peaks(model: &Model, cfg: &TrainConfig) -> Option<(crate::program::PhasePeaks, u64)> {
    let hf = program(model, cfg, Device::Cpu, 2, &StateScale::default()).ok()?;
    let sizes = hf.program.sizes(cfg.micro_batch, cfg.seq);
    Some(hf.program.step_peaks(&sizes, 2))
}

/// Layers of each stack: a decoder's, or T5's decoder and encoder.
fn stack_layers(model: &Model) -> [u32; 2] {
    let encoder = if model.family == Family::T5 { (model.layers - model.decoder_layers) as u32 } else { 0 };
    [model.layers as u32 - encoder, encoder]
}

struct Expansion<'a> {
    model: &'a Model,
    cfg: &'a TrainConfig,
    device: Device<'a>,
    t: &'a Template,
    ex: &'a Expander<'a>,
    scale: &'a StateScale,
    p: Program,
    /// Concrete parameters in `model.parameters()` order: (template param, layer).
    params: Vec<(u32, Option<Concrete>)>,
    param_index: HashMap<(u32, Option<Concrete>), usize>,
    /// The tied head: (the head's template parameter, the embedding's).
    tied: Option<(u32, u32)>,
    setup: HashMap<(u32, Option<Concrete>), TensorId>,
    /// The gradients of the step in progress, by concrete parameter.
    grads: Vec<Option<TensorId>>,
    dropout: bool,
}

impl<'a> Expansion<'a> {
    fn new(
        model: &'a Model,
        cfg: &'a TrainConfig,
        device: Device<'a>,
        t: &'a Template,
        ex: &'a Expander<'a>,
        scale: &'a StateScale,
    ) -> Self {
        let head = t.params.iter().position(|p| is_head(&p.name));
        let embedding = t.params.iter().position(|p| is_embedding(&p.name));
        let tied = match (model.tied_embeddings, head, embedding) {
            (true, Some(h), Some(e)) => Some((h as u32, e as u32)),
            _ => None,
        };
        let mut b = Expansion {
            model,
            cfg,
            device,
            t,
            ex,
            scale,
            p: Program::default(),
            params: Vec::new(),
            param_index: HashMap::new(),
            tied,
            setup: HashMap::new(),
            grads: Vec::new(),
            dropout: has_dropout(model) && matches!(device, Device::Gpu(_)),
        };
        b.expand_params();
        b
    }

    fn expand_params(&mut self) {
        let mut i = 0;
        let ps = &self.t.params;
        while i < ps.len() {
            let Some(l) = ps[i].layer.filter(|l| l.is_middle()) else {
                let layer = ps[i].layer.map(|l| (l.stack, self.ex.concrete(l.n, l.stack, None)));
                if self.tied.is_none_or(|(h, _)| h != i as u32) {
                    self.push_param(i as u32, layer);
                }
                i += 1;
                continue;
            };
            let mut end = i;
            while end < ps.len() && ps[end].layer == Some(l) {
                end += 1;
            }
            for j in EDGE..self.ex.layers[l.stack as usize] - EDGE {
                for k in i..end {
                    self.push_param(k as u32, Some((l.stack, j)));
                }
            }
            i = end;
        }
        self.grads = vec![None; self.params.len()];
    }

    fn push_param(&mut self, k: u32, layer: Option<Concrete>) {
        self.param_index.insert((k, layer), self.params.len());
        self.params.push((k, layer));
    }

    /// A template tensor's law on this device, or `None` where the device makes no such tensor.
    fn law(&self, x: &program_template::TensorT) -> Option<Law> {
        let law = x.law;
        match x.kernel {
            Kernel::RepeatKv if !(self.model.kv_heads > 1 && self.model.kv_heads < self.model.heads) => None,
            Kernel::Dropout if !self.dropout => None,
            Kernel::DropoutMask if !self.dropout => None,
            Kernel::DropoutMask => Some(law.scaled(1.0 / activation_bytes(self.cfg.precision))),
            _ => Some(match x.term {
                Term::Weights => law.scaled(self.scale.weights),
                Term::Gradients => law.scaled(self.scale.gradients),
                _ => law,
            }),
        }
    }

    fn build(&mut self, key: &str, steps: u32) -> Result<(), String> {
        let site = self.p.site(key);
        let _ = site;
        self.p.mark(0, Phase::Setup);
        let setup = self.ex.expand(&self.t.setup);
        for (e, j) in setup {
            let inst = self.ex.instance(e.tensor, self.t.tensors[e.tensor as usize].home, e.layer, j);
            let x = &self.t.tensors[inst.0 as usize];
            if e.free {
                if let Some(id) = self.setup.remove(&inst) {
                    self.p.free(id);
                }
                continue;
            }
            if let (Some(param), Some((head, _))) = (x.param, self.tied) {
                if param == head {
                    continue;
                }
            }
            if let Some(law) = self.law(x) {
                let site = self.site(x.site);
                let id = self.p.alloc(law, x.term, site);
                self.setup.insert(inst, id);
            }
        }
        let states = self.optimizer_params();
        let mut opt = optimizer::State::default();
        for step in 1..=steps {
            let section: &[EventT] =
                if step == 1 { self.t.step1.as_deref().unwrap_or(&self.t.step) } else { &self.t.step };
            let backward = self.t.backward[if step == 1 && self.t.step1.is_some() { 0 } else { 1 }];
            for micro in 1..=self.cfg.accumulation.max(1) {
                self.micro_batch(section, backward, step, micro == 1);
            }
            self.p.mark(step, Phase::Optimizer);
            let grads: Vec<Option<TensorId>> = std::mem::take(&mut self.grads);
            optimizer::step(&mut self.p, &mut opt, &states, &grads, self.cfg, self.device);
            // zero_grad(set_to_none=True): every gradient dropped, in parameter order.
            for g in grads.iter().flatten() {
                self.p.free(*g);
            }
            self.grads = vec![None; self.params.len()];
        }
        Ok(())
    }

    fn optimizer_params(&self) -> Vec<OptimizerParam> {
        self.params
            .iter()
            .map(|&(k, _)| OptimizerParam { law: self.t.params[k as usize].law.scaled(self.scale.optimizer) })
            .collect()
    }

    fn site(&mut self, s: u32) -> u32 {
        let name = self.t.sites.get(s as usize).cloned().unwrap_or_default();
        self.p.site(&name)
    }

    /// One micro-batch's forward and backward. The first micro-batch of a step makes the
    /// gradients; a later one adds its own to them and drops it.
    fn micro_batch(&mut self, section: &[EventT], backward: usize, step: u32, first: bool) {
        let gpu = matches!(self.device, Device::Gpu(_));
        self.p.mark(step, Phase::Forward);
        if gpu && step == 1 && first {
            self.workspace();
        }
        let (fwd, bwd) = section.split_at(backward.min(section.len()));
        let mut live: HashMap<(u32, Option<Concrete>), TensorId> = HashMap::new();
        // Per layer, the fused SDPA backward's outputs made so far (dq, dk, dv).
        let mut sdpa_grads: HashMap<Option<Concrete>, u32> = HashMap::new();
        let cudnn = self.cudnn_attention();
        for (part, events) in [(Phase::Forward, fwd), (Phase::Backward, bwd)] {
            if part == Phase::Backward {
                self.p.mark(step, Phase::Backward);
                if gpu && step == 1 && first {
                    self.workspace();
                }
            }
            for (e, j) in self.ex.expand(events) {
                let inst = self.ex.instance(e.tensor, self.t.tensors[e.tensor as usize].home, e.layer, j);
                let (x, layer) = (&self.t.tensors[inst.0 as usize], inst.1);
                if e.free {
                    if let Some(id) = live.remove(&inst).or_else(|| self.setup.remove(&inst)) {
                        self.p.free(id);
                    }
                    continue;
                }
                let Some(law) = self.law(x) else { continue };
                let site = self.site(x.site);
                let id = self.p.alloc(law, x.term, site);
                if cudnn && part == Phase::Backward && x.kernel == Kernel::Sdpa {
                    let n = sdpa_grads.entry(layer).or_insert(0);
                    *n += 1;
                    if *n == 3 {
                        self.attention_workspace();
                    }
                }
                match x.grad.map(|g| self.param_index.get(&(g, layer)).copied()) {
                    None => {
                        live.insert(inst, id);
                    }
                    // The tied head's gradient is not the head's: the embedding's grows into it.
                    Some(None) if self.tied.is_some_and(|(h, _)| x.grad == Some(h)) => {
                        let (_, e_) = self.tied.expect("tied");
                        let emb = self.param_index.get(&(e_, None)).copied();
                        self.grad(emb, id, law, site, first);
                    }
                    Some(None) => {
                        live.insert(inst, id);
                    }
                    Some(Some(k)) => self.grad(Some(k), id, law, site, first),
                }
            }
        }
        // What the step made and did not free (a template keeps nothing of a step but its
        // gradients): dropped with the step, in the order made.
        let mut left: Vec<TensorId> = live.into_values().collect();
        left.sort_unstable();
        for id in left {
            self.p.free(id);
        }
    }

    /// A gradient made for parameter `k`: kept as its `.grad`, or added to the one kept.
    fn grad(&mut self, k: Option<usize>, id: TensorId, law: Law, site: u32, first_micro_batch: bool) {
        let Some(k) = k else {
            self.p.free(id);
            return;
        };
        match self.grads[k] {
            None if first_micro_batch => self.grads[k] = Some(id),
            None => self.p.free(id),
            Some(kept) => {
                // AccumulateGrad: in place in fp32; 16-bit sums are made anew.
                if self.cfg.precision == Precision::Fp32 || self.cfg.precision == Precision::Amp {
                    self.p.free(id);
                } else {
                    let sum = self.p.alloc(law, Term::Gradients, site);
                    self.p.free(kept);
                    self.p.free(id);
                    self.grads[k] = Some(sum);
                }
            }
        }
    }

    /// Whether SDPA's fused kernel on this GPU is cuDNN's: on Hopper and Blackwell, with
    /// cuDNN 9.15 or later (torch 2.11's wheels), PyTorch tries it first for 16-bit inputs
    /// (research/sdpa-backends.md §1).
    fn cudnn_attention(&self) -> bool {
        matches!(self.device, Device::Gpu(g) if matches!(g.arch, crate::gpu::Arch::Hopper | crate::gpu::Arch::Blackwell))
            && matches!(self.cfg.precision, Precision::Bf16 | Precision::Amp | Precision::Mixed)
            && matches!(self.cfg.attention, Attention::Sdpa | Attention::Flash)
            && !sdpa_math(self.model, self.cfg.precision, self.device)
    }

    /// What cuDNN's attention backward takes for a moment once it has made the gradients
    /// of the queries, keys and values: fp32 accumulators of all three and the softmax
    /// statistics per head (seen on an H200 with torch 2.11: 8 MiB + 32 KiB for Qwen3-1.7B at
    /// 512 tokens, and 256 bytes beside: `../shared/gpu/snapshots/qwen3-1.7b-*`).
    fn attention_workspace(&mut self) {
        let m = self.model;
        let per_token = 4.0 * ((m.heads + 2 * m.kv_heads) * m.head_dim + m.heads) as f64;
        let site = self.p.site("cuDNN attention backward workspace");
        let law = Law { fixed: 256.0, ..Law::per_token(per_token) };
        let id = self.p.alloc(law, Term::Activations, site);
        self.p.free(id);
    }

    /// A cuBLAS workspace: one for the forward's thread, one for the backward's.
    fn workspace(&mut self) {
        if let Device::Gpu(gpu) = self.device {
            let site = self.p.site("cuBLAS workspace");
            self.p.alloc(Law::fixed(gpu.arch.cublas_workspace_bytes() as f64), Term::Workspace, site);
        }
    }
}

/// CUDA's autocast runs `pow` in fp32; the CPU's autocast, which the templates were
/// recorded under, leaves it in bf16 (`pow` is on CUDA's fp32 list, not on the CPU's).
/// transformers' tanh GELU (`NewGELUActivation`, `gelu_new`: GPT-2's MLP),
/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·pow(x, 3))))` of the bf16 output `x` of `c_fc`, then
/// runs in fp32 from the `pow` on: autocast copies `x` to fp32 for the `pow` (kept for its
/// backward in `x`'s place), every product and sum after it is promoted to fp32, the
/// `tanh` and `1 + tanh` kept for the backward take 4 bytes an element, and `c_proj` keeps
/// a bf16 copy of the fp32 result it is given. A layer keeps 16 bytes per token per MLP unit
/// where the recording kept 10 (the fp32 copy of `x`, `tanh` and `1 + tanh` at 4, `0.5·x` and
/// `c_proj`'s copy at 2; against `x`, `0.5·x`, `tanh`, `1 + tanh` and the product at 2): GPT-2
/// medium (4,096 units) at 4 × 2048 tokens, 4.5 GiB more over its 24 layers.
/// The backward runs the chain's gradients in fp32 too, with the casts to each bf16 input's
/// dtype autograd makes. Seen on an H200 with torch 2.11 (`../shared/gpu/snapshots/
/// native-gpt2-medium-b8`: at 8 × 888 tokens a layer's `c_fc` output is 58,195,968 bytes and
/// its GELU keeps three fp32 tensors of 116,391,936 beside the bf16 `0.5·x` and `c_proj`'s
/// bf16 input). Llama's `pow` (RMSNorm's) takes an fp32 input on both devices: no change.
fn autocast_fp32_pow(t: &mut Template) {
    let mut scaled = std::collections::HashSet::new();
    if let Some(step1) = t.step1.take() {
        let (events, bw) = gelu_fp32(t, step1, t.backward[0], &mut scaled);
        t.step1 = Some(events);
        t.backward[0] = bw;
    }
    let step = std::mem::take(&mut t.step);
    let (events, bw) = gelu_fp32(t, step, t.backward[1], &mut scaled);
    t.step = events;
    t.backward[1] = bw;
    if t.step1.is_none() {
        // The first step is the later one's events (read only where `step1` is recorded).
        t.backward[0] = bw;
    }
    for id in scaled {
        let x = &mut t.tensors[id as usize];
        x.law = x.law.scaled(2.0);
    }
}

/// The op a site names: its last part (`… > aten::mul` is `aten::mul`).
fn op(t: &Template, x: u32) -> &str {
    let site = t.sites.get(t.tensors[x as usize].site as usize).map(String::as_str).unwrap_or("");
    site.rsplit(" > ").next().unwrap_or(site)
}

fn site_has(t: &Template, x: u32, what: &str) -> bool {
    t.sites.get(t.tensors[x as usize].site as usize).is_some_and(|s| s.contains(what))
}

/// A new tensor like `like`, with `law` and a site of its own.
fn new_tensor(t: &mut Template, like: u32, law: Law, site: &str) -> u32 {
    let s = match t.sites.iter().position(|x| x == site) {
        Some(s) => s as u32,
        None => {
            t.sites.push(site.to_string());
            (t.sites.len() - 1) as u32
        }
    };
    let mut x = t.tensors[like as usize].clone();
    x.law = law;
    x.site = s;
    x.kernel = Kernel::None;
    x.param = None;
    x.grad = None;
    t.tensors.push(x);
    (t.tensors.len() - 1) as u32
}

/// One section with its tanh GELUs in fp32 ([`autocast_fp32_pow`]): the events, and where
/// its backward now begins.
fn gelu_fp32(
    t: &mut Template,
    ev: Vec<EventT>,
    backward: usize,
    scaled: &mut std::collections::HashSet<u32>,
) -> (Vec<EventT>, usize) {
    let mut before: HashMap<usize, Vec<EventT>> = HashMap::new();
    let mut after: HashMap<usize, Vec<EventT>> = HashMap::new();
    let mut replace: HashMap<usize, EventT> = HashMap::new();
    let alloc = |tensor: u32, layer| EventT { free: false, tensor, layer };
    let free = |tensor: u32, layer| EventT { free: true, tensor, layer };
    let allocs: Vec<usize> = (0..ev.len()).filter(|&i| !ev[i].free).collect();
    let free_of = |x: u32, from: usize| (from..ev.len()).find(|&i| ev[i].free && ev[i].tensor == x);
    for (k, &ip) in allocs.iter().enumerate() {
        // `x` (the matrix multiply's bf16 output), `0.5·x`, `pow(x, 3)`: three allocations in a
        // row of one law, in one layer.
        if k < 2 || op(t, ev[ip].tensor) != "aten::pow" {
            continue;
        }
        let (ia, im, layer) = (allocs[k - 2], allocs[k - 1], ev[ip].layer);
        let (a, m, p) = (ev[ia].tensor, ev[im].tensor, ev[ip].tensor);
        let law = t.tensors[a as usize].law;
        if op(t, a) != "aten::addmm"
            || op(t, m) != "aten::mul"
            || t.tensors[m as usize].law != law
            || t.tensors[p as usize].law != law
            || ev[ia].layer != layer
            || ev[im].layer != layer
        {
            continue;
        }
        // The chain: every allocation of that law from the pow on; then `c_proj`'s weight
        // cast and output.
        let chain: Vec<usize> = allocs[k..]
            .iter()
            .copied()
            .take_while(|&i| t.tensors[ev[i].tensor as usize].law == law && ev[i].layer == layer)
            .collect();
        let (Some(&ig), Some(&iw)) = (chain.last(), allocs.get(k + chain.len())) else { continue };
        if !chain.iter().any(|&i| op(t, ev[i].tensor) == "aten::tanh") {
            continue;
        }
        let Some(&io) = allocs[k + chain.len()..].iter().find(|&&i| op(t, ev[i].tensor) == "aten::addmm") else {
            continue;
        };
        let g = ev[ig].tensor;
        let (Some(fa), Some(fg)) = (free_of(a, ia), free_of(g, ig)) else { continue };
        for &i in &chain {
            scaled.insert(ev[i].tensor);
        }
        // Autocast's fp32 copy of `x` for the pow: kept by the pow's backward where the
        // recording kept `x` (then `x` goes when the MLP's code lets it go, after the GELU),
        // or gone with the pow where nothing keeps it (checkpointing's first forward).
        let x32 = new_tensor(t, a, law.scaled(2.0), "aten::pow > aten::to (autocast's fp32 copy)");
        after.entry(im).or_default().push(alloc(x32, layer));
        let a_held = fa > io;
        if a_held {
            replace.insert(fa, free(x32, ev[fa].layer));
            after.entry(ig).or_default().push(free(a, layer));
        } else {
            after.entry(ip).or_default().push(free(x32, layer));
        }
        // `c_proj`'s bf16 copy of the fp32 GELU: its saved input where the recording kept the
        // GELU's output; the fp32 output goes once `c_proj` has run.
        let g16 = new_tensor(t, g, law, "aten::addmm > aten::to (autocast's bf16 copy)");
        after.entry(iw).or_default().push(alloc(g16, layer));
        let g_held = allocs.iter().any(|&i| i > io && i < fg);
        if g_held {
            replace.insert(fg, free(g16, ev[fg].layer));
            after.entry(io).or_default().push(free(g, layer));
        } else {
            after.entry(io).or_default().push(free(g16, layer));
        }
        if !(a_held && g_held) {
            continue;
        }
        // The backward: from `c_proj`'s input gradient `dG` (bf16), through `G = 0.5x·u`
        // (`dU`, `dM`), `tanh`, the two constant products and the pow, in fp32.
        let Some(idg) = (0..fg).rev().find(|&i| {
            !ev[i].free
                && ev[i].tensor != g
                && t.tensors[ev[i].tensor as usize].law == law
                && op(t, ev[i].tensor) == "aten::mm"
        }) else {
            continue;
        };
        let bwd: Vec<usize> =
            allocs.iter().copied().filter(|&i| i > fg && t.tensors[ev[i].tensor as usize].law == law).take(8).collect();
        let names = [
            "MulBackward0",
            "MulBackward0",
            "TanhBackward0",
            "MulBackward0",
            "MulBackward0",
            "PowBackward0",
            "PowBackward0",
            "PowBackward0",
        ];
        if bwd.len() < 8 || !bwd.iter().zip(names).all(|(&i, n)| site_has(t, ev[i].tensor, n)) {
            continue;
        }
        let dg = ev[idg].tensor;
        let Some(fdg) = free_of(dg, idg) else { continue };
        let [du, dm, tb, s1, s2, p1, p2, p3] = [0, 1, 2, 3, 4, 5, 6, 7].map(|j| bwd[j]);
        let bl = ev[du].layer;
        // dG to fp32 (the backward of `c_proj`'s cast), the bf16 one gone at once.
        let dg32 = new_tensor(
            t,
            dg,
            law.scaled(2.0),
            "autograd::engine::evaluate_function: ToCopyBackward0 > aten::to (fp32 gradient)",
        );
        before.entry(du).or_default().extend([alloc(dg32, bl), free(dg, bl)]);
        replace.insert(fdg, free(dg32, ev[fdg].layer));
        // dM (for the bf16 `0.5·x`) made in fp32 and cast to bf16.
        let dm32 = new_tensor(
            t,
            ev[dm].tensor,
            law.scaled(2.0),
            "autograd::engine::evaluate_function: MulBackward0 > aten::mul (fp32)",
        );
        before.entry(dm).or_default().push(alloc(dm32, bl));
        after.entry(dm).or_default().push(free(dm32, bl));
        // The gradient of `x` through the sum `x + 0.044715·x³`, cast to bf16: the buffer the
        // other two of `x`'s gradients are added into, where the recording used the fp32 one.
        let da = new_tensor(
            t,
            ev[s1].tensor,
            law,
            "autograd::engine::evaluate_function: AddBackward0 > aten::to (bf16 gradient)",
        );
        before.entry(s2).or_default().push(alloc(da, bl));
        after.entry(s2).or_default().push(free(ev[s1].tensor, bl));
        if let Some(fs1) = free_of(ev[s1].tensor, s1) {
            replace.insert(fs1, free(da, ev[fs1].layer));
        }
        // The pow's gradient of `x`, cast to bf16 to be added in.
        if let Some(fp3) = free_of(ev[p3].tensor, p3) {
            let c = new_tensor(
                t,
                ev[p3].tensor,
                law,
                "autograd::engine::evaluate_function: ToCopyBackward0 > aten::to (bf16 gradient)",
            );
            before.entry(fp3).or_default().push(alloc(c, ev[fp3].layer));
            after.entry(fp3).or_default().push(free(c, ev[fp3].layer));
        }
        for i in [du, tb, s1, s2, p1, p2, p3] {
            scaled.insert(ev[i].tensor);
        }
    }
    let mut out = Vec::with_capacity(ev.len() + 16 * before.len().max(after.len()));
    let mut bw = backward;
    for (i, e) in ev.iter().enumerate() {
        if i == backward {
            bw = out.len();
        }
        out.extend(before.remove(&i).unwrap_or_default());
        out.push(replace.remove(&i).unwrap_or(*e));
        out.extend(after.remove(&i).unwrap_or_default());
    }
    if backward >= ev.len() {
        bw = out.len();
    }
    (out, bw)
}

fn is_head(name: &str) -> bool {
    name.starts_with("lm_head.") || name.starts_with("embed_out.")
}

fn is_embedding(name: &str) -> bool {
    name.ends_with("embed_tokens.weight")
        || name.ends_with("wte.weight")
        || name.ends_with("embed_in.weight")
        || name.ends_with("word_embeddings.weight")
        || name.ends_with("shared.weight")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FNV-1a over the decimal text of each item followed by `;`, as the recorder digests.
    fn digest(items: &[String]) -> String {
        let mut h: u64 = 0xcbf29ce484222325;
        for x in items {
            for b in x.bytes().chain(std::iter::once(b';')) {
                h ^= b as u64;
                h = h.wrapping_mul(0x100000001b3);
            }
        }
        format!("{h:016x}")
    }

    /// Under autocast on a GPU, GPT-2's tanh GELU runs in fp32 from its `pow` on: autocast's
    /// fp32 copy of `c_fc`'s output is made once a layer per forward (twice with checkpointing:
    /// the recomputation), at the size the H200 recorded for GPT-2 medium at 8 × 888 tokens
    /// (116,391,936 bytes), and the programs stay well formed; on the CPU, none.
    #[test]
    fn gpt2_autocast_runs_the_tanh_gelu_in_fp32_on_a_gpu() {
        use crate::job::Optimizer;
        use crate::program::Op;
        let model = crate::model::preset("gpt2-medium").expect("preset");
        let h200 = crate::gpu::gpu("h200").expect("gpu");
        for (checkpointing, forwards) in [(Checkpointing::None, 1), (Checkpointing::Full, 2)] {
            let cfg = TrainConfig {
                attention: Attention::Sdpa,
                checkpointing,
                ..TrainConfig::new(8, 888, Precision::Amp, Optimizer::AdamW)
            };
            for (device, copies_per_step) in [(Device::Gpu(&h200), forwards * model.layers as usize), (Device::Cpu, 0)]
            {
                let p = program(&model, &cfg, device, 2, &StateScale::default()).expect("a template serves it").program;
                p.check().expect("well formed");
                let sizes = p.sizes(8, 888);
                let copies: Vec<u64> = p
                    .ops
                    .iter()
                    .filter_map(|op| match op {
                        Op::Alloc(id)
                            if p.sites[p.tensors[*id as usize].site as usize].starts_with("aten::pow > aten::to") =>
                        {
                            Some(sizes[*id as usize])
                        }
                        _ => None,
                    })
                    .collect();
                assert_eq!(copies.len(), 2 * copies_per_step, "{checkpointing:?}");
                assert!(copies.iter().all(|&b| b == 116_391_936), "{copies:?}");
            }
        }
    }

    /// Every template, expanded to the depth the recorder checked it at, reproduces what the
    /// recorder saw at that depth: each event's kind and bytes, in order, and every free
    /// frees a tensor the expansion made (the instance, not only one of the same size: a
    /// free that names no tensor made would leave a layer's output live to the step's end).
    #[test]
    fn program_templates_expand_as_recorded() {
        let mut checked = 0;
        for key in program_template::keys() {
            let Some(parsed) = program_template::template(key) else { continue };
            let dims = parsed.template.dims.clone();
            let t = parsed.resolved(&|u| if u == "one" { 1.0 } else { dims.get(u).copied().unwrap_or(1.0) });
            let c = &t.check;
            let ex = Expander::new(&t, [c.layers, c.layers]);
            // The instances live, across the sections: a step frees what the setup made.
            let mut made: HashMap<(u32, Option<Concrete>), i64> = HashMap::new();
            let sections: [(&str, &[EventT], &program_template::SectionCheck); 3] = [
                ("setup", &t.setup, &c.setup),
                ("step1", t.step1.as_deref().unwrap_or(&t.step), &c.step1),
                ("step", &t.step, &c.step),
            ];
            for (name, events, want) in sections {
                let mut items = Vec::new();
                let (mut live, mut peak, mut n) = (0i64, 0i64, 0usize);
                let (mut by_instance, mut instance_peak) = (0i64, 0i64);
                for (e, j) in ex.expand(events) {
                    let bytes = t.tensors[e.tensor as usize].law.bytes(c.batch as f64, c.seq as f64) as i64;
                    live += if e.free { -bytes } else { bytes };
                    peak = peak.max(live);
                    let inst = ex.instance(e.tensor, t.tensors[e.tensor as usize].home, e.layer, j);
                    if e.free {
                        let b = made.remove(&inst);
                        assert!(b.is_some(), "{key} {name}: a free of {inst:?}, which the expansion did not make");
                        by_instance -= b.unwrap_or(0);
                    } else {
                        made.insert(inst, bytes);
                        by_instance += bytes;
                        instance_peak = instance_peak.max(by_instance);
                    }
                    items.push(if e.free { "f".to_string() } else { "a".to_string() });
                    items.push(bytes.to_string());
                    n += 1;
                }
                assert_eq!(n, want.events, "{key} {name}: events");
                assert_eq!(peak as u64, want.peak, "{key} {name}: peak");
                assert_eq!(instance_peak as u64, want.peak, "{key} {name}: peak, tensor by tensor");
                assert_eq!(digest(&items), want.digest, "{key} {name}: the events in order");
            }
            checked += 1;
        }
        assert!(checked > 0, "no template was checked");
    }
}
