//! `headroom plan --config FILE`: each format's published file plans the same job as the same
//! job written as flags, names what it does not honour, and a file that cannot be read is
//! refused (exit 2) by its name and the field.

use assert_cmd::Command;
use predicates::str::contains;
use serde_json::Value;
use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn headroom() -> Command {
    let mut c = Command::cargo_bin("headroom").unwrap();
    c.current_dir(repo()).arg("plan");
    c
}

fn plan(args: &[&str]) -> Value {
    let out = headroom().args(args).arg("--json").output().unwrap();
    let code = out.status.code().unwrap();
    assert!(code < 2, "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The plan of `config` (its `config` record taken out, and returned) and the plan of `flags`:
/// the same.
fn same_plan(config: &[&str], flags: &[&str]) -> Value {
    let mut from_file = plan(config);
    let record = from_file.as_object_mut().unwrap().remove("config").expect("a config record");
    let from_flags = plan(flags);
    assert!(from_flags.get("config").is_none());
    assert_eq!(from_file, from_flags, "--config {config:?} and the flags {flags:?} plan differently");
    record
}

/// The reason `record` gives for not honouring `field`.
fn why(record: &Value, field: &str) -> String {
    let list = record["not_honoured"].as_array().unwrap();
    let hit = list.iter().find(|i| i["field"] == field);
    hit.unwrap_or_else(|| panic!("{field} is not named in {list:?}"))["why"].as_str().unwrap().to_string()
}

#[test]
fn torchtitan_s_llama3_8b_toml_is_its_flags() {
    let record = same_plan(
        &["--config", "data/configs/torchtitan-llama3_8b.toml", "--gpu", "h100-sxm", "--gpus", "8"],
        &[
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "h100-sxm",
            "--gpus",
            "8",
            "--framework",
            "torchtitan",
            "--batch",
            "1",
            "--seq",
            "8192",
            "--checkpoint",
            "per-op",
            "--precision",
            "mixed",
            "--optimizer-impl",
            "fused",
        ],
    );
    assert_eq!(record["format"], "torchtitan");
    assert_eq!(record["model"]["field"], "model.flavor");
    assert!(why(&record, "quantize.linear.float8.filter_fqns").contains("converters"));
    assert_eq!(why(&record, "optimizer.lr"), "no bearing on memory");
}

#[test]
fn flags_beside_the_file_override_it() {
    same_plan(
        &[
            "--config",
            "data/configs/torchtitan-llama3_8b.toml",
            "--gpu",
            "h100-sxm",
            "--gpus",
            "8",
            "--seq",
            "4096",
            "--checkpoint",
            "full",
            "--model",
            "llama-3-8b",
        ],
        &[
            "--model",
            "llama-3-8b",
            "--gpu",
            "h100-sxm",
            "--gpus",
            "8",
            "--framework",
            "torchtitan",
            "--batch",
            "1",
            "--seq",
            "4096",
            "--checkpoint",
            "full",
            "--optimizer-impl",
            "fused",
        ],
    );
}

#[test]
fn a_deepspeed_config_with_training_arguments_is_its_flags() {
    let record = same_plan(
        &[
            "--config",
            "data/configs/deepspeed-ds_config_zero3.json",
            "--hf-args",
            "data/configs/hf-training-args.json",
            "--model",
            "llama-3-8b",
            "--gpu",
            "a100-80gb",
            "--gpus",
            "8",
        ],
        &[
            "--model",
            "llama-3-8b",
            "--gpu",
            "a100-80gb",
            "--gpus",
            "8",
            "--framework",
            "deepspeed",
            "--zero",
            "3",
            "--offload",
            "params",
            "--precision",
            "mixed",
            "--batch",
            "1",
            "--accumulation",
            "4",
            "--checkpoint",
            "full",
        ],
    );
    assert_eq!(record["format"], "deepspeed");
    assert!(why(&record, "zero_optimization.stage3_max_live_parameters").contains("default buckets"));
    assert!(why(&record, "data/configs/hf-training-args.json: optim").contains("optimizer runs instead"));
}

#[test]
fn vllm_s_serve_line_is_its_flags() {
    let record = same_plan(
        &["--config", "data/configs/vllm-serve-mistral-7b.sh", "--gpu", "a100-80gb"],
        &[
            "--model",
            "mistralai/Mistral-7B-v0.1",
            "--gpu",
            "a100-80gb",
            "--infer",
            "--framework",
            "vllm",
            "--seq",
            "2048",
        ],
    );
    assert_eq!(record["format"], "serve");
    assert_eq!(record["model"]["field"], "vllm serve MODEL");
}

#[test]
fn torchtune_s_lora_recipe_is_its_flags_and_names_its_chunked_loss() {
    let record = same_plan(
        &[
            "--config",
            "data/configs/torchtune-llama3_1-8B_lora_single_device.yaml",
            "--gpu",
            "rtx-4090",
            "--seq",
            "1024",
        ],
        &[
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "rtx-4090",
            "--finetune",
            "lora",
            "--lora-rank",
            "8",
            "--lora-targets",
            "all",
            "--batch",
            "2",
            "--accumulation",
            "8",
            "--seq",
            "1024",
            "--precision",
            "bf16",
            "--checkpoint",
            "full",
            "--optimizer-impl",
            "fused",
        ],
    );
    assert!(why(&record, "loss._component_").contains("python -m headroom_gpu record"));
    assert!(why(&record, "tokenizer.max_seq_len").contains("null"));
}

#[test]
fn accelerate_s_fsdp_template_is_its_flags() {
    let record = same_plan(
        &[
            "--config",
            "data/configs/accelerate-fsdp.yaml",
            "--model",
            "llama-3-8b",
            "--gpu",
            "a100-80gb",
            "--batch",
            "2",
        ],
        &[
            "--model",
            "llama-3-8b",
            "--gpu",
            "a100-80gb",
            "--gpus",
            "2",
            "--zero",
            "3",
            "--precision",
            "mixed",
            "--batch",
            "2",
        ],
    );
    assert!(why(&record, "fsdp_config.fsdp_backward_prefetch").contains("prefetch"));
}

/// `--emit torchtitan` writes the job file that, given back to `--config`, plans the same job.
#[test]
fn torchtitan_s_emitted_job_file_plans_the_same_job() {
    let dir = tempfile::tempdir().unwrap();
    for flags in [
        &["--gpus", "8", "--batch", "2", "--accumulation", "4", "--checkpoint", "per-op"][..],
        &["--gpus", "32", "--tp", "4", "--pp", "2", "--accumulation", "8", "--pp-schedule", "interleaved-1f1b"],
        &["--gpus", "16", "--dp-replicate", "2", "--cp", "2", "--checkpoint", "every-2", "--compile"],
    ] {
        let job =
            [&["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--framework", "torchtitan", "--seq", "4096"], flags]
                .concat();
        let emitted = plan(&[&job[..], &["--emit", "torchtitan"]].concat());
        let file = dir.path().join("job.toml");
        std::fs::write(&file, emitted["engine_config"].as_str().unwrap()).unwrap();
        let record = same_plan(&["--config", file.to_str().unwrap(), "--gpu", "h100-sxm"], &job);
        assert_eq!(record["format"], "torchtitan", "{record}");
    }
}

#[test]
fn the_text_names_what_is_not_honoured() {
    headroom()
        .args(["--config", "data/configs/torchtune-llama3_1-8B_lora_single_device.yaml", "--gpu", "a100-80gb"])
        .assert()
        .stdout(contains("not honoured:\n"))
        .stdout(contains("loss._component_: LinearCrossEntropyLoss"))
        .stdout(contains("no bearing on memory: checkpointer._component_"));
}

fn refused(args: &[&str], says: &[&str]) {
    let out = headroom().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    for s in says {
        assert!(stderr.contains(s), "{args:?} does not say {s:?}: {stderr}");
    }
}

#[test]
fn unreadable_files_are_refused_by_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let unknown = write("job.ini", "[x]\n");
    refused(&["--config", &unknown, "--gpu", "h100-sxm"], &["job.ini", "unknown format"]);
    let not_torchtitan = write("Cargo.toml", "[package]\nname = \"x\"\n");
    refused(&["--config", &not_torchtitan, "--gpu", "h100-sxm"], &["Cargo.toml", "not a torchtitan job file"]);
    let flavor = write("debug.toml", "[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n");
    refused(&["--config", &flavor, "--gpu", "h100-sxm"], &["debug.toml", "model.flavor"]);
    let serve = write("serve.sh", "vllm serve facebook/opt-13b --tensor-parallel-size 4\n");
    refused(&["--config", &serve, "--gpu", "h100-sxm"], &["serve.sh", "vllm serve MODEL", "facebook/opt-13b"]);
    let auto = write("ds.json", "{\"train_micro_batch_size_per_gpu\": \"auto\"}");
    refused(
        &["--config", &auto, "--model", "gpt2", "--gpu", "l4"],
        &["ds.json", "train_micro_batch_size_per_gpu", "--hf-args"],
    );
    let ds = "data/configs/deepspeed-ds_config_zero3.json";
    refused(&["--config", ds, "--gpu", "l4"], &[ds, "names no model", "--model"]);
    refused(&["--config", ds, "--model", "gpt2", "--gpu", "l4", "--infer"], &[ds, "leave out --infer"]);
    refused(&["--gpu", "l4"], &["--model"]);
    refused(&["--hf-args", ds, "--model", "gpt2", "--gpu", "l4"], &["--config"]);
}

/// `--recommend` holds what the file says of the job as it holds what flags fix: torchtitan's
/// file trains in bf16 mixed precision under torchtitan, so every row does.
#[test]
fn recommend_holds_the_files_precision_and_framework() {
    let v =
        plan(&["--config", "data/configs/torchtitan-llama3_8b.toml", "--gpu", "h100", "--gpus", "8", "--recommend"]);
    let rows = v["recommendations"].as_array().unwrap();
    assert!(!rows.is_empty());
    for r in rows {
        assert_eq!((r["framework"].as_str(), r["precision"].as_str()), (Some("torchtitan"), Some("mixed")), "{r}");
    }
}
