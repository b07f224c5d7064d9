//! Every failing case of the third hostile-input sweep
//! (`../shared/findings/hostile-input-sweep-turn3.md`: `inspect`, `replay`
//! of snapshots with policies and `--snapshot-out`, `completions`, `man`),
//! kept as a regression test named after its label. Each builds the
//! reproduction's input here (no Python), runs it as a user types it, and
//! checks the exit status, the message and that nothing panics. The
//! sweep's `plan` cases (S7–S11, E2's LoRA flags) are the planner's.
//!
//! Most inputs mutate the sweep's base snapshot: one 20 MiB segment holding
//! a live 4 MiB block, and five 8 MiB allocations freed in turn.

#[path = "../../../tests/support/skip.rs"]
mod skip;

use assert_cmd::Command;
use headroom_trace::py::{write_pickle, Py};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const M: u64 = 1 << 20;
const B: u64 = 0x7f00_0000_0000;

/// What a run printed.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Asserts the exit status and that `needle` is in stdout or stderr.
    fn expect(&self, code: i32, needle: &str) -> &Run {
        assert_eq!(self.code, code, "exit status\nstdout: {}\nstderr: {}", self.stdout, self.stderr);
        assert!(
            self.stdout.contains(needle) || self.stderr.contains(needle),
            "{needle:?} not in\nstdout: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        self
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {}", self.stdout))
    }
}

fn headroom<S: AsRef<std::ffi::OsStr>>(dir: &Path, args: &[S]) -> Run {
    let out = Command::cargo_bin("headroom").unwrap().args(args).current_dir(dir).output().unwrap();
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(!run.stderr.contains("panicked") && ![101, 134, -1].contains(&run.code), "{}", run.stderr);
    run
}

/// `bash -c SCRIPT` with `$H` the binary: for memory and time limits.
fn sh(script: &str, dir: &Path) -> Run {
    let bin = assert_cmd::cargo::cargo_bin("headroom");
    let out = std::process::Command::new("bash").arg("-c").arg(script).env("H", bin).current_dir(dir).output().unwrap();
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    run
}

fn frames() -> Py {
    Py::List(vec![
        Py::dict([("filename", Py::str("train.py")), ("line", Py::Int(10)), ("name", Py::str("step"))]),
        Py::dict([("filename", Py::str("model.py")), ("line", Py::Int(5)), ("name", Py::str("forward"))]),
    ])
}

fn ev(action: &str, addr: u64, size: u64, t: i64) -> Vec<(&'static str, Py)> {
    vec![
        ("action", Py::str(action)),
        ("addr", Py::uint(addr)),
        ("size", Py::uint(size)),
        ("stream", Py::Int(0)),
        ("time_us", Py::Int(t)),
        ("frames", frames()),
    ]
}

