//! Which recorded template plans a job: its key (family, head, precision, attention,
//! checkpointing, MLP, key-value cache, adapters), the code a family shares where it has no
//! recording of its own, and the SDPA kernel a GPU runs for the job's dtype and heads.
//!
//! A key reads `FAMILY/HEAD/PRECISION/ATTENTION/full|ckpt[/gated][/cache][/ADAPTERS]`. `/cache`
//! marks a step recorded with the config's `use_cache` on (transformers' default: a
//! `DynamicCache` built in the training forward, each layer's key and value copied into it);
//! a key without it was recorded with the cache off. Only the families that fuse the query,
//! key and value into one projection ([`fuses_qkv`]) are recorded both ways, since only there
//! the copies move a peak; any other family's one key plans either setting, and a checkpointed
//! step is the same either way (transformers turns the cache off under checkpointing).

use super::{adapters, is_head, Device};
use crate::job::{fuses_qkv, Attention, Checkpointing, Precision, TrainConfig};
use crate::model::{Family, Head, Model};
use crate::program_template;
use crate::recipe::{measured_code, measured_precision};

/// The template key for a job, and whether SDPA takes the math path.
pub fn key(model: &Model, cfg: &TrainConfig, device: Device) -> Result<String, String> {
    key_on_path(model, cfg, device, sdpa_math(model, cfg, device))
}

/// The key of the template SDPA's math path plans for a job asking for SDPA (`…/sdpa-math/…`,
/// the path a GPU takes for fp32 with grouped key-value heads), on the CPU: a CPU takes that
/// path only when asked for it (`sdpa_kernel([SDPBackend.MATH])`), as the check rows of those
/// templates are measured.
pub fn math_key(model: &Model, cfg: &TrainConfig) -> Result<String, String> {
    key_on_path(model, cfg, Device::Cpu, true)
}

fn key_on_path(model: &Model, cfg: &TrainConfig, device: Device, math: bool) -> Result<String, String> {
    if cfg.compile {
        return Err("torch.compile's steps were recorded as moments, not tensor by tensor".to_string());
    }
    let precision =
        measured_precision(cfg.precision).ok_or_else(|| "fp8 is not a transformers precision".to_string())?;
    if !matches!(cfg.checkpointing, Checkpointing::None | Checkpointing::Full) {
        return Err("transformers checkpoints whole layers or none".to_string());
    }
    if cfg.head == Head::SeqCls {
        return Err("no classification step was recorded".to_string());
    }
    // A GPU's AMP step as recorded under CUDA's autocast policy (`amp-cuda`), where it was:
    // CUDA runs `softmax`, `layer_norm`, `pow` and the losses in fp32 where the CPU's autocast,
    // which `amp` was recorded under, keeps a bf16 input's dtype (T5's cross-attention
    // probabilities, bf16 scores plus a bf16 bias, are fp32 on a GPU and bf16 on the CPU).
    // QLoRA's steps were recorded with CUDA's rules on either device (bitsandbytes' CUDA path has
    // no CPU kernels), its AMP step under CUDA's autocast policy alone. The job's own key-value
    // cache comes first, under either policy: the cache's copies move a fused family's peak more
    // than the policy's fp32 `pow`, which the CPU's is rewritten for.
    if cfg.precision == Precision::Amp && (matches!(device, Device::Gpu(_)) || adapters::qlora(cfg)) {
        for (p, either_cache) in [(AMP_CUDA, false), (precision, false), (AMP_CUDA, true)] {
            if let Ok(k) = key_with_precision(model, cfg, device, math, p, either_cache) {
                return Ok(k);
            }
        }
        // Where neither policy was recorded, the key to record is the one looked up first, the
        // step under CUDA's autocast policy (`step_programs.py --only …/amp-cuda/…`, as `record
        // --dtype amp` runs it), not the CPU's `amp`, which this job would plan only rewritten.
        return key_with_precision(model, cfg, device, math, precision, true)
            .or_else(|_| key_with_precision(model, cfg, device, math, AMP_CUDA, true));
    }
    key_with_precision(model, cfg, device, math, precision, true)
}

