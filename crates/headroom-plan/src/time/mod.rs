//! The step time (see the parent module): each layer's kernels by class — matrix
//! multiplies by shape, attention by kernel, memory-bound ops by the bytes they move
//! ([`crate::kernel`]) — forward, backward and what checkpointing recomputes; then the
//! pipeline bubble, exposed collectives, the optimizer step or its offload.
//!
//! Where transformers' eager code runs the job (one replica per GPU, not compiled), the
//! step is also what the host can issue: every operator the code dispatches costs the CPU
//! its interpreter, dispatcher and launch, and the GPU cannot run a kernel before it is
//! launched. The operators, kernels and memory-bound bytes of each family's step are
//! recorded ([`crate::eager`]); the host's rate is [`Host`]'s. The host and the GPU run
//! the step's stretches in order (the layers' forwards, the head and loss, their
//! backwards, the layers' backwards, the optimizer), the GPU starting each kernel when the
//! host has launched it and the one before has finished: a stretch of small kernels takes
//! the host's time, one of large kernels the GPU's, and what the host does ahead hides
//! under what the GPU still runs.

use crate::eager;
use crate::gpu::{Arch, GpuSpec};
use crate::job::{Attention, Checkpointing, Finetune, Framework, Job, PipelineStage, Precision, TrainConfig};
use crate::kernel::{Dtype, Kernels};
use crate::model::{Head, Model};
use crate::parallel;

mod optimizer;
pub mod recorded;
use crate::placement::{main_grads_fp32, share, state_bytes_per_param};
use optimizer::optimizer_time;

pub use crate::placement::{forward_flops, ForwardFlops};

/// How fast the host issues transformers' eager step: seconds per operator it dispatches.
/// Fitted on the dev grid's tuning rows (the twelve bf16 jobs on an H200 with torch 2.11
/// and transformers 5.17, `crates/headroom-plan/tests/step_time.rs`). A forward operator
/// carries the model's Python around it — its module's call, transformers' wrappers, the
/// binding — and costs tens of µs; an operator the autograd engine dispatches from C++
/// costs little more than its launch (2–5 µs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Host {
    /// An operator the model's Python code calls: the forward, a checkpointed layer's
    /// recomputed forward, the optimizer's Python.
    pub python_op: f64,
    /// An operator the autograd engine calls in the backward (C++, no interpreter).
    pub engine_op: f64,
    /// One call of non-reentrant checkpointing's hooks (Python): each tensor a checkpointed
    /// layer saves is packed in the forward, packed again when the backward recomputes the
    /// layer and unpacked for its backward.
    pub checkpoint_hook: f64,
}

impl Default for Host {
    fn default() -> Self {
        Host { python_op: 38e-6, engine_op: 2.5e-6, checkpoint_hook: 20e-6 }
    }
}

/// The least a kernel takes on the GPU, launched back to back with others: its blocks
/// scheduled, run and retired, however little it computes (about 2 µs on current parts).
pub const KERNEL_FLOOR_S: f64 = 2e-6;

/// Where a step's time goes: they add up to the step time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Breakdown {
    /// The GPU computing: matrix multiplies and attention kernels.
    pub compute: f64,
    /// The GPU bound by memory: norms, activations, residual adds, casts, the loss's
    /// passes over the logits, embeddings, gradient accumulation and the optimizer step.
    pub memory: f64,
    /// The GPU idle, waiting for the host to launch its next kernel.
    pub launch: f64,
    /// Collectives, pipeline sends and host transfers not hidden under compute.
    pub communication: f64,
}

/// A part of the step time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeTerm {
    Compute,
    Memory,
    Launch,
    Communication,
}

crate::names::named!(TimeTerm {
    Compute => ("compute", "the GPU computing matrix multiplies and attention"),
    Memory => ("memory-bound", "the GPU bound by memory: norms, activations, casts, the loss, the optimizer step"),
    Launch => ("launch", "the GPU idle, waiting for the host to launch kernels"),
    Communication => ("communication", "collectives and transfers not hidden under compute"),
});

impl Breakdown {
    pub fn total(&self) -> f64 {
        self.compute + self.memory + self.launch + self.communication
    }

