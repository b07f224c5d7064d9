//! `headroom plan` answers what to do: the levers that make a job fit, each checked by
//! planning the job again with it; the allocator's cache where a job that fits reserves far
//! more than it allocates.

use assert_cmd::Command;
use serde_json::Value;

fn plan(args: &[String]) -> (i32, Value) {
    let out = Command::cargo_bin("headroom").unwrap().arg("plan").args(args).arg("--json").output().unwrap();
    let code = out.status.code().unwrap();
    assert!(code < 2, "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    (code, serde_json::from_slice(&out.stdout).unwrap())
}

fn text(args: &[String]) -> (i32, String) {
    let out = Command::cargo_bin("headroom").unwrap().arg("plan").args(args).output().unwrap();
    (out.status.code().unwrap(), String::from_utf8(out.stdout).unwrap())
}

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

/// `base` with each `--flag value` of `flags` set: replaced where `base` gives the flag,
/// added where it does not.
fn with_flags(base: &[String], flags: &str) -> Vec<String> {
    let mut out = base.to_vec();
    let f = args(flags);
    for pair in f.chunks(2) {
        match out.iter().position(|a| *a == pair[0]) {
            Some(i) => out[i + 1] = pair[1].clone(),
            None => out.extend(pair.iter().cloned()),
        }
    }
    out
}

/// The LoRA job: Llama-3-8B on one 24 GB card at micro-batch 4 says "does NOT fit"
/// and, before, stopped there.
const LORA_JOB: &str = "--model llama-3-8b --gpu rtx-4090 --finetune lora --batch 4 --seq 2048 --precision bf16";

#[test]
fn a_plan_that_does_not_fit_lists_the_levers_each_checked_by_planning_again() {
    let base = args(LORA_JOB);
    let (code, p) = plan(&base);
    assert_eq!(code, 1);
    let levers = p["levers"].as_array().unwrap();
    assert!(!levers.is_empty(), "{p}");
    let fitting: Vec<&Value> = levers.iter().filter(|l| l["fits"] == true).collect();
    assert!(!fitting.is_empty(), "no lever fits: {levers:?}");
    // Those that fit first, fastest first; then the others by the memory they need.
    let times: Vec<f64> = fitting.iter().map(|l| l["step_time_s"].as_f64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert!(levers[..fitting.len()].iter().all(|l| l["fits"] == true));
    let rest: Vec<u64> = levers[fitting.len()..].iter().map(|l| l["per_gpu_bytes"].as_u64().unwrap()).collect();
    assert!(rest.windows(2).all(|w| w[0] <= w[1]), "{rest:?}");
    // Each lever is what planning the job with its flags says, figure for figure.
    for l in levers {
        let flags = l["flags"].as_str().unwrap();
        let (code, again) = plan(&with_flags(&base, flags));
        let alloc_conf = flags.contains("--alloc-conf");
        assert_eq!(again["fits"], l["fits"], "{flags}");
        assert_eq!(code, if l["fits"] == true { 0 } else { 1 }, "{flags}");
        assert_eq!(again["per_gpu_bytes"], l["per_gpu_bytes"], "{flags} (alloc-conf: {alloc_conf})");
        assert_eq!(again["step_time_s"], l["step_time_s"], "{flags}");
    }
    // Each lever saves memory, and the job is fine-tuning: checkpointing, a smaller
    // micro-batch and QLoRA are among them.
    let per_gpu = p["per_gpu_bytes"].as_u64().unwrap();
    assert!(levers.iter().all(|l| l["per_gpu_bytes"].as_u64().unwrap() < per_gpu));
    for lever in ["checkpointing", "micro-batch", "adapters"] {
        assert!(levers.iter().any(|l| l["lever"] == lever), "{lever}: {levers:?}");
    }
    let (_, t) = text(&base);
    assert!(t.contains("what makes it fit, each planned again with the change (those that fit fastest first"), "{t}");
    assert!(t.contains(fitting[0]["flags"].as_str().unwrap()), "{t}");
}

#[test]
fn a_plan_that_fits_says_no_levers_and_adapters_only_where_the_job_fine_tunes() {
    let (code, p) = plan(&with_flags(&args(LORA_JOB), "--batch 1 --checkpoint full"));
    assert_eq!(code, 0);
    assert_eq!(p["levers"], Value::Array(vec![]));
    // Full training that does not fit: no adapters unless --finetune says it fine-tunes.
    let training = args("--model qwen2.5-7b --gpu a100-80gb --gpus 8 --zero 2 --batch 4 --seq 2048 --precision bf16");
    let (_, p) = plan(&training);
    assert!(p["levers"].as_array().unwrap().iter().all(|l| l["lever"] != "adapters"), "{p}");
    let (_, p) = plan(&with_flags(&training, "--finetune full"));
    assert!(p["levers"].as_array().unwrap().iter().any(|l| l["flags"] == "--finetune lora"), "{p}");
}

/// The 8-GPU Qwen job: "framework" is mostly the caching allocator's reserved but
/// free memory, which expandable segments saves; the plan said neither.
#[test]
fn a_plan_that_reserves_far_more_than_it_allocates_names_the_cache_and_the_setting() {
    let job = args(
        "--model qwen2.5-7b --gpu a100-80gb --gpus 8 --zero 3 --batch 8 --seq 2048 --precision bf16 --finetune full \
         --checkpoint full",
    );
    let (code, p) = plan(&job);
    assert_eq!(code, 0);
    let c = &p["allocator_cache"];
    let (reserved, allocated) = (c["reserved_bytes"].as_u64().unwrap(), c["allocated_bytes"].as_u64().unwrap());
    assert!(reserved as f64 > 1.5 * allocated as f64, "{c}");
    assert_eq!(c["setting"], "expandable_segments:True");
    // The figure under expandable segments is the plan's own under that setting.
    let (_, expandable) = plan(&with_flags(&job, "--alloc-conf expandable_segments:True"));
    assert_eq!(c["expandable_reserved_bytes"], expandable["reserved_bytes"], "{expandable}");
    assert!(c["expandable_reserved_bytes"].as_u64().unwrap() < allocated + (1 << 30));
    let (_, t) = text(&job);
    assert!(t.contains("the caching allocator's cache") && t.contains("expandable_segments:True"), "{t}");
    // Under expandable segments already, nothing to say.
    assert_eq!(expandable["allocator_cache"], Value::Null);
}
