//! torchtitan's FSDP2 step under pipeline parallelism (`builders::fsdp2::pipeline`): every
//! pipeline rank planned from its schedule's own order, so that dropping a term fails here:
//! the micro-batches in flight (the first rank's activations grow with its warmup), the
//! head and loss on the last stage, the interleaved schedule's extra chunks, the gradients
//! accumulated unsharded over micro-batches, the stage kept gathered, and the outputs each
//! stage collects for `step()` to return.

use headroom_plan::builders::fsdp2::pipeline;
use headroom_plan::builders::Device;
use headroom_plan::gpu::{gpu, GpuSpec};
use headroom_plan::job::{Attention, Checkpointing, Framework, Optimizer, PipelineStage, Precision, TrainConfig};
use headroom_plan::model::Model;
use headroom_plan::parallel::{Parallelism, PipelineSchedule, StageOutputs};
use headroom_plan::program::{Op, Program, Term};
#[path = "support/plan.rs"]
mod plan;
use plan::estimate;

const GIB: f64 = (1u64 << 30) as f64;

/// A Llama-shaped model small enough to replay quickly: 32 layers, 4096 wide.
fn model() -> Model {
    Model::from_hf_config(
        r#"{"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 131072, "tie_word_embeddings": false}"#,
        "llama-32l",
    )
    .unwrap()
}

fn h100() -> GpuSpec {
    GpuSpec { memory_bytes: 96 << 30, ..gpu("h100-sxm").unwrap() }
}

fn job(pp: u64, v: u64, schedule: PipelineSchedule, micro_batches: u64) -> TrainConfig {
    TrainConfig {
        accumulation: micro_batches,
        checkpointing: Checkpointing::Full,
        parallel: Parallelism {
            data: 4,
            tensor: 2,
            pipeline: pp,
            virtual_stages: v,
            schedule,
            zero_stage: 3,
            ..Parallelism::default()
        },
        attention: Attention::Flash,
        framework: Framework::Torchtitan,
        ..TrainConfig::new(1, 8192, Precision::Mixed, Optimizer::AdamW)
    }
}

fn rank_program(cfg: &TrainConfig, rank: u64) -> Program {
    let g = h100();
    pipeline::program(&model(), cfg, Device::Gpu(&g), 0.0, 2, rank).unwrap()
}

/// The bytes of one term live over the program: the most at once, and what is left at its end.
fn term_live(p: &Program, cfg: &TrainConfig, term: Term) -> (f64, f64) {
    let sizes = p.sizes(cfg.micro_batch, cfg.seq);
    let (mut live, mut peak) = (0u64, 0u64);
    for op in &p.ops {
        match *op {
            Op::Alloc(id) if p.tensors[id as usize].term == term => live += sizes[id as usize],
            Op::Free(id) if p.tensors[id as usize].term == term => live -= sizes[id as usize],
            _ => {}
        }
        peak = peak.max(live);
    }
    (peak as f64, live as f64)
}

/// The most bytes of one term live at once over the program.
fn term_peak(p: &Program, cfg: &TrainConfig, term: Term) -> f64 {
    term_live(p, cfg, term).0
}

#[test]
fn the_first_ranks_activations_scale_with_its_warmup() {
    // 1F1B: rank 0 holds min(micro-batches, pp) in flight; with fewer micro-batches than
    // stages, fewer. Its activations follow.
    let many = job(4, 1, PipelineSchedule::Schedule1F1B, 8);
    let two = job(4, 1, PipelineSchedule::Schedule1F1B, 2);
    let a4 = term_peak(&rank_program(&many, 0), &many, Term::Activations);
    let a2 = term_peak(&rank_program(&two, 0), &two, Term::Activations);
    // Each micro-batch in flight keeps 8 blocks' inputs and the stage's output (a 4096 ×
    // 8192 / 2 bf16 tensor each, 32 MiB); the recompute of one block comes on top of both.
    // Every micro-batch, in flight or not, has its buffer for the gradient the next stage
    // sends back (`grad_recv_info`), the same size.
    let io = 4096.0 * 8192.0 / 2.0 * 2.0;
    let per_mb = 9.0 * io;
    let want = 2.0 * per_mb + (8.0 - 2.0) * io;
    assert!(((a4 - a2) / want - 1.0).abs() < 0.05, "{} vs {}", a4 / GIB, a2 / GIB);
    // The last rank has one in flight whatever the count.
    let last = term_peak(&rank_program(&many, 3), &many, Term::Activations);
    assert!(last < a2, "the last rank holds one micro-batch: {} vs {}", last / GIB, a2 / GIB);
}

