//! What each device call the allocator makes costs on this GPU, measured
//! through `CudaDevice` as the allocator makes them: `cudaMalloc`
//! (`cuMemAlloc`) and its free of one 2 MiB and one 20 MiB segment, and
//! mapping and unmapping 2 MiB pages (each its own physical allocation, as
//! `headroom-cuda` and PyTorch map them), one page and ten at a time, and ten
//! pages as one allocation of 20 MiB. Prints
//! the means beside the simulator's costs (`DeviceCosts::PUBLISHED`, an A100's
//! published figures), in microseconds, to set them from this GPU's.
//!
//!     cargo run --release -p headroom-cuda --example call_costs [ROUNDS]
//!
//! Without a driver or a device it says so and exits 2.

use headroom_alloc::{DeviceCosts, DeviceMemory};
use headroom_cuda::{CudaDevice, Streams};
use std::time::Instant;

const MIB: u64 = 1 << 20;

fn main() {
    let rounds: u32 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(200);
    let mut d = match CudaDevice::new(0, Streams::Labels) {
        Ok(d) => d,
        Err(why) => {
            eprintln!("call_costs: no CUDA device ({why})");
            std::process::exit(2);
        }
    };
    println!("{}, {} rounds", d.info().name, rounds);
    let mean_us = |total: std::time::Duration, n: u64| total.as_secs_f64() * 1e6 / n as f64;
    let published = DeviceCosts::PUBLISHED;
    for size in [2 * MIB, 20 * MIB] {
        let (mut alloc, mut free) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
        for _ in 0..rounds {
            let t = Instant::now();
            let p = d.malloc(size).expect("cudaMalloc");
            alloc += t.elapsed();
            let t = Instant::now();
            d.free(p, size).expect("cudaFree");
            free += t.elapsed();
        }
        let n = rounds as u64;
        println!(
            "cudaMalloc {:>2} MiB: {:>8.1} us (simulator {:.1}); cudaFree: {:>8.1} us (simulator {:.1})",
            size / MIB,
            mean_us(alloc, n),
            published.malloc_ns as f64 / 1e3,
            mean_us(free, n),
            published.free_ns as f64 / 1e3
        );
    }
    let page = 2 * MIB;
    let va_size = 64 * page;
    let va = d.reserve(va_size).expect("cuMemAddressReserve");
    for pages in [1u64, 10] {
        let (mut map, mut unmap) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
        for _ in 0..rounds {
            let t = Instant::now();
            d.map(va, pages * page, page).expect("map");
            map += t.elapsed();
            let t = Instant::now();
            d.unmap(va, pages * page, page, 0).expect("unmap");
            unmap += t.elapsed();
        }
        let n = rounds as u64 * pages;
        println!(
            "map {pages:>2} page(s) of 2 MiB: {:>8.1} us a page (simulator {:.1}); unmap: {:>8.1} us a page (simulator {:.1})",
            mean_us(map, n),
            published.map_page_ns as f64 / 1e3,
            mean_us(unmap, n),
            published.unmap_page_ns as f64 / 1e3
        );
    }
    // Ten pages as one physical allocation, as the `headroom` policy maps a
    // request's own pages while reserved memory climbs: whether an allocation
    // of 20 MiB costs what one of 2 MiB does (the simulator's assumption).
    let (mut map, mut unmap) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
    for _ in 0..rounds {
        let t = Instant::now();
        d.map(va, 10 * page, 10 * page).expect("map");
        map += t.elapsed();
        let t = Instant::now();
        d.unmap(va, 10 * page, 10 * page, 0).expect("unmap");
        unmap += t.elapsed();
    }
    let n = rounds as u64;
    println!(
        "map one allocation of 20 MiB: {:>8.1} us (simulator {:.1}); unmap: {:>8.1} us (simulator {:.1})",
        mean_us(map, n),
        published.map_page_ns as f64 / 1e3,
        mean_us(unmap, n),
        published.unmap_page_ns as f64 / 1e3
    );
    d.release_reservation(va, va_size).expect("cuMemAddressFree");
}
