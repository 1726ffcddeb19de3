//! Local stdout and stderr for a command's streamed output, written without
//! blocking the runtime's thread where the kernel allows it.
//!
//! Why: `run` drives its client (and, embedded, the whole server) on one
//! thread, so a write that blocks because the reader of our stdout stopped
//! reading (`| less`, a stalled consumer) would stall every timer, signal
//! and limit of that runtime too. On a pipe (and a socket), each write is a
//! `pwritev2` with `RWF_NOWAIT`, which takes what fits and answers `EAGAIN`
//! instead of sleeping; the rest waits for room through epoll. Where the
//! kernel refuses `RWF_NOWAIT` (a terminal, a regular file, kernels before
//! 6.6 for pipes) or the descriptor cannot be polled, writes block as usual:
//! a file does not stall, and a terminal stalls only on its user's say
//! (Ctrl-S). The descriptor's flags are never changed: a shared pipe or
//! terminal made non-blocking would surprise every other process writing
//! to it.

use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use tokio::io::unix::AsyncFd;

/// One local output descriptor (a duplicate of it: closing it leaves the
/// caller's open).
pub struct LocalOut {
    fd: std::fs::File,
    /// Readiness for writes, while `RWF_NOWAIT` writes work on it.
    room: Option<AsyncFd<OwnedFd>>,
}

impl LocalOut {
    /// Writes to a duplicate of `fd`. Errors: it cannot be duplicated.
    pub fn new(fd: BorrowedFd<'_>) -> io::Result<LocalOut> {
        let file = std::fs::File::from(fd.try_clone_to_owned()?);
        // Polled through a second duplicate, owned by the registration.
        let room = file.as_fd().try_clone_to_owned().ok().and_then(|d| {
            // SAFETY: the AsyncFd owns this duplicate and deregisters it
            // before closing it (on drop); nothing else holds it.
            unsafe { AsyncFd::register_with_interest(d, tokio::io::Interest::WRITABLE) }.ok()
        });
        Ok(LocalOut { fd: file, room })
    }

    /// The descriptor written to.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Writes all of `data`. Errors: the descriptor's (`EPIPE` when the
    /// reader is gone).
    pub async fn write_all(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let Some(room) = &self.room else {
                return self.fd.write_all(data);
            };
            match write_nowait(self.fd.as_raw_fd(), data) {
                Ok(n) => data = &data[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let mut ready = room.writable().await?;
                    ready.clear_ready();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL)) => {
                    // Not for this descriptor (or this kernel): block as usual.
                    self.room = None;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// One `pwritev2(fd, data, -1, RWF_NOWAIT)`: what fits now, or `EAGAIN`.
fn write_nowait(fd: i32, data: &[u8]) -> io::Result<usize> {
    let iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: one iovec describing `data`, alive for the call; offset -1
    // writes at the current position (the only one a pipe has).
    let n = unsafe { libc::pwritev2(fd, &iov, 1, -1, libc::RWF_NOWAIT) };
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

    #[tokio::test(flavor = "current_thread")]
    async fn a_full_pipe_leaves_the_thread_free_and_every_byte_arrives() {
        let (mut r, w) = pipe();
        let mut out = LocalOut::new(w.as_fd()).unwrap();
        drop(w);
        assert!(out.room.is_some(), "a pipe is written without blocking");
        // The reader starts when told to, or on its own after 10 s (so a
        // write that blocks this thread ends the test instead of hanging it).
        let (go, told) = std::sync::mpsc::channel::<()>();
        let reader = std::thread::spawn(move || {
            let by_timer = told.recv_timeout(Duration::from_secs(10)).is_ok();
            let mut got = Vec::new();
            r.read_to_end(&mut got).unwrap();
            (by_timer, got)
        });
        // Four times what the pipe holds (64 KiB by default).
        let data: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
        let writing = async {
            out.write_all(&data).await.unwrap();
            drop(out);
        };
        // On this one thread, the timer fires only if the writer waiting for
        // room leaves the thread free.
        let timer = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = go.send(());
        };
        tokio::join!(writing, timer);
        let (by_timer, got) = reader.join().unwrap();
        assert!(by_timer, "the timer fired while the pipe was full");
        assert_eq!(got, data);
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
