//! `headroom plan --loss-lives`: how long the training loop keeps the step's loss, and with it
//! what the loss's graph holds after the backward (T5's cross-attention zero position bias, which
//! requires a gradient under checkpointing, and its gradient; under peft the input embeddings'
//! output too). transformers' `Trainer` lets it go as each backward ends (the default), a step function
//! that returns `loss.item()` after `zero_grad`, a loop body that keeps `loss` once the next
//! forward's loss replaces it.

use assert_cmd::Command;
use serde_json::Value;

fn run(args: &[&str]) -> std::process::Output {
    Command::cargo_bin("headroom").unwrap().arg("plan").args(args).output().unwrap()
}

fn plan(args: &[&str]) -> Value {
    let out = run(&[args, &["--json"]].concat());
    assert!(out.status.code().unwrap() < 2, "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn text(args: &[&str]) -> String {
    let out = run(args);
    assert!(out.status.code().unwrap() < 2, "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// T5-large's checkpointed full fine-tuning at 4 × 512, as the H200 ran it (docs/VALIDATION.md).
const T5_LARGE: [&str; 14] = [
    "--model",
    "t5-large",
    "--gpu",
    "h200",
    "--batch",
    "4",
    "--seq",
    "512",
    "--attention",
    "eager",
    "--precision",
    "bf16",
    "--checkpoint",
    "full",
];

fn bytes(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key}: {v}"))
}

#[test]
fn each_loop_holds_the_pair_as_long_as_its_loss() {
    let with = |life: &str| plan(&[&T5_LARGE[..], &["--loss-lives", life]].concat());
    let (trainer, function, inline) = (with("trainer"), with("function"), with("inline"));
    let default = plan(&T5_LARGE);
    for (v, name) in [(&trainer, "trainer"), (&function, "function"), (&inline, "inline")] {
        assert_eq!(v["loss_lives"], name);
        assert_eq!(v["loss_held"], true, "{name}");
        assert_eq!(v["program"]["template"], "t5/seq2seq-lm/bf16/eager/ckpt");
    }
    // transformers' Trainer is the default.
    assert_eq!(default["loss_lives"], "trainer");
    assert_eq!(bytes(&default, "allocated_bytes"), bytes(&trainer, "allocated_bytes"));
    assert_eq!(bytes(&default, "reserved_bytes"), bytes(&trainer, "reserved_bytes"));
    // The cross-attention's zero position bias and its gradient (16 heads × 512 × 512 bf16,
    // twice): through the optimizer step, where this job's peak is, for a step function and a
    // loop body; in the next forward for a loop body alone.
    // Allocated bytes count blocks, as PyTorch's do: a large block keeps a remainder under 1 MiB
    // unsplit (`kSmallSize`), so where the two loops' blocks land can move a phase's peak by
    // less than that.
    let pair = 2 * 16 * 512 * 512 * 2;
    let slack = 1 << 20;
    let phase = |v: &Value, p: &str| v["phases"][p].as_u64().unwrap();
    let held = phase(&function, "optimizer") - phase(&trainer, "optimizer");
    assert!(held.abs_diff(pair) < slack, "the optimizer step holds {held} B more, not the pair's {pair}");
    assert_eq!(bytes(&function, "allocated_bytes") - bytes(&trainer, "allocated_bytes"), pair);
    assert_eq!(phase(&inline, "optimizer"), phase(&function, "optimizer"));
    assert_eq!(phase(&function, "forward"), phase(&trainer, "forward"));
    assert_eq!(phase(&inline, "forward") - phase(&function, "forward"), pair);
    assert!(bytes(&trainer, "allocated_bytes") < bytes(&function, "allocated_bytes"));
}

#[test]
fn the_loop_moves_t5_large_s_qlora_forward_not_its_reserved_memory() {
    // The H200's T5-large QLoRA row. The template holds the first step's pair in `step1`, so the
    // first forward makes the three leaves and the segments that hold them, as the GPU's does; a
    // loop body that holds them through the next forward finds them there. With the first step's
    // pair left out of the template (before 2026-11-30), the pair held through the third step's
    // forward moved that forward's blocks and the backward's logits gradient took a segment of
    // its own: 264,241,152 B more reserved under `inline` (docs/VALIDATION.md).
    let job = [&T5_LARGE[..], &["--finetune", "qlora"]].concat();
    let trainer = plan(&[&job[..], &["--loss-lives", "trainer"]].concat());
    let inline = plan(&[&job[..], &["--loss-lives", "inline"]].concat());
    assert_eq!(trainer["program"]["template"], "t5/seq2seq-lm/bf16/eager/ckpt/qlora-all");
    assert_eq!(bytes(&trainer, "allocated_bytes"), bytes(&inline, "allocated_bytes"));
    assert_eq!(bytes(&inline, "reserved_bytes"), bytes(&trainer, "reserved_bytes"));
    // The encoder's and the decoder's input embeddings' leaves (4 × 512 × 1024 fp32 each), the
    // cross-attention's zero position bias (16 heads × 512 × 512 fp32) and their gradients.
    let pair = 2 * (2 * 4 * 512 * 1024 * 4 + 16 * 512 * 512 * 4);
    let phase = |v: &Value, p: &str| v["phases"][p].as_u64().unwrap();
    assert_eq!(phase(&inline, "forward") - phase(&trainer, "forward"), pair);
}

#[test]
fn the_text_names_the_loop_where_the_loss_holds_something() {
    let t5 = text(&T5_LARGE);
    let said = "loss, and what its graph holds after the backward (--loss-lives trainer): transformers' Trainer";
    assert!(t5.contains(said) && t5.contains("freed as each backward ends"), "{t5}");
    let inline = text(&[&T5_LARGE[..], &["--loss-lives", "inline"]].concat());
    assert!(inline.contains("(--loss-lives inline): a loop body loss = model(**batch).loss"), "{inline}");
    // Llama's full fine-tuning without checkpointing keeps nothing past the backward.
    let llama = ["--model", "llama-3-8b", "--gpu", "h200", "--precision", "bf16", "--batch", "1", "--seq", "1024"];
    assert!(!text(&llama).contains("--loss-lives"));
    let v = plan(&llama);
    assert_eq!(v["loss_held"], false);
    assert_eq!(v["loss_lives"], "trainer");
}

#[test]
fn the_flag_is_training_s_and_names_its_loops() {
    let out = run(&["--model", "gpt2", "--gpu", "h200", "--infer", "--loss-lives", "inline"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--loss-lives applies to training"));
    let out = run(&["--model", "gpt2", "--gpu", "h200", "--loss-lives", "epoch"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    for name in ["trainer", "function", "inline"] {
        assert!(err.contains(name), "{err}");
    }
}
