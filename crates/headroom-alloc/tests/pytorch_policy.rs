//! The allocator makes PyTorch's decisions: the worked example of the spec
//! (research/pytorch-allocator.md §14.1) and each rule of §2–§7.

use headroom_alloc::units::{GIB, MIB};
use headroom_alloc::{
    Action, AllocError, AllocatorConfig, BlockState, CountingDevice, DeviceCachingAllocator, DeviceMemory,
    FaultyDevice, FreeMemoryCallback, SimDevice,
};

/// The simulated GPU, with its calls counted and faults injectable.
type Device = CountingDevice<FaultyDevice<SimDevice>>;
type Alloc = DeviceCachingAllocator<Device>;

fn allocator(conf: &str, capacity: u64) -> Alloc {
    let device = CountingDevice::new(FaultyDevice::new(SimDevice::new(capacity)));
    let mut a = DeviceCachingAllocator::new(device, AllocatorConfig::parse(conf).unwrap());
    a.record_history(Some(100_000));
    a
}

fn stat(a: &Alloc, key: &str) -> i64 {
    a.memory_stats()[key]
}

fn actions(a: &mut Alloc) -> Vec<(Action, u64)> {
    let snap = a.snapshot();
    snap.device_traces[0].iter().filter(|e| e.action != Action::Snapshot).map(|e| (e.action, e.size)).collect()
}

#[test]
fn worked_example_of_the_spec() {
    let mut a = allocator("", 80 * GIB);

    // 1. 3,000,000 B -> 3,000,320 B, a new 20 MiB segment, split.
    let b1 = a.malloc(3_000_000, 0).unwrap();
    assert_eq!(b1.size, 3_000_320);
    for pool in ["large_pool", "all"] {
        assert_eq!(stat(&a, &format!("segment.{pool}.current")), 1);
        assert_eq!(stat(&a, &format!("reserved_bytes.{pool}.current")), 20_971_520);
        assert_eq!(stat(&a, &format!("allocated_bytes.{pool}.current")), 3_000_320);
        assert_eq!(stat(&a, &format!("requested_bytes.{pool}.current")), 3_000_000);
        assert_eq!(stat(&a, &format!("inactive_split.{pool}.current")), 1);
        assert_eq!(stat(&a, &format!("inactive_split_bytes.{pool}.current")), 17_971_200);
    }
    assert_eq!(actions(&mut a), vec![(Action::SegmentAlloc, 20_971_520), (Action::Alloc, 3_000_000)]);

    // 2. 12,582,913 B -> 12,583,424 B, best fit is the remainder: no new segment.
    let b2 = a.malloc(12_582_913, 0).unwrap();
    assert_eq!(b2.size, 12_583_424);
    assert_eq!(b2.ptr, b1.ptr + 3_000_320, "carved from the front of the remainder");
    assert_eq!(stat(&a, "num_device_alloc"), 1);
    assert_eq!(stat(&a, "inactive_split_bytes.large_pool.current"), 5_387_776);
    assert_eq!(stat(&a, "inactive_split.large_pool.current"), 1);

    // 3. 100 B -> 512 B in the small pool, a new 2 MiB segment, split.
    let _b3 = a.malloc(100, 0).unwrap();
    assert_eq!(stat(&a, "segment.small_pool.current"), 1);
    assert_eq!(stat(&a, "inactive_split.small_pool.current"), 1);
    assert_eq!(stat(&a, "inactive_split_bytes.small_pool.current"), 2_096_640);
    assert_eq!(stat(&a, "segment.all.current"), 2);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 23_068_672);

    // 4. Free block 1: no merge (block 2 is allocated), it becomes a split fragment.
    a.free(b1.ptr).unwrap();
    assert_eq!(stat(&a, "inactive_split.large_pool.current"), 2);
    assert_eq!(stat(&a, "inactive_split_bytes.large_pool.current"), 8_388_096);
    let trace = actions(&mut a);
    assert_eq!(&trace[trace.len() - 2..], &[(Action::FreeRequested, 3_000_000), (Action::FreeCompleted, 3_000_000)]);
    // empty_cache releases nothing: both segments are split.
    a.empty_cache().unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 23_068_672);
    assert_eq!(stat(&a, "num_device_free"), 0);
    a.validate().unwrap();
}

