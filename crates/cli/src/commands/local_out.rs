//! Local stdout and stderr for a command's streamed output, written without
//! blocking the runtime's thread.
//!
//! Why: `run` and `shell` drive their client (and, embedded, the whole
//! server) on one thread, so a write that blocks because the reader of our
//! stdout stopped reading (`| less`, a stalled consumer, a terminal paused
//! with Ctrl-S or behind a slow link) would stall every timer, signal and
//! limit of that runtime too. The inherited descriptor's flags are never
//! changed: a shared pipe or terminal made non-blocking would surprise every
//! other process writing to it. Instead:
//!
//! - a pipe or a terminal is opened again through `/proc/self/fd` with
//!   `O_NONBLOCK`: a file description of our own on the same pipe or
//!   terminal, written until `EAGAIN`, then waited on through epoll;
//! - a socket is written with `send(MSG_DONTWAIT)`, waited on the same way;
//! - anything else (a regular file, `/dev/null`, a descriptor that cannot be
//!   opened again) is written with blocking writes, which do not stall.

use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// How writes reach the descriptor.
enum Mode {
    /// A pipe or terminal opened again, non-blocking (our own description).
    Reopened(AsyncFd<std::fs::File>),
    /// A socket: `send` with `MSG_DONTWAIT`; readiness through a duplicate.
    Socket(AsyncFd<OwnedFd>),
    /// Blocking writes to the duplicate.
    Blocking,
}

/// One local output descriptor (written through duplicates or a new
/// description: closing this leaves the caller's descriptor open).
pub struct LocalOut {
    fd: std::fs::File,
    mode: Mode,
}

impl LocalOut {
    /// Writes to what `fd` refers to. Errors: it cannot be duplicated.
    pub fn new(fd: BorrowedFd<'_>) -> io::Result<LocalOut> {
        let file = std::fs::File::from(fd.try_clone_to_owned()?);
        let kind = file.metadata().map(|m| m.file_type());
        let mode = match kind {
            Ok(t) if t.is_fifo() || t.is_char_device() => reopened(fd).unwrap_or(Mode::Blocking),
            Ok(t) if t.is_socket() => file
                .as_fd()
                .try_clone_to_owned()
                .ok()
                .and_then(|d| {
                    // SAFETY: the AsyncFd owns this duplicate and
                    // deregisters it before closing it; nothing else holds it.
                    unsafe { AsyncFd::register_with_interest(d, Interest::WRITABLE) }.ok()
                })
                .map_or(Mode::Blocking, Mode::Socket),
            _ => Mode::Blocking,
        };
        Ok(LocalOut { fd: file, mode })
    }