    /// The largest part.
    pub fn dominant(&self) -> TimeTerm {
        [
            (TimeTerm::Compute, self.compute),
            (TimeTerm::Memory, self.memory),
            (TimeTerm::Launch, self.launch),
            (TimeTerm::Communication, self.communication),
        ]
        .into_iter()
        .fold((TimeTerm::Compute, f64::MIN), |best, t| if t.1 > best.1 { t } else { best })
        .0
    }

    /// Whether the GPU waits on the host more than it computes or moves memory: a larger
    /// micro-batch, CUDA graphs or `torch.compile` (fewer, fused kernels) would run it faster.
    pub fn launch_bound(&self) -> bool {
        self.dominant() == TimeTerm::Launch
    }
}

/// One layer's kernels for one micro-batch on one GPU, seconds, by class of operation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LayerTimes {
    pub linear: Pass,
    pub attention: Pass,
    /// Norms, residual adds, the MLP's activation: bound by memory.
    pub elementwise: Pass,
}

/// A kernel class's forward and backward.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pass {
    pub forward: f64,
    pub backward: f64,
}

/// The format the step's kernels compute in.
fn dtype(precision: Precision) -> Dtype {
    match precision {
        Precision::Fp32 => Dtype::Fp32,
        Precision::Fp8 => Dtype::Fp8,
        Precision::Bf16 => Dtype::Bf16,
        Precision::Mixed | Precision::Amp => Dtype::Half,
    }
}

/// The step's kernels: in its format, at the rate kernels reach back to back in a step.
fn kernels<'a>(gpu: &'a GpuSpec, cfg: &TrainConfig) -> Kernels<'a> {
    Kernels { gpu, dtype: dtype(cfg.precision), hbm_efficiency: HBM_EFFICIENCY, sustained: KERNEL_EFFICIENCY }
}

/// The fraction of their speed alone that a training step's kernels keep back to back (launch
/// gaps, sustained clocks): tuned on Korthikanti et al.'s per-layer times (Table 4) and checked
/// on every other published step time (docs/VALIDATION.md).
pub const KERNEL_EFFICIENCY: f64 = 0.82;

/// Fraction of the HBM bandwidth a memory-bound kernel (the optimizer step) reaches
/// (llm-analysis's default).
pub const HBM_EFFICIENCY: f64 = 0.9;

/// Parameters a CPU optimizer step updates per second, per GPU's share (DeepSpeed CPU-Adam).
pub const HOST_OPTIMIZER_PARAMS_PER_S: f64 = 1e9;

/// A matrix multiply of `tokens` rows by a `k`×`n` weight: its forward, and its
/// backward — the input's gradient (`tokens`×`n` by `n`×`k`) and, unless the weight is
/// frozen, the weight's (`k`×`tokens` by `tokens`×`n`).
fn linear(kn: &Kernels, tokens: f64, k: f64, n: f64, frozen: bool) -> Pass {
    let input_grad = kn.matmul(1.0, tokens, k, n);
    let weight_grad = if frozen { 0.0 } else { kn.matmul(1.0, k, n, tokens) };
    Pass { forward: kn.matmul(1.0, tokens, n, k), backward: input_grad + weight_grad }
}

/// The kernel PyTorch's `scaled_dot_product_attention` runs for transformers' SDPA path
/// on a CUDA GPU (research/sdpa-backends.md): a fused kernel (flash, cuDNN or, on parts
/// without flash, the memory-efficient one) for 16-bit inputs; for fp32 the memory-efficient
/// kernel, unless the keys and values are grouped — transformers then passes
/// `enable_gqa`, which PyTorch 2.11's memory-efficient kernel does not take — and the
/// composite math path runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SdpaKernel {
    Fused,
    MemoryEfficient,
    Math,
}

pub fn sdpa_kernel(model: &Model, gpu: &GpuSpec, precision: Precision) -> SdpaKernel {
    match precision {
        Precision::Fp32 if model.kv_heads < model.heads => SdpaKernel::Math,
        Precision::Fp32 => SdpaKernel::MemoryEfficient,
        _ if matches!(gpu.arch, Arch::Volta | Arch::Turing) => SdpaKernel::MemoryEfficient,
        _ => SdpaKernel::Fused,
    }
}

