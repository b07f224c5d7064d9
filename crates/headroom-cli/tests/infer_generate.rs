//! `plan --infer --framework hf`: transformers' `generate` replayed from its recorded program
//! (prompt and decode steps), the closed form where no template serves, and an inference
//! recording's `--recommend` table with inference's levers only.

use assert_cmd::Command;
use predicates::prelude::PredicateBooleanExt;
use predicates::str::contains;
use serde_json::Value;

fn plan(args: &[&str]) -> (i32, Value) {
    let out = Command::cargo_bin("headroom").unwrap().arg("plan").args(args).arg("--json").output().unwrap();
    let code = out.status.code().unwrap();
    assert!(code < 2, "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    (code, serde_json::from_slice(&out.stdout).unwrap())
}

const HF: [&str; 7] = ["--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--infer", "--framework", "hf"];

/// `headroom ARGS` from the repository's root (its bundled model files), which plans from
/// template `key`: its `--json` names the template and its text, exiting as the JSON did (1
/// where the job does not fit), says it replayed it. The JSON.
fn planned_from_template(args: &[&str], key: &str) -> Value {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let out = Command::cargo_bin("headroom").unwrap().current_dir(root).args(args).arg("--json").output().unwrap();
    assert!(out.status.code().unwrap() < 2, "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["planned_from"]["source"], "template", "{args:?}: {}", v["planned_from"]);
    assert_eq!(v["planned_from"]["template"], key, "{args:?}: {}", v["planned_from"]);
    Command::cargo_bin("headroom")
        .unwrap()
        .current_dir(root)
        .args(args)
        .assert()
        .code(out.status.code().unwrap())
        .stdout(contains(format!("planned by replaying transformers' code as recorded tensor by tensor ({key})")));
    v
}

#[test]
fn generate_is_replayed_from_its_template_through_its_decode_steps() {
    let job = |extra: &[&str]| plan(&[&HF[..], &["--batch", "64", "--seq", "16"], extra].concat()).1;
    let first = job(&[]);
    assert_eq!(first["planned_from"]["source"], "template");
    assert_eq!(first["planned_from"]["template"], "llama/generate/bf16/sdpa");
    assert_eq!(first["new_tokens"], 1);
    // 4,000 tokens after a 16-token prompt: the cache at the last step holds 16 + 3,999
    // positions of 128 KiB for 64 sequences (31.4 GiB), which the prompt's forward never held.
    let long = job(&["--new-tokens", "4000"]);
    assert_eq!(long["new_tokens"], 4000);
    assert_eq!(long["breakdown"]["kv_cache"].as_u64(), Some(64 * (16 + 3999) * 131072));
    let (a, b) = (first["reserved_bytes"].as_u64().unwrap(), long["reserved_bytes"].as_u64().unwrap());
    assert!(b > a + (30 << 30), "{a} {b}");
    assert!(long["allocated_bytes"].as_u64().unwrap() >= long["tensor_bytes"].as_u64().unwrap());
    // The largest batch is the boundary of the replays.
    let n = long["max_sequences"].as_u64().unwrap();
    let fits = |batch: u64| {
        let b = batch.to_string();
        plan(&[&HF[..], &["--seq", "16", "--new-tokens", "4000", "--batch", &b]].concat()).1["fits"] == true
    };
    assert!(n > 64 && fits(n) && !fits(n + 1), "{n}");
}

/// The families recorded for inference beside Llama's SDPA are replayed from their own
/// templates, at their own attention: BLOOM and Gemma-2 eager whatever is asked (transformers
/// has no SDPA for them), the others' eager as asked; each in the modes recorded for it.
#[test]
fn every_recorded_family_plans_generate_and_the_forward_from_its_template() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let dir = tempfile::tempdir().unwrap();
    // A config of a family no preset or bundled file has, as their hubs' config.json.
    let gemma2 = dir.path().join("gemma2.json");
    std::fs::write(
        &gemma2,
        r#"{"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
            "max_position_embeddings": 8192, "query_pre_attn_scalar": 256, "sliding_window": 4096}"#,
    )
    .unwrap();
    let gemma2 = gemma2.to_str().unwrap();
    let qwen3_moe = dir.path().join("qwen3-30b-a3b.json");
    std::fs::write(
        &qwen3_moe,
        r#"{"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
            "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
            "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
            "tie_word_embeddings": false, "decoder_sparse_step": 1, "mlp_only_layers": []}"#,
    )
    .unwrap();
    let qwen3_moe = qwen3_moe.to_str().unwrap();
    let both = ["generate", "forward"];
    for (model, attention, key, modes) in [
        ("phi-3-mini", "sdpa", "phi3/MODE/bf16/sdpa", &both[..]),
        ("gemma-2b", "sdpa", "gemma/MODE/bf16/sdpa", &both),
        (gemma2, "sdpa", "gemma2/MODE/bf16/eager", &both),
        ("pythia-1b", "sdpa", "gpt_neox/MODE/bf16/sdpa", &both),
        ("bloom-7b1", "sdpa", "bloom/MODE/bf16/eager", &both),
        ("mixtral-8x7b", "sdpa", "mixtral/MODE/bf16/sdpa", &both),
        ("data/models/qwen1.5-moe-a2.7b.json", "sdpa", "qwen2_moe/MODE/bf16/sdpa", &both),
        (qwen3_moe, "sdpa", "qwen3_moe/MODE/bf16/sdpa", &both),
        ("data/models/gemma-3-1b.json", "sdpa", "gemma3_text/MODE/bf16/sdpa", &both),
        ("llama-3.1-8b", "eager", "llama/MODE/bf16/eager", &both),
        ("mistral-7b", "eager", "mistral/MODE/bf16/eager", &both),
        ("data/models/qwen1.5-moe-a2.7b.json", "eager", "qwen2_moe/MODE/bf16/eager", &both),
        ("bert-base-uncased", "eager", "bert/MODE/bf16/eager", &["forward"]),
        // An encoder's inference is its forward; T5's generate and evaluation forward run the
        // attention asked (SDPA on the memory-efficient kernel, its position bias the mask).
        ("bert-base-uncased", "sdpa", "bert/MODE/bf16/sdpa", &["forward"]),
        ("t5-base", "sdpa", "t5/MODE/bf16/sdpa", &both),
        ("t5-base", "eager", "t5/MODE/bf16/eager", &both),
    ] {
        for (mode, extra) in [("generate", &["--new-tokens", "8"][..]), ("forward", &["--all-logits"][..])] {
            if !modes.contains(&mode) {
                continue;
            }
            let args = [
                &["plan", "--model", model, "--gpu", "h200", "--infer", "--framework", "hf", "--weights", "bf16"][..],
                &["--attention", attention, "--batch", "2", "--seq", "256"],
                extra,
            ]
            .concat();
            planned_from_template(&args, &key.replace("MODE", mode));
        }
    }
    // BERT generates nothing: its plan is the forward without --all-logits too, and generate is
    // refused with the way out.
    let bert = ["--model", "bert-base-uncased", "--gpu", "h200", "--infer", "--batch", "2", "--seq", "256"];
    let (_, v) = plan(&[&bert[..], &["--weights", "fp32"]].concat());
    assert_eq!(v["planned_from"]["template"], "bert/forward/fp32/sdpa", "{}", v["planned_from"]);
    assert_eq!(v["breakdown"]["kv_cache"].as_u64(), Some(0));
    for (args, says) in [
        ([&bert[..], &["--new-tokens", "8"]].concat(), "generates no tokens; its inference is one forward"),
        ([&bert[..], &["--framework", "vllm"]].concat(), "plan its forward with --framework hf"),
    ] {
        Command::cargo_bin("headroom")
            .unwrap()
            .current_dir(root)
            .arg("plan")
            .args(&args)
            .assert()
            .code(2)
            .stderr(contains(says).and(contains("panicked").not()));
    }
    // fp32 where no key-value heads are grouped, SDPA's math path where they are (a GPU's: no
    // fused kernel takes them, Gemma-2B's one among them too), and eager attention (BLOOM,
    // Gemma-2) where they are or not.
    for (model, key) in [
        ("gemma-7b", "gemma/MODE/fp32/sdpa"),
        ("gemma-2b", "gemma/MODE/fp32/sdpa-math"),
        ("llama-3-8b", "llama/MODE/fp32/sdpa-math"),
        ("mistral-7b", "mistral/MODE/fp32/sdpa-math"),
        ("mixtral-8x7b", "mixtral/MODE/fp32/sdpa-math"),
        ("qwen2.5-7b", "qwen2/MODE/fp32/sdpa-math"),
        ("data/models/qwen3-1.7b.json", "qwen3/MODE/fp32/sdpa-math"),
        (qwen3_moe, "qwen3_moe/MODE/fp32/sdpa-math"),
        ("data/models/gemma-3-1b.json", "gemma3_text/MODE/fp32/sdpa-math"),
        ("bloom-7b1", "bloom/MODE/fp32/eager"),
        (gemma2, "gemma2/MODE/fp32/eager"),
        ("pythia-1b", "gpt_neox/MODE/fp32/sdpa"),
        ("data/models/qwen1.5-moe-a2.7b.json", "qwen2_moe/MODE/fp32/sdpa"),
    ] {
        for (mode, extra) in [("generate", &["--new-tokens", "8"][..]), ("forward", &["--all-logits"][..])] {
            let args = [
                &["plan", "--model", model, "--gpu", "h200", "--infer", "--framework", "hf", "--weights", "fp32"][..],
                &["--batch", "2", "--seq", "256"],
                extra,
            ]
            .concat();
            planned_from_template(&args, &key.replace("MODE", mode));
        }
    }
    // Gemma-3 was recorded within its window (512 tokens for the 1B): past it the sliding
    // layers keep a view of the step's keys, which the template does not carry, and Gemma-3
    // has no closed form, so the plan is refused with the reason and the way out.
    let gemma3 = "data/models/gemma-3-1b.json";
    let args = ["plan", "--model", gemma3, "--gpu", "h200", "--infer", "--framework", "hf", "--seq", "1024"];
    Command::cargo_bin("headroom")
        .unwrap()
        .current_dir(root)
        .args(args)
        .assert()
        .failure()
        .stderr(contains("the cache of a sliding window was not recorded").and(contains("--framework vllm")));
}

