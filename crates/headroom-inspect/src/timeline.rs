//! Memory over the trace: allocated, reserved and requested bytes, kept
//! as at most a few thousand points however long the trace (each point is
//! the bucket's highest allocated moment, so no peak is lost), and the peaks.

use crate::walk::{Totals, Walk};
use serde::Serialize;

/// Points a timeline keeps at most.
pub const MAX_POINTS: usize = 2000;

/// The totals after one entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Point {
    /// The entry just applied; `None` for the moment before the first.
    pub index: Option<usize>,
    pub time_us: Option<i64>,
    #[serde(flatten)]
    pub totals: Totals,
}

/// One device's memory over its trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timeline {
    pub points: Vec<Point>,
    pub start: Point,
    pub end: Point,
    /// The first moment allocated reached its highest.
    pub peak: Point,
    /// The first moment reserved reached its highest.
    pub peak_reserved: Point,
    /// The moment reserved exceeded allocated the most.
    pub most_fragmented: Point,
}

/// Walks the whole trace once. The walk is left at the end.
pub fn timeline(walk: &mut Walk) -> Timeline {
    let n = walk.trace().len();
    let bucket = n.div_ceil(MAX_POINTS).max(1);
    let start = Point { index: None, time_us: None, totals: walk.totals };
    let mut t =
        Timeline { points: vec![start], start, end: start, peak: start, peak_reserved: start, most_fragmented: start };
    let gap = |p: &Point| p.totals.reserved_bytes.saturating_sub(p.totals.allocated_bytes);
    let mut best: Option<Point> = None;
    let mut bucket_reserved = 0;
    while walk.next < n {
        let i = walk.next;
        walk.step();
        let p = Point { index: Some(i), time_us: walk.trace()[i].time_us, totals: walk.totals };
        if p.totals.allocated_bytes > t.peak.totals.allocated_bytes {
            t.peak = p;
        }
        if p.totals.reserved_bytes > t.peak_reserved.totals.reserved_bytes {
            t.peak_reserved = p;
        }
        if gap(&p) > gap(&t.most_fragmented) {
            t.most_fragmented = p;
        }
        if best.is_none_or(|b| p.totals.allocated_bytes > b.totals.allocated_bytes) {
            best = Some(p);
        }
        bucket_reserved = bucket_reserved.max(p.totals.reserved_bytes);
        if (i + 1).is_multiple_of(bucket) || i + 1 == n {
            // The bucket's highest allocated moment, with the bucket's highest
            // reserved so that neither line loses its peaks.
            let mut b = best.take().expect("the bucket saw this entry");
            b.totals.reserved_bytes = bucket_reserved;
            bucket_reserved = 0;
            t.points.push(b);
        }
        t.end = p;
    }
    t
}
