//! Output sinks: a process's pipe output moved with `splice(2)` straight into
//! a pipe of an embedder in this process (the `run` command's stdout), never
//! copied through this process's memory.
//!
//! Only an embedder in the same process can offer one: descriptors do not
//! travel over JSON-RPC. A stream with a sink sends no `process/output` and
//! keeps nothing for `process/read`; its process's seqs, `exited`, `closed`
//! and limits are as without one (the output cap and the idle timeout count
//! the bytes moved).
//!
//! Small output is copied instead ([`COPY_BELOW`]): each splice takes a
//! buffer slot of the sink of its own, where a write joins the last one, so
//! a command printing a line at a time would fill the sink's 256 slots with
//! a few KiB and stop its reader's other stream long before a pipe written
//! directly would. Spliced pages are shared, as between two programs on one
//! pipe: a command that splices a file into its output and then changes the
//! file may show the change to a reader that comes late.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Mutex;
use tokio::io::unix::AsyncFd;

/// Bytes moved by one `splice(2)` at most: 1 MiB, a full pipe of the size
/// the pump grows a source with a sink to once it fills.
pub const SINK_MOVE_BYTES: usize = 1024 * 1024;
/// Output waiting in the source below this (16 KiB) is copied with `read`
/// and `write`, so that it joins the sink's last page. At or above it, the
/// source's buffers average at least 1 KiB each in a pipe of the default
/// 16 slots, and a stream in bulk (moves of 50 KiB on average for `head -c`)
/// is spliced.
pub const COPY_BELOW: usize = 16 * 1024;

/// A sink a stream took: the embedder's pipe, and output read from the
/// source that the pipe has not taken yet.
pub(super) struct Sink {
    fd: AsyncFd<OwnedFd>,
    /// Copied output waiting for room (less than [`COPY_BELOW`] bytes).
    held: Vec<u8>,
    /// Whether the source was grown to [`SINK_MOVE_BYTES`].
    pub(super) widened: bool,
    /// Whether a move is waiting for room in it ([`move_or_wait`]): the
    /// reader holds output back, which is not the command's silence.
    pub(super) waiting: bool,
}

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
    pub(super) fn take(&self, process_id: &str) -> [Option<Sink>; 2] {
        let pair = self
            .offered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(process_id);
        let [a, b] = pair.unwrap_or_default();
        let sink = |f: OwnedFd| {
            super::nonblocking(f).ok().map(|fd| Sink {
                fd,
                held: Vec::new(),
                widened: false,
                waiting: false,
            })
        };
        [a.and_then(sink), b.and_then(sink)]
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
    /// The sink failed (a pipe fails only when its reader left). Nothing
    /// more was taken from the source, which is read as usual from here;
    /// copied output the sink had not taken is dropped with it, as no one
    /// can read it any more.
    Refused(std::io::Error),
}

impl Sink {
    /// Whether copied output waits for room in it.
    pub(super) fn holds(&self) -> bool {
        !self.held.is_empty()
    }
}

