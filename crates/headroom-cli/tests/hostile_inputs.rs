//! Every failing case of the hostile-input sweep (`../shared/findings/hostile-input-sweep.md`),
//! kept as a regression test: each runs the reproduction as a user types it
//! and checks the exit status the README promises (0 fits or succeeds, 1 does
//! not fit or runs out of memory, 2 bad input), the message, and that nothing
//! panics or aborts. Test names start with the finding's label.

use assert_cmd::Command;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data").join(rel)
}

fn chain() -> PathBuf {
    data("chains/gpt2-small-layers.json")
}

fn trace() -> PathBuf {
    data("traces/gpt2-small-train.jsonl")
}

/// What a run printed.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Asserts the exit status and that `needle` is in stdout or stderr.
    fn expect(&self, code: i32, needle: &str) -> &Run {
        assert_eq!(self.code, code, "exit status\nstdout: {}\nstderr: {}", self.stdout, self.stderr);
        assert!(
            self.stdout.contains(needle) || self.stderr.contains(needle),
            "{needle:?} not in\nstdout: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        self
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {}", self.stdout))
    }
}

fn headroom<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Run {
    let out = Command::cargo_bin("headroom").unwrap().args(args).output().unwrap();
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(!run.stderr.contains("panicked") && run.code != 101 && run.code != 134 && run.code >= 0, "{}", run.stderr);
    run
}

/// `bash -c SCRIPT` with `$H` the binary, for pipes, full disks and limits
/// (`pipefail` on, so a pipeline's status is headroom's).
fn sh(script: &str, dir: &Path) -> Run {
    let bin = assert_cmd::cargo::cargo_bin("headroom");
    let script = format!("set -o pipefail; {script}");
    let out = std::process::Command::new("bash").arg("-c").arg(script).env("H", bin).current_dir(dir).output().unwrap();
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    run
}

