//! Reading a Hugging Face `config.json`: the keys transformers writes for each family, with
//! the defaults its configuration classes take when a key is absent or `null`. Users' files
//! and the presets go through the same reader.

use super::{Family, Model, ModelError, RopeScaling};
use serde_json::{Map, Value};

/// The `model_type`s the reader knows, as [`Model::model_type`] keeps them.
const MODEL_TYPES: &[&str] = &[
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "qwen2_moe",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "gpt2",
    "gpt_bigcode",
    "gpt_neox",
    "bloom",
    "bert",
    "t5",
    "mt5",
];

impl Model {
    /// Reads a Hugging Face `config.json`, and checks the shapes it gives.
    pub fn from_hf_config(text: &str, name: &str) -> Result<Model, ModelError> {
        let fields = object(text)?;
        let config = Config::new(&fields, name)?;
        let m = match config.model_type {
            "gpt2" | "gpt_bigcode" => config.gpt2(),
            "gpt_neox" | "bloom" | "bert" => config.biased(),
            "t5" | "mt5" => config.t5(),
            _ => config.gated_decoder(),
        }?;
        m.check()?;
        Ok(m)
    }
}

/// The file's top-level object, read strictly (a key given twice is refused).
fn object(text: &str) -> Result<Map<String, Value>, ModelError> {
    let v = crate::json::parse(text).map_err(|e| {
        ModelError::Json(if e.is_data() { format!("is not usable: {e}") } else { format!("is not valid JSON: {e}") })
    })?;
    match v {
        Value::Object(fields) => Ok(fields),
        other => Err(ModelError::NotAnObject(format!("is {}, not a JSON object", crate::json::kind(&other)))),
    }
}

/// One config's fields, read by type: the family readers below ask for each key as what it is.
struct Config<'a> {
    fields: &'a Map<String, Value>,
    model_type: &'static str,
    name: &'a str,
}