/// The math path's kernels, forward and backward: the query scaled, the causal mask built
/// and turned additive, the keys and values repeated per query head, the keys scaled, the
/// scores multiplied, masked, `_safe_softmax` (softmax, a test for rows all masked, a
/// `where`), the weighted sum; the backward is each one's gradient.
const MATH_KERNELS: Pass = Pass { forward: 14.0, backward: 12.0 };
/// Passes over the scores (batch × heads × s × s at the query's width) the math path
/// makes: forward, the product written, the mask added in place, softmax read and
/// written, `_safe_softmax`'s test and `where`, the weighted sum reading it; backward, the
/// probabilities' gradient written and the probabilities read twice, softmax's backward
/// reading two and writing one, the scores' gradient read by both products.
const MATH_SCORE_PASSES: Pass = Pass { forward: 9.75, backward: 8.0 };

/// One transformer layer's kernels on one GPU (tensor-parallel shards of `t`, the
/// sequence split over `c` context-parallel ranks), forward and backward.
pub fn layer_times(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig, transformers: bool) -> LayerTimes {
    let par = &cfg.parallel;
    let (t, c) = (par.tensor.max(1) as f64, par.context.max(1) as f64);
    let kn = kernels(gpu, cfg);
    let eb = kn.dtype.bytes();
    let frozen = matches!(cfg.finetune, Finetune::Lora { .. });
    let (h, f) = (model.hidden as f64, model.intermediate as f64);
    let (q, kv) = ((model.heads * model.head_dim) as f64, (model.kv_heads * model.head_dim) as f64);
    let tokens = cfg.micro_batch as f64 * cfg.seq as f64 / c;
    let add = |a: Pass, b: Pass| Pass { forward: a.forward + b.forward, backward: a.backward + b.backward };
    // Query, key and value in one column-parallel multiply, the output projection row-parallel.
    let mut lin = add(linear(&kn, tokens, h, (q + 2.0 * kv) / t, frozen), linear(&kn, tokens, q / t, h, frozen));
    // Each expert sees its share of the tokens; a dense MLP is one expert that sees them all.
    let experts = model.experts.max(1) as f64;
    let expert_tokens = tokens * model.experts_per_token.max(1) as f64 / experts;
    let up = if model.gated_mlp { 2.0 * f } else { f };
    let mlp = add(linear(&kn, expert_tokens, h, up / t, frozen), linear(&kn, expert_tokens, f / t, h, frozen));
    lin = add(lin, Pass { forward: experts * mlp.forward, backward: experts * mlp.backward });

    let heads = cfg.micro_batch as f64 * model.heads as f64 / t;
    let (s, d) = (cfg.seq as f64, model.head_dim as f64);
    // Decoders mask the future; encoders (BERT, T5's encoder) attend both ways.
    let causal = model.decoder_layers == model.layers;
    // Megatron-LM's layers are Transformer Engine's, whose fused attention is cuDNN's;
    // PyTorch's SDPA and transformers run FlashAttention-2's class.
    let fused = if cfg.framework == Framework::Megatron {
        gpu.arch.cudnn_attention_efficiency()
    } else {
        gpu.arch.attention_efficiency()
    };
    let (forward, backward) = match cfg.attention {
        Attention::Eager => kn.eager_attention(heads, s / c, s, d),
        Attention::Sdpa if eager_step(model, cfg, transformers).is_some() => {
            match sdpa_kernel(model, gpu, cfg.precision) {
                SdpaKernel::Math => {
                    // Every product whole (the mask is added, not skipped), at the query's width.
                    let products = kn.matmul(heads, s, s, d) + kn.matmul(heads, s, d, s);
                    let scores = heads * s * s * eb;
                    (
                        products + kn.memory(MATH_SCORE_PASSES.forward * scores),
                        2.0 * products + kn.memory(MATH_SCORE_PASSES.backward * scores),
                    )
                }
                _ => kn.flash_attention(heads, s / c, s, d, causal, fused),
            }
        }
        Attention::Sdpa | Attention::Flash => kn.flash_attention(heads, s / c, s, d, causal, fused),
    };
    let attention = Pass { forward, backward };

    // Two norms (each reads and writes the hidden state) and two residual adds (each
    // reads two and writes one) per layer, on every token of the tensor-parallel group
    // unless sequence parallelism shards them; the activation reads the MLP's up
    // projection (both halves when gated) and writes one. A backward moves twice the
    // bytes: the output's gradient and the saved input read, the input's gradient written.
    let sp = if par.sequence_parallel { t } else { 1.0 };
    let hidden_passes = 2.0 * 2.0 + 2.0 * 3.0;
    let activation_passes = if model.gated_mlp { 3.0 } else { 2.0 };
    let bytes = eb
        * (tokens / sp * h * hidden_passes
            + tokens * model.experts_per_token.max(1) as f64 * f / t * activation_passes);
    let elementwise = Pass { forward: kn.memory(bytes), backward: kn.memory(2.0 * bytes) };
    LayerTimes { linear: lin, attention, elementwise }
}

