//! Reads WebSocket frames into whole messages. A large payload goes from the
//! socket straight into its message's buffer (sized once from the frame
//! header, never zeroed, unmasked as it lands); small frames are read
//! through a short buffer so that many of them cost one system call.

use bytes::{Buf, BufMut, BytesMut};
use exec_server_fastpath::lift::{Finished, HotLift, LiftedText};
use exec_server_wsframe::frame::{
    parse_header, Header, OpCode, ProtocolViolation, MAX_HEADER_BYTES,
};
use exec_server_wsframe::mask::apply_mask;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_tungstenite::tungstenite::protocol::Role;

/// Room a fragmented message's first buffer keeps beyond its first
/// fragment: 64 KiB.
const FRAGMENT_SLACK_BYTES: usize = 64 * 1024;

/// A client's text message this long (its first frame, or fragmented) is
/// followed by a [`HotLift`] as it arrives: 256 KiB.
const LIFT_FROM_BYTES: usize = 256 * 1024;

/// New bytes that make the lift look again: 1 MiB (most of each step then
/// decodes straight into place; the buffer holds at most this much base64).
const LIFT_STEP_BYTES: usize = 1024 * 1024;

/// A payload remainder at least this long is read straight into its
/// message rather than staged in the read buffer and copied: 8 KiB.
const DIRECT_READ_MIN_BYTES: usize = 8 * 1024;

/// A data frame at least this long makes the reader expect another: 64 KiB.
/// The next header is then read on its own (at most [`MAX_HEADER_BYTES`]),
/// so that the payload behind it goes straight into its message instead of
/// arriving in the read buffer and being copied (in a stream of 171 KiB
/// frames read through a 128 KiB buffer, that copy was a sixth of the
/// receiver's time). One more system call a frame, against a copy of up to
/// the buffer's size.
const BULK_FRAME_BYTES: u64 = 64 * 1024;

/// What the reader yields.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A whole text message (not yet checked as UTF-8).
    Text(Vec<u8>),
    /// A whole text message whose hot member was lifted as it arrived
    /// (skeleton not yet checked as UTF-8).
    Lifted(LiftedText),
    /// A whole binary message.
    Binary(Vec<u8>),
    /// A ping's payload (to be echoed in a pong).
    Ping(Vec<u8>),
    /// The peer began the closing handshake, with its status code if any.
    Close(Option<u16>),
}

/// Why reading stopped.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The socket failed.
    Io(std::io::Error),
    /// The peer closed the socket without a close frame (or mid-frame).
    Eof,
    /// The peer broke RFC 6455 (answered with close code 1002).
    Protocol(&'static str),
    /// A message would exceed the limit (answered with close code 1009).
    TooBig {
        /// The limit, bytes.
        max: usize,
    },
}

impl From<ProtocolViolation> for ReadError {
    fn from(v: ProtocolViolation) -> Self {
        ReadError::Protocol(v.0)
    }
}

impl From<std::io::Error> for ReadError {
    fn from(e: std::io::Error) -> Self {
        ReadError::Io(e)
    }
}

/// The read side of a WebSocket after its handshake.
pub(crate) struct FrameReader<R> {
    io: R,
    /// Bytes read but not yet taken.
    buf: BytesMut,
    /// Size of one read into `buf`; a payload remainder at least this long
    /// is read straight into its message.
    buf_bytes: usize,
    role: Role,
    max_message: usize,
    /// A fragmented message in progress (a control frame may come between
    /// its fragments).
    partial: Option<Partial>,
    /// The last data frame was at least [`BULK_FRAME_BYTES`] long.
    bulk: bool,
}

/// A message being received.
struct Partial {
    op: OpCode,
    data: Vec<u8>,
    /// Payload bytes received (`data` is shorter once a lift decoded some).
    received: usize,
    lift: Option<HotLift>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader for `role`'s side (a server requires masked frames, a
    /// client unmasked ones) refusing messages over `max_message` bytes.
    pub(crate) fn new(io: R, role: Role, buf_bytes: usize, max_message: usize) -> Self {
        let buf_bytes = buf_bytes.clamp(1024, 1 << 20);
        FrameReader {
            io,
            buf: BytesMut::new(),
            buf_bytes,
            role,
            max_message,
            partial: None,
            bulk: false,
        }
    }

