//! What a transformers training job allocates and frees, tensor by tensor, as recorded:
//! the program templates of `data/programs/*.tpl`.
//!
//! `scripts/validate/step_programs.py` runs each family's code (per head, precision,
//! attention kernel and checkpointing) on CPU the way a user's script does — the model
//! built, AdamW created, two steps of forward, backward, `opt.step()`, `zero_grad` — at five
//! layers and three shapes, and keeps every allocation and free with the layer it belongs
//! to and the law its size follows in the model's dimensions. A template holds:
//!
//! - `params`: the parameters in `model.parameters()` order, each a product of units
//!   (`q*h`) times a count and its bytes per element, with its layer;
//! - `laws`, `sites`: tables the tensors point into;
//! - `tensors`: `[law, term, site, param, grad, kernel, home]` — what the tensor is a
//!   parameter or gradient of, the kernel it comes from where the GPU's differs (`sdpa`,
//!   `dropout`, `dropout-mask`, `repeat_kv`), and its layer;
//! - `sources`: each dropout's output (forward and backward) and the tensor it consumed,
//!   which a step without dropout keeps in its place (the copies another model or batch gets
//!   as views, `repeat_kv`'s and BLOOM's reshapes, have theirs read from the events: `views`);
//! - `setup`, `step1`, `step`: the events of building the model, of the first step's
//!   forward and backward, and of a later one's (`step1` null when they are alike), each
//!   `kind, tensor, layer` (kind 0 allocates, 1 frees); `backward`: where each step's
//!   backward begins. What a step's loss holds after its backward (under checkpointing with
//!   peft, the input embeddings' leaf and its `.grad`) is made in its section and never freed
//!   there, `step1`'s as `step`'s: the planner frees it where the job's loop lets its loss go
//!   (`builders::hf::loss_life`). Templates recorded before 2026-11-30 leave the first step's
//!   out of `step1`.
//!
//! A layer is `stack × 100 + n` with n in 0..5: the planner keeps the first [`EDGE`] and
//! the last [`EDGE`] layers as recorded and repeats the middle one for every layer between
//! ([`crate::builders::hf`]); `check` is what the recorder saw at seven layers, which that
//! expansion reproduces exactly (tested). The optimizer step is not in the template: the
//! planner makes it for the implementation asked; `optimizer_check` is the recorded AdamW
//! (foreach) step it is tested against.

mod dropout_mask;
pub mod law_ambiguity;
mod unit_law;
mod views;

use crate::program::{Law, Term};
use crate::template_file::{self, Entry};
use rustc_hash::FxHashMap;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;
use unit_law::LawKind;
pub use unit_law::{DecoderLength, UnitLaw};

/// Layers kept as recorded at each end of a stack.
pub const EDGE: u32 = 2;
/// Layers a stack was recorded with.
pub const RECORDED_LAYERS: u32 = 5;

/// A layer of the recording: the stack (0 the main one, 1 T5's encoder) and its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Layer {
    pub stack: u8,
    pub n: u8,
}

impl Layer {
    fn decode(code: i64) -> Option<Layer> {
        (code >= 0).then_some(Layer { stack: (code / 100) as u8, n: (code % 100) as u8 })
    }

    /// Whether this is the middle layer that stands for every layer between the edges.
    pub fn is_middle(self) -> bool {
        (EDGE..RECORDED_LAYERS - EDGE).contains(&(self.n as u32))
    }
}

/// What produced a tensor, where a GPU produces it otherwise than the CPU it was recorded on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Nothing special.
    None,
    /// A fused SDPA kernel's output, statistics or gradients.
    Sdpa,
    /// Dropout's output (or its backward's).
    Dropout,
    /// Dropout's noise, kept for the backward: the dropped tensor's dtype on CPU, one byte an
    /// element on a GPU ([`TensorT::mask`]).
    DropoutMask,
    /// transformers' `repeat_kv` copies of keys and values, made only between one key-value
    /// head (a view) and one per query head (no copy).
    RepeatKv,
}

/// A parameter of the template.
#[derive(Clone, Debug)]
pub struct Param {
    pub name: String,
    pub law: Law,
    pub layer: Option<Layer>,
}

