//! The estimate of a training job as a whole: the model states, activations, logits and
//! temporaries the closed form gives (the published figures it was built from), and what the
//! spine makes of a job — its verdict, the stage that peaks, its step time.

use headroom_plan::builders::runner;
use headroom_plan::closed_form::{layer_activations, LayerActivations, StageMemory, GIB};
use headroom_plan::deepspeed;
use headroom_plan::estimate::{Estimate, Estimator};
use headroom_plan::gpu::{gpu, GpuSpec};
use headroom_plan::job::*;
use headroom_plan::model::{preset, Model};
use headroom_plan::parallel::Parallelism;
use headroom_plan::placement::{model_states, ModelStates};

fn estimate(m: &Model, g: &GpuSpec, cfg: &TrainConfig) -> Estimate {
    Estimator::default().estimate(&Job::new(m, g, *cfg).unwrap()).unwrap()
}

fn fits(m: &Model, g: &GpuSpec, cfg: &TrainConfig) -> bool {
    Estimator::default().fits(&Job::new(m, g, *cfg).unwrap())
}

fn max_micro_batch(m: &Model, g: &GpuSpec, cfg: &TrainConfig, limit: u64) -> u64 {
    Estimator::default().max_micro_batch(&Job::new(m, g, *cfg).unwrap(), limit)
}

/// The closed form's terms for a stage, as the job's runner asks for them.
fn memory(m: &Model, g: &GpuSpec, cfg: &TrainConfig, stage: PipelineStage, _: Option<()>) -> StageMemory {
    let job = Job::new(m, g, *cfg).unwrap();
    let (r, _) = runner(&job).unwrap();
    let job = Job { train: TrainConfig { framework: r.builder.framework(), ..job.train }, ..job };
    headroom_plan::closed_form::memory(&job, stage, r.builder.transformers_code(&job), 0.0)
}

/// ZeRO's Table 1: per-device model states in GB (1e9 bytes), mixed-precision Adam (K = 12).
#[test]
fn zero_table_1_exactly() {
    type Column = (u64, [f64; 3]);
    let rows: [(u64, [Column; 4]); 3] = [
        (
            7_500_000_000,
            [(16, [35.6, 21.6, 7.5]), (64, [31.4, 16.6, 1.88]), (256, [30.4, 15.4, 0.47]), (1024, [30.1, 15.1, 0.12])],
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
                let cfg = TrainConfig { parallel: Parallelism::data_parallel(dp, stage), ..base() };
                let ModelStates { weights: w, gradients: g, optimizer: o } = model_states(params, 4096, &cfg);
                let states = (w + g + o) / 1e9;
                // The paper rounds to 3 significant figures (1 decimal for the small ones).
                let tol = (paper * 0.006).max(0.006);
                assert!((states - paper).abs() <= tol, "{params} params, DP {dp}, stage {stage}: {states} vs {paper}");
            }
        }
    }
}

fn base() -> TrainConfig {
    TrainConfig {
        seq: 2048,
        attention: Attention::Eager,
        ..TrainConfig::new(1, 2048, Precision::Mixed, Optimizer::AdamW)
    }
}

fn gpt(name: &str, h: u64, l: u64, a: u64) -> Model {
    Model::gpt(name, h, l, a, 51200, 2048)
}

/// Korthikanti et al.: GPT-3 175B (a = 96, s = 2048, h = 12288, b = 1): sbh(34 + 5as/h) = 2.87 GB a layer, unparallelised.
#[test]
fn korthikanti_per_layer_figures() {
    let gpt3 = gpt("gpt3", 12288, 96, 96);
    let LayerActivations { kept: eager, core, .. } = layer_activations(&gpt3, &base());
    assert!((eager / 1e9 - 2.87).abs() < 0.01, "{eager}");
    // Selective recomputation leaves 34·sbh = 0.86 GB.
    assert!(((eager - core) / 1e9 - 0.856).abs() < 0.01);
    let flash = layer_activations(&gpt3, &TrainConfig { attention: Attention::Flash, ..base() }).kept;
    assert!(flash < eager / 3.0);
    // Table 2 under 8-way tensor parallelism: sequence parallel (34 + 5as/h)·sbh/t = 0.359 GB;
    // with selective recomputation 34·sbh/t = 0.107 GB; full recomputation keeps 2sbh = 0.050 GB.
    let tp = |sp: bool| TrainConfig {
        parallel: Parallelism { tensor: 8, sequence_parallel: sp, ..Parallelism::default() },
        ..base()
    };
    let LayerActivations { kept: with_sp, core: core_sp, .. } = layer_activations(&gpt3, &tp(true));
    assert!((with_sp / 1e9 - 0.359).abs() < 0.002, "{with_sp}");
    assert!(((with_sp - core_sp) / 1e9 - 0.107).abs() < 0.001);
    let input = layer_activations(&gpt3, &tp(false)).input;
    assert!((input / 1e9 - 0.050).abs() < 0.001);
    // Without sequence parallelism, 22B at b = 4: sbh(10 + 24/t + 5as/(ht)) = 1.33 GB.
    let m22 = gpt("22b", 6144, 48, 64);
    let tp_only = layer_activations(&m22, &TrainConfig { micro_batch: 4, ..tp(false) }).kept;
    assert!((tp_only / 1e9 - 1.33).abs() < 0.01, "{tp_only}");
    let unsplit = layer_activations(&m22, &TrainConfig { micro_batch: 4, ..base() }).kept;
    assert!((unsplit / 1e9 - 7.08).abs() < 0.01, "{unsplit}");
}

