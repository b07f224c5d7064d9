//! A QLoRA template's 4-bit base stored without double quantization, by bitsandbytes' rule.
//!
//! The QLoRA templates were recorded as QLoRA sets the base up: NF4 with double quantization
//! (`bnb_4bit_use_double_quant=True`). bitsandbytes' `quantize_4bit` (functional.py, 0.50)
//! packs a weight two values a byte and takes the fp32 absmax of each block of 64 weights.
//! With double quantization (`compress_statistics`) it quantizes that absmax again —
//! `offset = absmax.mean()`, `quantize_blockwise(absmax - offset, blocksize=256)`: a uint8
//! absmax a block, an fp32 absmax per 256 of those and its own copy of the 256-entry dynamic
//! map — and keeps those in the `QuantState` in the fp32 absmax's place; each use of the
//! weight then dequantizes the absmax first (`dequantize_blockwise`, then `+ offset`: in
//! `gemm_4bit`'s dequantize-then-matmul in the forward, in `dequantize_4bit` in the
//! backward). Without it the `QuantState` keeps the fp32 absmax itself (`absmax=_absmax`) and
//! nothing but the weight is dequantized. The job without double quantization is the template
//! with, for each quantized layer:
//! - the fp32 absmax `quantize_4bit` made kept as the layer's weight (4 bytes a block of 64:
//!   an eighth of the packed weight) where the recording freed it;
//! - what the double quantization made left out: the offset (`aten::mean`), `absmax - offset`
//!   (`aten::sub`), `quantize_blockwise`'s outputs and the map's copy (`aten::_to_copy`), each
//!   made between that absmax and its free; and the dynamic map itself, bitsandbytes' one
//!   global (the setup's first tensor, 1 KiB), which only `quantize_blockwise` makes;
//! - each step's `dequantize_blockwise` output left out, and the `+ offset` made from it.
//!
//! FP4 (`bnb_4bit_quant_type="fp4"`) stores the same tensors as NF4 (the same packed
//! nibbles, absmax and 16-entry code; only the code's values differ) and runs the same kernels:
//! a job with it replays the template as it is.

use super::autocast::op;
use crate::program::Term;
use crate::program_template::{EventT, Template};
use rustc_hash::FxHashSet as HashSet;

/// `quantize_4bit`'s operator: the packed weight (a parameter), then the fp32 absmax.
const QUANTIZE_4BIT: &str = "bitsandbytes::quantize_4bit";
/// What double quantization makes between the fp32 absmax and its free.
const DOUBLE_QUANT_OPS: [&str; 4] = ["aten::mean", "aten::sub", "bitsandbytes::quantize_blockwise", "aten::_to_copy"];
/// The absmax's dequantization before each use of a weight.
const DEQUANTIZE_ABSMAX: &str = "bitsandbytes::dequantize_blockwise";
/// bitsandbytes' dynamic map: 256 fp32 values.
const DYNAMIC_MAP_BYTES: f64 = 1024.0;

/// Rewrites `t`, recorded with double quantization, as bitsandbytes stores and runs the same
/// layers without it (see the module's documentation). The layers rewritten, or why none was.
pub(super) fn without_double_quant(t: &mut Template) -> Result<usize, String> {
    let mut dropped = HashSet::default();
    let mut kept = Vec::new();
    let setup = &t.setup;
    for (i, e) in setup.iter().enumerate() {
        if e.free || op(t, e.tensor) != QUANTIZE_4BIT || t.tensors[e.tensor as usize].param.is_none() {
            continue;
        }
        let packed = e.tensor;
        let Some(j) = (i + 1..setup.len()).find(|&j| !setup[j].free && op(t, setup[j].tensor) == QUANTIZE_4BIT) else {
            continue;
        };
        let absmax = setup[j].tensor;
        if t.tensors[absmax as usize].param.is_some() {
            continue;
        }
        // Freed: its place taken by the double quantization's state.
        let Some(f) = (j + 1..setup.len()).find(|&k| setup[k].free && setup[k].tensor == absmax) else {
            continue;
        };
        dropped.extend(
            setup[j + 1..f].iter().filter(|x| !x.free && DOUBLE_QUANT_OPS.contains(&op(t, x.tensor))).map(|x| x.tensor),
        );
        kept.push((absmax, packed));
    }
    if kept.is_empty() {
        return Err("the template's 4-bit layers were not recorded with double quantization".to_string());
    }
    if let Some(first) = t.setup.first().filter(|e| !e.free && op(t, e.tensor) == "aten::empty") {
        let law = t.tensors[first.tensor as usize].law;
        if law == crate::program::Law::fixed(DYNAMIC_MAP_BYTES) && !freed(t, first.tensor) {
            dropped.insert(first.tensor);
        }
    }
    let kept_ids: HashSet<u32> = kept.iter().map(|&(a, _)| a).collect();
    for &(absmax, packed) in &kept {
        // 4 bytes a block of 64 weights where the packed weight takes 32: exact for whole blocks,
        // and free of the law the recording fitted (a width the recording's MLP shared with the
        // rank read `f·h / 16` as `2·r·h`).
        let law = t.tensors[packed as usize].law.scaled(0.125);
        let x = &mut t.tensors[absmax as usize];
        x.law = law;
        x.term = Term::Weights;
    }
    for section in [t.step1.as_ref(), Some(&t.step)].into_iter().flatten() {
        for (i, e) in section.iter().enumerate() {
            if e.free || op(t, e.tensor) != DEQUANTIZE_ABSMAX {
                continue;
            }
            dropped.insert(e.tensor);
            // `dequantize_blockwise(...) + offset`: the next tensor made, in the forward.
            if let Some(next) = section[i + 1..].iter().find(|x| !x.free) {
                if op(t, next.tensor) == "aten::add"
                    && t.tensors[next.tensor as usize].law == t.tensors[e.tensor as usize].law
                {
                    dropped.insert(next.tensor);
                }
            }
        }
    }
    t.setup.retain(|e| !(dropped.contains(&e.tensor) || e.free && kept_ids.contains(&e.tensor)));
    if let Some(step1) = t.step1.take() {
        let (events, bw) = without(step1, t.backward[0], &dropped);
        t.step1 = Some(events);
        t.backward[0] = bw;
    }
    let step = std::mem::take(&mut t.step);
    let (events, bw) = without(step, t.backward[1], &dropped);
    t.step = events;
    t.backward[1] = bw;
    if t.step1.is_none() {
        t.backward[0] = bw;
    }
    Ok(kept.len())
}

