//! Differential fuzzing of our WebSocket reader against tungstenite's: the
//! same bytes in give the same messages out, in order, and the same kind of
//! ending (close, protocol error, message too big, invalid UTF-8 text, end
//! of stream). Seeded and bounded, so it runs with every `cargo test`.
//!
//! The generator writes streams of frames a client might send, mostly
//! valid, with the mistakes RFC 6455 forbids mixed in (reserved bits,
//! unknown opcodes, unmasked frames, long or fragmented control frames,
//! stray continuations, a new message inside a fragmented one, invalid
//! UTF-8, close codes and reasons of every kind, oversized messages, a
//! stream cut short).

use super::reader::{Event, FrameReader, ReadError};
use std::io::{Cursor, Read, Write};
use tokio_tungstenite::tungstenite::error::{CapacityError, Error as TError, ProtocolError};
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;

/// Largest message either reader accepts in these runs.
const MAX_MESSAGE: usize = 1024;

/// What a reader made of a stream, message by message.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Text(Vec<u8>),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    /// The closing handshake began (the code, if any).
    Close(Option<u16>),
    Protocol,
    TooBig,
    BadUtf8,
    Eof,
}

impl Outcome {
    fn ends(&self) -> bool {
        !matches!(
            self,
            Outcome::Text(_) | Outcome::Binary(_) | Outcome::Ping(_)
        )
    }
}

async fn ours(bytes: &[u8]) -> Vec<Outcome> {
    let mut r = FrameReader::new(bytes, Role::Server, 4096, MAX_MESSAGE);
    let mut out = Vec::new();
    for _ in 0..64 {
        let o = match r.next_event().await {
            Ok(Event::Text(t)) if std::str::from_utf8(&t).is_err() => Outcome::BadUtf8,
            Ok(Event::Text(t)) => Outcome::Text(t),
            Ok(Event::Lifted(l)) => Outcome::Text(l.restore()),
            Ok(Event::Binary(b)) => Outcome::Binary(b),
            Ok(Event::Ping(p)) => Outcome::Ping(p),
            Ok(Event::Close(code)) => Outcome::Close(code),
            Err(ReadError::Protocol(_)) => Outcome::Protocol,
            Err(ReadError::TooBig { .. }) => Outcome::TooBig,
            Err(ReadError::Eof | ReadError::Io(_)) => Outcome::Eof,
        };
        let end = o.ends();
        out.push(o);
        if end {
            break;
        }
    }
    out
}

/// A socket that reads `bytes` and swallows what is written (pongs).
struct Pipe(Cursor<Vec<u8>>);

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn theirs(bytes: &[u8]) -> Vec<Outcome> {
    let mut config = WebSocketConfig::default();
    config.max_message_size = Some(MAX_MESSAGE);
    config.max_frame_size = None;
    let mut ws = WebSocket::from_raw_socket(
        Pipe(Cursor::new(bytes.to_vec())),
        Role::Server,
        Some(config),
    );
    let mut out = Vec::new();
    for _ in 0..64 {
        let o = match ws.read() {
            Ok(Message::Text(t)) => Outcome::Text(t.as_bytes().to_vec()),
            Ok(Message::Binary(b)) => Outcome::Binary(b.to_vec()),
            Ok(Message::Ping(p)) => Outcome::Ping(p.to_vec()),
            Ok(Message::Pong(_)) | Ok(Message::Frame(_)) => continue,
            Ok(Message::Close(frame)) => Outcome::Close(frame.map(|f| u16::from(f.code))),
            Err(TError::Utf8(_)) => Outcome::BadUtf8,
            Err(TError::Capacity(CapacityError::MessageTooLong { .. })) => Outcome::TooBig,
            Err(TError::Protocol(ProtocolError::ResetWithoutClosingHandshake)) => Outcome::Eof,
            Err(TError::Protocol(_)) => Outcome::Protocol,
            Err(TError::Io(_) | TError::ConnectionClosed | TError::AlreadyClosed) => Outcome::Eof,
            Err(e) => panic!("tungstenite: unexpected {e:?}"),
        };
        let end = o.ends();
        out.push(o);
        if end {
            break;
        }
    }
    out
}

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, in_100: u64) -> bool {
        self.below(100) < in_100
    }
}

fn payload(rng: &mut Rng, op: u8) -> Vec<u8> {
    if op == 8 {
        // Close: none, a bare byte, or a code from every class and a reason.
        return match rng.below(4) {
            0 => Vec::new(),
            1 => vec![3],
            _ => {
                let codes = [
                    1000u16, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1011, 1012, 1015, 1016,
                    2999, 3000, 4999, 5000, 999, 0,
                ];
                let code = codes[rng.below(codes.len() as u64) as usize];
                let mut p = code.to_be_bytes().to_vec();
                if rng.chance(50) {
                    p.extend_from_slice(if rng.chance(80) { b"bye" } else { b"b\xffe" });
                }
                p
            }
        };
    }
    let len = match rng.below(10) {
        0 => 126 + rng.below(300) as usize,
        1 => MAX_MESSAGE + rng.below(64) as usize,
        _ => rng.below(40) as usize,
    };
    let mut p: Vec<u8> = (0..len).map(|_| b'a' + rng.below(26) as u8).collect();
    if !p.is_empty() && rng.chance(15) {
        // Not UTF-8: a lone continuation byte, or a multi-byte character
        // split at the end.
        let at = rng.below(p.len() as u64) as usize;
        p[at] = if rng.chance(50) { 0x80 } else { 0xE2 };
    } else if rng.chance(10) {
        p.extend_from_slice("é€".as_bytes());
    }
    p
}