/// Korthikanti §4.2.3: the first 1F1B stage holds p micro-batches of L/p layers — L layers' worth, whatever p —
/// and the interleaved schedule (1 + (p−1)/(p·v)) times that; fewer micro-batches than stages hold fewer.
#[test]
fn pipeline_first_stage_holds_a_whole_model_of_activations() {
    let m = gpt("175b", 12288, 96, 96);
    let g = GpuSpec { memory_bytes: 1 << 50, ..gpu("a100-80gb").unwrap() };
    let at = |p: u64, v: u64, m_: u64| {
        let cfg = TrainConfig {
            accumulation: m_,
            parallel: Parallelism { tensor: 8, pipeline: p, virtual_stages: v, ..Parallelism::default() },
            ..base()
        };
        memory(&m, &g, &cfg, if p > 1 { PipelineStage::First } else { PipelineStage::Only }, None).breakdown.activations
    };
    let one = at(1, 1, 64);
    assert!((at(8, 1, 64) / one - 1.0).abs() < 1e-9);
    assert!((at(8, 3, 64) / one - (1.0 + 7.0 / 24.0)).abs() < 1e-9);
    assert!((at(8, 1, 2) / one - 0.25).abs() < 1e-9);
    // The last stage holds the logits and one micro-batch.
    let cfg = TrainConfig {
        accumulation: 64,
        parallel: Parallelism { tensor: 8, pipeline: 8, ..Parallelism::default() },
        ..base()
    };
    let last = memory(&m, &g, &cfg, PipelineStage::Last, None).breakdown;
    assert!(last.logits > 0.0 && (last.activations / one - 1.0 / 8.0).abs() < 1e-9);
    assert_eq!(memory(&m, &g, &cfg, PipelineStage::First, None).breakdown.logits, 0.0);
    // Weights: a stage holds its layers and its embedding, ÷ t.
    let e = estimate(&m, &g, &cfg);
    let per_stage = (12.0 * 12288f64.powi(2) * 12.0 + 51200.0 * 12288.0) / 8.0;
    assert!((e.memory.breakdown.weights / (2.0 * per_stage) - 1.0).abs() < 0.01);
}

#[test]
fn fits_is_the_memory_half_of_estimate() {
    let m = preset("llama-2-70b").unwrap();
    let g = gpu("a100-80gb").unwrap();
    let mut seen = [0, 0];
    for (t, p, zero, b, ckpt) in [
        (1, 1, 3, 1, Checkpointing::Full),
        (8, 1, 1, 1, Checkpointing::None),
        (8, 4, 1, 1, Checkpointing::Selective),
        (4, 8, 0, 2, Checkpointing::Full),
        (2, 2, 3, 4, Checkpointing::EveryK(4)),
        (8, 8, 1, 8, Checkpointing::None),
    ] {
        let cfg = TrainConfig {
            accumulation: 16,
            checkpointing: ckpt,
            parallel: Parallelism { data: 4, tensor: t, pipeline: p, zero_stage: zero, ..Parallelism::default() },
            ..TrainConfig::new(b, 4096, Precision::Mixed, Optimizer::AdamW)
        };
        let e = estimate(&m, &g, &cfg);
        assert_eq!(fits(&m, &g, &cfg), e.verdict.fits, "{cfg:?}");
        seen[e.verdict.fits as usize] += 1;
    }
    assert!(seen[0] > 0 && seen[1] > 0, "both outcomes covered: {seen:?}");
}

