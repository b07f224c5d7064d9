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
//! Layout: one row of `M + 1` costs per interval (a, b), intervals ordered by
//! length, so each row is computed from earlier rows with slice arithmetic the
//! compiler vectorises. Costs are stored as `f32` (rotor keeps `f64` and a
//! table of choices): 4 bytes per cell, so 200 stages × 500 slots take 41 MB.
//! No choice is stored: backtracking visits only O(L) cells and recomputes
//! the options there with the same `f32` arithmetic, which reproduces the
//! stored minimum and its tie-break exactly. The time reported for a plan is
//! recomputed in `f64` by executing the schedule, so rounding can at worst
//! pick one of two schedules within ~1e-7 of each other.

use super::chain::{Arrays, Chain, ChainError};
use super::schedule::{run, Op, Outcome};

const INF: f32 = f32::INFINITY;

/// A schedule as the decisions that produce it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tree {
    /// `Fall(a)`, `B(a)`.
    Base(usize),
    /// `Fall(a)`, the rest, `B(a)`.
    Chain(usize, Box<Tree>),
    /// `Fck(a)`, `Fn(a+1..j−1)`, the right part from j, then the left part from a.
    Leaf { a: usize, j: usize, right: Box<Tree>, left: Box<Tree> },
}

impl Tree {
    /// The operations, in order.
    pub fn ops(&self) -> Vec<Op> {
        let mut out = Vec::new();
        self.push_ops(&mut out);
        out
    }

    fn push_ops(&self, out: &mut Vec<Op>) {
        match self {
            Tree::Base(a) => out.extend([Op::Fall(*a), Op::B(*a)]),
            Tree::Chain(a, rest) => {
                out.push(Op::Fall(*a));
                rest.push_ops(out);
                out.push(Op::B(*a));
            }
            Tree::Leaf { a, j, right, left } => {
                out.push(Op::Fck(*a));
                out.extend((a + 1..*j).map(Op::Fn));
                right.push_ops(out);
                left.push_ops(out);
            }
        }
    }
}

/// Why no plan was produced.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SolveError {
    #[error(transparent)]
    Chain(#[from] ChainError),
    #[error("no schedule fits in {budget} bytes; the least budget that fits with as many slots is {least} bytes")]
    Infeasible { budget: u64, least: u64 },
    #[error("{0}")]
    BadArgument(String),
}

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
    slots: u64,
    opt: Vec<f32>,
    /// Prefix sums of forward times (in `f32`, as the table uses them).
    prefix: Vec<f64>,
}

impl Solver {
    /// Fills the table for `budget` bytes in `slots` slots.
    pub fn new(chain: &Chain, budget: u64, slots: u32) -> Result<Solver, SolveError> {
        chain.check()?;
        if slots == 0 || budget == 0 {
            return Err(SolveError::BadArgument("the budget and the number of slots must be positive".into()));
        }
        let n = chain.len_with_loss();
        if n > u16::MAX as usize {
            return Err(SolveError::BadArgument(format!("{n} stages: at most {} are supported", u16::MAX)));
        }
        let mut s = Solver::with_unit_arrays(chain.arrays(), budget, budget.div_ceil(slots as u64));
        s.slots = slots as u64;
        Ok(s)
    }

    /// Fills the table for `budget` bytes in slots of `unit` bytes.
    fn with_unit_arrays(arrays: Arrays, budget: u64, unit: u64) -> Solver {
        let n = arrays.fw.len();
        let slot_arrays = arrays.in_slots(unit);
        let m = (budget / unit) as usize;
        let mut s = Solver {
            arrays,
            slot_arrays,
            n,
            m,
            unit,
            budget,
            slots: budget.div_ceil(unit),
            opt: Vec::new(),
            prefix: Vec::new(),
        };
        s.fill();
        s
    }

