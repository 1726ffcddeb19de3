//! One TCP socket shared by several users in a process: a reader, a writer
//! and code that works on the socket itself (a relay node's `splice(2)`),
//! all through one `tokio::net::TcpStream`, so its readiness stays right for
//! every one of them. Reads go into the caller's unused capacity (not zeroed
//! first), as tokio's own `TcpStream` does.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// One TCP socket shared by a node's reader, writer and splices: reads and
/// writes go through the same `TcpStream` (readiness included) as
/// whatever else works on the socket. Cheap to clone; a write shuts down
/// the write direction of the socket (shared by every clone).
#[derive(Clone, Debug)]
pub struct SharedTcp(Arc<TcpStream>);

impl SharedTcp {
    /// Shares `tcp`.
    pub fn new(tcp: TcpStream) -> SharedTcp {
        SharedTcp(Arc::new(tcp))
    }

    /// The socket.
    pub fn tcp(&self) -> &TcpStream {
        &self.0
    }
}

impl AsyncRead for SharedTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            ready!(self.0.poll_read_ready(cx))?;
            // SAFETY: the slice is only written to (by `read(2)`), never
            // read, and `assume_init` covers exactly the `n` bytes written.
            let unfilled = unsafe { &mut *(buf.unfilled_mut() as *mut [_] as *mut [u8]) };
            match self.0.try_read(unfilled) {
                Ok(n) => {
                    // SAFETY: `read(2)` wrote these `n` bytes.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl SharedTcp {
    /// Polls `write` (a non-blocking write to the socket) until it does not
    /// find the socket full.
    fn poll_writing(
        &self,
        cx: &mut Context<'_>,
        write: impl Fn(&TcpStream) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match write(&self.0) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }
}

impl AsyncWrite for SharedTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_writing(cx, |tcp| tcp.try_write(buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_writing(cx, |tcp| tcp.try_write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&*self.0);
        // SAFETY: `fd` is the open socket `self` holds.
        if unsafe { libc::shutdown(fd, libc::SHUT_WR) } == 0 {
            return Poll::Ready(Ok(()));
        }
        match io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::ENOTCONN) => Poll::Ready(Ok(())),
            e => Poll::Ready(Err(e)),
        }
    }
}
