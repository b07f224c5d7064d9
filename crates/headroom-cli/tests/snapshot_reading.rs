//! Memory snapshots as users and hostile files give them: pickles whose lists are shared or
//! memoised far apart, segments that contradict their blocks, impossible sizes and times, keys
//! given twice, and the messages that name each problem. Each input is built here (no Python)
//! and run as a user runs it; each exits 0 or 2 with a message, never a panic.

mod support;

use support::*;

#[test]
fn a_trace_list_shared_between_devices_is_read_not_a_panic() {
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
        let v = headroom_in(d, &["inspect", f, "--json"]).json();
        let devices = v["snapshots"][0]["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 2, "{f}: both devices read");
        headroom_in(d, &["replay", f]);
        headroom_in(d, &["replay", f, "--check", "--device", "1"]);
        headroom_in(d, &["replay", f, "--policy", "headroom"]);
        headroom_in(
            d,
            &["plan", "--model", "gpt2", "--gpu", "l4", "--seq", "128", "--calibrate", f, "--calibrate-seq", "128"],
        );
    }
    let v = headroom_in(d, &["inspect", "shared.pickle", "--json"]).json();
    for dev in v["snapshots"][0]["devices"].as_array().unwrap() {
        assert_eq!(dev["trace_entries"], 1, "each device has the shared entry");
    }
}

#[test]
fn memoised_lists_and_sparse_memos_stay_within_the_file() {
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

#[test]
fn segments_and_blocks_that_are_no_allocators_state_are_refused() {
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
            headroom_in(d, cmd).expect(2, needle).expect(2, "contradicts itself");
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
    headroom_in(d, &["inspect", "memoseg.pickle"]).expect(2, "listed twice");
}

#[test]
fn wrapped_device_sizes_and_impossible_times_are_refused_or_noted() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut s = base();
    let mut oom = ev("oom", 0, 100 * M, 100);
    oom.push(("device_free", Py::uint(u64::MAX)));
    s.trace.push(oom);
    s.pickle(d, "oom.pickle");
    let r = headroom_in(d, &["inspect", "oom.pickle", "--json"]);
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
            headroom_in(d, &[cmd, f.to_str().unwrap()]).expect(2, "'time_us' is");
        }
    }
    // Times that go backwards are said to, and no moment is before the trace.
    let mut s = base();
    set(&mut s.trace[5], "time_us", Py::Int(0));
    s.pickle(d, "back.pickle");
    headroom_in(d, &["inspect", "back.pickle"]).expect(0, "times go backwards at entry 5");
}

#[test]
fn a_key_given_twice_takes_its_last_value_as_python_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let json = serde_json::to_string(&base().py()).unwrap();
    std::fs::write(d.join("dupkey.json"), format!("{{\"segments\": [], {}", &json[1..])).unwrap();
    let v = headroom_in(d, &["inspect", "dupkey.json", "--json"]).json();
    assert_eq!(v["snapshots"][0]["devices"][0]["now"]["reserved_bytes"], 20 * M, "the last 'segments' is read");
    // In a pickle: the dict's SETITEMS names 'segments' twice, the empty list last.
    let mut r = Raw::new();
    r.op(b"}(").str("device_traces").op(b"](]e").str("segments");
    r.op(b"](}(").str("device").int(0).str("address").int(B).str("total_size").int(512).str("stream").int(0);
    r.str("blocks").op(b"](}(").str("size").int(512).str("state").str("inactive").op(b"ue").op(b"ue");
    r.str("segments").op(b"]").op(b"u");
    std::fs::write(d.join("dupkey.pickle"), r.done()).unwrap();
    let v = headroom_in(d, &["inspect", "dupkey.pickle", "--json"]).json();
    assert_eq!(v["snapshots"][0]["devices"].as_array().unwrap().len(), 0, "the last, empty, 'segments' is read");
}

#[test]
fn errors_reading_a_snapshot_name_the_problem() {
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
    headroom_in(d, &["inspect", "u1a.pickle"]).expect(2, "'segments' is a list of frames");
    headroom_in(d, &["inspect", "u1b.pickle"]).expect(2, "device_traces[0] is a list of frames");
    // U2: a file cut after its first byte is truncated, not "not a pickle".
    std::fs::write(d.join("u2.pickle"), b"\x80").unwrap();
    headroom_in(d, &["inspect", "u2.pickle"]).expect(2, "truncated");
    // U3: protocols 0 and 1 are named.
    std::fs::write(d.join("p0.pickle"), b"(dp0\nVsegments\np1\n(lp2\ns.").unwrap();
    std::fs::write(d.join("p1.pickle"), b"}q\x00(X\x08\x00\x00\x00segmentsq\x01]q\x02u.").unwrap();
    for f in ["p0.pickle", "p1.pickle"] {
        headroom_in(d, &["inspect", f]).expect(2, "protocol 0 or 1");
    }
    // U4: a JSONL trace given where a snapshot is read.
    let trace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/traces/gpt2-small-train.jsonl");
    headroom_in(d, &["inspect", trace.to_str().unwrap()]).expect(2, "a headroom trace, which `headroom replay` reads");
    // U5: a byte-order mark before JSON.
    let json = serde_json::to_string(&base().py()).unwrap();
    std::fs::write(d.join("bom.json"), [&b"\xef\xbb\xbf"[..], json.as_bytes()].concat()).unwrap();
    headroom_in(d, &["inspect", "bom.json"]).expect(0, "peak allocated");
    // U6: an --out-dir that is a file.
    std::fs::write(d.join("afile"), "x").unwrap();
    headroom_in(d, &["man", "--out-dir", "afile"]).expect(2, "is not a directory");
    // U7: `-` is neither written as a file named "-" nor read from one.
    base().pickle(d, "base.pickle");
    for out in ["--html", "--chrome-trace"] {
        headroom_in(d, &["inspect", "base.pickle", out, "-"]).expect(2, "standard output is not supported");
    }
    headroom_in(d, &["replay", "base.pickle", "--snapshot-out", "-"]).expect(2, "standard output is not supported");
    assert!(!d.join("-").exists());
    headroom_in(d, &["inspect", "-"]).expect(2, "standard input is not supported");
}
