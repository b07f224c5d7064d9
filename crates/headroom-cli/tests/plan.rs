//! `headroom plan`, run as a user runs it.

use assert_cmd::Command;
use predicates::str::contains;
use serde_json::Value;
mod support;
use support::*;

/// `headroom plan ARGS` exits 2 (bad input) and says `msg`.
fn refused(args: &[&str], msg: &str) {
    Command::cargo_bin("headroom").unwrap().arg("plan").args(args).assert().code(2).stderr(contains(msg));
}

/// `headroom plan ARGS` exits with `code` and prints `msg`.
fn prints(args: &[&str], code: i32, msg: &str) {
    Command::cargo_bin("headroom").unwrap().arg("plan").args(args).assert().code(code).stdout(contains(msg));
}

fn plan(args: &[&str]) -> (i32, Value) {
    let out = Command::cargo_bin("headroom").unwrap().arg("plan").args(args).arg("--json").output().unwrap();
    let code = out.status.code().unwrap();
    assert!(code < 2, "{}", String::from_utf8_lossy(&out.stderr));
    (code, serde_json::from_slice(&out.stdout).unwrap())
}

#[test]
fn json_has_the_documented_keys_and_checkpointing_changes_the_answer() {
    let common = [
        "--model",
        "llama-2-7b",
        "--gpu",
        "a100-80gb",
        "--train",
        "--batch",
        "8",
        "--seq",
        "4096",
        "--precision",
        "bf16",
        "--attention",
        "flash",
    ];
    let (code, none) = plan(&[&common[..], &["--checkpoint", "none"]].concat());
    assert_eq!(code, 1);
    assert_eq!(none["fits"], false);
    for k in ["weights", "gradients", "optimizer", "activations", "logits", "kv_cache", "temporary", "framework"] {
        assert!(none["breakdown"][k].is_number(), "{k}");
    }
    for k in ["per_gpu_bytes", "step_time_s", "tokens_per_s", "recommendations"] {
        assert!(none.get(k).is_some(), "{k}");
    }
    let (code, optimal) = plan(&[&common[..], &["--checkpoint", "optimal", "--max-batch"]].concat());
    assert_eq!(code, 0);
    let (_, full) = plan(&[&common[..], &["--checkpoint", "full"]].concat());
    assert!(optimal["per_gpu_bytes"].as_f64() <= Some(80.0 * (1u64 << 30) as f64));
    assert!(optimal["step_time_s"].as_f64() <= full["step_time_s"].as_f64());
    assert!(optimal["max_batch"].as_u64().unwrap() >= 8);
}

#[test]
fn zero_3_over_8_gpus_shards_the_model_states() {
    let (_, one) = plan(&["--model", "llama-3-8b", "--gpu", "h100-sxm", "--train"]);
    let (_, eight) = plan(&["--model", "llama-3-8b", "--gpu", "h100-sxm", "--train", "--gpus", "8", "--zero", "3"]);
    // Weights and optimizer state are held throughout the step (gradients only in its later
    // phases, so the breakdown at the peak may not show them).
    // At each job's own peak, as the replay holds them in the allocator's blocks: the weights
    // an eighth, within rounding; the optimizer's state at most an eighth (the single GPU's
    // peak comes while the first step makes its state).
    let term = |v: &Value, k: &str| v["breakdown"][k].as_f64().unwrap();
    assert!((term(&one, "weights") / term(&eight, "weights") - 8.0).abs() < 0.08);
    assert!(term(&one, "optimizer") / term(&eight, "optimizer") <= 8.01);
    // All terms at once (Megatron's accounting). Megatron-LM keeps fp32 main gradients,
    // whole on every GPU under its distributed optimizer (ZeRO-1), which shards the rest;
    // under ZeRO-3 (DeepSpeed's, 16-bit gradients) they shard too.
    let megatron = |extra: &[&str]| {
        plan(&[&["--model", "llama-3-8b", "--gpu", "h100-sxm", "--framework", "megatron"], extra].concat()).1
    };
    let (one, dist, zero3) =
        (megatron(&[]), megatron(&["--gpus", "8", "--zero", "1"]), megatron(&["--gpus", "8", "--zero", "3"]));
    let term = |v: &Value, k: &str| v["breakdown"][k].as_f64().unwrap();
    assert!((term(&one, "gradients") / 8.03e9 - 4.0).abs() < 0.01, "{}", term(&one, "gradients"));
    assert_eq!(term(&dist, "gradients"), term(&one, "gradients"));
    // (Each term as the allocator holds it: every tensor in whole blocks.)
    assert!((term(&one, "optimizer") / term(&dist, "optimizer") / 8.0 - 1.0).abs() < 1e-3);
    assert!((term(&one, "gradients") / term(&zero3, "gradients") / 16.0 - 1.0).abs() < 3e-3);
}

#[test]
fn bitsandbytes_quantizes_transformers_linear_layers_and_bad_combinations_are_named() {
    let base = ["--model", "llama-2-7b", "--gpu", "a100-40gb", "--infer", "--seq", "512"];
    let run = |extra: &[&str]| plan(&[&base[..], extra].concat());
    let (_, bf16) = run(&["--framework", "hf"]);
    // --quantize picks transformers' forward by itself.
    let (code, int8) = run(&["--quantize", "int8"]);
    assert_eq!(code, 0);
    assert_eq!(int8["quantize"]["format"], "int8");
    assert_eq!(int8["attention"], "sdpa");
    let (_, nf4) = run(&["--quantize", "nf4", "--double-quant", "--compute-dtype", "bf16"]);
    assert_eq!(nf4["quantize"]["double_quant"], true);
    assert_eq!(nf4["quantize"]["compute_dtype"], "bf16");
    let w = |v: &Value| v["breakdown"]["weights"].as_f64().unwrap();
    assert!(w(&nf4) < w(&int8) && w(&int8) < 0.6 * w(&bf16));
    prints(&[&base[..], &["--quantize", "fp4"]].concat(), 0, "bitsandbytes fp4, fp32 compute");
    for (extra, msg) in [
        (&["--quantize", "int8", "--double-quant"][..], "--double-quant: quantizes 4-bit layers"),
        (&["--quantize", "int8", "--compute-dtype", "bf16"], "--compute-dtype bf16: a 4-bit setting"),
        (&["--quantize", "nf4", "--weights", "int4"], "--weights int4 with --quantize"),
        (&["--quantize", "nf4", "--framework", "vllm"], "vllm loads checkpoints quantized ahead"),
        (&["--double-quant"], "--quantize"),
        (&["--quantize", "fp4", "--tp", "2", "--gpus", "2"], "no tensor parallelism"),
    ] {
        refused(&[&base[..], extra].concat(), msg);
    }
    refused(&["--model", "llama-2-7b", "--gpu", "a100-40gb", "--quantize", "int8"], "--infer");
}

/// QLoRA's base stored as asked: FP4 takes NF4's bytes, and without double quantization every
/// layer keeps an fp32 absmax a block of 64 (the replayed step rewritten by bitsandbytes' rule).
#[test]
fn qlora_s_base_format_and_double_quantization() {
    let base = ["--model", "llama-3-8b", "--gpu", "h200", "--batch", "1", "--seq", "256", "--finetune", "qlora"];
    let run = |extra: &[&str]| plan(&[&base[..], extra].concat());
    let (code, nf4) = run(&[]);
    assert_eq!(code, 0);
    assert_eq!(nf4["base_quantization"]["format"], "nf4");
    assert_eq!(nf4["base_quantization"]["double_quant"], true);
    let (_, fp4) = run(&["--base-weights", "fp4"]);
    assert_eq!(fp4["base_quantization"]["format"], "fp4");
    let (_, plain) = run(&["--double-quant", "off"]);
    assert_eq!(plain["base_quantization"]["double_quant"], false);
    assert_eq!(plain["runner"], nf4["runner"], "the same recorded step");
    let w = |v: &Value| v["breakdown"]["weights"].as_f64().unwrap();
    assert_eq!(w(&fp4), w(&nf4));
    // 0.5 − 0.127 bit a weight over Llama-3-8B's 6.98 B quantized weights: about 0.30 GiB.
    let more = (w(&plain) - w(&nf4)) / (1u64 << 30) as f64;
    assert!((0.28..0.36).contains(&more), "{more}");
    let (_, on) = run(&["--double-quant", "on"]);
    assert_eq!(w(&on), w(&nf4));
    prints(
        &[&base[..], &["--base-weights", "fp4", "--double-quant", "off"]].concat(),
        0,
        "bitsandbytes fp4, bf16 compute",
    );
    refused(
        &["--model", "llama-3-8b", "--gpu", "h200", "--finetune", "lora", "--double-quant", "off"],
        "4-bit LoRA base",
    );
    refused(&["--model", "llama-3-8b", "--gpu", "h200", "--double-quant", "off"], "4-bit LoRA base");
}

