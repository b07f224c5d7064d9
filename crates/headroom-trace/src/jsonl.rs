//! headroom's plain trace format: JSON Lines, one operation per line.
//!
//! ```text
//! {"op":"alloc","id":7,"size":4096,"stream":0}
//! {"op":"record_stream","id":7,"stream":1}
//! {"op":"free","id":7}
//! {"op":"complete_events"}
//! {"op":"empty_cache"}
//! {"op":"set_fraction","value":0.5}
//! ```
//!
//! `id` is any number or string naming an allocation; `stream` defaults to
//! 0. Blank lines are skipped, and a UTF-8 byte-order mark at the start of
//! the file. Anything else — an unknown op, a missing, mistyped, unknown or
//! repeated field, a line that is not UTF-8 — is an error naming the line.

use headroom_alloc::MempoolId;
use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;
use std::fmt;
use std::io::{BufRead, Read};

/// An allocation's name in a trace.
pub type TraceId = String;

/// One operation.
#[derive(Clone, Debug, PartialEq)]
pub enum TraceOp {
    Alloc {
        id: TraceId,
        size: u64,
        stream: u64,
    },
    Free {
        id: TraceId,
    },
    RecordStream {
        id: TraceId,
        stream: u64,
    },
    /// An allocation in a private pool (a CUDA graph's, a `torch.cuda.MemPool`'s),
    /// made if it does not exist: `alloc` with `pool`.
    AllocInPool {
        id: TraceId,
        size: u64,
        stream: u64,
        pool: MempoolId,
    },
    /// The pool's last user is gone (a graph reset, a `MemPool` deleted): its
    /// cached segments go back at the next `empty_cache`.
    ReleasePool {
        pool: MempoolId,
    },
    /// Every pending cross-stream event completes.
    CompleteEvents,
    EmptyCache,
    /// `empty_cache` of one released pool (`emptyCache(mempool_id)`): `empty_cache` with `pool`.
    EmptyPool {
        pool: MempoolId,
    },
    SetFraction {
        value: f64,
    },
}

/// An operation with the line it came from (1-based).
#[derive(Clone, Debug, PartialEq)]
pub struct TraceLine {
    pub line: usize,
    pub op: TraceOp,
}

/// A trace that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("line {line}: {message}")]
    Parse { line: usize, message: String },
    /// The reader failed (the message carries the system's error, which is not repeated as a source).
    #[error("reading the trace: {0}")]
    Io(std::io::Error),
}

fn perr(line: usize, message: impl Into<String>) -> TraceError {
    TraceError::Parse { line, message: message.into() }
}

/// The longest line read: an event takes a few dozen bytes, and without a bound a file
/// with no newline (`/dev/zero`) is read into memory until the process aborts. The pickle
/// reader bounds its strings the same way.
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// Reads a whole trace.
pub fn read_trace<R: BufRead>(mut reader: R) -> Result<Vec<TraceLine>, TraceError> {
    let mut out: Vec<TraceLine> = Vec::new();
    let mut buf = Vec::new();
    let mut n = 0;
    let mut shape_seen = false;
    loop {
        buf.clear();
        let read = (&mut reader).take(MAX_LINE_BYTES as u64 + 1).read_until(b'\n', &mut buf);
        if read.map_err(TraceError::Io)? == 0 {
            break;
        }
        n += 1;
        if buf.len() > MAX_LINE_BYTES {
            return Err(perr(n, format!("longer than {} MiB: not a trace event", MAX_LINE_BYTES >> 20)));
        }
        // A trace too long for memory is an error to report, not an abort.
        if out.len() == out.capacity() && out.try_reserve(out.len().max(1024)).is_err() {
            return Err(TraceError::Io(std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                format!("out of memory after {} events", out.len()),
            )));
        }
        let bytes = if n == 1 { buf.strip_prefix(b"\xef\xbb\xbf").unwrap_or(&buf) } else { &buf[..] };
        let text = std::str::from_utf8(bytes).map_err(|e| {
            perr(
                n,
                format!(
                    "not valid UTF-8: byte {} of the line is 0x{:02x}",
                    e.valid_up_to() + 1,
                    bytes[e.valid_up_to()]
                ),
            )
        })?;
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        if out.is_empty() && !shape_seen && shape_line(text, n)?.is_some() {
            // A step program's shape, what `headroom plan --program` reads: no operation.
            shape_seen = true;
            continue;
        }
        if out.is_empty() && compiled_line(text, n)? {
            // A step program's note that it was recorded compiled, before its operations.
            continue;
        }
        if is_kernel(text, n)? {
            continue;
        }
        out.push(TraceLine { line: n, op: parse_line(text, n)? });
    }
    Ok(out)
}