#[test]
fn bubbles_and_collectives_cost_time() {
    let m = preset("llama-2-70b").unwrap();
    let g = gpu("h100-sxm").unwrap();
    let cfg = |p: u64, v: u64, acc: u64| TrainConfig {
        accumulation: acc,
        attention: Attention::Flash,
        parallel: Parallelism { tensor: 8, pipeline: p, virtual_stages: v, ..Parallelism::default() },
        ..TrainConfig::new(1, 4096, Precision::Mixed, Optimizer::AdamW)
    };
    let t = |c: TrainConfig| estimate(&m, &g, &c).time.as_ref().unwrap().step_time_s;
    // 1F1B: (m + p − 1) slots of 1/p of the work; interleaving shrinks the bubble to (p−1)/v.
    let (p4, p4v2) = (t(cfg(4, 1, 8)), t(cfg(4, 2, 8)));
    assert!(p4v2 < p4);
    // Each micro-batch more is one slot more; what is left of 11 slots is the optimizer step.
    let per_slot = (t(cfg(4, 1, 16)) - p4) / 8.0;
    assert!((t(cfg(4, 1, 24)) - t(cfg(4, 1, 16)) - 8.0 * per_slot).abs() / p4 < 1e-9);
    let optimizer = p4 - 11.0 * per_slot;
    assert!(optimizer > 0.0 && optimizer < 0.05 * p4, "{optimizer} of {p4}");
    // Tensor parallelism across nodes is slower than inside one.
    let inside = estimate(&m, &g, &cfg(1, 1, 1));
    assert!(
        inside.time.as_ref().unwrap().mfu < 0.5 && inside.time.as_ref().unwrap().mfu > 0.3,
        "{}",
        inside.time.as_ref().unwrap().mfu
    );
}

#[test]
fn zero_shards_over_the_data_and_context_gpus() {
    // torchtitan's Table 2 layouts: 8 GPUs as FSDP 8 × CP 1 down to FSDP 1 × CP 8, each
    // at a sequence that grows with CP, so every GPU holds the same tokens.
    let m = preset("llama-3.1-8b").unwrap();
    let g = gpu("h100-sxm").unwrap();
    let cfg = |cp: u64| TrainConfig {
        attention: Attention::Flash,
        checkpointing: Checkpointing::Full,
        parallel: Parallelism { data: 8 / cp, context: cp, zero_stage: 3, ..Parallelism::default() },
        ..TrainConfig::new(1, 32768 * cp, Precision::Mixed, Optimizer::AdamW)
    };
    let psi = m.params();
    let states = |c: &TrainConfig| {
        let s = model_states(psi, m.hidden, c);
        s.weights + s.gradients + s.optimizer
    };
    assert!((states(&cfg(1)) - 16.0 * psi as f64 / 8.0).abs() < 1.0, "16 bytes a parameter over 8 GPUs");
    // With context parallelism the step is Megatron's (transformers cannot split a sequence).
    let two = estimate(&m, &g, &cfg(2));
    for cp in [2, 4, 8] {
        assert!((states(&cfg(cp)) - states(&cfg(1))).abs() < 1.0, "CP {cp}: the states stay sharded 8 ways");
        // The same tokens on every GPU, the same states: the same memory.
        let e = estimate(&m, &g, &cfg(cp));
        assert!((e.memory.per_gpu_bytes - two.memory.per_gpu_bytes).abs() / two.memory.per_gpu_bytes < 0.01, "CP {cp}");
    }
}

#[test]
fn per_op_checkpointing_keeps_what_torchtitan_saves() {
    let m = preset("llama-3.1-8b").unwrap();
    let g = gpu("h100-sxm").unwrap();
    let with = |checkpointing| {
        let cfg = TrainConfig {
            attention: Attention::Flash,
            checkpointing,
            parallel: Parallelism::data_parallel(8, 3),
            // Megatron's accounting for all three (transformers has no per-op policy).
            framework: Framework::Megatron,
            ..TrainConfig::new(2, 8192, Precision::Mixed, Optimizer::AdamW)
        };
        estimate(&m, &g, &cfg)
    };
    let (full, per_op, selective) =
        (with(Checkpointing::Full), with(Checkpointing::PerOp), with(Checkpointing::Selective));
    // A Llama block, by hand: the input (h), wq (h), wv (kv), w1 (f), w2 (h) and the
    // attention output (h) in bf16, and flash attention's fp32 log-sum-exp per head.
    let tokens = 2.0 * 8192.0;
    let (h, kv, f) = (4096.0, 1024.0, 14336.0);
    let kept = tokens * ((h + h + kv + f + h + h) * 2.0 + 4.0 * 32.0);
    let input = tokens * h * 2.0;
    // Both keep one layer's full set beside the rest while it is recomputed.
    let per_layer = full.memory.breakdown.activations - 32.0 * input;
    assert!((per_op.memory.breakdown.activations - per_layer - 32.0 * kept).abs() < 1.0);
    assert!(full.memory.breakdown.activations < per_op.memory.breakdown.activations);
    assert!(per_op.memory.breakdown.activations < selective.memory.breakdown.activations);
    // It recomputes wk, wo and w3: between selective (nothing, with flash) and full.
    assert!(selective.time.as_ref().unwrap().recompute_fraction < per_op.time.as_ref().unwrap().recompute_fraction);
    assert!(per_op.time.as_ref().unwrap().recompute_fraction < full.time.as_ref().unwrap().recompute_fraction);
}