    /// The next message or control event.
    pub(crate) async fn next_event(&mut self) -> Result<Event, ReadError> {
        loop {
            let h = self.read_header().await?;
            match (self.role, h.mask.is_some()) {
                (Role::Server, false) => {
                    return Err(ReadError::Protocol("a client frame is not masked"))
                }
                (Role::Client, true) => {
                    return Err(ReadError::Protocol("a server frame is masked"))
                }
                _ => {}
            }
            if h.opcode.is_control() {
                // At most 125 bytes (checked by the header parser).
                let mut payload = Vec::with_capacity(h.len as usize);
                self.read_payload(&mut payload, &h, None).await?;
                match h.opcode {
                    OpCode::Ping => return Ok(Event::Ping(payload)),
                    OpCode::Close => return Ok(Event::Close(close_code(&payload)?)),
                    _ => continue, // a pong: nothing was waiting for it
                }
            }
            // Not cancel-safe: a message in progress lives here between
            // frames, and an error ends the connection.
            let mut m = match (h.opcode, self.partial.take()) {
                (OpCode::Continue, Some(p)) => p,
                (OpCode::Continue, None) => {
                    return Err(ReadError::Protocol(
                        "a continuation frame without a message",
                    ))
                }
                (_, Some(_)) => {
                    return Err(ReadError::Protocol(
                        "a new message began before the last one ended",
                    ))
                }
                (op, None) => Partial {
                    op,
                    data: Vec::new(),
                    received: 0,
                    // A client's long text message: maybe a large file.
                    lift: (self.role == Role::Server
                        && op == OpCode::Text
                        && (!h.fin || h.len >= LIFT_FROM_BYTES as u64))
                        .then(HotLift::new),
                },
            };
            self.bulk = h.len >= BULK_FRAME_BYTES;
            let total = (m.received as u64).saturating_add(h.len);
            if total > self.max_message as u64 {
                return Err(ReadError::TooBig {
                    max: self.max_message,
                });
            }
            self.read_payload(&mut m.data, &h, m.lift.as_mut()).await?;
            m.received += h.len as usize;
            if !h.fin {
                self.partial = Some(m);
                continue;
            }
            let mut data = m.data;
            if data.capacity() - data.len() > FRAGMENT_SLACK_BYTES {
                // The address space asked for a long message, given back
                // (shrinking in place).
                data.shrink_to_fit();
            }
            return Ok(match (m.op, m.lift) {
                (OpCode::Binary, _) => Event::Binary(data),
                (_, Some(lift)) => match lift.finish(data) {
                    Finished::Text(data) => Event::Text(data),
                    Finished::Lifted(lifted) => Event::Lifted(lifted),
                },
                (_, None) => Event::Text(data),
            });
        }
    }

    /// The next frame header (bytes consumed).
    async fn read_header(&mut self) -> Result<Header, ReadError> {
        loop {
            if let Some(h) = parse_header(&self.buf)? {
                self.buf.advance(h.header_len);
                return Ok(h);
            }
            let most = if self.bulk {
                MAX_HEADER_BYTES - self.buf.len().min(MAX_HEADER_BYTES - 1)
            } else {
                self.buf_bytes
            };
            self.fill(most).await?;
        }
    }

    /// One read of at most `most` bytes into `buf`; EOF is an error (a
    /// frame or message is due).
    async fn fill(&mut self, most: usize) -> Result<(), ReadError> {
        if self.buf.capacity() - self.buf.len() < self.buf_bytes / 2 {
            self.buf.reserve(self.buf_bytes);
        }
        match self.io.read_buf(&mut (&mut self.buf).limit(most)).await? {
            0 => Err(ReadError::Eof),
            _ => Ok(()),
        }
    }

