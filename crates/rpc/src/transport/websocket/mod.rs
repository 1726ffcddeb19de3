//! The WebSocket transport: one message per text (or binary) message, large
//! ones as continuation frames, streamed messages as they are produced.
//!
//! tungstenite does the opening handshake; the frames after it are read and
//! written here ([`reader`], [`writer`]): payloads go from the socket into
//! their message's buffer and from the sender's buffer to the socket with no
//! staging copy.

#[cfg(test)]
mod differential;
mod reader;
mod writer;

use super::{
    next_to_write, Connection, Inbound, Next, Outbound, Outgoing, StreamAborted, StreamPiece,
    TextStream, OUTBOUND_QUEUE_MESSAGES, STALLED_WRITE_TIMEOUT, WS_FRAGMENT_BYTES,
};
use bytes::Bytes;
use exec_server_wsframe::frame::OpCode;
use reader::{Event, FrameReader, ReadError};
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch, Notify};
pub use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::WebSocketStream;
use writer::FrameWriter;

/// How long a closing frame may take to leave before the socket is dropped.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Queued messages gathered into one vectored write stop here (bytes).
const BATCH_BYTES: usize = 4 * 1024 * 1024;

/// Message limit when the stream's configuration sets none: 128 MiB.
const DEFAULT_MAX_MESSAGE_BYTES: usize = 128 * 1024 * 1024;

/// A close frame to send: status code and reason (RFC 6455 §7.4).
type CloseReply = (u16, &'static str);

/// Serves a WebSocket whose opening handshake is complete, as `role`'s side
/// (a server reads masked frames; a client masks what it sends). The limit
/// on one inbound message and the read buffer's size come from the stream's
/// configuration (`max_message_size`, `read_buffer_size`).
///
/// A client must not pass a stream whose server may have sent frames in
/// the same packet as its handshake response: exec-server peers speak only
/// when spoken to, so none does.
pub fn websocket<S>(ws: WebSocketStream<S>, role: Role, peer: String) -> Connection
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let config = *ws.get_config();
    let max_message = config.max_message_size.unwrap_or(DEFAULT_MAX_MESSAGE_BYTES);
    let (read_half, write_half) = tokio::io::split(ws.into_inner());
    let frames_in = FrameReader::new(read_half, role, config.read_buffer_size, max_message);
    let frames_out = FrameWriter::new(write_half, role, WS_FRAGMENT_BYTES);
    let (in_tx, in_rx) = mpsc::channel(64);
    let (out_tx, out_rx) = mpsc::channel::<Outgoing>(OUTBOUND_QUEUE_MESSAGES);
    // The pong owed to the peer: only the latest ping's (a pong may answer
    // for earlier pings, never the other way round, RFC 6455 §5.5.3).
    let (pong_tx, pong_rx) = watch::channel::<Option<Vec<u8>>>(None);
    let ending = Ending {
        closer: Arc::new(Notify::new()),
        close_reply: Arc::default(),
    };
    let writer = tokio::spawn(write_loop(frames_out, out_rx, pong_rx, ending.clone()));
    tokio::spawn(read_loop(
        frames_in,
        in_tx,
        out_tx.clone(),
        pong_tx,
        ending.clone(),
        writer,
    ));
    Connection {
        inbound: in_rx,
        outbound: Outbound::new(out_tx, ending.closer, true, true),
        peer,
    }
}

/// How the reader tells the writer to end: the close frame it owes (set
/// when the connection ends with one of ours), then a wake-up.
#[derive(Clone)]
struct Ending {
    closer: Arc<Notify>,
    close_reply: Arc<Mutex<Option<CloseReply>>>,
}