    /// The descriptor written to (a duplicate of the caller's).
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Writes all of `data`. Errors: the descriptor's (`EPIPE` when the
    /// reader is gone).
    pub async fn write_all(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let n = match &self.mode {
                Mode::Reopened(f) => f.async_io(Interest::WRITABLE, |f| (&*f).write(data)).await,
                Mode::Socket(s) => {
                    s.async_io(Interest::WRITABLE, |s| send_nowait(s.as_raw_fd(), data))
                        .await
                }
                Mode::Blocking => return self.fd.write_all(data),
            };
            match n {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => data = &data[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Sinks for a start with id `process_id` ([`exec_server::OutputSinks`]):
/// our stdout and stderr where each is a pipe, opened again (our own file
/// description, so the server may make it non-blocking). `None` when neither
/// is a pipe.
pub fn pipe_sinks(process_id: &str) -> Option<std::sync::Arc<exec_server::OutputSinks>> {
    let pipe = |fd: BorrowedFd<'_>| -> Option<OwnedFd> {
        let t = std::fs::File::from(fd.try_clone_to_owned().ok()?)
            .metadata()
            .ok()?
            .file_type();
        if !t.is_fifo() {
            return None;
        }
        let sink = OwnedFd::from(reopen(fd).ok()?);
        // As large before the start as `run` makes it after: the command's
        // first output may be moved there before `run` gets to it.
        let _ = nix::fcntl::fcntl(&sink, nix::fcntl::FcntlArg::F_SETPIPE_SZ(1024 * 1024));
        Some(sink)
    };
    let out = pipe(io::stdout().as_fd());
    let err = pipe(io::stderr().as_fd());
    if out.is_none() && err.is_none() {
        return None;
    }
    let sinks = exec_server::OutputSinks::new();
    sinks.offer(process_id, out, err).ok()?;
    Some(std::sync::Arc::new(sinks))
}

/// `fd` (a pipe or terminal) opened again for writing with `O_NONBLOCK`, and
/// polled; `None` when it cannot be (a terminal of another user, a pipe
/// without a reader, a device epoll does not take such as `/dev/null`).
fn reopened(fd: BorrowedFd<'_>) -> Option<Mode> {
    let f = reopen(fd).ok()?;
    // SAFETY: the AsyncFd owns this file and deregisters it before closing
    // it; nothing else holds the descriptor.
    unsafe { AsyncFd::register_with_interest(f, Interest::WRITABLE) }
        .ok()
        .map(Mode::Reopened)
}

/// `fd` (a pipe or terminal) opened again for writing through
/// `/proc/self/fd`: a file description of our own, non-blocking (so a pipe
/// without a reader fails with `ENXIO` instead of waiting for one).
fn reopen(fd: BorrowedFd<'_>) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// One `send(fd, data, MSG_DONTWAIT | MSG_NOSIGNAL)`: what fits now, or
/// `EAGAIN`.
fn send_nowait(fd: i32, data: &[u8]) -> io::Result<usize> {
    // SAFETY: `data` is valid for its length for the call.
    let n = unsafe {
        libc::send(
            fd,
            data.as_ptr().cast(),
            data.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::time::Duration;

    fn pipe() -> (std::fs::File, OwnedFd) {
        let (r, w) = nix::unistd::pipe().unwrap();
        (std::fs::File::from(r), w)
    }

    /// Writes `data` through `out` while nothing reads, on this one thread:
    /// a 50 ms timer must fire meanwhile and start `drain` (else it starts
    /// on its own after 10 s, and the test fails instead of hanging).
    /// Returns what `drain` read.
    async fn written_while_stalled(
        mut out: LocalOut,
        data: &[u8],
        drain: impl FnOnce() -> Vec<u8> + Send + 'static,
    ) -> Vec<u8> {
        let (go, told) = std::sync::mpsc::channel::<()>();
        let reader = std::thread::spawn(move || {
            let by_timer = told.recv_timeout(Duration::from_secs(10)).is_ok();
            (by_timer, drain())
        });
        let writing = async {
            out.write_all(data).await.unwrap();
            drop(out);
        };
        let timer = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = go.send(());
        };
        tokio::join!(writing, timer);
        let (by_timer, got) = reader.join().unwrap();
        assert!(by_timer, "the timer fired while nothing was read");
        got
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_full_pipe_leaves_the_thread_free_and_every_byte_arrives() {
        let (mut r, w) = pipe();
        let out = LocalOut::new(w.as_fd()).unwrap();
        drop(w);
        assert!(
            matches!(out.mode, Mode::Reopened(_)),
            "a pipe is opened again"
        );
        // Four times what the pipe holds (64 KiB by default).
        let data: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
        let got = written_while_stalled(out, &data, move || {
            let mut got = Vec::new();
            r.read_to_end(&mut got).unwrap();
            got
        })
        .await;
        assert_eq!(got, data);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_terminal_nobody_reads_leaves_the_thread_free() {
        let pty = nix::pty::openpty(None, None).unwrap();
        let out = LocalOut::new(pty.slave.as_fd()).unwrap();
        assert!(
            matches!(out.mode, Mode::Reopened(_)),
            "a terminal is opened again"
        );
        // No line ends (a terminal turns them into two bytes): far more than
        // the terminal buffers.
        let data: Vec<u8> = (0..1024 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
        let want = data.len();
        let mut master = std::fs::File::from(pty.master);
        let got = written_while_stalled(out, &data, move || {
            let mut got = vec![0u8; 0];
            let mut chunk = [0u8; 65536];
            while got.len() < want {
                match master.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&chunk[..n]),
                }
            }
            got
        })
        .await;
        assert_eq!(got, data);
        drop(pty.slave);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_regular_file_is_written_as_usual() {
        let dir = std::env::temp_dir().join(format!("local-out-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out");
        let f = std::fs::File::create(&path).unwrap();
        let mut out = LocalOut::new(f.as_fd()).unwrap();
        out.write_all(b"one ").await.unwrap();
        out.write_all(b"two").await.unwrap();
        drop(out);
        assert_eq!(std::fs::read(&path).unwrap(), b"one two");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_pipe_with_no_reader_is_an_error() {
        let (r, w) = pipe();
        drop(r);
        let mut out = LocalOut::new(w.as_fd()).unwrap();
        let err = out.write_all(b"x").await.unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPIPE));
    }
}