/// The precision of the AMP templates recorded under CUDA's autocast policy.
pub(super) const AMP_CUDA: &str = "amp-cuda";

fn key_with_precision(
    model: &Model,
    cfg: &TrainConfig,
    device: Device,
    math: bool,
    precision: &str,
    either_cache: bool,
) -> Result<String, String> {
    let adapters = adapters::suffix(cfg)?;
    let checkpointed = cfg.checkpointing == Checkpointing::Full;
    let head = match cfg.head {
        _ if model.family == Family::T5 => "seq2seq-lm",
        Head::MaskedLm => "masked-lm",
        Head::CausalLm if model.generates() => "causal-lm",
        Head::CausalLm | Head::SeqCls => "masked-lm",
    };
    let attention = match cfg.attention {
        Attention::Eager => "eager",
        Attention::Sdpa | Attention::Flash if math => "sdpa-math",
        Attention::Sdpa | Attention::Flash => "sdpa",
    };
    let ck = if checkpointed { "ckpt" } else { "full" };
    // T5 comes with either MLP: v1.0's one ReLU projection in (t5-base), or v1.1's gated pair
    // (flan-t5, T0, mT5), recorded under keys of their own.
    let mlp = if model.family == Family::T5 && model.gated_mlp { "/gated" } else { "" };
    if !mlp.is_empty() && precision == "amp" && matches!(device, Device::Gpu(_)) {
        // The CPU's autocast, which the step was recorded under, runs its tanh GELU's `pow`
        // in bf16; CUDA's in fp32, and `autocast.rs` rewrites GPT-2's MLP for it, not T5's.
        return Err("CUDA's autocast runs the `pow` of T5 v1.1's gated GELU in fp32, where the step recorded on \
             the CPU ran it in bf16; the rewrite for it knows GPT-2's MLP alone"
            .to_string());
    }
    // A family's own recording where it has one for the job; else the code it shares.
    let families = [program_family(model), measured_code(model)];
    let key = |family: &str, attn: &str, cache: bool| {
        let cache = if cache { CACHE } else { "" };
        match adapters {
            Some(a) => format!("{family}/{head}/{precision}/{attn}/{ck}{mlp}{cache}/{a}"),
            None => format!("{family}/{head}/{precision}/{attn}/{ck}{mlp}{cache}"),
        }
    };
    // Families without an SDPA path in transformers (none of their recordings SDPA's) run
    // eager whatever is asked.
    let on = |attention: &str, cache: bool| -> Vec<String> {
        families
            .iter()
            .flat_map(|f| {
                [key(f, attention, cache)].into_iter().chain(no_sdpa(f, head).then(|| key(f, "eager", cache)))
            })
            .filter(|k| program_template::template(k).is_some())
            .collect()
    };
    let cache = cache_matters(model, cfg) && cfg.use_cache;
    let mut recorded = on(attention, cache);
    if recorded.is_empty() && attention == "sdpa" && adapters::qlora(cfg) {
        // QLoRA's fused kernel is recorded for every family with grouped heads but Gemma 3: an
        // ungrouped model of it plans the math path's template, which keeps the s × s
        // probabilities the kernel does not, a plan above the step.
        recorded = on("sdpa-math", cache);
    }
    if recorded.is_empty() && either_cache && cache_matters(model, cfg) {
        // The other half where the asked one was not recorded: the plan names the half it
        // replayed ([`cache_recorded`]), and the peak it gives differs from the job's by the
        // cache's copies.
        recorded = on(attention, !cache);
    }
    // A template plans the MLP it was recorded with, whatever its key says.
    let recorded: Vec<String> =
        recorded.into_iter().filter(|k| model.family != Family::T5 || gated(k) == model.gated_mlp).collect();
    if let Some(k) = recorded.iter().find(|k| model.tied_embeddings || has_own_head(k)) {
        return Ok(k.clone());
    }
    let record = record_hint(cfg.precision);
    Err(match recorded.first() {
        Some(k) => format!(
            "`{k}` was recorded with its output layer tied to the embeddings, and {}'s is a layer of its own; {record}",
            model.name
        ),
        // peft's prepare_model_for_kbit_training turns checkpointing on by default, and every
        // QLoRA-recorded family has that step.
        None if adapters.is_some_and(|a| a.starts_with("qlora-")) && !checkpointed => format!(
            "no step `{}` was recorded (QLoRA without gradient checkpointing); add --checkpoint full, as peft's \
             prepare_model_for_kbit_training sets it up by default, or {record}",
            key(families[0], attention, cache)
        ),
        None => format!("no step `{}` was recorded; {record}", key(families[0], attention, cache)),
    })
}

