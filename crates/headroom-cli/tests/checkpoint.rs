//! `headroom checkpoint`, run as a user runs it.

use assert_cmd::Command;
use predicates::str::contains;
use serde_json::Value;
use std::path::PathBuf;

mod support;
use support::*;

fn bundled() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/chains/gpt2-small-layers.json")
}

fn headroom() -> Command {
    Command::cargo_bin("headroom").unwrap()
}

#[test]
fn optimal_fits_and_beats_the_baselines_that_fit() {
    let out = headroom().arg("checkpoint").arg(bundled()).args(["--budget", "1.5GiB", "--json"]).output().unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (time, peak) = (v["time"].as_f64().unwrap(), v["peak_bytes"].as_u64().unwrap());
    assert!(peak <= v["budget_bytes"].as_u64().unwrap());
    assert!(time > v["store_all_time"].as_f64().unwrap(), "store-all does not fit, so some recomputation");
    for b in v["baselines"].as_array().unwrap() {
        if b["fits"].as_bool().unwrap() {
            assert!(time <= b["time"].as_f64().unwrap() + 1e-9, "{b}");
        }
    }
    assert!(v["schedule"].as_array().unwrap().iter().any(|op| op.as_str().unwrap().starts_with("Fck")));
}

#[test]
fn infeasible_budget_names_the_least_that_fits() {
    let out = headroom().arg("checkpoint").arg(bundled()).args(["--budget", "600MiB", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let least = v["least_feasible_budget_bytes"].as_u64().unwrap();
    assert!(least > 600 << 20);
    let ok = headroom().arg("checkpoint").arg(bundled()).args(["--budget", &least.to_string()]).output().unwrap();
    assert!(ok.status.success(), "the least budget printed is enough: {}", String::from_utf8_lossy(&ok.stdout));
}

#[test]
fn bad_input_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"input_bytes": 1, "stages": [{"forward_time": 1, "backward_time": 1, "output_bytes": 8, "saved_bytes": 4}]}"#,
    )
    .unwrap();
    headroom()
        .arg("checkpoint")
        .arg(&bad)
        .args(["--budget", "1GiB"])
        .assert()
        .code(2)
        .stderr(contains("saved_bytes (4) must include the output"));
    let typo = dir.path().join("typo.json");
    std::fs::write(&typo, r#"{"input_bytes": 1, "stages": [{"forward_tim": 1}]}"#).unwrap();
    headroom().arg("checkpoint").arg(&typo).args(["--budget", "1GiB"]).assert().code(2).stderr(contains("forward_tim"));
    headroom()
        .arg("checkpoint")
        .arg(bundled())
        .args(["--budget", "lots"])
        .assert()
        .code(2)
        .stderr(contains("--budget"));
}

/// A chain too large for memory (`/dev/zero`) is an error naming the file, not an abort.
#[test]
fn a_chain_larger_than_memory_is_an_error_not_an_abort() {
    let dir = tempfile::tempdir().unwrap();
    let r = support::sh("ulimit -v 1000000; \"$H\" checkpoint /dev/zero --budget 1GiB", dir.path());
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("reading /dev/zero"), "{}", r.stderr);
}

#[test]
fn budgets_where_nothing_fits_and_tables_too_large_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    for budget in ["1", "1KiB", "100KiB"] {
        let r = headroom_run(&["checkpoint", arg(&gpt2_chain()), "--budget", budget, "--json"]);
        let v = r.expect(1, "least_feasible_budget_bytes").json();
        assert!(v["least_feasible_budget_bytes"].as_u64().unwrap() > 1 << 29, "{v}");
    }
    let big = format!(
        r#"{{"input_bytes":{n},"stages":[{s}]}}"#,
        n = 1u64 << 62,
        s = vec![
            format!(r#"{{"forward_time":1,"backward_time":2,"output_bytes":{0},"saved_bytes":{0}}}"#, 1u64 << 62);
            8
        ]
        .join(",")
    );
    let big = write_file(dir.path(), "big.json", big);
    headroom_run(&["checkpoint", arg(&big), "--budget", "1GiB"]).expect(2, "more than 2^64 bytes");
    let stage = r#"{"forward_time":1,"backward_time":2,"output_bytes":4194304,"saved_bytes":33554432}"#;
    let long = format!(r#"{{"input_bytes":4194304,"stages":[{}]}}"#, vec![stage; 10_000].join(","));
    let long = write_file(dir.path(), "c10k.json", long);
    headroom_run(&["checkpoint", arg(&long), "--budget", "8GiB"]).expect(2, "at most 4096 are supported");
    let long = format!(r#"{{"input_bytes":4194304,"stages":[{}]}}"#, vec![stage; 3000].join(","));
    let long = write_file(dir.path(), "c3k.json", long);
    headroom_run(&["checkpoint", arg(&long), "--budget", "8GiB"]).expect(2, "use --slots 79 or fewer");
    headroom_run(&["checkpoint", arg(&gpt2_chain()), "--budget", "1GiB", "--slots", "10000000"])
        .expect(2, "more than the 2048 MiB allowed");
    // W5: one slot is a rounding problem, not a memory one (a baseline that fits unrounded
    // answers; below every one the table's rounding is named); huge times are named as such.
    headroom_run(&["checkpoint", arg(&gpt2_chain()), "--budget", "1GiB", "--slots", "1"]).expect(0, "Chen greedy");
    headroom_run(&["checkpoint", arg(&gpt2_chain()), "--budget", "600MiB", "--slots", "1"])
        .expect(1, "at 1 slots none does");
    let slow = r#"{"input_bytes":1,"stages":[{"forward_time":1e308,"backward_time":1e308,"output_bytes":1,"saved_bytes":1},
        {"forward_time":1e308,"backward_time":1e308,"output_bytes":1,"saved_bytes":1}]}"#;
    let slow = write_file(dir.path(), "slow.json", slow);
    headroom_run(&["checkpoint", arg(&slow), "--budget", "1GiB"]).expect(2, "use a larger time unit");
}

#[test]
fn chains_stages_and_losses_are_objects() {
    let dir = tempfile::tempdir().unwrap();
    for text in [r#"[1, [{"forward_time":1,"backward_time":1,"output_bytes":1,"saved_bytes":1}]]"#, "[1,2,3]"] {
        let p = write_file(dir.path(), "pos.json", text);
        headroom_run(&["checkpoint", arg(&p), "--budget", "1GiB"])
            .expect(2, "the chain must be a JSON object, not an array");
    }
    let p = write_file(dir.path(), "stage.json", r#"{"input_bytes":1,"stages":[[1,1,1,1]]}"#);
    headroom_run(&["checkpoint", arg(&p), "--budget", "1GiB"]).expect(2, "stage 0 must be a JSON object");
    let p = write_file(dir.path(), "dup.json", r#"{"input_bytes":1,"input_bytes":2,"stages":[]}"#);
    headroom_run(&["checkpoint", arg(&p), "--budget", "1GiB"]).expect(2, "`input_bytes` is given twice");
}
