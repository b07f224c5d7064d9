//! Models: the architecture figures memory and time depend on, from a
//! Hugging Face `config.json` or a preset, and their parameter counts.
//!
//! Parameter counts follow research/estimation.md §7: for decoder-only
//! models with gated MLPs, `V·h·(1 or 2) + L·(h·H·d + 2·h·K·d + H·d·h +
//! 3·h·f + 2h [+ QKV bias]) + h`; GPT-2 `V·h + P·h + L·(12h² + 13h) + 2h`;
//! mixtures of experts `E·3·h·f + h·E` per layer. GPT-NeoX, BLOOM, BERT
//! (`BertModel` with its pooler) and T5 (`T5ForConditionalGeneration`) count
//! their biases, norms and relative-position tables as their code does. The
//! tests hold every family to published counts.

use serde_json::Value;
use std::fmt;

/// The family, as far as parameter counting and activations go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Llama, Mistral, Mixtral, Qwen2/3, Gemma, Phi-3: RMSNorm, rotary positions, gated MLP.
    GatedDecoder,
    /// GPT-2: LayerNorm with bias, learned positions, 2-matrix GELU MLP with biases.
    Gpt2,
    /// GPT-NeoX / Pythia: GPT-2's layer with rotary positions and an untied output embedding.
    NeoX,
    /// BLOOM: GPT-2's layer with ALiBi instead of positions and a LayerNorm after the embedding.
    Bloom,
    /// BERT: an encoder with learned positions, token types and a pooler.
    Bert,
    /// T5: an encoder-decoder with relative position buckets and no biases.
    T5,
}

/// A transformer.
///
/// `layers` counts every block (an encoder-decoder's two stacks together);
/// `decoder_layers` of them attend causally and keep a KV cache.
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    pub name: String,
    pub family: Family,
    /// The `model_type` of its `config.json` (`llama`, `gemma`, `gpt_neox`, ...): which
    /// transformers code runs it, for the activation recipes.
    pub model_type: &'static str,
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
    /// Three MLP matrices (SwiGLU, GeGLU) rather than two.
    pub gated_mlp: bool,
    /// Blocks with a KV cache: all of them for decoders, none for BERT, T5's decoder stack.
    pub decoder_layers: u64,
    /// Sliding-window attention: the KV cache a sequence needs stops growing here.
    pub sliding_window: Option<u64>,
    /// T5's relative-position buckets (one table per stack).
    pub relative_buckets: u64,
}

/// The output layer and its loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    /// Next-token prediction: logits over the vocabulary for every position.
    CausalLm,
    /// Masked-token prediction (BERT): logits over the vocabulary for every position.
    MaskedLm,
    /// Sequence classification: a few logits a sequence.
    SeqCls,
}

crate::names::named!(Head {
    CausalLm => ("causal-lm", "logits over the vocabulary for every position"),
    MaskedLm => ("masked-lm", "BERT's masked-token logits for every position"),
    SeqCls => ("seq-cls", "a classifier: a few logits a sequence"),
});

