//! Framed transports: any source and sink of whole JSON-RPC messages.
//!
//! Each transport is split into a reader task and a writer task joined to the rest of
//! the program by channels, so a peer never touches a socket: it receives
//! [`Inbound`] items and sends encoded messages through an [`Outbound`] handle.
//! One message is one WebSocket text frame, or one `\n`-terminated line on stdio and
//! on a Unix socket. A WebSocket also carries binary frames
//! (`exec_server_protocol::binary`) once both ends agreed to use them.

use futures_util::{SinkExt, StreamExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, Notify};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::WebSocketStream;

/// Messages a connection may have queued for writing before senders wait
/// (backpressure). Each queued item is one encoded message.
pub const OUTBOUND_QUEUE_MESSAGES: usize = 64;

/// How long the writer may be blocked on a peer that does not read before the
/// connection is dropped (its session detaches and can be resumed).
pub const STALLED_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Messages longer than this (bytes) are sent as several WebSocket frames of at
/// most this size (one message, fragmented as RFC 6455 allows): 1 MiB.
pub const WS_FRAGMENT_BYTES: usize = 1024 * 1024;

/// Largest line accepted by [`lines`]: 512 MiB. Servers pass their own limit to
/// [`lines_with_limit`].
pub const MAX_LINE_BYTES: usize = 512 * 1024 * 1024;

/// What a transport's reader yields.
#[derive(Debug)]
pub enum Inbound {
    /// One whole message (text).
    Message(String),
    /// One whole WebSocket binary message. Until binary frames were agreed
    /// for the connection, its bytes are read as a text message (as the
    /// reference does).
    Binary(tokio_tungstenite::tungstenite::Bytes),
    /// A message that is not valid UTF-8 text; answered as undecodable.
    Invalid(String),
}

/// One queued outbound message.
#[derive(Debug)]
pub enum Outgoing {
    /// A JSON text message.
    Text(String),
    /// A binary frame (`exec_server_protocol::binary`); only sent once
    /// [`Outbound::enable_binary`] succeeded. Shared bytes: the sender may
    /// keep parts of the same allocation (the output log does).
    Binary(tokio_tungstenite::tungstenite::Bytes),
    /// A text message sent while it is produced; only queued on transports
    /// whose [`Outbound::streams`] is true.
    Stream(TextStream),
}

/// A text message whose middle is produced while it is sent (a whole-file
/// read): the writer sends `head`, then each piece of `body` as it arrives,
/// then `tail`, as one message (WebSocket continuation frames, or one line),
/// so neither end's sender holds the whole message.
#[derive(Debug)]
pub struct TextStream {
    /// The message's first bytes (JSON text).
    pub head: Vec<u8>,
    /// The middle, in order; closed after the last piece. An `Err` means the
    /// producer failed part-way: the message cannot be completed, so the
    /// connection is closed (the peer sees its call fail, never a short value).
    pub body: mpsc::Receiver<Result<Vec<u8>, StreamAborted>>,
    /// The message's last bytes.
    pub tail: Vec<u8>,
}

/// The producer of a [`TextStream`] failed after the message had begun.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamAborted;

impl Outgoing {
    /// The message's length in bytes (for a stream, its head and tail only).
    pub fn len(&self) -> usize {
        match self {
            Outgoing::Text(s) => s.len(),
            Outgoing::Binary(b) => b.len(),
            Outgoing::Stream(t) => t.head.len() + t.tail.len(),
        }
    }
    /// True for an empty message.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether a connection carries binary frames: `capable` is the transport's
/// (WebSocket only), `on` is set once both ends agreed.
#[derive(Debug)]
struct BinaryFrames {
    capable: bool,
    on: AtomicBool,
    /// The writer sends [`Outgoing::Stream`] messages (not a channel).
    streams: bool,
}

/// A handle for queueing encoded messages on a connection. Cloneable; sending
/// waits while the queue is full and fails once the connection is gone.
#[derive(Debug, Clone)]
pub struct Outbound {
    tx: mpsc::Sender<Outgoing>,
    closer: Arc<Notify>,
    binary: Arc<BinaryFrames>,
}

/// The connection is closed; nothing more can be sent on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection closed")
    }
}

impl std::error::Error for Closed {}

