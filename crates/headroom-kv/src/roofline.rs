//! Step time of one batched forward pass, from FLOPs and bytes against the
//! GPU's ceilings (the roofline). Efficiencies are the measured anchors of
//! research/estimation.md §8.6: FasterTransformer's 13B decode ran at 76% of
//! peak HBM bandwidth and its prefill at ~68% of peak FLOPs on an A100.
//! (The planner's fuller model will replace this one.)

use crate::catalog::{GpuSpec, ModelSpec};

/// Fraction of peak FLOPs reached by the batched matmuls.
pub const COMPUTE_EFFICIENCY: f64 = 0.68;
/// Fraction of peak bandwidth reached when streaming weights and KV.
pub const BANDWIDTH_EFFICIENCY: f64 = 0.76;

/// What one step computes: for each scheduled request, the new tokens and
/// the context they attend to (tokens already in the KV cache plus themselves).
#[derive(Clone, Copy, Debug, Default)]
pub struct StepWork {
    pub new_tokens: u64,
    /// Σ over scheduled requests of new_tokens × context length (attention score work).
    pub attention_token_pairs: u64,
    /// Σ over scheduled requests of the context length read from the KV cache.
    pub kv_tokens_read: u64,
}

/// Seconds for one step with bf16 weights and KV.
pub fn step_time(model: &ModelSpec, gpu: &GpuSpec, w: &StepWork) -> f64 {
    if w.new_tokens == 0 {
        return 0.0;
    }
    let matmul_flops = 2.0 * model.active_params() as f64 * w.new_tokens as f64;
    // QK^T and PV: 2 matmuls × 2 FLOP per multiply-add, per layer, over heads × head_dim.
    let attn_flops = 4.0 * (model.layers * model.heads * model.head_dim) as f64 * w.attention_token_pairs as f64;
    let compute = (matmul_flops + attn_flops) / (gpu.bf16_flops * COMPUTE_EFFICIENCY);
    let bytes = 2.0 * model.params() as f64 + w.kv_tokens_read as f64 * model.kv_bytes_per_token(2.0);
    let memory = bytes / (gpu.bandwidth * BANDWIDTH_EFFICIENCY);
    compute.max(memory)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{gpu, model};

    #[test]
    fn decode_is_bandwidth_bound_and_prefill_compute_bound() {
        let m = model("llama-2-13b").unwrap();
        let g = gpu("a100-40gb").unwrap();
        // One sequence decoding: weights dominate, ~22 ms (FasterTransformer measured 22.0 ms/token).
        let decode = step_time(&m, &g, &StepWork { new_tokens: 1, attention_token_pairs: 512, kv_tokens_read: 512 });
        assert!((0.020..0.025).contains(&decode), "{decode}");
        // A 512-token prefill: compute bound, ~63 ms measured.
        let prefill =
            step_time(&m, &g, &StepWork { new_tokens: 512, attention_token_pairs: 512 * 512 / 2, kv_tokens_read: 512 });
        assert!((0.055..0.075).contains(&prefill), "{prefill}");
    }
}
