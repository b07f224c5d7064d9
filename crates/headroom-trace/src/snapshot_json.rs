//! A JSON snapshot, read through the same builder as a pickle: serde drives
//! the builder value by value, so no JSON tree is held.

use crate::pickle::Builder;
use crate::snapshot_builder::{SnapshotBuilder, SnapshotError, V};
use std::io::Read;

/// Reads one JSON value into `b`: the top level of the snapshot.
pub(crate) fn read_json<R: Read>(reader: R, b: &mut SnapshotBuilder) -> Result<V, SnapshotError> {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_reader(reader);
    let v = Seed(b).deserialize(&mut de).map_err(SnapshotError::Json)?;
    de.end().map_err(|e| {
        // A second value after the first: one JSON object a line is headroom's trace format.
        if e.line() > 1 && e.column() <= 1 {
            SnapshotError::Shape(format!(
                "after one JSON value, another begins at line {} (JSON Lines): a headroom trace, which `headroom \
                 replay` reads; a snapshot is one JSON object (or a pickle)",
                e.line()
            ))
        } else {
            SnapshotError::Json(e)
        }
    })?;
    Ok(v)
}

/// Hands each JSON value to the builder as it is read.
struct Seed<'a>(&'a mut SnapshotBuilder);

impl<'de> serde::de::DeserializeSeed<'de> for Seed<'_> {
    type Value = V;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<V, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Seed<'_> {
    type Value = V;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<V, E> {
        Ok(V::None)
    }
    fn visit_bool<E>(self, v: bool) -> Result<V, E> {
        Ok(V::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<V, E> {
        Ok(V::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<V, E> {
        Ok(i64::try_from(v).map_or(V::UInt(v), V::Int))
    }
    fn visit_f64<E>(self, v: f64) -> Result<V, E> {
        Ok(V::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<V, E> {
        Ok(self.0.str(v))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<V, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(Seed(self.0))? {
            items.push(v);
        }
        Ok(self.0.list(&items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<V, A::Error> {
        let mut items = Vec::new();
        while let Some(k) = map.next_key_seed(Seed(self.0))? {
            let v = map.next_value_seed(Seed(self.0))?;
            items.push((k, v));
        }
        Ok(self.0.dict(&items))
    }
}
