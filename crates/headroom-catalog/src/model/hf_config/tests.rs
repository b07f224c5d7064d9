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
    let gpt2 = r#"{"model_type":"gpt2","n_embd":768,"n_layer":12,"n_head":12,"n_positions":1024,"vocab_size":50257}"#;
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
    let cfg = include_str!("../../../../../data/models/qwen3-1.7b.json");
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
    let text = include_str!("../../../../../data/models/octocoder.json");
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
    let text = include_str!("../../../../../data/models/octocoder.json");
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
    let bloom =
        |fields: &str| Model::from_hf_config(&format!(r#"{{"model_type":"bloom","vocab_size":250880,{fields}}}"#), "b");
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
    let off = Model::from_hf_config(&GEMMA2_9B.replace(r#""sliding_window": 4096"#, r#""sliding_window": null"#), "x");
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