/// A tensor of the template.
#[derive(Clone, Debug)]
pub struct TensorT {
    /// In bytes once [`Parsed::resolved`] gives the units their sizes.
    pub law: Law,
    law_index: usize,
    pub term: Term,
    pub site: u32,
    /// The parameter it is, or is the gradient of.
    pub param: Option<u32>,
    pub grad: Option<u32>,
    pub kernel: Kernel,
    pub home: Option<Layer>,
    /// A dropout's output (its forward's or its backward's): the tensor it consumed, which a
    /// step without dropout passes on in its place (`F.dropout` at a rate of 0 returns its
    /// input; the backward passes the gradient through).
    pub source: Option<u32>,
    /// Made in an encoder-decoder's decode step and sized by the encoder's input (its
    /// cross-attention's scores and mask), not by the decoder's past.
    pub by_encoder: bool,
    /// A query, key or value folded to batch × heads (BLOOM's reshapes and eager attention's
    /// `matmul` of a fused query-key-value output, SDPA's math path's of its scaled query;
    /// [`TensorT::source`] what it copies): a copy at the recording's batches, a view at a batch
    /// of one (`program_template/views.rs`).
    pub batch_view: bool,
    /// A dropout's noise ([`Kernel::DropoutMask`]) as a GPU keeps it, once
    /// [`Parsed::resolved`] sizes it: one byte for each element of what it dropped, whatever
    /// that tensor's dtype (`program_template/dropout_mask.rs`).
    pub mask: Option<Law>,
}

impl TensorT {
    /// The length this tensor, made in a decode step, is sized at: the encoder's input
    /// `prompt`, or the decoder's `past`.
    pub fn decode_length(&self, prompt: u64, past: u64) -> u64 {
        if self.by_encoder {
            prompt
        } else {
            past
        }
    }
}

/// One recorded event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventT {
    pub free: bool,
    pub tensor: u32,
    pub layer: Option<Layer>,
    /// A free of the previous decode step's instance of `tensor` (an inference template's
    /// `decode`: the cache a step replaces was made by the step before).
    pub previous: bool,
}

/// What the recorder saw at [`Check::layers`] layers, for the expansion's test.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct SectionCheck {
    pub events: usize,
    pub peak: u64,
    pub digest: String,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Check {
    pub layers: u32,
    pub batch: u64,
    pub seq: u64,
    /// A sequence-to-sequence template recorded with its decoder at a length of its own: that
    /// length at the check's shape (absent where the decoder was as long as the encoder).
    #[serde(default)]
    pub target_seq: Option<u64>,
    pub setup: SectionCheck,
    /// A training template's steps.
    #[serde(default)]
    pub step1: Option<SectionCheck>,
    #[serde(default)]
    pub step: Option<SectionCheck>,
    /// An inference template's prefill (at `seq`) and decode steps (the first at a past of
    /// `seq`, a later one at `seq + 1`; an encoder-decoder's at a decoder's past of 1 and 2,
    /// its tensors sized by the encoder's input at `seq`).
    #[serde(default)]
    pub prefill: Option<SectionCheck>,
    #[serde(default)]
    pub decode1: Option<SectionCheck>,
    #[serde(default)]
    pub decode: Option<SectionCheck>,
}

/// One optimizer step as recorded: allocations above a few bytes, their bytes, the live peak
/// over where the step began.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub struct OptimizerStep {
    pub allocations: u64,
    pub bytes: u64,
    pub peak: u64,
}

#[derive(Clone, Copy, Debug, Deserialize)]
pub struct OptimizerCheck {
    pub step1: OptimizerStep,
    pub step2: OptimizerStep,
}

/// Each edge layer's tensors matched to the middle layer's: the layers run the same code, so
/// their tensors are made in the same order with the same laws, sites and kinds, except where
/// the first and last layers do more (the last layer's final norm): those are matched by the
/// longest common subsequence of the two layers' tensors, and the rest left unmatched.
/// ([`crate::builders::hf`] needs it: a layer's output is freed by the next layer, naming the
/// recorded layer's tensor, which for a repeated middle layer is the middle layer's.)
fn analogs(tensors_of: &[TensorT]) -> FxHashMap<u32, u32> {
    let mut by_layer: HashMap<Layer, Vec<u32>> = HashMap::new();
    for (i, x) in tensors_of.iter().enumerate() {
        if let Some(h) = x.home {
            by_layer.entry(h).or_default().push(i as u32);
        }
    }
    let same = |a: u32, b: u32| {
        let (x, y) = (&tensors_of[a as usize], &tensors_of[b as usize]);
        x.law_index == y.law_index
            && x.term == y.term
            && x.site == y.site
            && x.kernel == y.kernel
            && x.param.is_some() == y.param.is_some()
            && x.grad.is_some() == y.grad.is_some()
            && x.by_encoder == y.by_encoder
    };
    let mut out = FxHashMap::default();
    for (&layer, tensors) in &by_layer {
        if layer.is_middle() {
            continue;
        }
        let middle = Layer { stack: layer.stack, n: EDGE as u8 };
        let Some(mid) = by_layer.get(&middle) else { continue };
        let (a, b) = (tensors.len(), mid.len());
        // lcs[i][k]: the longest common subsequence of tensors[i..] and mid[k..].
        let mut lcs = vec![vec![0u32; b + 1]; a + 1];
        for i in (0..a).rev() {
            for k in (0..b).rev() {
                lcs[i][k] =
                    if same(tensors[i], mid[k]) { lcs[i + 1][k + 1] + 1 } else { lcs[i + 1][k].max(lcs[i][k + 1]) };
            }
        }
        let (mut i, mut k) = (0, 0);
        while i < a && k < b {
            if same(tensors[i], mid[k]) && lcs[i][k] == lcs[i + 1][k + 1] + 1 {
                out.insert(tensors[i], mid[k]);
                i += 1;
                k += 1;
            } else if lcs[i + 1][k] >= lcs[i][k + 1] {
                i += 1;
            } else {
                k += 1;
            }
        }
    }
    out
}

