//! How long one kernel runs on one GPU, by class of operation: a matrix multiply by
//! its shape and precision, attention by the kernel that computes it, and a
//! memory-bound op (a norm, an activation, a residual add, the loss) by the bytes
//! it moves. The training step's time ([`crate::time`]) is built from these.
//!
//! The efficiencies are published measurements, named where they are defined
//! ([`crate::gpu::GpuSpec::matmul_efficiency`],
//! [`crate::gpu::Arch::attention_efficiency`]; a part without one takes a measured
//! part's), and one constant is tuned ([`Kernels::sustained`]); the shapes do the rest. A matrix
//! multiply is split into output tiles that run one per SM in waves: a multiply
//! whose tiles fill 3.5 waves runs as long as one that fills 4, and that, not
//! one efficiency for every width, is why a 4,096-wide layer sharded eight ways
//! reaches less of the peak than a 25,600-wide one.

use crate::gpu::GpuSpec;

/// The numeric format a kernel computes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    /// fp32 without TF32: PyTorch's default for fp32 matrix multiplies.
    Fp32,
    /// 16-bit tensor cores, bf16 where the part has them and fp16 where it does not
    /// (mixed precision and autocast run fp16 on Volta and Turing).
    Half,
    /// bf16 itself: every tensor bf16, with no fp16 to fall back on.
    Bf16,
    /// fp8 tensor cores (Transformer Engine, torchao), where the part has them.
    Fp8,
}

impl Dtype {
    /// Bytes per element.
    pub fn bytes(self) -> f64 {
        match self {
            Dtype::Fp32 => 4.0,
            Dtype::Half | Dtype::Bf16 => 2.0,
            Dtype::Fp8 => 1.0,
        }
    }

    /// The fraction of its peak a large multiply in this format reaches: the part's
    /// measured tensor-core figure, or [`FP32_MATMUL_EFFICIENCY`] for PyTorch's fp32
    /// multiplies on the fp32 units.
    pub fn matmul_efficiency(self, gpu: &GpuSpec) -> f64 {
        match self {
            Dtype::Fp32 => FP32_MATMUL_EFFICIENCY,
            _ => gpu.matmul_efficiency,
        }
    }

    /// The dense peak of this format's matrix units, FLOP per second.
    pub fn peak(self, gpu: &GpuSpec) -> f64 {
        match self {
            Dtype::Fp32 => gpu.fp32_flops,
            Dtype::Half => gpu.bf16_flops,
            // bf16 tensor-core instructions start with compute capability 8.0 (PTX's
            // `mma` with `.bf16` needs sm_80): before, bf16 multiplies run on the fp32 units.
            Dtype::Bf16 if !gpu.arch.has_bf16_tensor_cores() => gpu.fp32_flops,
            Dtype::Bf16 => gpu.bf16_flops,
            Dtype::Fp8 => gpu.fp8_flops.unwrap_or(gpu.bf16_flops),
        }
    }
}

/// What cuBLAS's SGEMM reaches of the fp32 units' peak on a large multiply: 10.18 of
/// 11.34 TFLOP/s (89.8%) at 4096³ on a GTX 1080 Ti (zkh2016/sgemm's README). The fp32
/// units are simpler to keep fed than the tensor cores, whose best is 80–86%
/// ([`crate::gpu::MATMUL_EFFICIENCY_DEFAULT`]).
pub const FP32_MATMUL_EFFICIENCY: f64 = 0.90;

/// Output tiles of cuBLAS's kernels for large multiplies; its heuristics choose per
/// shape, so a shape is timed with whichever of these leaves the least idle.
const TILES: [(u64, u64); 3] = [(256, 128), (128, 256), (128, 128)];

/// Kernel times on one GPU in one format.
#[derive(Clone, Copy, Debug)]
pub struct Kernels<'a> {
    pub gpu: &'a GpuSpec,
    pub dtype: Dtype,
    /// Fraction of the HBM bandwidth a memory-bound kernel reaches.
    pub hbm_efficiency: f64,
    /// The fraction of its speed alone that a kernel keeps among others in a real
    /// step (launch gaps, clocks under sustained load, caches shared): 1 for a kernel
    /// timed alone, as the efficiencies above were measured.
    pub sustained: f64,
}

