//! Optimal activation checkpointing for a chain of layers under a memory budget.
//!
//! A network is a chain of stages 0..L−1 followed by the loss (stage L).
//! Stage i maps activation aᵢ to aᵢ₊₁. Training runs every forward, then every
//! backward in reverse; the backward of stage i needs what its forward saved.
//! Saving everything is fastest and takes the most memory; keeping only some
//! stage inputs and recomputing the rest during the backward trades time for
//! memory. [`solve`] finds the fastest schedule that fits a budget — the
//! dynamic program of Beaumont et al., "Optimal checkpointing for
//! heterogeneous chains" (rotor), over the memory model below — and
//! [`simulate`] executes any schedule step by step to check it.
//!
//! ## The memory model
//!
//! Tensors: `X[i]` (stage i's input aᵢ, `x[i]` bytes), `X̄[i+1]` (everything
//! stage i's backward needs, `x̄[i+1]` bytes, which includes its output aᵢ₊₁),
//! `G[i]` (the gradient of aᵢ, `x[i]` bytes). Operations:
//!
//! | op | needs | while running, extra | after |
//! |---|---|---|---|
//! | `Fck(i)` forward, keep input | aᵢ | `x[i+1] + ftmp[i]` | + `X[i+1]` |
//! | `Fn(i)` forward, drop input | `X[i]` | `x[i+1] + ftmp[i]` | + `X[i+1]`, − `X[i]` |
//! | `Fall(i)` forward, save for backward | aᵢ | `x̄[i+1] + ftmp[i]` | + `X̄[i+1]` |
//! | `B(i)` backward | `X̄[i+1]`, `G[i+1]` | `x[i] + btmp[i]` | + `G[i]`, − `X̄[i+1]`, − `G[i+1]`, − `X[i]` |
//!
//! At the start `X[0]` and `G[L+1]` (0 bytes) are in memory; at the end only
//! `G[0]`. The budget counts everything, `X[0]` included. `B(i)` holds its
//! input until it is done: this is rotor's own convention (the derived table
//! in the research notes frees it one slot earlier, so its budgets are one
//! slot lower). headroom also charges the forward of a saved stage against
//! the gradient actually in memory at that moment, which rotor does not
//! check; on chains whose activations do not grow along the chain, the two
//! agree.
//!
//! Sizes are discretised into slots of ⌊budget / slots⌋ bytes, rounded up
//! (rotor's default is 500 slots), so a schedule that fits in slots fits in
//! bytes; from `slots²` bytes of budget on, any budget larger than one that
//! fits also fits.

mod baselines;
mod bounds;
mod chain;
mod revolve;
mod schedule;
mod solver;
mod table;

pub use baselines::{baseline, Baseline};
pub use chain::{Chain, ChainError, Loss, Stage};
pub use revolve::{revolve_forwards, revolve_forwards_dp, revolve_repetitions};
pub use schedule::{format_ops, simulate, Op, Outcome, ScheduleError, Tree};
pub use solver::{solve, solve_with_progress, table_bytes, Plan, Progress, SolveError, Solver, TABLE_LIMIT_BYTES};
