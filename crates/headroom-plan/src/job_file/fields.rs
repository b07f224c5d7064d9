//! A parsed file's fields by their dotted paths, each taken at most once by a reader: what is
//! left when the reader is done is what it did not honour, and is named.

use super::{Ignored, NO_BEARING};
use serde_json::Value;
use std::collections::BTreeMap;

pub(crate) struct Fields {
    leaves: BTreeMap<String, Value>,
    ignored: Vec<Ignored>,
}

fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, v) in m {
                let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&path, v, out);
            }
        }
        v => {
            out.insert(prefix.to_string(), v.clone());
        }
    }
}

/// A value as the file wrote it, for messages.
pub(crate) fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        v => v.to_string(),
    }
}

impl Fields {
    pub fn new(doc: &Value) -> Fields {
        let mut leaves = BTreeMap::new();
        flatten("", doc, &mut leaves);
        Fields { leaves, ignored: Vec::new() }
    }

    /// The field at `path`, taken; `null` reads as absent.
    pub fn take(&mut self, path: &str) -> Option<Value> {
        self.leaves.remove(path).filter(|v| !v.is_null())
    }

    /// Whether any field lies at or under `path`.
    pub fn has(&self, path: &str) -> bool {
        let under = format!("{path}.");
        self.leaves.keys().any(|k| k == path || k.starts_with(&under))
    }

    pub fn u64(&mut self, path: &str) -> Result<Option<u64>, String> {
        match self.take(path) {
            None => Ok(None),
            Some(v) => {
                whole(&v).map(Some).ok_or_else(|| format!("{path}: expected a whole number, found {}", shown(&v)))
            }
        }
    }

    /// A positive whole number.
    pub fn positive(&mut self, path: &str) -> Result<Option<u64>, String> {
        match self.u64(path)? {
            Some(0) => Err(format!("{path}: must be at least 1")),
            n => Ok(n),
        }
    }

    pub fn f64(&mut self, path: &str) -> Result<Option<f64>, String> {
        match self.take(path) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| format!("{path}: expected a number, found {}", shown(&v))),
        }
    }

    pub fn str(&mut self, path: &str) -> Result<Option<String>, String> {
        match self.take(path) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(format!("{path}: expected a string, found {}", shown(&v))),
        }
    }

    pub fn bool(&mut self, path: &str) -> Result<Option<bool>, String> {
        match self.take(path) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(Some(true)),
            Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(Some(false)),
            Some(v) => Err(format!("{path}: expected true or false, found {}", shown(&v))),
        }
    }

    /// Records `field` as not honoured, for `why`.
    pub fn ignore(&mut self, field: impl Into<String>, why: impl Into<String>) {
        self.ignored.push(Ignored { field: field.into(), why: why.into() });
    }

    /// Takes every field at or under `path`, if any, and records them as not honoured.
    pub fn not_honoured(&mut self, path: &str, why: &str) {
        let under = format!("{path}.");
        let keys: Vec<String> = self.leaves.keys().filter(|k| *k == path || k.starts_with(&under)).cloned().collect();
        for k in keys {
            self.leaves.remove(&k);
            self.ignore(k, why);
        }
    }

    /// What was not honoured: what the reader recorded, then each field it left, as having no
    /// bearing on memory where it lies under one of `no_bearing`, else as not read.
    pub fn finish(mut self, no_bearing: &[&str], reader: &str) -> Vec<Ignored> {
        for (k, _) in std::mem::take(&mut self.leaves) {
            let quiet = no_bearing.iter().any(|p| k == *p || k.starts_with(&format!("{p}.")));
            let why = if quiet { NO_BEARING.to_string() } else { format!("not read by headroom's {reader} reader") };
            self.ignored.push(Ignored { field: k, why });
        }
        self.ignored
    }
}

/// A whole number, written as an integer or as a float with no fraction (JSON's `1e9`).
pub(crate) fn whole(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_f64().filter(|x| x.fract() == 0.0 && *x >= 0.0 && *x < 2f64.powi(63)).map(|x| x as u64))
}