/// The output layer and the loss for one micro-batch: the logits' multiply, and the
/// loss's passes over the logits (upcast, log-softmax, its gradient and the downcast:
/// 14 bytes a logit each way, as the transformers loss the memory model counts moves them).
fn head_times(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig) -> (Pass, Pass) {
    let par = &cfg.parallel;
    let (t, c) = (par.tensor.max(1) as f64, par.context.max(1) as f64);
    let kn = kernels(gpu, cfg);
    let tokens = cfg.micro_batch as f64 * cfg.seq as f64 / c;
    let outputs = match cfg.head {
        Head::SeqCls => return (Pass::default(), Pass::default()),
        Head::CausalLm | Head::MaskedLm => model.vocab as f64 / t,
    };
    let frozen = matches!(cfg.finetune, Finetune::Lora { .. });
    let logits = linear(&kn, tokens, model.hidden as f64, outputs, frozen);
    let loss = kn.memory(14.0 * tokens * outputs);
    (logits, Pass { forward: loss, backward: loss })
}

/// The recorded eager step of the job, where transformers' own code runs its layers
/// (`transformers`, as the job's program builder says: transformers, Accelerate or DeepSpeed
/// over its modelling code) as recorded: one model replica per GPU (data parallelism and ZeRO
/// shard only the states), not compiled, and no or full checkpointing (transformers has no
/// other policy).
pub fn eager_step(model: &Model, cfg: &TrainConfig, transformers: bool) -> Option<&'static eager::Step> {
    let par = &cfg.parallel;
    let runs = transformers
        && par.tensor == 1
        && par.pipeline == 1
        && par.context == 1
        && !cfg.compile
        && matches!(cfg.checkpointing, Checkpointing::None | Checkpointing::Full);
    if !runs {
        return None;
    }
    eager::step(model, cfg.precision, cfg.checkpointing == Checkpointing::Full)
}

/// An optimizer step's time, and one layer's within it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepTime {
    pub step: f64,
    /// One layer's forward for one micro-batch, tensor-parallel all-reduces included: its
    /// kernels, or, where the host issues them slower than they run, the host's time.
    pub layer_forward: f64,
    /// Its backward, with what checkpointing recomputes.
    pub layer_backward: f64,
    /// Where the step's time goes.
    pub breakdown: Breakdown,
}

/// A stretch of the step: `n` alike units, each taking the host `host` seconds to issue
/// and the GPU `compute + memory` seconds to run.
#[derive(Clone, Copy, Debug, Default)]
struct Stretch {
    n: f64,
    host: f64,
    compute: f64,
    memory: f64,
}

/// The host's clock and the GPU's as the step's stretches run: the host issues each unit's
/// kernels in turn; the GPU runs a unit once it has finished the one before and the host
/// has launched it (a unit's kernels start as they are launched, so the GPU finishes a
/// unit no sooner than its own time after the host does).
#[derive(Clone, Copy, Debug, Default)]
struct Clocks {
    host: f64,
    gpu: f64,
    busy: Breakdown,
}

