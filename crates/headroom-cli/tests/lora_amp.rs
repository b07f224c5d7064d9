//! LoRA under AMP (fp32 weights and adapters, the forward under bf16 autocast: peft with
//! `Trainer(bf16=True)` over a model loaded in fp32) replays its recorded step on a GPU: the
//! step recorded under CUDA's autocast policy (`…/amp-cuda/…/lora-all|lora-qv`,
//! `data/programs/hf-lora-amp.tpl`), with checkpointing and without, where it fell to
//! Megatron's closed form before ("no step `…/amp/…/lora-all` was recorded"); with eager
//! attention asked of a family recorded with SDPA, its own `…/amp-cuda/eager/…` step
//! (`data/programs/hf-lora-amp-eager.tpl`).

mod support;

use assert_cmd::Command;
use support::assert_replays;

fn plan(args: &[String], json: bool) -> (i32, String) {
    let mut cmd = Command::cargo_bin("headroom").unwrap();
    cmd.arg("plan").args(args);
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().unwrap();
    let code = out.status.code().unwrap();
    assert!(code < 2, "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    (code, String::from_utf8(out.stdout).unwrap())
}

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

/// Configs of families no preset or bundled file has, as their hubs' config.json.
const CONFIGS: &[(&str, &str)] = &[
    (
        "gemma-2-2b.json",
        r#"{"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
            "max_position_embeddings": 8192, "query_pre_attn_scalar": 256, "sliding_window": 4096}"#,
    ),
    (
        "qwen3-30b-a3b.json",
        r#"{"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
            "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
            "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
            "tie_word_embeddings": false, "decoder_sparse_step": 1, "mlp_only_layers": []}"#,
    ),
];

/// `--model`'s value for `name`: a preset, a config.json of `data/models/`, or one of
/// [`CONFIGS`] written into `dir`.
fn model(name: &str, dir: &std::path::Path) -> String {
    if let Some((_, json)) = CONFIGS.iter().find(|(n, _)| *n == name) {
        let path = dir.join(name);
        std::fs::write(&path, json).unwrap();
        path.to_str().unwrap().to_string()
    } else if name.ends_with(".json") {
        format!("{}/../../data/models/{name}", env!("CARGO_MANIFEST_DIR"))
    } else {
        name.to_string()
    }
}

/// A model of each family whose AMP LoRA step was recorded, the attention its keys were
/// recorded with, and the key's prefix (a config.json of `data/models/` where no preset is).
const RECORDED: &[(&str, &str, &str)] = &[
    ("llama-3-8b", "sdpa", "llama/causal-lm/amp-cuda/sdpa"),
    ("qwen2.5-7b", "sdpa", "qwen2/causal-lm/amp-cuda/sdpa"),
    ("mistral-7b", "sdpa", "mistral/causal-lm/amp-cuda/sdpa"),
    ("qwen3-1.7b.json", "sdpa", "qwen3/causal-lm/amp-cuda/sdpa"),
    ("mixtral-8x7b", "sdpa", "mixtral/causal-lm/amp-cuda/sdpa"),
    ("qwen1.5-moe-a2.7b.json", "sdpa", "qwen2_moe/causal-lm/amp-cuda/sdpa"),
    ("gemma-2b", "sdpa", "gemma/causal-lm/amp-cuda/sdpa"),
    ("gemma-3-1b.json", "sdpa", "gemma3_text/causal-lm/amp-cuda/sdpa"),
    ("gemma-2-2b.json", "eager", "gemma2/causal-lm/amp-cuda/eager"),
    ("qwen3-30b-a3b.json", "sdpa", "qwen3_moe/causal-lm/amp-cuda/sdpa"),
    ("phi-3-mini", "sdpa", "phi3/causal-lm/amp-cuda/sdpa"),
    ("gpt2", "sdpa", "gpt2/causal-lm/amp-cuda/sdpa"),
    ("pythia-1b", "sdpa", "gpt_neox/causal-lm/amp-cuda/sdpa"),
    // transformers has no SDPA path for BLOOM: the SDPA asked runs eager.
    ("bloom-7b1", "sdpa", "bloom/causal-lm/amp-cuda/eager"),
    ("bert-base-uncased", "sdpa", "bert/masked-lm/amp-cuda/sdpa"),
    // T5's SDPA on the memory-efficient kernel, its position bias the mask.
    ("t5-base", "sdpa", "t5/seq2seq-lm/amp-cuda/sdpa"),
    ("t5-base", "eager", "t5/seq2seq-lm/amp-cuda/eager"),
];

