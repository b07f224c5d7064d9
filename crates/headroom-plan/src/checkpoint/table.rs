//! The dynamic program's table, `opt(a, b, m)`, and how it is filled.
//!
//! The work is O(L³·M): for each interval (a, b) and each slot count m, a
//! minimum over the leaves j = a+1..=b of
//! `(Σfw(a..j) + opt(j, b, m − x[j])) + opt(a, j−1, m)`. Filled one interval's
//! row of M + 1 costs at a time, each leaf read two rows of 2 KB from anywhere
//! in a table of L²/2 rows: past ~150 stages the table left the caches, and
//! each doubling of the chain cost 12–16× where the operations grow 8×.
//!
//! So the table is filled in passes over tiles of [`LANES`] slot counts,
//! every interval once a pass, and stored tile by tile: a pass reads and
//! writes its own tiles (L²/2 × 64 bytes: 2.6 MB at 200 stages, 10 MB at
//! 400). A pass may run at slot count m once every tile below it is done: a
//! right operand and the chain's are at m − x ≤ m, a left operand at m for a
//! shorter interval, filled earlier in the same pass. Within a pass an
//! interval's leaves are a run of consecutive tiles in each of two layouts:
//!
//! - `by_start` (the table): intervals (a, ·) together, the left operands
//!   opt(a, j−1) of one start;
//! - `by_end`: intervals (·, b) together, each *shifted* by its start's
//!   input, so that the right operand opt(j, b, m − x[j]) sits in the lane of
//!   m: no unaligned read, and x[j] may differ from stage to stage. A tile
//!   of it is read in its own pass and written at most ⌊max x / LANES⌋ + 1
//!   passes before, so only that many + 1 are kept (rounded up to a power of
//!   two), in a ring.
//!
//! Starts are taken [`BLOCK`] at a time so that the right operands read for
//! one start are read again for the next ones from the nearest cache, and
//! intervals four at a time, two starts by two ends, so that each operand
//! loaded serves two of them ([`Table::quad`]).
//!
//! Every cost is the same `f32` expression, evaluated in the same order, as
//! in a fill row by row (and in [`super::solver`]'s backtracking), and a
//! minimum does not depend on the order it is taken in: the table holds the
//! same bits whichever way it is filled (the tests compare it with a plain
//! fill of the recurrence).

use super::chain::Arrays;

/// Slot counts per tile: one 64-byte cache line of `f32`.
pub(super) const LANES: usize = 16;

/// Starts filled together in a pass: their left operands (BLOCK × L tiles, 400 KB at 400
/// stages) stay in the core's own cache.
const BLOCK: usize = 32;

const INF: f32 = f32::INFINITY;

/// The costs of one interval at [`LANES`] consecutive slot counts.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C, align(64))]
pub(super) struct Tile([f32; LANES]);

const INF_TILE: Tile = Tile([INF; LANES]);

/// `opt(a, b, m)` for 0 ≤ a ≤ b < n and 0 ≤ m ≤ M.
pub(super) struct Table {
    n: usize,
    /// Intervals, n(n+1)/2: the tiles of one pass.
    tri: usize,
    by_start: Vec<Tile>,
    /// The passes of `by_end` kept, a ring of `tri` tiles a pass; empty once filled.
    by_end: Vec<Tile>,
    /// Pass t is at (t & ring_mask) × tri: the ring's length less one, or all ones where it
    /// holds every pass.
    ring_mask: usize,
}

/// Where the run of intervals (a, a..n) starts in a pass of `by_start`.
#[inline]
fn start_run(n: usize, a: usize) -> usize {
    a * n - a * a.saturating_sub(1) / 2
}

/// Where the run of intervals (0..=b, b) starts in a pass of `by_end`.
#[inline]
fn end_run(b: usize) -> usize {
    b * (b + 1) / 2
}