impl Clocks {
    fn run(&mut self, s: Stretch) {
        if s.n <= 0.0 {
            return;
        }
        let g = s.compute + s.memory;
        // The first unit starts when both are ready; the last ends after the later of the
        // GPU's own run of all n and the host's issue of all n (the host ahead or behind).
        let first = self.gpu.max(self.host + s.host) + g;
        self.gpu = (first + (s.n - 1.0) * g).max(self.host + s.n * s.host + g);
        self.host += s.n * s.host;
        self.busy.compute += s.n * s.compute;
        self.busy.memory += s.n * s.memory;
    }
}

/// Seconds per optimizer step (see the module documentation), at the host rate measured
/// on the dev grid's GPU; `transformers` where transformers' code runs the layers (as the
/// job's program builder says), whose kernels were recorded.
pub fn step_time(job: &Job, recompute_fraction: f64, transformers: bool) -> StepTime {
    step_time_with(job, recompute_fraction, transformers, &Host::default())
}

/// [`step_time`] at another host rate.
pub fn step_time_with(job: &Job, recompute_fraction: f64, transformers: bool, host: &Host) -> StepTime {
    let (model, gpu, cfg) = (job.model, job.gpu, &job.train);
    let par = &cfg.parallel;
    let (p, v) = (par.pipeline.max(1), par.virtual_stages.max(1));
    let m = cfg.accumulation.max(1) as f64;
    let recorded = eager_step(model, cfg, transformers);
    let layer = layer_times(model, gpu, cfg, transformers);
    let r = recomputed(job, recompute_fraction);
    let k = kernel_costs(job, &layer, &r, recorded, host);
    let layers = model.layers as f64 / p as f64;
    let on_last = 1.0 / p as f64;
    let forward_time = layers * (k.compute_f + k.mem_f) + (k.head.forward + k.rest_mem_f) * on_last;
    let backward_time = layers * (k.compute_b + k.mem_b) + (k.head.backward + k.rest_mem_b) * on_last;
    let compute = forward_time + backward_time;
    let attention_time = layers * (layer.attention.forward * (1.0 + r.attention) + layer.attention.backward);
    let comm = model_parallel_comm(job, compute, attention_time);
    let shown = if par.tp_comm_overlap { 0.0 } else { comm.all_reduce };
    // One layer's forward and backward as a profiler would time them: two all-reduces in
    // the forward, the rest in the backward (none shown when overlapped); the host's time
    // where it issues the layer slower than the GPU runs it.
    let layer_forward = (k.compute_f + k.mem_f).max(k.host_f) + 2.0 * shown;
    let layer_backward = (k.compute_b + k.mem_b).max(k.host_b) + (comm.tp_ops - 2.0) * shown;
    // The micro-batches through the host and the GPU: the layers' forwards, the head and
    // the loss, their backwards, the layers' backwards. The pipeline runs m + (p−1)/v
    // slots of one micro-batch each (the bubble).
    let slots = m + (p as f64 - 1.0) / v as f64;
    let micro_batch = [
        Stretch { n: layers, host: k.host_f, compute: k.compute_f, memory: k.mem_f },
        Stretch {
            n: 1.0,
            host: k.rest_host_f * on_last,
            compute: k.head.forward * on_last,
            memory: k.rest_mem_f * on_last,
        },
        Stretch {
            n: 1.0,
            host: k.rest_host_b * on_last,
            compute: k.head.backward * on_last,
            memory: k.rest_mem_b * on_last,
        },
        Stretch { n: layers, host: k.host_b, compute: k.compute_b, memory: k.mem_b },
    ];
    // Gradients of micro-batches after the first are added into those kept: a read of each
    // and a read and write of the sum, one kernel a parameter tensor.
    let stage = if p > 1 { PipelineStage::First } else { PipelineStage::Only };
    let sh = share(model, cfg, stage);
    let states = state_bytes_per_param(model.hidden, cfg.precision, cfg.optimizer);
    let grad_width = if main_grads_fp32(cfg) { 4.0 } else { states.gradients };
    let tensors = recorded.map_or(0.0, |st| layers * st.optimizer.layer.params + st.optimizer.rest.params * on_last);
    let accumulate = Stretch {
        n: 1.0,
        host: host.engine_op * tensors,
        compute: 0.0,
        memory: if recorded.is_some() { kernels(gpu, cfg).memory(3.0 * grad_width * sh.trainable) } else { 0.0 },
    };
    let per_slot = comm.tp + comm.cp + comm.p2p;
    let mut clocks = Clocks::default();
    let mut communication = slots * per_slot;
    let mut step = if recorded.is_some() {
        // Transformers' step (no pipeline, no tensor or context parallelism): one
        // micro-batch, and what each one after it adds (two in a row: the host's lead
        // settles after one).
        let mut one = Clocks::default();
        for s in micro_batch {
            one.run(s);
        }
        let mut two = one;
        two.run(accumulate);
        for s in micro_batch {
            two.run(s);
        }
        let more = m - 1.0;
        clocks.host = one.host + more * (two.host - one.host);
        clocks.gpu = one.gpu + more * (two.gpu - one.gpu);
        clocks.busy = one.busy.add_scaled(&two.busy, &one.busy, more);
        clocks.gpu + slots * per_slot
    } else {
        // Kernels back to back, the host never behind.
        let memory = layers * (k.mem_f + k.mem_b) + (k.rest_mem_f + k.rest_mem_b) * on_last;
        clocks.busy = Breakdown { compute: slots * (compute - memory), memory: slots * memory, ..Breakdown::default() };
        slots * (compute + per_slot)
    };
    let data_parallel = data_parallel_comm(job, forward_time, backward_time);
    step += data_parallel;
    communication += data_parallel;
    let (optimizer, offloaded) = optimizer_time(job, recorded, layers, tensors, grad_width, host, &mut clocks, step);
    step = optimizer;
    communication += offloaded;
    // What is left is the GPU waiting for the host.
    let Breakdown { compute, memory, .. } = clocks.busy;
    // (Rounding's residue, where the GPU never waits, is none.)
    let left = step - compute - memory - communication;
    let launch = if left > 1e-9 * step { left } else { 0.0 };
    let breakdown = Breakdown { compute, memory, launch, communication };
    StepTime { step, layer_forward, layer_backward, breakdown }
}

