//! Reads a snapshot and says what is in it and how long reading took: the
//! reader's side of `scripts/bench/snapshot_read.sh`, which runs it beside
//! CPython's `pickle.load` on the same file. With `--replay`, it then times
//! each replay pass over every device's trace: inferring the start state,
//! the check against the recorded decisions, and a what-if under the
//! recorded settings.
//!
//!     cargo run --release -p headroom-trace --example read_snapshot -- FILE [--replay]

use headroom_trace::device_trace::DeviceTrace;
use headroom_trace::snapshot::read_snapshot_file;
use headroom_trace::snapshot_replay::check_from;
use headroom_trace::what_if::what_if_device;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let replay = args.iter().any(|a| a == "--replay");
    let Some(path) = args.iter().find(|a| !a.starts_with("--")) else {
        eprintln!("usage: read_snapshot FILE [--replay]");
        std::process::exit(2);
    };
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let t = Instant::now();
    let snap = match read_snapshot_file(path.as_ref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(2);
        }
    };
    let secs = t.elapsed().as_secs_f64();
    let entries: usize = snap.device_traces.iter().map(Vec::len).sum();
    println!(
        "{path}: {size} bytes, {} segments, {entries} trace entries, {} distinct stacks; read in {secs:.3} s ({:.0} MB/s)",
        snap.segments.len(),
        snap.stacks.stacks.len(),
        size as f64 / secs / 1e6
    );
    if !replay {
        return;
    }
    let (config, _) = snap.allocator_config();
    for device in snap.devices() {
        let n = snap.device_traces.get(device as usize).map_or(0, Vec::len);
        let rate = |t: Instant| {
            format!(
                "{:.3} s ({:.1} M entries/s)",
                t.elapsed().as_secs_f64(),
                n as f64 / t.elapsed().as_secs_f64() / 1e6
            )
        };
        let t = Instant::now();
        let trace = match DeviceTrace::new(&snap, device) {
            Ok(d) => d,
            Err(e) => {
                println!("device {device}: {e}");
                continue;
            }
        };
        let infer = rate(t);
        let t = Instant::now();
        let f = check_from(&trace, config.clone(), 1 << 50, |_| {});
        let check = rate(t);
        let calls = f.as_ref().map(|f| f.recorded.clone()).unwrap_or_default();
        let t = Instant::now();
        let w = what_if_device(&trace, config.clone(), 1 << 50, &calls, None, |_| {});
        let what_if = rate(t);
        let exact = f.as_ref().map(|f| f.is_exact()).unwrap_or(false);
        println!(
            "device {device}: {n} entries; start state {infer}; check {check}{}; what-if {what_if}{}",
            if exact { ", exact" } else { ", NOT exact" },
            if w.is_ok() { "" } else { ", failed" }
        );
    }
}
