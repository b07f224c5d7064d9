//! peft's LoRA over transformers' code, as recorded: which template a LoRA job replays, and
//! the rank its laws are written in.
//!
//! `scripts/validate/step_programs.py --lora all,qv` records peft's step as it records full
//! fine-tuning (`get_peft_model` with its defaults: no adapter dropout, the adapters of a
//! 16-bit base autocast to fp32), keyed `family/head/precision/attention/ckpt/lora-TARGETS`
//! in `data/programs/hf-lora.tpl`. The adapters' weights and every tensor as wide as the
//! rank (`x @ A.T` and its gradient) are laws in the unit `r`, recorded at a rank no other
//! dimension of the recording is a small multiple of, so any rank plans. The frozen base's
//! weights are parameters with no gradient: `zero_grad` and the optimizer step skip them, as
//! `torch.optim` does, and AdamW keeps state for the adapters alone. peft's "all-linear" wraps
//! the layers each family has (fused query-key-value projections as one, Qwen2-MoE's shared
//! expert and its gate) and a stack of experts' weights as one adapter of rank E × r (unit
//! `Er`); the templates carry the adapters peft made, so the count is peft's
//! (`tests/lora_truth.rs` holds it to `get_nb_trainable_parameters`). peft's forward folds
//! such an adapter into a merged stack as large as the experts' weights, which `grouped_mm`
//! saves for the backward: without checkpointing a second copy of every layer's experts
//! (`tests/moe_lora_merged_experts.rs`).
//!
//! Recorded (docs/VALIDATION.md, "LoRA replayed from peft's recorded step"; the keys themselves:
//! `scripts/validate/template_file.py keys data/programs/hf-lora*.tpl`): each family at bf16
//! and fp32, both targets, without and with full checkpointing, with the attention a GPU runs
//! for it (SDPA, its math path for fp32 with grouped key-value heads, or eager where
//! transformers has nothing else; T5's SDPA, on the memory-efficient kernel, in
//! `hf-t5-sdpa.tpl`) and, for most families, with eager attention asked; a fused query-key-value layer
//! is one adapter, as [`LoraTargets::adapted`] counts it (peft's default target for GPT-2,
//! GPT-NeoX and BLOOM, the one named for Phi-3, which peft has no default for; the MoE families'
//! `q_proj` and `v_proj` named too). peft wraps BERT's masked-LM head's transform too, and T5's
//! decoder's cross-attention ([`LoraTargets::adapters`]); T5's keys hold v1.0's ReLU MLP, and
//! v1.1's gated one under `/gated` (recorded with its output layer its own, as T0's and mT0's
//! is, which plans a tied model too). Under AMP (an fp32 base and
//! adapters, bf16 autocast) the step is recorded under CUDA's autocast policy (`…/amp-cuda/…`,
//! `data/programs/hf-lora-amp.tpl`): autocast casts a frozen weight anew at every matmul (it
//! caches those that require a gradient alone), and the matmul keeps the bf16 copy for its
//! backward. What is not recorded (docs/VALIDATION.md says which) falls to the next builder.
//!
//! QLoRA (`--qlora all`, keyed `.../bf16/sdpa/ckpt/qlora-all` in `data/programs/hf-qlora.tpl`,
//! `.../bf16/eager/ckpt/qlora-all` for BLOOM and Gemma-2, recorded eager alone, and T5, whose
//! SDPA steps are in `hf-t5-sdpa.tpl`, and for eager
//! attention asked of the thirteen families recorded with SDPA in `hf-qlora-eager.tpl`, and
//! `.../full/qlora-all` without checkpointing; its SDPA runs in fp32, so families with grouped
//! key-value heads are recorded over grouped heads on SDPA's math path, `.../bf16/sdpa-math/...`,
//! and with every head its own key-value head on the memory-efficient kernel, `.../bf16/sdpa/...`,
//! the key picked by the planned model's heads; at fp32 compute `.../fp32/...` in
//! `hf-qlora-fp32.tpl`, and under AMP `.../amp-cuda/sdpa/...` in `hf-qlora-amp.tpl`, autocast
//! casting SDPA's inputs to bf16 for a fused kernel whatever the heads) is recorded
//! under fake tensors with CUDA's rules, bitsandbytes' own modules and operators
//! (`scripts/validate/qlora_programs.py`, `python/headroom_gpu/qlora.py`): the NF4 base packed
//! half a byte a weight, its double-quantized absmax, `gemm_4bit` dequantizing each weight
//! into a bf16 temporary, and `prepare_model_for_kbit_training`'s fp32 casts and checkpointing.
//! Every such tensor is a fraction of its layer's out × in (1/2, 1/16, 1/64, 1/4096 bytes an
//! element), exact where out × in is a multiple of 16,384, as it is for every model whose
//! widths are multiples of 128. QLoRA is planned as peft sets it up: adapters on every linear
//! layer (`qlora-all`), or on the query and value projections (`qlora-qv`, `--qlora qv`: the
//! targets `lora-qv` has), checkpointing on (`prepare_model_for_kbit_training`'s default) or off
//! (`use_gradient_checkpointing=False`, or TRL's `gradient_checkpointing=False`). `qlora-all`
//! recorded for every decoder family (eager for BLOOM and Gemma-2), BERT
//! as a masked LM (peft's plain `PeftModel`) and T5 as a sequence-to-sequence LM (SDPA and eager,
//! `SEQ_2_SEQ_LM`, its `wo` a full fp32 layer as transformers keeps it) (docs/VALIDATION.md,
//! "QLoRA replayed from its recorded step"), with and without checkpointing; `qlora-qv` for the
//! same families, with and without checkpointing. Two
//! things of the recording the replay keeps: the fp32 activations take SDPA's memory-efficient
//! kernel wherever no key-value head is shared or a mask is given, whose logsumexp pads each
//! sequence to 32 positions (the law's `per_padded_token`); and `Linear4bit` casts a layer's
//! bias to the compute dtype in its first forward, a parameter step 1 makes and every later
//! step keeps. LLM.int8's base is not recorded: those jobs are refused here and planned by the
//! closed form.

use crate::job::{BaseWeights, Finetune, LoraTargets, TrainConfig};
use crate::model::Model;
use crate::model_units;
use crate::program::{Law, Term};
use crate::program_template::Template;

/// The key suffix of the template that serves `cfg`'s fine-tuning: `None` for full
/// fine-tuning, `lora-all` or `lora-qv` for LoRA over a base in the training precision,
/// `qlora-all` or `qlora-qv` for QLoRA.
pub fn suffix(cfg: &TrainConfig) -> Result<Option<&'static str>, String> {
    match cfg.finetune {
        Finetune::Full => Ok(None),
        Finetune::Lora { base: BaseWeights::Nf4 | BaseWeights::Fp4, targets: LoraTargets::All, .. } => {
            Ok(Some("qlora-all"))
        }
        Finetune::Lora { base: BaseWeights::Nf4 | BaseWeights::Fp4, targets: LoraTargets::QueryValue, .. } => {
            Ok(Some("qlora-qv"))
        }
        Finetune::Lora { base: BaseWeights::Int8, .. } => {
            Err("LLM.int8's base was not recorded tensor by tensor".into())
        }
        Finetune::Lora { targets: LoraTargets::All, .. } => Ok(Some("lora-all")),
        Finetune::Lora { targets: LoraTargets::QueryValue, .. } => Ok(Some("lora-qv")),
    }
}

