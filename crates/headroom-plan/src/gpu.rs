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

    /// The CUDA context and the kernels loaded into it: 0.5 GiB on every generation until
    /// measurements per generation and CUDA version replace it (research/estimation.md §4.1).
    pub fn cuda_context_bytes(self) -> u64 {
        512 << 20
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
}

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
    }
}

/// The catalog: name, architecture, GiB, HBM bytes/s, bf16, fp32 and fp8 FLOP/s, GPU link and host link bytes/s.
pub const GPUS: &[GpuSpec] = &[
    spec("v100-16gb", Arch::Volta, 16, 0.90e12, 125e12, 15.7e12, None, 1.5e11, PCIE3),
    spec("v100-32gb", Arch::Volta, 32, 0.90e12, 125e12, 15.7e12, None, 1.5e11, PCIE3),
    spec("t4", Arch::Turing, 16, 0.32e12, 65e12, 8.1e12, None, PCIE3, PCIE3),
    spec("a10", Arch::Ampere, 24, 0.60e12, 125e12, 31.2e12, None, PCIE4, PCIE4),
    spec("l4", Arch::Ada, 24, 0.30e12, 121e12, 30.3e12, Some(242.5e12), PCIE4, PCIE4),
    spec("l40s", Arch::Ada, 48, 0.864e12, 362e12, 91.6e12, Some(733e12), PCIE4, PCIE4),
    spec("a100-40gb", Arch::Ampere, 40, 1.555e12, 312e12, 19.5e12, None, 3e11, PCIE4),
    spec("a100-80gb", Arch::Ampere, 80, 2.039e12, 312e12, 19.5e12, None, 3e11, PCIE4),
    spec("h100-sxm", Arch::Hopper, 80, 3.35e12, 989e12, 67e12, Some(1979e12), 4.5e11, PCIE5),
    spec("h100-pcie", Arch::Hopper, 80, 2.0e12, 756e12, 51e12, Some(1513e12), PCIE5, PCIE5),
    spec("h200", Arch::Hopper, 141, 4.8e12, 989e12, 67e12, Some(1979e12), 4.5e11, PCIE5),
    spec("b200", Arch::Blackwell, 180, 8.0e12, 2250e12, 80e12, Some(4500e12), 9e11, PCIE5),
    spec("rtx-3090", Arch::Ampere, 24, 0.936e12, 71e12, 35.6e12, None, PCIE4, PCIE4),
    spec("rtx-4090", Arch::Ada, 24, 1.008e12, 165.2e12, 82.6e12, Some(330e12), PCIE4, PCIE4),
    spec("mi300x", Arch::Cdna3, 192, 5.3e12, 1307e12, 163.4e12, Some(2615e12), 4.48e11, PCIE5),
];

/// A GPU by name (case, `_` and spaces ignored).
pub fn gpu(name: &str) -> Result<GpuSpec, crate::UnknownGpu> {
    let n = name.to_ascii_lowercase().replace(['_', ' '], "-");
    GPUS.iter().find(|g| g.name == n).copied().ok_or_else(|| crate::UnknownGpu {
        name: name.to_string(),
        known: GPUS.iter().map(|g| g.name).collect::<Vec<_>>().join(", "),
    })
}