impl Outbound {
    /// Queues one encoded message, waiting while the queue is full.
    pub async fn send(&self, msg: String) -> Result<(), Closed> {
        self.tx.send(Outgoing::Text(msg)).await.map_err(|_| Closed)
    }
    /// Queues one binary frame, waiting while the queue is full. The caller
    /// checks [`Outbound::binary_frames`] first.
    pub async fn send_binary(
        &self,
        frame: impl Into<tokio_tungstenite::tungstenite::Bytes>,
    ) -> Result<(), Closed> {
        let frame = frame.into();
        self.tx
            .send(Outgoing::Binary(frame))
            .await
            .map_err(|_| Closed)
    }
    /// Queues a message sent while it is produced (see [`TextStream`]),
    /// waiting while the queue is full. The caller checks
    /// [`Outbound::streams`] first.
    pub async fn send_stream(&self, stream: TextStream) -> Result<(), Closed> {
        self.tx
            .send(Outgoing::Stream(stream))
            .await
            .map_err(|_| Closed)
    }
    /// True when the transport's writer sends [`Outgoing::Stream`] messages
    /// (WebSocket and line transports; not an in-program channel).
    pub fn streams(&self) -> bool {
        self.binary.streams
    }
    /// Turns binary frames on for this connection (both ends agreed); false,
    /// and nothing changes, when the transport cannot carry them.
    pub fn enable_binary(&self) -> bool {
        if self.binary.capable {
            self.binary.on.store(true, Ordering::Release);
        }
        self.binary.capable
    }
    /// True when the transport can carry binary frames (a WebSocket).
    pub fn binary_capable(&self) -> bool {
        self.binary.capable
    }
    /// True once binary frames are on for this connection.
    pub fn binary_frames(&self) -> bool {
        self.binary.on.load(Ordering::Acquire)
    }
    /// True once the writer has stopped.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
    /// Resolves when the writer has stopped.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
    /// Closes the connection now: the writer stops without sending what is queued.
    pub fn close(&self) {
        self.closer.notify_one();
    }
}

/// A connected transport: a stream of inbound messages and a sending handle.
/// Dropping every [`Outbound`] clone and the receiver closes the connection.
pub struct Connection {
    /// Inbound messages; `None` when the peer closed or the reader failed.
    pub inbound: mpsc::Receiver<Inbound>,
    /// Outbound handle.
    pub outbound: Outbound,
    /// Description of the peer, e.g. `exec-server websocket 127.0.0.1:5555`.
    pub peer: String,
}