impl Table {
    /// Bytes the fill takes for the chain `s` (sizes in slots) over slot counts 0..=`m`:
    /// the table, and the ring of `by_end`'s passes.
    pub(super) fn bytes(s: &Arrays, m: usize) -> u128 {
        let n = s.fw.len() as u128;
        let (passes, ring) = Table::passes(s, m);
        n * (n + 1) / 2 * (passes + ring) as u128 * size_of::<Tile>() as u128
    }

    /// Passes over the slot counts 0..=`m`, and how many of `by_end`'s are kept.
    fn passes(s: &Arrays, m: usize) -> (usize, usize) {
        let passes = (m + 1).div_ceil(LANES);
        let reach = s.x.iter().map(|&x| x.min(m as u64 + 1) as usize).max().unwrap_or(0);
        // A power of two, so that finding a pass's place is a mask, not a division.
        (passes, (reach / LANES + 2).next_power_of_two().min(passes))
    }

    /// The cost at slot count `m`, infinite where nothing fits.
    #[inline]
    pub(super) fn get(&self, a: usize, b: usize, m: usize) -> f32 {
        self.by_start[(m / LANES) * self.tri + start_run(self.n, a) + (b - a)].0[m % LANES]
    }

    /// Fills the table over slot counts 0..=`m` for the chain `s` (sizes in
    /// slots, times scaled), `prefix` its forward times summed.
    pub(super) fn fill(s: &Arrays, m: usize, prefix: &[f64], progress: super::Progress) -> Table {
        let n = s.fw.len();
        let tri = n * (n + 1) / 2;
        let (passes, ring) = Table::passes(s, m);
        let mut table = Table {
            n,
            tri,
            by_start: vec![INF_TILE; passes * tri],
            by_end: vec![INF_TILE; ring * tri],
            ring_mask: if ring < passes { ring - 1 } else { usize::MAX },
        };
        let bounds = Bounds::new(s, prefix);
        for t in 0..passes {
            progress("filling the table", t as u64, passes as u64);
            if t > 0 && t + ring - 1 < passes {
                // The ring's slot that held pass t − 1 takes the last pass that can be written
                // from here on, and must start infinite like every other.
                let slot = table.slot(t + ring - 1);
                table.by_end[slot..slot + tri].fill(INF_TILE);
            }
            table.pass(&Pass { bounds: &bounds, m, t });
        }
        progress("filling the table", passes as u64, passes as u64);
        table.by_end = Vec::new();
        table
    }

    /// Where `by_end`'s pass `t` is in the ring.
    #[inline(always)]
    fn slot(&self, t: usize) -> usize {
        (t & self.ring_mask) * self.tri
    }

