//! The write side: a batch of frames in one vectored write, each payload
//! sent from where it lies. A server's frames are not masked; a client masks
//! a payload it holds alone in place (a sealed relay frame), and copies only
//! a shared one.

use super::{CloseStatus, Role};
use crate::buffers::BufferPool;
use bytes::{Bytes, BytesMut};
use exec_server_wsframe::frame::{header, HeaderBytes, OpCode};
use exec_server_wsframe::mask::{append_masked, apply_mask, MaskKeys};
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// A frame to write. Each is sent as one final (unfragmented) frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outgoing {
    /// A binary message.
    Binary(Bytes),
    /// A ping; its payload must be at most 125 bytes.
    Ping(Bytes),
    /// A pong answering a ping, with the ping's payload.
    Pong(Bytes),
    /// A close frame, with a status or none (the connection ends after it).
    Close(Option<CloseStatus>),
    /// Bytes written as they are, no header added and never masked: (part
    /// of) a frame as another socket's peer sent it, which a relay node
    /// passes on to a harness that agreed to masked frames
    /// ([`super::splice`]).
    Raw(Bytes),
}

impl Outgoing {
    /// Its opcode (none for raw bytes) and payload.
    fn into_parts(self) -> (Option<OpCode>, Bytes) {
        let (opcode, payload) = match self {
            Outgoing::Raw(b) => return (None, b),
            Outgoing::Binary(b) => (OpCode::Binary, b),
            Outgoing::Ping(b) => (OpCode::Ping, b),
            Outgoing::Pong(b) => (OpCode::Pong, b),
            Outgoing::Close(status) => (
                OpCode::Close,
                status.map_or_else(Bytes::new, |s| s.payload()),
            ),
        };
        (Some(opcode), payload)
    }
}

/// How far [`Writer::write_now`] got with a frame.
#[derive(Debug)]
pub enum WrittenNow {
    /// All of it, flushed.
    All,
    /// None of it: the socket would block at once (or this writer masks
    /// its frames). The payload is handed back.
    Nothing(Bytes),
    /// Part of it: the rest must be written ([`Writer::finish`]) before
    /// anything else goes to the socket.
    Part(Remainder),
}

/// The rest of a frame [`Writer::write_now`] started, then the flush owed.
#[derive(Debug)]
pub struct Remainder {
    head: HeaderBytes,
    /// Bytes of `head` already written.
    head_written: usize,
    /// The payload's bytes not yet written.
    payload: Bytes,
}

impl Remainder {
    /// Bytes still to write.
    pub fn len(&self) -> usize {
        self.head.as_slice().len() - self.head_written + self.payload.len()
    }

    /// Whether only the flush is owed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What is still to write: the header's rest, then the payload's.
    fn slices(&self) -> [IoSlice<'_>; 2] {
        [
            IoSlice::new(&self.head.as_slice()[self.head_written..]),
            IoSlice::new(&self.payload),
        ]
    }

    /// Marks `n` more bytes written.
    fn advance(&mut self, n: usize) {
        let in_head = n.min(self.head.as_slice().len() - self.head_written);
        self.head_written += in_head;
        bytes::Buf::advance(&mut self.payload, n - in_head);
    }
}

/// Writes WebSocket frames to the write half of an upgraded connection.
pub struct Writer<W> {
    io: W,
    role: Role,
    keys: MaskKeys,
    /// The batch being written, headers and payloads (kept to reuse the
    /// allocation).
    parts: Vec<(Option<HeaderBytes>, Bytes)>,
    /// Where payloads go once written, if recycled.
    pool: Option<BufferPool>,
}

impl<W: AsyncWrite + Unpin> Writer<W> {
    /// Writes frames for `role` to `io`.
    pub fn new(io: W, role: Role) -> Writer<W> {
        Writer {
            io,
            role,
            keys: MaskKeys::default(),
            parts: Vec::new(),
            pool: None,
        }
    }

    /// Gives each payload, once written, to `pool` (for a sealer to fill
    /// again while it is warm).
    pub fn with_pool(mut self, pool: BufferPool) -> Writer<W> {
        self.pool = Some(pool);
        self
    }

