//! Inference memory per GPU, along the planner's spine: the server's own sizing gives the
//! tensors it makes, laid out as a program — the weights, the run that sizes its cache, the
//! KV cache, a step's activations — and replayed through headroom's allocator on what
//! PyTorch can have of the GPU ([`crate::replay`]), so that an inference plan has allocated
//! and reserved memory and a verdict as a training plan has.
//!
//! - vLLM's serving engine (`vllm.rs`, with its budget in [`crate::engine`]): weights at their
//!   storage width, and a KV cache pool sized to fill `gpu_memory_utilization` of the device
//!   after the weights, the peak of its start-up profile run and the memory outside PyTorch
//!   — and how many sequences of a given length that pool holds (grouped-query aware, capped
//!   at a sliding window where the model's layers slide). Tensor parallelism splits the
//!   weights and the KV heads.
//! - SGLang's server (`sglang.rs`, with its share in [`crate::sglang`]): a pool of
//!   `mem_fraction_static` of the free memory at start-up less the weights, one token a slot.
//! - Hugging Face transformers' `generate` (`transformers.rs`): where its code was recorded
//!   tensor by tensor (`recorded.rs`, `data/programs/hf-infer.tpl`), the prompt's forward and
//!   each decode step as recorded, the cache growing a position a step; elsewhere (bitsandbytes'
//!   layers, most families' eager attention, the families not recorded) its peak moment in
//!   closed form: every layer's keys and values, the logits and the temporaries its code
//!   allocates, from
//!   [`crate::forward_recipe`]; with bitsandbytes ([`crate::bnb`]), its linear layers int8 or
//!   4-bit, and the temporaries their forward allocates in the last layer.

pub mod recorded;
mod sglang;
mod transformers;
mod vllm;

use crate::bnb::Bnb;
use crate::engine::Engine;
use crate::forward_recipe::forward_recipe;
use crate::gpu::GpuSpec;
use crate::job::Attention;
use crate::model::{Family, Model};
use crate::program::{Law, Program, TensorId, Term};
use crate::replay::{replay, OutOfMemory, ReplaySettings, Replayed};
use crate::sglang::Sglang;
use headroom_alloc::PolicyName;

/// Storage width of the weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    Fp32,
    Bf16,
    Fp8,
    Int8,
    /// 4-bit with a 16-bit scale per 64 weights (0.25 bit more per weight).
    Int4,
}

crate::names::named!(WeightFormat {
    Fp32 => ("fp32", "transformers' default dtype"),
    Bf16 => ("bf16", ""),
    Fp8 => ("fp8", ""),
    Int8 => ("int8", ""),
    Int4 => ("int4", "with a 16-bit scale per 64 weights"),
});

impl WeightFormat {
    pub fn bytes_per_param(self) -> f64 {
        match self {
            WeightFormat::Fp32 => 4.0,
            WeightFormat::Bf16 => 2.0,
            WeightFormat::Fp8 | WeightFormat::Int8 => 1.0,
            WeightFormat::Int4 => 0.5 + 2.0 / 64.0,
        }
    }

    /// Bytes of `model`'s weights in this format. Quantized checkpoints (fp8, int8, int4)
    /// quantize the linear layers of the blocks and keep the embeddings and the output
    /// layer in 16 bits (vLLM's FP8 and compressed-tensors models, AWQ and GPTQ alike).
    pub fn weight_bytes(self, model: &Model) -> f64 {
        let params = model.params() as f64;
        match self {
            WeightFormat::Fp32 | WeightFormat::Bf16 => params * self.bytes_per_param(),
            _ => {
                let embeddings = model.embedding_params() as f64;
                (params - embeddings) * self.bytes_per_param() + embeddings * 2.0
            }
        }
    }
}

