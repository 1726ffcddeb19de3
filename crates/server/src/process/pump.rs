//! The pump: the task that reads a child's output into its log and pushes it
//! to the attached connection, records the exit and the close, and keeps the
//! record for [`EXITED_PROCESS_RETENTION`] after.

use super::notify::{closed_json, exited_json};
use super::pty_line::complete_pty_line;
use super::read_buf::{Filled, ReadBuf};
use super::*;
use exec_server_protocol::binary;

/// What the pump holds for the life of a process: the sandbox's host-side
/// resources (released when it exits) and the process span (closed when its
/// output is closed, so the span's duration is the process's lifetime).
pub(super) struct Held {
    pub(super) confinement: Option<crate::sandbox::Confinement>,
    pub(super) span: tracing::Span,
    /// Its `limits`, watched from the spawn.
    pub(super) limits: super::limits::Watch,
    /// Its place in the running counts, given back at exit.
    pub(super) live: Option<super::live::LiveSlot>,
    /// Where stdout and stderr are spliced instead of sent ([`super::sink`]).
    pub(super) sinks: [Option<sink::Sink>; 2],
}

/// Where a pump starts: at the spawn, or where the previous image of the
/// server parked it (an upgrade).
pub(super) enum From {
    Start,
    Resume {
        /// The exit code, once the exit was recorded.
        exit_code: Option<i32>,
    },
}

