//! GPUs: memory, bandwidth and dense tensor throughput (research/estimation.md
//! §6; dense peaks — the sparse figures datasheets print are twice these —,
//! HBM or GDDR bandwidth, GPU and host links). Memory sizes are the
//! nominal ones in GiB; a device reports a little less to `cudaMemGetInfo`.
//!
//! The catalog is data: `data/gpus.json`, embedded in the binary and read once,
//! holds each GPU's figures with their sources (datasheets, papers, measurements).
//! What depends on the architecture rather than the part — workspaces, attention
//! kernels' efficiency, what lives outside PyTorch's allocator — is [`Arch`]'s.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// A GPU's architecture: what the software stack keys its choices on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
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

/// The catalog, `data/gpus.json` read once, in the order errors list it.
pub fn gpus() -> &'static [GpuSpec] {
    static GPUS: OnceLock<Vec<GpuSpec>> = OnceLock::new();
    GPUS.get_or_init(|| {
        read(include_str!("../../../data/gpus.json")).unwrap_or_else(|e| panic!("the bundled data/gpus.json: {e}"))
    })
}

/// The catalog file: named links, then the GPUs, each figure with its source.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File<'a> {
    #[serde(rename = "about")]
    _about: &'a str,
    #[serde(borrow)]
    links: BTreeMap<&'a str, Link<'a>>,
    #[serde(borrow)]
    gpus: Vec<Row<'a>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Link<'a> {
    bytes_per_second: f64,
    source: &'a str,
}

/// One GPU as the file writes it: links by name, memory in GiB, the measured efficiency
/// (when there is one) beside its source.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Row<'a> {
    name: &'a str,
    arch: Arch,
    memory_gib: u64,
    bandwidth: f64,
    bf16_flops: f64,
    fp32_flops: f64,
    fp8_flops: Option<f64>,
    gpu_link: &'a str,
    host_link: &'a str,
    sms: u32,
    matmul_efficiency: Option<f64>,
    source: &'a str,
    matmul_efficiency_source: Option<&'a str>,
}

/// The catalog from its file, every figure traced to a source and every link to a named one.
fn read(text: &'static str) -> Result<Vec<GpuSpec>, String> {
    let file: File<'static> = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if let Some((name, _)) = file.links.iter().find(|(_, l)| l.source.is_empty()) {
        return Err(format!("link `{name}` has no source"));
    }
    let link = |gpu: &str, name: &str| {
        file.links.get(name).map(|l| l.bytes_per_second).ok_or_else(|| format!("{gpu}: no link named `{name}`"))
    };
    file.gpus
        .iter()
        .map(|r| {
            if r.source.is_empty() {
                return Err(format!("{}: no source for its figures", r.name));
            }
            let matmul_efficiency = match (r.matmul_efficiency, r.matmul_efficiency_source) {
                (Some(e), Some(s)) if !s.is_empty() => e,
                (None, None) => MATMUL_EFFICIENCY_DEFAULT,
                _ => return Err(format!("{}: a matrix-multiply efficiency goes with its source", r.name)),
            };
            Ok(GpuSpec {
                name: r.name,
                arch: r.arch,
                memory_bytes: r.memory_gib << 30,
                bandwidth: r.bandwidth,
                bf16_flops: r.bf16_flops,
                fp32_flops: r.fp32_flops,
                fp8_flops: r.fp8_flops,
                link_bandwidth: link(r.name, r.gpu_link)?,
                host_bandwidth: link(r.name, r.host_link)?,
                sms: r.sms,
                matmul_efficiency,
            })
        })
        .collect()
}

/// A GPU name not in the catalog, with the nearest names and those it has.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown GPU `{name}`; {known}")]
pub struct UnknownGpu {
    pub name: String,
    pub known: String,
}

/// Cloud names for the catalog's GPUs: instance families and machine types (AWS's with
/// their size, `p4d.24xlarge`, or without; GCP's by prefix, `a2-highgpu-8g`), and short
/// names where one GPU is meant. AWS: g4dn T4, g5 A10G (the A10's 24 GB; its step times are
/// the A10's), g6 L4, g6e L40S, p3 V100 16 GB, p3dn V100 32 GB, p4d A100 40 GB, p4de A100
/// 80 GB, p5 H100 SXM, p5e and p5en H200. GCP: a2-highgpu and a2-megagpu A100 40 GB,
/// a2-ultragpu A100 80 GB, a3 H100 SXM, g2 L4.
pub const CLOUD_NAMES: [(&str, &str); 20] = [
    ("a10g", "a10"),
    ("h100", "h100-sxm"),
    ("g4dn", "t4"),
    ("g5", "a10"),
    ("g6", "l4"),
    ("g6e", "l40s"),
    ("p3", "v100-16gb"),
    ("p3dn", "v100-32gb"),
    ("p4d", "a100-40gb"),
    ("p4de", "a100-80gb"),
    ("p5", "h100-sxm"),
    ("p5e", "h200"),
    ("p5en", "h200"),
    ("a2-highgpu", "a100-40gb"),
    ("a2-megagpu", "a100-40gb"),
    ("a2-ultragpu", "a100-80gb"),
    ("a3-highgpu", "h100-sxm"),
    ("a3-megagpu", "h100-sxm"),
    ("a3-edgegpu", "h100-sxm"),
    ("g2-standard", "l4"),
];