/// Whose code runs the model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Runtime {
    /// vLLM's engine with these settings: a paged cache pool filling what its budget leaves.
    Vllm(Engine),
    /// SGLang's server with this share: a token pool of what the share leaves after the weights.
    Sglang(Sglang),
    /// transformers' forward with a cache, with this attention kernel: fp32 or bf16 weights,
    /// the cache in the weights' dtype; `generate` of `new_tokens` tokens after a prompt of
    /// the configuration's `seq` (its first forward alone at 1) or, with `all_logits`, one
    /// forward keeping every position's logits (an evaluation loop).
    Transformers { attention: Attention, all_logits: bool, new_tokens: u64 },
}

/// What planned an inference job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InferSource {
    /// The serving engine's own sizing of its pool.
    Engine,
    /// transformers' code as recorded tensor by tensor: the template's key.
    Template(String),
    /// transformers' peak moment in closed form, and why no template serves the job.
    ClosedForm(&'static str),
}

/// An inference configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InferConfig {
    pub runtime: Runtime,
    /// Concurrent sequences.
    pub batch: u64,
    /// Tokens per sequence (prompt and output; vLLM's `max_model_len`).
    pub seq: u64,
    pub weights: WeightFormat,
    /// Bytes per K or V element (2 for bf16, 1 for fp8); transformers caches in the weights' dtype.
    pub kv_bytes: f64,
    /// Tensor-parallel GPUs.
    pub tensor: u64,
    /// bitsandbytes quantization of the linear layers (transformers' forward only): `weights`
    /// is then the dtype of what it leaves unquantized and of the activations.
    pub quantize: Option<Bnb>,
}

/// Bytes per GPU by term, and the capacity answer.
#[derive(Clone, Debug, PartialEq)]
pub struct InferEstimate {
    pub weights: f64,
    /// The cache: with transformers, the batch's; with vLLM, the pool it allocates, which
    /// may be negative when nothing is left for it (the engine then refuses to start).
    pub kv_cache: f64,
    /// What the runtime keeps beside the weights, cache and logits at its peak (with
    /// transformers: the ids and the temporaries of the moment; with vLLM: the peak of its
    /// profile run, which the budget sets aside).
    pub activations: f64,
    pub logits: f64,
    /// What lives outside PyTorch's allocator: the CUDA context, and with a serving engine
    /// the memory it uses outside PyTorch.
    pub framework: f64,
    /// What the job takes of the GPU: its reserved memory and what lives outside PyTorch.
    pub per_gpu_bytes: f64,
    /// `torch.cuda.max_memory_reserved()`: the replay's reserved peak.
    pub reserved_bytes: f64,
    /// `torch.cuda.max_memory_allocated()`: the replay's allocated peak (blocks as the
    /// allocator rounds them).
    pub allocated_bytes: f64,
    /// The tensors at the peak, as the program holds them (what a CPU run measures).
    pub tensor_bytes: f64,
    /// The server's own rules let it serve the batch and its replay never ran out of memory.
    pub fits: bool,
    /// The engine would start: its weights, activations and graphs leave it a KV pool (for
    /// vLLM one that holds a sequence of `seq` tokens) and its replay never ran out of
    /// memory; with transformers, the batch fits. A server that starts serves what its pool
    /// holds at once and queues the rest.
    pub starts: bool,
    /// The allocation that ran out of memory, where one did.
    pub oom: Option<OutOfMemory>,
    /// What planned it.
    pub source: InferSource,
    /// Sequences of `seq` tokens the cache holds (with transformers: the largest batch of
    /// `seq` tokens that fits).
    pub max_sequences: u64,
    /// Tokens of KV the same memory holds.
    pub max_tokens: u64,
}

/// The longest sequence of which `cfg.batch` fit (0 if none does), up to `limit` tokens.
pub fn max_seq(model: &Model, gpu: &GpuSpec, cfg: &InferConfig, limit: u64) -> u64 {
    // A length [`check`] refuses (a template-only family's past its sliding window) does not fit.
    crate::estimate::largest(limit, |seq| {
        let c = InferConfig { seq, ..*cfg };
        check(model, &c).is_ok() && verdict(model, gpu, &c).fits
    })
}

