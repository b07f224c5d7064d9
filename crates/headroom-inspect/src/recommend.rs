//! The report's advice: what to change, each with the evidence the report found for it (the
//! OOM's verdict from its replays, fragmentation, leaks, activations at a training peak).

use crate::frames::Phase;
use crate::report::{DeviceReport, OomExplanation, Recommendation};
use crate::timeline::{Point, Timeline};
use headroom_alloc::units::format_size;
use headroom_alloc::AllocatorConfig;

/// Fragmentation large enough to act on: a tenth of reserved, and 256 MiB.
pub(crate) fn worth_defragmenting(r: &DeviceReport) -> bool {
    let gap = r
        .fragmentation_at_peak_bytes
        .max(r.most_fragmented.map_or(0, |p| p.totals.reserved_bytes.saturating_sub(p.totals.allocated_bytes)));
    worth(gap, r.peak_reserved_bytes)
}

/// [`worth_defragmenting`] of the report whose peaks `tl` would set.
pub(crate) fn worth_defragmenting_in(tl: &Timeline) -> bool {
    let gap = |p: &Point| p.totals.reserved_bytes.saturating_sub(p.totals.allocated_bytes);
    worth(gap(&tl.peak).max(gap(&tl.most_fragmented)), tl.peak_reserved.totals.reserved_bytes)
}

fn worth(gap: u64, peak_reserved: u64) -> bool {
    gap >= 256 << 20 && gap * 10 >= peak_reserved
}

/// Fragmentation or a lack of memory, as the replays decide: fragmentation only
/// where a setting replayed avoids the OOM (memory in pieces is not the cause
/// when no arrangement of it serves the run); otherwise a lack of memory, by
/// how much the run asked to hold beyond the memory it had. Without a replay,
/// no verdict.
fn oom_verdict(o: &OomExplanation) -> Option<Recommendation> {
    let avoiding: Vec<&str> =
        o.remedies.iter().filter(|m| m.avoided == Some(true)).map(|m| m.setting.as_str()).collect();
    if !avoiding.is_empty() {
        return Some(Recommendation {
            what: "the failure is fragmentation, not a lack of memory".into(),
            evidence: format!(
                "{} replayed avoid{} it; {} reserved but unallocated when {} was requested: cached, but in pieces \
                 too small",
                avoiding.join(", "),
                if avoiding.len() == 1 { "s" } else { "" },
                format_size(o.reserved_unallocated_bytes),
                format_size(o.requested_bytes)
            ),
        });
    }
    let failed: Vec<String> =
        o.remedies.iter().filter(|m| m.avoided == Some(false)).map(|m| format!("{} ({})", m.setting, m.note)).collect();
    if failed.is_empty() {
        return None;
    }
    let memory = o.capacity_bytes.or(o.memory_limit.map(|l| l.at_least))?;
    let on = if o.capacity_bytes.is_some() { "device" } else { "per-process limit" };
    let what = match o.demand_peak_bytes.checked_sub(memory).filter(|&d| d > 0) {
        Some(short) => {
            format!("the failure is a lack of memory, not fragmentation: up to {} short", format_size(short))
        }
        None => "the failure is a lack of memory, not fragmentation".into(),
    };
    Some(Recommendation {
        what,
        evidence: format!(
            "live blocks and the requests refused (each held from its refusal on: the trace cannot tell when the \
             program would have freed it) come to {} on a {} {on}; no setting replayed avoids the OOM: {}",
            format_size(o.demand_peak_bytes),
            format_size(memory),
            failed.join("; ")
        ),
    })
}

/// Advice from what the report found.
pub(crate) fn recommend(r: &mut DeviceReport, recorded: &AllocatorConfig, expandable_peak_reserved: Option<u64>) {
    let mut out = Vec::new();
    if let Some(o) = &r.oom {
        for m in o.remedies.iter().filter(|m| m.avoided == Some(true)) {
            out.push(Recommendation {
                what: format!("set PYTORCH_CUDA_ALLOC_CONF={}", m.setting),
                evidence: format!(
                    "replayed on the run's {} device{}: every request served, the failed {} one included; peak \
                     reserved {}",
                    o.capacity_bytes.map_or("?".into(), format_size),
                    o.memory_limit.map_or(String::new(), |l| format!(
                        " under its per-process limit of {}",
                        format_size(l.at_least)
                    )),
                    format_size(o.requested_bytes),
                    m.peak_reserved_bytes.map_or("?".into(), format_size),
                ),
            });
        }
        out.extend(oom_verdict(o));
    }
    if let Some(peak) = expandable_peak_reserved {
        if peak * 20 <= r.peak_reserved_bytes * 19 {
            out.push(Recommendation {
                what: "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into(),
                evidence: format!(
                    "replayed: peak reserved {} instead of {} ({} reserved but unallocated at the allocated peak)",
                    format_size(peak),
                    format_size(r.peak_reserved_bytes),
                    format_size(r.fragmentation_at_peak_bytes)
                ),
            });
        }
    }
    if let (Some(l), Some(reps)) = (r.leak_suspects.first(), &r.repetitions) {
        out.push(Recommendation {
            what: format!("look at what {} keeps alive from one repetition to the next", l.site),
            evidence: format!(
                "its live memory grows by {} per repetition over {} repetitions{}",
                format_size(l.growth_per_repetition_bytes),
                reps.starts.len(),
                if r.leak_suspects.len() > 1 {
                    format!(" ({} more sites grow)", r.leak_suspects.len() - 1)
                } else {
                    String::new()
                }
            ),
        });
    }
    let activations: u64 = r.roles.iter().filter(|x| x.role == crate::frames::Role::Activations).map(|x| x.bytes).sum();
    let training_peak = matches!(r.peak_phase, Some(Phase::Forward | Phase::Backward));
    if training_peak && activations * 5 >= r.peak_allocated_bytes * 2 && activations > 0 {
        out.push(Recommendation {
            what:
                "activation checkpointing (`headroom checkpoint` finds the fastest schedule in a budget), or a smaller \
                   batch or sequence"
                    .into(),
            evidence: format!(
                "forward allocations still live hold {} of the {} allocated at the peak{}",
                format_size(activations),
                format_size(r.peak_allocated_bytes),
                r.peak_phase.map_or(String::new(), |p| format!(" (the peak is in the {} phase)", p.name()))
            ),
        });
    }
    if r.trace_entries == 0 && !recorded.expandable_segments && r.segments_now.inactive_split_bytes >= 256 << 20 {
        out.push(Recommendation {
            what:
                "record a trace (`torch.cuda.memory._record_memory_history()`) to check expandable_segments by replay"
                    .into(),
            evidence: format!(
                "{} free in segments that also hold live blocks: empty_cache() cannot return it",
                format_size(r.segments_now.inactive_split_bytes)
            ),
        });
    }
    r.recommendations = out;
}
