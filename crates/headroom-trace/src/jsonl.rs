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
//! 0. Blank lines are skipped. Anything else — an unknown op, a missing or
//! mistyped field, an unknown field — is an error naming the line.

use serde_json::{Map, Value};
use std::io::BufRead;

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
    /// Every pending cross-stream event completes.
    CompleteEvents,
    EmptyCache,
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
    #[error("reading the trace: {0}")]
    Io(#[from] std::io::Error),
}

fn perr(line: usize, message: impl Into<String>) -> TraceError {
    TraceError::Parse { line, message: message.into() }
}

/// Reads a whole trace.
pub fn read_trace<R: BufRead>(reader: R) -> Result<Vec<TraceLine>, TraceError> {
    let mut out = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line?;
        let n = i + 1;
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        out.push(TraceLine { line: n, op: parse_line(text, n)? });
    }
    Ok(out)
}

/// Parses one line.
pub fn parse_line(text: &str, line: usize) -> Result<TraceOp, TraceError> {
    let value: Value = serde_json::from_str(text).map_err(|e| perr(line, format!("not valid JSON: {e}")))?;
    let Value::Object(obj) = value else {
        return Err(perr(line, "expected a JSON object like {\"op\":\"alloc\",...}"));
    };
    let op = match obj.get("op") {
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(perr(line, "`op` must be a string")),
        None => return Err(perr(line, "missing `op`")),
    };
    let f = Fields { obj: &obj, line };
    let parsed = match op {
        "alloc" => {
            f.only(&["op", "id", "size", "stream"])?;
            TraceOp::Alloc { id: f.id()?, size: f.uint("size")?, stream: f.stream()? }
        }
        "free" => {
            f.only(&["op", "id"])?;
            TraceOp::Free { id: f.id()? }
        }
        "record_stream" => {
            f.only(&["op", "id", "stream"])?;
            if !obj.contains_key("stream") {
                return Err(perr(line, "record_stream needs `stream`"));
            }
            TraceOp::RecordStream { id: f.id()?, stream: f.stream()? }
        }
        "complete_events" => {
            f.only(&["op"])?;
            TraceOp::CompleteEvents
        }
        "empty_cache" => {
            f.only(&["op"])?;
            TraceOp::EmptyCache
        }
        "set_fraction" => {
            f.only(&["op", "value"])?;
            let value = match obj.get("value") {
                Some(Value::Number(n)) => n.as_f64().unwrap_or(f64::NAN),
                Some(_) => return Err(perr(line, "`value` must be a number")),
                None => return Err(perr(line, "set_fraction needs `value`")),
            };
            if !(0.0..=1.0).contains(&value) {
                return Err(perr(line, format!("`value` {value} is outside [0, 1]")));
            }
            TraceOp::SetFraction { value }
        }
        other => {
            return Err(perr(
                line,
                format!(
                    "unknown op `{other}` (expected alloc, free, record_stream, complete_events, empty_cache or set_fraction)"
                ),
            ))
        }
    };
    Ok(parsed)
}

struct Fields<'a> {
    obj: &'a Map<String, Value>,
    line: usize,
}

impl Fields<'_> {
    fn only(&self, allowed: &[&str]) -> Result<(), TraceError> {
        match self.obj.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(perr(self.line, format!("unknown field `{k}` (allowed here: {})", allowed.join(", ")))),
            None => Ok(()),
        }
    }

    fn id(&self) -> Result<TraceId, TraceError> {
        match self.obj.get("id") {
            Some(Value::Number(n)) => Ok(n.to_string()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(perr(self.line, "`id` must be a number or a string")),
            None => Err(perr(self.line, "missing `id`")),
        }
    }

    fn uint(&self, key: &str) -> Result<u64, TraceError> {
        match self.obj.get(key) {
            Some(Value::Number(n)) => n.as_u64().ok_or_else(|| {
                perr(self.line, format!("`{key}` must be a non-negative whole number of bytes, got {n}"))
            }),
            Some(v) => Err(perr(self.line, format!("`{key}` must be a number, got {v}"))),
            None => Err(perr(self.line, format!("missing `{key}`"))),
        }
    }

    fn stream(&self) -> Result<u64, TraceError> {
        if self.obj.contains_key("stream") {
            self.uint("stream")
        } else {
            Ok(0)
        }
    }
}

/// Writes one operation as a JSONL line (without the newline).
pub fn format_op(op: &TraceOp) -> String {
    let id = |id: &str| match id.parse::<u64>() {
        Ok(n) => n.to_string(),
        Err(_) => Value::String(id.to_string()).to_string(),
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
        TraceOp::CompleteEvents => r#"{"op":"complete_events"}"#.to_string(),
        TraceOp::EmptyCache => r#"{"op":"empty_cache"}"#.to_string(),
        TraceOp::SetFraction { value } => format!(r#"{{"op":"set_fraction","value":{value}}}"#),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        ] {
            let input = format!("{{\"op\":\"empty_cache\"}}\n{text}\n");
            let e = read_trace(input.as_bytes()).unwrap_err().to_string();
            assert!(e.starts_with("line 2: ") && e.contains(needle), "{text}: {e}");
        }
    }
}
