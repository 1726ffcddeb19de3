//! Moving relay frames from one TCP socket to another without copying them
//! through user space: `splice(2)` from the executor's socket into a pipe,
//! and from the pipe into the harness's socket (the kernel passes page
//! references; on loopback about a third of a copying forwarder's CPU, see
//! BENCHMARKS.md). A node may do this only for frames it may pass on as they
//! came, header and masked payload alike, so only to a harness that agreed
//! to read masked frames ([`crate::api::MASKED_FRAMES_HEADER`]).
//!
//! A node's [`super::Reader`] and [`super::Writer`] of such a socket use a
//! [`SharedTcp`], so that they and the splices go through one
//! `tokio::net::TcpStream` and its readiness stays right for all of them.

pub use exec_server_sysio::shared_tcp::SharedTcp;
use nix::errno::Errno;
use nix::fcntl::{fcntl, splice, FcntlArg, OFlag, SpliceFFlags};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// What a node's pipe for one harness asks to hold: 1 MiB (the most an
/// unprivileged process may ask by default, `/proc/sys/fs/pipe-max-size`;
/// where it is refused the pipe keeps the kernel's 64 KiB).
pub const PIPE_BYTES: usize = 1 << 20;

/// A non-blocking pipe that holds spliced frames for one harness.
#[derive(Debug)]
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    /// A new pipe, asked to hold [`PIPE_BYTES`]. Errors: `pipe2`'s (out of
    /// file descriptors).
    pub fn new() -> io::Result<Pipe> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        // Best effort: a smaller pipe only means more frames fall back to
        // being read (see `splice_in`).
        let _ = fcntl(&write, FcntlArg::F_SETPIPE_SZ(PIPE_BYTES as i32));
        Ok(Pipe { read, write })
    }
}

/// How far [`splice_in`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplicedIn {
    /// This many bytes (at least one) moved into the pipe.
    Moved(usize),
    /// The pipe is full while the socket has bytes waiting.
    PipeFull,
    /// The peer closed the connection.
    Closed,
}

/// Moves up to `len` bytes from `tcp` into `pipe`, waiting for the socket
/// to have some. Cancel-safe (a dropped call moved nothing). Errors: the
/// socket's or the pipe's.
pub async fn splice_in(tcp: &TcpStream, pipe: &Pipe, len: usize) -> io::Result<SplicedIn> {
    loop {
        tcp.readable().await?;
        let moved = tcp.try_io(Interest::READABLE, || {
            let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
            match splice(tcp.as_fd(), None, &pipe.write, None, len, flags) {
                Ok(0) => Ok(SplicedIn::Closed),
                Ok(n) => Ok(SplicedIn::Moved(n)),
                // Either side may be what would block: the pipe is full
                // only if the socket has bytes (else readiness is cleared
                // and the loop waits for them).
                Err(Errno::EAGAIN) => match peek_now(tcp) {
                    Ok(true) => Ok(SplicedIn::PipeFull),
                    Ok(false) => Err(io::ErrorKind::WouldBlock.into()),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e.into()),
            }
        });
        match moved {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

/// Whether `tcp` has a byte to read (or its peer closed), without waiting.
fn peek_now(tcp: &TcpStream) -> io::Result<bool> {
    let fd = std::os::fd::AsRawFd::as_raw_fd(tcp);
    let mut byte = [0u8; 1];
    let flags = nix::sys::socket::MsgFlags::MSG_PEEK | nix::sys::socket::MsgFlags::MSG_DONTWAIT;
    match nix::sys::socket::recv(fd, &mut byte, flags) {
        Ok(_) => Ok(true),
        Err(Errno::EAGAIN) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Moves up to `len` bytes from `pipe` into `tcp` without waiting: the
/// bytes moved (0 when the socket takes none now). The caller must know
/// that the pipe holds `len` bytes. Errors: the socket's or the pipe's.
pub fn splice_out_now(pipe: &Pipe, tcp: &TcpStream, len: usize) -> io::Result<usize> {
    match tcp.try_io(Interest::WRITABLE, || splice_out_once(pipe, tcp, len)) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
        r => r,
    }
}

/// Moves exactly `len` bytes from `pipe` into `tcp`, waiting for the socket
/// to take them. The caller must know that the pipe holds `len` bytes.
/// Errors: the socket's or the pipe's; the connection is unusable after one
/// (or after the call is dropped half way).
pub async fn splice_out(pipe: &Pipe, tcp: &TcpStream, mut len: usize) -> io::Result<()> {
    while len > 0 {
        tcp.writable().await?;
        match tcp.try_io(Interest::WRITABLE, || splice_out_once(pipe, tcp, len)) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => len -= n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn splice_out_once(pipe: &Pipe, tcp: &TcpStream, len: usize) -> io::Result<usize> {
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
    splice(&pipe.read, None, tcp.as_fd(), None, len, flags).map_err(io::Error::from)
}

/// Reads exactly `len` bytes from `tcp`. Errors: the socket's;
/// `UnexpectedEof` when the peer closes first.
pub async fn read_exact(tcp: &TcpStream, len: usize) -> io::Result<bytes::BytesMut> {
    let mut buf = bytes::BytesMut::with_capacity(len);
    while buf.len() < len {
        tcp.readable().await?;
        let want = len - buf.len();
        let mut room = bytes::BufMut::limit(&mut buf, want);
        match tcp.try_read_buf(&mut room) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(buf)
}

#[cfg(test)]
#[path = "splice_tests.rs"]
mod tests;