/// Moves up to `max` bytes from `src` into `sink` once `src` has something
/// (its end included), after what `sink` holds. The end is told only once
/// everything held went out. With `max` 0 (the output cap reached), only
/// writes out what it holds: `Bytes(0)` once that is done.
pub(super) async fn move_some(src: &AsyncFd<OwnedFd>, sink: &mut Sink, max: usize) -> Moved {
    let fd = sink.fd.get_ref();
    loop {
        if !sink.held.is_empty() {
            match nix::unistd::write(fd, &sink.held) {
                Ok(n) => {
                    sink.held.drain(..n);
                    continue;
                }
                Err(nix::errno::Errno::EAGAIN) => return Moved::SinkFull,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Moved::Refused(e.into()),
            }
        }
        if max == 0 {
            return Moved::Bytes(0);
        }
        let mut guard = match src.readable().await {
            Ok(g) => g,
            Err(e) => return Moved::Refused(e),
        };
        let unread = super::pump::unread_bytes(src.as_raw_fd()) as usize;
        if unread == 0 {
            // Nothing to move yet. Splicing now would move whatever the
            // command writes next on its own, a buffer slot of the sink for
            // each small write: wait for it instead, and look again.
            let state = poll_now(src.get_ref(), libc::POLLIN);
            if state & libc::POLLIN != 0 {
                continue;
            }
            if state & (libc::POLLHUP | libc::POLLERR) != 0 {
                return Moved::End;
            }
            // Cleared only if no new output was seen since the guard was
            // taken.
            guard.clear_ready();
            continue;
        }
        if unread < COPY_BELOW {
            match exec_server_sysio::read_at::append_once(
                src.get_ref(),
                &mut sink.held,
                unread.min(max),
            ) {
                // Written out at the loop's top next time: a move that
                // found the sink full says so then, with these counted.
                Ok(n) if n > 0 => {
                    match nix::unistd::write(fd, &sink.held) {
                        Ok(w) => drop(sink.held.drain(..w)),
                        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
                        Err(e) => return Moved::Refused(e.into()),
                    }
                    return Moved::Bytes(n);
                }
                Ok(_) => return Moved::End,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    guard.clear_ready();
                    continue;
                }
                // As the read path: a source that fails has ended.
                Err(_) => return Moved::End,
            }
        }
        match splice(src.get_ref(), fd, max) {
            Ok(0) => return Moved::End,
            Ok(n) => return Moved::Bytes(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Either side may have said "not now", and either may have
                // changed since: ask both as they are now. (Reading the
                // source's unread bytes instead took output that arrived
                // after the splice for a full sink, and waited on a sink
                // with room for ever.)
                // The source first: an empty one is waited on whatever
                // the sink's state (a full sink with nothing to give it
                // is no reason to hold the other stream and the exit up).
                let input = poll_now(src.get_ref(), libc::POLLIN) != 0;
                if !input {
                    // Cleared only if no new output was seen since the
                    // guard was taken.
                    guard.clear_ready();
                } else if !has_room(fd) {
                    return Moved::SinkFull;
                }
            }
            Err(e) => return Moved::Refused(e),
        }
    }
}

/// [`move_some`], waiting for room when the sink is full, so that a caller
/// that selects over this and other work (the other stream, the exit, the
/// limits) goes on meanwhile; never `SinkFull`. Dropping it loses nothing:
/// what was read out of the source is in the sink's `held`.
pub(super) async fn move_or_wait(src: &AsyncFd<OwnedFd>, sink: &mut Sink, max: usize) -> Moved {
    loop {
        sink.waiting = false;
        match move_some(src, sink, max).await {
            Moved::SinkFull => {
                sink.waiting = true;
                writable(sink).await;
            }
            m => return m,
        }
    }
}

/// Resolves once `sink` can take more (at once if it has room now).
pub(super) async fn writable(sink: &Sink) {
    loop {
        let Ok(mut guard) = sink.fd.writable().await else {
            // The reactor is gone: the next splice says what is wrong.
            return;
        };
        if has_room(sink.fd.get_ref()) {
            return;
        }
        // A stale readiness: cleared only if no new one arrived since.
        guard.clear_ready();
    }
}

/// `revents` of one `poll(2)` of `fd` for `events`, without waiting. When
/// the poll itself fails, every bit asked for: the caller then tries the
/// read, write or splice, which tells.
fn poll_now(fd: &OwnedFd, events: libc::c_short) -> libc::c_short {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: `pfd` is one valid pollfd for the call.
    if unsafe { libc::poll(&mut pfd, 1, 0) } < 0 {
        return events;
    }
    pfd.revents
}