#[test]
fn inference_and_hf_configs() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.json");
    std::fs::write(
        &cfg,
        r#"{"model_type":"mistral","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,
            "intermediate_size":14336,"vocab_size":32000,"max_position_embeddings":32768}"#,
    )
    .unwrap();
    let (code, v) =
        plan(&["--model", cfg.to_str().unwrap(), "--gpu", "l4", "--infer", "--seq", "4096", "--weights", "int4"]);
    assert_eq!(code, 0);
    assert_eq!(v["params"], 7_241_732_096u64);
    assert!(v["max_sequences"].as_u64().unwrap() >= 20);
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"model_type":"llama","hidden_size":4096}"#).unwrap();
    Command::cargo_bin("headroom")
        .unwrap()
        .args(["plan", "--model", bad.to_str().unwrap(), "--gpu", "l4"])
        .assert()
        .code(2)
        .stderr(contains("lacks `num_attention_heads`"));
    Command::cargo_bin("headroom")
        .unwrap()
        .args(["plan", "--model", "llama-2-7b", "--gpu", "l4", "--checkpoint", "every-0"])
        .assert()
        .code(2)
        .stderr(contains("every-K"));
}

#[test]
fn recommendations_fit_are_ranked_and_become_engine_configs() {
    let (_, v) = plan(&[
        "--model",
        "llama-3-8b",
        "--gpu",
        "h100-sxm",
        "--gpus",
        "8",
        "--train",
        "--batch",
        "32",
        "--seq",
        "8192",
        "--recommend",
        "--emit",
        "deepspeed",
    ]);
    let recs = v["recommendations"].as_array().unwrap();
    assert!(!recs.is_empty() && v["configurations_searched"].as_u64().unwrap() > 1000);
    let times: Vec<f64> = recs.iter().map(|r| r["step_time_s"].as_f64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "fastest first");
    // --batch 32 on 8 GPUs: 256 sequences per optimizer step, however the GPUs are split.
    for r in recs {
        assert!(r["per_gpu_bytes"].as_f64().unwrap() <= 80.0 * (1u64 << 30) as f64);
        let data = r["parallel"]["data"].as_u64().unwrap();
        assert_eq!(r["micro_batch"].as_u64().unwrap() * r["accumulation"].as_u64().unwrap() * data, 256);
    }
    // DeepSpeed gets the fastest configuration it can express, planned as DeepSpeed runs it:
    // pure data parallelism, the global batch reached by accumulation.
    let ds: Value = serde_json::from_str(v["engine_config"].as_str().unwrap()).unwrap();
    assert_eq!(ds["train_batch_size"], 256);
    let (micro, accum) =
        (ds["train_micro_batch_size_per_gpu"].as_u64().unwrap(), ds["gradient_accumulation_steps"].as_u64().unwrap());
    assert_eq!(micro * accum * 8, 256);
}

#[test]
fn tensor_and_pipeline_parallelism_lora_and_offload_from_the_command_line() {
    let (code, v) = plan(&[
        "--model",
        "llama-3-70b",
        "--gpu",
        "h100-sxm",
        "--gpus",
        "64",
        "--tp",
        "8",
        "--pp",
        "4",
        "--zero",
        "1",
        "--accumulation",
        "16",
        "--seq",
        "8192",
        "--attention",
        "flash",
        "--checkpoint",
        "selective",
    ]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["parallel"]["data"], 2);
    assert_eq!(v["parallel"]["sequence_parallel"], true);
    assert_eq!(v["global_batch"], 32);
    assert!(v["mfu"].as_f64().unwrap() > 0.2 && v["mfu"].as_f64().unwrap() < 0.5);
    // A layer's backward does about twice its forward's work.
    let (fwd, bwd) = (v["layer_time_s"]["forward"].as_f64().unwrap(), v["layer_time_s"]["backward"].as_f64().unwrap());
    assert!(fwd > 0.0 && bwd > 1.5 * fwd && bwd < 3.0 * fwd, "{fwd} {bwd}");
    // The same job without splitting the model does not fit.
    let (code, _) = plan(&["--model", "llama-3-70b", "--gpu", "h100-sxm", "--gpus", "64", "--zero", "1"]);
    assert_eq!(code, 1);
    // QLoRA of an 8B model on a 24 GB card.
    let (code, q) = plan(&[
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "rtx-4090",
        "--finetune",
        "qlora",
        "--lora-rank",
        "32",
        "--seq",
        "4096",
        "--checkpoint",
        "full",
        "--attention",
        "flash",
    ]);
    assert_eq!(code, 0, "{q}");
    assert_eq!(q["finetune"], "qlora");
    assert!(q["trainable_params"].as_u64().unwrap() < 100_000_000);
    let (_, off) =
        plan(&["--model", "t5-3b", "--gpu", "a100-40gb", "--gpus", "8", "--zero", "2", "--offload", "optimizer"]);
    assert_eq!(off["breakdown"]["optimizer"], 0.0);
    assert!(off["host_bytes"].as_f64().unwrap() > 40e9);
    for (args, msg) in [
        (&["--gpus", "8", "--tp", "3"][..], "not a multiple"),
        (&["--gpus", "6", "--tp", "3"][..], "does not divide the 32 attention heads"),
        (&["--offload", "params"][..], "ZeRO stage 3"),
        (&["--precision", "fp8"][..], "no fp8 tensor cores"),
    ] {
        Command::cargo_bin("headroom")
            .unwrap()
            .args(["plan", "--model", "llama-2-7b", "--gpu", "a100-80gb"])
            .args(args)
            .assert()
            .code(2)
            .stderr(contains(msg));
    }
    // An encoder's inference is one forward: it generates no tokens.
    Command::cargo_bin("headroom")
        .unwrap()
        .args(["plan", "--model", "bert-base-uncased", "--gpu", "l4", "--infer", "--seq", "512", "--new-tokens", "8"])
        .assert()
        .code(2)
        .stderr(contains("encoder"));
}

/// `--compile`: torch.compile's partitioner recomputes norms and activation functions in the
/// backward instead of keeping their outputs, so an fp32 Llama keeps less; where no compiled
/// step was recorded the plan says so and plans the eager code.
#[test]
fn compile_keeps_fewer_activations_where_it_was_recorded() {
    let job = ["--model", "llama-3-8b", "--gpu", "h100-sxm", "--precision", "fp32", "--seq", "2048"];
    let (_, eager) = plan(&job);
    let (_, compiled) = plan(&[&job[..], &["--compile"]].concat());
    assert_eq!((eager["compile"].as_bool(), compiled["compile"].as_bool()), (Some(false), Some(true)));
    // What the forward holds beyond the weights and the optimizer's state (the optimizer step
    // is this job's peak, alike for both).
    let act = |v: &Value| {
        let states = v["breakdown"]["weights"].as_f64().unwrap() + v["breakdown"]["optimizer"].as_f64().unwrap();
        v["phases"]["forward"].as_f64().unwrap() - states
    };
    assert!(act(&compiled) < 0.8 * act(&eager), "{} {}", act(&compiled), act(&eager));
    // Compiled steps under Megatron's selective checkpointing were not recorded.
    let checkpointed =
        ["--model", "gpt2", "--gpu", "h100-sxm", "--seq", "1024", "--checkpoint", "selective", "--compile"];
    let (_, ck) = plan(&checkpointed);
    assert_eq!(ck["compile"], false);
    prints(&checkpointed, 0, "planned with the eager code's");
    refused(&["--model", "llama-3-8b", "--gpu", "h100-sxm", "--infer", "--compile"], "--compile");
}

