//! The schedules people use without a solver, as trees the validator can
//! measure: store everything, recompute everything (checkpoint every
//! stage), checkpoint every k stages, every √n stages, and Chen et al.'s
//! greedy plan (2016, Algorithm 3).

use super::chain::Chain;
use super::schedule::{run, Outcome, Tree};

/// A baseline strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Baseline {
    /// Save everything in one forward pass.
    StoreAll,
    /// Keep every stage's input; recompute each stage just before its backward.
    FullRecompute,
    /// Keep the input of every k-th stage; recompute one segment at a time, saving everything in it.
    EveryK(usize),
    /// `EveryK(⌈√n⌉)`.
    SqrtN,
    /// Chen's greedy segmentation by saved bytes, the threshold grid-searched
    /// around √(x·y); the fastest of the grid that fits the budget, else the smallest.
    ChenGreedy,
}

impl Baseline {
    pub fn name(&self) -> String {
        match self {
            Baseline::StoreAll => "store all".into(),
            Baseline::FullRecompute => "recompute every stage".into(),
            Baseline::EveryK(k) => format!("checkpoint every {k}"),
            Baseline::SqrtN => "checkpoint every √n".into(),
            Baseline::ChenGreedy => "Chen greedy".into(),
        }
    }
}

fn store_all(a: usize, b: usize) -> Tree {
    let mut t = Tree::Base(b);
    for i in (a..b).rev() {
        t = Tree::Chain(i, Box::new(t));
    }
    t
}

/// Segments starting at the given stage indices (the first is 0, sorted),
/// each recomputed and saved whole during the backward.
fn segments(starts: &[usize], n: usize) -> Tree {
    fn build(starts: &[usize], a: usize, b: usize) -> Tree {
        match starts.iter().find(|&&s| s > a && s <= b) {
            Some(&j) => Tree::Leaf { a, j, right: Box::new(build(starts, j, b)), left: Box::new(store_all(a, j - 1)) },
            None => store_all(a, b),
        }
    }
    build(starts, 0, n - 1)
}

/// The baseline's schedule for `chain` (the budget matters only to Chen's greedy).
pub fn baseline(chain: &Chain, which: Baseline, budget: u64) -> Tree {
    let n = chain.len_with_loss();
    match which {
        Baseline::StoreAll => store_all(0, n - 1),
        Baseline::FullRecompute => segments(&(0..n).collect::<Vec<_>>(), n),
        Baseline::EveryK(k) => segments(&(0..n).step_by(k.max(1)).collect::<Vec<_>>(), n),
        Baseline::SqrtN => {
            let k = (n as f64).sqrt().ceil() as usize;
            segments(&(0..n).step_by(k.max(1)).collect::<Vec<_>>(), n)
        }
        Baseline::ChenGreedy => chen_greedy(chain, budget),
    }
}

/// Chen et al.'s Algorithm 3: walk the stages adding saved bytes; past the
/// threshold, start a new segment (keeping that stage's input).
fn chen_segments(chain: &Chain, threshold: f64) -> (Vec<usize>, f64) {
    let a = chain.arrays();
    let n = chain.len_with_loss();
    let (mut starts, mut temp, mut x, mut y) = (vec![0], 0.0f64, 0.0f64, 0.0f64);
    for i in 0..n {
        temp += a.xbar[i + 1] as f64;
        y = y.max(temp);
        if temp > threshold && i + 1 < n {
            starts.push(i + 1);
            x += a.x[i + 1] as f64;
            temp = 0.0;
        }
    }
    (starts, (x * y).sqrt())
}

fn chen_greedy(chain: &Chain, budget: u64) -> Tree {
    let n = chain.len_with_loss();
    let arrays = chain.arrays();
    let (_, b0) = chen_segments(chain, 0.0);
    let mut best: Option<(Tree, Outcome)> = None;
    for g in 0..6 {
        // Six points from b/√2 to √2·b, as ColossalAI's transcription does.
        let t = b0 / std::f64::consts::SQRT_2 * 2f64.powf(g as f64 / 5.0);
        let (starts, _) = chen_segments(chain, t);
        let tree = segments(&starts, n);
        let Ok(o) = run(&arrays, &tree.ops(), None) else { continue };
        let better = match &best {
            None => true,
            Some((_, bo)) => {
                let (fits, bfits) = (o.peak <= budget, bo.peak <= budget);
                match (fits, bfits) {
                    (true, false) => true,
                    (true, true) => o.time < bo.time,
                    (false, false) => o.peak < bo.peak,
                    (false, true) => false,
                }
            }
        };
        if better {
            best = Some((tree, o));
        }
    }
    best.map(|(t, _)| t).unwrap_or_else(|| store_all(0, n - 1))
}
