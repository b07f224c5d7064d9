//! Training memory per GPU, term by term, and the step time.
//!
//! | term | formula | source (research/estimation.md) |
//! |---|---|---|
//! | weights, gradients, optimizer | bytes/param by precision and optimizer, ÷ N for the ZeRO-sharded ones | §1.1, §1.2 |
//! | activations | per layer sbh·(c₀ + c₁·f/h) at the activation width, plus the attention core: 5as²b (eager) or 4asb (SDPA/flash); by checkpoint policy | §2.1, §2.3, §2.5 |
//! | logits | b·s·V·(4 + activation width): fp32 logits for the loss plus their low-precision copy | §2.4 |
//! | temporary | cuBLAS workspace; ZeRO-3's gathered layer (4 × largest layer params) | §1.4, §4.1 |
//! | framework | CUDA context; NCCL buffers with more than one GPU | §4.1 |
//!
//! Step time: 6·N·tokens FLOPs plus attention (12·L·b·s²·H·d), one more
//! forward's worth for full recomputation (or what the optimal schedule
//! recomputes), at [`ActivationModel::mfu`] of the GPU's dense peak; plus
//! the data-parallel collectives as ring transfers of (n−1)/n of the volume
//! at 70% of the GPU-to-GPU link, not overlapped with compute (an upper
//! bound): an all-reduce of the gradients per optimizer step (2 × 2Ψ bytes)
//! for plain data parallelism and ZeRO-1, a reduce-scatter of the gradients
//! per micro-batch and an all-gather of the weights per step for ZeRO-2, and
//! two all-gathers and a reduce-scatter per micro-batch for ZeRO-3.

use crate::checkpoint::{self, Chain, Loss, Stage};
use crate::gpu::GpuSpec;
use crate::model::{Family, Model};

const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

/// Precision regimes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// Everything fp32.
    Fp32,
    /// `torch.autocast`: fp32 weights, gradients and optimizer; 16-bit activations.
    Amp,
    /// 16-bit weights and gradients with an fp32 master copy in the optimizer (DeepSpeed, Megatron).
    Mixed,
    /// Everything bf16, optimizer states included (no master copy).
    Bf16,
}

/// Optimizers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Optimizer {
    AdamW,
    Sgd,
    SgdMomentum,
    Adafactor,
    Adam8bit,
}

/// Attention kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attention {
    /// Materialises the s×s scores and probabilities.
    Eager,
    /// PyTorch's scaled_dot_product_attention (flash or memory-efficient kernel).
    Sdpa,
    Flash,
}

/// Activation checkpointing policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checkpointing {
    None,
    /// Keep each layer's input; recompute each layer in the backward.
    Full,
    /// Recompute only the attention core (Korthikanti et al.).
    Selective,
    /// Keep the input of every k-th layer.
    EveryK(u64),
    /// The fastest schedule that fits the GPU ([`crate::checkpoint`]).
    Optimal,
}

/// The coefficients of the activation and time model, in one place so that
/// a calibration from a measured run can replace them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActivationModel {
    /// sbh coefficient independent of the MLP width (attention linears, norms, dropouts): 18.
    pub c0: f64,
    /// sb·f coefficient of a 2-matrix GELU MLP (its 4h form gives Korthikanti's 16 of 34): 4.
    pub c1_mlp: f64,
    /// The same for a gated MLP (one more f-wide tensor saved): 6.
    pub c1_gated: f64,
    /// Fraction of the dense peak the step reaches (llm-analysis's training default).
    pub mfu: f64,
}

impl Default for ActivationModel {
    fn default() -> Self {
        ActivationModel { c0: 18.0, c1_mlp: 4.0, c1_gated: 6.0, mfu: 0.5 }
    }
}

/// A training configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainConfig {
    pub micro_batch: u64,
    pub seq: u64,
    pub precision: Precision,
    pub optimizer: Optimizer,
    pub attention: Attention,
    pub checkpointing: Checkpointing,
    /// Data-parallel GPUs.
    pub gpus: u64,
    /// 0 (plain data parallelism) to 3.
    pub zero_stage: u8,
    pub coefficients: ActivationModel,
}

/// Bytes per GPU by term.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Breakdown {
    pub weights: f64,
    pub gradients: f64,
    pub optimizer: f64,
    pub activations: f64,
    pub logits: f64,
    pub temporary: f64,
    pub framework: f64,
}

impl Breakdown {
    pub fn total(&self) -> f64 {
        self.weights
            + self.gradients
            + self.optimizer
            + self.activations
            + self.logits
            + self.temporary
            + self.framework
    }
}

