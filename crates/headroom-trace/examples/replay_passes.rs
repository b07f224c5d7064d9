//! Times each replay pass over a snapshot's trace, in rounds: the check against
//! every recorded decision, the what-if under the recorded settings, and the
//! what-if with expandable segments. Each pass starts from a freshly made
//! `DeviceTrace` (not timed): its start state, and the trace's index and private
//! pools made beside it on a second thread, as `headroom replay` and `inspect`
//! make them before their first pass. Prints each pass's median and best rate in
//! trace entries per second, by the wall clock and by the thread's own CPU time
//! (on Linux; on a machine shared with other work, the CPU time is the steadier
//! of the two), and the medians of the start state and of the index.
//!
//!     cargo run --release -p headroom-trace --example replay_passes -- FILE [ROUNDS] [PASS] [own-index]
//!
//! PASS (`check`, `recorded` or `expandable`; `all` for the three) runs that pass
//! alone, for a profile of it. `own-index`: the index and pools are made inside the
//! timed pass, on its thread, as builds before the twelfth round of
//! docs/PERFORMANCE.md's replay passes did.

use headroom_alloc::AllocatorConfig;
use headroom_trace::device_trace::DeviceTrace;
use headroom_trace::snapshot::read_snapshot_file;
use headroom_trace::snapshot_replay::check_from;
use headroom_trace::start_state::infer_start;
use headroom_trace::trace_index::TraceIndex;
use headroom_trace::what_if::what_if_device;
use std::time::Instant;

/// Seconds this thread has run on a CPU: the first field of Linux's
/// `/proc/thread-self/schedstat`, in nanoseconds. `None` elsewhere.
fn thread_cpu_s() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse::<f64>().ok().map(|ns| ns / 1e9)
}

/// The time `f` takes: wall seconds and, where known, CPU seconds.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64, Option<f64>) {
    let (wall, cpu) = (Instant::now(), thread_cpu_s());
    let out = f();
    let cpu = cpu.zip(thread_cpu_s()).map(|(a, b)| b - a);
    (out, wall.elapsed().as_secs_f64(), cpu)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: replay_passes FILE [ROUNDS] [PASS] [own-index]");
        std::process::exit(2);
    };
    let rounds: usize = args.get(1).and_then(|r| r.parse().ok()).unwrap_or(5);
    let only = match args.get(2).map(String::as_str) {
        None | Some("all") => None,
        Some("check") => Some(0),
        Some("recorded") => Some(1),
        Some("expandable") => Some(2),
        Some(other) => {
            eprintln!("unknown pass {other:?}: use check, recorded or expandable");
            std::process::exit(2);
        }
    };
    let own_index = match args.get(3).map(String::as_str) {
        None => false,
        Some("own-index") => true,
        Some(other) => {
            eprintln!("unknown mode {other:?}: use own-index or nothing");
            std::process::exit(2);
        }
    };
    let runs = |k: usize| only.is_none_or(|o| o == k);
    let snap = match read_snapshot_file(path.as_ref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(2);
        }
    };
    let (recorded, _) = snap.allocator_config();
    let mut expandable = recorded.clone();
    if let Err(e) = expandable.apply("expandable_segments:True") {
        eprintln!("{e}");
        std::process::exit(2);
    }
    let expandable: AllocatorConfig = expandable;
    for device in snap.devices() {
        let n = snap.device_traces.get(device as usize).map_or(0, Vec::len);
        let made = |t| match t {
            Ok(t) => t,
            Err(e) => {
                eprintln!("device {device}: {e}");
                std::process::exit(2);
            }
        };
        let fresh =
            || made(if own_index { DeviceTrace::new(&snap, device) } else { DeviceTrace::with_pools(&snap, device) });
        let calls = check_from(&fresh(), recorded.clone(), 1 << 50, |_| {}).map(|f| f.recorded).unwrap_or_default();
        let mut times: [Vec<f64>; 3] = Default::default();
        let mut cpu: [Vec<f64>; 3] = Default::default();
        let (mut start_s, mut index_s) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let (_, _, c) = timed(|| infer_start(&snap, device, &recorded));
            start_s.extend(c);
            let (_, _, c) = timed(|| TraceIndex::of(&snap, device));
            index_s.extend(c);
            if runs(0) {
                let t = fresh();
                let (exact, wall, c) =
                    timed(|| check_from(&t, recorded.clone(), 1 << 50, |_| {}).is_ok_and(|f| f.is_exact()));
                times[0].push(wall);
                cpu[0].extend(c);
                assert!(exact, "the check found a decision that differs");
            }
            for (k, config) in [(1, &recorded), (2, &expandable)].into_iter().filter(|(k, _)| runs(*k)) {
                let t = fresh();
                let (w, wall, c) = timed(|| what_if_device(&t, config.clone(), 1 << 50, &calls, None, |_| {}));
                times[k].push(wall);
                cpu[k].extend(c);
                assert!(w.is_ok(), "a what-if failed");
            }
        }
        for (name, mut cs) in [("start state", start_s), ("trace index", index_s)] {
            if !cs.is_empty() {
                cs.sort_by(f64::total_cmp);
                println!("device {device}, {name} (made before the passes): CPU time median {:.3} s", cs[cs.len() / 2]);
            }
        }
        for ((name, mut ts), mut cs) in
            ["check", "what-if, recorded settings", "what-if, expandable segments"].into_iter().zip(times).zip(cpu)
        {
            if ts.is_empty() {
                continue;
            }
            ts.sort_by(f64::total_cmp);
            let (median, best) = (ts[ts.len() / 2], ts[0]);
            println!(
                "device {device}, {n} entries, {name}: median {median:.3} s ({:.1} M entries/s), best {best:.3} s ({:.1} M/s)",
                n as f64 / median / 1e6,
                n as f64 / best / 1e6
            );
            if !cs.is_empty() {
                cs.sort_by(f64::total_cmp);
                let (median, best) = (cs[cs.len() / 2], cs[0]);
                println!(
                    "    CPU time: median {median:.3} s ({:.1} M entries/s), best {best:.3} s ({:.1} M/s)",
                    n as f64 / median / 1e6,
                    n as f64 / best / 1e6
                );
            }
        }
    }
}
