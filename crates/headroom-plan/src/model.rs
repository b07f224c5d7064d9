//! Models: the architecture figures memory and time depend on, from a
//! Hugging Face `config.json` or a preset, and their parameter counts.
//!
//! Parameter counts follow research/estimation.md §7: for decoder-only
//! models with gated MLPs, `V·h·(1 or 2) + L·(h·H·d + 2·h·K·d + H·d·h +
//! 3·h·f + 2h [+ QKV bias]) + h`; GPT-2 `V·h + P·h + L·(12h² + 13h) + 2h`;
//! mixtures of experts `E·3·h·f + h·E` per layer. The tests hold them to the
//! published counts.

use serde_json::Value;
use std::fmt;

/// The family, as far as parameter counting and activations go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Llama, Mistral, Mixtral, Qwen2/3, Gemma, Phi-3: RMSNorm, rotary positions, gated MLP.
    GatedDecoder,
    /// GPT-2: LayerNorm with bias, learned positions, 2-matrix GELU MLP with biases.
    Gpt2,
}

/// A decoder-only transformer.
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    pub name: String,
    pub family: Family,
    pub hidden: u64,
    pub layers: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    /// MLP width (per expert for mixtures of experts).
    pub intermediate: u64,
    pub vocab: u64,
    pub max_position: u64,
    pub tied_embeddings: bool,
    pub qkv_bias: bool,
    /// Experts per layer (1 for dense models) and experts used per token.
    pub experts: u64,
    pub experts_per_token: u64,
}

/// A config that cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("config.json is not valid JSON: {0}")]
    Json(String),
    #[error("config.json lacks `{0}`, which a {1} model needs")]
    Missing(&'static str, String),
    #[error("config.json field `{0}` must be a positive integer")]
    NotPositive(&'static str),
    #[error("model type `{0}` is not supported yet (supported: llama, mistral, mixtral, qwen2, qwen3, gemma, gemma2, phi3, gpt2)")]
    Unsupported(String),
    #[error("unknown model `{0}`; known presets: {1}")]
    Unknown(String, String),
}

impl Model {
    /// Parameters, embeddings included (and the LM head when not tied).
    pub fn params(&self) -> u64 {
        let (h, l, v) = (self.hidden, self.layers, self.vocab);
        match self.family {
            Family::Gpt2 => v * h + self.max_position * h + l * (12 * h * h + 13 * h) + 2 * h,
            Family::GatedDecoder => {
                let q = self.heads * self.head_dim;
                let kv = self.kv_heads * self.head_dim;
                let attention = h * q + 2 * h * kv + q * h + if self.qkv_bias { q + 2 * kv } else { 0 };
                let mlp =
                    self.experts * 3 * h * self.intermediate + if self.experts > 1 { h * self.experts } else { 0 };
                let embeddings = v * h * if self.tied_embeddings { 1 } else { 2 };
                embeddings + l * (attention + mlp + 2 * h) + h
            }
        }
    }

    /// Parameters one token passes through (differs from [`Model::params`] for mixtures of experts).
    pub fn active_params(&self) -> u64 {
        if self.experts <= 1 {
            return self.params();
        }
        let unused = self.experts - self.experts_per_token;
        self.params() - self.layers * unused * 3 * self.hidden * self.intermediate
    }

    /// Parameters of one transformer layer.
    pub fn layer_params(&self) -> u64 {
        let embeddings = self.embedding_params();
        (self.params() - embeddings - self.final_norm_params()) / self.layers
    }

    /// Token (and position) embeddings, plus the LM head when untied.
    pub fn embedding_params(&self) -> u64 {
        match self.family {
            Family::Gpt2 => (self.vocab + self.max_position) * self.hidden,
            Family::GatedDecoder => self.vocab * self.hidden * if self.tied_embeddings { 1 } else { 2 },
        }
    }

    fn final_norm_params(&self) -> u64 {
        match self.family {
            Family::Gpt2 => 2 * self.hidden,
            Family::GatedDecoder => self.hidden,
        }
    }

    /// Bytes of K and V per token over all layers.
    pub fn kv_bytes_per_token(&self, dtype_bytes: f64) -> f64 {
        2.0 * (self.layers * self.kv_heads * self.head_dim) as f64 * dtype_bytes
    }

    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_config(text: &str, name: &str) -> Result<Model, ModelError> {
        let v: Value = serde_json::from_str(text).map_err(|e| ModelError::Json(e.to_string()))?;
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("").to_string();
        let uint = |key: &'static str| -> Result<Option<u64>, ModelError> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x.as_u64().filter(|&n| n > 0).map(Some).ok_or(ModelError::NotPositive(key)),
            }
        };
        let need = |key: &'static str| -> Result<u64, ModelError> {
            uint(key)?.ok_or_else(|| ModelError::Missing(key, model_type.clone()))
        };
        let flag = |key: &str, default: bool| v.get(key).and_then(Value::as_bool).unwrap_or(default);
        match model_type.as_str() {
            "gpt2" => {
                let hidden = need("n_embd")?;
                let heads = need("n_head")?;
                Ok(Model {
                    name: name.to_string(),
                    family: Family::Gpt2,
                    hidden,
                    layers: need("n_layer")?,
                    heads,
                    kv_heads: heads,
                    head_dim: hidden / heads,
                    intermediate: uint("n_inner")?.unwrap_or(4 * hidden),
                    vocab: need("vocab_size")?,
                    max_position: need("n_positions")?,
                    tied_embeddings: true,
                    qkv_bias: true,
                    experts: 1,
                    experts_per_token: 1,
                })
            }
            "llama" | "mistral" | "mixtral" | "qwen2" | "qwen3" | "gemma" | "gemma2" | "phi3" => {
                let hidden = need("hidden_size")?;
                let heads = need("num_attention_heads")?;
                let experts = uint("num_local_experts")?.unwrap_or(1);
                Ok(Model {
                    name: name.to_string(),
                    family: Family::GatedDecoder,
                    hidden,
                    layers: need("num_hidden_layers")?,
                    heads,
                    kv_heads: uint("num_key_value_heads")?.unwrap_or(heads),
                    head_dim: uint("head_dim")?.unwrap_or(hidden / heads),
                    intermediate: need("intermediate_size")?,
                    vocab: need("vocab_size")?,
                    max_position: need("max_position_embeddings")?,
                    // Each family's default in transformers.
                    tied_embeddings: flag("tie_word_embeddings", matches!(model_type.as_str(), "gemma" | "gemma2")),
                    qkv_bias: model_type == "qwen2" || flag("attention_bias", false),
                    experts,
                    experts_per_token: uint("num_experts_per_tok")?.unwrap_or(if experts > 1 { 2 } else { 1 }),
                })
            }
            other => Err(ModelError::Unsupported(other.to_string())),
        }
    }
}

