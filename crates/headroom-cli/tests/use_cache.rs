//! `headroom plan --use-cache`: transformers' key-value cache in a training forward, which
//! moves the peak of the families that fuse the query, key and value (GPT-2's `c_attn`) and
//! no other's (Llama's projections are their own), and nothing under checkpointing.

use assert_cmd::Command;
use serde_json::Value;

fn plan(args: &[&str]) -> Value {
    let out = Command::cargo_bin("headroom").unwrap().arg("plan").args(args).arg("--json").output().unwrap();
    assert!(out.status.code().unwrap() < 2, "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn text(args: &[&str]) -> String {
    let out = Command::cargo_bin("headroom").unwrap().arg("plan").args(args).output().unwrap();
    assert!(out.status.code().unwrap() < 2, "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn job<'a>(model: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["--model", model, "--gpu", "h200", "--precision", "bf16", "--attention", "sdpa"];
    a.extend_from_slice(&["--batch", "4", "--seq", "1024"]);
    a.extend_from_slice(extra);
    a
}

#[test]
fn the_cache_changes_a_gpt2_plan_and_not_a_llama_one() {
    let on = plan(&job("gpt2-medium", &["--use-cache", "true"]));
    let off = plan(&job("gpt2-medium", &["--use-cache", "false"]));
    let default = plan(&job("gpt2-medium", &[]));
    assert_eq!(on["program"]["template"], "gpt2/causal-lm/bf16/sdpa/full/cache");
    assert_eq!(off["program"]["template"], "gpt2/causal-lm/bf16/sdpa/full");
    assert_eq!(on["use_cache"], serde_json::json!({"asked": true, "recorded": true}));
    assert_eq!(off["use_cache"], serde_json::json!({"asked": false, "recorded": false}));
    // The copies of each layer's key and value, which a run without the cache does not make.
    let (a_on, a_off) = (on["allocated_bytes"].as_u64().unwrap(), off["allocated_bytes"].as_u64().unwrap());
    assert!(a_on > a_off, "cache on {a_on} B, off {a_off} B");
    // transformers' default is the cache on.
    assert_eq!(default["allocated_bytes"], on["allocated_bytes"]);
    assert_eq!(default["use_cache"], on["use_cache"]);

    let on = plan(&job("llama-3-8b", &["--use-cache", "true"]));
    let off = plan(&job("llama-3-8b", &["--use-cache", "false"]));
    assert_eq!(on["program"]["template"], off["program"]["template"]);
    assert_eq!(on["allocated_bytes"], off["allocated_bytes"]);
    assert_eq!(on["reserved_bytes"], off["reserved_bytes"]);
    assert_eq!(on["use_cache"], Value::Null, "the cache moves no peak of Llama's");
}

/// Over two GPUs transformers' phases plan the job in closed form (its recorded step is one
/// GPU's): the setting reaches it too. Its recipes were recorded with the cache on, so the
/// default plans them as they are, and without the cache GPT-2's plan is lower by the copies of
/// each layer's key and value, Phi-3's higher by the fused output and rotated key SDPA keeps in
/// their place.
#[test]
fn the_closed_form_plans_either_setting() {
    let two = |model, cache| plan(&job(model, &["--gpus", "2", "--use-cache", cache]));
    for (model, lower_without) in [("gpt2-medium", true), ("phi-3-mini", false)] {
        let (on, off) = (two(model, "true"), two(model, "false"));
        assert_eq!(on["runner"]["builder"], "transformers-phases", "{model}");
        assert_eq!(off["runner"]["builder"], "transformers-phases", "{model}");
        let (a_on, a_off) = (on["allocated_bytes"].as_u64().unwrap(), off["allocated_bytes"].as_u64().unwrap());
        assert_eq!(a_off < a_on, lower_without, "{model}: cache on {a_on} B, off {a_off} B");
        assert_ne!(a_on, a_off, "{model}");
        let default = plan(&job(model, &["--gpus", "2"]));
        assert_eq!(default["allocated_bytes"], on["allocated_bytes"], "{model}: the default is the cache on");
    }
}

#[test]
fn under_checkpointing_the_cache_changes_nothing() {
    let on = plan(&job("gpt2-medium", &["--use-cache", "true", "--checkpoint", "full"]));
    let off = plan(&job("gpt2-medium", &["--use-cache", "false", "--checkpoint", "full"]));
    assert_eq!(on["program"]["template"], "gpt2/causal-lm/bf16/sdpa/ckpt");
    assert_eq!(on["allocated_bytes"], off["allocated_bytes"]);
    assert_eq!(on["use_cache"], Value::Null);
}

#[test]
fn the_text_says_which_the_plan_assumed_where_it_matters() {
    let gpt2 = text(&job("gpt2-medium", &[]));
    assert!(
        gpt2.contains("key-value cache: on in the training forward (--use-cache true, transformers' default)"),
        "{gpt2}"
    );
    let off = text(&job("gpt2-medium", &["--use-cache", "false"]));
    assert!(off.contains("key-value cache: off in the training forward (--use-cache false)"), "{off}");
    let llama = text(&job("llama-3-8b", &[]));
    assert!(!llama.contains("key-value cache:"), "{llama}");
}

#[test]
fn a_job_whose_half_was_not_recorded_says_so() {
    // QLoRA's steps are recorded with the cache off alone (`qlora_programs.py` sets
    // `use_cache = False`, as peft's QLoRA scripts do): Phi-3's without checkpointing, asked
    // with it on, replays that half and says the cache's copies are not in it.
    let args = ["--model", "phi-3-mini", "--gpu", "h200", "--finetune", "qlora", "--batch", "1", "--seq", "512"];
    let v = plan(&args);
    assert_eq!(v["program"]["template"], "phi3/causal-lm/bf16/sdpa/full/qlora-all");
    assert_eq!(v["use_cache"], serde_json::json!({"asked": true, "recorded": false}));
    let t = text(&args);
    assert!(
        t.contains("key-value cache: on asked (--use-cache true), but only the step with it off was recorded"),
        "{t}"
    );
}

#[test]
fn the_flag_is_training_s() {
    let out = Command::cargo_bin("headroom")
        .unwrap()
        .args(["plan", "--model", "gpt2", "--gpu", "h200", "--infer", "--use-cache", "false"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--use-cache applies to training"));
}

/// The jobs of the fused families whose step was recorded both ways plan the half they ask
/// for, either way, and say the step was recorded so: each job as `(preset, precision,
/// attention, LoRA's targets or `full` for full fine-tuning, key of the half without the
/// cache)`, the half with it the key with `/cache` after `full`.
const BOTH_HALVES: &[(&str, &str, &str, &str, &str)] = &[
    ("phi-3-mini", "amp", "eager", "all", "phi3/causal-lm/amp-cuda/eager/full/lora-all"),
    ("phi-3-mini", "amp", "eager", "qv", "phi3/causal-lm/amp-cuda/eager/full/lora-qv"),
    ("phi-3-mini", "amp", "eager", "full", "phi3/causal-lm/amp/eager/full"),
    ("gpt2", "amp", "eager", "all", "gpt2/causal-lm/amp-cuda/eager/full/lora-all"),
    ("gpt2", "amp", "eager", "qv", "gpt2/causal-lm/amp-cuda/eager/full/lora-qv"),
    ("gpt2", "amp", "eager", "full", "gpt2/causal-lm/amp-cuda/eager/full"),
    ("pythia-1b", "amp", "eager", "all", "gpt_neox/causal-lm/amp-cuda/eager/full/lora-all"),
    ("pythia-1b", "amp", "eager", "qv", "gpt_neox/causal-lm/amp-cuda/eager/full/lora-qv"),
    ("pythia-1b", "amp", "eager", "full", "gpt_neox/causal-lm/amp-cuda/eager/full"),
    ("phi-3-mini", "amp", "sdpa", "all", "phi3/causal-lm/amp-cuda/sdpa/full/lora-all"),
    ("phi-3-mini", "amp", "sdpa", "qv", "phi3/causal-lm/amp-cuda/sdpa/full/lora-qv"),
    ("phi-3-mini", "bf16", "eager", "all", "phi3/causal-lm/bf16/eager/full/lora-all"),
    ("phi-3-mini", "bf16", "eager", "qv", "phi3/causal-lm/bf16/eager/full/lora-qv"),
    ("phi-3-mini", "fp32", "eager", "all", "phi3/causal-lm/fp32/eager/full/lora-all"),
    ("phi-3-mini", "fp32", "eager", "qv", "phi3/causal-lm/fp32/eager/full/lora-qv"),
    ("phi-3-mini", "fp32", "sdpa", "all", "phi3/causal-lm/fp32/sdpa/full/lora-all"),
    ("phi-3-mini", "fp32", "sdpa", "qv", "phi3/causal-lm/fp32/sdpa/full/lora-qv"),
    ("gpt2", "amp", "sdpa", "all", "gpt2/causal-lm/amp-cuda/sdpa/full/lora-all"),
    ("gpt2", "amp", "sdpa", "qv", "gpt2/causal-lm/amp-cuda/sdpa/full/lora-qv"),
    ("gpt2", "bf16", "eager", "all", "gpt2/causal-lm/bf16/eager/full/lora-all"),
    ("gpt2", "bf16", "eager", "qv", "gpt2/causal-lm/bf16/eager/full/lora-qv"),
    ("pythia-1b", "amp", "sdpa", "all", "gpt_neox/causal-lm/amp-cuda/sdpa/full/lora-all"),
    ("pythia-1b", "amp", "sdpa", "qv", "gpt_neox/causal-lm/amp-cuda/sdpa/full/lora-qv"),
    ("pythia-1b", "bf16", "eager", "all", "gpt_neox/causal-lm/bf16/eager/full/lora-all"),
    ("pythia-1b", "bf16", "eager", "qv", "gpt_neox/causal-lm/bf16/eager/full/lora-qv"),
    ("pythia-1b", "fp32", "sdpa", "all", "gpt_neox/causal-lm/fp32/sdpa/full/lora-all"),
    ("pythia-1b", "fp32", "sdpa", "qv", "gpt_neox/causal-lm/fp32/sdpa/full/lora-qv"),
    ("pythia-1b", "fp32", "eager", "all", "gpt_neox/causal-lm/fp32/eager/full/lora-all"),
    ("pythia-1b", "fp32", "eager", "qv", "gpt_neox/causal-lm/fp32/eager/full/lora-qv"),
    ("bloom-7b1", "amp", "sdpa", "all", "bloom/causal-lm/amp-cuda/eager/full/lora-all"),
    ("bloom-7b1", "amp", "sdpa", "qv", "bloom/causal-lm/amp-cuda/eager/full/lora-qv"),
    ("bloom-7b1", "fp32", "sdpa", "all", "bloom/causal-lm/fp32/eager/full/lora-all"),
    ("bloom-7b1", "fp32", "sdpa", "qv", "bloom/causal-lm/fp32/eager/full/lora-qv"),
];

#[test]
fn each_job_recorded_both_ways_plans_the_half_it_asks_for() {
    for &(model, precision, attention, targets, without) in BOTH_HALVES {
        let with = match without.strip_suffix("/full") {
            Some(base) => format!("{base}/full/cache"),
            None => without.replacen("/full/", "/full/cache/", 1),
        };
        let finetune: &[&str] = match targets {
            "full" => &["--finetune", "full"],
            _ => &["--finetune", "lora", "--lora-targets", targets],
        };
        let job = ["--model", model, "--gpu", "h200", "--precision", precision, "--attention", attention];
        let job = [&job[..], finetune, &["--batch", "1", "--seq", "512"]].concat();
        for (cache, asked, key, line) in [
            ("true", true, with.as_str(), "key-value cache: on in the training forward (--use-cache true, transformers' default), as the step was recorded"),
            ("false", false, without, "key-value cache: off in the training forward (--use-cache false), as the step was recorded"),
        ] {
            let args = [&job[..], &["--use-cache", cache]].concat();
            let v = plan(&args);
            assert_eq!(v["program"]["template"], key, "{args:?}");
            assert_eq!(v["use_cache"], serde_json::json!({"asked": asked, "recorded": asked}), "{args:?}");
            let t = text(&args);
            assert!(t.contains(&format!("recorded as {key}\n")), "{args:?}: {t}");
            assert!(t.contains(line), "{args:?}: {t}");
            assert!(!t.contains("was recorded for this job") && !t.contains("not recorded"), "{args:?}: {t}");
            assert!(!v.to_string().contains("not recorded"), "{args:?}: {v}");
        }
    }
}