/// `--compile` under torchtitan: its program's compiled blocks, and with the loss compiled
/// too (the default components) less again; `--compile model` is torchtitan's setting alone.
#[test]
fn torchtitans_compile_components_are_planned() {
    let job: Vec<&str> = "--model llama-3.1-8b --gpu h200 --gpus 32 --framework torchtitan --precision fp8 --batch 2 \
                          --seq 8192 --checkpoint per-op"
        .split_whitespace()
        .collect();
    let reserved = |extra: &[&str]| {
        let (code, v) = plan(&[&job[..], extra].concat());
        assert_eq!(code, 0, "{v}");
        (v["compile"].as_bool(), v["reserved_bytes"].as_f64().unwrap())
    };
    let (eager_flag, eager) = reserved(&[]);
    let (model_flag, model) = reserved(&["--compile", "model"]);
    let (all_flag, all) = reserved(&["--compile"]);
    assert_eq!((eager_flag, model_flag, all_flag), (Some(false), Some(true), Some(true)));
    // The compiled loss: the eager loss's three fp32 copies of 2 × 8192 × 128256 logits at the
    // peak (11.7 GiB) become the bf16 logits and their gradient.
    assert!(model < eager && all < model - 8.0 * (1u64 << 30) as f64, "{eager} {model} {all}");
    refused(&["--model", "llama-3.1-8b", "--gpu", "h200", "--compile", "model"], "--framework torchtitan");
}

/// `--pp-outputs`: what PyTorch's pipelining keeps of each micro-batch's output for the step,
/// by version; the last rank holds the logits, so it is the one that changes.
#[test]
fn pipeline_stage_outputs_are_planned_by_pytorchs_version() {
    let job: Vec<&str> = "--model llama-3.1-8b --gpu h200 --gpus 16 --pp 4 --tp 2 --framework torchtitan --batch 1 \
                          --seq 8192 --accumulation 8 --checkpoint full"
        .split_whitespace()
        .collect();
    let last_rank = |extra: &[&str]| {
        let (code, v) = plan(&[&job[..], extra].concat());
        assert_eq!(code, 0, "{v}");
        let ranks = v["pipeline_ranks"]["ranks"].as_array().unwrap().clone();
        (v["parallel"]["pipeline_outputs"].as_str().unwrap().to_string(), ranks[3]["reserved_bytes"].as_f64().unwrap())
    };
    let (none_name, none) = last_rank(&[]);
    let (every_name, every) = last_rank(&["--pp-outputs", "every"]);
    assert_eq!((none_name.as_str(), every_name.as_str()), ("none", "every"));
    // Eight micro-batches' logits (8192 × 128256 / 2 in bf16, 1 GiB each) are kept, and
    // concatenated once more at the schedule's end.
    assert!(every > none + 7.0 * (1u64 << 30) as f64, "{none} {every}");
    refused(&["--model", "llama-3.1-8b", "--gpu", "h200", "--pp-outputs", "every"], "more than one pipeline stage");
    refused(
        &["--model", "llama-3.1-8b", "--gpu", "h200", "--gpus", "2", "--pp", "2", "--pp-outputs", "last"],
        "--framework torchtitan",
    );
}

/// SGLang's server: its share of the free memory less the weights is the token pool, the
/// share defaults to SGLang's own for the GPU, and vLLM's settings are refused with it.
#[test]
fn sglang_sizes_its_pool_from_its_share() {
    let job = ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--infer", "--framework", "sglang", "--seq", "32768"];
    let (code, v) = plan(&job);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["framework"], "sglang");
    assert_eq!(v["engine"]["mem_fraction_static"], 0.834);
    let pool = v["engine"]["kv_cache_bytes"].as_f64().unwrap();
    assert_eq!(v["max_tokens"].as_f64().unwrap(), (pool / 131072.0).floor());
    // A larger share, a larger pool by the share of the same free memory.
    let (_, more) = plan(&[&job[..], &["--mem-fraction-static", "0.9"]].concat());
    // The free memory at start-up: the weights, the pool and the reserve the share leaves.
    let b = &v["breakdown"];
    let free = ["weights", "kv_cache", "activations"].iter().map(|k| b[k].as_f64().unwrap()).sum::<f64>();
    let grown = more["engine"]["kv_cache_bytes"].as_f64().unwrap() - pool;
    assert!((grown - (0.9 - 0.834) * free).abs() < 4096.0, "{grown}");
    // Seventy billion parameters on one H100: SGLang would not start.
    let (code, big) = plan(&["--model", "llama-3-70b", "--gpu", "h100-sxm", "--infer", "--framework", "sglang"]);
    assert_eq!(code, 1);
    assert!(big["engine"]["kv_cache_bytes"].as_f64().unwrap() < 0.0);
    for (args, msg) in
        [(&["--block-size", "32"][..], "a vLLM setting"), (&["--attention", "eager"][..], "serving engines")]
    {
        refused(&[&job[..], args].concat(), msg);
    }
    refused(
        &["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--infer", "--mem-fraction-static", "0.9"],
        "an SGLang setting",
    );
    refused(&["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--framework", "sglang"], "plans inference");
    refused(&[&job[..], &["--mem-fraction-static", "1.5"]].concat(), "is not in (0, 1]");
}

/// peft's DeepSpeed example as a user plans it: --offload implies DeepSpeed, whose gradient
/// bucket (5e8 fp32 elements) and ZeRO-3 gathers stay on the one GPU the parameters left.
#[test]
fn offload_plans_deepspeed_and_its_buffers() {
    let job = [
        "--model",
        "t0-3b",
        "--gpu",
        "a100-80gb",
        "--train",
        "--batch",
        "8",
        "--seq",
        "64",
        "--precision",
        "fp32",
        "--finetune",
        "lora",
        "--lora-rank",
        "8",
        "--lora-targets",
        "qv",
        "--zero",
        "3",
    ];
    let (code, ds) = plan(&[&job[..], &["--offload", "params"]].concat());
    assert_eq!(code, 0, "{ds}");
    assert_eq!(ds["framework"], "deepspeed");
    let bucket = 5e8 * 4.0;
    let temporary = ds["breakdown"]["temporary"].as_f64().unwrap();
    // The bucket, and the most ZeRO-3 gathers: what the prefetcher fetched up to
    // stage3_max_live_parameters (1e9), the tensor that crossed it fetched whole and, with
    // the parameters offloaded, copied from the host first — at most twice the largest
    // tensor (the 32,128 × 2,048 head) beyond the cap.
    let head = 32128.0 * 2048.0;
    assert!(temporary > bucket + 4.0 * 1e9 && temporary < bucket + 4.0 * (1e9 + 2.0 * head), "{temporary}");
    // The weights left but the norms and adapters DeepSpeed never partitions.
    let weights = ds["breakdown"]["weights"].as_f64().unwrap();
    assert!(weights > 0.0 && weights < 20e6, "{weights}");
    // Asked for as transformers' own, no builder plans it (its offload is DeepSpeed's): refused
    // with each transformers builder's reason, never planned as another framework's.
    let hf = Command::cargo_bin("headroom")
        .unwrap()
        .args(["plan"].into_iter().chain(job).chain(["--offload", "params", "--framework", "hf"]))
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&hf.get_output().stderr).to_string();
    assert!(err.contains("no program builder") && err.contains("transformers-phases: CPU offload"), "{err}");
    prints(
        &[&job[..], &["--offload", "params"]].concat(),
        0,
        "data 1 with DeepSpeed ZeRO-3, offloading the optimizer and params to the CPU",
    );
}