/// Serves an accepted or connected WebSocket.
pub fn websocket<S>(ws: WebSocketStream<S>, peer: String) -> Connection
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = ws.split();
    let (in_tx, in_rx) = mpsc::channel(64);
    let (out_tx, mut out_rx) = mpsc::channel::<Outgoing>(OUTBOUND_QUEUE_MESSAGES);
    let closer = Arc::new(Notify::new());
    let writer_closer = closer.clone();
    // Set by the reader when it must refuse the peer with a close frame.
    let close_frame: Arc<std::sync::Mutex<Option<CloseFrame>>> = Arc::default();
    let writer_close_frame = close_frame.clone();
    let writer = tokio::spawn(async move {
        loop {
            let first = tokio::select! {
                m = out_rx.recv() => match m { Some(m) => m, None => break },
                _ = writer_closer.notified() => {
                    let frame = writer_close_frame.lock().unwrap_or_else(|p| p.into_inner()).take();
                    if let Some(frame) = frame {
                        let _ = tokio::time::timeout(Duration::from_secs(5), sink.send(WsMessage::Close(Some(frame)))).await;
                    }
                    break;
                }
            };
            // Feed everything already queued, then flush once: fewer syscalls under load.
            let mut batch = Some(first);
            let result = tokio::time::timeout(STALLED_WRITE_TIMEOUT, async {
                while let Some(msg) = batch.take() {
                    match msg {
                        Outgoing::Stream(stream) => send_ws_stream(&mut sink, stream).await?,
                        // Large messages go out as continuation frames: the WebSocket
                        // library buffers a whole frame and shifts its buffer after
                        // each partial write, which is quadratic in the frame size.
                        Outgoing::Text(t) if t.len() > WS_FRAGMENT_BYTES => {
                            send_ws_fragmented(&mut sink, Data::Text, t.into_bytes().into()).await?
                        }
                        Outgoing::Binary(b) if b.len() > WS_FRAGMENT_BYTES => {
                            send_ws_fragmented(&mut sink, Data::Binary, b).await?
                        }
                        Outgoing::Text(t) => sink.feed(WsMessage::text(t)).await?,
                        Outgoing::Binary(b) => sink.feed(WsMessage::binary(b)).await?,
                    }
                    batch = out_rx.try_recv().ok();
                }
                sink.flush().await
            })
            .await;
            match result {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!("websocket write failed: {e}");
                    break;
                }
                Err(_) => {
                    tracing::warn!("websocket peer stopped reading; dropping the connection");
                    break;
                }
            }
        }
        let _ = sink.close().await;
    });
    let reader_out = out_tx.clone();
    let reader_closer = closer.clone();
    tokio::spawn(async move {
        let mut refused = false;
        while let Some(item) = stream.next().await {
            let item = match item {
                // A fragmented message was assembled in a buffer of its own:
                // taken over without a copy (a large upload is not held twice).
                Ok(WsMessage::Text(t)) => match String::from_utf8(Vec::from(
                    tokio_tungstenite::tungstenite::Bytes::from(t),
                )) {
                    Ok(s) => Inbound::Message(s),
                    Err(_) => Inbound::Invalid("message is not valid UTF-8".into()),
                },
                // Read as text by the connection until binary frames are on
                // (the reference treats a binary frame's bytes as a message too).
                Ok(WsMessage::Binary(b)) => Inbound::Binary(b),
                Ok(WsMessage::Close(_)) => break,
                Ok(_) => continue, // ping/pong handled by tungstenite
                Err(tokio_tungstenite::tungstenite::Error::Capacity(e)) => {
                    refused = true;
                    // Refuse with a close frame (1009), not a reset.
                    tracing::warn!("closing a connection: {e}");
                    *close_frame.lock().unwrap_or_else(|p| p.into_inner()) = Some(CloseFrame {
                        code: CloseCode::Size,
                        reason: "message too big".into(),
                    });
                    reader_closer.notify_one();
                    break;
                }
                Err(e) => {
                    tracing::debug!("websocket read failed: {e}");
                    break;
                }
            };
            tokio::select! {
                r = in_tx.send(item) => if r.is_err() { break },
                _ = reader_out.closed() => break,
            }
        }
        drop(reader_out);
        // When the read side ends, the writer must stop too, or a half-open peer
        // would keep the connection (and its session attachment) alive; a writer
        // sending a refusal gets a moment to finish it.
        if close_frame
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
            || refused
        {
            let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
        } else {
            writer.abort();
        }
    });
    Connection {
        inbound: in_rx,
        outbound: Outbound::new(out_tx, closer, true, true),
        peer,
    }
}

/// Sends one message as frames of at most [`WS_FRAGMENT_BYTES`].
async fn send_ws_fragmented<S>(
    sink: &mut futures_util::stream::SplitSink<WebSocketStream<S>, WsMessage>,
    first: Data,
    bytes: tokio_tungstenite::tungstenite::Bytes,
) -> Result<(), tokio_tungstenite::tungstenite::Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut offset = 0;
    while offset < bytes.len() {
        let end = (offset + WS_FRAGMENT_BYTES).min(bytes.len());
        let opcode = if offset == 0 { first } else { Data::Continue };
        let frame = Frame::message(
            bytes.slice(offset..end),
            OpCode::Data(opcode),
            end == bytes.len(),
        );
        sink.feed(WsMessage::Frame(frame)).await?;
        offset = end;
    }
    Ok(())
}

/// Sends a [`TextStream`] as one WebSocket text message: a frame per piece
/// (the head rides with the first), the last one final once the body ends.
async fn send_ws_stream<S>(
    sink: &mut futures_util::stream::SplitSink<WebSocketStream<S>, WsMessage>,
    mut stream: TextStream,
) -> Result<(), tokio_tungstenite::tungstenite::Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    // One piece is held back until the next arrives: only then is it known
    // not to be the last frame. Small pieces are gathered into one frame;
    // a large one is sent as it is (never copied).
    let mut pending = std::mem::take(&mut stream.head);
    let mut opcode = Data::Text;
    while let Some(piece) = stream.body.recv().await {
        let piece = piece.map_err(|_| {
            tokio_tungstenite::tungstenite::Error::Io(std::io::Error::other(
                "the producer of a streamed message failed",
            ))
        })?;
        if pending.len() + piece.len() <= STREAM_GATHER_BYTES {
            pending.extend_from_slice(&piece);
            continue;
        }
        if !pending.is_empty() {
            let frame = Frame::message(pending, OpCode::Data(opcode), false);
            sink.feed(WsMessage::Frame(frame)).await?;
            opcode = Data::Continue;
        }
        pending = piece;
    }
    if pending.len() + stream.tail.len() > STREAM_GATHER_BYTES {
        let frame = Frame::message(pending, OpCode::Data(opcode), false);
        sink.feed(WsMessage::Frame(frame)).await?;
        opcode = Data::Continue;
        pending = std::mem::take(&mut stream.tail);
    } else {
        pending.extend_from_slice(&stream.tail);
    }
    sink.feed(WsMessage::Frame(Frame::message(
        pending,
        OpCode::Data(opcode),
        true,
    )))
    .await
}