/// What a configuration needs and how fast it runs.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainEstimate {
    pub breakdown: Breakdown,
    pub per_gpu_bytes: f64,
    pub fits: bool,
    pub step_time_s: f64,
    pub tokens_per_s: f64,
    /// Forward FLOPs recomputed, as a fraction of one forward pass.
    pub recompute_fraction: f64,
    /// With `Checkpointing::Optimal`: the schedule's peak did not fit even with every layer recomputed.
    pub note: Option<String>,
}

/// Bytes per parameter of weights, gradients and optimizer state, unsharded.
pub fn state_bytes_per_param(hidden: u64, precision: Precision, optimizer: Optimizer) -> (f64, f64, f64) {
    // Adafactor factors the second moment of an n×m matrix into n + m values.
    let adafactor = 2.0 * 4.0 / hidden as f64;
    let (w, g, master, state_width) = match precision {
        Precision::Fp32 | Precision::Amp => (4.0, 4.0, 0.0, 4.0),
        Precision::Mixed => (2.0, 2.0, 4.0, 4.0),
        Precision::Bf16 => (2.0, 2.0, 0.0, 2.0),
    };
    let states = match optimizer {
        Optimizer::AdamW => 2.0 * state_width,
        Optimizer::SgdMomentum => state_width,
        Optimizer::Sgd => 0.0,
        Optimizer::Adafactor => adafactor,
        Optimizer::Adam8bit => 2.0,
    };
    (w, g, master + states)
}

/// Weights, gradients and optimizer bytes per GPU: ZeRO stage 1 shards the
/// optimizer state over the data-parallel GPUs, stage 2 also the gradients,
/// stage 3 also the weights (FSDP's SHARD_GRAD_OP is stage 2, FULL_SHARD stage 3).
pub fn model_states(params: u64, hidden: u64, cfg: &TrainConfig) -> (f64, f64, f64) {
    let (w, g, o) = state_bytes_per_param(hidden, cfg.precision, cfg.optimizer);
    let n = cfg.gpus.max(1) as f64;
    let shard = |stage: u8| if cfg.zero_stage >= stage { n } else { 1.0 };
    let psi = params as f64;
    (w * psi / shard(3), g * psi / shard(2), o * psi / shard(1))
}

fn activation_width(p: Precision) -> f64 {
    if p == Precision::Fp32 {
        4.0
    } else {
        2.0
    }
}

/// Per-layer activation bytes: (kept by the layer, of which the attention core).
fn layer_activations(model: &Model, cfg: &TrainConfig) -> (f64, f64) {
    let (s, b, h) = (cfg.seq as f64, cfg.micro_batch as f64, model.hidden as f64);
    let a = model.heads as f64;
    let width = activation_width(cfg.precision) / 2.0;
    let k = &cfg.coefficients;
    let c1 = if model.gated_mlp { k.c1_gated } else { k.c1_mlp };
    let linear = s * b * h * (k.c0 + c1 * model.intermediate as f64 / h) * width;
    let core = match cfg.attention {
        Attention::Eager => 5.0 * a * s * s * b * width,
        Attention::Sdpa | Attention::Flash => 4.0 * a * s * b,
    };
    (linear + core, core)
}

/// Forward FLOPs of one layer and of the LM head, per micro-batch.
fn forward_flops(model: &Model, cfg: &TrainConfig) -> (f64, f64) {
    let tokens = (cfg.micro_batch * cfg.seq) as f64;
    let layer_params = model.layer_params() as f64 * model.active_params() as f64 / model.params() as f64;
    let attention = 4.0 * (cfg.micro_batch * cfg.seq * cfg.seq * model.heads * model.head_dim) as f64;
    (2.0 * layer_params * tokens + attention, 2.0 * (model.vocab * model.hidden) as f64 * tokens)
}