/// The writer task: pongs first, then queued messages (batched) and
/// streams, until the queue closes or a close is asked for; then the close
/// frame. A socket that fails gets none.
async fn write_loop<W>(
    mut frames_out: FrameWriter<W>,
    mut out_rx: mpsc::Receiver<Outgoing>,
    mut pong_rx: watch::Receiver<Option<Vec<u8>>>,
    ending: Ending,
) where
    W: AsyncWrite + Unpin,
{
    // A stream met in a batch: sent next, on its own.
    let mut carried: Option<Outgoing> = None;
    let mut closing = (1000, "");
    loop {
        let first = tokio::select! {
            biased;
            Ok(()) = pong_rx.changed() => {
                let Some(p) = pong_rx.borrow_and_update().clone() else { continue };
                frames_out.push_control(OpCode::Pong, &p);
                match timed(frames_out.write_queued()).await {
                    Ok(()) => continue,
                    Err(e) => { e.log(); break; }
                }
            }
            next = next_to_write(&mut carried, &mut out_rx, &ending.closer) => match next {
                Next::Message(m) => m,
                Next::QueueClosed => break,
                Next::CloseRequested => {
                    let owed = ending.close_reply.lock().unwrap_or_else(|p| p.into_inner()).take();
                    if let Some(reply) = owed {
                        closing = reply;
                    }
                    break;
                }
            },
        };
        let result = match first {
            // A stream waits for its producer between frames: only the
            // socket's writes count against the stall timeout, each alone.
            Outgoing::Stream(stream) => send_stream(&mut frames_out, stream).await,
            first => write_batch(&mut frames_out, first, &mut carried, &mut out_rx).await,
        };
        match result {
            Ok(()) => {}
            // The message cannot be completed; the socket still works:
            // close it properly (a control frame may come between a
            // message's fragments).
            Err(WriteFailure::Producer) => {
                tracing::warn!("a streamed message's producer failed; closing the connection");
                closing = (1011, "a streamed message failed");
                break;
            }
            // The socket is unusable: no close frame.
            Err(e) => {
                e.log();
                return;
            }
        }
    }
    let (code, reason) = closing;
    let mut payload = code.to_be_bytes().to_vec();
    payload.extend_from_slice(reason.as_bytes());
    frames_out.push_control(OpCode::Close, &payload);
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
        if frames_out.write_queued().await.is_ok() {
            frames_out.shutdown().await;
        }
    })
    .await;
}

/// Writes `first` and everything already queued behind it (up to
/// [`BATCH_BYTES`]) in one vectored write: fewer system calls under load.
/// A stream met on the way is left in `carried`, for next.
async fn write_batch<W>(
    frames_out: &mut FrameWriter<W>,
    first: Outgoing,
    carried: &mut Option<Outgoing>,
    out_rx: &mut mpsc::Receiver<Outgoing>,
) -> Result<(), WriteFailure>
where
    W: AsyncWrite + Unpin,
{
    let mut next = Some(first);
    while let Some(msg) = next.take() {
        match msg {
            Outgoing::Stream(stream) => {
                *carried = Some(Outgoing::Stream(stream));
                break;
            }
            Outgoing::Text(t) => {
                frames_out.push(Bytes::from(t.into_bytes()), &mut OpCode::Text, true)
            }
            Outgoing::Binary(b) => frames_out.push(b, &mut OpCode::Binary, true),
            Outgoing::BinaryParts(a, b) => {
                frames_out.push_parts(vec![a, b], &mut OpCode::Binary, true)
            }
        }
        if frames_out.queued_bytes() < BATCH_BYTES {
            next = out_rx.try_recv().ok();
        }
    }
    timed(frames_out.write_queued()).await
}

/// The reader task: each message to the connection, pings to the writer,
/// until the peer or the protocol ends it. When the read side ends the
/// writer stops too, or a half-open peer would keep the connection (and its
/// session attachment) alive; a writer owing a close frame gets a moment to
/// send it.
async fn read_loop<R>(
    mut frames_in: FrameReader<R>,
    in_tx: mpsc::Sender<Inbound>,
    out: mpsc::Sender<Outgoing>,
    pong_tx: watch::Sender<Option<Vec<u8>>>,
    ending: Ending,
    writer: tokio::task::JoinHandle<()>,
) where
    R: AsyncRead + Unpin,
{
    let reply = loop {
        // Not cancel-safe, and need not be: once the writer is gone the
        // connection is over.
        let event = tokio::select! {
            e = frames_in.next_event() => e,
            _ = out.closed() => break None,
        };
        let item = match classify(event, &pong_tx) {
            ControlFlow::Continue(Some(item)) => item,
            ControlFlow::Continue(None) => continue,
            ControlFlow::Break(reply) => break reply,
        };
        tokio::select! {
            r = in_tx.send(item) => if r.is_err() { break None },
            _ = out.closed() => break None,
        }
    };
    drop(out);
    if let Some(r) = reply {
        *ending.close_reply.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        ending.closer.notify_one();
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, writer).await;
    } else {
        writer.abort();
    }
}