#[test]
fn would_be_segment_for_a_12_mib_request_is_7_pages_of_2_mib() {
    let mut a = allocator("", 80 * GIB);
    let b = a.malloc(12_582_913, 0).unwrap();
    assert_eq!(b.size, 12_583_424);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 14_680_064);
    // Remainder 2,096,640 > 1 MiB: split.
    assert_eq!(stat(&a, "inactive_split_bytes.large_pool.current"), 2_096_640);
}

#[test]
fn large_blocks_keep_up_to_1_mib_of_slack_unsplit() {
    let mut a = allocator("", 80 * GIB);
    let b = a.malloc(20 * MIB - MIB, 0).unwrap();
    assert_eq!(b.size, 20 * MIB, "remainder of exactly 1 MiB is not split off");
    assert_eq!(stat(&a, "allocated_bytes.all.current"), 20 * MIB as i64);
    assert_eq!(stat(&a, "requested_bytes.all.current"), 19 * MIB as i64);
}

#[test]
fn best_fit_takes_the_lowest_address_among_equal_sizes_and_stays_on_its_stream() {
    let mut a = allocator("", 80 * GIB);
    let x: Vec<_> = (0..4).map(|_| a.malloc(30 * MIB, 0).unwrap()).collect();
    a.free(x[2].ptr).unwrap();
    a.free(x[0].ptr).unwrap();
    let y = a.malloc(30 * MIB, 0).unwrap();
    assert_eq!(y.ptr, x[0].ptr);
    // Another stream cannot use stream 0's cached block.
    let z = a.malloc(30 * MIB, 7).unwrap();
    assert_ne!(z.ptr, x[2].ptr);
    assert_eq!(stat(&a, "segment.all.current"), 5);
    a.validate().unwrap();
}

#[test]
fn record_stream_defers_reuse_until_the_other_streams_work_is_done() {
    let mut a = allocator("", 80 * GIB);
    let b = a.malloc(4 * MIB, 0).unwrap();
    a.record_stream(b.ptr, 1).unwrap();
    a.record_stream(b.ptr, 0).unwrap(); // its own stream: ignored
    a.free(b.ptr).unwrap();
    assert_eq!(stat(&a, "allocated_bytes.all.current"), 0);
    assert_eq!(stat(&a, "active_bytes.all.current"), 4 * MIB as i64);
    let snap = a.snapshot();
    assert_eq!(snap.segments[0].blocks[0].state, BlockState::ActivePendingFree);
    a.validate().unwrap();

    // While stream 1's event is pending, the block is not reused.
    let c = a.malloc(4 * MIB, 0).unwrap();
    assert_ne!(c.ptr, b.ptr);
    a.free(c.ptr).unwrap();
    a.device_mut().inner_mut().inner_mut().complete_events_on(1);
    // The next malloc completes the free first, then reuses the lowest address.
    let d = a.malloc(4 * MIB, 0).unwrap();
    assert_eq!(d.ptr, b.ptr);
    assert_eq!(a.device().inner().inner().live_events(), 0);
    a.validate().unwrap();
}

#[test]
fn empty_cache_waits_for_pending_frees() {
    let mut a = allocator("", 80 * GIB);
    let b = a.malloc(30 * MIB, 0).unwrap();
    a.record_stream(b.ptr, 3).unwrap();
    a.free(b.ptr).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(stat(&a, "num_sync_all_streams"), 1);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    assert_eq!(stat(&a, "active.all.current"), 0);
    a.validate().unwrap();
}

#[test]
fn failed_malloc_flushes_every_unsplit_cached_block_in_free_set_order_then_retries() {
    let mut a = allocator("", 100 * MIB);
    let xs: Vec<_> = [12, 16, 14].iter().map(|&m| a.malloc(m * MIB, 0).unwrap()).collect();
    let keep = a.malloc(2 * MIB, 0).unwrap(); // 2 MiB request: a 20 MiB segment, split, stays
    for x in &xs {
        a.free(x.ptr).unwrap();
    }
    // 42 MiB cached + 20 MiB in use; 60 MiB more does not fit until the cache is flushed.
    let big = a.malloc(60 * MIB, 0).unwrap();
    assert_eq!(big.size, 60 * MIB);
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    let trace = actions(&mut a);
    let frees: Vec<u64> = trace.iter().filter(|(a, _)| *a == Action::SegmentFree).map(|&(_, s)| s).collect();
    assert_eq!(frees, vec![12 * MIB, 14 * MIB, 16 * MIB], "ascending (stream, size, address)");
    assert_eq!(trace.last().unwrap(), &(Action::Alloc, 60 * MIB));
    assert!(a.allocation_size(keep.ptr).is_some());
    a.validate().unwrap();
}