    /// Appends the frame's payload to `data`, unmasked; `lift` follows it
    /// (and may decode some of `data` in place) every [`LIFT_STEP_BYTES`].
    async fn read_payload(
        &mut self,
        data: &mut Vec<u8>,
        h: &Header,
        mut lift: Option<&mut HotLift>,
    ) -> Result<(), ReadError> {
        // The size was checked against the message limit.
        let len = h.len as usize;
        let start = data.len();
        if start == 0 {
            // A single frame is the whole message; a first fragment gets
            // room for a short last one too (a 1 MiB block sent as 1 MiB and
            // a few bytes must not need a second, larger buffer).
            data.reserve_exact(if h.fin {
                len
            } else {
                len + FRAGMENT_SLACK_BYTES
            });
            exec_server_sysio::huge_pages::advise_huge_pages(data);
        } else if data.capacity() < start + len {
            // A fragmented message: its total is unknown. A short one
            // doubles. A long one asks once for address space up to the
            // limit: pages cost nothing until written, and the buffer then
            // never moves again (moving a large buffer splits its huge
            // pages). Where that is refused, it doubles.
            let long = start + len >= exec_server_sysio::huge_pages::HUGE_PAGE_MIN_BYTES;
            if !long || data.try_reserve_exact(self.max_message - start).is_err() {
                let target = (start + len).max(2 * data.capacity());
                data.reserve_exact(target - start);
            }
            exec_server_sysio::huge_pages::advise_huge_pages(data);
        }
        let mut remaining = len;
        let mut unseen = 0;
        while remaining > 0 {
            let at = data.len();
            let before = remaining;
            if !self.buf.is_empty() {
                let n = remaining.min(self.buf.len());
                data.extend_from_slice(&self.buf[..n]);
                self.buf.advance(n);
                remaining -= n;
            } else if remaining >= DIRECT_READ_MIN_BYTES.min(self.buf_bytes) {
                // Straight into the message: no staging copy, no zeroing.
                let mut room = (&mut *data).limit(remaining);
                match self.io.read_buf(&mut room).await? {
                    0 => return Err(ReadError::Eof),
                    n => remaining -= n,
                }
            } else {
                self.fill(self.buf_bytes).await?;
                continue;
            }
            if let Some(key) = h.mask {
                // While the bytes are still in cache.
                apply_mask(&mut data[at..], key, len - before);
            }
            unseen += before - remaining;
            if let Some(lift) = lift.as_deref_mut() {
                if unseen >= LIFT_STEP_BYTES || remaining == 0 {
                    lift.progress(data);
                    unseen = 0;
                }
            }
        }
        Ok(())
    }
}

