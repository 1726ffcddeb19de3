//! The hot requests of the text dialect (`fs/writeFile`, `process/write`,
//! `fs/writeBlock`): their base64 member is decoded straight out of the
//! message buffer, in place, instead of being copied into a `Value` first and
//! decoded into a third buffer. A 64 MiB `fs/writeFile` then needs the 85 MiB
//! message and nothing of its size besides.
//!
//! Everything else about decoding is unchanged: [`decode_text`] runs the same
//! bounded decoder (budget, duplicate keys, errors) and the same envelope
//! classification; a member that is not valid base64 is put back as text, so
//! its refusal is the usual -32602 with the usual wording.
//!
//! The common case does not even parse the base64: the member is found by
//! the skimmer ([`crate::skim`], a SIMD search for the closing quote), its
//! bytes checked as base64 (which rules out quotes, escapes and control
//! characters), and the bounded decoder parses the message with an empty
//! string in its place. Any other outcome (not found, not base64, a message
//! the decoder refuses, not a hot request) takes the full path, so errors
//! are word for word those of [`Message::decode`].

use bytes::Bytes;
use exec_server_protocol::decode::{from_slice_bounded, from_slice_lifting, Lifted};
use exec_server_protocol::envelope::{DecodeError, Message};
use exec_server_protocol::{methods, MAX_JSONRPC_VALUE_NODES};
use serde_json::Value;

/// Each hot method and the member holding its bytes.
pub const HOT_METHODS: [(&str, &str); 3] = [
    (methods::FS_WRITE_FILE, "dataBase64"),
    (methods::PROCESS_WRITE, "chunk"),
    (methods::FS_WRITE_BLOCK, "chunk"),
];

/// Base64 members shorter than this stay in the value (copying a small
/// string costs less than the bookkeeping): 16 KiB.
pub const LIFT_MIN_BYTES: usize = 16 * 1024;

/// Decodes one text message. For a hot request whose bytes member is long
/// valid base64 without escapes, the member is absent from the params and
/// its bytes come back apart (decoded in the message's own buffer, which
/// they share); otherwise the message is exactly what [`Message::decode`]
/// gives.
///
/// # Errors
/// As [`Message::decode`].
pub fn decode_text(text: String) -> Result<(Message, Option<Bytes>), DecodeError> {
    let text = match decode_skimmed(text) {
        Ok(done) => return done,
        Err(text) => text,
    };
    let members = ["dataBase64", "chunk"];
    let (value, lifted) = from_slice_lifting(
        text.as_bytes(),
        MAX_JSONRPC_VALUE_NODES,
        &members,
        LIFT_MIN_BYTES,
    )
    .map_err(|e| DecodeError(e.to_string()))?;
    let mut msg = Message::from_value(value)?;
    if lifted.is_empty() {
        return Ok((msg, None));
    }
    let wanted = match &msg {
        Message::Request(r) => HOT_METHODS
            .iter()
            .find(|(m, _)| *m == r.method)
            .map(|(_, member)| *member),
        _ => None,
    };
    let hot = match (wanted, lifted.as_slice()) {
        (Some(member), [one]) if one.key == member => {
            exec_server_base64::is_valid(&text.as_bytes()[one.start..one.end])
        }
        _ => false,
    };
    if !hot {
        restore(&mut msg, &text, &lifted);
        return Ok((msg, None));
    }
    let one = &lifted[0];
    if let Message::Request(r) = &mut msg {
        if let Value::Object(m) = &mut r.params {
            m.remove(&one.key);
        }
    }
    match decoded_in_place(text, one.start..one.end) {
        Some(bytes) => Ok((msg, Some(bytes))),
        // Checked above; unreachable, but never a panic.
        None => Err(DecodeError("Invalid padding".into())),
    }
}

