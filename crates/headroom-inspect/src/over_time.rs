//! What the report follows over the whole trace once the peak is known: the
//! largest sites' bands under the timeline, each allocation's life, and each
//! phase's peak, taken in one walk of the trace instead of one walk each.
//!
//! Each of the three reads the same thing at each entry — the block the entry
//! ends, looked up before the entry is applied, and the block it allocates,
//! after — so one walk looks each up once for all three. Sites are named in
//! the order the separate walks named them (the bands' first), so the
//! report's site numbers do not change.

use crate::allocations::{Allocation, Lives};
use crate::report::SiteSeries;
use crate::roles::Lifetimes;
use crate::sites::Sites;
use crate::step_phases::{PhasePeaks, StepPhases};
use crate::timeline::Timeline;
use crate::walk::Walk;
use headroom_trace::snapshot::TraceAction;

/// The three, as one walk found them.
pub struct OverTime {
    /// Live bytes of each chosen site at each of the timeline's points.
    pub series: Vec<SiteSeries>,
    /// Every allocation, in the order they began.
    pub allocations: Vec<Allocation>,
    /// Each phase's peak, where the trace's passes are known (it has frames).
    pub step_phases: Option<StepPhases>,
}

/// Walks the whole trace from where `w` stands (its start): the bands of the
/// `chosen` sites at `tl`'s points, with `allocations` the allocations (none
/// otherwise), and with `lifetimes` the phases' peaks.
pub fn over_time(
    mut w: Walk,
    tl: &Timeline,
    chosen: &[u32],
    sites: &mut Sites,
    lifetimes: Option<&Lifetimes>,
    allocations: bool,
) -> OverTime {
    let slot = |id: u32| chosen.iter().position(|&c| c == id);
    let mut bytes = vec![0u64; chosen.len()];
    // Sites of the blocks live at the start.
    for l in w.live.values().filter(|l| !l.pending) {
        if let Some(k) = slot(sites.of(l)) {
            bytes[k] += l.size;
        }
    }
    let mut lives = allocations.then(|| Lives::new(&w, sites));
    let mut phases = lifetimes.map(|_| PhasePeaks::new(w.totals.allocated_bytes));
    let mut series: Vec<SiteSeries> = chosen
        .iter()
        .map(|&id| SiteSeries { site: sites.list[id as usize].site.site.clone(), id, bytes: Vec::new() })
        .collect();
    let mut points = tl.points.iter().peekable();
    let record = |series: &mut Vec<SiteSeries>, bytes: &[u64]| {
        for (s, &b) in series.iter_mut().zip(bytes) {
            s.bytes.push(b);
        }
    };
    while points.peek().is_some_and(|p| p.index.is_none()) {
        points.next();
        record(&mut series, &bytes);
    }
    let trace = w.trace();
    while w.next < trace.len() {
        let i = w.next;
        let e = &trace[i];
        // What this entry takes away from the caller, read before it is applied.
        let ended = w.named_by_next().filter(|l| !l.pending).copied();
        if let Some(l) = &ended {
            if let Some(k) = slot(sites.of(l)) {
                bytes[k] -= l.size;
            }
        }
        if let Some(lives) = &mut lives {
            lives.before(i, e, ended.as_ref());
        }
        w.step();
        if e.action == TraceAction::Alloc {
            if let Some(l) = w.allocated_by(i).copied() {
                let site = sites.of(&l);
                if let Some(k) = slot(site) {
                    bytes[k] += l.size;
                }
                if let Some(lives) = &mut lives {
                    lives.allocated(i, &l, site);
                }
            }
        }
        if let (Some(p), Some(t)) = (&mut phases, lifetimes) {
            p.see(t.phase_after(i), w.totals.allocated_bytes);
        }
        while points.peek().is_some_and(|p| p.index == Some(i)) {
            points.next();
            record(&mut series, &bytes);
        }
    }
    OverTime {
        series,
        allocations: lives.map(Lives::finish).unwrap_or_default(),
        step_phases: phases.map(PhasePeaks::finish),
    }
}
