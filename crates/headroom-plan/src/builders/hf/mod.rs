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
//!   recorded on CPU as its own template (`sdpa-math`), whose s × s probabilities it keeps.
//!   QLoRA's attention runs in fp32 whatever its compute dtype, and its templates were
//!   recorded with a GPU's rules: over grouped heads (`sdpa-math`) and over heads that are
//!   their own key-value heads (`sdpa`, the memory-efficient kernel), picked by the model's;
//! - dropout keeps a one-byte mask where the CPU keeps its noise in the dropped tensor's dtype;
//! - QLoRA's setup empties the allocator's cache after peft's fp32 casts, as
//!   `prepare_model_for_kbit_training` does where CUDA is available (`kbit_cache.rs`);
//! - cuBLAS takes a workspace inside the first matrix multiply of the forward, after its
//!   output, and another in the backward's first (the autograd engine's thread), kept for
//!   the life of the process;
//! - the token embedding's backward over more than 3,072 tokens sums them by partial segments
//!   in a buffer it frees at once (`embedding_backward.rs`);
//! - under autocast a GPU plans the template recorded under CUDA's autocast policy
//!   (`…/amp-cuda/…`, `headroom_gpu.amp`) where there is one: CUDA runs `softmax`,
//!   `layer_norm`, `pow` and the losses in fp32, where the CPU's autocast keeps a bf16 input's
//!   dtype. Where only the CPU's (`…/amp/…`) was recorded, `pow` is rewritten to fp32: the
//!   tanh GELU of GPT-2's MLP keeps fp32 tensors where the CPU kept bf16 ones
//!   (`autocast.rs`); T5 v1.1's gated GELU is not rewritten so, and without an `amp-cuda`
//!   template its AMP plans the CPU alone (a GPU's job passes to the next builder, saying why).
//!
//! Tied embeddings: a template recorded with an untied head plans a tied model by dropping
//! the head's weight; the head's gradient, made first in the backward, is the shared one,
//! and the embedding's gradient, made last, is added to it. The head's is a view
//! (`TBackward0`'s), which the engine adds out of place (one more table for a moment, both
//! freed) but under autocast, where the weight's cast (`ToCopyBackward0`) makes it anew and
//! the sum is made in place (the CPU's profile of GPT-2's tied embedding: `aten::add` in bf16
//! and fp32; an H200's snapshot of Llama-1B at fp32, docs/VALIDATION.md).
//!
//! A model built on the device (`built_on_device`) makes a tied head's own weight and frees it
//! before the first step (`on_device.rs`).
//!
//! Without dropout (the CPU replay, as the CPU ground truth is measured), dropout's tensors are
//! left out and each dropout's output is its input, kept as long as either lived, where the
//! recording wrote which tensor each dropout consumed (`dropout.rs`).

mod adapters;
mod autocast;
mod dropout;
mod embedding_backward;
pub(crate) mod expander;
mod kbit_cache;
mod loss_life;
mod on_device;
mod quant_state;
mod template_key;

pub use loss_life::loss_holds;
use template_key::attention_fp32;
pub(crate) use template_key::no_sdpa;
pub use template_key::{cache_assumed, cache_matters, cache_recorded, key, math_key, sdpa_math, CacheAssumed};

use expander::Expander;

use super::optimizer::{self, OptimizerParam};
use super::{Builder, Built, Context, Device, ProgramSource, RankProgram, StateScale};
use crate::job::{Attention, Finetune, Framework, Job, Offload, PipelineStage, Precision, TrainConfig};
use crate::model::{Family, Model};
use crate::program::{Law, Phase, Program, TensorId, Term};
use crate::program_template::{self, DecoderLength, EventT, Kernel, Template, EDGE};
use rustc_hash::FxHashMap as HashMap;
use rustc_hash::FxHashSet as HashSet;

/// A concrete layer: (stack, index).
pub(crate) type Concrete = (u8, u32);

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

/// What [`program`] builds.
pub struct HfProgram {
    pub program: Program,
    /// The template it was made from.
    pub key: String,
    /// The most tensors a micro-batch's loss held after its backward: what `loss_lives` keeps.
    pub loss_held: usize,
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
    program_of(model, cfg, device, &key(model, cfg, device)?, steps, scale)
}