/// The fast path of [`decode_text`]: the hot member found by skimming and
/// the rest parsed with an empty string in its place. Gives the text back
/// when the message is not one it can take whole.
fn decode_skimmed(text: String) -> Result<Decoded, String> {
    // The method is checked again once the rest is parsed.
    let Some((_, member, at)) = locate(&text) else {
        return Err(text);
    };
    if at.len() < LIFT_MIN_BYTES || !exec_server_base64::is_valid(&text.as_bytes()[at.clone()]) {
        return Err(text);
    }
    // The base64 is a whole JSON string token: putting an empty one in its
    // place keeps the message's structure, node count and keys.
    let mut rest = String::with_capacity(text.len() - at.len());
    rest.push_str(&text[..at.start]);
    rest.push_str(&text[at.end..]);
    let Some(msg) = without_member(rest.as_bytes(), member) else {
        return Err(text);
    };
    Ok(match decoded_in_place(text, at) {
        Some(bytes) => Ok((msg, Some(bytes))),
        // Checked above; unreachable, but never a panic.
        None => Err(DecodeError("Invalid padding".into())),
    })
}

/// What [`decode_text`] returns.
type Decoded = Result<(Message, Option<Bytes>), DecodeError>;

/// Parses `rest` (a message whose hot member holds `""`) with the bounded
/// decoder; the message without that member when it is a request of a hot
/// method whose member it is, and `None` otherwise (including any error:
/// the caller then takes the full path on the original text).
fn without_member(rest: &[u8], member: &str) -> Option<Message> {
    let value = from_slice_bounded(rest, MAX_JSONRPC_VALUE_NODES).ok()?;
    let mut msg = Message::from_value(value).ok()?;
    let Message::Request(r) = &mut msg else {
        return None;
    };
    let hot = HOT_METHODS.contains(&(r.method.as_str(), member));
    let Value::Object(params) = &mut r.params else {
        return None;
    };
    (hot && params.remove(member) == Some(Value::String(String::new()))).then_some(msg)
}

/// Decodes a message lifted while it arrived ([`crate::lift`]): the same
/// answer as [`decode_text`] on the message as sent. `skeleton` is the
/// lifted text's skeleton, already checked as UTF-8.
///
/// # Errors
/// As [`Message::decode`].
pub fn decode_lifted(lifted: crate::lift::LiftedText) -> Decoded {
    if let Some(msg) = without_member(&lifted.skeleton, lifted.member) {
        return Ok((msg, Some(lifted.payload)));
    }
    match String::from_utf8(lifted.restore()) {
        Ok(text) => decode_text(text),
        Err(_) => Err(DecodeError("message is not valid UTF-8".into())),
    }
}

/// The hot method, its member and the member's string contents in `text`
/// (without quotes), found by skimming the top-level `method` and `params`.
fn locate(text: &str) -> Option<(&'static str, &'static str, std::ops::Range<usize>)> {
    let (top, params) = crate::skim::members_and_nested(text, &["params"])?;
    let method = top.iter().find(|(k, _)| *k == "method")?.1.clone();
    let method = crate::skim::plain_string(&text[method])?;
    let (method, member) = HOT_METHODS.iter().find(|(m, _)| *m == method)?;
    let (_, at) = params?.into_iter().find(|(k, _)| k == member)?;
    // A string's contents: inside its quotes.
    if !text[at.clone()].starts_with('"') || at.len() < 2 {
        return None;
    }
    Some((method, member, at.start + 1..at.end - 1))
}

/// Decodes the base64 at `at` in the message's own buffer; the bytes share
/// that buffer. `None` when it is not base64 (callers checked it is).
fn decoded_in_place(text: String, at: std::ops::Range<usize>) -> Option<Bytes> {
    let mut buf = text.into_bytes();
    let n = exec_server_base64::decode_in_place(&mut buf[at.clone()])?;
    Some(Bytes::from(buf).slice(at.start..at.start + n))
}

