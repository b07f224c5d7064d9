//! JSON input files (`config.json`, checkpoint chains) read strictly: a key
//! given twice in one object is an error naming the key, where `serde_json`
//! (like Python's `json`) would silently keep the last value and plan a
//! model nobody wrote. A UTF-8 byte-order mark at the start is skipped.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;

/// Parses `text` into a value, refusing repeated keys at any depth.
pub fn parse(text: &str) -> Result<Value, serde_json::Error> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    serde_json::from_str::<Strict>(text).map(|s| s.0)
}

/// What a JSON value is, for messages: "an array", "a string", ...
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Strict, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Strict;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Strict, E> {
        Ok(Strict(Value::Bool(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Strict, E> {
        Ok(Strict(Value::from(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Strict, E> {
        Ok(Strict(Value::from(v)))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Strict, E> {
        Ok(Strict(Value::from(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Strict, E> {
        Ok(Strict(Value::String(v.to_string())))
    }

    fn visit_string<E>(self, v: String) -> Result<Strict, E> {
        Ok(Strict(Value::String(v)))
    }

    fn visit_unit<E>(self) -> Result<Strict, E> {
        Ok(Strict(Value::Null))
    }

    fn visit_none<E>(self) -> Result<Strict, E> {
        Ok(Strict(Value::Null))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Strict, D::Error> {
        Strict::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Strict(Value::Array(items)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
        let mut m = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            let Strict(v) = map.next_value()?;
            if m.contains_key(&k) {
                return Err(de::Error::custom(format!("`{k}` is given twice")));
            }
            m.insert(k, v);
        }
        Ok(Strict(Value::Object(m)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_keys_are_refused_at_any_depth_and_a_bom_is_skipped() {
        assert_eq!(parse("\u{feff}{\"a\": [1, {\"b\": null}]}").unwrap()["a"][1]["b"], Value::Null);
        let e = parse(r#"{"hidden_size": 4096, "x": 1, "hidden_size": 8}"#).unwrap_err().to_string();
        assert!(e.contains("`hidden_size` is given twice"), "{e}");
        let e = parse(r#"{"stages": [{"a": 1, "a": 2}]}"#).unwrap_err().to_string();
        assert!(e.contains("`a` is given twice"), "{e}");
        assert_eq!(parse("18446744073709551615").unwrap(), Value::from(u64::MAX));
        assert_eq!(parse("-3").unwrap(), Value::from(-3));
    }
}