/// The sweep's base snapshot, as (segments, trace, settings) to mutate.
struct Snap {
    segments: Vec<Vec<(&'static str, Py)>>,
    blocks: Vec<Vec<(&'static str, Py)>>,
    trace: Vec<Vec<(&'static str, Py)>>,
    settings: Vec<(&'static str, Py)>,
}

fn base() -> Snap {
    let blocks = vec![
        vec![
            ("size", Py::uint(4 * M)),
            ("requested_size", Py::uint(4 * M)),
            ("address", Py::uint(B)),
            ("state", Py::str("active_allocated")),
            ("frames", frames()),
        ],
        vec![
            ("size", Py::uint(16 * M)),
            ("requested_size", Py::Int(0)),
            ("address", Py::uint(B + 4 * M)),
            ("state", Py::str("inactive")),
            ("frames", Py::List(vec![])),
        ],
    ];
    let segment = vec![
        ("device", Py::Int(0)),
        ("address", Py::uint(B)),
        ("total_size", Py::uint(20 * M)),
        ("allocated_size", Py::uint(4 * M)),
        ("active_size", Py::uint(4 * M)),
        ("requested_size", Py::uint(4 * M)),
        ("stream", Py::Int(0)),
        ("segment_type", Py::str("large")),
        ("segment_pool_id", Py::Tuple(vec![Py::Int(0), Py::Int(0)])),
        ("is_expandable", Py::Bool(false)),
        ("frames", Py::List(vec![])),
    ];
    let mut trace = vec![ev("segment_alloc", B, 20 * M, 0), ev("alloc", B, 4 * M, 1)];
    for i in 0..5 {
        trace.push(ev("alloc", B + 4 * M, 8 * M, 2 + 3 * i));
        trace.push(ev("free_requested", B + 4 * M, 8 * M, 3 + 3 * i));
        trace.push(ev("free_completed", B + 4 * M, 8 * M, 4 + 3 * i));
    }
    let settings = vec![
        ("PYTORCH_CUDA_ALLOC_CONF", Py::str("")),
        ("expandable_segments", Py::Bool(false)),
        ("max_split_size", Py::Int(-1)),
        ("garbage_collection_threshold", Py::Float(0.0)),
    ];
    Snap { segments: vec![segment], blocks, trace, settings }
}

impl Snap {
    fn py(&self) -> Py {
        let blocks = Py::List(self.blocks.iter().map(|b| Py::dict(b.clone())).collect());
        let segments = self
            .segments
            .iter()
            .map(|s| {
                let mut s = s.clone();
                s.push(("blocks", blocks.clone()));
                Py::dict(s)
            })
            .collect();
        Py::dict([
            ("segments", Py::List(segments)),
            ("device_traces", Py::List(vec![Py::List(self.trace.iter().map(|e| Py::dict(e.clone())).collect())])),
            ("allocator_settings", Py::dict(self.settings.clone())),
        ])
    }

    fn pickle(&self, dir: &Path, name: &str) -> PathBuf {
        pickle_file(dir, name, &self.py())
    }
}

fn pickle_file(dir: &Path, name: &str, v: &Py) -> PathBuf {
    let mut buf = Vec::new();
    write_pickle(v, &mut buf).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, buf).unwrap();
    p
}

fn set(fields: &mut [(&'static str, Py)], key: &str, v: Py) {
    fields.iter_mut().find(|(k, _)| *k == key).unwrap_or_else(|| panic!("no {key}")).1 = v;
}

/// A pickle written opcode by opcode, for what [`write_pickle`] never
/// writes: one object referred to twice through the memo.
#[derive(Default)]
struct Raw {
    bytes: Vec<u8>,
    memo: u32,
}

impl Raw {
    fn new() -> Raw {
        Raw { bytes: vec![0x80, 4], memo: 0 }
    }
    fn str(&mut self, s: &str) -> &mut Raw {
        self.bytes.extend([0x8c, s.len() as u8]);
        self.bytes.extend(s.as_bytes());
        self
    }
    fn int(&mut self, v: u64) -> &mut Raw {
        self.bytes.push(0x8a);
        self.bytes.push(9);
        self.bytes.extend(v.to_le_bytes());
        self.bytes.push(0);
        self
    }
    fn op(&mut self, ops: &[u8]) -> &mut Raw {
        self.bytes.extend(ops);
        self
    }
    /// MEMOIZE: the value on top gets the next memo index, returned.
    fn put(&mut self) -> u32 {
        self.bytes.push(0x94);
        self.memo += 1;
        self.memo - 1
    }
    /// LONG_BINGET.
    fn get(&mut self, i: u32) -> &mut Raw {
        self.bytes.push(b'j');
        self.bytes.extend(i.to_le_bytes());
        self
    }
    /// A trace entry dict (EMPTY_DICT, MARK, the pairs, SETITEMS).
    fn entry(&mut self, action: &str, addr: u64, size: u64) -> &mut Raw {
        self.op(b"}(").str("action").str(action).str("addr").int(addr).str("size").int(size);
        self.str("stream").int(0).str("time_us").int(1).str("frames").op(b"]").op(b"u")
    }
    fn done(&mut self) -> Vec<u8> {
        self.bytes.push(b'.');
        std::mem::take(&mut self.bytes)
    }
}

#[test]
fn c1_a_trace_list_shared_between_devices_is_read_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // `t = [e]; device_traces = [t, t]`, as Python's pickler memoises it.
    let mut r = Raw::new();
    r.op(b"}(").str("segments").op(b"]").str("device_traces").op(b"](");
    r.op(b"](");
    r.entry("alloc", 4096, 512);
    r.op(b"e");
    let t = r.put();
    r.get(t).op(b"e").op(b"u");
    std::fs::write(d.join("shared.pickle"), r.done()).unwrap();
    // The second trigger: one entry in device 0's list and again in device 1's.
    let mut r = Raw::new();
    r.op(b"}(").str("segments").op(b"]").str("device_traces").op(b"](");
    r.op(b"](");
    r.entry("alloc", 4096, 512);
    r.entry("free_requested", 4096, 512);
    let e2 = r.put();
    r.op(b"e").op(b"](").get(e2).op(b"e").op(b"e").op(b"u");
    std::fs::write(d.join("shared2.pickle"), r.done()).unwrap();

    for f in ["shared.pickle", "shared2.pickle"] {
        let v = headroom(d, &["inspect", f, "--json"]).json();
        let devices = v["snapshots"][0]["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 2, "{f}: both devices read");
        headroom(d, &["replay", f]);
        headroom(d, &["replay", f, "--check", "--device", "1"]);
        headroom(d, &["replay", f, "--policy", "headroom"]);
        headroom(
            d,
            &["plan", "--model", "gpt2", "--gpu", "l4", "--seq", "128", "--calibrate", f, "--calibrate-seq", "128"],
        );
    }
    let v = headroom(d, &["inspect", "shared.pickle", "--json"]).json();
    for dev in v["snapshots"][0]["devices"].as_array().unwrap() {
        assert_eq!(dev["trace_entries"], 1, "each device has the shared entry");
    }
}

#[cfg(target_os = "linux")]
#[test]
fn b1_b2_memoised_lists_and_sparse_memos_stay_within_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // One entry a million times in a list, the list given to 100 devices: 2 MB
    // on disk, 6 GB once copied per reference.
    let mut r = Raw::new();
    r.op(b"}(").str("segments").op(b"]").str("device_traces").op(b"](");
    r.op(b"](");
    r.entry("free_completed", 4096, 512);
    let e = r.put();
    for _ in 0..1_000_000 - 1 {
        r.get(e);
    }
    r.op(b"e");
    let l = r.put();
    for _ in 0..99 {
        r.get(l);
    }
    r.op(b"e").op(b"u");
    std::fs::write(d.join("amp.pickle"), r.done()).unwrap();
    // One list of 100,000 blocks shared by 1,000 segments.
    let mut r = Raw::new();
    r.op(b"}(").str("device_traces").op(b"](]e").str("segments").op(b"](");
    r.op(b"}(").str("size").int(512).str("requested_size").int(512).str("address").int(0);
    r.str("state").str("inactive").str("frames").op(b"]u");
    let blk = r.put();
    r.op(b"](");
    for _ in 0..100_000 {
        r.get(blk);
    }
    r.op(b"e");
    let blocks = r.put();
    for i in 0..1000u64 {
        r.op(b"}(").str("device").int(0).str("address").int(B + i * (1 << 30)).str("total_size").int(512 * 100_000);
        r.str("stream").int(0).str("segment_type").str("large").str("blocks").get(blocks).op(b"u");
    }
    r.op(b"e").op(b"u");
    std::fs::write(d.join("segamp.pickle"), r.done()).unwrap();
    // B2: memo puts far apart, each growing the memo table by a million slots.
    let mut memo = vec![0x80, 4];
    let mut n: u32 = 0;
    while n + (1 << 20) < 1 << 28 {
        n += 1 << 20;
        memo.extend([b'N', b'r']);
        memo.extend(n.to_le_bytes());
        memo.push(b'0');
        n += 1;
    }
    memo.extend(b"}.");
    std::fs::write(d.join("memo.pickle"), memo).unwrap();

    // Under 1 GB of address space, where the copies needed 4 to 6 GB.
    for cmd in ["inspect amp.pickle --json", "replay amp.pickle"] {
        sh(&format!("ulimit -v 1000000; $H {cmd}"), d).expect(2, "refers again to records already used");
    }
    sh("ulimit -v 1000000; $H inspect segamp.pickle", d).expect(2, "refers again to records already used");
    for cmd in ["inspect memo.pickle", "replay memo.pickle"] {
        sh(&format!("ulimit -v 1000000; $H {cmd}"), d).expect(2, "memo puts");
    }
}

/// Runs `script` and asserts it ends within `limit` with `code`.
fn within(script: &str, d: &Path, limit: u64, code: i32) {
    let t = Instant::now();
    let r = sh(&format!("timeout {limit} {script}"), d);
    assert_eq!(r.code, code, "{script}: {}{}", r.stdout, r.stderr);
    assert!(t.elapsed() < Duration::from_secs(limit), "{script} took {:?}", t.elapsed());
}

fn entry_json(action: &str, addr: u64, size: u64, stream: u64, t: u64) -> String {
    format!(r#"{{"action":"{action}","addr":{addr},"size":{size},"stream":{stream},"time_us":{t},"frames":[]}}"#)
}

fn snapshot_json(segments: &[String], trace: &[String]) -> String {
    format!(r#"{{"segments":[{}],"device_traces":[[{}]]}}"#, segments.join(","), trace.join(","))
}

fn segment_json(addr: u64, size: u64, stream: u64, blocks: &[(u64, u64, &str)]) -> String {
    pool_segment_json("large", addr, size, stream, blocks)
}

fn pool_segment_json(pool: &str, addr: u64, size: u64, stream: u64, blocks: &[(u64, u64, &str)]) -> String {
    let blocks: Vec<String> = blocks
        .iter()
        .map(|(a, s, st)| format!(r#"{{"address":{a},"size":{s},"requested_size":{s},"state":"{st}","frames":[]}}"#))
        .collect();
    format!(
        r#"{{"device":0,"address":{addr},"total_size":{size},"stream":{stream},"segment_type":"{pool}","blocks":[{}]}}"#,
        blocks.join(",")
    )
}

#[test]
fn b3_b4_inspect_is_linear_in_ooms_delayed_frees_streams_and_repetitions() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Sizes at which the quadratic walks took minutes; each is seconds now (a debug build).
    const N: u64 = 50_000;
    // B3: a program that catches OOMs and retries records one entry per failure.
    let mut t = vec![entry_json("segment_alloc", B, 20 * M, 0, 0)];
    for i in 0..2 * N {
        t.push(format!(
            r#"{{"action":"oom","addr":0,"size":{},"stream":0,"time_us":{},"device_free":{},"frames":[]}}"#,
            100 * M,
            1 + i,
            10 * M
        ));
    }
    let seg = segment_json(B, 20 * M, 0, &[(B, 20 * M, "inactive")]);
    std::fs::write(d.join("ooms.json"), snapshot_json(std::slice::from_ref(&seg), &t)).unwrap();
    // B4: every free delayed (record_stream), all requested before any completes.
    let mut t = vec![entry_json("segment_alloc", B, 1 << 40, 0, 0)];
    for (k, action) in ["alloc", "free_requested", "free_completed"].iter().enumerate() {
        t.extend((0..N).map(|i| entry_json(action, B + i * 512, 512, 0, k as u64 * N + i)));
    }
    let seg = segment_json(B, 1 << 40, 0, &[(B, 1 << 40, "inactive")]);
    std::fs::write(d.join("pending.json"), snapshot_json(&[seg], &t)).unwrap();
    // Streams: one allocation and free on each of N streams.
    let (mut t, mut segs) = (Vec::new(), Vec::new());
    for i in 0..N {
        let a = B + i * 2 * M;
        t.push(entry_json("segment_alloc", a, 2 * M, i + 1, 3 * i));
        t.push(entry_json("alloc", a, 512, i + 1, 3 * i + 1));
        t.push(entry_json("free_requested", a, 512, i + 1, 3 * i + 2));
        t.push(entry_json("free_completed", a, 512, i + 1, 3 * i + 2));
        segs.push(pool_segment_json("small", a, 2 * M, i + 1, &[(a, 2 * M, "inactive")]));
    }
    std::fs::write(d.join("streams.json"), snapshot_json(&segs, &t)).unwrap();
    // Repetitions: each leaks one 4 KiB block from one site, and frees a 64 KiB one.
    let leak = r#"[{"filename":"train.py","line":10,"name":"step"}]"#;
    let other = r#"[{"filename":"train.py","line":20,"name":"other"}]"#;
    let e = |action: &str, addr: u64, size: u64, t: u64, f: &str| {
        format!(r#"{{"action":"{action}","addr":{addr},"size":{size},"stream":0,"time_us":{t},"frames":{f}}}"#)
    };
    let (small, big) = (4096, 65536);
    let mut t = vec![entry_json("segment_alloc", B, 1 << 40, 0, 0)];
    let mut blocks = Vec::new();
    for i in 0..N {
        let a = B + i * (small + big);
        t.extend([
            e("alloc", a, small, 3 * i + 1, leak),
            e("alloc", a + small, big, 3 * i + 2, other),
            e("free_requested", a + small, big, 3 * i + 3, other),
            e("free_completed", a + small, big, 3 * i + 3, other),
        ]);
        blocks.push((a, small, "active_allocated"));
        blocks.push((a + small, big, "inactive"));
    }
    let used = N * (small + big);
    blocks.push((B + used, (1 << 40) - used, "inactive"));
    std::fs::write(d.join("leaks.json"), snapshot_json(&[segment_json(B, 1 << 40, 0, &blocks)], &t)).unwrap();

    // `inspect` replays the run (`replay --check`'s walk) and looks for leaks: it covers both.
    for f in ["ooms.json", "pending.json", "streams.json", "leaks.json"] {
        within(&format!("$H inspect {f} --json > /dev/null"), d, 60, 0);
    }
    let r = headroom(d, &["inspect", "leaks.json", "--json"]);
    let suspects = &r.json()["snapshots"][0]["devices"][0]["leak_suspects"];
    assert_eq!(suspects[0]["site"], "train.py:10 in step", "{suspects}");
    assert_eq!(suspects[0]["growth_per_repetition_bytes"], 4096);
}

#[test]
fn b5_the_chrome_traces_slice_cap_holds_when_allocations_share_a_size() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let n = 100_500u64;
    let fr = r#"[{"filename":"train.py","line":1,"name":"step"}]"#;
    let mut t = vec![entry_json("segment_alloc", B, 20 * M, 0, 0)];
    for i in 0..n {
        for a in ["alloc", "free_requested", "free_completed"] {
            t.push(format!(
                r#"{{"action":"{a}","addr":{B},"size":{},"stream":0,"time_us":{},"frames":{fr}}}"#,
                2 * M,
                i + 1
            ));
        }
    }
    let seg = segment_json(B, 20 * M, 0, &[(B, 20 * M, "inactive")]);
    std::fs::write(d.join("same.json"), snapshot_json(&[seg], &t)).unwrap();
    headroom(d, &["inspect", "same.json", "--chrome-trace", "ct.json"]).expect(0, "Chrome trace written");
    let ct: Value = serde_json::from_slice(&std::fs::read(d.join("ct.json")).unwrap()).unwrap();
    let slices = ct["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "b").count();
    assert_eq!(slices, 100_000, "the documented cap");
    let notes = ct["otherData"]["notes"].to_string();
    assert!(notes.contains("the first 100000 of the 100500 of exactly 2097152 bytes"), "{notes}");
}

#[test]
fn s1_e1_a_replay_that_replays_nothing_exits_2_and_claims_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    pickle_file(d, "empty.pickle", &Py::dict([("segments", Py::List(vec![])), ("device_traces", Py::List(vec![]))]));
    let r = headroom(d, &["replay", "empty.pickle", "--snapshot-out", "o.pickle"]);
    r.expect(2, "nothing to replay");
    assert!(!r.stdout.contains("written"), "{}", r.stdout);
    assert!(!d.join("o.pickle").exists());
    // A trace without segments to start from, on device 0 of a snapshot with segments: not replayable.
    let mut s = base();
    set(&mut s.settings, "PYTORCH_CUDA_ALLOC_CONF", Py::str("backend:cudaMallocAsync"));
    s.pickle(d, "async.pickle");
    // The same status whatever the flags: 0, 1 and 2 before.
    for extra in [&[][..], &["--check"], &["--policy", "pytorch"], &["--snapshot-out", "o.pickle"]] {
        let mut args = vec!["replay", "async.pickle"];
        args.extend(extra);
        headroom(d, &args).expect(2, "cudaMallocAsync");
    }
    assert!(!d.join("o.pickle").exists());
    // A trace only on device 7, with nothing of its own to start from, and an empty one on device 0.
    let mut v = base().py();
    if let Py::Dict(items) = &mut v {
        let traces = items.iter_mut().find(|(k, _)| *k == Py::str("device_traces")).unwrap();
        let Py::List(t) = &mut traces.1 else { panic!() };
        let trace = t.pop().unwrap();
        t.extend((0..7).map(|_| Py::List(vec![])));
        t.push(trace);
    }
    pickle_file(d, "dev7.pickle", &v);
    headroom(d, &["replay", "dev7.pickle"]).expect(2, "nothing replayed");
    // E2: --max-entries shapes only the snapshot written.
    base().pickle(d, "base.pickle");
    headroom(d, &["replay", "base.pickle", "--max-entries", "5"]).expect(2, "--snapshot-out");
}

#[test]
fn s2_s3_segments_and_blocks_that_are_no_allocators_state_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    type Mutation = Box<dyn Fn(&mut Snap)>;
    let cases: Vec<(&str, Mutation, &str)> = vec![
        ("total0", Box::new(|s| set(&mut s.segments[0], "total_size", Py::Int(0))), "runs past the segment's end"),
        ("total1m", Box::new(|s| set(&mut s.segments[0], "total_size", Py::uint(M))), "runs past the segment's end"),
        (
            "totalbig",
            Box::new(|s| set(&mut s.segments[0], "total_size", Py::uint(30 * M))),
            "blocks add up to 20.00 MiB",
        ),
        ("totalmax", Box::new(|s| set(&mut s.segments[0], "total_size", Py::uint(u64::MAX))), "64-bit address space"),
        ("blockmax", Box::new(|s| set(&mut s.blocks[0], "size", Py::uint(u64::MAX))), "runs past the segment's end"),
        ("gap", Box::new(|s| set(&mut s.blocks[1], "address", Py::uint(B + 5 * M))), "the blocks before it end"),
        (
            "duplicate",
            Box::new(|s| {
                let again = s.segments[0].clone();
                s.segments.push(again)
            }),
            "listed twice",
        ),
        (
            "overlap",
            Box::new(|s| {
                let mut other = s.segments[0].clone();
                set(&mut other, "address", Py::uint(B + 10 * M));
                s.segments.push(other)
            }),
            "overlap",
        ),
    ];
    for (name, mutate, needle) in cases {
        let mut s = base();
        mutate(&mut s);
        // The overlapping copy needs its blocks where it is.
        let f = if name == "overlap" {
            let mut v = s.py();
            if let Py::Dict(items) = &mut v {
                let Py::List(segs) = &mut items[0].1 else { panic!() };
                let Py::Dict(seg) = &mut segs[1] else { panic!() };
                let Py::List(blocks) = &mut seg.last_mut().unwrap().1 else { panic!() };
                for (k, b) in blocks.iter_mut().enumerate() {
                    let Py::Dict(b) = b else { panic!() };
                    b[2].1 = Py::uint(B + 10 * M + k as u64 * 4 * M);
                }
            }
            pickle_file(d, "overlap.pickle", &v)
        } else {
            s.pickle(d, &format!("{name}.pickle"))
        };
        let f = f.to_str().unwrap();
        for cmd in [&["inspect", f][..], &["replay", f, "--check"]] {
            headroom(d, cmd).expect(2, needle).expect(2, "contradicts itself");
        }
    }
    // A segment dict memoised twice is the same segment twice, not a second one at address 0.
    let mut r = Raw::new();
    r.op(b"}(").str("device_traces").op(b"](]e").str("segments").op(b"](");
    r.op(b"}(").str("device").int(0).str("address").int(B).str("total_size").int(512).str("stream").int(0);
    r.str("blocks").op(b"](}(").str("size").int(512).str("state").str("inactive").op(b"ue").op(b"u");
    let seg = r.put();
    r.get(seg).op(b"e").op(b"u");
    std::fs::write(d.join("memoseg.pickle"), r.done()).unwrap();
    headroom(d, &["inspect", "memoseg.pickle"]).expect(2, "listed twice");
}

#[test]
fn s4_s5_wrapped_device_sizes_and_impossible_times() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut s = base();
    let mut oom = ev("oom", 0, 100 * M, 100);
    oom.push(("device_free", Py::uint(u64::MAX)));
    s.trace.push(oom);
    s.pickle(d, "oom.pickle");
    let r = headroom(d, &["inspect", "oom.pickle", "--json"]);
    let dev = &r.json()["snapshots"][0]["devices"][0];
    assert_eq!(dev["oom"]["capacity_bytes"], Value::Null, "no device of 20 MiB − 1 from a wrapped sum");
    assert!(dev["notes"].to_string().contains("more than any GPU has"), "{dev}");
    // The recording bounds the memory only by the refusal (20 MiB reserved, 100 MiB more refused):
    // a remedy is said to fail only where it fails on the most that allows.
    for m in dev["oom"]["remedies"].as_array().unwrap().iter().filter(|m| m["avoided"] == false) {
        assert!(m["note"].as_str().unwrap().contains("even with 120.00 MiB"), "{m}");
    }

    for (name, t) in [("min", Py::Int(i64::MIN)), ("nan", Py::Float(f64::NAN)), ("inf", Py::Float(f64::INFINITY))] {
        let mut s = base();
        set(&mut s.trace[0], "time_us", t);
        let f = s.pickle(d, &format!("time_{name}.pickle"));
        for cmd in ["inspect", "replay"] {
            headroom(d, &[cmd, f.to_str().unwrap()]).expect(2, "'time_us' is");
        }
    }
    // Times that go backwards are said to, and no moment is before the trace.
    let mut s = base();
    set(&mut s.trace[5], "time_us", Py::Int(0));
    s.pickle(d, "back.pickle");
    headroom(d, &["inspect", "back.pickle"]).expect(0, "times go backwards at entry 5");
}

#[test]
fn s6_a_key_given_twice_takes_its_last_value_as_python_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let json = serde_json::to_string(&base().py()).unwrap();
    std::fs::write(d.join("dupkey.json"), format!("{{\"segments\": [], {}", &json[1..])).unwrap();
    let v = headroom(d, &["inspect", "dupkey.json", "--json"]).json();
    assert_eq!(v["snapshots"][0]["devices"][0]["now"]["reserved_bytes"], 20 * M, "the last 'segments' is read");
    // In a pickle: the dict's SETITEMS names 'segments' twice, the empty list last.
    let mut r = Raw::new();
    r.op(b"}(").str("device_traces").op(b"](]e").str("segments");
    r.op(b"](}(").str("device").int(0).str("address").int(B).str("total_size").int(512).str("stream").int(0);
    r.str("blocks").op(b"](}(").str("size").int(512).str("state").str("inactive").op(b"ue").op(b"ue");
    r.str("segments").op(b"]").op(b"u");
    std::fs::write(d.join("dupkey.pickle"), r.done()).unwrap();
    let v = headroom(d, &["inspect", "dupkey.pickle", "--json"]).json();
    assert_eq!(v["snapshots"][0]["devices"].as_array().unwrap().len(), 0, "the last, empty, 'segments' is read");
}

#[test]
fn s7_s8_calibration_refuses_another_models_snapshot_and_contradictory_shapes() {
    let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/pytorch-snapshots");
    let w = |len: u32| {
        fx.join(format!(
            "Wedsonlin__assignment2-systems__8630bcfe__results_medium_{len}_training_memory_snapshot.pickle"
        ))
    };
    let larger = fx.join("kkaitlyn111__cs336-a2-systems__c1c174d1__memory_files_memory_ctx128_fullstep_.pickle");
    let unrelated = fx.join("HugePandaCoder__octree-nca-groupeq__0cc72993__my_snapshot.pickle");
    if ![w(128), w(256), larger.clone(), unrelated.clone()].iter().all(|f| f.is_file()) {
        skip::skip("../shared/fixtures is absent: the sweep's calibration cases are real snapshots");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/models/cs336-medium.json");
    let job = [
        "plan",
        "--model",
        model.to_str().unwrap(),
        "--gpu",
        "h100-sxm",
        "--precision",
        "fp32",
        "--attention",
        "eager",
        "--batch",
        "4",
        "--seq",
        "512",
    ];
    let (w128, w256) = (w(128), w(256));
    let (w128, w256) = (w128.to_str().unwrap(), w256.to_str().unwrap());
    // S7: a larger model's snapshot and an unrelated program's.
    headroom(d, &[&job[..], &["--calibrate", larger.to_str().unwrap(), "--calibrate-seq", "128"]].concat())
        .expect(2, "a snapshot of another model");
    headroom(d, &[&job[..], &["--calibrate", unrelated.to_str().unwrap()]].concat())
        .expect(2, "no whole training step");
    // S8: two lengths given as one, and given swapped.
    headroom(d, &[&job[..], &["--calibrate", w128, "--calibrate", w256, "--calibrate-seq", "128"]].concat())
        .expect(2, "runs of one job at one shape make the same tensors");
    let swapped = ["--calibrate", w128, "--calibrate", w256, "--calibrate-seq", "256", "--calibrate-seq", "128"];
    headroom(d, &[&job[..], &swapped].concat()).expect(2, "a longer sequence keeps more");
    let right = ["--calibrate", w128, "--calibrate", w256, "--calibrate-seq", "128", "--calibrate-seq", "256"];
    headroom(d, &[&job[..], &right].concat()).expect(0, "fits");
}

#[test]
fn s9_vllm_configurations_vllm_refuses_to_start_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let serve = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--infer", "--framework", "vllm"];
    for extra in [&["--max-num-seqs", "100000"][..], &["--max-num-batched-tokens", "512"]] {
        headroom(d, &[&serve[..], extra].concat()).expect(2, "must be greater than or equal to max_num_seqs");
    }
    headroom(d, &[&serve[..], &["--max-num-seqs", "18446744073709551615"]].concat()).expect(2, "is not in 1..=");
    headroom(d, &[&serve[..], &["--max-num-batched-tokens", "2048", "--max-num-seqs", "2048"]].concat())
        .expect(0, "starts: vLLM takes");
}

#[test]
fn s10_compile_says_where_it_has_no_effect() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let job = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm"];
    for extra in [
        &["--framework", "megatron"][..],
        &["--framework", "torchtitan"],
        &["--tp", "2", "--gpus", "2"],
        &["--finetune", "lora"],
        &["--finetune", "qlora"],
    ] {
        let with = headroom(d, &[&job[..], extra, &["--compile"]].concat());
        assert!(with.stdout.contains("it is planned with the eager code's"), "{extra:?}: {}", with.stdout);
        assert!(!with.stdout.lines().next().unwrap_or("").contains("torch.compile"), "{extra:?}: {}", with.stdout);
    }
}

#[test]
fn s11_e2_sizes_past_what_a_gpu_holds_and_flags_without_effect_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let job = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm"];
    headroom(d, &[&job[..], &["--seq", "18446744073709551615"]].concat()).expect(2, "is not in 1..=4294967296");
    headroom(d, &[&job[..], &["--batch", "18446744073709551615"]].concat()).expect(2, "more than 2^32 tokens");
    headroom(d, &[&job[..], &["--batch", "65536", "--seq", "65537"]].concat()).expect(2, "more than 2^32 tokens");
    for (flag, value) in [("--lora-rank", "8"), ("--lora-targets", "qv"), ("--base-weights", "nf4")] {
        headroom(d, &[&job[..], &[flag, value]].concat())
            .expect(2, &format!("{flag} applies to --finetune lora or qlora"));
    }
    headroom(d, &[&job[..], &["--finetune", "lora", "--lora-rank", "8", "--lora-targets", "qv"]].concat())
        .expect(0, "fits");
}

#[test]
fn s12_check_under_a_policy_or_other_settings_says_what_it_compares() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    base().pickle(d, "base.pickle");
    for extra in [&["--policy", "headroom"][..], &["--start", "fresh"], &["--alloc-conf", "expandable_segments:True"]] {
        let mut args = vec!["replay", "base.pickle", "--check"];
        args.extend(extra);
        let r = headroom(d, &args);
        r.expect(0, "--check replays PyTorch's policy from the recorded state under the recorded settings, apart from the rows above");
    }
    let r = headroom(d, &["replay", "base.pickle", "--check"]);
    assert!(!r.stdout.contains("apart from the rows above"), "{}", r.stdout);
}

#[test]
fn s13_allocator_settings_are_checked_and_written_back_as_they_were_used() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let bad = [
        ("PYTORCH_CUDA_ALLOC_CONF", Py::None, "a str"),
        ("expandable_segments", Py::Int(3), "True or False"),
        ("max_split_size", Py::Int(-5), "bytes, or -1"),
        ("garbage_collection_threshold", Py::Float(f64::INFINITY), "a fraction"),
        ("garbage_collection_threshold", Py::Float(f64::NAN), "a fraction"),
        ("garbage_collection_threshold", Py::Float(-1.0), "a fraction"),
    ];
    for (k, (key, v, needle)) in bad.into_iter().enumerate() {
        let mut s = base();
        set(&mut s.settings, key, v);
        let f = s.pickle(d, &format!("bad{k}.pickle"));
        headroom(d, &["replay", f.to_str().unwrap()]).expect(2, needle).expect(2, key);
    }
    // The string and the fields disagree: the fields are what ran, and the
    // snapshot written back replays to the same decisions.
    for conf in ["", "nonsense:::"] {
        let mut s = base();
        set(&mut s.settings, "PYTORCH_CUDA_ALLOC_CONF", Py::str(conf));
        set(&mut s.settings, "expandable_segments", Py::Bool(true));
        s.pickle(d, "x.pickle");
        headroom(d, &["replay", "x.pickle", "--snapshot-out", "o.pickle"]).expect(0, "written to o.pickle");
        headroom(d, &["replay", "o.pickle", "--check"]).expect(0, "every decision as recorded");
    }
}

