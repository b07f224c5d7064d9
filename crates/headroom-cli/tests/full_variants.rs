//! Full fine-tuning with eager attention under AMP (with and without checkpointing), with
//! eager attention in fp32 with checkpointing, with SDPA under AMP with checkpointing, and
//! BERT's and Mixtral's eager bf16 with checkpointing: each job replays its own recorded step
//! (`data/programs/hf-variants.tpl`) on an H200, where it fell to the closed form's phases
//! before ("no step `…` was recorded"). A GPU's AMP job replays the step recorded under CUDA's
//! autocast policy (`…/amp-cuda/…`) where that policy makes other tensors than the CPU's
//! (GPT-2's tanh GELU in fp32; GPT-NeoX's query and key with no fp32 copy of their unrotated
//! part for `cat`; BERT's eager softmax, its head's LayerNorm and its loss), the CPU's
//! (`…/amp/…`) where the two make the same. Without checkpointing, the families that fuse the
//! query, key and value replay their step recorded with the key-value cache, transformers'
//! default (`…/full/cache`, `data/programs/hf-cache.tpl`).

mod support;

use support::assert_replays;

/// (preset, precision, attention, checkpointing, the key its plan replays).
const JOBS: &[(&str, &str, &str, &str, &str)] = &[
    ("llama-3-8b", "amp", "eager", "none", "llama/causal-lm/amp/eager/full"),
    ("llama-3-8b", "amp", "eager", "full", "llama/causal-lm/amp/eager/ckpt"),
    ("mistral-7b", "amp", "eager", "none", "mistral/causal-lm/amp/eager/full"),
    ("mistral-7b", "amp", "eager", "full", "mistral/causal-lm/amp/eager/ckpt"),
    ("mixtral-8x7b", "amp", "eager", "none", "mixtral/causal-lm/amp/eager/full"),
    ("mixtral-8x7b", "amp", "eager", "full", "mixtral/causal-lm/amp/eager/ckpt"),
    ("qwen2.5-7b", "amp", "eager", "none", "qwen2/causal-lm/amp/eager/full"),
    ("qwen2.5-7b", "amp", "eager", "full", "qwen2/causal-lm/amp/eager/ckpt"),
    ("phi-3-mini", "amp", "eager", "none", "phi3/causal-lm/amp/eager/full/cache"),
    ("phi-3-mini", "amp", "eager", "full", "phi3/causal-lm/amp/eager/ckpt"),
    ("gemma-7b", "amp", "eager", "none", "gemma/causal-lm/amp/eager/full"),
    ("gemma-7b", "amp", "eager", "full", "gemma/causal-lm/amp/eager/ckpt"),
    ("gpt2", "amp", "eager", "none", "gpt2/causal-lm/amp-cuda/eager/full/cache"),
    ("gpt2", "amp", "eager", "full", "gpt2/causal-lm/amp-cuda/eager/ckpt"),
    ("pythia-1b", "amp", "eager", "none", "gpt_neox/causal-lm/amp-cuda/eager/full/cache"),
    ("pythia-1b", "amp", "eager", "full", "gpt_neox/causal-lm/amp-cuda/eager/ckpt"),
    ("bert-base-uncased", "amp", "eager", "none", "bert/masked-lm/amp-cuda/eager/full"),
    ("bert-base-uncased", "amp", "eager", "full", "bert/masked-lm/amp-cuda/eager/ckpt"),
    // BLOOM has no SDPA path in transformers: eager whatever is asked.
    ("bloom-7b1", "amp", "eager", "full", "bloom/causal-lm/amp/eager/ckpt"),
    ("bloom-7b1", "amp", "sdpa", "full", "bloom/causal-lm/amp/eager/ckpt"),
    ("llama-3-8b", "fp32", "eager", "full", "llama/causal-lm/fp32/eager/ckpt"),
    ("mistral-7b", "fp32", "eager", "full", "mistral/causal-lm/fp32/eager/ckpt"),
    ("mixtral-8x7b", "fp32", "eager", "full", "mixtral/causal-lm/fp32/eager/ckpt"),
    ("qwen2.5-7b", "fp32", "eager", "full", "qwen2/causal-lm/fp32/eager/ckpt"),
    ("phi-3-mini", "fp32", "eager", "full", "phi3/causal-lm/fp32/eager/ckpt"),
    ("gemma-7b", "fp32", "eager", "full", "gemma/causal-lm/fp32/eager/ckpt"),
    ("gpt2", "fp32", "eager", "full", "gpt2/causal-lm/fp32/eager/ckpt"),
    ("pythia-1b", "fp32", "eager", "full", "gpt_neox/causal-lm/fp32/eager/ckpt"),
    ("gemma-7b", "amp", "sdpa", "full", "gemma/causal-lm/amp/sdpa/ckpt"),
    ("pythia-1b", "amp", "sdpa", "full", "gpt_neox/causal-lm/amp-cuda/sdpa/ckpt"),
    ("bert-base-uncased", "amp", "sdpa", "full", "bert/masked-lm/amp-cuda/sdpa/ckpt"),
    ("bert-base-uncased", "bf16", "eager", "full", "bert/masked-lm/bf16/eager/ckpt"),
    ("mixtral-8x7b", "bf16", "eager", "full", "mixtral/causal-lm/bf16/eager/ckpt"),
];

#[test]
fn each_job_replays_its_own_recorded_step() {
    for (model, precision, attention, ck, want) in JOBS {
        let job: Vec<String> = format!(
            "--model {model} --gpu h200 --finetune full --precision {precision} --attention {attention} \
             --checkpoint {ck} --batch 1 --seq 512"
        )
        .split_whitespace()
        .map(String::from)
        .collect();
        let (_, text) = assert_replays(&job, want);
        assert!(!text.contains("passed over transformers"), "{job:?}: {text}");
    }
}
