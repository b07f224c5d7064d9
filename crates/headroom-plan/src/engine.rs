//! vLLM's memory budget: how its engine sizes the KV cache pool at start-up
//! (`Worker.determine_available_memory` in `vllm/v1/worker/gpu_worker.py`;
//! research/estimation.md §3.3).
//!
//! vLLM does not size the cache for the requests it will serve. It loads the
//! weights, runs one dummy step at its limits (`profile_run`: a forward of
//! `max_num_batched_tokens` tokens, then the sampler over `max_num_seqs`
//! rows), and gives the KV cache everything left of `gpu_memory_utilization`
//! of the device:
//!
//! ```text
//! kv pool = utilization × total − weights − profile peak − non-torch memory
//! ```
//!
//! The profile's peak is usually the sampler's, not the forward's: its
//! PyTorch path sorts every row's logits over the whole vocabulary, so a
//! thousand rows of a 150,000-token vocabulary hold gigabytes for a moment.
//! A request is served if the pool holds its sequence in whole blocks; the
//! engine refuses to start when it cannot hold one sequence of
//! `max_model_len` tokens.

use crate::gpu::GpuSpec;
use crate::model::Model;

const GIB: f64 = (1u64 << 30) as f64;

/// The settings that size vLLM's memory (`vllm serve` flags of the same names).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Engine {
    /// The share of the device's memory the engine may use, the CUDA context aside.
    pub gpu_memory_utilization: f64,
    /// Tokens in one step: the dummy forward's length.
    pub max_num_batched_tokens: u64,
    /// Sequences in one step: the dummy sampler's rows.
    pub max_num_seqs: u64,
    /// Tokens per KV block (`--block-size`).
    pub block_size: u64,
}

impl Engine {
    /// `vllm serve`'s defaults on `gpu` (`EngineArgs.get_batch_defaults` in
    /// `vllm/engine/arg_utils.py`): 8,192 tokens and 1,024 sequences a step on GPUs of
    /// 70 GiB or more other than the A100 (PR #17885 measured the larger budget slower
    /// there), 2,048 tokens and 256 sequences elsewhere; utilization 0.9, blocks of 16.
    pub fn vllm_defaults(gpu: &GpuSpec) -> Engine {
        let large = gpu.memory_bytes as f64 >= 70.0 * GIB && !gpu.name.starts_with("a100");
        Engine {
            gpu_memory_utilization: 0.9,
            max_num_batched_tokens: if large { 8192 } else { 2048 },
            max_num_seqs: if large { 1024 } else { 256 },
            block_size: 16,
        }
    }
}

/// The device's total as CUDA reports it, which vLLM's budget is a share of: 99% of the
/// nominal size (an "80 GB" A100 or H100 reports 79.2 GiB, a 16 GB part 15.77 GiB;
/// research/estimation.md, Units).
pub fn reported_total(gpu: &GpuSpec) -> f64 {
    gpu.memory_bytes as f64 * 0.99
}

/// Memory the engine uses outside PyTorch's allocator once the context exists (cuBLAS,
/// NCCL's buffers between tensor-parallel GPUs), as vLLM's start-up log reports it: 0.13
/// GiB on one H100 and 0.55 GiB on each of two (llm-d's vLLM logs, the Llama-3.1-8B and
/// Llama-3.3-70B-FP8 runs: the two rows this is set from).
pub fn non_torch_bytes(tensor: u64) -> f64 {
    if tensor > 1 {
        0.55 * GIB
    } else {
        0.13 * GIB
    }
}

/// Bytes a sampler row holds per vocabulary entry at the sampler's peak, in vLLM's
/// PyTorch-native top-k/top-p path (`apply_top_k_top_p` in
/// `vllm/v1/sample/ops/topk_topp_sampler.py`, which the dummy run takes: it sets top-k and
/// top-p on every row). At the sort: the logits in the model's dtype (2) and in fp32 (4),
/// the sort's sorted values (4) and int64 indices (8), the indices it sorts (8), and the
/// radix sort's alternate key and value buffers (4 + 8).
pub const SAMPLER_BYTES_PER_LOGIT: f64 = 2.0 + 4.0 + 4.0 + 8.0 + 8.0 + 12.0;

/// The dummy step's activation peak on one GPU: the larger of the forward's (at its
/// widest, the MLP: the hidden state and the residual, the gate and up projections and
/// their product, in bf16; a mixture of experts holds its top-k experts' copies of them)
/// and the sampler's, with the forward's output still held.
pub fn profile_peak(model: &Model, engine: &Engine, tensor: u64) -> f64 {
    let t = tensor.max(1) as f64;
    let tokens = engine.max_num_batched_tokens as f64;
    let h = model.hidden as f64;
    let inter = model.intermediate as f64 / t;
    let mlp = if model.experts > 1 {
        // fused_moe's three caches: [tokens, k, 2I], [tokens·k, I] and [tokens, k, h].
        model.experts_per_token as f64 * (3.0 * inter + h)
    } else if model.gated_mlp {
        3.0 * inter
    } else {
        2.0 * inter
    };
    let forward = 2.0 * tokens * (2.0 * h + mlp);
    let rows = engine.max_num_seqs.min(engine.max_num_batched_tokens) as f64;
    let sampler = 2.0 * tokens * h + SAMPLER_BYTES_PER_LOGIT * rows * model.vocab as f64;
    forward.max(sampler)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::gpu;
    use crate::model::preset;

    #[test]
    fn defaults_follow_the_gpu() {
        let h100 = Engine::vllm_defaults(&gpu("h100-sxm").unwrap());
        assert_eq!((h100.max_num_batched_tokens, h100.max_num_seqs), (8192, 1024));
        let a100 = Engine::vllm_defaults(&gpu("a100-80gb").unwrap());
        assert_eq!((a100.max_num_batched_tokens, a100.max_num_seqs), (2048, 256));
        let l4 = Engine::vllm_defaults(&gpu("l4").unwrap());
        assert_eq!((l4.max_num_batched_tokens, l4.max_num_seqs), (2048, 256));
    }

    #[test]
    fn the_sampler_sets_the_peak_at_vllms_defaults() {
        let m = preset("llama-3.1-8b").unwrap();
        let e = Engine::vllm_defaults(&gpu("h100-sxm").unwrap());
        // 1,024 rows × 128,256 entries × 38 bytes, and the forward's 8,192 × 4,096 bf16 output.
        let want = 1024.0 * 128256.0 * 38.0 + 2.0 * 8192.0 * 4096.0;
        assert_eq!(profile_peak(&m, &e, 1), want);
        // One row: the forward's MLP at 8,192 tokens is the peak.
        let one = Engine { max_num_seqs: 1, ..e };
        assert_eq!(profile_peak(&m, &one, 1), 2.0 * 8192.0 * (2.0 * 4096.0 + 3.0 * 14336.0));
    }
}