    /// One pass, compiled for the widest vectors the processor has: the
    /// leaves' loop is all of the work, and the baseline x86-64 target has
    /// only 4-lane SSE. (Detection is cached by std: one load per pass.)
    fn pass(&mut self, p: &Pass) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the processor has AVX2, checked just above.
            return unsafe { self.pass_avx2(p) };
        }
        self.pass_body(p)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn pass_avx2(&mut self, p: &Pass) {
        self.pass_body(p)
    }

    /// Starts are taken [`BLOCK`] at a time, from the end, and each block's
    /// intervals by end, upwards: a run of right operands (·, b) read for one
    /// start is read for the next ones while it is still in the nearest cache.
    /// Within a block, intervals are filled four at a time, two starts by two
    /// ends, which share their operands ([`Table::quad`]).
    #[inline(always)]
    fn pass_body(&mut self, p: &Pass) {
        let n = self.n;
        let mut hi = n;
        while hi > 0 {
            let lo = hi.saturating_sub(BLOCK);
            let mut b = lo;
            while b < n {
                if b + 1 == n {
                    for a in (lo..hi.min(b + 1)).rev() {
                        self.cell(p, a, b);
                    }
                    break;
                }
                if b + 1 < hi {
                    self.cell(p, b + 1, b + 1);
                }
                if b < hi {
                    self.cell(p, b, b);
                    self.cell(p, b, b + 1);
                }
                let mut a = hi.min(b);
                while a > lo {
                    a -= 1;
                    if a > lo {
                        self.quad(p, a, b);
                        a -= 1;
                    } else {
                        self.cell(p, a, b);
                        self.cell(p, a, b + 1);
                    }
                }
                b += 2;
            }
            hi = lo;
        }
    }

    /// Intervals (a, b), (a, b+1), (a−1, b) and (a−1, b+1), for a < b: their
    /// leaves a+1..=b together (each operand read once for two intervals),
    /// then the leaves only some of them have, in an order that has each
    /// operand filled before it is read.
    #[inline(always)]
    fn quad(&mut self, p: &Pass, a: usize, b: usize) {
        let (n, sumfw) = (self.n, &p.bounds.sumfw);
        let (pass, ring) = (p.t * self.tri, self.slot(p.t));
        let d = b - a;
        let (sa, sp) = (start_run(n, a), start_run(n, a - 1));
        self.prefetch(p, a, b);
        let [c00, mut c01, mut c10, mut c11] = quad_leaves(
            &sumfw[sa + 1..][..d],
            &sumfw[sp + 2..][..d],
            &self.by_end[ring + end_run(b) + a + 1..][..d],
            &self.by_end[ring + end_run(b + 1) + a + 1..][..d],
            &self.by_start[pass + sa..][..d],
            &self.by_start[pass + sp + 1..][..d],
        );
        self.finish(p, a, b, c00);
        let (end, start) = (&self.by_end[ring..], &self.by_start[pass..]);
        step(&mut c01.0, sumfw[sa + d + 1], &end[end_run(b + 1) + b + 1].0, &start[sa + d].0);
        self.finish(p, a, b + 1, c01);
        let (end, start) = (&self.by_end[ring..], &self.by_start[pass..]);
        step(&mut c10.0, sumfw[sp + 1], &end[end_run(b) + a].0, &start[sp].0);
        self.finish(p, a - 1, b, c10);
        let (end, start) = (&self.by_end[ring..], &self.by_start[pass..]);
        step(&mut c11.0, sumfw[sp + 1], &end[end_run(b + 1) + a].0, &start[sp].0);
        step(&mut c11.0, sumfw[sp + d + 2], &end[end_run(b + 1) + b + 1].0, &start[sp + d + 1].0);
        self.finish(p, a - 1, b + 1, c11);
    }

    /// Asks for the tiles of the previous pass and of the ring that the four
    /// intervals' chain options and stores will touch, while their leaves are
    /// summed: a pass ago is megabytes ago.
    #[inline(always)]
    fn prefetch(&self, p: &Pass, a: usize, b: usize) {
        let m0 = p.t * LANES;
        for (a, b) in [(a, b), (a, b + 1), (a - 1, b), (a - 1, b + 1)] {
            if let Some(mm) = m0.checked_sub(p.bounds.xbar[a + 1]) {
                prefetch(&self.by_start[mm / LANES * self.tri + start_run(self.n, a + 1) + b - a - 1]);
            }
            let first = m0.saturating_add(p.bounds.x[a]);
            if first <= p.m {
                let q = first / LANES;
                prefetch(&self.by_end[self.slot(q) + end_run(b) + a]);
                if (q + 1) * LANES <= p.m {
                    prefetch(&self.by_end[self.slot(q + 1) + end_run(b) + a]);
                }
            }
        }
    }

    /// One interval on its own.
    #[inline(always)]
    fn cell(&mut self, p: &Pass, a: usize, b: usize) {
        let best = if a == b {
            // Fall(a), B(a).
            Tile([p.bounds.own[a]; LANES])
        } else {
            let d = b - a;
            let (pass, ring) = (p.t * self.tri, self.slot(p.t));
            let sa = start_run(self.n, a);
            let right = &self.by_end[ring + end_run(b) + a + 1..][..d];
            let left = &self.by_start[pass + sa..][..d];
            leaves(&p.bounds.sumfw[sa + 1..=sa + d], right, left)
        };
        self.finish(p, a, b, best);
    }

    /// The chain option beside the leaves, then infinity below the interval's
    /// least memory, and the store.
    #[inline(always)]
    fn finish(&mut self, p: &Pass, a: usize, b: usize, mut best: Tile) {
        let m0 = p.t * LANES;
        let top = (m0 + LANES - 1).min(p.m);
        let i = start_run(self.n, a) + b - a;
        let mmin = p.bounds.mmin[i];
        if mmin > top {
            return;
        }
        // Fall(a), the rest with x̄[a+1] held, B(a).
        let clo = p.bounds.chain[i];
        if a < b && clo <= top {
            let rest = self.window(a + 1, b, m0, p.bounds.xbar[a + 1]);
            let own = p.bounds.own[a];
            for (k, v) in best.0.iter_mut().enumerate() {
                let mm = m0 + k;
                if mm >= clo && mm <= p.m {
                    *v = min(*v, own + rest[k]);
                }
            }
        }
        for (k, v) in best.0.iter_mut().enumerate() {
            if m0 + k < mmin {
                *v = INF;
            }
        }
        self.store(p, a, b, best);
    }

    /// Writes opt(a, b) at this pass's tile: in place in `by_start`, and `x[a]`
    /// lanes further on in `by_end` (across two tiles unless `x[a]` is a whole
    /// number of tiles).
    #[inline(always)]
    fn store(&mut self, p: &Pass, a: usize, b: usize, tile: Tile) {
        self.by_start[p.t * self.tri + start_run(self.n, a) + (b - a)] = tile;
        let first = (p.t * LANES).saturating_add(p.bounds.x[a]);
        if first > p.m {
            return;
        }
        let (q, r) = (first / LANES, first % LANES);
        let at = end_run(b) + a;
        let here = self.slot(q) + at;
        if r == 0 {
            self.by_end[here] = tile;
            return;
        }
        let next = ((q + 1) * LANES <= p.m).then(|| self.slot(q + 1) + at);
        // Straight into place: through a buffer of two tiles, each tile loaded back from it
        // spanned two stores still in flight, which stalled every store (a fifth of the fill).
        self.by_end[here].0[r..].copy_from_slice(&tile.0[..LANES - r]);
        if let Some(next) = next {
            self.by_end[next].0[..r].copy_from_slice(&tile.0[LANES - r..]);
        }
    }

    /// opt(a, b) at slot counts m0 − shift .. m0 − shift + LANES (infinite below 0),
    /// for a tile no later than the one being filled.
    #[inline(always)]
    fn window(&self, a: usize, b: usize, m0: usize, shift: usize) -> [f32; LANES] {
        let mut pair = [INF; 2 * LANES];
        let i = start_run(self.n, a) + b - a;
        let Some(p) = m0.checked_sub(shift) else {
            // The first tiles: part of the window is below zero.
            for (k, v) in pair[..LANES].iter_mut().enumerate() {
                if let Some(mm) = (m0 + k).checked_sub(shift) {
                    *v = self.get(a, b, mm);
                }
            }
            return pair[..LANES].try_into().expect("one tile");
        };
        let (q, r) = (p / LANES, p % LANES);
        pair[..LANES].copy_from_slice(&self.by_start[q * self.tri + i].0);
        if r > 0 {
            pair[LANES..].copy_from_slice(&self.by_start[(q + 1) * self.tri + i].0);
        }
        pair[r..r + LANES].try_into().expect("one tile")
    }
}