#[test]
fn u1_to_u7_errors_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let frame = || Py::dict([("filename", Py::str("a.py")), ("line", Py::Int(1)), ("name", Py::str("f"))]);
    pickle_file(
        d,
        "u1a.pickle",
        &Py::dict([("segments", Py::List(vec![frame()])), ("device_traces", Py::List(vec![]))]),
    );
    pickle_file(
        d,
        "u1b.pickle",
        &Py::dict([
            ("segments", Py::List(vec![])),
            ("device_traces", Py::List(vec![Py::List(vec![frame(), frame()])])),
        ]),
    );
    headroom(d, &["inspect", "u1a.pickle"]).expect(2, "'segments' is a list of frames");
    headroom(d, &["inspect", "u1b.pickle"]).expect(2, "device_traces[0] is a list of frames");
    // U2: a file cut after its first byte is truncated, not "not a pickle".
    std::fs::write(d.join("u2.pickle"), b"\x80").unwrap();
    headroom(d, &["inspect", "u2.pickle"]).expect(2, "truncated");
    // U3: protocols 0 and 1 are named.
    std::fs::write(d.join("p0.pickle"), b"(dp0\nVsegments\np1\n(lp2\ns.").unwrap();
    std::fs::write(d.join("p1.pickle"), b"}q\x00(X\x08\x00\x00\x00segmentsq\x01]q\x02u.").unwrap();
    for f in ["p0.pickle", "p1.pickle"] {
        headroom(d, &["inspect", f]).expect(2, "protocol 0 or 1");
    }
    // U4: a JSONL trace given where a snapshot is read.
    let trace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/traces/gpt2-small-train.jsonl");
    headroom(d, &["inspect", trace.to_str().unwrap()]).expect(2, "a headroom trace, which `headroom replay` reads");
    // U5: a byte-order mark before JSON.
    let json = serde_json::to_string(&base().py()).unwrap();
    std::fs::write(d.join("bom.json"), [&b"\xef\xbb\xbf"[..], json.as_bytes()].concat()).unwrap();
    headroom(d, &["inspect", "bom.json"]).expect(0, "peak allocated");
    // U6: an --out-dir that is a file.
    std::fs::write(d.join("afile"), "x").unwrap();
    headroom(d, &["man", "--out-dir", "afile"]).expect(2, "is not a directory");
    // U7: `-` is neither written as a file named "-" nor read from one.
    base().pickle(d, "base.pickle");
    for out in ["--html", "--chrome-trace"] {
        headroom(d, &["inspect", "base.pickle", out, "-"]).expect(2, "standard output is not supported");
    }
    headroom(d, &["replay", "base.pickle", "--snapshot-out", "-"]).expect(2, "standard output is not supported");
    assert!(!d.join("-").exists());
    headroom(d, &["inspect", "-"]).expect(2, "standard input is not supported");
}

