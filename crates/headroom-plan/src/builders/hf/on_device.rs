//! A model built from its config on the GPU ([`TrainConfig::built_on_device`]: transformers'
//! `from_config` under `torch.device("cuda")`). Each module makes its parameters where it is
//! constructed, so a tied model's output layer, an `nn.Linear` constructed after the rest of
//! the model, makes a weight of its own after the model's last weight, and `tie_weights` frees
//! it as it points the layer at the embedding's. `from_pretrained` builds the model on the meta
//! device and loads the weights into it: no such weight. On an H200 (torch 2.11, transformers
//! 5.17) Llama-1B's, 525,336,576 B in bf16, was made and freed so before the first step
//! (docs/VALIDATION.md, "Llama-1B's checkpointed reserved rows, segment by segment"); it is
//! gone before the step, but the segment it made stays cached and takes the weights made
//! after it, which moves where the step's later segments fall.
//!
//! [`TrainConfig::built_on_device`]: crate::job::TrainConfig::built_on_device

use crate::program::{Law, Op, Program, Term};

/// The output layer's own weight (`law`: the embedding's), made after the last weight the
/// setup made so far and freed at once. `p` holds the setup alone.
pub(super) fn tied_head_made_and_freed(p: &mut Program, law: Law) {
    let last_weight =
        p.ops.iter().rposition(|op| matches!(*op, Op::Alloc(t) if p.tensors[t as usize].term == Term::Weights));
    let Some(at) = last_weight else { return };
    let site = p.site("nn.Linear: the tied output layer's own weight, freed by tie_weights");
    let id = p.tensor(law, Term::Weights, site);
    p.ops.splice(at + 1..at + 1, [Op::Alloc(id), Op::Free(id)]);
}
