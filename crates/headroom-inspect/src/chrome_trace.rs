//! Memory as Chrome trace-event JSON (the format chrome://tracing and
//! Perfetto open), so that it lines up with the user's profiler traces:
//! a counter track of allocated, reserved and active bytes per device,
//! each allocation as an async slice named after its call site, and the
//! OOMs as instant events.
//!
//! Times are the trace's own microseconds, as PyTorch recorded them, so a
//! profiler trace of the same run shares the axis. A trace without times
//! gets one microsecond per entry. Long traces are thinned to stay openable:
//! at most [`MAX_COUNTERS`] counter samples and [`MAX_SLICES`] allocations
//! (the largest), said in the file's metadata.

use crate::sites::Sites;
use crate::walk::Walk;
use headroom_trace::device_trace::DeviceTrace;
use headroom_trace::snapshot::{MemorySnapshot, TraceAction};
use serde_json::json;
use std::io::{self, Write};

pub const MAX_COUNTERS: usize = 200_000;
pub const MAX_SLICES: usize = 100_000;

/// Writes the trace events of each `(name, snapshot, devices)`: one process
/// track per device of each snapshot.
pub fn write_chrome_trace(
    inputs: &[(&str, &MemorySnapshot, &[u32])],
    cpp: bool,
    out: &mut impl Write,
) -> io::Result<()> {
    let mut notes = Vec::new();
    out.write_all(b"{\"traceEvents\":[\n")?;
    let mut first = true;
    let mut event = |out: &mut dyn Write, v: serde_json::Value| -> io::Result<()> {
        if !first {
            out.write_all(b",\n")?;
        }
        first = false;
        serde_json::to_writer(&mut *out, &v)?;
        Ok(())
    };
    let mut pid = 0u32;
    for &(name, snap, devices) in inputs {
        let mut sites = Sites::new(&snap.stacks, cpp);
        for &device in devices {
            pid += 1;
            event(
                out,
                json!({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": format!("{name}: GPU {device} memory")}}),
            )?;
            let trace = snap.device_traces.get(device as usize).map_or(&[][..], Vec::as_slice);
            if trace.is_empty() {
                notes.push(format!("{name} device {device}: no trace, nothing over time"));
                continue;
            }
            let times = trace.iter().any(|e| e.time_us.is_some());
            let dt = DeviceTrace::new(snap, device).ok();
            let mut w = Walk::new(snap, device, dt.as_ref().map(|t| &t.start));
            // The smallest allocation kept as a slice, so that at most MAX_SLICES
            // are: every larger one, and of those of exactly that size (fixed-size
            // buffers make many), the first that fit the cap.
            let mut sizes: Vec<u64> = trace.iter().filter(|e| e.action == TraceAction::Alloc).map(|e| e.size).collect();
            let (min_slice, mut ties_left) = if sizes.len() > MAX_SLICES {
                let k = sizes.len() - MAX_SLICES;
                let min = *sizes.select_nth_unstable(k).1;
                let above = sizes.iter().filter(|&&s| s > min).count();
                let ties = MAX_SLICES - above;
                let of_min = sizes.iter().filter(|&&s| s == min).count();
                notes.push(if ties < of_min {
                    format!(
                        "{name} device {device}: {MAX_SLICES} of {} allocations drawn as slices: those over {min} \
                         bytes, and the first {ties} of the {of_min} of exactly {min} bytes",
                        sizes.len()
                    )
                } else {
                    format!("{name} device {device}: allocations under {min} bytes are not drawn as slices")
                });
                (min, ties)
            } else {
                (0, usize::MAX)
            };
            let stride = trace.len().div_ceil(MAX_COUNTERS).max(1);
            if stride > 1 {
                notes.push(format!("{name} device {device}: counters sampled every {stride} entries"));
            }
            // Slices open at their alloc and close when the caller frees them.
            let mut open: rustc_hash::FxHashMap<u64, u64> = Default::default();
            let mut next_id = 0u64;
            // Entries without a time take the last time before them.
            let mut last_time = trace.iter().find_map(|e| e.time_us).unwrap_or(0);
            for i in 0..trace.len() {
                let e = &trace[i];
                w.step();
                // Times of entries recorded together can go back a little
                // (threads): a counter never goes back.
                let t = if times { e.time_us.unwrap_or(last_time).max(last_time) } else { i as i64 };
                last_time = t;
                match e.action {
                    TraceAction::Alloc if e.size > min_slice || (e.size == min_slice && ties_left > 0) => {
                        if e.size == min_slice {
                            ties_left -= 1;
                        }
                        next_id += 1;
                        open.insert(e.addr, next_id);
                        let site = &sites.info(e.stack).site.site;
                        event(
                            out,
                            json!({"ph": "b", "cat": "allocation", "name": site, "id": next_id, "pid": pid, "tid": 0, "ts": t,
                               "args": {"bytes": e.size, "address": format!("{:#x}", e.addr), "stream": e.stream}}),
                        )?;
                    }
                    TraceAction::FreeRequested | TraceAction::Free => {
                        if let Some(id) = open.remove(&e.addr) {
                            event(
                                out,
                                json!({"ph": "e", "cat": "allocation", "id": id, "pid": pid, "tid": 0, "ts": t}),
                            )?;
                        }
                    }
                    TraceAction::Oom => {
                        event(
                            out,
                            json!({"ph": "i", "s": "g", "name": "out of memory", "pid": pid, "tid": 0, "ts": t,
                               "args": {"requested_bytes": e.size, "device_free_bytes": e.device_free}}),
                        )?;
                    }
                    _ => {}
                }
                if i.is_multiple_of(stride) || i + 1 == trace.len() {
                    let tot = w.totals;
                    event(
                        out,
                        json!({"ph": "C", "name": "memory", "pid": pid, "ts": t,
                           "args": {"allocated": tot.allocated_bytes, "reserved": tot.reserved_bytes, "active": tot.active_bytes}}),
                    )?;
                }
            }
            // Allocations still live at the end close there.
            let mut ids: Vec<u64> = open.into_values().collect();
            ids.sort_unstable();
            for id in ids {
                event(out, json!({"ph": "e", "cat": "allocation", "id": id, "pid": pid, "tid": 0, "ts": last_time}))?;
            }
        }
    }
    out.write_all(b"\n],\"displayTimeUnit\":\"ms\",\"otherData\":")?;
    serde_json::to_writer(
        &mut *out,
        &json!({"producer": "headroom inspect", "notes": notes, "time_unit": "microseconds as recorded by PyTorch (entry index when none were)"}),
    )?;
    out.write_all(b"}\n")?;
    Ok(())
}