impl fmt::Display for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:.2} B parameters)", self.name, self.params() as f64 / 1e9)
    }
}

#[allow(clippy::too_many_arguments)] // one argument per column of the preset table
fn gated(name: &str, h: u64, l: u64, heads: u64, kv: u64, d: u64, f: u64, v: u64, pos: u64, tied: bool) -> Model {
    Model {
        name: name.to_string(),
        family: Family::GatedDecoder,
        hidden: h,
        layers: l,
        heads,
        kv_heads: kv,
        head_dim: d,
        intermediate: f,
        vocab: v,
        max_position: pos,
        tied_embeddings: tied,
        qkv_bias: false,
        experts: 1,
        experts_per_token: 1,
    }
}

/// The presets of research/estimation.md §7, by the names users type.
pub fn presets() -> Vec<Model> {
    let gpt2 = |name: &str, h: u64, l: u64, a: u64| Model {
        name: name.to_string(),
        family: Family::Gpt2,
        hidden: h,
        layers: l,
        heads: a,
        kv_heads: a,
        head_dim: h / a,
        intermediate: 4 * h,
        vocab: 50257,
        max_position: 1024,
        tied_embeddings: true,
        qkv_bias: true,
        experts: 1,
        experts_per_token: 1,
    };
    let mut qwen = gated("qwen2.5-7b", 3584, 28, 28, 4, 128, 18944, 152064, 32768, false);
    qwen.qkv_bias = true;
    let mut mixtral = gated("mixtral-8x7b", 4096, 32, 32, 8, 128, 14336, 32000, 32768, false);
    mixtral.experts = 8;
    mixtral.experts_per_token = 2;
    vec![
        gpt2("gpt2", 768, 12, 12),
        gpt2("gpt2-medium", 1024, 24, 16),
        gpt2("gpt2-large", 1280, 36, 20),
        gpt2("gpt2-xl", 1600, 48, 25),
        gated("llama-2-7b", 4096, 32, 32, 32, 128, 11008, 32000, 4096, false),
        gated("llama-2-13b", 5120, 40, 40, 40, 128, 13824, 32000, 4096, false),
        gated("llama-2-70b", 8192, 80, 64, 8, 128, 28672, 32000, 4096, false),
        gated("llama-3-8b", 4096, 32, 32, 8, 128, 14336, 128256, 8192, false),
        gated("llama-3.1-8b", 4096, 32, 32, 8, 128, 14336, 128256, 131072, false),
        gated("llama-3-70b", 8192, 80, 64, 8, 128, 28672, 128256, 8192, false),
        gated("mistral-7b", 4096, 32, 32, 8, 128, 14336, 32000, 32768, false),
        mixtral,
        qwen,
        gated("phi-3-mini", 3072, 32, 32, 32, 96, 8192, 32064, 4096, false),
        gated("gemma-2b", 2048, 18, 8, 1, 256, 16384, 256000, 8192, true),
        gated("gemma-7b", 3072, 28, 16, 16, 256, 24576, 256000, 8192, true),
    ]
}