/// [`program`] from template `key`, whichever key the job would pick.
pub fn program_of(
    model: &Model,
    cfg: &TrainConfig,
    device: Device,
    key: &str,
    steps: u32,
    scale: &StateScale,
) -> Result<HfProgram, String> {
    let parsed = program_template::template(key).ok_or_else(|| format!("no step `{key}` was recorded"))?;
    let mut t = parsed.resolved(&|u| adapters::unit(model, cfg, u), decoder_length(parsed, cfg, key)?);
    if matches!(cfg.finetune, Finetune::Lora { .. }) {
        adapters::merged_experts_saved(&mut t);
    }
    // A template recorded under CUDA's autocast policy ran its `pow` in fp32 already.
    let cuda_policy = key.split('/').nth(2) == Some(template_key::AMP_CUDA);
    if matches!(device, Device::Gpu(_)) && cfg.precision == Precision::Amp && !cuda_policy {
        autocast::fp32_pow(&mut t);
    }
    if matches!(cfg.finetune, Finetune::Lora { base, .. } if base.four_bit()) && !cfg.double_quant {
        quant_state::without_double_quant(&mut t).map_err(|e| format!("`{key}`: {e}"))?;
    }
    let layers = stack_layers(model);
    let stacks_used = t.tensors.iter().filter_map(|x| x.home).map(|h| h.stack).collect::<Vec<_>>();
    for s in stacks_used {
        if layers[s as usize] < 2 * EDGE {
            return Err("fewer layers a stack than the template keeps at its ends".to_string());
        }
    }
    let ex = Expander::new(&t, layers);
    let mut b = Expansion::new(model, cfg, device, &t, &ex, scale, key);
    b.build(key, steps)?;
    Ok(HfProgram { program: b.p, key: key.to_string(), loss_held: b.loss_held })
}

/// The decoder length template `key` is read at for `cfg`: the job's `--target-seq` where the
/// template was recorded with its decoder at a length of its own; the encoder's where the job's
/// decoder is as long. A template recorded with one length for both stacks wrote each decoder
/// tensor's law in that one length, so it cannot plan a decoder of another: refused, saying so.
fn decoder_length(parsed: &program_template::Parsed, cfg: &TrainConfig, key: &str) -> Result<DecoderLength, String> {
    match cfg.target_seq {
        Some(t) if parsed.decoder_length_apart() => Ok(DecoderLength::Tokens(t as f64)),
        Some(t) if t != cfg.seq => Err(format!(
            "`{key}` was recorded with its decoder as long as its encoder, one length for both stacks, so it \
             cannot plan a decoder of --target-seq {t} apart from --seq {}",
            cfg.seq
        )),
        _ => Ok(DecoderLength::Encoder),
    }
}

/// Why transformers' builders leave CPU offload to DeepSpeed's.
pub(super) const OFFLOAD: &str =
    "CPU offload is planned as DeepSpeed's ZeRO-Offload (--framework deepspeed); FSDP's offload is not modelled";

/// transformers' recorded step as a program builder: one model replica on one GPU, running
/// transformers' code eagerly with full fine-tuning or peft's LoRA (`adapters.rs`) and no or
/// full checkpointing, where the family, precision and attention were recorded.
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
        let k = key(job.model, cfg, Device::Gpu(job.gpu))?;
        if let Some(parsed) = program_template::template(&k) {
            decoder_length(parsed, cfg, &k)?;
        }
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
            source: ProgramSource::Template(hf.key),
            recompute_fraction: crate::closed_form::recompute_fraction(job),
            note: None,
            compiled: false,
        })
    }
}

/// A training step as the CPU the templates were recorded on runs it, from its recorded
/// program: the live peak of a steady step's forward, backward and optimizer step, and of the
/// step (tensors only, as the CPU ground truth measures them), the job's loop keeping its loss
/// as `cfg.loss_lives` says (`measure.py`'s step function returns it as a number: `function`;
/// `record --qlora` keeps it: `inline`). `None` where no template serves the job.
pub fn cpu_peaks(model: &Model, cfg: &TrainConfig) -> Option<(crate::program::PhasePeaks, u64)> {
    cpu_peaks_of(model, cfg, &key(model, cfg, Device::Cpu).ok()?)
}

