//! Writes WebSocket frames: headers built apart from their payloads, and
//! both handed to the socket in one vectored write, so a payload is never
//! copied into a staging buffer (a client's frames are masked in place when
//! their buffer is not shared).

use super::frame::{apply_mask, header, HeaderBytes, MaskKeys, OpCode};
use bytes::{Bytes, BytesMut};
use std::io::IoSlice;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::tungstenite::protocol::Role;

/// Slices handed to one vectored write.
const IOV_PER_WRITE: usize = 64;

/// One piece of queued output.
enum Part {
    Header(HeaderBytes),
    Data(Bytes),
}

impl Part {
    fn as_slice(&self) -> &[u8] {
        match self {
            Part::Header(h) => h.as_slice(),
            Part::Data(b) => b,
        }
    }
}

/// The write side of a WebSocket after its handshake: frames are queued,
/// then written together.
pub(crate) struct FrameWriter<W> {
    io: W,
    role: Role,
    keys: MaskKeys,
    parts: Vec<Part>,
    queued: usize,
    /// Largest frame payload sent; longer messages are fragmented.
    max_frame: usize,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    /// A writer for `role`'s side (a client masks its frames), sending
    /// frames of at most `max_frame` payload bytes.
    pub(crate) fn new(io: W, role: Role, max_frame: usize) -> Self {
        FrameWriter {
            io,
            role,
            keys: MaskKeys::default(),
            parts: Vec::new(),
            queued: 0,
            max_frame: max_frame.max(1),
        }
    }

    /// Bytes queued and not yet written.
    pub(crate) fn queued_bytes(&self) -> usize {
        self.queued
    }

    /// Queues `payload` as the next part of a message: frames of at most
    /// the frame size (slices of it, never copies), the first with
    /// `*opcode` (afterwards [`OpCode::Continue`]), the last final when
    /// `fin`. An empty payload is one empty frame.
    pub(crate) fn push(&mut self, payload: Bytes, opcode: &mut OpCode, fin: bool) {
        let total = payload.len();
        let (mut data, payload) = if self.role == Role::Client {
            // A buffer only we hold is masked where it is.
            let owned = payload
                .try_into_mut()
                .unwrap_or_else(|b| BytesMut::from(&b[..]));
            (Some(owned), Bytes::new())
        } else {
            (None, payload)
        };
        let mut frames = Vec::with_capacity(total / self.max_frame + 1);
        let mut offset = 0;
        loop {
            let end = (offset + self.max_frame).min(total);
            let last = end == total;
            let key = match &mut data {
                Some(d) => {
                    let key = self.keys.next_key();
                    apply_mask(&mut d[offset..end], key, 0);
                    Some(key)
                }
                None => None,
            };
            frames.push((header(fin && last, *opcode, end - offset, key), offset..end));
            *opcode = OpCode::Continue;
            if last {
                break;
            }
            offset = end;
        }
        let bytes = match data {
            Some(d) => d.freeze(),
            None => payload,
        };
        for (h, range) in frames {
            self.parts.push(Part::Header(h));
            self.queued += h.as_slice().len() + range.len();
            if !range.is_empty() {
                self.parts.push(Part::Data(bytes.slice(range)));
            }
        }
    }

    /// Queues a control frame (close, ping or pong; payload at most 125
    /// bytes, cut there if longer).
    pub(crate) fn push_control(&mut self, opcode: OpCode, payload: &[u8]) {
        let payload = &payload[..payload.len().min(super::frame::MAX_CONTROL_PAYLOAD)];
        let mut op = opcode;
        self.push(Bytes::copy_from_slice(payload), &mut op, true);
    }

    /// Writes everything queued, in order, with vectored writes.
    ///
    /// # Errors
    /// The socket's error; [`std::io::ErrorKind::WriteZero`] when it takes
    /// nothing.
    pub(crate) async fn write_queued(&mut self) -> std::io::Result<()> {
        let FrameWriter { io, parts, .. } = self;
        let (mut idx, mut off) = (0usize, 0usize);
        while idx < parts.len() {
            let mut iov = [IoSlice::new(&[]); IOV_PER_WRITE];
            let mut n_iov = 0;
            for (i, p) in parts[idx..].iter().take(IOV_PER_WRITE).enumerate() {
                let s = p.as_slice();
                iov[n_iov] = IoSlice::new(if i == 0 { &s[off..] } else { s });
                n_iov += 1;
            }
            let mut n = io.write_vectored(&iov[..n_iov]).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            while n > 0 && idx < parts.len() {
                let left = parts[idx].as_slice().len() - off;
                if n >= left {
                    n -= left;
                    idx += 1;
                    off = 0;
                } else {
                    off += n;
                    n = 0;
                }
            }
        }
        parts.clear();
        self.queued = 0;
        // A TLS stream may hold the last record until flushed.
        self.io.flush().await
    }

    /// Shuts the write side down (TCP FIN), after a close frame.
    pub(crate) async fn shutdown(&mut self) {
        let _ = self.io.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::super::reader::{Event, FrameReader};
    use super::*;

    #[tokio::test]
    async fn what_one_side_writes_the_other_reads_in_both_roles() {
        for role in [Role::Client, Role::Server] {
            let (a, b) = tokio::io::duplex(1 << 14);
            let peer_role = match role {
                Role::Client => Role::Server,
                Role::Server => Role::Client,
            };
            let big: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
            let shared = Bytes::from(big.clone());
            let keep = shared.clone(); // a shared buffer is copied, not masked in place
            let sender = tokio::spawn(async move {
                let mut w = FrameWriter::new(a, role, 64 * 1024);
                let mut op = OpCode::Text;
                w.push(Bytes::from_static(b"hello"), &mut op, true);
                let mut op = OpCode::Binary;
                w.push(shared, &mut op, true);
                w.push_control(OpCode::Ping, b"p");
                let mut op = OpCode::Text;
                w.push(Bytes::new(), &mut op, false);
                w.push(Bytes::from_static(b"end"), &mut op, true);
                w.write_queued().await.unwrap();
                w.shutdown().await;
            });
            let mut r = FrameReader::new(b, peer_role, 4096, 1 << 20);
            assert_eq!(
                r.next_event().await.unwrap(),
                Event::Text(b"hello".to_vec())
            );
            assert_eq!(r.next_event().await.unwrap(), Event::Binary(big.clone()));
            assert_eq!(r.next_event().await.unwrap(), Event::Ping(b"p".to_vec()));
            assert_eq!(r.next_event().await.unwrap(), Event::Text(b"end".to_vec()));
            sender.await.unwrap();
            assert_eq!(&keep[..], &big[..], "the sender's shared bytes changed");
        }
    }
}
