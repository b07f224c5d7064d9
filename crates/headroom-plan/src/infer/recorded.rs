//! transformers' inference replayed as recorded, tensor by tensor: the inference templates of
//! `data/programs/hf-infer.tpl` ([`crate::program_template`], recorded on CPU by
//! `scripts/validate/infer_programs.py`) expanded to the model's depth as the training
//! templates are ([`crate::builders::hf`]), then laid out as the job runs them: the model and
//! its inputs, the prompt's forward (`generate`'s prefill, or an evaluation loop's forward
//! with every position's logits), and `generate`'s decode steps, each at its own past length,
//! the cache it replaces freed by the step after.
//!
//! The families: Llama, Qwen2, Qwen3, GPT-2, Mistral, Phi-3, Gemma, Gemma-3, GPT-NeoX, Mixtral,
//! Qwen2-MoE and Qwen3-MoE with SDPA (at fp32 too, but Mixtral), and at fp32 on SDPA's math
//! path (`sdpa-math`) each of them whose released models group their key-value heads (all but
//! GPT-2 and GPT-NeoX); BLOOM and Gemma-2 with eager attention, the only one transformers has
//! for them (at bf16 and fp32), and Llama's eager at bf16. A Mixture of Experts runs
//! transformers' default experts implementation, every tensor sized by the tokens times the
//! experts a token takes, whatever the routing. Sliding layers are served within their window
//! only. BERT's masked-LM forward with SDPA at bf16 and fp32: an encoder's inference, no cache.
//! T5, with SDPA (on the memory-efficient kernel, which takes its position bias as a mask) and
//! eager, at bf16 and fp32, its encoder a stack of its own: its evaluation forward, v1.0's
//! (a ReLU MLP, tied) and v1.1's (a gated MLP and an output layer of its own, keys ending
//! `/gated`); and its `generate`: the encoder once over the prompt and the decoder's first step
//! from its start token in the prefill (every tensor sized by the prompt, the decoder's one
//! token fixed), then decode steps at the decoder's past (1 in the first), each tensor sized by
//! one of two lengths, the decoder's past (its self-attention's cache) or the encoder's input
//! (cross-attention's scores and mask), as the template says
//! ([`program_template::TensorT::by_encoder`]);
//! the cross-attention's keys and values, made over the encoder's output in the first decoder
//! step, are kept to the end. T5 v1.1's `generate` too, under keys ending `/gated`: its gated
//! MLP and an output layer of its own, untied as a loaded v1.1 checkpoint's is (transformers 5
//! ties every T5's when it builds one).
//!
//! Over bitsandbytes' 4-bit layers (`--quantize nf4 --double-quant --compute-dtype bf16` over a
//! bf16 load: keys ending `/nf4`; and as `BitsAndBytesConfig(load_in_4bit=True)` loads them by
//! default, `--quantize nf4` or `fp4` alone: keys ending `/nf4-fp32-nodq`), recorded with
//! bitsandbytes' CUDA operators' allocations (`scripts/validate/quant_infer.py`): each layer's
//! weight quantized as it loads (its fp32 absmax kept, or quantized again), the prompt's forward
//! dequantizing each weight into a temporary of the compute dtype (at fp32 each layer's input
//! cast to it and its output back), a decode step on the fused kernel ([`assumed`]).
//!
//! A GPU adds a cuBLAS workspace at the first matrix multiply, kept for the life of the
//! process. SDPA's fused kernels keep what the CPU's fused kernel keeps; fp32 with grouped
//! key-value heads takes SDPA's math path on a GPU, recorded on the CPU by asking for it: the
//! keys and values copied to every query head, and the scores and probabilities of every
//! query against every key.

use super::{InferConfig, Runtime, WeightFormat};
use crate::bnb::{Bnb, ComputeDtype};
use crate::builders::hf::expander::Expander;
use crate::builders::hf::{is_head, matrix_multiply, no_sdpa, stack_layers, Concrete};
use crate::gpu::GpuSpec;
use crate::job::Attention;
use crate::model::{Family, Model};
use crate::model_units::unit;
use crate::program::{Law, Op, Phase, Program, TensorId, Term, PADDED_COLUMNS, PADDED_POSITIONS};
use crate::program_template::{self, DecoderLength, EventT, Template, EDGE};
use crate::recipe::measured_code;
use rustc_hash::FxHashMap as HashMap;

/// Decode steps replayed at most: the first and the last half of them. A step's tensors grow
/// by one position of the cache a step, so the last steps hold the most; the steps between
/// are what the allocator's cache has seen by then, and replaying them all would make a long
/// generation's plan, and the search for its largest batch, cost a replay per token.
pub const REPLAYED_STEPS: u64 = 16;

