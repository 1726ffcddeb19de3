//! A JSON skimmer: finds where an object's members lie in a message's text
//! without building anything or checking every byte.
//!
//! A 64 MiB file travels as 85 MiB of base64 in one JSON string. A parser
//! checks each of its bytes for escapes and control characters; here a
//! string is skipped with a SIMD search for its closing quote (`memchr`).
//! The skimmer does not validate: it only says where things are, for a
//! caller that validates what it takes (the hot requests' base64 is checked
//! by its decoder, and the rest of the message is parsed by the bounded
//! decoder, see [`crate::hot`]). Its answers are exact for valid JSON; for
//! anything else it may answer `None` or a wrong place, never panic.

use std::ops::Range;

/// A member's name (as written, escapes included) and its value's span.
pub type Member<'a> = (&'a str, Range<usize>);

/// The members of the object at the start of `text` (after whitespace), in
/// order. `None` when `text` is not an object or is cut short.
pub fn members(text: &str) -> Option<Vec<Member<'_>>> {
    object(text, 0, &[]).map(|o| o.members)
}

/// As [`members`], and the members of the object that is the value of the
/// (last) top-level member named one of `keys` (spans in `text`), found in the
/// same pass: the nested object is read once, not skipped and then read
/// again. The second part is `None` when there is no such member or its
/// value is no object.
pub fn members_and_nested<'a>(
    text: &'a str,
    keys: &[&str],
) -> Option<(Vec<Member<'a>>, Option<Vec<Member<'a>>>)> {
    object(text, 0, keys).map(|o| (o.members, o.nested))
}

struct Object<'a> {
    members: Vec<Member<'a>>,
    nested: Option<Vec<Member<'a>>>,
    /// Index just past the closing brace.
    end: usize,
}

/// The object starting at `text[at..]` (after whitespace); the value of
/// the (last) member named one of `descend`, when an object, is read for its
/// members too.
fn object<'a>(text: &'a str, at: usize, descend: &[&str]) -> Option<Object<'a>> {
    let b = text.as_bytes();
    let mut i = object_open(b, at)?;
    let mut out = Object {
        members: Vec::new(),
        nested: None,
        end: 0,
    };
    if b.get(i) == Some(&b'}') {
        out.end = i + 1;
        return Some(out);
    }
    loop {
        let (key, start) = member_at(b, i)?;
        let key = &text[key];
        let end = if descend.contains(&key) && b.get(start) == Some(&b'{') {
            let inner = object(text, start, &[])?;
            out.nested = Some(inner.members);
            inner.end
        } else {
            value_end(b, start)?
        };
        out.members.push((key, start..end));
        match after_value(b, end)? {
            After::Member(next) => i = next,
            After::End(close) => {
                out.end = close;
                return Some(out);
            }
        }
    }
}

/// The value of member `key` in the object `text`, as text.
pub fn member<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    members(text)?
        .into_iter()
        .find(|(k, _)| *k == key)
        .map(|(_, r)| &text[r])
}

/// The contents of a JSON string value as written, escapes included (for
/// base64 and ids, which have none; a base64 decoder refuses a backslash),
/// or `None` when `value` is not a string.
pub fn plain_string(value: &str) -> Option<&str> {
    value.strip_prefix('"')?.strip_suffix('"')
}

/// Index of the first member's key in the object opening at `b[at..]`
/// (after whitespace).
pub(crate) fn object_open(b: &[u8], at: usize) -> Option<usize> {
    let i = skip_ws(b, at);
    (b.get(i) == Some(&b'{')).then(|| skip_ws(b, i + 1))
}

/// The key (contents, as written) of the member at `b[i]` and where its
/// value starts.
pub(crate) fn member_at(b: &[u8], i: usize) -> Option<(Range<usize>, usize)> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let key_end = string_end(b, i)?;
    let colon = skip_ws(b, key_end);
    (b.get(colon) == Some(&b':')).then(|| (i + 1..key_end - 1, skip_ws(b, colon + 1)))
}

/// What follows a member's value.
enum After {
    /// Another member, whose key is at this index.
    Member(usize),
    /// The object's end: the index just past its closing brace.
    End(usize),
}

/// What follows a value ending at `end`; `None` when it is neither a comma
/// nor a closing brace.
fn after_value(b: &[u8], end: usize) -> Option<After> {
    let i = skip_ws(b, end);
    match b.get(i)? {
        b',' => Some(After::Member(skip_ws(b, i + 1))),
        b'}' => Some(After::End(i + 1)),
        _ => None,
    }
}

/// Where the next member's key is, after a value ending at `end`; `None`
/// at the object's end.
pub(crate) fn next_member(b: &[u8], end: usize) -> Option<usize> {
    match after_value(b, end)? {
        After::Member(i) => Some(i),
        After::End(_) => None,
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// Index just past the string that opens at `b[i]` (a quote).
fn string_end(b: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    loop {
        i += memchr::memchr2(b'"', b'\\', b.get(i..)?)?;
        if b[i] == b'"' {
            return Some(i + 1);
        }
        i += 2; // an escape: skip the escaped character
    }
}

/// Index just past the value that starts at `b[i]`.
pub(crate) fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match *b.get(j)? {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            let mut j = i;
            while !matches!(
                b.get(j),
                None | Some(b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t')
            ) {
                j += 1;
            }
            (j > i).then_some(j)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_members_past_nested_values_and_escapes() {
        let t = r#" {"id": 7, "result": {"a": [1, {"b": "x\"}"}], "c": "d"}, "e\\": null } "#;
        let m = members(t).expect("object");
        let keys: Vec<&str> = m.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, ["id", "result", "e\\\\"]);
        assert_eq!(&t[m[0].1.clone()], "7");
        assert_eq!(&t[m[1].1.clone()], r#"{"a": [1, {"b": "x\"}"}], "c": "d"}"#);
        assert_eq!(&t[m[2].1.clone()], "null");
        assert_eq!(member(&t[m[1].1.clone()], "c"), Some("\"d\""));
        let (top, nested) = members_and_nested(t, &["result"]).expect("object");
        assert_eq!(top, m);
        let nested = nested.expect("result is an object");
        assert_eq!(nested.len(), 2);
        assert_eq!(&t[nested[1].1.clone()], "\"d\"");
        assert_eq!(members_and_nested(t, &["id"]).map(|(_, n)| n), Some(None));
        let either = members_and_nested(t, &["params", "result"]).and_then(|(_, n)| n);
        assert_eq!(either.map(|n| n.len()), Some(2));
        assert_eq!(plain_string("\"QUJD\""), Some("QUJD"));
        assert_eq!(plain_string("7"), None);
    }

    #[test]
    fn refuses_what_is_not_a_whole_object() {
        assert!(members("[1]").is_none());
        assert!(members(r#"{"a": "unterminated}"#).is_none());
        assert!(members(r#"{"a" 1}"#).is_none());
        assert_eq!(members("{}").map(|m| m.len()), Some(0));
    }
}
