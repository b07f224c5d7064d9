//! The planner's speed, as `headroom plan` runs it: one plan (its step program synthesized
//! and replayed through the allocator), `--max-batch` (replays by bisection) and the
//! README's `--recommend` (every configuration screened, the fastest replayed), and
//! `--program`: a recorded Llama-3-70B step read from its JSONL and planned.
//!
//! `cargo bench -p headroom-plan --bench plan`; figures in docs/PERFORMANCE.md.

use criterion::{criterion_group, criterion_main, Criterion};
use headroom_plan::estimate::Estimator;
use headroom_plan::gpu::gpu;
use headroom_plan::job::{Attention, Checkpointing, Job, Optimizer, Precision, TrainConfig};
use headroom_plan::model::preset;
use headroom_plan::parallel::Parallelism;
use headroom_plan::recording::Recording;
use headroom_plan::request::TrainRequest;
use headroom_plan::search::{recommend, SearchSpace};
use std::time::Duration;

fn plan(c: &mut Criterion) {
    let mut g = c.benchmark_group("plan");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(5));
    let h100 = gpu("h100-sxm").unwrap();
    // One GPU, transformers' recorded step: 32 layers, three steps, about 25,000 operations.
    let model = preset("llama-3-8b").unwrap();
    let one = TrainConfig {
        attention: Attention::Sdpa,
        checkpointing: Checkpointing::Full,
        ..TrainConfig::new(2, 4096, Precision::Bf16, Optimizer::AdamW)
    };
    let one = Job::new(&model, &h100, one).unwrap();
    let estimator = Estimator::default();
    eprintln!("one plan: {}", estimator.estimate(&one).unwrap().runner.builder);
    g.bench_function("one_plan_llama3_8b_recorded", |b| b.iter(|| estimator.estimate(&one)));
    g.bench_function("max_batch_llama3_8b_recorded", |b| b.iter(|| estimator.max_micro_batch(&one, 1 << 40)));
    // The README's --recommend: Llama-3-8B on 8 H100s, 128 sequences of 8192 tokens a step.
    let base = TrainConfig {
        accumulation: 16,
        attention: Attention::Flash,
        checkpointing: Checkpointing::Full,
        parallel: Parallelism::data_parallel(8, 3),
        ..TrainConfig::new(1, 8192, Precision::Mixed, Optimizer::AdamW)
    };
    let base = Job::new(&model, &h100, base).unwrap();
    let space = SearchSpace::for_job(&model, &h100, 8, 8192, 128);
    g.bench_function("readme_recommend", |b| b.iter(|| recommend(&base, 128, &space, &estimator, 20, None)));
    // `--program`: Llama-3-70B's step at 1 × 4096 in bf16, 80 layers and three steps (about
    // 66,000 lines), as `--dump-program` writes it and the recorder records it; read and planned
    // on a GPU it fits (one replay) and on one H200 (it runs out: replayed again unbounded).
    let m70 = preset("llama-3-70b").unwrap();
    let mut h200 = gpu("h200").unwrap();
    let request = TrainRequest { micro_batch: 1, seq: 4096, ..TrainRequest::default() };
    let synthesized = TrainRequest { precision: Precision::Bf16, ..request }.resolve(&m70, &h200).unwrap();
    let p = estimator.estimate(&synthesized).unwrap().program;
    let text = p.to_jsonl(&p.sizes(1, 4096));
    let plan_program = |gpu: &headroom_plan::gpu::GpuSpec| {
        let r = Recording::parse(text.as_bytes(), "llama-3-70b.jsonl").unwrap();
        let job = request.resolve_recorded(&m70, gpu, &r).unwrap();
        estimator.estimate(&job).unwrap().verdict.fits
    };
    g.bench_function("program_llama3_70b_h200_out_of_memory", |b| b.iter(|| plan_program(&h200)));
    h200.memory_bytes = 1 << 40;
    g.bench_function("program_llama3_70b_fits", |b| b.iter(|| plan_program(&h200)));
    g.finish();
}

criterion_group!(benches, plan);
criterion_main!(benches);
