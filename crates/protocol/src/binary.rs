//! Binary frames (ours, opt-in): a JSON-RPC message whose one byte-carrying
//! member travels as raw bytes after a small header instead of as base64 inside
//! the JSON text. Specified in `docs/binary-frames.md`.
//!
//! Layout of one frame (one WebSocket binary message):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | kind: [`Kind::ParamsChunk`] (`0x01`) or [`Kind::ResultChunk`] (`0x02`) |
//! | 1 | 4 | head length `H`, unsigned big-endian, at most [`MAX_HEAD_BYTES`] |
//! | 5 | `H` | head: the JSON-RPC message as UTF-8 JSON text, without the bytes member |
//! | 5 + `H` | rest | payload: the member's raw bytes |
//!
//! The kind names the member the payload stands for: `params.chunk` of a
//! request or notification, or `result.chunk` of a response. Everything else
//! (ids, method, seq, stream, eof) stays in the head, decoded by the same
//! bounded decoder as a text message.

use serde_json::Value;

/// The version of binary frames this crate speaks, announced in `initialize`
/// (`extensions.binaryFrames`) and answered in its result (`binaryFrames`).
pub const VERSION: u32 = 1;

/// Bytes before the head: kind (1) and head length (4).
pub const HEADER_BYTES: usize = 5;

/// Longest head accepted: 64 KiB. A head holds ids and small fields only.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The member of the message the payload stands for (always named `chunk`).
pub const PAYLOAD_MEMBER: &str = "chunk";

/// Which member the payload of a frame replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `params.chunk` of a request or notification (`0x01`): `process/output`,
    /// `process/write`, `fs/writeBlock`.
    ParamsChunk = 1,
    /// `result.chunk` of a response (`0x02`): `fs/readBlock`.
    ResultChunk = 2,
}

/// A frame that does not follow the layout. Its text names the fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError(&'static str);

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for FrameError {}

/// True when `frame` starts like a binary frame (a kind byte). A JSON text
/// message never does: it starts with `{`, `[` or whitespace.
pub fn looks_binary(frame: &[u8]) -> bool {
    matches!(frame.first(), Some(1 | 2))
}

/// Builds a frame of `kind` from the head's JSON text and the payload (one
/// allocation, the payload copied once).
pub fn encode(kind: Kind, head: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + head.len() + payload.len());
    out.push(kind as u8);
    // Heads are built by this program from small fields: far below 4 GiB.
    out.extend_from_slice(&(head.len() as u32).to_be_bytes());
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(payload);
    out
}

/// Builds a frame in `buf`, whose first `headroom` bytes are free room and
/// whose rest is the payload: the header and head are written at the end of
/// the room, and the frame starts at the returned offset (the payload is
/// not moved). `None`, and `buf` unchanged, when the room is too small.
pub fn encode_in_headroom(
    kind: Kind,
    head: &str,
    buf: &mut [u8],
    headroom: usize,
) -> Option<usize> {
    let start = headroom.checked_sub(HEADER_BYTES + head.len())?;
    if headroom > buf.len() {
        return None;
    }
    buf[start] = kind as u8;
    // Heads are built by this program from small fields: far below 4 GiB.
    buf[start + 1..start + HEADER_BYTES].copy_from_slice(&(head.len() as u32).to_be_bytes());
    buf[start + HEADER_BYTES..headroom].copy_from_slice(head.as_bytes());
    Some(start)
}

/// Bytes with free room in front for a frame's header and head: a frame is
/// built around them ([`FrameBuf::into_frame`]) without moving them, and
/// the frame and the bytes then share one allocation. A reader fills one
/// (the server a child's output, a client a file's block) straight from the
/// source.
#[derive(Debug, Default)]
pub struct FrameBuf {
    /// `headroom` bytes of room, then the payload.
    vec: Vec<u8>,
    headroom: usize,
}

impl FrameBuf {
    /// An empty payload with `headroom` bytes of room in front and capacity
    /// for `capacity` payload bytes (neither zeroed beyond the room).
    pub fn with_room(headroom: usize, capacity: usize) -> Self {
        let mut vec = Vec::with_capacity(headroom + capacity);
        vec.resize(headroom, 0);
        FrameBuf { vec, headroom }
    }

    /// Takes `vec`: its first `headroom` bytes (at most all) are room, the
    /// rest is the payload.
    pub fn from_parts(vec: Vec<u8>, headroom: usize) -> Self {
        let headroom = headroom.min(vec.len());
        FrameBuf { vec, headroom }
    }

