//! GPUs: memory, bandwidth and dense tensor throughput (research/estimation.md
//! §6; dense bf16/fp16 peaks, HBM or GDDR bandwidth). Memory sizes are the
//! nominal ones in GiB; a device reports a little less to `cudaMemGetInfo`.

/// A GPU model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuSpec {
    pub name: &'static str,
    pub memory_bytes: u64,
    /// Bytes per second.
    pub bandwidth: f64,
    /// Dense bf16 (or fp16) tensor throughput, FLOP per second.
    pub bf16_flops: f64,
    /// GPU-to-GPU bandwidth per direction, bytes per second (NVLink, or PCIe
    /// for parts without it; research/estimation.md §6 interconnect peaks).
    pub link_bandwidth: f64,
}

const GIB: u64 = 1 << 30;

/// The catalog.
pub const GPUS: &[GpuSpec] = &[
    GpuSpec {
        name: "v100-16gb",
        memory_bytes: 16 * GIB,
        bandwidth: 0.90e12,
        bf16_flops: 125e12,
        link_bandwidth: 1.5e11,
    },
    GpuSpec {
        name: "v100-32gb",
        memory_bytes: 32 * GIB,
        bandwidth: 0.90e12,
        bf16_flops: 125e12,
        link_bandwidth: 1.5e11,
    },
    GpuSpec { name: "t4", memory_bytes: 16 * GIB, bandwidth: 0.32e12, bf16_flops: 65e12, link_bandwidth: 1.575e10 },
    GpuSpec { name: "a10", memory_bytes: 24 * GIB, bandwidth: 0.60e12, bf16_flops: 125e12, link_bandwidth: 3.15e10 },
    GpuSpec { name: "l4", memory_bytes: 24 * GIB, bandwidth: 0.30e12, bf16_flops: 121e12, link_bandwidth: 3.15e10 },
    GpuSpec { name: "l40s", memory_bytes: 48 * GIB, bandwidth: 0.864e12, bf16_flops: 362e12, link_bandwidth: 3.15e10 },
    GpuSpec {
        name: "a100-40gb",
        memory_bytes: 40 * GIB,
        bandwidth: 1.555e12,
        bf16_flops: 312e12,
        link_bandwidth: 3e11,
    },
    GpuSpec {
        name: "a100-80gb",
        memory_bytes: 80 * GIB,
        bandwidth: 2.039e12,
        bf16_flops: 312e12,
        link_bandwidth: 3e11,
    },
    GpuSpec {
        name: "h100-sxm",
        memory_bytes: 80 * GIB,
        bandwidth: 3.35e12,
        bf16_flops: 989e12,
        link_bandwidth: 4.5e11,
    },
    GpuSpec {
        name: "h100-pcie",
        memory_bytes: 80 * GIB,
        bandwidth: 2.0e12,
        bf16_flops: 756e12,
        link_bandwidth: 6.3e10,
    },
    GpuSpec { name: "h200", memory_bytes: 141 * GIB, bandwidth: 4.8e12, bf16_flops: 989e12, link_bandwidth: 4.5e11 },
    GpuSpec { name: "b200", memory_bytes: 180 * GIB, bandwidth: 8.0e12, bf16_flops: 2250e12, link_bandwidth: 9e11 },
    GpuSpec {
        name: "rtx-3090",
        memory_bytes: 24 * GIB,
        bandwidth: 0.936e12,
        bf16_flops: 71e12,
        link_bandwidth: 3.15e10,
    },
    GpuSpec {
        name: "rtx-4090",
        memory_bytes: 24 * GIB,
        bandwidth: 1.008e12,
        bf16_flops: 165.2e12,
        link_bandwidth: 3.15e10,
    },
    GpuSpec {
        name: "mi300x",
        memory_bytes: 192 * GIB,
        bandwidth: 5.3e12,
        bf16_flops: 1307e12,
        link_bandwidth: 4.48e11,
    },
];

/// A GPU by name (case, `_` and spaces ignored).
pub fn gpu(name: &str) -> Result<GpuSpec, String> {
    let n = name.to_ascii_lowercase().replace(['_', ' '], "-");
    GPUS.iter().find(|g| g.name == n).copied().ok_or_else(|| {
        format!("unknown GPU `{name}`; known: {}", GPUS.iter().map(|g| g.name).collect::<Vec<_>>().join(", "))
    })
}
