//! peft's LoRA steps measured on CPU (`scripts/validate/lora_truth.py`,
//! `data/validation/lora_cpu_truth.json`) against the planner's replay of the recorded LoRA
//! templates (`data/programs/hf-lora.tpl`), as the CPU runs it: the step's live peak and each
//! phase's, within the CPU ground truth's 3% (tests/ground_truth.rs), set before any
//! comparison. Every case is a check row, at a depth, shape and rank the templates were not
//! recorded at. The adapters the planner's program trains are peft's exactly: their gradients'
//! bytes are four (fp32, as peft keeps a 16-bit base's adapters) times the trainable
//! parameters peft counts (`get_nb_trainable_parameters`) on each case's config. A case of a
//! family that comes in variants names its own (T5's v1.0 and v1.1, by their MLPs), and is
//! planned from the templates recorded with that variant.
//!
//! A case measured under CUDA's autocast policy (`precision: amp-cuda`: fp32 weights and
//! adapters, the forward under `torch.autocast("cuda")` as step_programs.py records it) is
//! planned from the `…/amp-cuda/…` template a GPU's AMP job picks (`data/programs/hf-lora-amp.tpl`).
//!
//! A case measured on SDPA's math path (`attention: sdpa-math`, asked for on the CPU as a GPU
//! takes it for fp32 with grouped key-value heads) is planned from the `…/sdpa-math/…`
//! template the GPU's job picks, not the fused kernel's the CPU's job would.
//!
//! `cargo test -p headroom-plan --test lora_truth -- --nocapture` prints the table
//! docs/VALIDATION.md shows.

use headroom_plan::builders::hf::{key, math_key, program, program_of, HfProgram};
use headroom_plan::builders::{Device, StateScale};
use headroom_plan::gpu::gpu;
use headroom_plan::job::{
    Attention, BaseWeights, Checkpointing, Finetune, LoraTargets, LossLife, Optimizer, OptimizerImpl, PipelineStage,
    Precision, TrainConfig,
};
use headroom_plan::model::Model;
use headroom_plan::placement::share;
use headroom_plan::program::Term;
use serde_json::Value;

#[path = "support/phase_peaks.rs"]
mod phase_peaks;

const PEAK_TOLERANCE: f64 = 0.03;

fn cases() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/validation/lora_cpu_truth.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("the measured cases")).expect("JSON");
    v["cases"].as_array().expect("cases").clone()
}

fn config(c: &Value) -> TrainConfig {
    let precision = match c["precision"].as_str() {
        Some("bf16") => Precision::Bf16,
        Some("amp-cuda") => Precision::Amp,
        _ => Precision::Fp32,
    };
    TrainConfig {
        attention: if c["attention"] == "eager" { Attention::Eager } else { Attention::Sdpa },
        checkpointing: if c["checkpointing"] == true { Checkpointing::Full } else { Checkpointing::None },
        finetune: Finetune::Lora {
            rank: c["rank"].as_u64().expect("rank"),
            targets: if c["targets"] == "qv" { LoraTargets::QueryValue } else { LoraTargets::All },
            base: BaseWeights::Native,
        },
        // torch.optim's foreach implementation, as the script runs it on CPU.
        optimizer_impl: Some(OptimizerImpl::Foreach),
        // A sequence-to-sequence case's decoder length, where it names its own.
        target_seq: c["target_seq"].as_u64(),
        // A case without `use_cache` was measured before `measure.no_cache`: with the cache on.
        use_cache: c["use_cache"].as_bool().unwrap_or(true),
        // lora_truth.py's step function returns the loss as a number.
        loss_lives: LossLife::Function,
        ..TrainConfig::new(
            c["batch"].as_u64().expect("batch"),
            c["seq"].as_u64().expect("seq"),
            precision,
            Optimizer::AdamW,
        )
    }
}

