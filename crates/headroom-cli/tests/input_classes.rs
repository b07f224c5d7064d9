//! The classes of bad input users hit, for every command: each file a command
//! reads, given as empty, binary, truncated, not UTF-8, the wrong JSON type,
//! deeply nested, a directory or missing; each number it takes, given as
//! zero, negative, not a number, past 2^64 or not finite. Every case exits 2
//! with a message that names the input (or, where the value is valid, 0 or 1
//! as documented), and none panics.

use assert_cmd::Command;
use std::path::{Path, PathBuf};

fn repo(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

/// Runs `args`; returns the exit status and stderr, after checking nothing panicked.
fn run(args: &[&str]) -> (i32, String) {
    let out = Command::cargo_bin("headroom").unwrap().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let code = out.status.code().unwrap_or(-1);
    assert!(!stderr.contains("panicked") && code != 101 && code >= 0, "{args:?}: {code} {stderr}");
    (code, stderr)
}

/// Bad contents for a file, by class.
fn bad_files(dir: &Path, valid: &[u8]) -> Vec<(&'static str, PathBuf)> {
    let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let mut cases: Vec<(&'static str, Vec<u8>)> = vec![
        ("binary", (0..=255u8).cycle().take(4096).collect()),
        ("truncated", valid[..valid.len() / 2].to_vec()),
        ("not-utf8", [&valid[..valid.len().min(40)], b"\xff\xfe\xc3\x28"].concat()),
        ("wrong-type", br#"{"op": ["alloc"], "input_bytes": "many", "model_type": {"a": 1}}"#.to_vec()),
        ("array", b"[1, 2, 3]".to_vec()),
        ("nested", nested.into_bytes()),
        ("nul", vec![0; 64]),
    ];
    cases.push(("huge-number", b"{\"input_bytes\": 1e400, \"op\": \"alloc\", \"id\": 1, \"size\": 1e400}".to_vec()));
    cases
        .into_iter()
        .map(|(name, bytes)| {
            let p = dir.join(format!("{name}.in"));
            std::fs::write(&p, bytes).unwrap();
            (name, p)
        })
        .collect()
}

#[test]
fn every_file_a_command_reads_refuses_every_class_of_bad_content() {
    let dir = tempfile::tempdir().unwrap();
    let trace = std::fs::read(repo("data/traces/gpt2-small-train.jsonl")).unwrap();
    let chain = std::fs::read(repo("data/chains/gpt2-small-layers.json")).unwrap();
    let config = br#"{"model_type":"llama","hidden_size":512,"num_hidden_layers":4,"num_attention_heads":8,
        "intermediate_size":1024,"vocab_size":1000,"max_position_embeddings":4096}"#;
    let missing = dir.path().join("missing.json");
    let d = dir.path().to_str().unwrap().to_string();
    let pickle = dir.path().join("run.pickle");
    let trace_path = repo("data/traces/gpt2-small-train.jsonl");
    let (code, stderr) = run(&["replay", trace_path.to_str().unwrap(), "--snapshot-out", pickle.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    let snapshot = std::fs::read(&pickle).unwrap();
    type Cmd = fn(&str) -> Vec<String>;
    let commands: [(&str, &[u8], Cmd); 5] = [
        ("replay", &trace, |f| vec!["replay".into(), f.into()]),
        ("checkpoint", &chain, |f| vec!["checkpoint".into(), f.into(), "--budget".into(), "1GiB".into()]),
        ("plan", config, |f| vec!["plan".into(), "--model".into(), f.into(), "--gpu".into(), "h100-sxm".into()]),
        ("kv", config, |f| {
            vec!["kv".into(), "simulate".into(), "--model".into(), f.into(), "--gpu".into(), "h100-sxm".into()]
        }),
        ("plan --calibrate", &snapshot, |f| {
            ["plan", "--model", "gpt2", "--gpu", "h100-sxm", "--seq", "512", "--calibrate", f]
                .map(String::from)
                .to_vec()
        }),
    ];
    let mut checked = 0;
    for (name, valid, cmd) in commands {
        let mut inputs = bad_files(dir.path(), valid);
        inputs.push(("missing", missing.clone()));
        inputs.push(("directory", PathBuf::from(&d)));
        for (class, path) in inputs {
            let args = cmd(path.to_str().unwrap());
            let (code, stderr) = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
            assert_eq!(code, 2, "{name} with a {class} file: {stderr}");
            // The message names the input: the file, or the flag that took it.
            let named = stderr.contains(path.file_name().unwrap().to_str().unwrap()) || stderr.contains("--model");
            assert!(named && stderr.starts_with("error: "), "{name}, {class}: {stderr}");
            checked += 1;
        }
    }
    // An empty trace replays nothing; an empty chain or config is refused.
    let empty = dir.path().join("empty.in");
    std::fs::write(&empty, b"").unwrap();
    assert_eq!(run(&["replay", empty.to_str().unwrap()]).0, 0);
    assert_eq!(run(&["checkpoint", empty.to_str().unwrap(), "--budget", "1GiB"]).0, 2);
    assert_eq!(run(&["plan", "--model", empty.to_str().unwrap(), "--gpu", "l4"]).0, 2);
    eprintln!("{checked} bad files refused");
}

#[test]
fn every_number_a_command_takes_refuses_what_is_not_one() {
    let chain = repo("data/chains/gpt2-small-layers.json");
    let trace = repo("data/traces/gpt2-small-train.jsonl");
    let (chain, trace) = (chain.to_str().unwrap(), trace.to_str().unwrap());
    let plan = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm"];
    let kv = ["kv", "simulate", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--requests", "20"];
    let replay = ["replay", trace];
    let checkpoint = ["checkpoint", chain, "--budget", "1GiB"];
    let flags: [(&[&str], &[&str]); 4] = [
        (
            &plan,
            &[
                "--batch",
                "--seq",
                "--gpus",
                "--tp",
                "--pp",
                "--vpp",
                "--cp",
                "--zero",
                "--accumulation",
                "--global-batch",
                "--lora-rank",
                "--gpu-memory",
                "--calibrate-batch",
                "--calibrate-seq",
            ],
        ),
        (
            &kv,
            &[
                "--gpu-memory-utilization",
                "--block-size",
                "--max-batched-tokens",
                "--max-num-seqs",
                "--max-model-len",
                "--num-gpu-blocks",
                "--seed",
                "--gpu-memory",
            ],
        ),
        (&replay, &["--capacity", "--max-entries"]),
        (&checkpoint, &["--slots"]),
    ];
    let mut checked = 0;
    for (base, names) in flags {
        for flag in names {
            for value in ["-1", "abc", "", "1e400", "18446744073709551616", "nan", "inf", "0x10", "1 2"] {
                let (code, stderr) = run(&[base, &[flag, value]].concat());
                assert_eq!(code, 2, "{flag} {value:?}: {stderr}");
                assert!(stderr.contains(flag) || stderr.contains(value), "{flag} {value:?}: {stderr}");
                checked += 1;
            }
            // Zero is a seed, a ZeRO stage and a valid global option; for every other count it is refused.
            let (code, stderr) = run(&[base, &[flag, "0"]].concat());
            let zero_is_valid = matches!(*flag, "--zero" | "--seed");
            assert_eq!(code == 2, !zero_is_valid, "{flag} 0: exit {code}, {stderr}");
        }
    }
    // --budget and --capacity: sizes.
    for value in ["-1", "abc", "", "1e400", "18446744073709551616", "17EiB"] {
        assert_eq!(run(&[&checkpoint[..2], &["--budget", value]].concat()).0, 2, "--budget {value:?}");
        checked += 1;
    }
    eprintln!("{checked} bad numbers refused");
}

#[test]
fn conflicting_and_unknown_flags_and_names() {
    let p = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm"];
    for (args, needle) in [
        (&["--train", "--infer"][..], "cannot be used with"),
        (&["--infer", "--accumulation", "4"], "--accumulation applies to training"),
        (&["--kv-dtype", "fp8"], "--infer"),
        (&["--frobnicate"], "unexpected argument"),
        (&["--precision", "fp3"], "invalid value"),
        (&["--checkpoint", "every-0"], "--checkpoint"),
    ] {
        let (code, stderr) = run(&[&p[..], args].concat());
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    for (args, needle) in [
        (&["plan", "--model", "gpt-9", "--gpu", "h100-sxm"][..], "unknown model `gpt-9`"),
        (&["plan", "--model", "gpt2", "--gpu", "h900"], "h900"),
        (&["kv", "simulate", "--model", "llama-3-8b", "--gpu", "tpu"], "tpu"),
        (&["replay", "/no/such/trace.jsonl"], "/no/such/trace.jsonl"),
    ] {
        let (code, stderr) = run(args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}