/// How much of an estimate to make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sizing {
    /// Everything, the largest batch that fits among it.
    Full,
    /// Whether the job fits, and its figures; not the largest batch (a search of its own).
    Verdict,
}

/// Why a configuration cannot be estimated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    #[error(
        "transformers' forward was measured with fp32 and bf16 weights, not {}: for bitsandbytes' int8 or \
         4-bit linear layers add --quantize int8, nf4 or fp4 to --weights bf16",
        crate::names::Named::name(*.0)
    )]
    Weights(WeightFormat),
    #[error("transformers' forward runs on one GPU here: no tensor parallelism")]
    Tensor,
    #[error(
        "bitsandbytes quantizes transformers' linear layers as it loads them (--framework hf); vLLM and \
         SGLang load checkpoints quantized ahead (--weights int8, int4 or fp8)"
    )]
    QuantizeRuntime,
    #[error(
        "transformers' forward with a cache was measured for decoder-only families (Llama, Mistral, \
         Qwen2, Qwen3, Gemma, Gemma-2, Phi-3, Mixtral, Qwen2-MoE, GPT-2, GPTBigCode, GPT-NeoX, BLOOM); \
         {0} (model_type `{1}`) is none of them: plan it as a serving engine (--framework vllm)"
    )]
    Family(String, &'static str),
    #[error(
        "transformers' inference of {0} (model_type `{1}`) is planned from its recorded template alone, which \
         does not serve this job ({2}): {3}"
    )]
    TemplateOnly(String, &'static str, &'static str, &'static str),
}

/// Checks that `cfg` can be estimated for `model`.
pub fn check(model: &Model, cfg: &InferConfig) -> Result<(), Unsupported> {
    if cfg.quantize.is_some() && !matches!(cfg.runtime, Runtime::Transformers { .. }) {
        return Err(Unsupported::QuantizeRuntime);
    }
    if let Runtime::Transformers { attention, all_logits, .. } = cfg.runtime {
        if !matches!(cfg.weights, WeightFormat::Fp32 | WeightFormat::Bf16) {
            return Err(Unsupported::Weights(cfg.weights));
        }
        if cfg.tensor > 1 {
            return Err(Unsupported::Tensor);
        }
        // Families recorded for inference and never measured for the closed form (Qwen2-MoE)
        // are planned where a template serves, and refused with its reason elsewhere.
        if forward_recipe(model, cfg.weights == WeightFormat::Bf16, attention, all_logits).is_none() {
            return match recorded::key(model, cfg) {
                Ok(_) => Ok(()),
                Err(why) if recorded::family_recorded(model) => {
                    // An encoder has no serving engine to plan instead; T5's forward was recorded.
                    let way_out = match model.family {
                        Family::Bert => {
                            "plan its forward with bf16 or fp32 weights and SDPA attention, or over bitsandbytes' \
                             layers with bf16 weights (--quantize int8; --quantize nf4 or fp4 alone, transformers' \
                             defaults; or with --double-quant --compute-dtype bf16, QLoRA's)"
                        }
                        Family::T5 => {
                            "T5's generate and forward are planned for v1.0's models (a ReLU MLP, the output \
                             layer tied to the embeddings: t5-base, t5-large) and v1.1's (a gated MLP, an output \
                             layer of its own: flan-t5, T0, mT5), with bf16 or fp32 weights, or over bitsandbytes' layers \
                             with bf16 weights (--quantize int8; --quantize nf4 or fp4 alone, transformers' \
                             defaults; or with --double-quant --compute-dtype bf16, QLoRA's)"
                        }
                        _ => "plan it as a serving engine (--framework vllm)",
                    };
                    Err(Unsupported::TemplateOnly(model.name.clone(), model.model_type, why, way_out))
                }
                Err(_) => Err(Unsupported::Family(model.name.clone(), model.model_type)),
            };
        }
    }
    Ok(())
}