impl<'a> Config<'a> {
    fn new(fields: &'a Map<String, Value>, name: &'a str) -> Result<Config<'a>, ModelError> {
        let model_type = match fields.get("model_type") {
            Some(Value::String(t)) => t.as_str(),
            Some(other) => {
                return Err(ModelError::NotAnObject(format!(
                    "field `model_type` must be a string, not {}",
                    crate::json::kind(other)
                )))
            }
            None => return Err(ModelError::NotAnObject("has no `model_type` (e.g. \"llama\", \"gpt2\")".into())),
        };
        let model_type = MODEL_TYPES
            .iter()
            .copied()
            .find(|&t| t == model_type)
            .ok_or_else(|| ModelError::Unsupported(model_type.into()))?;
        Ok(Config { fields, model_type, name })
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.fields.get(key).filter(|v| !v.is_null())
    }

    /// A positive integer, or `None` when absent or `null` (transformers' default then).
    fn uint(&self, key: &'static str) -> Result<Option<u64>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(x) => x.as_u64().filter(|&n| n > 0).map(Some).ok_or(ModelError::NotPositive(key)),
        }
    }

    /// A positive integer; `default` when absent, `None` when `null` (a window turned off).
    fn uint_unless_null(&self, key: &'static str, default: u64) -> Result<Option<u64>, ModelError> {
        match self.fields.get(key) {
            None => Ok(Some(default)),
            Some(_) => self.uint(key),
        }
    }

    /// A whole number, 0 included; `default` when absent or `null`.
    fn count(&self, key: &'static str, default: u64) -> Result<u64, ModelError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) if v.is_number() => v
                .as_u64()
                .ok_or_else(|| ModelError::Invalid(format!("`{key}` is {v}; it must be a whole number, 0 or more"))),
            Some(_) => Err(self.wrong(key, "a whole number")),
        }
    }

    /// A positive integer the family cannot do without.
    fn need(&self, key: &'static str) -> Result<u64, ModelError> {
        self.uint(key)?.ok_or_else(|| ModelError::Missing(key, self.model_type.into()))
    }

    /// One figure under either of two names transformers accepts for it (a configuration
    /// class's `attribute_map`, or an older spelling): both given must agree.
    fn either(&self, [key, alias]: [&'static str; 2]) -> Result<Option<u64>, ModelError> {
        match (self.uint(key)?, self.uint(alias)?) {
            (Some(a), Some(b)) if a != b => {
                Err(ModelError::Invalid(format!("`{key}` ({a}) and `{alias}` ({b}) name the same figure and disagree")))
            }
            (a, b) => Ok(a.or(b)),
        }
    }

    fn need_either(&self, keys: [&'static str; 2]) -> Result<u64, ModelError> {
        self.either(keys)?.ok_or_else(|| ModelError::Missing(keys[0], self.model_type.into()))
    }

    /// A value of the wrong type, refused by name: read as the default it would plan a model
    /// nobody wrote (`"tie_word_embeddings": "true"` is not `true`).
    fn wrong(&self, field: &'static str, expected: &'static str) -> ModelError {
        let found = self.get(field).map_or("null", crate::json::kind);
        ModelError::WrongType { field, expected, found }
    }

    /// `true` or `false`, or the family's default when absent or `null`.
    fn flag(&self, key: &'static str, default: bool) -> Result<bool, ModelError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.wrong(key, "true or false")),
        }
    }

    fn string(&self, key: &'static str) -> Result<Option<&'a str>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.wrong(key, "a string")),
        }
    }

    fn list(&self, key: &'static str) -> Result<&'a [Value], ModelError> {
        match self.get(key) {
            None => Ok(&[]),
            Some(v) => v.as_array().map(Vec::as_slice).ok_or_else(|| self.wrong(key, "a list")),
        }
    }

    /// What every family starts from: one dense stack, no window, every field the family
    /// reader does not set.
    fn base(&self, family: Family) -> Model {
        Model {
            name: self.name.to_string(),
            family,
            model_type: self.model_type,
            hidden: 0,
            layers: 0,
            heads: 0,
            kv_heads: 0,
            head_dim: 0,
            intermediate: 0,
            vocab: 0,
            max_position: 0,
            tied_embeddings: true,
            qkv_bias: false,
            experts: 1,
            experts_per_token: 1,
            shared_expert: 0,
            gated_mlp: false,
            decoder_layers: 0,
            sliding_window: None,
            global_layers: Vec::new(),
            relative_buckets: 0,
            rope_theta: None,
            rope_scaling: None,
            norm_eps: 1e-5,
        }
    }

    /// GPT-2 (`GPT2Config`), and GPTBigCode (StarCoder), which is GPT-2's code with
    /// `multi_query`: one key-value head.
    fn gpt2(&self) -> Result<Model, ModelError> {
        let hidden = self.need("n_embd")?;
        let heads = self.need("n_head")?;
        let layers = self.need("n_layer")?;
        let bigcode = self.model_type == "gpt_bigcode";
        Ok(Model {
            hidden,
            layers,
            heads,
            kv_heads: if bigcode && self.flag("multi_query", true)? { 1 } else { heads },
            head_dim: derived_head_dim(hidden, heads)?,
            intermediate: self.uint("n_inner")?.unwrap_or(hidden.saturating_mul(4)),
            vocab: self.need("vocab_size")?,
            max_position: self.need("n_positions")?,
            qkv_bias: true,
            decoder_layers: layers,
            norm_eps: self.float("layer_norm_epsilon")?.unwrap_or(1e-5),
            ..self.base(Family::Gpt2)
        })
    }

    /// The LayerNorm-with-bias families: GPT-NeoX (Pythia), BLOOM and BERT.
    fn biased(&self) -> Result<Model, ModelError> {
        let family = match self.model_type {
            "gpt_neox" => Family::NeoX,
            "bloom" => Family::Bloom,
            _ => Family::Bert,
        };
        let (hidden, heads, layers) = if family == Family::Bloom {
            // `BloomConfig` still takes the `n_embed` of the first BLOOM files, and maps
            // `num_attention_heads` and `num_hidden_layers` onto its own names.
            (
                self.need_either(["hidden_size", "n_embed"])?,
                self.need_either(["n_head", "num_attention_heads"])?,
                self.need_either(["n_layer", "num_hidden_layers"])?,
            )
        } else {
            (self.need("hidden_size")?, self.need("num_attention_heads")?, self.need("num_hidden_layers")?)
        };
        Ok(Model {
            hidden,
            layers,
            heads,
            kv_heads: heads,
            head_dim: derived_head_dim(hidden, heads)?,
            // BLOOM's MLP is 4h whatever its config says.
            intermediate: match family {
                Family::Bloom => hidden.saturating_mul(4),
                _ => self.need("intermediate_size")?,
            },
            vocab: self.need("vocab_size")?,
            // BLOOM has no position table (ALiBi); 2048 is the length it was trained at.
            max_position: match family {
                Family::Bloom => self.uint("seq_length")?.unwrap_or(2048),
                _ => self.need("max_position_embeddings")?,
            },
            tied_embeddings: self.flag("tie_word_embeddings", family != Family::NeoX)?,
            qkv_bias: true,
            decoder_layers: if family == Family::Bert { 0 } else { layers },
            rope_theta: match family {
                Family::NeoX => Some(self.float("rotary_emb_base")?.unwrap_or(10000.0)),
                _ => None,
            },
            norm_eps: match family {
                Family::Bloom => self.float("layer_norm_epsilon")?.unwrap_or(1e-5),
                Family::Bert => self.float("layer_norm_eps")?.unwrap_or(1e-12),
                _ => self.float("layer_norm_eps")?.unwrap_or(1e-5),
            },
            ..self.base(family)
        })
    }

    /// T5 and mT5 (`T5Config`): an encoder and a decoder stack, each `num_layers` deep
    /// unless `num_decoder_layers` says otherwise.
    fn t5(&self) -> Result<Model, ModelError> {
        let encoder = self.need("num_layers")?;
        let decoder = self.uint("num_decoder_layers")?.unwrap_or(encoder);
        let heads = self.need("num_heads")?;
        let gated_mlp = self.gated_feed_forward()?;
        Ok(Model {
            hidden: self.need("d_model")?,
            layers: encoder.saturating_add(decoder),
            heads,
            kv_heads: heads,
            head_dim: self.need("d_kv")?,
            intermediate: self.need("d_ff")?,
            vocab: self.need("vocab_size")?,
            max_position: self.uint("n_positions")?.unwrap_or(512),
            tied_embeddings: self.flag("tie_word_embeddings", true)?,
            gated_mlp,
            decoder_layers: decoder,
            relative_buckets: self.uint("relative_attention_num_buckets")?.unwrap_or(32),
            norm_eps: self.float("layer_norm_epsilon")?.unwrap_or(1e-6),
            ..self.base(Family::T5)
        })
    }

    /// Whether T5's feed-forward is gated: `feed_forward_proj` is an activation, or
    /// `gated-` and one, as `T5Config` reads it (and refuses anything else).
    fn gated_feed_forward(&self) -> Result<bool, ModelError> {
        let ff = self.string("feed_forward_proj")?.unwrap_or("relu");
        match ff.split('-').collect::<Vec<_>>()[..] {
            [act] if !act.is_empty() && act != "gated" => Ok(false),
            ["gated", act] if !act.is_empty() => Ok(true),
            _ => Err(ModelError::Invalid(format!(
                "`feed_forward_proj` is \"{ff}\"; T5 takes an activation, or `gated-` and one (\"relu\", \"gated-gelu\")"
            ))),
        }
    }

    /// Llama and the families built like it: RMSNorm, rotary positions, a gated MLP,
    /// grouped key-value heads, and for some a mixture of experts or a sliding window.
    fn gated_decoder(&self) -> Result<Model, ModelError> {
        let hidden = self.need("hidden_size")?;
        let heads = self.need("num_attention_heads")?;
        let layers = self.need("num_hidden_layers")?;
        let moe = matches!(self.model_type, "qwen3_moe" | "qwen2_moe");
        if moe {
            self.every_layer_a_mixture()?;
        }
        let experts = self.uint(if moe { "num_experts" } else { "num_local_experts" })?.unwrap_or(1);
        let (sliding_window, global_layers) = self.sliding(layers)?;
        Ok(Model {
            hidden,
            layers,
            heads,
            kv_heads: self.uint("num_key_value_heads")?.unwrap_or(heads),
            head_dim: match self.uint("head_dim")? {
                Some(d) => d,
                // Gemma3TextConfig's default, whatever the hidden size.
                None if self.model_type == "gemma3_text" => 256,
                None => derived_head_dim(hidden, heads)?,
            },
            // Qwen2-MoE's shared expert, as wide as its config says (transformers' default 5632).
            shared_expert: if self.model_type == "qwen2_moe" {
                self.uint("shared_expert_intermediate_size")?.unwrap_or(5632)
            } else {
                0
            },
            // A Qwen-MoE expert's width; its `intermediate_size` is a dense layer's, unused.
            intermediate: self.need(if moe { "moe_intermediate_size" } else { "intermediate_size" })?,
            vocab: self.need("vocab_size")?,
            max_position: self.need("max_position_embeddings")?,
            // Each family's default in transformers.
            tied_embeddings: self
                .flag("tie_word_embeddings", matches!(self.model_type, "gemma" | "gemma2" | "gemma3_text"))?,
            qkv_bias: match self.model_type {
                "qwen2" => true,
                // Qwen2MoeConfig's `qkv_bias`, true unless it says otherwise.
                "qwen2_moe" => self.flag("qkv_bias", true)?,
                _ => self.flag("attention_bias", false)?,
            },
            experts,
            experts_per_token: self.uint("num_experts_per_tok")?.unwrap_or(if experts > 1 { 2 } else { 1 }),
            gated_mlp: true,
            decoder_layers: layers,
            sliding_window,
            global_layers,
            // Each family's defaults in transformers.
            rope_theta: Some(self.rope_theta(if self.model_type == "mixtral" { 1e6 } else { 10000.0 })?),
            rope_scaling: self.rope_scaling()?,
            norm_eps: self.float("rms_norm_eps")?.unwrap_or(match self.model_type {
                "mixtral" | "phi3" => 1e-5,
                _ => 1e-6,
            }),
            ..self.base(Family::GatedDecoder)
        })
    }

    /// The sliding window and the layers that attend to the whole sequence despite it, as
    /// each family's transformers code decides: `layer_types` where the config lists it, else
    /// the family's rule. Llama and Gemma have no window; Mistral, Mixtral, Phi-3 and
    /// Qwen3-MoE slide on every layer; Gemma 2 on every other, from the first; Qwen2 and Qwen3
    /// from `max_window_layers` on. Qwen's configs write a window they use only under
    /// `use_sliding_window`.
    fn sliding(&self, layers: u64) -> Result<(Option<u64>, Vec<u64>), ModelError> {
        let window = match self.model_type {
            // Their configuration classes' default when the key is absent; `null` turns it off.
            "mistral" | "gemma2" | "gemma3_text" => self.uint_unless_null("sliding_window", 4096)?,
            "mixtral" | "phi3" => self.uint("sliding_window")?,
            "qwen2" | "qwen3" | "qwen3_moe" | "qwen2_moe" if self.flag("use_sliding_window", false)? => {
                self.uint_unless_null("sliding_window", 4096)?
            }
            _ => None,
        };
        // A model with more layers than check() allows is refused there; no list is built for it.
        let Some(window) = window.filter(|_| layers <= super::MAX_LAYERS) else { return Ok((window, Vec::new())) };
        // MistralConfig warns that it ignores `layer_types` (Ministral's code reads them).
        let listed = if self.model_type == "mistral" { None } else { self.layer_types(layers)? };
        let global: Vec<u64> = match listed {
            Some(slides) => (0..layers).filter(|&i| !slides[i as usize]).collect(),
            None => match self.model_type {
                "gemma2" => (0..layers).filter(|i| i % 2 == 1).collect(),
                // Gemma 3: every `sliding_window_pattern`-th layer global (Gemma3TextConfig's 6).
                "gemma3_text" => {
                    let every = self.uint("sliding_window_pattern")?.unwrap_or(6);
                    (0..layers).filter(|i| (i + 1) % every == 0).collect()
                }
                "qwen2" | "qwen3" => (0..layers.min(self.count("max_window_layers", 28)?)).collect(),
                _ => Vec::new(),
            },
        };
        if global.len() as u64 == layers {
            return Ok((None, Vec::new()));
        }
        Ok((Some(window), global))
    }

    /// Which layers slide, from `layer_types` (`sliding_attention` or `full_attention` a layer).
    fn layer_types(&self, layers: u64) -> Result<Option<Vec<bool>>, ModelError> {
        let Some(types) = self.get("layer_types") else { return Ok(None) };
        let types = types.as_array().ok_or_else(|| self.wrong("layer_types", "a list"))?;
        if types.len() as u64 != layers {
            return Err(ModelError::Invalid(format!(
                "`layer_types` lists {} layers, but `num_hidden_layers` is {layers}",
                types.len()
            )));
        }
        types
            .iter()
            .enumerate()
            .map(|(i, t)| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(ModelError::Invalid(format!(
                    "`layer_types` gives layer {i} {t}; headroom plans \"sliding_attention\" and \"full_attention\""
                ))),
            })
            .collect::<Result<_, _>>()
            .map(Some)
    }

    /// A positive number, or `None` when absent or `null`.
    fn float(&self, key: &'static str) -> Result<Option<f64>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x > 0.0 && x.is_finite() => Ok(Some(x)),
                Some(_) => Err(ModelError::Invalid(format!("`{key}` is {v}; it must be a positive number"))),
                None => Err(self.wrong(key, "a number")),
            },
        }
    }

    /// The rotary positions' parameters: `rope_scaling`, or transformers 5's `rope_parameters`.
    fn rope_parameters(&self) -> Result<Option<Config<'a>>, ModelError> {
        let key = if self.get("rope_scaling").is_some() { "rope_scaling" } else { "rope_parameters" };
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(fields)) => Ok(Some(Config { fields, model_type: self.model_type, name: self.name })),
            Some(_) => Err(self.wrong(key, "an object")),
        }
    }

    /// `rope_theta`, at the top level or among transformers 5's `rope_parameters`.
    fn rope_theta(&self, default: f64) -> Result<f64, ModelError> {
        let nested = match self.get("rope_parameters") {
            Some(Value::Object(fields)) => {
                Config { fields, model_type: self.model_type, name: self.name }.float("rope_theta")?
            }
            _ => None,
        };
        Ok(self.float("rope_theta")?.or(nested).unwrap_or(default))
    }

    /// The rotary frequencies' stretching, unless its type is `default` (none).
    fn rope_scaling(&self) -> Result<Option<RopeScaling>, ModelError> {
        let Some(rope) = self.rope_parameters()? else { return Ok(None) };
        let kind = match (rope.string("rope_type")?, rope.string("type")?) {
            (Some(k), _) | (None, Some(k)) => k,
            (None, None) => "default",
        };
        if kind == "default" {
            return Ok(None);
        }
        Ok(Some(RopeScaling {
            kind: kind.to_string(),
            factor: rope.float("factor")?,
            low_freq_factor: rope.float("low_freq_factor")?,
            high_freq_factor: rope.float("high_freq_factor")?,
            original_max_position: rope.uint("original_max_position_embeddings")?,
        }))
    }

    /// Qwen3-MoE and Qwen2-MoE may keep some layers dense; the plan counts every layer alike,
    /// so such a config is refused rather than miscounted.
    fn every_layer_a_mixture(&self) -> Result<(), ModelError> {
        let dense = !self.list("mlp_only_layers")?.is_empty();
        if dense || self.uint("decoder_sparse_step")?.unwrap_or(1) != 1 {
            return Err(ModelError::Invalid(
                "a Qwen MoE config with dense layers (mlp_only_layers, decoder_sparse_step); \
                 headroom plans every layer as a mixture of experts"
                    .into(),
            ));
        }
        Ok(())
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

#[cfg(test)]
mod tests;