/// Whether any section frees `tensor`.
fn freed(t: &Template, tensor: u32) -> bool {
    [Some(&t.setup), t.step1.as_ref(), Some(&t.step)]
        .into_iter()
        .flatten()
        .any(|s| s.iter().any(|e| e.free && e.tensor == tensor))
}

/// A section without the events of `dropped`, and where its backward now begins.
fn without(events: Vec<EventT>, backward: usize, dropped: &HashSet<u32>) -> (Vec<EventT>, usize) {
    let bw = events[..backward.min(events.len())].iter().filter(|e| !dropped.contains(&e.tensor)).count();
    (events.into_iter().filter(|e| !dropped.contains(&e.tensor)).collect(), bw)
}

#[cfg(test)]
mod tests {
    use crate::bnb::{Bnb, ComputeDtype, QuantType};
    use crate::builders::hf::program;
    use crate::builders::{Device, StateScale};
    use crate::job::{Attention, BaseWeights, Checkpointing, Finetune, LoraTargets, Optimizer, Precision, TrainConfig};
    use crate::program::{Program, Term};

    fn qlora(base: BaseWeights, double_quant: bool, checkpointing: Checkpointing) -> TrainConfig {
        TrainConfig {
            attention: Attention::Sdpa,
            checkpointing,
            finetune: Finetune::Lora { rank: 16, targets: LoraTargets::All, base },
            double_quant,
            ..TrainConfig::new(1, 512, Precision::Bf16, Optimizer::AdamW)
        }
    }

    fn of(p: &Program, cfg: &TrainConfig, term: Term) -> u64 {
        let sizes = p.sizes(cfg.micro_batch, cfg.seq);
        p.tensors.iter().zip(&sizes).filter(|(t, _)| t.term == term).map(|(_, &b)| b).sum()
    }

    /// Without double quantization each quantized layer keeps bitsandbytes' fp32 absmax in the
    /// place of the double quantization's state: the weights differ by what `Bnb::stored_bytes`
    /// (the closed form's count of `quantize_4bit`'s outputs) says of every layer, less the
    /// dynamic map; and no step dequantizes an absmax.
    #[test]
    fn the_weights_are_bitsandbytes_state_without_double_quantization() {
        for (name, checkpointing) in [("llama-3-8b", Checkpointing::Full), ("qwen2.5-7b", Checkpointing::None)] {
            let model = crate::model::preset(name).expect("preset");
            let build =
                |cfg: &TrainConfig| program(&model, cfg, Device::Cpu, 2, &StateScale::default()).expect("QLoRA");
            let dq = qlora(BaseWeights::Nf4, true, checkpointing);
            let plain = qlora(BaseWeights::Nf4, false, checkpointing);
            let (a, b) = (build(&dq), build(&plain));
            b.program.check().expect("well formed");
            let format =
                |double_quant| Bnb::FourBit { quant_type: QuantType::Nf4, double_quant, compute: ComputeDtype::Bf16 };
            let per_block: f64 = crate::bnb::quantized_linears(&model)
                .iter()
                .map(|&(k, n)| format(false).stored_bytes(k, n) - format(true).stored_bytes(k, n))
                .sum();
            let expected = per_block * model.layers as f64 - super::DYNAMIC_MAP_BYTES;
            let moved = of(&b.program, &plain, Term::Weights) as f64 - of(&a.program, &dq, Term::Weights) as f64;
            assert_eq!(moved, expected, "{name}");
            assert!(expected > 0.0);
            let dequantized = |p: &Program| p.sites.iter().filter(|s| s.contains("dequantize_blockwise")).count();
            assert!(dequantized(&a.program) > 0, "{name}: the recording dequantizes the absmax");
            let used = |p: &Program| {
                p.tensors.iter().filter(|t| p.sites[t.site as usize].contains("dequantize_blockwise")).count()
            };
            assert_eq!(used(&b.program), 0, "{name}");
        }
    }

    /// FP4 stores what NF4 stores: the same program.
    #[test]
    fn fp4_replays_the_nf4_recording() {
        let model = crate::model::preset("llama-3-8b").expect("preset");
        for double_quant in [true, false] {
            let build = |base| {
                let cfg = qlora(base, double_quant, Checkpointing::Full);
                let p = program(&model, &cfg, Device::Cpu, 2, &StateScale::default()).expect("QLoRA").program;
                (p.sizes(1, 512), p.tensors.len())
            };
            assert_eq!(build(BaseWeights::Nf4), build(BaseWeights::Fp4));
        }
    }
}
