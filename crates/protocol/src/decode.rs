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
    from_slice_lifting(text, max_nodes, &[], usize::MAX).map(|(v, _)| v)
}

/// A string of the input left out of the parsed value: the member `key` of
/// the top-level `params` object, whose value (without quotes, no escapes)
/// is `text[start..end]`. The value holds an empty string in its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lifted {
    /// The member's name (one of the names asked for).
    pub key: String,
    /// Byte offset of the string's first character in the input.
    pub start: usize,
    /// Byte offset one past its last character.
    pub end: usize,
}

/// As [`from_slice_bounded`] (same budget, same duplicate-key rule, same
/// errors), but a member of the top-level `params` object named in `members`
/// whose value is a string of at least `min_len` bytes without escapes is not
/// copied into the value: it is left as an empty string there and its place
/// in `text` returned, so a caller can decode a large base64 member straight
/// out of the message buffer (at most one per name: keys are unique).
pub fn from_slice_lifting(
    text: &[u8],
    max_nodes: usize,
    members: &[&str],
    min_len: usize,
) -> Result<(Value, Vec<Lifted>), serde_json::Error> {
    let budget = Budget {
        remaining: Cell::new(max_nodes),
        limit: max_nodes,
        base: text.as_ptr() as usize,
        members,
        min_len,
        lifted: std::cell::RefCell::new(Vec::new()),
    };
    let mut de = serde_json::Deserializer::from_slice(text);
    // Deep nesting is already bounded by serde_json's recursion limit (128).
    let value = ValueSeed(&budget, Spot::Root).deserialize(&mut de)?;
    de.end()?;
    Ok((value, budget.lifted.into_inner()))
}

/// Where a value sits, as far as lifting cares.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Spot {
    /// The message itself.
    Root,
    /// The top-level `params` object.
    Params,
    /// A member of `params` that may be lifted (its index in `members`).
    Member(usize),
    /// Anywhere else.
    Elsewhere,
}

struct Budget<'m> {
    remaining: Cell<usize>,
    limit: usize,
    /// Address of the input's first byte (borrowed strings point into it).
    base: usize,
    members: &'m [&'m str],
    min_len: usize,
    lifted: std::cell::RefCell<Vec<Lifted>>,
}

impl Budget<'_> {
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

struct ValueSeed<'a, 'm>(&'a Budget<'m>, Spot);

impl<'de> DeserializeSeed<'de> for ValueSeed<'_, '_> {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(ValueVisitor(self.0, self.1))
    }
}

struct ValueVisitor<'a, 'm>(&'a Budget<'m>, Spot);

impl<'de> Visitor<'de> for ValueVisitor<'_, '_> {
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
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Value, E> {
        if let Spot::Member(i) = self.1 {
            if v.len() >= self.0.min_len {
                self.0.take()?;
                // Borrowed from the input slice, so it lies inside it.
                let start = (v.as_ptr() as usize).wrapping_sub(self.0.base);
                self.0.lifted.borrow_mut().push(Lifted {
                    key: self.0.members[i].to_owned(),
                    start,
                    end: start + v.len(),
                });
                return Ok(Value::String(String::new()));
            }
        }
        self.visit_str(v)
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
        while let Some(v) = seq.next_element_seed(ValueSeed(self.0, Spot::Elsewhere))? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.0.take()?;
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let spot = match self.1 {
                Spot::Root if key == "params" => Spot::Params,
                Spot::Params => self
                    .0
                    .members
                    .iter()
                    .position(|m| *m == key)
                    .map_or(Spot::Elsewhere, Spot::Member),
                _ => Spot::Elsewhere,
            };
            let value = map.next_value_seed(ValueSeed(self.0, spot))?;
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

#[cfg(test)]
mod lifting_tests {
    use super::*;

    #[test]
    fn only_params_members_are_lifted_and_checks_still_apply() {
        let text = br#"{"id":1,"method":"m","params":{"chunk":"QUJD","other":"QUJD","n":{"chunk":"QUJD"}},"chunk":"QUJD"}"#;
        let (v, lifted) = from_slice_lifting(text, 100, &["chunk"], 4).unwrap();
        assert_eq!(lifted.len(), 1);
        let l = &lifted[0];
        assert_eq!(
            (l.key.as_str(), &text[l.start..l.end]),
            ("chunk", &b"QUJD"[..])
        );
        assert_eq!(v["params"]["chunk"], "");
        assert_eq!(v["params"]["other"], "QUJD");
        assert_eq!(v["params"]["n"]["chunk"], "QUJD");
        assert_eq!(v["chunk"], "QUJD");
        // Short strings and strings with escapes stay in the value.
        let (v, lifted) = from_slice_lifting(text, 100, &["chunk"], 5).unwrap();
        assert!(lifted.is_empty());
        assert_eq!(v["params"]["chunk"], "QUJD");
        let esc = br#"{"params":{"chunk":"QU\u004aD"}}"#;
        assert!(from_slice_lifting(esc, 100, &["chunk"], 1)
            .unwrap()
            .1
            .is_empty());
        // Same budget and duplicate rule as without lifting.
        let dup = br#"{"params":{"chunk":"QUJD","chunk":"QUJD"}}"#;
        assert!(from_slice_lifting(dup, 100, &["chunk"], 1).is_err());
        assert!(from_slice_lifting(text, 8, &["chunk"], 1).is_err());
        assert!(from_slice_lifting(text, 9, &["chunk"], 1).is_ok());
        assert!(from_slice_bounded(text, 8).is_err());
    }
}