/// Estimates one configuration on one GPU model.
pub fn estimate(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig) -> TrainEstimate {
    let n = cfg.gpus.max(1) as f64;
    let (weights, gradients, optimizer) = model_states(model.params(), model.hidden, cfg);
    let mut br = Breakdown { weights, gradients, optimizer, ..Breakdown::default() };
    let (s, b, h, l) = (cfg.seq as f64, cfg.micro_batch as f64, model.hidden as f64, model.layers as f64);
    let width = activation_width(cfg.precision);
    let hidden_state = s * b * h * width;
    let (per_layer, core) = layer_activations(model, cfg);
    br.logits = s * b * model.vocab as f64 * (4.0 + width);
    let hopper = gpu.name.starts_with('h') || gpu.name.starts_with('b');
    br.temporary = if hopper { 32.0 * MIB } else { 4.0 * MIB };
    if cfg.zero_stage >= 3 && cfg.gpus > 1 {
        br.temporary += 4.0 * model.layer_params() as f64;
    }
    br.framework = 0.5 * GIB + if cfg.gpus > 1 { 1.5 * GIB } else { 0.0 };
    let (layer_flops, head_flops) = forward_flops(model, cfg);
    let mut recompute_fraction = 0.0;
    let mut note = None;
    br.activations = match cfg.checkpointing {
        Checkpointing::None => l * per_layer,
        Checkpointing::Selective => {
            if cfg.attention == Attention::Eager {
                // The s² tensors are recomputed: their FLOPs are a small share of the layer's.
                recompute_fraction =
                    4.0 * s * s * b * model.heads as f64 * model.head_dim as f64 / (l * layer_flops + head_flops) * l;
            }
            l * (per_layer - core) + core
        }
        Checkpointing::Full => {
            recompute_fraction = l * layer_flops / (l * layer_flops + head_flops);
            l * hidden_state + per_layer
        }
        Checkpointing::EveryK(k) => {
            let k = k.clamp(1, model.layers) as f64;
            recompute_fraction = l * layer_flops / (l * layer_flops + head_flops);
            (l / k).ceil() * hidden_state + k * per_layer
        }
        Checkpointing::Optimal => {
            let fixed = br.weights + br.gradients + br.optimizer + br.temporary + br.framework;
            let budget = (gpu.memory_bytes as f64 - fixed).max(0.0) as u64;
            let chain = Chain {
                input_bytes: hidden_state as u64,
                stages: (0..model.layers)
                    .map(|i| Stage {
                        name: format!("layer{i}"),
                        forward_time: layer_flops,
                        backward_time: 2.0 * layer_flops,
                        output_bytes: hidden_state as u64,
                        saved_bytes: per_layer.max(hidden_state) as u64,
                        forward_tmp_bytes: 0,
                        backward_tmp_bytes: 0,
                    })
                    .collect(),
                loss: Loss {
                    forward_time: head_flops,
                    backward_time: 2.0 * head_flops,
                    saved_bytes: br.logits as u64,
                    ..Loss::default()
                },
            };
            match checkpoint::solve(&chain, budget.max(1), 500) {
                Ok(plan) => {
                    let store_all = 3.0 * (l * layer_flops + head_flops);
                    recompute_fraction = (plan.outcome.time - store_all).max(0.0) / (l * layer_flops + head_flops);
                    // The schedule's peak holds the logits too; report them apart.
                    (plan.outcome.peak as f64 - br.logits).max(0.0)
                }
                Err(e) => {
                    note = Some(format!("no checkpointing schedule fits: {e}"));
                    recompute_fraction = l * layer_flops / (l * layer_flops + head_flops);
                    l * hidden_state + per_layer
                }
            }
        }
    };
    let per_gpu = br.total();
    let forward = l * layer_flops + head_flops;
    let flops = 3.0 * forward + recompute_fraction * forward;
    let step = flops / (gpu.bf16_flops * cfg.coefficients.mfu) + comm_time(model, gpu, cfg, 1);
    TrainEstimate {
        breakdown: br,
        per_gpu_bytes: per_gpu,
        fits: per_gpu <= gpu.memory_bytes as f64 && note.is_none(),
        step_time_s: step,
        tokens_per_s: b * s * n / step,
        recompute_fraction,
        note,
    }
}

/// Fraction of the link bandwidth collectives reach.
const LINK_EFFICIENCY: f64 = 0.7;

/// Seconds of data-parallel communication per optimizer step of
/// `accumulation` micro-batches (see the module documentation).
pub fn comm_time(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig, accumulation: u64) -> f64 {
    let n = cfg.gpus.max(1) as f64;
    if n <= 1.0 {
        return 0.0;
    }
    let psi16 = 2.0 * model.params() as f64; // 16-bit gradients and weights on the wire
    let acc = accumulation.max(1) as f64;
    let volume = match cfg.zero_stage {
        0 | 1 => 2.0 * psi16,
        2 => acc * psi16 + psi16,
        _ => acc * 3.0 * psi16,
    };
    volume * (n - 1.0) / n / (gpu.link_bandwidth * LINK_EFFICIENCY)
}

