//! Times each replay pass over a snapshot's trace, in rounds: the check against
//! every recorded decision, the what-if under the recorded settings, and the
//! what-if with expandable segments. Each pass starts from a freshly inferred
//! start state (not timed), as a `headroom replay` that runs only that pass
//! does, so each pays for whatever it reads from the whole trace. Prints each
//! pass's median and best rate in trace entries per second.
//!
//!     cargo run --release -p headroom-trace --example replay_passes -- FILE [ROUNDS]

use headroom_alloc::AllocatorConfig;
use headroom_trace::device_trace::DeviceTrace;
use headroom_trace::snapshot::read_snapshot_file;
use headroom_trace::snapshot_replay::check_from;
use headroom_trace::what_if::what_if_device;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: replay_passes FILE [ROUNDS]");
        std::process::exit(2);
    };
    let rounds: usize = args.get(1).and_then(|r| r.parse().ok()).unwrap_or(5);
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
        let fresh = || match DeviceTrace::new(&snap, device) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("device {device}: {e}");
                std::process::exit(2);
            }
        };
        let calls = check_from(&fresh(), recorded.clone(), 1 << 50, |_| {}).map(|f| f.recorded).unwrap_or_default();
        let mut times: [Vec<f64>; 3] = Default::default();
        for _ in 0..rounds {
            let t = fresh();
            let at = Instant::now();
            let exact = check_from(&t, recorded.clone(), 1 << 50, |_| {}).is_ok_and(|f| f.is_exact());
            times[0].push(at.elapsed().as_secs_f64());
            assert!(exact, "the check found a decision that differs");
            for (k, config) in [(1, &recorded), (2, &expandable)] {
                let t = fresh();
                let at = Instant::now();
                let w = what_if_device(&t, config.clone(), 1 << 50, &calls, None, |_| {});
                times[k].push(at.elapsed().as_secs_f64());
                assert!(w.is_ok(), "a what-if failed");
            }
        }
        for (name, mut ts) in
            ["check", "what-if, recorded settings", "what-if, expandable segments"].into_iter().zip(times)
        {
            ts.sort_by(f64::total_cmp);
            let (median, best) = (ts[ts.len() / 2], ts[0]);
            println!(
                "device {device}, {n} entries, {name}: median {median:.3} s ({:.1} M entries/s), best {best:.3} s ({:.1} M/s)",
                n as f64 / median / 1e6,
                n as f64 / best / 1e6
            );
        }
    }
}
