//! The checkpointing solver on rotor's benchmark instance (research notes,
//! anchor-measurements §3): a homogeneous chain, forward time 1, backward 2,
//! activations of 5 slots, saved 10 slots, no transients, 500 slots of
//! budget; and the scaling in stages and in slots.
//!
//! The planner's searches are in `benches/plan.rs`.
//!
//! `cargo bench -p headroom-plan --bench checkpoint`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use headroom_plan::checkpoint::{solve, Chain};
use std::time::Duration;

fn rotor_instance(stages: usize) -> Chain {
    Chain::homogeneous(stages, 1.0, 2.0, 5, 10)
}

fn end_to_end(c: &mut Criterion) {
    let mut g = c.benchmark_group("checkpoint_solve");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    for stages in [50usize, 100, 200, 400] {
        let chain = rotor_instance(stages);
        let plan = solve(&chain, 500, 500).unwrap();
        eprintln!("L = {stages}: makespan {} (store all {}), {} ops", plan.outcome.time, 3 * stages, plan.ops.len());
        g.bench_with_input(BenchmarkId::new("stages_500_slots", stages), &chain, |b, chain| {
            b.iter(|| solve(chain, 500, 500).unwrap())
        });
    }
    // Slots: the same chain at a finer or coarser slot size (sizes stay 1% and 2% of the budget).
    for slots in [250u64, 1000] {
        let chain = Chain::homogeneous(100, 1.0, 2.0, slots / 100, slots / 50);
        g.bench_with_input(BenchmarkId::new("100_stages_slots", slots), &chain, |b, chain| {
            b.iter(|| solve(chain, slots, slots as u32).unwrap())
        });
    }
    g.finish();
    // Nothing fits: the answer (the least budget at 500 slots) comes from the feasibility
    // recurrence, with no table per byte or per slot.
    let mut g = c.benchmark_group("checkpoint_infeasible");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    // Rotor's instance in MiB instead of slots: its least budget is 30 MiB.
    for (stages, budget) in [(200usize, 1u64), (200, 20 << 20)] {
        let chain = Chain::homogeneous(stages, 1.0, 2.0, 5 << 20, 10 << 20);
        match solve(&chain, budget, 500) {
            Err(e) => eprintln!("L = {stages}, budget {budget}: {e}"),
            Ok(_) => panic!("a budget of {budget} fits {stages} stages"),
        }
        g.bench_with_input(BenchmarkId::new(format!("{stages}_stages_budget"), budget), &chain, |b, chain| {
            b.iter(|| solve(chain, budget, 500).unwrap_err())
        });
    }
    g.finish();
}

criterion_group!(benches, end_to_end);
criterion_main!(benches);
