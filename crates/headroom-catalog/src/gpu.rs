//! GPUs: memory, bandwidth and dense tensor throughput (research/estimation.md
//! §6; dense peaks — the sparse figures datasheets print are twice these —,
//! HBM or GDDR bandwidth, GPU and host links). Memory sizes are the
//! nominal ones in GiB; a device reports a little less to `cudaMemGetInfo`.

/// A GPU's architecture: what the software stack keys its choices on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Volta,
    Turing,
    Ampere,
    Ada,
    Hopper,
    Blackwell,
    /// AMD Instinct MI300 (ROCm).
    Cdna3,
}

impl Arch {
    /// The cuBLAS workspace PyTorch allocates per handle and stream: 32 MiB from
    /// compute capability 9.0 (Hopper, Blackwell), 4 MiB before
    /// (`getChosenWorkspaceSize` in aten/src/ATen/cuda/CublasHandlePool.cpp).
    pub fn cublas_workspace_bytes(self) -> u64 {
        match self {
            Arch::Hopper | Arch::Blackwell => 32 << 20,
            _ => 4 << 20,
        }
    }

    /// Whether the tensor cores compute in bf16 (compute capability 8.0 and later, and AMD's
    /// CDNA3): Volta's and Turing's compute only fp16, so bf16 runs on their fp32 units.
    pub fn has_bf16_tensor_cores(self) -> bool {
        !matches!(self, Arch::Volta | Arch::Turing)
    }

    /// The fraction of the dense 16-bit peak a fused attention kernel (flash, or PyTorch's
    /// `scaled_dot_product_attention`) reaches over its forward and backward. Ampere and Ada run
    /// FlashAttention-2, which reaches 50–73% of an A100's peak (Dao 2023, arXiv:2307.08691):
    /// the middle, 60%. On Hopper and later, FlashAttention-2 reaches 35% of an H100 (Shah et
    /// al. 2024, arXiv:2407.08608, the FlashAttention-3 paper), and that is the kernel
    /// PyTorch's SDPA and transformers run there. Volta and Turing have no FlashAttention-2:
    /// PyTorch's memory-efficient kernel, FlashAttention-1's class, 25–40% on an A100: 30%.
    /// AMD's is taken as Hopper's, for want of a measurement.
    pub fn attention_efficiency(self) -> f64 {
        match self {
            Arch::Ampere | Arch::Ada => 0.60,
            Arch::Volta | Arch::Turing => 0.30,
            Arch::Hopper | Arch::Blackwell | Arch::Cdna3 => 0.35,
        }
    }

    /// The same for cuDNN's fused attention, which Transformer Engine (Megatron-LM's
    /// layers) runs, where it is faster than FlashAttention-2: on Hopper, 518 TFLOP/s
    /// forward (causal) and 499 backward of an H100's 989 at 4k tokens and head dim 128 (the
    /// FlashAttention-3 paper's benchmarks, arXiv:2407.08608): 51%. Blackwell is taken as
    /// Hopper, for want of a measurement; elsewhere cuDNN is FlashAttention-2's class.
    pub fn cudnn_attention_efficiency(self) -> f64 {
        match self {
            Arch::Hopper | Arch::Blackwell => 0.51,
            _ => self.attention_efficiency(),
        }
    }

    /// The CUDA context and the kernels loaded into it, with lazy module loading (the
    /// default from CUDA 11.7 and PyTorch 2.0: kernels load when first launched), as measured
    /// per generation: Hopper 0.61 GiB (vLLM's start-up on an H100 finds 78.57 of 79.18 GiB
    /// free: llm-d's logs), Ampere 0.47 GiB (an A100 after its first tensor, PyTorch 2.1.1:
    /// research/estimation.md §4.1); Blackwell is taken as Hopper, and the others, unmeasured,
    /// at 0.5 GiB. Eager loading (older CUDA or PyTorch, or `CUDA_MODULE_LOADING=EAGER`) loads
    /// every kernel at start-up, 0.92 GiB on the same A100 and 1.3 GiB on a V100, and is not
    /// modelled.
    /// What the driver holds of the GPU before any process starts (NVML's used memory at
    /// idle): measured on an H200 (615 MiB, ../shared/gpu/cuda-context.json); A100s and
    /// older report a few MiB.
    pub fn driver_reserved_bytes(self) -> u64 {
        match self {
            Arch::Hopper | Arch::Blackwell => 615 << 20,
            _ => 0,
        }
    }