/// The template serving `cfg` on `model`, or why none does.
pub fn key(model: &Model, cfg: &InferConfig) -> Result<String, &'static str> {
    let Runtime::Transformers { attention, all_logits, .. } = cfg.runtime else {
        return Err("a serving engine sizes its own cache");
    };
    let quant = match cfg.quantize {
        None => "",
        Some(q) => quant_suffix(q, cfg.weights)?,
    };
    // Families without an SDPA path in transformers (BLOOM, Gemma-2) run eager whatever is
    // asked, and were recorded so ([`no_sdpa`]); a family's code shared with another (Gemma-2's
    // with Gemma's) is the other's at the same kernel only.
    let precision = match cfg.weights {
        WeightFormat::Bf16 => "bf16",
        WeightFormat::Fp32 => "fp32",
        _ => return Err("transformers' forward was recorded with fp32 and bf16 weights"),
    };
    // A GPU runs fp32 with grouped key-value heads on SDPA's math path, as training's
    // (`builders::hf::sdpa_math`): no fused kernel takes them, and transformers passes
    // `enable_gqa` where generate's and the forward's mask is none. Recorded so.
    let mode = if all_logits { "forward" } else { "generate" };
    let attn = match attention {
        _ if no_sdpa(model.model_type, mode) => "eager",
        Attention::Eager => "eager",
        Attention::Sdpa | Attention::Flash if precision == "fp32" && model.kv_heads < model.heads => "sdpa-math",
        Attention::Sdpa | Attention::Flash => "sdpa",
    };
    let new_tokens = match cfg.runtime {
        Runtime::Transformers { all_logits: false, new_tokens, .. } => new_tokens,
        _ => 1,
    };
    // transformers' cache keeps a window's tokens in the layers that slide, which the templates
    // (recorded without a window) do not: a job that reaches past the window is not theirs.
    if model.sliding_window.is_some_and(|w| cfg.seq + new_tokens - 1 > w) {
        return Err("the cache of a sliding window was not recorded");
    }
    // T5's encoder is a stack of its own, as deep as the template's ends at least.
    if stack_layers(model).iter().any(|&n| n > 0 && n < 2 * EDGE) || stack_layers(model)[0] == 0 {
        return Err("fewer layers than the template keeps at its ends");
    }
    // T5 comes with either MLP: v1.0's one ReLU projection in (t5-base, tied), or v1.1's gated
    // pair (flan-t5, T0, mT5), recorded under keys of their own, as its training templates are.
    let mlp = if model.family == Family::T5 && model.gated_mlp { "/gated" } else { "" };
    let recorded: Vec<String> = [model.model_type, measured_code(model)]
        .iter()
        .map(|family| format!("{family}/{mode}/{precision}/{attn}{mlp}{quant}"))
        .filter(|k| program_template::template(k).is_some())
        .collect();
    if recorded.is_empty() && !mlp.is_empty() {
        return Err("T5's inference was recorded for this job's mode with v1.0's MLP (one ReLU projection in), \
                    and this model's is gated");
    }
    if recorded.is_empty() && !quant.is_empty() {
        return Err(if quant == "/int8" {
            "this family's inference was not recorded with bitsandbytes' LLM.int8() layers for this job's mode"
        } else {
            "this family's inference was not recorded with bitsandbytes' 4-bit layers for this job's mode"
        });
    }
    if recorded.is_empty() {
        return Err(match (family_recorded(model), attn) {
            (true, "eager") => {
                "this family's inference was not recorded with eager attention for this job's mode and precision"
            }
            (true, _) => {
                "this family's inference was not recorded for this job's mode (generate or --all-logits) and precision"
            }
            _ => "this family was not recorded for inference",
        });
    }
    // A template plans the MLP it was recorded with, whatever its key says.
    let recorded: Vec<String> =
        recorded.into_iter().filter(|k| model.family != Family::T5 || gated(k) == model.gated_mlp).collect();
    if recorded.is_empty() {
        return Err("T5's inference was not recorded with this model's MLP");
    }
    // A template recorded with its output layer tied to the embeddings has no head's weight
    // to plan an untied model's with.
    recorded
        .into_iter()
        .find(|k| model.tied_embeddings || has_own_head(k))
        .ok_or("the family was recorded with its output layer tied to the embeddings, and this model's is its own")
}