/// The share of each class of a layer's forward kernels the backward runs again.
struct Recomputed {
    linear: f64,
    attention: f64,
    elementwise: f64,
}

/// What the backward runs again, by class. Selective checkpointing with a fused kernel
/// recomputes nothing the kernel's own backward does not; per-op checkpointing reruns every
/// other matrix multiply and everything bound by memory; a solver's schedule reruns its share
/// of each layer.
fn recomputed(job: &Job, recompute_fraction: f64) -> Recomputed {
    let cfg = &job.train;
    let ForwardFlops { linear: lin, attention: attn, head } = forward_flops(job.model, cfg);
    let total = lin + attn + head;
    let (linear, attention, elementwise) = match cfg.checkpointing {
        Checkpointing::None => (0.0, 0.0, 0.0),
        Checkpointing::Full | Checkpointing::EveryK(_) => (1.0, 1.0, 1.0),
        Checkpointing::Selective => (0.0, if cfg.attention == Attention::Eager { 1.0 } else { 0.0 }, 0.0),
        Checkpointing::PerOp => ((recompute_fraction * total / lin.max(1.0)).min(1.0), 0.0, 1.0),
        Checkpointing::Optimal => {
            let share = (recompute_fraction * total / (lin + attn).max(1.0)).clamp(0.0, 1.0);
            (share, share, share)
        }
    };
    Recomputed { linear, attention, elementwise }
}

/// One layer's kernels, forward and backward, compute and memory-bound apart, and what the
/// host takes to issue them; the same for the head and the loss.
struct KernelCosts {
    compute_f: f64,
    compute_b: f64,
    mem_f: f64,
    mem_b: f64,
    host_f: f64,
    host_b: f64,
    head: Pass,
    rest_mem_f: f64,
    rest_mem_b: f64,
    rest_host_f: f64,
    rest_host_b: f64,
}

