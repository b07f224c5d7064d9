//! What a GPU's attention backward takes for a moment beside the gradients it makes, as an
//! H200 with torch 2.11 and transformers 5.17 allocated it (docs/VALIDATION.md, "Llama-1B's
//! checkpointed reserved rows"):
//!
//! - cuDNN's workspace (bf16, grouped heads), after the queries', keys' and values' gradients:
//!   135,266,560 bytes a layer for Llama-1B at 4 × 2048 (32 heads over 8, head_dim 64), and
//!   8 MiB + 32 KiB + 256 for Qwen3-1.7B at 512 tokens (16 heads over 8, head_dim 128);
//! - CUDA's softmax backward (fp32, SDPA's math path): a temporary as large as the gradient it
//!   makes, freed at once — Llama-1B at 4 × 2048 made three 2 GiB blocks a layer, not two.

use headroom_plan::builders::{hf, Device, StateScale};
use headroom_plan::gpu::gpu;
use headroom_plan::job::{Attention, Checkpointing, Optimizer, Precision, TrainConfig};
use headroom_plan::model::Model;
use headroom_plan::program::{Op, Phase, Program};

const LLAMA_1B: &str = r#"{"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16,
  "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
  "max_position_embeddings": 8192, "tie_word_embeddings": true}"#;

const QWEN3_1_7B: &str = r#"{"model_type": "qwen3", "hidden_size": 2048, "intermediate_size": 6144,
  "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
  "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": true}"#;

fn program(config: &str, name: &str, cfg: &TrainConfig, device: Device) -> Program {
    let model = Model::from_hf_config(config, name).unwrap();
    hf::program(&model, cfg, device, 2, &StateScale::default()).expect("a template serves it").program
}

fn cfg(batch: u64, seq: u64, precision: Precision, checkpointing: Checkpointing) -> TrainConfig {
    TrainConfig {
        attention: Attention::Sdpa,
        checkpointing,
        ..TrainConfig::new(batch, seq, precision, Optimizer::AdamW)
    }
}

/// Each allocation of step 2's backward: (bytes, site), with whether the next op frees it.
fn step2_backward(p: &Program, batch: u64, seq: u64) -> Vec<(u64, String, bool)> {
    let sizes = p.sizes(batch, seq);
    let mut on = false;
    let mut out = Vec::new();
    for (i, op) in p.ops.iter().enumerate() {
        match op {
            Op::Mark { step, phase } => on = *step == 2 && *phase == Phase::Backward,
            Op::Alloc(id) if on => {
                let freed_at_once = matches!(p.ops.get(i + 1), Some(Op::Free(f)) if f == id);
                let site = p.sites[p.tensors[*id as usize].site as usize].clone();
                out.push((sizes[*id as usize], site, freed_at_once));
            }
            _ => {}
        }
    }
    out
}

#[test]
fn cudnn_takes_its_workspace_per_query_head_after_the_three_gradients() {
    let h200 = gpu("h200").unwrap();
    for checkpointing in [Checkpointing::None, Checkpointing::Full] {
        let p = program(LLAMA_1B, "llama-1b", &cfg(4, 2048, Precision::Bf16, checkpointing), Device::Gpu(&h200));
        let allocs = step2_backward(&p, 4, 2048);
        let at: Vec<usize> = allocs
            .iter()
            .enumerate()
            .filter(|(_, a)| a.1 == "cuDNN attention backward workspace")
            .map(|(i, _)| i)
            .collect();
        assert_eq!(at.len(), 16, "{checkpointing:?}: one a layer");
        for &i in &at {
            assert_eq!(allocs[i].0, 135_266_560, "{checkpointing:?}");
            assert!(allocs[i].2, "{checkpointing:?}: freed at once");
            // dq, dk, dv just before it: the queries' 32 heads, the keys' and values' 8.
            let before: Vec<u64> = allocs[i - 3..i].iter().map(|a| a.0).collect();
            assert_eq!(before, [33_554_432, 8_388_608, 8_388_608], "{checkpointing:?}");
        }
    }
    let p = program(QWEN3_1_7B, "qwen3-1.7b", &cfg(1, 512, Precision::Bf16, Checkpointing::None), Device::Gpu(&h200));
    let ws: Vec<u64> = step2_backward(&p, 1, 512)
        .into_iter()
        .filter(|a| a.1 == "cuDNN attention backward workspace")
        .map(|a| a.0)
        .collect();
    assert_eq!(ws.len(), 28);
    assert!(ws.iter().all(|&b| b == 8 * (1 << 20) + 32 * 1024 + 256), "{ws:?}");
}

#[test]
fn cuda_softmax_backward_makes_the_product_for_a_moment() {
    let h200 = gpu("h200").unwrap();
    let job = cfg(4, 2048, Precision::Fp32, Checkpointing::Full);
    let p = program(LLAMA_1B, "llama-1b", &job, Device::Gpu(&h200));
    let allocs = step2_backward(&p, 4, 2048);
    let softmax: Vec<&(u64, String, bool)> =
        allocs.iter().filter(|a| a.1.ends_with("aten::_softmax_backward_data")).collect();
    // Per layer: the gradient (kept) and the product (freed at once), both b·h·s·s fp32.
    assert_eq!(softmax.len(), 2 * 16);
    assert!(softmax.iter().all(|a| a.0 == 4 * 32 * 2048 * 2048 * 4), "{softmax:?}");
    assert_eq!(softmax.iter().filter(|a| a.2).count(), 16);
    // The same template expanded for the CPU (where the job itself would take another).
    let model = Model::from_hf_config(LLAMA_1B, "llama-1b").unwrap();
    let key = hf::key(&model, &job, Device::Gpu(&h200)).unwrap();
    let cpu = hf::program_of(&model, &job, Device::Cpu, &key, 2, &StateScale::default()).unwrap().program;
    let on_cpu =
        step2_backward(&cpu, 4, 2048).into_iter().filter(|a| a.1.ends_with("aten::_softmax_backward_data")).count();
    assert_eq!(on_cpu, 16, "the CPU's recording makes the gradient alone");
}
