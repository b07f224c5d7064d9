//! The dynamic program. `opt(a, b, m)`: least time to run the backwards of
//! stages a..=b, given that stage a's input is held outside `m` free slots
//! and the gradient of stage b's output is in them. Options for a < b:
//!
//! - **chain**: `Fall(a)`, solve a+1..=b with `m − x̄[a+1]`, then `B(a)`;
//! - **leaf at j** (a < j ≤ b): `Fck(a)`, `Fn(a+1..j−1)`, solve j..=b with
//!   `m − x[j]` (stage j's input held), then solve a..=j−1 with `m`.
//!
//! and for a = b: `Fall(a)`, `B(a)`. A leaf wins a tie with the chain (the
//! smaller j among leaves), as in rotor.
//!
//! The table and how it is filled are in [`super::table`]. Costs are stored
//! as `f32` (rotor keeps `f64` and a table of choices): 4 bytes per cell, so
//! 200 stages × 500 slots take 41 MB. No choice is stored: backtracking
//! visits only O(L) cells and recomputes the options there with the same
//! `f32` arithmetic, which reproduces the stored minimum and its tie-break
//! exactly. The time reported for a plan is recomputed in `f64` by executing
//! the schedule, so rounding can at worst pick one of two schedules within
//! ~1e-7 of each other.

use super::baselines::{baseline, Baseline};
use super::bounds::{base_min, chain_min, forward_min, interval_min};
use super::chain::{Arrays, Chain, ChainError};
use super::schedule::{run, simulate, Op, Outcome, Tree};
use super::table::{Table, LANES};

const INF: f32 = f32::INFINITY;

/// Why no plan was produced.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SolveError {
    #[error(transparent)]
    Chain(#[from] ChainError),
    #[error("{}", infeasible_message(*.budget, *.slots, *.least, *.least_bytes))]
    Infeasible {
        budget: u64,
        slots: u32,
        /// The least budget with a schedule at this number of slots (to one slot), or `None`
        /// when none has: rounding to slots leaves too few of them whatever the budget.
        least: Option<u64>,
        /// The least budget with a schedule when sizes are not rounded (`u64::MAX`: more than that).
        least_bytes: u64,
    },
    /// The table would take more memory than [`TABLE_LIMIT_BYTES`].
    #[error(
        "{stages} stages at {slots} slots need {} MiB for the table (stages² / 2 × slots × 4 bytes, and the passes \
         being filled), more than the {} MiB allowed; use --slots {fitting} or fewer",
        table_bytes / (1 << 20),
        TABLE_LIMIT_BYTES / (1 << 20)
    )]
    TooLarge { stages: usize, slots: u32, table_bytes: u128, fitting: u32 },
    #[error("{0}")]
    BadArgument(String),
}

fn infeasible_message(budget: u64, slots: u32, least: Option<u64>, least_bytes: u64) -> String {
    match least {
        Some(least) => {
            format!("no schedule fits in {budget} bytes; the least budget that fits at {slots} slots is {least} bytes")
        }
        None if least_bytes == u64::MAX => {
            format!("no schedule fits in {budget} bytes: the chain needs more than 2^64 bytes")
        }
        None => format!(
            "no schedule fits in {slots} slots whatever the budget: sizes rounded up to whole slots take more \
             slots than there are; use more slots (without rounding, the least budget is {least_bytes} bytes)"
        ),
    }
}

/// The most stages a chain may have, the loss included: the work grows with
/// their cube (4,096 take minutes at a few dozen slots).
pub const MAX_STAGES: usize = 4096;

/// The most memory the solver's table may take while it is filled: 2 GiB.
pub const TABLE_LIMIT_BYTES: u128 = 2 << 30;

