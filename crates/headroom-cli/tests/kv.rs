//! `headroom kv simulate`, run as a user runs it.

use assert_cmd::Command;
use predicates::str::contains;
use serde_json::Value;
mod support;
use support::*;

fn headroom() -> Command {
    Command::cargo_bin("headroom").unwrap()
}

fn simulate(args: &[&str]) -> Value {
    let out = headroom().args(["kv", "simulate", "--json"]).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The PagedAttention paper's result: on ShareGPT-like requests a paged KV
/// cache stores tokens in over 90% of its memory; contiguous reservation far less.
/// Runs the exact command docs/VALIDATION.md shows and checks every figure of its
/// table, as printed there.
#[test]
fn paged_beats_contiguous_on_a_sharegpt_like_mix() {
    let v = simulate(&["--model", "llama-2-13b", "--gpu", "a100-40gb", "--max-model-len", "2048"]);
    for k in ["peak_running", "kv_utilization", "preemptions", "prefix_hit_rate"] {
        assert!(v["paged"].get(k).is_some() && v["contiguous"].get(k).is_some(), "missing {k}");
    }
    let paged = v["paged"]["kv_utilization"].as_f64().unwrap();
    let contiguous = v["contiguous"]["kv_utilization"].as_f64().unwrap();
    assert!(paged > 0.9, "paged utilization {paged}");
    assert!(contiguous < 0.4, "contiguous utilization {contiguous}");
    assert_eq!(v["contiguous"]["preemptions"], 0);
    assert_eq!(v["paged"]["finished"].as_u64().unwrap() + v["rejected_requests"].as_u64().unwrap(), 1000);

    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/VALIDATION.md")).unwrap();
    let section = &doc[doc.find("## Paged vs contiguous KV cache").expect("the section")..];
    assert!(section.contains("headroom kv simulate --model llama-2-13b --gpu a100-40gb --max-model-len 2048\n"));
    let row = |label: &str| -> Vec<String> {
        let line = section.lines().find(|l| l.starts_with(&format!("| {label} |"))).expect(label);
        line.split('|').map(|c| c.trim().to_string()).filter(|c| !c.is_empty()).skip(1).collect()
    };
    let (pt, ct) = (
        v["paged"]["throughput_tokens_per_s"].as_f64().unwrap(),
        v["contiguous"]["throughput_tokens_per_s"].as_f64().unwrap(),
    );
    let percent = |x: f64| format!("{:.1}%", x * 100.0);
    let count = |x: &Value| {
        let s = x.as_u64().unwrap().to_string();
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        out
    };
    assert_eq!(row("KV memory holding token states")[..2], [percent(paged), percent(contiguous)]);
    assert_eq!(
        row("peak running requests")[..2],
        [count(&v["paged"]["peak_running"]), count(&v["contiguous"]["peak_running"])]
    );
    assert_eq!(row("preemptions")[..2], [count(&v["paged"]["preemptions"]), count(&v["contiguous"]["preemptions"])]);
    assert_eq!(row("estimated throughput")[..2], [format!("{pt:.0} tokens/s"), format!("{ct:.0} tokens/s")]);
    assert_eq!(row("throughput ratio")[0], format!("{:.2}×", pt / ct));
}

#[test]
fn a_shared_prefix_is_found_in_the_prefix_cache() {
    let shared =
        simulate(&["--model", "llama-3-8b", "--gpu", "h100-sxm", "--requests", "300", "--shared-prefix", "1024:0.9"]);
    let rate = shared["paged"]["prefix_hit_rate"].as_f64().unwrap();
    assert!(rate > 0.6, "hit rate {rate}");
    let off = simulate(&[
        "--model",
        "llama-3-8b",
        "--gpu",
        "h100-sxm",
        "--requests",
        "300",
        "--shared-prefix",
        "1024:0.9",
        "--no-prefix-caching",
    ]);
    assert_eq!(off["paged"]["prefix_hit_rate"], 0.0);
}

#[test]
fn human_output_and_errors() {
    headroom()
        .args(["kv", "simulate", "--model", "mistral-7b", "--gpu", "l4", "--requests", "50"])
        .assert()
        .success()
        .stdout(contains("KV utilization"))
        .stdout(contains("paged serves"));
    headroom()
        .args(["kv", "simulate", "--model", "gpt-5", "--gpu", "l4"])
        .assert()
        .code(2)
        .stderr(contains("unknown model `gpt-5`"));
    headroom()
        .args(["kv", "simulate", "--model", "llama-2-70b", "--gpu", "l4"])
        .assert()
        .code(1)
        .stdout(contains("does NOT fit"))
        .stdout(contains("does not leave room for a KV cache"));
    headroom()
        .args(["kv", "simulate", "--model", "gpt2", "--gpu", "l4", "--prompt-len", "uniform:9"])
        .assert()
        .code(2)
        .stderr(contains("--prompt-len"));
    headroom()
        .args(["kv", "simulate", "--model", "gpt2", "--gpu", "l4", "--shared-prefix", "100"])
        .assert()
        .code(2)
        .stderr(contains("TOKENS:FRACTION"));
}

#[test]
fn models_without_a_kv_cache_or_with_odd_shapes_are_named() {
    let dir = tempfile::tempdir().unwrap();
    headroom_run(&["kv", "simulate", "--model", "bert-base-uncased", "--gpu", "h100-sxm"]).expect(2, "is an encoder");
    let m = dir.path().join("m");
    std::fs::create_dir(&m).unwrap();
    let cfg = m.join("config.json");
    let vocab = llama_config("").replace("128256", &(1u64 << 32).to_string());
    std::fs::write(&cfg, vocab).unwrap();
    let out = headroom_run(&[
        "kv",
        "simulate",
        "--model",
        arg(&cfg),
        "--gpu",
        "h200",
        "--requests",
        "10",
        "--gpu-memory",
        "100TiB",
        "--json",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json()["paged"]["finished"], out.json()["requests"]);
    // W3: heads beyond the hidden size, and a key given twice.
    std::fs::write(
        &cfg,
        llama_config("").replace(
            r#""num_attention_heads":32,"num_key_value_heads":8"#,
            r#""num_attention_heads":8192,"num_key_value_heads":8192"#,
        ),
    )
    .unwrap();
    headroom_run(&["plan", "--model", arg(&cfg), "--gpu", "h100-sxm", "--infer"])
        .expect(2, "8192 attention heads do not divide the hidden size 4096");
    std::fs::write(&cfg, llama_config(r#","hidden_size":8"#)).unwrap();
    headroom_run(&["plan", "--model", arg(&cfg), "--gpu", "h100-sxm"]).expect(2, "`hidden_size` is given twice");
    let gpt2 = r#"{"model_type":"gpt2","n_embd":768,"n_layer":12,"n_head":1024,"n_positions":1024,"vocab_size":50257}"#;
    std::fs::write(&cfg, gpt2).unwrap();
    headroom_run(&["kv", "simulate", "--model", arg(&cfg), "--gpu", "h100-sxm"])
        .expect(2, "1024 attention heads do not divide the hidden size 768");
}

#[test]
fn prompt_lengths_are_checked_and_never_built_when_too_long() {
    let kv = ["kv", "simulate", "--model", "llama-3-8b", "--gpu", "h100-sxm"];
    for (dist, needle) in [
        ("normal:inf,1", "`inf` is not a finite number"),
        ("1e30", "is not a whole number of tokens"),
        ("1.5", "is not a whole number of tokens"),
        ("sharegpt:3", "sharegpt takes no argument"),
    ] {
        headroom_run(&[&kv[..], &["--prompt-len", dist]].concat()).expect(2, needle);
    }
    for dist in ["normal:1e30,1", "1000000000000", "uniform:1-1000000000000", "100000000"] {
        let v = headroom_run(&[&kv[..], &["--prompt-len", dist, "--requests", "3", "--json"]].concat()).json();
        assert_eq!(v["rejected_requests"], 3, "{dist}: {v}");
        assert_eq!(v["requests"], 0);
    }
    // W6: prompts of max_model_len tokens are rejected as vLLM rejects them, and counted.
    let r = headroom_run(&[&kv[..], &["--prompt-len", "5000", "--requests", "20"]].concat());
    r.expect(0, "20 requests rejected: their prompts reach max_model_len = 4096 tokens");
    let v = headroom_run(
        &[&kv[..], &["--prompt-len", "4000", "--output-len", "200", "--requests", "20", "--json"]].concat(),
    )
    .json();
    assert_eq!((v["rejected_requests"].as_u64(), v["capped_requests"].as_u64()), (Some(0), Some(20)), "{v}");
    headroom_run(&[&kv[..], &["--shared-prefix", "5000:1"]].concat()).expect(2, "leaves no room in a prompt");
    // U6: the flags behind a does-not-fit answer are named.
    headroom_run(&[&kv[..], &["--max-num-seqs", "1000000000"]].concat()).expect(1, "--max-num-seqs 1000000000");
}

#[test]
fn long_prefixes_and_many_requests_stay_small() {
    headroom_run(&[
        "kv",
        "simulate",
        "--model",
        "llama-3-8b",
        "--gpu",
        "h100-sxm",
        "--shared-prefix",
        "1000000000:0.5",
    ])
    .expect(2, "leaves no room in a prompt of at most max_model_len − 1 = 4095 tokens");
    // Requests are drawn one at a time and a rejected prompt is never built (the simulator's
    // own test bounds what is held); drawn all at once, these would take 16 GB.
    #[cfg(target_os = "linux")]
    {
        let dir = tempfile::tempdir().unwrap();
        let r = sh(
            "ulimit -v 400000; $H kv simulate --model llama-3-8b --gpu h100-sxm --requests 1000000 --prompt-len 5000 --json",
            dir.path(),
        );
        assert_eq!(r.code, 0, "{}", r.stderr);
        assert_eq!(r.json()["rejected_requests"], 1_000_000);
    }
}