#[test]
fn d1_d2_escape_sequences_are_shown_not_obeyed_and_man_pages_are_whole_or_absent() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut s = base();
    let nasty = Py::List(vec![Py::dict([
        ("filename", Py::str("\x1b[2J\x1b]0;pwned\x07x\u{202e}\u{200b}.py")),
        ("line", Py::Int(1)),
        ("name", Py::str("f\0")),
    ])]);
    for e in &mut s.trace {
        set(e, "frames", nasty.clone());
    }
    s.pickle(d, "ansi.pickle");
    let r = headroom(d, &["inspect", "ansi.pickle", "--html", "r.html"]);
    r.expect(0, "\\u{1b}[2J\\u{1b}]0;pwned\\u{7}x\\u{202e}\\u{200b}.py:1 in f\\u{0}");
    assert!(!r.stdout.chars().any(|c| c.is_control() && c != '\n'), "{:?}", r.stdout);
    let html = std::fs::read_to_string(d.join("r.html")).unwrap();
    assert!(!html.contains('\0') && !html.contains('\x1b'), "the report has no raw NUL or ESC");

    std::fs::create_dir_all(d.join("out/headroom-plan.1")).unwrap();
    headroom(d, &["man", "--out-dir", "out"]).expect(2, "headroom-plan.1");
    let left: Vec<_> = std::fs::read_dir(d.join("out")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["headroom-plan.1"], "nothing written beside the blocker");
    let r = headroom(d, &["man", "--out-dir", "pages"]);
    assert_eq!(r.code, 0);
    let pages = std::fs::read_dir(d.join("pages")).unwrap().count();
    assert!(pages >= 8 && r.stdout.lines().count() == pages, "{pages} pages: {}", r.stdout);
}