    #[inline]
    fn interval(&self, a: usize, b: usize) -> usize {
        let d = b - a;
        d * self.n - d * d.saturating_sub(1) / 2 + a
    }

    fn fill(&mut self) {
        let (n, m1) = (self.n, self.m + 1);
        let cells = n * (n + 1) / 2 * m1;
        self.opt = vec![INF; cells];
        let s = &self.slot_arrays;
        let mut prefix = vec![0f64; n + 1];
        for i in 0..n {
            prefix[i + 1] = prefix[i] + s.fw[i];
        }
        self.prefix = prefix.clone();
        let sl = |v: u64| v.min(usize::MAX as u64) as usize;
        let (x, xbar, ftmp, btmp) = (&s.x, &s.xbar, &s.ftmp, &s.btmp);
        for d in 0..n {
            for a in 0..n - d {
                let b = a + d;
                let idx = self.interval(a, b);
                let (done, rest) = self.opt.split_at_mut(idx * m1);
                let row = &mut rest[..m1];
                if d == 0 {
                    let limit = sl((x[a + 1] + xbar[a + 1] + ftmp[a]).max(x[a + 1] + xbar[a + 1] + x[a] + btmp[a]));
                    let cost = (s.fw[a] + s.bw[a]) as f32;
                    for v in row.iter_mut().skip(limit) {
                        *v = cost;
                    }
                    continue;
                }
                let mmin = sl(interval_min(s, a, b));
                if mmin > self.m {
                    continue;
                }
                let row_of = |a2: usize, b2: usize| {
                    let d2 = b2 - a2;
                    let i2 = d2 * n - d2 * d2.saturating_sub(1) / 2 + a2;
                    &done[i2 * m1..(i2 + 1) * m1]
                };
                for j in a + 1..=b {
                    let xj = sl(x[j]);
                    let lo = mmin.max(xj);
                    if lo > self.m {
                        continue;
                    }
                    let sumfw = (prefix[j] - prefix[a]) as f32;
                    let right = &row_of(j, b)[..m1 - xj];
                    let left = &row_of(a, j - 1)[xj..];
                    let off = lo - xj;
                    for (r, (&rv, &lv)) in row[lo..].iter_mut().zip(right[off..].iter().zip(left[off..].iter())) {
                        // Branch-free so the loop vectorises.
                        let cost = sumfw + rv + lv;
                        *r = if cost < *r { cost } else { *r };
                    }
                }
                let xb = sl(xbar[a + 1]);
                let clo = mmin.max(sl(chain_min(s, a, b)));
                if clo <= self.m {
                    let fb = (s.fw[a] + s.bw[a]) as f32;
                    let sub = row_of(a + 1, b);
                    for (r, &sv) in row[clo..].iter_mut().zip(sub[clo - xb..].iter()) {
                        let cost = fb + sv;
                        *r = if cost < *r { cost } else { *r };
                    }
                }
            }
        }
    }

    /// Slots free for the whole chain: the budget less the network input.
    fn top_slots(&self) -> Option<usize> {
        self.m.checked_sub(self.slot_arrays.x[0] as usize)
    }

    /// The optimal time predicted by the table (before executing the schedule).
    pub fn predicted_time(&self) -> f64 {
        match self.top_slots() {
            Some(m) => self.opt[self.interval(0, self.n - 1) * (self.m + 1) + m] as f64,
            None => f64::INFINITY,
        }
    }

    /// The least budget, in bytes and to the slot, with a schedule.
    pub fn least_feasible_budget(&self) -> Option<u64> {
        let row = &self.opt[self.interval(0, self.n - 1) * (self.m + 1)..][..self.m + 1];
        let m = row.iter().position(|v| v.is_finite())?;
        Some((m as u64 + self.slot_arrays.x[0]) * self.unit)
    }

