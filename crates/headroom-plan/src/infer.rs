//! Inference memory per GPU, for the two ways a model generates:
//!
//! - a serving engine (vLLM, SGLang): weights at their storage width, the KV
//!   cache (grouped-query aware, capped at a sliding window), one layer's
//!   activations at the prefill chunk, the last tokens' logits, and the
//!   context — and how many sequences of a given length fit
//!   (research/estimation.md §3). Tensor parallelism splits the weights and
//!   the KV heads.
//! - Hugging Face transformers' forward with a cache (`model(input_ids,
//!   use_cache=True)`, as an evaluation loop runs it): every layer's keys and
//!   values, every position's logits, and the temporaries its code
//!   allocates, moment by moment from [`crate::forward_recipe`].

use crate::forward_recipe::forward_recipe;
use crate::gpu::GpuSpec;
use crate::model::Model;
use crate::train::Attention;

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
}

/// Whose code runs the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    /// A serving engine: paged cache, chunked prefill, the last tokens' logits.
    Engine,
    /// transformers' forward with a cache, with this attention kernel: fp32 or bf16 weights,
    /// the cache in the weights' dtype; the last position's logits (`generate`'s first
    /// forward) or, with `all_logits`, every position's (an evaluation loop).
    Transformers { attention: Attention, all_logits: bool },
}

/// An inference configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InferConfig {
    pub runtime: Runtime,
    /// Concurrent sequences.
    pub batch: u64,
    /// Tokens per sequence (prompt and output).
    pub seq: u64,
    /// Tokens computed at once in a prefill step.
    pub prefill_chunk: u64,
    pub weights: WeightFormat,
    /// Bytes per K or V element (2 for bf16, 1 for fp8); transformers caches in the weights' dtype.
    pub kv_bytes: f64,
    /// Tensor-parallel GPUs.
    pub tensor: u64,
}

/// Bytes per GPU by term, and the capacity answer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InferEstimate {
    pub weights: f64,
    pub kv_cache: f64,
    /// What the runtime keeps beside the weights, cache and logits at its peak (with
    /// transformers: the ids and the temporaries of the moment).
    pub activations: f64,
    pub logits: f64,
    pub framework: f64,
    pub per_gpu_bytes: f64,
    /// What `torch.cuda.max_memory_reserved()` would report: everything but the CUDA context.
    pub reserved_bytes: f64,
    pub fits: bool,
    /// Sequences of `seq` tokens the memory left after weights, activations and context
    /// holds (with transformers: the largest batch of `seq` tokens that fits).
    pub max_sequences: u64,
    /// Tokens of KV the same memory holds.
    pub max_tokens: u64,
}

/// The longest sequence of which `cfg.batch` fit (0 if none does), up to `limit` tokens.
pub fn max_seq(model: &Model, gpu: &GpuSpec, cfg: &InferConfig, limit: u64) -> u64 {
    crate::train::largest(limit, |seq| estimate(model, gpu, &InferConfig { seq, ..*cfg }).fits)
}

/// Why a configuration cannot be estimated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    #[error("transformers' forward was measured with fp32 and bf16 weights, not {}", crate::names::Named::name(*.0))]
    Weights(WeightFormat),
    #[error("transformers' forward runs on one GPU here: no tensor parallelism")]
    Tensor,
    #[error(
        "transformers' forward with a cache was measured for decoder-only families (Llama, Mistral, \
         Qwen2, Gemma, Phi-3, Mixtral, GPT-2, GPT-NeoX, BLOOM); {0} (model_type `{1}`) is none of \
         them: plan it as a serving engine (--framework auto)"
    )]
    Family(String, &'static str),
}

/// Checks that `cfg` can be estimated for `model`.
pub fn check(model: &Model, cfg: &InferConfig) -> Result<(), Unsupported> {
    if let Runtime::Transformers { attention, all_logits } = cfg.runtime {
        if !matches!(cfg.weights, WeightFormat::Fp32 | WeightFormat::Bf16) {
            return Err(Unsupported::Weights(cfg.weights));
        }
        if cfg.tensor > 1 {
            return Err(Unsupported::Tensor);
        }
        if forward_recipe(model, cfg.weights == WeightFormat::Bf16, attention, all_logits).is_none() {
            return Err(Unsupported::Family(model.name.clone(), model.model_type));
        }
    }
    Ok(())
}

