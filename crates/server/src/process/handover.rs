//! A process handed from one image of the server to the next (an upgrade;
//! the whole procedure is in `crate::handover`).
//!
//! Once the server raises its handover signal, the pump and the stdin
//! writer of every process *park*: each stops between two steps, where no
//! byte is in flight (everything read from the child is in the log; a
//! write to its stdin that was cut short knows how much the child took),
//! and hands over what it owned. [`Parked::write`] then writes the process
//! down as a [`ProcessDoc`] (descriptors by number, bytes by place in the
//! document's blob), and [`adopt`] starts it again from one in the next
//! image: same pid, same pipes or terminal, same seqs.

use super::cgroup::ProcessCgroupParts;
use super::limits::WatchParts;
use super::list::StartedWith;
use super::output_log::{Chunk, LogParts};
use super::pump::{self, Held};
use super::spool::{SegmentParts, Spool, SpoolParts};
use super::{
    lock, nonblocking, stdin_writer, OutputLog, Process, RetireHook, Sources, State, StdinOp,
    WriteIds, EXITED_PROCESS_RETENTION, MAX_PENDING_STDIN_BYTES,
};
use crate::error::ExecError;
use crate::link::Link;
use crate::reaper::Exit;
use exec_server_protocol::types::{LimitReason, OutputStream};
use serde::{Deserialize, Serialize};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, oneshot, watch};

/// The server-wide signal that asks every pump and stdin writer to park:
/// raised once, just before the `execve` into the next image.
#[derive(Clone)]
pub struct Signal(Arc<watch::Sender<bool>>);

impl Default for Signal {
    fn default() -> Self {
        Signal(Arc::new(watch::channel(false).0))
    }
}

impl Signal {
    /// Asks every process to park (it cannot be taken back: the server
    /// `execve`s next).
    pub fn raise(&self) {
        self.0.send_replace(true);
    }

    fn subscribe(&self) -> watch::Receiver<bool> {
        self.0.subscribe()
    }
}

