//! Terminal output read in whole lines where the terminal layer splits them.

use super::pump::read_opt;
use super::read_buf::ReadBuf;
use std::os::fd::OwnedFd;
use std::time::Duration;
use tokio::io::unix::AsyncFd;

/// How long a terminal read that stopped mid-line waits for the rest: 2 ms.
pub const PTY_LINE_WAIT: Duration = Duration::from_millis(2);

/// After a terminal read of `n` bytes that ends mid-line, reads on for at most
/// [`PTY_LINE_WAIT`] until a line end, a full buffer, or silence; returns the
/// bytes now in `buf`. Why: the terminal layer hands a single `write` of
/// `err\n` to the reading side in pieces (`err`, then the `\r\n` it made of
/// the newline), and a reader that wakes between them would split one line
/// into two chunks. A prompt (no line end) is delayed by the wait, once.
pub(super) async fn complete_pty_line(
    fd: Option<&AsyncFd<OwnedFd>>,
    buf: &mut ReadBuf,
    mut n: usize,
) -> usize {
    let deadline = tokio::time::Instant::now() + PTY_LINE_WAIT;
    while n > 0 && n < buf.size() && buf.filled(n).last() != Some(&b'\n') {
        match tokio::time::timeout_at(deadline, read_opt(fd, buf, n)).await {
            Ok(Ok(more)) if more > 0 => n += more,
            // End of output, an error (seen again by the next read), or silence.
            _ => break,
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> (AsyncFd<OwnedFd>, std::fs::File) {
        let (r, w) = nix::unistd::pipe().unwrap();
        (
            super::super::nonblocking(r).unwrap(),
            std::fs::File::from(w),
        )
    }

    #[tokio::test]
    async fn a_read_that_stopped_mid_line_takes_the_rest_of_the_line() {
        use std::io::Write;
        let (r, mut w) = pipe();
        // The first read saw only "err" (as when woken between two pieces).
        w.write_all(b"err").unwrap();
        let mut buf = ReadBuf::new(0, 64);
        let n = buf.read_from(r.get_ref(), 0).unwrap();
        assert_eq!(n, 3);
        w.write_all(b"\r\nnext").unwrap();
        let n = complete_pty_line(Some(&r), &mut buf, n).await;
        assert_eq!(buf.filled(n), b"err\r\nnext", "read on to what was there");
        // Nothing more comes: the wait ends on silence, keeping what was read.
        drop(w);
        let mut buf = ReadBuf::new(0, 64);
        let (r, mut w) = pipe();
        w.write_all(b"prompt> ").unwrap();
        let n = buf.read_from(r.get_ref(), 0).unwrap();
        let n = complete_pty_line(Some(&r), &mut buf, n).await;
        assert_eq!(buf.filled(n), b"prompt> ");
    }

    #[tokio::test]
    async fn a_read_that_ended_a_line_is_not_held() {
        use std::io::Write;
        let (r, mut w) = pipe();
        w.write_all(b"ok\r\n").unwrap();
        let mut buf = ReadBuf::new(0, 64);
        assert_eq!(buf.read_from(r.get_ref(), 0).unwrap(), 4);
        // More output is already waiting; a complete line does not take it.
        w.write_all(b"more").unwrap();
        assert_eq!(complete_pty_line(Some(&r), &mut buf, 4).await, 4);
        assert_eq!(buf.filled(64), b"ok\r\n");
    }
}