#[allow(clippy::too_many_arguments)] // each is one thing the pump owns
pub(super) async fn pump(
    proc: Arc<Process>,
    sources: Sources,
    mut exit: oneshot::Receiver<crate::reaper::Exit>,
    link: Arc<Link>,
    start_gate: oneshot::Receiver<()>,
    on_retire: RetireHook,
    from: From,
    held: Held,
) {
    let Held {
        mut confinement,
        span,
        limits: mut watch,
        mut live,
        sinks,
    } = held;
    let mut parking = proc.park.signal();
    tokio::select! {
        _ = start_gate => {}
        _ = handover::asked(&mut parking) => {
            let parked = handover::PumpParked {
                exit_code: None,
                exit: Some(exit),
                held: Some(Held { confinement, span, limits: watch, live, sinks }),
            };
            proc.park.pump_parked(parked, Some(sources));
            return;
        }
    }
    // Room for a frame's header in front of large reads; an id so long that
    // its head does not fit costs one copy per frame instead.
    let headroom = notify::output_frame_headroom(&proc.id).min(MAX_FRAME_HEADROOM);
    let mut buf_a = ReadBuf::new(headroom, READ_CHUNK_BYTES);
    let mut buf_b = ReadBuf::new(headroom, READ_CHUNK_BYTES);
    let (mut a, mut b, stream_a, stream_b): (
        Option<&AsyncFd<OwnedFd>>,
        Option<&AsyncFd<OwnedFd>>,
        _,
        _,
    ) = match &sources {
        Sources::Pipes(o, e) => (
            o.as_ref(),
            e.as_ref(),
            OutputStream::Stdout,
            OutputStream::Stderr,
        ),
        Sources::Pty(m) => (Some(&**m), None, OutputStream::Pty, OutputStream::Pty),
    };
    let [mut sink_a, mut sink_b] = sinks;
    let mut exit_code: Option<i32> = match from {
        From::Start => None,
        From::Resume { exit_code } => exit_code,
    };
    let mut park = false;
    loop {
        if park {
            // Between two steps: every byte read is in the log, and an exit
            // the reaper delivered is either recorded or still in `exit`.
            let parked = handover::PumpParked {
                exit_code,
                exit: exit_code.is_none().then_some(exit),
                // Sinks belong to this process's embedder: not carried
                // into another image. (An embedded server is never asked
                // to park: only `serve` hands over.)
                held: Some(Held {
                    confinement,
                    span,
                    limits: watch,
                    live,
                    sinks: [None, None],
                }),
            };
            let (a_open, b_open) = (a.is_some(), b.is_some());
            proc.park
                .pump_parked(parked, Some(handover::keep_open(sources, a_open, b_open)));
            return;
        }
        if a.is_none() && b.is_none() && exit_code.is_some() {
            let seq = lock(&proc.state).log.push_closed();
            proc.bump();
            let mut limits = Limits::new(&mut watch, true, None, None);
            send_event(&proc, &link, seq, closed_json(&proc.id, seq), &mut limits).await;
            // The connection's writer puts `exited` and `closed` on the wire
            // before the bookkeeping below (a cgroup read), not after it.
            tokio::task::yield_now().await;
            // The network proxy stops with the process.
            let kept = proc.kept.lock().unwrap_or_else(|p| p.into_inner()).take();
            drop(kept);
            drop(span);
            // A daemon the process left behind (detached from its output)
            // still dies at the process's deadline.
            let left_behind = proc.settle_cgroup();
            if let (Some(deadline), Some(group)) = (watch.deadline(), left_behind) {
                tokio::spawn(async move {
                    tokio::time::sleep_until(deadline).await;
                    if group.is_populated() {
                        crate::metrics::limit_fired(LimitReason::WallTimeout);
                        group.kill();
                    }
                });
            }
            break;
        }
        if watch.output_room() == Some(0) {
            // Past the output cap the pump reads and drops (both streams:
            // a sink would wait for room that never comes), once a sink has
            // written out what it holds: counted, so within the cap.
            for sink in [&mut sink_a, &mut sink_b] {
                if sink.as_ref().is_some_and(|s| !s.holds()) {
                    *sink = None;
                }
            }
        }
        let paused = lock(&proc.state).log.window_full();
        let due = watch.next_due();
        let room = watch.output_room();
        let (move_a, move_b) = (
            a.is_some() && sink_a.is_some(),
            b.is_some() && sink_b.is_some(),
        );
        tokio::select! {
            m = move_opt(a, sink_a.as_mut(), room), if move_a => {
                let mut limits = Limits::new(&mut watch, exit_code.is_some(), a, b);
                if !moved(&proc, m, &mut a, &mut sink_a, &mut limits) {
                    sink_a = None;
                }
            }
            m = move_opt(b, sink_b.as_mut(), room), if move_b => {
                let mut limits = Limits::new(&mut watch, exit_code.is_some(), a, b);
                if !moved(&proc, m, &mut b, &mut sink_b, &mut limits) {
                    sink_b = None;
                }
            }
            r = read_opt(a, &mut buf_a, 0), if a.is_some() && !move_a && !paused => {
                match r {
                    Ok(n) if n > 0 => {
                        let n = if stream_a == OutputStream::Pty {
                            complete_pty_line(a, &mut buf_a, n).await
                        } else {
                            n
                        };
                        widen_if_full(a, &mut buf_a, n, &link);
                        let mut limits = Limits::new(&mut watch, exit_code.is_some(), a, b);
                        emit_within(&proc, &link, stream_a, buf_a.take(n), &mut limits).await;
                    }
                    _ => a = None,
                }
            }
            r = read_opt(b, &mut buf_b, 0), if b.is_some() && !move_b && !paused => {
                match r {
                    Ok(n) if n > 0 => {
                        widen_if_full(b, &mut buf_b, n, &link);
                        let mut limits = Limits::new(&mut watch, exit_code.is_some(), a, b);
                        emit_within(&proc, &link, stream_b, buf_b.take(n), &mut limits).await;
                    }
                    _ => b = None,
                }
            }
            code = &mut exit, if exit_code.is_none() => {
                // The child is gone: what it wrote is already in the pipe or PTY
                // buffer. Take it now so `exited` follows the child's last output.
                // (A stream with a sink has no notification to order.)
                for (fd, stream, sinked) in [(&mut a, stream_a, move_a), (&mut b, stream_b, move_b)] {
                    while let (Some(f), false) = (*fd, sinked) {
                        match raw_read(f.get_ref(), &mut buf_a, 0) {
                            Ok(0) => { *fd = None; }
                            Ok(n) => {
                                let mut limits = Limits::new(&mut watch, true, Some(f), None);
                                emit_within(&proc, &link, stream, buf_a.take(n), &mut limits).await;
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                            Err(_) => { *fd = None; }
                        }
                    }
                }
                // What a sink's source still holds is output on its way: if
                // it reaches the cap, `exited` must say the cap ended it (the
                // move that reaches it may come only after a reader reads).
                let pending: u64 = [(a, move_a), (b, move_b)]
                    .into_iter()
                    .filter_map(|(fd, sinked)| fd.filter(|_| sinked))
                    .map(|f| unread_bytes(std::os::fd::AsRawFd::as_raw_fd(f)).max(0) as u64)
                    .sum();
                watch.output_pending(pending, tokio::time::Instant::now());
                let (code, signal) = code.map_or((-1, None), |e| (e.code, e.signal));
                exit_code = Some(code);
                drop(live.take());
                span.record("exit_code", code);
                crate::metrics::process_exit(code);
                // The sandbox is gone with its last process: release what it held
                // on the host (placeholders).
                drop(confinement.take());
                let (seq, denied) = {
                    let mut st = lock(&proc.state);
                    st.stdin = None;
                    st.signal = signal;
                    st.sandbox_denied = proc.sandboxed
                        && exec_server_sandbox::is_likely_denied(code, &st.log.retained_output());
                    (st.log.push_exited(code), st.sandbox_denied)
                };
                proc.stdin_budget.close();
                proc.bump();
                let limit = watch.fired().or_else(|| {
                    // A cap the kernel held (the OOM killer, a refused fork)
                    // is read from its cgroup's counters.
                    let cap = proc.cap_exceeded()?;
                    lock(&proc.state).limit = Some(cap);
                    crate::metrics::limit_fired(cap);
                    tracing::info!(process_id = %proc.id, limit = cap.as_str(), "a cap was reached");
                    Some(cap)
                });
                if limit.is_some() {
                    // A limit ends the whole tree: what the process left
                    // behind (a daemon in its cgroup) goes with it now.
                    proc.terminate();
                }
                let mut limits = Limits::new(&mut watch, true, a, b);
                send_event(&proc, &link, seq, exited_json(&proc.id, seq, code, denied, limit, signal), &mut limits).await;
            }
            _ = tokio::time::sleep_until(due.unwrap_or_else(far_future)), if due.is_some() => {
                let mut limits = Limits::new(&mut watch, exit_code.is_some(), a, b);
                // A sink's reader holding output back is the client's
                // doing, as a paused read is.
                let waiting = [&sink_a, &sink_b].iter().any(|s| s.as_ref().is_some_and(|s| s.waiting));
                limits.due(&proc, paused || waiting);
            }
            _ = proc.resume.notified(), if paused => {}
            _ = handover::asked(&mut parking) => park = true,
        }
    }
    // Not held through the retention: each buffer reserved 64 KiB or more,
    // and a heap that grew by them at every start faulted in fresh pages.
    drop((sources, buf_a, buf_b, sink_a, sink_b));
    retain(proc, on_retire, EXITED_PROCESS_RETENTION).await;
}

/// Keeps a closed process's record readable for `time`, then retires it
/// (unless it left its session first, or an upgrade parks it).
pub(super) async fn retain(proc: Arc<Process>, on_retire: RetireHook, time: Duration) {
    let mut parking = proc.park.signal();
    tokio::select! {
        _ = tokio::time::sleep(time) => on_retire(&proc),
        _ = proc.discarded.notified() => {}
        _ = handover::asked(&mut parking) => {
            let parked = handover::PumpParked { exit_code: None, exit: None, held: None };
            proc.park.pump_parked(parked, None);
        }
    }
}

/// After a read of `n` bytes filled `buf`: grows it, and the pipe behind `fd`,
/// to [`BULK_READ_CHUNK_BYTES`], then, on a connection with binary frames, to
/// [`BINARY_READ_CHUNK_BYTES`]. A PTY or a refused pipe size keeps its kernel
/// buffer; the larger read buffer still gathers more per read.
fn widen_if_full(fd: Option<&AsyncFd<OwnedFd>>, buf: &mut ReadBuf, n: usize, link: &Link) {
    let size = match buf.size() {
        s if n < s => return,
        s if s < BULK_READ_CHUNK_BYTES => BULK_READ_CHUNK_BYTES,
        s if s < BINARY_READ_CHUNK_BYTES && link.outbound().is_some_and(|o| o.binary_frames()) => {
            BINARY_READ_CHUNK_BYTES
        }
        _ => return,
    };
    buf.grow(size);
    if let Some(f) = fd {
        // The pipe's size is a power of two pages at least as large.
        let pipe = size.next_power_of_two() as i32;
        let _ = nix::fcntl::fcntl(f.get_ref(), nix::fcntl::FcntlArg::F_SETPIPE_SZ(pipe));
    }
}

/// [`read_some`] from `fd` into `buf` after its first `at` bytes; never
/// ready without a descriptor.
pub(super) async fn read_opt(
    fd: Option<&AsyncFd<OwnedFd>>,
    buf: &mut ReadBuf,
    at: usize,
) -> std::io::Result<usize> {
    match fd {
        Some(f) => read_some(f, buf, at).await,
        None => std::future::pending().await,
    }
}

/// [`sink::move_some`] from `fd` into `sink`, at most `room` bytes (the
/// output cap's; `None`: no cap); never ready without both.
async fn move_opt(
    fd: Option<&AsyncFd<OwnedFd>>,
    sink: Option<&mut sink::Sink>,
    room: Option<u64>,
) -> sink::Moved {
    let max = room.map_or(sink::SINK_MOVE_BYTES, |r| {
        r.min(sink::SINK_MOVE_BYTES as u64) as usize
    });
    match (fd, sink) {
        (Some(f), Some(s)) if max > 0 || s.holds() => sink::move_or_wait(f, s, max).await,
        _ => std::future::pending().await,
    }
}

/// Accounts for what a move did to the source `fd`. False: the sink
/// refused, and the stream is read and sent as usual from here.
fn moved(
    proc: &Process,
    m: sink::Moved,
    fd: &mut Option<&AsyncFd<OwnedFd>>,
    sink: &mut Option<sink::Sink>,
    limits: &mut Limits<'_>,
) -> bool {
    match m {
        sink::Moved::Bytes(n) => {
            if let (Some(f), Some(s)) = (*fd, sink.as_mut()) {
                if n >= READ_CHUNK_BYTES && !s.widened {
                    // The source filled (a pipe holds 64 KiB at first): as
                    // large as a move from here, for fewer, larger moves
                    // (only then, as a pipe's size counts against its
                    // user's allowance).
                    s.widened = true;
                    let pipe = sink::SINK_MOVE_BYTES as i32;
                    let _ =
                        nix::fcntl::fcntl(f.get_ref(), nix::fcntl::FcntlArg::F_SETPIPE_SZ(pipe));
                }
            }
            limits.watch.output(n, tokio::time::Instant::now());
            crate::metrics::output_bytes(n);
            proc.output_bytes
                .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            if n < sink::SINK_MOVE_BYTES / 4 {
                // A writer that outpaces its reader makes small moves only
                // because the reader keeps coming back too soon: giving
                // the CPU up once lets the writer fill its pipe, so the
                // next move takes more (1 GiB of `head -c` into `wc`: 0.52
                // s without, 0.33 s with). A writer that is idle anyway
                // loses nothing.
                std::thread::yield_now();
            }
            true
        }
        sink::Moved::End => {
            *fd = None;
            true
        }
        // `move_or_wait` waits for room itself.
        sink::Moved::SinkFull => true,
        sink::Moved::Refused(e) => {
            tracing::debug!(process_id = %proc.id, error = %e, "an output sink refused: output is sent instead");
            false
        }
    }
}

/// Most room a read buffer leaves for a frame's header: 1 KiB.
const MAX_FRAME_HEADROOM: usize = 1024;

/// A small terminal read holding several lines is sent as one chunk per line, up
/// to this many bytes: on a terminal, lines written by different programs in
/// quick succession (a prompt, then a command's output) reach a client as they
/// were written rather than merged by scheduling luck. Larger reads are one chunk.
pub const PTY_LINE_SPLIT_MAX_BYTES: usize = 4096;

/// A far-off instant for a timer branch that is disabled anyway.
fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86_400 * 365)
}