fn write(dir: &Path, name: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn llama_config(extra: &str) -> String {
    format!(
        r#"{{"model_type":"llama","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"intermediate_size":14336,"vocab_size":128256,"max_position_embeddings":8192{extra}}}"#
    )
}

#[test]
fn a1_optimal_checkpointing_when_the_states_leave_no_room() {
    // The README's and --help's example: an answer, not an abort.
    headroom(&[
        "plan",
        "--model",
        "llama-2-7b",
        "--gpu",
        "a100-80gb",
        "--batch",
        "8",
        "--seq",
        "4096",
        "--attention",
        "flash",
        "--checkpoint",
        "optimal",
        "--max-batch",
    ])
    .expect(1, "no checkpointing schedule fits: the model states and fixed terms take");
    let p = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--checkpoint", "optimal"];
    headroom(&p).expect(1, "leaving 0.00 GiB for activations");
    headroom(&[&p[..], &["--recommend"]].concat()).expect(1, "configurations fit");
    let zero3 = [&p[..], &["--gpus", "8", "--zero", "3", "--gpu-memory"]].concat();
    let v = headroom(&[&zero3[..], &["16GiB", "--json"]].concat()).json();
    assert_eq!(v["fits"], false);
    assert!(v["note"].as_str().unwrap().contains("no checkpointing schedule fits"), "{v}");
    headroom(&[&zero3[..], &["20GiB"]].concat()).expect(1, "the least budget that fits at");
}

#[test]
fn a2_b4_w5_checkpoint_budgets_nothing_fits_and_tables_too_large() {
    let dir = tempfile::tempdir().unwrap();
    for budget in ["1", "1KiB", "100KiB"] {
        let r = headroom(&["checkpoint", arg(&chain()), "--budget", budget, "--json"]);
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
    let big = write(dir.path(), "big.json", big);
    headroom(&["checkpoint", arg(&big), "--budget", "1GiB"]).expect(2, "more than 2^64 bytes");
    let stage = r#"{"forward_time":1,"backward_time":2,"output_bytes":4194304,"saved_bytes":33554432}"#;
    let long = format!(r#"{{"input_bytes":4194304,"stages":[{}]}}"#, vec![stage; 10_000].join(","));
    let long = write(dir.path(), "c10k.json", long);
    headroom(&["checkpoint", arg(&long), "--budget", "8GiB"]).expect(2, "at most 4096 are supported");
    let long = format!(r#"{{"input_bytes":4194304,"stages":[{}]}}"#, vec![stage; 3000].join(","));
    let long = write(dir.path(), "c3k.json", long);
    headroom(&["checkpoint", arg(&long), "--budget", "8GiB"]).expect(2, "use --slots 79 or fewer");
    headroom(&["checkpoint", arg(&chain()), "--budget", "1GiB", "--slots", "10000000"])
        .expect(2, "more than the 2048 MiB allowed");
    // W5: one slot is a rounding problem, not a memory one (a baseline that fits unrounded
    // answers; below every one the table's rounding is named); huge times are named as such.
    headroom(&["checkpoint", arg(&chain()), "--budget", "1GiB", "--slots", "1"]).expect(0, "Chen greedy");
    headroom(&["checkpoint", arg(&chain()), "--budget", "600MiB", "--slots", "1"]).expect(1, "at 1 slots none does");
    let slow = r#"{"input_bytes":1,"stages":[{"forward_time":1e308,"backward_time":1e308,"output_bytes":1,"saved_bytes":1},
        {"forward_time":1e308,"backward_time":1e308,"output_bytes":1,"saved_bytes":1}]}"#;
    let slow = write(dir.path(), "slow.json", slow);
    headroom(&["checkpoint", arg(&slow), "--budget", "1GiB"]).expect(2, "use a larger time unit");
}

/// A path as an argument (the test directories' paths are UTF-8).
fn arg(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

#[test]
fn a3_w2_large_segment_sizes_that_overflow_are_refused_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(dir.path(), "t.jsonl", "{\"op\":\"alloc\",\"id\":1,\"size\":3000000}\n");
    for conf in [
        "large_segment_size_mb:17592186044416,expandable_segments:True",
        "large_segment_size_mb:17592186044417",
        "large_segment_size_mb:17592186044416",
        "large_segment_size_mb:18446744073709551615,expandable_segments:True",
    ] {
        headroom(&["replay", arg(&t), "--alloc-conf", conf])
            .expect(2, "invalid allocator setting `large_segment_size_mb`: ");
    }
    headroom(&["replay", arg(&t), "--alloc-conf", "large_segment_size_mb:21,expandable_segments:True"])
        .expect(2, "not a multiple of 2 MiB");
}

#[test]
fn a4_a6_w3_models_without_a_kv_cache_or_with_odd_shapes() {
    let dir = tempfile::tempdir().unwrap();
    headroom(&["kv", "simulate", "--model", "bert-base-uncased", "--gpu", "h100-sxm"]).expect(2, "is an encoder");
    let m = dir.path().join("m");
    std::fs::create_dir(&m).unwrap();
    let cfg = m.join("config.json");
    let vocab = llama_config("").replace("128256", &(1u64 << 32).to_string());
    std::fs::write(&cfg, vocab).unwrap();
    let out = headroom(&[
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
    headroom(&["plan", "--model", arg(&cfg), "--gpu", "h100-sxm", "--infer"])
        .expect(2, "8192 attention heads do not divide the hidden size 4096");
    std::fs::write(&cfg, llama_config(r#","hidden_size":8"#)).unwrap();
    headroom(&["plan", "--model", arg(&cfg), "--gpu", "h100-sxm"]).expect(2, "`hidden_size` is given twice");
    let gpt2 = r#"{"model_type":"gpt2","n_embd":768,"n_layer":12,"n_head":1024,"n_positions":1024,"vocab_size":50257}"#;
    std::fs::write(&cfg, gpt2).unwrap();
    headroom(&["kv", "simulate", "--model", arg(&cfg), "--gpu", "h100-sxm"])
        .expect(2, "1024 attention heads do not divide the hidden size 768");
}

#[test]
fn a5_b5_w6_u6_prompt_lengths_are_checked_and_never_built_when_too_long() {
    let kv = ["kv", "simulate", "--model", "llama-3-8b", "--gpu", "h100-sxm"];
    for (dist, needle) in [
        ("normal:inf,1", "`inf` is not a finite number"),
        ("1e30", "is not a whole number of tokens"),
        ("1.5", "is not a whole number of tokens"),
        ("sharegpt:3", "sharegpt takes no argument"),
    ] {
        headroom(&[&kv[..], &["--prompt-len", dist]].concat()).expect(2, needle);
    }
    for dist in ["normal:1e30,1", "1000000000000", "uniform:1-1000000000000", "100000000"] {
        let v = headroom(&[&kv[..], &["--prompt-len", dist, "--requests", "3", "--json"]].concat()).json();
        assert_eq!(v["rejected_requests"], 3, "{dist}: {v}");
        assert_eq!(v["requests"], 0);
    }
    // W6: prompts of max_model_len tokens are rejected as vLLM rejects them, and counted.
    let r = headroom(&[&kv[..], &["--prompt-len", "5000", "--requests", "20"]].concat());
    r.expect(0, "20 requests rejected: their prompts reach max_model_len = 4096 tokens");
    let v =
        headroom(&[&kv[..], &["--prompt-len", "4000", "--output-len", "200", "--requests", "20", "--json"]].concat())
            .json();
    assert_eq!((v["rejected_requests"].as_u64(), v["capped_requests"].as_u64()), (Some(0), Some(20)), "{v}");
    headroom(&[&kv[..], &["--shared-prefix", "5000:1"]].concat()).expect(2, "leaves no room in a prompt");
    // U6: the flags behind a does-not-fit answer are named.
    headroom(&[&kv[..], &["--max-num-seqs", "1000000000"]].concat()).expect(1, "--max-num-seqs 1000000000");
}

#[test]
fn a7_closed_or_full_output_is_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let r = sh("$H kv simulate --model llama-3-8b --gpu h100-sxm --requests 5 | head -c 10 > /dev/null", dir.path());
    assert_eq!(r.code, 0, "{}", r.stderr);
    let t = trace().display().to_string();
    let c = chain().display().to_string();
    for script in [
        format!("$H replay {t} --json | head -c 100 > /dev/null"),
        format!("$H checkpoint {c} --budget 20GiB --slots 50 --schedule | head -1 > /dev/null"),
        "$H plan --help | head -1 > /dev/null".to_string(),
    ] {
        let r = sh(&script, dir.path());
        assert_eq!(r.code, 0, "{script}: {}", r.stderr);
        assert!(r.stderr.is_empty(), "{script}: {}", r.stderr);
    }
    // The status of the command itself, its reader gone: 1 for a plan that does not fit.
    let r = sh("$H plan --model llama-3-70b --gpu l4 > /dev/null; echo $?", dir.path());
    assert_eq!(r.stdout.trim(), "1");
    if Path::new("/dev/full").exists() {
        for cmd in ["plan --model llama-3-8b --gpu h100-sxm", &format!("replay {t} --json")] {
            sh(&format!("$H {cmd} > /dev/full"), dir.path())
                .expect(2, "error: writing the output: No space left on device");
        }
    }
}

#[test]
fn b1_b2_long_prefixes_and_many_requests_stay_small() {
    headroom(&["kv", "simulate", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--shared-prefix", "1000000000:0.5"])
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

#[cfg(target_os = "linux")]
#[test]
fn b3_snapshot_history_is_bounded_and_streamed() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = String::new();
    for i in 0..200_000u64 {
        t.push_str(&format!(
            "{{\"op\":\"alloc\",\"id\":{i},\"size\":{}}}\n{{\"op\":\"free\",\"id\":{i}}}\n",
            4096 + i % 7000
        ));
    }
    write(dir.path(), "load.jsonl", t);
    let r = sh("ulimit -v 600000; $H replay load.jsonl --snapshot-out s.json --max-entries 50000", dir.path());
    r.expect(0, "it keeps the last 50000 trace entries");
    let snap: Value = serde_json::from_slice(&std::fs::read(dir.path().join("s.json")).unwrap()).unwrap();
    assert_eq!(snap["device_traces"][0].as_array().unwrap().len(), 50_000);
}

#[test]
fn w1_u5_capacities_beyond_the_largest_gpu_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = (1u64 << 60) - (1 << 22);
    let t: String = (0..17).map(|i| format!("{{\"op\":\"alloc\",\"id\":{i},\"size\":{s}}}\n")).collect();
    let t = write(dir.path(), "t.jsonl", t);
    for (cap, needle) in [
        ("16EiB", "more than the largest size, 2^64 − 1 bytes"),
        ("17EiB", "2^64"),
        ("1000EiB", "2^64"),
        ("99999999999999999999999", "2^64"),
        ("2EiB", "more than the largest simulated GPU, 1 PiB"),
    ] {
        headroom(&["replay", arg(&t), "--capacity", cap]).expect(2, needle);
    }
    let v = headroom(&["replay", arg(&t), "--capacity", "1PiB", "--json"]).json();
    assert_eq!(v["num_ooms"], 17);
    assert_eq!(v["final_allocated_bytes"], 0);
    let eb = write(dir.path(), "eb.jsonl", format!("{{\"op\":\"alloc\",\"id\":1,\"size\":{}}}\n", 1u64 << 60));
    headroom(&["replay", arg(&eb), "--capacity", "1PiB"]).expect(1, "Tried to allocate more than 1EB memory.");
}

#[test]
fn w4_w10_plan_numbers_and_shapes_that_do_not_make_a_job() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.json");
    for (extra, needle) in [
        (r#","vocab_size":18446744073709551615"#, "is given twice"),
        (r#","num_attention_heads":30,"num_key_value_heads":30,"x":0"#, "is given twice"),
    ] {
        std::fs::write(&cfg, llama_config(extra)).unwrap();
        headroom(&["plan", "--model", arg(&cfg), "--gpu", "h100-sxm"]).expect(2, needle);
    }
    for (from, to, needle) in [
        ("128256", "18446744073709551615", "the vocabulary: 18446744073709551615 is more than"),
        (r#""num_hidden_layers":32"#, r#""num_hidden_layers":18446744073709551615"#, "the layers"),
        (r#""num_attention_heads":32"#, r#""num_attention_heads":30"#, "30 attention heads do not divide"),
        (r#""num_key_value_heads":8"#, r#""num_key_value_heads":64"#, "64 key-value heads do not divide"),
        (r#""num_key_value_heads":8"#, r#""num_key_value_heads":5"#, "5 key-value heads do not divide"),
        (
            r#""model_type":"llama""#,
            r#""model_type":"mixtral","num_local_experts":8,"num_experts_per_tok":64"#,
            "64 experts per token",
        ),
    ] {
        std::fs::write(&cfg, llama_config("").replace(from, to)).unwrap();
        headroom(&["plan", "--model", arg(&cfg), "--gpu", "h100-sxm", "--infer"]).expect(2, needle);
    }
    let p = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm"];
    headroom(&[&p[..], &["--gpus", "18446744073709551615", "--batch", "4", "--accumulation", "4"]].concat())
        .expect(2, "not in 1..=1048576");
    headroom(&[&p[..], &["--gpus", "1048576", "--batch", "4", "--accumulation", "18446744073709551615"]].concat())
        .expect(2, "more than 2^64 sequences");
    headroom(&[&p[..], &["--batch", "1000000000000", "--seq", "1000000000", "--json"]].concat())
        .expect(2, "more than 2^32 tokens in one micro-batch");
    let v = headroom(&[&p[..], &["--batch", "65536", "--seq", "65536", "--json"]].concat()).json();
    assert_eq!(v["fits"], false);
    headroom(&["plan", "--model", "bert-base-uncased", "--gpu", "h100-sxm", "--seq", "100000"])
        .expect(2, "512 learned positions");
    headroom(&[&p[..], &["--gpus", "16", "--tp", "16"]].concat()).expect(2, "does not divide the 8 key-value heads");
    // Uneven pipeline stages are a layout torchtitan and Megatron run; the emitted arguments say how.
    let r = headroom(&[&p[..], &["--gpus", "3", "--pp", "3", "--zero", "1", "--emit", "megatron"]].concat());
    r.expect(0, "--decoder-first-pipeline-num-layers 11 --decoder-last-pipeline-num-layers 11");
    let r = headroom(&[&p[..], &["--seq", "16384"]].concat());
    assert!(r.stdout.contains("beyond llama-3-8b's context of 8192 tokens"), "{}", r.stdout);
}

#[test]
fn w7_emitted_configs_launch_the_planned_gpus() {
    let p = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm"];
    headroom(&[&p[..], &["--gpus", "12", "--zero", "1", "--emit", "megatron"]].concat())
        .expect(0, "--nproc_per_node 6 --nnodes 2");
    headroom(&[&p[..], &["--gpus", "64", "--zero", "3", "--emit", "fsdp"]].concat())
        .expect(0, "torchrun --nnodes 8 --nproc_per_node 8");
    headroom(&[&p[..], &["--gpus", "8", "--zero", "3", "--emit", "megatron"]].concat())
        .expect(2, "shards the optimizer state only (ZeRO-1)");
    let r = headroom(&[&p[..], &["--gpus", "64", "--zero", "3", "--emit", "accelerate"]].concat());
    r.expect(0, "num_machines: 8\nnum_processes: 64");
}

#[test]
fn w8_stream_ids_beyond_i64_are_kept_apart_in_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(
        dir.path(),
        "s.jsonl",
        "{\"op\":\"alloc\",\"id\":1,\"size\":4096,\"stream\":18446744073709551615}\n\
         {\"op\":\"alloc\",\"id\":2,\"size\":4096,\"stream\":9223372036854775807}\n",
    );
    let out = dir.path().join("s.json");
    headroom(&["replay", arg(&t), "--snapshot-out", arg(&out)]).expect(0, "snapshot written");
    let v: Value = serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap();
    let mut streams: Vec<u64> =
        v["segments"].as_array().unwrap().iter().map(|s| s["stream"].as_u64().unwrap()).collect();
    streams.sort();
    assert_eq!(streams, [i64::MAX as u64, u64::MAX]);
}

#[test]
fn w9_u10_settings_headroom_does_not_simulate_are_said() {
    headroom(&["replay", arg(&trace()), "--alloc-conf", "backend:cudaMallocAsync"])
        .expect(2, "backend:cudaMallocAsync (CUDA's stream-ordered pool) is not simulated");
    let r = headroom(&[
        "replay",
        arg(&trace()),
        "--alloc-conf",
        "release_lock_on_cudamalloc:True,pinned_num_register_threads:8",
    ]);
    r.expect(
        0,
        "release_lock_on_cudamalloc, pinned_num_register_threads do not change the device allocator's decisions",
    );
}

#[test]
fn w11_max_batch_is_the_answer_not_the_ceiling() {
    let plan = |extra: &[&str]| {
        let p = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--gpu-memory", "10000000GiB", "--json"];
        headroom(&[&p[..], extra].concat()).json()
    };
    let v = plan(&["--max-batch"]);
    let m = v["max_batch"].as_u64().unwrap();
    assert!(m > 65536 && v["max_batch_is_search_limit"] == false, "{v}");
    let fits = |b: u64| plan(&["--batch", &b.to_string()])["fits"].clone();
    assert_eq!((fits(m), fits(m + 1)), (Value::Bool(true), Value::Bool(false)));
}

#[test]
fn e1_e2_e3_e4_exit_statuses() {
    let p = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm"];
    for flag in
        [&["--zero", "3"][..], &["--finetune", "qlora"], &["--recommend"], &["--emit", "deepspeed"], &["--max-batch"]]
    {
        headroom(&[&p[..], &["--infer"], flag].concat()).expect(2, "applies to training");
    }
    headroom(&[&p[..], &["--weights", "int4"]].concat()).expect(2, "--infer");
    headroom(&[&p[..], &["--global-batch", "0", "--recommend"]].concat()).expect(2, "0 is not in 1..");
    for m in ["0", "1"] {
        headroom(&[&p[..], &["--gpu-memory", m]].concat()).expect(2, "is less than 1 MiB; give a unit");
    }
    let kv = ["kv", "simulate", "--model", "llama-3-8b", "--gpu", "h100-sxm"];
    headroom(&["kv", "simulate", "--model", "llama-3-70b", "--gpu", "l4"])
        .expect(1, "does not leave room for a KV cache");
    headroom(&[&kv[..], &["--block-size", "1000000000"]].concat()).expect(1, "holds 0 blocks");
    // Beyond the model's context is a setting vLLM refuses; beyond the KV cache, an answer.
    headroom(&[&kv[..], &["--max-model-len", "1000000000"]].concat()).expect(2, "more than llama-3-8b's context");
    let v =
        headroom(&["kv", "simulate", "--model", "llama-3.1-8b", "--gpu", "l4", "--max-model-len", "131072", "--json"])
            .json();
    assert_eq!(v["fits"], false);
    assert!(v["reason"].as_str().unwrap().contains("more than the KV cache holds"), "{v}");
}

#[test]
fn u1_u4_u8_u9_trace_lines_are_named_and_read_strictly() {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes, needle) in [
        (
            "utf8.jsonl",
            &b"{\"op\":\"empty_cache\"}\n\n\n\n\xc3\x28\n"[..],
            "line 5: not valid UTF-8: byte 1 of the line is 0xc3",
        ),
        ("bin.jsonl", &b"\x00\x01\xfe\xff garbage"[..], "line 1: not valid UTF-8"),
        (
            "stream.jsonl",
            &b"{\"op\":\"alloc\",\"id\":1,\"size\":1,\"stream\":-1}\n"[..],
            "`stream` must be a non-negative whole number, got -1",
        ),
        ("big.jsonl", &b"{\"op\":\"alloc\",\"id\":1,\"size\":18446744073709551616}\n"[..], "`size` is out of range"),
        (
            "dup.jsonl",
            &b"{\"op\":\"alloc\",\"id\":1,\"size\":4096,\"size\":8192}\n"[..],
            "line 1: `size` is given twice",
        ),
        ("dupop.jsonl", &b"{\"op\":\"alloc\",\"op\":\"free\",\"id\":1}\n"[..], "`op` is given twice"),
    ] {
        let p = write(dir.path(), name, bytes);
        let r = headroom(&["replay", arg(&p)]);
        r.expect(2, needle);
        assert!(!r.stderr.contains("UTF-8: stream did not"), "{}", r.stderr);
    }
    let dir_err = headroom(&["replay", arg(dir.path())]);
    dir_err.expect(2, "is a directory");
    assert_eq!(dir_err.stderr.matches("directory").count(), 1, "{}", dir_err.stderr);
    let bom = write(dir.path(), "bom.jsonl", b"\xef\xbb\xbf{\"op\":\"empty_cache\"}\n");
    headroom(&["replay", arg(&bom)]).expect(0, "1 operations");
}

#[test]
fn u2_u3_u8_model_paths_and_configs_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let plan = |model: &Path| headroom(&["plan", "--model", arg(model), "--gpu", "h100-sxm"]);
    plan(Path::new("./no/config.json")).expect(2, "no such file");
    plan(dir.path()).expect(2, "the directory has no config.json");
    let cfg = dir.path().join("config.json");
    for (text, needle) in [
        ("[1,2,3]", "config.json is an array, not a JSON object"),
        ("\"hello\"", "is a string, not a JSON object"),
        ("null", "is null, not a JSON object"),
        ("{}", "has no `model_type`"),
        ("{\"model_type\": 5}", "`model_type` must be a string, not a number"),
    ] {
        std::fs::write(&cfg, text).unwrap();
        plan(&cfg).expect(2, needle);
    }
    // A byte-order mark is skipped; a model directory is read through its config.json.
    let small = llama_config("")
        .replace("4096", "512")
        .replace(r#""num_hidden_layers":32"#, r#""num_hidden_layers":4"#)
        .replace("14336", "1024")
        .replace("128256", "1000");
    std::fs::write(&cfg, format!("\u{feff}{small}")).unwrap();
    plan(&cfg).expect(0, "fits");
    plan(dir.path()).expect(0, "fits");
}

#[test]
fn u7_chains_are_objects() {
    let dir = tempfile::tempdir().unwrap();
    for text in [r#"[1, [{"forward_time":1,"backward_time":1,"output_bytes":1,"saved_bytes":1}]]"#, "[1,2,3]"] {
        let p = write(dir.path(), "pos.json", text);
        headroom(&["checkpoint", arg(&p), "--budget", "1GiB"])
            .expect(2, "the chain must be a JSON object, not an array");
    }
    let p = write(dir.path(), "stage.json", r#"{"input_bytes":1,"stages":[[1,1,1,1]]}"#);
    headroom(&["checkpoint", arg(&p), "--budget", "1GiB"]).expect(2, "stage 0 must be a JSON object");
    let p = write(dir.path(), "dup.json", r#"{"input_bytes":1,"input_bytes":2,"stages":[]}"#);
    headroom(&["checkpoint", arg(&p), "--budget", "1GiB"]).expect(2, "`input_bytes` is given twice");
}

#[test]
fn f1_f2_f3_snapshot_files_are_whole_or_absent_and_never_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(dir.path(), "t.jsonl", std::fs::read(trace()).unwrap());
    let out = dir.path().join("s.pickle");
    headroom(&[
        "replay",
        arg(&t),
        "--alloc-conf",
        "",
        "--alloc-conf",
        "large_segment_size_mb:17592186044416",
        "--snapshot-out",
        arg(&out),
    ])
    .expect(2, "large_segment_size_mb");
    assert!(!out.exists(), "F1: no file after an error");
    let before = std::fs::read(&t).unwrap();
    headroom(&["replay", arg(&t), "--snapshot-out", arg(&t)]).expect(2, "is also the input");
    assert_eq!(std::fs::read(&t).unwrap(), before, "F3: the trace is untouched");
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&t, dir.path().join("link.jsonl")).unwrap();
        sh("$H replay link.jsonl --snapshot-out t.jsonl", dir.path()).expect(2, "is also the input");
        // F2: a write cut short by a file-size limit leaves nothing behind.
        let r = sh("ulimit -f 8; trap '' XFSZ; $H replay t.jsonl --snapshot-out cut.pickle", dir.path());
        r.expect(2, "File too large");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(!left.iter().any(|n| n.to_string_lossy().contains("cut.pickle")), "{left:?}");
    }
    // An existing file is replaced whole.
    headroom(&["replay", arg(&t), "--snapshot-out", arg(&out)]).expect(0, "snapshot written");
    assert_eq!(&std::fs::read(&out).unwrap()[..2], &[0x80, 4]);
}