fn frame(rng: &mut Rng, fin: bool, op: u8, data: &[u8], out: &mut Vec<u8>) {
    let mut b0 = op | if fin { 0x80 } else { 0 };
    if rng.chance(3) {
        b0 |= 0x10 << rng.below(3);
    }
    out.push(b0);
    let masked = !rng.chance(3);
    let m = if masked { 0x80 } else { 0 };
    match data.len() {
        n if n < 126 => out.push(m | n as u8),
        n if n < 65536 => {
            out.push(m | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(m | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    let key = [rng.next() as u8, 0x5a, 0x33, rng.next() as u8];
    if masked {
        out.extend_from_slice(&key);
        out.extend(data.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    } else {
        out.extend_from_slice(data);
    }
}

/// A stream of a few messages, fragmented or not, control frames between;
/// true when it was cut short.
fn stream(rng: &mut Rng) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    for _ in 0..1 + rng.below(5) {
        let op = match rng.below(20) {
            0..=6 => 1,
            7..=10 => 2,
            11 => 8,
            12 | 13 => 9,
            14 => 10,
            15 => 0,
            16 => 3 + rng.below(5) as u8,
            17 => 11 + rng.below(5) as u8,
            _ => 1,
        };
        let data = payload(rng, op);
        if (op == 1 || op == 2) && rng.chance(30) && data.len() > 2 {
            // Fragmented, with a control frame (or a mistake) between.
            let cut = 1 + rng.below(data.len() as u64 - 1) as usize;
            frame(rng, false, op, &data[..cut], &mut out);
            match rng.below(4) {
                0 => frame(rng, true, 9, b"ping", &mut out),
                1 => frame(rng, true, 1, b"inside", &mut out),
                _ => {}
            }
            frame(rng, true, 0, &data[cut..], &mut out);
        } else {
            let fin = !rng.chance(5);
            frame(rng, fin, op, &data, &mut out);
        }
    }
    if rng.chance(10) && !out.is_empty() {
        let at = rng.below(out.len() as u64) as usize;
        out.truncate(at);
        return (out, true);
    }
    (out, false)
}

/// Where the two readers may rightly differ (each difference is room RFC
/// 6455 leaves, and both still fail the connection):
/// - tungstenite checks a fragmented text message's UTF-8 fragment by
///   fragment, we at its end: for a message that is not UTF-8, it stops at
///   the first bad fragment (before a ping between fragments), and we end
///   on whatever comes first after it (the message too big, a protocol
///   error, a close frame, the end of the stream);
/// - a close frame with an invalid code or reason is a protocol error to
///   us, and to tungstenite a close it answers with 1002: the same answer;
/// - in a stream cut short, we judge a frame's header as soon as it
///   arrives (a reserved opcode is a protocol error, a length past the
///   limit too big), tungstenite once the whole frame is in (the end of the
///   stream comes first).
fn equivalent(a: &[Outcome], b: &[Outcome], truncated: bool) -> bool {
    if a == b {
        return true;
    }
    let (Some((ea, ra)), Some((eb, rb))) = (a.split_last(), b.split_last()) else {
        return false;
    };
    use Outcome::*;
    let failed = |o: &Outcome| matches!(o, Protocol | TooBig | BadUtf8);
    let data = |r: &[Outcome]| -> Vec<Outcome> {
        r.iter()
            .filter(|o| !matches!(o, Ping(_)))
            .cloned()
            .collect()
    };
    if matches!(eb, BadUtf8) {
        // Ours ends the message later, on whatever ends the stream first.
        return data(ra) == data(rb);
    }
    if matches!(ea, BadUtf8) {
        return failed(eb) && data(ra) == data(rb);
    }
    ra == rb
        && match (ea, eb) {
            (Protocol, Close(Some(1002))) => true,
            (Protocol | TooBig, Eof) => truncated,
            _ => false,
        }
}

#[tokio::test]
async fn our_reader_reads_what_tungstenite_reads() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut disagreements = Vec::new();
    // How often each kind of outcome came up: every kind must be exercised.
    let mut seen = std::collections::HashMap::<&str, usize>::new();
    for case in 0..20_000 {
        let (bytes, truncated) = stream(&mut rng);
        let (a, b) = (ours(&bytes).await, theirs(&bytes));
        for o in &a {
            let kind = match o {
                Outcome::Text(_) => "text",
                Outcome::Binary(_) => "binary",
                Outcome::Ping(_) => "ping",
                Outcome::Close(_) => "close",
                Outcome::Protocol => "protocol",
                Outcome::TooBig => "too big",
                Outcome::BadUtf8 => "bad utf-8",
                Outcome::Eof => "eof",
            };
            *seen.entry(kind).or_default() += 1;
        }
        if !equivalent(&a, &b, truncated) && disagreements.len() < 5 {
            let shown = &bytes[..bytes.len().min(64)];
            disagreements.push(format!(
                "case {case}: {} bytes {shown:02x?}…\n  ours   {a:?}\n  theirs {b:?}",
                bytes.len()
            ));
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
    for kind in [
        "text",
        "binary",
        "ping",
        "close",
        "protocol",
        "too big",
        "bad utf-8",
        "eof",
    ] {
        assert!(
            seen.get(kind).copied().unwrap_or(0) >= 50,
            "{kind} too rare: {seen:?}"
        );
    }
}