/// A config that cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("config.json {0}")]
    Json(String),
    #[error("config.json lacks `{0}`, which a {1} model needs")]
    Missing(&'static str, String),
    #[error("config.json field `{0}` must be a positive integer")]
    NotPositive(&'static str),
    #[error("model type `{0}` is not supported yet (supported: llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, gemma, gemma2, phi3, gpt2, gpt_neox, bloom, bert, t5, mt5)")]
    Unsupported(String),
    #[error("unknown model `{0}`; known presets: {1}")]
    Unknown(String, String),
    #[error("config.json {0}")]
    NotAnObject(String),
    #[error("config.json describes no model headroom can plan: {0}")]
    Invalid(String),
}

impl Model {
    /// Parameters, embeddings included (and the LM head when not tied).
    pub fn params(&self) -> u64 {
        u64::try_from(self.params_wide()).unwrap_or(u64::MAX)
    }

    /// [`Model::params`] in 128 bits, where no configuration overflows: what
    /// [`Model::check`] bounds before anything else computes in 64 bits.
    fn params_wide(&self) -> u128 {
        let w = |x: u64| x as u128;
        let (h, l, v, f) = (w(self.hidden), w(self.layers), w(self.vocab), w(self.intermediate));
        let (heads, kv_heads, head_dim) = (w(self.heads), w(self.kv_heads), w(self.head_dim));
        let untied = if self.tied_embeddings { 1 } else { 2 };
        // LayerNorm-with-bias layer: QKV and output projection with biases, two norms, a 2-matrix MLP with biases.
        let biased_layer = 4 * h * h + 2 * h * f + 9 * h + f;
        match self.family {
            Family::Gpt2 => {
                // The fused c_attn is q + 2 kv wide (kv = q but with GPTBigCode's one head).
                let qkv = heads * head_dim + 2 * kv_heads * head_dim;
                let layer = biased_layer - 3 * h * h - 3 * h + h * qkv + qkv - h * h + heads * head_dim * h;
                v * h + w(self.max_position) * h + l * layer + 2 * h
            }
            Family::NeoX => v * h * untied + l * biased_layer + 2 * h,
            Family::Bloom => v * h * untied + 2 * h + l * biased_layer + 2 * h,
            Family::Bert => {
                // Word, position and two token-type embeddings with their LayerNorm; the pooler.
                (v + w(self.max_position) + 2) * h + 2 * h + l * biased_layer + h * h + h
            }
            Family::T5 => {
                let inner = heads * head_dim;
                let mlp = if self.gated_mlp { 3 } else { 2 } * h * f;
                let decoder = w(self.decoder_layers);
                let encoder = l - decoder;
                let tables = 2 * w(self.relative_buckets) * heads;
                v * h * untied
                    + encoder * (4 * h * inner + mlp + 2 * h)
                    + decoder * (8 * h * inner + mlp + 3 * h)
                    + tables
                    + 2 * h
            }
            Family::GatedDecoder => {
                let q = heads * head_dim;
                let kv = kv_heads * head_dim;
                let attention = h * q + 2 * h * kv + q * h + if self.qkv_bias { q + 2 * kv } else { 0 };
                let experts = w(self.experts);
                let mlp = experts * 3 * h * f + if self.experts > 1 { h * experts } else { 0 };
                v * h * untied + l * (attention + mlp + 2 * h) + h
            }
        }
    }

    /// Whether the shapes make a model headroom can plan; what is wrong if not.
    /// Configurations from files go through this; the presets pass it.
    pub fn check(&self) -> Result<(), ModelError> {
        let bad = |why: String| Err(ModelError::Invalid(why));
        // Each dimension below 2^32 (and the layers below 2^20) keeps every product
        // of two of them, and the parameter count, far from 64-bit overflow.
        for (what, v, max) in [
            ("the hidden size", self.hidden, 1u64 << 32),
            ("the layers", self.layers, 1 << 20),
            ("the attention heads", self.heads, 1 << 32),
            ("the key-value heads", self.kv_heads, 1 << 32),
            ("the head dimension", self.head_dim, 1 << 32),
            ("the MLP width", self.intermediate, 1 << 32),
            ("the vocabulary", self.vocab, 1 << 32),
            ("the experts", self.experts, 1 << 20),
            ("the positions", self.max_position, 1 << 40),
        ] {
            if v > max {
                return bad(format!("{what}: {v} is more than {max}"));
            }
        }
        if self.head_dim == 0 {
            return bad(format!(
                "{} attention heads do not fit in a hidden size of {}: each head would have 0 dimensions",
                self.heads, self.hidden
            ));
        }
        if self.kv_heads > self.heads || !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "{} key-value heads do not divide the {} attention heads into equal groups",
                self.kv_heads, self.heads
            ));
        }
        if self.experts_per_token > self.experts {
            return bad(format!("{} experts per token, but only {} experts", self.experts_per_token, self.experts));
        }
        let params = self.params_wide();
        if params > 1 << 53 {
            return bad(format!("{params} parameters are more than headroom plans (2^53)"));
        }
        Ok(())
    }

    /// Whether positions are a learned table (GPT-2, BERT), so no sequence may be longer.
    pub fn learned_positions(&self) -> bool {
        matches!(self.family, Family::Gpt2 | Family::Bert)
    }

    /// Parameters with a given output layer: [`Model::params`] counts the decoders' LM head
    /// and BERT's pooler (`BertModel`); BERT's masked-LM head adds a transform's norm and
    /// an output bias (it has no pooler, and its dense layer is the pooler's size), a
    /// classifier replaces an LM head with a 2-label layer.
    pub fn params_with(&self, head: Head) -> u64 {
        let (h, v) = (self.hidden, self.vocab);
        let untied_head = if self.tied_embeddings { 0 } else { v * h };
        match (self.family, head) {
            (Family::Bert, Head::SeqCls) => self.params() + 2 * h + 2,
            (Family::Bert, _) => self.params() + 2 * h + v,
            (Family::T5, _) | (_, Head::CausalLm | Head::MaskedLm) => self.params(),
            (_, Head::SeqCls) => self.params() - untied_head + 2 * h,
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

    /// Parameters of one layer of T5's encoder and of the main stack (T5's decoder, every
    /// other model's layers); 0 for the encoder of a model without one. T5's relative
    /// position tables, in each stack's first block, are left out.
    pub fn stack_layer_params(&self) -> (u64, u64) {
        if self.family != Family::T5 {
            return (0, self.layer_params());
        }
        let (h, inner) = (self.hidden, self.heads * self.head_dim);
        let mlp = if self.gated_mlp { 3 } else { 2 } * h * self.intermediate;
        (4 * h * inner + mlp + 2 * h, 8 * h * inner + mlp + 3 * h)
    }

    /// Token (and position) embeddings, plus the LM head when untied.
    pub fn embedding_params(&self) -> u64 {
        let untied = if self.tied_embeddings { 1 } else { 2 };
        let h = self.hidden;
        match self.family {
            Family::Gpt2 => (self.vocab + self.max_position) * h,
            Family::Bert => (self.vocab + self.max_position + 2) * h + 2 * h,
            Family::Bloom => self.vocab * h * untied + 2 * h,
            Family::GatedDecoder | Family::NeoX | Family::T5 => self.vocab * h * untied,
        }
    }

    /// What is neither embeddings nor blocks: final norms, BERT's pooler, T5's position tables.
    fn final_norm_params(&self) -> u64 {
        let h = self.hidden;
        match self.family {
            Family::Gpt2 | Family::NeoX | Family::Bloom => 2 * h,
            Family::Bert => h * h + h,
            Family::T5 => 2 * h + 2 * self.relative_buckets * self.heads,
            Family::GatedDecoder => h,
        }
    }

    /// Whether it has a causal decoder (one that can generate, with a KV cache).
    pub fn generates(&self) -> bool {
        self.decoder_layers > 0
    }

    /// Bytes of K and V per token over all layers that keep a cache.
    pub fn kv_bytes_per_token(&self, dtype_bytes: f64) -> f64 {
        2.0 * (self.decoder_layers * self.kv_heads * self.head_dim) as f64 * dtype_bytes
    }

    /// (inputs, outputs) of each linear layer in one block, for adapters:
    /// the query, key, value and output projections, then the MLP's matrices
    /// (every expert's); T5 averages its decoder's cross-attention over the blocks.
    pub fn block_linears(&self) -> Vec<(u64, u64)> {
        let (h, f) = (self.hidden, self.intermediate);
        let q = self.heads * self.head_dim;
        let kv = self.kv_heads * self.head_dim;
        let mut out = vec![(h, q), (h, kv), (h, kv), (q, h)];
        let mlp: &[(u64, u64)] = if self.gated_mlp { &[(h, f), (h, f), (f, h)] } else { &[(h, f), (f, h)] };
        for _ in 0..self.experts.max(1) {
            out.extend_from_slice(mlp);
        }
        out
    }

    /// Reads a Hugging Face `config.json`, and checks the shapes it gives.
    pub fn from_hf_config(text: &str, name: &str) -> Result<Model, ModelError> {
        let m = Model::read_hf_config(text, name)?;
        m.check()?;
        Ok(m)
    }

    fn read_hf_config(text: &str, name: &str) -> Result<Model, ModelError> {
        let v: Value = crate::json::parse(text).map_err(|e| {
            ModelError::Json(if e.is_data() {
                format!("is not usable: {e}")
            } else {
                format!("is not valid JSON: {e}")
            })
        })?;
        if !v.is_object() {
            return Err(ModelError::NotAnObject(format!("is {}, not a JSON object", crate::json::kind(&v))));
        }
        let model_type = match v.get("model_type") {
            Some(Value::String(t)) => t.clone(),
            Some(other) => {
                return Err(ModelError::NotAnObject(format!(
                    "field `model_type` must be a string, not {}",
                    crate::json::kind(other)
                )))
            }
            None => return Err(ModelError::NotAnObject("has no `model_type` (e.g. \"llama\", \"gpt2\")".into())),
        };
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
            "gpt2" | "gpt_bigcode" => {
                let hidden = need("n_embd")?;
                let heads = need("n_head")?;
                // GPTBigCode (StarCoder) is GPT-2's code with `multi_query`: one key-value head.
                let bigcode = model_type == "gpt_bigcode";
                Ok(Model {
                    name: name.to_string(),
                    family: Family::Gpt2,
                    model_type: if bigcode { "gpt_bigcode" } else { "gpt2" },
                    hidden,
                    layers: need("n_layer")?,
                    heads,
                    kv_heads: if bigcode && flag("multi_query", true) { 1 } else { heads },
                    head_dim: derived_head_dim(hidden, heads)?,
                    intermediate: uint("n_inner")?.unwrap_or(hidden.saturating_mul(4)),
                    vocab: need("vocab_size")?,
                    max_position: need("n_positions")?,
                    tied_embeddings: true,
                    qkv_bias: true,
                    experts: 1,
                    experts_per_token: 1,
                    gated_mlp: false,
                    decoder_layers: need("n_layer")?,
                    sliding_window: None,
                    relative_buckets: 0,
                })
            }
            "gpt_neox" | "bloom" | "bert" => {
                let (hidden_key, layers_key, heads_key) = match model_type.as_str() {
                    "bloom" => ("hidden_size", "n_layer", "n_head"),
                    _ => ("hidden_size", "num_hidden_layers", "num_attention_heads"),
                };
                let hidden = need(hidden_key)?;
                let heads = need(heads_key)?;
                let layers = need(layers_key)?;
                let family = match model_type.as_str() {
                    "gpt_neox" => Family::NeoX,
                    "bloom" => Family::Bloom,
                    _ => Family::Bert,
                };
                Ok(Model {
                    name: name.to_string(),
                    family,
                    model_type: match family {
                        Family::NeoX => "gpt_neox",
                        Family::Bloom => "bloom",
                        _ => "bert",
                    },
                    hidden,
                    layers,
                    heads,
                    kv_heads: heads,
                    head_dim: derived_head_dim(hidden, heads)?,
                    intermediate: match family {
                        Family::Bloom => hidden.saturating_mul(4),
                        _ => need("intermediate_size")?,
                    },
                    vocab: need("vocab_size")?,
                    max_position: match family {
                        Family::Bloom => uint("seq_length")?.unwrap_or(2048),
                        _ => need("max_position_embeddings")?,
                    },
                    tied_embeddings: flag("tie_word_embeddings", family != Family::NeoX),
                    qkv_bias: true,
                    experts: 1,
                    experts_per_token: 1,
                    gated_mlp: false,
                    decoder_layers: if family == Family::Bert { 0 } else { layers },
                    sliding_window: None,
                    relative_buckets: 0,
                })
            }
            "t5" | "mt5" => {
                let encoder = need("num_layers")?;
                let decoder = uint("num_decoder_layers")?.unwrap_or(encoder);
                let heads = need("num_heads")?;
                let ff = v.get("feed_forward_proj").and_then(Value::as_str).unwrap_or("relu");
                Ok(Model {
                    name: name.to_string(),
                    family: Family::T5,
                    model_type: if model_type == "mt5" { "mt5" } else { "t5" },
                    hidden: need("d_model")?,
                    layers: encoder.saturating_add(decoder),
                    heads,
                    kv_heads: heads,
                    head_dim: need("d_kv")?,
                    intermediate: need("d_ff")?,
                    vocab: need("vocab_size")?,
                    max_position: uint("n_positions")?.unwrap_or(512),
                    tied_embeddings: flag("tie_word_embeddings", true),
                    qkv_bias: false,
                    experts: 1,
                    experts_per_token: 1,
                    gated_mlp: ff.starts_with("gated"),
                    decoder_layers: decoder,
                    sliding_window: None,
                    relative_buckets: uint("relative_attention_num_buckets")?.unwrap_or(32),
                })
            }
            "llama" | "mistral" | "mixtral" | "qwen2" | "qwen3" | "qwen3_moe" | "gemma" | "gemma2" | "phi3" => {
                let hidden = need("hidden_size")?;
                let heads = need("num_attention_heads")?;
                let moe = model_type == "qwen3_moe";
                if moe {
                    // Qwen3-MoE may keep some layers dense; the plan counts every layer alike.
                    let dense = v.get("mlp_only_layers").and_then(|l| l.as_array()).is_some_and(|l| !l.is_empty());
                    if dense || uint("decoder_sparse_step")?.unwrap_or(1) != 1 {
                        return Err(ModelError::Invalid(
                            "a qwen3_moe config with dense layers (mlp_only_layers, decoder_sparse_step); \
                             headroom plans every layer as a mixture of experts"
                                .into(),
                        ));
                    }
                }
                let experts = uint(if moe { "num_experts" } else { "num_local_experts" })?.unwrap_or(1);
                let layers = need("num_hidden_layers")?;
                Ok(Model {
                    name: name.to_string(),
                    family: Family::GatedDecoder,
                    model_type: match model_type.as_str() {
                        "mistral" => "mistral",
                        "mixtral" => "mixtral",
                        "qwen2" => "qwen2",
                        "qwen3" => "qwen3",
                        "qwen3_moe" => "qwen3_moe",
                        "gemma" => "gemma",
                        "gemma2" => "gemma2",
                        "phi3" => "phi3",
                        _ => "llama",
                    },
                    hidden,
                    layers,
                    heads,
                    kv_heads: uint("num_key_value_heads")?.unwrap_or(heads),
                    head_dim: match uint("head_dim")? {
                        Some(d) => d,
                        None => derived_head_dim(hidden, heads)?,
                    },
                    // A Qwen3-MoE expert's width; its `intermediate_size` is a dense layer's, unused.
                    intermediate: need(if moe { "moe_intermediate_size" } else { "intermediate_size" })?,
                    vocab: need("vocab_size")?,
                    max_position: need("max_position_embeddings")?,
                    // Each family's default in transformers.
                    tied_embeddings: flag("tie_word_embeddings", matches!(model_type.as_str(), "gemma" | "gemma2")),
                    qkv_bias: model_type == "qwen2" || flag("attention_bias", false),
                    experts,
                    experts_per_token: uint("num_experts_per_tok")?.unwrap_or(if experts > 1 { 2 } else { 1 }),
                    gated_mlp: true,
                    decoder_layers: layers,
                    // Only when the config turns it on (Qwen2 writes a window it does not use).
                    sliding_window: if flag("use_sliding_window", !model_type.starts_with("qwen")) {
                        uint("sliding_window")?
                    } else {
                        None
                    },
                    relative_buckets: 0,
                })
            }
            other => Err(ModelError::Unsupported(other.to_string())),
        }
    }
}

