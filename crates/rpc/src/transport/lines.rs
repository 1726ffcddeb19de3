//! The line transport (stdio, a Unix socket): one message per `\n`-ended line.

use super::{
    next_to_write, Connection, Next, Outbound, Outgoing, StreamPiece, TextStream, MAX_LINE_BYTES,
    OUTBOUND_QUEUE_MESSAGES, STALLED_WRITE_TIMEOUT,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, Notify};

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

/// Writes `data`, failing when the peer does not take it within
/// [`STALLED_WRITE_TIMEOUT`].
async fn write_within<W: AsyncWrite + Unpin>(w: &mut W, data: &[u8]) -> std::io::Result<()> {
    match tokio::time::timeout(STALLED_WRITE_TIMEOUT, w.write_all(data)).await {
        Ok(r) => r,
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

/// Writes a [`TextStream`] as one line: head, each piece as it arrives, tail.
/// A producer that fails or vanishes before [`StreamPiece::End`] fails the
/// write (the connection closes; the line is never completed).
async fn write_stream<W: AsyncWrite + Unpin>(
    w: &mut W,
    mut stream: TextStream,
) -> std::io::Result<()> {
    write_within(w, &stream.head).await?;
    loop {
        match stream.body.recv().await {
            Some(Ok(StreamPiece::Data(piece))) => write_within(w, &piece).await?,
            Some(Ok(StreamPiece::End)) => break,
            Some(Err(_)) | None => {
                return Err(std::io::Error::other(
                    "the producer of a streamed message failed",
                ))
            }
        }
    }
    write_within(w, &stream.tail).await?;
    write_within(w, b"\n").await?;
    match tokio::time::timeout(STALLED_WRITE_TIMEOUT, w.flush()).await {
        Ok(r) => r,
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
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
        // A stream met in a batch: sent next, on its own.
        let mut carried: Option<Outgoing> = None;
        loop {
            let Next::Message(first) =
                next_to_write(&mut carried, &mut out_rx, &writer_closer).await
            else {
                break;
            };
            let result = match first {
                // A stream waits for its producer between pieces: only the
                // writes count against the stall timeout, each alone.
                Outgoing::Stream(stream) => write_stream(&mut w, stream).await,
                first => {
                    let mut batch = Some(first);
                    let sent = tokio::time::timeout(STALLED_WRITE_TIMEOUT, async {
                        while let Some(msg) = batch.take() {
                            match msg {
                                Outgoing::Text(msg) => {
                                    w.write_all(msg.as_bytes()).await?;
                                    w.write_all(b"\n").await?;
                                }
                                Outgoing::Stream(stream) => {
                                    carried = Some(Outgoing::Stream(stream));
                                    break;
                                }
                                // Never agreed on a line transport (`enable_binary` refuses).
                                Outgoing::Binary(_) | Outgoing::BinaryParts(..) => {
                                    return Err(std::io::Error::other(
                                        "binary frame on a line transport",
                                    ))
                                }
                            }
                            batch = out_rx.try_recv().ok();
                        }
                        w.flush().await
                    })
                    .await;
                    sent.unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
                }
            };
            if result.is_err() {
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
            let item = super::inbound_text(std::mem::take(&mut buf));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::test_support::text_stream;

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

    #[tokio::test]
    async fn a_line_transport_writes_a_streamed_message_as_one_line() {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let (r, w) = tokio::io::split(ours);
        let conn = lines(r, w, "test".into());
        let (stream, tx) = text_stream(2);
        conn.outbound.send_stream(stream).await.unwrap();
        conn.outbound.send("next".into()).await.unwrap();
        tx.send(Ok(StreamPiece::Data(b"abc".to_vec())))
            .await
            .unwrap();
        tx.send(Ok(StreamPiece::Data(b"def".to_vec())))
            .await
            .unwrap();
        tx.send(Ok(StreamPiece::End)).await.unwrap();
        let mut lines = BufReader::new(theirs).lines();
        assert_eq!(
            lines.next_line().await.unwrap().unwrap(),
            "{\"data\":\"abcdef\"}"
        );
        assert_eq!(lines.next_line().await.unwrap().unwrap(), "next");
    }
}