/// [`emit`] within the output cap: a chunk that crosses it is cut there
/// (one copy of the part kept), and output past it is read and dropped, so
/// the child never blocks on a full pipe before the limit ends it.
async fn emit_within(
    proc: &Process,
    link: &Link,
    stream: OutputStream,
    data: Filled,
    limits: &mut Limits<'_>,
) {
    let n = data.payload().len();
    let allowed = limits.watch.output(n, tokio::time::Instant::now());
    if allowed == n {
        emit(proc, link, limits, stream, data).await;
    } else if allowed > 0 {
        let kept = Filled::copy_of(&data.payload()[..allowed], 0);
        emit(proc, link, limits, stream, kept).await;
    }
}

/// A process's limits as the pump enforces them at one step.
pub(super) struct Limits<'w> {
    watch: &'w mut super::limits::Watch,
    /// Whether the process has exited (its output is held open).
    exited: bool,
    /// Its output descriptors still open: unread output in them means the
    /// command is not silent, only held back.
    output: [Option<std::os::fd::RawFd>; 2],
}

impl<'w> Limits<'w> {
    /// The limits of `watch`, for a process that has `exited` or not, whose
    /// output sources `a` and `b` are still open.
    fn new(
        watch: &'w mut super::limits::Watch,
        exited: bool,
        a: Option<&AsyncFd<OwnedFd>>,
        b: Option<&AsyncFd<OwnedFd>>,
    ) -> Limits<'w> {
        use std::os::fd::AsRawFd;
        let output = [a.map(|f| f.as_raw_fd()), b.map(|f| f.as_raw_fd())];
        Limits {
            watch,
            exited,
            output,
        }
    }

    /// The limits' step now due. While the client holds output back
    /// (`held`: reading paused at the window, or a chunk waiting for the
    /// client), output already waiting in the pipe or terminal is not
    /// silence and restarts the idle clock; a command that went silent
    /// meanwhile still idles out. Then a fired limit SIGTERMs the process
    /// group (or, once the process exited with its output held open by a
    /// daemon, ends what is left), and SIGKILLs it when the grace has run
    /// out.
    fn due(&mut self, proc: &Process, held: bool) {
        let now = tokio::time::Instant::now();
        if held && self.output.iter().flatten().any(|fd| unread_bytes(*fd) > 0) {
            self.watch.output_held(now);
        }
        match self.watch.tick(now) {
            super::limits::Action::Terminate(reason) => {
                lock(&proc.state).limit = Some(reason);
                crate::metrics::limit_fired(reason);
                tracing::info!(process_id = %proc.id, limit = reason.as_str(), "a limit ended the process");
                if self.exited {
                    // Exited, yet its output is held open (a daemon):
                    // nothing to ask, end what is left.
                    proc.terminate();
                } else {
                    kill::signal_group(proc.pid, nix::sys::signal::Signal::SIGTERM);
                }
            }
            super::limits::Action::Kill => {
                proc.terminate();
            }
            super::limits::Action::Wait => {}
        }
    }
}

