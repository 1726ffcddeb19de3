//! Output sinks: a process's pipe output moved with `splice(2)` straight into
//! a pipe of an embedder in this process (the `run` command's stdout), never
//! copied through this process's memory.
//!
//! Only an embedder in the same process can offer one: descriptors do not
//! travel over JSON-RPC. A stream with a sink sends no `process/output` and
//! keeps nothing for `process/read`; its process's seqs, `exited`, `closed`
//! and limits are as without one (the output cap and the idle timeout count
//! the bytes moved).

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Mutex;
use tokio::io::unix::AsyncFd;

/// Bytes moved by one `splice(2)` at most: 1 MiB, a full pipe of the size
/// the pump gives a source with a sink.
pub const SINK_MOVE_BYTES: usize = 1024 * 1024;

/// Sinks offered for processes not started yet, by process id (the
/// `processId` of their `process/start`). Shared between an embedder and its
/// server ([`crate::ServerConfig::output_sinks`]).
#[derive(Default)]
pub struct OutputSinks {
    offered: Mutex<HashMap<String, [Option<OwnedFd>; 2]>>,
}

impl OutputSinks {
    /// An empty set.
    pub fn new() -> OutputSinks {
        OutputSinks::default()
    }

    /// Offers `stdout` and `stderr` (each the write end of a pipe, or
    /// `None` to keep that stream's `process/output`) to the next pipe-mode
    /// start whose `processId` is `process_id`, in any session. A PTY start
    /// drops them unused. Each descriptor is made non-blocking: give one
    /// whose open file description is this offer's alone (opened again
    /// through `/proc/self/fd`, not `dup`ed). A descriptor that is not a
    /// pipe is dropped here (`Err(InvalidInput)`), and its stream keeps its
    /// notifications.
    pub fn offer(
        &self,
        process_id: &str,
        stdout: Option<OwnedFd>,
        stderr: Option<OwnedFd>,
    ) -> std::io::Result<()> {
        let mut pair = [stdout, stderr];
        let mut refused = None;
        for fd in &mut pair {
            if let Some(f) = fd.take() {
                match is_pipe(&f) {
                    Ok(()) => *fd = Some(f),
                    Err(e) => refused = Some(e),
                }
            }
        }
        self.offered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(process_id.to_string(), pair);
        refused.map_or(Ok(()), Err)
    }

    /// Takes what was offered for `process_id`, made non-blocking and
    /// registered with this runtime's reactor. A sink that cannot be is
    /// dropped.
    pub(crate) fn take(&self, process_id: &str) -> [Option<AsyncFd<OwnedFd>>; 2] {
        let pair = self
            .offered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(process_id);
        let [a, b] = pair.unwrap_or_default();
        [
            a.and_then(|f| super::nonblocking(f).ok()),
            b.and_then(|f| super::nonblocking(f).ok()),
        ]
    }
}

/// `Err(InvalidInput)` unless `fd` is a pipe.
fn is_pipe(fd: &OwnedFd) -> std::io::Result<()> {
    use nix::sys::stat::{fstat, SFlag};
    let st = fstat(fd.as_fd()).map_err(std::io::Error::from)?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFIFO {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "an output sink must be a pipe",
        ));
    }
    Ok(())
}

/// What one [`move_some`] did.
#[derive(Debug)]
pub(super) enum Moved {
    /// This many bytes went from the source to the sink.
    Bytes(usize),
    /// The source reached its end of file.
    End,
    /// The source has output, and the sink is full.
    SinkFull,
    /// The sink failed or cannot be spliced into (its reader left, say).
    /// Nothing was taken from the source: it is read as usual from here.
    Refused(std::io::Error),
}

/// Moves up to `max` bytes from `src` into `sink` once `src` has something
/// (its end included).
pub(super) async fn move_some(
    src: &AsyncFd<OwnedFd>,
    sink: &AsyncFd<OwnedFd>,
    max: usize,
) -> Moved {
    loop {
        let mut guard = match src.readable().await {
            Ok(g) => g,
            Err(e) => return Moved::Refused(e),
        };
        match splice(src.get_ref(), sink.get_ref(), max) {
            Ok(0) => return Moved::End,
            Ok(n) => return Moved::Bytes(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Either side may have said "not now", and either may have
                // changed since: ask both as they are now. (Reading the
                // source's unread bytes instead took output that arrived
                // after the splice for a full sink, and waited on a sink
                // with room for ever.)
                let (input, room) = poll_now(src.get_ref(), sink.get_ref());
                if !room {
                    return Moved::SinkFull;
                }
                if !input {
                    // Cleared only if no new output was seen since the
                    // guard was taken.
                    guard.clear_ready();
                }
            }
            Err(e) => return Moved::Refused(e),
        }
    }
}

/// Resolves once `sink` can take more (at once if it has room now).
pub(super) async fn writable(sink: &AsyncFd<OwnedFd>) {
    loop {
        let Ok(mut guard) = sink.writable().await else {
            // The reactor is gone: the next splice says what is wrong.
            return;
        };
        if poll_now(sink.get_ref(), sink.get_ref()).1 {
            return;
        }
        // A stale readiness: cleared only if no new one arrived since.
        guard.clear_ready();
    }
}