/// Bytes of the table for `stages` stages (the loss included) and `slots` slots (slot counts
/// 0..=slots, in tiles of 16). Filling it takes more where activations are a large part of
/// the budget: up to twice this when one is as large as the budget.
pub fn table_bytes(stages: usize, slots: u32) -> u128 {
    let n = stages as u128;
    n * (n + 1) / 2 * (slots as u128 + 1).next_multiple_of(LANES as u128) * 4
}

/// Progress of a long solve: the phase, work done and the total, in any unit.
pub type Progress<'a> = &'a mut dyn FnMut(&'static str, u64, u64);

/// An optimal schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub tree: Tree,
    pub ops: Vec<Op>,
    /// Time and peak, measured by executing the schedule.
    pub outcome: Outcome,
    pub budget: u64,
    pub slots: u32,
}

/// The filled table for one chain and one budget.
pub struct Solver {
    arrays: Arrays,
    slot_arrays: Arrays,
    n: usize,
    m: usize,
    unit: u64,
    budget: u64,
    /// The number of slots asked for (the budget's slot size follows from it).
    slots: u32,
    /// Times in the table are the chain's times × this power of two, which
    /// keeps their sums well inside `f32`'s range whatever the chain's unit.
    time_scale: f64,
    /// Whether any schedule fits (the table is filled only then).
    feasible: bool,
    /// Filled only when a schedule fits.
    opt: Option<Table>,
    /// Prefix sums of forward times (in `f32`, as the table uses them).
    prefix: Vec<f64>,
}

impl Solver {
    /// Fills the table for `budget` bytes in `slots` slots.
    pub fn new(chain: &Chain, budget: u64, slots: u32) -> Result<Solver, SolveError> {
        Solver::with_progress(chain, budget, slots, &mut |_, _, _| {})
    }

    /// [`Solver::new`], reporting progress as it fills the table.
    pub fn with_progress(chain: &Chain, budget: u64, slots: u32, progress: Progress) -> Result<Solver, SolveError> {
        chain.check()?;
        if slots == 0 || budget == 0 {
            return Err(SolveError::BadArgument("the budget and the number of slots must be positive".into()));
        }
        let n = chain.len_with_loss();
        if n > MAX_STAGES {
            return Err(SolveError::BadArgument(format!(
                "{n} stages (the loss included): at most {MAX_STAGES} are supported (the work grows with the cube \
                 of the stages; group layers into stages)"
            )));
        }
        let arrays = chain.arrays();
        let unit = slot_unit(budget, slots);
        let time_scale = time_scale(&arrays);
        let slot_arrays = arrays.in_slots(unit).with_times_scaled(time_scale);
        // S slots, up to 2S − 1 when the budget is under S² bytes (a slot of a few bytes).
        let m = (budget / unit) as usize;
        // Refused before anything else: the problems whose table is too large are also those whose
        // least-budget search would take minutes.
        let bytes_at = |slots: u32| {
            let unit = slot_unit(budget, slots);
            Table::bytes(&arrays.in_slots(unit), (budget / unit) as usize)
        };
        let bytes = bytes_at(slots);
        if bytes > TABLE_LIMIT_BYTES {
            // The most slots whose table fits: fewer slots take fewer passes, and activations
            // fewer slots, so fewer of the passes beside the table.
            let (mut fits, mut over) = (0u32, slots);
            while over - fits > 1 {
                let mid = fits + (over - fits) / 2;
                if bytes_at(mid) <= TABLE_LIMIT_BYTES {
                    fits = mid;
                } else {
                    over = mid;
                }
            }
            return Err(SolveError::TooLarge { stages: n, slots, table_bytes: bytes, fitting: fits.max(1) });
        }
        let feasible = least_units(&slot_arrays) <= m as u64;
        let mut s = Solver {
            arrays,
            slot_arrays,
            n,
            m,
            unit,
            budget,
            slots,
            time_scale,
            feasible,
            opt: None,
            prefix: Vec::new(),
        };
        if feasible {
            s.fill(progress);
        }
        Ok(s)
    }

