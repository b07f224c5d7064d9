//! A recorded step's time, from the kernels it recorded ([`crate::recording::Kernel`]): each
//! one timed on the job's GPU by the kernel model ([`crate::kernel`]) — a matrix multiply by its
//! shape and format, attention by the fused kernel routed, every other operator by the bytes it
//! moves, bound by memory — and no shorter than a kernel launched back to back takes
//! ([`KERNEL_FLOOR_S`]). The host issues each one as the time model's host does, at its rate
//! per operator dispatched ([`Host`]: an operator of the forward's or the optimizer's Python,
//! a checkpointed forward's run again in the backward among them, or one the autograd engine
//! dispatches in the backward) for the operators the recorder saw dispatched for it (views
//! among them), and at the engine's rate per scalar read back (the optimizer's step counts, as
//! the time model's optimizer reads them); the GPU runs it once the host has launched it and
//! the one before has finished: what is left of the step beyond the kernels' own time is the
//! GPU waiting for the host (launch).
//!
//! It sees what the recorder saw: the operators of eager PyTorch, one kernel each. Kernels that
//! overlap (streams, communication), CUDA graphs (no launches) and kernels a compiler fuses
//! are not in it.

use super::{Breakdown, Clocks, Host, StepTime, Stretch, HBM_EFFICIENCY, KERNEL_EFFICIENCY, KERNEL_FLOOR_S};
use crate::gpu::GpuSpec;
use crate::kernel::{Dtype, Kernels};
use crate::program::Phase;
use crate::recording::{Kernel, KernelShape};

/// One kernel's time on the GPU, seconds: computing (matrix multiplies, attention) or bound by
/// memory (everything else), at least [`KERNEL_FLOOR_S`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KernelTime {
    pub compute: f64,
    pub memory: f64,
}

/// `k`'s time on `gpu`, with the time model's efficiencies.
pub fn kernel_time(k: &Kernel, gpu: &GpuSpec) -> KernelTime {
    // A kernel in a format the model does not know (integers, booleans) moves its bytes at
    // the width they were counted at; the format matters only to the compute kernels.
    let dtype = k.dtype.unwrap_or(Dtype::Fp32);
    let kn = Kernels { gpu, dtype, hbm_efficiency: HBM_EFFICIENCY, sustained: KERNEL_EFFICIENCY };
    let floor = |t: f64| t.max(KERNEL_FLOOR_S);
    match k.shape {
        KernelShape::Matmul { batch, m, n, k: depth } if k.dtype.is_some() => {
            KernelTime { compute: floor(kn.matmul(batch, m, n, depth)), memory: 0.0 }
        }
        KernelShape::Attention { b, heads, q, k: keys, d, causal, backward } if k.dtype.is_some() => {
            let (f, bw) = kn.flash_attention(b * heads, q, keys, d, causal, gpu.arch.attention_efficiency());
            KernelTime { compute: floor(if backward { bw } else { f }), memory: 0.0 }
        }
        _ => KernelTime { compute: 0.0, memory: floor(kn.memory(k.bytes)) },
    }
}

