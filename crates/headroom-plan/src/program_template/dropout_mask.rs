//! A dropout's mask as a GPU keeps it: one byte an element.
//!
//! The CPU's `aten::dropout` makes its noise with `empty_like(input)`, in the input's dtype;
//! CUDA's fused dropout (`native_dropout`) keeps a bool mask, one byte an element whatever the
//! input's dtype. Under bf16 or fp32 every dropped tensor has the step's one dtype, but under
//! autocast with fp32 parameters the inputs differ: GPT-2's and BERT's embeddings (and BERT's
//! embedding LayerNorm, on autocast's fp32 list) come out fp32, the blocks' projections bf16,
//! and T5's attention probabilities fp32 (its position bias is fp32). Dividing every mask by
//! the step's activation width planned the fp32 ones at 2 bytes an element: on an H200,
//! GPT-2 medium under AMP at 8 × 888 tokens keeps its embedding dropout's mask at 7,274,496
//! bytes (`../shared/gpu/snapshots/native-gpt2-medium-b8`), where the plan held 14,548,992.
//!
//! A mask's elements are those of what its dropout dropped: the hidden states (`h` a token),
//! an MLP's inner activations (`f` a token: T5's), or attention's probabilities (`heads` a
//! token and position). The recorded law gives them with the width the CPU kept them at,
//! 2 or 4 bytes. Where the recorder read the bytes in another unit that the recording's sizes
//! could not tell apart (GPT-2's fp32 embedding noise, `4·h` bytes a token, read as `1·f` at
//! its `f = 4·h`; BERT's, read as `2·P` at its `P = 2·h`), the one dropped shape those bytes
//! make at an element width is the reading.

use super::unit_law::{LawKind, UnitLaw};
use std::collections::BTreeMap;

/// What a dropout drops, by how it grows: in a decoder of a length of its own (a
/// sequence-to-sequence template recorded at two lengths) its hidden states and MLP a decoder
/// token, its self-attention's probabilities a decoder token and position, its
/// cross-attention's a decoder token and encoder position.
const DROPPED: [(LawKind, &str); 7] = [
    (LawKind::Token, "h"),
    (LawKind::Token, "f"),
    (LawKind::TokenPosition, "heads"),
    (LawKind::TargetToken, "h"),
    (LawKind::TargetToken, "f"),
    (LawKind::TargetTokenTargetPosition, "heads"),
    (LawKind::TargetTokenPosition, "heads"),
];
/// The widths the CPU keeps noise at: bf16 (or fp16), fp32.
const WIDTHS: [f64; 2] = [2.0, 4.0];

/// The mask's elements as a law (one byte each), read from the noise's recorded law `law`
/// at the recording's dimensions `dims`; `None` where a term reads as no dropped shape at an
/// element width.
pub(super) fn elements(law: &UnitLaw, dims: &BTreeMap<String, f64>) -> Option<UnitLaw> {
    let size = |u: &str| {
        u.split('*').map(|p| if p == "one" { 1.0 } else { dims.get(p).copied().unwrap_or(0.0) }).product::<f64>()
    };
    let width = |w: f64| WIDTHS.iter().any(|&x| (x - w).abs() < 1e-9);
    let mut out = Vec::with_capacity(law.0.len());
    for (kind, unit, c) in &law.0 {
        if DROPPED.contains(&(*kind, unit.as_str())) && width(*c) {
            out.push((*kind, unit.clone(), 1.0));
            continue;
        }
        let bytes = c * size(unit);
        let mut readings =
            DROPPED.iter().filter(|(k, u)| k == kind && size(u) > 0.0 && width(bytes / size(u))).map(|(_, u)| *u);
        let (Some(u), None) = (readings.next(), readings.next()) else { return None };
        out.push((*kind, u.to_string(), 1.0));
    }
    (!out.is_empty()).then_some(UnitLaw(out))
}

#[cfg(test)]
mod tests {
    use super::super::{keys, template, Kernel};
    use super::*;

