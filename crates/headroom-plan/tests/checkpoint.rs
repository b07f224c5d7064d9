//! The checkpointing solver: REVOLVE's closed form, rotor's values on
//! homogeneous chains, brute force on small chains, and the invariants.

use headroom_plan::checkpoint::{
    baseline, revolve_forwards, revolve_forwards_dp, revolve_repetitions, simulate, solve, Baseline, Chain, Loss, Plan,
    SolveError, Solver, Stage, Tree,
};
use proptest::prelude::*;

#[test]
fn revolve_closed_form_table() {
    // (l, s, F, t) from the research notes' table (Griewank & Walther).
    let table = [
        (5, 1, 10, 4),
        (5, 2, 6, 2),
        (5, 3, 5, 2),
        (5, 4, 4, 1),
        (5, 10, 4, 1),
        (10, 1, 45, 9),
        (10, 2, 20, 3),
        (10, 3, 15, 2),
        (10, 4, 14, 2),
        (10, 5, 13, 2),
        (10, 10, 9, 1),
        (20, 2, 65, 5),
        (20, 3, 45, 3),
        (20, 5, 33, 2),
        (20, 10, 28, 2),
        (50, 2, 285, 9),
        (50, 4, 144, 4),
        (50, 10, 88, 2),
        (100, 1, 4950, 99),
        (100, 3, 490, 7),
        (100, 5, 316, 4),
        (100, 10, 222, 3),
        (1000, 2, 28820, 44),
        (1000, 3, 12155, 17),
        (1000, 4, 7998, 10),
        (1000, 5, 6284, 8),
        (1000, 10, 3636, 4),
        (56, 3, 210, 5),
        (55, 3, 205, 5),
    ];
    for (l, s, f, t) in table {
        assert_eq!(revolve_forwards(l, s), f, "F({l}, {s})");
        assert_eq!(revolve_repetitions(l, s), t, "t({l}, {s})");
    }
    // β(10, 10) = 184,756: ten snapshots reverse that many steps with at most ten repetitions.
    assert_eq!(revolve_repetitions(184_756, 10), 10);
    assert_eq!(revolve_repetitions(184_757, 10), 11);
}

#[test]
fn revolve_closed_form_equals_its_dynamic_program() {
    for s in 1..=6 {
        for l in 1..80 {
            assert_eq!(revolve_forwards(l as u64, s as u64), revolve_forwards_dp(l, s), "l {l} s {s}");
        }
    }
}

/// Enough slots for one byte each at the budgets of these tests.
const BYTE_SLOTS: u32 = 1 << 20;

fn cost(chain: &Chain, budget: u64) -> Option<f64> {
    match solve(chain, budget, BYTE_SLOTS) {
        Ok(p) => Some(p.outcome.time),
        Err(SolveError::Infeasible { .. }) => None,
        Err(e) => panic!("{e}"),
    }
}

/// Rotor's own values (upstream C solver, measured in the research notes)
/// on homogeneous chains, uf = ub = 1, x = x̄ = 1, one byte per slot.
#[test]
fn rotor_values_on_homogeneous_chains() {
    type Row = (u64, Option<f64>);
    let cases: [(usize, &[Row]); 3] = [
        (5, &[(4, None), (5, Some(19.0)), (6, Some(13.0)), (7, Some(12.0)), (8, Some(10.0)), (12, Some(10.0))]),
        (
            8,
            &[
                (4, None),
                (5, Some(43.0)),
                (6, Some(26.0)),
                (7, Some(22.0)),
                (8, Some(20.0)),
                (9, Some(19.0)),
                (10, Some(18.0)),
                (11, Some(16.0)),
            ],
        ),
        (
            10,
            &[
                (5, Some(64.0)),
                (6, Some(36.0)),
                (7, Some(29.0)),
                (8, Some(27.0)),
                (9, Some(25.0)),
                (10, Some(24.0)),
                (11, Some(23.0)),
                (12, Some(22.0)),
                (13, Some(20.0)),
                (30, Some(20.0)),
            ],
        ),
    ];
    for (l, rows) in cases {
        let chain = Chain::homogeneous(l, 1.0, 1.0, 1, 1);
        for &(m, want) in rows {
            assert_eq!(cost(&chain, m), want, "L = {l}, M = {m}");
        }
    }
}