/// The step of `kernels` (one step's, in the order they ran) on `gpu` with the host `host`; its
/// forward and backward spread over `layers` for the per-layer times. `None` where there are none.
pub fn recorded_step_time(kernels: &[Kernel], gpu: &GpuSpec, host: &Host, layers: f64) -> Option<StepTime> {
    if kernels.is_empty() {
        return None;
    }
    let mut clocks = Clocks::default();
    let mut ends = [0.0f64; 3];
    for (i, phase) in Phase::STEP.into_iter().enumerate() {
        for k in kernels.iter().filter(|k| k.phase == phase) {
            let t = kernel_time(k, gpu);
            let python = phase != Phase::Backward || k.recompute;
            let issue = k.ops * if python { host.python_op } else { host.engine_op } + k.reads * host.engine_op;
            clocks.run(Stretch { n: 1.0, host: issue, compute: t.compute, memory: t.memory });
        }
        ends[i] = clocks.gpu;
    }
    let step = clocks.gpu;
    let Breakdown { compute, memory, .. } = clocks.busy;
    let left = step - compute - memory;
    let launch = if left > 1e-9 * step { left } else { 0.0 };
    let per_layer = layers.max(1.0);
    Some(StepTime {
        step,
        layer_forward: ends[0] / per_layer,
        layer_backward: (ends[1] - ends[0]) / per_layer,
        breakdown: Breakdown { compute, memory, launch, communication: 0.0 },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::gpu;

    fn kernel(phase: Phase, shape: KernelShape, bytes: f64) -> Kernel {
        Kernel {
            step: 2,
            phase,
            name: "aten::x".into(),
            flops: 0.0,
            bytes,
            dtype: Some(Dtype::Bf16),
            shape,
            ops: 1.0,
            reads: 0.0,
            recompute: false,
        }
    }

    /// Kernels long enough that the host is never behind: the step is the sum of the kernel
    /// model's times, split into compute and memory, with no launch.
    #[test]
    fn a_step_of_large_kernels_is_the_sum_of_the_kernel_models_times() {
        let h100 = gpu("h100").unwrap();
        let mm = KernelShape::Matmul { batch: 1.0, m: 16384.0, n: 8192.0, k: 8192.0 };
        let attention = |backward| KernelShape::Attention {
            b: 8.0,
            heads: 32.0,
            q: 4096.0,
            k: 4096.0,
            d: 128.0,
            causal: true,
            backward,
        };
        let ks = [
            kernel(Phase::Forward, mm, 0.0),
            kernel(Phase::Forward, attention(false), 0.0),
            kernel(Phase::Forward, KernelShape::Memory, 4e9),
            kernel(Phase::Backward, attention(true), 0.0),
            kernel(Phase::Backward, mm, 0.0),
            kernel(Phase::OptimizerStep, KernelShape::Memory, 8e9),
        ];
        let t = recorded_step_time(&ks, &h100, &Host::default(), 2.0).unwrap();
        let kn =
            Kernels { gpu: &h100, dtype: Dtype::Bf16, hbm_efficiency: HBM_EFFICIENCY, sustained: KERNEL_EFFICIENCY };
        let (f, b) = kn.flash_attention(256.0, 4096.0, 4096.0, 128.0, true, h100.arch.attention_efficiency());
        let compute = 2.0 * kn.matmul(1.0, 16384.0, 8192.0, 8192.0) + f + b;
        let memory = kn.memory(4e9) + kn.memory(8e9);
        let sum: f64 = ks.iter().map(|k| kernel_time(k, &h100)).map(|t| t.compute + t.memory).sum();
        assert!((sum - (compute + memory)).abs() < 1e-12 * sum, "{sum} {compute} {memory}");
        // The first kernel waits for its launch; every other one is launched while the one
        // before runs.
        let first = Host::default().python_op;
        assert!((t.step - (sum + first)).abs() < 1e-12 * t.step, "{} {sum}", t.step);
        assert!((t.breakdown.compute - compute).abs() < 1e-12 * compute);
        assert!((t.breakdown.memory - memory).abs() < 1e-12 * memory);
        assert!((t.breakdown.launch - first).abs() < 1e-12 * t.step);
        assert!((t.breakdown.total() - t.step).abs() < 1e-12 * t.step);
        assert!(recorded_step_time(&[], &h100, &Host::default(), 2.0).is_none());
    }

    /// A synthetic recording's kernel lines, read and timed: its last step's kernels, each as
    /// the kernel model times it, the step their sum where the host keeps ahead.
    #[test]
    fn a_recordings_kernel_lines_are_timed_by_the_kernel_model() {
        let h100 = gpu("h100").unwrap();
        let text = concat!(
            r#"{"op":"alloc","id":"0 setup weights m","size":4096}"#,
            "\n",
            r#"{"op":"alloc","id":"1 step1.forward activations m.layers.0","size":64}"#,
            "\n",
            r#"{"op":"kernel","at":"step1.forward","name":"aten::mm","flops":1,"bytes":1,"dtype":"bf16","mnk":[8,8,8],"batch":1}"#,
            "\n",
            r#"{"op":"free","id":"1 step1.forward activations m.layers.0"}"#,
            "\n",
            r#"{"op":"alloc","id":"2 step2.forward activations m.layers.0","size":64}"#,
            "\n",
            r#"{"op":"kernel","at":"step2.forward","name":"aten::mm","flops":2.2e12,"bytes":4e8,"dtype":"bf16","mnk":[16384,8192,8192],"batch":1,"ops":3}"#,
            "\n",
            r#"{"op":"kernel","at":"step2.forward","name":"aten::_scaled_dot_product_flash_attention","flops":0,"bytes":1e9,"dtype":"bf16","sdpa":"flash","bhqkd":[8,32,4096,4096,128],"causal":true}"#,
            "\n",
            r#"{"op":"kernel","at":"step2.backward","name":"aten::_scaled_dot_product_flash_attention_backward","flops":0,"bytes":1e9,"dtype":"bf16","sdpa":"flash","bhqkd":[8,32,4096,4096,128],"causal":true}"#,
            "\n",
            r#"{"op":"free","id":"2 step2.forward activations m.layers.0"}"#,
            "\n",
            r#"{"op":"kernel","at":"step2.optimizer","name":"aten::_foreach_add_","flops":0,"bytes":8e9,"dtype":"fp32","reads":2}"#,
            "\n",
        );
        let r = crate::recording::Recording::parse(text.as_bytes(), "k.jsonl").unwrap();
        assert_eq!(r.kernels.len(), 5);
        let ks = r.timed_kernels();
        assert_eq!(ks.len(), 4);
        assert!(ks.iter().all(|k| k.step == 2));
        assert_eq!((ks[0].ops, ks[3].ops, ks[3].reads), (3.0, 1.0, 2.0));
        let kn = |dtype| Kernels { gpu: &h100, dtype, hbm_efficiency: HBM_EFFICIENCY, sustained: KERNEL_EFFICIENCY };
        let (f, b) =
            kn(Dtype::Bf16).flash_attention(256.0, 4096.0, 4096.0, 128.0, true, h100.arch.attention_efficiency());
        let compute = kn(Dtype::Bf16).matmul(1.0, 16384.0, 8192.0, 8192.0) + f + b;
        let memory = kn(Dtype::Fp32).memory(8e9);
        let t = recorded_step_time(ks, &h100, &Host::default(), 1.0).unwrap();
        // The first kernel waits for the host to dispatch its three operators.
        let first = 3.0 * Host::default().python_op;
        assert!((t.step - (compute + memory + first)).abs() < 1e-12 * t.step, "{} {compute} {memory}", t.step);
        assert!((t.breakdown.compute - compute).abs() < 1e-12 * compute);
        assert!((t.breakdown.memory - memory).abs() < 1e-12 * memory);
        assert!(r.describe().ends_with("2 steps, 4 kernels timed)"), "{}", r.describe());
    }

    /// Small kernels wait for the host: the step is the host's issue, the rest launch.
    #[test]
    fn a_step_of_small_kernels_waits_for_the_host() {
        let h100 = gpu("h100").unwrap();
        let ks: Vec<Kernel> = (0..100).map(|_| kernel(Phase::Forward, KernelShape::Memory, 1e3)).collect();
        let t = recorded_step_time(&ks, &h100, &Host::default(), 1.0).unwrap();
        assert_eq!(kernel_time(&ks[0], &h100).memory, KERNEL_FLOOR_S);
        assert!((t.step - (100.0 * Host::default().python_op + KERNEL_FLOOR_S)).abs() < 1e-12);
        assert!((t.breakdown.memory - 100.0 * KERNEL_FLOOR_S).abs() < 1e-12);
        assert!(t.breakdown.launch_bound());
    }
}
