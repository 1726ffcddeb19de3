//! Relay frames (`codex.exec_server.relay.v1.RelayMessageFrame`): one per
//! WebSocket binary message. Encoded as canonical proto3 (zero values omitted,
//! `segment_count = 1` always written); decoding accepts explicit zeros, skips
//! unknown fields and never panics on any input.
//!
//! The codec is written by hand (seven tiny messages) because `prost` cannot be
//! fetched on this build machine; field numbers are those of `relay.proto`.

use std::ops::Range;

/// Only protocol version: 1.
pub const VERSION: u32 = 1;
/// Largest stream id accepted: 128 bytes.
pub const MAX_STREAM_ID_BYTES: usize = 128;
/// Largest reset reason accepted: 256 bytes.
pub const MAX_RESET_REASON_BYTES: usize = 256;
/// Largest relay WebSocket message: 256 KiB (`MAX_NOISE_RELAY_WEBSOCKET_MESSAGE_SIZE`).
pub const MAX_FRAME_BYTES: usize = 256 * 1024;
/// Largest WebSocket message a node reads from a harness: 68 KiB, one
/// Noise message (at most 65 535 bytes) and its frame's head, which is all
/// any harness sends in one (the reference's included). A half-sent message
/// is held until it is whole, by anyone holding a client relay URL: at
/// 256 KiB, 1 900 such sockets took a node from 15 MB to 530 MB.
pub const MAX_HARNESS_FRAME_BYTES: usize = 68 * 1024;
/// Reset reason the executor sends on any stream error (wire text).
pub const RESET_PROTOCOL_ERROR: &str = "noise_relay_protocol_error";
/// Reset reason our executor sends a harness it cannot serve now: it has
/// [`crate::executor::mux::MAX_ACTIVE_STREAMS`] streams open, or as many
/// handshakes awaiting the registry as it takes, or it pauses after failed
/// handshakes. Any reset ends the reference's handshake alike.
pub const RESET_EXECUTOR_BUSY: &str = "executor_busy";
/// Reset reason our relay sends an executor when a harness socket goes away.
pub const RESET_HARNESS_DISCONNECTED: &str = "harness_disconnected";

/// What a frame carries (`oneof body`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// Field 5, `RelayData`: one Noise record at `seq` (per stream, per direction, from 0).
    Data {
        /// Sequence number.
        seq: u32,
        /// Must be 0.
        segment_index: u32,
        /// Must be 1.
        segment_count: u32,
        /// Ciphertext, non-empty; shared with the message it was decoded
        /// from by [`Frame::decode_shared`].
        payload: bytes::Bytes,
    },
    /// Field 6, `RelayAck` (ignored).
    Ack,
    /// Field 7, `RelayResume`: the harness claims the stream at the relay.
    Resume {
        /// Always 0 on the wire.
        next_seq: u32,
    },
    /// Field 8, `RelayReset`: tear the stream down. The reason is unauthenticated.
    Reset {
        /// Non-empty, ≤ 256 bytes.
        reason: String,
    },
    /// Field 9, `RelayHeartbeat` (ignored).
    Heartbeat,
    /// Field 10, `RelayHandshake`: a Noise handshake message, non-empty.
    Handshake {
        /// msg1 or msg2.
        payload: Vec<u8>,
    },
}

/// One `RelayMessageFrame`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Field 1; must be [`VERSION`].
    pub version: u32,
    /// Field 2; the virtual stream.
    pub stream_id: String,
    /// Field 3; reserved, written 0.
    pub ack: u32,
    /// Field 4; reserved, written 0.
    pub ack_bits: u32,
    /// The body; `None` when absent (invalid).
    pub body: Option<Body>,
    /// Field 11 (optional W3C trace context).
    pub traceparent: Option<String>,
    /// Field 12.
    pub tracestate: Option<String>,
    /// Field 2001 (ours, absent from `relay.proto`; the reference skips it
    /// as an unknown field): on a harness's handshake frame, the transport
    /// cipher it offers besides AES-GCM; on an executor's, the one it took
    /// (see `noise::TransportCipher`). Meaningless on other frames.
    pub transport_cipher: Option<String>,
}