/// The key segment of a step recorded with the key-value cache on.
const CACHE: &str = "/cache";

/// Whether the key-value cache moves the peak of `cfg`'s step for `model`: a training forward
/// without checkpointing (transformers turns the cache off under it) of a family that fuses
/// the query, key and value, where SDPA saves the cache's copies of the key and value in place
/// of views of the fused output, or eager attention its products of them.
pub fn cache_matters(model: &Model, cfg: &TrainConfig) -> bool {
    fuses_qkv(model) && cfg.checkpointing == Checkpointing::None
}

/// The key-value cache a plan from template `key` assumed, where the cache moves the peak
/// ([`cache_matters`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheAssumed {
    /// The job's `use_cache`.
    pub asked: bool,
    /// The template's: where it differs from `asked`, the asked half was not recorded and the
    /// plan is off by the cache's copies.
    pub recorded: bool,
}

/// What a plan of `cfg` for `model` from template `key` assumed of the key-value cache; `None`
/// where the cache moves no peak.
pub fn cache_assumed(model: &Model, cfg: &TrainConfig, key: &str) -> Option<CacheAssumed> {
    cache_matters(model, cfg).then(|| CacheAssumed { asked: cfg.use_cache, recorded: cache_recorded(key) })
}

/// Whether template `key` was recorded with the key-value cache on.
pub fn cache_recorded(key: &str) -> bool {
    key.split('/').any(|part| part == &CACHE[1..])
}

/// Whether `family`'s jobs of `head` (a training head, or inference's `forward` or `generate`)
/// were recorded with eager attention alone, so SDPA asked replays the eager step: BLOOM and
/// Gemma-2, which transformers runs eager whatever is asked. (T5, which transformers 5.24 runs
/// with SDPA where asked, its default since transformers#47014, is recorded both ways:
/// docs/VALIDATION.md, "T5 with SDPA".)
pub(crate) fn no_sdpa(family: &str, head: &str) -> bool {
    let prefix = format!("{family}/{head}/");
    !program_template::keys().any(|k| k.starts_with(&prefix) && k.contains("/sdpa"))
}

/// How to plan a job no template serves: its own step recorded, at the job's precision
/// (`record --dtype amp` runs the forward under CUDA's autocast policy, the `amp-cuda` keys').
fn record_hint(precision: Precision) -> String {
    let dtype = match precision {
        Precision::Amp => " --dtype amp",
        Precision::Fp32 => " --dtype fp32",
        _ => "",
    };
    format!(
        "record this job's own on a CPU (python -m headroom_gpu record --model CONFIG{dtype} --out step.jsonl, \
         docs/RECORDING.md) and plan it with --program step.jsonl"
    )
}

/// Whether template `key` has an output layer of its own: a template recorded with tied
/// embeddings has no weight, gradient or optimizer state to plan an untied model's with.
fn has_own_head(key: &str) -> bool {
    program_template::template(key).is_some_and(|t| t.template.params.iter().any(|p| is_head(&p.name)))
}