/// A recorded job.
#[derive(Clone, Debug)]
pub struct Template {
    /// The recording's dimensions, in the units' names.
    pub dims: BTreeMap<String, f64>,
    pub params: Vec<Param>,
    pub sites: Vec<String>,
    pub tensors: Vec<TensorT>,
    pub setup: Vec<EventT>,
    /// `None`: the first step makes what `step` makes.
    pub step1: Option<Vec<EventT>>,
    pub step: Vec<EventT>,
    /// Where the backward begins in `step1` and `step`.
    pub backward: [usize; 2],
    pub check: Check,
    /// A training template's recorded optimizer step.
    pub optimizer_check: Option<OptimizerCheck>,
    /// An inference template's sections (`data/programs/hf-infer.tpl`).
    pub inference: Option<InferenceSections>,
    /// An edge layer's tensor → the middle layer's tensor made in its place: each edge layer's
    /// tensors matched to the middle layer's by the longest common subsequence of their kinds.
    pub analog: FxHashMap<u32, u32>,
}

/// What an inference template records after its setup: the prompt's forward (with
/// `generate`, through its first token), the first decode step (its tensors are `decode`'s,
/// at a past one shorter; it frees what the prefill made) and a later one (its
/// [`EventT::previous`] frees free what the step before it made). A `forward` template
/// (every position's logits) has no decode steps.
#[derive(Clone, Debug, Default)]
pub struct InferenceSections {
    pub prefill: Vec<EventT>,
    pub decode1: Vec<EventT>,
    pub decode: Vec<EventT>,
    /// An encoder-decoder's `generate` (T5's): the encoder runs once over the prompt in the
    /// prefill, its decoder from one start token, so a decode step's past is the decoder's
    /// (1 in the first), and a decode step's tensor [`TensorT::by_encoder`] is sized by the
    /// encoder's input instead.
    pub encoder_decoder: bool,
}

impl InferenceSections {
    /// The decoder's past in the first decode step after a prompt of `prompt` tokens.
    pub fn first_past(&self, prompt: u64) -> u64 {
        if self.encoder_decoder {
            1
        } else {
            prompt
        }
    }
}

#[derive(Deserialize)]
struct Raw {
    dims: BTreeMap<String, f64>,
    params: Vec<(String, String, f64, f64, i64)>,
    laws: Vec<BTreeMap<String, BTreeMap<String, f64>>>,
    sites: Vec<String>,
    tensors: Vec<(usize, usize, u32, i64, i64, String, i64)>,
    setup: Vec<i64>,
    #[serde(default)]
    step1: Option<Vec<i64>>,
    #[serde(default)]
    step: Vec<i64>,
    #[serde(default)]
    backward: (Option<usize>, Option<usize>),
    check: Check,
    #[serde(default)]
    optimizer_check: Option<OptimizerCheck>,
    /// `[dropout's output, the tensor it consumed]`, where the recorder wrote them.
    #[serde(default)]
    sources: Vec<(u32, u32)>,
    #[serde(default)]
    prefill: Option<Vec<i64>>,
    #[serde(default)]
    decode1: Vec<i64>,
    #[serde(default)]
    decode: Vec<i64>,
    /// An encoder-decoder's `generate`: the decode steps' tensors sized by the encoder's input
    /// (present, if empty, for every encoder-decoder's).
    #[serde(default)]
    by_encoder: Option<Vec<u32>>,
}

fn term(code: usize) -> Result<Term, String> {
    Term::ALL.get(code).copied().ok_or_else(|| format!("unknown term {code}"))
}

fn kernel(name: &str) -> Result<Kernel, String> {
    Ok(match name {
        "" => Kernel::None,
        "sdpa" => Kernel::Sdpa,
        "dropout" => Kernel::Dropout,
        "dropout-mask" => Kernel::DropoutMask,
        "repeat_kv" => Kernel::RepeatKv,
        other => return Err(format!("unknown kernel `{other}`")),
    })
}

