//! Several snapshots side by side: one per rank of a distributed job, or a
//! run before and after a change. Which one peaks, and which call sites
//! account for the difference.

use crate::Report;
use rustc_hash::FxHashMap;
use serde::Serialize;

/// One device of one snapshot, in a comparison.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Row {
    pub snapshot: String,
    pub device: u32,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub fragmentation_at_peak_bytes: u64,
    pub peak_phase: Option<&'static str>,
    pub top_site: Option<String>,
}

/// A call site whose live bytes at the peak differ from the first row's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SiteDifference {
    pub site: String,
    pub first_bytes: u64,
    pub other_bytes: u64,
    pub difference_bytes: i64,
}

/// Each row against the first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Against {
    /// Index into `rows`.
    pub row: usize,
    pub peak_allocated_difference_bytes: i64,
    /// Largest differences first (at most ten).
    pub sites: Vec<SiteDifference>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Comparison {
    pub rows: Vec<Row>,
    /// The row with the highest allocated peak.
    pub peaks: usize,
    pub against_first: Vec<Against>,
}

/// Compares every device of every report.
pub fn compare(reports: &[Report]) -> Comparison {
    let devices: Vec<(&Report, &crate::DeviceReport)> =
        reports.iter().flat_map(|r| r.devices.iter().map(move |d| (r, d))).collect();
    let rows: Vec<Row> = devices
        .iter()
        .map(|(r, d)| Row {
            snapshot: r.snapshot.clone(),
            device: d.device,
            peak_allocated_bytes: d.peak_allocated_bytes,
            peak_reserved_bytes: d.peak_reserved_bytes,
            fragmentation_at_peak_bytes: d.fragmentation_at_peak_bytes,
            peak_phase: d.peak_phase.map(|p| p.name()),
            top_site: d.top_sites.first().map(|s| s.site.site.clone()),
        })
        .collect();
    let peaks = (0..rows.len()).max_by_key(|&i| (rows[i].peak_allocated_bytes, std::cmp::Reverse(i))).unwrap_or(0);
    let by_site = |d: &crate::DeviceReport| -> FxHashMap<String, u64> {
        d.top_sites.iter().map(|s| (s.site.site.clone(), s.bytes)).collect()
    };
    let against_first = match devices.first() {
        None => Vec::new(),
        Some((_, first)) => {
            let a = by_site(first);
            devices
                .iter()
                .enumerate()
                .skip(1)
                .map(|(row, (_, d))| {
                    let b = by_site(d);
                    let mut names: Vec<&String> = a.keys().chain(b.keys()).collect();
                    names.sort();
                    names.dedup();
                    let mut sites: Vec<SiteDifference> = names
                        .into_iter()
                        .map(|n| {
                            let (x, y) = (a.get(n).copied().unwrap_or(0), b.get(n).copied().unwrap_or(0));
                            SiteDifference {
                                site: n.clone(),
                                first_bytes: x,
                                other_bytes: y,
                                difference_bytes: y as i64 - x as i64,
                            }
                        })
                        .filter(|s| s.difference_bytes != 0)
                        .collect();
                    sites.sort_by(|p, q| {
                        q.difference_bytes.abs().cmp(&p.difference_bytes.abs()).then(p.site.cmp(&q.site))
                    });
                    sites.truncate(10);
                    Against {
                        row,
                        peak_allocated_difference_bytes: d.peak_allocated_bytes as i64
                            - first.peak_allocated_bytes as i64,
                        sites,
                    }
                })
                .collect()
        }
    };
    Comparison { rows, peaks, against_first }
}