/// The README's main command, as a newcomer runs it on a fresh clone, fits and recommends.
#[test]
fn the_readme_main_command_runs() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let try_it = &readme[readme.find("## Try it").expect("a Try it section")..];
    let line = try_it
        .lines()
        .find_map(|l| l.strip_prefix("cargo run --release -p headroom-cli -- "))
        .expect("a cargo run line");
    let args: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(args[0], "plan", "the main command is a plan run");
    let out = Command::cargo_bin("headroom").unwrap().args(&args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains("fits: ")
            && text.contains("configurations fit by their tensors")
            && text.contains("replayed fastest first"),
        "{text}"
    );
}

/// Byte figures are whole numbers and enum values are the documented names (docs/JSON.md),
/// in training, in the recommendations, and in inference.
#[test]
fn json_bytes_are_integers_and_enums_are_stable_names() {
    let (_, t) = plan(&[
        "--model",
        "llama-3-8b",
        "--gpu",
        "h100-sxm",
        "--gpus",
        "8",
        "--zero",
        "3",
        "--offload",
        "params",
        "--recommend",
    ]);
    let (_, i) = plan(&["--model", "llama-3-8b", "--gpu", "l4", "--infer", "--weights", "int4"]);
    let mut byte_figures = vec![&t["per_gpu_bytes"], &t["host_bytes"], &t["allocated_bytes"], &t["tensor_bytes"]];
    byte_figures.extend(t["breakdown"].as_object().unwrap().values());
    byte_figures.extend(i["breakdown"].as_object().unwrap().values());
    byte_figures.push(&i["per_gpu_bytes"]);
    let recs = t["recommendations"].as_array().unwrap();
    assert!(!recs.is_empty());
    byte_figures.extend(recs.iter().map(|r| &r["per_gpu_bytes"]));
    for v in byte_figures {
        assert!(v.is_u64(), "{v} is not a whole number of bytes");
    }
    assert_eq!(t["offload"], "optimizer+params");
    assert_eq!(t["pipeline_stage"], "only");
    for r in recs {
        assert!(["mixed", "amp", "bf16", "fp32", "fp8"].contains(&r["precision"].as_str().unwrap()), "{r}");
        assert!(["eager", "sdpa", "flash"].contains(&r["attention"].as_str().unwrap()), "{r}");
    }
}

/// `--max-seq`: the answer fits and one token more does not, in training and in inference.
#[test]
fn max_seq_is_the_boundary() {
    let train = ["--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--finetune", "qlora", "--checkpoint", "full"];
    let (_, v) = plan(&[&train[..], &["--max-seq"]].concat());
    let n = v["max_seq"].as_u64().unwrap();
    assert!(n > 1000 && v["max_seq_is_search_limit"] == false, "{v}");
    let at = |seq: u64| plan(&[&train[..], &["--seq", &seq.to_string()]].concat()).1["fits"].as_bool().unwrap();
    assert!(at(n) && !at(n + 1), "{n}");

    let infer = ["--model", "llama-3-8b", "--gpu", "l4", "--infer", "--batch", "4"];
    let (_, v) = plan(&[&infer[..], &["--max-seq"]].concat());
    let n = v["max_seq"].as_u64().unwrap();
    let at = |seq: u64| plan(&[&infer[..], &["--seq", &seq.to_string()]].concat()).1["fits"].as_bool().unwrap();
    assert!(n > 8192 && at(n) && !at(n + 1), "{n}");
    // Learned positions end the search: GPT-2 has 1,024.
    let (_, v) = plan(&["--model", "gpt2", "--gpu", "h100-sxm", "--seq", "512", "--max-seq"]);
    assert_eq!((v["max_seq"].as_u64(), v["max_seq_is_search_limit"].as_bool()), (Some(1024), Some(true)));
}

/// `reserved_bytes` is what `max_memory_reserved` reports: the tensors and the allocator's
/// slack, without the CUDA context and NCCL.
#[test]
fn reserved_bytes_sit_between_allocated_and_the_total() {
    for args in [
        &["--model", "llama-3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--zero", "3"][..],
        &["--model", "gpt2", "--gpu", "l4", "--seq", "1024"],
        &["--model", "mistral-7b", "--gpu", "a100-80gb", "--infer", "--batch", "8"],
    ] {
        let (_, v) = plan(args);
        let (reserved, total) = (v["reserved_bytes"].as_u64().unwrap(), v["per_gpu_bytes"].as_u64().unwrap());
        assert!(reserved < total, "{args:?}");
        if let Some(allocated) = v["allocated_bytes"].as_u64() {
            assert!(allocated <= reserved, "{args:?}");
        }
        let outside = total - reserved;
        let gpus = v["gpus"].as_u64().unwrap();
        // The context by generation: 625 MiB on Hopper, 481 MiB on Ampere, 512 MiB on Ada.
        // The driver's own and a training process's context (measured on an H200 for Hopper).
        let context: u64 = match v["gpu"].as_str().unwrap() {
            "h100-sxm" if v["mode"] == "train" => (615 + 775) << 20,
            "h100-sxm" => 625 << 20,
            "a100-80gb" => 481 << 20,
            _ => 512 << 20,
        };
        let expected: u64 = if gpus > 1 && v["mode"] == "train" {
            context + 3 * (1 << 29)
        } else if v["framework"] == "vllm" {
            // vLLM's memory outside PyTorch on one GPU, 0.13 GiB, beside the context.
            context + (0.13 * (1u64 << 30) as f64).round() as u64
        } else {
            context
        };
        assert!(outside.abs_diff(expected) <= 1, "{args:?}: {outside} outside the allocator");
    }
}

/// `--infer --framework hf`: transformers' forward with a cache. Eager attention's s × s
/// scores make long prompts cost far more than SDPA; the largest batch is the boundary; the
/// options that do not apply are refused, naming why.
#[test]
fn transformers_inference_plans_its_own_forward() {
    let hf = ["--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--infer", "--framework", "hf", "--seq", "8192"];
    let (_, eager) = plan(&[&hf[..], &["--attention", "eager", "--batch", "4"]].concat());
    let (_, sdpa) = plan(&[&hf[..], &["--attention", "sdpa", "--batch", "4"]].concat());
    assert_eq!((eager["framework"].as_str(), eager["attention"].as_str()), (Some("hf"), Some("eager")));
    let act = |v: &Value| v["breakdown"]["activations"].as_u64().unwrap();
    // 32 heads × 8192² fp32 scores for 4 sequences alone are 32 GiB.
    assert!(act(&eager) > 32 << 30 && act(&sdpa) < 8 << 30, "{} {}", act(&eager), act(&sdpa));
    // generate's first forward keeps the last position's logits, at most 4 × 128,256 bf16
    // (its peak may fall inside the last layer, before them), and at most the whole cache.
    assert_eq!(sdpa["logits"].as_str(), Some("last"));
    assert!(sdpa["breakdown"]["logits"].as_u64().unwrap() <= 4 * 128256 * 2);
    assert!(sdpa["breakdown"]["kv_cache"].as_u64().unwrap() <= 4 * 8192 * 131072);
    // An evaluation loop's forward keeps every position's, 4 × 8192 × 128,256 bf16, beside
    // the whole cache (128 KiB a token).
    let (_, all) = plan(&[&hf[..], &["--attention", "sdpa", "--batch", "4", "--all-logits"]].concat());
    assert_eq!(all["breakdown"]["logits"].as_u64(), Some(4 * 8192 * 128256 * 2));
    assert_eq!(all["breakdown"]["kv_cache"].as_u64(), Some(4 * 8192 * 131072));
    let n = sdpa["max_sequences"].as_u64().unwrap();
    let fits = |batch: u64| plan(&[&hf[..], &["--batch", &batch.to_string()]].concat()).1["fits"] == true;
    assert!(n >= 4 && fits(n) && !fits(n + 1), "{n}");
    // Without --framework hf, vLLM's engine: it keeps no logits beside its sampler's moment.
    let (_, engine) =
        plan(&["--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--infer", "--seq", "8192", "--batch", "4"]);
    assert_eq!(engine["framework"].as_str(), Some("vllm"));
    assert_eq!(engine["breakdown"]["logits"].as_u64(), Some(0));

    for (args, msg) in [
        (&["--framework", "megatron"][..], "plans training"),
        (&["--framework", "hf", "--weights", "int4"], "fp32 and bf16"),
        (&["--framework", "hf", "--kv-dtype", "fp8"], "weights' dtype"),
        (&["--framework", "hf", "--gpus", "2", "--tp", "2"], "no tensor parallelism"),
        (&["--attention", "eager"], "serving engines"),
        (&["--framework", "hf", "--gpu-memory-utilization", "0.8"], "a vLLM setting"),
        (&["--all-logits"], "applies to --framework hf"),
    ] {
        refused(&[&["--model", "llama-3-8b", "--gpu", "a100-80gb", "--infer"][..], args].concat(), msg);
    }
    // An encoder-decoder's generate is replayed as recorded, its decode steps at the decoder's
    // past and the encoder's input.
    Command::cargo_bin("headroom")
        .unwrap()
        .args(["plan", "--model", "t5-base", "--gpu", "l4", "--infer", "--framework", "hf"])
        .assert()
        .success()
        .stdout(contains("(t5/generate/bf16/sdpa)"));
    // Nothing fits: said in words, not as a batch of 0.
    Command::cargo_bin("headroom")
        .unwrap()
        .args(["plan", "--model", "llama-3-8b", "--gpu", "l4", "--infer", "--framework", "hf", "--seq", "100000"])
        .assert()
        .code(1)
        .stdout(contains("largest batch that fits: none"));
}

