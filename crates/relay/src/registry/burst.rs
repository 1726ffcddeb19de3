//! A relay socket's reads: small while it idles, large while it streams.
//!
//! tungstenite reads at most its configured buffer size per call (8 KiB on
//! a node, where every attached executor's socket holds that buffer idle or
//! not). A stream of 256 KiB frames then costs 32 system calls and wake-ups
//! per frame. [`BurstReader`] sits under tungstenite: a read that fills the
//! caller's buffer says more is waiting, and from then on the socket is read
//! [`BURST_BYTES`] at a time into a buffer of its own, handed out in the
//! caller's slices. A burst that comes back short, or finds nothing, ends
//! the streak; a plain read that comes back short (a trickle, or silence)
//! frees the buffer. An idle socket holds none.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes one read takes from a socket that streams: 256 KiB.
pub const BURST_BYTES: usize = 256 * 1024;

/// An [`AsyncRead`] + [`AsyncWrite`] that reads in bursts while its peer
/// streams (see the module). Writes pass through unchanged.
pub struct BurstReader<T> {
    inner: T,
    /// Read ahead, not yet handed out: `buf[at..filled]`.
    buf: Option<Box<[u8]>>,
    at: usize,
    filled: usize,
    /// The last read filled what it was given: more is likely waiting.
    busy: bool,
}

impl<T> BurstReader<T> {
    /// Wraps `inner`; nothing is allocated until it streams.
    pub fn new(inner: T) -> BurstReader<T> {
        BurstReader {
            inner,
            buf: None,
            at: 0,
            filled: 0,
            busy: false,
        }
    }

    /// Hands out what was read ahead.
    fn hand_out(&mut self, out: &mut ReadBuf<'_>) {
        let Some(buf) = &self.buf else { return };
        let n = (self.filled - self.at).min(out.remaining());
        out.put_slice(&buf[self.at..self.at + n]);
        self.at += n;
        if self.at == self.filled {
            self.at = 0;
            self.filled = 0;
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for BurstReader<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.filled > this.at {
            this.hand_out(out);
            return Poll::Ready(Ok(()));
        }
        if !this.busy {
            // Straight into the caller's buffer; a full one means the peer
            // streams, and the next reads go in bursts.
            let before = out.filled().len();
            let wanted = out.remaining();
            let r = Pin::new(&mut this.inner).poll_read(cx, out);
            if let Poll::Ready(Ok(())) = r {
                this.busy = wanted > 0 && out.filled().len() - before == wanted;
                if !this.busy {
                    // A trickle or the end: not worth holding a buffer for.
                    this.buf = None;
                }
            }
            return r;
        }
        let buf = this
            .buf
            .get_or_insert_with(|| vec![0u8; BURST_BYTES].into_boxed_slice());
        let mut ahead = ReadBuf::new(buf);
        match Pin::new(&mut this.inner).poll_read(cx, &mut ahead) {
            Poll::Ready(Ok(())) => {
                let n = ahead.filled().len();
                // Short of a burst: the socket drained (or ended).
                this.busy = n == BURST_BYTES;
                this.at = 0;
                this.filled = n;
                this.hand_out(out);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                // Nothing waiting after all: the next read is a plain one,
                // which frees the buffer if the socket has gone quiet.
                this.busy = false;
                Poll::Pending
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for BurstReader<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Reads `n` bytes through `r` in slices of `slice` bytes.
    async fn read_all<R: AsyncRead + Unpin>(r: &mut R, n: usize, slice: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n);
        let mut chunk = vec![0u8; slice];
        while out.len() < n {
            let k = r.read(&mut chunk).await.unwrap();
            assert!(k > 0, "ended early at {}", out.len());
            out.extend_from_slice(&chunk[..k]);
        }
        out
    }

    #[tokio::test]
    async fn every_byte_in_order_through_bursts_and_idle_spells() {
        let (a, mut b) = tokio::io::duplex(64 * 1024);
        let mut r = BurstReader::new(a);
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            // A stream, a pause, then small writes.
            b.write_all(&sent[..2_000_000]).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            for piece in sent[2_000_000..].chunks(777) {
                b.write_all(piece).await.unwrap();
            }
            b
        });
        let got = read_all(&mut r, data.len(), 8 * 1024).await;
        assert!(got == data);
        let mut b = writer.await.unwrap();
        b.write_all(b"tail").await.unwrap();
        drop(b);
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"tail");
        assert!(r.buf.is_none(), "an ended socket holds no buffer");
    }

    #[tokio::test]
    async fn an_idle_socket_holds_no_buffer() {
        let (a, mut b) = tokio::io::duplex(1024);
        let mut r = BurstReader::new(a);
        b.write_all(b"ping").await.unwrap();
        let mut chunk = [0u8; 8192];
        assert_eq!(r.read(&mut chunk).await.unwrap(), 4);
        assert!(r.buf.is_none() && !r.busy);
    }
}