/// CPU's `aten::dropout` makes its noise with `aten::empty_like`, which profiles as
/// `aten::empty_strided` beneath it, and the recorder's rule for the mask looked at that
/// last operator alone: every template recorded so far tags the noise `dropout`, a GPU plan
/// kept it in the activations' dtype, and GPT-2's fp32 and bf16 steps at 4 × 2048 on an H200
/// were planned 3 and 1 bytes an element of each dropout too high. The noise is the one
/// tensor `aten::dropout` makes with that operator (its output comes of `aten::mul`).
fn mask_of_cpu_dropout(kernel: Kernel, site: &str) -> Kernel {
    match kernel {
        Kernel::Dropout if site == "aten::dropout > aten::empty_strided" => Kernel::DropoutMask,
        other => other,
    }
}

fn events(flat: &[i64], tensors: usize) -> Result<Vec<EventT>, String> {
    if !flat.len().is_multiple_of(3) {
        return Err("a section's length is not a multiple of 3".into());
    }
    flat.chunks(3)
        .map(|c| {
            let t = u32::try_from(c[1]).ok().filter(|&t| (t as usize) < tensors);
            match (c[0], t) {
                (0..=2, Some(tensor)) => {
                    Ok(EventT { free: c[0] != 0, tensor, layer: Layer::decode(c[2]), previous: c[0] == 2 })
                }
                _ => Err(format!("a malformed event {c:?}")),
            }
        })
        .collect()
}

/// A template with its laws in units: resolve them for a model with [`Parsed::resolved`].
pub struct Parsed {
    pub template: Template,
    laws: Vec<UnitLaw>,
    param_laws: Vec<UnitLaw>,
}

impl Parsed {
    fn parse(text: &str) -> Result<Parsed, String> {
        let raw: Raw = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let laws = raw.laws.iter().map(UnitLaw::parse).collect::<Result<Vec<_>, _>>()?;
        let mut param_laws = Vec::new();
        let mut params = Vec::new();
        for (name, units, count, bytes, layer) in &raw.params {
            let mut m = BTreeMap::new();
            m.insert(units.clone(), count * bytes);
            let mut k = BTreeMap::new();
            k.insert("fixed".to_string(), m);
            param_laws.push(UnitLaw::parse(&k)?);
            params.push(Param { name: name.clone(), law: Law::default(), layer: Layer::decode(*layer) });
        }
        let mut tensors = Vec::new();
        for &(law, t, site, param, grad, ref k, home) in &raw.tensors {
            if law >= laws.len() || site as usize >= raw.sites.len() {
                return Err("a tensor points outside the tables".into());
            }
            let index = |v: i64| u32::try_from(v).ok().filter(|&p| (p as usize) < params.len());
            // A parameter and its gradient belong to the parameter's layer, or to none (the
            // embeddings, the head): not to the layer whose backward happened to run last.
            let home = match index(param).or(index(grad)) {
                Some(p) => params[p as usize].layer,
                None => Layer::decode(home),
            };
            tensors.push(TensorT {
                law: Law::default(),
                law_index: law,
                term: term(t)?,
                site,
                param: index(param),
                grad: index(grad),
                kernel: mask_of_cpu_dropout(kernel(k)?, &raw.sites[site as usize]),
                home,
                source: None,
                by_encoder: false,
                batch_view: false,
                mask: None,
            });
        }
        let n = tensors.len();
        for &i in raw.by_encoder.iter().flatten() {
            tensors.get_mut(i as usize).ok_or("a tensor sized by the encoder's input is none")?.by_encoder = true;
        }
        for &(out, input) in &raw.sources {
            if out as usize >= n || input as usize >= n {
                return Err("a dropout's source points outside the tensors".into());
            }
            tensors[out as usize].source = Some(input);
        }
        let step = events(&raw.step, n)?;
        let step1 = raw.step1.as_deref().map(|s| events(s, n)).transpose()?;
        let recorded: Vec<&[EventT]> = step1.as_deref().into_iter().chain([step.as_slice()]).collect();
        views::repeat_kv_sources(&mut tensors, &laws, &recorded);
        views::batch_view_sources(&mut tensors, &laws, &raw.sites, &recorded);
        let analog = analogs(&tensors);
        let inference = match &raw.prefill {
            Some(prefill) => Some(InferenceSections {
                prefill: events(prefill, n)?,
                decode1: events(&raw.decode1, n)?,
                decode: events(&raw.decode, n)?,
                encoder_decoder: raw.by_encoder.is_some(),
            }),
            None => None,
        };
        let backward = [
            raw.backward.0.unwrap_or(step1.as_ref().map_or(step.len(), Vec::len)),
            raw.backward.1.unwrap_or(step.len()),
        ];
        Ok(Parsed {
            template: Template {
                dims: raw.dims,
                params,
                sites: raw.sites,
                tensors,
                setup: events(&raw.setup, n)?,
                step1,
                step,
                backward,
                check: raw.check,
                optimizer_check: raw.optimizer_check,
                inference,
                analog,
            },
            laws,
            param_laws,
        })
    }

