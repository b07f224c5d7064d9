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
//!
//! A model comes from a `config.json` ([`Model::from_hf_config`], in `hf_config.rs`) or from a
//! preset ([`preset`], in `presets.rs`), which is such a file shipped in the binary.

use std::fmt;

mod hf_config;
mod presets;
pub use presets::{hub_ids, preset, presets};

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
    /// The width of the shared expert every token runs beside the routed ones, with its
    /// one-wide gate (Qwen2-MoE's); 0 where there is none.
    pub shared_expert: u64,
    /// Three MLP matrices (SwiGLU, GeGLU) rather than two.
    pub gated_mlp: bool,
    /// Blocks with a KV cache: all of them for decoders, none for BERT, T5's decoder stack.
    pub decoder_layers: u64,
    /// Sliding-window attention: in the layers that slide, the KV cache a sequence needs
    /// stops growing here.
    pub sliding_window: Option<u64>,
    /// The decoder layers (from 0, ascending) that attend to the whole sequence although the
    /// model has a window: Gemma 2's every other layer, Qwen2's below `max_window_layers`,
    /// those `layer_types` calls `full_attention`. Empty when every layer slides (Mistral) or
    /// none does (no window).
    pub global_layers: Vec<u64>,
    /// T5's relative-position buckets (one table per stack).
    pub relative_buckets: u64,
    /// Rotary positions' base (`rope_theta`, GPT-NeoX's `rotary_emb_base`); `None` where
    /// positions are not rotary (a learned table, ALiBi, T5's buckets).
    pub rope_theta: Option<f64>,
    /// How the rotary frequencies are stretched for contexts longer than trained (`rope_scaling`).
    pub rope_scaling: Option<RopeScaling>,
    /// The norms' epsilon (`rms_norm_eps`, `layer_norm_epsilon`, `layer_norm_eps`).
    pub norm_eps: f64,
}

/// A config's `rope_scaling` (transformers 5's `rope_parameters` other than the default).
#[derive(Clone, Debug, PartialEq)]
pub struct RopeScaling {
    /// `rope_type` (or the older `type`): `llama3`, `linear`, `dynamic`, `yarn`, `longrope`, ...
    pub kind: String,
    pub factor: Option<f64>,
    /// Llama 3's `low_freq_factor`, `high_freq_factor` and `original_max_position_embeddings`.
    pub low_freq_factor: Option<f64>,
    pub high_freq_factor: Option<f64>,
    pub original_max_position: Option<u64>,
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
    #[error("config.json field `{field}` must be {expected}, not {found}")]
    WrongType { field: &'static str, expected: &'static str, found: &'static str },
    #[error(
        "model type `{0}` is not supported yet (supported: llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, qwen2_moe, \
         gemma, gemma2, gemma3_text, phi3, gpt2, gpt_neox, bloom, bert, t5, mt5); a step of any model transformers builds can be recorded \
         without a GPU (python -m headroom_gpu record --model CONFIG --out step.jsonl, docs/RECORDING.md) and planned \
         on a GPU with `headroom plan --gpu h100 --program step.jsonl`"
    )]
    Unsupported(String),
    #[error("unknown model `{0}`; {1}")]
    Unknown(String, String),
    #[error("config.json {0}")]
    NotAnObject(String),
    #[error("config.json describes no model headroom can plan: {0}")]
    Invalid(String),
}

/// The most layers a model may have. The planner lays out a training step tensor by tensor,
/// every layer's and, on a pipeline rank, every layer's of each micro-batch in flight, and
/// replays it, and `--max-seq` or `--recommend` do that dozens of times: their time grows
/// with the layers (about 2 ms a layer for one plan of a small model). The deepest
/// transformers trained (DeepNet's 1,000 layers) fit, and the deepest plan's searches take
/// seconds; past it, a config is a typo or a probe.
pub(crate) const MAX_LAYERS: u64 = 1 << 10;