/// Pieces of a [`TextStream`] smaller than this together are sent as one
/// WebSocket frame: 64 KiB.
const STREAM_GATHER_BYTES: usize = 64 * 1024;

impl Outbound {
    fn new(
        tx: mpsc::Sender<Outgoing>,
        closer: Arc<Notify>,
        binary_capable: bool,
        streams: bool,
    ) -> Self {
        Outbound {
            tx,
            closer,
            binary: Arc::new(BinaryFrames {
                capable: binary_capable,
                on: AtomicBool::new(false),
                streams,
            }),
        }
    }
}

/// Serves a line-framed byte stream (stdio, a Unix socket): one message per line,
/// at most [`MAX_LINE_BYTES`]. Empty lines are skipped.
pub fn lines<R, W>(reader: R, writer: W, peer: String) -> Connection
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    lines_with_limit(reader, writer, peer, MAX_LINE_BYTES)
}

/// What [`read_line_capped`] found.
#[derive(Debug, PartialEq, Eq)]
enum LineRead {
    /// A line (without its `\n`), or the unterminated rest before end of input.
    Line,
    /// End of input, nothing pending.
    End,
    /// The line passed the limit; what was read of it is discarded.
    TooLong,
}

/// Reads one line into `buf` (cleared first), holding at most `limit` bytes of
/// it: a longer line is refused as soon as it passes the limit, not buffered.
async fn read_line_capped<R: AsyncRead + Unpin>(
    r: &mut BufReader<R>,
    buf: &mut Vec<u8>,
    limit: usize,
) -> std::io::Result<LineRead> {
    buf.clear();
    loop {
        let available = r.fill_buf().await?;
        if available.is_empty() {
            return Ok(if buf.is_empty() {
                LineRead::End
            } else {
                LineRead::Line
            });
        }
        let (piece, found) = match memchr::memchr(b'\n', available) {
            Some(i) => (&available[..i], true),
            None => (available, false),
        };
        if piece.len() > limit - buf.len() {
            buf.clear();
            buf.shrink_to(64 * 1024);
            return Ok(LineRead::TooLong);
        }
        // Grow by doubling but never past the limit, so a line of `limit`
        // bytes costs `limit`, not the next power of two.
        if buf.capacity() - buf.len() < piece.len() {
            let want = (buf.capacity() * 2).max(buf.len() + piece.len()).min(limit);
            buf.reserve_exact(want - buf.len());
        }
        buf.extend_from_slice(piece);
        let used = piece.len() + usize::from(found);
        r.consume(used);
        if found {
            return Ok(LineRead::Line);
        }
    }
}

