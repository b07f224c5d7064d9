//! LoRA under AMP (fp32 weights and adapters, the forward under bf16 autocast: peft with
//! `Trainer(bf16=True)` over a model loaded in fp32) replays its recorded step on a GPU: the
//! step recorded under CUDA's autocast policy (`…/amp-cuda/…/lora-all|lora-qv`,
//! `data/programs/hf-lora-amp.tpl`), with checkpointing and without, where it fell to
//! Megatron's closed form before ("no step `…/amp/…/lora-all` was recorded").

use assert_cmd::Command;
use serde_json::Value;

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

fn model(name: &str) -> String {
    if name.ends_with(".json") {
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
];

/// Each family's AMP LoRA job on an H200, both adapter targets, with and without full
/// checkpointing: planned by transformers' builder from the `amp-cuda` template of its own.
#[test]
fn amp_lora_replays_the_step_recorded_under_cuda_s_autocast() {
    for (name, attention, prefix) in RECORDED {
        for (ck, ck_key) in [("none", "full"), ("full", "ckpt")] {
            for targets in ["all", "qv"] {
                let job = args(&format!(
                    "--model {} --gpu h200 --batch 1 --seq 256 --finetune lora --precision amp --attention {attention} \
                     --lora-targets {targets} --checkpoint {ck}",
                    model(name)
                ));
                let want = format!("{prefix}/{ck_key}/lora-{targets}");
                let (code, out) = plan(&job, true);
                assert_eq!(code, 0, "{out}");
                let p: Value = serde_json::from_str(&out).unwrap();
                assert_eq!(p["runner"]["builder"], "transformers", "{name}: {}", p["runner"]);
                assert_eq!(p["program"]["source"], "recorded", "{name}: {}", p["program"]);
                assert_eq!(p["program"]["template"], want.as_str(), "{name}: {}", p["program"]);
                let (_, t) = plan(&job, false);
                assert!(t.contains(&format!("recorded as {want}")), "{t}");
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
