//! What an interval of the chain needs at least, in the arrays' units: the
//! bounds below which an option of the dynamic program has no schedule. The
//! table's fill and the solver's backtracking test the same bounds, so both
//! read them here.

use super::chain::Arrays;

/// The memory `B(a)` and the forward before it need on their own: the
/// least with which the one-stage interval (a, a) has a schedule.
pub(super) fn base_min(s: &Arrays, a: usize) -> u64 {
    let held = s.x[a + 1].saturating_add(s.xbar[a + 1]);
    held.saturating_add(s.ftmp[a]).max(held.saturating_add(s.x[a]).saturating_add(s.btmp[a]))
}

/// Every stage a..b−1 runs forward at least once while the gradient of b's
/// output is held: a memory bound that no option for the interval beats.
pub(super) fn interval_min(s: &Arrays, a: usize, b: usize) -> u64 {
    let mut inner = s.x[a + 1].saturating_add(s.ftmp[a]);
    for k in a + 1..b {
        inner = inner.max(forward_min(s, k));
    }
    s.x[b + 1].saturating_add(inner)
}

/// Stage k's forward inside an interval: its input, its output and its transient.
pub(super) fn forward_min(s: &Arrays, k: usize) -> u64 {
    s.x[k].saturating_add(s.x[k + 1]).saturating_add(s.ftmp[k])
}

/// The chain option's own needs: `Fall(a)` beside the gradient of b's output,
/// and `B(a)` beside its saved data, the incoming gradient and its own.
pub(super) fn chain_min(s: &Arrays, a: usize, b: usize) -> u64 {
    let fall = s.x[b + 1].saturating_add(s.xbar[a + 1]).saturating_add(s.ftmp[a]);
    let back = s.x[a + 1].saturating_add(s.xbar[a + 1]).saturating_add(s.x[a]).saturating_add(s.btmp[a]);
    fall.max(back).max(s.xbar[a + 1])
}