/// Whether a pipe has room now: exactly when a splice into it would not
/// say `EAGAIN` (both test for a free buffer slot). A pipe without a reader
/// counts as room, so that the next write says `EPIPE`.
fn has_room(sink: &OwnedFd) -> bool {
    poll_now(sink, libc::POLLOUT) & (libc::POLLOUT | libc::POLLERR) != 0
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

    /// A source pipe (read end registered) and a sink offered and taken,
    /// with the sink's read end.
    fn source_and_sink() -> (AsyncFd<OwnedFd>, std::fs::File, Sink, std::fs::File) {
        let (src_r, src_w) = pipe();
        let (sink_r, sink_w) = pipe();
        let sinks = OutputSinks::new();
        sinks.offer("p", Some(sink_w.into()), None).expect("a pipe");
        let [sink, none] = sinks.take("p");
        assert!(none.is_none());
        assert!(sinks.take("p").iter().all(Option::is_none), "taken once");
        let src = super::super::nonblocking(src_r.into()).expect("register");
        (src, src_w, sink.expect("offered"), sink_r)
    }

    #[tokio::test]
    async fn bytes_move_from_pipe_to_pipe_then_the_end_is_seen() {
        let (src, mut src_w, mut sink, mut sink_r) = source_and_sink();
        src_w.write_all(b"hello").expect("write");
        drop(src_w);
        assert!(matches!(
            move_some(&src, &mut sink, 1024).await,
            Moved::Bytes(5)
        ));
        assert!(matches!(move_some(&src, &mut sink, 1024).await, Moved::End));
        drop(sink);
        let mut got = Vec::new();
        sink_r.read_to_end(&mut got).expect("read");
        assert_eq!(got, b"hello");
    }

    #[tokio::test]
    async fn a_full_source_is_spliced_whole() {
        let (src, mut src_w, mut sink, mut sink_r) = source_and_sink();
        let block: Vec<u8> = (0..COPY_BELOW).map(|i| (i % 251) as u8).collect();
        src_w.write_all(&block).expect("write");
        drop(src_w);
        let m = move_some(&src, &mut sink, SINK_MOVE_BYTES).await;
        assert!(matches!(m, Moved::Bytes(n) if n == COPY_BELOW), "{m:?}");
        assert!(sink.held.is_empty(), "spliced, not copied");
        let mut got = vec![0u8; COPY_BELOW];
        sink_r.read_exact(&mut got).expect("read");
        assert!(got == block);
        assert!(matches!(
            move_some(&src, &mut sink, SINK_MOVE_BYTES).await,
            Moved::End
        ));
    }

    /// A line at a time, each moved as it comes: spliced, each would take
    /// a slot of the sink's 16 and fill it after 16 lines; copied, they
    /// share its pages.
    #[tokio::test]
    async fn lines_moved_one_at_a_time_share_the_sinks_pages() {
        let (src, mut src_w, mut sink, mut sink_r) = source_and_sink();
        let mut want = Vec::new();
        for i in 0..1000 {
            let line = format!("{i}\n");
            src_w.write_all(line.as_bytes()).expect("write");
            want.extend_from_slice(line.as_bytes());
            let m = move_some(&src, &mut sink, SINK_MOVE_BYTES).await;
            assert!(
                matches!(m, Moved::Bytes(n) if n == line.len()),
                "line {i}: {m:?}"
            );
        }
        drop((src_w, sink));
        let mut got = Vec::new();
        sink_r.read_to_end(&mut got).expect("read");
        assert!(got == want);
    }

    #[tokio::test]
    async fn an_empty_source_waits_for_output_and_never_reads_as_a_full_sink() {
        let (src, mut src_w, mut sink, mut sink_r) = source_and_sink();
        let quiet = std::time::Duration::from_millis(50);
        let early = tokio::time::timeout(quiet, move_some(&src, &mut sink, 1024)).await;
        assert!(early.is_err(), "moved {early:?} from an empty source");
        src_w.write_all(b"x").expect("write");
        let later = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            move_some(&src, &mut sink, 1024),
        )
        .await;
        assert!(matches!(later, Ok(Moved::Bytes(1))), "{later:?}");
        let mut got = [0u8; 1];
        sink_r.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"x");
    }

    /// The sink filled by moves that emptied the source: the next move
    /// waits for output, never "sink full".
    #[tokio::test]
    async fn a_full_sink_with_nothing_to_give_it_waits_for_output() {
        let (src, mut src_w, mut sink, _sink_r) = source_and_sink();
        let block = vec![3u8; COPY_BELOW];
        // A default pipe is 16 slots, 4 per spliced block of 16 KiB.
        for _ in 0..4 {
            src_w.write_all(&block).expect("write");
            let m = move_some(&src, &mut sink, SINK_MOVE_BYTES).await;
            assert!(matches!(m, Moved::Bytes(n) if n == COPY_BELOW), "{m:?}");
        }
        let quiet = std::time::Duration::from_millis(50);
        let next = tokio::time::timeout(quiet, move_some(&src, &mut sink, SINK_MOVE_BYTES)).await;
        assert!(next.is_err(), "{next:?} from an empty source");
    }

    /// Copied output the sink could not take yet goes out once the cap is
    /// reached too (`max` 0), and nothing more is read.
    #[tokio::test]
    async fn held_output_is_written_out_with_no_room_left_under_the_cap() {
        let (src, mut src_w, mut sink, mut sink_r) = source_and_sink();
        let block = vec![5u8; COPY_BELOW];
        for _ in 0..4 {
            src_w.write_all(&block).expect("write");
            move_some(&src, &mut sink, SINK_MOVE_BYTES).await;
        }
        src_w.write_all(b"last").expect("write");
        let m = move_some(&src, &mut sink, 4).await;
        assert!(matches!(m, Moved::Bytes(4)), "{m:?}");
        assert!(sink.holds(), "the full sink took the copy");
        src_w.write_all(b"past the cap").expect("write");
        let mut drained = vec![0u8; 4 * COPY_BELOW];
        sink_r.read_exact(&mut drained).expect("read");
        let m = move_some(&src, &mut sink, 0).await;
        assert!(matches!(m, Moved::Bytes(0)), "{m:?}");
        assert!(!sink.holds());
        let mut last = [0u8; 4];
        sink_r.read_exact(&mut last).expect("read");
        assert_eq!(&last, b"last");
        let left = super::super::pump::unread_bytes(src.as_raw_fd());
        assert_eq!(left as usize, b"past the cap".len(), "read past the cap");
    }

    #[tokio::test]
    async fn a_full_sink_is_told_apart_from_an_empty_source() {
        let (src, mut src_w, mut sink, _sink_r) = source_and_sink();
        // Fill the sink (64 KiB by default) through the source.
        let block = vec![7u8; 16 * 1024];
        let mut moved = 0;
        loop {
            src_w.write_all(&block).expect("write");
            match move_some(&src, &mut sink, SINK_MOVE_BYTES).await {
                Moved::Bytes(n) => moved += n,
                Moved::SinkFull => break,
                other => panic!("unexpected {other:?}"),
            }
            assert!(moved < 64 << 20, "the sink never filled");
        }
        assert!(moved >= 4096);
        let quiet = std::time::Duration::from_millis(50);
        let wait = tokio::time::timeout(quiet, writable(&sink)).await;
        assert!(wait.is_err(), "a full sink said it had room");
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
    async fn a_sink_whose_reader_left_is_refused_and_spliced_output_stays() {
        let (src, mut src_w, mut sink, sink_r) = source_and_sink();
        drop(sink_r);
        src_w.write_all(&vec![1u8; COPY_BELOW]).expect("write");
        let m = move_some(&src, &mut sink, SINK_MOVE_BYTES).await;
        assert!(matches!(m, Moved::Refused(_)), "{m:?}");
        let unread = super::super::pump::unread_bytes(src.as_raw_fd());
        assert_eq!(unread as usize, COPY_BELOW);
        // A copied line is refused the same way.
        let (src, mut src_w, mut sink, sink_r) = source_and_sink();
        drop(sink_r);
        src_w.write_all(b"line\n").expect("write");
        let m = move_some(&src, &mut sink, SINK_MOVE_BYTES).await;
        assert!(matches!(m, Moved::Refused(_)), "{m:?}");
    }
}