/// `hidden / heads`, when the config leaves the head dimension to follow (as transformers does, which
/// refuses a hidden size the heads do not divide).
fn derived_head_dim(hidden: u64, heads: u64) -> Result<u64, ModelError> {
    if hidden.is_multiple_of(heads) {
        Ok(hidden / heads)
    } else {
        Err(ModelError::Invalid(format!("{heads} attention heads do not divide the hidden size {hidden}")))
    }
}

impl Model {
    /// A GPT-2/GPT-3-shaped decoder (4h GELU MLP with biases, learned
    /// positions, tied embeddings), as the GPT-2 presets and the Megatron
    /// papers size their models.
    pub fn gpt(name: &str, hidden: u64, layers: u64, heads: u64, vocab: u64, max_position: u64) -> Model {
        Model {
            name: name.to_string(),
            family: Family::Gpt2,
            model_type: "gpt2",
            hidden,
            layers,
            heads,
            kv_heads: heads,
            head_dim: hidden / heads,
            intermediate: 4 * hidden,
            vocab,
            max_position,
            tied_embeddings: true,
            qkv_bias: true,
            experts: 1,
            experts_per_token: 1,
            gated_mlp: false,
            decoder_layers: layers,
            sliding_window: None,
            relative_buckets: 0,
        }
    }