/// Puts lifted strings back where they were (a method that is not hot, or
/// bytes that are not valid base64).
fn restore(msg: &mut Message, text: &str, lifted: &[Lifted]) {
    let params = match msg {
        Message::Request(r) => &mut r.params,
        Message::Notification(n) => &mut n.params,
        // The classifier dropped `params`: nothing to put back.
        _ => return,
    };
    if let Value::Object(m) = params {
        for l in lifted {
            m.insert(
                l.key.clone(),
                Value::String(text[l.start..l.end].to_owned()),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exec_server_protocol::ByteChunk;

    fn request(method: &str, member: &str, b64: &str) -> String {
        format!(
            r#"{{"id":7,"method":"{method}","params":{{"processId":"p","{member}":"{b64}","writeId":"w"}}}}"#
        )
    }

    #[test]
    fn hot_members_come_apart_and_everything_else_is_unchanged() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        let b64 = ByteChunk::encode(&data);
        for (method, member) in HOT_METHODS {
            let text = request(method, member, &b64);
            let (msg, payload) = decode_text(text.clone()).unwrap();
            assert!(payload.as_deref() == Some(&data[..]), "{method}");
            let Message::Request(r) = msg else { panic!() };
            assert!(r.params.get(member).is_none());
            assert_eq!(r.params["writeId"], "w");
            // Without lifting: the same message with the member in place.
            let plain = Message::decode(text.as_bytes()).unwrap();
            let Message::Request(mut p) = plain else {
                panic!()
            };
            p.params.as_object_mut().unwrap().remove(member);
            assert_eq!(p.params, r.params);
        }
        // Not hot, wrong member, bad base64, short: untouched.
        let cases = [
            request("process/start", "chunk", &b64),
            request("process/write", "dataBase64", &b64),
            request("process/write", "chunk", &format!("!{}", &b64[1..])),
            request("process/write", "chunk", "QUJD"),
        ];
        for text in cases {
            let (msg, payload) = decode_text(text.clone()).unwrap();
            assert!(payload.is_none());
            assert_eq!(msg, Message::decode(text.as_bytes()).unwrap());
        }
        // Errors are the decoder's.
        let dup =
            format!(r#"{{"id":1,"id":2,"method":"process/write","params":{{"chunk":"{b64}"}}}}"#);
        assert_eq!(
            decode_text(dup.clone()).unwrap_err().to_string(),
            Message::decode(dup.as_bytes()).unwrap_err().to_string()
        );
    }

    #[test]
    fn the_skimmed_path_takes_only_what_the_full_path_would() {
        let data: Vec<u8> = (0..60_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let b64 = ByteChunk::encode(&data);
        // Params first, spaces, a decoy inside another string, and a nested
        // `chunk`: the member taken is params.chunk, whole.
        let text = format!(
            r#" {{ "params" : {{ "note": "\"chunk\":\"{b64}\"", "inner": {{"chunk": "QUJD"}}, "chunk" : "{b64}" }}, "method": "process/write", "id": 3 }}"#
        );
        let (method, member, at) = locate(&text).expect("found by skimming");
        assert_eq!(
            (method, member, &text[at]),
            ("process/write", "chunk", &b64[..])
        );
        let (msg, payload) = decode_text(text.clone()).unwrap();
        assert!(payload.as_deref() == Some(&data[..]));
        let Message::Request(r) = msg else { panic!() };
        assert_eq!(r.params["inner"]["chunk"], "QUJD");
        assert!(r.params["note"].as_str().unwrap().starts_with("\"chunk\""));
        assert!(r.params.get("chunk").is_none());
        // A key written with an escape, a duplicate member, a control
        // character elsewhere: the full path's answer, word for word.
        let escaped =
            format!(r#"{{"id":1,"method":"process/write","params":{{"chun\u006b":"{b64}"}}}}"#);
        let (_, payload) = decode_text(escaped).unwrap();
        assert!(
            payload.as_deref() == Some(&data[..]),
            "the full path still lifts it"
        );
        for bad in [
            format!(r#"{{"id":1,"method":"process/write","params":{{"chunk":"{b64}","chunk":"{b64}"}}}}"#),
            format!(
                "{{\"id\":1,\"method\":\"process/write\",\"params\":{{\"p\":\"a{}b\",\"chunk\":\"{b64}\"}}}}",
                '\u{1}'
            ),
            format!(r#"{{"id":1,"method":"process/write","params":{{"chunk":"{b64}"}}"#),
        ] {
            assert_eq!(
                decode_text(bad.clone()).unwrap_err().to_string(),
                Message::decode(bad.as_bytes()).unwrap_err().to_string()
            );
        }
    }
}