/// T5 v1.1 (flan-t5: a gated MLP, an output layer of its own) plans `generate` and the
/// forward from its `/gated` templates, with its head's weight; the same config tied plans
/// them without it, and v1.0 (t5-base) from its own.
#[test]
fn t5_v1_1_plans_generate_and_the_forward_with_its_own_output_layer() {
    let dir = tempfile::tempdir().unwrap();
    // T5 v1.1 (flan-t5-base's config): a gated MLP and an output layer of its own, its template's;
    // tied to the embeddings, v1.1's template without its head.
    let config = |tied: bool| {
        let path = dir.path().join(format!("flan-t5-base-tied-{tied}.json"));
        let text = format!(
            r#"{{"model_type": "t5", "d_model": 768, "d_ff": 2048, "d_kv": 64, "num_heads": 12, "num_layers": 12,
                "num_decoder_layers": 12, "vocab_size": 32128, "feed_forward_proj": "gated-gelu",
                "tie_word_embeddings": {tied}, "relative_attention_num_buckets": 32}}"#
        );
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let (flan, gated) = (config(false), config(true));
    // Each mode at both precisions: flan-t5's output layer among the weights, the same config
    // tied planned from the same template without it; v1.0's forward from its own template.
    for (mode, extra) in
        [("generate", &["--new-tokens", "8"][..]), ("forward", &["--all-logits", "--batch", "2", "--seq", "256"])]
    {
        for (weights, width) in [("bf16", 2), ("fp32", 4)] {
            let job = |model: &str| {
                let args = ["--model", model, "--gpu", "h200", "--infer", "--framework", "hf", "--weights", weights];
                plan(&[&args[..], extra].concat()).1
            };
            let (v, tied) = (job(&flan), job(&gated));
            let key = format!("t5/{mode}/{weights}/sdpa/gated");
            assert_eq!(v["planned_from"]["template"], key.as_str(), "{}", v["planned_from"]);
            assert_eq!(tied["planned_from"]["template"], key.as_str(), "{}", tied["planned_from"]);
            let head = v["breakdown"]["weights"].as_u64().unwrap() - tied["breakdown"]["weights"].as_u64().unwrap();
            assert_eq!(head, 32128 * 768 * width);
            if mode == "forward" {
                let v10 = job("t5-base");
                assert_eq!(v10["planned_from"]["template"], key.replace("/gated", ""), "{}", v10["planned_from"]);
            }
        }
    }
}

