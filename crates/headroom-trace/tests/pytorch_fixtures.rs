//! Decision-for-decision fidelity on real PyTorch snapshots.
//!
//! The fixtures in `../shared/fixtures/pytorch-snapshots` were recorded by
//! other people on real GPUs. For those whose trace starts from an empty
//! allocator, every recorded request is replayed through headroom's
//! allocator (the device is told the addresses `cudaMalloc` returned), and
//! every choice must match: the address of each allocation, the address
//! and size of each new segment, and the final layout of every segment and
//! block.
//!
//! Skips with a message where `../shared` is absent (a user's fresh clone).

#[path = "../../../tests/support/skip.rs"]
mod skip;

use headroom_alloc::{Action, AllocatorConfig, BlockState, DeviceCachingAllocator, SimDevice};
use serde_pickle::{DeOptions, HashableValue as H, Value as V};
use std::collections::VecDeque;
use std::path::PathBuf;

/// Fixtures whose traces begin with no live block.
const FROM_EMPTY: [&str; 4] = [
    "ZidongLiu__DeComFL__edd30e09__memory.pickle",
    "shreyansh26__MLSys-Experiments__16debf2b__model_memory_usage_profile_grad.pickle",
    "shreyansh26__MLSys-Experiments__16debf2b__model_memory_usage_profile_no_grad.pickle",
    "silmont2000__assignment2-systems__133f0643__mem_snapshot.pickle",
];

fn fixtures_dir() -> Option<PathBuf> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/pytorch-snapshots");
    d.is_dir().then_some(d)
}

fn get<'a>(v: &'a V, k: &str) -> Option<&'a V> {
    match v {
        V::Dict(d) => d.get(&H::String(k.to_string())),
        _ => None,
    }
}

fn int(v: Option<&V>) -> u64 {
    match v {
        Some(V::I64(i)) => *i as u64,
        Some(V::Int(b)) => b.to_string().parse().expect("integer"),
        other => panic!("expected an int, got {other:?}"),
    }
}

fn list(v: Option<&V>) -> &[V] {
    match v {
        Some(V::List(l)) => l,
        other => panic!("expected a list, got {other:?}"),
    }
}

fn text(v: Option<&V>) -> &str {
    match v {
        Some(V::String(s)) => s,
        other => panic!("expected a str, got {other:?}"),
    }
}

struct Outcome {
    allocs: usize,
    allocs_matched: usize,
    segments: usize,
    segments_matched: usize,
    blocks: usize,
    blocks_matched: usize,
}

fn replay_fixture(bytes: &[u8]) -> Outcome {
    let snap = serde_pickle::value_from_slice(
        bytes,
        DeOptions::new().replace_unresolved_globals().replace_recursive_structures(),
    )
    .unwrap();
    let trace = &list(get(&snap, "device_traces"))[0];
    let mut a = DeviceCachingAllocator::new(SimDevice::new(1 << 40), AllocatorConfig::default());
    a.record_history(Some(1 << 16));
    let mut o =
        Outcome { allocs: 0, allocs_matched: 0, segments: 0, segments_matched: 0, blocks: 0, blocks_matched: 0 };
    // The recorded run's new segments (address, size) not yet matched by ours.
    let mut recorded: VecDeque<(u64, u64)> = VecDeque::new();
    for e in list(Some(trace)) {
        let addr = || int(get(e, "addr"));
        match text(get(e, "action")) {
            "segment_alloc" => {
                o.segments += 1;
                recorded.push_back((addr(), int(get(e, "size"))));
                a.device_mut().push_next_address(addr());
            }
            "alloc" => {
                o.allocs += 1;
                let b = a.malloc(int(get(e, "size")), int(get(e, "stream"))).expect("the fixture's run fit");
                o.allocs_matched += (b.ptr == addr()) as usize;
                let ours: Vec<(u64, u64)> =
                    a.drain_history().filter(|t| t.action == Action::SegmentAlloc).map(|t| (t.addr, t.size)).collect();
                for seg in ours {
                    o.segments_matched += (recorded.pop_front() == Some(seg)) as usize;
                }
            }
            "free_requested" => {
                a.free(addr()).expect("freeing a live block");
                a.drain_history().for_each(drop);
            }
            "free_completed" | "snapshot" => {}
            other => panic!("action {other} is not expected in these fixtures"),
        }
    }
    // The final layout: every segment's blocks, addresses, sizes and states.
    let ours = a.snapshot();
    let mut theirs: Vec<(u64, u64, bool)> = Vec::new();
    for s in list(get(&snap, "segments")).iter().filter(|s| int(get(s, "device")) == 0) {
        for b in list(get(s, "blocks")) {
            theirs.push((int(get(b, "address")), int(get(b, "size")), text(get(b, "state")) == "active_allocated"));
        }
    }
    let mine: Vec<(u64, u64, bool)> = ours
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter().map(|b| (b.address, b.size, b.state == BlockState::ActiveAllocated)))
        .collect();
    theirs.sort_unstable();
    o.blocks = theirs.len();
    o.blocks_matched = theirs.iter().filter(|t| mine.binary_search(t).is_ok()).count();
    assert_eq!(mine.len(), theirs.len(), "block count");
    a.validate().unwrap();
    o
}

#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn real_snapshots_replay_decision_for_decision() {
    let Some(dir) = fixtures_dir() else {
        skip::skip("../shared/fixtures/pytorch-snapshots is absent (only development checkouts have it)");
        return;
    };
    let (mut fixtures, mut decisions) = (0, 0);
    for name in FROM_EMPTY {
        let bytes = std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let o = replay_fixture(&bytes);
        eprintln!(
            "{name}: alloc {}/{}, segment_alloc {}/{}, final blocks {}/{}",
            o.allocs_matched, o.allocs, o.segments_matched, o.segments, o.blocks_matched, o.blocks
        );
        assert_eq!(o.allocs_matched, o.allocs, "{name}: allocation addresses");
        assert_eq!(o.segments_matched, o.segments, "{name}: new segments");
        assert_eq!(o.blocks_matched, o.blocks, "{name}: final blocks");
        fixtures += 1;
        decisions += o.allocs + o.segments + o.blocks;
    }
    eprintln!(
        "checked {fixtures} fixtures, {decisions} decisions (allocation addresses, new segments' addresses and sizes, final blocks)"
    );
    assert_eq!(fixtures, FROM_EMPTY.len());
    assert!(decisions > 8000);
}