/// A step program's first line, `{"op":"shape","batch":B,"seq":S}`: the micro-batch and
/// sequence length it was recorded at; `Ok(None)` for any other line.
pub fn shape_line(text: &str, line: usize) -> Result<Option<(u64, u64)>, TraceError> {
    let Ok(fields) = serde_json::from_str::<Fields>(text) else { return Ok(None) };
    if fields.get("op").and_then(Value::as_str) != Some("shape") {
        return Ok(None);
    }
    let f = Line { fields: &fields, line };
    f.only(&["op", "batch", "seq"])?;
    Ok(Some((f.uint("batch", "")?, f.uint("seq", "")?)))
}

/// Whether the line is a step program's `{"op":"compiled"}`: its step was recorded under
/// `torch.compile` (what `headroom plan --program` says of its step time), no operation.
pub fn compiled_line(text: &str, line: usize) -> Result<bool, TraceError> {
    if !text.contains("\"compiled\"") {
        return Ok(false);
    }
    let Ok(fields) = serde_json::from_str::<Fields>(text) else { return Ok(false) };
    if fields.get("op").and_then(Value::as_str) != Some("compiled") {
        return Ok(false);
    }
    Line { fields: &fields, line }.only(&["op"])?;
    Ok(true)
}

/// The fields of one line in the order written; a repeated key is an error
/// (JSON leaves it undefined, and taking the last one would replay a different program).
struct Fields(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Fields, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Fields;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#"a JSON object like {"op":"alloc",...}"#)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Fields, A::Error> {
                let mut fields: Vec<(String, Value)> = Vec::new();
                while let Some(k) = m.next_key::<String>()? {
                    if fields.iter().any(|(seen, _)| *seen == k) {
                        return Err(de::Error::custom(format!("`{k}` is given twice")));
                    }
                    let v = m.next_value()?;
                    fields.push((k, v));
                }
                Ok(Fields(fields))
            }
        }
        d.deserialize_map(V)
    }
}