/// One pass: the chain's bounds, the largest slot count, the tile's index.
struct Pass<'a> {
    bounds: &'a Bounds,
    m: usize,
    t: usize,
}

#[inline(always)]
fn prefetch(tile: &Tile) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch only hints the cache, and the pointer is to a live tile.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((tile as *const Tile).cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = tile;
}

/// What the passes read of the chain, by interval in `by_start`'s order:
/// computed once, not once a pass.
struct Bounds {
    /// The least slots with which the interval has a schedule ([`super::bounds::interval_min`];
    /// for one stage, [`super::bounds::base_min`]).
    mmin: Vec<usize>,
    /// The least slots for the chain option, `mmin` included.
    chain: Vec<usize>,
    /// At (a, j): the forward times of stages a..j, as the table adds them.
    sumfw: Vec<f32>,
    /// By stage: its forward and backward, as the table adds them.
    own: Vec<f32>,
    x: Vec<usize>,
    xbar: Vec<usize>,
}

impl Bounds {
    fn new(s: &Arrays, prefix: &[f64]) -> Bounds {
        let n = s.fw.len();
        let tri = n * (n + 1) / 2;
        let sl = |v: u64| v.min(usize::MAX as u64) as usize;
        let (mut mmin, mut chain, mut sumfw) = (vec![0; tri], vec![0; tri], vec![0f32; tri]);
        for a in 0..n {
            let sa = start_run(n, a);
            mmin[sa] = sl(super::bounds::base_min(s, a));
            // interval_min(a, b), kept as b grows.
            let mut inner = s.x[a + 1].saturating_add(s.ftmp[a]);
            for b in a + 1..n {
                if b >= a + 2 {
                    inner = inner.max(super::bounds::forward_min(s, b - 1));
                }
                let i = sa + b - a;
                mmin[i] = sl(s.x[b + 1].saturating_add(inner));
                chain[i] = mmin[i].max(sl(super::bounds::chain_min(s, a, b)));
                sumfw[i] = (prefix[b] - prefix[a]) as f32;
            }
        }
        Bounds {
            mmin,
            chain,
            sumfw,
            own: s.fw.iter().zip(&s.bw).map(|(f, b)| (f + b) as f32).collect(),
            x: s.x.iter().map(|&v| sl(v)).collect(),
            xbar: s.xbar.iter().map(|&v| sl(v)).collect(),
        }
    }
}