/// The most experts over all layers (layers × experts): an optimizer step lays out each
/// expert's parameters as tensors of their own. Kimi K2 has 61 × 384 = 23,424.
const MAX_EXPERT_LAYERS: u64 = 1 << 16;

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
                let shared = if self.shared_expert > 0 { 3 * h * w(self.shared_expert) + h } else { 0 };
                v * h * untied + l * (attention + mlp + shared + 2 * h + self.extra_norms()) + h
            }
        }
    }

    /// Whether the shapes make a model headroom can plan; what is wrong if not.
    /// Configurations from files go through this; the presets pass it.
    pub fn check(&self) -> Result<(), ModelError> {
        let bad = |why: String| Err(ModelError::Invalid(why));
        // Each dimension below 2^32 (and the layers at most 2^10) keeps every product
        // of two of them, and the parameter count, far from 64-bit overflow.
        if self.layers > MAX_LAYERS {
            return bad(format!(
                "{} layers are more than headroom plans ({MAX_LAYERS}: a step is laid out layer by layer, \
                 tensor by tensor, and the deepest transformers trained have about 1,000)",
                self.layers
            ));
        }
        for (what, v, max) in [
            ("the hidden size", self.hidden, 1u64 << 32),
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
        if self.experts > 1 && self.layers * self.experts > MAX_EXPERT_LAYERS {
            return bad(format!(
                "{} layers of {} experts are more than headroom plans ({MAX_EXPERT_LAYERS} experts over all layers: \
                 an optimizer step is laid out expert by expert)",
                self.layers, self.experts
            ));
        }
        if self.experts_per_token > self.experts {
            return bad(format!("{} experts per token, but only {} experts", self.experts_per_token, self.experts));
        }
        let ordered = self.global_layers.windows(2).all(|w| w[0] < w[1]);
        if !ordered || self.global_layers.last().is_some_and(|&l| l >= self.decoder_layers) {
            return bad(format!(
                "the global layers are not distinct decoder layers (of {}) in ascending order",
                self.decoder_layers
            ));
        }
        if self.sliding_window.is_none() && !self.global_layers.is_empty() {
            return bad("global layers are named, but there is no sliding window for the others".into());
        }
        let params = self.params_wide();
        if params > 1 << 53 {
            return bad(format!("{params} parameters are more than headroom plans (2^53)"));
        }
        Ok(())
    }

    /// Norm weights a layer has beyond the two every gated decoder has: Gemma-2's and Gemma 3's
    /// two around the MLP (`pre_feedforward_layernorm`, `post_feedforward_layernorm`), and Gemma
    /// 3's, Qwen3's and Qwen3-MoE's queries' and keys' (`q_norm`, `k_norm`, one head wide each).
    fn extra_norms(&self) -> u128 {
        match self.model_type {
            "gemma2" => 2 * self.hidden as u128,
            "qwen3" | "qwen3_moe" => 2 * self.head_dim as u128,
            "gemma3_text" => 2 * self.hidden as u128 + 2 * self.head_dim as u128,
            _ => 0,
        }
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

    /// Whether decoder layer `layer` (from 0) attends over the sliding window only, so keeps
    /// the keys and values of at most the window's tokens.
    pub fn slides(&self, layer: u64) -> bool {
        self.sliding_window.is_some()
            && layer < self.decoder_layers
            && self.global_layers.binary_search(&layer).is_err()
    }

    /// Tokens of a `seq`-token sequence whose keys and values the cache holds, averaged over
    /// the decoder layers, each layer's rounded up to whole blocks of `block` tokens: all of
    /// them in a layer that attends to the whole sequence, at most the window in one that
    /// slides. Gemma 2's alternate layers keep the whole sequence, so its window saves half
    /// what Mistral's, on every layer, saves.
    pub fn cached_tokens(&self, seq: u64, block: u64) -> f64 {
        let block = block.max(1);
        let kept = |tokens: u64| tokens.div_ceil(block) as f64 * block as f64;
        let Some(window) = self.sliding_window else { return kept(seq) };
        if self.global_layers.is_empty() {
            return kept(seq.min(window));
        }
        let layers = self.decoder_layers.max(1) as f64;
        let global = (self.global_layers.len() as f64).min(layers);
        ((layers - global) * kept(seq.min(window)) + global * kept(seq)) / layers
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
            shared_expert: 0,
            gated_mlp: false,
            decoder_layers: layers,
            sliding_window: None,
            global_layers: Vec::new(),
            relative_buckets: 0,
            rope_theta: None,
            rope_scaling: None,
            norm_eps: 1e-5,
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