/// vLLM's engine: the cache pool its start-up leaves, its settings by flag and by GPU, and
/// the engine's refusal to start said as such (exit 1).
#[test]
fn vllm_sizes_its_cache_from_its_settings() {
    let base = ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--infer", "--framework", "vllm", "--seq", "16000"];
    let (_, d) = plan(&base);
    let e = &d["engine"];
    assert_eq!(d["framework"].as_str(), Some("vllm"));
    // `vllm serve`'s defaults on an H100.
    assert_eq!(
        (e["gpu_memory_utilization"].as_f64(), e["max_num_batched_tokens"].as_u64(), e["max_num_seqs"].as_u64()),
        (Some(0.9), Some(8192), Some(1024))
    );
    let gib = |v: &Value| v.as_i64().unwrap() as f64 / (1u64 << 30) as f64;
    // The pool llm-d's vLLM log shows for this model and GPU, 51.38 GiB, within 1%.
    assert!((gib(&e["kv_cache_bytes"]) / 51.38 - 1.0).abs() < 0.01, "{}", e["kv_cache_bytes"]);
    // A lower utilization and fewer sampler rows: a smaller budget, a smaller profile peak.
    let (_, low) = plan(&[&base[..], &["--gpu-memory-utilization", "0.5", "--max-num-seqs", "256"]].concat());
    assert!(low["engine"]["profile_peak_bytes"].as_u64() < e["profile_peak_bytes"].as_u64());
    assert!(low["engine"]["kv_cache_bytes"].as_i64() < e["kv_cache_bytes"].as_i64());
    // The sequences it holds are whole blocks of --block-size tokens.
    let pool = e["kv_cache_bytes"].as_i64().unwrap() as u64;
    assert_eq!(d["max_sequences"].as_u64(), Some(pool / (16000 * 131072)));
    let (_, blocks) = plan(&[&base[..], &["--block-size", "4096"]].concat());
    assert_eq!(blocks["max_sequences"].as_u64(), Some(pool / (16384 * 131072)));
    // --batch beyond what the pool holds: the engine starts (exit 0) and queues the rest, said;
    // --max-seq finds the longest of which the batch fits at once.
    let n = d["max_sequences"].as_u64().unwrap();
    let over = Command::cargo_bin("headroom")
        .unwrap()
        .arg("plan")
        .args(base)
        .args(["--batch", &(n + 1).to_string()])
        .output()
        .unwrap();
    assert_eq!(over.status.code(), Some(0));
    let said = String::from_utf8_lossy(&over.stdout);
    assert!(
        said.contains(&format!("it holds {n} sequences of 16000 tokens at once — fewer than the --batch")),
        "{said}"
    );
    let (_, longest) = plan(&[&base[..], &["--batch", "8", "--max-seq"]].concat());
    let s = longest["max_seq"].as_u64().unwrap();
    assert!(s.div_ceil(16) * 16 * 8 * 131072 <= pool && (s + 16).div_ceil(16) * 16 * 8 * 131072 > pool, "{s}");
    // On an A100, vllm serve's smaller defaults.
    let (_, a100) = plan(&["--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--infer"]);
    assert_eq!(a100["engine"]["max_num_seqs"].as_u64(), Some(256));
    // A 70B model in fp8 on one H100: the weights and the profile leave nothing; exit 1, said.
    Command::cargo_bin("headroom")
        .unwrap()
        .args(["plan", "--model", "llama-3-70b", "--gpu", "h100-sxm", "--infer", "--weights", "fp8", "--seq", "8192"])
        .assert()
        .code(1)
        .stdout(contains("vLLM would not start"));
    for (args, msg) in [
        (&["--gpu-memory-utilization", "0"][..], "not in (0, 1]"),
        (&["--gpu-memory-utilization", "x"], "not a number"),
        (&["--max-num-seqs", "0"], "max-num-seqs"),
    ] {
        refused(&[&["--model", "llama-3-8b", "--gpu", "a100-80gb", "--infer"][..], args].concat(), msg);
    }
    // Settings past any sense are answered, not aborted on: a profile run larger than the GPU,
    // and more tokens a step than any GPU holds refused by name.
    Command::cargo_bin("headroom")
        .unwrap()
        .args(["plan", "--model", "llama-3-8b", "--gpu", "l4", "--infer", "--max-num-batched-tokens", "4194304"])
        .assert()
        .code(1)
        .stdout(contains("vLLM would not start"));
    refused(
        &["--model", "llama-3-8b", "--gpu", "l4", "--infer", "--max-num-batched-tokens", &u64::MAX.to_string()],
        "is not in 1..=4294967296",
    );
    // vLLM plans inference only.
    refused(&["--model", "llama-3-8b", "--gpu", "a100-80gb", "--framework", "vllm"], "plans inference");
}

#[test]
fn the_step_time_breakdown_adds_up_and_a_small_eager_step_is_launch_bound() {
    let part = |v: &Value, k: &str| v["step_time_breakdown"][k].as_f64().unwrap();
    let parts = ["compute_s", "memory_bound_s", "launch_s", "communication_s"];
    // GPT-2 small at one 512-token sequence: transformers' eager step waits on the host.
    let small = ["--model", "gpt2", "--gpu", "h100-sxm", "--batch", "1", "--seq", "512", "--precision", "bf16"];
    let (_, v) = plan(&small);
    let sum: f64 = parts.iter().map(|k| part(&v, k)).sum();
    let step = v["step_time_s"].as_f64().unwrap();
    assert!((sum - step).abs() <= 1e-9 * step, "{v}");
    assert_eq!(v["step_time_breakdown"]["dominant"], "launch");
    assert_eq!(v["step_time_breakdown"]["launch_bound"], true);
    prints(&small, 0, "launch-bound");
    prints(&small, 0, "CUDA graphs or torch.compile");
    // Llama-3-8B at 8 × 4096 keeps the GPU busy.
    let (_, big) = plan(&["--model", "llama-3-8b", "--gpu", "h200", "--batch", "8", "--seq", "4096"]);
    assert_eq!(big["step_time_breakdown"]["launch_bound"], false, "{big}");
    assert_eq!(big["step_time_breakdown"]["dominant"], "compute", "{big}");
}