    /// The least feasible budget, searched in a table large enough to store
    /// everything, at this table's slot size.
    fn least_budget_anywhere(&self) -> u64 {
        if let Some(b) = self.least_feasible_budget() {
            return b;
        }
        let store_all = run(&self.arrays, &super::baselines::store_all_tree(self.n).ops(), None)
            .expect("store-all is a valid schedule");
        // Rounding to slots can need a little more than the byte peak.
        let slack = self.unit * (2 * self.n as u64 + 4);
        Solver::with_unit_arrays(self.arrays.clone(), store_all.peak + slack, self.unit)
            .least_feasible_budget()
            .unwrap_or(u64::MAX)
    }

    /// The least budget that has a schedule with this table's number of
    /// slots (their size grows with the budget, so it is searched upward from
    /// the least budget at this table's slot size).
    fn least_budget_for_slots(&self) -> u64 {
        let mut b = self.least_budget_anywhere();
        for _ in 0..200 {
            if b == u64::MAX {
                break;
            }
            let unit = b.div_ceil(self.slots.max(1));
            if Solver::with_unit_arrays(self.arrays.clone(), b, unit).predicted_time().is_finite() {
                return b;
            }
            b = b.saturating_add(unit.max(b / 2000));
        }
        b
    }

    /// Bytes per slot.
    pub fn unit(&self) -> u64 {
        self.unit
    }

    /// The optimal schedule, executed and measured.
    pub fn plan(&self) -> Result<Plan, SolveError> {
        let infeasible = || SolveError::Infeasible { budget: self.budget, least: self.least_budget_for_slots() };
        let m = self.top_slots().ok_or_else(infeasible)?;
        if !self.predicted_time().is_finite() {
            return Err(infeasible());
        }
        let tree = self.tree(0, self.n - 1, m);
        let ops = tree.ops();
        let outcome = run(&self.arrays, &ops, Some(self.budget)).expect("the solver's schedules fit their budget");
        Ok(Plan { tree, ops, outcome, budget: self.budget, slots: (self.budget / self.unit) as u32 })
    }

    fn row(&self, a: usize, b: usize) -> &[f32] {
        let m1 = self.m + 1;
        &self.opt[self.interval(a, b) * m1..][..m1]
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
            let cost = sumfw + self.row(j, b)[m - xj] + self.row(a, j - 1)[m];
            if cost < best {
                best = cost;
                choice = Some(j);
            }
        }
        let xb = s.xbar[a + 1] as usize;
        if mmin.max(chain_min(s, a, b) as usize) <= m {
            let cost = (s.fw[a] + s.bw[a]) as f32 + self.row(a + 1, b)[m - xb];
            if cost < best {
                best = cost;
                choice = None;
            }
        }
        debug_assert_eq!(best, self.row(a, b)[m], "backtracking must find the stored optimum");
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

/// Every stage a..b−1 runs forward at least once while the gradient of b's
/// output is held: a memory bound that no option for the interval beats.
fn interval_min(s: &Arrays, a: usize, b: usize) -> u64 {
    let mut m = s.x[b + 1] + s.x[a + 1] + s.ftmp[a];
    for k in a + 1..b {
        m = m.max(s.x[b + 1] + s.x[k] + s.x[k + 1] + s.ftmp[k]);
    }
    m
}

/// The chain option's own needs: `Fall(a)` beside the gradient of b's output,
/// and `B(a)` beside its saved data, the incoming gradient and its own.
fn chain_min(s: &Arrays, a: usize, b: usize) -> u64 {
    (s.x[b + 1] + s.xbar[a + 1] + s.ftmp[a]).max(s.x[a + 1] + s.xbar[a + 1] + s.x[a] + s.btmp[a]).max(s.xbar[a + 1])
}

/// The fastest schedule of `chain` within `budget` bytes, sizes rounded up
/// to `budget / slots`-byte slots.
pub fn solve(chain: &Chain, budget: u64, slots: u32) -> Result<Plan, SolveError> {
    Solver::new(chain, budget, slots)?.plan()
}
