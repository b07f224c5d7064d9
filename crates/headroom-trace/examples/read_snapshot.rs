//! Reads a snapshot and says what is in it and how long reading took: the
//! reader's side of `scripts/bench/snapshot_read.sh`, which runs it beside
//! CPython's `pickle.load` on the same file.
//!
//!     cargo run --release -p headroom-trace --example read_snapshot -- FILE

use headroom_trace::snapshot::read_snapshot_file;
use std::time::Instant;

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: read_snapshot FILE");
        std::process::exit(2);
    };
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let t = Instant::now();
    match read_snapshot_file(path.as_ref()) {
        Ok(s) => {
            let secs = t.elapsed().as_secs_f64();
            let entries: usize = s.device_traces.iter().map(Vec::len).sum();
            println!(
                "{path}: {size} bytes, {} segments, {entries} trace entries, {} distinct stacks; read in {secs:.3} s ({:.0} MB/s)",
                s.segments.len(),
                s.stacks.stacks.len(),
                size as f64 / secs / 1e6
            );
        }
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(2);
        }
    }
}