    /// Writes the frames `batch` holds, in order (leaving it empty), and
    /// flushes. Errors: the socket's; after one, the connection is unusable
    /// (a frame may have been cut short).
    pub async fn send(&mut self, batch: &mut Vec<Outgoing>) -> io::Result<()> {
        self.parts.clear();
        for f in batch.drain(..) {
            let (opcode, payload) = f.into_parts();
            let Some(opcode) = opcode else {
                self.parts.push((None, payload));
                continue;
            };
            let (mask, payload) = match self.role {
                Role::Server => (None, payload),
                Role::Client => {
                    let key = self.keys.next_key();
                    (Some(key), masked(payload, key))
                }
            };
            self.parts
                .push((Some(header(true, opcode, payload.len(), mask)), payload));
        }
        let result = if self.io.is_write_vectored() {
            self.write_vectored().await
        } else {
            let mut joined = Vec::new();
            for (h, p) in &self.parts {
                joined.extend_from_slice(h.as_ref().map_or(&[][..], HeaderBytes::as_slice));
                joined.extend_from_slice(p);
            }
            self.io.write_all(&joined).await
        };
        match &self.pool {
            Some(pool) if result.is_ok() => {
                for (_, payload) in self.parts.drain(..) {
                    pool.give(payload);
                }
            }
            _ => self.parts.clear(),
        }
        result?;
        self.io.flush().await
    }

    /// Writes `payload` as one binary frame as far as the socket takes it
    /// without waiting, then flushes, polling with `cx` (whose waker the
    /// socket may keep; the caller that finishes a [`WrittenNow::Part`]
    /// polls again with its own). For a server's writer only: a client's
    /// frames are masked, and it gets [`WrittenNow::Nothing`]. Errors: the
    /// socket's; the connection is unusable after one.
    pub fn write_now(&mut self, cx: &mut Context<'_>, payload: Bytes) -> io::Result<WrittenNow> {
        if self.role == Role::Client {
            return Ok(WrittenNow::Nothing(payload));
        }
        let mut rest = Remainder {
            head: header(true, OpCode::Binary, payload.len(), None),
            head_written: 0,
            payload,
        };
        while !rest.is_empty() {
            match Pin::new(&mut self.io).poll_write_vectored(cx, &rest.slices()) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => rest.advance(n),
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending if rest.head_written == 0 => {
                    return Ok(WrittenNow::Nothing(rest.payload));
                }
                Poll::Pending => return Ok(WrittenNow::Part(rest)),
            }
        }
        match Pin::new(&mut self.io).poll_flush(cx) {
            Poll::Ready(result) => result.map(|()| WrittenNow::All),
            Poll::Pending => Ok(WrittenNow::Part(rest)),
        }
    }

    /// Writes what [`Writer::write_now`] left of its frame, then flushes.
    /// Errors as [`Writer::send`].
    pub async fn finish(&mut self, mut rest: Remainder) -> io::Result<()> {
        while !rest.is_empty() {
            let n = self.io.write_vectored(&rest.slices()).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            rest.advance(n);
        }
        self.io.flush().await
    }

    /// The stream written to.
    pub fn into_inner(self) -> W {
        self.io
    }

    /// Sends a close frame (with `status`, if any) and shuts the write
    /// direction down.
    pub async fn close(&mut self, status: Option<CloseStatus>) -> io::Result<()> {
        self.send(&mut vec![Outgoing::Close(status)]).await?;
        self.io.shutdown().await
    }

    async fn write_vectored(&mut self) -> io::Result<()> {
        let mut slices = Vec::with_capacity(2 * self.parts.len());
        for (h, p) in &self.parts {
            if let Some(h) = h {
                slices.push(IoSlice::new(h.as_slice()));
            }
            if !p.is_empty() {
                slices.push(IoSlice::new(p));
            }
        }
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            let n = self.io.write_vectored(rest).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut rest, n);
        }
        Ok(())
    }
}

/// `payload` masked with `key`: in place when this is its buffer's only
/// handle, else a masked copy.
fn masked(payload: Bytes, key: [u8; 4]) -> Bytes {
    match payload.try_into_mut() {
        Ok(mut owned) => {
            apply_mask(&mut owned, key, 0);
            owned.freeze()
        }
        Err(shared) => {
            let mut copy = BytesMut::with_capacity(shared.len());
            append_masked(&mut copy, &shared, key, 0);
            copy.freeze()
        }
    }
}

/// Fills `batch` (emptied first) with `first` and then what `more` yields
/// at once, up to [`crate::MAX_FRAMES_PER_FLUSH`] frames: a writer sends
/// what is already queued behind the frame it waited for in one write.
pub fn gather(
    batch: &mut Vec<Outgoing>,
    first: Outgoing,
    mut more: impl FnMut() -> Option<Outgoing>,
) {
    batch.clear();
    batch.push(first);
    while batch.len() < crate::MAX_FRAMES_PER_FLUSH {
        match more() {
            Some(f) => batch.push(f),
            None => break,
        }
    }
}