/// Field number of [`Frame::transport_cipher`]: far above the reference's
/// numbers, so that a field it adds later cannot collide.
pub const TRANSPORT_CIPHER_FIELD: u32 = 2001;

/// Why bytes are not a frame, or a frame breaks a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Not protobuf (truncated, bad varint, bad wire type, bad UTF-8).
    #[error("malformed relay frame")]
    Malformed,
    /// Larger than [`MAX_FRAME_BYTES`].
    #[error("relay frame too large")]
    TooLarge,
    /// `version` is not 1.
    #[error("unsupported relay frame version")]
    Version,
    /// Empty, padded or too long stream id.
    #[error("invalid relay stream id")]
    StreamId,
    /// No body.
    #[error("relay frame has no body")]
    NoBody,
    /// Data with segments other than 0/1, or an empty payload.
    #[error("invalid relay data frame")]
    Data,
    /// Reset with an empty or too long reason.
    #[error("invalid relay reset frame")]
    Reset,
    /// Handshake with an empty payload.
    #[error("invalid relay handshake frame")]
    Handshake,
}

impl Frame {
    fn new(stream_id: &str, body: Body) -> Frame {
        Frame {
            version: VERSION,
            stream_id: stream_id.to_string(),
            ack: 0,
            ack_bits: 0,
            body: Some(body),
            transport_cipher: None,
            traceparent: None,
            tracestate: None,
        }
    }

    /// A data frame.
    pub fn data(stream_id: &str, seq: u32, payload: impl Into<bytes::Bytes>) -> Frame {
        Frame::new(
            stream_id,
            Body::Data {
                seq,
                segment_index: 0,
                segment_count: 1,
                payload: payload.into(),
            },
        )
    }

    /// A resume frame (`next_seq` 0).
    pub fn resume(stream_id: &str) -> Frame {
        Frame::new(stream_id, Body::Resume { next_seq: 0 })
    }

    /// A reset frame.
    pub fn reset(stream_id: &str, reason: &str) -> Frame {
        Frame::new(
            stream_id,
            Body::Reset {
                reason: reason.to_string(),
            },
        )
    }

    /// A handshake frame.
    pub fn handshake(stream_id: &str, payload: Vec<u8>) -> Frame {
        Frame::new(stream_id, Body::Handshake { payload })
    }

    /// This frame naming `cipher` in [`Frame::transport_cipher`] (`None`
    /// leaves the field out).
    pub fn with_transport_cipher(mut self, cipher: Option<&str>) -> Frame {
        self.transport_cipher = cipher.map(str::to_string);
        self
    }

    /// Checks the rules of `RelayMessageFrame::validate` (and the older,
    /// stricter stream id rule, which is cheap).
    pub fn validate(&self) -> Result<(), FrameError> {
        match &self.body {
            Some(Body::Data { payload, .. }) => self.check(payload.len()),
            _ => self.check(0),
        }
    }

    /// The rules, a data body's payload taking `data_len` bytes.
    fn check(&self, data_len: usize) -> Result<(), FrameError> {
        if self.version != VERSION {
            return Err(FrameError::Version);
        }
        let id = &self.stream_id;
        if id.is_empty() || id.len() > MAX_STREAM_ID_BYTES || id.trim() != id {
            return Err(FrameError::StreamId);
        }
        match &self.body {
            None => Err(FrameError::NoBody),
            Some(Body::Data {
                segment_index,
                segment_count,
                ..
            }) => {
                if *segment_index != 0 || *segment_count != 1 || data_len == 0 {
                    Err(FrameError::Data)
                } else {
                    Ok(())
                }
            }
            Some(Body::Reset { reason }) => {
                if reason.is_empty() || reason.len() > MAX_RESET_REASON_BYTES {
                    Err(FrameError::Reset)
                } else {
                    Ok(())
                }
            }
            Some(Body::Handshake { payload }) if payload.is_empty() => Err(FrameError::Handshake),
            Some(_) => Ok(()),
        }
    }