#[test]
fn out_of_memory_reports_pytorchs_fields_and_what_users_asked_for() {
    let mut a = allocator("", 100 * MIB);
    let x = a.malloc(40 * MIB, 0).unwrap();
    let _y = a.malloc(3 * MIB, 0).unwrap(); // 20 MiB segment, 17 MiB split remainder
    a.free(x.ptr).unwrap();
    let _z = a.malloc(30 * MIB, 0).unwrap(); // reuses the 40 MiB block, splits off 10 MiB
    let err = a.malloc(50 * MIB, 0).unwrap_err();
    let AllocError::OutOfMemory(r) = &err else { panic!("{err:?}") };
    assert_eq!(r.alloc_size, 50 * MIB);
    assert_eq!(r.reserved, 60 * MIB);
    assert_eq!(r.allocated, 33 * MIB);
    assert_eq!(r.largest_free_block, 17 * MIB);
    assert_eq!(r.split_fragment_bytes, 27 * MIB);
    let msg = err.to_string();
    assert!(msg.starts_with("CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 has a total capacity of 100.00 MiB of which 40.00 MiB is free."), "{msg}");
    assert!(msg.contains("27.00 MiB is reserved by PyTorch but unallocated"), "{msg}");
    assert!(msg.contains("largest free block 17.00 MiB"), "{msg}");
    assert_eq!(stat(&a, "num_ooms"), 1);
    let snap = a.snapshot();
    let oom = snap.device_traces[0].iter().find(|e| e.action == Action::Oom).unwrap();
    assert_eq!((oom.size, oom.device_free, oom.addr), (50 * MIB, Some(40 * MIB), 40 * MIB));
    // The allocator carries on after an OOM.
    a.malloc(10 * MIB, 0).unwrap();
    a.validate().unwrap();
}

#[test]
fn requests_larger_than_the_device_never_fit() {
    let mut a = allocator("", 100 * MIB);
    assert!(matches!(a.malloc(200 * MIB, 0), Err(AllocError::NeverFits(_))));
    assert!(matches!(a.malloc(1 << 60, 0), Err(AllocError::NeverFits(_))));
}

#[test]
fn memory_fraction_limits_reserved_memory() {
    let mut a = allocator("", 100 * MIB);
    a.set_memory_fraction(0.5).unwrap();
    assert_eq!(a.memory_limit(), Some(50 * MIB));
    a.malloc(40 * MIB, 0).unwrap();
    let err = a.malloc(20 * MIB, 0).unwrap_err();
    assert!(matches!(err, AllocError::OverLimit(ref r) if r.allowed == Some(50 * MIB)), "{err:?}");
    assert!(err.to_string().contains("50.00 MiB allowed; "));
    assert_eq!(a.device().calls().malloc, 1, "the device is never asked beyond the limit");
    a.set_memory_fraction(1.0).unwrap();
    a.malloc(20 * MIB, 0).unwrap();
    assert!(a.set_memory_fraction(1.5).is_err());
}

#[test]
fn oversize_blocks_are_never_split_and_only_serve_close_large_requests() {
    let mut a = allocator("max_split_size_mb:32", 10 * GIB);
    let x = a.malloc(100 * MIB, 0).unwrap();
    a.free(x.ptr).unwrap();
    assert_eq!(stat(&a, "oversize_segments.current"), 1);
    // A request below max_split_size never takes an oversize block.
    let small = a.malloc(20 * MIB, 0).unwrap();
    assert_ne!(small.ptr, x.ptr);
    // An oversize request takes it only within max_non_split_rounding (20 MiB).
    let far = a.malloc(70 * MIB, 0).unwrap();
    assert_ne!(far.ptr, x.ptr);
    let near = a.malloc(90 * MIB, 0).unwrap();
    assert_eq!((near.ptr, near.size), (x.ptr, 100 * MIB), "not split");
    assert_eq!(stat(&a, "oversize_allocations.current"), 2);
    a.validate().unwrap();
}