/// Resolves once the handover signal is raised; never if it cannot be.
pub(super) async fn asked(rx: &mut watch::Receiver<bool>) {
    if rx.wait_for(|raised| *raised).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// What a pump hands over when it parks.
pub(super) struct PumpParked {
    /// The exit code, once the pump recorded the exit.
    pub(super) exit_code: Option<i32>,
    /// Where the reaper delivers the exit, while the pump has not
    /// recorded it: read once the reaper is frozen.
    pub(super) exit: Option<oneshot::Receiver<Exit>>,
    /// Its sandbox resources, limits and place in the running counts;
    /// `None` once the process is closed.
    pub(super) held: Option<Held>,
}

struct PumpHandoff {
    parked: PumpParked,
    sources: Option<Sources>,
}

struct StdinHandoff {
    rx: mpsc::UnboundedReceiver<StdinOp>,
    fd: Arc<AsyncFd<OwnedFd>>,
    /// The part of a write the child had not taken yet.
    rest: Vec<u8>,
}

/// The two ends of one handoff: the parking task's, and the upgrade's.
type Handoff<T> = (Option<oneshot::Sender<T>>, Option<oneshot::Receiver<T>>);

/// Where one process's pump and stdin writer park.
pub(super) struct Park {
    signal: watch::Receiver<bool>,
    pump: Mutex<Handoff<PumpHandoff>>,
    stdin: Mutex<Handoff<StdinHandoff>>,
}

impl Park {
    pub(super) fn new(signal: &Signal) -> Park {
        let (tx, rx) = oneshot::channel();
        Park {
            signal: signal.subscribe(),
            pump: Mutex::new((Some(tx), Some(rx))),
            stdin: Mutex::new((None, None)),
        }
    }

    /// A receiver of the handover signal.
    pub(super) fn signal(&self) -> watch::Receiver<bool> {
        self.signal.clone()
    }

    /// A stdin writer starts: it will park too.
    pub(super) fn stdin_started(&self) {
        let (tx, rx) = oneshot::channel();
        *self.stdin.lock().unwrap_or_else(|p| p.into_inner()) = (Some(tx), Some(rx));
    }

    /// The stdin writer parks with what it owned.
    pub(super) fn stdin_parked(
        &self,
        rx: mpsc::UnboundedReceiver<StdinOp>,
        fd: Arc<AsyncFd<OwnedFd>>,
        rest: Vec<u8>,
    ) {
        let tx = self
            .stdin
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .take();
        if let Some(tx) = tx {
            let _ = tx.send(StdinHandoff { rx, fd, rest });
        }
    }

    /// The stdin writer ended (stdin closed or broken): nothing to hand over.
    pub(super) fn stdin_ended(&self) {
        self.stdin
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .take();
    }

    /// The pump parks with what it owned.
    pub(super) fn pump_parked(&self, parked: PumpParked, sources: Option<Sources>) {
        let tx = self.pump.lock().unwrap_or_else(|p| p.into_inner()).0.take();
        if let Some(tx) = tx {
            let _ = tx.send(PumpHandoff { parked, sources });
        }
    }
}

/// The output ends a parked pump still reads: a stream that reached its end
/// of file is closed now.
pub(super) fn keep_open(sources: Sources, a_open: bool, b_open: bool) -> Sources {
    match sources {
        Sources::Pipes(a, b) => Sources::Pipes(a.filter(|_| a_open), b.filter(|_| b_open)),
        pty => pty,
    }
}

/// The answer to a stdin write that arrives while the server hands over.
pub(super) fn frozen_error() -> ExecError {
    ExecError::new(
        crate::error::ErrorKind::Upgrading,
        "the server is being upgraded: this write was not applied; resume the session and retry \
         it with the same writeId",
    )
}

/// Where a document keeps descriptors and bytes.
pub trait Sink {
    /// Keeps `fd` open across the `execve`; its number in the document.
    fn fd(&mut self, fd: RawFd) -> i32;
    /// Puts `bytes` in the document's blob.
    fn bytes(&mut self, bytes: &[u8]) -> Blob;
}

/// Where the next image finds them again.
pub trait Source {
    /// The descriptor numbered `n` in the document, now owned (each once).
    /// Errors: not handed over, or taken already.
    fn fd(&mut self, n: i32) -> std::io::Result<OwnedFd>;
    /// The bytes at `blob`. Errors: outside the blob.
    fn bytes(&self, blob: Blob) -> std::io::Result<bytes::Bytes>;
}

/// A place in the document's blob.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Blob {
    /// Offset in bytes.
    pub at: u64,
    /// Length in bytes.
    pub len: u64,
}

/// One retained chunk of output.
#[derive(Debug, Serialize, Deserialize)]
struct ChunkDoc {
    seq: u64,
    stream: OutputStream,
    data: Blob,
}

/// One spool segment.
#[derive(Debug, Serialize, Deserialize)]
struct SegmentDoc {
    fd: i32,
    len: u64,
    first_seq: u64,
    last_seq: u64,
    index: Vec<(u64, u64)>,
}

/// A process written down for the next image: everything its record,
/// pump and stdin writer held.
#[derive(Debug, Serialize, Deserialize)]
pub struct ProcessDoc {
    id: String,
    pid: u32,
    /// PTY master (also its stdin), when it runs on a terminal.
    pty: Option<i32>,
    /// stdout and stderr pipes still open.
    stdout: Option<i32>,
    stderr: Option<i32>,
    /// The stdin pipe, while a writer holds it.
    stdin: Option<i32>,
    cgroup: Option<ProcessCgroupParts>,
    chunks: Vec<ChunkDoc>,
    next_seq: u64,
    delivered_seq: u64,
    ack_mode: bool,
    exited: Option<(u64, i32)>,
    closed_seq: Option<u64>,
    spool: Option<(Vec<SegmentDoc>, bool)>,
    write_ids: Vec<String>,
    has_stdin: bool,
    /// The client may still write (it has not closed stdin).
    stdin_open: bool,
    stdin_broken: bool,
    /// Accepted stdin bytes the child has not taken, in order.
    stdin_pending: Vec<Blob>,
    /// A close of stdin is queued behind them.
    stdin_close_pending: bool,
    sandbox_denied: bool,
    limit: Option<LimitReason>,
    signal: Option<i32>,
    sandboxed: bool,
    /// Sandbox placeholders on the host, and whether the pid counts among
    /// the live sandboxes.
    placeholders: Vec<PathBuf>,
    confined: bool,
    started_with: StartedWith,
    /// Milliseconds it had run when written down.
    age_ms: u64,
    output_bytes: u64,
    /// The exit, once the pump recorded it; or one delivered but not yet
    /// recorded.
    exit_code: Option<i32>,
    pending_exit: Option<(i32, Option<i32>)>,
    /// The output is closed: only the record's retention is left.
    closed: bool,
    limits: Option<WatchParts>,
    live: bool,
    /// Its managed network proxy, while it has one.
    #[serde(default)]
    proxy: Option<crate::network::handover::ProxyDoc>,
}

