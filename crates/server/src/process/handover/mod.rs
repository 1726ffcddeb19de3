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

mod adopt;
mod doc;

pub use adopt::{adopt, AdoptContext};
pub use doc::{Blob, ProcessDoc, Sink, Source};

use super::output_log::{LogParts, OutputLog};
use super::pump::Held;
use super::spool::SpoolParts;
use super::{lock, Process, Sources, StdinOp};
use crate::error::ExecError;
use crate::reaper::Exit;
use doc::{ChunkDoc, SegmentDoc};
use std::os::fd::{AsRawFd, OwnedFd};
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
            window: Some(log.window),
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
            window: log.window,
            exited: log.exited,
            closed_seq: log.closed_seq,
            spool: None,
        });
        doc
    }
}
