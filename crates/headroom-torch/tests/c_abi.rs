//! The C functions PyTorch loads, called as PyTorch calls them, over the
//! simulated GPU: from Rust through the same symbols, and from Python with
//! ctypes through the built shared library.

#[path = "../../../tests/support/skip.rs"]
mod skip;

use headroom_torch::{
    headroom_dump_snapshot, headroom_empty_cache, headroom_free, headroom_malloc, headroom_memory_stats_json,
    headroom_record_history,
};
use serde_json::Value;
use std::ffi::{c_void, CString};
use std::sync::Once;

const MIB: usize = 1 << 20;

/// Settings are read once per process, at the first call: every test sets
/// the same ones first.
fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_var("HEADROOM_TORCH_BACKEND", "sim");
        std::env::set_var("HEADROOM_POLICY", "headroom");
        std::env::set_var("HEADROOM_TORCH_SIM_BYTES", "2GiB");
        headroom_record_history(100_000);
    });
}

fn stats(device: i32) -> Value {
    let mut buf = vec![0u8; 1 << 16];
    // SAFETY: the buffer is as long as we say.
    let n = unsafe { headroom_memory_stats_json(device, buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n > 0 && (n as usize) < buf.len(), "stats of device {device}: {n}");
    serde_json::from_slice(&buf[..n as usize]).unwrap()
}

fn stream(s: usize) -> *mut c_void {
    s as *mut c_void
}

#[test]
fn allocations_round_trip_and_the_statistics_follow() {
    setup();
    // SAFETY: streams are only compared; pointers come from headroom_malloc.
    unsafe {
        let p = headroom_malloc(3 * MIB + 5, 0, stream(0));
        assert!(!p.is_null());
        let q = headroom_malloc(4096, 0, stream(0x55aa));
        assert!(!q.is_null() && q != p);
        let s = stats(0);
        assert!(s["allocated_bytes.all.current"].as_i64().unwrap() >= (3 * MIB + 5 + 4096) as i64);
        headroom_free(p, 3 * MIB + 5, 0, stream(0));
        headroom_free(q, 4096, 0, stream(0x55aa));
    }
    assert_eq!(stats(0)["allocated_bytes.all.current"], 0);
}

#[test]
fn threads_on_several_devices_share_the_plug_in() {
    setup();
    let workers: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let device = 1 + (t % 2) as i32;
                let mut live = Vec::new();
                for i in 0..2000usize {
                    let size = (i * 7919 + t * 104_729) % (24 * MIB) + 1;
                    // SAFETY: pointers come from headroom_malloc and are freed once.
                    unsafe {
                        let p = headroom_malloc(size, device, stream(t + 1));
                        assert!(!p.is_null(), "thread {t}: {size} B");
                        live.push((p as usize, size));
                        // At most about 32 live per thread: 2 threads share a 2 GiB device.
                        if i % 3 != 0 || live.len() > 32 {
                            let (p, s) = live.swap_remove(i % live.len());
                            headroom_free(p as *mut c_void, s, device, stream(t + 1));
                        }
                    }
                }
                for (p, s) in live {
                    // SAFETY: as above.
                    unsafe { headroom_free(p as *mut c_void, s, device, stream(t + 1)) };
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    for device in [1, 2] {
        let s = stats(device);
        assert_eq!(s["allocated_bytes.all.current"], 0, "device {device}");
        assert!(s["num_alloc_retries"].as_i64().is_some());
    }
}

#[test]
fn failures_are_answered_not_raised() {
    setup();
    // SAFETY: nothing here is dereferenced.
    unsafe {
        assert!(headroom_malloc(3 << 30, 3, stream(0)).is_null(), "more than the 2 GiB device");
        assert!(!headroom_malloc(MIB, 3, stream(0)).is_null(), "the device still serves");
        assert!(headroom_malloc(MIB, -1, stream(0)).is_null());
        assert!(headroom_malloc(MIB, 64, stream(0)).is_null());
        headroom_free(0xdead_0000 as *mut c_void, 16, 3, stream(0));
        assert_eq!(headroom_memory_stats_json(-2, std::ptr::null_mut(), 0), -1);
        assert_eq!(headroom_dump_snapshot(std::ptr::null()), -1);
    }
}

#[test]
fn a_snapshot_in_pytorchs_format_is_written() {
    setup();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plugin.pickle");
    // SAFETY: as in the tests above; the path is NUL-terminated.
    unsafe {
        let p = headroom_malloc(5 * MIB, 4, stream(0));
        assert!(!p.is_null());
        let c = CString::new(path.to_str().unwrap()).unwrap();
        assert_eq!(headroom_dump_snapshot(c.as_ptr()), 0);
        headroom_free(p, 5 * MIB, 4, stream(0));
        headroom_empty_cache();
    }
    let snap = headroom_trace::snapshot::read_snapshot_file(&path).unwrap();
    assert!(snap.devices().contains(&4), "{:?}", snap.devices());
    let trace = &snap.device_traces[4];
    assert!(trace.iter().any(|e| e.action == headroom_trace::snapshot::TraceAction::Alloc && e.size == 5 * MIB as u64));
    assert_eq!(stats(4)["reserved_bytes.all.current"], 0, "empty_cache gave everything back");
}

/// The shared library, built for the profile these tests run under: `cargo
/// test` builds the crate as an rlib only.
fn shared_library() -> std::path::PathBuf {
    static BUILT: Once = Once::new();
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap().to_path_buf();
    BUILT.call_once(|| {
        let mut cargo = std::process::Command::new(env!("CARGO"));
        cargo.args(["build", "-q", "-p", "headroom-torch", "--lib"]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cargo.arg("--release");
        }
        let status = cargo.status().expect("cargo runs");
        assert!(status.success(), "building the shared library failed");
    });
    let lib = dir.join(format!("{}headroom_torch{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX));
    assert!(lib.exists(), "{} was not built", lib.display());
    lib
}

/// The library loaded in Python as `lib`, with the C signatures declared.
const PRELUDE: &str = r#"
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
lib.headroom_malloc.restype = ctypes.c_void_p
lib.headroom_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.headroom_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.headroom_memory_stats_json.restype = ctypes.c_ssize_t
lib.headroom_memory_stats_json.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
"#;

/// Runs [`PRELUDE`] then `script` in Python, with the shared library's path as its argument;
/// `None` (said) where no Python runs.
fn python(script: &str, env: &[(&str, Option<&str>)]) -> Option<std::process::Output> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let mut cmd = std::process::Command::new(&python);
    cmd.args(["-c", &format!("{PRELUDE}{script}")]).arg(shared_library());
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    match cmd.output() {
        Ok(o) => Some(o),
        Err(e) => {
            skip::skip(&format!("{python} cannot run ({e})"));
            None
        }
    }
}

/// The shared library itself, loaded by Python's ctypes as PyTorch loads it.
#[test]
fn python_loads_the_shared_library() {
    let script = r#"
p = lib.headroom_malloc(1 << 20, 0, None)
assert p, "null"
buf = ctypes.create_string_buffer(1 << 16)
n = lib.headroom_memory_stats_json(0, buf, len(buf))
s = json.loads(buf.value[:n])
assert s["allocated_bytes.all.current"] == 1 << 20, s["allocated_bytes.all.current"]
lib.headroom_free(p, 1 << 20, 0, None)
print("ok")
"#;
    let env = [("HEADROOM_TORCH_BACKEND", Some("sim")), ("HEADROOM_TORCH_SIM_BYTES", Some("1GiB"))];
    let Some(out) = python(script, &env) else { return };
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}

/// A backend that cannot run is refused clearly: null, and a message naming
/// what is missing, once. On the default `cuda` backend without an NVIDIA
/// driver that is the driver; a backend name it does not know, anywhere.
#[test]
fn without_a_backend_it_says_so() {
    let script = r#"
assert not lib.headroom_malloc(4096, 0, None)
assert not lib.headroom_malloc(4096, 0, None)
print("refused")
"#;
    let mut cases = vec![(Some("none"), "HEADROOM_TORCH_BACKEND=none: expected cuda or sim".to_string())];
    if let Err(why) = headroom_cuda::available() {
        cases.push((None, why.to_string()));
    }
    for (backend, says) in cases {
        let Some(out) = python(script, &[("HEADROOM_TORCH_BACKEND", backend)]) else { return };
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.matches(&says).count(), 1, "said once: {err}");
    }
}

extern "C" {
    /// The C++ test driver in `cpp/filter.cpp`: calls a begin hook as PyTorch does.
    fn headroom_test_begin_as_pytorch(begin: *mut c_void, device: i32, a: u64, b: u64, accept: *mut c_void);
}

/// The segments of `device` in a snapshot the plug-in writes: (address, size, pool id).
fn segments(device: i64) -> Vec<(u64, u64, Value)> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("snap.json");
    let c = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { headroom_dump_snapshot(c.as_ptr()) }, 0);
    let snap: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let segs = snap["segments"].as_array().unwrap().iter().filter(|s| s["device"] == device);
    segs.map(|s| (s["address"].as_u64().unwrap(), s["total_size"].as_u64().unwrap(), s["segment_pool_id"].clone()))
        .collect()
}