impl Fields {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

/// Whether the line is a `kernel` line: a step program's note of a kernel its step ran (what
/// `headroom plan --program` times a recording by), which holds no allocator operation and
/// which the replay skips. Its fields are the planner's to read.
fn is_kernel(text: &str, line: usize) -> Result<bool, TraceError> {
    if !text.contains("\"kernel\"") {
        return Ok(false);
    }
    let fields: Fields = match serde_json::from_str(text) {
        Ok(f) => f,
        // Not JSON: parse_line says why.
        Err(_) => return Ok(false),
    };
    match fields.get("op") {
        Some(Value::String(s)) if s == "kernel" => match fields.get("name") {
            Some(Value::String(_)) => Ok(true),
            _ => Err(perr(line, "a kernel line needs `name`, its operator")),
        },
        _ => Ok(false),
    }
}

/// Parses one line.
pub fn parse_line(text: &str, line: usize) -> Result<TraceOp, TraceError> {
    let fields: Fields = serde_json::from_str(text).map_err(|e| {
        let m = e.to_string();
        if e.is_data() {
            // A wrong shape or a repeated key: the message says it; drop serde's position.
            perr(line, m.split(" at line ").next().unwrap_or(&m).to_string())
        } else {
            perr(line, format!("not valid JSON: {m}"))
        }
    })?;
    let op = match fields.get("op") {
        Some(Value::String(s)) => s.as_str(),
        Some(v) => return Err(perr(line, format!("`op` must be a string, got {v}"))),
        None => return Err(perr(line, "missing `op`")),
    };
    let f = Line { fields: &fields, line };
    let parsed = match op {
        "alloc" => {
            f.only(&["op", "id", "size", "stream", "pool"])?;
            let (id, size, stream) = (f.id()?, f.uint("size", " of bytes")?, f.stream()?);
            match f.pool()? {
                None | Some((0, 0)) => TraceOp::Alloc { id, size, stream },
                Some(pool) => TraceOp::AllocInPool { id, size, stream, pool },
            }
        }
        "release_pool" => {
            f.only(&["op", "pool"])?;
            match f.pool()? {
                Some(pool) if pool != (0, 0) => TraceOp::ReleasePool { pool },
                _ => return Err(perr(line, "release_pool needs `pool`, a private pool's [a, b], not [0, 0]")),
            }
        }
        "free" => {
            f.only(&["op", "id"])?;
            TraceOp::Free { id: f.id()? }
        }
        "record_stream" => {
            f.only(&["op", "id", "stream"])?;
            if fields.get("stream").is_none() {
                return Err(perr(line, "record_stream needs `stream`"));
            }
            TraceOp::RecordStream { id: f.id()?, stream: f.stream()? }
        }
        "complete_events" => {
            f.only(&["op"])?;
            TraceOp::CompleteEvents
        }
        "empty_cache" => {
            f.only(&["op", "pool"])?;
            match f.pool()? {
                None | Some((0, 0)) => TraceOp::EmptyCache,
                Some(pool) => TraceOp::EmptyPool { pool },
            }
        }
        "set_fraction" => {
            f.only(&["op", "value"])?;
            let value = match fields.get("value") {
                Some(Value::Number(n)) => n.as_f64().unwrap_or(f64::NAN),
                Some(_) => return Err(perr(line, "`value` must be a number")),
                None => return Err(perr(line, "set_fraction needs `value`")),
            };
            if !(0.0..=1.0).contains(&value) {
                return Err(perr(line, format!("`value` {value} is outside [0, 1]")));
            }
            TraceOp::SetFraction { value }
        }
        "shape" => return Err(perr(line, "a step program's shape line comes first, before any operation")),
        other => {
            return Err(perr(
                line,
                format!(
                    "unknown op `{other}` (expected alloc, free, record_stream, complete_events, empty_cache, release_pool or set_fraction)"
                ),
            ))
        }
    };
    Ok(parsed)
}

struct Line<'a> {
    fields: &'a Fields,
    line: usize,
}

impl Line<'_> {
    fn only(&self, allowed: &[&str]) -> Result<(), TraceError> {
        match self.fields.0.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
            Some((k, _)) => Err(perr(self.line, format!("unknown field `{k}` (allowed here: {})", allowed.join(", ")))),
            None => Ok(()),
        }
    }

    /// `pool`, if given: a private pool's id as PyTorch writes a `MempoolId_t`, `[a, b]`.
    fn pool(&self) -> Result<Option<MempoolId>, TraceError> {
        let Some(v) = self.fields.get("pool") else { return Ok(None) };
        match v.as_array().map(|a| a.iter().map(Value::as_u64).collect::<Vec<_>>()).as_deref() {
            Some(&[Some(a), Some(b)]) => Ok(Some((a, b))),
            _ => Err(perr(self.line, format!("`pool` must be two non-negative whole numbers [a, b], got {v}"))),
        }
    }

    fn id(&self) -> Result<TraceId, TraceError> {
        match self.fields.get("id") {
            Some(Value::Number(n)) => Ok(n.to_string()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(perr(self.line, "`id` must be a number or a string")),
            None => Err(perr(self.line, "missing `id`")),
        }
    }

    /// A field that must be a whole number in `0..=u64::MAX`; `unit` follows "whole number" in messages.
    fn uint(&self, key: &str, unit: &str) -> Result<u64, TraceError> {
        match self.fields.get(key) {
            Some(Value::Number(n)) => n.as_u64().ok_or_else(|| {
                let x = n.as_f64().unwrap_or(f64::NAN);
                let why = if x >= 18_446_744_073_709_551_615.0 {
                    format!("is out of range: {n} is more than 2^64 − 1 ({})", u64::MAX)
                } else {
                    format!("must be a non-negative whole number{unit}, got {n}")
                };
                perr(self.line, format!("`{key}` {why}"))
            }),
            Some(v) => Err(perr(self.line, format!("`{key}` must be a number, got {v}"))),
            None => Err(perr(self.line, format!("missing `{key}`"))),
        }
    }

    fn stream(&self) -> Result<u64, TraceError> {
        if self.fields.get("stream").is_some() {
            self.uint("stream", "")
        } else {
            Ok(0)
        }
    }
}