/// [`cpu_peaks`] of template `key` ([`math_key`]'s, for one): the first steady step's, the last
/// of the program.
pub fn cpu_peaks_of(model: &Model, cfg: &TrainConfig, key: &str) -> Option<(crate::program::PhasePeaks, u64)> {
    let step = loss_life::steady_step(cfg.loss_lives);
    let hf = program_of(model, cfg, Device::Cpu, key, step, &StateScale::default()).ok()?;
    let sizes = hf.program.sizes(cfg.micro_batch, cfg.seq);
    Some(hf.program.step_peaks(&sizes, step))
}

/// Layers of each stack: a decoder's, or T5's decoder and encoder.
pub(crate) fn stack_layers(model: &Model) -> [u32; 2] {
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
    /// Each template site's index in the program, once interned: a layer's every tensor
    /// names a site, and interning by name at each would cost a search of the sites (and a
    /// copy of the name) per allocation.
    sites: Vec<Option<u32>>,
    /// Whether the keys and values are copied once a query head where the recording's
    /// `repeat_kv` copied them ([`repeat_kv_copies`]).
    repeat_kv_copies: bool,
    /// [`HfProgram::loss_held`].
    loss_held: usize,
}

/// Whether a model's attention copies its keys and values once a query head where template
/// `key`'s `repeat_kv` did. With grouped key-value heads `repeat_kv` copies them. With as many
/// key-value heads as heads it returns them, and with one it returns a view (stride 0 across
/// the heads): SDPA's fused kernels take that view as it is, but a matmul (eager attention,
/// SDPA's math path) folds the batch into the heads, which copies the view once the batch is
/// more than one, and saves the copy for the backward as it saved `repeat_kv`'s (the CPU's
/// profile of Gemma 3 on the math path at 2 × 96). Where nothing is copied, what the attention
/// saves is the key or value itself (`TensorT::source`). Under QLoRA a GPU's rules route
/// SDPA, and `repeat_kv`'s output (made where there is a mask) is no longer grouped, so in
/// fp32 it goes to the memory-efficient kernel, not the math path.
fn repeat_kv_copies(model: &Model, cfg: &TrainConfig, key: &str) -> bool {
    let (kv, heads) = (model.kv_heads, model.heads);
    let folded = key.contains("/eager/") || key.contains("/sdpa-math/") && !adapters::qlora(cfg);
    (kv > 1 && kv < heads) || (kv == 1 && heads > 1 && folded && cfg.micro_batch > 1)
}

