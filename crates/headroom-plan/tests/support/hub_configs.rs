//! config.json of models no preset or bundled file holds, as their hubs ship them (the fields
//! the catalog reads), for the tests that plan them.

/// google/gemma-2-2b.
pub const GEMMA_2_2B: &str = r#"{"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
    "max_position_embeddings": 8192, "sliding_window": 4096, "query_pre_attn_scalar": 256}"#;

/// Qwen/Qwen3-30B-A3B: 128 experts 768 wide, 8 a token.
pub const QWEN3_30B_A3B: &str = r#"{"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
    "max_position_embeddings": 40960, "tie_word_embeddings": false}"#;
