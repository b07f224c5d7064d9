//! What a mixture of experts' LoRA plan holds at its peak that the closed form does not
//! (docs/VALIDATION.md, "The merged expert weights of peft's LoRA").
//!
//! transformers 5 keeps each layer's experts as two stacked parameters (`gate_up_proj`,
//! E × 2f × h, and `down_proj`, E × h × f), and peft 0.21's "all-linear" wraps a stack with
//! one adapter (`ParamWrapper`) for Qwen3-MoE and Mixtral. Its forward folds the adapter into
//! a new tensor, W + s · B @ A (one `torch.baddbmm`), that `grouped_mm` multiplies by, and
//! autograd saves it for the input's gradient: without checkpointing every layer's merged
//! stacks are live at once until that layer's backward, a second copy of all the experts'
//! weights. `scripts/validate/moe_lora_saved.py` shows the same of real tensors (the storages
//! autograd saves); the CPU check rows of the LoRA table measure the whole step. Qwen2-MoE's
//! experts are not wrapped by "all-linear" (transformers' conversion table names no pattern
//! for `qwen2_moe` itself), and LoRA of the query and value projections wraps no expert.

use headroom_plan::builders::{hf, Device, StateScale};
use headroom_plan::gpu::gpu;
use headroom_plan::job::TrainConfig;
use headroom_plan::job::{Attention, BaseWeights, Checkpointing, Finetune, LoraTargets, Optimizer, Precision};
use headroom_plan::model::{preset, Model};
use headroom_plan::program::{Op, Term};
#[path = "support/plan.rs"]
mod plan;

/// Qwen/Qwen3-30B-A3B's config.json, the fields the planner reads.
const QWEN3_30B_A3B: &str = r#"{"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "vocab_size": 151936, "max_position_embeddings": 40960,
    "tie_word_embeddings": false}"#;

/// The site of peft's fold of an adapter into its stack of experts.
const FOLD: &str = "aten::baddbmm";

fn qwen3_30b_a3b() -> Model {
    Model::from_hf_config(QWEN3_30B_A3B, "qwen3-30b-a3b").expect("Qwen3-30B-A3B's config")
}

fn qwen15() -> Model {
    Model::from_hf_config(include_str!("../../../data/models/qwen1.5-moe-a2.7b.json"), "qwen1.5-moe-a2.7b")
        .expect("Qwen1.5-MoE-A2.7B's config")
}

fn lora(precision: Precision, attention: Attention, targets: LoraTargets, checkpointing: Checkpointing) -> TrainConfig {
    TrainConfig {
        attention,
        checkpointing,
        finetune: Finetune::Lora { rank: 16, targets, base: BaseWeights::Native },
        ..TrainConfig::new(1, 256, precision, Optimizer::AdamW)
    }
}

/// Bytes of one layer's stacked experts (gate and up fused, and down) at `width` bytes.
fn layer_stacks(model: &Model, width: u64) -> u64 {
    model.experts * 3 * model.intermediate * model.hidden * width
}

/// The template the job replays, and the bytes live at its peak of live bytes that the fold
/// made, with the count of such tensors made over the program.
fn folds_at_peak(model: &Model, cfg: &TrainConfig) -> (String, u64, usize) {
    let h200 = gpu("h200").expect("h200 is a preset");
    let hf = hf::program(model, cfg, Device::Gpu(&h200), 2, &StateScale::default())
        .unwrap_or_else(|e| panic!("{}: {e}", model.name));
    let p = hf.program;
    let sizes = p.sizes(cfg.micro_batch, cfg.seq);
    let fold = |t: u32| p.sites[p.tensors[t as usize].site as usize] == FOLD;
    let peak = p.live_peak(&sizes);
    let mut live = 0u64;
    for op in &p.ops[..=peak.at] {
        match *op {
            Op::Alloc(t) if fold(t) => live += sizes[t as usize],
            Op::Free(t) if fold(t) => live -= sizes[t as usize],
            _ => {}
        }
    }
    let made = p.ops.iter().filter(|op| matches!(**op, Op::Alloc(t) if fold(t))).count();
    (hf.key, live, made)
}