impl<'a> Expansion<'a> {
    fn new(
        model: &'a Model,
        cfg: &'a TrainConfig,
        device: Device<'a>,
        t: &'a Template,
        ex: &'a Expander<'a>,
        scale: &'a StateScale,
        key: &str,
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
            param_index: HashMap::default(),
            tied,
            setup: HashMap::default(),
            grads: Vec::new(),
            // QLoRA's CPU replay is its fake recording's run (`record --qlora`), dropout and all.
            dropout: has_dropout(model) && (matches!(device, Device::Gpu(_)) || adapters::qlora(cfg)),
            sites: vec![None; t.sites.len()],
            repeat_kv_copies: repeat_kv_copies(model, cfg, key),
            loss_held: 0,
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
        // A fold into batch × heads is a view at a batch of one (`program_template/views.rs`): of
        // a fused query-key-value output, or of SDPA's math path's scaled query.
        let query_fold = self.t.sites.get(x.site as usize).is_some_and(|s| s == "aten::clone");
        if x.batch_view && (crate::job::fuses_qkv(self.model) || query_fold) && self.cfg.micro_batch == 1 {
            return None;
        }
        match x.kernel {
            Kernel::RepeatKv if !self.repeat_kv_copies => None,
            Kernel::Dropout if !self.dropout => None,
            Kernel::DropoutMask if !self.dropout => None,
            // The CPU keeps its noise as recorded, in the dropped tensor's dtype.
            Kernel::DropoutMask if !matches!(self.device, Device::Gpu(_)) => Some(law),
            // Each mask at one byte for each element it covers, whatever the dtype of what it
            // dropped (fp32 embeddings under autocast); the step's activation width where the
            // recording's law reads as no dropped shape.
            Kernel::DropoutMask => {
                Some(x.mask.unwrap_or_else(|| law.scaled(1.0 / activation_bytes(self.cfg.precision))))
            }
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
        let mut emptied = if adapters::qlora(self.cfg) && matches!(self.device, Device::Gpu(_)) {
            kbit_cache::emptied_before(self.t)
        } else {
            None
        };
        for (e, j) in setup {
            if !e.free && emptied == Some(e.tensor) {
                self.p.empty_cache();
                emptied = None;
            }
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
        let embedding = self.t.params.iter().find(|p| is_embedding(&p.name));
        if let (true, true, Some(e)) = (self.cfg.built_on_device, self.model.tied_embeddings, embedding) {
            on_device::tied_head_made_and_freed(&mut self.p, e.law.scaled(self.scale.weights));
        }
        let states = self.optimizer_params();
        // peft makes its adapters fp32 whatever the base's dtype (`autocast_adapter_dtype`), and
        // torch.optim keeps their moments in their own dtype: no fp32 master copy for mixed
        // precision to add, and moments as wide as the recorded parameter.
        let optimizer_cfg = match self.cfg.finetune {
            Finetune::Lora { .. } if self.cfg.precision == Precision::Mixed => {
                TrainConfig { precision: Precision::Bf16, ..*self.cfg }
            }
            _ => *self.cfg,
        };
        let mut opt = optimizer::State::default();
        // What the last loss's graph holds, for as long as the loop keeps the loss (`loss_life`).
        let mut held = Vec::new();
        for step in 1..=steps {
            let section: &[EventT] =
                if step == 1 { self.t.step1.as_deref().unwrap_or(&self.t.step) } else { &self.t.step };
            let backward = self.t.backward[if step == 1 && self.t.step1.is_some() { 0 } else { 1 }];
            for micro in 1..=super::micro_batches_built(self.cfg) {
                held = self.micro_batch(section, backward, step, micro == 1, held);
                self.loss_held = self.loss_held.max(held.len());
                held = loss_life::backward_ended(self.cfg.loss_lives, &mut self.p, held);
            }
            self.p.mark(step, Phase::OptimizerStep);
            let grads: Vec<Option<TensorId>> = std::mem::take(&mut self.grads);
            optimizer::step(&mut self.p, &mut opt, &states, &grads, &optimizer_cfg, self.device);
            // zero_grad(set_to_none=True): every gradient dropped, in parameter order.
            for g in grads.iter().flatten() {
                self.p.free(*g);
            }
            self.grads = vec![None; self.params.len()];
            held = loss_life::step_ended(self.cfg.loss_lives, &mut self.p, held);
        }
        loss_life::loop_ended(&mut self.p, held);
        Ok(())
    }

    fn optimizer_params(&self) -> Vec<OptimizerParam> {
        self.params
            .iter()
            .map(|&(k, _)| OptimizerParam { law: self.t.params[k as usize].law.scaled(self.scale.optimizer) })
            .collect()
    }

    fn site(&mut self, s: u32) -> u32 {
        if let Some(&Some(site)) = self.sites.get(s as usize) {
            return site;
        }
        let site = self.p.site(self.t.sites.get(s as usize).map(String::as_str).unwrap_or(""));
        if let Some(slot) = self.sites.get_mut(s as usize) {
            *slot = Some(site);
        }
        site
    }

    /// One micro-batch's forward and backward. The first micro-batch of a step makes the
    /// gradients; a later one adds its own to them and drops it. `held` is what the previous
    /// micro-batch's loss still holds (the previous step's last, for a step's first, where the
    /// loop keeps its loss: `inline`), dropped when this forward's loss takes its name; returns
    /// what this one's holds.
    fn micro_batch(
        &mut self,
        section: &[EventT],
        backward: usize,
        step: u32,
        first: bool,
        held: Vec<TensorId>,
    ) -> Vec<TensorId> {
        let gpu = matches!(self.device, Device::Gpu(_));
        self.p.mark(step, Phase::Forward);
        // Each thread's cuBLAS workspace is made inside its first matrix multiply, after that
        // multiply's output: the forward's (the loop's thread) and the backward's (the
        // autograd engine's), once for the process.
        let mut workspace_due = gpu && step == 1 && first;
        let (fwd, bwd) = section.split_at(backward.min(section.len()));
        let mut live: HashMap<(u32, Option<Concrete>), TensorId> = HashMap::default();
        let mut passed = dropout::PassedThrough::default();
        // Per layer, the fused SDPA backward's outputs made so far (dq, dk, dv).
        let mut sdpa_grads: HashMap<Option<Concrete>, u32> = HashMap::default();
        let cudnn = self.cudnn_attention();
        for (part, events) in [(Phase::Forward, fwd), (Phase::Backward, bwd)] {
            if part == Phase::Backward {
                for &id in &held {
                    self.p.free(id);
                }
                if workspace_due {
                    self.workspace();
                }
                self.p.mark(step, Phase::Backward);
                workspace_due = gpu && step == 1 && first;
            }
            for (e, j) in self.ex.expand(events) {
                let inst = self.ex.instance(e.tensor, self.t.tensors[e.tensor as usize].home, e.layer, j);
                let (x, layer) = (&self.t.tensors[inst.0 as usize], inst.1);
                if e.free {
                    let Some(inst) = passed.free(inst) else { continue };
                    if let Some(id) = live.remove(&inst).or_else(|| self.setup.remove(&inst)) {
                        self.p.free(id);
                    }
                    continue;
                }
                let Some(law) = self.law(x) else {
                    // A dropout left out, a `repeat_kv` that copies nothing (one key-value
                    // head, or as many as heads) or a reshape that is a view at this batch:
                    // its output is its input, alive as long as either would have been.
                    if let Some(s) = x.source {
                        let input = passed.resolve(self.ex.instance(s, self.t.tensors[s as usize].home, e.layer, j));
                        if live.contains_key(&input) {
                            passed.pass(inst, input);
                        }
                    }
                    continue;
                };
                // A parameter given a new storage inside the step (bitsandbytes' Linear4bit casts
                // its bias to the compute dtype in its first forward) lives on as the setup's
                // tensors do, made once.
                let parameter = x.param.is_some() && x.grad.is_none();
                if parameter && self.setup.contains_key(&inst) {
                    continue;
                }
                let site = self.site(x.site);
                let id = self.p.alloc(law, x.term, site);
                self.p.tensors[id as usize].layer = layer.map(|(stack, n)| self.ex.numbered(stack, n));
                if workspace_due && matrix_multiply(&self.t.sites[x.site as usize]) {
                    self.workspace();
                    workspace_due = false;
                }
                if parameter {
                    self.setup.insert(inst, id);
                    continue;
                }
                // Counted among the backward's own outputs only: under checkpointing the
                // recomputed forward's output and statistics are SDPA's too, and the workspace
                // comes after the third gradient (dv), not the first.
                if cudnn
                    && part == Phase::Backward
                    && x.kernel == Kernel::Sdpa
                    && self.t.sites[x.site as usize].contains("Backward0 > ")
                    && self.t.sites[x.site as usize].contains("ScaledDotProduct")
                {
                    let n = sdpa_grads.entry(layer).or_insert(0);
                    *n += 1;
                    if *n == 3 {
                        self.attention_workspace();
                    }
                }
                if gpu
                    && part == Phase::Backward
                    && self.t.sites[x.site as usize].ends_with("aten::_softmax_backward_data")
                {
                    self.softmax_backward_product(law, x.term, site);
                }
                // T5's shared table is looked up twice, at two lengths: not planned.
                if gpu && x.grad.is_some() && embedding_backward::made_by(&self.t.sites[x.site as usize]) {
                    let tokens = if self.model.family == Family::T5 { 0 } else { self.cfg.micro_batch * self.cfg.seq };
                    embedding_backward::per_segment_sums(&mut self.p, self.model, tokens);
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
        if workspace_due {
            self.workspace();
        }
        // What the recorded step made and never freed is what the loss's graph holds after
        // the backward — under checkpointing, the leaves made to require a gradient (the
        // input embeddings' output, which `enable_input_require_grads` marks for peft; T5's
        // zero position bias) and their `.grad`s: they live as long as the loop keeps its
        // `loss` (`loss_life`; with dropout off, a gradient passed through a dropout the
        // recording never freed is the tensor it consumed). What else is left (a dropout's
        // input whose last free the replay without dropout does not see) goes now, as before;
        // in the order made.
        let freed: HashSet<u32> = section.iter().filter(|e| e.free).map(|e| e.tensor).collect();
        let outlives = |t: u32| !freed.contains(&t);
        let mut left: Vec<(bool, TensorId)> =
            live.into_iter().map(|(inst, id)| (outlives(inst.0) || passed.stands_for(inst, outlives), id)).collect();
        left.sort_unstable_by_key(|&(_, id)| id);
        let mut held = Vec::new();
        for (kept, id) in left {
            if kept {
                held.push(id);
            } else {
                self.p.free(id);
            }
        }
        held
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
                // AccumulateGrad: in place in fp32; 16-bit sums are made anew. The tied head's
                // gradient and the embedding's meet in one backward, the head's first: a view
                // (`TBackward0`'s) the engine adds out of place, but under autocast, where the
                // weight's cast makes it anew (`ToCopyBackward0`).
                let tied = self.tied.and_then(|(_, e)| self.param_index.get(&(e, None)).copied());
                let tied_sum = first_micro_batch && tied == Some(k);
                let fp32 = self.cfg.precision == Precision::Fp32 && !tied_sum;
                if fp32 || self.cfg.precision == Precision::Amp {
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
            && !attention_fp32(self.cfg)
    }

    /// What cuDNN's attention backward takes for a moment once it has made the gradients
    /// of the queries, keys and values: the workspace cuDNN's graph asks for, which PyTorch
    /// allocates as one byte tensor. On an H200 with torch 2.11 (cuDNN 9.19) it is 8 bytes per
    /// token for each query head's dimension, 4 for each query head's softmax statistic, and
    /// 256 bytes beside, whatever the key-value heads: 8 MiB + 32 KiB + 256 for Qwen3-1.7B at
    /// 512 tokens (16 heads over 8, head_dim 128: `../shared/gpu/snapshots/qwen3-1.7b-*`),
    /// 135,266,560 bytes for Llama-1B at 4 × 2048 (32 heads over 8, head_dim 64:
    /// docs/VALIDATION.md, "Llama-1B's checkpointed reserved rows"). Read as fp32 accumulators
    /// of all three gradients, Qwen3's 2:1 grouping fitted (q + 2·kv)·d as well; Llama-1B's
    /// 4:1 does not (101,712,128 bytes), so the keys' and values' share is per query head.
    fn attention_workspace(&mut self) {
        let m = self.model;
        let per_token = 4.0 * (2 * m.heads * m.head_dim + m.heads) as f64;
        let site = self.p.site("cuDNN attention backward workspace");
        let law = Law { fixed: 256.0, ..Law::per_token(per_token) };
        let id = self.p.alloc(law, Term::Activations, site);
        self.p.free(id);
    }

    /// CUDA's softmax backward (`softmax_backward_cuda_out` in PyTorch's
    /// `aten/src/ATen/native/cuda/SoftMax.cu`: `Tensor tmp = grad * output;`) multiplies the
    /// incoming gradient by the softmax's output into a temporary once it has made the
    /// gradient, and frees it when it returns: the math path's probabilities once more for a
    /// moment, per layer (an H200 with torch 2.11, Llama-1B fp32 at 4 × 2048: a third 2 GiB
    /// block after `_softmax_backward_data`'s, freed at once). The CPU's recording holds
    /// none. Planned at the gradient's size, which is the incoming one's but where a half
    /// input's softmax was taken in fp32 (the product is then twice as wide).
    fn softmax_backward_product(&mut self, law: Law, term: Term, site: u32) {
        let id = self.p.alloc(law, term, site);
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

/// Whether a template site is a matrix multiply cuBLAS runs on a GPU (its innermost operator):
/// the first on a thread makes that thread's workspace (`getCurrentCUDABlasHandle` sets it
/// from the caching allocator when `at::cuda::blas` first asks for the handle, after the
/// operator has made its output).
pub(crate) fn matrix_multiply(site: &str) -> bool {
    let leaf = site.rsplit(" > ").next().unwrap_or(site);
    matches!(
        leaf,
        "aten::mm" | "aten::bmm" | "aten::addmm" | "aten::baddbmm" | "aten::addbmm" | "aten::_addmm_activation"
    )
}

pub(crate) fn is_head(name: &str) -> bool {
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
mod tests;