#[test]
fn torchtitan_plans_fsdp2_as_torchtitan_runs_it() {
    // torchtitan shards over the data-parallel GPUs without --zero.
    let args = [
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h200",
        "--gpus",
        "8",
        "--framework",
        "torchtitan",
        "--batch",
        "2",
        "--seq",
        "8192",
        "--checkpoint",
        "per-op",
        "--attention",
        "flash",
    ];
    prints(&args, 0, "FSDP2 (fully_shard) as torchtitan runs it, sharded over 8 GPUs, reshard_after_forward=True");
    let (_, j) = plan(&args);
    assert_eq!(j["program"]["source"], "fsdp2", "{j}");
    let mut zero2 = args.to_vec();
    zero2.extend(["--zero", "2"]);
    prints(&zero2, 0, "reshard_after_forward=False");
}

#[test]
fn vllm_configurations_vllm_refuses_to_start_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let serve = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--infer", "--framework", "vllm"];
    for extra in [&["--max-num-seqs", "100000"][..], &["--max-num-batched-tokens", "512"]] {
        headroom_in(d, &[&serve[..], extra].concat()).expect(2, "must be greater than or equal to max_num_seqs");
    }
    headroom_in(d, &[&serve[..], &["--max-num-seqs", "18446744073709551615"]].concat()).expect(2, "is not in 1..=");
    headroom_in(d, &[&serve[..], &["--max-num-batched-tokens", "2048", "--max-num-seqs", "2048"]].concat())
        .expect(0, "starts: vLLM takes");
}

#[test]
fn compile_says_where_it_has_no_effect() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let job = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm"];
    for extra in [
        &["--framework", "megatron"][..],
        &["--framework", "torchtitan"],
        &["--tp", "2", "--gpus", "2"],
        &["--finetune", "lora"],
        &["--finetune", "qlora"],
    ] {
        let with = headroom_in(d, &[&job[..], extra, &["--compile"]].concat());
        assert!(with.stdout.contains("it is planned with the eager code's"), "{extra:?}: {}", with.stdout);
        assert!(!with.stdout.lines().next().unwrap_or("").contains("torch.compile"), "{extra:?}: {}", with.stdout);
    }
}

#[test]
fn sizes_past_what_a_gpu_holds_and_flags_without_effect_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let job = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm"];
    headroom_in(d, &[&job[..], &["--seq", "18446744073709551615"]].concat()).expect(2, "is not in 1..=4294967296");
    headroom_in(d, &[&job[..], &["--batch", "18446744073709551615"]].concat()).expect(2, "more than 2^32 tokens");
    headroom_in(d, &[&job[..], &["--batch", "65536", "--seq", "65537"]].concat()).expect(2, "more than 2^32 tokens");
    for (flag, value) in [("--lora-rank", "8"), ("--lora-targets", "qv"), ("--base-weights", "nf4")] {
        headroom_in(d, &[&job[..], &[flag, value]].concat())
            .expect(2, &format!("{flag} applies to --finetune lora or qlora"));
    }
    headroom_in(d, &[&job[..], &["--finetune", "lora", "--lora-rank", "8", "--lora-targets", "qv"]].concat())
        .expect(0, "fits");
}

/// `plan ARGS --json` run in `d` under 4 GiB of address space and `limit` seconds: the exit
/// status and the answer.
fn plan_bounded(d: &Path, args: &[&str], limit: u64) -> (i32, Value) {
    let started = Instant::now();
    let r = sh(&format!("ulimit -v 4194304; timeout {limit} \"$H\" plan {} --json", args.join(" ")), d);
    assert!(r.code < 2, "{args:?}: exit {}: {}", r.code, r.stderr);
    assert!(started.elapsed() < Duration::from_secs(limit), "{args:?} took {:?}", started.elapsed());
    (r.code, r.json())
}

/// A step's micro-batches repeat after the second: they are replayed once and counted, so an
/// accumulation or a global batch of 2^31 plans within seconds and a few megabytes under
/// every builder, and each micro-batch adds the same time to its step.
#[test]
fn an_accumulation_of_two_to_the_31_plans_in_bounded_work() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let jobs: [&[&str]; 4] = [
        &["--model", "llama-3-8b", "--gpu", "h100-sxm"],
        &["--model", "llama-3-8b", "--gpu", "h100-sxm", "--gpus", "4", "--pp", "4", "--framework", "torchtitan"],
        &["--model", "llama-3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--framework", "deepspeed", "--zero", "3"],
        &["--model", "gpt2", "--gpu", "l4", "--seq", "128", "--finetune", "lora"],
    ];
    for job in jobs {
        let (_, two) = plan_bounded(d, &[job, &["--accumulation", "2"]].concat(), 60);
        let (_, four) = plan_bounded(d, &[job, &["--accumulation", "4"]].concat(), 60);
        let (_, eight) = plan_bounded(d, &[job, &["--accumulation", "8"]].concat(), 60);
        let (_, many) = plan_bounded(d, &[job, &["--accumulation", "2147483648"]].concat(), 60);
        let step = |v: &Value| v["step_time_s"].as_f64().unwrap();
        // Each micro-batch past the second adds the same time.
        let each = (step(&four) - step(&two)) / 2.0;
        let added = (step(&many) - step(&two)) / (2147483648.0 - 2.0);
        assert!(each > 0.0 && (added / each - 1.0).abs() < 0.01, "{job:?}: {each} s, then {added} s a micro-batch");
        // The allocator's cache settles within the micro-batches a program holds (LoRA's many
        // small adapter tensors may take one more small segment past the fourth): a step of
        // more repeats the eighth's memory, and the fourth's within a few small blocks.
        assert_eq!(many["per_gpu_bytes"], eight["per_gpu_bytes"], "{job:?}: the memory of a step that has repeated");
        let settled = many["per_gpu_bytes"].as_f64().unwrap() - four["per_gpu_bytes"].as_f64().unwrap();
        assert!(settled.abs() <= (4u64 << 20) as f64, "{job:?}: {settled} bytes between four micro-batches and many");
    }
    let (_, global) = plan_bounded(
        d,
        &["--model", "llama-3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "2147483648", "--recommend"],
        60,
    );
    let recommendations = global["recommendations"].as_array().unwrap();
    assert!(!recommendations.is_empty());
    for r in recommendations {
        let n = |v: &Value| v.as_u64().unwrap();
        let sequences = n(&r["micro_batch"]) * n(&r["accumulation"]) * n(&r["parallel"]["data"]);
        assert_eq!(sequences, 1 << 31, "{r}");
    }
}

/// A config deeper than a plan lays out is refused by name before any work; the deepest
/// accepted plans, under optimal checkpointing too, in seconds.
#[test]
fn a_config_deeper_than_a_plan_lays_out_is_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let llama = |layers: u64, hidden: u64| {
        format!(
            r#"{{"model_type":"llama","hidden_size":{hidden},"num_hidden_layers":{layers},"num_attention_heads":4,
            "intermediate_size":688,"vocab_size":1000,"max_position_embeddings":4096}}"#
        )
    };
    for (name, layers, hidden) in [("deep.json", 1025, 256), ("huge.json", 1 << 20, 1 << 14)] {
        std::fs::write(d.join(name), llama(layers, hidden)).unwrap();
        let started = Instant::now();
        headroom_in(d, &["plan", "--model", name, "--gpu", "h100-sxm", "--seq", "128"])
            .expect(2, &format!("{layers} layers are more than headroom plans (1024"));
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    }
    std::fs::write(d.join("deepest.json"), llama(1024, 256)).unwrap();
    let (_, deepest) = plan_bounded(
        d,
        &[
            "--model",
            "deepest.json",
            "--gpu",
            "h100-sxm",
            "--seq",
            "128",
            "--checkpoint",
            "optimal",
            "--optimizer-impl",
            "fused",
        ],
        // Under a second in a release build; this is the test's debug build on a loaded machine.
        120,
    );
    assert_eq!(deepest["fits"], true);
}

