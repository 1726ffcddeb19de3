//! A node's connections may not keep a write blocked for long: an HTTP
//! client that pipelines requests and never reads the answers, or a relay
//! peer that stops reading, would otherwise hold its place under the
//! connection limit (and its buffers) for as long as it stays connected.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// Wraps a connection so that a write (or flush) that stays blocked for
/// `limit` fails with [`io::ErrorKind::TimedOut`]; reads are untouched.
pub(crate) struct WriteDeadline<S> {
    io: S,
    limit: Duration,
    /// Running while a write is blocked: started by the first blocked poll.
    blocked: Option<Pin<Box<Sleep>>>,
}

impl<S> WriteDeadline<S> {
    pub(crate) fn new(io: S, limit: Duration) -> WriteDeadline<S> {
        WriteDeadline {
            io,
            limit,
            blocked: None,
        }
    }

    /// The connection wrapped.
    pub(crate) fn into_inner(self) -> S {
        self.io
    }

    /// The outcome of a write that `poll` found blocked: still waiting, or
    /// the error once it has been blocked for `limit`.
    fn blocked<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let limit = self.limit;
        let timer = self
            .blocked
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer has not read for the write timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn outcome<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match poll {
            Poll::Ready(r) => {
                self.blocked = None;
                Poll::Ready(r)
            }
            Poll::Pending => self.blocked(cx),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_write(cx, buf);
        this.outcome(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.outcome(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_flush(cx);
        this.outcome(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_write_blocked_past_the_limit_fails_and_a_slow_reader_is_not_cut() {
        // A 1 KiB pipe nobody reads: the second KiB blocks until the limit.
        let (a, b) = tokio::io::duplex(1024);
        let mut w = WriteDeadline::new(a, Duration::from_secs(30));
        let t = tokio::time::Instant::now();
        let err = w.write_all(&[7u8; 4096]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(t.elapsed().as_secs(), 30);
        drop(b);
        // A reader that takes 1 KiB every 20 s keeps each wait below it.
        let (a, mut b) = tokio::io::duplex(1024);
        let mut w = WriteDeadline::new(a, Duration::from_secs(30));
        let reader = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut got = 0;
            let mut buf = [0u8; 1024];
            while got < 4096 {
                tokio::time::sleep(Duration::from_secs(20)).await;
                got += b.read(&mut buf).await.unwrap();
            }
            got
        });
        w.write_all(&[7u8; 4096]).await.unwrap();
        assert_eq!(reader.await.unwrap(), 4096);
    }
}