    fn fill(&mut self, progress: Progress) {
        let s = &self.slot_arrays;
        let mut prefix = vec![0f64; self.n + 1];
        for i in 0..self.n {
            prefix[i + 1] = prefix[i] + s.fw[i];
        }
        self.opt = Some(Table::fill(s, self.m, &prefix, progress));
        self.prefix = prefix;
    }

    /// Slots free for the whole chain: the budget less the network input.
    fn top_slots(&self) -> Option<usize> {
        self.m.checked_sub(self.slot_arrays.x[0] as usize)
    }

    /// The optimal time predicted by the table (before executing the
    /// schedule), in the chain's unit; infinite when nothing fits.
    pub fn predicted_time(&self) -> f64 {
        match self.top_slots() {
            Some(m) if self.feasible => self.cost(0, self.n - 1, m) as f64 / self.time_scale,
            _ => f64::INFINITY,
        }
    }

    /// The least budget, in bytes and to the slot, with a schedule at this table's slot size.
    pub fn least_feasible_budget(&self) -> Option<u64> {
        let need = least_units(&self.slot_arrays);
        need.checked_mul(self.unit)
    }

    /// Why nothing fits: the least budgets at this number of slots and in bytes.
    fn infeasible(&self, progress: Progress) -> SolveError {
        let (least, least_bytes) = least_budget(&self.arrays, self.slots, progress);
        SolveError::Infeasible { budget: self.budget, slots: self.slots, least, least_bytes }
    }

    /// Bytes per slot.
    pub fn unit(&self) -> u64 {
        self.unit
    }

    /// The optimal schedule, executed and measured.
    pub fn plan(&self) -> Result<Plan, SolveError> {
        self.plan_with_progress(&mut |_, _, _| {})
    }

    /// [`Solver::plan`], reporting the search for the least budget when nothing fits.
    pub fn plan_with_progress(&self, progress: Progress) -> Result<Plan, SolveError> {
        let Some(m) = self.top_slots().filter(|_| self.feasible && self.predicted_time().is_finite()) else {
            return Err(self.infeasible(progress));
        };
        let tree = self.tree(0, self.n - 1, m);
        let ops = tree.ops();
        let outcome = run(&self.arrays, &ops, Some(self.budget)).expect("the solver's schedules fit their budget");
        Ok(Plan { tree, ops, outcome, budget: self.budget, slots: (self.budget / self.unit) as u32 })
    }

    /// `opt(a, b, m)` from the filled table.
    fn cost(&self, a: usize, b: usize, m: usize) -> f32 {
        self.opt.as_ref().expect("the table is filled when a schedule fits").get(a, b, m)
    }

    /// The option that produced `opt(a, b)[m]`, found again: leaves in order
    /// of j with a strict comparison, then the chain, exactly as when filling.
    fn choice(&self, a: usize, b: usize, m: usize) -> Option<usize> {
        let s = &self.slot_arrays;
        let mmin = interval_min(s, a, b) as usize;
        let mut best = INF;
        let mut choice = None;
        for j in a + 1..=b {
            let xj = s.x[j] as usize;
            if xj.max(mmin) > m {
                continue;
            }
            let sumfw = (self.prefix[j] - self.prefix[a]) as f32;
            let cost = sumfw + self.cost(j, b, m - xj) + self.cost(a, j - 1, m);
            if cost < best {
                best = cost;
                choice = Some(j);
            }
        }
        let xb = s.xbar[a + 1] as usize;
        if mmin.max(chain_min(s, a, b) as usize) <= m {
            let cost = (s.fw[a] + s.bw[a]) as f32 + self.cost(a + 1, b, m - xb);
            if cost < best {
                best = cost;
                choice = None;
            }
        }
        debug_assert_eq!(best, self.cost(a, b, m), "backtracking must find the stored optimum");
        choice
    }