/// Whether `src` has something to read (or its end) and `sink` has room,
/// now (`poll(2)` without waiting). A pipe has room exactly when a splice
/// into it would not say `EAGAIN`: both test for a free buffer slot.
fn poll_now(src: &OwnedFd, sink: &OwnedFd) -> (bool, bool) {
    let mut fds = [
        libc::pollfd {
            fd: src.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: sink.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        },
    ];
    // SAFETY: `fds` is a valid array of two pollfds for the call.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, 0) };
    if r < 0 {
        // Cannot tell: say "both", and the caller tries again.
        return (true, true);
    }
    let input = fds[0].revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
    let room = fds[1].revents & (libc::POLLOUT | libc::POLLERR) != 0;
    (input, room)
}

/// One non-blocking `splice(2)` of up to `max` bytes between two pipes.
fn splice(src: &OwnedFd, sink: &OwnedFd, max: usize) -> std::io::Result<usize> {
    // SAFETY: both descriptors are open for the call; null offsets are
    // what pipes take.
    let n = unsafe {
        libc::splice(
            src.as_raw_fd(),
            std::ptr::null_mut(),
            sink.as_raw_fd(),
            std::ptr::null_mut(),
            max,
            libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MOVE,
        )
    };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn pipe() -> (std::fs::File, std::fs::File) {
        let (r, w) = nix::unistd::pipe().expect("pipe");
        (std::fs::File::from(r), std::fs::File::from(w))
    }

    #[tokio::test]
    async fn bytes_move_from_pipe_to_pipe_then_the_end_is_seen() {
        let (src_r, mut src_w) = pipe();
        let (mut sink_r, sink_w) = pipe();
        let sinks = OutputSinks::new();
        sinks.offer("p", Some(sink_w.into()), None).expect("a pipe");
        let [sink, none] = sinks.take("p");
        assert!(none.is_none());
        let sink = sink.expect("offered");
        let src = super::super::nonblocking(src_r.into()).expect("register");
        src_w.write_all(b"hello").expect("write");
        drop(src_w);
        assert!(matches!(
            move_some(&src, &sink, 1024).await,
            Moved::Bytes(5)
        ));
        assert!(matches!(move_some(&src, &sink, 1024).await, Moved::End));
        drop(sink);
        let mut got = Vec::new();
        sink_r.read_to_end(&mut got).expect("read");
        assert_eq!(got, b"hello");
        assert!(sinks.take("p").iter().all(Option::is_none), "taken once");
    }

    #[tokio::test]
    async fn an_empty_source_waits_for_output_and_never_reads_as_a_full_sink() {
        let (src_r, mut src_w) = pipe();
        let (mut sink_r, sink_w) = pipe();
        let sinks = OutputSinks::new();
        sinks.offer("p", Some(sink_w.into()), None).expect("a pipe");
        let sink = sinks.take("p")[0].take().expect("offered");
        let src = super::super::nonblocking(src_r.into()).expect("register");
        let quiet = std::time::Duration::from_millis(50);
        let early = tokio::time::timeout(quiet, move_some(&src, &sink, 1024)).await;
        assert!(early.is_err(), "moved {early:?} from an empty source");
        src_w.write_all(b"x").expect("write");
        let later = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            move_some(&src, &sink, 1024),
        )
        .await;
        assert!(matches!(later, Ok(Moved::Bytes(1))), "{later:?}");
        let mut got = [0u8; 1];
        sink_r.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"x");
    }

    #[tokio::test]
    async fn a_full_sink_is_told_apart_from_an_empty_source() {
        let (src_r, mut src_w) = pipe();
        let (_sink_r, sink_w) = pipe();
        let sinks = OutputSinks::new();
        sinks.offer("p", Some(sink_w.into()), None).expect("a pipe");
        let sink = sinks.take("p")[0].take().expect("offered");
        let src = super::super::nonblocking(src_r.into()).expect("register");
        // Fill the sink (64 KiB by default) through the source.
        let block = vec![7u8; 16 * 1024];
        let mut moved = 0;
        loop {
            src_w.write_all(&block).expect("write");
            match move_some(&src, &sink, SINK_MOVE_BYTES).await {
                Moved::Bytes(n) => moved += n,
                Moved::SinkFull => break,
                other => panic!("unexpected {other:?}"),
            }
            assert!(moved < 64 << 20, "the sink never filled");
        }
        assert!(moved >= 4096);
    }

    #[test]
    fn a_descriptor_that_is_not_a_pipe_is_refused() {
        let file = std::fs::File::open("/dev/null").expect("a character device");
        let sinks = OutputSinks::new();
        let e = sinks
            .offer("p", Some(file.into()), None)
            .expect_err("not a pipe");
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    }

    #[tokio::test]
    async fn a_sink_whose_reader_left_is_refused_and_the_output_stays() {
        let (src_r, mut src_w) = pipe();
        let (sink_r, sink_w) = pipe();
        drop(sink_r);
        let sinks = OutputSinks::new();
        sinks.offer("p", Some(sink_w.into()), None).expect("a pipe");
        let sink = sinks.take("p")[0].take().expect("offered");
        let src_fd: OwnedFd = src_r.into();
        let src = super::super::nonblocking(src_fd).expect("register");
        src_w.write_all(b"kept").expect("write");
        assert!(matches!(
            move_some(&src, &sink, 1024).await,
            Moved::Refused(_)
        ));
        assert_eq!(super::super::pump::unread_bytes(src.as_raw_fd()), 4);
    }
}