impl ProcessDoc {
    /// The process id the client chose.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The OS pid (unchanged across the upgrade).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Every descriptor it names: terminal, pipes, spool files.
    pub fn fds(&self) -> Vec<i32> {
        let mut all: Vec<i32> = [self.pty, self.stdout, self.stderr, self.stdin]
            .into_iter()
            .flatten()
            .collect();
        if let Some((segments, _)) = &self.spool {
            all.extend(segments.iter().map(|s| s.fd));
        }
        all.extend(self.proxy.iter().flat_map(|p| p.fds()));
        all
    }

    /// Takes its proxy out, to serve it again first ([`adopt`] is sync; a
    /// proxy starts in the runtime).
    pub fn take_proxy(&mut self) -> Option<crate::network::handover::ProxyDoc> {
        self.proxy.take()
    }

    /// True when every blob range it names lies within `len` bytes.
    pub fn blobs_within(&self, len: u64) -> bool {
        let within = |b: &Blob| b.at.checked_add(b.len).is_some_and(|end| end <= len);
        self.chunks.iter().all(|c| within(&c.data)) && self.stdin_pending.iter().all(within)
    }

    /// True while it has not exited (its exit is neither recorded nor
    /// delivered): the next image must wait for it.
    pub fn running(&self) -> bool {
        self.exit_code.is_none() && self.pending_exit.is_none() && !self.closed
    }
}

/// A process whose pump and stdin writer parked: it owns everything they
/// held until the `execve` (nothing is closed before it).
pub struct Parked {
    proc: Arc<Process>,
    pump: PumpHandoff,
    stdin: Option<StdinHandoff>,
    /// Spool files written down, open until the `execve`.
    spooled: Vec<SpoolParts>,
}

impl Process {
    /// True when it holds something an upgrade cannot hand over yet (a
    /// managed network proxy, which lives in this image's memory).
    pub fn holds_unmovable(&self) -> bool {
        self.kept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|k| k.iter().any(|k| !k.is::<crate::network::RunningProxy>()))
    }

    /// Parks the pump and the stdin writer (the handover signal must be
    /// raised) and takes what they held. `None` when the pump ended first
    /// (the record left its session meanwhile).
    pub async fn park(self: &Arc<Self>) -> Option<Parked> {
        lock(&self.state).frozen = true;
        let stdin_rx = self
            .park
            .stdin
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .take();
        let stdin = match stdin_rx {
            Some(rx) => rx.await.ok(),
            None => None,
        };
        let pump_rx = self
            .park
            .pump
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .take();
        let pump = pump_rx?.await.ok()?;
        Some(Parked {
            proc: self.clone(),
            pump,
            stdin,
            spooled: Vec::new(),
        })
    }
}