/// Without checkpointing, the peak holds every layer's merged stacks but at most one (the
/// backward frees a layer's as it passes it): a second copy of the experts' weights, in the
/// step's precision, at fp32 (eager attention, the verdict that moved) and bf16 alike.
#[test]
fn the_peak_holds_every_layers_merged_experts() {
    let jobs = [
        (qwen3_30b_a3b(), Precision::Fp32, Attention::Eager, 4, "qwen3_moe/causal-lm/fp32/eager/full/lora-all"),
        (qwen3_30b_a3b(), Precision::Fp32, Attention::Sdpa, 4, "qwen3_moe/causal-lm/fp32/sdpa-math/full/lora-all"),
        (qwen3_30b_a3b(), Precision::Bf16, Attention::Sdpa, 2, "qwen3_moe/causal-lm/bf16/sdpa/full/lora-all"),
        (
            preset("mixtral-8x7b").expect("preset"),
            Precision::Fp32,
            Attention::Eager,
            4,
            "mixtral/causal-lm/fp32/eager/full/lora-all",
        ),
        (
            preset("mixtral-8x7b").expect("preset"),
            Precision::Bf16,
            Attention::Sdpa,
            2,
            "mixtral/causal-lm/bf16/sdpa/full/lora-all",
        ),
    ];
    for (model, precision, attention, width, want) in jobs {
        let cfg = lora(precision, attention, LoraTargets::All, Checkpointing::None);
        let (key, live, _) = folds_at_peak(&model, &cfg);
        assert_eq!(key, want, "{}", model.name);
        let layer = layer_stacks(&model, width);
        let all = model.layers * layer;
        assert!(live <= all && live + layer >= all, "{key}: {live} bytes of merged experts at the peak, all {all}");
    }
    // Qwen3-30B-A3B's: 48 layers of 128 experts 768 wide over 2048, fp32: 108 GiB, what the
    // replay holds above the closed form (241.48 GiB against 133.20).
    let (_, live, _) = folds_at_peak(
        &qwen3_30b_a3b(),
        &lora(Precision::Fp32, Attention::Eager, LoraTargets::All, Checkpointing::None),
    );
    assert_eq!(live, 48 * layer_stacks(&qwen3_30b_a3b(), 4) - 128 * 2048 * 768 * 4);
}

/// Checkpointed, a layer's merged stacks live through its recomputation and backward alone.
#[test]
fn checkpointed_the_peak_holds_one_layers_merged_experts() {
    for model in [qwen3_30b_a3b(), preset("mixtral-8x7b").expect("preset")] {
        let cfg = lora(Precision::Fp32, Attention::Eager, LoraTargets::All, Checkpointing::Full);
        let (key, live, made) = folds_at_peak(&model, &cfg);
        assert!(key.ends_with("/fp32/eager/ckpt/lora-all"), "{key}");
        assert!(made > 0, "{key}: no fold recorded");
        assert!(live <= layer_stacks(&model, 4), "{key}: {live} bytes of merged experts at the peak");
    }
}

/// No merged stack where peft wraps no expert: Qwen2-MoE's every linear layer, and the
/// query and value projections of the other two.
#[test]
fn no_merged_experts_where_peft_wraps_no_expert() {
    let qwen15 = qwen15();
    let jobs = [
        (qwen15.clone(), Precision::Fp32, Attention::Eager, LoraTargets::All),
        (qwen15, Precision::Bf16, Attention::Sdpa, LoraTargets::All),
        (qwen3_30b_a3b(), Precision::Fp32, Attention::Eager, LoraTargets::QueryValue),
        (preset("mixtral-8x7b").expect("preset"), Precision::Fp32, Attention::Eager, LoraTargets::QueryValue),
    ];
    for (model, precision, attention, targets) in jobs {
        let (key, _, made) = folds_at_peak(&model, &lora(precision, attention, targets, Checkpointing::None));
        assert_eq!(made, 0, "{key}: {made} folds of an adapter into its experts");
    }
}

