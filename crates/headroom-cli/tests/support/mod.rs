//! What the command-line tests share: running `headroom` as a user does and checking that
//! nothing panics, and building memory snapshots (pickled as PyTorch writes them) to mutate.
//! Most inputs mutate one base snapshot: one 20 MiB segment holding a live 4 MiB block, and
//! five 8 MiB allocations freed in turn.
#![allow(dead_code)]

use assert_cmd::Command;
use headroom_trace::py::write_pickle;
pub use headroom_trace::py::Py;
pub use serde_json::Value;
pub use std::path::{Path, PathBuf};
pub use std::time::{Duration, Instant};

pub const M: u64 = 1 << 20;
pub const B: u64 = 0x7f00_0000_0000;

/// What a run printed.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Asserts the exit status and that `needle` is in stdout or stderr.
    pub fn expect(&self, code: i32, needle: &str) -> &Run {
        assert_eq!(self.code, code, "exit status\nstdout: {}\nstderr: {}", self.stdout, self.stderr);
        assert!(
            self.stdout.contains(needle) || self.stderr.contains(needle),
            "{needle:?} not in\nstdout: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        self
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {}", self.stdout))
    }
}

pub fn headroom_in<S: AsRef<std::ffi::OsStr>>(dir: &Path, args: &[S]) -> Run {
    let out = Command::cargo_bin("headroom").unwrap().args(args).current_dir(dir).output().unwrap();
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(!run.stderr.contains("panicked") && ![101, 134, -1].contains(&run.code), "{}", run.stderr);
    run
}

/// `bash -c SCRIPT` with `$H` the binary, for pipes, full disks, memory and time limits
/// (`pipefail` on, so a pipeline's status is headroom's).
pub fn sh(script: &str, dir: &Path) -> Run {
    let bin = assert_cmd::cargo::cargo_bin("headroom");
    let script = format!("set -o pipefail; {script}");
    let out = std::process::Command::new("bash").arg("-c").arg(script).env("H", bin).current_dir(dir).output().unwrap();
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    run
}

pub fn frames() -> Py {
    Py::List(vec![
        Py::dict([("filename", Py::str("train.py")), ("line", Py::Int(10)), ("name", Py::str("step"))]),
        Py::dict([("filename", Py::str("model.py")), ("line", Py::Int(5)), ("name", Py::str("forward"))]),
    ])
}