/// Whether template `key`'s MLP is gated (T5 v1.1's `wi_0` and `wi_1`).
fn gated(key: &str) -> bool {
    program_template::template(key).is_some_and(|t| t.template.params.iter().any(|p| p.name.contains(".wi_0.")))
}

/// The transformers code whose recording holds for `model`: its own model type's where that
/// was recorded, else the code it shares its layers with (Qwen3's Qwen2, Gemma-2's Gemma).
fn program_family(model: &Model) -> &'static str {
    let own = model.model_type;
    let prefix = format!("{own}/");
    if program_template::keys().any(|k| k.starts_with(&prefix)) {
        own
    } else {
        measured_code(model)
    }
}

/// Whether a GPU runs SDPA as its composite math path: no fused kernel takes fp32 with
/// grouped key-value heads (flash and cuDNN need 16 bits; PyTorch 2.11's memory-efficient
/// kernel needs as many key-value heads as heads), and transformers passes `enable_gqa`
/// when there is no mask (research/sdpa-backends.md §1, §3). QLoRA's steps were recorded
/// with CUDA's rules on either device (bitsandbytes' CUDA path has no CPU kernels), so its
/// check rows take the path a GPU takes.
pub fn sdpa_math(model: &Model, cfg: &TrainConfig, device: Device) -> bool {
    let cuda = matches!(device, Device::Gpu(_)) || adapters::qlora(cfg);
    cuda && attention_fp32(cfg) && model.kv_heads < model.heads
}

