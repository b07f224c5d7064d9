//! SGLang's memory budget: how its server sizes the KV cache pool at start-up
//! (`ModelRunner.profile_max_num_token` and `init_torch_distributed` in
//! `python/sglang/srt/model_executor/model_runner.py`; the default share in
//! `ServerArgs._handle_gpu_memory_settings`, `python/sglang/srt/server_args.py`).
//!
//! SGLang reads the free memory twice: once the CUDA context and the communicators exist,
//! before the weights, and again after them. The pool takes what the second reading leaves
//! beyond `1 − mem_fraction_static` of the first:
//!
//! ```text
//! pool = free after the weights − (1 − f) × free before = f × free before − weights
//! ```
//!
//! The other `(1 − f)` of the first reading is left for activations and CUDA graphs; no
//! profile run measures them, so a share set too high fails at run time, not at start-up.
//! A token's keys and values take one slot of the pool (pages of one token by default).

use crate::engine::reported_total;
use crate::gpu::GpuSpec;
use crate::parallel::NCCL_BYTES;

const MIB: f64 = (1u64 << 20) as f64;

/// The setting that sizes SGLang's memory (`--mem-fraction-static`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sglang {
    /// The share of the free memory at start-up the weights and the KV pool take together.
    pub mem_fraction_static: f64,
}

impl Sglang {
    /// SGLang's default share on `gpu` with `tensor` GPUs: the device less a reserve for
    /// activations and CUDA graphs, in MiB — 512, 1.5 per token of the chunked prefill, 2 per
    /// sequence of the largest CUDA graph, 128 per tensor-parallel GPU, at least 10 GiB on
    /// parts of more than 60 GiB — with the chunked prefill and the largest graph chosen by
    /// the device's size (2048 and 8 below 20 GiB; 2048 and 24, or 80 from four GPUs, below
    /// 35 GiB; 4096 and 32 or 160 below 60 GiB; 8192 and 256 or 512 below 160 GiB; 16384
    /// and 512 above), rounded to three decimals as SGLang rounds it.
    pub fn defaults(gpu: &GpuSpec, tensor: u64) -> Sglang {
        let mib = reported_total(gpu) / MIB;
        let few = tensor < 4;
        let (chunked_prefill, graph_batch) = if mib < 20.0 * 1024.0 {
            (2048.0, 8.0)
        } else if mib < 35.0 * 1024.0 {
            (2048.0, if few { 24.0 } else { 80.0 })
        } else if mib < 60.0 * 1024.0 {
            (4096.0, if few { 32.0 } else { 160.0 })
        } else if mib < 160.0 * 1024.0 {
            (8192.0, if few { 256.0 } else { 512.0 })
        } else {
            (16384.0, 512.0)
        };
        let mut reserve = 512.0 + chunked_prefill * 1.5 + graph_batch * 2.0 + tensor as f64 / 8.0 * 1024.0;
        if mib > 60.0 * 1024.0 {
            reserve = reserve.max(10.0 * 1024.0);
        }
        Sglang { mem_fraction_static: ((mib - reserve) / mib * 1000.0).round() / 1000.0 }
    }
}

/// What SGLang's first reading finds free: the device as CUDA reports it, less the CUDA
/// context and, between tensor-parallel GPUs, NCCL's communicators.
pub fn free_before_weights(gpu: &GpuSpec, tensor: u64) -> f64 {
    let comm = if tensor > 1 { NCCL_BYTES } else { 0.0 };
    reported_total(gpu) - gpu.arch.cuda_context_bytes() as f64 - comm
}

/// The KV pool for weights of `weights` bytes per GPU; negative when they leave none (SGLang
/// then refuses to start, asking for a larger share).
pub fn pool(s: &Sglang, gpu: &GpuSpec, tensor: u64, weights: f64) -> f64 {
    s.mem_fraction_static * free_before_weights(gpu, tensor) - weights
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::gpu;

    const GIB: f64 = (1u64 << 30) as f64;

    #[test]
    fn the_default_share_follows_the_device_and_the_tensor_parallel_size() {
        // An H100 reports 81,101 MiB: one GPU reserves 512 + 12,288 + 512 + 128 = 13,440 MiB,
        // four reserve 512 + 12,288 + 1,024 + 512 = 14,336 MiB.
        let h100 = gpu("h100-sxm").unwrap();
        assert_eq!(Sglang::defaults(&h100, 1).mem_fraction_static, 0.834);
        assert_eq!(Sglang::defaults(&h100, 4).mem_fraction_static, 0.823);
        // A 24 GB card: 512 + 3,072 + 48 + 128 = 3,760 MiB of 24,330.
        let l4 = gpu("l4").unwrap();
        assert_eq!(Sglang::defaults(&l4, 1).mem_fraction_static, 0.845);
    }

    #[test]
    fn the_pool_is_the_share_of_the_free_memory_less_the_weights() {
        let h100 = gpu("h100-sxm").unwrap();
        let s = Sglang { mem_fraction_static: 0.9 };
        let free = 0.99 * 80.0 * GIB - (625 << 20) as f64; // an H100's context
        assert_eq!(pool(&s, &h100, 1, 16.0 * GIB), 0.9 * free - 16.0 * GIB);
        // Tensor parallelism's communicators come out of the free memory first.
        assert_eq!(pool(&s, &h100, 2, 16.0 * GIB), 0.9 * (free - NCCL_BYTES) - 16.0 * GIB);
        assert!(pool(&s, &h100, 1, 80.0 * GIB) < 0.0);
    }
}