/// Bytes waiting to be read in a pipe or terminal (`FIONREAD`); 0 when
/// it cannot say.
pub(super) fn unread_bytes(fd: std::os::fd::RawFd) -> libc::c_int {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int to `n`, which outlives the call.
    let r = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
    if r < 0 {
        0
    } else {
        n
    }
}

/// Awaits `send` (true when the client's queue took the message) while the
/// limits go on: a client that does not read holds the message up, not the
/// deadline, the output cap or the grace's SIGKILL. An upgrade asking the
/// pump to park ends the wait too (false): the message is in the log, and a
/// resume replays it.
async fn send_enforcing(
    proc: &Process,
    limits: &mut Limits<'_>,
    send: impl std::future::Future<Output = bool>,
) -> bool {
    let mut parking = proc.park.signal();
    tokio::pin!(send);
    loop {
        let due = limits.watch.next_due();
        tokio::select! {
            // The send first: a message the client's queue takes at once
            // (the common case) never arms the timer.
            biased;
            sent = &mut send => return sent,
            _ = handover::asked(&mut parking) => return false,
            _ = tokio::time::sleep_until(due.unwrap_or_else(far_future)), if due.is_some() => {
                limits.due(proc, true);
            }
        }
    }
}

/// Sends a chunk, a PTY's short read line by line, enforcing `limits`
/// while the client holds it up.
async fn emit(
    proc: &Process,
    link: &Link,
    limits: &mut Limits<'_>,
    stream: OutputStream,
    data: Filled,
) {
    if stream == OutputStream::Pty && data.payload().len() <= PTY_LINE_SPLIT_MAX_BYTES {
        let mut rest = data.payload();
        while let Some(i) = rest.iter().position(|b| *b == b'\n') {
            if i + 1 == rest.len() {
                break;
            }
            emit_one(proc, link, limits, stream, Filled::copy_of(&rest[..=i], 0)).await;
            rest = &rest[i + 1..];
        }
        if rest.len() < data.payload().len() {
            emit_one(proc, link, limits, stream, Filled::copy_of(rest, 0)).await;
            return;
        }
    }
    emit_one(proc, link, limits, stream, data).await;
}