/// The leaves' minimum at one tile: over j, `(sumfw[j] + right[j]) + left[j]`.
/// Four accumulators, so that each minimum waits on the one four leaves back
/// rather than the last (the minimum of the four is the same bits).
#[inline(always)]
fn leaves(sumfw: &[f32], right: &[Tile], left: &[Tile]) -> Tile {
    let (mut a0, mut a1, mut a2, mut a3) = ([INF; LANES], [INF; LANES], [INF; LANES], [INF; LANES]);
    let (s4, r4, l4) = (sumfw.chunks_exact(4), right.chunks_exact(4), left.chunks_exact(4));
    let (s1, r1, l1) = (s4.remainder(), r4.remainder(), l4.remainder());
    for ((s, r), l) in s4.zip(r4).zip(l4) {
        step(&mut a0, s[0], &r[0].0, &l[0].0);
        step(&mut a1, s[1], &r[1].0, &l[1].0);
        step(&mut a2, s[2], &r[2].0, &l[2].0);
        step(&mut a3, s[3], &r[3].0, &l[3].0);
    }
    for ((&s, r), l) in s1.iter().zip(r1).zip(l1) {
        step(&mut a0, s, &r.0, &l.0);
    }
    for k in 0..LANES {
        a0[k] = min(min(a0[k], a1[k]), min(a2[k], a3[k]));
    }
    Tile(a0)
}

/// The leaves common to four intervals (a, b), (a, b+1), (a−1, b), (a−1, b+1):
/// `s0`/`l0` the sums and left operands of start a, `s1`/`l1` of start a−1,
/// `r0`/`r1` the right operands of ends b and b+1.
#[inline(always)]
fn quad_leaves(s0: &[f32], s1: &[f32], r0: &[Tile], r1: &[Tile], l0: &[Tile], l1: &[Tile]) -> [Tile; 4] {
    let mut acc = [[INF; LANES]; 4];
    for (((((&s0, &s1), r0), r1), l0), l1) in s0.iter().zip(s1).zip(r0).zip(r1).zip(l0).zip(l1) {
        step(&mut acc[0], s0, &r0.0, &l0.0);
        step(&mut acc[1], s0, &r1.0, &l0.0);
        step(&mut acc[2], s1, &r0.0, &l1.0);
        step(&mut acc[3], s1, &r1.0, &l1.0);
    }
    acc.map(Tile)
}