/// A preset by name (case, `_` and spaces ignored).
pub fn preset(name: &str) -> Result<Model, ModelError> {
    let n = name.to_ascii_lowercase().replace(['_', ' '], "-");
    let all = presets();
    all.iter().find(|m| m.name == n).cloned().ok_or_else(|| {
        ModelError::Unknown(name.to_string(), all.iter().map(|m| m.name.clone()).collect::<Vec<_>>().join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts_equal_the_published_ones() {
        for (name, count) in [
            ("gpt2", 124_439_808u64),
            ("gpt2-medium", 354_823_168),
            ("gpt2-large", 774_030_080),
            ("gpt2-xl", 1_557_611_200),
            ("llama-2-7b", 6_738_415_616),
            ("llama-2-13b", 13_015_864_320),
            ("llama-2-70b", 68_976_648_192),
            ("llama-3-8b", 8_030_261_248),
            ("llama-3-70b", 70_553_706_496),
            ("mistral-7b", 7_241_732_096),
            ("mixtral-8x7b", 46_702_792_704),
            ("qwen2.5-7b", 7_615_616_512),
            ("phi-3-mini", 3_821_079_552),
            ("gemma-2b", 2_506_172_416),
            ("gemma-7b", 8_537_680_896),
        ] {
            assert_eq!(preset(name).unwrap().params(), count, "{name}");
        }
        assert_eq!(preset("mixtral-8x7b").unwrap().active_params(), 12_879_925_248);
    }

    #[test]
    fn reads_hf_configs_and_names_missing_fields() {
        let llama3 = r#"{"model_type":"llama","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,
            "num_key_value_heads":8,"intermediate_size":14336,"vocab_size":128256,"max_position_embeddings":8192,
            "tie_word_embeddings":false}"#;
        let m = Model::from_hf_config(llama3, "mine").unwrap();
        assert_eq!(m.params(), 8_030_261_248);
        assert_eq!(m.kv_bytes_per_token(2.0), 131072.0);
        let gemma = r#"{"model_type":"gemma","hidden_size":2048,"num_hidden_layers":18,"num_attention_heads":8,
            "num_key_value_heads":1,"head_dim":256,"intermediate_size":16384,"vocab_size":256000,"max_position_embeddings":8192}"#;
        assert_eq!(Model::from_hf_config(gemma, "g").unwrap().params(), 2_506_172_416);
        let gpt2 =
            r#"{"model_type":"gpt2","n_embd":768,"n_layer":12,"n_head":12,"n_positions":1024,"vocab_size":50257}"#;
        assert_eq!(Model::from_hf_config(gpt2, "g").unwrap().params(), 124_439_808);
        let missing = r#"{"model_type":"llama","hidden_size":4096}"#;
        assert_eq!(
            Model::from_hf_config(missing, "x").unwrap_err().to_string(),
            "config.json lacks `num_attention_heads`, which a llama model needs"
        );
        assert!(matches!(Model::from_hf_config(r#"{"model_type":"bert"}"#, "x"), Err(ModelError::Unsupported(_))));
        assert!(matches!(Model::from_hf_config("{", "x"), Err(ModelError::Json(_))));
        assert!(preset("gpt5").unwrap_err().to_string().contains("known presets: gpt2"));
    }
}
