//! The backend on a real GPU. Each test skips with a message where no
//! driver or device is present; on a machine with one (`device` tool) they
//! are the backend's checks: data lands in what it hands out, running out of
//! memory is the recoverable error, pages map and unmap, events order
//! streams, and the caching allocator runs a real trace on it.

#[path = "../../../tests/support/skip.rs"]
mod skip;

use headroom_alloc::{AllocError, AllocatorConfig, DeviceCachingAllocator, DeviceError, DeviceMemory};
use headroom_cuda::{CudaDevice, PinnedBuffer, Streams};

const MIB: u64 = 1 << 20;

fn device() -> Option<CudaDevice> {
    match CudaDevice::new(0, Streams::Labels) {
        Ok(d) => Some(d),
        Err(why) => {
            skip::skip(&format!("no CUDA device ({why})"));
            None
        }
    }
}

/// Writes a pattern to `[ptr, ptr + len)` through pinned memory and reads it back.
fn round_trip(d: &mut CudaDevice, ptr: u64, len: usize, seed: u8, stream: u64) {
    let mut out = PinnedBuffer::new(d, len).unwrap();
    for (i, b) in out.as_mut_slice().iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
    let mut back = PinnedBuffer::new(d, len).unwrap();
    out.copy_to_device(d, ptr, stream).unwrap();
    back.copy_from_device(d, ptr, stream).unwrap();
    let e = d.record_event(stream).unwrap();
    d.synchronize_event(e).unwrap();
    assert!(d.query_event(e).unwrap());
    d.destroy_event(e);
    assert!(out.as_slice() == back.as_slice(), "the device returned other bytes than were written");
}

#[test]
fn reports_the_device() {
    let Some(d) = device() else { return };
    let info = d.info();
    let mem = d.mem_get_info();
    assert!(info.total_bytes > 0 && mem.free <= mem.total, "{info:?} {mem}");
    assert!(!info.name.is_empty());
    eprintln!("{} ({} bytes), VMM granularity {:?}, {mem}", info.name, info.total_bytes, info.vmm_granularity);
}

#[test]
fn segments_hold_what_is_written() {
    let Some(mut d) = device() else { return };
    let ptr = d.malloc(64 * MIB).unwrap();
    round_trip(&mut d, ptr, (64 * MIB) as usize, 7, 0);
    round_trip(&mut d, ptr, (64 * MIB) as usize, 9, 3);
    d.free(ptr, 64 * MIB).unwrap();
}

#[test]
fn running_out_of_memory_is_recoverable() {
    let Some(mut d) = device() else { return };
    let chunk = 1 << 30;
    let mut held = Vec::new();
    let err = loop {
        match d.malloc(chunk) {
            Ok(p) => held.push(p),
            Err(e) => break e,
        }
        assert!(held.len() < 4096, "the device never ran out");
    };
    assert!(matches!(err, DeviceError::OutOfMemory { .. }), "{err:?}");
    assert!(err.is_out_of_memory());
    let total = d.info().total_bytes;
    assert!(matches!(d.malloc(total + chunk), Err(DeviceError::NeverFits { .. })));
    for p in held.drain(..) {
        d.free(p, chunk).unwrap();
    }
    let p = d.malloc(chunk).expect("memory comes back once freed");
    d.free(p, chunk).unwrap();
}

#[test]
fn pages_map_and_unmap() {
    let Some(mut d) = device() else { return };
    let Some(g) = d.info().vmm_granularity else {
        skip::skip("the device cannot map pages");
        return;
    };
    let va = d.reserve(8 * g).unwrap();
    d.map(va, 2 * g, g).unwrap();
    round_trip(&mut d, va, (2 * g) as usize, 1, 0);
    d.map(va + 2 * g, 2 * g, g).unwrap();
    round_trip(&mut d, va, (4 * g) as usize, 2, 5);
    d.unmap(va + 2 * g, 2 * g, g, 5).unwrap();
    round_trip(&mut d, va, (2 * g) as usize, 3, 0);
    assert!(matches!(d.unmap(va + 6 * g, g, g, 0), Err(DeviceError::Invalid(_))), "an unmapped page");
    d.unmap(va, 2 * g, g, 0).unwrap();
    d.release_reservation(va, 8 * g).unwrap();
}

#[test]
fn events_on_other_streams_complete() {
    let Some(mut d) = device() else { return };
    let events: Vec<_> = (1..=4).map(|s| d.record_event(s).unwrap()).collect();
    d.synchronize().unwrap();
    for &e in &events {
        assert!(d.query_event(e).unwrap());
        d.destroy_event(e);
    }
    // Destroyed events are reused, and a destroyed id is an error, not a crash.
    let again = d.record_event(2).unwrap();
    assert!(events.contains(&again));
    d.destroy_event(again);
    assert!(matches!(d.query_event(again), Err(DeviceError::Invalid(_))));
}

#[test]
fn the_caching_allocator_runs_on_the_gpu() {
    for conf in ["", "expandable_segments:True"] {
        let Some(d) = device() else { return };
        let mut a = DeviceCachingAllocator::new(d, AllocatorConfig::parse(conf).unwrap());
        // A step's worth of sizes, twice: the second reuses the cache.
        for _ in 0..2 {
            let blocks: Vec<u64> =
                [512, 4096, MIB, 3 * MIB, 20 * MIB, 100 * MIB].iter().map(|&s| a.malloc(s, 0).unwrap().ptr).collect();
            for p in blocks {
                a.free(p).unwrap();
            }
        }
        a.validate().unwrap();
        let s = a.stats();
        assert_eq!(s.allocated_bytes.all().current, 0, "{conf}");
        assert!(s.reserved_bytes.all().current > 0, "{conf}: the cache keeps its segments");
        a.empty_cache().unwrap();
        assert_eq!(a.stats().reserved_bytes.all().current, 0, "{conf}");
        // Past the device: PyTorch's out-of-memory error, and the allocator carries on.
        let too_big = 2 * a.device().info().total_bytes;
        assert!(matches!(a.malloc(too_big, 0), Err(AllocError::NeverFits(_) | AllocError::OutOfMemory(_))));
        let p = a.malloc(MIB, 0).unwrap().ptr;
        a.free(p).unwrap();
    }
}
