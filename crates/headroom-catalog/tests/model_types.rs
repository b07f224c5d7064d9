//! Model types read since the first families: Qwen2-MoE (a shared expert beside the routed
//! ones) and Gemma 3's text model (norms around the MLP and on the queries and keys, five
//! sliding layers to one global). Each is held to the parameter count transformers builds
//! from the same config.json.

use headroom_catalog::model::{Model, ModelError};

/// Qwen/Qwen1.5-MoE-A2.7B's config.json.
const QWEN15_MOE_A27B: &str = include_str!("../../../data/models/qwen1.5-moe-a2.7b.json");

/// google/gemma-3-1b-pt's config.json.
const GEMMA3_1B: &str = include_str!("../../../data/models/gemma-3-1b.json");

#[test]
fn qwen2_moe_counts_its_shared_expert_and_its_biases() {
    let m = Model::from_hf_config(QWEN15_MOE_A27B, "qwen1.5-moe-a2.7b").unwrap();
    assert_eq!((m.experts, m.experts_per_token, m.intermediate, m.shared_expert), (60, 4, 1408, 5632));
    assert!(m.qkv_bias && !m.tied_embeddings && m.sliding_window.is_none());
    // transformers' Qwen2MoeForCausalLM of this config: 14,315,784,192 parameters; "2.7B
    // activated" (its model card), the shared expert among them.
    assert_eq!(m.params(), 14_315_784_192);
    assert_eq!(m.active_params() / 100_000_000, 26);
    // Dense layers among the experts are refused, not miscounted, as for Qwen3-MoE.
    let dense = QWEN15_MOE_A27B.replace(r#""mlp_only_layers": []"#, r#""mlp_only_layers": [3]"#);
    assert!(matches!(Model::from_hf_config(&dense, "x"), Err(ModelError::Invalid(_))));
}

#[test]
fn gemma3_text_counts_its_extra_norms_and_slides_five_layers_of_six() {
    let m = Model::from_hf_config(GEMMA3_1B, "gemma-3-1b").unwrap();
    // transformers' Gemma3ForCausalLM of this config: 999,885,952 parameters.
    assert_eq!(m.params(), 999_885_952);
    assert!(m.tied_embeddings);
    assert_eq!(m.sliding_window, Some(512));
    assert_eq!(m.global_layers, vec![5, 11, 17, 23]);
    // `layer_types` where the config lists them, as transformers 5 writes them.
    let types: Vec<String> =
        (0..26).map(|i| if i % 2 == 0 { "\"full_attention\"" } else { "\"sliding_attention\"" }.to_string()).collect();
    let listed =
        GEMMA3_1B.replace(r#""sliding_window_pattern": 6"#, &format!(r#""layer_types": [{}]"#, types.join(",")));
    let m = Model::from_hf_config(&listed, "x").unwrap();
    assert_eq!(m.global_layers, (0..26).step_by(2).collect::<Vec<u64>>());
    // Gemma3TextConfig's head dimension (256) where the file gives none, not hidden / heads.
    let no_head_dim = GEMMA3_1B.replace(r#""head_dim": 256,"#, "");
    assert_ne!(no_head_dim, GEMMA3_1B);
    assert_eq!(Model::from_hf_config(&no_head_dim, "x").unwrap().head_dim, 256);
}
