//! Private pools, by hand-built traces: what PyTorch's allocator does for a
//! CUDA graph capture (`torch.cuda.graph`), a `torch.cuda.MemPool` and their
//! release (`PrivatePool`, `use_count`, `captures_underway`,
//! `releasePool`, `emptyCache(mempool_id)` in `CUDACachingAllocator.cpp`).

use headroom_alloc::units::MIB;
use headroom_alloc::{
    AllocError, AllocatorConfig, BlockState, DeviceCachingAllocator, MempoolId, SimDevice, DEFAULT_MEMPOOL,
};

const GRAPH: MempoolId = (1, 0);
const MEMPOOL: MempoolId = (0, 1);
const CAPTURE_STREAM: u64 = 7;

fn allocator(conf: &str) -> DeviceCachingAllocator<SimDevice> {
    let mut a = DeviceCachingAllocator::new(SimDevice::new(1 << 34), AllocatorConfig::parse(conf).unwrap());
    a.record_history(Some(1 << 16));
    a
}

/// The pool of the segment holding `ptr`, by the snapshot.
fn pool_of(a: &mut DeviceCachingAllocator<SimDevice>, ptr: u64) -> MempoolId {
    let snap = a.snapshot();
    let s = snap.segments.iter().find(|s| s.address <= ptr && ptr < s.address + s.total_size).expect("a segment");
    s.segment_pool_id
}

fn capture(a: &mut DeviceCachingAllocator<SimDevice>, id: MempoolId, stream: u64) {
    a.begin_allocate_to_pool(id, Box::new(move |s| s == stream)).unwrap();
}

#[test]
fn a_capture_allocates_from_its_own_pool_and_keeps_it_until_released() {
    let mut a = allocator("");
    let before = a.malloc(3 * MIB, CAPTURE_STREAM).unwrap();
    a.free(before.ptr).unwrap();
    // A cached default-pool block of the right size exists; the capture must not take it.
    capture(&mut a, GRAPH, CAPTURE_STREAM);
    assert!(a.captures_underway());
    let g1 = a.malloc(3 * MIB, CAPTURE_STREAM).unwrap();
    assert_ne!(g1.ptr, before.ptr, "a capture took a block of the default pool");
    assert_eq!(pool_of(&mut a, g1.ptr), GRAPH);
    // Another stream is not capturing: its request goes to the default pool.
    let other = a.malloc(3 * MIB, 0).unwrap();
    assert_eq!(pool_of(&mut a, other.ptr), DEFAULT_MEMPOOL);
    // Within the pool, freed blocks are reused as usual.
    a.free(g1.ptr).unwrap();
    let g2 = a.malloc(3 * MIB, CAPTURE_STREAM).unwrap();
    assert_eq!(g2.ptr, g1.ptr);
    a.end_allocate_to_pool(GRAPH).unwrap();
    a.validate().unwrap();
    // After the capture, requests on the stream go to the default pool again.
    let after = a.malloc(3 * MIB, CAPTURE_STREAM).unwrap();
    assert_eq!(after.ptr, before.ptr);
    a.free(g2.ptr).unwrap();
    a.free(after.ptr).unwrap();
    a.free(other.ptr).unwrap();

    // The graph lives: a flush keeps its segment.
    a.empty_cache().unwrap();
    assert_eq!(a.reserved_bytes(), 20 * MIB, "the graph's 20 MiB segment stays");
    assert_eq!(a.private_pools()[0].reserved_bytes, 20 * MIB);
    // The graph is reset: the next flush gives the segment back and forgets the pool.
    a.release_pool(GRAPH).unwrap();
    assert_eq!(a.pool_use_count(GRAPH), Some(0));
    a.empty_cache().unwrap();
    assert_eq!(a.reserved_bytes(), 0);
    assert!(a.private_pools().is_empty());
    a.validate().unwrap();
    let segment_frees = a.snapshot().device_traces[0].iter().filter(|e| e.action.name() == "segment_free").count();
    assert_eq!(segment_frees, 3, "two default-pool segments (streams 7 and 0) and the graph's");
}

#[test]
fn stats_and_snapshots_count_and_mark_pool_blocks() {
    let mut a = allocator("");
    capture(&mut a, GRAPH, CAPTURE_STREAM);
    let g = a.malloc(100, CAPTURE_STREAM).unwrap();
    let d = a.malloc(100, 0).unwrap();
    let s = a.memory_stats();
    // PyTorch counts private-pool blocks in the same statistics.
    assert_eq!(s["segment.small_pool.current"], 2);
    assert_eq!(s["allocated_bytes.all.current"], 1024);
    let snap = a.snapshot();
    let ids: Vec<MempoolId> = snap.segments.iter().map(|s| s.segment_pool_id).collect();
    assert!(ids.contains(&GRAPH) && ids.contains(&DEFAULT_MEMPOOL));
    let entry = snap.device_traces[0].iter().find(|e| e.action.name() == "alloc" && e.addr == g.ptr).unwrap();
    assert_eq!(entry.pool_id, GRAPH, "trace entries carry the pool, as PyTorch's record_trace does");
    let entry = snap.device_traces[0].iter().find(|e| e.action.name() == "alloc" && e.addr == d.ptr).unwrap();
    assert_eq!(entry.pool_id, DEFAULT_MEMPOOL);
}