    fn tree(&self, a: usize, b: usize, m: usize) -> Tree {
        if a == b {
            return Tree::Base(a);
        }
        let s = &self.slot_arrays;
        match self.choice(a, b, m) {
            None => Tree::Chain(a, Box::new(self.tree(a + 1, b, m - s.xbar[a + 1] as usize))),
            Some(j) => Tree::Leaf {
                a,
                j,
                right: Box::new(self.tree(j, b, m - s.x[j] as usize)),
                left: Box::new(self.tree(a, j - 1, m)),
            },
        }
    }
}

/// The least memory, in the arrays' units, with which the whole chain has a
/// schedule, its input included (`u64::MAX`: more than that).
///
/// The table's `opt(a, b, m)` is finite exactly from some `T(a, b)` on (more
/// memory never removes an option), and each option's threshold follows from
/// its parts' thresholds: a leaf at j needs `max(mmin, T(j, b) + x[j],
/// T(a, j−1))`, the chain `max(mmin, chain_min, T(a+1, b) + x̄[a+1])`, one
/// stage `base_min`. So the least budget is found in O(n³) steps without a
/// column per slot — which is what answering "nothing fits" must not need.
fn least_units(s: &Arrays) -> u64 {
    let n = s.fw.len();
    // T twice, by start (row a holds b = a..n) and by end (column b holds a = 0..=b), so the
    // leaf options of an interval read two contiguous runs: a loop the compiler vectorises.
    let row = |a: usize| a * n - a * a.saturating_sub(1) / 2;
    let col = |b: usize| b * (b + 1) / 2;
    let mut rows = vec![0u64; n * (n + 1) / 2];
    let mut cols = vec![0u64; n * (n + 1) / 2];
    for a in (0..n).rev() {
        let ra = row(a);
        rows[ra] = base_min(s, a);
        cols[col(a) + a] = rows[ra];
        // interval_min(a, b), kept as b grows.
        let mut inner = s.x[a + 1].saturating_add(s.ftmp[a]);
        for b in a + 1..n {
            if b >= a + 2 {
                inner = inner.max(forward_min(s, b - 1));
            }
            let mmin = s.x[b + 1].saturating_add(inner);
            let chain = mmin.max(chain_min(s, a, b)).max(rows[row(a + 1) + b - a - 1].saturating_add(s.xbar[a + 1]));
            // Leaves at j = a+1..=b: T(j, b) + x[j] beside T(a, j−1).
            let right = &cols[col(b) + a + 1..=col(b) + b];
            let left = &rows[ra..ra + (b - a)];
            let leaf = right
                .iter()
                .zip(&s.x[a + 1..=b])
                .zip(left)
                .map(|((&t, &x), &l)| t.saturating_add(x).max(l))
                .min()
                .unwrap_or(u64::MAX);
            let best = chain.min(mmin.max(leaf));
            rows[ra + b - a] = best;
            cols[col(b) + a] = best;
        }
    }
    rows[row(0) + n - 1].saturating_add(s.x[0])
}

