//! The WebSocket transport: one message per text (or binary) message, large
//! ones as continuation frames, streamed messages as they are produced.

use super::{
    next_to_write, Connection, Inbound, Next, Outbound, Outgoing, StreamAborted, StreamPiece,
    TextStream, OUTBOUND_QUEUE_MESSAGES, STALLED_WRITE_TIMEOUT, WS_FRAGMENT_BYTES,
};
use futures_util::{SinkExt, StreamExt};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, Notify};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::WebSocketStream;

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
        // A stream met in a batch: sent next, on its own.
        let mut carried: Option<Outgoing> = None;
        loop {
            let first = match next_to_write(&mut carried, &mut out_rx, &writer_closer).await {
                Next::Message(m) => m,
                Next::QueueClosed => break,
                Next::CloseRequested => {
                    let frame = writer_close_frame
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .take();
                    if let Some(frame) = frame {
                        let _ = tokio::time::timeout(
                            Duration::from_secs(5),
                            sink.send(WsMessage::Close(Some(frame))),
                        )
                        .await;
                    }
                    break;
                }
            };
            let result = match first {
                // A stream waits for its producer between frames: only the
                // socket's writes count against the stall timeout, each alone.
                Outgoing::Stream(stream) => send_ws_stream(&mut sink, stream).await,
                first => {
                    // Feed everything already queued, then flush once: fewer
                    // syscalls under load.
                    let mut batch = Some(first);
                    let sent = tokio::time::timeout(STALLED_WRITE_TIMEOUT, async {
                        while let Some(msg) = batch.take() {
                            match msg {
                                Outgoing::Stream(stream) => {
                                    carried = Some(Outgoing::Stream(stream));
                                    break;
                                }
                                // Large messages go out as continuation frames: the
                                // WebSocket library buffers a whole frame and shifts
                                // its buffer after each partial write, which is
                                // quadratic in the frame size.
                                Outgoing::Text(t) => {
                                    let bytes = t.into_bytes().into();
                                    send_frames(&mut sink, bytes, &mut Data::Text, true).await?
                                }
                                Outgoing::Binary(b) => {
                                    send_frames(&mut sink, b, &mut Data::Binary, true).await?
                                }
                            }
                            batch = out_rx.try_recv().ok();
                        }
                        sink.flush().await.map_err(WriteFailure::Failed)
                    })
                    .await;
                    sent.unwrap_or(Err(WriteFailure::Stalled))
                }
            };
            match result {
                Ok(()) => {}
                Err(WriteFailure::Failed(e)) => {
                    tracing::debug!("websocket write failed: {e}");
                    break;
                }
                Err(WriteFailure::Stalled) => {
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

/// Why the writer stopped.
enum WriteFailure {
    /// The peer did not take a write for [`STALLED_WRITE_TIMEOUT`].
    Stalled,
    /// The socket failed, or a streamed message's producer did.
    Failed(tokio_tungstenite::tungstenite::Error),
}

type WsSink<S> = futures_util::stream::SplitSink<WebSocketStream<S>, WsMessage>;

/// Feeds one frame, failing as [`WriteFailure::Stalled`] when the peer does
/// not take it within [`STALLED_WRITE_TIMEOUT`].
async fn feed<S>(sink: &mut WsSink<S>, msg: WsMessage) -> Result<(), WriteFailure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(STALLED_WRITE_TIMEOUT, sink.feed(msg)).await {
        Ok(r) => r.map_err(WriteFailure::Failed),
        Err(_) => Err(WriteFailure::Stalled),
    }
}

/// Sends `bytes` as the next part of a message: frames of at most
/// [`WS_FRAGMENT_BYTES`] (slices, never copies), the first with `opcode`
/// (then [`Data::Continue`]), the last final when `fin`. A small message
/// is one ordinary frame.
async fn send_frames<S>(
    sink: &mut WsSink<S>,
    bytes: tokio_tungstenite::tungstenite::Bytes,
    opcode: &mut Data,
    fin: bool,
) -> Result<(), WriteFailure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut offset = 0;
    loop {
        let end = (offset + WS_FRAGMENT_BYTES).min(bytes.len());
        let last = end == bytes.len();
        let frame = Frame::message(bytes.slice(offset..end), OpCode::Data(*opcode), fin && last);
        feed(sink, WsMessage::Frame(frame)).await?;
        *opcode = Data::Continue;
        if last {
            return Ok(());
        }
        offset = end;
    }
}

/// Sends a [`TextStream`] as one WebSocket text message: small pieces (and
/// the head) gathered into one frame, large ones as they are (in frames of
/// at most [`WS_FRAGMENT_BYTES`]), the last frame final once the body says
/// [`StreamPiece::End`].
async fn send_ws_stream<S>(sink: &mut WsSink<S>, mut stream: TextStream) -> Result<(), WriteFailure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    // One piece is held back until the next arrives: only then is it known
    // not to be the last.
    let mut pending = std::mem::take(&mut stream.head);
    let mut opcode = Data::Text;
    loop {
        let piece = match stream.body.recv().await {
            Some(Ok(StreamPiece::Data(piece))) => piece,
            Some(Ok(StreamPiece::End)) => break,
            // A producer that failed, or vanished without saying the body
            // is complete: the message cannot be finished honestly.
            Some(Err(StreamAborted)) | None => {
                return Err(WriteFailure::Failed(
                    tokio_tungstenite::tungstenite::Error::Io(std::io::Error::other(
                        "the producer of a streamed message failed",
                    )),
                ))
            }
        };
        if pending.len() + piece.len() <= STREAM_GATHER_BYTES {
            pending.extend_from_slice(&piece);
            continue;
        }
        if !pending.is_empty() {
            let bytes = std::mem::replace(&mut pending, piece).into();
            send_frames(sink, bytes, &mut opcode, false).await?;
        } else {
            pending = piece;
        }
    }
    if pending.len() + stream.tail.len() > STREAM_GATHER_BYTES {
        let bytes = std::mem::take(&mut pending).into();
        send_frames(sink, bytes, &mut opcode, false).await?;
        pending = std::mem::take(&mut stream.tail);
    } else {
        pending.extend_from_slice(&stream.tail);
    }
    send_frames(sink, pending.into(), &mut opcode, true).await?;
    match tokio::time::timeout(STALLED_WRITE_TIMEOUT, sink.flush()).await {
        Ok(r) => r.map_err(WriteFailure::Failed),
        Err(_) => Err(WriteFailure::Stalled),
    }
}

/// Pieces of a [`TextStream`] smaller than this together are sent as one
/// WebSocket frame: 64 KiB.
const STREAM_GATHER_BYTES: usize = 64 * 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::test_support::text_stream;

    /// A server-side WebSocket over an in-memory pipe, and the client's end.
    async fn ws_pair() -> (Connection, WebSocketStream<tokio::io::DuplexStream>) {
        use tokio_tungstenite::tungstenite::protocol::Role;
        let (a, b) = tokio::io::duplex(1 << 20);
        let server = WebSocketStream::from_raw_socket(a, Role::Server, None).await;
        let client = WebSocketStream::from_raw_socket(b, Role::Client, None).await;
        (websocket(server, "test".into()), client)
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
