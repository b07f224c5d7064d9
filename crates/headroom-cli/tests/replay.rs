//! `headroom replay`, run as a user runs it.

#[path = "../../../tests/support/skip.rs"]
mod skip;

use assert_cmd::Command;
use predicates::str::contains;
use serde_json::Value;
use std::path::{Path, PathBuf};
mod support;
use support::*;

fn bundled() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/traces/gpt2-small-train.jsonl")
}

fn headroom() -> Command {
    Command::cargo_bin("headroom").unwrap()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn replays_the_bundled_trace() {
    headroom()
        .args(["replay"])
        .arg(bundled())
        .assert()
        .success()
        .stdout(contains("2640 operations on a simulated GPU of 80.00 GiB"))
        .stdout(contains("(default)"))
        .stdout(contains("peak reserved"));
}

#[test]
fn json_has_the_documented_keys() {
    let out = headroom().arg("replay").arg(bundled()).arg("--json").output().unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    for k in [
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "num_device_alloc",
        "num_device_free",
        "num_ooms",
        "oom_ops",
        "stats",
    ] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    assert_eq!(v["stats"].as_object().unwrap().len(), 122);
    assert_eq!(v["stats"]["reserved_bytes.all.peak"], v["peak_reserved_bytes"]);
    assert_eq!(v["num_ooms"], 0);
}

#[test]
fn comparing_settings_gives_one_run_each() {
    let out = headroom()
        .arg("replay")
        .arg(bundled())
        .args(["--alloc-conf", "", "--alloc-conf", "expandable_segments:True", "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1]["alloc_conf"], "expandable_segments:True");
    assert!(runs[1]["peak_reserved_bytes"].as_u64() < runs[0]["peak_reserved_bytes"].as_u64());
}

#[test]
fn ooms_are_reported_with_line_numbers_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(
        dir.path(),
        "t.jsonl",
        "{\"op\":\"alloc\",\"id\":\"a\",\"size\":41943040}\n{\"op\":\"alloc\",\"id\":\"b\",\"size\":41943040}\n\
         {\"op\":\"free\",\"id\":\"b\"}\n{\"op\":\"alloc\",\"id\":\"c\",\"size\":1000}\n",
    );
    let out = headroom().arg("replay").arg(&t).args(["--capacity", "64MiB", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["num_ooms"], 1);
    assert_eq!(v["oom_ops"], serde_json::json!([2]));
    assert_eq!(v["skipped_frees"], 1);
    assert_eq!(v["stats"]["num_ooms"], 1);
    headroom()
        .arg("replay")
        .arg(&t)
        .args(["--capacity", "64MiB"])
        .assert()
        .code(1)
        .stdout(contains("1 allocations failed, at lines 2"))
        .stdout(contains("CUDA out of memory. Tried to allocate 40.00 MiB"));
}

#[test]
fn bad_input_is_named_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(dir.path(), "bad.jsonl", "{\"op\":\"alloc\",\"id\":1,\"size\":10}\n{\"op\":\"alloc\",\"id\":2}\n");
    headroom().arg("replay").arg(&t).assert().code(2).stderr(contains("line 2: missing `size`"));
    let good = write(dir.path(), "good.jsonl", "{\"op\":\"alloc\",\"id\":1,\"size\":10}\n");
    headroom()
        .arg("replay")
        .arg(&good)
        .args(["--alloc-conf", "max_split_size_mb:5"])
        .assert()
        .code(2)
        .stderr(contains("max_split_size_mb"));
    headroom().arg("replay").arg(&good).args(["--capacity", "lots"]).assert().code(2).stderr(contains("--capacity"));
    headroom().arg("replay").arg(dir.path().join("missing.jsonl")).assert().code(2).stderr(contains("missing.jsonl"));
    let unknown = write(dir.path(), "u.jsonl", "{\"op\":\"free\",\"id\":1}\n");
    headroom().arg("replay").arg(&unknown).assert().code(2).stderr(contains("line 1: `1` is not a live allocation"));
}

/// The pickle is protocol 4 and holds what PyTorch's viewer reads, consistent
/// with the trace (the viewer rebuilds earlier states from it): every active
/// block in `segments` is an `alloc` without a matching `free_completed`, and
/// the segment events add up to the reserved total.
#[test]
fn snapshot_out_writes_a_consistent_pytorch_snapshot() {
    use serde_pickle::{HashableValue as H, Value as V};
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap.pickle");
    headroom()
        .arg("replay")
        .arg(bundled())
        .arg("--snapshot-out")
        .arg(&snap)
        .assert()
        .success()
        .stdout(contains("memory_viz"));
    let bytes = std::fs::read(&snap).unwrap();
    assert_eq!(&bytes[..2], &[0x80, 4]);
    let v = serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new()).unwrap();
    let get = |v: &V, k: &str| match v {
        V::Dict(d) => d.get(&H::String(k.into())).cloned().unwrap_or_else(|| panic!("no key {k}")),
        _ => panic!("not a dict"),
    };
    let int = |v: V| match v {
        V::I64(i) => i,
        other => panic!("not an int: {other:?}"),
    };
    let list = |v: V| match v {
        V::List(l) => l,
        other => panic!("not a list: {other:?}"),
    };
    let segments = list(get(&v, "segments"));
    let trace = list(list(get(&v, "device_traces")).remove(0));
    assert!(!segments.is_empty() && !trace.is_empty());
    let mut live = std::collections::BTreeMap::new();
    let mut reserved = 0i64;
    for e in &trace {
        let action = match get(e, "action") {
            V::String(s) => s,
            _ => panic!(),
        };
        match action.as_str() {
            "alloc" => assert!(live.insert(int(get(e, "addr")), int(get(e, "size"))).is_none()),
            "free_completed" => assert!(live.remove(&int(get(e, "addr"))).is_some()),
            "segment_alloc" | "segment_map" => reserved += int(get(e, "size")),
            "segment_free" | "segment_unmap" => reserved -= int(get(e, "size")),
            _ => {}
        }
    }
    let mut total = 0;
    let mut allocated = std::collections::BTreeMap::new();
    for s in &segments {
        total += int(get(s, "total_size"));
        assert_eq!(get(s, "segment_pool_id"), V::Tuple(vec![V::I64(0), V::I64(0)]));
        for b in list(get(s, "blocks")) {
            // A freed block waiting for another stream has no free_completed yet.
            if get(&b, "state") != V::String("inactive".into()) {
                allocated.insert(int(get(&b, "address")), int(get(&b, "requested_size")));
            }
        }
    }
    assert_eq!(total, reserved);
    assert!(allocated == live, "live blocks in `segments` differ from the trace");
    let settings = get(&v, "allocator_settings");
    assert_eq!(get(&settings, "max_split_size"), V::I64(-1));

    // The same snapshot as JSON.
    let json_path = dir.path().join("snap.json");
    headroom().arg("replay").arg(bundled()).arg("--snapshot-out").arg(&json_path).assert().success();
    let j: Value = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    assert_eq!(j["segments"].as_array().unwrap().len(), segments.len());
}

#[test]
fn help_teaches_the_format() {
    headroom()
        .args(["replay", "--help"])
        .assert()
        .success()
        .stdout(contains("{\"op\":\"alloc\",\"id\":1,\"size\":4096,\"stream\":0}"))
        .stdout(contains("--alloc-conf"))
        .stdout(contains("Exit status"));
}

/// A snapshot of the bundled run, written by headroom itself: replay reads it
/// back by content (pickle or JSON), and `--check` finds every decision as
/// recorded, with and without expandable segments.
fn recorded_snapshot(dir: &Path, name: &str, conf: &str) -> PathBuf {
    let p = dir.join(name);
    headroom().arg("replay").arg(bundled()).args(["--alloc-conf", conf, "--snapshot-out"]).arg(&p).assert().success();
    p
}

#[test]
fn snapshots_replay_and_check_decision_for_decision() {
    let dir = tempfile::tempdir().unwrap();
    for (name, conf) in [("native.pickle", ""), ("expandable.json", "expandable_segments:True")] {
        let snap = recorded_snapshot(dir.path(), name, conf);
        headroom()
            .arg("replay")
            .arg(&snap)
            .arg("--check")
            .assert()
            .success()
            .stdout(contains("starting from an empty allocator"))
            .stdout(contains("(recorded)"))
            .stdout(contains("every decision as recorded"));
        let out = headroom().arg("replay").arg(&snap).args(["--check", "--json"]).output().unwrap();
        assert!(out.status.success());
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let d = &v["devices"][0];
        let f = &d["fidelity"];
        assert_eq!(f["alloc_matched"], f["alloc_total"], "{name}");
        assert_eq!(f["alloc_total"], 1563, "{name}: every alloc of the bundled trace");
        assert_eq!(f["segment_matched"], f["segment_total"], "{name}");
        assert!(f["first_divergence"].is_null());
        for k in [
            "peak_allocated_bytes",
            "peak_reserved_bytes",
            "unallocated_at_reserved_peak_bytes",
            "num_device_alloc",
            "num_ooms",
            "oom_ops",
        ] {
            assert!(d["runs"][0].get(k).is_some(), "{name}: {k}");
        }
    }
}

#[test]
fn snapshot_what_if_compares_settings_and_finds_the_oom() {
    let dir = tempfile::tempdir().unwrap();
    let snap = recorded_snapshot(dir.path(), "run.pickle", "");
    let out = headroom()
        .arg("replay")
        .arg(&snap)
        .args(["--alloc-conf", "", "--alloc-conf", "expandable_segments:True", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = v["devices"][0]["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["alloc_conf"], "(default)");
    assert!(runs[1]["peak_reserved_bytes"].as_u64() <= runs[0]["peak_reserved_bytes"].as_u64());
    // On a 3 GiB device the 4.3 GiB run runs out of memory: exit 1, with the trace entry.
    let out = headroom().arg("replay").arg(&snap).args(["--capacity", "3GiB", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let run = &v["devices"][0]["runs"][0];
    assert!(run["num_ooms"].as_u64().unwrap() > 0);
    assert!(run["oom_ops"][0].as_u64().is_some());
    // The replayed run, written back, replays as recorded in turn.
    let again = dir.path().join("again.pickle");
    headroom().arg("replay").arg(&snap).arg("--snapshot-out").arg(&again).assert().success();
    headroom()
        .arg("replay")
        .arg(&again)
        .arg("--check")
        .assert()
        .success()
        .stdout(contains("every decision as recorded"));
}

#[test]
fn bad_snapshots_are_named_with_the_byte_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let snap = recorded_snapshot(dir.path(), "run.pickle", "");
    let bytes = std::fs::read(&snap).unwrap();
    let cut = write(dir.path(), "cut.pickle", "");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    headroom().arg("replay").arg(&cut).assert().code(2).stderr(contains("cut.pickle")).stderr(contains("truncated"));
    let global = write(dir.path(), "evil.pickle", "");
    std::fs::write(
        &global,
        b"\x80\x04\x95\x14\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94.",
    )
    .unwrap();
    headroom().arg("replay").arg(&global).assert().code(2).stderr(contains("byte 28")).stderr(contains("never runs"));
    headroom().arg("replay").arg(&snap).args(["--device", "3"]).assert().code(2).stderr(contains("no device 3"));
    headroom().arg("replay").arg(bundled()).arg("--check").assert().code(2).stderr(contains("apply to snapshots"));
}

/// `path` gzip-compressed, as users keep snapshots, under `name` in `dir`.
fn gzipped(dir: &Path, path: &Path, name: &str) -> PathBuf {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(&std::fs::read(path).unwrap()).unwrap();
    let out = dir.join(name);
    std::fs::write(&out, e.finish().unwrap()).unwrap();
    out
}

#[test]
fn compressed_snapshots_and_traces_are_read_directly() {
    let dir = tempfile::tempdir().unwrap();
    let snap = recorded_snapshot(dir.path(), "run.pickle", "");
    let gz = gzipped(dir.path(), &snap, "run.pickle.gz");
    headroom()
        .arg("replay")
        .arg(&gz)
        .arg("--check")
        .assert()
        .success()
        .stdout(contains("pickle protocol 4, gzip"))
        .stdout(contains("every decision as recorded"));
    headroom().arg("inspect").arg(&gz).assert().success().stdout(contains("run.pickle.gz"));
    let trace = gzipped(dir.path(), &bundled(), "trace.jsonl.gz");
    headroom().arg("replay").arg(&trace).assert().success().stdout(contains("2640 operations"));
    // A compressed file cut short is an error, never a shorter run.
    let bytes = std::fs::read(&gz).unwrap();
    let cut = write(dir.path(), "cut.pickle.gz", "");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    headroom().arg("replay").arg(&cut).assert().code(2).stderr(contains("cut.pickle.gz"));
}

#[test]
#[cfg_attr(no_shared, ignore = "needs ../shared (development checkouts)")]
fn real_snapshots_from_mid_run_replay_as_recorded() {
    let f = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures/pytorch-snapshots/Wedsonlin__assignment2-systems__8630bcfe__results_medium_128_training_memory_snapshot.pickle");
    if !f.exists() {
        skip::skip("../shared/fixtures is absent (only development checkouts have it)");
        return;
    }
    headroom()
        .arg("replay")
        .arg(&f)
        .arg("--check")
        .assert()
        .success()
        .stdout(contains("starting mid-run"))
        .stdout(contains("alloc 6526/6526"))
        .stdout(contains("every decision as recorded"));
}

/// `--policy` on a snapshot: one run per policy, from an empty device, each
/// with its peak against the live bytes; no policy reserves less than the
/// live peak, and `headroom` no more than `pytorch`.
#[test]
fn policies_compare_side_by_side_on_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let snap = recorded_snapshot(dir.path(), "run.pickle", "");
    headroom()
        .arg("replay")
        .arg(&snap)
        .args(["--policy", "pytorch", "--policy", "expandable", "--policy", "headroom"])
        .assert()
        .success()
        .stdout(contains("policy [PYTORCH_CUDA_ALLOC_CONF]"))
        .stdout(contains("headroom [(recorded)]"))
        .stdout(contains("--start fresh"))
        .stdout(contains("no allocator reserves less"));
    let out = headroom()
        .arg("replay")
        .arg(&snap)
        .args(["--policy", "pytorch", "--policy", "headroom", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["start"], "fresh");
    let d = &v["devices"][0];
    let live = d["live_peak_bytes"].as_u64().unwrap();
    let runs = d["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["policy"], "pytorch");
    assert_eq!(runs[1]["policy"], "headroom");
    let peak = |i: usize| runs[i]["peak_reserved_bytes"].as_u64().unwrap();
    assert!(peak(0) >= live && peak(1) >= live, "{} {} below the live peak {live}", peak(0), peak(1));
    assert!(peak(1) <= peak(0));
    // Started from the recorded segments instead, the run is the plain what-if.
    let out = headroom()
        .arg("replay")
        .arg(&snap)
        .args(["--policy", "headroom", "--start", "recorded", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["start"], "recorded");
}

#[test]
fn policies_replay_a_jsonl_trace_and_unknown_names_exit_2() {
    let out = headroom()
        .arg("replay")
        .arg(bundled())
        .args(["--policy", "expandable", "--policy", "headroom", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs[0]["policy"], "expandable");
    assert_eq!(runs[1]["policy"], "headroom");
    assert!(runs[1]["peak_reserved_bytes"].as_u64() <= runs[0]["peak_reserved_bytes"].as_u64());
    headroom()
        .arg("replay")
        .arg(bundled())
        .args(["--policy", "best"])
        .assert()
        .code(2)
        .stderr(contains("unknown policy `best`"));
    headroom()
        .arg("replay")
        .arg(bundled())
        .args(["--start", "fresh"])
        .assert()
        .code(2)
        .stderr(contains("apply to snapshots"));
}

#[test]
fn the_cuda_backend_without_a_gpu_says_so() {
    let trace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/traces/gpt2-small-train.jsonl");
    let out = headroom().arg("replay").arg(&trace).args(["--backend", "cuda", "--json"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    match headroom_cuda::available() {
        Err(why) => {
            assert_eq!(out.status.code(), Some(2), "{stderr}");
            assert!(stderr.contains(&why.to_string()), "{stderr}");
        }
        // With a GPU: the same requests, the same bytes handed out as on the simulator.
        Ok(_) => {
            assert_eq!(out.status.code(), Some(0), "{stderr}");
            let real: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let sim = headroom().arg("replay").arg(&trace).arg("--json").output().unwrap();
            let sim: serde_json::Value = serde_json::from_slice(&sim.stdout).unwrap();
            assert_eq!(real["backend"], "cuda");
            assert_eq!(real["peak_allocated_bytes"], sim["peak_allocated_bytes"]);
            assert_eq!(real["operations"], sim["operations"]);
        }
    }
    for bad in [&["--backend", "cuda", "--capacity", "1GiB"][..], &["--cuda-device", "1"], &["--backend", "rocm"]] {
        let out = headroom().arg("replay").arg(&trace).args(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
}

#[test]
fn a_replay_that_replays_nothing_exits_2_and_claims_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    pickle_file(d, "empty.pickle", &Py::dict([("segments", Py::List(vec![])), ("device_traces", Py::List(vec![]))]));
    let r = headroom_in(d, &["replay", "empty.pickle", "--snapshot-out", "o.pickle"]);
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
        headroom_in(d, &args).expect(2, "cudaMallocAsync");
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
    headroom_in(d, &["replay", "dev7.pickle"]).expect(2, "nothing replayed");
    // E2: --max-entries shapes only the snapshot written.
    base().pickle(d, "base.pickle");
    headroom_in(d, &["replay", "base.pickle", "--max-entries", "5"]).expect(2, "--snapshot-out");
}

#[test]
fn check_under_a_policy_or_other_settings_says_what_it_compares() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    base().pickle(d, "base.pickle");
    for extra in [&["--policy", "headroom"][..], &["--start", "fresh"], &["--alloc-conf", "expandable_segments:True"]] {
        let mut args = vec!["replay", "base.pickle", "--check"];
        args.extend(extra);
        let r = headroom_in(d, &args);
        r.expect(0, "--check replays PyTorch's policy from the recorded state under the recorded settings, apart from the rows above");
    }
    let r = headroom_in(d, &["replay", "base.pickle", "--check"]);
    assert!(!r.stdout.contains("apart from the rows above"), "{}", r.stdout);
}

#[test]
fn allocator_settings_are_checked_and_written_back_as_they_were_used() {
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
        headroom_in(d, &["replay", f.to_str().unwrap()]).expect(2, needle).expect(2, key);
    }
    // The string and the fields disagree: the fields are what ran, and the
    // snapshot written back replays to the same decisions.
    for conf in ["", "nonsense:::"] {
        let mut s = base();
        set(&mut s.settings, "PYTORCH_CUDA_ALLOC_CONF", Py::str(conf));
        set(&mut s.settings, "expandable_segments", Py::Bool(true));
        s.pickle(d, "x.pickle");
        headroom_in(d, &["replay", "x.pickle", "--snapshot-out", "o.pickle"]).expect(0, "written to o.pickle");
        headroom_in(d, &["replay", "o.pickle", "--check"]).expect(0, "every decision as recorded");
    }
}

/// headroom's own policies keep state by the blocks live, not by the pages mapped: a trace of
/// one allocation of nearly 1 PiB replays in a moment under every policy, as PyTorch's does.
#[test]
fn policies_keep_state_by_live_blocks_not_by_the_bytes_mapped() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let size = (1u64 << 50) - (1 << 21);
    std::fs::write(
        d.join("pib.jsonl"),
        format!("{{\"op\":\"alloc\",\"id\":1,\"size\":{size}}}\n{{\"op\":\"free\",\"id\":1}}\n"),
    )
    .unwrap();
    for policy in ["headroom", "lifetime", "planned", "pytorch"] {
        let started = Instant::now();
        let r = sh(&format!("ulimit -v 1048576; \"$H\" replay pib.jsonl --capacity 1PiB --policy {policy} --json"), d);
        assert_eq!(r.code, 0, "{policy}: {}", r.stderr);
        assert_eq!(r.json()["peak_allocated_bytes"], size, "{policy}");
        assert!(started.elapsed() < Duration::from_secs(10), "{policy}: {:?}", started.elapsed());
    }
}

/// A trace line is read to 64 MiB at most: a file with no line end (`/dev/zero`, a long run of
/// text) is refused by its line within a small memory limit, not an abort.
#[test]
fn a_trace_line_longer_than_64_mib_is_refused_not_an_abort() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let long = "head -c 70000000 /dev/zero | tr '\\0' a > long.jsonl";
    for trace in ["/dev/zero", "long.jsonl"] {
        let r = sh(&format!("{long}; ulimit -v 1000000; \"$H\" replay {trace}"), d);
        assert_eq!(r.code, 2, "{trace}: {}", r.stderr);
        assert!(r.stderr.contains("line 1: longer than 64 MiB: not a trace event"), "{trace}: {}", r.stderr);
    }
}

#[test]
fn large_segment_sizes_that_overflow_are_refused_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_file(dir.path(), "t.jsonl", "{\"op\":\"alloc\",\"id\":1,\"size\":3000000}\n");
    for conf in [
        "large_segment_size_mb:17592186044416,expandable_segments:True",
        "large_segment_size_mb:17592186044417",
        "large_segment_size_mb:17592186044416",
        "large_segment_size_mb:18446744073709551615,expandable_segments:True",
    ] {
        headroom_run(&["replay", arg(&t), "--alloc-conf", conf])
            .expect(2, "invalid allocator setting `large_segment_size_mb`: ");
    }
    headroom_run(&["replay", arg(&t), "--alloc-conf", "large_segment_size_mb:21,expandable_segments:True"])
        .expect(2, "not a multiple of 2 MiB");
}

#[test]
fn snapshot_history_is_bounded_and_streamed() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = String::new();
    for i in 0..200_000u64 {
        t.push_str(&format!(
            "{{\"op\":\"alloc\",\"id\":{i},\"size\":{}}}\n{{\"op\":\"free\",\"id\":{i}}}\n",
            4096 + i % 7000
        ));
    }
    write_file(dir.path(), "load.jsonl", t);
    let r = sh("ulimit -v 600000; $H replay load.jsonl --snapshot-out s.json --max-entries 50000", dir.path());
    r.expect(0, "it keeps the last 50000 trace entries");
    let snap: Value = serde_json::from_slice(&std::fs::read(dir.path().join("s.json")).unwrap()).unwrap();
    assert_eq!(snap["device_traces"][0].as_array().unwrap().len(), 50_000);
}

#[test]
fn capacities_beyond_the_largest_gpu_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = (1u64 << 60) - (1 << 22);
    let t: String = (0..17).map(|i| format!("{{\"op\":\"alloc\",\"id\":{i},\"size\":{s}}}\n")).collect();
    let t = write_file(dir.path(), "t.jsonl", t);
    for (cap, needle) in [
        ("16EiB", "more than the largest size, 2^64 − 1 bytes"),
        ("17EiB", "2^64"),
        ("1000EiB", "2^64"),
        ("99999999999999999999999", "2^64"),
        ("2EiB", "more than the largest simulated GPU, 1 PiB"),
    ] {
        headroom_run(&["replay", arg(&t), "--capacity", cap]).expect(2, needle);
    }
    let v = headroom_run(&["replay", arg(&t), "--capacity", "1PiB", "--json"]).json();
    assert_eq!(v["num_ooms"], 17);
    assert_eq!(v["final_allocated_bytes"], 0);
    let eb = write_file(dir.path(), "eb.jsonl", format!("{{\"op\":\"alloc\",\"id\":1,\"size\":{}}}\n", 1u64 << 60));
    headroom_run(&["replay", arg(&eb), "--capacity", "1PiB"]).expect(1, "Tried to allocate more than 1EB memory.");
}

#[test]
fn stream_ids_beyond_i64_are_kept_apart_in_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_file(
        dir.path(),
        "s.jsonl",
        "{\"op\":\"alloc\",\"id\":1,\"size\":4096,\"stream\":18446744073709551615}\n\
         {\"op\":\"alloc\",\"id\":2,\"size\":4096,\"stream\":9223372036854775807}\n",
    );
    let out = dir.path().join("s.json");
    headroom_run(&["replay", arg(&t), "--snapshot-out", arg(&out)]).expect(0, "snapshot written");
    let v: Value = serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap();
    let mut streams: Vec<u64> =
        v["segments"].as_array().unwrap().iter().map(|s| s["stream"].as_u64().unwrap()).collect();
    streams.sort();
    assert_eq!(streams, [i64::MAX as u64, u64::MAX]);
}

#[test]
fn settings_headroom_does_not_simulate_are_said() {
    headroom_run(&["replay", arg(&gpt2_trace()), "--alloc-conf", "backend:cudaMallocAsync"])
        .expect(2, "backend:cudaMallocAsync (CUDA's stream-ordered pool) is not simulated");
    let r = headroom_run(&[
        "replay",
        arg(&gpt2_trace()),
        "--alloc-conf",
        "release_lock_on_cudamalloc:True,pinned_num_register_threads:8",
    ]);
    r.expect(
        0,
        "release_lock_on_cudamalloc, pinned_num_register_threads do not change the device allocator's decisions",
    );
}

#[test]
fn trace_lines_are_named_and_read_strictly() {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes, needle) in [
        (
            "utf8.jsonl",
            &b"{\"op\":\"empty_cache\"}\n\n\n\n\xc3\x28\n"[..],
            "line 5: not valid UTF-8: byte 1 of the line is 0xc3",
        ),
        ("bin.jsonl", &b"\x00\x01\xfe\xff garbage"[..], "line 1: not valid UTF-8"),
        (
            "stream.jsonl",
            &b"{\"op\":\"alloc\",\"id\":1,\"size\":1,\"stream\":-1}\n"[..],
            "`stream` must be a non-negative whole number, got -1",
        ),
        ("big.jsonl", &b"{\"op\":\"alloc\",\"id\":1,\"size\":18446744073709551616}\n"[..], "`size` is out of range"),
        (
            "dup.jsonl",
            &b"{\"op\":\"alloc\",\"id\":1,\"size\":4096,\"size\":8192}\n"[..],
            "line 1: `size` is given twice",
        ),
        ("dupop.jsonl", &b"{\"op\":\"alloc\",\"op\":\"free\",\"id\":1}\n"[..], "`op` is given twice"),
    ] {
        let p = write_file(dir.path(), name, bytes);
        let r = headroom_run(&["replay", arg(&p)]);
        r.expect(2, needle);
        assert!(!r.stderr.contains("UTF-8: stream did not"), "{}", r.stderr);
    }
    let dir_err = headroom_run(&["replay", arg(dir.path())]);
    dir_err.expect(2, "is a directory");
    assert_eq!(dir_err.stderr.matches("directory").count(), 1, "{}", dir_err.stderr);
    let bom = write_file(dir.path(), "bom.jsonl", b"\xef\xbb\xbf{\"op\":\"empty_cache\"}\n");
    headroom_run(&["replay", arg(&bom)]).expect(0, "1 operations");
}

#[test]
fn snapshot_files_are_whole_or_absent_and_never_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_file(dir.path(), "t.jsonl", std::fs::read(gpt2_trace()).unwrap());
    let out = dir.path().join("s.pickle");
    headroom_run(&[
        "replay",
        arg(&t),
        "--alloc-conf",
        "",
        "--alloc-conf",
        "large_segment_size_mb:17592186044416",
        "--snapshot-out",
        arg(&out),
    ])
    .expect(2, "large_segment_size_mb");
    assert!(!out.exists(), "F1: no file after an error");
    let before = std::fs::read(&t).unwrap();
    headroom_run(&["replay", arg(&t), "--snapshot-out", arg(&t)]).expect(2, "is also the input");
    assert_eq!(std::fs::read(&t).unwrap(), before, "F3: the trace is untouched");
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&t, dir.path().join("link.jsonl")).unwrap();
        sh("$H replay link.jsonl --snapshot-out t.jsonl", dir.path()).expect(2, "is also the input");
        // F2: a write cut short by a file-size limit leaves nothing behind.
        let r = sh("ulimit -f 8; trap '' XFSZ; $H replay t.jsonl --snapshot-out cut.pickle", dir.path());
        r.expect(2, "File too large");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(!left.iter().any(|n| n.to_string_lossy().contains("cut.pickle")), "{left:?}");
    }
    // An existing file is replaced whole.
    headroom_run(&["replay", arg(&t), "--snapshot-out", arg(&out)]).expect(0, "snapshot written");
    assert_eq!(&std::fs::read(&out).unwrap()[..2], &[0x80, 4]);
}