/// Whether SDPA's inputs are fp32: an fp32 job's, and QLoRA's outside autocast, whose embeddings
/// and norms peft's `prepare_model_for_kbit_training` casts to fp32 and whose 4-bit layers return
/// their input's dtype, whatever the compute dtype. Under autocast (AMP) CUDA's policy casts
/// SDPA's inputs to bf16, QLoRA's too.
pub(super) fn attention_fp32(cfg: &TrainConfig) -> bool {
    cfg.precision == Precision::Fp32 || adapters::qlora(cfg) && cfg.precision != Precision::Amp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{BaseWeights, Finetune, LoraTargets, Optimizer};
    use crate::model::preset;

    fn qlora(precision: Precision) -> TrainConfig {
        TrainConfig {
            attention: Attention::Sdpa,
            checkpointing: Checkpointing::Full,
            finetune: Finetune::Lora { rank: 16, targets: LoraTargets::All, base: BaseWeights::Nf4 },
            ..TrainConfig::new(1, 512, precision, Optimizer::AdamW)
        }
    }

    /// QLoRA under AMP attends in bf16 (CUDA's autocast casts SDPA's fp32 inputs), so grouped
    /// heads take the fused kernel's `…/amp-cuda/sdpa/…` step, on a GPU and, the steps being
    /// recorded with a GPU's rules, on the CPU; at bf16 and fp32 compute its SDPA is fp32, and
    /// grouped heads take the math path.
    #[test]
    fn qlora_under_amp_attends_in_bf16_and_otherwise_in_fp32() {
        let h200 = crate::gpu::gpu("h200").expect("gpu");
        let llama = crate::model::preset("llama-3-8b").expect("preset");
        for device in [Device::Gpu(&h200), Device::Cpu] {
            assert_eq!(
                key(&llama, &qlora(Precision::Amp), device).as_deref(),
                Ok("llama/causal-lm/amp-cuda/sdpa/ckpt/qlora-all")
            );
            assert!(!sdpa_math(&llama, &qlora(Precision::Amp), device));
            assert!(sdpa_math(&llama, &qlora(Precision::Fp32), device));
            assert!(sdpa_math(&llama, &qlora(Precision::Bf16), device));
        }
    }

    fn cfg(use_cache: bool, checkpointing: Checkpointing) -> TrainConfig {
        TrainConfig { use_cache, checkpointing, ..TrainConfig::new(1, 512, Precision::Bf16, Optimizer::AdamW) }
    }

    #[test]
    fn a_fused_family_plans_each_setting_from_its_own_recording() {
        let gpt2 = preset("gpt2-medium").expect("a preset");
        assert_eq!(
            key(&gpt2, &cfg(true, Checkpointing::None), Device::Cpu).unwrap(),
            "gpt2/causal-lm/bf16/sdpa/full/cache"
        );
        assert_eq!(key(&gpt2, &cfg(false, Checkpointing::None), Device::Cpu).unwrap(), "gpt2/causal-lm/bf16/sdpa/full");
        // transformers turns the cache off under checkpointing: one recording either way.
        for on in [true, false] {
            assert_eq!(
                key(&gpt2, &cfg(on, Checkpointing::Full), Device::Cpu).unwrap(),
                "gpt2/causal-lm/bf16/sdpa/ckpt"
            );
            assert_eq!(cache_assumed(&gpt2, &cfg(on, Checkpointing::Full), "gpt2/causal-lm/bf16/sdpa/ckpt"), None);
        }
        let c = cfg(true, Checkpointing::None);
        assert_eq!(
            cache_assumed(&gpt2, &c, &key(&gpt2, &c, Device::Cpu).unwrap()),
            Some(CacheAssumed { asked: true, recorded: true })
        );
    }

    #[test]
    fn a_family_with_projections_of_their_own_plans_either_setting_from_one_key() {
        let llama = preset("llama-3-8b").expect("a preset");
        let on = key(&llama, &cfg(true, Checkpointing::None), Device::Cpu).unwrap();
        assert_eq!(on, key(&llama, &cfg(false, Checkpointing::None), Device::Cpu).unwrap());
        assert!(!cache_recorded(&on), "{on}");
        assert_eq!(cache_assumed(&llama, &cfg(true, Checkpointing::None), &on), None);
    }

    /// peft's LoRA over a fused family with the cache on replays the LoRA step recorded so.
    #[test]
    fn lora_of_a_fused_family_with_the_cache_replays_its_cache_on_step() {
        let cases = [
            ("gpt2-medium", "gpt2/causal-lm/bf16/sdpa/full/cache"),
            ("phi-3-mini", "phi3/causal-lm/bf16/sdpa/full/cache"),
            ("pythia-1b", "gpt_neox/causal-lm/bf16/sdpa/full/cache"),
            ("bloom-7b1", "bloom/causal-lm/bf16/eager/full/cache"),
        ];
        for (name, prefix) in cases {
            let model = preset(name).expect("a preset");
            for (targets, suffix) in [(LoraTargets::All, "lora-all"), (LoraTargets::QueryValue, "lora-qv")] {
                let finetune = Finetune::Lora { rank: 16, targets, base: BaseWeights::Native };
                let c = TrainConfig { finetune, ..cfg(true, Checkpointing::None) };
                assert_eq!(key(&model, &c, Device::Cpu).unwrap(), format!("{prefix}/{suffix}"), "{name}");
            }
        }
    }

    /// `/cache` follows the checkpointing (and T5's `/gated`) and precedes the adapters, and only
    /// a fused family's step without checkpointing is recorded so.
    #[test]
    fn every_key_recorded_with_the_cache_is_a_fused_family_s_uncheckpointed_step() {
        let fused = ["gpt2/", "phi3/", "gpt_neox/", "bloom/"];
        let cached: Vec<&str> = program_template::keys().filter(|k| cache_recorded(k)).collect();
        assert!(!cached.is_empty());
        for k in cached {
            let parts: Vec<&str> = k.split('/').collect();
            assert!(fused.iter().any(|f| k.starts_with(f)), "{k}");
            assert_eq!((parts[4], parts[5]), ("full", "cache"), "{k}");
            assert!(parts.len() == 6 || parts[6].starts_with("lora-"), "{k}");
        }
    }
}