/// What a template recorded over bitsandbytes' 4-bit layers assumed of its CUDA kernels, which
/// choose by rows (`gemm_4bit` in bitsandbytes/backends/cuda/ops.py, 0.50), for the plan to say.
pub fn assumed(key: &str) -> Option<&'static str> {
    if key.ends_with("/int8") {
        return Some(
            "bitsandbytes' LLM.int8() as recorded: no input column above its 6.0 threshold (the recording's weights \
             and inputs are zeros); a real model's few outlier columns (about 6) add each layer's input columns in the \
             compute dtype and the weight's in fp16, a few bytes a token and a row",
        );
    }
    if key.ends_with(FOUR_BIT_DEFAULTS) {
        return Some(
            "bitsandbytes' gemm_4bit as recorded: each layer's input cast to fp32 and its weight dequantized into an \
             fp32 temporary in the prompt's forward (a GPU's path past 1536 rows; under that its heuristic may pick \
             the fused kernel, for a weight of 4M elements or more up to 512 rows, and the plan is high by one \
             layer's weight in fp32), none in a decode step (the fused kernel, up to 4 sequences; past that a GPU \
             may dequantize too: one layer's weight more)",
        );
    }
    key.ends_with("/nf4").then_some(
        "bitsandbytes' gemm_4bit as recorded: each layer's weight dequantized into a bf16 temporary in the \
         prompt's forward (a GPU's path past 1536 rows; under that its heuristic may pick the fused kernel, for a \
         weight of 4M elements or more up to 512 rows, and the plan is high by one layer's weight), none in a \
         decode step (the fused kernel, up to 4 sequences; past that a GPU may dequantize too: one layer's weight \
         more)",
    )
}

/// The last part of the keys recorded over 4-bit layers as `BitsAndBytesConfig(load_in_4bit=True)`
/// loads them by default: no double quantization, fp32 compute.
const FOUR_BIT_DEFAULTS: &str = "/nf4-fp32-nodq";

/// The key's last part for bitsandbytes' layers as `quantize` loads them over `weights`, each over
/// a bf16 load: NF4 (or FP4) with double quantization and bf16 compute (QLoRA's
/// `BitsAndBytesConfig`), or without double quantization at fp32 compute (transformers' defaults),
/// or LLM.int8() (the ones recorded, `scripts/validate/quant_infer.py`); or why no template serves
/// it.
fn quant_suffix(quantize: Bnb, weights: WeightFormat) -> Result<&'static str, &'static str> {
    match quantize {
        Bnb::Int8 if weights != WeightFormat::Bf16 => {
            Err("bitsandbytes' 8-bit layers were recorded over a bf16 load (--weights bf16)")
        }
        Bnb::Int8 => Ok("/int8"),
        // FP4 is NF4's layout with another 16-value code: bitsandbytes 0.50 quantizes, stores and
        // dequantizes both through the same CUDA functions, `quant_type` picking the code
        // (`backends/cuda/ops.py`), so NF4's recording is FP4's tensor for tensor.
        Bnb::FourBit { .. } if weights != WeightFormat::Bf16 => {
            Err("bitsandbytes' 4-bit layers were recorded over a bf16 load (--weights bf16)")
        }
        Bnb::FourBit { double_quant: true, compute: ComputeDtype::Bf16, .. } => Ok("/nf4"),
        Bnb::FourBit { double_quant: false, compute: ComputeDtype::Fp32, .. } => Ok(FOUR_BIT_DEFAULTS),
        Bnb::FourBit { .. } => Err("bitsandbytes' 4-bit layers were recorded as QLoRA loads them (--double-quant on \
             --compute-dtype bf16) and as transformers loads them by default (--double-quant off --compute-dtype fp32), \
             not with this mix"),
    }
}

/// Whether any inference template is `model`'s family's (or the code it shares).
pub fn family_recorded(model: &Model) -> bool {
    let prefixes = [model.model_type, measured_code(model)]
        .into_iter()
        .flat_map(|f| ["generate", "forward"].map(|mode| format!("{f}/{mode}/")))
        .collect::<Vec<_>>();
    program_template::keys().any(|k| prefixes.iter().any(|p| k.starts_with(p.as_str())))
}

/// Whether the template's MLP is gated (T5 v1.1's `wi_0` and `wi_1`).
fn gated(key: &str) -> bool {
    program_template::template(key).is_some_and(|t| t.template.params.iter().any(|p| p.name.contains(".wi_0.")))
}

fn has_own_head(key: &str) -> bool {
    program_template::template(key).is_some_and(|t| t.template.params.iter().any(|p| is_head(&p.name)))
}

/// The past lengths of the decode steps replayed for `new_tokens` tokens after a prompt of
/// `prompt`: every step's up to [`REPLAYED_STEPS`], else the first and the last half of them.
pub fn decode_pasts(prompt: u64, new_tokens: u64) -> Vec<u64> {
    let steps = new_tokens.saturating_sub(1);
    if steps <= REPLAYED_STEPS {
        return (0..steps).map(|i| prompt + i).collect();
    }
    let half = REPLAYED_STEPS / 2;
    (0..half).chain(steps - half..steps).map(|i| prompt + i).collect()
}