#[test]
fn a_pool_shared_by_two_captures_is_freeable_after_both_are_released() {
    let mut a = allocator("");
    capture(&mut a, GRAPH, CAPTURE_STREAM);
    let x = a.malloc(2 * MIB, CAPTURE_STREAM).unwrap();
    a.end_allocate_to_pool(GRAPH).unwrap();
    // make_graphed_callables: a second capture shares the first one's pool.
    capture(&mut a, GRAPH, CAPTURE_STREAM);
    assert_eq!(a.pool_use_count(GRAPH), Some(2));
    let y = a.malloc(2 * MIB, CAPTURE_STREAM).unwrap();
    assert_eq!(pool_of(&mut a, y.ptr), GRAPH);
    a.end_allocate_to_pool(GRAPH).unwrap();
    a.free(x.ptr).unwrap();
    a.free(y.ptr).unwrap();
    a.release_pool(GRAPH).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.reserved_bytes(), 20 * MIB, "one graph still uses the pool");
    a.release_pool(GRAPH).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.reserved_bytes(), 0);
    a.validate().unwrap();
}

#[test]
fn a_mempool_is_emptied_by_its_own_empty_cache_only_once_released() {
    let mut a = allocator("");
    // torch.cuda.MemPool(): the pool is made with one user; use_mem_pool adds one.
    a.create_or_incref_pool(MEMPOOL).unwrap();
    a.begin_allocate_to_pool(MEMPOOL, Box::new(|_| true)).unwrap();
    let m = a.malloc(30 * MIB, 3).unwrap();
    a.end_allocate_to_pool(MEMPOOL).unwrap();
    a.release_pool(MEMPOOL).unwrap();
    assert_eq!(a.pool_use_count(MEMPOOL), Some(1));
    let d = a.malloc(30 * MIB, 3).unwrap();
    a.free(m.ptr).unwrap();
    a.free(d.ptr).unwrap();
    // The pool is still in use: emptying it does nothing; the default flush does not touch it.
    a.empty_cache_pool(MEMPOOL).unwrap();
    assert_eq!(a.reserved_bytes(), 60 * MIB);
    // del pool: releasePool, then emptyCache(pool id) — only that pool's memory goes.
    a.release_pool(MEMPOOL).unwrap();
    a.empty_cache_pool(MEMPOOL).unwrap();
    assert_eq!(a.reserved_bytes(), 30 * MIB, "the default pool's cached segment stays");
    assert_eq!(a.pool_use_count(MEMPOOL), None);
    a.validate().unwrap();
}

#[test]
fn the_newest_capture_whose_filter_accepts_the_stream_wins() {
    let mut a = allocator("");
    a.begin_allocate_to_pool(MEMPOOL, Box::new(|_| true)).unwrap();
    capture(&mut a, GRAPH, CAPTURE_STREAM);
    let g = a.malloc(MIB, CAPTURE_STREAM).unwrap();
    let m = a.malloc(MIB, 0).unwrap();
    assert_eq!(pool_of(&mut a, g.ptr), GRAPH);
    assert_eq!(pool_of(&mut a, m.ptr), MEMPOOL);
    a.validate().unwrap();
}

#[test]
fn misuse_is_refused_and_changes_nothing() {
    let mut a = allocator("");
    let e = |r: Result<(), AllocError>| matches!(r, Err(AllocError::InvalidArgument(_)));
    assert!(e(a.end_allocate_to_pool(GRAPH)));
    assert!(e(a.release_pool(GRAPH)));
    assert!(e(a.begin_allocate_to_pool(DEFAULT_MEMPOOL, Box::new(|_| true))));
    capture(&mut a, GRAPH, 1);
    assert!(e(a.begin_allocate_to_pool(GRAPH, Box::new(|_| true))), "already recording to it");
    a.end_allocate_to_pool(GRAPH).unwrap();
    a.release_pool(GRAPH).unwrap();
    assert!(e(a.release_pool(GRAPH)), "released twice");
    assert!(e(a.begin_allocate_to_pool(GRAPH, Box::new(|_| true))), "a released pool is not used again");
    a.validate().unwrap();
}