#[test]
fn the_last_stage_holds_the_head_and_the_loss() {
    let cfg = job(4, 1, PipelineSchedule::Schedule1F1B, 8);
    let first = rank_program(&cfg, 0);
    let last = rank_program(&cfg, 3);
    assert_eq!(term_peak(&first, &cfg, Term::Logits), 0.0);
    // bf16 logits kept as the stage's output, log-softmax's fp32 output, and the fp32
    // gradients of the loss: vocabulary / TP × 8192 tokens.
    let logits = term_peak(&last, &cfg, Term::Logits);
    let row = 128256.0 / 2.0 * 8192.0;
    assert!(logits >= row * (2.0 + 4.0 + 4.0), "{}", logits / GIB);
}

/// PyTorch's `output_chunks`: under `every` (PyTorch before 2.8) each stage keeps every
/// micro-batch's output to the next step; under `last` only the last stage its logits; and
/// `_merge_outputs` concatenates the last stage's at the schedule's end.
#[test]
fn the_outputs_collected_for_the_step_are_kept_where_pytorch_keeps_them() {
    let with = |o: StageOutputs| {
        let mut cfg = job(4, 1, PipelineSchedule::Schedule1F1B, 8);
        cfg.parallel.stage_outputs = o;
        cfg
    };
    let (none, last, every) = (with(StageOutputs::None), with(StageOutputs::LastStage), with(StageOutputs::EveryStage));
    // The last stage's bf16 logits, vocabulary / TP × 8192 tokens a micro-batch: under
    // `none` one lives at a time beside the loss's fp32 tensors (9 such rows in all); kept,
    // all 8 are live once the last backward ends, and their concatenation (8 more) beside
    // them.
    let row = 128256.0 / 2.0 * 8192.0 * 2.0;
    let base = term_peak(&rank_program(&none, 3), &none, Term::Logits);
    for cfg in [&last, &every] {
        let kept = term_peak(&rank_program(cfg, 3), cfg, Term::Logits);
        assert!(kept >= 15.99 * row && kept > base + 6.0 * row, "{} vs {} GiB", kept / GIB, base / GIB);
    }
    // A middle stage's output (4096 × 8192 / 2 bf16, 32 MiB) stays past its backward only
    // under `every`: rank 1 holds 3 in flight at most, and 8 once its backwards are done.
    let out = 4096.0 * 8192.0 / 2.0 * 2.0;
    let a_none = term_peak(&rank_program(&none, 1), &none, Term::Activations);
    let a_last = term_peak(&rank_program(&last, 1), &last, Term::Activations);
    let a_every = term_peak(&rank_program(&every, 1), &every, Term::Activations);
    assert_eq!(a_none, a_last);
    assert!(a_every > a_none, "{} vs {} GiB", a_every / GIB, a_none / GIB);
    // The activations live when the program ends, after its last optimizer step: the
    // receive buffers, and under `every` the step's 8 outputs.
    let at_end = |cfg: &TrainConfig| term_live(&rank_program(cfg, 1), cfg, Term::Activations).1;
    let kept = at_end(&every) - at_end(&none);
    assert!((kept / (8.0 * out) - 1.0).abs() < 0.01, "{} MiB", kept / (1u64 << 20) as f64);
}

#[test]
fn interleaved_holds_more_than_1f1b_at_equal_micro_batches() {
    // PyTorch's warmup: 1F1B's rank 0 holds pp = 4 stage-sized chunks; interleaved with 2
    // chunks a rank holds (v+1)·pp - 1 = 11 half-stage chunks, 5.5 stages' worth.
    let one = job(4, 1, PipelineSchedule::Schedule1F1B, 8);
    let two = job(4, 2, PipelineSchedule::Interleaved1F1B, 8);
    let a1 = term_peak(&rank_program(&one, 0), &one, Term::Activations);
    let a2 = term_peak(&rank_program(&two, 0), &two, Term::Activations);
    assert!(a2 > 1.2 * a1, "interleaved {} GiB, 1F1B {} GiB", a2 / GIB, a1 / GIB);
}

#[test]
fn gradients_accumulate_unsharded_in_fp32_and_the_stage_stays_gathered() {
    // Every backward but the last runs without the gradient sync or the reshard: the
    // stage's gradients in fp32, unsharded, and its parameters gathered in bf16.
    let cfg = job(4, 1, PipelineSchedule::Schedule1F1B, 8);
    let p = rank_program(&cfg, 1);
    let stage_params = 8.0 * model().layer_params() as f64 / 2.0;
    let grads = term_peak(&p, &cfg, Term::Gradients);
    assert!(grads >= 4.0 * stage_params, "{} GiB", grads / GIB);
    let weights = term_peak(&p, &cfg, Term::Weights);
    // fp32 shards (1/4) and the bf16 stage gathered.
    assert!(weights >= (4.0 / 4.0 + 2.0) * stage_params, "{} GiB", weights / GIB);
}