/// The decode steps' pasts for `new_tokens` tokens after a prompt of `prompt` with the
/// template `key` ([`decode_pasts`]): the decoder's, which in an encoder-decoder starts from
/// its one start token whatever the prompt.
pub fn generate_pasts(key: &str, prompt: u64, new_tokens: u64) -> Vec<u64> {
    decode_pasts(decoder_input(key, prompt), new_tokens)
}

/// The tokens the template `key`'s first forward feeds its decoder after a prompt of `prompt`:
/// the prompt, but T5's start token alone in its `generate`.
pub fn decoder_input(key: &str, prompt: u64) -> u64 {
    program_template::template(key).and_then(|t| t.template.inference.as_ref()).map_or(prompt, |s| s.first_past(prompt))
}

/// The job's program over a prompt of `prompt` tokens, and the decode steps at `pasts` (none
/// for an evaluation loop's forward; [`generate_pasts`]), on `gpu` where one is given: each
/// tensor's law in the batch alone (its section's length given), so `sizes(batch, 1)` sizes
/// it for any batch.
pub fn program(model: &Model, key: &str, prompt: u64, pasts: &[u64], gpu: Option<&GpuSpec>) -> Program {
    let parsed = program_template::template(key).expect("a key from `key`");
    let t = parsed.resolved(&|u| unit(model, u), DecoderLength::Encoder);
    let ex = Expander::new(&t, stack_layers(model));
    let head = t.params.iter().position(|p| is_head(&p.name)).filter(|_| model.tied_embeddings).map(|h| h as u32);
    let mut r = Replay {
        t: &t,
        ex: &ex,
        prompt,
        p: Program::default(),
        sites: vec![None; t.sites.len()],
        head,
        live: HashMap::default(),
        prev: HashMap::default(),
        cur: HashMap::default(),
        workspace: None,
    };
    let sections = t.inference.as_ref().expect("an inference template");
    r.p.mark(0, Phase::Setup);
    r.section(&t.setup, prompt, false);
    r.p.mark(1, Phase::Forward);
    r.workspace = gpu.map(|g| g.arch.cublas_workspace_bytes());
    if !t.sites.iter().any(|s| matrix_multiply(s)) {
        r.cublas_workspace();
    }
    r.section(&sections.prefill, prompt, false);
    r.cublas_workspace();
    for (i, &past) in pasts.iter().enumerate() {
        r.p.mark(i as u32 + 2, Phase::Forward);
        r.section(if i == 0 { &sections.decode1 } else { &sections.decode }, past, true);
        // What the step before made and this one did not free: none in a recorded step (the
        // recorder checks), dropped here in the order made so nothing outlives its step.
        let mut left: Vec<TensorId> = r.prev.drain().map(|(_, id)| id).collect();
        left.sort_unstable();
        for id in left {
            r.p.free(id);
        }
        r.prev = std::mem::take(&mut r.cur);
    }
    // The job's end: what is left is dropped, in the order made.
    let mut left: Vec<TensorId> = r.live.drain().chain(r.prev.drain()).map(|(_, id)| id).collect();
    left.sort_unstable();
    for id in left {
        r.p.free(id);
    }
    r.p
}

/// `law` at a length of `s`: a law in the batch alone.
fn at_length(law: Law, s: f64) -> Law {
    Law {
        fixed: law.fixed + law.per_position * s + law.per_position_square * s * s,
        per_sequence: law.per_sequence
            + law.per_token * s
            + law.per_token_position * s * s
            + law.per_padded_token * (s / PADDED_POSITIONS).ceil() * PADDED_POSITIONS
            + (law.per_token_padded_position * s + law.per_sequence_padded_position)
                * (s / PADDED_COLUMNS).ceil()
                * PADDED_COLUMNS,
        ..Law::default()
    }
}

/// The live peak from the prompt's forward on: what is alive when it begins (the model, the
/// ids, the mask) plus the highest running sum after, as a measurement that begins at the call
/// sees it (the model's construction before it left out).
pub fn call_peak(p: &Program, sizes: &[u64]) -> u64 {
    let (mut live, mut peak, mut begun) = (0u64, 0u64, false);
    for op in &p.ops {
        match *op {
            Op::Mark { step, .. } if step >= 1 => begun = true,
            Op::Alloc(t) => live += sizes[t as usize],
            Op::Free(t) => live = live.saturating_sub(sizes[t as usize]),
            _ => {}
        }
        if begun {
            peak = peak.max(live);
        }
    }
    peak
}

type Instance = (u32, Option<Concrete>);