    /// What a training process holds outside PyTorch's allocator: the CUDA context with
    /// its modules, cuBLAS's and cuDNN's handles. Measured on an H200 with torch 2.11 at the
    /// end of 36 training jobs: 767–783 MiB above the idle reading (NVML's used less
    /// `memory_reserved`); elsewhere the context alone ([`Arch::cuda_context_bytes`]).
    pub fn training_context_bytes(self) -> u64 {
        match self {
            Arch::Hopper | Arch::Blackwell => 775 << 20,
            other => other.cuda_context_bytes(),
        }
    }

    pub fn cuda_context_bytes(self) -> u64 {
        match self {
            Arch::Hopper | Arch::Blackwell => 625 << 20,
            Arch::Ampere => 481 << 20,
            _ => 512 << 20,
        }
    }
}

/// A GPU model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuSpec {
    pub name: &'static str,
    pub arch: Arch,
    pub memory_bytes: u64,
    /// Bytes per second.
    pub bandwidth: f64,
    /// Dense bf16 (or fp16) tensor throughput, FLOP per second.
    pub bf16_flops: f64,
    /// Dense fp32 throughput without TF32 (PyTorch's default for fp32 matmuls).
    pub fp32_flops: f64,
    /// Dense fp8 tensor throughput, on parts that have fp8 tensor cores.
    pub fp8_flops: Option<f64>,
    /// GPU-to-GPU bandwidth per direction, bytes per second (NVLink, or PCIe
    /// for parts without it; research/estimation.md §6 interconnect peaks).
    pub link_bandwidth: f64,
    /// Host link per direction (PCIe 3, 4 or 5 x16), bytes per second.
    pub host_bandwidth: f64,
    /// Streaming multiprocessors (compute units on AMD): how many tiles of a matrix
    /// multiply run at once, so how much of its last wave stands idle.
    pub sms: u32,
    /// The fraction of the dense peak a large, well-shaped bf16 matrix multiply reaches
    /// (see [`MATMUL_EFFICIENCY_DEFAULT`]).
    pub matmul_efficiency: f64,
}

/// What a large bf16 matrix multiply reaches on parts without a measurement: the lowest
/// figure measured on an NVIDIA data-centre part. Measured, "maximum achievable matmul
/// FLOPS" at the best shape found (stas00/ml-engineering, compute/accelerator/README.md,
/// CUDA 12.1–12.5, ROCm 6.2): A100 SXM 267.9 of 312 TFLOP/s (85.9%), A100 PCIe 82.2%,
/// H100 SXM 792.1 of 989 (80.1%), GH200 83.0%, MI300X 781.9 of 1300 (60.1%).
pub const MATMUL_EFFICIENCY_DEFAULT: f64 = 0.80;

const GIB: u64 = 1 << 30;
const PCIE3: f64 = 15.75e9;
const PCIE4: f64 = 31.5e9;
const PCIE5: f64 = 63e9;

#[allow(clippy::too_many_arguments)] // one argument per column of the catalog
const fn spec(
    name: &'static str,
    arch: Arch,
    gib: u64,
    bandwidth: f64,
    bf16_flops: f64,
    fp32_flops: f64,
    fp8_flops: Option<f64>,
    link_bandwidth: f64,
    host_bandwidth: f64,
    sms: u32,
    matmul_efficiency: f64,
) -> GpuSpec {
    GpuSpec {
        name,
        arch,
        memory_bytes: gib * GIB,
        bandwidth,
        bf16_flops,
        fp32_flops,
        fp8_flops,
        link_bandwidth,
        host_bandwidth,
        sms,
        matmul_efficiency,
    }
}