    /// Canonical proto3 bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.body_len_hint());
        put_uint(&mut out, 1, self.version);
        put_bytes(&mut out, 2, self.stream_id.as_bytes(), false);
        put_uint(&mut out, 3, self.ack);
        put_uint(&mut out, 4, self.ack_bits);
        if let Some(body) = &self.body {
            let mut inner = Vec::new();
            let field = match body {
                Body::Data {
                    seq,
                    segment_index,
                    segment_count,
                    payload,
                } => {
                    put_uint(&mut inner, 1, *seq);
                    put_uint(&mut inner, 2, *segment_index);
                    put_uint(&mut inner, 3, *segment_count);
                    put_bytes(&mut inner, 4, payload, false);
                    5
                }
                Body::Ack => 6,
                Body::Resume { next_seq } => {
                    put_uint(&mut inner, 1, *next_seq);
                    7
                }
                Body::Reset { reason } => {
                    put_bytes(&mut inner, 1, reason.as_bytes(), false);
                    8
                }
                Body::Heartbeat => 9,
                Body::Handshake { payload } => {
                    put_bytes(&mut inner, 1, payload, false);
                    10
                }
            };
            put_bytes(&mut out, field, &inner, true);
        }
        if let Some(t) = &self.traceparent {
            put_bytes(&mut out, 11, t.as_bytes(), true);
        }
        if let Some(t) = &self.tracestate {
            put_bytes(&mut out, 12, t.as_bytes(), true);
        }
        if let Some(c) = &self.transport_cipher {
            put_bytes(&mut out, TRANSPORT_CIPHER_FIELD, c.as_bytes(), true);
        }
        out
    }

    /// Appends to `out` the first bytes of
    /// `Frame::data(stream_id, seq, payload).encode()` for a payload of
    /// `payload_len` bytes (1 or more): the payload after them gives
    /// exactly that frame, without encoding the payload twice (a sender
    /// seals its record into the frame after this head).
    pub fn put_data_head(out: &mut Vec<u8>, stream_id: &str, seq: u32, payload_len: usize) {
        let mut inner = Vec::with_capacity(24);
        put_uint(&mut inner, 1, seq);
        // segment_index 0 is not written (proto3 default); segment_count is 1.
        put_uint(&mut inner, 3, 1);
        put_varint(&mut inner, (4 << 3) | 2);
        put_varint(&mut inner, payload_len as u64);
        put_uint(out, 1, VERSION);
        put_bytes(out, 2, stream_id.as_bytes(), false);
        put_varint(out, (5 << 3) | 2);
        put_varint(out, (inner.len() + payload_len) as u64);
        out.extend_from_slice(&inner);
    }

    fn body_len_hint(&self) -> usize {
        match &self.body {
            Some(Body::Data { payload, .. }) => payload.len(),
            Some(Body::Handshake { payload }) => payload.len(),
            _ => 0,
        }
    }

    /// Parses one frame (no rule checks: see [`Frame::validate`]). Errors:
    /// [`FrameError::TooLarge`], [`FrameError::Malformed`].
    pub fn decode(bytes: &[u8]) -> Result<Frame, FrameError> {
        Frame::decode_with(bytes, Payload::Copied)
    }

    /// [`Frame::decode`] of a shared message: a data payload is a slice of
    /// `bytes`, not a copy (a receiver then opens the record where it lies).
    pub fn decode_shared(bytes: &bytes::Bytes) -> Result<Frame, FrameError> {
        Frame::decode_with(bytes, Payload::Shared(bytes))
    }

    /// [`Frame::decode`] without taking a data payload out: the frame's
    /// payload is left empty and its place in `bytes` returned (an empty
    /// range for any other body), so a receiver can open the record where
    /// it lies. Check the frame with [`Frame::validate_located`].
    pub fn decode_located(bytes: &[u8]) -> Result<(Frame, Range<usize>), FrameError> {
        let mut at = 0..0;
        let f = Frame::decode_with(bytes, Payload::Located(&mut at))?;
        Ok((f, at))
    }

    /// [`Frame::validate`] of a frame from [`Frame::decode_located`] whose
    /// payload takes `payload_len` bytes.
    pub fn validate_located(&self, payload_len: usize) -> Result<(), FrameError> {
        self.check(payload_len)
    }

    fn decode_with(bytes: &[u8], mut payload: Payload<'_>) -> Result<Frame, FrameError> {
        if bytes.len() > MAX_FRAME_BYTES {
            return Err(FrameError::TooLarge);
        }
        let mut f = Frame {
            version: 0,
            stream_id: String::new(),
            ack: 0,
            ack_bits: 0,
            body: None,
            traceparent: None,
            tracestate: None,
            transport_cipher: None,
        };
        const CIPHER: u64 = TRANSPORT_CIPHER_FIELD as u64;
        let mut r = Reader(bytes);
        while let Some((field, value)) = r.field()? {
            match (field, value) {
                (1, Value::Varint(v)) => f.version = v as u32,
                (2, Value::Bytes(b)) => f.stream_id = utf8(b)?,
                (3, Value::Varint(v)) => f.ack = v as u32,
                (4, Value::Varint(v)) => f.ack_bits = v as u32,
                (5, Value::Bytes(b)) => f.body = Some(decode_data(bytes, b, &mut payload)?),
                (6, Value::Bytes(_)) => f.body = Some(Body::Ack),
                (7, Value::Bytes(b)) => {
                    let mut next_seq = 0;
                    let mut r = Reader(b);
                    while let Some((field, v)) = r.field()? {
                        if let (1, Value::Varint(v)) = (field, v) {
                            next_seq = v as u32;
                        }
                    }
                    f.body = Some(Body::Resume { next_seq });
                }
                (8, Value::Bytes(b)) => {
                    let mut reason = String::new();
                    let mut r = Reader(b);
                    while let Some((field, v)) = r.field()? {
                        if let (1, Value::Bytes(b)) = (field, v) {
                            reason = utf8(b)?;
                        }
                    }
                    f.body = Some(Body::Reset { reason });
                }
                (9, Value::Bytes(_)) => f.body = Some(Body::Heartbeat),
                (10, Value::Bytes(b)) => {
                    let mut payload = Vec::new();
                    let mut r = Reader(b);
                    while let Some((field, v)) = r.field()? {
                        if let (1, Value::Bytes(b)) = (field, v) {
                            payload = b.to_vec();
                        }
                    }
                    f.body = Some(Body::Handshake { payload });
                }
                (11, Value::Bytes(b)) => f.traceparent = Some(utf8(b)?),
                (12, Value::Bytes(b)) => f.tracestate = Some(utf8(b)?),
                // Ours, and only a preference: a value that is not UTF-8
                // text is no offer (AES-GCM), never a reason to drop the
                // handshake and leave the peer waiting.
                (CIPHER, Value::Bytes(b)) => {
                    f.transport_cipher = std::str::from_utf8(b).ok().map(str::to_string)
                }
                (CIPHER, _) => f.transport_cipher = None,
                // A known field with the wrong wire type is not this message.
                (1..=12, _) => return Err(FrameError::Malformed),
                _ => {} // unknown fields are skipped, as proto3 requires
            }
        }
        Ok(f)
    }
}

