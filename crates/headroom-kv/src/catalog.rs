//! The models and GPUs the serving simulator knows by name: just the
//! figures it needs. Figures from `research/estimation.md` §6–7 (parameter
//! counts recomputed from the Hugging Face configs; dense bf16 peak; HBM
//! bandwidth). Memory sizes are nominal (GiB for the marketing "GB").

/// A decoder-only model, as far as serving memory and time go.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelSpec {
    pub name: &'static str,
    /// All parameters (what must be resident).
    pub params: u64,
    /// Parameters used per token (differs for mixture-of-experts models).
    pub active_params: u64,
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub intermediate: u64,
    pub vocab: u64,
    pub max_position: u64,
}

impl ModelSpec {
    /// Bytes of K and V per token across all layers: 2 × layers × kv_heads × head_dim × bytes.
    pub fn kv_bytes_per_token(&self, dtype_bytes: u64) -> u64 {
        2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes
    }
}

// One argument per column of the preset table below.
#[allow(clippy::too_many_arguments)]
const fn dense(
    name: &'static str,
    params: u64,
    layers: u64,
    hidden: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    intermediate: u64,
    vocab: u64,
    max_position: u64,
) -> ModelSpec {
    ModelSpec {
        name,
        params,
        active_params: params,
        layers,
        hidden,
        heads,
        kv_heads,
        head_dim,
        intermediate,
        vocab,
        max_position,
    }
}

/// Model presets, by the names users type.
pub const MODELS: &[ModelSpec] = &[
    dense("gpt2", 124_439_808, 12, 768, 12, 12, 64, 3072, 50257, 1024),
    dense("llama-2-7b", 6_738_415_616, 32, 4096, 32, 32, 128, 11008, 32000, 4096),
    dense("llama-2-13b", 13_015_864_320, 40, 5120, 40, 40, 128, 13824, 32000, 4096),
    dense("llama-2-70b", 68_976_648_192, 80, 8192, 64, 8, 128, 28672, 32000, 4096),
    dense("llama-3-8b", 8_030_261_248, 32, 4096, 32, 8, 128, 14336, 128256, 8192),
    dense("llama-3.1-8b", 8_030_261_248, 32, 4096, 32, 8, 128, 14336, 128256, 131072),
    dense("llama-3-70b", 70_553_706_496, 80, 8192, 64, 8, 128, 28672, 128256, 8192),
    dense("mistral-7b", 7_241_732_096, 32, 4096, 32, 8, 128, 14336, 32000, 32768),
    ModelSpec {
        name: "mixtral-8x7b",
        params: 46_702_792_704,
        active_params: 12_879_925_248,
        layers: 32,
        hidden: 4096,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 14336,
        vocab: 32000,
        max_position: 32768,
    },
    dense("qwen2.5-7b", 7_615_616_512, 28, 3584, 28, 4, 128, 18944, 152064, 32768),
    dense("phi-3-mini", 3_821_079_552, 32, 3072, 32, 32, 96, 8192, 32064, 4096),
    dense("gemma-2b", 2_506_172_416, 18, 2048, 8, 1, 256, 16384, 256000, 8192),
    dense("gemma-7b", 8_537_680_896, 28, 3072, 16, 16, 256, 24576, 256000, 8192),
];

/// A GPU, as far as serving goes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuSpec {
    pub name: &'static str,
    pub memory_bytes: u64,
    /// HBM/GDDR bandwidth, bytes per second.
    pub bandwidth: f64,
    /// Dense bf16 (or fp16) tensor throughput, FLOP per second.
    pub bf16_flops: f64,
}

const GIB: u64 = 1 << 30;

/// GPU presets.
pub const GPUS: &[GpuSpec] = &[
    GpuSpec { name: "a100-40gb", memory_bytes: 40 * GIB, bandwidth: 1.555e12, bf16_flops: 312e12 },
    GpuSpec { name: "a100-80gb", memory_bytes: 80 * GIB, bandwidth: 2.039e12, bf16_flops: 312e12 },
    GpuSpec { name: "h100-sxm", memory_bytes: 80 * GIB, bandwidth: 3.35e12, bf16_flops: 989e12 },
    GpuSpec { name: "h100-pcie", memory_bytes: 80 * GIB, bandwidth: 2.0e12, bf16_flops: 756e12 },
    GpuSpec { name: "h200", memory_bytes: 141 * GIB, bandwidth: 4.8e12, bf16_flops: 989e12 },
    GpuSpec { name: "l4", memory_bytes: 24 * GIB, bandwidth: 0.30e12, bf16_flops: 121e12 },
    GpuSpec { name: "l40s", memory_bytes: 48 * GIB, bandwidth: 0.864e12, bf16_flops: 362e12 },
    GpuSpec { name: "a10", memory_bytes: 24 * GIB, bandwidth: 0.60e12, bf16_flops: 125e12 },
    GpuSpec { name: "rtx-4090", memory_bytes: 24 * GIB, bandwidth: 1.008e12, bf16_flops: 165.2e12 },
];

fn norm(s: &str) -> String {
    s.to_ascii_lowercase().replace(['_', ' '], "-")
}

/// A model preset by name (case and `_`/`-` insensitive).
pub fn model(name: &str) -> Result<ModelSpec, String> {
    let n = norm(name);
    MODELS.iter().find(|m| m.name == n).copied().ok_or_else(|| {
        format!("unknown model `{name}`; known: {}", MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", "))
    })
}

/// A GPU preset by name.
pub fn gpu(name: &str) -> Result<GpuSpec, String> {
    let n = norm(name);
    GPUS.iter().find(|g| g.name == n).copied().ok_or_else(|| {
        format!("unknown GPU `{name}`; known: {}", GPUS.iter().map(|g| g.name).collect::<Vec<_>>().join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_bytes_per_token_match_the_published_table() {
        // research/estimation.md §3.1, bf16.
        assert_eq!(model("llama-2-13b").unwrap().kv_bytes_per_token(2), 800 * 1024);
        assert_eq!(model("Llama_3_8B").unwrap().kv_bytes_per_token(2), 128 * 1024);
        assert_eq!(model("llama-2-70b").unwrap().kv_bytes_per_token(2), 320 * 1024);
        assert_eq!(model("qwen2.5-7b").unwrap().kv_bytes_per_token(2), 56 * 1024);
        assert_eq!(model("gemma-2b").unwrap().kv_bytes_per_token(2), 18 * 1024);
        assert_eq!(model("gpt2").unwrap().kv_bytes_per_token(2), 36 * 1024);
        assert!(model("gpt5").unwrap_err().contains("known: gpt2"));
        assert!(gpu("H100-SXM").is_ok());
    }
}