/// [`lines`] with a limit on the line length (bytes, without the `\n`): a longer
/// line closes the connection (logged as a warning) once it passes the limit,
/// without being held in memory; lines read before it are still delivered.
pub fn lines_with_limit<R, W>(
    reader: R,
    writer: W,
    peer: String,
    max_line_bytes: usize,
) -> Connection
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (in_tx, in_rx) = mpsc::channel(64);
    let (out_tx, mut out_rx) = mpsc::channel::<Outgoing>(OUTBOUND_QUEUE_MESSAGES);
    let closer = Arc::new(Notify::new());
    let writer_closer = closer.clone();
    let writer_task = tokio::spawn(async move {
        let mut w = BufWriter::with_capacity(64 * 1024, writer);
        loop {
            let first = tokio::select! {
                m = out_rx.recv() => match m { Some(m) => m, None => break },
                _ = writer_closer.notified() => break,
            };
            let mut batch = Some(first);
            let result = tokio::time::timeout(STALLED_WRITE_TIMEOUT, async {
                while let Some(msg) = batch.take() {
                    match msg {
                        Outgoing::Text(msg) => w.write_all(msg.as_bytes()).await?,
                        Outgoing::Stream(mut stream) => {
                            w.write_all(&stream.head).await?;
                            while let Some(piece) = stream.body.recv().await {
                                let piece = piece.map_err(|_| {
                                    std::io::Error::other(
                                        "the producer of a streamed message failed",
                                    )
                                })?;
                                w.write_all(&piece).await?;
                            }
                            w.write_all(&stream.tail).await?;
                        }
                        // Never agreed on a line transport (`enable_binary` refuses).
                        Outgoing::Binary(_) => {
                            return Err(std::io::Error::other("binary frame on a line transport"))
                        }
                    }
                    w.write_all(b"\n").await?;
                    batch = out_rx.try_recv().ok();
                }
                w.flush().await
            })
            .await;
            if !matches!(result, Ok(Ok(()))) {
                break;
            }
        }
        let _ = w.shutdown().await;
    });
    let reader_out = out_tx.clone();
    let reader_peer = peer.clone();
    tokio::spawn(async move {
        let peer = reader_peer;
        let mut r = BufReader::with_capacity(64 * 1024, reader);
        let mut buf = Vec::new();
        loop {
            match read_line_capped(&mut r, &mut buf, max_line_bytes).await {
                Ok(LineRead::Line) => {}
                Ok(LineRead::End) | Err(_) => break,
                Ok(LineRead::TooLong) => {
                    tracing::warn!(
                        "{peer}: message longer than {max_line_bytes} bytes (--max-message-bytes); closing the connection"
                    );
                    break;
                }
            }
            while matches!(buf.last(), Some(b'\r')) {
                buf.pop();
            }
            if buf.iter().all(|b| b.is_ascii_whitespace()) {
                continue;
            }
            let item = match String::from_utf8(std::mem::take(&mut buf)) {
                Ok(s) => Inbound::Message(s),
                Err(_) => Inbound::Invalid("message is not valid UTF-8".into()),
            };
            tokio::select! {
                res = in_tx.send(item) => if res.is_err() { break },
                _ = reader_out.closed() => break,
            }
        }
        drop(reader_out);
        // End of input reaches the connection loop now; queued replies still go
        // out, since the writer ends on its own once every sender is dropped.
        drop(in_tx);
        if tokio::time::timeout(Duration::from_secs(5), writer_task)
            .await
            .is_err()
        {
            tracing::debug!("line writer still busy 5 s after end of input");
        }
    });
    Connection {
        inbound: in_rx,
        outbound: Outbound::new(out_tx, closer, false, true),
        peer,
    }
}

/// The program's side of a [`channel`] connection.
pub struct ChannelEnd {
    /// Feed the connection's inbound messages here; dropping it is end of input.
    pub inbound: mpsc::Sender<Inbound>,
    /// What the connection sends; `None` once every [`Outbound`] clone is gone.
    /// Text only: a channel does not carry binary frames.
    pub outbound: mpsc::Receiver<Outgoing>,
    /// Notified when [`Outbound::close`] is called: stop and drop both ends.
    pub closer: Arc<Notify>,
}

