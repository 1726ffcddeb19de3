//! Bounded JSON decoding: a node budget and duplicate-key rejection.
//!
//! The reference server refuses any message holding more than
//! [`MAX_JSONRPC_VALUE_NODES`] JSON values and any object with a repeated key, at
//! any depth. Both checks run while the text is parsed, so a hostile message is
//! refused before it is fully materialised, and the cost on ordinary messages is one
//! counter decrement per value (duplicate keys are caught by the map insert that
//! building the object does anyway).

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use std::cell::Cell;
use std::fmt;

/// Largest number of JSON values (scalars, arrays and objects; object keys do not
/// count) one message may hold: 262 144 (256 × 1024), as in the reference.
pub const MAX_JSONRPC_VALUE_NODES: usize = 256 * 1024;

/// Parses `text` into a [`Value`], refusing more than `max_nodes` values and any
/// duplicate object key.
///
/// Errors carry serde_json's position suffix, e.g.
/// ``duplicate JSON object key `id` at line 1 column 12`` or
/// `JSON-RPC message exceeds the limit of 262144 JSON values at line 1 column N`.
pub fn from_slice_bounded(text: &[u8], max_nodes: usize) -> Result<Value, serde_json::Error> {
    let budget = Budget {
        remaining: Cell::new(max_nodes),
        limit: max_nodes,
    };
    let mut de = serde_json::Deserializer::from_slice(text);
    // Deep nesting is already bounded by serde_json's recursion limit (128).
    let value = ValueSeed(&budget).deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

struct Budget {
    remaining: Cell<usize>,
    limit: usize,
}

impl Budget {
    #[inline]
    fn take<E: de::Error>(&self) -> Result<(), E> {
        let left = self.remaining.get();
        if left == 0 {
            return Err(E::custom(format_args!(
                "JSON-RPC message exceeds the limit of {} JSON values",
                self.limit
            )));
        }
        self.remaining.set(left - 1);
        Ok(())
    }
}

struct ValueSeed<'a>(&'a Budget);

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(ValueVisitor(self.0))
    }
}

struct ValueVisitor<'a>(&'a Budget);

impl<'de> Visitor<'de> for ValueVisitor<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.0.take()?;
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.0.take()?;
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.0.take()?;
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        self.0.take()?;
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.0.take()?;
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.0.take()?;
        Ok(Value::String(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.0.take()?;
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.0.take()?;
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(v) = seq.next_element_seed(ValueSeed(self.0))? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.0.take()?;
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(ValueSeed(self.0))?;
            if out.contains_key(&key) {
                return Err(de::Error::custom(format_args!(
                    "duplicate JSON object key `{key}`"
                )));
            }
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn array_message(n: usize) -> String {
        let mut s =
            String::from(r#"{"id":1,"method":"initialize","params":{"clientName":"c","x":["#);
        for i in 0..n {
            if i > 0 {
                s.push(',');
            }
            s.push('0');
        }
        s.push_str("]}}");
        s
    }

    #[test]
    fn budget_boundary_matches_reference() {
        // 6 other values: top object, id, method, params object, clientName, array.
        assert!(
            from_slice_bounded(array_message(262_138).as_bytes(), MAX_JSONRPC_VALUE_NODES).is_ok()
        );
        let err = from_slice_bounded(array_message(262_139).as_bytes(), MAX_JSONRPC_VALUE_NODES)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "JSON-RPC message exceeds the limit of 262144 JSON values at line 1 column "
            ),
            "{err}"
        );
    }

    #[test]
    fn duplicate_keys_rejected_at_any_depth() {
        let err = from_slice_bounded(br#"{"id":1,"id":2}"#, 100)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("duplicate JSON object key `id` at line 1 column"),
            "{err}"
        );
        let err = from_slice_bounded(br#"{"a":[{"b":{"c":1,"c":2}}]}"#, 100)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("duplicate JSON object key `c`"), "{err}");
    }

    #[test]
    fn keys_do_not_count_and_strings_are_unbounded() {
        // {"a":1,"b":2} holds 3 values.
        assert!(from_slice_bounded(br#"{"a":1,"b":2}"#, 3).is_ok());
        assert!(from_slice_bounded(br#"{"a":1,"b":2}"#, 2).is_err());
        let big = format!(r#"{{"s":"{}"}}"#, "x".repeat(1 << 20));
        assert!(from_slice_bounded(big.as_bytes(), 2).is_ok());
    }

    #[test]
    fn trailing_characters_rejected() {
        let err = from_slice_bounded(br#"{"a":1} {"b":2}"#, 100)
            .unwrap_err()
            .to_string();
        assert!(err.contains("trailing characters"), "{err}");
    }

    #[test]
    fn same_value_as_serde_json() {
        let text = br#"{"id":"x","params":{"n":-5,"f":1.5,"big":18446744073709551615,"a":[true,null,"s"]}}"#;
        let a = from_slice_bounded(text, 100).unwrap();
        let b: Value = serde_json::from_slice(text).unwrap();
        assert_eq!(a, b);
    }
}
