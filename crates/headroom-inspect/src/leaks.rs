//! Leak suspects: call sites whose live memory grows from one repetition
//! of the workload to the next.
//!
//! A training or serving loop repeats itself: its allocations, each a
//! (stack, size) pair, happen once per step, or once per layer or per
//! parameter within a step. Counts of occurrences shared by many pairs are
//! the loop's, and the smallest of them is the number of steps in the trace.
//! The earliest pair seen that many times marks where each repetition
//! begins; the marks must be evenly spread.
//! A site's live bytes are read at each mark; the first repetition is
//! warm-up (optimizer state and caches appear there once), so a suspect is
//! a site that never shrinks after it and grows in at least half of the
//! later repetitions.

use crate::frames::Phase;
use crate::sites::Sites;
use crate::walk::Walk;
use headroom_trace::snapshot::{TraceAction, TraceEvent};
use rustc_hash::FxHashMap;
use serde::Serialize;

/// Where each repetition of the workload begins.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Repetitions {
    /// Indices of the entries that begin each repetition.
    pub starts: Vec<usize>,
    /// The site of the allocation that marks them.
    pub marker_site: String,
}

/// A call site that grows from one repetition to the next.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LeakSuspect {
    pub site: String,
    /// Average growth per repetition after the first.
    pub growth_per_repetition_bytes: u64,
    /// Live bytes at the start of each repetition.
    pub bytes_by_repetition: Vec<u64>,
}

/// At least this many repetition starts: warm-up, then two to compare.
const MIN_REPETITIONS: usize = 3;

/// Finds the repetitions, or `None` when the trace does not repeat.
pub fn repetitions(trace: &[TraceEvent], sites: &mut Sites) -> Option<Repetitions> {
    let mut count: FxHashMap<(u32, u64), (usize, usize)> = FxHashMap::default();
    for (i, e) in trace.iter().enumerate().filter(|(_, e)| e.action == TraceAction::Alloc) {
        // Building the model repeats per layer too, but it is not the workload's loop.
        if sites.info(e.stack).phase != Phase::Setup {
            count.entry((e.stack, e.size)).or_insert((0, i)).0 += 1;
        }
    }
    let mut keys_with: FxHashMap<usize, usize> = FxHashMap::default();
    for &(c, _) in count.values().filter(|(c, _)| *c >= MIN_REPETITIONS) {
        *keys_with.entry(c).or_default() += 1;
    }
    // Counts shared by many pairs are the loop's: per step, per layer within
    // a step, per parameter in the optimizer. The step is the smallest.
    let most = *keys_with.values().max()?;
    let steps = *keys_with.iter().filter(|(_, &k)| k >= 2 && k * 10 >= most).map(|(c, _)| c).min()?;
    let (&(stack, size), _) = count.iter().filter(|(_, (c, _))| *c == steps).min_by_key(|(_, (_, first))| *first)?;
    let starts: Vec<usize> = trace
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action == TraceAction::Alloc && e.stack == stack && e.size == size)
        .map(|(i, _)| i)
        .collect();
    // Evenly spread or not a loop: a burst of one allocation is not a step.
    let gaps: Vec<usize> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    let (lo, hi) = (gaps.iter().min()?, gaps.iter().max()?);
    if *lo * 4 < *hi {
        return None;
    }
    let marker_site = sites.info(stack).site.site.clone();
    Some(Repetitions { starts, marker_site })
}

/// The repetitions of `walk`'s trace and what grows across them, from where `walk` stands
/// (the trace's start); the report's reason where there are none to read.
pub fn search(walk: &mut Walk, sites: &mut Sites) -> Result<(Repetitions, Vec<LeakSuspect>), String> {
    let reps = repetitions(walk.trace(), sites).ok_or_else(|| {
        "leak suspects: the trace does not repeat (fewer than three evenly spread repetitions of the same \
         allocations), so growth per repetition cannot be measured"
            .to_string()
    })?;
    let s = suspects(walk, &reps, sites).map_err(|why| why.0)?;
    Ok((reps, s))
}

/// A repetition that keeps more than this share of what it allocates is
/// not a step of a loop but a stage of one (the layers of a forward pass,
/// which keep their activations for backward).
const MAX_KEPT: f64 = 0.25;

/// The repetitions found are not steps (they keep most of what they allocate, as the
/// layers of one pass do), so no leak can be read from them; the reason, for the report.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotSteps(pub String);

