//! `headroom plan --target-seq N`: an encoder-decoder's decoder length apart from its encoder's
//! (`--seq`), refused where the model has one stack.

use assert_cmd::Command;
use predicates::str::contains;
use serde_json::Value;

/// `headroom plan ARGS` exits 2 (bad input) and says `msg`.
fn refused(args: &[&str], msg: &str) {
    Command::cargo_bin("headroom").unwrap().arg("plan").args(args).assert().code(2).stderr(contains(msg));
}

fn plan(args: &[&str]) -> Value {
    let out = Command::cargo_bin("headroom").unwrap().arg("plan").args(args).arg("--json").output().unwrap();
    assert!(out.status.code().unwrap() < 2, "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn allocated(v: &Value) -> u64 {
    v["allocated_bytes"].as_u64().expect("allocated_bytes")
}

/// `job` planned from its template, and the same with a decoder as long as its encoder, which is
/// the job without the flag: the first plan.
fn replayed_with_the_encoder_s_length(job: &[&str]) -> Value {
    let one = plan(job);
    assert_eq!(one["runner"]["builder"], "transformers");
    let same = plan(&[job, &["--target-seq", "256"]].concat());
    assert_eq!(same["runner"]["builder"], "transformers");
    assert_eq!(allocated(&same), allocated(&one), "a decoder as long as the encoder is the job without the flag");
    one
}

#[test]
fn a_model_with_one_stack_refuses_a_decoder_length() {
    refused(
        &["--model", "llama-3-8b", "--gpu", "h100-sxm", "--target-seq", "4"],
        "--target-seq 4: the decoder's length of an encoder-decoder model, and llama-3-8b is a decoder",
    );
    refused(
        &["--model", "bert-base-uncased", "--gpu", "h100-sxm", "--head", "masked-lm", "--target-seq", "4"],
        "bert-base-uncased is an encoder",
    );
    refused(&["--model", "t0-3b", "--gpu", "h100-sxm", "--target-seq", "0"], "--target-seq");
    let recording = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/recordings/gpt2-bf16-b4-s1024.jsonl");
    refused(&["--gpu", "l4", "--program", recording, "--target-seq", "8"], "--target-seq shapes the step program");
    refused(
        &["--model", "t0-3b", "--gpu", "h100-sxm", "--infer", "--target-seq", "4"],
        "--target-seq applies to training",
    );
}

/// T0-3B's fp32 LoRA of every linear layer is recorded with its decoder at a length of its own
/// (24 tokens against the encoder's): a decoder shorter than the encoder is the same template
/// replayed, with less to keep.
#[test]
fn a_template_recorded_with_a_decoder_of_its_own_plans_a_shorter_one() {
    let job: Vec<&str> =
        "--model t0-3b --gpu h200 --precision fp32 --finetune lora --lora-targets all --attention eager \
                          --batch 1 --seq 256"
            .split_whitespace()
            .collect();
    let one = replayed_with_the_encoder_s_length(&job);
    let short = plan(&[&job[..], &["--target-seq", "16"]].concat());
    assert_eq!(short["runner"]["builder"], "transformers", "{}", short["runner"]);
    assert_eq!(short["runner"]["source"], one["runner"]["source"]);
    assert!(allocated(&short) < allocated(&one), "{} {}", allocated(&short), allocated(&one));
}

/// T5's checkpointed QLoRA of every linear layer was recorded with its decoder as long as its
/// encoder: asked for a decoder of its own, the plan passes over the template, saying why, and
/// plans the closed form, whose activations and logits shrink with the decoder.
#[test]
fn a_template_recorded_at_one_length_passes_a_decoder_of_another() {
    let job: Vec<&str> =
        "--model t5-base --gpu h200 --precision bf16 --finetune qlora --lora-targets all --attention eager \
                          --checkpoint full --batch 1 --seq 256"
            .split_whitespace()
            .collect();
    replayed_with_the_encoder_s_length(&job);
    let short = plan(&[&job[..], &["--target-seq", "16"]].concat());
    assert_ne!(short["runner"]["builder"], "transformers");
    let why = short["runner"]["passed"][0]["why"].as_str().expect("a reason");
    assert!(why.contains("recorded with its decoder as long as its encoder"), "{why}");
    let closed = |t: &str| {
        let v = plan(&[&job[..], &["--framework", "megatron", "--target-seq", t]].concat());
        (v["breakdown"]["activations"].as_u64().unwrap(), v["breakdown"]["logits"].as_u64().unwrap())
    };
    let (long, short) = (closed("256"), closed("16"));
    // The logits follow the decoder: 16 positions of 256 (each a block the allocator rounds).
    assert!(short.0 < long.0 && short.1 * 15 < long.1, "{long:?} {short:?}");
}