#[test]
fn with_max_split_size_only_enough_oversize_blocks_are_released() {
    let mut a = allocator("max_split_size_mb:32", 200 * MIB);
    let x = a.malloc(40 * MIB, 0).unwrap();
    let y = a.malloc(60 * MIB, 0).unwrap();
    let k = a.malloc(20 * MIB, 0).unwrap(); // not oversize, stays cached
    a.free(x.ptr).unwrap();
    a.free(y.ptr).unwrap();
    a.free(k.ptr).unwrap();
    // 120 MiB cached of 200; 100 MiB needs 20 MiB more than is free: the
    // smallest oversize block of at least 100 MiB does not exist, so release
    // from the largest down (60, then 40) until 100 MiB are released.
    a.malloc(100 * MIB, 0).unwrap();
    assert_eq!(stat(&a, "num_alloc_retries"), 0, "no full flush");
    assert_eq!(stat(&a, "segment.all.current"), 2, "the 20 MiB segment stayed cached");
    a.validate().unwrap();
}

#[test]
fn garbage_collection_returns_old_cached_blocks_before_asking_for_more() {
    let mut a = allocator("garbage_collection_threshold:0.5", 1000 * MIB);
    a.set_memory_fraction(0.8).unwrap(); // limit 800 MiB, GC above 400 MiB
    let old: Vec<_> = (0..3).map(|i| a.malloc((100 + 2 * i) * MIB, 0).unwrap()).collect();
    for b in &old {
        a.free(b.ptr).unwrap();
    }
    // Age the cached blocks with searches that miss them.
    // (on another stream: the GC clock counts every search of the pool).
    let keep: Vec<_> = (0..4).map(|_| a.malloc(30 * MIB, 1).unwrap()).collect();
    assert!(a.reserved_bytes() > 400 * MIB);
    let before = stat(&a, "num_device_free");
    a.malloc(150 * MIB, 1).unwrap();
    assert!(stat(&a, "num_device_free") > before, "GC released aged blocks");
    assert_eq!(stat(&a, "num_alloc_retries"), 0, "without a full flush");
    drop(keep);
    a.validate().unwrap();
}

#[test]
fn expandable_segments_map_pages_and_unmap_whole_free_pages() {
    let mut a = allocator("expandable_segments:True", 80 * GIB);
    let x = a.malloc(3_000_000, 0).unwrap();
    let y = a.malloc(25 * MIB, 0).unwrap();
    assert_eq!(y.ptr, x.ptr + 3_000_320, "dense tiling in one segment");
    assert_eq!(stat(&a, "reserved_bytes.large_pool.current"), 40 * MIB as i64);
    assert_eq!(stat(&a, "segment.all.current"), 0, "maps do not count as segments");
    assert_eq!(stat(&a, "num_device_alloc"), 2);
    let trace = actions(&mut a);
    assert_eq!(
        trace,
        vec![
            (Action::SegmentMap, 20 * MIB),
            (Action::Alloc, 3_000_000),
            (Action::SegmentMap, 20 * MIB),
            (Action::Alloc, 25 * MIB)
        ]
    );
    let snap = a.snapshot();
    assert_eq!(snap.segments.len(), 1);
    assert!(snap.segments[0].is_expandable);
    assert_eq!(snap.segments[0].total_size, 40 * MIB);
    a.validate().unwrap();

    a.free(x.ptr).unwrap();
    a.empty_cache().unwrap();
    // The first page still holds part of y: nothing whole is free.
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 40 * MIB as i64);
    a.free(y.ptr).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    assert_eq!(stat(&a, "num_device_free"), 1);
    assert_eq!(a.device().inner().inner().used_bytes(), 0);
    assert_eq!(a.device().calls().release_reservation, 1, "the empty reservation is released");
    a.validate().unwrap();
}

#[test]
fn expandable_segments_grow_across_the_free_tail() {
    let mut a = allocator("expandable_segments:True", 80 * GIB);
    let blocks: Vec<_> = (0..10).map(|i| a.malloc((5 + i) * MIB, 0).unwrap()).collect();
    let total: u64 = blocks.iter().map(|b| b.size).sum();
    let reserved = stat(&a, "reserved_bytes.all.current") as u64;
    assert!(reserved - total < 20 * MIB, "less than a page of slack: {reserved} for {total}");
    for w in blocks.windows(2) {
        assert_eq!(w[0].ptr + w[0].size, w[1].ptr);
    }
    a.validate().unwrap();
}