/// Writes one operation as a JSONL line (without the newline).
pub fn format_op(op: &TraceOp) -> String {
    // A number only where the id is one as the reader writes numbers: "+0" or "007" parse as
    // numbers but are other ids than 0 and 7, and stay strings.
    let id = |id: &str| match id.parse::<u64>() {
        Ok(n) if n.to_string() == id => id.to_string(),
        _ => Value::String(id.to_string()).to_string(),
    };
    match op {
        TraceOp::Alloc { id: i, size, stream: 0 } => format!(r#"{{"op":"alloc","id":{},"size":{size}}}"#, id(i)),
        TraceOp::Alloc { id: i, size, stream } => {
            format!(r#"{{"op":"alloc","id":{},"size":{size},"stream":{stream}}}"#, id(i))
        }
        TraceOp::Free { id: i } => format!(r#"{{"op":"free","id":{}}}"#, id(i)),
        TraceOp::RecordStream { id: i, stream } => {
            format!(r#"{{"op":"record_stream","id":{},"stream":{stream}}}"#, id(i))
        }
        TraceOp::AllocInPool { id: i, size, stream, pool: (a, b) } => {
            format!(r#"{{"op":"alloc","id":{},"size":{size},"stream":{stream},"pool":[{a},{b}]}}"#, id(i))
        }
        TraceOp::ReleasePool { pool: (a, b) } => format!(r#"{{"op":"release_pool","pool":[{a},{b}]}}"#),
        TraceOp::CompleteEvents => r#"{"op":"complete_events"}"#.to_string(),
        TraceOp::EmptyCache => r#"{"op":"empty_cache"}"#.to_string(),
        TraceOp::EmptyPool { pool: (a, b) } => format!(r#"{{"op":"empty_cache","pool":[{a},{b}]}}"#),
        TraceOp::SetFraction { value } => format!(r#"{{"op":"set_fraction","value":{value}}}"#),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step program's shape line is skipped where it comes first, and refused elsewhere.
    #[test]
    fn a_step_programs_shape_line_is_no_operation() {
        let t = read_trace(&b"\n{\"op\":\"shape\",\"batch\":4,\"seq\":1024}\n{\"op\":\"empty_cache\"}\n"[..]).unwrap();
        assert_eq!(t, vec![TraceLine { line: 3, op: TraceOp::EmptyCache }]);
        assert_eq!(shape_line("{\"op\":\"shape\",\"batch\":4,\"seq\":1024}", 1).unwrap(), Some((4, 1024)));
        let e = read_trace(&b"{\"op\":\"shape\",\"batch\":4}\n"[..]).unwrap_err().to_string();
        assert!(e.contains("missing `seq`"), "{e}");
        let twice = b"{\"op\":\"shape\",\"batch\":4,\"seq\":8}\n{\"op\":\"shape\",\"batch\":4,\"seq\":8}\n";
        let e = read_trace(&twice[..]).unwrap_err().to_string();
        assert!(e.contains("line 2: a step program's shape line comes first"), "{e}");
    }

    /// A step program's compiled line, before its operations, is a note for the planner: the
    /// replay skips it; after an operation, or with a field of its own, it is refused.
    #[test]
    fn a_step_programs_compiled_line_is_no_operation() {
        let text = b"{\"op\":\"shape\",\"batch\":4,\"seq\":8}\n{\"op\":\"compiled\"}\n{\"op\":\"empty_cache\"}\n";
        let t = read_trace(&text[..]).unwrap();
        assert_eq!(t, vec![TraceLine { line: 3, op: TraceOp::EmptyCache }]);
        let after = b"{\"op\":\"empty_cache\"}\n{\"op\":\"compiled\"}\n";
        let e = read_trace(&after[..]).unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
        let e = read_trace(&b"{\"op\":\"compiled\",\"graphs\":2}\n"[..]).unwrap_err().to_string();
        assert!(e.contains("graphs"), "{e}");
    }

    /// A step program's kernel lines are notes for the planner's time: the replay skips them.
    #[test]
    fn kernel_lines_are_skipped() {
        let text = concat!(
            r#"{"op":"alloc","id":"0 step1.forward activations kernel","size":8}"#,
            "\n",
            r#"{"op":"kernel","at":"step1.forward","name":"aten::mm","flops":2,"bytes":12,"dtype":"bf16","mnk":[1,1,1],"batch":1}"#,
            "\n",
            r#"{"op":"free","id":"0 step1.forward activations kernel"}"#,
            "\n"
        );
        let t = read_trace(text.as_bytes()).unwrap();
        assert_eq!(t.iter().map(|l| l.line).collect::<Vec<_>>(), [1, 3]);
        let e = read_trace(&br#"{"op":"kernel","flops":1}"#[..]).unwrap_err().to_string();
        assert!(e.contains("line 1: a kernel line needs `name`"), "{e}");
    }

    /// A number is read as the double nearest its digits, so a value written back (in the
    /// shortest digits that read as it) reads as the same value.
    #[test]
    fn a_fraction_reads_back_as_the_value_written() {
        let text = r#"{"op":"set_fraction","value":0.001507263340988304563}"#;
        let op = parse_line(text, 1).unwrap();
        // Rust's parser gives the nearest double.
        let nearest: f64 = "0.001507263340988304563".parse().unwrap();
        assert_eq!(op, TraceOp::SetFraction { value: nearest });
        assert_eq!(parse_line(&format_op(&op), 1).unwrap(), op);
    }

    /// An id written and read back is the same id: a string that only parses as a number
    /// ("+0", "007") stays a string, and a number's digits stay a number.
    #[test]
    fn ids_read_back_as_the_ids_written() {
        for id in ["0", "7", "18446744073709551615", "+0000000000000000000", "007", "-1", "1.5", "a b"] {
            let op = TraceOp::Free { id: id.to_string() };
            assert_eq!(parse_line(&format_op(&op), 1).unwrap(), op, "{id:?}");
        }
        assert_eq!(format_op(&TraceOp::Free { id: "7".into() }), r#"{"op":"free","id":7}"#);
    }

    #[test]
    fn reads_every_op_with_defaults() {
        let text = "{\"op\":\"alloc\",\"id\":1,\"size\":4096}\n\n{\"op\":\"alloc\",\"id\":\"w.q\",\"size\":10,\"stream\":2}\n\
                    {\"op\":\"record_stream\",\"id\":1,\"stream\":1}\n{\"op\":\"free\",\"id\":1}\n{\"op\":\"complete_events\"}\n\
                    {\"op\":\"empty_cache\"}\n{\"op\":\"set_fraction\",\"value\":0.5}\n";
        let t = read_trace(text.as_bytes()).unwrap();
        assert_eq!(t.len(), 7);
        assert_eq!(t[0].op, TraceOp::Alloc { id: "1".into(), size: 4096, stream: 0 });
        assert_eq!(t[1].line, 3, "blank lines are skipped but counted");
        assert_eq!(t[1].op, TraceOp::Alloc { id: "w.q".into(), size: 10, stream: 2 });
        assert_eq!(t[6].op, TraceOp::SetFraction { value: 0.5 });
        for l in &t {
            assert_eq!(parse_line(&format_op(&l.op), 1).unwrap(), l.op);
        }
    }

    #[test]
    fn errors_name_the_line_and_the_problem() {
        for (text, needle) in [
            ("{\"op\":\"malloc\",\"id\":1,\"size\":1}", "unknown op `malloc`"),
            ("{\"op\":\"alloc\",\"id\":1}", "missing `size`"),
            ("{\"op\":\"alloc\",\"id\":1,\"size\":-4}", "non-negative"),
            ("{\"op\":\"alloc\",\"id\":1,\"size\":1,\"szie\":2}", "unknown field `szie`"),
            ("{\"op\":\"free\"}", "missing `id`"),
            ("{\"op\":\"set_fraction\",\"value\":2}", "outside [0, 1]"),
            ("{\"op\":\"record_stream\",\"id\":1}", "needs `stream`"),
            ("[1,2]", "expected a JSON object"),
            ("{\"op\":\"alloc\",", "not valid JSON"),
            ("{\"op\":\"alloc\",\"id\":1,\"size\":4096,\"size\":8192}", "`size` is given twice"),
            ("{\"op\":\"alloc\",\"op\":\"free\",\"id\":1}", "`op` is given twice"),
            (
                "{\"op\":\"alloc\",\"id\":1,\"size\":1,\"stream\":-1}",
                "`stream` must be a non-negative whole number, got -1",
            ),
            ("{\"op\":\"alloc\",\"id\":1,\"size\":18446744073709551616}", "`size` is out of range"),
            ("{\"op\":\"alloc\",\"id\":1,\"size\":1.5}", "whole number of bytes, got 1.5"),
            ("{\"op\":5}", "`op` must be a string, got 5"),
        ] {
            let input = format!("{{\"op\":\"empty_cache\"}}\n{text}\n");
            let e = read_trace(input.as_bytes()).unwrap_err().to_string();
            assert!(e.starts_with("line 2: ") && e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn a_byte_order_mark_is_skipped_and_bad_utf8_is_named_by_line() {
        let t = read_trace(&b"\xef\xbb\xbf{\"op\":\"empty_cache\"}\n"[..]).unwrap();
        assert_eq!(t[0].op, TraceOp::EmptyCache);
        let bad = b"{\"op\":\"empty_cache\"}\n\n\n\n\xc3\x28\n";
        let e = read_trace(&bad[..]).unwrap_err().to_string();
        assert_eq!(e, "line 5: not valid UTF-8: byte 1 of the line is 0xc3");
        let e = read_trace(&b"{\"op\":\"empty_cache\"}\n\x00\xff\xfe"[..]).unwrap_err().to_string();
        assert!(e.starts_with("line 2: "), "{e}");
    }

    /// Finding A6 of the hostile-input sweep: `/dev/zero`, or a file with no newline, was
    /// read into one line until the process ran out of memory and aborted. An endless line
    /// is refused once it passes the bound, having read no more than that.
    #[test]
    fn a_line_without_end_is_refused_at_the_bound_not_read_until_memory_runs_out() {
        let mut endless = std::io::BufReader::new(std::io::repeat(b'a'));
        let e = read_trace(&mut endless).unwrap_err().to_string();
        assert_eq!(e, "line 1: longer than 64 MiB: not a trace event");
        // A line of the bound, its newline included, is read and judged for what it says.
        let mut long = vec![b'a'; MAX_LINE_BYTES - 1];
        long.push(b'\n');
        let e = read_trace(&long[..]).unwrap_err().to_string();
        assert!(e.starts_with("line 1: ") && !e.contains("longer than"), "{e}");
    }
}