    /// The template with every law in bytes for the units `units` gives, its decoder (a
    /// sequence-to-sequence template's) `decoder` long.
    pub fn resolved(&self, units: &dyn Fn(&str) -> f64, decoder: DecoderLength) -> Template {
        let mut t = self.template.clone();
        for x in &mut t.tensors {
            x.law = self.laws[x.law_index].resolve(units, decoder);
            if x.kernel == Kernel::DropoutMask {
                x.mask = dropout_mask::elements(&self.laws[x.law_index], &t.dims).map(|e| e.resolve(units, decoder));
            }
        }
        for (p, law) in t.params.iter_mut().zip(&self.param_laws) {
            p.law = law.resolve(units, decoder);
        }
        t
    }

    /// Whether the template was recorded with its decoder at a length of its own, so that its
    /// laws read the decoder's length apart from the encoder's.
    pub fn decoder_length_apart(&self) -> bool {
        self.template.check.target_seq.is_some() || self.laws.iter().any(UnitLaw::in_target)
    }
}

/// Every bundled template, deflated, by key (`family/head/precision/attention/full|ckpt`, and
/// `/lora-all|lora-qv` for adapters): the files' indexes alone, nothing inflated.
fn bundled() -> &'static BTreeMap<&'static str, Entry> {
    static B: OnceLock<BTreeMap<&'static str, Entry>> = OnceLock::new();
    B.get_or_init(|| {
        let mut all = BTreeMap::new();
        for (name, bytes) in FILES {
            let entries = template_file::index(bytes)
                .unwrap_or_else(|e| panic!("the bundled program templates {name} do not read: {e}"));
            for (key, entry) in entries {
                if all.insert(key, entry).is_some() {
                    panic!("the program template {key} is bundled twice ({name} and another file)");
                }
            }
        }
        all
    })
}