/// What a server's rules make of a job before the replay: its terms, whether its pool holds
/// the batch, its capacity answer, and the program of what it allocates (laws fixed at the
/// job's shape).
struct Sized {
    weights: f64,
    kv_cache: f64,
    activations: f64,
    logits: f64,
    /// What lives outside PyTorch's allocator.
    outside: f64,
    /// Whether the server's own rules let it start: a pool, and for vLLM room for one
    /// sequence of its max_model_len.
    starts: bool,
    /// Whether the server's own rules let it serve the batch.
    serves: bool,
    max_sequences: u64,
    max_tokens: u64,
    program: Program,
    source: InferSource,
}

/// A device larger than any job: 1 PiB.
const UNBOUNDED: u64 = 1 << 50;

/// Estimates one configuration ([`check`] it first: a transformers configuration it refuses
/// is estimated as a serving engine): the server's sizing, its program replayed through
/// PyTorch's caching allocator on what PyTorch can have of the GPU.
pub fn estimate(model: &Model, gpu: &GpuSpec, cfg: &InferConfig) -> InferEstimate {
    estimated(model, gpu, cfg, Sizing::Full)
}

/// [`estimate`] without the search for the largest batch (`max_sequences` and `max_tokens`
/// are then 0 with transformers).
pub fn verdict(model: &Model, gpu: &GpuSpec, cfg: &InferConfig) -> InferEstimate {
    estimated(model, gpu, cfg, Sizing::Verdict)
}

/// [`verdict`] from the closed form where transformers' forward has one, whatever template
/// serves the job: the CPU ground truth's plan of a forward whose CPU run took a kernel other
/// than a GPU's (SDPA's fused kernel where a GPU takes the math path).
pub fn closed_form_verdict(model: &Model, gpu: &GpuSpec, cfg: &InferConfig) -> InferEstimate {
    let sized = closed_form(model, gpu, cfg).unwrap_or_else(|| sized(model, gpu, cfg, Sizing::Verdict));
    estimate_of(sized, gpu)
}

fn closed_form(model: &Model, gpu: &GpuSpec, cfg: &InferConfig) -> Option<Sized> {
    let (Runtime::Transformers { attention, all_logits, .. }, WeightFormat::Fp32 | WeightFormat::Bf16) =
        (cfg.runtime, cfg.weights)
    else {
        return None;
    };
    let recipe = forward_recipe(model, cfg.weights == WeightFormat::Bf16, attention, all_logits)?;
    Some(transformers::sized(model, gpu, cfg, recipe, "the closed form asked for", Sizing::Verdict))
}

fn estimated(model: &Model, gpu: &GpuSpec, cfg: &InferConfig, sizing: Sizing) -> InferEstimate {
    estimate_of(sized(model, gpu, cfg, sizing), gpu)
}

fn estimate_of(sized: Sized, gpu: &GpuSpec) -> InferEstimate {
    let capacity = (gpu.memory_bytes as f64 - sized.outside).max(0.0) as u64;
    let mut r = replayed(&sized.program, capacity);
    let oom = r.oom.take();
    if oom.is_some() {
        // What it would need, beside where it ran out.
        r = replayed(&sized.program, UNBOUNDED);
    }
    let tensors = sized.program.live_peak(&sized.program.sizes(1, 1)).bytes;
    InferEstimate {
        weights: sized.weights,
        kv_cache: sized.kv_cache,
        activations: sized.activations,
        logits: sized.logits,
        framework: sized.outside,
        per_gpu_bytes: r.peak_reserved as f64 + sized.outside,
        reserved_bytes: r.peak_reserved as f64,
        allocated_bytes: r.peak_allocated as f64,
        tensor_bytes: tensors as f64,
        fits: sized.serves && oom.is_none(),
        starts: sized.starts && oom.is_none(),
        oom,
        max_sequences: sized.max_sequences,
        max_tokens: sized.max_tokens,
        source: sized.source,
    }
}

