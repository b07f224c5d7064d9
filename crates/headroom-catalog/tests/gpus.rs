//! Every GPU pinned: each figure of each catalog entry, exactly as the catalog had them
//! before it became data, so an edit of data/gpus.json that moves a figure fails here.

use headroom_catalog::gpu::{gpu, gpus, Arch, Arch::*, GpuSpec};

/// name, architecture, memory bytes, bandwidth, bf16, fp32 and fp8 FLOP/s, GPU and host links,
/// SMs, matrix-multiply efficiency.
type Row = (&'static str, Arch, u64, f64, f64, f64, Option<f64>, f64, f64, u32, f64);

#[rustfmt::skip]
const PINNED: [Row; 15] = [
    ("v100-16gb", Volta, 16 << 30, 9e11, 1.25e14, 1.57e13, None, 1.5e11, 1.575e10, 80, 0.8),
    ("v100-32gb", Volta, 32 << 30, 9e11, 1.25e14, 1.57e13, None, 1.5e11, 1.575e10, 80, 0.8),
    ("t4", Turing, 16 << 30, 3.2e11, 6.5e13, 8.1e12, None, 1.575e10, 1.575e10, 40, 0.37),
    ("a10", Ampere, 24 << 30, 6e11, 1.25e14, 3.12e13, None, 3.15e10, 3.15e10, 72, 0.8),
    ("l4", Ada, 24 << 30, 3e11, 1.21e14, 3.03e13, Some(2.425e14), 3.15e10, 3.15e10, 58, 0.8),
    ("l40s", Ada, 48 << 30, 8.64e11, 3.62e14, 9.16e13, Some(7.33e14), 3.15e10, 3.15e10, 142, 0.8),
    ("a100-40gb", Ampere, 40 << 30, 1.555e12, 3.12e14, 1.95e13, None, 3e11, 3.15e10, 108, 0.859),
    ("a100-80gb", Ampere, 80 << 30, 2.039e12, 3.12e14, 1.95e13, None, 3e11, 3.15e10, 108, 0.859),
    ("h100-sxm", Hopper, 80 << 30, 3.35e12, 9.89e14, 6.7e13, Some(1.979e15), 4.5e11, 6.3e10, 132, 0.801),
    ("h100-pcie", Hopper, 80 << 30, 2e12, 7.56e14, 5.1e13, Some(1.513e15), 6.3e10, 6.3e10, 114, 0.8),
    ("h200", Hopper, 141 << 30, 4.8e12, 9.89e14, 6.7e13, Some(1.979e15), 4.5e11, 6.3e10, 132, 0.801),
    ("b200", Blackwell, 180 << 30, 8e12, 2.25e15, 8e13, Some(4.5e15), 9e11, 6.3e10, 148, 0.8),
    ("rtx-3090", Ampere, 24 << 30, 9.36e11, 7.1e13, 3.56e13, None, 3.15e10, 3.15e10, 82, 0.8),
    ("rtx-4090", Ada, 24 << 30, 1.008e12, 1.652e14, 8.26e13, Some(3.3e14), 3.15e10, 3.15e10, 128, 0.8),
    ("mi300x", Cdna3, 192 << 30, 5.3e12, 1.307e15, 1.634e14, Some(2.615e15), 4.48e11, 6.3e10, 304, 0.601),
];

fn row(g: &GpuSpec) -> Row {
    (
        g.name,
        g.arch,
        g.memory_bytes,
        g.bandwidth,
        g.bf16_flops,
        g.fp32_flops,
        g.fp8_flops,
        g.link_bandwidth,
        g.host_bandwidth,
        g.sms,
        g.matmul_efficiency,
    )
}

#[test]
fn every_gpu_keeps_its_figures() {
    let all: Vec<Row> = gpus().iter().map(row).collect();
    assert_eq!(all, PINNED, "the catalog, in the order errors list it");
    for want in PINNED {
        assert_eq!(row(&gpu(want.0).unwrap()), want);
    }
}
