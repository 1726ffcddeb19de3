//! The read side: frames parsed from a small read-ahead buffer, large
//! payloads read straight into their own buffer.

use super::{Message, Next, Role, WsError};
use bytes::{Buf, BufMut, BytesMut};
use exec_server_wsframe::frame::{parse_header, Header, OpCode};
use exec_server_wsframe::mask::apply_mask;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

/// Bytes read ahead per read while looking for a frame: 8 KiB, what an
/// idle socket holds. A payload longer than what is already read ahead is
/// read into a buffer of its own length, as few reads as the socket allows.
pub const READ_AHEAD: usize = 8 * 1024;

/// Parses the frame header at the start of `buf` and checks its masking
/// against `role`; `None` until all of it has arrived.
/// `masked_ok`: a client that agreed to masked frames from its server
/// ([`Reader::accept_masked`]).
fn parse(buf: &[u8], role: Role, masked_ok: bool) -> Result<Option<Header>, WsError> {
    let Some(h) = parse_header(buf).map_err(|v| WsError::Protocol(v.0))? else {
        return Ok(None);
    };
    match (role, h.mask.is_some()) {
        (Role::Server, false) => Err(WsError::Protocol("unmasked frame from a client")),
        (Role::Client, true) if !masked_ok => Err(WsError::Protocol("masked frame from a server")),
        _ => Ok(Some(h)),
    }
}

/// Reads WebSocket messages from the read half of an upgraded connection.
pub struct Reader<R> {
    io: R,
    role: Role,
    /// Longest message accepted, in bytes.
    limit: usize,
    /// Read but not yet parsed.
    ahead: BytesMut,
    /// A fragmented message being reassembled: its opcode, bytes so far.
    partial: Option<(OpCode, BytesMut)>,
    /// A frame whose payload is still arriving: its header, and where.
    pending: Option<(Header, Dest)>,
    /// Time a message may take from its first byte to its last, if bounded.
    message_timeout: Option<Duration>,
    /// When the first byte of the message now arriving came.
    message_started: Option<Instant>,
    /// A client that takes masked frames from its server too.
    masked_ok: bool,
    /// Most bytes the next read looking for a frame may take, once.
    next_read_cap: Option<usize>,
}

/// Where a frame's payload is being read to.
enum Dest {
    /// A buffer of its own: the bytes so far.
    Own(BytesMut),
    /// The caller's buffer of [`Reader::next_appending`], from `start`.
    Appended { start: usize },
}

impl<R: AsyncRead + Unpin> Reader<R> {
    /// Reads frames for `role` from `io`, refusing messages longer than
    /// `limit` bytes.
    pub fn new(io: R, role: Role, limit: usize) -> Reader<R> {
        Reader {
            io,
            role,
            limit,
            ahead: BytesMut::new(),
            partial: None,
            pending: None,
            message_timeout: None,
            message_started: None,
            masked_ok: false,
            next_read_cap: None,
        }
    }

    /// For a client: masked frames from the server are taken (and
    /// unmasked) as well as unmasked ones. A relay node may send a harness
    /// that agreed to them frames exactly as the executor masked them, which
    /// it can forward without copying them ([`super::splice`]).
    pub fn accept_masked(mut self) -> Reader<R> {
        self.masked_ok = true;
        self
    }

    /// Whether nothing of the connection is read but not yet handed over:
    /// no byte read ahead, no frame or message half read. Only then may
    /// someone else read the connection's next frame.
    pub fn between_frames(&self) -> bool {
        self.ahead.is_empty() && self.pending.is_none() && self.partial.is_none()
    }

    /// The next read looking for a frame takes at most `n` bytes (then
    /// reads are as large as usual again): a caller that knows where the
    /// next frame ends keeps the reader from reading past it.
    pub fn cap_next_read(&mut self, n: usize) {
        self.next_read_cap = Some(n.max(1));
    }

    /// Bounds the time from a message's first byte to its last: a peer that
    /// starts a message and then stalls (holding the reader's buffer for
    /// it) gets [`WsError::Stalled`] after `limit`. Waiting between
    /// messages stays unbounded (the caller's silence policy covers it).
    pub fn with_message_timeout(mut self, limit: Duration) -> Reader<R> {
        self.message_timeout = Some(limit);
        self
    }