    /// A copy of `data` with `headroom` bytes of room in front.
    pub fn copy_of(data: &[u8], headroom: usize) -> Self {
        let mut buf = Self::with_room(headroom, data.len());
        buf.vec.extend_from_slice(data);
        buf
    }

    /// The room and the payload as one vector, to read more payload into
    /// (bytes appended are payload; the first [`Self::headroom`] bytes must
    /// stay).
    pub fn as_mut_vec(&mut self) -> &mut Vec<u8> {
        &mut self.vec
    }

    /// Bytes of room in front of the payload.
    pub fn headroom(&self) -> usize {
        self.headroom
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        self.vec.get(self.headroom..).unwrap_or_default()
    }

    /// The payload alone (a view of the buffer, not a copy).
    pub fn into_payload(self) -> bytes::Bytes {
        let headroom = self.headroom.min(self.vec.len());
        bytes::Bytes::from(self.vec).slice(headroom..)
    }

    /// A frame of `kind` with `head` (JSON text) in front of the payload,
    /// and the payload alone; both share one allocation. A head longer than
    /// the room costs one copy of the payload.
    pub fn into_frame(mut self, kind: Kind, head: &str) -> (bytes::Bytes, bytes::Bytes) {
        match encode_in_headroom(kind, head, &mut self.vec, self.headroom) {
            Some(start) => {
                let headroom = self.headroom;
                let all = bytes::Bytes::from(self.vec);
                (all.slice(start..), all.slice(headroom..))
            }
            None => {
                let payload = self.into_payload();
                let frame = bytes::Bytes::from(encode(kind, head, &payload));
                (frame, payload)
            }
        }
    }
}

/// Splits a frame into its kind, head text and payload (borrowed: the caller
/// copies the payload once, where it keeps it).
///
/// # Errors
/// [`FrameError`] for an unknown kind, a frame shorter than its header or
/// head, a head longer than [`MAX_HEAD_BYTES`], or a head that is not UTF-8.
pub fn decode(frame: &[u8]) -> Result<(Kind, &str, &[u8]), FrameError> {
    let kind = match frame.first() {
        Some(1) => Kind::ParamsChunk,
        Some(2) => Kind::ResultChunk,
        Some(_) => return Err(FrameError("unknown binary frame kind")),
        None => return Err(FrameError("empty binary frame")),
    };
    let Some(len) = frame.get(1..HEADER_BYTES) else {
        return Err(FrameError("binary frame shorter than its header"));
    };
    let head_len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
    if head_len > MAX_HEAD_BYTES {
        return Err(FrameError("binary frame head longer than 64 KiB"));
    }
    let end = HEADER_BYTES + head_len;
    let Some(head) = frame.get(HEADER_BYTES..end) else {
        return Err(FrameError("binary frame shorter than its head"));
    };
    let head =
        std::str::from_utf8(head).map_err(|_| FrameError("binary frame head is not UTF-8"))?;
    Ok((kind, head, &frame[end..]))
}

/// Decodes a whole frame: the head as a JSON-RPC message (same bounded
/// decoder as text), checked against the kind (a [`Kind::ParamsChunk`] head
/// is a request or notification, a [`Kind::ResultChunk`] head a response),
/// and the payload (a view of the frame, not a copy).
///
/// # Errors
/// The fault's text, for a -32600 answer with id -1.
pub fn decode_message(frame: &bytes::Bytes) -> Result<(crate::Message, bytes::Bytes), String> {
    use crate::Message;
    let (kind, head, payload) = decode(frame).map_err(|e| e.to_string())?;
    let payload_start = frame.len() - payload.len();
    let msg = Message::decode(head.as_bytes()).map_err(|e| e.to_string())?;
    let fits = matches!(
        (kind, &msg),
        (
            Kind::ParamsChunk,
            Message::Request(_) | Message::Notification(_)
        ) | (Kind::ResultChunk, Message::Response(_))
    );
    if !fits {
        return Err("binary frame kind does not match its head".into());
    }
    // A view of the frame's buffer: the payload is not copied.
    Ok((msg, frame.slice(payload_start..)))
}

