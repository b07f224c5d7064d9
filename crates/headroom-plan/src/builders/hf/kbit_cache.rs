//! peft's `prepare_model_for_kbit_training` empties the CUDA allocator's cache.
//!
//! After casting every 16-bit parameter that is not a 4-bit one to fp32, peft (0.21, its
//! `auto_clear_cache=True` default) calls `torch.cuda.empty_cache()` where CUDA is available:
//! the segments the bf16 originals, bitsandbytes' quantization scratch and the loading's
//! temporaries left free go back to the driver, and the adapters, the inputs and the first
//! step's tensors that a replay without the call would have placed in them make segments of
//! their own. The QLoRA templates are recorded on fake CPU tensors, where the call is skipped,
//! so the replay makes it: on an H200, Qwen3-30B-A3B (4 layers) at 2 × 1024 gave back 2,724 MiB
//! there (two 594 MiB and four 384 MiB segments of the expert stacks' loading) and made 1,180
//! MiB of smaller segments after, and the plan without the call reserved 1,550 MiB more than the
//! GPU (the job's allocator snapshot, `validate_templates.py measure --snapshot`; docs/VALIDATION.md,
//! "QLoRA and NF4 inference on an H200").
//!
//! The call comes after the casts and before `get_peft_model` makes the first adapter, so in the
//! template's setup it stands before the first allocation of a LoRA parameter.

use crate::program_template::Template;

/// The template tensor before whose first allocation in the setup peft empties the cache: the
/// first LoRA parameter the setup makes. `None` where the setup makes none.
pub(super) fn emptied_before(t: &Template) -> Option<u32> {
    t.setup.iter().filter(|e| !e.free).map(|e| e.tensor).find(|&x| {
        t.tensors[x as usize].param.is_some_and(|p| t.params.get(p as usize).is_some_and(|p| is_lora(&p.name)))
    })
}

/// peft's adapter weights: `lora_A`, `lora_B` (and `lora_embedding_A`/`_B`, `lora_magnitude_vector`).
fn is_lora(name: &str) -> bool {
    name.split('.').any(|part| part.starts_with("lora_"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program_template::{keys, template};

    #[test]
    fn lora_names_are_peft_s() {
        assert!(is_lora("model.layers.0.self_attn.q_proj.lora_A.default.weight"));
        assert!(is_lora("bert.encoder.layer.3.output.dense.lora_B.default.weight"));
        assert!(!is_lora("model.layers.0.self_attn.q_proj.weight"));
        assert!(!is_lora("model.lora.weight"));
    }

    /// Every QLoRA template's setup makes its adapters after the base's casts: the point is found,
    /// and no parameter of the base is made after it.
    #[test]
    fn every_qlora_setup_empties_before_its_adapters() {
        let mut n = 0;
        for key in keys().filter(|k| k.contains("/qlora-")) {
            let t = &template(key).expect("bundled").template;
            let first = emptied_before(t).unwrap_or_else(|| panic!("{key}: no adapter in the setup"));
            let at = t.setup.iter().position(|e| !e.free && e.tensor == first).expect("made");
            let base_after = t.setup[at..].iter().filter(|e| !e.free).find_map(|e| {
                let p = t.tensors[e.tensor as usize].param?;
                let name = &t.params[p as usize].name;
                (!is_lora(name)).then_some(name)
            });
            assert_eq!(base_after, None, "{key}: a base parameter made after the first adapter");
            n += 1;
        }
        assert!(n > 0, "no QLoRA template");
    }
}