    /// The deadline of the message now arriving, if any is bounded and one
    /// has started; `started` says whether bytes of it were read already.
    fn deadline(&mut self, started: bool) -> Option<Instant> {
        let limit = self.message_timeout?;
        if !started {
            return None;
        }
        Some(*self.message_started.get_or_insert_with(Instant::now) + limit)
    }

    /// The next message; `Ok(None)` when the peer closed the connection
    /// between frames. Errors: [`WsError`] (the socket is unusable then).
    /// Cancel-safe: a call dropped in the middle of a frame loses nothing;
    /// the next call goes on where it stopped.
    pub async fn next(&mut self) -> Result<Option<Message>, WsError> {
        match self.read(None).await? {
            Some(Next::Message(m)) => Ok(Some(m)),
            // `read` appends only to a buffer it is given.
            Some(Next::Appended(_)) => Err(WsError::Protocol("a frame appended to no buffer")),
            None => Ok(None),
        }
    }

    /// As [`Reader::next`], except that the payload of a binary message
    /// that comes in one frame is appended to `target` rather than given a
    /// buffer of its own: [`Next::Appended`] then says where it starts
    /// (it runs to `target`'s end). A receiver that assembles records into
    /// a message can so have the kernel copy each record straight to its
    /// place. Cancel-safe as `next`, provided the call after a dropped one
    /// is given the same `target`, unchanged: the bytes read so far are
    /// already in it.
    pub async fn next_appending(&mut self, target: &mut BytesMut) -> Result<Option<Next>, WsError> {
        self.read(Some(target)).await
    }

    async fn read(&mut self, mut target: Option<&mut BytesMut>) -> Result<Option<Next>, WsError> {
        loop {
            let Some((header, payload)) = self.frame(target.as_deref_mut()).await? else {
                return match self.partial {
                    None => Ok(None),
                    Some(_) => Err(WsError::Protocol("connection closed inside a message")),
                };
            };
            let payload = match payload {
                Dest::Own(p) => p,
                Dest::Appended { start } => {
                    self.message_done();
                    return Ok(Some(Next::Appended(start)));
                }
            };
            let message = match header.opcode {
                OpCode::Ping => Message::Ping(payload.freeze()),
                OpCode::Pong => Message::Pong,
                OpCode::Close => {
                    Message::Close(payload.get(..2).map(|c| u16::from_be_bytes([c[0], c[1]])))
                }
                OpCode::Continue => {
                    let Some((opcode, mut whole)) = self.partial.take() else {
                        return Err(WsError::Protocol("continuation frame outside a message"));
                    };
                    whole.extend_from_slice(&payload);
                    if !header.fin {
                        self.partial = Some((opcode, whole));
                        continue;
                    }
                    data(opcode, whole)
                }
                opcode => {
                    if self.partial.is_some() {
                        return Err(WsError::Protocol("new message inside a fragmented one"));
                    }
                    if !header.fin {
                        self.partial = Some((opcode, payload));
                        continue;
                    }
                    data(opcode, payload)
                }
            };
            self.message_done();
            return Ok(Some(Next::Message(message)));
        }
    }

    /// A message (or a control frame) was handed over: the next message's
    /// clock starts with its first byte, which may be read ahead already.
    /// A control frame between fragments leaves the message's clock running.
    fn message_done(&mut self) {
        if self.partial.is_none() {
            self.message_started = (!self.ahead.is_empty()).then(Instant::now);
        }
    }

