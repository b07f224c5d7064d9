//! A snapshot's device trace as the operations of a JSONL trace: the blocks
//! live when the trace began are allocated first (their requested sizes, on
//! their segments' streams), then every request and free in the order
//! recorded. What a program asked of the allocator, without the recorded
//! allocator's answers: for replaying the run on another device (a real GPU)
//! from empty, where addresses and segments are that device's own.
//!
//! Lines number the trace's entries from 1; the blocks live at its start are
//! line 0.

use crate::device_trace::DeviceTrace;
use crate::jsonl::{TraceLine, TraceOp};
use crate::memory_snapshot::TraceAction;
use rustc_hash::FxHashMap;

/// The operations of `t`'s trace, from an empty device.
pub fn fresh_ops(t: &DeviceTrace) -> Vec<TraceLine> {
    let trace = t.snap.device_traces.get(t.device as usize).map_or(&[][..], Vec::as_slice);
    let mut ops = Vec::with_capacity(t.start.live_blocks() + trace.len());
    // The id of the block at each address: the address, and how many blocks it held before.
    let mut live: FxHashMap<u64, String> = FxHashMap::default();
    let mut generation: FxHashMap<u64, u32> = FxHashMap::default();
    let mut new_id = |addr: u64| {
        let g = generation.entry(addr).or_insert(0);
        *g += 1;
        format!("{addr:#x}.{g}")
    };
    for s in &t.start.segments {
        for b in &s.live {
            let id = new_id(b.address);
            live.insert(b.address, id.clone());
            ops.push(TraceLine { line: 0, op: alloc(id, b.requested_size, s.stream, s.pool_id) });
        }
    }
    let pools = t.pools();
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            TraceAction::Alloc => {
                let id = new_id(e.addr);
                live.insert(e.addr, id.clone());
                ops.push(TraceLine { line: i + 1, op: alloc(id, e.size, e.stream, pools.pool_of(i, e)) });
            }
            TraceAction::FreeRequested | TraceAction::Free => {
                // A free of a block the trace never saw (its alloc fell out of a ring buffer
                // that the start state could not rebuild) has nothing to free.
                if let Some(id) = live.remove(&e.addr) {
                    ops.push(TraceLine { line: i + 1, op: TraceOp::Free { id } });
                }
            }
            _ => {}
        }
    }
    ops
}

/// A request in its pool: the default pools', or a private pool's.
fn alloc(id: String, size: u64, stream: u64, pool: headroom_alloc::MempoolId) -> TraceOp {
    match pool {
        headroom_alloc::DEFAULT_MEMPOOL => TraceOp::Alloc { id, size, stream },
        pool => TraceOp::AllocInPool { id, size, stream, pool },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jsonl::read_trace;
    use crate::replay::{replay, ReplayOptions};
    use crate::snapshot::read_snapshot;
    use crate::snapshot_file::{write_snapshot, SnapshotFormat};
    use headroom_alloc::{AllocatorConfig, PolicyName};

    #[test]
    fn a_snapshot_replays_as_the_trace_that_made_it() {
        // A JSONL run, written as a snapshot whose trace is every allocator event.
        let text = "{\"op\":\"alloc\",\"id\":\"a\",\"size\":4096}\n{\"op\":\"alloc\",\"id\":\"b\",\"size\":30000000,\"stream\":1}\n\
                    {\"op\":\"free\",\"id\":\"a\"}\n{\"op\":\"alloc\",\"id\":\"c\",\"size\":4096}\n{\"op\":\"free\",\"id\":\"b\"}\n";
        let ops = read_trace(text.as_bytes()).unwrap();
        let opts = ReplayOptions {
            config: AllocatorConfig::default(),
            capacity: 1 << 30,
            history: Some(1000),
            policy: PolicyName::PyTorch,
        };
        let (first, mut a) = replay(&ops, &opts, |_| {}).unwrap();
        let mut buf = Vec::new();
        write_snapshot(&a.snapshot(), SnapshotFormat::Pickle, &mut buf).unwrap();
        let snap = read_snapshot(std::io::Cursor::new(buf)).unwrap();
        let t = DeviceTrace::new(&snap, 0).unwrap();
        let again = fresh_ops(&t);
        let kinds: Vec<&str> = again
            .iter()
            .map(|l| match &l.op {
                TraceOp::Alloc { .. } => "alloc",
                TraceOp::Free { .. } => "free",
                _ => "other",
            })
            .collect();
        assert_eq!(kinds, ["alloc", "alloc", "free", "alloc", "free"]);
        let (second, _) = replay(&again, &opts, |_| {}).unwrap();
        assert_eq!(
            (second.peak_allocated_bytes, second.peak_reserved_bytes, second.num_device_alloc),
            (first.peak_allocated_bytes, first.peak_reserved_bytes, first.num_device_alloc)
        );
        assert_eq!(second.final_allocated_bytes, first.final_allocated_bytes);
    }
}