/// The sites that grow across `reps`, largest growth first; an error saying
/// why when the repetitions are not steps.
///
/// Each site's live bytes are kept up to date entry by entry, and at each
/// repetition's start only the sites that changed since the last are
/// written down: the cost follows the trace, not repetitions × live blocks
/// (a leak of one block a step made that quadratic).
pub fn suspects(walk: &mut Walk, reps: &Repetitions, sites: &mut Sites) -> Result<Vec<LeakSuspect>, NotSteps> {
    let trace = walk.trace();
    let mut bytes: Vec<u64> = Vec::new();
    let mut dirty: Vec<u32> = Vec::new();
    // Per site: (repetition, live bytes) at each start where they had changed.
    let mut changes: Vec<Vec<(usize, u64)>> = Vec::new();
    let note = |id: u32, delta: i128, bytes: &mut Vec<u64>, dirty: &mut Vec<u32>| {
        let i = id as usize;
        if bytes.len() <= i {
            bytes.resize(i + 1, 0);
        }
        bytes[i] = (bytes[i] as i128 + delta).max(0) as u64;
        dirty.push(id);
    };
    let live: Vec<_> = walk.live.values().filter(|l| !l.pending).copied().collect();
    for l in &live {
        note(sites.of(l), l.size as i128, &mut bytes, &mut dirty);
    }
    let mut allocated_at = Vec::new();
    for (r, &start) in reps.starts.iter().enumerate() {
        while walk.next < start {
            walk.step_with(|l, added| {
                let delta = if added { l.size as i128 } else { -(l.size as i128) };
                note(sites.of(l), delta, &mut bytes, &mut dirty);
            });
        }
        allocated_at.push(walk.totals.allocated_bytes);
        dirty.sort_unstable();
        dirty.dedup();
        if changes.len() < bytes.len() {
            changes.resize(bytes.len(), Vec::new());
        }
        for id in dirty.drain(..) {
            let c = &mut changes[id as usize];
            if c.last().is_none_or(|&(_, b)| b != bytes[id as usize]) {
                c.push((r, bytes[id as usize]));
            }
        }
    }
    let n = reps.starts.len();
    // After warm-up: what the repetitions allocated, and what they kept.
    let (first, last) = (reps.starts[1], *reps.starts.last().expect("at least three"));
    let allocated: u64 = trace[first..last].iter().filter(|e| e.action == TraceAction::Alloc).map(|e| e.size).sum();
    let kept = allocated_at.last().copied().unwrap_or(0).saturating_sub(allocated_at[1]);
    if allocated > 0 && kept as f64 > MAX_KEPT * allocated as f64 {
        return Err(NotSteps(format!(
            "leak suspects: the repetitions found ({}, each beginning at {}) keep {:.0}% of what they allocate: \
             stages of one pass (layers keeping activations for backward), not steps; a trace of at least three \
             whole steps is needed",
            reps.starts.len(),
            reps.marker_site,
            100.0 * kept as f64 / allocated as f64
        )));
    }
    // Growth in half the steps after warm-up needs that many changes: only
    // such sites are written out repetition by repetition.
    let needed = n.saturating_sub(2).div_ceil(2).max(1);
    let mut out: Vec<LeakSuspect> = changes
        .into_iter()
        .enumerate()
        .filter(|(_, c)| c.iter().filter(|&&(r, _)| r >= 2).count() >= needed)
        .filter_map(|(id, c)| {
            let mut series = vec![0u64; n];
            for (k, &(r, b)) in c.iter().enumerate() {
                let until = c.get(k + 1).map_or(n, |&(next, _)| next);
                series[r..until].fill(b);
            }
            let after = series.get(1..)?;
            let steps = after.len().checked_sub(1).filter(|&s| s > 0)?;
            let never_shrinks = after.windows(2).all(|w| w[1] >= w[0]);
            let grows = after.windows(2).filter(|w| w[1] > w[0]).count();
            (never_shrinks && grows * 2 >= steps && grows > 0).then(|| LeakSuspect {
                site: sites.list[id].site.site.clone(),
                growth_per_repetition_bytes: (after[steps] - after[0]) / steps as u64,
                bytes_by_repetition: series.clone(),
            })
        })
        .collect();
    out.sort_by(|a, b| b.growth_per_repetition_bytes.cmp(&a.growth_per_repetition_bytes).then(a.site.cmp(&b.site)));
    Ok(out)
}