impl Kernels<'_> {
    /// The fraction of the SMs' tile slots a multiply with an `m`×`n` output (`batch`
    /// of them) over a `k`-long sum keeps busy: its output padded to whole tiles (tile
    /// quantization), the tiles run one per SM in waves, the last wave part empty (wave
    /// quantization). A dimension smaller than a tile gets a tile its own size, down to
    /// 16 (cuBLAS has kernels that narrow); fewer tiles than SMs split the sum across
    /// them (split-K), in pieces of at least 256.
    pub fn occupancy(&self, batch: f64, m: f64, n: f64, k: f64) -> f64 {
        // In integers: the search times hundreds of thousands of layers, and a float
        // ceil is a library call on the baseline x86-64 target. Saturating: a shape no GPU
        // could hold must still get an answer, not an overflow.
        let sms = u64::from(self.gpu.sms.max(1));
        let whole = |x: f64| x.max(0.0).ceil() as u64;
        let (batch_i, m_i, n_i) = (whole(batch), whole(m), whole(n));
        let pieces = (whole(k) / 256).max(1);
        let useful = batch * m * n;
        // A dimension below the tile gets a tile of the next power of two, at least 16.
        let narrow = |dim: u64, tile: u64| if dim >= tile { tile } else { dim.max(16).next_power_of_two().min(tile) };
        TILES
            .iter()
            .map(|&(tm, tn)| {
                let (tm, tn) = (narrow(m_i, tm), narrow(n_i, tn));
                let tiles = batch_i.saturating_mul(m_i.div_ceil(tm)).saturating_mul(n_i.div_ceil(tn));
                let split = (sms / tiles.max(1)).min(pieces).max(1);
                let waves = tiles.saturating_mul(split).div_ceil(sms);
                let slots = waves as f64 * (sms * tm * tn) as f64;
                (useful * split as f64 / slots).min(1.0)
            })
            .fold(0.0, f64::max)
    }

    /// Seconds of `batch` multiplies of an `m`×`k` matrix by a `k`×`n` one: at the
    /// part's measured efficiency times the occupancy, or as long as moving the
    /// operands and the result takes, whichever is longer.
    pub fn matmul(&self, batch: f64, m: f64, n: f64, k: f64) -> f64 {
        if batch <= 0.0 || m <= 0.0 || n <= 0.0 || k <= 0.0 {
            return 0.0;
        }
        let flops = 2.0 * batch * m * n * k;
        let rate = self.dtype.peak(self.gpu)
            * self.dtype.matmul_efficiency(self.gpu)
            * self.occupancy(batch, m, n, k)
            * self.sustained;
        let bytes = batch * (m * k + k * n + m * n) * self.dtype.bytes();
        (flops / rate).max(self.memory(bytes))
    }

    /// Seconds of a kernel bound by memory that reads and writes `bytes`.
    pub fn memory(&self, bytes: f64) -> f64 {
        bytes / (self.gpu.bandwidth * self.hbm_efficiency * self.sustained)
    }

    /// Seconds of a fused attention kernel's forward and its backward: `heads`
    /// (batch × heads) of `queries` positions against `keys`, `head_dim` wide, at
    /// `efficiency` of the peak ([`crate::gpu::Arch::attention_efficiency`] for
    /// FlashAttention-2's class). A causal kernel skips the masked half. The backward does
    /// 2.5 times the forward's work (five matrix multiplies to its two: Dao 2023, §3.1).
    pub fn flash_attention(
        &self,
        heads: f64,
        queries: f64,
        keys: f64,
        head_dim: f64,
        causal: bool,
        efficiency: f64,
    ) -> (f64, f64) {
        let flops = 4.0 * heads * queries * keys * head_dim * if causal { 0.5 } else { 1.0 };
        // No flash kernel computes in fp8 under the training stacks modelled here.
        let peak = if self.dtype == Dtype::Fp8 { Dtype::Half.peak(self.gpu) } else { self.dtype.peak(self.gpu) };
        let forward = flops / (peak * efficiency * self.sustained);
        (forward, 2.5 * forward)
    }

    /// Seconds of attention that materialises the scores: the scores and the weighted
    /// sum as batched multiplies, and a softmax that reads and writes every score (its
    /// backward reads the probabilities and their gradient and writes one). The
    /// backward multiplies twice the forward's.
    pub fn eager_attention(&self, heads: f64, queries: f64, keys: f64, head_dim: f64) -> (f64, f64) {
        let products = self.matmul(heads, queries, keys, head_dim) + self.matmul(heads, queries, head_dim, keys);
        let scores = heads * queries * keys * self.dtype.bytes();
        (products + self.memory(2.0 * scores), 2.0 * products + self.memory(3.0 * scores))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::gpu;

    fn a100() -> GpuSpec {
        gpu("a100-80gb").unwrap()
    }

    #[test]
    fn a_large_multiply_runs_at_the_measured_efficiency() {
        let g = a100();
        let k = Kernels { gpu: &g, dtype: Dtype::Half, hbm_efficiency: 0.9, sustained: 1.0 };
        let n = 8192.0;
        let rate = 2.0 * n * n * n / k.matmul(1.0, n, n, n);
        // 2,048 tiles in 19 waves of 108: 99.8% busy, at 85.9% of 312 TFLOP/s.
        assert!((rate / 312e12 - 0.859 * 2048.0 / 2052.0).abs() < 1e-9, "{rate}");
        // The same work as 8 products of a quarter the width runs no faster.
        assert!(k.matmul(8.0, n / 2.0, n / 4.0, n) >= k.matmul(1.0, n, n, n));
    }

    #[test]
    fn bf16_without_its_tensor_cores_runs_at_the_fp32_rate() {
        let v100 = gpu("v100-32gb").unwrap();
        let k = |dtype| Kernels { gpu: &v100, dtype, hbm_efficiency: 0.9, sustained: 1.0 };
        let n = 8192.0;
        // fp16 on Volta's tensor cores; bf16 on its CUDA cores, 8x slower.
        let ratio = k(Dtype::Bf16).matmul(1.0, n, n, n) / k(Dtype::Half).matmul(1.0, n, n, n);
        assert!((ratio - v100.bf16_flops / v100.fp32_flops).abs() < 1e-9, "{ratio}");
        // Ampere has them: the same rate either way.
        let g = a100();
        let k = |dtype| Kernels { gpu: &g, dtype, hbm_efficiency: 0.9, sustained: 1.0 };
        assert_eq!(k(Dtype::Bf16).matmul(1.0, n, n, n), k(Dtype::Half).matmul(1.0, n, n, n));
    }

    #[test]
    fn a_thin_multiply_is_bound_by_memory() {
        let g = a100();
        let k = Kernels { gpu: &g, dtype: Dtype::Half, hbm_efficiency: 0.9, sustained: 1.0 };
        // A matrix-vector product reads the matrix once: 2 × 4096² bytes.
        let t = k.matmul(1.0, 1.0, 4096.0, 4096.0);
        assert_eq!(t, k.memory(2.0 * (4096.0 + 4096.0 * 4096.0 + 4096.0)));
        assert_eq!(k.matmul(1.0, 0.0, 4096.0, 4096.0), 0.0);
    }

    #[test]
    fn causal_flash_attention_skips_half_and_its_backward_does_more() {
        let g = a100();
        let k = Kernels { gpu: &g, dtype: Dtype::Half, hbm_efficiency: 0.9, sustained: 1.0 };
        let e = g.arch.attention_efficiency();
        let (f, b) = k.flash_attention(32.0, 4096.0, 4096.0, 128.0, false, e);
        let (fc, bc) = k.flash_attention(32.0, 4096.0, 4096.0, 128.0, true, e);
        assert_eq!(fc * 2.0, f);
        assert_eq!(b, 2.5 * f);
        assert_eq!(bc, 2.5 * fc);
        // 4·32·4096²·128 FLOPs at 60% of 312 TFLOP/s.
        assert!((f - 4.0 * 32.0 * 4096.0 * 4096.0 * 128.0 / (312e12 * 0.6)).abs() < 1e-12);
        // Materialising the scores costs more than the fused kernel at this length.
        assert!(k.eager_attention(32.0, 4096.0, 4096.0, 128.0).0 > fc);
    }

    #[test]
    fn occupancy_counts_tiles_and_waves() {
        let g = a100();
        let k = Kernels { gpu: &g, dtype: Dtype::Half, hbm_efficiency: 0.9, sustained: 1.0 };
        // 108 tiles of 256×128 fill one wave of 108 SMs exactly.
        assert_eq!(k.occupancy(1.0, 256.0 * 108.0, 128.0, 4096.0), 1.0);
        // One row of tiles more: 109 tiles of 256×128 take a second wave almost empty
        // (50%); as 218 tiles of 128×128 they fill 3 waves of 108 better (67%).
        let over = k.occupancy(1.0, 256.0 * 109.0, 128.0, 4096.0);
        assert!((over - 218.0 / 324.0).abs() < 1e-12, "{over}");
        // 200 rows fill two 128-row tiles to 78%; a short sum cannot be split: 2 SMs of 108.
        assert_eq!(k.occupancy(1.0, 200.0, 128.0, 256.0), 200.0 / 128.0 / 108.0);
        // A long one is split over the idle SMs.
        assert_eq!(k.occupancy(1.0, 256.0, 128.0, 1e6), 1.0);
        // Shapes no GPU could hold get an answer, not an overflow.
        for x in [1e19, 1e30, f64::MAX, f64::INFINITY] {
            let o = k.occupancy(x, x, x, x);
            assert!((0.0..=1.0).contains(&o), "{x}: {o}");
            assert!(k.matmul(x, x, x, x) >= 0.0);
        }
    }
}