impl Parked {
    /// Writes the process down; descriptors and bytes go to `sink`. Call
    /// it with the reaper frozen ([`crate::reaper::freeze`]), so an exit is
    /// either delivered here or still waitable in the next image.
    pub fn write(&mut self, sink: &mut dyn Sink) -> ProcessDoc {
        let proc = &self.proc;
        let mut st = lock(&proc.state);
        let log = st.log.take_parts();
        let fd_of = |sink: &mut dyn Sink, fd: &AsyncFd<OwnedFd>| sink.fd(fd.get_ref().as_raw_fd());
        let (pty, stdout, stderr) = match &self.pump.sources {
            Some(Sources::Pty(m)) => (Some(fd_of(sink, m)), None, None),
            Some(Sources::Pipes(a, b)) => (
                None,
                a.as_ref().map(|f| fd_of(sink, f)),
                b.as_ref().map(|f| fd_of(sink, f)),
            ),
            None => (None, None, None),
        };
        let mut stdin_pending = Vec::new();
        let mut stdin_close_pending = false;
        let mut stdin = None;
        if let Some(h) = &mut self.stdin {
            if !h.rest.is_empty() {
                stdin_pending.push(sink.bytes(&h.rest));
            }
            while let Ok(op) = h.rx.try_recv() {
                match op {
                    StdinOp::Write(data, _permit) => stdin_pending.push(sink.bytes(&data)),
                    StdinOp::Close => stdin_close_pending = true,
                }
            }
            if proc.tty.is_none() {
                stdin = Some(fd_of(sink, &h.fd));
            }
        }
        let chunks = log
            .chunks
            .iter()
            .map(|c| ChunkDoc {
                seq: c.seq,
                stream: c.stream,
                data: sink.bytes(&c.data),
            })
            .collect();
        let spool = log.spool.map(|mut s| {
            let parts = s.take_parts();
            let segments = parts
                .segments
                .iter()
                .map(|seg| SegmentDoc {
                    fd: sink.fd(seg.file.as_raw_fd()),
                    len: seg.len,
                    first_seq: seg.first_seq,
                    last_seq: seg.last_seq,
                    index: seg.index.clone(),
                })
                .collect();
            let failed = parts.failed;
            self.spooled.push(parts);
            (segments, failed)
        });
        let proxy = proc
            .kept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .flatten()
            .find_map(|k| k.downcast_ref::<crate::network::RunningProxy>())
            .map(|p| p.write(sink));
        let held = self.pump.parked.held.as_ref();
        let confinement = held.and_then(|h| h.confinement.as_ref());
        let cgroup = proc.cgroup.lock().unwrap_or_else(|p| p.into_inner());
        let doc = ProcessDoc {
            id: proc.id.clone(),
            pid: proc.pid,
            pty,
            stdout,
            stderr,
            stdin,
            cgroup: cgroup.as_ref().map(|g| g.parts()),
            chunks,
            next_seq: log.next_seq,
            delivered_seq: log.delivered_seq,
            ack_mode: log.ack_mode,
            exited: log.exited,
            closed_seq: log.closed_seq,
            spool,
            write_ids: st.write_ids.order.iter().cloned().collect(),
            has_stdin: st.has_stdin,
            stdin_open: st.stdin.is_some(),
            stdin_broken: st.stdin_broken,
            stdin_pending,
            stdin_close_pending,
            sandbox_denied: st.sandbox_denied,
            limit: st.limit,
            signal: st.signal.map(|s| s as i32),
            sandboxed: proc.sandboxed,
            placeholders: confinement
                .map(|c| c.placeholder_paths())
                .unwrap_or_default(),
            confined: confinement.is_some_and(|c| c.confined()),
            started_with: proc.started_with.clone(),
            age_ms: proc.started.elapsed().as_millis() as u64,
            output_bytes: proc.output_bytes.load(std::sync::atomic::Ordering::Relaxed),
            exit_code: self.pump.parked.exit_code,
            pending_exit: self
                .pump
                .parked
                .exit
                .as_mut()
                .and_then(|rx| rx.try_recv().ok())
                .map(|e| (e.code, e.signal.map(|s| s as i32))),
            closed: held.is_none(),
            limits: held.map(|h| h.limits.parts(tokio::time::Instant::now())),
            live: held.is_some_and(|h| h.live.is_some()),
            proxy,
        };
        st.log = OutputLog::from_parts(LogParts {
            chunks: log.chunks,
            next_seq: log.next_seq,
            delivered_seq: log.delivered_seq,
            ack_mode: log.ack_mode,
            exited: log.exited,
            closed_seq: log.closed_seq,
            spool: None,
        });
        doc
    }
}

