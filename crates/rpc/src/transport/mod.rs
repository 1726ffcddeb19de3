//! Framed transports: any source and sink of whole JSON-RPC messages.
//!
//! Each transport is split into a reader task and a writer task joined to the rest of
//! the program by channels, so a peer never touches a socket: it receives
//! [`Inbound`] items and sends encoded messages through an [`Outbound`] handle.
//! One message is one WebSocket text frame, or one `\n`-terminated line on stdio and
//! on a Unix socket. A WebSocket also carries binary frames
//! (`exec_server_protocol::binary`) once both ends agreed to use them.

mod byte_channels;
mod lines;
mod websocket;

pub use byte_channels::{byte_channels, channel_pair, MessageSink};
pub use lines::{lines, lines_with_limit};
pub use websocket::{websocket, Role};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Notify};

/// Messages a connection may have queued for writing before senders wait
/// (backpressure). Each queued item is one encoded message.
pub const OUTBOUND_QUEUE_MESSAGES: usize = 64;

/// How long the writer may be blocked on a peer that does not read before the
/// connection is dropped (its session detaches and can be resumed).
pub const STALLED_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Messages longer than this (bytes) are sent as several WebSocket frames of at
/// most this size (one message, fragmented as RFC 6455 allows): 4 MiB. The
/// reference refuses frames of 16 MiB and more; below that, one frame is
/// cheapest for the receiver (it sizes the message's buffer exactly).
pub const WS_FRAGMENT_BYTES: usize = 4 * 1024 * 1024;

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
    /// A server's text message whose hot request member (a large base64
    /// `params.dataBase64` or `params.chunk`) was decoded while it arrived
    /// (`exec_server_fastpath::lift`): the skeleton is valid UTF-8. Read it
    /// with `exec_server_fastpath::hot::decode_lifted`, or as text with
    /// [`LiftedText::restore`](exec_server_fastpath::lift::LiftedText::restore).
    Lifted(exec_server_fastpath::lift::LiftedText),
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
    /// A binary frame given in two parts (a header and a payload the sender
    /// keeps a share of), sent as one message: the payload is not copied
    /// into a frame (a client copies it once, masked).
    BinaryParts(
        tokio_tungstenite::tungstenite::Bytes,
        tokio_tungstenite::tungstenite::Bytes,
    ),
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
    /// The middle, in order, then [`StreamPiece::End`]. An `Err`, or a
    /// channel closed before `End` (a producer that panicked or was dropped),
    /// means the message cannot be completed: the connection is closed, and
    /// the peer sees its call fail, never a short value.
    pub body: mpsc::Receiver<Result<StreamPiece, StreamAborted>>,
    /// The message's last bytes.
    pub tail: Vec<u8>,
}

impl TextStream {
    /// A stream whose middle is already complete: sent as `head`, `middle`,
    /// `tail` without joining them (no copy of a large middle).
    pub fn whole(head: Vec<u8>, middle: Vec<u8>, tail: Vec<u8>) -> TextStream {
        let (tx, body) = mpsc::channel(2);
        // The channel has room for both: neither send can fail.
        let _ = tx.try_send(Ok(StreamPiece::Data(middle)));
        let _ = tx.try_send(Ok(StreamPiece::End));
        TextStream { head, body, tail }
    }
}

/// What a transport's writer takes next.
enum Next {
    Message(Outgoing),
    /// Every sender is gone.
    QueueClosed,
    /// [`Outbound::close`] was called.
    CloseRequested,
}

/// The next message for a writer: the stream it carried over from its last
/// batch (a stream is sent on its own), else the queue's next.
async fn next_to_write(
    carried: &mut Option<Outgoing>,
    queue: &mut mpsc::Receiver<Outgoing>,
    closer: &Notify,
) -> Next {
    if let Some(m) = carried.take() {
        return Next::Message(m);
    }
    tokio::select! {
        m = queue.recv() => m.map_or(Next::QueueClosed, Next::Message),
        _ = closer.notified() => Next::CloseRequested,
    }
}

/// One item of a [`TextStream`]'s body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamPiece {
    /// The next bytes of the message.
    Data(Vec<u8>),
    /// The body is complete; the tail follows.
    End,
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
            Outgoing::BinaryParts(a, b) => a.len() + b.len(),
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
    /// Queues one binary frame given as a header and a payload (see
    /// [`Outgoing::BinaryParts`]). The caller checks
    /// [`Outbound::binary_frames`] first.
    pub async fn send_binary_parts(
        &self,
        header: tokio_tungstenite::tungstenite::Bytes,
        payload: tokio_tungstenite::tungstenite::Bytes,
    ) -> Result<(), Closed> {
        self.tx
            .send(Outgoing::BinaryParts(header, payload))
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

/// A received message's bytes as [`Inbound::Message`], or
/// [`Inbound::Invalid`] when they are not UTF-8. Validated with SIMD: a
/// message may be tens of MiB of base64.
fn inbound_text(bytes: Vec<u8>) -> Inbound {
    if simdutf8::basic::from_utf8(&bytes).is_err() {
        return Inbound::Invalid("message is not valid UTF-8".into());
    }
    // SAFETY: validated as UTF-8 just above.
    Inbound::Message(unsafe { String::from_utf8_unchecked(bytes) })
}

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

/// The program's side of a [`channel`] connection.
pub struct ChannelEnd {
    /// Feed the connection's inbound messages here; dropping it is end of input.
    pub inbound: mpsc::Sender<Inbound>,
    /// What the connection sends; `None` once every [`Outbound`] clone is gone.
    /// Text only, unless made by [`binary_channel`] and binary frames were
    /// agreed ([`Outgoing::Binary`] and [`Outgoing::BinaryParts`] then too).
    pub outbound: mpsc::Receiver<Outgoing>,
    /// Notified when [`Outbound::close`] is called: stop and drop both ends.
    pub closer: Arc<Notify>,
}

/// A connection whose far end is in this program (e.g. one relay stream): the
/// caller moves messages between the [`ChannelEnd`] and wherever they travel.
/// Text only: [`Outbound::enable_binary`] refuses.
pub fn channel(peer: String) -> (Connection, ChannelEnd) {
    channel_of(peer, false)
}

/// A [`channel`] whose far end carries binary frames as well as text (a relay
/// stream between our client and our executor): [`Outbound::enable_binary`]
/// succeeds once both ends agree in `initialize`, and the caller then passes
/// binary messages both ways.
pub fn binary_channel(peer: String) -> (Connection, ChannelEnd) {
    channel_of(peer, true)
}

fn channel_of(peer: String, binary_capable: bool) -> (Connection, ChannelEnd) {
    let (in_tx, in_rx) = mpsc::channel(64);
    let (out_tx, out_rx) = mpsc::channel::<Outgoing>(OUTBOUND_QUEUE_MESSAGES);
    let closer = Arc::new(Notify::new());
    (
        Connection {
            inbound: in_rx,
            outbound: Outbound::new(out_tx, closer.clone(), binary_capable, false),
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
pub(crate) mod test_support {
    use super::*;

    /// A stream `{"data":"…"}` whose middle is fed through the sender.
    pub(crate) fn text_stream(
        capacity: usize,
    ) -> (TextStream, mpsc::Sender<Result<StreamPiece, StreamAborted>>) {
        let (tx, rx) = mpsc::channel(capacity);
        let stream = TextStream {
            head: b"{\"data\":\"".to_vec(),
            body: rx,
            tail: b"\"}".to_vec(),
        };
        (stream, tx)
    }
}
