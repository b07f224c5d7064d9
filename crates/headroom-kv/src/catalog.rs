//! The models and GPUs the serving simulator knows by name: headroom's
//! catalogs (`headroom_catalog::model`, `headroom_catalog::gpu`), which the
//! planner names them from too.

pub use headroom_catalog::gpu::{gpu, gpus, GpuSpec};
pub use headroom_catalog::model::Model as ModelSpec;

/// A model preset by name, with the known names in the error.
pub fn model(name: &str) -> Result<ModelSpec, headroom_catalog::model::ModelError> {
    headroom_catalog::model::preset(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_bytes_per_token_match_the_published_table() {
        // research/estimation.md §3.1, bf16.
        for (name, kib) in [
            ("llama-2-13b", 800.0),
            ("Llama_3_8B", 128.0),
            ("llama-2-70b", 320.0),
            ("qwen2.5-7b", 56.0),
            ("gemma-2b", 18.0),
            ("gpt2", 36.0),
        ] {
            assert_eq!(model(name).unwrap().kv_bytes_per_token(2.0), kib * 1024.0, "{name}");
        }
        assert!(model("gpt5").unwrap_err().to_string().contains("known presets: gpt2"));
        assert!(gpu("H100-SXM").is_ok());
    }
}
