//! What DeepSpeed's ZeRO engine keeps on each GPU beyond the model states' shards, at its
//! default settings (`DeepSpeedZeroConfig`; deepspeed/runtime/zero/stage3.py,
//! stage_1_and_2.py, partitioned_param_coordinator.py and partition_parameters.py):
//!
//! - the gradient bucket: `reduce_bucket_size` (5e8) elements of the parameters' dtype, one
//!   flat buffer the gradients are copied into before they are reduced (and, with the
//!   optimizer offloaded, sent to the host). ZeRO-3 allocates it when the optimizer is built
//!   (`contiguous_gradients`, on by default), ZeRO-1 and -2 at every backward; its size does
//!   not depend on the model's, so a LoRA job pays it whole;
//! - ZeRO-3's persistent parameters: tensors of at most `stage3_param_persistence_threshold`
//!   (1e5) elements are never partitioned — norms, biases, small LoRA adapters — so they stay
//!   whole on every GPU, offload or not;
//! - ZeRO-3's gathered parameters: a module's parameters are gathered before it runs and
//!   released after, unless the recorded trace of the step uses them again within
//!   `stage3_max_reuse_distance` (1e9) elements of parameters fetched in between. At the
//!   turn from the forward to the backward, a module with `a` elements of parameters after
//!   it in the forward is used again after `2a` (the rest of the forward, then the backward
//!   back to it): every module with fewer than 5e8 elements after it is still gathered —
//!   the head and the last layers, or a large head alone. The prefetcher fetches
//!   `stage3_prefetch_bucket_size` (5e7) elements more at every module's fetch — containers,
//!   dropouts and norms included, several a linear layer — so it runs ahead of the forward
//!   until the gathered parameters reach `stage3_max_live_parameters` (1e9), whole tensors
//!   (`fetch_sub_module`: at most `max_live - n_available` a call). Simulating the
//!   coordinator of DeepSpeed 0.8.0 over the module trace of peft's T0_3B, mt0-xxl and
//!   bloomz-7b1 (LoRA on q and v) holds 1.007e9, 1.024e9 and 1.028e9 elements at the turn:
//!   the tail kept for reuse, then prefetched tensors up to the live cap.
//!
//! Hugging Face's Trainer replaces some of these defaults with "auto" values derived from
//! the hidden size; the plan models DeepSpeed's own, which Accelerate's generated configs keep.

use crate::job::{Finetune, Offload, Precision, TrainConfig};
use crate::model::{Family, Head, Model};

/// `reduce_bucket_size`: elements of the gradient bucket.
pub const REDUCE_BUCKET_SIZE: f64 = 5e8;
/// `stage3_prefetch_bucket_size`: elements fetched ahead of the running module.
pub const PREFETCH_BUCKET_SIZE: f64 = 5e7;
/// `stage3_max_reuse_distance`: parameters fetched before a released one would be used again.
pub const MAX_REUSE_DISTANCE: f64 = 1e9;
/// `stage3_max_live_parameters`: the prefetcher gathers no more while this many are gathered.
pub const MAX_LIVE_PARAMETERS: f64 = 1e9;
/// `stage3_param_persistence_threshold`: tensors this small are never partitioned.
pub const PARAM_PERSISTENCE_THRESHOLD: u64 = 100_000;

/// What DeepSpeed holds on one GPU beside the model states, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ZeroBuffers {
    /// The gradient bucket.
    pub reduce_bucket: f64,
    /// ZeRO-3's parameters gathered at the turn from forward to backward, and the prefetch
    /// beyond them: what exceeds the GPU's own shard.
    pub gathered: f64,
    /// ZeRO-3's persistent parameters: on the GPU whole even with the parameters offloaded.
    pub persistent: f64,
}

/// The parameter tensors DeepSpeed gathers (those above the persistence threshold), as
/// elements, in the order the forward uses them: the embeddings, each layer's linear layers
/// (T5's decoder blocks with their cross-attention), the head. Norms, biases and relative
/// position tables stay whole, and are left out.
pub fn forward_tensors(model: &Model, head: Head) -> Vec<u64> {
    let (h, v) = (model.hidden, model.vocab);
    let mut out = vec![v * h];
    if matches!(model.family, Family::Gpt2 | Family::Bert) {
        out.push(model.max_position * h);
    }
    let linears: Vec<u64> = model.block_linears().iter().map(|&(i, o)| i * o).collect();
    let q = model.heads * model.head_dim;
    let encoder_layers = model.layers - model.decoder_layers.min(model.layers);
    for layer in 0..model.layers {
        if model.family == Family::T5 && layer == encoder_layers {
            // T5's decoder embeds its input again with the shared table.
            out.push(v * h);
        }
        out.extend_from_slice(&linears[..4]);
        if model.family == Family::T5 && layer >= encoder_layers {
            out.extend_from_slice(&[h * q, h * q, h * q, q * h]);
        }
        out.extend_from_slice(&linears[4..]);
    }
    match (model.family, head) {
        (Family::Bert, _) => out.push(h * h),
        (_, Head::SeqCls) => {}
        _ => out.push(v * h),
    }
    out.retain(|&n| n > PARAM_PERSISTENCE_THRESHOLD);
    out
}

