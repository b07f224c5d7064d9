//! What the HTML report's script reads: one device's timeline, bands,
//! segment map and call sites as JSON, embedded in the page. The page
//! draws its plots without script too (inline SVG); the script redraws them
//! from this to zoom, pan, point at and filter.

use crate::layout::Layout;
use crate::report::DeviceReport;
use crate::sites::SiteDetail;
use headroom_alloc::BlockState;
use serde_json::{json, Value};

/// The x of each timeline point (seconds into the trace, or the entry
/// number), and what the axis says it is.
pub fn xs(d: &DeviceReport) -> (Vec<f64>, &'static str) {
    let t0 = d.timeline.points.iter().find_map(|p| p.time_us);
    let pts = &d.timeline.points;
    match t0 {
        Some(t0) => {
            // Times that go back (see the report's note) are held at the latest so far.
            let mut last = 0.0;
            let v = pts
                .iter()
                .map(|p| {
                    if let Some(t) = p.time_us {
                        last = ((t - t0) as f64 / 1e6).max(last);
                    }
                    last
                })
                .collect();
            (v, "seconds into the trace")
        }
        None => (pts.iter().map(|p| p.index.map_or(0.0, |i| i as f64 + 1.0)).collect(), "trace entry"),
    }
}

/// The page data of one device.
pub fn device_data(d: &DeviceReport) -> Value {
    let (x, xlabel) = xs(d);
    let pts = &d.timeline.points;
    let (layout, when) = match &d.layout_at_peak {
        Some(l) => (Some(l), "at the peak (replayed)"),
        None if !d.layout_now.segments.is_empty() => (Some(&d.layout_now), "at the snapshot's moment"),
        None => (None, ""),
    };
    json!({
        "device": d.device,
        "xlabel": xlabel,
        // Six significant digits: the axis needs no more, and the page stays small.
        "x": x.iter().map(|v| round6(*v)).collect::<Vec<_>>(),
        "entry": pts.iter().map(|p| p.index).collect::<Vec<_>>(),
        "allocated": pts.iter().map(|p| p.totals.allocated_bytes).collect::<Vec<_>>(),
        "reserved": pts.iter().map(|p| p.totals.reserved_bytes).collect::<Vec<_>>(),
        "series": d.series.iter().map(|s| json!({"site": s.id, "bytes": s.bytes})).collect::<Vec<_>>(),
        "sites": d.sites.iter().map(|(id, s)| (id.to_string(), site(s))).collect::<serde_json::Map<_, _>>(),
        "layout": layout.map(|l| layout_data(l, when)),
        "allocs": allocations_data(d),
    })
}