/// The layer's and the head's kernels (see [`KernelCosts`]): as timed by class, and where
/// transformers' step was recorded, its memory-bound kernels and its host's operators as
/// recorded (nothing where no recording says: Megatron's and the compiled steps' fused
/// kernels keep the GPU ahead of the host).
fn kernel_costs(
    job: &Job,
    layer: &LayerTimes,
    r: &Recomputed,
    recorded: Option<&eager::Step>,
    host: &Host,
) -> KernelCosts {
    let (model, gpu, cfg) = (job.model, job.gpu, &job.train);
    let c = cfg.parallel.context.max(1) as f64;
    let (head, loss) = head_times(model, gpu, cfg);
    let mut k = KernelCosts {
        compute_f: layer.linear.forward + layer.attention.forward,
        compute_b: layer.linear.backward
            + layer.attention.backward
            + r.linear * layer.linear.forward
            + r.attention * layer.attention.forward,
        mem_f: layer.elementwise.forward,
        mem_b: layer.elementwise.backward + r.elementwise * layer.elementwise.forward,
        host_f: 0.0,
        host_b: 0.0,
        head,
        rest_mem_f: loss.forward,
        rest_mem_b: loss.backward,
        rest_host_f: 0.0,
        rest_host_b: 0.0,
    };
    let Some(st) = recorded else { return k };
    let kn = kernels(gpu, cfg);
    let tokens = cfg.micro_batch as f64 * cfg.seq as f64 / c;
    let positions = cfg.seq as f64 / c;
    let layer_params = model.layer_params() as f64;
    let floor = |bytes: f64, kernels: f64| kn.memory(bytes).max(kernels * KERNEL_FLOOR_S);
    let (fl, bl) = (&st.forward.layer, &st.backward.layer);
    let math = cfg.attention == Attention::Sdpa && sdpa_kernel(model, gpu, cfg.precision) == SdpaKernel::Math;
    let attention_kernels = if math { MATH_KERNELS } else { Pass { forward: 1.0, backward: 3.0 } };
    // The memory-bound kernels as recorded (a checkpointed layer's backward includes its
    // recomputed forward's); the matrix multiplies and attention are timed above.
    let elementwise = |part: &eager::Part| part.kernels - part.matmuls;
    k.mem_f = floor(fl.traffic.bytes(model, tokens, positions, layer_params), elementwise(fl));
    k.mem_b = floor(bl.traffic.bytes(model, tokens, positions, layer_params), elementwise(bl));
    // The host: the forward's operators from Python; the backward's from the engine; a
    // checkpointed layer's recomputed forward from Python again (the operators the
    // checkpointed backward has beyond the plain one), with the hooks around each saved
    // tensor. The math path's composite dispatches its kernels from C++.
    let plain = eager::step(model, cfg.precision, false).unwrap_or(st);
    let again = (bl.ops - plain.backward.layer.ops).max(0.0);
    let hooks = if cfg.checkpointing == Checkpointing::Full { 3.0 * plain.forward.layer.saved } else { 0.0 };
    let sdpa_ops = if math { attention_kernels } else { Pass::default() };
    k.host_f = host.python_op * fl.ops + host.engine_op * sdpa_ops.forward;
    k.host_b = host.engine_op * (plain.backward.layer.ops + sdpa_ops.backward * bl.attention)
        + host.python_op * (again + sdpa_ops.forward * (bl.attention - 1.0).max(0.0))
        + host.checkpoint_hook * hooks;
    let (fr, br) = (&st.forward.rest, &st.backward.rest);
    k.rest_mem_f = floor(fr.traffic.bytes(model, tokens, positions, 0.0), elementwise(fr));
    k.rest_mem_b = floor(br.traffic.bytes(model, tokens, positions, 0.0), elementwise(br));
    k.rest_host_f = host.python_op * fr.ops;
    k.rest_host_b = host.engine_op * br.ops;
    k
}

/// Tensor, context and pipeline parallelism's collectives per micro-batch slot.
struct ModelParallelComm {
    /// One all-reduce of the hidden states.
    all_reduce: f64,
    /// All-reduces per layer: 4, 6 when the forward is redone.
    tp_ops: f64,
    tp: f64,
    cp: f64,
    p2p: f64,
}