/// Inference over bitsandbytes' layers (4-bit as QLoRA loads it, NF4 with double quantization
/// and bf16 compute; 4-bit as transformers loads it by default, `--quantize nf4` or `fp4` alone;
/// and LLM.int8(), each over a bf16 load) is replayed from each family's own quantized template,
/// which says what its recording assumed of bitsandbytes' kernels.
#[test]
fn every_recorded_family_over_bitsandbytes_layers_replays_its_quantized_template() {
    let nf4 = ["--quantize", "nf4", "--double-quant", "--compute-dtype", "bf16"];
    let defaults = ["--quantize", "nf4"];
    let fp4 = ["--quantize", "fp4"];
    let int8 = ["--quantize", "int8"];
    let qwen2_moe = "data/models/qwen1.5-moe-a2.7b.json";
    let both = ["generate", "forward"];
    let cases: [(&str, &[&str], &str, &[&str]); 19] = [
        (qwen2_moe, &nf4, "qwen2_moe/MODE/bf16/sdpa/nf4", &both),
        ("llama-3-8b", &defaults, "llama/MODE/bf16/sdpa/nf4-fp32-nodq", &both),
        ("bert-base-uncased", &fp4, "bert/MODE/bf16/sdpa/nf4-fp32-nodq", &["forward"]),
        ("t0-3b", &defaults, "t5/MODE/bf16/sdpa/gated/nf4-fp32-nodq", &both),
        (qwen2_moe, &fp4, "qwen2_moe/MODE/bf16/sdpa/nf4-fp32-nodq", &both),
        ("bert-base-uncased", &nf4, "bert/MODE/bf16/sdpa/nf4", &["forward"]),
        ("t5-base", &nf4, "t5/MODE/bf16/sdpa/nf4", &both),
        ("t0-3b", &nf4, "t5/MODE/bf16/sdpa/gated/nf4", &both),
        ("phi-3-mini", &int8, "phi3/MODE/bf16/sdpa/int8", &both),
        ("gemma-2b", &int8, "gemma/MODE/bf16/sdpa/int8", &both),
        ("data/models/gemma-3-1b.json", &int8, "gemma3_text/MODE/bf16/sdpa/int8", &both),
        ("mixtral-8x7b", &int8, "mixtral/MODE/bf16/sdpa/int8", &both),
        ("pythia-1b", &int8, "gpt_neox/MODE/bf16/sdpa/int8", &both),
        ("gpt2", &int8, "gpt2/MODE/bf16/sdpa/int8", &both),
        ("bloom-7b1", &int8, "bloom/MODE/bf16/eager/int8", &both),
        (qwen2_moe, &int8, "qwen2_moe/MODE/bf16/sdpa/int8", &both),
        ("bert-base-uncased", &int8, "bert/MODE/bf16/sdpa/int8", &["forward"]),
        ("t5-base", &int8, "t5/MODE/bf16/sdpa/int8", &both),
        ("t0-3b", &int8, "t5/MODE/bf16/sdpa/gated/int8", &both),
    ];
    for (model, quantize, key, modes) in cases {
        for (mode, extra) in [("generate", &["--new-tokens", "8"][..]), ("forward", &["--all-logits"][..])] {
            if !modes.contains(&mode) {
                continue;
            }
            let args = [
                &["plan", "--model", model, "--gpu", "h200", "--infer", "--framework", "hf", "--batch", "2"][..],
                &["--seq", "256"],
                quantize,
                extra,
            ]
            .concat();
            let v = planned_from_template(&args, &key.replace("MODE", mode));
            let kernel = if key.ends_with("/int8") { "LLM.int8()" } else { "gemm_4bit" };
            assert!(v["planned_from"]["assumed"].as_str().unwrap().contains(kernel), "{}", v["planned_from"]);
        }
    }
}