/// What one read means: a message for the connection (`Continue(Some)`),
/// nothing to deliver (`Continue(None)`: a ping, whose pong is handed to
/// the writer), or the end, with the close frame owed (`Break`).
fn classify(
    event: Result<Event, ReadError>,
    pong_tx: &watch::Sender<Option<Vec<u8>>>,
) -> ControlFlow<Option<CloseReply>, Option<Inbound>> {
    const NOT_UTF8: CloseReply = (1007, "text message is not valid UTF-8");
    let item = match event {
        // A text message that is not UTF-8 breaks RFC 6455 (§8.1): the
        // connection is closed with 1007 (the reference drops it without a
        // close frame).
        Ok(Event::Text(bytes)) => match super::inbound_text(bytes) {
            Inbound::Invalid(_) => {
                tracing::debug!("closing a connection: a text message is not UTF-8");
                return ControlFlow::Break(Some(NOT_UTF8));
            }
            item => item,
        },
        // The rest is base64 (ASCII): the skeleton decides.
        Ok(Event::Lifted(lifted)) => match simdutf8::basic::from_utf8(&lifted.skeleton) {
            Ok(_) => Inbound::Lifted(lifted),
            Err(_) => return ControlFlow::Break(Some(NOT_UTF8)),
        },
        // Read as text by the connection until binary frames are on (the
        // reference treats a binary frame's bytes as a message too).
        Ok(Event::Binary(bytes)) => Inbound::Binary(Bytes::from(bytes)),
        Ok(Event::Ping(payload)) => {
            // Replaces a pong not yet sent: the latest answers for both.
            pong_tx.send_replace(Some(payload));
            return ControlFlow::Continue(None);
        }
        // The closing handshake: answered in kind.
        Ok(Event::Close(_)) => return ControlFlow::Break(Some((1000, ""))),
        Err(ReadError::TooBig { max }) => {
            // Refuse with a close frame (1009), not a reset.
            tracing::warn!("closing a connection: a message is over {max} bytes");
            return ControlFlow::Break(Some((1009, "message too big")));
        }
        Err(ReadError::Protocol(why)) => {
            tracing::debug!("closing a connection: websocket protocol error: {why}");
            return ControlFlow::Break(Some((1002, why)));
        }
        Err(ReadError::Io(e)) => {
            tracing::debug!("websocket read failed: {e}");
            return ControlFlow::Break(None);
        }
        Err(ReadError::Eof) => return ControlFlow::Break(None),
    };
    ControlFlow::Continue(Some(item))
}

/// Why the writer stopped.
enum WriteFailure {
    /// The peer did not take a write for [`STALLED_WRITE_TIMEOUT`].
    Stalled,
    /// The socket failed.
    Failed(std::io::Error),
    /// A streamed message's producer failed (the socket is fine).
    Producer,
}

impl WriteFailure {
    fn log(&self) {
        match self {
            WriteFailure::Failed(e) => tracing::debug!("websocket write failed: {e}"),
            WriteFailure::Stalled => {
                tracing::warn!("websocket peer stopped reading; dropping the connection")
            }
            WriteFailure::Producer => tracing::debug!("a streamed message's producer failed"),
        }
    }
}

/// A write that fails as [`WriteFailure::Stalled`] when the peer does not
/// take it within [`STALLED_WRITE_TIMEOUT`].
async fn timed(
    write: impl std::future::Future<Output = std::io::Result<()>>,
) -> Result<(), WriteFailure> {
    match tokio::time::timeout(STALLED_WRITE_TIMEOUT, write).await {
        Ok(r) => r.map_err(WriteFailure::Failed),
        Err(_) => Err(WriteFailure::Stalled),
    }
}

