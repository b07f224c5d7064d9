//! The KV cache of a model whose window slides on some layers only: the hostile-input
//! sweep's B7, where Gemma 2's window was applied to every layer and a serving engine was
//! planned to hold half as many sequences again as it does.

use headroom_plan::engine::Engine;
use headroom_plan::gpu::gpu;
use headroom_plan::infer::{estimate, InferConfig, InferEstimate, Runtime, WeightFormat};
use headroom_plan::model::{preset, Model};
use headroom_plan::sglang::Sglang;

/// google/gemma-2-9b's config.json, the keys that shape it.
const GEMMA2_9B: &str = r#"{"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336,
    "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
    "vocab_size": 256000, "max_position_embeddings": 8192, "sliding_window": 4096}"#;

fn plan(model: &Model, runtime: Runtime, seq: u64) -> InferEstimate {
    let cfg =
        InferConfig { runtime, batch: 1, seq, weights: WeightFormat::Bf16, kv_bytes: 2.0, tensor: 1, quantize: None };
    estimate(model, &gpu("h100-sxm").unwrap(), &cfg)
}

#[test]
fn gemma2_keeps_the_whole_sequence_in_its_global_layers() {
    let g = gpu("h100-sxm").unwrap();
    let windowed = Model::from_hf_config(GEMMA2_9B, "gemma-2-9b").unwrap();
    let whole =
        Model::from_hf_config(&GEMMA2_9B.replace(r#""sliding_window": 4096"#, r#""sliding_window": null"#), "x")
            .unwrap();
    for runtime in [Runtime::Vllm(Engine::vllm_defaults(&g)), Runtime::Sglang(Sglang::defaults(&g, 1))] {
        let (with, without) = (plan(&windowed, runtime, 8192), plan(&whole, runtime, 8192));
        // The same pool and the same bytes a token; half the layers keep 4096 of the 8192
        // tokens, so a sequence takes 6144 tokens' worth (it had taken 4096: 33 sequences).
        assert_eq!(with.max_tokens, without.max_tokens, "{runtime:?}");
        assert_eq!(without.max_sequences, without.max_tokens / 8192, "{runtime:?}");
        assert_eq!(with.max_sequences, with.max_tokens / 6144, "{runtime:?}");
        // Within the window every layer keeps the whole sequence.
        let (with, without) = (plan(&windowed, runtime, 4096), plan(&whole, runtime, 4096));
        assert_eq!(with.max_sequences, without.max_sequences, "{runtime:?}");
    }
    // vLLM on an H100: 16 sequences without the window, 22 with it.
    let vllm = Runtime::Vllm(Engine::vllm_defaults(&g));
    assert_eq!((plan(&whole, vllm, 8192).max_sequences, plan(&windowed, vllm, 8192).max_sequences), (16, 22));
}

#[test]
fn mistral_slides_on_every_layer() {
    let g = gpu("h100-sxm").unwrap();
    let mistral = preset("mistral-7b").unwrap();
    let whole = Model { sliding_window: None, ..mistral.clone() };
    let vllm = Runtime::Vllm(Engine::vllm_defaults(&g));
    let (with, without) = (plan(&mistral, vllm, 16384), plan(&whole, vllm, 16384));
    assert_eq!(with.max_tokens, without.max_tokens);
    assert_eq!((with.max_sequences, without.max_sequences), (with.max_tokens / 4096, without.max_tokens / 16384));
}