/// FNV-1a over the decimal text of each item followed by `;`, as the recorder digests a
/// template's `check` (its events in order), for the tests that expand templates.
#[cfg(test)]
pub(crate) fn check_digest(items: &[String]) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for x in items {
        for b in x.bytes().chain(std::iter::once(b';')) {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    format!("{h:016x}")
}

/// `hf.tpl`: Llama, Qwen2, Qwen3 and GPT-2; `hf-families.tpl`: the families recorded since
/// (Mistral, Phi-3, Gemma, Gemma-2, GPT-NeoX, BLOOM, Mixtral, Qwen3-MoE), by the same script;
/// `hf-infer.tpl`: inference (`generate` and an evaluation loop's forward, keys
/// `family/generate|forward/precision/attention`), by `scripts/validate/infer_programs.py`;
/// `hf-more.tpl`: BERT, T5, Qwen2-MoE, Gemma 3, and eager attention for families recorded
/// with SDPA; `hf-variants.tpl`: the precisions, kernels and checkpointing recorded after
/// those for families they hold (eager attention in bf16 with checkpointing and in fp32, AMP,
/// fp32 with SDPA's math path or fused kernel, checkpointed fp32); `hf-lora.tpl`: peft's LoRA steps (`--lora`), keyed with the adapters'
/// targets; `hf-lora-fp32.tpl`: the fp32 LoRA steps recorded once `hf-lora.tpl` neared 2 MiB
/// (the query and value projections' with each family's own attention); `hf-qlora.tpl`: QLoRA's (`--qlora`, keys ending `/ckpt/qlora-all` and, without
/// checkpointing, `/full/qlora-all`; `/ckpt/qlora-qv` and `/full/qlora-qv` with the adapters on
/// the query and value projections), recorded
/// under fake tensors with CUDA's bitsandbytes rules (`scripts/validate/qlora_programs.py`);
/// `hf-qlora-eager.tpl`: QLoRA's with eager attention asked of families recorded with SDPA,
/// recorded once `hf-qlora.tpl` neared 2 MiB; `hf-lora-eager.tpl`: bf16 LoRA with eager
/// attention asked of families recorded with SDPA; `hf-lora-amp.tpl`: LoRA under AMP
/// (`…/amp-cuda/…/lora-*`, recorded under CUDA's autocast policy); `hf-lora-amp-eager.tpl`:
/// LoRA under AMP with eager attention asked of families recorded with SDPA; `hf-qlora-amp.tpl`:
/// QLoRA under AMP (`…/amp-cuda/…/qlora-*`: bf16 compute, the step under CUDA's autocast
/// policy); `hf-qlora-fp32.tpl`: QLoRA computing in fp32 (`…/fp32/…/qlora-*`); `hf-cache.tpl`:
/// the steps of the families that fuse the query, key and value recorded with the config's
/// `use_cache` on (`…/full/cache`, `…/full/cache/lora-*`; `step_programs.py --use-cache`), every
/// other file's being recorded with it off; `hf-infer-4bit.tpl`: inference over 4-bit layers as
/// transformers loads them by default (`…/nf4-fp32-nodq`: no double quantization, fp32 compute);
/// `hf-t5-sdpa.tpl`: T5's training steps with SDPA (`t5/seq2seq-lm/…/sdpa/…`: full, LoRA and
/// QLoRA, every precision, v1.0 and v1.1), on the memory-efficient kernel a GPU runs for its
/// position bias (recorded on the kernel's CPU stand-in, `scripts/validate/efficient_on_cpu.py`).
const FILES: &[(&str, &[u8])] = &[
    ("hf.tpl", include_bytes!("../../../data/programs/hf.tpl")),
    ("hf-families.tpl", include_bytes!("../../../data/programs/hf-families.tpl")),
    ("hf-infer.tpl", include_bytes!("../../../data/programs/hf-infer.tpl")),
    ("hf-more.tpl", include_bytes!("../../../data/programs/hf-more.tpl")),
    ("hf-variants.tpl", include_bytes!("../../../data/programs/hf-variants.tpl")),
    ("hf-lora.tpl", include_bytes!("../../../data/programs/hf-lora.tpl")),
    ("hf-lora-fp32.tpl", include_bytes!("../../../data/programs/hf-lora-fp32.tpl")),
    ("hf-lora-eager.tpl", include_bytes!("../../../data/programs/hf-lora-eager.tpl")),
    ("hf-qlora.tpl", include_bytes!("../../../data/programs/hf-qlora.tpl")),
    ("hf-lora-amp.tpl", include_bytes!("../../../data/programs/hf-lora-amp.tpl")),
    ("hf-lora-amp-eager.tpl", include_bytes!("../../../data/programs/hf-lora-amp-eager.tpl")),
    ("hf-qlora-eager.tpl", include_bytes!("../../../data/programs/hf-qlora-eager.tpl")),
    ("hf-qlora-amp.tpl", include_bytes!("../../../data/programs/hf-qlora-amp.tpl")),
    ("hf-qlora-fp32.tpl", include_bytes!("../../../data/programs/hf-qlora-fp32.tpl")),
    ("hf-cache.tpl", include_bytes!("../../../data/programs/hf-cache.tpl")),
    ("hf-infer-4bit.tpl", include_bytes!("../../../data/programs/hf-infer-4bit.tpl")),
    ("hf-t5-sdpa.tpl", include_bytes!("../../../data/programs/hf-t5-sdpa.tpl")),
];

/// The template recorded under `key`, parsed (each once per process).
pub fn template(key: &str) -> Option<&'static Parsed> {
    static PARSED: OnceLock<std::sync::Mutex<BTreeMap<String, &'static Parsed>>> = OnceLock::new();
    let cache = PARSED.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = cache.get(key) {
        return Some(p);
    }
    let text = bundled().get(key)?.inflate().unwrap_or_else(|e| panic!("the program template {key} {e}"));
    // A recording that failed is kept with its reason: no template.
    if text.starts_with("{\"error\"") {
        return None;
    }
    let parsed = Parsed::parse(&text).unwrap_or_else(|e| panic!("the program template {key} is malformed: {e}"));
    let leaked: &'static Parsed = Box::leak(Box::new(parsed));
    cache.insert(key.to_string(), leaked);
    Some(leaked)
}