/// A graph capture as PyTorch drives a pluggable allocator: the begin hook with a
/// std::function filter (called through the C++ ABI), requests on the capturing stream
/// in the graph's pool and others in the default pools, the end hook, and the release
/// hook after which a flush gives the graph's memory back.
#[test]
fn a_graph_capture_allocates_from_its_pool_through_pytorchs_hooks() {
    setup();
    let device = 7;
    let pool_of = |ptr: *mut c_void| {
        let p = ptr as u64;
        segments(device).into_iter().find(|s| s.0 <= p && p < s.0 + s.1).map(|s| s.2)
    };
    // SAFETY: the driver calls the hook with a live std::function, as PyTorch does; the
    // streams are only compared.
    unsafe {
        let begin = headroom_torch::headroom_begin_allocate_to_pool as *mut c_void;
        headroom_test_begin_as_pytorch(begin, device as i32, 3, 0, stream(0xcafe));
        let g = headroom_malloc(5 * MIB, device as i32, stream(0xcafe));
        let d = headroom_malloc(5 * MIB, device as i32, stream(0));
        assert!(!g.is_null() && !d.is_null());
        assert_eq!(pool_of(g), Some(serde_json::json!([3, 0])));
        assert_eq!(pool_of(d), Some(serde_json::json!([0, 0])));
        headroom_torch::headroom_end_allocate_to_pool(device as i32, 3, 0);
        headroom_free(g, 5 * MIB, device as i32, stream(0xcafe));
        headroom_free(d, 5 * MIB, device as i32, stream(0));
        headroom_empty_cache();
        assert_eq!(segments(device).len(), 1, "the graph's segment stays while the graph lives");
        headroom_torch::headroom_release_pool(device as i32, 3, 0);
        headroom_empty_cache();
        assert!(segments(device).is_empty(), "released, the graph's memory goes back");
    }
}