/// The status code of a close frame's payload (none for an empty one).
fn close_code(payload: &[u8]) -> Result<Option<u16>, ReadError> {
    match payload {
        [] => Ok(None),
        [_] => Err(ReadError::Protocol("a close frame with a one-byte payload")),
        [a, b, reason @ ..] => {
            if std::str::from_utf8(reason).is_err() {
                return Err(ReadError::Protocol("a close reason that is not UTF-8"));
            }
            let code = u16::from_be_bytes([*a, *b]);
            // Codes a peer may send (RFC 6455 §7.4): the defined ones that
            // are not reserved for local use, and the registered and
            // private ranges.
            if !matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999) {
                return Err(ReadError::Protocol(
                    "a close frame with an invalid status code",
                ));
            }
            Ok(Some(code))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exec_server_wsframe::frame::header;

    /// Frames as a client sends them (masked).
    fn client_frame(fin: bool, op: OpCode, payload: &[u8]) -> Vec<u8> {
        let key = [9, 8, 7, 6];
        let mut p = payload.to_vec();
        apply_mask(&mut p, key, 0);
        [header(fin, op, p.len(), Some(key)).as_slice(), &p].concat()
    }

    /// One message as a client sends it in fragments of `piece` bytes.
    fn client_fragments(op: OpCode, message: &[u8], piece: usize) -> Vec<u8> {
        let pieces: Vec<&[u8]> = message.chunks(piece).collect();
        let mut wire = Vec::new();
        for (i, p) in pieces.iter().enumerate() {
            let op = if i == 0 { op } else { OpCode::Continue };
            wire.extend(client_frame(i + 1 == pieces.len(), op, p));
        }
        wire
    }

    async fn events(wire: Vec<u8>, role: Role, max: usize) -> Vec<Result<Event, String>> {
        // In odd-sized pieces: headers and payloads split anywhere.
        events_in_pieces(wire, role, max, 1000).await
    }

    async fn events_in_pieces(
        wire: Vec<u8>,
        role: Role,
        max: usize,
        piece: usize,
    ) -> Vec<Result<Event, String>> {
        let (mut a, b) = tokio::io::duplex(1 << 16);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for piece in wire.chunks(piece) {
                a.write_all(piece).await.unwrap();
            }
        });
        let mut r = FrameReader::new(b, role, 4096, max);
        let mut out = Vec::new();
        loop {
            match r.next_event().await {
                Ok(e) => out.push(Ok(e)),
                Err(ReadError::Eof) => break,
                Err(e) => {
                    out.push(Err(format!("{e:?}")));
                    break;
                }
            }
        }
        writer.await.unwrap();
        out
    }

    #[tokio::test]
    async fn fragmented_messages_with_a_ping_between_come_out_whole_and_unmasked() {
        let big: Vec<u8> = (0..300_001u32).map(|i| (i % 251) as u8).collect();
        let wire = [
            client_frame(false, OpCode::Text, b"hel"),
            client_frame(true, OpCode::Ping, b"p"),
            client_frame(true, OpCode::Continue, b"lo"),
            client_frame(false, OpCode::Binary, &big[..100_000]),
            client_frame(true, OpCode::Continue, &big[100_000..]),
            client_frame(true, OpCode::Close, &[0x03, 0xE8]),
        ]
        .concat();
        let got = events(wire, Role::Server, 1 << 20).await;
        assert_eq!(
            got,
            vec![
                Ok(Event::Ping(b"p".to_vec())),
                Ok(Event::Text(b"hello".to_vec())),
                Ok(Event::Binary(big)),
                Ok(Event::Close(Some(1000))),
            ]
        );
    }

    #[tokio::test]
    async fn bulk_frames_and_small_ones_in_turn_come_out_exact_however_the_bytes_arrive() {
        // After a bulk frame the next header is read on its own; a small
        // frame, a ping or a header split anywhere must not upset that.
        let payload = |n: usize, salt: u32| -> Vec<u8> {
            (0..n as u32)
                .map(|i| (i.wrapping_mul(31) ^ salt) as u8)
                .collect()
        };
        let sizes = [
            70_000, 3, 200_000, 65_536, 125, 65_535, 1, 100_000, 0, 90_000,
        ];
        let messages: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, n)| payload(*n, i as u32))
            .collect();
        for role in [Role::Server, Role::Client] {
            let mut wire = Vec::new();
            for (i, m) in messages.iter().enumerate() {
                let key = (role == Role::Server).then_some([1, 2, 3, i as u8]);
                let mut p = m.clone();
                if let Some(k) = key {
                    apply_mask(&mut p, k, 0);
                }
                wire.extend(header(true, OpCode::Binary, p.len(), key).as_slice());
                wire.extend(p);
                if i == 4 {
                    let mut ping = b"p".to_vec();
                    if let Some(k) = key {
                        apply_mask(&mut ping, k, 0);
                    }
                    wire.extend(header(true, OpCode::Ping, 1, key).as_slice());
                    wire.extend(ping);
                }
            }
            for piece in [1, 7, 13, 1000, 65_537, 1 << 20] {
                let got = events_in_pieces(wire.clone(), role, 1 << 20, piece).await;
                let mut want: Vec<Result<Event, String>> = messages
                    .iter()
                    .map(|m| Ok(Event::Binary(m.clone())))
                    .collect();
                want.insert(5, Ok(Event::Ping(b"p".to_vec())));
                assert!(
                    got == want,
                    "{role:?}, pieces of {piece}: {} events, {} expected",
                    got.len(),
                    want.len()
                );
            }
        }
    }

    #[tokio::test]
    async fn a_large_hot_request_is_lifted_as_it_arrives_in_one_frame_or_many() {
        let bytes: Vec<u8> = (0..900_000u32).map(|i| (i % 241) as u8).collect();
        let b64 = exec_server_protocol::ByteChunk::encode(&bytes);
        let text = format!(
            r#"{{"id":1,"method":"fs/writeBlock","params":{{"handleId":"h","offset":0,"chunk":"{b64}"}}}}"#
        );
        let whole = client_frame(true, OpCode::Text, text.as_bytes());
        let fragmented = client_fragments(OpCode::Text, text.as_bytes(), 100_000);
        for wire in [whole, fragmented] {
            let got = events(wire, Role::Server, 64 << 20).await;
            let [Ok(Event::Lifted(lifted))] = got.as_slice() else {
                panic!("one lifted message expected, got {} events", got.len());
            };
            assert!(lifted.payload == bytes, "the payload differs");
            assert_eq!(lifted.restore(), text.as_bytes());
        }
        // A client's reader never lifts.
        let frame = [
            header(true, OpCode::Text, text.len(), None).as_slice(),
            text.as_bytes(),
        ]
        .concat();
        let got = events(frame, Role::Client, 64 << 20).await;
        assert!(matches!(got.as_slice(), [Ok(Event::Text(t))] if t == text.as_bytes()));
    }

    #[tokio::test]
    async fn a_long_fragmented_message_comes_out_whole_in_a_buffer_of_its_size() {
        // 1 MiB fragments past the size where the reader asks for address
        // space up to the limit: the message is intact and the unused room
        // is given back.
        let big: Vec<u8> = (0..6_500_000u32).map(|i| (i % 253) as u8).collect();
        let wire = client_fragments(OpCode::Binary, &big, 1 << 20);
        let got = events(wire, Role::Server, 64 << 20).await;
        let [Ok(Event::Binary(data))] = got.as_slice() else {
            panic!("one binary message expected, got {} events", got.len());
        };
        assert!(data == &big, "the message's bytes differ");
        assert!(
            data.capacity() - data.len() <= FRAGMENT_SLACK_BYTES,
            "{} bytes of room kept past {}",
            data.capacity() - data.len(),
            data.len()
        );
    }

    #[tokio::test]
    async fn rule_breaking_frames_are_refused() {
        let unmasked = [header(true, OpCode::Text, 2, None).as_slice(), b"hi"].concat();
        let got = events(unmasked.clone(), Role::Server, 1 << 20).await;
        assert!(
            matches!(&got[..], [Err(e)] if e.contains("not masked")),
            "{got:?}"
        );
        // A client accepts it, but not a masked one.
        let got = events(unmasked, Role::Client, 1 << 20).await;
        assert_eq!(got, vec![Ok(Event::Text(b"hi".to_vec()))]);
        let got = events(client_frame(true, OpCode::Text, b"x"), Role::Client, 100).await;
        assert!(
            matches!(&got[..], [Err(e)] if e.contains("masked")),
            "{got:?}"
        );
        let stray = client_frame(true, OpCode::Continue, b"x");
        let got = events(stray, Role::Server, 100).await;
        assert!(matches!(&got[..], [Err(e)] if e.contains("continuation")));
        let interleaved = [
            client_frame(false, OpCode::Text, b"a"),
            client_frame(true, OpCode::Text, b"b"),
        ]
        .concat();
        let got = events(interleaved, Role::Server, 100).await;
        assert!(matches!(&got[..], [Err(e)] if e.contains("new message")));
        // Close codes no peer may send: 1005 (no code) and 999.
        for code in [1005u16, 999] {
            let close = client_frame(true, OpCode::Close, &code.to_be_bytes());
            let got = events(close, Role::Server, 100).await;
            assert!(
                matches!(&got[..], [Err(e)] if e.contains("status code")),
                "{got:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_message_over_the_limit_is_refused_at_its_header() {
        // Two fragments that together pass the limit: refused at the second
        // header, before its payload is read.
        let wire = [
            client_frame(false, OpCode::Text, &[b'a'; 60]),
            header(true, OpCode::Continue, 50, Some([1, 1, 1, 1]))
                .as_slice()
                .to_vec(),
        ]
        .concat();
        let got = events(wire, Role::Server, 100).await;
        assert!(
            matches!(&got[..], [Err(e)] if e.contains("TooBig")),
            "{got:?}"
        );
    }
}