/// Tensor parallelism: 4 all-reduces of the 16-bit hidden states per layer, 6 when the
/// forward is redone, each between two matmuls that need it, on the critical path (chunked
/// against the GEMMs it feeds under overlap: only what outlasts them shows). Context
/// parallelism: K and V gathered for the forward and again for the backward, their gradients
/// reduce-scattered; the ring passes them while the attention computes, so only the excess
/// shows. Stage to stage: activations forward, their gradients backward, once per chunk.
fn model_parallel_comm(job: &Job, compute: f64, attention_time: f64) -> ModelParallelComm {
    let (model, gpu, cfg) = (job.model, job.gpu, &job.train);
    let par = &cfg.parallel;
    let (t, c, p, v) = (par.tensor.max(1), par.context.max(1), par.pipeline.max(1), par.virtual_stages.max(1));
    let (s, b, h) = (cfg.seq as f64, cfg.micro_batch as f64, model.hidden as f64);
    let lp = model.layers.div_ceil(p) as f64;
    let recomputes =
        matches!(cfg.checkpointing, Checkpointing::Full | Checkpointing::EveryK(_) | Checkpointing::Optimal);
    let tp_ops = if recomputes { 6.0 } else { 4.0 };
    let all_reduce = parallel::all_reduce(s / c as f64 * b * h * 2.0, t, par.tensor_bandwidth(gpu));
    let mut tp = lp * tp_ops * all_reduce;
    if par.tp_comm_overlap {
        tp = (tp - (compute - attention_time)).max(0.0);
    }
    let kv = 2.0 * s * b * (model.kv_heads * model.head_dim) as f64 * 2.0 / t as f64;
    let cp = (lp * 3.0 * parallel::all_gather(kv, c, par.context_bandwidth(gpu)) - attention_time).max(0.0);
    let boundary = s / c as f64 * b * h * 2.0 / if par.sequence_parallel { t as f64 } else { 1.0 };
    let p2p = if p > 1 { 2.0 * v as f64 * parallel::send(boundary, par.pipeline_bandwidth(gpu)) } else { 0.0 };
    ModelParallelComm { all_reduce, tp_ops, tp, cp, p2p }
}

/// Data parallelism over the 16-bit weights and gradients this GPU holds. The engines overlap
/// it with compute — DDP's bucketed all-reduce and ZeRO's reduce-scatters with the backward,
/// ZeRO-3's prefetched gathers with the pass that needs them — so only what outlasts that
/// compute is added.
fn data_parallel_comm(job: &Job, forward_time: f64, backward_time: f64) -> f64 {
    let (gpu, cfg) = (job.gpu, &job.train);
    let par = &cfg.parallel;
    let m = cfg.accumulation.max(1) as f64;
    let sh = share(job.model, cfg, if par.pipeline > 1 { PipelineStage::First } else { PipelineStage::Only });
    let grads16 = 2.0 * sh.trainable;
    let weights16 = 2.0 * (sh.trainable + sh.frozen_linear + sh.frozen_other);
    let n = par.shard_degree();
    let bw = par.data_bandwidth(gpu);
    let exposed = |comm: f64, under: f64| (comm - under).max(0.0);
    match par.zero_stage {
        0 | 1 => exposed(parallel::all_reduce(grads16, n, bw), backward_time),
        2 => m * exposed(parallel::all_gather(grads16, n, bw), backward_time) + parallel::all_gather(grads16, n, bw),
        _ => {
            let gather = parallel::all_gather(weights16, n, bw);
            m * (exposed(gather, forward_time) + exposed(gather + parallel::all_gather(grads16, n, bw), backward_time))
        }
    }
}

impl Breakdown {
    /// `self` plus `more` times what `two` adds to `one`.
    fn add_scaled(self, two: &Breakdown, one: &Breakdown, more: f64) -> Breakdown {
        Breakdown {
            compute: self.compute + more * (two.compute - one.compute),
            memory: self.memory + more * (two.memory - one.memory),
            launch: self.launch + more * (two.launch - one.launch),
            communication: self.communication + more * (two.communication - one.communication),
        }
    }
}