#[test]
fn the_closed_form_plans_what_no_template_serves_and_says_why() {
    for (extra, why) in [
        (&["--quantize", "nf4", "--double-quant"][..], "bitsandbytes"),
        (&["--weights", "fp32", "--quantize", "int8"][..], "bf16 load"),
    ] {
        let (_, v) = plan(&[&HF[..], extra].concat());
        assert_eq!(v["planned_from"]["source"], "closed_form", "{extra:?}");
        assert!(v["planned_from"]["why"].as_str().unwrap().contains(why), "{extra:?}: {}", v["planned_from"]);
    }
    // Mistral-7B's 4,096-token window: its cache stops growing there, which no template holds.
    let mistral = ["--model", "mistral-7b", "--gpu", "a100-80gb", "--infer", "--framework", "hf", "--seq"];
    let (_, short) = plan(&[&mistral[..], &["2048"]].concat());
    assert_eq!(short["planned_from"]["template"], "mistral/generate/bf16/sdpa");
    let (_, long) = plan(&[&mistral[..], &["4000", "--new-tokens", "200"]].concat());
    assert!(long["planned_from"]["why"].as_str().unwrap().contains("sliding window"), "{}", long["planned_from"]);
    // Eager attention asked of a family recorded with SDPA replays its own eager recording.
    let (_, eager) = plan(&[&mistral[..], &["2048", "--attention", "eager"]].concat());
    assert_eq!(eager["planned_from"]["template"], "mistral/generate/bf16/eager");
    let (_, vllm) = plan(&["--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--infer"]);
    assert_eq!(vllm["planned_from"]["source"], "engine");
    assert_eq!(vllm["new_tokens"], Value::Null);
}

