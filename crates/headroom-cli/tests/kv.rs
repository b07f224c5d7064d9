//! `headroom kv simulate`, run as a user runs it.

use assert_cmd::Command;
use predicates::str::contains;
use serde_json::Value;

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