/// The template a case replays where it is not the one its CPU job picks: SDPA's math path's,
/// or, for AMP measured under CUDA's autocast policy, the `…/amp-cuda/…` one a GPU's job picks.
fn template_key(c: &Value, m: &Model, cfg: &TrainConfig) -> Option<String> {
    if c["precision"] == "amp-cuda" {
        let h200 = gpu("h200").expect("h200 is a preset");
        let k = key(m, cfg, Device::Gpu(&h200)).expect("an AMP LoRA key");
        assert!(k.contains("/amp-cuda/"), "a GPU's AMP job replays {k}");
        return Some(k);
    }
    (c["attention"] == "sdpa-math").then(|| math_key(m, cfg).expect("a math-path key"))
}

/// The case's program on the CPU, from [`template_key`]'s template where it names one.
fn planned(c: &Value, m: &Model, cfg: &TrainConfig, steps: u32) -> Result<HfProgram, String> {
    match template_key(c, m, cfg) {
        Some(key) => program_of(m, cfg, Device::Cpu, &key, steps, &StateScale::default()),
        None => program(m, cfg, Device::Cpu, steps, &StateScale::default()),
    }
}

#[test]
fn lora_steps_replayed_match_peft_s_on_cpu() {
    let mut misses = Vec::new();
    println!("| case | measured peak | planned | diff | forward | backward | optimizer step |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for c in cases() {
        let family = c["family"].as_str().expect("family");
        let m = Model::from_hf_config(&c["config"].to_string(), family).expect("config");
        let cfg = config(&c);
        let variant = c["variant"].as_str().map(|v| format!(" {v}")).unwrap_or_default();
        let label = format!(
            "{family}{variant} L{} {} {}{} r={} {} {}×{}{}{}",
            c["layers"],
            c["precision"].as_str().unwrap_or(""),
            c["attention"].as_str().unwrap_or("sdpa"),
            if c["checkpointing"] == true { " ckpt" } else { "" },
            c["rank"],
            c["targets"].as_str().unwrap_or(""),
            c["batch"],
            c["seq"],
            c["target_seq"].as_u64().map(|t| format!("→{t}")).unwrap_or_default(),
            // A case measured with the cache on beside its twin without it (lora_truth.py's
            // `use_cache` cases); a row measured before `no_cache` says nothing.
            if c["use_cache"] == true { " cache" } else { "" }
        );
        let key = template_key(&c, &m, &cfg);
        if let Err(miss) = phase_peaks::within(&label, &c, &m, &cfg, key.as_deref(), PEAK_TOLERANCE) {
            misses.push(miss);
        }
    }
    assert!(misses.is_empty(), "outside ±{}%: {misses:?}", 100.0 * PEAK_TOLERANCE);
}

/// The cases measured with the key-value cache on (`use_cache`) of the families whose query,
/// key and value are one projection replay a template recorded with it (`…/cache/…`), each
/// beside a case of the same job without it that replays one recorded without it: the check
/// rows hold each half to its own step, not to the other half.
#[test]
fn each_cache_half_is_replayed_from_its_own_recording() {
    use headroom_plan::builders::hf::{cache_matters, cache_recorded};
    let all = cases();
    let job = |c: &Value| {
        ["family", "precision", "attention", "layers", "batch", "seq", "rank", "targets"].map(|k| c[k].to_string())
    };
    let mut halves = std::collections::BTreeMap::<_, Vec<bool>>::new();
    let mut wrong = Vec::new();
    for c in all.iter().filter(|c| c["use_cache"].is_boolean()) {
        let family = c["family"].as_str().expect("family");
        let m = Model::from_hf_config(&c["config"].to_string(), family).expect("config");
        let cfg = config(c);
        if !cache_matters(&m, &cfg) {
            continue;
        }
        let key = match planned(c, &m, &cfg, 1) {
            Ok(hf) => hf.key,
            Err(e) => {
                wrong.push(format!("{family}: {e}"));
                continue;
            }
        };
        if cache_recorded(&key) != cfg.use_cache {
            wrong.push(format!("{} with use_cache {} replays {key}", job(c).join(" "), cfg.use_cache));
        }
        halves.entry(job(c)).or_default().push(cfg.use_cache);
    }
    assert!(wrong.is_empty(), "{wrong:?}");
    let on: Vec<_> = halves.iter().filter(|(_, h)| h.contains(&true)).collect();
    assert!(on.len() >= 12, "{} jobs measured with the cache", on.len());
    let alone: Vec<_> = on.iter().filter(|(_, h)| !h.contains(&false)).map(|(j, _)| j.join(" ")).collect();
    assert!(alone.is_empty(), "measured with the cache and not without: {alone:?}");
}