#[test]
fn fsdp_under_pipelining_keeps_the_stage_gathered() {
    let m = preset("llama-3-70b").unwrap();
    let g = gpu("h100-sxm").unwrap();
    let with = |zero_stage| {
        let cfg = TrainConfig {
            accumulation: 8,
            attention: Attention::Flash,
            checkpointing: Checkpointing::Full,
            parallel: Parallelism { data: 4, pipeline: 4, zero_stage, ..Parallelism::default() },
            ..TrainConfig::new(1, 4096, Precision::Mixed, Optimizer::AdamW)
        };
        memory(&m, &g, &cfg, PipelineStage::First, None).breakdown.temporary
    };
    // A quarter of the model, gathered in bf16, beside the shard ZeRO-3 keeps.
    let gathered = with(3) - with(1);
    let quarter = 2.0 * m.params() as f64 / 4.0;
    assert!(gathered > 0.9 * quarter && gathered < 1.2 * quarter, "{gathered} vs {quarter}");
}

#[test]
fn torchtitans_loss_holds_twelve_bytes_a_logit() {
    let m = preset("llama-3.1-8b").unwrap();
    let g = gpu("h100-sxm").unwrap();
    let logits = |framework| {
        let cfg = TrainConfig {
            framework,
            attention: Attention::Flash,
            checkpointing: Checkpointing::PerOp,
            parallel: Parallelism::data_parallel(8, 3),
            ..TrainConfig::new(2, 8192, Precision::Mixed, Optimizer::AdamW)
        };
        let e = estimate(&m, &g, &cfg);
        assert_eq!(e.runner.framework, framework);
        e.memory.breakdown.logits
    };
    let per_token = 2.0 * 8192.0 * m.vocab as f64;
    assert_eq!(logits(Framework::Torchtitan), 12.0 * per_token);
    assert_eq!(logits(Framework::Megatron), 16.0 * per_token);
}

/// The trainable parameters of a LoRA run are peft's: `get_peft_model` with
/// `target_modules="all-linear"` (all) or the family's default targets (query and value) at
/// r = 16, counted by peft 0.21 over transformers 5.24's model of each preset's config. A
/// layer transformers fuses gets one adapter: GPT-2's `c_attn`, GPT-NeoX's and BLOOM's
/// `query_key_value`, Phi-3's `qkv_proj` and `gate_up_proj` (Phi-3 has no default targets).
/// BERT (`BertForMaskedLM`, no task type) adds its masked-LM head's transform to "all-linear";
/// T5 (`T5ForConditionalGeneration`, `SEQ_2_SEQ_LM`) its decoder's cross-attention, whose `q`
/// and `v` are among the default targets too. Mixtral's experts are stacks of weights under
/// transformers 5: peft wraps each stack with one adapter of rank 8 × r (`down_proj`) or
/// 16 × r (`gate_up_proj`), and its router too.
#[test]
fn lora_trains_the_adapters_peft_makes() {
    let g = gpu("h100-sxm").unwrap();
    let cases = [
        ("gpt2", 2_359_296, Some(589_824)),
        ("gpt2-medium", 6_291_456, Some(1_572_864)),
        ("pythia-1b", 8_388_608, Some(2_097_152)),
        ("bloom-7b1", 31_457_280, Some(7_864_320)),
        ("phi-3-mini", 25_165_824, None),
        ("llama-3-8b", 41_943_040, Some(6_815_744)),
        ("mixtral-8x7b", 359_665_664, Some(6_815_744)),
        ("bert-base-uncased", 2_678_784, Some(589_824)),
        ("bert-large-uncased", 7_110_656, Some(1_572_864)),
        ("t5-base", 6_488_064, Some(1_769_472)),
        ("t5-large", 17_301_504, Some(4_718_592)),
    ];
    for (name, all, qv) in cases {
        let m = preset(name).unwrap();
        for (targets, peft) in [(LoraTargets::All, Some(all)), (LoraTargets::QueryValue, qv)] {
            let Some(peft) = peft else { continue };
            let cfg = TrainConfig {
                finetune: Finetune::Lora { rank: 16, targets, base: BaseWeights::Native },
                ..TrainConfig::new(1, 512, Precision::Bf16, Optimizer::AdamW)
            };
            assert_eq!(estimate(&m, &g, &cfg).memory.trainable_params, peft, "{name} {targets:?}");
        }
    }
}