#[inline(always)]
fn step(acc: &mut [f32; LANES], s: f32, r: &[f32; LANES], l: &[f32; LANES]) {
    for k in 0..LANES {
        acc[k] = min(acc[k], s + r[k] + l[k]);
    }
}

/// The smaller; `b` on a tie or where either is NaN (no cost is: times are finite and positive).
#[inline(always)]
fn min(a: f32, b: f32) -> f32 {
    if a < b {
        a
    } else {
        b
    }
}

#[cfg(test)]
mod tests {
    use super::super::bounds::{base_min, chain_min, interval_min};
    use super::*;
    use proptest::prelude::*;

    /// The recurrence filled as it was before tiles: interval by interval in order of
    /// length, each row of slot counts from earlier rows.
    fn rows(s: &Arrays, m: usize, prefix: &[f64]) -> Vec<Vec<f32>> {
        let n = s.fw.len();
        let sl = |v: u64| v.min(usize::MAX as u64) as usize;
        let at = |a: usize, b: usize| a * n + b;
        let mut opt = vec![vec![INF; m + 1]; n * n];
        for d in 0..n {
            for a in 0..n - d {
                let b = a + d;
                let mut row = vec![INF; m + 1];
                if d == 0 {
                    for v in row.iter_mut().skip(sl(base_min(s, a))) {
                        *v = (s.fw[a] + s.bw[a]) as f32;
                    }
                } else {
                    let mmin = sl(interval_min(s, a, b));
                    for j in a + 1..=b {
                        let xj = sl(s.x[j]);
                        let sumfw = (prefix[j] - prefix[a]) as f32;
                        for mm in mmin.max(xj)..=m {
                            let cost = sumfw + opt[at(j, b)][mm - xj] + opt[at(a, j - 1)][mm];
                            row[mm] = if cost < row[mm] { cost } else { row[mm] };
                        }
                    }
                    let xb = sl(s.xbar[a + 1]);
                    let fb = (s.fw[a] + s.bw[a]) as f32;
                    for mm in mmin.max(sl(chain_min(s, a, b)))..=m {
                        let cost = fb + opt[at(a + 1, b)][mm - xb];
                        row[mm] = if cost < row[mm] { cost } else { row[mm] };
                    }
                }
                opt[at(a, b)] = row;
            }
        }
        opt
    }

    fn size() -> impl Strategy<Value = u64> {
        // Nothing, a few slots, more than a tile, more than two, more than the table.
        prop_oneof![Just(0u64), 1u64..6, 14u64..40, 60u64..400]
    }

    prop_compose! {
        fn arrays(max_stages: usize)(n in 1..max_stages)
            (fw in proptest::collection::vec(0.01f64..10.0, n),
             bw in proptest::collection::vec(0.01f64..10.0, n),
             x in proptest::collection::vec(size(), n + 1),
             xbar in proptest::collection::vec(size(), n + 1),
             ftmp in proptest::collection::vec(0u64..8, n),
             btmp in proptest::collection::vec(0u64..8, n)) -> Arrays {
            Arrays { fw, bw, x, xbar, ftmp, btmp }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        /// Every cell of the tiled fill holds the bits of the fill row by row: the same
        /// optimum, and the same ties for the backtracking to break, on chains whose
        /// activations span one lane, several tiles or the whole table, over more starts
        /// than a block.
        #[test]
        fn tiles_hold_the_bits_of_the_fill_row_by_row(s in arrays(80), m in 0usize..300) {
            let n = s.fw.len();
            let mut prefix = vec![0f64; n + 1];
            for i in 0..n {
                prefix[i + 1] = prefix[i] + s.fw[i];
            }
            let table = Table::fill(&s, m, &prefix, &mut |_, _, _| {});
            let want = rows(&s, m, &prefix);
            for a in 0..n {
                for b in a..n {
                    for mm in 0..=m {
                        let (got, want) = (table.get(a, b, mm), want[a * n + b][mm]);
                        prop_assert_eq!(got.to_bits(), want.to_bits(), "opt({}, {}, {}): {} against {}", a, b, mm, got, want);
                    }
                }
            }
        }
    }
}