/// The key segment of a job's step without checkpointing for the families that fuse the query,
/// key and value: recorded with the key-value cache too, and planned so by default
/// (transformers' `use_cache`, `data/programs/hf-cache.tpl`).
fn cache(prefix: &str, ck_key: &str) -> &'static str {
    let fused = ["gpt2/", "phi3/", "gpt_neox/", "bloom/"].iter().any(|f| prefix.starts_with(f));
    if fused && ck_key == "full" {
        "/cache"
    } else {
        ""
    }
}

/// Each family's AMP LoRA job on an H200, both adapter targets, with and without full
/// checkpointing: planned by transformers' builder from the `amp-cuda` template of its own.
#[test]
fn amp_lora_replays_the_step_recorded_under_cuda_s_autocast() {
    let dir = tempfile::tempdir().unwrap();
    for (name, attention, prefix) in RECORDED {
        for (ck, ck_key) in [("none", "full"), ("full", "ckpt")] {
            for targets in ["all", "qv"] {
                let job = args(&format!(
                    "--model {} --gpu h200 --batch 1 --seq 256 --finetune lora --precision amp --attention {attention} \
                     --lora-targets {targets} --checkpoint {ck}",
                    model(name, dir.path())
                ));
                // Mixtral's fp32 base alone passes an H200's memory: an answer either way.
                assert_replays(&job, &format!("{prefix}/{ck_key}{}/lora-{targets}", cache(prefix, ck_key)));
            }
        }
    }
}

/// A model of each family recorded with SDPA whose AMP LoRA step was recorded with eager attention
/// asked too (`data/programs/hf-lora-amp-eager.tpl`), and its keys' prefix.
const EAGER_RECORDED: &[(&str, &str)] = &[
    ("llama-3-8b", "llama/causal-lm/amp-cuda/eager"),
    ("mistral-7b", "mistral/causal-lm/amp-cuda/eager"),
    ("qwen2.5-7b", "qwen2/causal-lm/amp-cuda/eager"),
    ("mixtral-8x7b", "mixtral/causal-lm/amp-cuda/eager"),
    ("phi-3-mini", "phi3/causal-lm/amp-cuda/eager"),
    ("gemma-7b", "gemma/causal-lm/amp-cuda/eager"),
    ("gpt2", "gpt2/causal-lm/amp-cuda/eager"),
    ("pythia-1b", "gpt_neox/causal-lm/amp-cuda/eager"),
    ("bert-base-uncased", "bert/masked-lm/amp-cuda/eager"),
    ("qwen3-1.7b.json", "qwen3/causal-lm/amp-cuda/eager"),
    ("gemma-3-1b.json", "gemma3_text/causal-lm/amp-cuda/eager"),
    ("qwen1.5-moe-a2.7b.json", "qwen2_moe/causal-lm/amp-cuda/eager"),
    ("qwen3-30b-a3b.json", "qwen3_moe/causal-lm/amp-cuda/eager"),
];

/// Each such family's AMP LoRA job with eager attention asked, both targets, with and without
/// full checkpointing, replays its own `…/amp-cuda/eager/…` template, where it fell to
/// Megatron's closed form before ("no step `…/amp/eager/full/lora-all` was recorded"), not the
/// SDPA one.
#[test]
fn eager_amp_lora_replays_its_own_recorded_step() {
    let dir = tempfile::tempdir().unwrap();
    for (name, prefix) in EAGER_RECORDED {
        for (ck, ck_key) in [("none", "full"), ("full", "ckpt")] {
            for targets in ["all", "qv"] {
                let job = args(&format!(
                    "--model {} --gpu h200 --batch 1 --seq 512 --finetune lora --precision amp --attention eager \
                     --lora-targets {targets} --checkpoint {ck}",
                    model(name, dir.path())
                ));
                assert_replays(&job, &format!("{prefix}/{ck_key}{}/lora-{targets}", cache(prefix, ck_key)));
            }
        }
    }
}

/// The issue's job: Llama-3-8B's LoRA under AMP with SDPA on an H200, as `plan` is given it.
#[test]
fn the_issue_s_llama_job_is_no_longer_passed_over() {
    let (code, t) =
        plan(&args("--model llama-3-8b --gpu h200 --finetune lora --precision amp --attention sdpa"), false);
    assert!(code < 2, "{t}");
    assert!(t.contains("recorded as llama/causal-lm/amp-cuda/sdpa/full/lora-all"), "{t}");
    assert!(!t.contains("passed over transformers"), "{t}");
}