#[test]
fn lora_keeps_a_frozen_base_and_trains_adapters() {
    let m = preset("llama-2-7b").unwrap();
    let g = gpu("a100-80gb").unwrap();
    // Megatron's closed form: with transformers' code the job replays peft's recorded step
    // (tests/lora_gpu.rs, tests/lora_truth.rs).
    let lora = |base| TrainConfig {
        finetune: Finetune::Lora { rank: 64, targets: LoraTargets::All, base },
        attention: Attention::Flash,
        framework: Framework::Megatron,
        ..TrainConfig::new(1, 512, Precision::Mixed, Optimizer::AdamW)
    };
    let e = estimate(&m, &g, &lora(BaseWeights::Native));
    // The closed form's terms: what placement gives; the replay's peak holds the same
    // tensors in allocator blocks.
    let closed = |c: &TrainConfig| memory(&m, &g, c, PipelineStage::Only, None).breakdown;
    let cf = closed(&lora(BaseWeights::Native));
    // r = 64 on every linear layer: 64 × (4·(4096+4096) + 3·(4096+11008)) × 32 layers.
    assert_eq!(e.memory.trainable_params, 64 * (4 * 8192 + 3 * 15104) * 32);
    let base16 = 2.0 * m.params() as f64;
    assert!((cf.weights - base16 - 2.0 * e.memory.trainable_params as f64).abs() < 1e3);
    assert_eq!(cf.gradients, 2.0 * e.memory.trainable_params as f64);
    assert!(
        (e.memory.breakdown.weights / cf.weights - 1.0).abs() < 1e-3,
        "{} vs {}",
        e.memory.breakdown.weights,
        cf.weights
    );
    // QLoRA: linears as bitsandbytes stores NF4 with double quantization (4.127 bits a
    // weight, QLoRA §3), fp32 embeddings and norms.
    let q = closed(&lora(BaseWeights::Nf4));
    let linears = 32.0 * (4.0 * 4096.0 * 4096.0 + 3.0 * 4096.0 * 11008.0);
    let nf4 = headroom_plan::placement::base_format(&lora(BaseWeights::Nf4)).unwrap();
    let stored: f64 = m.block_linears().iter().map(|&(k, n)| nf4.stored_bytes(k, n)).sum::<f64>() * 32.0;
    let want = stored + (m.params() as f64 - linears) * 4.0 + 2.0 * e.memory.trainable_params as f64;
    assert!((q.weights / want - 1.0).abs() < 1e-9);
    assert!((stored * 8.0 / linears - 4.127).abs() < 1e-3, "{} bits", stored * 8.0 / linears);
    // No weight gradients for the base: 4N instead of 6N per token.
    let full = estimate(&m, &g, &TrainConfig { finetune: Finetune::Full, ..lora(BaseWeights::Native) });
    assert!(e.time.as_ref().unwrap().step_time_s < full.time.as_ref().unwrap().step_time_s * 0.75);
}