#[test]
fn turning_expandable_segments_off_skips_their_blocks() {
    let mut a = allocator("expandable_segments:True", 80 * GIB);
    let x = a.malloc(4 * MIB, 0).unwrap();
    a.free(x.ptr).unwrap();
    a.set_allocator_settings("expandable_segments:False").unwrap();
    let y = a.malloc(4 * MIB, 0).unwrap();
    assert_ne!(y.ptr, x.ptr);
    assert_eq!(stat(&a, "segment.all.current"), 1);
    a.validate().unwrap();
}

#[test]
fn free_memory_callbacks_are_asked_before_the_device() {
    struct Holder(Vec<u64>);
    impl FreeMemoryCallback for Holder {
        fn release(&mut self) -> Vec<u64> {
            std::mem::take(&mut self.0)
        }
    }
    let mut a = allocator("", 100 * MIB);
    let held = a.malloc(30 * MIB, 0).unwrap();
    a.attach_free_memory_callback(Box::new(Holder(vec![held.ptr])));
    let b = a.malloc(30 * MIB, 0).unwrap();
    assert_eq!(b.ptr, held.ptr, "the released block was found on the second search");
    assert_eq!(a.device().calls().malloc, 1);
}

#[test]
fn bad_pointers_are_errors_not_panics() {
    let mut a = allocator("", GIB);
    let b = a.malloc(1000, 0).unwrap();
    a.free(b.ptr).unwrap();
    assert!(matches!(a.free(b.ptr), Err(AllocError::InvalidPointer(_))));
    assert!(matches!(a.free(12345), Err(AllocError::InvalidPointer(12345))));
    assert!(matches!(a.record_stream(b.ptr, 2), Err(AllocError::InvalidPointer(_))));
}

#[test]
fn device_faults_surface_through_the_ladder() {
    let mut a = allocator("", GIB);
    a.device_mut().inner_mut().fail_nth_allocation(1);
    // The first device malloc fails; nothing is cached, the retry succeeds.
    a.malloc(30 * MIB, 0).unwrap();
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    a.device_mut().inner_mut().set_external_usage(GIB - 30 * MIB);
    assert!(matches!(a.malloc(30 * MIB, 0), Err(AllocError::OutOfMemory(_))));
    a.validate().unwrap();
}

#[test]
fn stats_and_device_agree() {
    let mut a = allocator("", GIB);
    let xs: Vec<_> = (1..20).map(|i| a.malloc(i * 700_000, i % 3).unwrap()).collect();
    for x in xs.iter().step_by(2) {
        a.free(x.ptr).unwrap();
    }
    assert_eq!(a.reserved_bytes(), a.device().inner().inner().used_bytes());
    assert_eq!(stat(&a, "num_device_alloc") as u64, a.device().calls().malloc);
    assert_eq!(a.device().mem_get_info().free, GIB - a.reserved_bytes());
    a.validate().unwrap();
}

#[test]
fn a_zero_byte_request_touches_nothing_and_returns_null() {
    let mut a = allocator("", GIB);
    let z = a.malloc(0, 0).unwrap();
    assert_eq!((z.ptr, z.size), (0, 0));
    assert_eq!(stat(&a, "segment.all.current"), 0);
    assert_eq!(stat(&a, "allocation.all.allocated"), 0);
    assert_eq!(a.device().calls().malloc, 0);
    assert!(actions(&mut a).is_empty(), "nothing in the history");
    a.record_stream(0, 1).unwrap();
    a.free(0).unwrap();
    a.validate().unwrap();
}

#[test]
fn a_device_call_history_keeps_the_segment_actions_alone() {
    let mut a = allocator("expandable_segments:True", GIB);
    a.record_device_calls();
    let p = a.malloc(3 * MIB, 0).unwrap().ptr;
    let q = a.malloc(4096, 0).unwrap().ptr;
    let mapped = a.history_len();
    assert!(mapped > 0, "each request mapped memory");
    a.free(p).unwrap();
    a.free(q).unwrap();
    assert_eq!(a.history_len(), mapped, "frees that release nothing add nothing");
    a.empty_cache().unwrap();
    let kept: Vec<Action> = a.drain_history().map(|e| e.action).collect();
    assert!(kept.len() > mapped, "empty_cache unmapped");
    assert_eq!(a.history_len(), 0, "drained");
    assert!(
        kept.iter().all(|x| matches!(
            x,
            Action::SegmentMap | Action::SegmentUnmap | Action::SegmentAlloc | Action::SegmentFree
        )),
        "{kept:?}"
    );
    assert!(kept.contains(&Action::SegmentMap) && kept.contains(&Action::SegmentUnmap), "{kept:?}");
}
