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

use crate::decode::{from_slice_lifting, Lifted};
use crate::envelope::{DecodeError, Message};
use crate::{methods, MAX_JSONRPC_VALUE_NODES};
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
/// its bytes come back apart (decoded in the message's own buffer);
/// otherwise the message is exactly what [`Message::decode`] gives.
///
/// # Errors
/// As [`Message::decode`].
pub fn decode_text(text: String) -> Result<(Message, Option<Vec<u8>>), DecodeError> {
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
        (Some(member), [one]) if one.key == member => base64_simd::STANDARD
            .check(&text.as_bytes()[one.start..one.end])
            .is_ok(),
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
    let mut buf = text.into_bytes();
    let n = match base64_simd::STANDARD.decode_inplace(&mut buf[one.start..one.end]) {
        Ok(out) => out.len(),
        // Checked above; unreachable, but never a panic.
        Err(_) => return Err(DecodeError("Invalid padding".into())),
    };
    buf.truncate(one.start + n);
    buf.drain(..one.start);
    Ok((msg, Some(buf)))
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
    use crate::ByteChunk;

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
}