/// Estimates one configuration ([`check`] it first: a transformers configuration it refuses
/// is estimated as a serving engine).
pub fn estimate(model: &Model, gpu: &GpuSpec, cfg: &InferConfig) -> InferEstimate {
    if let (Runtime::Transformers { attention, all_logits }, WeightFormat::Fp32 | WeightFormat::Bf16) =
        (cfg.runtime, cfg.weights)
    {
        if let Some(recipe) = forward_recipe(model, cfg.weights == WeightFormat::Bf16, attention, all_logits) {
            return transformers(model, gpu, cfg, recipe);
        }
    }
    let t = cfg.tensor.max(1) as f64;
    let weights = model.params() as f64 * cfg.weights.bytes_per_param() / t;
    // Heads split over the tensor-parallel GPUs; a group of KV heads smaller than t is replicated.
    let kv_split = t.min(model.kv_heads as f64);
    let per_token = model.kv_bytes_per_token(cfg.kv_bytes) / kv_split;
    let cached = model.sliding_window.map_or(cfg.seq, |w| cfg.seq.min(w));
    let kv_cache = per_token * cfg.batch as f64 * cached as f64;
    // One layer's working set at the prefill chunk (EleutherAI's 16 values per
    // hidden unit per token, 2 bytes each), reused layer after layer.
    let activations = cfg.prefill_chunk.min(cfg.batch.saturating_mul(cfg.seq)) as f64 * model.hidden as f64 * 32.0 / t;
    // Logits of the last token of each sequence, fp32.
    let logits = cfg.batch as f64 * model.vocab as f64 * 4.0 / t;
    let framework = gpu.arch.cuda_context_bytes() as f64;
    let per_gpu = weights + kv_cache + activations + logits + framework;
    let free_for_kv = gpu.memory_bytes as f64 - (weights + activations + logits + framework);
    let max_tokens = if free_for_kv > 0.0 { (free_for_kv / per_token) as u64 } else { 0 };
    InferEstimate {
        weights,
        kv_cache,
        activations,
        logits,
        framework,
        per_gpu_bytes: per_gpu,
        reserved_bytes: per_gpu - framework,
        fits: per_gpu <= gpu.memory_bytes as f64,
        max_sequences: max_tokens / cached.max(1),
        max_tokens,
    }
}

/// transformers' forward with a cache: its peak moment, the cache and logits alive then.
fn transformers(
    model: &Model,
    gpu: &GpuSpec,
    cfg: &InferConfig,
    recipe: &crate::forward_recipe::ForwardRecipe,
) -> InferEstimate {
    let weights = model.params() as f64 * cfg.weights.bytes_per_param();
    let framework = gpu.arch.cuda_context_bytes() as f64;
    let peak = recipe.peak(model, cfg.batch as f64, cfg.seq as f64);
    let per_gpu = weights + peak.total + framework;
    let fits_batch = |batch: u64| {
        weights + recipe.peak(model, batch as f64, cfg.seq as f64).total + framework <= gpu.memory_bytes as f64
    };
    // The peak grows with the batch, so the largest batch that fits is found by bisection.
    let max_sequences = crate::train::largest(1 << 40, fits_batch);
    InferEstimate {
        weights,
        kv_cache: peak.kv_cache,
        activations: peak.total - peak.kv_cache - peak.logits,
        logits: peak.logits,
        framework,
        per_gpu_bytes: per_gpu,
        reserved_bytes: per_gpu - framework,
        fits: per_gpu <= gpu.memory_bytes as f64,
        max_sequences,
        max_tokens: max_sequences.saturating_mul(cfg.seq),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::gpu;
    use crate::model::preset;

    #[test]
    fn grouped_query_attention_shrinks_the_cache() {
        let cfg = InferConfig {
            runtime: Runtime::Engine,
            batch: 8,
            seq: 4096,
            prefill_chunk: 2048,
            weights: WeightFormat::Bf16,
            kv_bytes: 2.0,
            tensor: 1,
        };
        let g = gpu("a100-80gb").unwrap();
        let mha = estimate(&preset("llama-2-7b").unwrap(), &g, &cfg);
        let gqa = estimate(&preset("llama-3-8b").unwrap(), &g, &cfg);
        // 512 KiB vs 128 KiB a token (research/estimation.md §3.1).
        assert_eq!(mha.kv_cache, 8.0 * 4096.0 * 512.0 * 1024.0);
        assert_eq!(gqa.kv_cache * 4.0, mha.kv_cache);
        assert!(gqa.max_sequences > 3 * mha.max_sequences);
        let int4 = estimate(&preset("llama-2-70b").unwrap(), &g, &InferConfig { weights: WeightFormat::Int4, ..cfg });
        assert!(int4.fits && int4.weights < 40e9);
        assert!(!estimate(&preset("llama-2-70b").unwrap(), &g, &cfg).fits);
        // Two GPUs halve the weights and the cache (vllm #11251: Llama-3-8B at TP 2, 64 KiB a token a GPU).
        let tp2 = estimate(&preset("llama-3-8b").unwrap(), &g, &InferConfig { tensor: 2, ..cfg });
        assert_eq!(tp2.kv_cache * 2.0, gqa.kv_cache);
        assert_eq!(preset("llama-3-8b").unwrap().kv_bytes_per_token(2.0) / 2.0, 65536.0);
        // Mistral's 4,096-token window caps what a 32K sequence keeps.
        let long = InferConfig { seq: 32768, batch: 1, ..cfg };
        let mistral = estimate(&preset("mistral-7b").unwrap(), &g, &long);
        assert_eq!(mistral.kv_cache, 4096.0 * 128.0 * 1024.0);
    }
}
