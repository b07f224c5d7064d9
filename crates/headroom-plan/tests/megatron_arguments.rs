//! `--emit megatron` writes only flags Megatron-LM's parser defines: the list in
//! `data/megatron-arguments.txt`, taken from `megatron/training/arguments.py` at the commit
//! its header names. And the flags build each model's architecture, not Megatron's GPT.

use headroom_plan::emit::{emit, Engine};
use headroom_plan::job::{Attention, Checkpointing, Offload, Optimizer, Precision, TrainConfig};
use headroom_plan::model::{preset, Model};
use headroom_plan::parallel::Parallelism;
use std::collections::BTreeSet;

const ARGUMENTS: &str = include_str!("data/megatron-arguments.txt");

fn megatron_flags() -> BTreeSet<&'static str> {
    let mut lines = ARGUMENTS.lines();
    let header = lines.next().unwrap();
    assert!(header.contains("NVIDIA/Megatron-LM") && header.contains("megatron/training/arguments.py"), "{header}");
    let flags: BTreeSet<&str> = lines.map(str::trim).filter(|l| !l.is_empty()).collect();
    assert!(flags.len() > 500 && flags.iter().all(|f| f.starts_with("--")));
    flags
}

/// The jobs each model is emitted for: data parallel with the distributed optimizer, and
/// tensor, pipeline (uneven and interleaved), sequence and context parallelism with fp8,
/// selective recomputation and the optimizer offloaded.
fn jobs(model: &Model) -> Vec<TrainConfig> {
    let base = TrainConfig {
        attention: Attention::Flash,
        checkpointing: Checkpointing::Full,
        accumulation: 2,
        parallel: Parallelism::data_parallel(8, 1),
        ..TrainConfig::new(1, 4096, Precision::Bf16, Optimizer::AdamW)
    };
    let stages = if model.layers.is_multiple_of(4) { 4 } else { 3 };
    vec![
        base,
        TrainConfig {
            checkpointing: Checkpointing::Selective,
            precision: Precision::Fp8,
            offload: Offload::Optimizer,
            parallel: Parallelism {
                data: 2,
                tensor: 2,
                pipeline: stages,
                context: 2,
                virtual_stages: if stages == 4 { 2 } else { 1 },
                tp_comm_overlap: true,
                zero_stage: 1,
                ..Parallelism::default()
            },
            ..base
        },
        TrainConfig {
            checkpointing: Checkpointing::EveryK(2),
            parallel: Parallelism { data: 1, pipeline: 3, zero_stage: 1, ..Parallelism::default() },
            ..base
        },
    ]
}

/// The `--flags` after `pretrain_gpt.py` (those before it are torchrun's).
fn written(args: &str) -> Vec<&str> {
    let script = args.split_once("pretrain_gpt.py").expect("pretrain_gpt.py").1;
    script.split_whitespace().filter(|w| w.starts_with("--")).collect()
}

#[test]
fn every_flag_megatron_is_given_is_one_its_parser_defines() {
    let known = megatron_flags();
    for name in ["llama-3-8b", "llama-3.1-8b", "mistral-7b", "qwen2.5-7b", "gpt2", "mixtral-8x7b", "phi-3-mini"] {
        let model = preset(name).unwrap();
        for job in jobs(&model) {
            let args = emit(Engine::Megatron, &model, &job).unwrap_or_else(|e| panic!("{name}: {e}"));
            for flag in written(&args) {
                assert!(known.contains(flag), "{name}: {flag} is not one of Megatron-LM's arguments:\n{args}");
            }
        }
    }
}

#[test]
fn megatron_builds_llama_not_gpt() {
    let model = preset("llama-3-8b").unwrap();
    let args = emit(Engine::Megatron, &model, &jobs(&model)[0]).unwrap();
    for flags in [
        "--normalization RMSNorm --norm-epsilon 0.00001",
        "--position-embedding-type rope --rotary-base 500000",
        "--max-position-embeddings 8192",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
        "--swiglu",
        "--attention-dropout 0 --hidden-dropout 0",
        "--group-query-attention --num-query-groups 8",
        "--tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-8B --padded-vocab-size 128256",
    ] {
        assert!(args.contains(flags), "{flags} in {args}");
    }
    for gpt in ["--add-qkv-bias", "--openai-gelu", "learned_absolute", "--use-rope-scaling", "--window-size"] {
        assert!(!args.contains(gpt), "{gpt} in {args}");
    }
}

