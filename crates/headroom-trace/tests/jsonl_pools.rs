//! The JSONL trace's private pools (docs/TRACE_FORMAT.md): an allocation names its pool,
//! `release_pool` says its last user is gone, `empty_cache` with a pool empties that one.

use headroom_alloc::PolicyName;
use headroom_trace::jsonl::{format_op, read_trace, TraceOp};
use headroom_trace::replay::{replay, ReplayOptions};

const TRACE: &str = r#"{"op":"alloc","id":"w","size":31457280}
{"op":"alloc","id":"g1","size":4194304,"stream":7,"pool":[1,0]}
{"op":"alloc","id":"g2","size":4194304,"stream":7,"pool":[1,0]}
{"op":"free","id":"g1"}
{"op":"free","id":"g2"}
{"op":"alloc","id":"d","size":4194304,"stream":7}
{"op":"free","id":"d"}
{"op":"empty_cache"}
{"op":"release_pool","pool":[1,0]}
{"op":"empty_cache","pool":[1,0]}
"#;

fn options() -> ReplayOptions {
    ReplayOptions {
        config: headroom_alloc::AllocatorConfig::default(),
        capacity: 8 << 30,
        history: Some(1000),
        policy: PolicyName::PyTorch,
    }
}

#[test]
fn pool_fields_read_and_write_back() {
    let t = read_trace(TRACE.as_bytes()).unwrap();
    assert_eq!(t[1].op, TraceOp::AllocInPool { id: "g1".into(), size: 4 << 20, stream: 7, pool: (1, 0) });
    assert_eq!(t[8].op, TraceOp::ReleasePool { pool: (1, 0) });
    assert_eq!(t[9].op, TraceOp::EmptyPool { pool: (1, 0) });
    assert_eq!(t[7].op, TraceOp::EmptyCache);
    for line in &t {
        assert_eq!(read_trace(format_op(&line.op).as_bytes()).unwrap()[0].op, line.op);
    }
    // [0, 0] is the default pools, as if `pool` were left out.
    let d = read_trace(&br#"{"op":"alloc","id":1,"size":1,"pool":[0,0]}"#[..]).unwrap();
    assert_eq!(d[0].op, TraceOp::Alloc { id: "1".into(), size: 1, stream: 0 });
    for bad in [
        r#"{"op":"alloc","id":1,"size":1,"pool":[1]}"#,
        r#"{"op":"release_pool","pool":[0,0]}"#,
        r#"{"op":"release_pool"}"#,
    ] {
        let e = read_trace(bad.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("pool"), "{bad}: {e}");
    }
}

#[test]
fn a_pools_memory_stays_until_it_is_released() {
    let t = read_trace(TRACE.as_bytes()).unwrap();
    let (report, mut a) = replay(&t[..8], &options(), |_| {}).unwrap();
    assert!(report.ooms.is_empty());
    // The weights' segment and the graph's stay; the default pool's cached block went back.
    assert_eq!(a.reserved_bytes(), (30 + 20) << 20);
    let snap = a.snapshot();
    assert!(snap.segments.iter().any(|s| s.segment_pool_id == (1, 0)));
    let (_, a) = replay(&t, &options(), |_| {}).unwrap();
    assert_eq!(a.reserved_bytes(), 30 << 20, "released and emptied, the graph's memory is gone");
    // Releasing a pool no allocation named is the trace's mistake, said with its line.
    let bad = read_trace(&br#"{"op":"release_pool","pool":[2,0]}"#[..]).unwrap();
    assert!(replay(&bad, &options(), |_| {}).is_err());
}