/// Reads only the stream id and whether the body is data, without copying a
/// payload: what a relay needs to route a frame it never opens.
pub fn peek_stream_id(bytes: &[u8]) -> Result<String, FrameError> {
    let mut r = Reader(bytes);
    let mut id = None;
    while let Some((field, value)) = r.field()? {
        if let (2, Value::Bytes(b)) = (field, value) {
            id = Some(utf8(b)?);
        }
    }
    id.ok_or(FrameError::StreamId)
}

/// What decoding does with a data frame's payload.
enum Payload<'a> {
    /// Copies it into the frame.
    Copied,
    /// Slices it from this message, the one being decoded.
    Shared(&'a bytes::Bytes),
    /// Leaves it out and writes here where it lies in the message.
    Located(&'a mut Range<usize>),
}

/// Field 5, `b`, of the message `whole`.
fn decode_data(whole: &[u8], b: &[u8], mode: &mut Payload<'_>) -> Result<Body, FrameError> {
    let (mut seq, mut segment_index, mut segment_count) = (0, 0, 0);
    let mut payload = bytes::Bytes::new();
    let mut r = Reader(b);
    while let Some((field, v)) = r.field()? {
        match (field, v) {
            (1, Value::Varint(v)) => seq = v as u32,
            (2, Value::Varint(v)) => segment_index = v as u32,
            (3, Value::Varint(v)) => segment_count = v as u32,
            (4, Value::Bytes(b)) => match mode {
                Payload::Copied => payload = bytes::Bytes::copy_from_slice(b),
                Payload::Shared(message) => payload = message.slice_ref(b),
                Payload::Located(at) => {
                    // `b` is a subslice of `whole`, so this cannot underflow.
                    let start = b.as_ptr() as usize - whole.as_ptr() as usize;
                    **at = start..start + b.len();
                }
            },
            (1..=4, _) => return Err(FrameError::Malformed),
            _ => {}
        }
    }
    Ok(Body::Data {
        seq,
        segment_index,
        segment_count,
        payload,
    })
}

fn utf8(b: &[u8]) -> Result<String, FrameError> {
    String::from_utf8(b.to_vec()).map_err(|_| FrameError::Malformed)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_uint(out: &mut Vec<u8>, field: u32, v: u32) {
    if v != 0 {
        put_varint(out, (field as u64) << 3);
        put_varint(out, v as u64);
    }
}

/// Writes a length-delimited field; empty values only when `always`
/// (message fields and set optionals are present even when empty).
fn put_bytes(out: &mut Vec<u8>, field: u32, b: &[u8], always: bool) {
    if b.is_empty() && !always {
        return;
    }
    put_varint(out, ((field as u64) << 3) | 2);
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, FrameError> {
        let mut v = 0u64;
        for i in 0..10 {
            let (&b, rest) = self.0.split_first().ok_or(FrameError::Malformed)?;
            self.0 = rest;
            v |= ((b & 0x7f) as u64) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(FrameError::Malformed)
    }

    fn skip(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.0.len() < n {
            return Err(FrameError::Malformed);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }

    fn field(&mut self) -> Result<Option<(u64, Value<'a>)>, FrameError> {
        if self.0.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = key >> 3;
        if field == 0 {
            return Err(FrameError::Malformed);
        }
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                self.skip(8)?;
                Value::Fixed
            }
            2 => {
                let len = self.varint()?;
                let len = usize::try_from(len).map_err(|_| FrameError::Malformed)?;
                Value::Bytes(self.skip(len)?)
            }
            5 => {
                self.skip(4)?;
                Value::Fixed
            }
            _ => return Err(FrameError::Malformed),
        };
        Ok(Some((field, value)))
    }
}

mod route;
pub use route::data_stream_id;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_bytes_match_the_reference() {
        let id = "0f8fad5b-d9cb-469f-a165-70867728950e";
        let mut want = vec![0x08, 0x01, 0x12, 0x24];
        want.extend_from_slice(id.as_bytes());
        want.extend_from_slice(&[0x3a, 0x00]);
        assert_eq!(Frame::resume(id).encode(), want);
        assert_eq!(Frame::decode(&want).unwrap(), Frame::resume(id));
    }

    #[test]
    fn data_omits_zeros_and_keeps_segment_count() {
        let f = Frame::data("s", 0, vec![1, 2, 3]);
        let b = f.encode();
        // version, stream id, then field 5 with segment_count=1 and payload only.
        assert_eq!(
            b,
            vec![0x08, 0x01, 0x12, 0x01, b's', 0x2a, 0x07, 0x18, 0x01, 0x22, 0x03, 1, 2, 3]
        );
        assert_eq!(Frame::decode(&b).unwrap(), f);
        let f = Frame::data("s", 300, vec![9]);
        assert_eq!(Frame::decode(&f.encode()).unwrap(), f);
    }

    #[test]
    fn explicit_zeros_and_unknown_fields_are_accepted() {
        let mut b = vec![0x08, 0x01, 0x12, 0x01, b's', 0x18, 0x00, 0x20, 0x00];
        b.extend_from_slice(&[0xa0, 0x06, 0x05]); // field 100 varint
        b.extend_from_slice(&[0x4a, 0x00]); // heartbeat
        let f = Frame::decode(&b).unwrap();
        assert_eq!(f.body, Some(Body::Heartbeat));
        assert!(f.validate().is_ok());
    }

    /// Our transport cipher field: absent unless set (the reference's bytes
    /// unchanged), field 2001 when set, read back, and skipped by a decoder
    /// that does not know it (as the reference's prost does).
    #[test]
    fn transport_cipher_field_round_trips_and_is_ours_alone() {
        let plain = Frame::handshake("s", vec![1; 4]);
        assert_eq!(plain.transport_cipher, None);
        let offered = plain.clone().with_transport_cipher(Some("AEGIS-256X2"));
        let b = offered.encode();
        // The plain frame's bytes, then tag (2001 << 3 | 2) as a varint and the value.
        let mut want = plain.encode();
        want.extend_from_slice(&[0x8a, 0x7d, 11]);
        want.extend_from_slice(b"AEGIS-256X2");
        assert_eq!(b, want);
        assert_eq!(Frame::decode(&b).unwrap(), offered);
        assert_eq!(
            Frame::decode(&plain.encode()).unwrap().transport_cipher,
            None
        );
        // A varint or bytes that are not UTF-8 under our field number are
        // no offer: the frame still decodes (its handshake goes on in AES-GCM).
        for junk in [&[0x88, 0x7d, 1][..], &[0x8a, 0x7d, 2, 0xff, 0x41][..]] {
            let mut odd = offered.encode();
            odd.extend_from_slice(junk);
            assert_eq!(Frame::decode(&odd).unwrap(), plain, "{junk:?}");
        }
        // The stream id reader (the node's) ignores it.
        assert_eq!(peek_stream_id(&b).unwrap(), "s");
    }

    #[test]
    fn rule_violations() {
        let mut f = Frame::data("s", 0, vec![1]);
        f.version = 2;
        assert_eq!(f.validate(), Err(FrameError::Version));
        assert_eq!(
            Frame::data("", 0, vec![1]).validate(),
            Err(FrameError::StreamId)
        );
        assert_eq!(
            Frame::data(" s", 0, vec![1]).validate(),
            Err(FrameError::StreamId)
        );
        assert_eq!(
            Frame::data(&"x".repeat(129), 0, vec![1]).validate(),
            Err(FrameError::StreamId)
        );
        assert_eq!(
            Frame::data("s", 0, vec![]).validate(),
            Err(FrameError::Data)
        );
        let mut f = Frame::data("s", 0, vec![1]);
        if let Some(Body::Data { segment_count, .. }) = &mut f.body {
            *segment_count = 2;
        }
        assert_eq!(
            Frame::decode(&f.encode()).unwrap().validate(),
            Err(FrameError::Data)
        );
        assert_eq!(Frame::reset("s", "").validate(), Err(FrameError::Reset));
        assert_eq!(
            Frame::handshake("s", vec![]).validate(),
            Err(FrameError::Handshake)
        );
        let mut f = Frame::resume("s");
        f.body = None;
        assert_eq!(
            Frame::decode(&f.encode()).unwrap().validate(),
            Err(FrameError::NoBody)
        );
    }

    #[test]
    fn garbage_never_panics() {
        assert_eq!(
            Frame::decode(&[0x12, 0x05, b'a']),
            Err(FrameError::Malformed)
        );
        assert_eq!(Frame::decode(&[0xff; 11]), Err(FrameError::Malformed));
        assert_eq!(Frame::decode(&[0x0f]), Err(FrameError::Malformed));
        assert_eq!(
            Frame::decode(&[0x12, 0x01, 0xff]),
            Err(FrameError::Malformed)
        );
        assert_eq!(Frame::decode(&[0x0a, 0x00]), Err(FrameError::Malformed));
        assert_eq!(
            Frame::decode(&vec![0u8; MAX_FRAME_BYTES + 1]),
            Err(FrameError::TooLarge)
        );
        // A cheap deterministic fuzz: every prefix and every single-byte flip
        // of a valid frame decodes or fails cleanly.
        let good = Frame::handshake("stream", vec![7; 40]).encode();
        for n in 0..good.len() {
            let _ = Frame::decode(&good[..n]);
            for bit in 0..8 {
                let mut b = good.clone();
                b[n] ^= 1 << bit;
                if let Ok(f) = Frame::decode(&b) {
                    let _ = f.validate();
                    let _ = f.encode();
                }
            }
        }
        assert_eq!(peek_stream_id(&good).unwrap(), "stream");
    }
}