/// The catalog: name, architecture, GiB, HBM bytes/s, bf16, fp32 and fp8 FLOP/s, GPU link and
/// host link bytes/s, SMs (the vendors' datasheets and architecture whitepapers), and the
/// measured matrix-multiply efficiency where there is one (see [`MATMUL_EFFICIENCY_DEFAULT`];
/// H200 takes H100's, its compute die; T4's is its power cap's, below).
pub const GPUS: &[GpuSpec] = &[
    spec("v100-16gb", Arch::Volta, 16, 0.90e12, 125e12, 15.7e12, None, 1.5e11, PCIE3, 80, MATMUL_EFFICIENCY_DEFAULT),
    spec("v100-32gb", Arch::Volta, 32, 0.90e12, 125e12, 15.7e12, None, 1.5e11, PCIE3, 80, MATMUL_EFFICIENCY_DEFAULT),
    // T4: a 4096³ fp16 cuBLAS multiply runs at about 24 of its 65 TFLOP/s, its clocks held
    // down by the 70 W cap (NVIDIA developer forums, "About GPU peak performance", 2023).
    spec("t4", Arch::Turing, 16, 0.32e12, 65e12, 8.1e12, None, PCIE3, PCIE3, 40, 0.37),
    spec("a10", Arch::Ampere, 24, 0.60e12, 125e12, 31.2e12, None, PCIE4, PCIE4, 72, MATMUL_EFFICIENCY_DEFAULT),
    spec("l4", Arch::Ada, 24, 0.30e12, 121e12, 30.3e12, Some(242.5e12), PCIE4, PCIE4, 58, MATMUL_EFFICIENCY_DEFAULT),
    spec("l40s", Arch::Ada, 48, 0.864e12, 362e12, 91.6e12, Some(733e12), PCIE4, PCIE4, 142, MATMUL_EFFICIENCY_DEFAULT),
    spec("a100-40gb", Arch::Ampere, 40, 1.555e12, 312e12, 19.5e12, None, 3e11, PCIE4, 108, 0.859),
    spec("a100-80gb", Arch::Ampere, 80, 2.039e12, 312e12, 19.5e12, None, 3e11, PCIE4, 108, 0.859),
    spec("h100-sxm", Arch::Hopper, 80, 3.35e12, 989e12, 67e12, Some(1979e12), 4.5e11, PCIE5, 132, 0.801),
    spec(
        "h100-pcie",
        Arch::Hopper,
        80,
        2.0e12,
        756e12,
        51e12,
        Some(1513e12),
        PCIE5,
        PCIE5,
        114,
        MATMUL_EFFICIENCY_DEFAULT,
    ),
    spec("h200", Arch::Hopper, 141, 4.8e12, 989e12, 67e12, Some(1979e12), 4.5e11, PCIE5, 132, 0.801),
    spec(
        "b200",
        Arch::Blackwell,
        180,
        8.0e12,
        2250e12,
        80e12,
        Some(4500e12),
        9e11,
        PCIE5,
        148,
        MATMUL_EFFICIENCY_DEFAULT,
    ),
    spec("rtx-3090", Arch::Ampere, 24, 0.936e12, 71e12, 35.6e12, None, PCIE4, PCIE4, 82, MATMUL_EFFICIENCY_DEFAULT),
    spec(
        "rtx-4090",
        Arch::Ada,
        24,
        1.008e12,
        165.2e12,
        82.6e12,
        Some(330e12),
        PCIE4,
        PCIE4,
        128,
        MATMUL_EFFICIENCY_DEFAULT,
    ),
    spec("mi300x", Arch::Cdna3, 192, 5.3e12, 1307e12, 163.4e12, Some(2615e12), 4.48e11, PCIE5, 304, 0.601),
];

/// The catalog, in the order errors list it.
pub fn gpus() -> &'static [GpuSpec] {
    GPUS
}

/// A GPU name not in the catalog, with the names it has.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown GPU `{name}`; known: {known}")]
pub struct UnknownGpu {
    pub name: String,
    pub known: String,
}

/// A GPU by name (case, `_` and spaces ignored).
pub fn gpu(name: &str) -> Result<GpuSpec, UnknownGpu> {
    let n = name.to_ascii_lowercase().replace(['_', ' '], "-");
    GPUS.iter().find(|g| g.name == n).copied().ok_or_else(|| UnknownGpu {
        name: name.to_string(),
        known: GPUS.iter().map(|g| g.name).collect::<Vec<_>>().join(", "),
    })
}
