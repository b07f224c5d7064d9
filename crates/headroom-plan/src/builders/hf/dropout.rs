//! A step without dropout replayed from one recorded with it. `F.dropout` at a rate of 0 (or in
//! eval mode) returns its input itself, and no backward node stands for it, so the gradient
//! passes through: each dropout output the recording made (forward or backward,
//! [`TensorT::source`](crate::program_template::TensorT::source)) is, in the replay, the tensor
//! it consumed, alive until both the recorded input and output would have been freed. What
//! saved the output saves the input in its place: T5's `wo` saves the MLP's dropped-out
//! activation, and without dropout the activation itself, which then lives to the backward.

use super::Concrete;
use rustc_hash::FxHashMap as HashMap;

/// A template tensor's instance: (tensor, concrete layer).
type Instance = (u32, Option<Concrete>);

#[derive(Default)]
pub(super) struct PassedThrough {
    /// A dropout output's instance → the instance it is.
    output: HashMap<Instance, Instance>,
    /// An input's instance → how many outputs it stands for, and whether its own free came.
    held: HashMap<Instance, (u32, bool)>,
}

impl PassedThrough {
    /// The instance `inst` is: its input where it is a dropout's output.
    pub(super) fn resolve(&self, inst: Instance) -> Instance {
        self.output.get(&inst).copied().unwrap_or(inst)
    }

    /// Dropout's output `out` is `input` itself (resolved with [`Self::resolve`]).
    pub(super) fn pass(&mut self, out: Instance, input: Instance) {
        self.output.insert(out, input);
        self.held.entry(input).or_insert((0, false)).0 += 1;
    }

    /// A recorded free of `inst`: the instance to free now, if any — none while a dropout's
    /// output that is it is still alive, the input once the last of them is freed after it.
    pub(super) fn free(&mut self, inst: Instance) -> Option<Instance> {
        if let Some(input) = self.output.remove(&inst) {
            let (count, freed) = self.held.get_mut(&input)?;
            *count -= 1;
            if *count > 0 {
                return None;
            }
            let freed = *freed;
            self.held.remove(&input);
            return freed.then_some(input);
        }
        match self.held.get_mut(&inst) {
            Some((_, freed)) => {
                *freed = true;
                None
            }
            None => Some(inst),
        }
    }

    /// Whether `inst` stands for a dropout output not freed yet that `outlives` says is
    /// never freed in the step.
    pub(super) fn stands_for(&self, inst: Instance, outlives: impl Fn(u32) -> bool) -> bool {
        self.output.iter().any(|(out, input)| *input == inst && outlives(out.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An input freed before its dropout's output lives until the output's free; one freed
    /// after it, at its own; an output of an output stands for the first input.
    #[test]
    fn an_input_lives_as_long_as_the_outputs_that_are_it() {
        let (a, d, d2, b, e) = ((1, None), (2, None), (3, None), (4, None), (5, None));
        let mut p = PassedThrough::default();
        p.pass(d, p.resolve(a));
        p.pass(d2, p.resolve(d));
        assert_eq!(p.free(a), None);
        assert_eq!(p.free(d), None);
        assert_eq!(p.free(d2), Some(a));
        p.pass(e, p.resolve(b));
        assert_eq!(p.free(e), None);
        assert_eq!(p.free(b), Some(b));
        assert_eq!(p.free((9, None)), Some((9, None)));
    }

    /// CUDA's fused dropout keeps a bool mask: every dropout of GPT-2 medium at 8 × 888 tokens
    /// keeps 7,274,496 bytes (one a hidden element) on an H200 in bf16, fp32 and under
    /// autocast, where the embeddings' dropout takes an fp32 input (`../shared/gpu/snapshots/
    /// native-gpt2-medium-b8`: its `dropout_cuda` masks, the embeddings' and each block's,
    /// are all 7,274,496 bytes).
    #[test]
    fn a_gpu_keeps_one_byte_a_dropped_element_whatever_its_dtype() {
        use super::super::*;
        use crate::job::Optimizer;
        let model = crate::model::preset("gpt2-medium").expect("preset");
        let h200 = crate::gpu::gpu("h200").expect("gpu");
        for precision in [Precision::Amp, Precision::Bf16, Precision::Fp32] {
            let cfg =
                TrainConfig { attention: Attention::Sdpa, ..TrainConfig::new(8, 888, precision, Optimizer::AdamW) };
            let p = program(&model, &cfg, Device::Gpu(&h200), 1, &StateScale::default()).expect("a template").program;
            let masks = super::super::tests::sizes_at(&p, 8, 888, |site| site == "aten::dropout > aten::empty_strided");
            // The embeddings' and two a block.
            assert_eq!(masks.len(), 1 + 2 * model.layers as usize, "{precision:?}");
            assert!(masks.iter().all(|&b| b == 7_274_496), "{precision:?}: {masks:?}");
        }
    }
}