/// What an adopted process needs from its server and session.
pub struct AdoptContext<'a> {
    /// Its session's link.
    pub link: Arc<Link>,
    /// Removes its record from the session once retired.
    pub on_retire: RetireHook,
    /// The server's spool, where enabled.
    pub spool: Option<Arc<super::spool::SpoolConfig>>,
    /// The session's share of it.
    pub spool_share: Arc<super::spool::SessionShare>,
    /// The server's cgroups and handover signal.
    pub host: &'a super::Host,
    /// The server's sandbox support (its live sandboxes).
    pub sandbox: &'a crate::sandbox::Support,
    /// The running counts it takes a place in (session, server).
    pub live: [&'a super::live::LiveCount; 2],
    /// How it ends, from the reaper ([`crate::reaper::adopt`]), while it runs.
    pub exit: Option<oneshot::Receiver<Exit>>,
}

/// Starts again, in this image, the process `doc` wrote down in the
/// previous one: its pump reads on from where it parked, its stdin writer
/// writes what was pending, its record keeps its seqs and writeIds.
/// Errors: a descriptor or blob range the document names is missing.
pub fn adopt(
    doc: ProcessDoc,
    source: &mut dyn Source,
    cx: AdoptContext<'_>,
) -> std::io::Result<Arc<Process>> {
    let async_fd =
        |source: &mut dyn Source, n: Option<i32>| -> std::io::Result<Option<AsyncFd<OwnedFd>>> {
            n.map(|n| source.fd(n).and_then(nonblocking)).transpose()
        };
    let tty = async_fd(source, doc.pty)?.map(Arc::new);
    let sources = match &tty {
        Some(m) => Sources::Pty(m.clone()),
        None => Sources::Pipes(async_fd(source, doc.stdout)?, async_fd(source, doc.stderr)?),
    };
    let stdin_fd = match &tty {
        Some(m) => Some(m.clone()),
        None => async_fd(source, doc.stdin)?.map(Arc::new),
    };
    let mut chunks = Vec::with_capacity(doc.chunks.len());
    for c in &doc.chunks {
        chunks.push(Chunk {
            seq: c.seq,
            stream: c.stream,
            data: source.bytes(c.data)?,
        });
    }
    let spool = match (doc.spool, &cx.spool) {
        (Some((segments, failed)), Some(config)) => {
            let mut parts = SpoolParts {
                segments: Vec::with_capacity(segments.len()),
                failed,
            };
            for s in segments {
                parts.segments.push(SegmentParts {
                    file: Arc::new(std::fs::File::from(source.fd(s.fd)?)),
                    len: s.len,
                    first_seq: s.first_seq,
                    last_seq: s.last_seq,
                    index: s.index,
                });
            }
            Some(Spool::from_parts(
                config.clone(),
                cx.spool_share.clone(),
                parts,
            ))
        }
        // The spool is off in this image: spooled output is gone, which a
        // reader sees as a seq jump, as for any spool cap.
        (_, None) => None,
        (None, Some(config)) => Some(Spool::new(config.clone(), cx.spool_share.clone())),
    };
    let log = OutputLog::from_parts(LogParts {
        chunks,
        next_seq: doc.next_seq,
        delivered_seq: doc.delivered_seq,
        ack_mode: doc.ack_mode,
        exited: doc.exited,
        closed_seq: doc.closed_seq,
        spool,
    });
    let mut write_ids = WriteIds::default();
    for id in doc.write_ids {
        write_ids.remember(id);
    }
    let stdin_budget = Arc::new(tokio::sync::Semaphore::new(MAX_PENDING_STDIN_BYTES));
    let writer = match &stdin_fd {
        Some(fd) if doc.stdin_open || !doc.stdin_pending.is_empty() || doc.stdin_close_pending => {
            let (tx, rx) = mpsc::unbounded_channel();
            for blob in &doc.stdin_pending {
                let data = source.bytes(*blob)?.to_vec();
                let n = (data.len().min(MAX_PENDING_STDIN_BYTES) as u32).max(1);
                let permit = stdin_budget
                    .clone()
                    .try_acquire_many_owned(n)
                    .map_err(|_| std::io::Error::other("pending stdin exceeds its budget"))?;
                let _ = tx.send(StdinOp::Write(data, permit));
            }
            if doc.stdin_close_pending {
                let _ = tx.send(StdinOp::Close);
            }
            Some((tx, rx, fd.clone()))
        }
        _ => None,
    };
    let cgroup = doc
        .cgroup
        .map(|p| Arc::new(cx.host.cgroups.adopt_process(p)));
    let age = std::time::Duration::from_millis(doc.age_ms);
    let (changed, _) = watch::channel(0);
    let proc = Arc::new(Process {
        id: doc.id.clone(),
        pid: doc.pid,
        cgroup: Mutex::new(cgroup),
        tty,
        state: Mutex::new(State {
            log,
            write_ids,
            stdin: writer
                .as_ref()
                .filter(|_| doc.stdin_open)
                .map(|(tx, _, _)| tx.clone()),
            stdin_broken: doc.stdin_broken,
            has_stdin: doc.has_stdin,
            sandbox_denied: doc.sandbox_denied,
            limit: doc.limit,
            signal: doc
                .signal
                .and_then(|s| nix::sys::signal::Signal::try_from(s).ok()),
            frozen: false,
        }),
        changed,
        resume: tokio::sync::Notify::new(),
        stdin_budget,
        sandboxed: doc.sandboxed,
        started: std::time::Instant::now()
            .checked_sub(age)
            .unwrap_or_else(std::time::Instant::now),
        discarded: tokio::sync::Notify::new(),
        kept: Mutex::new((!doc.closed).then(Vec::new)),
        started_with: doc.started_with,
        output_bytes: std::sync::atomic::AtomicU64::new(doc.output_bytes),
        park: Park::new(&cx.host.handover),
    });
    if let Some((_, rx, fd)) = writer {
        proc.park.stdin_started();
        tokio::spawn(stdin_writer(proc.clone(), rx, fd));
    }
    if doc.closed {
        tokio::spawn(pump::retain(
            proc.clone(),
            cx.on_retire,
            EXITED_PROCESS_RETENTION,
        ));
        return Ok(proc);
    }
    let exit = match (doc.exit_code, doc.pending_exit, cx.exit) {
        // Recorded: the pump never waits for it again.
        (Some(_), _, _) => oneshot::channel().1,
        (None, Some((code, signal)), _) => {
            let (tx, rx) = oneshot::channel();
            let signal = signal.and_then(|s| nix::sys::signal::Signal::try_from(s).ok());
            let _ = tx.send(Exit { code, signal });
            rx
        }
        (None, None, Some(rx)) => rx,
        (None, None, None) => {
            return Err(std::io::Error::other(format!(
                "process {} (pid {}) runs but nothing waits for it",
                doc.id, doc.pid
            )))
        }
    };
    let confinement = (doc.confined || !doc.placeholders.is_empty()).then(|| {
        crate::sandbox::Confinement::adopt(cx.sandbox, &doc.placeholders, doc.pid, doc.confined)
    });
    let limits = match &doc.limits {
        Some(p) => super::limits::Watch::from_parts(p, tokio::time::Instant::now()),
        None => super::limits::Watch::new(None, tokio::time::Instant::now(), Default::default()),
    };
    let live = doc
        .live
        .then(|| super::live::LiveSlot::take(&[(cx.live[0], None), (cx.live[1], None)]).ok())
        .flatten();
    let span = tracing::info_span!(
        "process",
        process_id = %doc.id,
        pid = doc.pid,
        tty = proc.tty.is_some(),
        sandboxed = doc.sandboxed,
        exit_code = tracing::field::Empty,
    );
    // Its start was answered in the previous image: nothing to wait for.
    let gate = oneshot::channel().1;
    tokio::spawn(pump::pump(
        proc.clone(),
        sources,
        exit,
        cx.link,
        gate,
        cx.on_retire,
        pump::From::Resume {
            exit_code: doc.exit_code,
        },
        Held {
            confinement,
            span,
            limits,
            live,
        },
    ));
    Ok(proc)
}