/// DeepSpeed's memory estimator (research/estimation.md §1.4), t5-3b on one node of 8 GPUs, GiB:
/// ZeRO-2 with optimizer offload 2Ψ = 5.31; ZeRO-3 with optimizer offload 2Ψ/8 + the gathered layer;
/// with the parameters offloaded too, none but the few DeepSpeed never partitions.
#[test]
fn offload_moves_the_optimizer_to_the_host() {
    let m = preset("t5-3b").unwrap();
    let g = gpu("a100-80gb").unwrap();
    let cfg = |zero, offload| TrainConfig {
        parallel: Parallelism::data_parallel(8, zero),
        offload,
        ..TrainConfig::new(1, 512, Precision::Mixed, Optimizer::AdamW)
    };
    // The closed form's terms (what the replay's program is laid out from).
    let states = |c: &TrainConfig| {
        let b = memory(&m, &g, c, PipelineStage::Only, None).breakdown;
        (b.weights + b.gradients + b.optimizer) / GIB
    };
    let z2 = estimate(&m, &g, &cfg(2, Offload::Optimizer));
    assert!((states(&cfg(2, Offload::Optimizer)) - 5.31).abs() < 0.01);
    assert!((states(&cfg(3, Offload::Optimizer)) - 5.31 / 8.0).abs() < 0.01);
    let all = states(&cfg(3, Offload::OptimizerAndParams));
    // Only what DeepSpeed never partitions stays: the norms and position tables, whole.
    let kept = deepspeed::buffers(&m, &cfg(3, Offload::OptimizerAndParams), 2.0).persistent;
    assert!(kept > 0.0 && kept < (1 << 20) as f64, "{kept}");
    assert!((all * GIB / kept - 1.0).abs() < 1e-9);
    // The host holds the fp32 master, both moments and fp32 gradients: 16 bytes a parameter per node.
    assert!((z2.memory.host_bytes / (16.0 * m.params() as f64) - 1.0).abs() < 1e-9);
    assert!(
        z2.time.as_ref().unwrap().step_time_s
            > estimate(&m, &g, &cfg(2, Offload::None)).time.as_ref().unwrap().step_time_s
    );
}

#[test]
fn fp8_saves_linear_inputs_in_one_byte_and_runs_faster() {
    let m = preset("llama-3-8b").unwrap();
    let g = gpu("h100-sxm").unwrap();
    let cfg = |p| TrainConfig { attention: Attention::Flash, ..TrainConfig::new(2, 4096, p, Optimizer::AdamW) };
    let bf16 = estimate(&m, &g, &cfg(Precision::Mixed));
    let fp8 = estimate(&m, &g, &cfg(Precision::Fp8));
    assert!(fp8.memory.breakdown.activations < bf16.memory.breakdown.activations);
    assert!(fp8.memory.breakdown.weights > bf16.memory.breakdown.weights);
    assert!(fp8.time.as_ref().unwrap().step_time_s < 0.7 * bf16.time.as_ref().unwrap().step_time_s);
    let a100 = gpu("a100-80gb").unwrap();
    assert!(cfg(Precision::Fp8).check(&m, &a100).unwrap_err().0.contains("fp8"));
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
    assert!(
        !none.verdict.fits && full.verdict.fits && optimal.verdict.fits,
        "{} {} {} {:?} {:?} {:?}",
        none.verdict.fits,
        full.verdict.fits,
        optimal.verdict.fits,
        full.memory.oom,
        optimal.memory.oom,
        optimal.verdict.note
    );
    assert!(full.memory.breakdown.activations < none.memory.breakdown.activations);
    assert!(
        optimal.time.as_ref().unwrap().step_time_s <= full.time.as_ref().unwrap().step_time_s
            && optimal.time.as_ref().unwrap().step_time_s >= none.time.as_ref().unwrap().step_time_s
    );
    assert!(optimal.memory.per_gpu_bytes <= g.memory_bytes as f64);
    let most = max_micro_batch(&m, &g, &cfg(Checkpointing::Full), 1024);
    assert!(
        most >= 8 && !estimate(&m, &g, &TrainConfig { micro_batch: most + 1, ..cfg(Checkpointing::Full) }).verdict.fits
    );
}