/// Puts an empty `chunk` member into `obj` (the params or result object of a
/// frame's head) so that it decodes as the method's usual type, whose `chunk`
/// the caller then replaces with the payload.
///
/// # Errors
/// When `obj` is not an object, or already has a `chunk` (the bytes would be
/// given twice).
pub fn add_empty_chunk(obj: &mut Value) -> Result<(), &'static str> {
    add_empty_member(obj, PAYLOAD_MEMBER)
}

/// [`add_empty_chunk`] for a member of another name (`dataBase64`).
///
/// # Errors
/// As [`add_empty_chunk`].
pub fn add_empty_member(obj: &mut Value, member: &str) -> Result<(), &'static str> {
    match obj {
        Value::Object(m) => {
            if m.contains_key(member) {
                return Err("the bytes are given both in the params and as the payload");
            }
            m.insert(member.into(), Value::String(String::new()));
            Ok(())
        }
        _ => Err("params carrying a payload must be an object"),
    }
}

/// Types whose bytes member can come apart from the JSON: as a binary
/// frame's payload, or decoded straight out of the message buffer.
pub trait WithPayload {
    /// The member's wire name (`chunk`, or `dataBase64` for `fs/writeFile`).
    const MEMBER: &'static str = PAYLOAD_MEMBER;
    /// Replaces the (empty) member with the bytes.
    fn set_payload(&mut self, bytes: bytes::Bytes);
}

impl WithPayload for crate::types::WriteFileParams {
    const MEMBER: &'static str = "dataBase64";
    fn set_payload(&mut self, bytes: bytes::Bytes) {
        self.data_base64 = crate::bytes::LenientChunk::Valid(crate::ByteChunk(bytes));
    }
}

impl WithPayload for crate::types::WriteParams {
    fn set_payload(&mut self, bytes: bytes::Bytes) {
        self.chunk.0 = bytes;
    }
}

impl WithPayload for crate::types::WriteBlockParams {
    fn set_payload(&mut self, bytes: bytes::Bytes) {
        self.chunk.0 = bytes;
    }
}

impl WithPayload for crate::types::ReadBlockResponse {
    fn set_payload(&mut self, bytes: bytes::Bytes) {
        self.chunk.0 = bytes;
    }
}

impl WithPayload for crate::types::ProcessOutputNotification {
    fn set_payload(&mut self, bytes: bytes::Bytes) {
        self.chunk.0 = bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_built_in_headroom_equals_an_encoded_one() {
        let mut buf = vec![0u8; 40];
        buf.extend_from_slice(b"payload");
        let head = r#"{"id":7,"result":{}}"#;
        let start = encode_in_headroom(Kind::ResultChunk, head, &mut buf, 40).unwrap();
        assert_eq!(
            &buf[start..],
            &encode(Kind::ResultChunk, head, b"payload")[..]
        );
        // Too little room: nothing written.
        let mut small = vec![9u8; 10];
        assert_eq!(
            encode_in_headroom(Kind::ResultChunk, head, &mut small, 10),
            None
        );
        assert_eq!(small, vec![9u8; 10]);
    }

    #[test]
    fn frames_round_trip_and_bad_ones_are_named() {
        let head =
            r#"{"method":"process/output","params":{"processId":"p","seq":3,"stream":"stdout"}}"#;
        for payload in [&b""[..], b"\0\xff raw \n bytes", &[7u8; 70_000]] {
            let f = encode(Kind::ParamsChunk, head, payload);
            assert!(looks_binary(&f));
            let (k, h, p) = decode(&f).unwrap();
            assert_eq!((k, h, p), (Kind::ParamsChunk, head, payload));
        }
        let f = encode(Kind::ResultChunk, "{}", b"x");
        assert_eq!(decode(&f).unwrap().0, Kind::ResultChunk);
        assert!(!looks_binary(b"{\"id\":1}"));
        assert!(!looks_binary(b" {}"));
        let bad: [&[u8]; 6] = [
            b"",
            b"\x03\0\0\0\0",
            b"\x01\0\0",
            b"\x01\0\0\0\x09{}",
            b"\x01\0\x01\0\x01",
            b"\x01\0\0\0\x02\xff\xfe",
        ];
        for f in bad {
            assert!(decode(f).is_err(), "{f:?}");
        }
    }

    #[test]
    fn empty_chunk_goes_in_once() {
        let mut v = serde_json::json!({"processId": "p"});
        add_empty_chunk(&mut v).unwrap();
        assert_eq!(v["chunk"], "");
        assert!(add_empty_chunk(&mut v).is_err());
        assert!(add_empty_chunk(&mut Value::Null).is_err());
    }
}