/// The catalog's name for a cloud name: `p4d.24xlarge` is `p4d`'s, `a2-highgpu-8g` is
/// `a2-highgpu`'s.
fn cloud_name(n: &str) -> Option<&'static str> {
    let family = n.split('.').next().unwrap_or(n);
    CLOUD_NAMES.iter().find(|(alias, _)| *alias == family || n.starts_with(&format!("{alias}-"))).map(|(_, g)| *g)
}

/// A GPU by name (case, `_` and spaces ignored), or by a cloud name ([`CLOUD_NAMES`]).
pub fn gpu(name: &str) -> Result<GpuSpec, UnknownGpu> {
    let n = name.to_ascii_lowercase().replace(['_', ' '], "-");
    let all = gpus();
    // The catalog's own names first: `h100-pcie` is not the `h100` alias's size.
    let n = if all.iter().any(|g| g.name == n) { n } else { cloud_name(&n).unwrap_or(&n).to_string() };
    all.iter().find(|g| g.name == n).copied().ok_or_else(|| {
        // A family the catalog has in several sizes (`a100`), else the nearest names.
        let sizes: Vec<&str> = all.iter().map(|g| g.name).filter(|g| g.starts_with(&format!("{n}-"))).collect();
        let near = if sizes.is_empty() {
            crate::names::nearest(&n, all.iter().map(|g| g.name).chain(CLOUD_NAMES.iter().map(|(a, _)| *a)))
        } else {
            sizes
        };
        UnknownGpu {
            name: name.to_string(),
            known: format!(
                "{}known: {}",
                crate::names::did_you_mean(&near).trim_start_matches("; ").to_string()
                    + if near.is_empty() { "" } else { " " },
                all.iter().map(|g| g.name).collect::<Vec<_>>().join(", ")
            ),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cloud_name_is_a_gpu_of_the_catalog() {
        for (alias, name) in CLOUD_NAMES {
            assert_eq!(gpu(alias).unwrap().name, name, "{alias}");
        }
        assert_eq!(gpu("P4d.24xlarge").unwrap().name, "a100-40gb");
        assert_eq!(gpu("a3-highgpu-8g").unwrap().name, "h100-sxm");
        let e = gpu("a100").unwrap_err().to_string();
        assert!(e.contains("did you mean `a100-40gb` or `a100-80gb`?"), "{e}");
    }

    const ONE_LINK: &str = r#""about": "", "links": {"pcie4": {"bytes_per_second": 31.5e9, "source": "PCIe 4.0 x16"}}"#;

    fn row(extra: &str) -> String {
        format!(
            r#"{{{ONE_LINK}, "gpus": [{{"name": "x", "arch": "ada", "memory_gib": 24, "bandwidth": 1e12,
            "bf16_flops": 1e14, "fp32_flops": 1e13, "gpu_link": "pcie4", "host_link": "pcie4", "sms": 1{extra}}}]}}"#
        )
    }

    fn read_str(text: String) -> Result<Vec<GpuSpec>, String> {
        read(Box::leak(text.into_boxed_str()))
    }

    #[test]
    fn every_figure_keeps_its_source() {
        let ok = read_str(row(r#", "source": "a datasheet""#)).unwrap();
        assert_eq!((ok[0].memory_bytes, ok[0].link_bandwidth), (24 << 30, 31.5e9));
        assert_eq!(ok[0].matmul_efficiency, MATMUL_EFFICIENCY_DEFAULT);
        let measured = read_str(row(r#", "source": "s", "matmul_efficiency": 0.7, "matmul_efficiency_source": "m""#));
        assert_eq!(measured.unwrap()[0].matmul_efficiency, 0.7);
        for (extra, why) in [
            (r#", "source": """#, "no source for its figures"),
            (r#", "source": "s", "matmul_efficiency": 0.7"#, "goes with its source"),
            (r#", "source": "s", "matmul_efficiency_source": "m""#, "goes with its source"),
        ] {
            let e = read_str(row(extra)).unwrap_err();
            assert!(e.contains(why), "{extra}: {e}");
        }
        let e = read_str(row(r#", "source": "s""#).replace(r#""gpu_link": "pcie4""#, r#""gpu_link": "nvlink9""#));
        assert_eq!(e.unwrap_err(), "x: no link named `nvlink9`");
        let e = read_str(row(r#", "source": "s""#).replace(r#""source": "PCIe 4.0 x16""#, r#""source": """#));
        assert_eq!(e.unwrap_err(), "link `pcie4` has no source");
        let e = read_str(row(r#", "source": "s", "tdp": 70"#)).unwrap_err();
        assert!(e.contains("unknown field `tdp`"), "{e}");
    }

    #[test]
    fn names_are_matched_loosely_and_the_error_lists_the_catalog() {
        assert_eq!(gpu("H100_SXM").unwrap().name, "h100-sxm");
        let e = gpu("h300").unwrap_err().to_string();
        assert!(
            e.starts_with("unknown GPU `h300`; did you mean `h200` or `h100`? known: v100-16gb, v100-32gb, t4,"),
            "{e}"
        );
        let e = gpu("tpu-v5").unwrap_err().to_string();
        assert!(e.starts_with("unknown GPU `tpu-v5`; known: v100-16gb,"), "{e}");
    }
}
