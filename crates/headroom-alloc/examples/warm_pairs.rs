//! Warm malloc + free pairs, a fixed number of them, for instruction counts:
//! callgrind's totals at N and at 0 pairs differ by N times the pair's cost,
//! where the bench's timed loop runs an unknown number of iterations.
//!
//! `cargo run --release -p headroom-alloc --example warm_pairs -- N small|large [locked]`

use headroom_alloc::units::{GIB, MIB};
use headroom_alloc::{AllocatorConfig, CachingAllocator, DeviceCachingAllocator, SimDevice};
use std::hint::black_box;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: warm_pairs N small|large [locked]";
    let Some(n) = args.first().and_then(|a| a.parse::<u64>().ok()) else {
        eprintln!("{usage}");
        return ExitCode::FAILURE;
    };
    let size = match args.get(1).map(String::as_str) {
        Some("small") => 4096,
        Some("large") => 64 * MIB,
        _ => {
            eprintln!("{usage}");
            return ExitCode::FAILURE;
        }
    };
    // As the bench: one pair first, so that every counted pair finds its block cached.
    if args.get(2).is_some_and(|a| a == "locked") {
        let a = CachingAllocator::new(SimDevice::new(80 * GIB), AllocatorConfig::default());
        for _ in 0..=n {
            let b = a.malloc(black_box(size), 0).expect("80 GiB holds one block");
            a.free(b.ptr).expect("the pointer was just handed out");
        }
    } else {
        let mut a = DeviceCachingAllocator::new(SimDevice::new(80 * GIB), AllocatorConfig::default());
        for _ in 0..=n {
            let b = a.malloc(black_box(size), 0).expect("80 GiB holds one block");
            a.free(b.ptr).expect("the pointer was just handed out");
        }
    }
    ExitCode::SUCCESS
}