fn sized(model: &Model, gpu: &GpuSpec, cfg: &InferConfig, sizing: Sizing) -> Sized {
    if let (Runtime::Transformers { attention, all_logits, .. }, WeightFormat::Fp32 | WeightFormat::Bf16) =
        (cfg.runtime, cfg.weights)
    {
        match recorded::key(model, cfg) {
            Ok(key) => return transformers::replayed_sized(model, gpu, cfg, &key, sizing),
            Err(why) => {
                if let Some(recipe) = forward_recipe(model, cfg.weights == WeightFormat::Bf16, attention, all_logits) {
                    return transformers::sized(model, gpu, cfg, recipe, why, sizing);
                }
            }
        }
    }
    match cfg.runtime {
        Runtime::Vllm(e) => vllm::sized(model, gpu, cfg, &e),
        Runtime::Sglang(s) => sglang::sized(model, gpu, cfg, &s),
        Runtime::Transformers { .. } => vllm::sized(model, gpu, cfg, &Engine::vllm_defaults(gpu)),
    }
}

/// `program` replayed through PyTorch's caching allocator at its defaults on `capacity` bytes.
fn replayed(program: &Program, capacity: u64) -> Replayed {
    let settings = ReplaySettings { capacity, config: Default::default(), policy: PolicyName::PyTorch };
    replay(program, &program.sizes(1, 1), &settings)
}

/// Bytes of one token's keys and values on one GPU: the heads split over the tensor-parallel
/// GPUs, a group of KV heads smaller than them replicated.
fn kv_per_token(model: &Model, cfg: &InferConfig) -> f64 {
    let kv_split = (cfg.tensor.max(1) as f64).min(model.kv_heads as f64);
    model.kv_bytes_per_token(cfg.kv_bytes) / kv_split
}

/// The weights as a loader makes them: a tensor for each layer's share and one for the tables
/// outside the layers, `total` bytes in all.
fn load_weights(p: &mut Program, model: &Model, total: f64) {
    let site = p.site("weights");
    let layers = model.layers.max(1);
    let per_layer = total * model.layer_params() as f64 / model.params().max(1) as f64;
    for _ in 0..layers {
        p.alloc(Law::fixed(per_layer), Term::Weights, site);
    }
    p.alloc(Law::fixed((total - per_layer * layers as f64).max(0.0)), Term::Weights, site);
}