/// Each allocation, for the per-allocation view, as columns of integers
/// (the page stays small: about 26 bytes an allocation, with the stacks): `t` each one's
/// start after the one before, `d` how long it lasted (-1: live at the end),
/// in ticks of `tick` x units (microseconds, or entries), `s` its size in
/// `unit` bytes and `k` its site. The sites the rest of the page does not
/// name come with their frames as numbers into `frames`, which they share
/// (`[file, ":line in function"]`, the file a number into `files`).
pub fn allocations_data(d: &DeviceReport) -> Value {
    let list = &d.allocations.list;
    let t0 = d.timeline.points.iter().find_map(|p| p.time_us);
    let tick = |entry: Option<usize>, time: Option<i64>| -> i64 {
        match t0 {
            Some(t0) => time.map_or(0, |t| (t - t0).max(0)),
            None => entry.map_or(0, |i| i as i64 + 1),
        }
    };
    let unit = if list.iter().all(|a| a.size % 512 == 0) { 512 } else { 1 };
    let (mut t, mut dur, mut prev) = (Vec::with_capacity(list.len()), Vec::with_capacity(list.len()), 0);
    for a in list {
        let start = tick(a.entry, a.time_us);
        t.push(start - prev);
        prev = start;
        dur.push(a.end_entry.map_or(-1, |e| (tick(Some(e), a.end_time_us) - start).max(0)));
    }
    // A frame is `file:line in function`: its file is a number into `files`, which frames share.
    let mut frames: Vec<Value> = Vec::new();
    let (mut index, mut files) = (rustc_hash::FxHashMap::default(), Intern::default());
    let mut intern = |v: &[String]| -> Vec<usize> {
        v.iter()
            .map(|f| {
                *index.entry(f.clone()).or_insert_with(|| {
                    let (file, rest) =
                        f.rfind(" in ").and_then(|k| f[..k].rfind(':')).map_or(("", &f[..]), |k| f.split_at(k));
                    frames.push(json!([files.of(file), rest]));
                    frames.len() - 1
                })
            })
            .collect()
    };
    let sites: serde_json::Map<_, _> = d
        .allocations
        .sites
        .iter()
        .map(|(id, s)| {
            let v = json!([s.site, s.role.name(), s.phase.name(), intern(&s.frames), intern(&s.stack), s.more_frames]);
            (id.to_string(), v)
        })
        .collect();
    json!({
        "tick": if t0.is_some() { 1e-6 } else { 1.0 },
        "unit": unit,
        // The first `before` were live when the trace began.
        "before": list.iter().take_while(|a| a.entry.is_none()).count(),
        // Smaller allocations left out (beyond `allocations::MAX_ALLOCATIONS`).
        "dropped": d.allocations.dropped,
        "t": t,
        "d": dur,
        "s": list.iter().map(|a| a.size / unit).collect::<Vec<_>>(),
        "k": list.iter().map(|a| a.site).collect::<Vec<_>>(),
        "sites": sites,
        "frames": frames,
        "files": files.list,
    })
}

/// Strings numbered in the order they are first met.
#[derive(Default)]
struct Intern {
    list: Vec<String>,
    index: rustc_hash::FxHashMap<String, usize>,
}

impl Intern {
    fn of(&mut self, s: &str) -> usize {
        if let Some(&k) = self.index.get(s) {
            return k;
        }
        self.list.push(s.to_string());
        self.index.insert(s.to_string(), self.list.len() - 1);
        self.list.len() - 1
    }
}

fn site(s: &SiteDetail) -> Value {
    json!({
        "name": s.site,
        "role": s.role.name(),
        "phase": s.phase.name(),
        "frames": s.frames,
        "stack": s.stack,
        "more": s.more_frames,
    })
}

fn layout_data(l: &Layout, when: &str) -> Value {
    let (segs, total) = l.map_segments();
    json!({
        "when": when,
        "total": total,
        "segments": segs.iter().map(|s| json!({
            "address": format!("{:#x}", s.address),
            "size": s.size,
            "expandable": s.expandable,
            // [size, state, site]: state 0 allocated, 1 freed but pending, 2 free.
            "blocks": s.blocks.iter().map(|b| json!([b.size, state(b.state), b.site])).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

fn state(s: BlockState) -> u8 {
    match s {
        BlockState::ActiveAllocated => 0,
        BlockState::ActivePendingFree => 1,
        BlockState::Inactive => 2,
    }
}

fn round6(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return 0.0;
    }
    let scale = 10f64.powi(5 - v.abs().log10().floor() as i32);
    (v * scale).round() / scale
}

/// JSON text safe inside a `<script>` element: no `<` (so no `</script>`
/// or `<!--` in a file name ends it early), `>` or `&`.
pub fn script_json(v: &Value) -> String {
    serde_json::to_string(v)
        .unwrap_or_else(|_| "null".into())
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_in_a_script_cannot_close_it() {
        let v = json!({"name": "</script><script>alert(1)</script> & <!--"});
        let s = script_json(&v);
        assert!(!s.contains('<') && !s.contains('>') && !s.contains('&'), "{s}");
        assert_eq!(serde_json::from_str::<Value>(&s).unwrap(), v);
    }

    #[test]
    fn six_significant_digits() {
        assert_eq!(round6(1.234_567_89), 1.234_57);
        assert_eq!(round6(123_456_789.0), 123_457_000.0);
        assert_eq!(round6(0.000_123_456_78), 0.000_123_457);
    }
}
