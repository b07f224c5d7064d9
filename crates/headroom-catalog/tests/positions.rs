//! The positions and norms a `config.json` gives, as engines that build the model need them:
//! the rotary base, its scaling, the norms' epsilon, each with transformers' defaults.

use headroom_catalog::model::{preset, Model, ModelError, RopeScaling};

fn llama(extra: &str) -> Result<Model, ModelError> {
    let text = format!(
        r#"{{"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
            "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192{extra}}}"#
    );
    Model::from_hf_config(&text, "test")
}

#[test]
fn presets_carry_their_rotary_base_and_norm_epsilon() {
    let row = |name: &str| {
        let m = preset(name).unwrap();
        (m.rope_theta, m.norm_eps)
    };
    assert_eq!(row("llama-3-8b"), (Some(500000.0), 1e-5));
    assert_eq!(row("qwen2.5-7b"), (Some(1e6), 1e-6));
    assert_eq!(row("mixtral-8x7b"), (Some(1e6), 1e-5));
    assert_eq!(row("gpt2"), (None, 1e-5));
    assert_eq!(row("pythia-1b"), (Some(10000.0), 1e-5));
    assert_eq!(row("bert-base-uncased"), (None, 1e-12));
    assert_eq!(row("t5-base"), (None, 1e-6));
    assert_eq!(preset("llama-3-8b").unwrap().rope_scaling, None);
    let scaling = preset("llama-3.1-8b").unwrap().rope_scaling.unwrap();
    assert_eq!(
        scaling,
        RopeScaling {
            kind: "llama3".into(),
            factor: Some(8.0),
            low_freq_factor: Some(1.0),
            high_freq_factor: Some(4.0),
            original_max_position: Some(8192),
        }
    );
}

#[test]
fn defaults_transformers_5_s_rope_parameters_and_wrong_types() {
    let m = llama("").unwrap();
    assert_eq!((m.rope_theta, m.norm_eps, m.rope_scaling), (Some(10000.0), 1e-6, None));
    // transformers 5 writes the base and the scaling in one object.
    let m = llama(r#", "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}"#).unwrap();
    assert_eq!((m.rope_theta, m.rope_scaling), (Some(500000.0), None));
    let m = llama(r#", "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}"#).unwrap();
    assert_eq!(m.rope_theta, Some(1e6));
    assert_eq!(m.rope_scaling.unwrap().kind, "yarn");
    // The older spelling of the type.
    let m = llama(r#", "rope_scaling": {"type": "linear", "factor": 2.0}"#).unwrap();
    assert_eq!(m.rope_scaling.unwrap().factor, Some(2.0));
    assert!(llama(r#", "rope_scaling": null"#).unwrap().rope_scaling.is_none());
    for (bad, why) in [
        (r#", "rope_theta": "500000""#, "must be a number"),
        (r#", "rms_norm_eps": 0"#, "must be a positive number"),
        (r#", "rope_scaling": 8"#, "must be an object"),
        (r#", "rope_scaling": {"rope_type": "llama3", "factor": "8"}"#, "`factor` must be a number"),
    ] {
        let e = llama(bad).unwrap_err().to_string();
        assert!(e.contains(why), "{bad}: {e}");
    }
}
