//! Writes WebSocket frames: headers built apart from their payloads, and
//! both handed to the socket in one vectored write, so a payload is never
//! copied into a staging buffer (a client's frames are masked in place when
//! their buffer is not shared).

use bytes::{Bytes, BytesMut};
use exec_server_wsframe::frame::{header, HeaderBytes, OpCode};
use exec_server_wsframe::mask::{append_masked, apply_mask, MaskKeys};
use std::io::IoSlice;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::tungstenite::protocol::Role;

/// Slices handed to one vectored write.
const IOV_PER_WRITE: usize = 64;

/// `parts` joined and masked frame by frame (`frames[i]` with `keys[i]`),
/// copied once: the copy and the mask are one pass.
fn masked_copy(parts: &[Bytes], frames: &[std::ops::Range<usize>], keys: &[[u8; 4]]) -> Bytes {
    let total: usize = parts.iter().map(Bytes::len).sum();
    let mut out = BytesMut::with_capacity(total);
    let mut frame = 0;
    for p in parts {
        let mut piece = &p[..];
        while !piece.is_empty() {
            let at = out.len();
            while frames[frame].end <= at {
                frame += 1;
            }
            let take = piece.len().min(frames[frame].end - at);
            append_masked(
                &mut out,
                &piece[..take],
                keys[frame],
                at - frames[frame].start,
            );
            piece = &piece[take..];
        }
    }
    out.freeze()
}

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
        self.push_parts(vec![payload], opcode, fin);
    }

    /// [`Self::push`] for a payload given in parts, sent as if joined. A
    /// server sends the parts as they are; a client masks a part it holds
    /// alone in place, and otherwise copies the parts masked (one pass).
    pub(crate) fn push_parts(&mut self, mut parts: Vec<Bytes>, opcode: &mut OpCode, fin: bool) {
        let total: usize = parts.iter().map(Bytes::len).sum();
        let mut frames = Vec::with_capacity(total / self.max_frame + 1);
        let mut offset = 0;
        loop {
            let end = (offset + self.max_frame).min(total);
            frames.push(offset..end);
            if end == total {
                break;
            }
            offset = end;
        }
        let mut keys = Vec::new();
        if self.role == Role::Client {
            keys = frames.iter().map(|_| self.keys.next_key()).collect();
            let whole = if parts.len() == 1 {
                match parts.pop().map(Bytes::try_into_mut) {
                    // A buffer only we hold is masked where it is.
                    Some(Ok(mut owned)) => {
                        for (range, key) in frames.iter().zip(&keys) {
                            apply_mask(&mut owned[range.clone()], *key, 0);
                        }
                        owned.freeze()
                    }
                    Some(Err(shared)) => masked_copy(&[shared], &frames, &keys),
                    None => Bytes::new(),
                }
            } else {
                masked_copy(&parts, &frames, &keys)
            };
            parts = vec![whole];
        }
        let last = frames.len() - 1;
        for (i, range) in frames.into_iter().enumerate() {
            let h = header(fin && i == last, *opcode, range.len(), keys.get(i).copied());
            *opcode = OpCode::Continue;
            self.parts.push(Part::Header(h));
            self.queued += h.as_slice().len() + range.len();
            // The parts' slices that fall in this frame.
            let mut at = 0;
            for p in &parts {
                let (start, end) = (range.start.max(at), range.end.min(at + p.len()));
                if start < end {
                    self.parts.push(Part::Data(p.slice(start - at..end - at)));
                }
                at += p.len();
            }
        }
    }

    /// Queues a control frame (close, ping or pong; payload at most 125
    /// bytes, cut there if longer).
    pub(crate) fn push_control(&mut self, opcode: OpCode, payload: &[u8]) {
        let payload = &payload[..payload
            .len()
            .min(exec_server_wsframe::frame::MAX_CONTROL_PAYLOAD)];
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
                w.push(shared.clone(), &mut op, true);
                // The same bytes in two parts, across frame boundaries.
                let mut op = OpCode::Binary;
                w.push_parts(
                    vec![shared.slice(..70_001), shared.slice(70_001..)],
                    &mut op,
                    true,
                );
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
            assert_eq!(r.next_event().await.unwrap(), Event::Binary(big.clone()));
            assert_eq!(r.next_event().await.unwrap(), Event::Ping(b"p".to_vec()));
            assert_eq!(r.next_event().await.unwrap(), Event::Text(b"end".to_vec()));
            sender.await.unwrap();
            assert_eq!(&keep[..], &big[..], "the sender's shared bytes changed");
        }
    }
}