#[test]
fn the_text_says_what_planned_it_and_new_tokens_is_refused_where_it_does_not_apply() {
    Command::cargo_bin("headroom")
        .unwrap()
        .args(["plan"])
        .args(HF)
        .args(["--seq", "512", "--new-tokens", "128"])
        .assert()
        .success()
        .stdout(contains("transformers' generate of 128 tokens"))
        .stdout(contains(
            "planned by replaying transformers' code as recorded tensor by tensor (llama/generate/bf16/sdpa)",
        ));
    Command::cargo_bin("headroom")
        .unwrap()
        .args(["plan"])
        .args(HF)
        .args(["--quantize", "nf4", "--double-quant"])
        .assert()
        .success()
        .stdout(contains("planned from its peak moment in closed form (no recorded program: bitsandbytes"));
    for (args, msg) in [
        (&["--new-tokens", "8"][..], "a serving engine's --seq is prompt and output"),
        (&["--framework", "hf", "--new-tokens", "8", "--all-logits"], "--all-logits plans one forward"),
        (&["--framework", "hf", "--new-tokens", "0"], "--new-tokens"),
        (&["--train", "--new-tokens", "8"], "applies to inference"),
    ] {
        Command::cargo_bin("headroom")
            .unwrap()
            .args(["plan", "--model", "llama-3-8b", "--gpu", "a100-80gb"])
            .args(if args.contains(&"--train") { &[][..] } else { &["--infer"][..] })
            .args(args)
            .assert()
            .code(2)
            .stderr(contains(msg));
    }
}

#[test]
fn an_inference_recordings_recommendations_show_inference_levers_only() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let out = Command::cargo_bin("headroom")
        .unwrap()
        .current_dir(root)
        .args(["plan", "--gpu", "l4", "--program", "data/recordings/gpt2-bf16-b1-s64-generate2.jsonl", "--recommend"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let table = &text[text.find("configurations of the recording's levers").expect("a table")..];
    let header = table.lines().nth(1).unwrap();
    assert!(header.contains("allocator") && header.contains("sequences") && header.contains("per GPU"), "{header}");
    assert!(!header.contains("checkpoint") && !header.contains("accum"), "{header}");
    assert!(!table.contains("optimizer: record it"), "{table}");
}