async fn emit_one(
    proc: &Process,
    link: &Link,
    limits: &mut Limits<'_>,
    stream: OutputStream,
    data: Filled,
) {
    crate::metrics::output_bytes(data.payload().len());
    proc.output_bytes.fetch_add(
        data.payload().len() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    let (out, seq, push) = {
        let mut st = lock(&proc.state);
        // The connection is looked up under the log's lock, with the seq
        // taken: a client that resumes reads the log (under this lock)
        // after attaching, so each chunk is either in that read or pushed
        // on the new connection. Looked up before the lock, a chunk could
        // miss both (a detached link seen, then the resume and its read,
        // then the seq): a gap the client waits on for ever.
        let out = link.outbound();
        // Raw bytes in a binary frame when the client agreed to them: the frame
        // and the log share the bytes. Otherwise base64 in a notification.
        let binary = out.as_ref().is_some_and(|o| o.binary_frames());
        if binary {
            let seq = st.log.next_seq();
            let head = notify::output_frame_head(&proc.id, seq, stream);
            let (frame, payload) = data.into_frame(binary::Kind::ParamsChunk, &head);
            (out, st.log.push_output(stream, payload), Push::Frame(frame))
        } else {
            let payload = data.into_payload();
            (
                out,
                st.log.push_output(stream, payload.clone()),
                Push::Json(payload),
            )
        }
    };
    proc.bump();
    let Some(out) = out else { return };
    let send = async {
        match push {
            Push::Frame(frame) => out.send_binary(frame).await,
            Push::Json(payload) => {
                out.send(encode_output_notification(&proc.id, seq, stream, &payload))
                    .await
            }
        }
    };
    let send = async { send.await.is_ok() };
    let sent = send_enforcing(proc, limits, send).await;
    if sent {
        lock(&proc.state).log.delivered_by_push(seq);
    }
}

/// How [`emit_one`] sends a chunk.
enum Push {
    Frame(bytes::Bytes),
    Json(bytes::Bytes),
}

async fn send_event(proc: &Process, link: &Link, seq: u64, msg: String, limits: &mut Limits<'_>) {
    if let Some(out) = link.outbound() {
        let sent = send_enforcing(proc, limits, async { out.send(msg).await.is_ok() }).await;
        if sent {
            lock(&proc.state).log.delivered_by_push(seq);
        }
    }
}