fn heterogeneous() -> Chain {
    let uf = [1.0, 2.0, 3.0, 1.0];
    let ub = [2.0, 4.0, 6.0, 2.0];
    let x = [2u64, 4, 1, 3, 2];
    let xbar = [6u64, 3, 5, 3];
    let ftmp = [0u64, 1, 0, 0];
    let btmp = [1u64, 0, 2, 0];
    Chain {
        input_bytes: x[0],
        stages: (0..4)
            .map(|i| Stage {
                name: format!("s{i}"),
                forward_time: uf[i],
                backward_time: ub[i],
                output_bytes: x[i + 1],
                saved_bytes: xbar[i],
                forward_tmp_bytes: ftmp[i],
                backward_tmp_bytes: btmp[i],
            })
            .collect(),
        loss: Loss::default(),
    }
}

/// The heterogeneous instance of the research notes. Rotor gives: ≤ 14
/// infeasible, 15 → 28, 16–21 → 24, 22–23 → 22, ≥ 24 → 21. headroom also
/// charges a saved forward against the gradient in memory at that moment; on
/// this chain that agrees everywhere rotor's schedules are valid.
#[test]
fn heterogeneous_instance() {
    let c = heterogeneous();
    let got: Vec<Option<f64>> = (12..=26).map(|m| cost(&c, m)).collect();
    let rotor: Vec<Option<f64>> = (12..=26)
        .map(|m| match m {
            ..=14 => None,
            15 => Some(28.0),
            16..=21 => Some(24.0),
            22..=23 => Some(22.0),
            _ => Some(21.0),
        })
        .collect();
    assert_eq!(got, rotor);
}

/// Every schedule the decision trees can express, for chains of n stages (loss included).
fn all_trees(a: usize, b: usize) -> Vec<Tree> {
    if a == b {
        return vec![Tree::Base(a)];
    }
    let mut out: Vec<Tree> = all_trees(a + 1, b).into_iter().map(|t| Tree::Chain(a, Box::new(t))).collect();
    for j in a + 1..=b {
        for right in all_trees(j, b) {
            for left in all_trees(a, j - 1) {
                out.push(Tree::Leaf { a, j, right: Box::new(right.clone()), left: Box::new(left) });
            }
        }
    }
    out
}

fn chain_from(v: &[(u8, u8, u8, u8, u8, u8)], input: u8) -> Chain {
    Chain {
        input_bytes: input as u64,
        stages: v
            .iter()
            .enumerate()
            .map(|(i, &(f, b, x, extra, ft, bt))| Stage {
                name: format!("s{i}"),
                forward_time: f as f64,
                backward_time: b as f64,
                output_bytes: x as u64,
                saved_bytes: x as u64 + extra as u64,
                forward_tmp_bytes: ft as u64,
                backward_tmp_bytes: bt as u64,
            })
            .collect(),
        loss: Loss { forward_time: 1.0, backward_time: 1.0, ..Loss::default() },
    }
}

fn stage() -> impl Strategy<Value = (u8, u8, u8, u8, u8, u8)> {
    (1u8..5, 1u8..8, 1u8..6, 0u8..6, 0u8..3, 0u8..3)
}

type Solve = fn(&Chain, u64, u32) -> Result<Plan, SolveError>;

/// The solver against every schedule the trees express, at every budget.
fn against_brute_force(stages: &[(u8, u8, u8, u8, u8, u8)], input: u8, solve: Solve) -> Result<(), TestCaseError> {
    let chain = chain_from(stages, input);
    let n = chain.len_with_loss();
    let trees = all_trees(0, n - 1);
    let outcomes: Vec<_> =
        trees.iter().map(|t| simulate(&chain, &t.ops(), None).expect("trees give valid schedules")).collect();
    let max_peak = outcomes.iter().map(|o| o.peak).max().unwrap();
    for budget in 1..=max_peak + 1 {
        let brute = outcomes.iter().filter(|o| o.peak <= budget).map(|o| o.time).fold(f64::INFINITY, f64::min);
        match solve(&chain, budget, BYTE_SLOTS) {
            Ok(plan) => {
                prop_assert!(plan.outcome.peak <= budget);
                prop_assert!(
                    (plan.outcome.time - brute).abs() < 1e-6,
                    "budget {}: solver {} brute force {}",
                    budget,
                    plan.outcome.time,
                    brute
                );
            }
            Err(SolveError::Infeasible { least, least_bytes, .. }) => {
                prop_assert!(brute.is_infinite(), "budget {}: brute force found {}", budget, brute);
                let least_brute = outcomes.iter().map(|o| o.peak).min().unwrap();
                prop_assert_eq!(least, Some(least_brute));
                prop_assert_eq!(least_bytes, least_brute);
            }
            Err(e) => return Err(TestCaseError::fail(e.to_string())),
        }
    }
    Ok(())
}