/// The program `--dump-program` writes is the one whose replay the plan reports: under
/// optimal checkpointing too, where the schedule is solved again with memory held back until
/// its replay fits. It replays on the plan's capacity to the plan's peaks, with no OOM.
#[test]
fn a_dumped_program_replays_to_the_plans_peaks_under_optimal_checkpointing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for batch in ["4", "8"] {
        let job = [
            "plan",
            "--model",
            "llama-2-7b",
            "--gpu",
            "a100-80gb",
            "--precision",
            "bf16",
            "--batch",
            batch,
            "--seq",
            "4096",
            "--attention",
            "flash",
            "--checkpoint",
            "optimal",
            "--dump-program",
            "opt.jsonl",
            "--json",
        ];
        let plan = headroom_in(d, &job);
        assert_eq!(plan.code, 0, "{}", plan.stderr);
        let plan = plan.json();
        let capacity = plan["capacity_bytes"].as_u64().unwrap().to_string();
        let replay = headroom_in(d, &["replay", "opt.jsonl", "--capacity", &capacity, "--json"]);
        assert_eq!(replay.code, 0, "batch {batch}: {}", replay.stdout);
        let replay = replay.json();
        assert_eq!(replay["num_ooms"], 0, "batch {batch}");
        assert_eq!(replay["peak_allocated_bytes"], plan["allocated_bytes"], "batch {batch}");
        assert_eq!(replay["peak_reserved_bytes"], plan["reserved_bytes"], "batch {batch}");
    }
}

/// An explicit `--optimizer-impl foreach` where only Megatron's builder lays out the job (its
/// step is its own fused Adam) is refused by name, not planned as fused.
#[test]
fn an_optimizer_implementation_no_builder_runs_is_refused_by_name() {
    let job = ["--model", "llama-3-8b", "--gpu", "h200", "--optimizer-impl", "foreach", "--checkpoint"];
    for checkpoint in ["selective", "every-2", "per-op", "optimal"] {
        refused(&[&job[..], &[checkpoint]].concat(), "--optimizer-impl foreach is torch.optim's");
    }
}

/// Where vLLM's budget is spent before the KV cache, the text says the shortfall rather than
/// adding a negative cache into the total.
#[test]
fn a_server_with_no_room_for_its_kv_cache_says_its_shortfall() {
    let out = Command::cargo_bin("headroom")
        .unwrap()
        .args(["plan", "--model", "llama-3-70b", "--gpu", "l4", "--infer"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("falls 111.36 GiB short of them, with nothing for the KV cache"), "{text}");
    assert!(text.contains("weights (131.42 GiB)"), "{text}");
    assert!(!text.contains(" -") && !text.contains("kv cache      -"), "no negative figure: {text}");
}

/// Every flag that only inference reads is refused on every training plan, however the
/// training is asked for (clap waives `requires` once a conflicting flag is present).
#[test]
fn inference_flags_are_refused_on_every_training_plan() {
    let base = ["--model", "llama-3-8b", "--gpu", "h100-sxm"];
    let cases: [(&[&str], &str); 7] = [
        (&["--train", "--quantize", "int8"], "--quantize"),
        (&["--finetune", "qlora", "--quantize", "nf4", "--double-quant", "--compute-dtype", "bf16"], "--quantize"),
        // `--double-quant` is QLoRA's too now (`qlora_s_base_format_and_double_quantization`).
        (&["--finetune", "qlora", "--compute-dtype", "bf16"], "--compute-dtype"),
        (&["--finetune", "lora", "--weights", "int4"], "--weights"),
        (&["--checkpoint", "full", "--kv-dtype", "fp8"], "--kv-dtype"),
        (&["--zero", "3", "--gpus", "2", "--max-num-seqs", "8"], "--max-num-seqs"),
        (&["--accumulation", "4", "--gpu-memory-utilization", "0.5"], "--gpu-memory-utilization"),
    ];
    for (extra, flag) in cases {
        refused(&[&base[..], extra].concat(), &format!("{flag} applies to inference: add --infer"));
    }
}

/// `backend:cudaMallocAsync` is CUDA's pool, not the caching allocator headroom replays: `plan`
/// refuses it by name as `replay` does, alone or beside other keys.
#[test]
fn the_cuda_malloc_async_backend_is_refused_not_replayed_as_the_native_allocator() {
    let job = ["--model", "gpt2", "--gpu", "l4", "--seq", "1024", "--batch", "8", "--alloc-conf"];
    for conf in ["backend:cudaMallocAsync", "backend:cudaMallocAsync,expandable_segments:True"] {
        refused(&[&job[..], &[conf]].concat(), "backend:cudaMallocAsync (CUDA's stream-ordered pool) is not simulated");
    }
}

/// `--dump-program` never writes over one of the command's inputs (the config, a calibration
/// snapshot, also through a link), and what it writes is whole or absent: past the file-size
/// limit, the old file is kept and no partial file is left.
#[test]
fn the_dumped_program_never_replaces_an_input_and_is_whole_or_absent() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::copy(repo.join("data/models/qwen3-1.7b.json"), d.join("q.json")).unwrap();
    std::fs::copy(repo.join("data/snapshots/qwen3-1.7b-train.pickle.gz"), d.join("s.pickle")).unwrap();
    std::os::unix::fs::symlink("q.json", d.join("link.json")).unwrap();
    let config = std::fs::read(d.join("q.json")).unwrap();
    let snapshot = std::fs::read(d.join("s.pickle")).unwrap();
    let job = ["plan", "--model", "q.json", "--gpu", "h200", "--precision", "bf16"];
    for out in ["q.json", "link.json", "./q.json"] {
        headroom_in(d, &[&job[..], &["--dump-program", out]].concat()).expect(2, "is also the input");
    }
    let calibrated = ["--calibrate", "s.pickle", "--calibrate-batch", "1", "--calibrate-seq", "512"];
    headroom_in(d, &[&job[..], &calibrated, &["--dump-program", "s.pickle"]].concat()).expect(2, "is also the input");
    assert_eq!(std::fs::read(d.join("q.json")).unwrap(), config);
    assert_eq!(std::fs::read(d.join("s.pickle")).unwrap(), snapshot);

    std::fs::write(d.join("old.jsonl"), "kept\n").unwrap();
    for out in ["old.jsonl", "new.jsonl"] {
        let r = sh(&format!("ulimit -f 20; \"$H\" plan --model gpt2 --gpu l4 --seq 128 --dump-program {out}"), d);
        assert_eq!(r.code, 2, "{}", r.stderr);
        assert!(r.stderr.contains("File too large"), "{}", r.stderr);
    }
    assert_eq!(std::fs::read_to_string(d.join("old.jsonl")).unwrap(), "kept\n");
    let mut left: Vec<_> =
        std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    left.sort();
    assert_eq!(left, ["link.json", "old.jsonl", "q.json", "s.pickle"]);
}