/// Elements gathered at the turn from forward to backward under the default reuse distance
/// and prefetch: the trailing tensors with fewer than half the reuse distance after them,
/// then the backward's next tensors while fewer than the live cap are gathered (whole
/// tensors, as the prefetcher fetches them, a bucket at each of the many fetches before the
/// turn; none once the tail alone reaches the cap).
pub fn gathered_at_turn(forward: &[u64]) -> f64 {
    let mut after = 0.0;
    let mut held = 0.0;
    let mut rest = forward.iter().rev().map(|&n| n as f64).peekable();
    while let Some(&n) = rest.peek() {
        if 2.0 * after >= MAX_REUSE_DISTANCE {
            break;
        }
        held += n;
        after += n;
        rest.next();
    }
    let mut prefetched = 0.0;
    for n in rest {
        if held + prefetched >= MAX_LIVE_PARAMETERS {
            break;
        }
        prefetched += n;
    }
    held + prefetched
}

/// Elements gathered at most during the forward, and the tensor being fetched then. The
/// prefetcher fetches whole tensors while fewer than the live cap are gathered, so the one
/// that crosses the cap is fetched whole: where it is a 1e9-element head (mt0-xxl's,
/// BLOOM's), the forward holds the cap and the head — about twice the turn's — a few layers
/// before its end (mt0-xxl's decoder block 20 of 24, bloomz-7b1's layer 25 of 30). Each
/// window starts at the tensor running and runs to the first that reaches the cap.
pub fn gathered_in_forward(forward: &[u64]) -> (f64, f64) {
    // Each window's total is largest at its end (sizes are not negative), and a later
    // window ends no earlier: one pass with two ends. The search screens every ZeRO-3
    // configuration through this.
    let n = |k: usize| forward[k] as f64;
    let (mut best, mut fetched) = (0.0f64, 0.0f64);
    let (mut end, mut held) = (0usize, 0.0f64);
    for i in 0..forward.len() {
        if end < i {
            end = i;
            held = 0.0;
        }
        // Extend to the first tensor that brings the window to the cap.
        while end < forward.len() && held < MAX_LIVE_PARAMETERS {
            held += n(end);
            end += 1;
        }
        let last = n(end - 1);
        if held > best || (held == best && last > fetched) {
            (best, fetched) = (held, last);
        }
        held -= n(i);
    }
    (best, fetched)
}

/// Elements of the parameters DeepSpeed never partitions: everything but the gathered
/// tensors, and LoRA's adapters where they are small enough.
fn persistent_params(model: &Model, cfg: &TrainConfig, forward: &[u64]) -> f64 {
    // The forward uses the embedding table again as a tied head, and T5's decoder embeds with
    // the encoder's table: count each table once.
    let lm_head = model.family == Family::T5 || (model.family != Family::Bert && cfg.head != Head::SeqCls);
    let uses = 1 + u64::from(model.family == Family::T5) + u64::from(lm_head);
    let tables = 1 + u64::from(lm_head && !model.tied_embeddings);
    let gathered = forward.iter().sum::<u64>().saturating_sub((uses - tables) * model.vocab * model.hidden);
    let base = model.params_with(cfg.head).saturating_sub(gathered) as f64;
    let adapters = match cfg.finetune {
        Finetune::Full => 0.0,
        Finetune::Lora { rank, targets, .. } => {
            let small = |n: u64| if n <= PARAM_PERSISTENCE_THRESHOLD { n } else { 0 };
            targets.adapters(model, cfg.head).iter().map(|&(i, o)| small(rank * i) + small(rank * o)).sum::<u64>()
                as f64
        }
    };
    base + adapters
}