/// A step's micro-batches repeat: the program holds as many as the allocator needs to settle
/// and the plan's work does not grow with `--accumulation` (2^31 plans as 8 do), while a
/// pipeline's per-micro-batch buffers are all counted.
#[test]
fn a_steps_micro_batches_are_replayed_once_and_counted() {
    let m = preset("llama-3-8b").unwrap();
    let g = gpu("h100-sxm").unwrap();
    let cases = [
        TrainConfig::new(1, 2048, Precision::Bf16, Optimizer::AdamW),
        TrainConfig {
            checkpointing: Checkpointing::Selective,
            ..TrainConfig::new(1, 2048, Precision::Mixed, Optimizer::AdamW)
        },
        TrainConfig {
            framework: Framework::Torchtitan,
            checkpointing: Checkpointing::PerOp,
            parallel: Parallelism::data_parallel(8, 3),
            ..TrainConfig::new(1, 2048, Precision::Mixed, Optimizer::AdamW)
        },
    ];
    for cfg in cases {
        let at = |accumulation: u64| estimate(&m, &g, &TrainConfig { accumulation, ..cfg });
        let (eight, huge) = (at(8), at(1 << 31));
        assert_eq!(eight.program.ops.len(), huge.program.ops.len(), "{}", eight.runner.builder);
        assert_eq!(eight.memory.reserved_bytes, huge.memory.reserved_bytes, "{}", eight.runner.builder);
        // The step's time counts every micro-batch.
        assert!(
            huge.time.as_ref().unwrap().step_time_s > 1e6 * eight.time.as_ref().unwrap().step_time_s,
            "{}",
            eight.runner.builder
        );
    }
    // A pipeline rank's receive buffers, one per micro-batch for the whole step: those of the
    // micro-batches past the built ones are held as one tensor, so the rank's memory grows
    // with the step's micro-batches as its buffers do.
    let pp = |accumulation: u64| {
        let cfg = TrainConfig {
            accumulation,
            framework: Framework::Torchtitan,
            checkpointing: Checkpointing::Full,
            parallel: Parallelism { data: 2, pipeline: 4, zero_stage: 3, ..Parallelism::default() },
            ..TrainConfig::new(1, 2048, Precision::Mixed, Optimizer::AdamW)
        };
        let e = estimate(&m, &GpuSpec { memory_bytes: 1 << 50, ..g }, &cfg);
        (e.program.ops.len(), e.memory.pipeline.unwrap().ranks[1].allocated_bytes)
    };
    let ((ops_32, last_32), (ops_64, last_64)) = (pp(32), pp(64));
    assert_eq!(ops_32, ops_64);
    // A middle rank holds an input and an output-gradient buffer per micro-batch: 2 × 32
    // more of 2048 tokens × 4096 in bf16.
    let buffers = 2.0 * 32.0 * 2048.0 * 4096.0 * 2.0;
    assert!((last_64 - last_32 - buffers).abs() < 64.0 * (1 << 20) as f64, "{} vs {buffers}", last_64 - last_32);
}

/// HSDP's replicas each hold the whole model states, sharded over their own group: one replica
/// per data-parallel GPU shards nothing, and plans as much as no sharding.
#[test]
fn hsdp_with_a_replica_per_gpu_shards_nothing() {
    let m = preset("llama-3-8b").unwrap();
    let g = GpuSpec { memory_bytes: 1 << 50, ..gpu("h100-sxm").unwrap() };
    let cfg = |replicate: u64, zero: u8| TrainConfig {
        framework: Framework::Torchtitan,
        parallel: Parallelism { data: 16, zero_stage: zero, replicate, ..Parallelism::default() },
        ..TrainConfig::new(1, 2048, Precision::Mixed, Optimizer::AdamW)
    };
    let states = |c: &TrainConfig| {
        let b = estimate(&m, &g, c).memory.breakdown;
        b.weights + b.optimizer
    };
    let one_each = states(&cfg(16, 3));
    assert!(one_each > 0.9 * states(&cfg(1, 0)), "{one_each}");
    assert!(one_each > 8.0 * states(&cfg(1, 3)), "{one_each}");
}

/// A plan's work grows with the model's depth by the same amount for every layer added, under
/// every builder: the sites a program names are interned once, not one a layer (a site a
/// layer made interning search every layer's name at each allocation, and a plan of 16,384
/// layers take minutes), and each layer adds the same operations wherever it sits.
#[test]
fn a_layer_adds_the_same_work_at_any_depth() {
    let base = preset("llama-3-8b").unwrap();
    let g = GpuSpec { memory_bytes: 1 << 50, ..gpu("h100-sxm").unwrap() };
    let mixed = TrainConfig::new(1, 512, Precision::Mixed, Optimizer::AdamW);
    let cases = [
        TrainConfig::new(1, 512, Precision::Bf16, Optimizer::AdamW),
        TrainConfig { checkpointing: Checkpointing::Full, ..mixed },
        TrainConfig { checkpointing: Checkpointing::Selective, ..mixed },
        TrainConfig { framework: Framework::DeepSpeed, parallel: Parallelism::data_parallel(8, 2), ..mixed },
        TrainConfig { framework: Framework::Torchtitan, parallel: Parallelism::data_parallel(8, 3), ..mixed },
        TrainConfig {
            framework: Framework::Torchtitan,
            parallel: Parallelism { data: 2, pipeline: 4, zero_stage: 3, ..Parallelism::default() },
            ..mixed
        },
    ];
    for cfg in cases {
        let at = |layers: u64| {
            let m = Model { layers, decoder_layers: layers, ..base.clone() };
            let e = estimate(&m, &g, &cfg);
            (e.runner.builder, e.program.sites.len(), e.program.ops.len())
        };
        let ((builder, sites_16, ops_16), (_, sites_32, ops_32), (_, sites_64, ops_64)) = (at(16), at(32), at(64));
        assert_eq!((sites_16, sites_32), (sites_64, sites_64), "{builder}: sites at 16, 32 and 64 layers");
        assert!(ops_32 > ops_16, "{builder}: {ops_16} operations at 16 layers, {ops_32} at 32");
        assert_eq!(ops_64 - ops_32, 2 * (ops_32 - ops_16), "{builder}: operations at 16, 32 and 64 layers");
    }
}

