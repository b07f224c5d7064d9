//! Where no recorded step serves a job, `headroom plan` names the key it looked up and how to
//! record it. A GPU's AMP job looks up the step recorded under CUDA's autocast policy first
//! (`…/amp-cuda/…`: `step_programs.py --only …/amp-cuda/…` records it, as `python -m
//! headroom_gpu record --dtype amp` runs its forward), and plans the CPU's `…/amp/…` only
//! rewritten for CUDA's `pow`: where neither was recorded, the key named is the `amp-cuda` one.

mod support;

use support::{headroom_in, Run};

const GEMMA3: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/models/gemma-3-1b.json");

fn plan(model: &str, args: &str) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let mut all = vec!["plan", "--model", model, "--gpu", "h200", "--batch", "1", "--seq", "512"];
    all.extend(args.split_whitespace());
    let run = headroom_in(dir.path(), &all);
    assert!(run.code < 2, "{args}: {}{}", run.stdout, run.stderr);
    run
}

/// Gemma 3's LoRA and QLoRA steps under AMP were recorded with its output layer tied, as its
/// checkpoints are: a config with a layer of its own has weights those steps lack, and the plan
/// names the key a GPU looks up first, no `…/amp/…` key, and the recorder's command at the
/// job's precision.
#[test]
fn a_gpu_s_amp_job_names_the_amp_cuda_key_it_looked_up() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gemma-3-1b-untied.json");
    let text = std::fs::read_to_string(GEMMA3).unwrap();
    let brace = text.rfind('}').expect("a JSON object");
    std::fs::write(&config, format!("{}, \"tie_word_embeddings\": false}}", text[..brace].trim_end())).unwrap();
    let untied = config.to_str().unwrap();
    let run = plan(untied, "--precision amp --finetune lora --checkpoint full --attention sdpa");
    run.expect(
        run.code,
        "passed over transformers: `gemma3_text/causal-lm/amp-cuda/sdpa/ckpt/lora-all` was recorded with its output \
         layer tied",
    );
    run.expect(run.code, "python -m headroom_gpu record --model CONFIG --dtype amp --out step.jsonl");
    assert!(!run.stdout.contains("/amp/"), "{}", run.stdout);
    // QLoRA's AMP steps were recorded under CUDA's policy alone, on either device.
    let run = plan(untied, "--precision amp --finetune qlora --checkpoint full --attention sdpa");
    run.expect(
        run.code,
        "`gemma3_text/causal-lm/amp-cuda/sdpa/ckpt/qlora-all` was recorded with its output layer tied",
    );
    assert!(!run.stdout.contains("/amp/"), "{}", run.stdout);
}

/// Where the CPU's AMP step was recorded and CUDA's was not, the job replays `…/amp/…` as
/// before.
#[test]
fn a_recorded_cpu_amp_step_still_plans_the_job() {
    plan(GEMMA3, "--precision amp --attention sdpa --checkpoint none")
        .expect(0, "recorded as gemma3_text/causal-lm/amp/sdpa/full");
}