/// The KV cache as the server allocates it, `total` bytes over the layers that keep one, in
/// `per_layer` tensors each (a key and a value, or one for both).
fn allocate_cache(p: &mut Program, model: &Model, total: f64, per_layer: u64, site: &str) -> Vec<TensorId> {
    let site = p.site(site);
    let n = model.decoder_layers.max(1) * per_layer;
    (0..n).map(|_| p.alloc(Law::fixed(total / n as f64), Term::Activations, site)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::gpu;
    use crate::model::preset;

    const GIB: f64 = (1u64 << 30) as f64;

    fn serve(g: &GpuSpec, batch: u64, seq: u64) -> InferConfig {
        InferConfig {
            runtime: Runtime::Vllm(Engine::vllm_defaults(g)),
            batch,
            seq,
            weights: WeightFormat::Bf16,
            kv_bytes: 2.0,
            tensor: 1,
            quantize: None,
        }
    }

    #[test]
    fn the_pool_is_what_the_budget_leaves_and_holds_whole_blocks() {
        let g = gpu("h100-sxm").unwrap();
        let m = preset("llama-3.1-8b").unwrap();
        let cfg = serve(&g, 1, 16000);
        let e = estimate(&m, &g, &cfg);
        let budget = 0.9 * 0.99 * 80.0 * GIB;
        assert_eq!(e.kv_cache, budget - e.weights - e.activations - 0.13 * GIB);
        // Reserved: the weights, the pool and the step's activations, in the allocator's blocks;
        // beside them what lives outside PyTorch, the budget's share and the context.
        let outside = 0.13 * GIB + (625 << 20) as f64;
        assert_eq!(e.per_gpu_bytes, e.reserved_bytes + outside);
        // Each of its allocations (a tensor per layer of weights and of cache, the tables, the
        // step's activations) rounds up to whole 2 MiB pages at most.
        let rounding = e.reserved_bytes - (budget - 0.13 * GIB);
        let pages = (2 * m.layers + 3) as f64 * (2 << 20) as f64;
        assert!((0.0..pages).contains(&rounding), "{rounding}");
        // 128 KiB a token; a 16,000-token sequence takes 1,000 blocks of 16.
        assert_eq!(e.max_tokens, (e.kv_cache / 131072.0) as u64);
        assert_eq!(e.max_sequences, (e.kv_cache / (16000.0 * 131072.0)) as u64);
        assert!(e.fits);
        assert!(!estimate(&m, &g, &InferConfig { batch: e.max_sequences + 1, ..cfg }).fits);
        // A 16,001-token sequence takes a 1,001st block.
        let odd = estimate(&m, &g, &InferConfig { seq: 16001, ..cfg });
        assert_eq!(odd.max_sequences, (e.kv_cache / (16016.0 * 131072.0)) as u64);
    }

    #[test]
    fn grouped_query_attention_and_windows_shrink_what_a_sequence_takes() {
        let g = gpu("a100-80gb").unwrap();
        let mha = estimate(&preset("llama-2-7b").unwrap(), &g, &serve(&g, 1, 4096));
        let gqa = estimate(&preset("llama-3-8b").unwrap(), &g, &serve(&g, 1, 4096));
        // 512 KiB vs 128 KiB a token (research/estimation.md §3.1).
        assert_eq!(mha.max_tokens, (mha.kv_cache / (512.0 * 1024.0)) as u64);
        assert_eq!(gqa.max_tokens, (gqa.kv_cache / (128.0 * 1024.0)) as u64);
        assert!(gqa.max_sequences > 3 * mha.max_sequences);
        // Two GPUs halve the weights and a token's cache (vllm #11251: Llama-3-8B at TP 2,
        // 64 KiB a token a GPU).
        let l3 = preset("llama-3-8b").unwrap();
        let tp2 = estimate(&l3, &g, &InferConfig { tensor: 2, ..serve(&g, 1, 4096) });
        assert_eq!(tp2.weights * 2.0, gqa.weights);
        assert_eq!(tp2.max_tokens, (tp2.kv_cache / 65536.0) as u64);
        // Mistral's 4,096-token window caps what a 32K sequence keeps.
        let mistral = estimate(&preset("mistral-7b").unwrap(), &g, &serve(&g, 1, 32768));
        assert_eq!(mistral.max_sequences, (mistral.kv_cache / (4096.0 * 131072.0)) as u64);
    }

    #[test]
    fn sglang_holds_tokens_in_the_pool_its_share_leaves() {
        let g = gpu("h100-sxm").unwrap();
        let m = preset("llama-3.1-8b").unwrap();
        let s = Sglang::defaults(&g, 1);
        let cfg = InferConfig { runtime: Runtime::Sglang(s), ..serve(&g, 8, 32768) };
        let e = estimate(&m, &g, &cfg);
        let free = 0.99 * 80.0 * GIB - (625 << 20) as f64; // an H100's context
        assert_eq!(e.kv_cache, s.mem_fraction_static * free - e.weights);
        // 128 KiB a token, one token a slot: no rounding to blocks.
        assert_eq!(e.max_tokens, (e.kv_cache / 131072.0) as u64);
        assert_eq!(e.max_sequences, (e.kv_cache / (32768.0 * 131072.0)) as u64);
        assert!(e.fits);
        // The device is the server's: the pool, the reserve for activations and the context,
        // the allocator's blocks rounding them up a little.
        let rounding = e.per_gpu_bytes - 0.99 * 80.0 * GIB;
        let pages = (3 * m.layers + 2) as f64 * (2 << 20) as f64;
        assert!((0.0..pages).contains(&rounding), "{rounding}");
        assert!((e.weights + e.kv_cache + e.activations - free).abs() < 1.0);
        // A share below the weights' leaves no pool: the server would not start.
        let low =
            estimate(&m, &g, &InferConfig { runtime: Runtime::Sglang(Sglang { mem_fraction_static: 0.1 }), ..cfg });
        assert!(!low.fits && low.kv_cache < 0.0 && low.max_tokens == 0);
    }

    #[test]
    fn bitsandbytes_layers_store_less_and_allocate_in_the_layer() {
        use crate::bnb::{ComputeDtype, QuantType};
        let g = gpu("a100-80gb").unwrap();
        let m = preset("llama-2-7b").unwrap();
        let hf = |quantize, batch, seq| InferConfig {
            runtime: Runtime::Transformers { attention: Attention::Sdpa, all_logits: false, new_tokens: 1 },
            batch,
            seq,
            weights: WeightFormat::Bf16,
            kv_bytes: 2.0,
            tensor: 1,
            quantize,
        };
        let recipe = forward_recipe(&m, true, Attention::Sdpa, false).unwrap();
        for q in [
            // (LLM.int8() and 4-bit as QLoRA and transformers' defaults load it over a bf16 load
            // are replayed from their templates: `recorded::quantized`.)
            Bnb::FourBit { quant_type: QuantType::Nf4, double_quant: false, compute: ComputeDtype::Bf16 },
            Bnb::FourBit { quant_type: QuantType::Fp4, double_quant: true, compute: ComputeDtype::Fp32 },
        ] {
            let (batch, seq) = (1, 512);
            let e = estimate(&m, &g, &hf(Some(q), batch, seq));
            assert_eq!(e.weights, q.weight_bytes(&m, 2.0));
            // The layer's moments and the quantized layer's temporaries, or the head's.
            let layer = recipe.peak_in(&m, 1.0, 512.0, true).total + q.transient_bytes(&m, 512.0, 2.0);
            let head = recipe.peak_in(&m, 1.0, 512.0, false).total;
            // Each tensor's bytes a whole number: the sum within a byte a tensor.
            assert!((e.tensor_bytes - (e.weights + layer.max(head))).abs() < 200.0, "{q:?}");
            assert!(e.allocated_bytes >= e.tensor_bytes, "{q:?}: the allocator's blocks hold the tensors");
            // Without the temporaries the peak would be lower: they are counted.
            assert!(layer > head, "{q:?}");
            let plain = estimate(&m, &g, &hf(None, batch, seq));
            assert!(e.weights < 0.6 * plain.weights && e.activations > plain.activations, "{q:?}");
        }
        // A serving engine does not run bitsandbytes.
        let vllm = InferConfig { quantize: Some(Bnb::Int8), ..serve(&g, 1, 512) };
        assert_eq!(check(&m, &vllm), Err(Unsupported::QuantizeRuntime));
    }

    #[test]
    fn quantized_weights_keep_embeddings_in_sixteen_bits_and_an_oversized_model_does_not_start() {
        let g = gpu("a100-80gb").unwrap();
        let m = preset("llama-2-70b").unwrap();
        let emb = m.embedding_params() as f64;
        let int4 = estimate(&m, &g, &InferConfig { weights: WeightFormat::Int4, ..serve(&g, 1, 4096) });
        assert_eq!(int4.weights, (m.params() as f64 - emb) * (0.5 + 2.0 / 64.0) + 2.0 * emb);
        assert!(int4.fits);
        let bf16 = estimate(&m, &g, &serve(&g, 1, 4096));
        assert!(!bf16.fits && bf16.kv_cache < 0.0 && bf16.max_sequences == 0 && bf16.max_tokens == 0);
    }
}