    /// One frame's header and unmasked payload; `None` at a clean end. An
    /// unfragmented binary frame's payload goes to the end of `target` when
    /// one is given. Cancel-safe: what a dropped call read stays in `ahead`,
    /// `pending` or `target`.
    async fn frame(
        &mut self,
        mut target: Option<&mut BytesMut>,
    ) -> Result<Option<(Header, Dest)>, WsError> {
        if self.pending.is_none() {
            let header = loop {
                if let Some(h) = parse(&self.ahead, self.role, self.masked_ok)? {
                    break h;
                }
                self.ahead.reserve(READ_AHEAD);
                let started = !self.ahead.is_empty() || self.partial.is_some();
                let deadline = self.deadline(started);
                let cap = self.next_read_cap.take().unwrap_or(usize::MAX);
                if read_by(&mut self.io, &mut (&mut self.ahead).limit(cap), deadline).await? == 0 {
                    if self.ahead.is_empty() {
                        return Ok(None);
                    }
                    return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
                }
            };
            // A control frame between fragments is not part of the message.
            let so_far = match &self.partial {
                Some((_, b)) if !header.opcode.is_control() => b.len(),
                _ => 0,
            };
            let total = header.len.saturating_add(so_far as u64);
            if total > self.limit as u64 {
                return Err(WsError::TooLong {
                    len: total,
                    limit: self.limit,
                });
            }
            // Within the limit, so it fits in usize.
            let len = header.len as usize;
            self.ahead.advance(header.header_len);
            let whole_binary =
                header.opcode == OpCode::Binary && header.fin && self.partial.is_none();
            let dest = match target.as_deref_mut() {
                Some(t) if whole_binary => {
                    let start = t.len();
                    t.reserve(len);
                    let now = len.min(self.ahead.len());
                    t.extend_from_slice(&self.ahead[..now]);
                    self.ahead.advance(now);
                    Dest::Appended { start }
                }
                _ => Dest::Own(self.own_payload(len)),
            };
            self.pending = Some((header, dest));
        }
        let deadline = self.deadline(true);
        while let Some((header, dest)) = &mut self.pending {
            let n = match dest {
                Dest::Own(p) => {
                    let want = header.len as usize - p.len();
                    if want == 0 {
                        break;
                    }
                    read_by(&mut self.io, &mut (&mut *p).limit(want), deadline).await?
                }
                Dest::Appended { start } => {
                    // Not given the buffer this frame is going to: nothing
                    // else can hold its bytes, so the socket is unusable.
                    let Some(t) = target.as_deref_mut() else {
                        return Err(WsError::Protocol("a frame being appended lost its buffer"));
                    };
                    let want = (*start + header.len as usize).saturating_sub(t.len());
                    if want == 0 {
                        break;
                    }
                    read_by(&mut self.io, &mut (&mut *t).limit(want), deadline).await?
                }
            };
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
            }
        }
        let Some((header, mut dest)) = self.pending.take() else {
            return Ok(None);
        };
        if self.ahead.is_empty() && self.ahead.capacity() > READ_AHEAD {
            // Do not keep a large read-ahead around once the socket idles.
            self.ahead = BytesMut::new();
        }
        if let Some(key) = header.mask {
            match &mut dest {
                Dest::Own(p) => apply_mask(p, key, 0),
                Dest::Appended { start } => {
                    if let Some(t) = target {
                        apply_mask(&mut t[*start..], key, 0);
                    }
                }
            }
        }
        Ok(Some((header, dest)))
    }

    /// A buffer for a `len`-byte payload, with what is already read ahead.
    fn own_payload(&mut self, len: usize) -> BytesMut {
        if self.ahead.len() >= len {
            // Copied out, not split off: a slice would keep the whole
            // read-ahead allocation alive for as long as the frame is
            // queued somewhere (a stream of tiny frames to a harness that
            // does not read would pin kilobytes per frame).
            let p = BytesMut::from(&self.ahead[..len]);
            self.ahead.advance(len);
            p
        } else {
            let mut p = BytesMut::with_capacity(len);
            p.extend_from_slice(&self.ahead);
            self.ahead.clear();
            p
        }
    }
}

fn data(opcode: OpCode, payload: BytesMut) -> Message {
    if opcode == OpCode::Text {
        Message::Text(payload.freeze())
    } else {
        Message::Binary(payload.freeze())
    }
}

/// One read from `io` into `buf`, failing with [`WsError::Stalled`] at
/// `deadline`. Cancel-safe: a read that is dropped read nothing.
async fn read_by<R: AsyncRead + Unpin, B: BufMut>(
    io: &mut R,
    buf: &mut B,
    deadline: Option<Instant>,
) -> Result<usize, WsError> {
    match deadline {
        None => Ok(io.read_buf(buf).await?),
        Some(at) => match tokio::time::timeout_at(at, io.read_buf(buf)).await {
            Ok(n) => Ok(n?),
            Err(_) => Err(WsError::Stalled),
        },
    }
}