pub fn ev(action: &str, addr: u64, size: u64, t: i64) -> Vec<(&'static str, Py)> {
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
pub struct Snap {
    pub segments: Vec<Vec<(&'static str, Py)>>,
    pub blocks: Vec<Vec<(&'static str, Py)>>,
    pub trace: Vec<Vec<(&'static str, Py)>>,
    pub settings: Vec<(&'static str, Py)>,
}

pub fn base() -> Snap {
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
    pub fn py(&self) -> Py {
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

    pub fn pickle(&self, dir: &Path, name: &str) -> PathBuf {
        pickle_file(dir, name, &self.py())
    }
}

pub fn pickle_file(dir: &Path, name: &str, v: &Py) -> PathBuf {
    let mut buf = Vec::new();
    write_pickle(v, &mut buf).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, buf).unwrap();
    p
}

pub fn set(fields: &mut [(&'static str, Py)], key: &str, v: Py) {
    fields.iter_mut().find(|(k, _)| *k == key).unwrap_or_else(|| panic!("no {key}")).1 = v;
}

/// A pickle written opcode by opcode, for what [`write_pickle`] never
/// writes: one object referred to twice through the memo.
#[derive(Default)]
pub struct Raw {
    pub bytes: Vec<u8>,
    pub memo: u32,
}

impl Raw {
    pub fn new() -> Raw {
        Raw { bytes: vec![0x80, 4], memo: 0 }
    }
    pub fn str(&mut self, s: &str) -> &mut Raw {
        self.bytes.extend([0x8c, s.len() as u8]);
        self.bytes.extend(s.as_bytes());
        self
    }
    pub fn int(&mut self, v: u64) -> &mut Raw {
        self.bytes.push(0x8a);
        self.bytes.push(9);
        self.bytes.extend(v.to_le_bytes());
        self.bytes.push(0);
        self
    }
    pub fn op(&mut self, ops: &[u8]) -> &mut Raw {
        self.bytes.extend(ops);
        self
    }
    /// MEMOIZE: the value on top gets the next memo index, returned.
    pub fn put(&mut self) -> u32 {
        self.bytes.push(0x94);
        self.memo += 1;
        self.memo - 1
    }
    /// LONG_BINGET.
    pub fn get(&mut self, i: u32) -> &mut Raw {
        self.bytes.push(b'j');
        self.bytes.extend(i.to_le_bytes());
        self
    }
    /// A trace entry dict (EMPTY_DICT, MARK, the pairs, SETITEMS).
    pub fn entry(&mut self, action: &str, addr: u64, size: u64) -> &mut Raw {
        self.op(b"}(").str("action").str(action).str("addr").int(addr).str("size").int(size);
        self.str("stream").int(0).str("time_us").int(1).str("frames").op(b"]").op(b"u")
    }
    pub fn done(&mut self) -> Vec<u8> {
        self.bytes.push(b'.');
        std::mem::take(&mut self.bytes)
    }
}

/// Runs `script` and asserts it ends within `limit` with `code`.
pub fn within(script: &str, d: &Path, limit: u64, code: i32) {
    let t = Instant::now();
    let r = sh(&format!("timeout {limit} {script}"), d);
    assert_eq!(r.code, code, "{script}: {}{}", r.stdout, r.stderr);
    assert!(t.elapsed() < Duration::from_secs(limit), "{script} took {:?}", t.elapsed());
}

pub fn entry_json(action: &str, addr: u64, size: u64, stream: u64, t: u64) -> String {
    format!(r#"{{"action":"{action}","addr":{addr},"size":{size},"stream":{stream},"time_us":{t},"frames":[]}}"#)
}

pub fn snapshot_json(segments: &[String], trace: &[String]) -> String {
    format!(r#"{{"segments":[{}],"device_traces":[[{}]]}}"#, segments.join(","), trace.join(","))
}

pub fn segment_json(addr: u64, size: u64, stream: u64, blocks: &[(u64, u64, &str)]) -> String {
    pool_segment_json("large", addr, size, stream, blocks)
}

pub fn pool_segment_json(pool: &str, addr: u64, size: u64, stream: u64, blocks: &[(u64, u64, &str)]) -> String {
    let blocks: Vec<String> = blocks
        .iter()
        .map(|(a, s, st)| format!(r#"{{"address":{a},"size":{s},"requested_size":{s},"state":"{st}","frames":[]}}"#))
        .collect();
    format!(
        r#"{{"device":0,"address":{addr},"total_size":{size},"stream":{stream},"segment_type":"{pool}","blocks":[{}]}}"#,
        blocks.join(",")
    )
}

/// A file of the repository's `data/`.
pub fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data").join(rel)
}

/// GPT-2 small's layers as a checkpoint chain.
pub fn gpt2_chain() -> PathBuf {
    data("chains/gpt2-small-layers.json")
}

/// GPT-2 small's training step as a JSONL trace.
pub fn gpt2_trace() -> PathBuf {
    data("traces/gpt2-small-train.jsonl")
}

/// `headroom ARGS`, run where the tests run.
pub fn headroom_run<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Run {
    headroom_in(Path::new("."), args)
}

pub fn write_file(dir: &Path, name: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// A Llama 3 8B config.json, with `extra` fields after the others.
pub fn llama_config(extra: &str) -> String {
    format!(
        r#"{{"model_type":"llama","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"intermediate_size":14336,"vocab_size":128256,"max_position_embeddings":8192{extra}}}"#
    )
}

/// A path as an argument (the test directories' paths are UTF-8).
pub fn arg(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// Plans `job` (`headroom plan`'s arguments) with `--json` and as text, and asserts that the
/// answer replays the recorded step `want` through transformers' builder, saying so in both;
/// an answer either way (fits or not). Returns the JSON answer and the text.
pub fn assert_replays(job: &[String], want: &str) -> (Value, String) {
    let json = headroom_run(&[&["plan".to_string()], job, &["--json".to_string()]].concat());
    assert!(json.code < 2, "{job:?}: {}", json.stderr);
    let p = json.json();
    assert_eq!(p["runner"]["builder"], "transformers", "{job:?}: {}", p["runner"]);
    assert_eq!(p["program"]["source"], "recorded", "{job:?}: {}", p["program"]);
    assert_eq!(p["program"]["template"], want, "{job:?}: {}", p["program"]);
    let text = headroom_run(&[&["plan".to_string()], job].concat());
    assert!(text.stdout.contains(&format!("recorded as {want}")), "{job:?}: {}", text.stdout);
    (p, text.stdout)
}