struct Replay<'a> {
    t: &'a Template,
    ex: &'a Expander<'a>,
    /// The prompt's length: an encoder-decoder's decode step sizes its cross-attention by it.
    prompt: u64,
    p: Program,
    sites: Vec<Option<u32>>,
    /// The head's weight where the model ties it to the embeddings: not a tensor of its own.
    head: Option<u32>,
    /// What the setup and the prompt's forward made, and is not freed yet.
    live: HashMap<Instance, TensorId>,
    /// What the decode step before made (freed by [`EventT::previous`] events), and this one.
    prev: HashMap<Instance, TensorId>,
    cur: HashMap<Instance, TensorId>,
    /// A GPU's cuBLAS workspace bytes until it is made ([`Replay::cublas_workspace`]).
    workspace: Option<u64>,
}

impl Replay<'_> {
    /// A section's events, its tensors sized at `len` (the prompt, or a decode step's past;
    /// an encoder-decoder's cross-attention in a decode step at the prompt).
    fn section(&mut self, events: &[EventT], len: u64, decode: bool) {
        for (e, j) in self.ex.expand(events) {
            let inst = self.ex.instance(e.tensor, self.t.tensors[e.tensor as usize].home, e.layer, j);
            if e.free {
                let id = if e.previous {
                    self.prev.remove(&inst)
                } else {
                    self.cur.remove(&inst).or_else(|| self.live.remove(&inst))
                };
                if let Some(id) = id {
                    self.p.free(id);
                }
                continue;
            }
            let x = &self.t.tensors[inst.0 as usize];
            if x.param.is_some() && x.param == self.head {
                continue;
            }
            let site = self.site(x.site);
            let len = if decode { x.decode_length(self.prompt, len) } else { len };
            let id = self.p.alloc(at_length(x.law, len as f64), x.term, site);
            self.p.tensors[id as usize].layer = inst.1.map(|(stack, n)| self.ex.numbered(stack, n));
            if decode {
                self.cur.insert(inst, id);
            } else {
                self.live.insert(inst, id);
            }
            if self.workspace.is_some() && matrix_multiply(&self.t.sites[x.site as usize]) {
                self.cublas_workspace();
            }
        }
    }

    /// The cuBLAS workspace, where a GPU's is still to be made: cuBLAS takes it from the caching
    /// allocator inside the first matrix multiply, after that multiply's output. Made at the
    /// forward's start instead, it took the free block the embedding's output takes on a GPU:
    /// Llama-2-7B in NF4 at 4 × 2048 on an H200 put its embedding (64 MiB) in an 86 MiB block the
    /// loading left free and the workspace (32 MiB) in a segment of its own, and the plan, the
    /// other way round, made a 64 MiB segment, which moved every later placement of the prompt's
    /// forward and the decode steps' caches (docs/VALIDATION.md, "QLoRA and NF4 inference on an H200").
    fn cublas_workspace(&mut self) {
        if let Some(bytes) = self.workspace.take() {
            let site = self.p.site("cuBLAS workspace");
            self.p.alloc(Law::fixed(bytes as f64), Term::Workspace, site);
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program_template::check_digest as digest;
    use crate::program_template::SectionCheck;

    /// Every inference template, expanded to the depth the recorder checked it at, reproduces
    /// what the recorder saw there: each event's kind and bytes in order, the live peak, and
    /// every free frees an instance the expansion made (a decode step's of the step before).
    #[test]
    fn inference_templates_expand_as_recorded() {
        let mut checked = 0;
        for key in program_template::keys() {
            let Some(parsed) = program_template::template(key) else { continue };
            let Some(sections) = parsed.template.inference.clone() else { continue };
            let dims = parsed.template.dims.clone();
            let t = parsed.resolved(
                &|u| if u == "one" { 1.0 } else { dims.get(u).copied().unwrap_or(1.0) },
                DecoderLength::Encoder,
            );
            let c = &t.check;
            let ex = Expander::new(&t, [c.layers, c.layers]);
            let (b, s) = (c.batch as f64, c.seq as f64);
            let mut made: HashMap<Instance, i64> = HashMap::default();
            let mut prev: HashMap<Instance, i64> = HashMap::default();
            let past = sections.first_past(c.seq) as f64;
            let parts: [(&str, &[EventT], Option<&SectionCheck>, f64); 4] = [
                ("setup", &t.setup, Some(&c.setup), s),
                ("prefill", &sections.prefill, c.prefill.as_ref(), s),
                ("decode1", &sections.decode1, c.decode1.as_ref(), past),
                ("decode", &sections.decode, c.decode.as_ref(), past + 1.0),
            ];
            for (name, events, want, len) in parts {
                let Some(want) = want else {
                    assert!(events.is_empty(), "{key} {name}: events without a check");
                    continue;
                };
                let decode = name.starts_with("decode");
                let mut cur: HashMap<Instance, i64> = HashMap::default();
                let (mut items, mut live, mut peak, mut n) = (Vec::new(), 0i64, 0i64, 0usize);
                for (e, j) in ex.expand(events) {
                    let inst = ex.instance(e.tensor, t.tensors[e.tensor as usize].home, e.layer, j);
                    let bytes = if e.free {
                        let found = if e.previous {
                            prev.remove(&inst)
                        } else {
                            cur.remove(&inst).or_else(|| made.remove(&inst))
                        };
                        assert!(found.is_some(), "{key} {name}: a free of {inst:?}, which the expansion did not make");
                        found.unwrap_or(0)
                    } else {
                        let x = &t.tensors[inst.0 as usize];
                        let len = if decode { x.decode_length(c.seq, len as u64) as f64 } else { len };
                        let bytes = x.law.bytes(b, len) as i64;
                        if decode {
                            cur.insert(inst, bytes)
                        } else {
                            made.insert(inst, bytes)
                        };
                        bytes
                    };
                    live += if e.free { -bytes } else { bytes };
                    peak = peak.max(live);
                    items.push(if e.free { "f" } else { "a" }.to_string());
                    items.push(bytes.to_string());
                    n += 1;
                }
                if decode {
                    prev = cur;
                }
                assert_eq!(n, want.events, "{key} {name}: events");
                assert_eq!(peak as u64, want.peak, "{key} {name}: peak");
                assert_eq!(digest(&items), want.digest, "{key} {name}: the events in order");
            }
            checked += 1;
        }
        assert!(checked >= 86, "{checked} inference templates checked");
    }

    /// T5's generate: its decoder starts from its one start token, so a decode step is at the
    /// decoder's past whatever the prompt. The last step's self-attention caches (`aten::cat`: a
    /// key and a value a decoder layer, and the generated ids) grow with that past, and not with
    /// the prompt; its cross-attention's scores (`aten::softmax`, every head of every decoder
    /// layer) grow with the prompt, at its length.
    #[test]
    fn t5_decode_steps_are_sized_by_the_decoders_past_and_the_encoders_input() {
        let t5 = crate::model::preset("t5-base").expect("preset");
        let key = "t5/generate/bf16/eager";
        assert_eq!(generate_pasts(key, 512, 4), vec![1, 2, 3]);
        assert_eq!(decoder_input(key, 512), 1);
        assert_eq!(decoder_input("t5/forward/bf16/eager", 512), 512);
        // Bytes made at sites containing `site` in the last decode step, for one sequence.
        let last = |prompt: u64, past: u64, site: &str| {
            let p = program(&t5, key, prompt, &[1, past], None);
            let sizes = p.sizes(1, 1);
            let (mut step, mut bytes) = (0, 0u64);
            for op in &p.ops {
                match *op {
                    Op::Mark { step: s, .. } => step = s,
                    Op::Alloc(t) if step == 3 && p.sites[p.tensors[t as usize].site as usize].contains(site) => {
                        bytes += sizes[t as usize]
                    }
                    _ => {}
                }
            }
            bytes
        };
        let (layers, kv, heads) = (t5.decoder_layers, t5.kv_heads * t5.head_dim, t5.heads);
        // 100 positions more of the past: a key and a value of kv bf16 elements a layer, and
        // 100 more int64 ids.
        assert_eq!(last(512, 199, "aten::cat") - last(512, 99, "aten::cat"), 100 * (layers * 2 * kv * 2 + 8));
        assert_eq!(last(1024, 99, "aten::cat"), last(512, 99, "aten::cat"));
        // 512 positions more of the prompt: a bf16 score a head a layer for each; the
        // self-attention's scores the same.
        assert_eq!(last(1024, 99, "softmax") - last(512, 99, "softmax"), 512 * layers * heads * 2);
        assert_eq!(last(512, 199, "softmax") - last(512, 99, "softmax"), 100 * layers * heads * 2);
    }

    #[test]
    fn a_long_generation_replays_its_first_and_last_steps() {
        assert_eq!(decode_pasts(100, 1), Vec::<u64>::new());
        assert_eq!(decode_pasts(100, 4), vec![100, 101, 102]);
        let long = decode_pasts(100, 1001);
        assert_eq!(long.len() as u64, REPLAYED_STEPS);
        assert_eq!((long[0], long[7], long[8], long[15]), (100, 107, 1092, 1099));
    }
}

#[cfg(test)]
mod quantized {
    use super::*;
    use crate::bnb::{Bnb, ComputeDtype, QuantType};
    use crate::model::preset;

    const NF4: Bnb = Bnb::FourBit { quant_type: QuantType::Nf4, double_quant: true, compute: ComputeDtype::Bf16 };
    const KEY: &str = "llama/generate/bf16/sdpa/nf4";

    fn hf(quantize: Option<Bnb>, weights: WeightFormat) -> InferConfig {
        InferConfig {
            runtime: Runtime::Transformers { attention: Attention::Sdpa, all_logits: false, new_tokens: 4 },
            batch: 1,
            seq: 256,
            weights,
            kv_bytes: 2.0,
            tensor: 1,
            quantize: Some(quantize).flatten(),
        }
    }

    /// Bytes each tensor of `p` takes for one sequence, with its site.
    fn sized(p: &Program) -> Vec<(u64, Term, &str)> {
        p.tensors.iter().zip(p.sizes(1, 1)).map(|(t, b)| (b, t.term, p.sites[t.site as usize].as_str())).collect()
    }

    /// The 4-bit templates serve NF4 (and FP4) over a bf16 load as QLoRA loads it (double
    /// quantization, bf16 compute) and as transformers loads it by default (neither), and every
    /// other bitsandbytes load is left to the closed form with its reason.
    #[test]
    fn four_bit_loads_as_qlora_and_transformers_load_them_are_replayed() {
        let m = preset("llama-3-8b").expect("preset");
        assert_eq!(key(&m, &hf(Some(NF4), WeightFormat::Bf16)).as_deref(), Ok(KEY));
        assert_eq!(key(&m, &hf(None, WeightFormat::Bf16)).as_deref(), Ok("llama/generate/bf16/sdpa"));
        assert_eq!(key(&m, &hf(Some(Bnb::Int8), WeightFormat::Bf16)).as_deref(), Ok("llama/generate/bf16/sdpa/int8"));
        let fp4 = Bnb::FourBit { quant_type: QuantType::Fp4, double_quant: true, compute: ComputeDtype::Bf16 };
        assert_eq!(key(&m, &hf(Some(fp4), WeightFormat::Bf16)).as_deref(), Ok(KEY), "FP4 is NF4's layout");
        for quant_type in [QuantType::Nf4, QuantType::Fp4] {
            let defaults = Bnb::FourBit { quant_type, double_quant: false, compute: ComputeDtype::Fp32 };
            let want = "llama/generate/bf16/sdpa/nf4-fp32-nodq";
            assert_eq!(key(&m, &hf(Some(defaults), WeightFormat::Bf16)).as_deref(), Ok(want), "{quant_type:?}");
            assert!(assumed(want).is_some_and(|a| a.contains("fp32 temporary")));
        }
        let refused = [
            Bnb::FourBit { quant_type: QuantType::Nf4, double_quant: false, compute: ComputeDtype::Bf16 },
            Bnb::FourBit { quant_type: QuantType::Nf4, double_quant: true, compute: ComputeDtype::Fp32 },
            Bnb::FourBit { quant_type: QuantType::Nf4, double_quant: false, compute: ComputeDtype::Fp16 },
        ];
        for q in refused {
            let why = key(&m, &hf(Some(q), WeightFormat::Bf16)).expect_err("not recorded");
            assert!(why.contains("bitsandbytes"), "{q:?}: {why}");
        }
        assert!(key(&m, &hf(Some(NF4), WeightFormat::Fp32)).is_err());
    }

    /// A GPU's cuBLAS workspace comes right after the first matrix multiply's output (the first
    /// layer's query projection, dequantized then multiplied), not before the embedding.
    #[test]
    fn the_workspace_follows_the_first_matrix_multiply() {
        let m = preset("llama-2-7b").expect("preset");
        let h200 = crate::gpu::gpu("h200").expect("gpu");
        let p = program(&m, KEY, 256, &decode_pasts(256, 4), Some(&h200));
        let made = p.alloc_sites();
        let at = made.iter().position(|s| *s == "cuBLAS workspace").expect("a workspace");
        assert!(matrix_multiply(made[at - 1]), "made after {}", made[at - 1]);
        assert!(!made[..at - 1].iter().any(|s| matrix_multiply(s)), "a matrix multiply before the workspace");
        assert_eq!(made.iter().filter(|s| **s == "cuBLAS workspace").count(), 1);
        assert!(made[..at].iter().any(|s| s.contains("embedding")), "the embedding after the workspace");
        let cpu = program(&m, KEY, 256, &decode_pasts(256, 4), None);
        assert!(!cpu.sites.iter().any(|s| s == "cuBLAS workspace"));
    }

    /// Llama-3-8B's weights as the template replays them are bitsandbytes' by its rules
    /// (`quantize_4bit` and `quantize_blockwise` in bitsandbytes 0.50.2's functional.py), by
    /// hand: each of the 7 linear layers of the 32 blocks keeps its packed weight (half a byte
    /// an element), one uint8 absmax a block of 64, an fp32 absmax a block of 256 of those, the
    /// fp32 offset, the 16-entry fp32 NF4 code and its own copy of the 256-entry fp32 dynamic map
    /// (`code.to(A.device, copy=True)`); the embeddings, the head and the norms stay bf16; the
    /// dynamic map itself (1 KiB), and the rotary embedding's two 64-entry fp32 frequency buffers.
    #[test]
    fn the_4bit_weights_are_bitsandbytes_stored_bytes() {
        let m = preset("llama-3-8b").expect("preset");
        let (h, q, kv, f, layers, vocab) = (4096u64, 4096u64, 1024u64, 14336u64, 32u64, 128_256u64);
        let stored = |n: u64| n / 2 + n / 64 + 4 * (n / 64 / 256) + 4 + 16 * 4 + 256 * 4;
        let block = 2 * stored(q * h) + 2 * stored(kv * h) + 3 * stored(f * h) + 2 * h * 2;
        let want = layers * block + 2 * vocab * h * 2 + h * 2 + 256 * 4 + 2 * 64 * 4;
        let p = program(&m, KEY, 256, &[], None);
        let weights: u64 = sized(&p).iter().filter(|(_, t, _)| *t == Term::Weights).map(|(b, _, _)| b).sum();
        assert_eq!(weights, want);
    }

    /// Llama-3-8B's LLM.int8() weights as the template replays them, by bitsandbytes' rules
    /// (`Int8Params._quantize`, `int8_vectorwise_quant`), by hand: each linear layer of the 32
    /// blocks keeps its int8 weight (`CB`, a byte an element) and an fp32 scale a row (`SCB`);
    /// the embeddings, the head and the norms stay bf16; and the rotary embedding's two 64-entry
    /// fp32 frequency buffers.
    #[test]
    fn the_int8_weights_are_bitsandbytes_stored_bytes() {
        let m = preset("llama-3-8b").expect("preset");
        let (h, q, kv, f, layers, vocab) = (4096u64, 4096u64, 1024u64, 14336u64, 32u64, 128_256u64);
        let stored = |k: u64, n: u64| k * n + 4 * n;
        let block = stored(h, q) + 2 * stored(h, kv) + stored(q, h) + 2 * stored(h, f) + stored(f, h) + 2 * h * 2;
        let want = layers * block + 2 * vocab * h * 2 + h * 2 + 2 * 64 * 4;
        let p = program(&m, "llama/generate/bf16/sdpa/int8", 256, &[], None);
        let weights: u64 = sized(&p).iter().filter(|(_, t, _)| *t == Term::Weights).map(|(b, _, _)| b).sum();
        assert_eq!(weights, want);
    }

    /// The prompt's forward dequantizes each layer's weight into a bf16 temporary before its
    /// matmul (the largest an MLP weight, 14336 x 4096 x 2 bytes); a decode step of one token a
    /// sequence runs bitsandbytes' fused kernel, which makes no such temporary.
    #[test]
    fn the_prompt_dequantizes_each_weight_and_a_decode_step_does_not() {
        let m = preset("llama-3-8b").expect("preset");
        let p = program(&m, KEY, 256, &generate_pasts(KEY, 256, 4), None);
        let mlp = 14336 * 4096 * 2;
        let mut step = 0;
        let (mut prompt, mut decode) = (0, 0);
        let sizes = p.sizes(1, 1);
        for op in &p.ops {
            match *op {
                Op::Mark { step: s, .. } => step = s,
                Op::Alloc(t)
                    if sizes[t as usize] == mlp
                        && p.sites[p.tensors[t as usize].site as usize].contains("gemm_4bit") =>
                {
                    if step == 1 {
                        prompt += 1
                    } else if step >= 2 {
                        decode += 1
                    }
                }
                _ => {}
            }
        }
        // Three MLP weights a block (gate, up, down).
        assert_eq!((prompt, decode), (3 * 32, 0));
        let plain = program(&m, "llama/generate/bf16/sdpa", 256, &generate_pasts(KEY, 256, 4), None);
        let peak = |p: &Program| p.live_peak(&p.sizes(1, 1)).bytes;
        let weights =
            |p: &Program| sized(p).iter().filter(|(_, t, _)| *t == Term::Weights).map(|(b, _, _)| b).sum::<u64>();
        // Beyond its weights, the 4-bit model's peak holds a dequantized MLP weight more.
        assert!(peak(&p) - weights(&p) >= peak(&plain) - weights(&plain) + mlp);
    }
}