/// A connection whose far end is in this program (e.g. one relay stream): the
/// caller moves messages between the [`ChannelEnd`] and wherever they travel.
pub fn channel(peer: String) -> (Connection, ChannelEnd) {
    let (in_tx, in_rx) = mpsc::channel(64);
    let (out_tx, out_rx) = mpsc::channel::<Outgoing>(OUTBOUND_QUEUE_MESSAGES);
    let closer = Arc::new(Notify::new());
    (
        Connection {
            inbound: in_rx,
            outbound: Outbound::new(out_tx, closer.clone(), false, false),
            peer,
        },
        ChannelEnd {
            inbound: in_tx,
            outbound: out_rx,
            closer,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read_all(input: &[u8], limit: usize, chunk: usize) -> Vec<(LineRead, Vec<u8>)> {
        let mut r = BufReader::with_capacity(chunk, input);
        let mut buf = Vec::new();
        let mut out = Vec::new();
        loop {
            let got = read_line_capped(&mut r, &mut buf, limit).await.unwrap();
            let done = got != LineRead::Line;
            out.push((got, buf.clone()));
            if done {
                return out;
            }
        }
    }

    #[tokio::test]
    async fn lines_up_to_the_limit_pass_and_longer_ones_are_refused_unbuffered() {
        for chunk in [1, 3, 64] {
            let got = read_all(b"abcd\n\nxyz\nlast", 4, chunk).await;
            assert_eq!(
                got,
                [
                    (LineRead::Line, b"abcd".to_vec()),
                    (LineRead::Line, b"".to_vec()),
                    (LineRead::Line, b"xyz".to_vec()),
                    (LineRead::Line, b"last".to_vec()),
                    (LineRead::End, b"".to_vec()),
                ],
                "chunk {chunk}"
            );
            let got = read_all(b"ok\nabcde\nnever", 4, chunk).await;
            assert_eq!(
                got,
                [
                    (LineRead::Line, b"ok".to_vec()),
                    (LineRead::TooLong, b"".to_vec()),
                ],
                "chunk {chunk}"
            );
        }
        // A line of exactly the limit never allocates past it.
        let mut r = BufReader::with_capacity(3, &b"0123456789\n"[..]);
        let mut buf = Vec::new();
        assert_eq!(
            read_line_capped(&mut r, &mut buf, 10).await.unwrap(),
            LineRead::Line
        );
        assert_eq!(buf.capacity(), 10);
    }

    /// A server-side WebSocket over an in-memory pipe, and the client's end.
    async fn ws_pair() -> (Connection, WebSocketStream<tokio::io::DuplexStream>) {
        use tokio_tungstenite::tungstenite::protocol::Role;
        let (a, b) = tokio::io::duplex(1 << 20);
        let server = WebSocketStream::from_raw_socket(a, Role::Server, None).await;
        let client = WebSocketStream::from_raw_socket(b, Role::Client, None).await;
        (websocket(server, "test".into()), client)
    }

    /// A stream `{"data":"…"}` whose middle is fed through the sender.
    fn text_stream(capacity: usize) -> (TextStream, mpsc::Sender<Result<Vec<u8>, StreamAborted>>) {
        let (tx, rx) = mpsc::channel(capacity);
        let stream = TextStream {
            head: b"{\"data\":\"".to_vec(),
            body: rx,
            tail: b"\"}".to_vec(),
        };
        (stream, tx)
    }

    #[tokio::test]
    async fn a_streamed_message_arrives_whole_between_the_others() {
        let (conn, mut client) = ws_pair().await;
        let (stream, tx) = text_stream(4);
        conn.outbound.send("first".into()).await.unwrap();
        conn.outbound.send_stream(stream).await.unwrap();
        conn.outbound.send("last".into()).await.unwrap();
        // Pieces of several frames' worth, produced while the writer waits.
        let pieces: Vec<Vec<u8>> = (0..5u8).map(|i| vec![b'a' + i; 300_000]).collect();
        let expected: Vec<u8> =
            [b"{\"data\":\"".to_vec(), pieces.concat(), b"\"}".to_vec()].concat();
        let producer = tokio::spawn(async move {
            for p in pieces {
                tx.send(Ok(p)).await.unwrap();
            }
        });
        let mut got = Vec::new();
        while got.len() < 3 {
            match client.next().await.unwrap().unwrap() {
                WsMessage::Text(t) => got.push(t.as_bytes().to_vec()),
                other => panic!("unexpected {other:?}"),
            }
        }
        producer.await.unwrap();
        assert_eq!(got[0], b"first");
        assert_eq!(got[1].len(), expected.len());
        assert!(got[1] == expected, "the streamed message differs");
        assert_eq!(got[2], b"last");
    }

    #[tokio::test]
    async fn a_failed_producer_closes_the_connection_without_a_short_message() {
        let (conn, mut client) = ws_pair().await;
        let (stream, tx) = text_stream(4);
        conn.outbound.send_stream(stream).await.unwrap();
        conn.outbound.send("after".into()).await.unwrap();
        tx.send(Ok(vec![b'x'; 200_000])).await.unwrap();
        tx.send(Err(StreamAborted)).await.unwrap();
        // The client never receives a complete message: the stream ends.
        let next = tokio::time::timeout(Duration::from_secs(10), client.next())
            .await
            .expect("the connection stayed open");
        assert!(
            !matches!(next, Some(Ok(WsMessage::Text(_)))),
            "a message arrived: {next:?}"
        );
        conn.outbound.closed().await;
    }

    #[tokio::test]
    async fn a_line_transport_writes_a_streamed_message_as_one_line() {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let (r, w) = tokio::io::split(ours);
        let conn = lines(r, w, "test".into());
        let (stream, tx) = text_stream(2);
        conn.outbound.send_stream(stream).await.unwrap();
        conn.outbound.send("next".into()).await.unwrap();
        tx.send(Ok(b"abc".to_vec())).await.unwrap();
        tx.send(Ok(b"def".to_vec())).await.unwrap();
        drop(tx);
        let mut lines = BufReader::new(theirs).lines();
        assert_eq!(
            lines.next_line().await.unwrap().unwrap(),
            "{\"data\":\"abcdef\"}"
        );
        assert_eq!(lines.next_line().await.unwrap().unwrap(), "next");
    }
}
