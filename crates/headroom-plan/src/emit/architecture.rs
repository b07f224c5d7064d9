//! The Megatron-LM flags that make `pretrain_gpt.py` build the model's own architecture,
//! not Megatron's default GPT: its norm, positions, biases, MLP, embeddings, experts and
//! vocabulary, each from the model's `config.json`. What Megatron's GPT model cannot
//! express is an error that names it.
//!
//! Every flag is one Megatron-LM's parser defines (`megatron/training/arguments.py`); the
//! tests hold the output to the list in `tests/data/megatron-arguments.txt`.

use crate::model::{hub_ids, preset, Family, Model, RopeScaling};

/// Megatron's Llama 3.x rope scaling, whose factors other than `factor` are fixed
/// (`RotaryEmbedding._apply_scaling`): low 1, high 4, trained at 8,192 positions.
const LLAMA3_SCALING: (f64, f64, u64) = (1.0, 4.0, 8192);

/// The architecture flags for `model` trained on `seq`-token sequences, with the vocabulary
/// padded to whole shards over `tensor` ranks.
pub(super) fn flags(model: &Model, seq: u64, tensor: u64) -> Result<Vec<String>, String> {
    refuse(model)?;
    let mut args = vec![format!(
        "--num-layers {} --hidden-size {} --ffn-hidden-size {} --num-attention-heads {}",
        model.layers, model.hidden, model.intermediate, model.heads
    )];
    if model.heads * model.head_dim != model.hidden {
        args.push(format!("--kv-channels {}", model.head_dim));
    }
    if model.kv_heads != model.heads {
        args.push(format!("--group-query-attention --num-query-groups {}", model.kv_heads));
    }
    let gated = model.family == Family::GatedDecoder;
    let norm = if gated { "RMSNorm" } else { "LayerNorm" };
    args.push(format!("--normalization {norm} --norm-epsilon {}", model.norm_eps));
    args.extend(positions(model, seq)?);
    if gated {
        // Llama's linears have no bias; Qwen2's query, key and value projections do.
        args.push("--disable-bias-linear".into());
        if model.qkv_bias {
            args.push("--add-qkv-bias".into());
        }
        args.push("--swiglu".into());
        // Llama, Mistral and Qwen train without dropout; Megatron's default is 0.1.
        args.push("--attention-dropout 0 --hidden-dropout 0".into());
    } else {
        // GPT-2's `gelu_new`: the tanh approximation.
        args.push("--openai-gelu".into());
    }
    if matches!(model.model_type, "qwen3" | "qwen3_moe") {
        args.push("--qk-layernorm".into());
    }
    if !model.tied_embeddings {
        args.push("--untie-embeddings-and-output-weights".into());
    }
    if model.experts > 1 {
        args.push(format!("--num-experts {} --moe-router-topk {}", model.experts, model.experts_per_token));
    }
    args.push(vocabulary(model, tensor));
    Ok(args)
}

/// What `pretrain_gpt.py` cannot build, by name.
fn refuse(model: &Model) -> Result<(), String> {
    let why = match (model.family, model.model_type) {
        (Family::Bert, _) => "is an encoder (BERT); pretrain_gpt.py builds decoders",
        (Family::T5, _) => "is an encoder-decoder (T5); pretrain_gpt.py builds decoders",
        (Family::NeoX, _) => {
            "adds attention and MLP to the residual in parallel (GPT-NeoX's `use_parallel_residual`), which \
             Megatron-LM's GPT layers cannot express"
        }
        (Family::Bloom, _) => "has ALiBi attention biases instead of positions, which Megatron-LM's GPT model lacks",
        (_, "gemma" | "gemma2") => {
            "has Gemma's GeGLU MLP (a tanh-GELU gate), embeddings scaled by √hidden and (1 + w) RMSNorm, which \
             Megatron-LM's GPT model cannot express"
        }
        _ => return Ok(()),
    };
    Err(format!("{} {why}; plan it with --emit deepspeed, fsdp or accelerate", model.name))
}

/// Rotary or learned positions, their limit, the rotary base and Llama 3's scaling, and a
/// sliding window.
fn positions(model: &Model, seq: u64) -> Result<Vec<String>, String> {
    let mut args = Vec::new();
    match model.rope_theta {
        Some(theta) => {
            // Megatron's `--rotary-base` is an integer.
            if theta.fract() != 0.0 || theta > u32::MAX as f64 {
                return Err(format!(
                    "{}'s rope_theta is {theta}; Megatron-LM's --rotary-base takes a whole number",
                    model.name
                ));
            }
            args.push(format!("--position-embedding-type rope --rotary-base {}", theta as u64));
        }
        None => args.push("--position-embedding-type learned_absolute".into()),
    }
    // Megatron refuses sequences longer than the limit; rotary positions have no table, so a
    // plan beyond the model's context (which the plan warns of) raises it to the sequence.
    let limit = if model.rope_theta.is_some() { model.max_position.max(seq) } else { model.max_position };
    args.push(format!("--max-position-embeddings {limit}"));
    if let Some(scaling) = &model.rope_scaling {
        args.push(rope_scaling(model, scaling)?);
    }
    if let Some(window) = model.sliding_window {
        // Megatron's window is (left, right) beyond the token itself; transformers' counts it.
        args.push(format!("--window-size {},0", window.saturating_sub(1)));
        if !model.global_layers.is_empty() {
            // One entry a layer: 1 slides, 0 attends to the whole sequence.
            let pattern: Vec<&str> = (0..model.layers).map(|l| if model.slides(l) { "1" } else { "0" }).collect();
            args.push(format!("--window-attn-skip-freq '[{}]'", pattern.join(",")));
        }
    }
    Ok(args)
}

/// Llama 3.x's scaling, the one Megatron-LM's `--use-rope-scaling` applies.
fn rope_scaling(model: &Model, s: &RopeScaling) -> Result<String, String> {
    let (low, high, original) = LLAMA3_SCALING;
    let llama3 = s.kind == "llama3"
        && s.low_freq_factor.unwrap_or(low) == low
        && s.high_freq_factor.unwrap_or(high) == high
        && s.original_max_position.unwrap_or(original) == original;
    match (llama3, s.factor) {
        (true, Some(factor)) => Ok(format!("--use-rope-scaling --rope-scaling-factor {factor}")),
        _ => Err(format!(
            "{}'s rope scaling (`{}`{}) is not the Llama 3 scaling (factors {low} and {high} from {original} \
             positions) that Megatron-LM's --use-rope-scaling applies",
            model.name,
            s.kind,
            s.factor.map_or(String::new(), |f| format!(", factor {f}"))
        )),
    }
}

/// The tokenizer and the embedding's rows: a preset's Hugging Face tokenizer by its Hub id;
/// for any other config, data tokenized beforehand (`NullTokenizer`, whose last id of
/// `--vocab-size` ends a document). `--padded-vocab-size` keeps the config's rows
/// rather than Megatron's padding to 128, rounded up only to whole tensor-parallel shards.
fn vocabulary(model: &Model, tensor: u64) -> String {
    let rows = model.vocab.div_ceil(tensor.max(1)) * tensor.max(1);
    let hub = hub_ids().into_iter().find(|&(_, name)| name == model.name && preset(name).as_ref() == Ok(model));
    let tokenizer = match hub {
        Some((id, _)) => format!("--tokenizer-type HuggingFaceTokenizer --tokenizer-model {id}"),
        None => format!("--tokenizer-type NullTokenizer --vocab-size {}", model.vocab),
    };
    format!("{tokenizer} --padded-vocab-size {rows}")
}