    /// The same model under another name.
    pub fn renamed(mut self, name: &str) -> Model {
        self.name = name.to_string();
        self
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
        model_type: "llama",
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
        gated_mlp: true,
        decoder_layers: l,
        sliding_window: None,
        relative_buckets: 0,
    }
}

/// The presets of research/estimation.md §7, by the names users type.
pub fn presets() -> Vec<Model> {
    let gpt2 = |name: &str, h: u64, l: u64, a: u64| Model::gpt(name, h, l, a, 50257, 1024);
    let neox = |name: &str, h: u64, l: u64, a: u64, v: u64| Model {
        family: Family::NeoX,
        model_type: "gpt_neox",
        vocab: v,
        max_position: 2048,
        tied_embeddings: false,
        ..gpt2(name, h, l, a)
    };
    let bert = |name: &str, h: u64, l: u64, a: u64, v: u64| Model {
        family: Family::Bert,
        model_type: "bert",
        vocab: v,
        max_position: 512,
        decoder_layers: 0,
        ..gpt2(name, h, l, a)
    };
    #[allow(clippy::too_many_arguments)] // one argument per column of the preset table
    let t5 = |name: &str, h: u64, l: u64, a: u64, d: u64, f: u64, v: u64, gated: bool| Model {
        name: name.to_string(),
        family: Family::T5,
        model_type: "t5",
        hidden: h,
        layers: 2 * l,
        heads: a,
        kv_heads: a,
        head_dim: d,
        intermediate: f,
        vocab: v,
        max_position: 512,
        // T5 v1.0 ties the output to the embedding; v1.1 (T0, mT5, mT0) does not.
        tied_embeddings: !gated,
        qkv_bias: false,
        experts: 1,
        experts_per_token: 1,
        gated_mlp: gated,
        decoder_layers: l,
        sliding_window: None,
        relative_buckets: 32,
    };
    let mut bloom = gpt2("bloom-7b1", 4096, 30, 32);
    bloom.family = Family::Bloom;
    bloom.model_type = "bloom";
    bloom.vocab = 250880;
    bloom.max_position = 2048;
    let mut mistral = gated("mistral-7b", 4096, 32, 32, 8, 128, 14336, 32000, 32768, false);
    mistral.sliding_window = Some(4096);
    mistral.model_type = "mistral";
    let mut qwen = gated("qwen2.5-7b", 3584, 28, 28, 4, 128, 18944, 152064, 32768, false);
    qwen.qkv_bias = true;
    qwen.model_type = "qwen2";
    let mut mixtral = gated("mixtral-8x7b", 4096, 32, 32, 8, 128, 14336, 32000, 32768, false);
    mixtral.experts = 8;
    mixtral.experts_per_token = 2;
    mixtral.model_type = "mixtral";
    let mut phi3 = gated("phi-3-mini", 3072, 32, 32, 32, 96, 8192, 32064, 4096, false);
    phi3.model_type = "phi3";
    let mut gemma_2b = gated("gemma-2b", 2048, 18, 8, 1, 256, 16384, 256000, 8192, true);
    gemma_2b.model_type = "gemma";
    let mut gemma_7b = gated("gemma-7b", 3072, 28, 16, 16, 256, 24576, 256000, 8192, true);
    gemma_7b.model_type = "gemma";
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
        gated("llama-3.1-70b", 8192, 80, 64, 8, 128, 28672, 128256, 131072, false),
        gated("llama-3.1-405b", 16384, 126, 128, 8, 128, 53248, 128256, 131072, false),
        mistral,
        mixtral,
        qwen,
        phi3,
        gemma_2b,
        gemma_7b,
        neox("pythia-160m", 768, 12, 12, 50304),
        neox("pythia-1b", 2048, 16, 8, 50304),
        neox("pythia-6.9b", 4096, 32, 32, 50432),
        bloom,
        bert("bert-base-uncased", 768, 12, 12, 30522),
        bert("bert-base-cased", 768, 12, 12, 28996),
        bert("bert-large-uncased", 1024, 24, 16, 30522),
        t5("t5-base", 768, 12, 12, 64, 3072, 32128, false),
        t5("t5-large", 1024, 24, 16, 64, 4096, 32128, false),
        t5("t5-3b", 1024, 24, 32, 128, 16384, 32128, false),
        t5("t0-3b", 2048, 24, 32, 64, 5120, 32128, true),
        t5("mt0-xxl", 4096, 24, 64, 64, 10240, 250112, true),
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
            // Hugging Face's meta-llama/Llama-3.1-70B and -405B.
            ("llama-3.1-70b", 70_553_706_496),
            ("llama-3.1-405b", 405_853_388_800),
            ("mistral-7b", 7_241_732_096),
            ("mixtral-8x7b", 46_702_792_704),
            ("qwen2.5-7b", 7_615_616_512),
            ("phi-3-mini", 3_821_079_552),
            ("gemma-2b", 2_506_172_416),
            ("gemma-7b", 8_537_680_896),
            // Pythia's Table 1 (with embeddings).
            ("pythia-160m", 162_322_944),
            ("pythia-1b", 1_011_781_632),
            ("pythia-6.9b", 6_857_302_016),
            ("bloom-7b1", 7_069_016_064),
            ("bert-base-uncased", 109_482_240),
            ("bert-base-cased", 108_310_272),
            ("bert-large-uncased", 335_141_888),
            ("t5-base", 222_903_552),
            // DeepSpeed's memory estimator examples: 737.67M and 2851M.
            ("t5-large", 737_668_096),
            ("t5-3b", 2_851_598_336),
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
        assert!(matches!(Model::from_hf_config(r#"{"model_type":"falcon"}"#, "x"), Err(ModelError::Unsupported(_))));
        assert!(matches!(Model::from_hf_config("{", "x"), Err(ModelError::Json(_))));
        assert!(preset("gpt5").unwrap_err().to_string().contains("known presets: gpt2"));
        // Pythia-410m, BERT, T5 v1.1 and BLOOM as their config.json files spell them.
        let neox = r#"{"model_type":"gpt_neox","hidden_size":1024,"num_hidden_layers":24,"num_attention_heads":16,
            "intermediate_size":4096,"vocab_size":50304,"max_position_embeddings":2048}"#;
        assert_eq!(Model::from_hf_config(neox, "p").unwrap().params(), 405_334_016);
        let bert = r#"{"model_type":"bert","hidden_size":768,"num_hidden_layers":12,"num_attention_heads":12,
            "intermediate_size":3072,"vocab_size":30522,"max_position_embeddings":512,"type_vocab_size":2}"#;
        let bert = Model::from_hf_config(bert, "b").unwrap();
        assert_eq!(bert.params(), 109_482_240);
        assert!(!bert.generates());
        let t0 = r#"{"model_type":"t5","d_model":2048,"d_ff":5120,"d_kv":64,"num_heads":32,"num_layers":24,
            "vocab_size":32128,"feed_forward_proj":"gated-gelu","tie_word_embeddings":false}"#;
        let t0 = Model::from_hf_config(t0, "t").unwrap();
        assert_eq!(t0, preset("t0-3b").unwrap().renamed("t"));
        assert_eq!(t0.kv_bytes_per_token(2.0), 2.0 * 24.0 * 32.0 * 64.0 * 2.0);
        let bloom = r#"{"model_type":"bloom","hidden_size":4096,"n_layer":30,"n_head":32,"vocab_size":250880}"#;
        assert_eq!(Model::from_hf_config(bloom, "b").unwrap().params(), 7_069_016_064);
        let missing_t5 = r#"{"model_type":"t5","d_model":512}"#;
        assert_eq!(
            Model::from_hf_config(missing_t5, "x").unwrap_err().to_string(),
            "config.json lacks `num_layers`, which a t5 model needs"
        );
        // mT0-xxl: "12.9B" (the peft README rounds to 12B).
        assert_eq!(preset("mt0-xxl").unwrap().params() / 100_000_000, 129);
    }

    #[test]
    fn qwen3_moe_counts_its_experts_at_their_own_width() {
        let cfg = r#"{"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
            "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
            "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
            "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": false,
            "decoder_sparse_step": 1, "mlp_only_layers": []}"#;
        let m = Model::from_hf_config(cfg, "qwen3-30b-a3b").unwrap();
        assert_eq!((m.experts, m.experts_per_token, m.intermediate), (128, 8, 768));
        // Qwen3-30B-A3B: 30.5 B parameters, 3.3 B of them active a token (its model card).
        assert_eq!(m.params() / 100_000_000, 305);
        assert_eq!(m.active_params() / 100_000_000, 33);
        // Dense layers among the experts are refused, not miscounted.
        let dense = cfg.replace(r#""mlp_only_layers": []"#, r#""mlp_only_layers": [0]"#);
        assert!(matches!(Model::from_hf_config(&dense, "x"), Err(ModelError::Invalid(_))));
        let step = cfg.replace(r#""decoder_sparse_step": 1"#, r#""decoder_sparse_step": 2"#);
        assert!(matches!(Model::from_hf_config(&step, "x"), Err(ModelError::Invalid(_))));
    }

    #[test]
    fn gpt_bigcode_is_gpt2_with_one_key_value_head() {
        let text = include_str!("../../../../data/models/octocoder.json");
        let m = Model::from_hf_config(text, "octocoder").unwrap();
        assert_eq!((m.family, m.model_type, m.kv_heads, m.head_dim), (Family::Gpt2, "gpt_bigcode", 1, 128));
        // StarCoder and OctoCoder: "15.5B parameters" (their model cards).
        assert_eq!(m.params() / 100_000_000, 155);
        // The fused c_attn is q + 2 × 128 wide; the cache 2 × 128 a token a layer.
        assert_eq!(m.block_linears()[1], (6144, 128));
        assert_eq!(m.kv_bytes_per_token(2.0), 2.0 * 40.0 * 128.0 * 2.0);
        // Without multi_query it is GPT-2's attention again.
        let mha = Model::from_hf_config(&text.replace(r#""multi_query": true"#, r#""multi_query": false"#), "x");
        assert_eq!(mha.unwrap().kv_heads, 48);
    }
}