#[test]
fn a_free_with_stream_uses_during_capture_waits_until_no_capture_is_underway() {
    let mut a = allocator("");
    capture(&mut a, GRAPH, CAPTURE_STREAM);
    let x = a.malloc(MIB, CAPTURE_STREAM).unwrap();
    let y = a.malloc(MIB, CAPTURE_STREAM).unwrap();
    // x was used on stream 2 before the capture's work; y only by the capture's side stream 3.
    a.end_allocate_to_pool(GRAPH).unwrap();
    a.record_stream(x.ptr, 2).unwrap();
    capture(&mut a, (2, 0), 9);
    a.record_stream(y.ptr, 3).unwrap();
    a.free(x.ptr).unwrap();
    a.free(y.ptr).unwrap();
    // No event may be recorded or queried now: both wait, pending.
    assert_eq!(a.device().live_events(), 0);
    let pending = |a: &mut DeviceCachingAllocator<SimDevice>| {
        a.snapshot()
            .segments
            .iter()
            .flat_map(|s| s.blocks.clone())
            .filter(|b| b.state == BlockState::ActivePendingFree)
            .count()
    };
    assert_eq!(pending(&mut a), 2);
    a.validate().unwrap();
    let _ = a.malloc(100, 9).unwrap();
    assert_eq!(pending(&mut a), 2, "a malloc during the capture processes no events");
    a.end_allocate_to_pool((2, 0)).unwrap();
    // The next malloc with no capture: y's use was the capture's own, it completes at once;
    // x waits for an event on stream 2.
    let _ = a.malloc(100, 0).unwrap();
    assert_eq!(a.device().live_events(), 1);
    assert_eq!(pending(&mut a), 1);
    a.device_mut().complete_all_events();
    let _ = a.malloc(100, 0).unwrap();
    assert_eq!(pending(&mut a), 0);
    a.validate().unwrap();
}

#[test]
fn a_capture_is_out_of_memory_rather_than_flush_the_default_pools() {
    // 64 MiB device: a cached 40 MiB default segment leaves too little for the capture.
    let mut a = DeviceCachingAllocator::new(SimDevice::new(64 * MIB), AllocatorConfig::default());
    let d = a.malloc(40 * MIB, 0).unwrap();
    a.free(d.ptr).unwrap();
    capture(&mut a, GRAPH, CAPTURE_STREAM);
    let err = a.malloc(40 * MIB, CAPTURE_STREAM).unwrap_err();
    assert!(matches!(err, AllocError::OutOfMemory(_)), "{err}");
    assert_eq!(a.reserved_bytes(), 40 * MIB, "the flush rung is skipped during a capture");
    a.end_allocate_to_pool(GRAPH).unwrap();
    // Without the capture, the same request flushes and succeeds.
    let ok = a.malloc(50 * MIB, CAPTURE_STREAM);
    assert!(ok.is_ok());
    a.validate().unwrap();
}

#[test]
fn the_oom_message_counts_free_private_pool_blocks_as_allocated() {
    let mut a = DeviceCachingAllocator::new(SimDevice::new(64 * MIB), AllocatorConfig::default());
    capture(&mut a, GRAPH, CAPTURE_STREAM);
    let g = a.malloc(30 * MIB, CAPTURE_STREAM).unwrap();
    a.free(g.ptr).unwrap();
    a.end_allocate_to_pool(GRAPH).unwrap();
    let err = a.malloc(40 * MIB, 0).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("Of the allocated memory 30.00 MiB is allocated by PyTorch, with 30.00 MiB allocated in private pools (e.g., CUDA Graphs), and 0 bytes is reserved"), "{text}");
}

#[test]
fn expandable_segments_of_a_private_pool_are_its_own() {
    let mut a = allocator("expandable_segments:True");
    let d = a.malloc(4 * MIB, CAPTURE_STREAM).unwrap();
    capture(&mut a, GRAPH, CAPTURE_STREAM);
    let g = a.malloc(4 * MIB, CAPTURE_STREAM).unwrap();
    a.end_allocate_to_pool(GRAPH).unwrap();
    assert_eq!(pool_of(&mut a, g.ptr), GRAPH);
    assert_eq!(pool_of(&mut a, d.ptr), DEFAULT_MEMPOOL);
    // The default pool's 16 MiB left in its page do not serve the graph, nor the graph's the default pool.
    assert!(g.ptr.abs_diff(d.ptr) >= 1 << 30, "two reservations");
    a.free(g.ptr).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.reserved_bytes(), 40 * MIB, "both pages stay: the graph's pool is in use");
    a.release_pool(GRAPH).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.reserved_bytes(), 20 * MIB);
    assert!(a.private_pools().is_empty());
    a.validate().unwrap();
}