/// autograd keeps each merged stack for its layer's backward, so the plan's breakdown files it
/// with what the layers save (activations), not with the temporaries: every fold, the
/// forward's and checkpointing's recomputation's, and, at Qwen3-30B-A3B's fp32 peak, the
/// 107.25 GiB of merged stacks under activations and less than one layer's stacks under
/// temporary (108.88 GiB there when the recorder's term stood).
#[test]
fn the_merged_experts_are_filed_with_the_activations() {
    let h200 = gpu("h200").expect("h200 is a preset");
    for model in [qwen3_30b_a3b(), preset("mixtral-8x7b").expect("preset")] {
        for checkpointing in [Checkpointing::None, Checkpointing::Full] {
            let cfg = lora(Precision::Fp32, Attention::Eager, LoraTargets::All, checkpointing);
            let p =
                hf::program(&model, &cfg, Device::Gpu(&h200), 2, &StateScale::default()).expect("a template").program;
            let folds: Vec<Term> = p
                .tensors
                .iter()
                .filter(|t| {
                    let site = &p.sites[t.site as usize];
                    (site == FOLD || site.ends_with(" > aten::baddbmm")) && !t.law.grows_with_batch()
                })
                .map(|t| t.term)
                .collect();
            assert!(!folds.is_empty(), "{}: no fold", model.name);
            assert!(folds.iter().all(|&t| t == Term::Activations), "{} {checkpointing:?}: {folds:?}", model.name);
        }
    }
    let model = qwen3_30b_a3b();
    let cfg = lora(Precision::Fp32, Attention::Eager, LoraTargets::All, Checkpointing::None);
    let e = plan::estimate(&model, &h200, &cfg);
    let (_, live, _) = folds_at_peak(&model, &cfg);
    let b = &e.memory.breakdown;
    assert!(b.activations >= live as f64, "activations {} below the merged stacks' {live}", b.activations);
    assert!(b.temporary < layer_stacks(&model, 4) as f64, "temporary {}", b.temporary);
}

/// The closed form counts the merged stacks where peft makes them: one layer's stacks at the
/// step's width (fp32 4 bytes, bf16 2) for Mixtral's and Qwen3-MoE's LoRA of every linear
/// layer under transformers' code; none for Qwen2-MoE, for the query and value projections,
/// for full fine-tuning, or for Megatron's LoRA (no peft).
#[test]
fn the_closed_form_counts_one_layers_merged_experts() {
    use headroom_plan::closed_form::merged_experts;
    for model in [qwen3_30b_a3b(), preset("mixtral-8x7b").expect("preset")] {
        for (precision, width) in [(Precision::Fp32, 4), (Precision::Bf16, 2)] {
            let cfg = lora(precision, Attention::Sdpa, LoraTargets::All, Checkpointing::None);
            assert_eq!(merged_experts(&model, &cfg, true), layer_stacks(&model, width) as f64, "{}", model.name);
            assert_eq!(merged_experts(&model, &cfg, false), 0.0, "{}: Megatron's LoRA", model.name);
            let qv = lora(precision, Attention::Sdpa, LoraTargets::QueryValue, Checkpointing::None);
            assert_eq!(merged_experts(&model, &qv, true), 0.0, "{}: query and value", model.name);
            let full = TrainConfig { finetune: Finetune::Full, ..cfg };
            assert_eq!(merged_experts(&model, &full, true), 0.0, "{}: full fine-tuning", model.name);
        }
    }
    let cfg = lora(Precision::Bf16, Attention::Sdpa, LoraTargets::All, Checkpointing::None);
    assert_eq!(merged_experts(&qwen15(), &cfg, true), 0.0, "Qwen2-MoE's experts are not wrapped");
}

/// The search's screen (the closed form) and the replay agree on what fits an H200 for every
/// mixture's LoRA of every linear layer at 1 × 256, with and without checkpointing, in fp32
/// (eager) and bf16 (SDPA): the screen said Qwen3-30B-A3B's fp32 and Mixtral's bf16 steps
/// without checkpointing fit (133.04 and 93.15 GiB) where the replay does not (241.48 and
/// 182.97 GiB), so a search kept what a plan then refused.
#[test]
fn the_screen_and_the_replay_agree_on_what_fits() {
    let h200 = gpu("h200").expect("h200 is a preset");
    for model in [qwen3_30b_a3b(), preset("mixtral-8x7b").expect("preset"), qwen15()] {
        for (precision, attention) in [(Precision::Fp32, Attention::Eager), (Precision::Bf16, Attention::Sdpa)] {
            for checkpointing in [Checkpointing::None, Checkpointing::Full] {
                let cfg = lora(precision, attention, LoraTargets::All, checkpointing);
                let job = plan::job(&model, &h200, &cfg);
                let screened = headroom_plan::estimate::Estimator::default().screen(&job).is_some();
                let replayed = plan::estimate(&model, &h200, &cfg).verdict.fits;
                assert_eq!(screened, replayed, "{} {precision:?} {checkpointing:?}", model.name);
            }
        }
    }
}