/// Sends a [`TextStream`] as one WebSocket text message: small pieces (and
/// the head) gathered into one frame, large ones as they are (in frames of
/// at most [`WS_FRAGMENT_BYTES`]), the last frame final once the body says
/// [`StreamPiece::End`].
async fn send_stream<W>(
    out: &mut FrameWriter<W>,
    mut stream: TextStream,
) -> Result<(), WriteFailure>
where
    W: AsyncWrite + Unpin,
{
    // One piece is held back until the next arrives: only then is it known
    // not to be the last.
    let mut pending = std::mem::take(&mut stream.head);
    let mut opcode = OpCode::Text;
    loop {
        let piece = match stream.body.recv().await {
            Some(Ok(StreamPiece::Data(piece))) => piece,
            Some(Ok(StreamPiece::End)) => break,
            // A producer that failed, or vanished without saying the body
            // is complete: the message cannot be finished honestly.
            Some(Err(StreamAborted)) | None => return Err(WriteFailure::Producer),
        };
        if pending.len() + piece.len() <= STREAM_GATHER_BYTES {
            pending.extend_from_slice(&piece);
            continue;
        }
        if !pending.is_empty() {
            let bytes = std::mem::replace(&mut pending, piece);
            out.push(Bytes::from(bytes), &mut opcode, false);
            timed(out.write_queued()).await?;
        } else {
            pending = piece;
        }
    }
    if pending.len() + stream.tail.len() > STREAM_GATHER_BYTES {
        let bytes = std::mem::take(&mut pending);
        out.push(Bytes::from(bytes), &mut opcode, false);
        pending = std::mem::take(&mut stream.tail);
    } else {
        pending.extend_from_slice(&stream.tail);
    }
    out.push(Bytes::from(pending), &mut opcode, true);
    timed(out.write_queued()).await
}

/// Pieces of a [`TextStream`] smaller than this together are sent as one
/// WebSocket frame: 64 KiB.
const STREAM_GATHER_BYTES: usize = 64 * 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::test_support::text_stream;
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::protocol::Role;
    use tokio_tungstenite::tungstenite::Message as WsMessage;

    /// A server-side WebSocket over an in-memory pipe, and the client's end.
    async fn ws_pair() -> (Connection, WebSocketStream<tokio::io::DuplexStream>) {
        let (a, b) = tokio::io::duplex(1 << 20);
        let server = WebSocketStream::from_raw_socket(a, Role::Server, None).await;
        let client = WebSocketStream::from_raw_socket(b, Role::Client, None).await;
        (websocket(server, Role::Server, "test".into()), client)
    }

    #[tokio::test]
    async fn a_streamed_message_arrives_whole_between_the_others() {
        let (conn, mut client) = ws_pair().await;
        let (stream, tx) = text_stream(4);
        conn.outbound.send("first".into()).await.unwrap();
        conn.outbound.send_stream(stream).await.unwrap();
        conn.outbound.send("last".into()).await.unwrap();
        // Pieces of several frames' worth, produced while the writer waits;
        // one larger than a frame may be.
        let mut pieces: Vec<Vec<u8>> = (0..5u8).map(|i| vec![b'a' + i; 300_000]).collect();
        pieces.push(vec![b'z'; 2 * WS_FRAGMENT_BYTES + 7]);
        pieces.push(b"tiny".to_vec());
        let expected: Vec<u8> =
            [b"{\"data\":\"".to_vec(), pieces.concat(), b"\"}".to_vec()].concat();
        let producer = tokio::spawn(async move {
            for p in pieces {
                tx.send(Ok(StreamPiece::Data(p))).await.unwrap();
            }
            tx.send(Ok(StreamPiece::End)).await.unwrap();
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
    async fn a_failed_or_vanished_producer_closes_the_connection_without_a_short_message() {
        for vanish in [false, true] {
            let (conn, mut client) = ws_pair().await;
            let (stream, tx) = text_stream(4);
            conn.outbound.send_stream(stream).await.unwrap();
            conn.outbound.send("after".into()).await.unwrap();
            tx.send(Ok(StreamPiece::Data(vec![b'x'; 200_000])))
                .await
                .unwrap();
            if vanish {
                // Dropped without `End` (a producer that panicked).
                drop(tx);
            } else {
                tx.send(Err(StreamAborted)).await.unwrap();
            }
            // The client never receives a complete message: the stream ends.
            let next = tokio::time::timeout(Duration::from_secs(10), client.next())
                .await
                .expect("the connection stayed open");
            assert!(
                !matches!(next, Some(Ok(WsMessage::Text(_)))),
                "a message arrived ({vanish}): {next:?}"
            );
            conn.outbound.closed().await;
        }
    }
}