/// Whether the job is QLoRA's: LoRA over a 4-bit base.
pub fn qlora(cfg: &TrainConfig) -> bool {
    matches!(cfg.finetune, Finetune::Lora { base: BaseWeights::Nf4 | BaseWeights::Fp4, .. })
}

/// The size of unit `name` for `model` trained as `cfg` asks: the model's dimensions, and
/// `r`, the job's LoRA rank (1 without adapters, where no template names it), and `Er`, the
/// rank of peft's one adapter over a stack of experts' weights (E × r).
pub fn unit(model: &Model, cfg: &TrainConfig, name: &str) -> f64 {
    match (name, cfg.finetune) {
        ("r", Finetune::Lora { rank, .. }) => rank as f64,
        ("Er", Finetune::Lora { rank, .. }) => (rank * model.experts.max(1)) as f64,
        _ => model_units::unit(model, name),
    }
}

/// peft's folds of an adapter into its stack of experts filed with the activations, where the
/// recorder filed them with the temporaries (its term for a tensor whose size follows no
/// shape): each is `torch.baddbmm`'s new tensor W + s · B @ A, as large as the stack, that
/// `grouped_mm` multiplies the tokens by and autograd saves for the input's gradient, from the
/// layer's forward (or its recomputation, under checkpointing) to its backward, as it saves an
/// activation. What `baddbmm` makes beneath it (`aten::empty`) is its own scratch and stays
/// temporary; BLOOM's attention scores (`baddbmm` too) grow with the tokens and were
/// activations already. The count refiled.
pub(super) fn merged_experts_saved(t: &mut Template) -> usize {
    let mut refiled = 0;
    for i in 0..t.tensors.len() {
        let fold = super::autocast::op(t, i as u32) == "aten::baddbmm";
        let x = &mut t.tensors[i];
        if fold && x.term == Term::Temporary && x.param.is_none() && x.law == Law::fixed(x.law.fixed) {
            x.term = Term::Activations;
            refiled += 1;
        }
    }
    refiled
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::hf::program;
    use crate::builders::{Device, StateScale};
    use crate::job::{Attention, Checkpointing, Optimizer, Precision};
    use crate::program::Term;

    fn lora(rank: u64, targets: LoraTargets, checkpointing: Checkpointing) -> TrainConfig {
        TrainConfig {
            attention: Attention::Sdpa,
            checkpointing,
            finetune: Finetune::Lora { rank, targets, base: BaseWeights::Native },
            ..TrainConfig::new(2, 512, Precision::Bf16, Optimizer::AdamW)
        }
    }

    /// Bytes of the adapters peft adds: r × (inputs + outputs) per targeted linear layer
    /// ([`LoraTargets::adapters`]), fp32 (peft autocasts a 16-bit base's adapters).
    fn adapter_bytes(model: &Model, rank: u64, targets: LoraTargets) -> u64 {
        // Every adapter peft makes: each block's, T5's decoder's cross-attention's and BERT's
        // masked-LM transform's.
        let head = lora(rank, targets, Checkpointing::None).head;
        4 * targets.adapters(model, head).iter().map(|&(i, o)| rank * (i + o)).sum::<u64>()
    }

    /// The optimizer steps the adapters only: AdamW's two moments are twice the adapters'
    /// bytes, at every rank (the rank a law unit, not the recorded one), and the gradients
    /// the step keeps are the adapters' (the frozen base's weights get none).
    #[test]
    fn adamw_keeps_state_for_the_adapters_alone() {
        let model = crate::model::preset("llama-3-8b").expect("preset");
        let jobs = [
            (LoraTargets::All, Checkpointing::None),
            (LoraTargets::All, Checkpointing::Full),
            (LoraTargets::QueryValue, Checkpointing::None),
        ];
        for (targets, checkpointing) in jobs {
            for rank in [8, 16, 64] {
                let cfg = lora(rank, targets, checkpointing);
                let p = program(&model, &cfg, Device::Cpu, 2, &StateScale::default()).expect("a LoRA template").program;
                p.check().expect("well formed");
                let sizes = p.sizes(cfg.micro_batch, cfg.seq);
                let of = |term: Term| -> u64 {
                    p.tensors.iter().zip(&sizes).filter(|(t, _)| t.term == term).map(|(_, &b)| b).sum()
                };
                let adapters = adapter_bytes(&model, rank, targets);
                assert_eq!(of(Term::Optimizer), 2 * adapters, "rank {rank} {targets:?} {checkpointing:?}");
                // Two steps' gradients, made once each.
                assert_eq!(of(Term::Gradients), 2 * adapters, "rank {rank} {targets:?} {checkpointing:?}");
            }
        }
    }

    /// peft's adapters are fp32 over any base, so mixed precision (the CLI's default) adds no
    /// fp32 master copy of them and keeps AdamW's moments as wide as they are: the state is
    /// the same as bf16's, LoRA's and QLoRA's.
    #[test]
    fn mixed_precision_keeps_no_master_copy_of_the_fp32_adapters() {
        let model = crate::model::preset("llama-2-7b").expect("preset");
        for base in [BaseWeights::Native, BaseWeights::Nf4] {
            let cfg = TrainConfig {
                finetune: Finetune::Lora { rank: 16, targets: LoraTargets::QueryValue, base },
                precision: Precision::Mixed,
                ..lora(16, LoraTargets::QueryValue, Checkpointing::None)
            };
            let p = program(&model, &cfg, Device::Cpu, 2, &StateScale::default()).expect("a template").program;
            let sizes = p.sizes(cfg.micro_batch, cfg.seq);
            let optimizer: u64 =
                p.tensors.iter().zip(&sizes).filter(|(t, _)| t.term == Term::Optimizer).map(|(_, &b)| b).sum();
            assert_eq!(optimizer, 2 * adapter_bytes(&model, 16, LoraTargets::QueryValue), "{base:?}");
        }
    }

    /// google/gemma-2-9b's and Qwen/Qwen3-30B-A3B's config.json, the fields the planner reads:
    /// no preset ships either family.
    const GEMMA2_9B: &str = r#"{"model_type": "gemma2", "hidden_size": 3584, "num_hidden_layers": 42,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 14336,
        "vocab_size": 256000, "max_position_embeddings": 8192, "sliding_window": 4096,
        "query_pre_attn_scalar": 256}"#;
    const QWEN3_30B_A3B: &str = r#"{"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
        "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "vocab_size": 151936, "max_position_embeddings": 40960,
        "tie_word_embeddings": false}"#;
    /// Qwen/Qwen1.5-7B's config.json, the fields the planner reads: Qwen2's code with every head
    /// its own key-value head.
    const QWEN1_5_7B: &str = r#"{"model_type": "qwen2", "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 151936,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "tie_word_embeddings": false}"#;

    /// `--finetune lora` on a GPU replays each recorded family's own LoRA step: a preset of
    /// every family `--model` names (or a Hub config where no preset ships one), with the
    /// key-value cache on (transformers' default) where a fused family was recorded so.
    #[test]
    fn every_recorded_family_plans_lora_from_its_own_template() {
        let h200 = crate::gpu::gpu("h200").expect("gpu");
        let config = |text: &str, name: &str| Model::from_hf_config(text, name).expect("config");
        let models = [
            (crate::model::preset("gemma-2b").expect("preset"), "gemma/causal-lm/bf16/sdpa/full/lora-all"),
            (config(GEMMA2_9B, "gemma-2-9b"), "gemma2/causal-lm/bf16/eager/full/lora-all"),
            (
                config(include_str!("../../../../../data/models/gemma-3-1b.json"), "gemma-3-1b"),
                "gemma3_text/causal-lm/bf16/sdpa/full/lora-all",
            ),
            (crate::model::preset("phi-3-mini").expect("preset"), "phi3/causal-lm/bf16/sdpa/full/cache/lora-all"),
            (crate::model::preset("pythia-1b").expect("preset"), "gpt_neox/causal-lm/bf16/sdpa/full/cache/lora-all"),
            (crate::model::preset("bloom-7b1").expect("preset"), "bloom/causal-lm/bf16/eager/full/cache/lora-all"),
            (crate::model::preset("mixtral-8x7b").expect("preset"), "mixtral/causal-lm/bf16/sdpa/full/lora-all"),
            (
                config(include_str!("../../../../../data/models/qwen1.5-moe-a2.7b.json"), "qwen1.5-moe-a2.7b"),
                "qwen2_moe/causal-lm/bf16/sdpa/full/lora-all",
            ),
            (config(QWEN3_30B_A3B, "qwen3-30b-a3b"), "qwen3_moe/causal-lm/bf16/sdpa/full/lora-all"),
            (crate::model::preset("bert-base-uncased").expect("preset"), "bert/masked-lm/bf16/sdpa/full/lora-all"),
            (crate::model::preset("t5-base").expect("preset"), "t5/seq2seq-lm/bf16/sdpa/full/lora-all"),
        ];
        for (model, want) in models {
            let cfg = lora(16, LoraTargets::All, Checkpointing::None);
            assert_eq!(
                crate::builders::hf::key(&model, &cfg, Device::Gpu(&h200)).as_deref(),
                Ok(want),
                "{}",
                model.name
            );
        }
        // BERT's and T5's query and value adapters (peft's default targets for them).
        for (name, want) in [
            ("bert-large-uncased", "bert/masked-lm/bf16/sdpa/full/lora-qv"),
            ("t5-large", "t5/seq2seq-lm/bf16/sdpa/full/lora-qv"),
        ] {
            let model = crate::model::preset(name).expect("preset");
            let cfg = lora(16, LoraTargets::QueryValue, Checkpointing::None);
            assert_eq!(crate::builders::hf::key(&model, &cfg, Device::Gpu(&h200)).as_deref(), Ok(want), "{name}");
        }
        // T5 with eager attention asked replays its eager step, recorded beside the SDPA one.
        let model = crate::model::preset("t5-large").expect("preset");
        let cfg = TrainConfig { attention: Attention::Eager, ..lora(16, LoraTargets::QueryValue, Checkpointing::None) };
        assert_eq!(
            crate::builders::hf::key(&model, &cfg, Device::Gpu(&h200)).as_deref(),
            Ok("t5/seq2seq-lm/bf16/eager/full/lora-qv")
        );
    }

    /// Every decoder family's bf16 LoRA with and without full checkpointing, on every linear
    /// layer and on the query and value projections, each planned from its own template: a
    /// fused query-key-value layer (GPT-2's, GPT-NeoX's, BLOOM's, Phi-3's) takes one adapter
    /// for its whole output, as peft's default targets wrap it, and the planner's trainable
    /// count is the template's.
    #[test]
    fn every_decoder_family_plans_lora_with_and_without_checkpointing_and_both_targets() {
        use {
            Checkpointing::Full as Ckpt, Checkpointing::None as NoCkpt, LoraTargets::All, LoraTargets::QueryValue as Qv,
        };
        let h200 = crate::gpu::gpu("h200").expect("gpu");
        let config = |text: &str, name: &str| Model::from_hf_config(text, name).expect("config");
        let preset = |name: &str| crate::model::preset(name).expect("preset");
        let models = [
            (preset("llama-3-8b"), "llama/causal-lm/bf16/sdpa"),
            (preset("mistral-7b"), "mistral/causal-lm/bf16/sdpa"),
            (preset("qwen2.5-7b"), "qwen2/causal-lm/bf16/sdpa"),
            (
                config(include_str!("../../../../../data/models/qwen3-1.7b.json"), "qwen3-1.7b"),
                "qwen3/causal-lm/bf16/sdpa",
            ),
            (preset("gpt2"), "gpt2/causal-lm/bf16/sdpa"),
            (preset("gemma-2b"), "gemma/causal-lm/bf16/sdpa"),
            (config(GEMMA2_9B, "gemma-2-9b"), "gemma2/causal-lm/bf16/eager"),
            (
                config(include_str!("../../../../../data/models/gemma-3-1b.json"), "gemma-3-1b"),
                "gemma3_text/causal-lm/bf16/sdpa",
            ),
            (preset("phi-3-mini"), "phi3/causal-lm/bf16/sdpa"),
            (preset("pythia-1b"), "gpt_neox/causal-lm/bf16/sdpa"),
            (preset("bloom-7b1"), "bloom/causal-lm/bf16/eager"),
            (preset("mixtral-8x7b"), "mixtral/causal-lm/bf16/sdpa"),
            (
                config(include_str!("../../../../../data/models/qwen1.5-moe-a2.7b.json"), "qwen1.5-moe-a2.7b"),
                "qwen2_moe/causal-lm/bf16/sdpa",
            ),
            (config(QWEN3_30B_A3B, "qwen3-30b-a3b"), "qwen3_moe/causal-lm/bf16/sdpa"),
        ];
        let jobs = [
            (All, NoCkpt, "full/lora-all"),
            (All, Ckpt, "ckpt/lora-all"),
            (Qv, NoCkpt, "full/lora-qv"),
            (Qv, Ckpt, "ckpt/lora-qv"),
        ];
        // Every decoder family is recorded at every one of them, with the key-value cache off
        // (a fused query-key-value family's step with it on is `…/full/cache/…`, where recorded).
        for (model, prefix) in &models {
            for &(targets, checkpointing, suffix) in &jobs {
                let want = format!("{prefix}/{suffix}");
                let cfg = TrainConfig { use_cache: false, ..lora(16, targets, checkpointing) };
                assert_eq!(
                    crate::builders::hf::key(model, &cfg, Device::Gpu(&h200)),
                    Ok(want.clone()),
                    "{}",
                    model.name
                );
                let hf = program(model, &cfg, Device::Gpu(&h200), 2, &StateScale::default()).expect(&want);
                let sizes = hf.program.sizes(cfg.micro_batch, cfg.seq);
                let gradients: u64 = hf
                    .program
                    .tensors
                    .iter()
                    .zip(&sizes)
                    .filter(|(t, _)| t.term == Term::Gradients)
                    .map(|(_, &b)| b)
                    .sum();
                // The mixtures of experts' too: one adapter of rank E × r over a stack of
                // experts' weights, as peft makes it and the template carries it.
                let adapters: u64 =
                    targets.adapters(model, crate::model::Head::CausalLm).iter().map(|&(i, o)| 16 * (i + o)).sum();
                // fp32 adapters, two steps' gradients, each made once.
                assert_eq!(gradients, 2 * 4 * adapters, "{want}");
            }
        }
    }

    /// Each job's fp32 LoRA of `targets` (rank 16) with `attention` asked on an H200 is planned
    /// from the template named beside it, and trains the adapters peft makes: two steps' fp32
    /// gradients of them, each made once.
    fn plans_fp32_lora_from<K: AsRef<str>>(
        targets: LoraTargets,
        attention: Attention,
        jobs: &[(Model, Checkpointing, K)],
    ) {
        plans_lora_from(Precision::Fp32, targets, attention, jobs);
    }

    /// As [`plans_fp32_lora_from`] at `precision`: peft keeps a 16-bit base's adapters in fp32,
    /// so their gradients are fp32 at either precision.
    fn plans_lora_from<K: AsRef<str>>(
        precision: Precision,
        targets: LoraTargets,
        attention: Attention,
        jobs: &[(Model, Checkpointing, K)],
    ) {
        let h200 = crate::gpu::gpu("h200").expect("gpu");
        for (model, checkpointing, want) in jobs {
            let want = want.as_ref();
            let cfg = TrainConfig { precision, attention, ..lora(16, targets, *checkpointing) };
            assert_eq!(
                crate::builders::hf::key(model, &cfg, Device::Gpu(&h200)).as_deref(),
                Ok(want),
                "{}",
                model.name
            );
            let hf = program(model, &cfg, Device::Gpu(&h200), 2, &StateScale::default()).expect(want);
            let sizes = hf.program.sizes(cfg.micro_batch, cfg.seq);
            let gradients: u64 =
                hf.program.tensors.iter().zip(&sizes).filter(|(t, _)| t.term == Term::Gradients).map(|(_, &b)| b).sum();
            assert_eq!(gradients, 2 * adapter_bytes(model, 16, targets), "{want}");
        }
    }

    /// fp32 LoRA on a GPU replays the attention the GPU runs: SDPA's math path where the model
    /// groups its key-value heads (no fused kernel takes fp32 with them), SDPA's fused kernel
    /// where it has as many key-value heads as heads, eager attention where transformers has
    /// no SDPA path (BLOOM) or the family's steps were recorded eager alone (Gemma-2). Each is
    /// planned, its adapters' gradients the count the plan prints.
    #[test]
    fn fp32_lora_replays_the_attention_a_gpu_runs() {
        use Checkpointing::{Full as Ckpt, None as NoCkpt};
        let preset = |name: &str| crate::model::preset(name).expect("preset");
        let config = |text: &str, name: &str| Model::from_hf_config(text, name).expect("config");
        let jobs = [
            (preset("llama-3-8b"), NoCkpt, "llama/causal-lm/fp32/sdpa-math/full/lora-all"),
            (preset("llama-3-8b"), Ckpt, "llama/causal-lm/fp32/sdpa-math/ckpt/lora-all"),
            (preset("mistral-7b"), NoCkpt, "mistral/causal-lm/fp32/sdpa-math/full/lora-all"),
            (preset("mistral-7b"), Ckpt, "mistral/causal-lm/fp32/sdpa-math/ckpt/lora-all"),
            (preset("qwen2.5-7b"), NoCkpt, "qwen2/causal-lm/fp32/sdpa-math/full/lora-all"),
            (preset("qwen2.5-7b"), Ckpt, "qwen2/causal-lm/fp32/sdpa-math/ckpt/lora-all"),
            (
                config(include_str!("../../../../../data/models/qwen3-1.7b.json"), "qwen3-1.7b"),
                NoCkpt,
                "qwen3/causal-lm/fp32/sdpa-math/full/lora-all",
            ),
            (
                config(include_str!("../../../../../data/models/qwen3-1.7b.json"), "qwen3-1.7b"),
                Ckpt,
                "qwen3/causal-lm/fp32/sdpa-math/ckpt/lora-all",
            ),
            (preset("mixtral-8x7b"), NoCkpt, "mixtral/causal-lm/fp32/sdpa-math/full/lora-all"),
            (preset("mixtral-8x7b"), Ckpt, "mixtral/causal-lm/fp32/sdpa-math/ckpt/lora-all"),
            (
                config(include_str!("../../../../../data/models/gemma-3-1b.json"), "gemma-3-1b"),
                NoCkpt,
                "gemma3_text/causal-lm/fp32/sdpa-math/full/lora-all",
            ),
            (
                config(include_str!("../../../../../data/models/gemma-3-1b.json"), "gemma-3-1b"),
                Ckpt,
                "gemma3_text/causal-lm/fp32/sdpa-math/ckpt/lora-all",
            ),
            // One key-value head for eight.
            (preset("gemma-2b"), NoCkpt, "gemma/causal-lm/fp32/sdpa-math/full/lora-all"),
            (preset("gemma-2b"), Ckpt, "gemma/causal-lm/fp32/sdpa-math/ckpt/lora-all"),
            // As many key-value heads as heads (32 and 32, 16 and 16): SDPA's fused kernel.
            (preset("phi-3-mini"), NoCkpt, "phi3/causal-lm/fp32/sdpa/full/cache/lora-all"),
            (preset("phi-3-mini"), Ckpt, "phi3/causal-lm/fp32/sdpa/ckpt/lora-all"),
            (
                config(include_str!("../../../../../data/models/qwen1.5-moe-a2.7b.json"), "qwen1.5-moe-a2.7b"),
                NoCkpt,
                "qwen2_moe/causal-lm/fp32/sdpa/full/lora-all",
            ),
            (
                config(include_str!("../../../../../data/models/qwen1.5-moe-a2.7b.json"), "qwen1.5-moe-a2.7b"),
                Ckpt,
                "qwen2_moe/causal-lm/fp32/sdpa/ckpt/lora-all",
            ),
            // 32 heads over 4 key-value heads: the math path.
            (config(QWEN3_30B_A3B, "qwen3-30b-a3b"), NoCkpt, "qwen3_moe/causal-lm/fp32/sdpa-math/full/lora-all"),
            (config(QWEN3_30B_A3B, "qwen3-30b-a3b"), Ckpt, "qwen3_moe/causal-lm/fp32/sdpa-math/ckpt/lora-all"),
            (preset("gemma-7b"), NoCkpt, "gemma/causal-lm/fp32/sdpa/full/lora-all"),
            (preset("gemma-7b"), Ckpt, "gemma/causal-lm/fp32/sdpa/ckpt/lora-all"),
            (preset("pythia-1b"), NoCkpt, "gpt_neox/causal-lm/fp32/sdpa/full/cache/lora-all"),
            (preset("pythia-1b"), Ckpt, "gpt_neox/causal-lm/fp32/sdpa/ckpt/lora-all"),
            (preset("gpt2"), Ckpt, "gpt2/causal-lm/fp32/sdpa/ckpt/lora-all"),
            // Llama 2's 32 heads and 32 key-value heads: SDPA's fused kernel.
            (preset("llama-2-7b"), NoCkpt, "llama/causal-lm/fp32/sdpa/full/lora-all"),
            (preset("llama-2-7b"), Ckpt, "llama/causal-lm/fp32/sdpa/ckpt/lora-all"),
            // No SDPA path in transformers.
            (preset("bloom-7b1"), NoCkpt, "bloom/causal-lm/fp32/eager/full/cache/lora-all"),
            (preset("bloom-7b1"), Ckpt, "bloom/causal-lm/fp32/eager/ckpt/lora-all"),
            (config(GEMMA2_9B, "gemma-2-9b"), NoCkpt, "gemma2/causal-lm/fp32/eager/full/lora-all"),
            (config(GEMMA2_9B, "gemma-2-9b"), Ckpt, "gemma2/causal-lm/fp32/eager/ckpt/lora-all"),
        ];
        plans_fp32_lora_from(LoraTargets::All, Attention::Sdpa, &jobs);
    }

    /// fp32 LoRA on the query and value projections alone replays the attention a GPU runs,
    /// as every linear layer's does: SDPA's math path for models that group their key-value
    /// heads, its fused kernel for those with as many key-value heads as heads, eager attention
    /// for BLOOM and Gemma-2. Each is planned from its own `lora-qv` template, its adapters' gradients those
    /// of the two projections peft wraps.
    #[test]
    fn fp32_query_value_lora_replays_the_attention_a_gpu_runs() {
        use Checkpointing::{Full as Ckpt, None as NoCkpt};
        let preset = |name: &str| crate::model::preset(name).expect("preset");
        let config = |text: &str, name: &str| Model::from_hf_config(text, name).expect("config");
        let qwen3 = || config(include_str!("../../../../../data/models/qwen3-1.7b.json"), "qwen3-1.7b");
        let gemma3 = || config(include_str!("../../../../../data/models/gemma-3-1b.json"), "gemma-3-1b");
        let phi3_grouped = || Model { kv_heads: 8, ..preset("phi-3-mini") };
        let qwen2_moe =
            || config(include_str!("../../../../../data/models/qwen1.5-moe-a2.7b.json"), "qwen1.5-moe-a2.7b");
        let jobs = [
            (preset("llama-3-8b"), NoCkpt, "llama/causal-lm/fp32/sdpa-math/full/lora-qv"),
            (preset("llama-3-8b"), Ckpt, "llama/causal-lm/fp32/sdpa-math/ckpt/lora-qv"),
            (preset("qwen2.5-7b"), NoCkpt, "qwen2/causal-lm/fp32/sdpa-math/full/lora-qv"),
            (preset("qwen2.5-7b"), Ckpt, "qwen2/causal-lm/fp32/sdpa-math/ckpt/lora-qv"),
            (preset("mistral-7b"), NoCkpt, "mistral/causal-lm/fp32/sdpa-math/full/lora-qv"),
            (preset("mistral-7b"), Ckpt, "mistral/causal-lm/fp32/sdpa-math/ckpt/lora-qv"),
            (qwen3(), NoCkpt, "qwen3/causal-lm/fp32/sdpa-math/full/lora-qv"),
            (qwen3(), Ckpt, "qwen3/causal-lm/fp32/sdpa-math/ckpt/lora-qv"),
            // One key-value head for eight (Gemma-2B), and for four (Gemma 3 1B).
            (preset("gemma-2b"), NoCkpt, "gemma/causal-lm/fp32/sdpa-math/full/lora-qv"),
            (preset("gemma-2b"), Ckpt, "gemma/causal-lm/fp32/sdpa-math/ckpt/lora-qv"),
            (gemma3(), NoCkpt, "gemma3_text/causal-lm/fp32/sdpa-math/full/lora-qv"),
            (gemma3(), Ckpt, "gemma3_text/causal-lm/fp32/sdpa-math/ckpt/lora-qv"),
            (preset("mixtral-8x7b"), NoCkpt, "mixtral/causal-lm/fp32/sdpa-math/full/lora-qv"),
            (preset("mixtral-8x7b"), Ckpt, "mixtral/causal-lm/fp32/sdpa-math/ckpt/lora-qv"),
            // Phi-3-mini's widths with Phi-3-medium's grouping (four heads a key-value head):
            // its fused `qkv_proj` one adapter.
            (phi3_grouped(), NoCkpt, "phi3/causal-lm/fp32/sdpa-math/full/cache/lora-qv"),
            (phi3_grouped(), Ckpt, "phi3/causal-lm/fp32/sdpa-math/ckpt/lora-qv"),
            // As many key-value heads as heads: SDPA's fused kernel.
            (preset("gpt2"), NoCkpt, "gpt2/causal-lm/fp32/sdpa/full/cache/lora-qv"),
            (preset("gpt2"), Ckpt, "gpt2/causal-lm/fp32/sdpa/ckpt/lora-qv"),
            (preset("phi-3-mini"), NoCkpt, "phi3/causal-lm/fp32/sdpa/full/cache/lora-qv"),
            (preset("phi-3-mini"), Ckpt, "phi3/causal-lm/fp32/sdpa/ckpt/lora-qv"),
            (preset("gemma-7b"), NoCkpt, "gemma/causal-lm/fp32/sdpa/full/lora-qv"),
            (preset("gemma-7b"), Ckpt, "gemma/causal-lm/fp32/sdpa/ckpt/lora-qv"),
            (qwen2_moe(), NoCkpt, "qwen2_moe/causal-lm/fp32/sdpa/full/lora-qv"),
            (qwen2_moe(), Ckpt, "qwen2_moe/causal-lm/fp32/sdpa/ckpt/lora-qv"),
            (preset("llama-2-7b"), NoCkpt, "llama/causal-lm/fp32/sdpa/full/lora-qv"),
            (preset("llama-2-7b"), Ckpt, "llama/causal-lm/fp32/sdpa/ckpt/lora-qv"),
            (preset("pythia-1b"), NoCkpt, "gpt_neox/causal-lm/fp32/sdpa/full/cache/lora-qv"),
            (preset("pythia-1b"), Ckpt, "gpt_neox/causal-lm/fp32/sdpa/ckpt/lora-qv"),
            // 32 heads over 4 key-value heads: the math path.
            (config(QWEN3_30B_A3B, "qwen3-30b-a3b"), NoCkpt, "qwen3_moe/causal-lm/fp32/sdpa-math/full/lora-qv"),
            (config(QWEN3_30B_A3B, "qwen3-30b-a3b"), Ckpt, "qwen3_moe/causal-lm/fp32/sdpa-math/ckpt/lora-qv"),
            // No SDPA path in transformers (BLOOM), or recorded eager alone (Gemma-2).
            (preset("bloom-7b1"), NoCkpt, "bloom/causal-lm/fp32/eager/full/cache/lora-qv"),
            (preset("bloom-7b1"), Ckpt, "bloom/causal-lm/fp32/eager/ckpt/lora-qv"),
            (config(GEMMA2_9B, "gemma-2-9b"), NoCkpt, "gemma2/causal-lm/fp32/eager/full/lora-qv"),
            (config(GEMMA2_9B, "gemma-2-9b"), Ckpt, "gemma2/causal-lm/fp32/eager/ckpt/lora-qv"),
        ];
        plans_fp32_lora_from(LoraTargets::QueryValue, Attention::Sdpa, &jobs);
    }

    /// fp32 LoRA with eager attention asked replays the eager step of the model's own family,
    /// on every linear layer and on the query and value projections, with and without
    /// checkpointing.
    #[test]
    fn fp32_lora_with_eager_attention_replays_the_eager_step() {
        for (targets, suffix) in [(LoraTargets::All, "lora-all"), (LoraTargets::QueryValue, "lora-qv")] {
            let jobs = eager_jobs(&eager_models(), "fp32", suffix);
            plans_fp32_lora_from(targets, Attention::Eager, &jobs);
        }
    }

    /// bf16 LoRA with eager attention asked replays the bf16 eager step of the families recorded
    /// so (the mixtures of experts' in `hf-lora.tpl`, the others' in `hf-lora-eager.tpl`): the
    /// mixtures of experts' merged expert stacks among what it keeps, where Megatron's closed
    /// form, with no peft, planned them.
    #[test]
    fn bf16_lora_with_eager_attention_replays_the_eager_step() {
        let qwen3 = Model::from_hf_config(include_str!("../../../../../data/models/qwen3-1.7b.json"), "qwen3-1.7b");
        let mut models = eager_models();
        models.push((qwen3.expect("config"), "qwen3/causal-lm"));
        for (targets, suffix) in [(LoraTargets::All, "lora-all"), (LoraTargets::QueryValue, "lora-qv")] {
            plans_lora_from(Precision::Bf16, targets, Attention::Eager, &eager_jobs(&models, "bf16", suffix));
        }
    }

    /// Each model's jobs with and without checkpointing at `precision`, and the keys they replay:
    /// a fused query-key-value family's without checkpointing with the key-value cache on
    /// (transformers' default, `…/full/cache/…`), as its eager LoRA is recorded both ways.
    fn eager_jobs(models: &[(Model, &str)], precision: &str, suffix: &str) -> Vec<(Model, Checkpointing, String)> {
        models
            .iter()
            .flat_map(|(model, family)| {
                let fused = ["gpt2/", "phi3/", "gpt_neox/"].iter().any(|f| family.starts_with(f));
                [(Checkpointing::None, "full"), (Checkpointing::Full, "ckpt")].map(|(checkpointing, ck)| {
                    let cache = if fused && ck == "full" { "/cache" } else { "" };
                    (model.clone(), checkpointing, format!("{family}/{precision}/eager/{ck}{cache}/{suffix}"))
                })
            })
            .collect()
    }

    /// A model of each family recorded with eager attention asked, and the key its family's
    /// templates start with.
    fn eager_models() -> Vec<(Model, &'static str)> {
        let preset = |name: &str| crate::model::preset(name).expect("preset");
        let config = |text: &str, name: &str| Model::from_hf_config(text, name).expect("config");
        vec![
            (preset("llama-3-8b"), "llama/causal-lm"),
            (preset("llama-2-7b"), "llama/causal-lm"),
            (preset("gpt2"), "gpt2/causal-lm"),
            (preset("gpt2-xl"), "gpt2/causal-lm"),
            (preset("mistral-7b"), "mistral/causal-lm"),
            (preset("qwen2.5-7b"), "qwen2/causal-lm"),
            (preset("phi-3-mini"), "phi3/causal-lm"),
            (preset("gemma-2b"), "gemma/causal-lm"),
            (preset("gemma-7b"), "gemma/causal-lm"),
            (config(include_str!("../../../../../data/models/gemma-3-1b.json"), "gemma-3-1b"), "gemma3_text/causal-lm"),
            (preset("pythia-1b"), "gpt_neox/causal-lm"),
            (preset("mixtral-8x7b"), "mixtral/causal-lm"),
            (
                config(include_str!("../../../../../data/models/qwen1.5-moe-a2.7b.json"), "qwen1.5-moe-a2.7b"),
                "qwen2_moe/causal-lm",
            ),
            (config(QWEN3_30B_A3B, "qwen3-30b-a3b"), "qwen3_moe/causal-lm"),
            (preset("bert-base-uncased"), "bert/masked-lm"),
        ]
    }

    /// BERT's and T5's LoRA at each precision and checkpointing recorded for them, on every
    /// linear layer and on the query and value projections (peft's default targets for them):
    /// each planned from its own template, t5-base (v1.0's MLP) from the plain keys and a gated
    /// T5 from the `/gated` ones.
    #[test]
    fn bert_and_t5_plan_lora_at_each_precision_and_checkpointing_recorded() {
        use {
            Checkpointing::Full as Ckpt, Checkpointing::None as NoCkpt, LoraTargets::All, LoraTargets::QueryValue as Qv,
        };
        let h200 = crate::gpu::gpu("h200").expect("gpu");
        let t5 = crate::model::preset("t5-base").expect("preset");
        // flan-t5's MLP at t5-base's dimensions, tied: the templates, recorded untied, plan it
        // without the head's weight.
        let gated = Model { gated_mlp: true, ..t5.clone() };
        let bert = crate::model::preset("bert-base-uncased").expect("preset");
        // T5 v1.1 as its checkpoints are, its output layer its own (the query and value
        // projections' at two lengths, the decoder's own).
        let t0 = crate::model::preset("t0-3b").expect("preset");
        let jobs = [
            (&t0, All, Precision::Fp32, NoCkpt, "t5/seq2seq-lm/fp32/sdpa/full/gated/lora-all"),
            (&t0, All, Precision::Fp32, Ckpt, "t5/seq2seq-lm/fp32/sdpa/ckpt/gated/lora-all"),
            (&t0, Qv, Precision::Fp32, NoCkpt, "t5/seq2seq-lm/fp32/sdpa/full/gated/lora-qv"),
            (&t0, Qv, Precision::Fp32, Ckpt, "t5/seq2seq-lm/fp32/sdpa/ckpt/gated/lora-qv"),
            (&t0, All, Precision::Bf16, NoCkpt, "t5/seq2seq-lm/bf16/sdpa/full/gated/lora-all"),
            (&t0, Qv, Precision::Bf16, Ckpt, "t5/seq2seq-lm/bf16/sdpa/ckpt/gated/lora-qv"),
            (&t0, All, Precision::Amp, NoCkpt, "t5/seq2seq-lm/amp-cuda/sdpa/full/gated/lora-all"),
            (&t0, Qv, Precision::Amp, Ckpt, "t5/seq2seq-lm/amp-cuda/sdpa/ckpt/gated/lora-qv"),
            (&t5, All, Precision::Fp32, NoCkpt, "t5/seq2seq-lm/fp32/sdpa/full/lora-all"),
            (&t5, All, Precision::Fp32, Ckpt, "t5/seq2seq-lm/fp32/sdpa/ckpt/lora-all"),
            (&t5, All, Precision::Bf16, Ckpt, "t5/seq2seq-lm/bf16/sdpa/ckpt/lora-all"),
            (&gated, All, Precision::Fp32, NoCkpt, "t5/seq2seq-lm/fp32/sdpa/full/gated/lora-all"),
            (&gated, All, Precision::Fp32, Ckpt, "t5/seq2seq-lm/fp32/sdpa/ckpt/gated/lora-all"),
            (&gated, All, Precision::Bf16, Ckpt, "t5/seq2seq-lm/bf16/sdpa/ckpt/gated/lora-all"),
            (&bert, All, Precision::Fp32, NoCkpt, "bert/masked-lm/fp32/sdpa/full/lora-all"),
            (&bert, All, Precision::Fp32, Ckpt, "bert/masked-lm/fp32/sdpa/ckpt/lora-all"),
            (&bert, All, Precision::Bf16, Ckpt, "bert/masked-lm/bf16/sdpa/ckpt/lora-all"),
            (&t5, Qv, Precision::Fp32, NoCkpt, "t5/seq2seq-lm/fp32/sdpa/full/lora-qv"),
            (&t5, Qv, Precision::Bf16, Ckpt, "t5/seq2seq-lm/bf16/sdpa/ckpt/lora-qv"),
            (&t5, Qv, Precision::Fp32, Ckpt, "t5/seq2seq-lm/fp32/sdpa/ckpt/lora-qv"),
            (&bert, Qv, Precision::Fp32, NoCkpt, "bert/masked-lm/fp32/sdpa/full/lora-qv"),
            (&bert, Qv, Precision::Bf16, Ckpt, "bert/masked-lm/bf16/sdpa/ckpt/lora-qv"),
            (&bert, Qv, Precision::Fp32, Ckpt, "bert/masked-lm/fp32/sdpa/ckpt/lora-qv"),
        ];
        for (model, targets, precision, checkpointing, want) in jobs {
            let cfg = TrainConfig { precision, ..lora(16, targets, checkpointing) };
            assert_eq!(
                crate::builders::hf::key(model, &cfg, Device::Gpu(&h200)).as_deref(),
                Ok(want),
                "{}",
                model.name
            );
            let planned = program(model, &cfg, Device::Gpu(&h200), 2, &StateScale::default());
            assert!(planned.is_ok(), "{want}: {:?}", planned.err());
        }
    }

    /// `--finetune qlora` on a GPU replays each QLoRA-recorded family's own step, with
    /// checkpointing and without (`prepare_model_for_kbit_training(model,
    /// use_gradient_checkpointing=False)`), on every linear layer and on the query and value
    /// projections (`--lora-targets qv`), expanded to the model's depth: a preset of every
    /// family `--model` names (or a Hub config where no preset ships one).
    #[test]
    fn every_qlora_recorded_family_plans_from_its_own_template() {
        let h200 = crate::gpu::gpu("h200").expect("gpu");
        let config = |text: &str, name: &str| Model::from_hf_config(text, name).expect("config");
        let preset = |name: &str| crate::model::preset(name).expect("preset");
        // QLoRA's SDPA runs in fp32: grouped key-value heads on the math path's template
        // (`sdpa-math`), heads that are their own key-value heads on the memory-efficient
        // kernel's (`sdpa`).
        let ungrouped = |m: Model| Model { kv_heads: m.heads, ..m };
        let models = [
            (preset("llama-3-8b"), "llama/causal-lm/bf16/sdpa-math"),
            (preset("llama-2-7b"), "llama/causal-lm/bf16/sdpa"),
            (preset("mistral-7b"), "mistral/causal-lm/bf16/sdpa-math"),
            (preset("qwen2.5-7b"), "qwen2/causal-lm/bf16/sdpa-math"),
            (
                config(include_str!("../../../../../data/models/qwen3-1.7b.json"), "qwen3-1.7b"),
                "qwen3/causal-lm/bf16/sdpa-math",
            ),
            (preset("phi-3-mini"), "phi3/causal-lm/bf16/sdpa"),
            (
                config(include_str!("../../../../../data/models/qwen1.5-moe-a2.7b.json"), "qwen1.5-moe-a2.7b"),
                "qwen2_moe/causal-lm/bf16/sdpa",
            ),
            (preset("gemma-2b"), "gemma/causal-lm/bf16/sdpa-math"),
            (preset("gemma-7b"), "gemma/causal-lm/bf16/sdpa"),
            (preset("mixtral-8x7b"), "mixtral/causal-lm/bf16/sdpa-math"),
            (config(QWEN3_30B_A3B, "qwen3-30b-a3b"), "qwen3_moe/causal-lm/bf16/sdpa-math"),
            // Qwen1.5's layout (Qwen2's code, every head its own key-value head), and the other
            // grouped families' configs so.
            (config(QWEN1_5_7B, "qwen1.5-7b"), "qwen2/causal-lm/bf16/sdpa"),
            (ungrouped(preset("mistral-7b")), "mistral/causal-lm/bf16/sdpa"),
            (
                ungrouped(config(include_str!("../../../../../data/models/qwen3-1.7b.json"), "qwen3-1.7b")),
                "qwen3/causal-lm/bf16/sdpa",
            ),
            (ungrouped(preset("mixtral-8x7b")), "mixtral/causal-lm/bf16/sdpa"),
            (ungrouped(config(QWEN3_30B_A3B, "qwen3-30b-a3b")), "qwen3_moe/causal-lm/bf16/sdpa"),
            // Eager attention: transformers has no SDPA path for BLOOM, and Gemma-2's steps are
            // recorded eager alone, so SDPA asked of either plans eager.
            (preset("bloom-7b1"), "bloom/causal-lm/bf16/eager"),
            (config(GEMMA2_9B, "gemma-2-9b"), "gemma2/causal-lm/bf16/eager"),
            // BERT trains as a masked LM, T5 as a sequence-to-sequence LM (its SDPA on the
            // memory-efficient kernel, its position bias the mask).
            (preset("bert-base-uncased"), "bert/masked-lm/bf16/sdpa"),
            (preset("t5-base"), "t5/seq2seq-lm/bf16/sdpa"),
            (preset("gpt2"), "gpt2/causal-lm/bf16/sdpa"),
            (
                config(include_str!("../../../../../data/models/gemma-3-1b.json"), "gemma-3-1b"),
                "gemma3_text/causal-lm/bf16/sdpa-math",
            ),
            (preset("pythia-1b"), "gpt_neox/causal-lm/bf16/sdpa"),
        ];
        let jobs = [
            (LoraTargets::All, Checkpointing::Full, "ckpt/qlora-all"),
            (LoraTargets::All, Checkpointing::None, "full/qlora-all"),
            (LoraTargets::QueryValue, Checkpointing::Full, "ckpt/qlora-qv"),
            (LoraTargets::QueryValue, Checkpointing::None, "full/qlora-qv"),
        ];
        for (targets, checkpointing, suffix) in jobs {
            let cfg = TrainConfig {
                attention: Attention::Sdpa,
                checkpointing,
                finetune: Finetune::Lora { rank: 16, targets, base: BaseWeights::Nf4 },
                ..TrainConfig::new(2, 1024, Precision::Bf16, Optimizer::AdamW)
            };
            for (model, want) in &models {
                let want = format!("{want}/{suffix}");
                assert_eq!(
                    crate::builders::hf::key(model, &cfg, Device::Gpu(&h200)),
                    Ok(want.clone()),
                    "{}",
                    model.name
                );
                // The steps were recorded with a GPU's rules: the CPU's check rows take the same.
                assert_eq!(crate::builders::hf::key(model, &cfg, Device::Cpu), Ok(want), "{}", model.name);
                let planned = program(model, &cfg, Device::Gpu(&h200), 2, &StateScale::default());
                assert!(planned.is_ok(), "{}: {:?}", model.name, planned.err());
            }
        }
    }

    /// A family whose QLoRA was recorded over grouped heads alone (Gemma 3, whose catalog model
    /// groups them) plans a model of it whose heads are not grouped from the math path's
    /// template: over, not refused.
    #[test]
    fn qlora_of_ungrouped_heads_without_their_template_plans_the_math_path() {
        let gemma3 = Model::from_hf_config(include_str!("../../../../../data/models/gemma-3-1b.json"), "gemma-3-1b")
            .expect("config");
        let model = Model { kv_heads: gemma3.heads, ..gemma3 };
        let cfg = TrainConfig {
            finetune: Finetune::Lora { rank: 16, targets: LoraTargets::All, base: BaseWeights::Nf4 },
            ..lora(16, LoraTargets::All, Checkpointing::Full)
        };
        assert_eq!(
            crate::builders::hf::key(&model, &cfg, Device::Cpu).as_deref(),
            Ok("gemma3_text/causal-lm/bf16/sdpa-math/ckpt/qlora-all")
        );
    }

    /// Without checkpointing QLoRA keeps every layer's activations for the backward: its replay
    /// peaks above the checkpointed one's at the same job, with the same weights and optimizer
    /// state (the 4-bit base, the fp32 adapters and AdamW's moments are the same tensors).
    #[test]
    fn qlora_without_checkpointing_keeps_every_layer_s_activations() {
        let h200 = crate::gpu::gpu("h200").expect("gpu");
        let model = crate::model::preset("gpt2").expect("preset");
        let plan = |checkpointing| {
            let cfg = TrainConfig {
                attention: Attention::Sdpa,
                checkpointing,
                finetune: Finetune::Lora { rank: 16, targets: LoraTargets::All, base: BaseWeights::Nf4 },
                ..TrainConfig::new(4, 1024, Precision::Bf16, Optimizer::AdamW)
            };
            let p = program(&model, &cfg, Device::Gpu(&h200), 2, &StateScale::default())
                .expect("a recorded QLoRA step")
                .program;
            p.check().expect("well formed");
            let sizes = p.sizes(cfg.micro_batch, cfg.seq);
            let of = |term: Term| -> u64 {
                p.tensors.iter().zip(&sizes).filter(|(t, _)| t.term == term).map(|(_, &b)| b).sum()
            };
            (of(Term::Weights), of(Term::Optimizer), p.live_peak(&sizes).bytes)
        };
        let (full, ckpt) = (plan(Checkpointing::None), plan(Checkpointing::Full));
        assert_eq!((full.0, full.1), (ckpt.0, ckpt.1), "weights and optimizer state");
        assert!(full.2 > ckpt.2, "peak without checkpointing {} <= with {}", full.2, ckpt.2);
    }

    #[test]
    fn int8_bases_are_refused_with_the_reason() {
        let cfg = TrainConfig {
            finetune: Finetune::Lora { rank: 16, targets: LoraTargets::All, base: BaseWeights::Int8 },
            ..TrainConfig::new(1, 128, Precision::Bf16, Optimizer::AdamW)
        };
        assert!(suffix(&cfg).unwrap_err().contains("not recorded"));
    }

    /// QLoRA replays the template of the targets asked (every linear layer, or the query and
    /// value projections), with checkpointing or without.
    #[test]
    fn qlora_replays_its_template_as_peft_sets_it_up() {
        let qlora = |targets, checkpointing| TrainConfig {
            checkpointing,
            finetune: Finetune::Lora { rank: 16, targets, base: BaseWeights::Nf4 },
            ..TrainConfig::new(1, 128, Precision::Bf16, Optimizer::AdamW)
        };
        assert_eq!(suffix(&qlora(LoraTargets::All, Checkpointing::Full)), Ok(Some("qlora-all")));
        assert_eq!(suffix(&qlora(LoraTargets::All, Checkpointing::None)), Ok(Some("qlora-all")));
        assert_eq!(suffix(&qlora(LoraTargets::QueryValue, Checkpointing::Full)), Ok(Some("qlora-qv")));
        assert_eq!(suffix(&qlora(LoraTargets::QueryValue, Checkpointing::None)), Ok(Some("qlora-qv")));
    }
}