/// The largest micro-batch that fits (0 if none does), up to `limit`.
pub fn max_micro_batch(model: &Model, gpu: &GpuSpec, cfg: &TrainConfig, limit: u64) -> u64 {
    let fits = |b: u64| estimate(model, gpu, &TrainConfig { micro_batch: b, ..*cfg }).fits;
    if !fits(1) {
        return 0;
    }
    let (mut lo, mut hi) = (1u64, 2u64);
    while hi <= limit && fits(hi) {
        lo = hi;
        hi *= 2;
    }
    let mut hi = hi.min(limit + 1);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::gpu;
    use crate::model::preset;

    /// ZeRO's Table 1: per-device model states in GB (1e9 bytes), mixed-precision Adam (K = 12).
    #[test]
    fn zero_table_1_exactly() {
        type Column = (u64, [f64; 3]);
        let rows: [(u64, [Column; 4]); 3] = [
            (
                7_500_000_000,
                [
                    (16, [35.6, 21.6, 7.5]),
                    (64, [31.4, 16.6, 1.88]),
                    (256, [30.4, 15.4, 0.47]),
                    (1024, [30.1, 15.1, 0.12]),
                ],
            ),
            (
                128_000_000_000,
                [
                    (16, [608.0, 368.0, 128.0]),
                    (64, [536.0, 284.0, 32.0]),
                    (256, [518.0, 263.0, 8.0]),
                    (1024, [513.0, 257.0, 2.0]),
                ],
            ),
            (
                1_000_000_000_000,
                [
                    (16, [4750.0, 2875.0, 1000.0]),
                    (64, [4187.0, 2218.0, 250.0]),
                    (256, [4046.0, 2054.0, 62.5]),
                    (1024, [4011.0, 2013.0, 15.6]),
                ],
            ),
        ];
        for (params, cols) in rows {
            for (dp, want) in cols {
                for (stage, paper) in [1u8, 2, 3].into_iter().zip(want) {
                    let cfg = TrainConfig { gpus: dp, zero_stage: stage, ..base() };
                    let (w, g, o) = model_states(params, 4096, &cfg);
                    let states = (w + g + o) / 1e9;
                    // The paper rounds to 3 significant figures (1 decimal for the small ones).
                    let tol = (paper * 0.006).max(0.006);
                    assert!(
                        (states - paper).abs() <= tol,
                        "{params} params, DP {dp}, stage {stage}: {states} vs {paper}"
                    );
                }
            }
        }
    }

    fn base() -> TrainConfig {
        TrainConfig {
            micro_batch: 1,
            seq: 2048,
            precision: Precision::Mixed,
            optimizer: Optimizer::AdamW,
            attention: Attention::Eager,
            checkpointing: Checkpointing::None,
            gpus: 1,
            zero_stage: 0,
            coefficients: ActivationModel::default(),
        }
    }

    /// Korthikanti et al.: GPT-3 175B (a = 96, s = 2048, h = 12288, b = 1): sbh(34 + 5as/h) = 2.87 GB a layer, unparallelised.
    #[test]
    fn korthikanti_per_layer_figures() {
        let gpt3 = Model {
            name: "gpt3".into(),
            family: Family::Gpt2,
            hidden: 12288,
            layers: 96,
            heads: 96,
            kv_heads: 96,
            head_dim: 128,
            intermediate: 4 * 12288,
            vocab: 51200,
            max_position: 2048,
            tied_embeddings: true,
            qkv_bias: true,
            experts: 1,
            experts_per_token: 1,
            gated_mlp: false,
            decoder_layers: 96,
            sliding_window: None,
            relative_buckets: 0,
        };
        let (eager, core) = layer_activations(&gpt3, &base());
        assert!((eager / 1e9 - 2.87).abs() < 0.01, "{eager}");
        // Selective recomputation leaves 34·sbh = 0.86 GB.
        assert!(((eager - core) / 1e9 - 0.856).abs() < 0.01);
        let flash = layer_activations(&gpt3, &TrainConfig { attention: Attention::Flash, ..base() }).0;
        assert!(flash < eager / 3.0);
    }

    #[test]
    fn policies_trade_memory_for_time_and_optimal_fits_between() {
        let m = preset("llama-2-7b").unwrap();
        let g = gpu("a100-80gb").unwrap();
        let cfg = |c| TrainConfig {
            micro_batch: 8,
            seq: 4096,
            precision: Precision::Bf16,
            attention: Attention::Flash,
            checkpointing: c,
            ..base()
        };
        let none = estimate(&m, &g, &cfg(Checkpointing::None));
        let full = estimate(&m, &g, &cfg(Checkpointing::Full));
        let optimal = estimate(&m, &g, &cfg(Checkpointing::Optimal));
        assert!(!none.fits && full.fits && optimal.fits);
        assert!(full.breakdown.activations < none.breakdown.activations);
        assert!(optimal.step_time_s <= full.step_time_s && optimal.step_time_s >= none.step_time_s);
        assert!(optimal.per_gpu_bytes <= g.memory_bytes as f64);
        let most = max_micro_batch(&m, &g, &cfg(Checkpointing::Full), 1024);
        assert!(
            most >= 8 && !estimate(&m, &g, &TrainConfig { micro_batch: most + 1, ..cfg(Checkpointing::Full) }).fits
        );
    }
}