/// Every bundled key, for tests.
pub fn keys() -> impl Iterator<Item = &'static str> {
    bundled().keys().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `data/programs/` holds the bundled files and nothing else: a template file recorded or
    /// merged there in the recorders' text (`.json`) and not packed, or a new file not
    /// listed in [`FILES`], would be left out of every plan.
    #[test]
    fn every_file_of_the_programs_folder_is_bundled() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/programs");
        let mut found: Vec<String> = std::fs::read_dir(&dir)
            .expect("data/programs")
            .map(|e| e.expect("an entry").file_name().to_string_lossy().into_owned())
            .collect();
        found.sort();
        let mut bundled: Vec<String> = FILES.iter().map(|(name, _)| name.to_string()).collect();
        bundled.sort();
        assert_eq!(found, bundled, "pack each with scripts/validate/template_file.py pack IN.json OUT.tpl");
    }

    /// `tok32`: memory-efficient attention's logsumexp, fp32 for each of 12 heads, at the
    /// sizes the QLoRA recorder saw for GPT-2 at 2 × 56, 2 × 88 and 3 × 56 tokens (6,144, 9,216
    /// and 9,216 bytes): each sequence padded to 32 positions, no law in b × s.
    #[test]
    fn a_padded_token_law_rounds_each_sequence_up_to_32_positions() {
        let raw: BTreeMap<String, BTreeMap<String, f64>> =
            serde_json::from_str(r#"{"tok32": {"heads": 4.0}}"#).expect("JSON");
        let law = UnitLaw::parse(&raw)
            .expect("a known kind")
            .resolve(&|u| if u == "heads" { 12.0 } else { 1.0 }, DecoderLength::Encoder);
        let at = |b: u64, s: u64| law.bytes(b as f64, s as f64);
        assert_eq!((at(2, 56), at(2, 88), at(3, 56)), (6144, 9216, 9216));
        assert_eq!((at(1, 32), at(1, 33), at(4, 1024)), (1536, 3072, 196_608));
        assert!(law.grows_with_batch());
    }

    /// What `_safe_softmax` (SDPA's math path) makes to find the rows a mask fills with -inf,
    /// one bool a head: `isneginf` over the scores, `all` over each row.
    const PER_HEAD_BOOLS: [&str; 2] = ["aten::isneginf", "aten::all"];

    /// What makes attention's scores and probabilities: the scores' matmul (eager's, Bloom's
    /// `baddbmm`, SDPA's math path's) and the softmax. A decode step's (b × heads × 1 × past)
    /// grow with the past at a fixed count of bytes a position, as int64 ids do.
    const SCORE_OPS: [&str; 3] = ["aten::bmm", "aten::baddbmm", "aten::_softmax"];
    const SCORE_SITES: [&str; 1] = ["aten::softmax > aten::empty_strided"];

    /// Where `bytes` (a law's `one`, a length's) would be per head if planned so: a whole number
    /// of at least `least` bytes a head.
    fn per_head(bytes: f64, heads: f64, least: f64) -> bool {
        bytes.fract() == 0.0 && bytes % heads == 0.0 && bytes >= least * heads
    }

    /// Each tensor's law read as constant in the heads where what made it says it is per head:
    /// `key: site: kind bytes`.
    fn stale_per_head_laws(key: &str, raw: &serde_json::Value) -> Vec<String> {
        let mut stale = Vec::new();
        let Some(heads) = raw["dims"]["heads"].as_f64().filter(|&h| h > 0.0) else { return stale };
        let laws = raw["laws"].as_array().map(Vec::as_slice).unwrap_or_default();
        let sites = raw["sites"].as_array().map(Vec::as_slice).unwrap_or_default();
        for row in raw["tensors"].as_array().into_iter().flatten() {
            let (Some(law), Some(site)) = (
                row[0].as_u64().and_then(|i| laws.get(i as usize)),
                row[2].as_u64().and_then(|i| sites.get(i as usize)).and_then(|s| s.as_str()),
            ) else {
                stale.push(format!("{key}: a tensor points outside the tables"));
                continue;
            };
            let op = site.rsplit(" > ").next().unwrap_or(site);
            let bool_op = PER_HEAD_BOOLS.contains(&op);
            let scores = SCORE_OPS.contains(&op) || SCORE_SITES.contains(&site);
            for (kind, units) in law.as_object().into_iter().flatten() {
                let Some(per) = units["one"].as_f64() else { continue };
                let pair = kind == "tok_s" || kind == "pos_s";
                let past = kind == "tok" || kind == "pos";
                if (pair && per_head(per, heads, if bool_op { 1.0 } else { 2.0 }))
                    || (bool_op && kind != "fixed" && per_head(per, heads, 1.0))
                    || (scores && past && per_head(per, heads, 2.0))
                {
                    stale.push(format!("{key}: {site}: {kind} {per} bytes at {heads} heads"));
                }
            }
        }
        stale
    }

    /// A tensor of a whole number of at least two bytes a head for each position pair is per
    /// head (an eager attention's scores, T5's position bias), and so is a bool `_safe_softmax`
    /// makes at one byte a head, in every length it grows with, and a decode step's scores and
    /// probabilities (b × heads × 1 × past) at two bytes a head a position: each is planned
    /// with the model's heads. A template read with an older rule (per head only above 16 bytes
    /// a pair; never at one byte a head) would plan them the same whatever the heads: at Llama-3-8B's
    /// 32 heads, the 8 bytes a pair `isneginf` made at the recording's 8 are a quarter of its
    /// size (`scripts/validate/per_head_laws.py` reads them again).
    #[test]
    fn no_template_plans_a_per_head_pair_tensor_whatever_the_heads() {
        let mut stale = std::collections::BTreeSet::new();
        for key in keys() {
            let raw: serde_json::Value =
                serde_json::from_str(&bundled()[key].inflate().expect("inflates")).expect("JSON");
            stale.extend(stale_per_head_laws(key, &raw));
        }
        let stale: Vec<_> = stale.into_iter().collect();
        assert!(stale.is_empty(), "per-head laws read as constants:\n{}", stale.join("\n"));
    }

    /// The test above fails on what the older rules left: `_safe_softmax`'s `isneginf` at one
    /// byte a head (8 bytes a pair at Llama's 8 recorded heads) and its `all` over a decode
    /// step's past, an eager attention's bf16 scores at 16 bytes a pair; and it leaves a mask
    /// (one byte a pair, or Gemma-3's fp32 one at 4 bytes beside 4 heads) alone.
    #[test]
    fn the_per_head_test_fails_on_a_bool_per_head_tensor_planned_per_pair() {
        let raw = serde_json::json!({
            "dims": {"heads": 8.0},
            "laws": [{"tok_s": {"one": 8.0}}, {"tok": {"one": 8.0}, "seq": {"one": 8.0}},
                     {"tok_s": {"one": 16.0}}, {"pos_s": {"one": 1.0}}, {"tok_s": {"heads": 1.0}}],
            "sites": ["aten::scaled_dot_product_attention > aten::isneginf",
                      "aten::scaled_dot_product_attention > aten::all", "aten::softmax", "aten::tril"],
            "tensors": [[0, 3, 0], [1, 3, 1], [2, 3, 2], [3, 3, 3], [4, 3, 0]],
        });
        let stale = stale_per_head_laws("t", &raw);
        assert_eq!(stale.len(), 4, "{stale:?}");
        assert!(stale[0].contains("isneginf: tok_s 8 bytes"), "{stale:?}");
        assert!(stale[1].contains("all: seq 8") || stale[1].contains("all: tok 8"), "{stale:?}");
        assert!(stale[3].contains("softmax: tok_s 16"), "{stale:?}");
        let gemma3 = serde_json::json!({
            "dims": {"heads": 4.0},
            "laws": [{"tok_s": {"one": 4.0}}, {"tok_s": {"heads": 1.0}}],
            "sites": ["aten::scaled_dot_product_attention > aten::where",
                      "aten::scaled_dot_product_attention > aten::isneginf"],
            "tensors": [[0, 3, 0], [1, 3, 1]],
        });
        assert!(stale_per_head_laws("t", &gemma3).is_empty());
        let shared = serde_json::json!({
            "dims": {"heads": 4.0},
            "laws": [{"tok_s": {"one": 4.0}}],
            "sites": ["aten::scaled_dot_product_attention > aten::where",
                      "aten::scaled_dot_product_attention > aten::isneginf"],
            "tensors": [[0, 3, 0], [0, 3, 1]],
        });
        assert_eq!(stale_per_head_laws("t", &shared).len(), 1);
    }

    /// A decode step's scores and probabilities read as bytes a position (Llama's bf16 over 8
    /// recorded heads: 16 bytes, a quarter of Llama-3-8B's 32 heads) fail the test; int64 ids
    /// of the same 8 or 16 bytes a position, made by `cat`, and a decode step's bf16 mask
    /// (`where`, 2 bytes a position) do not, nor scores already per head, nor an elementwise
    /// operator's output (`to`), whose site int64 tensors share.
    #[test]
    fn the_per_head_test_fails_on_a_decode_steps_scores_planned_per_position() {
        let raw = serde_json::json!({
            "dims": {"heads": 8.0},
            "laws": [{"tok": {"one": 16.0}, "seq": {"one": 16.0}}, {"tok": {"one": 8.0}, "seq": {"one": 8.0}},
                     {"tok": {"one": 2.0}, "seq": {"one": 2.0}}, {"tok": {"heads": 2.0}, "seq": {"heads": 2.0}}],
            "sites": ["aten::matmul > aten::bmm", "aten::baddbmm", "aten::softmax > aten::_softmax",
                      "aten::softmax > aten::empty_strided",
                      "aten::scaled_dot_product_attention > aten::_softmax", "aten::cat", "aten::where",
                      "aten::to > aten::empty_strided"],
            "tensors": [[0, 3, 0], [0, 3, 1], [0, 3, 2], [0, 3, 3], [0, 3, 4], [0, 3, 5], [1, 3, 5],
                        [2, 3, 6], [3, 3, 0], [3, 3, 2], [0, 3, 7]],
        });
        let stale = stale_per_head_laws("t", &raw);
        assert_eq!(stale.len(), 5, "{stale:?}");
        for (i, op) in ["bmm", "baddbmm", "softmax > aten::_softmax", "empty_strided", "_softmax"].iter().enumerate() {
            assert!(stale[i].contains(op), "{op}: {stale:?}");
        }
        assert!(stale.iter().all(|s| s.contains(": tok 16 bytes at 8 heads")), "{stale:?}");
        assert!(!stale.iter().any(|s| s.contains("cat") || s.contains("where") || s.contains("aten::to")), "{stale:?}");
    }
}