/// DeepSpeed's buffers for this job on one GPU. `width` is the bytes per element of the
/// parameters it gathers (the frozen base's under LoRA); the gradient bucket takes the dtype
/// of the parameters it trains (fp32 without mixed precision, 16 bits with).
pub fn buffers(model: &Model, cfg: &TrainConfig, width: f64) -> ZeroBuffers {
    let par = &cfg.parallel;
    if par.zero_stage == 0 {
        return ZeroBuffers::default();
    }
    let grad_width = match cfg.precision {
        Precision::Fp32 | Precision::Amp => 4.0,
        _ => 2.0,
    };
    let reduce_bucket = REDUCE_BUCKET_SIZE * grad_width;
    if par.zero_stage < 3 {
        return ZeroBuffers { reduce_bucket, ..ZeroBuffers::default() };
    }
    let forward = forward_tensors(model, cfg.head);
    let t = par.tensor.max(1) as f64;
    // A gathered tensor is a new buffer beside the GPU's shard, except on one GPU with the
    // parameters kept there: the one partition is the whole tensor, gathered in place.
    let d = par.shard_degree() as f64;
    let gathered = if cfg.offload == Offload::OptimizerAndParams || d > 1.0 {
        // The forward's moment, where the prefetcher fetched a tensor past the cap: with the
        // parameters offloaded, a fetch first copies the host partition to the GPU
        // (`ds_tensor.to(cuda)`, the whole tensor on one GPU) and gathers from it, so the
        // fetched tensor is there twice. It is counted beside the whole forward's
        // activations, which a few layers before the forward's end is a slight excess.
        let (forward_peak, fetched) = gathered_in_forward(&forward);
        let copy = if cfg.offload == Offload::OptimizerAndParams { fetched / d } else { 0.0 };
        gathered_at_turn(&forward).max(forward_peak + copy) * width / t
    } else {
        0.0
    };
    let persistent = persistent_params(model, cfg, &forward) * width / t;
    ZeroBuffers { reduce_bucket, gathered, persistent }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::preset;

    #[test]
    fn the_turn_keeps_the_tail_within_half_the_reuse_distance() {
        // Twenty tensors of 1e8: the last five have fewer than 5e8 after them (4e8 ... 0),
        // the sixth from the end has exactly 5e8 (used again after 1e9: released); the
        // prefetcher then fetches the backward's next tensors until 1e9 are live — five more,
        // not the one a single bucket of 5e7 would take.
        let t = vec![100_000_000u64; 20];
        assert_eq!(gathered_at_turn(&t), 1e9);
        // Tensors that do not divide the cap: the one that crosses it is fetched whole.
        let odd = vec![300_000_000u64; 10];
        assert_eq!(gathered_at_turn(&odd), 6e8 + 6e8);
        // A head larger than the reuse distance is kept alone (nothing is fetched between its
        // forward and its backward), and the last layer's tensors are released; with the live
        // cap reached, the prefetcher fetches nothing more.
        let big = [60_000_000, 60_000_000, 1_000_000_000];
        assert_eq!(gathered_at_turn(&big), 1e9);
        // A small model is kept whole.
        assert_eq!(gathered_at_turn(&[3_000_000, 4_000_000]), 7e6);
    }

    #[test]
    fn the_turn_holds_what_deepspeeds_coordinator_holds() {
        // DeepSpeed 0.8.0's PartitionedParameterCoordinator simulated over the module trace
        // of peft's LoRA models (q and v, r = 8; 8 × 64 tokens): the elements gathered at
        // the first fetch of the backward.
        for (name, simulated) in [("t0-3b", 1.007e9), ("mt0-xxl", 1.024e9), ("bloom-7b1", 1.028e9)] {
            let m = preset(name).unwrap();
            let turn = gathered_at_turn(&forward_tensors(&m, Head::CausalLm));
            assert!((turn / simulated - 1.0).abs() < 0.02, "{name}: {turn:e} vs {simulated:e}");
        }
    }

    #[test]
    fn the_forward_holds_the_cap_and_the_tensor_that_crosses_it() {
        // The same simulation's most gathered during the forward: the cap and the head,
        // fetched whole while the cap was not yet reached.
        for (name, simulated) in [("mt0-xxl", 2.014e9), ("bloom-7b1", 1.984e9)] {
            let m = preset(name).unwrap();
            let (most, fetched) = gathered_in_forward(&forward_tensors(&m, Head::CausalLm));
            assert!((most / simulated - 1.0).abs() < 0.02, "{name}: {most:e} vs {simulated:e}");
            assert_eq!(fetched, (m.vocab * m.hidden) as f64, "{name}: the head is the tensor fetched");
        }
        // Tensors far below the cap: the forward never holds more than the cap and one more.
        let t = vec![100_000_000u64; 20];
        assert_eq!(gathered_in_forward(&t), (1e9, 1e8));
    }

    #[test]
    fn t0_3b_tensors_follow_the_stacks() {
        let m = preset("t0-3b").unwrap();
        let f = forward_tensors(&m, Head::CausalLm);
        // Embedding, 24 encoder blocks of 7 tensors, the decoder's embedding, 24 decoder
        // blocks of 11, the head.
        assert_eq!(f.len(), 1 + 24 * 7 + 1 + 24 * 11 + 1);
        // Their sum (the shared table counted twice) is every parameter but the norms (two an
        // encoder block, three a decoder block, one after each stack) and the relative
        // position tables.
        let small = m.params() + m.vocab * m.hidden - f.iter().sum::<u64>();
        assert_eq!(small, (24 * 2 + 24 * 3 + 2) * m.hidden + 2 * 32 * m.heads);
    }
}