/// The negative control: a solver with an off-by-one in its memory check (it plans for one
/// byte more than the budget) must be caught by the brute-force suite.
#[test]
fn negative_control_a_solver_that_overruns_its_budget_by_one_byte_is_caught() {
    let overrun: Solve = |chain, budget, slots| solve(chain, budget + 1, slots);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let result = runner.run(&(proptest::collection::vec(stage(), 1..6), 1u8..6), |(stages, input)| {
        against_brute_force(&stages, input, overrun)
    });
    assert!(
        matches!(result, Err(proptest::test_runner::TestError::Fail(..))),
        "the brute-force suite did not catch a solver that overruns its budget: {result:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// The dynamic program's time equals the best of every schedule the
    /// trees express, executed by the validator, at every budget.
    #[test]
    fn equals_brute_force(stages in proptest::collection::vec(stage(), 1..6), input in 1u8..6) {
        against_brute_force(&stages, input, solve)?;
    }

    /// Monotone in the budget, store-all above its peak, never worse than a baseline that fits.
    #[test]
    fn invariants(stages in proptest::collection::vec(stage(), 1..14), input in 1u8..6) {
        let chain = chain_from(&stages, input);
        let all = simulate(&chain, &baseline(&chain, Baseline::StoreAll, 0).ops(), None).unwrap();
        let mut last = f64::INFINITY;
        for budget in 1..=all.peak + 2 {
            let t = cost(&chain, budget).unwrap_or(f64::INFINITY);
            prop_assert!(t <= last + 1e-9, "not monotone at {}", budget);
            last = t;
            for b in [Baseline::FullRecompute, Baseline::SqrtN, Baseline::EveryK(2), Baseline::EveryK(3), Baseline::ChenGreedy] {
                let o = simulate(&chain, &baseline(&chain, b, budget).ops(), None).unwrap();
                if o.peak <= budget {
                    prop_assert!(t <= o.time + 1e-6, "{} beats the solver at {}", b.name(), budget);
                }
            }
        }
        prop_assert!((last - all.time).abs() < 1e-9, "store-all time above its peak");
    }
}

#[test]
fn slots_round_sizes_up_so_plans_fit_in_bytes() {
    let chain = Chain::homogeneous(60, 1.0, 2.0, 5_000_000, 10_000_000);
    let all = simulate(&chain, &baseline(&chain, Baseline::StoreAll, 0).ops(), None).unwrap();
    let budget = all.peak / 4;
    let plan = solve(&chain, budget, 500).unwrap();
    assert!(plan.outcome.peak <= budget);
    assert!(plan.outcome.time > all.time && plan.outcome.recomputations > 0);
    let s = Solver::new(&chain, budget, 500).unwrap();
    assert!((s.predicted_time() - plan.outcome.time).abs() < 1e-3);
}

fn gpt2_layers() -> Chain {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/chains/gpt2-small-layers.json");
    Chain::from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Budgets nothing fits are answered from the feasibility thresholds, with
/// the least budget at the asked slot count, never a table per byte.
#[test]
fn infeasible_budgets_name_the_least_that_fits_at_their_slots() {
    let chain = gpt2_layers();
    for budget in [1, 1 << 10, 100 << 10, 600 << 20] {
        match solve(&chain, budget, 500) {
            Err(SolveError::Infeasible { least: Some(least), least_bytes, .. }) => {
                assert!(least >= least_bytes && least > budget, "{budget}: {least} {least_bytes}");
                assert!(solve(&chain, least, 500).is_ok(), "the least budget printed fits");
                // Within one slot: a slot less does not.
                let slot = least.div_ceil(500);
                assert!(solve(&chain, least - slot, 500).is_err(), "{budget}: {least} is not the least to a slot");
            }
            other => panic!("{budget}: {other:?}"),
        }
    }
    // One slot holds one tensor at a time: the table fits nothing, whatever the budget; a
    // baseline that fits unrounded still answers, and where none does the error says so.
    let plan = solve(&chain, 1 << 30, 1).unwrap();
    assert!(plan.outcome.peak <= 1 << 30);
    match solve(&chain, 600 << 20, 1) {
        Err(e @ SolveError::Infeasible { least: None, .. }) => {
            assert!(e.to_string().contains("whatever the budget"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn chains_too_large_to_add_up_or_to_tabulate_are_refused_by_name() {
    let stage = |t: f64, size: u64| Stage {
        name: String::new(),
        forward_time: t,
        backward_time: t,
        output_bytes: size,
        saved_bytes: size,
        forward_tmp_bytes: 0,
        backward_tmp_bytes: 0,
    };
    let chain = |t: f64, size: u64, n: usize| Chain {
        input_bytes: size,
        stages: vec![stage(t, size); n],
        loss: Loss::default(),
    };
    assert!(matches!(solve(&chain(1.0, 1 << 62, 8), 1 << 30, 500), Err(SolveError::Chain(_))));
    assert!(matches!(solve(&chain(1e308, 1, 2), 1 << 30, 500), Err(SolveError::Chain(_))));
    // Times near the top of f64 still solve: the table works in a scaled unit.
    let big = solve(&chain(1e300, 1 << 20, 6), 40 << 20, 500).unwrap();
    assert!((big.outcome.time / 12e300 - 1.0).abs() < 1e-12, "{}", big.outcome.time);
    let tiny = solve(&chain(1e-300, 1 << 20, 6), 40 << 20, 500).unwrap();
    assert!((tiny.outcome.time / 12e-300 - 1.0).abs() < 1e-12, "{}", tiny.outcome.time);
    match solve(&Chain::homogeneous(3000, 1.0, 2.0, 5, 10), 500, 500) {
        Err(e @ SolveError::TooLarge { fitting, .. }) => {
            assert!(fitting < 500 && e.to_string().contains(&format!("--slots {fitting}")), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 60, ..ProptestConfig::default() })]

    /// At few slots, rounding matters: the least budget reported fits at
    /// those slots, and no budget below the unrounded least fits.
    #[test]
    fn least_budget_at_few_slots_fits(stages in proptest::collection::vec(stage(), 1..10), input in 1u8..6, slots in 3u32..60, scale in 1u64..5000) {
        let mut chain = chain_from(&stages, input);
        chain.input_bytes *= scale;
        for s in &mut chain.stages {
            s.output_bytes *= scale;
            s.saved_bytes *= scale;
            s.forward_tmp_bytes *= scale;
            s.backward_tmp_bytes *= scale;
        }
        match solve(&chain, 1, slots) {
            Err(SolveError::Infeasible { least, least_bytes, .. }) => {
                prop_assert!(least_bytes > 1);
                if least_bytes > 1 {
                    prop_assert!(solve(&chain, least_bytes - 1, slots.max(1 << 16)).is_err());
                }
                if let Some(l) = least {
                    prop_assert!(l >= least_bytes);
                    let plan = solve(&chain, l, slots);
                    prop_assert!(plan.is_ok(), "{:?}", plan);
                    prop_assert!(plan.unwrap().outcome.peak <= l);
                    // From slots² bytes on, every larger budget fits too.
                    let from = l.max((slots as u64).pow(2));
                    for b in [from, from + 1, from + from / 3 + 7, 2 * from + 1] {
                        prop_assert!(solve(&chain, b, slots).is_ok(), "{} fits but {} does not", l, b);
                    }
                }
            }
            other => return Err(TestCaseError::fail(format!("{other:?}"))),
        }
    }
}

/// Rotor's benchmark instance (research notes, anchor-measurements §3): forward 1,
/// backward 2, activations of 5 slots, saved data of 10, a budget of 500 slots. Rotor's C
/// solver finds makespans 152, 353 and 754 for 50, 100 and 200 stages; so must headroom
/// (docs/PERFORMANCE.md and docs/VALIDATION.md quote these).
#[test]
fn rotor_benchmark_makespans() {
    for (stages, makespan) in [(50usize, 152.0), (100, 353.0), (200, 754.0)] {
        let plan = solve(&Chain::homogeneous(stages, 1.0, 2.0, 5, 10), 500, 500).unwrap();
        assert_eq!(plan.outcome.time, makespan, "{stages} stages");
    }
}

/// Sizes rounded up to slots can push storing everything over a budget it fits unrounded:
/// the answer is never slower than a baseline that fits, from just under the store-all peak
/// (where another baseline or the table answers) to well above it.
#[test]
fn never_slower_than_a_baseline_that_fits_at_coarse_slots() {
    let chain = gpt2_layers();
    let all = simulate(&chain, &baseline(&chain, Baseline::StoreAll, u64::MAX).ops(), None).unwrap();
    for permille in 980..1030u64 {
        let budget = all.peak / 1000 * permille;
        let plan = solve(&chain, budget, 500).unwrap();
        assert!(plan.outcome.peak <= budget, "{budget}: peak {}", plan.outcome.peak);
        for b in
            [Baseline::StoreAll, Baseline::FullRecompute, Baseline::SqrtN, Baseline::EveryK(2), Baseline::ChenGreedy]
        {
            if let Ok(o) = simulate(&chain, &baseline(&chain, b, budget).ops(), Some(budget)) {
                assert!(plan.outcome.time <= o.time, "{budget}: {} over {}'s {}", plan.outcome.time, b.name(), o.time);
            }
        }
    }
}