#[test]
fn every_rank_is_planned_and_the_peak_named() {
    let m = model();
    for (v, schedule) in [
        (1, PipelineSchedule::Schedule1F1B),
        (2, PipelineSchedule::Interleaved1F1B),
        (2, PipelineSchedule::InterleavedZeroBubble),
        (2, PipelineSchedule::ZbvZeroBubble),
    ] {
        let cfg = job(4, v, schedule, 8);
        cfg.check(&m, &h100()).unwrap();
        let e = estimate(&m, &h100(), &cfg);
        assert_eq!(e.runner.builder, "torchtitan-pipeline");
        let pr = e.memory.pipeline.as_ref().expect("every rank planned");
        assert_eq!(pr.ranks.len(), 4);
        let peak = &pr.ranks[pr.peak as usize];
        assert_eq!(e.memory.reserved_bytes, peak.reserved_bytes);
        assert!(pr.ranks.iter().all(|r| r.reserved_bytes <= peak.reserved_bytes));
        assert_eq!(pr.ranks.iter().map(|r| r.layout.layers).sum::<u64>(), 32, "{schedule:?}");
        if peak.layout.stages.contains(&0) {
            assert_eq!(e.memory.stage, PipelineStage::First);
        }
        // The program `--dump-program` writes is the rank that peaks.
        let dumped = e.program.clone();
        let est = headroom_plan::estimate::Estimator::default();
        let settings =
            headroom_plan::replay::ReplaySettings { capacity: u64::MAX, config: est.alloc.clone(), policy: est.policy };
        let r = headroom_plan::replay::replay(&dumped, &dumped.sizes(cfg.micro_batch, cfg.seq), &settings);
        assert_eq!(r.peak_reserved as f64, peak.reserved_bytes, "{schedule:?}");
    }
}

#[test]
fn bad_combinations_are_refused_by_name() {
    let m = model();
    let why = |cfg: TrainConfig| cfg.check(&m, &h100()).unwrap_err().to_string();
    assert!(why(job(4, 1, PipelineSchedule::Interleaved1F1B, 8)).contains("at least 2 stages per rank"));
    assert!(why(job(4, 3, PipelineSchedule::ZbvZeroBubble, 8)).contains("exactly 2 stages per rank"));
    assert!(why(job(1, 2, PipelineSchedule::Interleaved1F1B, 8)).contains("more than one pipeline stage"));
    assert!(why(job(32, 2, PipelineSchedule::Interleaved1F1B, 64)).contains("at least as many layers"));
    assert!(why(job(4, 2, PipelineSchedule::Interleaved1F1B, 9)).contains("multiple of their rounds"));
    let megatron = TrainConfig { framework: Framework::Megatron, ..job(4, 2, PipelineSchedule::ZbvZeroBubble, 8) };
    assert!(why(megatron).contains("--framework torchtitan"));
}

/// The compiled blocks and loss, and float8's fp8 all-gather, on every pipeline rank: the
/// last stage's loss keeps the logits and two fp32 values a token instead of log-softmax's
/// fp32 output, and each rank's gathered stage is one byte a linear weight.
#[test]
fn compile_and_float8_reach_every_rank() {
    let eager = job(4, 1, PipelineSchedule::Schedule1F1B, 8);
    let compiled = TrainConfig { compile: true, compile_loss: true, precision: Precision::Fp8, ..eager };
    for rank in 0..4 {
        let (e, c) = (rank_program(&eager, rank), rank_program(&compiled, rank));
        c.check().unwrap();
        let weights = |p: &Program, cfg: &TrainConfig| term_peak(p, cfg, Term::Weights);
        assert!(weights(&c, &compiled) < weights(&e, &eager), "rank {rank}");
        if rank == 3 {
            let logits = |p: &Program, cfg: &TrainConfig| term_peak(p, cfg, Term::Logits);
            // Eager: the bf16 logits, log-softmax's fp32 output and, in the backward, two fp32
            // gradients of it (TP 2: half the vocabulary); compiled: the logits, two fp32
            // values a token and the bf16 gradient.
            let (el, cl) = (logits(&e, &eager), logits(&c, &compiled));
            assert!(cl < 0.5 * el, "{} vs {} GiB", cl / GIB, el / GIB);
        }
    }
}