#[test]
fn megatron_builds_each_family_s_differences() {
    let args = |name: &str| {
        let model = preset(name).unwrap();
        emit(Engine::Megatron, &model, &jobs(&model)[0]).unwrap()
    };
    let has = |name: &str, flags: &[&str]| {
        let a = args(name);
        for f in flags {
            assert!(a.contains(f), "{name}: {f} in {a}");
        }
        a
    };
    // Llama 3.1's rope scaling is the one Megatron's --use-rope-scaling applies.
    has("llama-3.1-8b", &["--use-rope-scaling --rope-scaling-factor 8", "--max-position-embeddings 131072"]);
    // Qwen2 biases its query, key and value projections only.
    has("qwen2.5-7b", &["--disable-bias-linear", "--add-qkv-bias", "--rotary-base 1000000", "--norm-epsilon 0.000001"]);
    // Mistral slides a 4096-token window (the token and 4095 before it).
    has("mistral-7b", &["--window-size 4095,0", "--rotary-base 10000"]);
    has("mixtral-8x7b", &["--num-experts 8 --moe-router-topk 2", "--rotary-base 1000000"]);
    // GPT-2: LayerNorm, learned positions, tied embeddings, biases, tanh GELU, 50257 rows.
    let gpt2 =
        has("gpt2", &["--normalization LayerNorm", "--position-embedding-type learned_absolute", "--openai-gelu"]);
    assert!(gpt2.contains("--tokenizer-model openai-community/gpt2") || gpt2.contains("--tokenizer-model gpt2"));
    assert!(gpt2.contains("--padded-vocab-size 50257"), "{gpt2}");
    for llama in ["--swiglu", "--untie-embeddings", "--disable-bias-linear", "rope"] {
        assert!(!gpt2.contains(llama), "{llama} in {gpt2}");
    }
    // Tensor parallelism shards the embedding: its rows round up to whole shards.
    let model = preset("gpt2").unwrap();
    let tp2 = emit(Engine::Megatron, &model, &jobs(&model)[1]).unwrap();
    assert!(tp2.contains("--padded-vocab-size 50258"), "{tp2}");
    // Layers that attend to the whole sequence beside those that slide: 1 slides, 0 does not.
    let mistral = preset("mistral-7b").unwrap();
    let mixed = Model { global_layers: vec![0, 2], ..mistral };
    let args = emit(Engine::Megatron, &mixed, &jobs(&mixed)[0]).unwrap();
    let pattern = format!("--window-attn-skip-freq '[0,1,0{}]'", ",1".repeat(29));
    assert!(args.contains(&format!("--window-size 4095,0 \\\n  {pattern}")), "{args}");
    // Megatron refuses sequences past the limit: rotary positions, which have no table, take
    // the longer sequence a plan beyond the context asks for.
    let llama = preset("llama-3-8b").unwrap();
    let long = TrainConfig { seq: 16384, ..jobs(&llama)[0] };
    assert!(emit(Engine::Megatron, &llama, &long).unwrap().contains("--max-position-embeddings 16384"));
}

#[test]
fn what_megatron_cannot_build_is_named() {
    let job = &jobs(&preset("llama-3-8b").unwrap())[0];
    for (name, why) in [
        ("pythia-1b", "use_parallel_residual"),
        ("bloom-7b1", "ALiBi"),
        ("bert-base-uncased", "encoder"),
        ("t5-base", "encoder-decoder"),
        ("gemma-7b", "GeGLU"),
    ] {
        let e = emit(Engine::Megatron, &preset(name).unwrap(), job).unwrap_err().to_string();
        assert!(e.contains(why) && e.contains(name), "{name}: {e}");
    }
    // A rope scaling other than Llama 3's.
    let mut yarn = preset("llama-3.1-8b").unwrap();
    yarn.rope_scaling.as_mut().unwrap().kind = "yarn".into();
    let e = emit(Engine::Megatron, &yarn, job).unwrap_err().to_string();
    assert!(e.contains("`yarn`"), "{e}");
    // A config that is not a preset: its data tokenized beforehand.
    let own = preset("llama-3-8b").unwrap().renamed("my-llama");
    let args = emit(Engine::Megatron, &own, job).unwrap();
    assert!(args.contains("--tokenizer-type NullTokenizer --vocab-size 128256 --padded-vocab-size 128256"), "{args}");
}