#[test]
fn optimal_checkpointing_when_the_states_leave_no_room_says_so() {
    // The README's and --help's example: an answer, not an abort.
    headroom_run(&[
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
    headroom_run(&p).expect(1, "leaving 0.00 GiB for activations");
    headroom_run(&[&p[..], &["--recommend"]].concat()).expect(1, "configurations fit");
    let zero3 = [&p[..], &["--gpus", "8", "--zero", "3", "--gpu-memory"]].concat();
    let v = headroom_run(&[&zero3[..], &["16GiB", "--json"]].concat()).json();
    assert_eq!(v["fits"], false);
    assert!(v["note"].as_str().unwrap().contains("no checkpointing schedule fits"), "{v}");
    headroom_run(&[&zero3[..], &["20GiB"]].concat()).expect(1, "the least budget that fits at");
}

#[test]
fn numbers_and_shapes_that_do_not_make_a_job_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.json");
    for (extra, needle) in [
        (r#","vocab_size":18446744073709551615"#, "is given twice"),
        (r#","num_attention_heads":30,"num_key_value_heads":30,"x":0"#, "is given twice"),
    ] {
        std::fs::write(&cfg, llama_config(extra)).unwrap();
        headroom_run(&["plan", "--model", arg(&cfg), "--gpu", "h100-sxm"]).expect(2, needle);
    }
    for (from, to, needle) in [
        ("128256", "18446744073709551615", "the vocabulary: 18446744073709551615 is more than"),
        (
            r#""num_hidden_layers":32"#,
            r#""num_hidden_layers":18446744073709551615"#,
            "18446744073709551615 layers are more than headroom plans",
        ),
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
        headroom_run(&["plan", "--model", arg(&cfg), "--gpu", "h100-sxm", "--infer"]).expect(2, needle);
    }
    let p = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm"];
    headroom_run(&[&p[..], &["--gpus", "18446744073709551615", "--batch", "4", "--accumulation", "4"]].concat())
        .expect(2, "not in 1..=1048576");
    headroom_run(&[&p[..], &["--gpus", "1048576", "--batch", "4", "--accumulation", "18446744073709551615"]].concat())
        .expect(2, "more than 2^64 sequences");
    headroom_run(&[&p[..], &["--batch", "1000000000000", "--seq", "1000000000", "--json"]].concat())
        .expect(2, "more than 2^32 tokens in one micro-batch");
    let v = headroom_run(&[&p[..], &["--batch", "65536", "--seq", "65536", "--json"]].concat()).json();
    assert_eq!(v["fits"], false);
    headroom_run(&["plan", "--model", "bert-base-uncased", "--gpu", "h100-sxm", "--seq", "100000"])
        .expect(2, "512 learned positions");
    headroom_run(&[&p[..], &["--gpus", "16", "--tp", "16"]].concat())
        .expect(2, "does not divide the 8 key-value heads");
    // Uneven pipeline stages are a layout torchtitan and Megatron run; the emitted arguments say how.
    let r = headroom_run(&[&p[..], &["--gpus", "3", "--pp", "3", "--zero", "1", "--emit", "megatron"]].concat());
    r.expect(0, "--decoder-first-pipeline-num-layers 11 --decoder-last-pipeline-num-layers 11");
    let r = headroom_run(&[&p[..], &["--seq", "16384"]].concat());
    assert!(r.stdout.contains("beyond llama-3-8b's context of 8192 tokens"), "{}", r.stdout);
}

#[test]
fn emitted_configs_launch_the_planned_gpus() {
    let p = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm"];
    headroom_run(&[&p[..], &["--gpus", "12", "--zero", "1", "--emit", "megatron"]].concat())
        .expect(0, "--nproc_per_node 6 --nnodes 2");
    headroom_run(&[&p[..], &["--gpus", "64", "--zero", "3", "--emit", "fsdp"]].concat())
        .expect(0, "torchrun --nnodes 8 --nproc_per_node 8");
    headroom_run(&[&p[..], &["--gpus", "8", "--zero", "3", "--emit", "megatron"]].concat())
        .expect(2, "shards the optimizer state only (ZeRO-1)");
    let r = headroom_run(&[&p[..], &["--gpus", "64", "--zero", "3", "--emit", "accelerate"]].concat());
    r.expect(0, "num_machines: 8\nnum_processes: 64");
}

#[test]
fn max_batch_is_the_answer_not_the_ceiling() {
    let plan = |extra: &[&str]| {
        let p = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--gpu-memory", "10000000GiB", "--json"];
        headroom_run(&[&p[..], extra].concat()).json()
    };
    let v = plan(&["--max-batch"]);
    let m = v["max_batch"].as_u64().unwrap();
    assert!(m > 65536 && v["max_batch_is_search_limit"] == false, "{v}");
    let fits = |b: u64| plan(&["--batch", &b.to_string()])["fits"].clone();
    assert_eq!((fits(m), fits(m + 1)), (Value::Bool(true), Value::Bool(false)));
}

#[test]
fn exit_statuses_of_plan_and_kv_simulate_keep_their_promise() {
    let p = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm"];
    for flag in
        [&["--zero", "3"][..], &["--finetune", "qlora"], &["--recommend"], &["--emit", "deepspeed"], &["--max-batch"]]
    {
        headroom_run(&[&p[..], &["--infer"], flag].concat()).expect(2, "applies to training");
    }
    headroom_run(&[&p[..], &["--weights", "int4"]].concat()).expect(2, "--infer");
    headroom_run(&[&p[..], &["--global-batch", "0", "--recommend"]].concat()).expect(2, "0 is not in 1..");
    for m in ["0", "1"] {
        headroom_run(&[&p[..], &["--gpu-memory", m]].concat()).expect(2, "is less than 1 MiB; give a unit");
    }
    let kv = ["kv", "simulate", "--model", "llama-3-8b", "--gpu", "h100-sxm"];
    headroom_run(&["kv", "simulate", "--model", "llama-3-70b", "--gpu", "l4"])
        .expect(1, "does not leave room for a KV cache");
    headroom_run(&[&kv[..], &["--block-size", "1000000000"]].concat()).expect(1, "holds 0 blocks");
    // Beyond the model's context is a setting vLLM refuses; beyond the KV cache, an answer.
    headroom_run(&[&kv[..], &["--max-model-len", "1000000000"]].concat()).expect(2, "more than llama-3-8b's context");
    let v = headroom_run(&[
        "kv",
        "simulate",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "l4",
        "--max-model-len",
        "131072",
        "--json",
    ])
    .json();
    assert_eq!(v["fits"], false);
    assert!(v["reason"].as_str().unwrap().contains("more than the KV cache holds"), "{v}");
}

#[test]
fn model_paths_and_configs_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let plan = |model: &Path| headroom_run(&["plan", "--model", arg(model), "--gpu", "h100-sxm"]);
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
fn lora_on_a_recorded_family_replays_peft_s_recorded_step() {
    let args = [
        "--model",
        "llama-3-8b",
        "--gpu",
        "h200",
        "--batch",
        "1",
        "--seq",
        "2048",
        "--precision",
        "bf16",
        "--attention",
        "sdpa",
        "--finetune",
        "lora",
        "--lora-rank",
        "16",
    ];
    let (code, j) = plan(&args);
    assert_eq!(code, 0, "{j}");
    assert_eq!(j["program"]["source"], "recorded", "{j}");
    assert_eq!(j["program"]["template"], "llama/causal-lm/bf16/sdpa/full/lora-all", "{j}");
    // Any rank: the rank is a unit of the template's laws.
    let mut rank = args.to_vec();
    rank[15] = "64";
    let (_, j64) = plan(&rank);
    assert_eq!(j64["program"]["template"], j["program"]["template"], "{j64}");
    assert!(j64["breakdown"]["optimizer"].as_f64() > j["breakdown"]["optimizer"].as_f64(), "{j64}");
    // QLoRA replays its own recorded step, without checkpointing
    // (`use_gradient_checkpointing=False`) and with it (prepare_model_for_kbit_training's default):
    // SDPA's math path, which a GPU runs for QLoRA's fp32 attention over Llama 3's grouped heads.
    let mut qlora = args.to_vec();
    qlora[13] = "qlora";
    let (_, j) = plan(&qlora);
    assert_eq!(j["program"]["source"], "recorded", "{j}");
    assert_eq!(j["program"]["template"], "llama/causal-lm/bf16/sdpa-math/full/qlora-all", "{j}");
    let (_, j) = plan(&[&qlora[..], &["--checkpoint", "full"]].concat());
    assert_eq!(j["program"]["template"], "llama/causal-lm/bf16/sdpa-math/ckpt/qlora-all", "{j}");
}