/// The program's trainable parameters, from the gradients one step makes: peft's count.
#[test]
fn adapters_planned_are_the_parameters_peft_trains() {
    let mut wrong = Vec::new();
    for c in cases() {
        let family = c["family"].as_str().expect("family");
        let m = Model::from_hf_config(&c["config"].to_string(), family).expect("config");
        let cfg = config(&c);
        let Ok(hf) = planned(&c, &m, &cfg, 1) else {
            wrong.push(format!("{family}: no LoRA template serves it"));
            continue;
        };
        let sizes = hf.program.sizes(cfg.micro_batch, cfg.seq);
        let gradients: u64 =
            hf.program.tensors.iter().zip(&sizes).filter(|(t, _)| t.term == Term::Gradients).map(|(_, &b)| b).sum();
        let peft = c["trainable_parameters"].as_u64().expect("peft's trainable parameters");
        if gradients != 4 * peft {
            wrong.push(format!(
                "{} r={} {}: {} planned, {peft} peft's",
                hf.key,
                c["rank"],
                c["targets"],
                gradients / 4
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:?}");
}

/// The trainable parameters `plan` prints (`placement::share`, from the model's linear layers)
/// are peft's count on each case's config: the mixtures of experts' too, whose stacks of
/// experts' weights peft 0.21 wraps whole under transformers 5 (Mixtral's, Qwen3-MoE's) or
/// leaves unwrapped (Qwen2-MoE's), where one adapter an expert was counted before.
#[test]
fn printed_trainable_parameters_are_peft_s() {
    let mut wrong = Vec::new();
    for c in cases() {
        let family = c["family"].as_str().expect("family");
        let m = Model::from_hf_config(&c["config"].to_string(), family).expect("config");
        let cfg = config(&c);
        let printed = share(&m, &cfg, PipelineStage::Only).trainable.round() as u64;
        let peft = c["trainable_parameters"].as_u64().expect("peft's trainable parameters");
        if printed != peft {
            wrong.push(format!("{family} r={} {}: {printed} printed, {peft} peft's", c["rank"], c["targets"]));
        }
    }
    assert!(wrong.is_empty(), "{wrong:?}");
}

/// Whether T5 variant `v` has v1.1's gated MLP (flan-t5, T0, mT5) rather than v1.0's one
/// ReLU projection in (t5-base): its templates are the ones keyed `.../gated/...`.
fn gated_variant(v: &str) -> bool {
    match v {
        "v1.0" => false,
        "v1.1" | "v1.1-untied" => true,
        _ => panic!("lora_truth.py's VARIANTS has T5's v1.0, v1.1 and v1.1-untied, not {v}"),
    }
}

/// A case's model is built as its variant's (the config carried in the case), and planned
/// from the templates recorded with that variant's MLP: both T5 variants are checked.
#[test]
fn each_t5_variant_is_planned_from_its_own_templates() {
    let mut wrong = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for c in cases().iter().filter(|c| c["family"] == "t5") {
        let v = c["variant"].as_str().expect("every T5 case names its variant");
        seen.insert(v.to_string());
        let m = Model::from_hf_config(&c["config"].to_string(), "t5").expect("config");
        if m.gated_mlp != gated_variant(v) {
            wrong.push(format!("{v}: the config's MLP is {}", if m.gated_mlp { "gated" } else { "ReLU" }));
            continue;
        }
        match program(&m, &config(c), Device::Cpu, 1, &StateScale::default()) {
            Ok(hf) if hf.key.contains("/gated/") == gated_variant(v) => {}
            Ok(hf) => wrong.push(format!("{v} r={} {}: planned from {}", c["rank"], c["targets"], hf.key)),
            Err(e) => wrong.push(format!("{v}: {e}")),
        }
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        ["v1.0", "v1.1", "v1.1-untied"],
        "the cases check each of T5's variants"
    );
    assert!(wrong.is_empty(), "{wrong:?}");
}

/// Under checkpointing, what the loss's graph holds after the backward lives through the
/// optimizer step, as the profiler showed tensor by tensor for T5 v1.0 fp32 at 1 × 96: the
/// encoder's and the decoder's input embeddings' outputs (leaves peft's
/// `enable_input_require_grads` makes require a gradient) and their `.grad`s, batch × seq ×
/// hidden × 4 bytes each, and the decoder's cross-attention zero position bias (T5Attention
/// makes it require a gradient under checkpointing) and its `.grad`, heads × seq² × 4 each.
/// Only the step's parameters' gradients are the step's otherwise at that point.
#[test]
fn what_the_loss_holds_lives_through_the_optimizer_step() {
    use headroom_plan::program::{Op, Phase};
    let c = cases()
        .into_iter()
        .find(|c| {
            c["family"] == "t5" && c["checkpointing"] == true && c["precision"] == "fp32" && c["variant"] == "v1.0"
        })
        .expect("lora_truth.py's T5 v1.0 fp32 checkpointed case");
    let m = Model::from_hf_config(&c["config"].to_string(), "t5").expect("config");
    let cfg = config(&c);
    let hf = program(&m, &cfg, Device::Cpu, 2, &StateScale::default()).expect("a LoRA template serves it");
    let sizes = hf.program.sizes(cfg.micro_batch, cfg.seq);
    let (mut in_step, mut held) = (false, None);
    let mut live = std::collections::BTreeSet::new();
    for op in &hf.program.ops {
        match *op {
            Op::Mark { step: 2, phase: Phase::Forward } => in_step = true,
            Op::Mark { step: 2, phase: Phase::OptimizerStep } => {
                held = Some(live.iter().map(|&t: &u32| sizes[t as usize]).sum::<u64>());
                break;
            }
            Op::Alloc(t) if in_step && hf.program.tensors[t as usize].term != Term::Gradients => {
                live.insert(t);
            }
            Op::Free(t) => {
                live.remove(&t);
            }
            _ => {}
        }
    }
    let (b, s) = (cfg.micro_batch, cfg.seq);
    let (h, heads) = (m.hidden, m.heads);
    assert_eq!(held, Some(2 * (2 * b * s * h * 4) + 2 * heads * s * s * 4));
}

/// The tensors made in step 2's forward and still alive as its backward begins.
fn made_in_step_2_and_live_at_its_backward(p: &headroom_plan::program::Program) -> std::collections::BTreeSet<u32> {
    use headroom_plan::program::{Op, Phase};
    let mut live = std::collections::BTreeSet::new();
    let mut in_step = false;
    for op in &p.ops {
        match *op {
            Op::Mark { step: 2, phase: Phase::Forward } => in_step = true,
            Op::Mark { step: 2, phase: Phase::Backward } => return live,
            Op::Alloc(t) if in_step => {
                live.insert(t);
            }
            Op::Free(t) => {
                live.remove(&t);
            }
            _ => {}
        }
    }
    panic!("step 2 has no backward")
}

/// BLOOM reshapes the query of its fused query-key-value output to batch × heads: a copy at a
/// batch of two or more, a view at a batch of one, which the attention's `baddbmm` saves, so
/// each layer's fused output (3 × hidden a token) stays alive for the backward in the copy's
/// place, as the CPU's profile of the fp32 case at 1 × 96 showed. At the start of step 2's
/// backward, the plan at a batch of one holds one fused output a layer and at two none (at 100
/// tokens, where a fused output is not as large as a layer's attention scores: at 96 with 8
/// heads it is).
#[test]
fn bloom_at_a_batch_of_one_keeps_each_layer_s_fused_output() {
    let c = cases()
        .into_iter()
        .find(|c| c["family"] == "bloom" && c["precision"] == "fp32" && c["checkpointing"] == false)
        .expect("lora_truth.py's BLOOM fp32 case");
    let m = Model::from_hf_config(&c["config"].to_string(), "bloom").expect("config");
    let fused_at_backward = |batch: u64| {
        let cfg = TrainConfig { micro_batch: batch, seq: 100, ..config(&c) };
        let hf = program(&m, &cfg, Device::Cpu, 2, &StateScale::default()).expect("a LoRA template serves it");
        let sizes = hf.program.sizes(cfg.micro_batch, cfg.seq);
        let at_backward = made_in_step_2_and_live_at_its_backward(&hf.program);
        let fused = 3 * batch * cfg.seq * m.hidden * 4;
        at_backward.iter().filter(|&&t| sizes[t as usize] == fused).count() as u64
    };
    assert_eq!(c["batch"], 1);
    assert_eq!((fused_at_backward(1), fused_at_backward(2)), (m.layers, 0));
}

/// GPT-2's eager attention with the key-value cache on: `torch.matmul` folds the query (a view
/// of the fused `c_attn` output) into batch × heads, a copy at a batch of two or more
/// (`gpt2/…/eager/full/cache/lora-qv` was recorded at two and three) and a view at one, which
/// the scores' `bmm` saves, so each layer's fused output (3 × hidden a token) stays alive for the
/// backward beside the cache's copies of the key and value (the case measured at 1 × 128 with
/// the cache). At the start of step 2's backward the plan at a batch of one holds one fused
/// output a layer, at two none.
#[test]
fn gpt2_with_the_cache_at_a_batch_of_one_keeps_each_layer_s_fused_output() {
    let c = cases()
        .into_iter()
        .find(|c| c["family"] == "gpt2" && c["attention"] == "eager" && c["use_cache"] == true && c["batch"] == 1)
        .expect("lora_truth.py's GPT-2 eager case with the cache at a batch of one");
    let m = Model::from_hf_config(&c["config"].to_string(), "gpt2").expect("config");
    let fused_at_backward = |batch: u64| {
        let cfg = TrainConfig { micro_batch: batch, ..config(&c) };
        let hf = program(&m, &cfg, Device::Cpu, 2, &StateScale::default()).expect("a LoRA template serves it");
        assert!(hf.key.contains("/eager/full/cache/"), "{}", hf.key);
        let sizes = hf.program.sizes(cfg.micro_batch, cfg.seq);
        let at_backward = made_in_step_2_and_live_at_its_backward(&hf.program);
        let fused = 3 * batch * cfg.seq * m.hidden * 2;
        at_backward.iter().filter(|&&t| sizes[t as usize] == fused).count() as u64
    };
    assert_eq!((fused_at_backward(1), fused_at_backward(2)), (m.layers, 0));
}

/// A case whose decoder is a length of its own is planned from a template recorded at two
/// lengths (its laws read the decoder's length apart), never from one recorded with the
/// decoder as long as the encoder.
#[test]
fn a_decoder_of_its_own_length_is_planned_from_a_template_recorded_at_two_lengths() {
    let mut seen = 0;
    for c in cases().iter().filter(|c| c["target_seq"].is_u64()) {
        let m = Model::from_hf_config(&c["config"].to_string(), "t5").expect("config");
        let cfg = config(c);
        assert_ne!(cfg.target_seq, Some(cfg.seq), "a case at two lengths has two");
        let hf = program(&m, &cfg, Device::Cpu, 1, &StateScale::default()).expect("a template serves it");
        let parsed = headroom_plan::program_template::template(&hf.key).expect("bundled");
        assert!(parsed.decoder_length_apart(), "{} was recorded at one length", hf.key);
        seen += 1;
    }
    assert!(seen >= 2, "{seen} cases at two lengths");
}
