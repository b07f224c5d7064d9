//! A GPU's AMP step as recorded under CUDA's autocast policy (`…/amp-cuda/…` templates,
//! `scripts/validate/step_programs.py` with `headroom_gpu.amp.cuda_autocast`), against what an
//! H200 allocated for the same jobs (docs/VALIDATION.md, "AMP on a GPU: CUDA's autocast policy
//! recorded").
//!
//! CUDA's autocast runs `softmax` in fp32 (`AT_FORALL_FP32_SET_OPT_DTYPE`); the CPU's keeps a
//! bf16 input's dtype. T5's self-attention scores meet its fp32 position bias and come out
//! fp32 on both, but its cross-attention's bf16 scores meet a bf16 zero bias: on a GPU
//! `softmax` copies them to fp32 and keeps an fp32 output, where the CPU's recording kept bf16.

use headroom_plan::builders::{hf, Device, StateScale};
use headroom_plan::gpu::gpu;
use headroom_plan::job::{Attention, Optimizer, Precision, TrainConfig};
use headroom_plan::model::preset;
use headroom_plan::program::Op;

/// The sizes of step 1's allocations at `site`, in order, for `model` under AMP at 8 × 512.
fn allocations(model: &str, attention: Attention, device: Device, site: &str) -> Vec<u64> {
    let model = preset(model).expect("a preset");
    let cfg = TrainConfig { attention, ..TrainConfig::new(8, 512, Precision::Amp, Optimizer::AdamW) };
    let p = hf::program(&model, &cfg, device, 1, &StateScale::default()).expect("a template serves it").program;
    p.check().expect("well formed");
    let sizes = p.sizes(8, 512);
    p.ops
        .iter()
        .filter_map(|op| match op {
            Op::Alloc(id) if p.sites[p.tensors[*id as usize].site as usize] == site => Some(sizes[*id as usize]),
            _ => None,
        })
        .collect()
}

/// The H200's snapshot of t5-base under AMP at 8 × 512 (torch 2.11, transformers 5.17) holds
/// each of its 36 attentions' probabilities (`softmax`, modeling_t5.py:167) at 100,663,296
/// bytes, 8 × 12 × 512² fp32, and makes an fp32 copy of each of the 12 cross-attentions'
/// scores for it; the GPU's plan does the same. The CPU's keeps its recording's: the 12
/// cross-attentions' in bf16, no copy.
#[test]
fn t5_s_attention_probabilities_are_fp32_under_cuda_s_autocast() {
    const FP32: u64 = 8 * 12 * 512 * 512 * 4;
    let h200 = gpu("h200").expect("h200 is a preset");
    let t5 = |device, site| allocations("t5-base", Attention::Eager, device, site);
    let gpu_softmax = t5(Device::Gpu(&h200), "aten::softmax > aten::_softmax");
    assert_eq!(gpu_softmax, vec![FP32; 36]);
    let gpu_copies = t5(Device::Gpu(&h200), "aten::softmax > aten::empty_strided");
    assert_eq!(gpu_copies, vec![FP32; 12]);
    let mut cpu_softmax = t5(Device::Cpu, "aten::softmax > aten::_softmax");
    cpu_softmax.sort_unstable();
    assert_eq!(cpu_softmax, [vec![FP32 / 2; 12], vec![FP32; 24]].concat());
}

/// BERT's residual stream is fp32 under autocast (a bf16 projection plus an fp32 input), and
/// so is each LayerNorm's output: the H200's snapshot of bert-base under AMP at 8 × 512 makes
/// every one at 12,582,912 bytes, 4 × 768 a token (modeling_bert.py:292 and :350, twelve
/// layers each, the embeddings' :104 and the head's :479). The GPU's plan makes its 26 so. The
/// template recorded before at a position table twice the hidden size read these 4·h bytes a
/// token as 2·P, 4,194,304 bytes at BERT's 512 positions.
#[test]
fn bert_s_fp32_hidden_states_are_four_bytes_a_hidden_element() {
    let h200 = gpu("h200").expect("h200 is a preset");
    let mut norms =
        allocations("bert-base-uncased", Attention::Sdpa, Device::Gpu(&h200), "aten::layer_norm > aten::empty");
    // Each LayerNorm's mean and reciprocal deviation, fp32 a token, aside.
    let stats = norms.iter().filter(|&&b| b == 8 * 512 * 4).count();
    norms.retain(|&b| b != 8 * 512 * 4);
    assert_eq!(stats, 2 * 26);
    assert_eq!(norms, vec![8 * 512 * 768 * 4; 26]);
}