/// The least budget with a schedule at `slots` slots, to one slot (`None`
/// when no budget has one), and the least in bytes without rounding.
///
/// A budget B fits at S slots when the chain's least, with sizes rounded up
/// to slots of u = ⌊B/S⌋ bytes, is at most ⌊B/u⌋ slots. Rounding only adds,
/// so nothing below the byte-exact least fits; once a slot outgrows every
/// size, each tensor takes one slot, so if that count exceeds S no budget
/// fits. Between the two the search doubles, then halves to one slot; from
/// S² bytes on fitting is monotone (see [`slot_unit`]), so the answer is the
/// least there, and every larger budget fits.
fn least_budget(arrays: &Arrays, slots: u32, progress: Progress) -> (Option<u64>, u64) {
    let exact = least_units(arrays);
    if exact == u64::MAX || least_units(&arrays.in_slots(u64::MAX)) > slots as u64 {
        return (None, exact);
    }
    let fits = |b: u64| {
        let unit = slot_unit(b, slots);
        least_units(&arrays.in_slots(unit)) <= b / unit
    };
    let mut steps = 0u64;
    let mut report = || {
        steps += 1;
        progress("searching for the least budget", steps.min(99), 100);
    };
    if fits(exact) {
        return (Some(exact), exact);
    }
    let mut hi = exact;
    let mut lo;
    loop {
        report();
        if hi == u64::MAX {
            return (None, exact);
        }
        lo = hi;
        hi = hi.saturating_mul(2);
        if fits(hi) {
            break;
        }
    }
    while hi - lo > slot_unit(hi, slots) {
        report();
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    (Some(hi), exact)
}

/// Bytes per slot for `budget` in `slots` slots: ⌊budget / slots⌋ (at least
/// 1), so the budget holds at least `slots` whole slots. Rounded down rather
/// than up because that makes fitting monotone in the budget: from `slots²`
/// bytes on, the budget holds exactly `slots` slots, and a larger budget only
/// has larger slots, in which every size takes as many or fewer — so it fits
/// whatever a smaller budget fits. (Rounded up, a budget one byte over a
/// multiple of `slots` holds a slot fewer, and a larger budget could fail
/// where a smaller one fit.)
fn slot_unit(budget: u64, slots: u32) -> u64 {
    (budget / slots as u64).max(1)
}

/// A power of two that brings the chain's total time to (0.5, 1], so sums
/// of times in the `f32` table neither overflow nor lose their low bits to
/// underflow, whatever unit the times are in.
fn time_scale(a: &Arrays) -> f64 {
    let total: f64 = a.fw.iter().chain(&a.bw).sum();
    if total > 0.0 && total.is_finite() {
        2f64.powi(-(total.log2().ceil() as i32))
    } else {
        1.0
    }
}

/// The fastest schedule of `chain` within `budget` bytes, sizes rounded up
/// to slots of ⌊budget / slots⌋ bytes, and never slower than a baseline
/// that fits.
pub fn solve(chain: &Chain, budget: u64, slots: u32) -> Result<Plan, SolveError> {
    no_slower_than_baselines(chain, budget, slots, Solver::new(chain, budget, slots)?.plan())
}

/// [`solve`], reporting progress on long chains.
pub fn solve_with_progress(chain: &Chain, budget: u64, slots: u32, progress: Progress) -> Result<Plan, SolveError> {
    let solved = Solver::with_progress(chain, budget, slots, progress)?.plan_with_progress(progress);
    no_slower_than_baselines(chain, budget, slots, solved)
}

/// The table rounds every size up to whole slots, so near a schedule's exact
/// peak it can miss what fits: storing everything a few bytes under the budget
/// took 1.4 slots more than the budget's 500 once rounded. The baselines are
/// measured unrounded; the fastest that fits replaces a slower table schedule,
/// or answers where the table found none.
fn no_slower_than_baselines(
    chain: &Chain,
    budget: u64,
    slots: u32,
    solved: Result<Plan, SolveError>,
) -> Result<Plan, SolveError> {
    let slots = (budget / slot_unit(budget, slots)) as u32;
    let best =
        [Baseline::StoreAll, Baseline::FullRecompute, Baseline::SqrtN, Baseline::EveryK(2), Baseline::ChenGreedy]
            .into_iter()
            .filter_map(|b| {
                let tree = baseline(chain, b, budget);
                let ops = tree.ops();
                let outcome = simulate(chain, &ops, Some(budget)).ok()?;
                Some(Plan { tree, ops, outcome, budget, slots })
            })
            .min_by(|a, b| a.outcome.time.total_cmp(&b.outcome.time));
    match (solved, best) {
        (Ok(p), Some(b)) if b.outcome.time < p.outcome.time => Ok(b),
        (Err(SolveError::Infeasible { .. }), Some(b)) => Ok(b),
        (solved, _) => solved,
    }
}
