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
mod tests {
    use super::*;
    use crate::model::preset;

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
    fn qwen3_counts_its_queries_and_keys_norms() {
        let cfg = include_str!("../../../../data/models/qwen3-1.7b.json");
        let m = Model::from_hf_config(cfg, "qwen3-1.7b").unwrap();
        // transformers' count of Qwen/Qwen3-1.7B's config: `q_norm` and `k_norm`, 128 wide
        // each, are 7,168 of them over 28 layers.
        assert_eq!(m.params(), 1_720_574_976);
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
        // Qwen3-30B-A3B: 30.5 B parameters, 3.3 B of them active a token (its model card);
        // transformers' count of the same config, its queries' and keys' norms included.
        assert_eq!(m.params(), 30_532_122_624);
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

    /// The hostile-input sweep's B8a: booleans, strings and lists of the wrong type were read
    /// as the family's default and planned a model nobody wrote.
    #[test]
    fn config_fields_of_the_wrong_type_are_refused_by_name() {
        let llama = r#"{"model_type":"llama","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,
            "num_key_value_heads":8,"intermediate_size":14336,"vocab_size":128256,"max_position_embeddings":8192"#;
        let t5 = r#"{"model_type":"t5","d_model":2048,"d_ff":5120,"d_kv":64,"num_heads":32,"num_layers":24,
            "vocab_size":32128"#;
        let qwen3_moe = r#"{"model_type": "qwen3_moe", "hidden_size": 2048, "moe_intermediate_size": 768,
            "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
            "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960"#;
        let read = |base: &str, field: &str| Model::from_hf_config(&format!("{base}, {field}}}"), "x");
        let wrong = |field: &'static str, expected: &'static str, found: &'static str| {
            Err(ModelError::WrongType { field, expected, found })
        };
        for (base, field, want) in [
            (llama, r#""tie_word_embeddings": "true""#, wrong("tie_word_embeddings", "true or false", "a string")),
            (llama, r#""tie_word_embeddings": 1"#, wrong("tie_word_embeddings", "true or false", "a number")),
            (llama, r#""tie_word_embeddings": [true]"#, wrong("tie_word_embeddings", "true or false", "an array")),
            (llama, r#""attention_bias": "false""#, wrong("attention_bias", "true or false", "a string")),
            (llama, r#""attention_bias": {}"#, wrong("attention_bias", "true or false", "an object")),
            (t5, r#""feed_forward_proj": 3"#, wrong("feed_forward_proj", "a string", "a number")),
            (t5, r#""tie_word_embeddings": "false""#, wrong("tie_word_embeddings", "true or false", "a string")),
            (qwen3_moe, r#""mlp_only_layers": "0""#, wrong("mlp_only_layers", "a list", "a string")),
            (qwen3_moe, r#""mlp_only_layers": 0"#, wrong("mlp_only_layers", "a list", "a number")),
            (qwen3_moe, r#""use_sliding_window": "true""#, wrong("use_sliding_window", "true or false", "a string")),
        ] {
            assert_eq!(read(base, field).map(|_| ()), want, "{field}");
        }
        // multi_query as a string: GPTBigCode's only switch between one key-value head and many.
        let text = include_str!("../../../../data/models/octocoder.json");
        let quoted = text.replace(r#""multi_query": true"#, r#""multi_query": "false""#);
        assert_eq!(
            Model::from_hf_config(&quoted, "x").unwrap_err().to_string(),
            "config.json field `multi_query` must be true or false, not a string"
        );
        // null is transformers' default, as an absent key is.
        assert!(read(llama, r#""tie_word_embeddings": null, "attention_bias": null"#).is_ok());
        assert!(read(qwen3_moe, r#""mlp_only_layers": null"#).is_ok());
    }

    /// A plan lays out every layer, and every expert's parameters, tensor by tensor: a depth
    /// or a count of experts past what that holds is refused by name before any work, however
    /// small each layer is.
    #[test]
    fn models_deeper_or_wider_in_experts_than_a_plan_lays_out_are_refused() {
        let llama = |layers: u64| {
            format!(
                r#"{{"model_type":"llama","hidden_size":256,"num_hidden_layers":{layers},"num_attention_heads":4,
                "intermediate_size":688,"vocab_size":1000,"max_position_embeddings":4096}}"#
            )
        };
        assert!(Model::from_hf_config(&llama(super::super::MAX_LAYERS), "x").is_ok());
        for layers in [super::super::MAX_LAYERS + 1, 1 << 14, 1 << 20, u64::MAX] {
            let e = Model::from_hf_config(&llama(layers), "x").unwrap_err().to_string();
            assert!(e.contains(&format!("{layers} layers are more than headroom plans (1024")), "{e}");
        }
        let moe = |layers: u64, experts: u64| {
            format!(
                r#"{{"model_type": "qwen3_moe", "hidden_size": 256, "moe_intermediate_size": 64,
                "num_hidden_layers": {layers}, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64,
                "num_experts": {experts}, "num_experts_per_tok": 2, "vocab_size": 1000, "max_position_embeddings": 4096}}"#
            )
        };
        // Kimi K2's 61 layers of 384 experts, and the most there may be.
        assert!(Model::from_hf_config(&moe(61, 384), "x").is_ok());
        assert!(Model::from_hf_config(&moe(4, 1 << 14), "x").is_ok());
        let e = Model::from_hf_config(&moe(4, (1 << 14) + 1), "x").unwrap_err().to_string();
        assert!(e.contains("4 layers of 16385 experts are more than headroom plans (65536"), "{e}");
    }

    #[test]
    fn t5_feed_forward_is_an_activation_or_a_gated_one() {
        let t5 =
            r#"{"model_type":"t5","d_model":512,"d_ff":1024,"d_kv":64,"num_heads":8,"num_layers":6,"vocab_size":32128"#;
        let gated = |proj: &str| Model::from_hf_config(&format!(r#"{t5}, "feed_forward_proj": "{proj}"}}"#), "x");
        assert!(!gated("relu").unwrap().gated_mlp);
        assert!(gated("gated-gelu").unwrap().gated_mlp);
        assert!(gated("gated-silu").unwrap().gated_mlp);
        for bad in ["gelu-gated", "gated-gelu-new", "gated", "", "gated-"] {
            assert!(matches!(gated(bad), Err(ModelError::Invalid(_))), "{bad:?}");
        }
    }

    #[test]
    fn bloom_takes_its_older_spellings_when_they_agree() {
        let bloom = |fields: &str| {
            Model::from_hf_config(&format!(r#"{{"model_type":"bloom","vocab_size":250880,{fields}}}"#), "b")
        };
        let modern = bloom(r#""hidden_size":4096,"n_layer":30,"n_head":32"#).unwrap();
        assert_eq!(modern.params(), 7_069_016_064);
        assert_eq!(bloom(r#""n_embed":4096,"num_hidden_layers":30,"num_attention_heads":32"#).unwrap(), modern);
        assert_eq!(bloom(r#""n_embed":4096,"hidden_size":4096,"n_layer":30,"n_head":32"#).unwrap(), modern);
        let e = bloom(r#""n_embed":4096,"hidden_size":1024,"n_layer":30,"n_head":32"#).unwrap_err().to_string();
        assert!(e.contains("`hidden_size` (1024) and `n_embed` (4096) name the same figure and disagree"), "{e}");
        let e = bloom(r#""hidden_size":4096,"n_layer":30"#).unwrap_err().to_string();
        assert_eq!(e, "config.json lacks `n_head`, which a bloom model needs");
    }

    /// google/gemma-2-9b's config.json.
    const GEMMA2_9B: &str = r#"{"architectures": ["Gemma2ForCausalLM"], "attention_bias": false,
        "attention_dropout": 0.0, "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
        "eos_token_id": 1, "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584, "initializer_range": 0.02,
        "intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "gemma2",
        "num_attention_heads": 16, "num_hidden_layers": 42, "num_key_value_heads": 8, "pad_token_id": 0,
        "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
        "sliding_window_size": 4096, "use_cache": true, "vocab_size": 256000}"#;

    fn with(base: &str, fields: &str) -> Result<Model, ModelError> {
        let base = base.trim_end().strip_suffix('}').unwrap();
        Model::from_hf_config(&format!("{base}, {fields}}}"), "x")
    }

    /// The hostile-input sweep's B7: Gemma 2's window was applied to every layer, where its
    /// odd layers attend to the whole sequence.
    #[test]
    fn gemma2_slides_on_every_other_layer() {
        let m = Model::from_hf_config(GEMMA2_9B, "gemma-2-9b").unwrap();
        // transformers' count of the same config (its four norms a layer counted).
        assert_eq!(m.params(), 9_241_705_984);
        assert_eq!(m.sliding_window, Some(4096));
        assert_eq!(m.global_layers, (0..21).map(|i| 2 * i + 1).collect::<Vec<u64>>());
        assert!(m.slides(0) && !m.slides(1) && m.slides(40) && !m.slides(41) && !m.slides(42));
        // 21 layers keep 4096 of 8192 tokens, 21 keep all: 6144 a layer.
        assert_eq!(m.cached_tokens(8192, 16), 6144.0);
        assert_eq!(m.cached_tokens(1000, 16), 1008.0);
        // Gemma2Config's window when the key is absent; null turns it off.
        let absent = GEMMA2_9B.replace(r#""sliding_window": 4096,"#, "");
        assert_eq!(Model::from_hf_config(&absent, "x").unwrap(), m.clone().renamed("x"));
        let off =
            Model::from_hf_config(&GEMMA2_9B.replace(r#""sliding_window": 4096"#, r#""sliding_window": null"#), "x");
        let off = off.unwrap();
        assert_eq!((off.sliding_window, off.global_layers.len(), off.cached_tokens(8192, 16)), (None, 0, 8192.0));
    }

    #[test]
    fn layer_types_say_which_layers_slide_where_a_config_lists_them() {
        let types = |last: &str| {
            let mut t = vec![r#""sliding_attention""#; 41];
            t.push(last);
            format!(r#""layer_types": [{}]"#, t.join(", "))
        };
        let m = with(GEMMA2_9B, &types(r#""full_attention""#)).unwrap();
        assert_eq!(m.global_layers, [41]);
        assert_eq!(m.cached_tokens(8192, 1), (41.0 * 4096.0 + 8192.0) / 42.0);
        let e = with(GEMMA2_9B, &types(r#""chunked_attention""#)).unwrap_err().to_string();
        assert!(e.contains("`layer_types` gives layer 41 \"chunked_attention\""), "{e}");
        let e = with(GEMMA2_9B, r#""layer_types": ["full_attention"]"#).unwrap_err().to_string();
        assert!(e.contains("`layer_types` lists 1 layers, but `num_hidden_layers` is 42"), "{e}");
        assert_eq!(
            with(GEMMA2_9B, r#""layer_types": "sliding_attention""#),
            Err(ModelError::WrongType { field: "layer_types", expected: "a list", found: "a string" })
        );
        // Every layer full: no layer slides, so no window.
        let all_full = format!(r#""layer_types": [{}]"#, vec![r#""full_attention""#; 42].join(", "));
        assert_eq!(with(GEMMA2_9B, &all_full).unwrap().sliding_window, None);
    }

    #[test]
    fn each_family_slides_as_its_transformers_code_does() {
        let decoder = |model_type: &str, fields: &str| {
            Model::from_hf_config(
                &format!(
                    r#"{{"model_type": "{model_type}", "hidden_size": 512, "num_hidden_layers": 28,
                    "num_attention_heads": 8, "intermediate_size": 1024, "vocab_size": 1000,
                    "max_position_embeddings": 32768{fields}}}"#
                ),
                "x",
            )
        };
        let slides = |m: Model| (m.sliding_window, (0..28).filter(|&l| m.slides(l)).count());
        // Mistral and Mixtral on every layer; Mistral's code ignores layer_types.
        assert_eq!(slides(decoder("mistral", r#", "sliding_window": 4096"#).unwrap()), (Some(4096), 28));
        assert_eq!(slides(decoder("mistral", "").unwrap()), (Some(4096), 28));
        let listed = format!(r#", "layer_types": [{}]"#, vec![r#""full_attention""#; 28].join(", "));
        assert_eq!(slides(decoder("mistral", &listed).unwrap()), (Some(4096), 28));
        assert_eq!(slides(decoder("mixtral", r#", "sliding_window": 4096"#).unwrap()), (Some(4096), 28));
        assert_eq!(slides(decoder("mixtral", "").unwrap()), (None, 0));
        // Llama's code has no window, whatever the config writes.
        assert_eq!(slides(decoder("llama", r#", "sliding_window": 4096"#).unwrap()), (None, 0));
        // Qwen2: only under use_sliding_window, and from max_window_layers (28 unless given) on.
        let qwen = |fields: &str| slides(decoder("qwen2", &format!(r#", "sliding_window": 4096{fields}"#)).unwrap());
        assert_eq!(qwen(""), (None, 0));
        assert_eq!(qwen(r#", "use_sliding_window": true"#), (None, 0));
        assert_eq!(qwen(r#", "use_sliding_window": true, "max_window_layers": 21"#), (Some(4096), 7));
        assert_eq!(qwen(r#", "use_sliding_window": true, "max_window_layers": 0"#), (Some(4096), 28));
        assert_eq!(qwen(r#", "use_sliding_window": false, "max_window_layers": 0"#), (None, 0));
        let q = decoder("qwen2", r#", "use_sliding_window": true, "max_window_layers": 21"#).unwrap();
        assert_eq!(q.global_layers, (0..21).collect::<Vec<u64>>());
        for (bad, why) in
            [("-1", "it must be a whole number, 0 or more"), (r#""21""#, "must be a whole number, not a string")]
        {
            let e = decoder("qwen2", &format!(r#", "use_sliding_window": true, "max_window_layers": {bad}"#));
            let e = e.unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        // A model too deep to plan is refused by its checks, with no list of layers built.
        let deep = GEMMA2_9B.replace(r#""num_hidden_layers": 42"#, r#""num_hidden_layers": 1099511627776"#);
        assert!(matches!(Model::from_hf_config(&deep, "x"), Err(ModelError::Invalid(_))));
    }
}