    fn dims(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    /// A reading in a dropped shape at 2 or 4 bytes keeps its unit; GPT-2's fp32 noise read as
    /// `1·f` (f = 4·h at the recording) and BERT's as `2·P` (P = 2·h) are the hidden states,
    /// one byte each; bytes no dropped shape makes at an element width read as none.
    #[test]
    fn a_mask_is_its_dropped_tensor_s_elements() {
        let d = dims(&[("h", 256.0), ("f", 1024.0), ("P", 512.0), ("heads", 8.0)]);
        let read = |k: LawKind, u: &str, c: f64| elements(&UnitLaw(vec![(k, u.to_string(), c)]), &d);
        let one = |k: LawKind, u: &str| Some(UnitLaw(vec![(k, u.to_string(), 1.0)]));
        assert_eq!(read(LawKind::Token, "h", 2.0), one(LawKind::Token, "h"));
        assert_eq!(read(LawKind::Token, "h", 4.0), one(LawKind::Token, "h"));
        assert_eq!(read(LawKind::Token, "f", 2.0), one(LawKind::Token, "f"));
        assert_eq!(read(LawKind::TokenPosition, "heads", 4.0), one(LawKind::TokenPosition, "heads"));
        assert_eq!(read(LawKind::Token, "f", 1.0), one(LawKind::Token, "h"));
        assert_eq!(read(LawKind::Token, "P", 2.0), one(LawKind::Token, "h"));
        assert_eq!(read(LawKind::Token, "h", 3.0), None);
        assert_eq!(read(LawKind::Fixed, "h", 2.0), None);
        // A decoder of its own length: its hidden states, and its cross-attention's
        // probabilities (a decoder token and an encoder position).
        assert_eq!(read(LawKind::TargetToken, "h", 4.0), one(LawKind::TargetToken, "h"));
        assert_eq!(read(LawKind::TargetTokenPosition, "heads", 4.0), one(LawKind::TargetTokenPosition, "heads"));
        assert_eq!(read(LawKind::TargetToken, "heads", 4.0), None);
    }

    /// Every dropout noise of every bundled template reads as a dropped shape at an element
    /// width: none is left to the step's activation width.
    #[test]
    fn every_recorded_mask_reads_as_elements() {
        let mut masks = 0;
        for key in keys() {
            let Some(p) = template(key) else { continue };
            for x in p.template.tensors.iter().filter(|x| x.kernel == Kernel::DropoutMask) {
                let law = &p.laws[x.law_index];
                assert!(elements(law, &p.template.dims).is_some(), "{key}: {law:?}");
                masks += 1;
            }
        }
        assert!(masks > 0, "no dropout noise in the bundled templates");
    }

    /// Every dropout of GPT-2's, BERT's and T5's recorded steps keeps its noise as a mask (one
    /// byte an element on a GPU) and its output as dropout's output: no noise is left tagged as
    /// an output, which a GPU plan would keep in the activations' dtype.
    #[test]
    fn cpu_dropout_noise_is_read_as_the_gpu_s_mask() {
        let (mut masks, mut outputs) = (0, 0);
        for key in keys().filter(|k| ["gpt2/", "bert/", "t5/"].iter().any(|f| k.starts_with(f))) {
            let Some(t) = template(key).map(|p| &p.template) else { continue };
            let (mut forward, mut recomputed) = (0, 0);
            // QLoRA's fake recorder names a recomputed dropout as it names the forward's; what a
            // checkpointed step's backward makes is the recomputation. Non-reentrant
            // checkpointing stops recomputing once the last saved tensor is back: a layer's last
            // dropout's noise is saved, its output is not, and is never made again.
            let qlora = key.contains("/qlora-");
            let step1 = t.step1.as_deref().map(|s| &s[t.backward[0].min(s.len())..]).unwrap_or(&[]);
            let in_backward: std::collections::HashSet<u32> = step1
                .iter()
                .chain(&t.step[t.backward[1].min(t.step.len())..])
                .filter(|e| !e.free)
                .map(|e| e.tensor)
                .collect();
            for (i, x) in t.tensors.iter().enumerate() {
                let site = t.sites[x.site as usize].as_str();
                let checkpointed = key.split('/').any(|part| part == "ckpt");
                let recomputation = qlora && checkpointed && in_backward.contains(&(i as u32));
                match x.kernel {
                    Kernel::DropoutMask | Kernel::Dropout if recomputation && site.starts_with("aten::dropout") => {
                        recomputed += usize::from(x.kernel == Kernel::DropoutMask);
                    }
                    // A checkpointed step recorded since the recorder reads the whole chain makes
                    // its recomputed dropouts' noise inside the backward, the site named by the
                    // autograd node whose saved tensors asked for the recomputation.
                    Kernel::DropoutMask
                        if checkpointed
                            && site.starts_with("autograd::engine::evaluate_function: ")
                            && site.ends_with(" > aten::empty_strided") =>
                    {
                        recomputed += 1
                    }
                    Kernel::DropoutMask => {
                        // QLoRA's fake recorder names the operator dispatched (`empty_like`), the
                        // profiler the allocation's leaf beneath it.
                        let noise = if key.contains("/qlora-") { "aten::empty_like" } else { "aten::empty_strided" };
                        assert_eq!(site, format!("aten::dropout > {noise}"), "{key}");
                        forward += 1;
                    }
                    Kernel::Dropout if site.starts_with("aten::dropout") => {
                        assert_eq!(site, "aten::dropout > aten::mul", "{key}: dropout's noise left as its output");
                        outputs += 1;
                    }
                    _ => {}
                }
            }
            // Checkpointing recomputes the dropouts of the layers it checkpoints, no more.
            assert!(recomputed <= forward, "{key}: {recomputed} recomputed masks, {forward} in the forward");
            // QLoRA's recordings of these families run their dropouts (their configs' defaults).
            assert!(!qlora || forward > 0, "{key}: no dropout noise read as a mask");
            masks += forward;
        }
        assert!(masks > 0 && masks == outputs, "{masks} masks, {outputs} outputs");
    }
}