/// The optimizer step a plan lays out is the implementation's that runs, whatever lays out
/// the layers: torch.optim's foreach AdamW keeps a copy of every second moment for a moment
/// under any checkpointing, so a job whose plain step runs out of memory there runs out there
/// under every schedule, `optimal` included; its fused AdamW keeps none. Where only Megatron's
/// builder serves a job, the step is Megatron's fused Adam, and foreach asked for is refused.
#[test]
fn the_optimizer_step_is_the_implementations_that_runs_under_every_checkpointing() {
    let m = preset("llama-3-8b").unwrap();
    let g = gpu("h200").unwrap();
    let second_moments = 4.0 * m.params() as f64;
    let schedules = [
        Checkpointing::None,
        Checkpointing::Full,
        Checkpointing::Selective,
        Checkpointing::EveryK(2),
        Checkpointing::PerOp,
        Checkpointing::Optimal,
    ];
    for checkpointing in schedules {
        let cfg = |optimizer_impl| TrainConfig {
            framework: Framework::Torchtitan,
            checkpointing,
            optimizer_impl: Some(optimizer_impl),
            ..TrainConfig::new(1, 2048, Precision::Mixed, Optimizer::AdamW)
        };
        let (foreach, fused) =
            (estimate(&m, &g, &cfg(OptimizerImpl::Foreach)), estimate(&m, &g, &cfg(OptimizerImpl::Fused)));
        let temporary = |e: &Estimate| e.memory.breakdown.temporary;
        assert!(temporary(&foreach) > second_moments, "{checkpointing:?}: foreach keeps {}", temporary(&foreach));
        assert!(temporary(&fused) < 0.01 * second_moments, "{checkpointing:?}: fused keeps {}", temporary(&fused));
        let oom_phase = foreach.memory.oom.as_ref().map(|o| o.at.phase);
        assert!(
            !foreach.verdict.fits && oom_phase == Some(headroom_plan::program::Phase::OptimizerStep),
            "{checkpointing:?}: {oom_phase:?}"
        );
        assert!(fused.verdict.fits, "{checkpointing:?}");
    }
    let selective = TrainConfig {
        checkpointing: Checkpointing::Selective,
        ..TrainConfig::new(1, 2048, Precision::Mixed, Optimizer::AdamW)
    };
    let megatron = estimate(&m, &g, &selective);
    assert_eq!((megatron.runner.builder, megatron.runner.optimizer_impl), ("megatron", OptimizerImpl::Fused));
    let foreach = TrainConfig { optimizer_impl: Some(OptimizerImpl::Foreach), ..selective };
    let refused = Estimator::default().estimate(&Job::new(&m, &g, foreach).unwrap()).map(|_| ()).unwrap_err();
    assert!(refused.to_string().contains("fused Adam"), "{refused}");
}

/// Optimal checkpointing's solver grows with the cube of its stages: a model of the most
/// layers headroom plans is solved over runs of layers, in seconds, and its schedule still
/// keeps less than storing every layer and more than keeping one layer's input each.
#[test]
fn optimal_checkpointing_of_the_deepest_model_has_an_answer() {
    let base = preset("llama-3-8b").unwrap();
    let m = Model {
        layers: 2048,
        decoder_layers: 2048,
        hidden: 256,
        heads: 4,
        kv_heads: 4,
        head_dim: 64,
        intermediate: 688,
        vocab: 1000,
        ..base
    };
    let g = gpu("h100-sxm").unwrap();
    let cfg = |checkpointing| TrainConfig {
        checkpointing,
        optimizer_impl: Some(OptimizerImpl::Fused),
        ..TrainConfig::new(8, 512, Precision::Mixed, Optimizer::AdamW)
    };
    // The work is bounded by the stages solved (closed_form's unit test holds the bound; the
    // time is in docs/PERFORMANCE.md); here the deepest model gets an answer.
    let activations = |c| memory(&m, &g, &cfg(c), PipelineStage::Only, None).breakdown.activations;
    let optimal = activations(Checkpointing::Optimal);
    let (none, full) = (activations(Checkpointing::None), activations(Checkpointing::Full));
    assert!(optimal <= none && optimal > 0.0, "optimal {optimal}, none {none}, full {full}");
}
