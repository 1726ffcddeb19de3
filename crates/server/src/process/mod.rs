//! Processes: one [`Process`] per `process/start`, owning the child's output log,
//! its stdin writer and the task that pumps its output.
//!
//! Ownership: the session's process table owns the [`Process`]; the pump task holds
//! a clone until the process is closed. Killing is by process tree (see [`kill`]).

mod born;
pub mod cgroup;
pub mod handover;
pub mod kill;
pub mod limits;
pub mod list;
pub mod live;
mod notify;
pub mod output_log;
pub mod plan;
mod pty_line;
mod pump;
mod read_buf;
pub mod resources;
pub mod sink;
pub mod snapshot;
pub mod spawn;
pub mod spawn_error;
pub mod spool;
mod stdin;
pub mod warm;

use crate::error::{ExecError, ExecResult};
use crate::link::Link;
use exec_server_protocol::types::{LimitReason, OutputStream, ProcessSignal, ReadResponse};
pub use notify::encode_output_notification;
use output_log::OutputLog;
use pump::{pump, Held};
use std::collections::{HashSet, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use stdin::{stdin_writer, StdinOp};
pub use stdin::{MAX_PENDING_STDIN_BYTES, STDIN_WRITE_TIMEOUT};
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, oneshot, watch, Notify};

/// How long the record of an exited and closed process stays readable: 30 s.
pub const EXITED_PROCESS_RETENTION: Duration = Duration::from_secs(30);
/// Accepted writeIds remembered per process for de-duplication: 4096.
pub const REMEMBERED_WRITE_IDS: usize = 4096;
/// Bytes read from a child's pipe or PTY at once: 64 KiB, until the child
/// writes faster than that (see [`BULK_READ_CHUNK_BYTES`]).
pub const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Once a read fills the whole [`READ_CHUNK_BYTES`] buffer (the child outpaces
/// us), the buffer and the pipe grow to 128 KiB: half as many
/// notifications, frames and wake-ups per byte. A `process/output` message is
/// then at most ~171 KiB of JSON, far below the 16 MiB the reference's peers
/// accept. Processes that write little never pay for the larger pipe.
pub const BULK_READ_CHUNK_BYTES: usize = 128 * 1024;
/// The same growth on a connection that agreed to binary frames, once a
/// [`BULK_READ_CHUNK_BYTES`] read fills too: reads of up to 1 MiB (less a
/// little, so a frame with its header stays one WebSocket frame) from a 1 MiB
/// pipe. The raw bytes are never base64'd or scanned, so the larger the chunk,
/// the fewer wake-ups per byte.
pub const BINARY_READ_CHUNK_BYTES: usize = 1024 * 1024 - 4096;

/// Called once a closed process's record has been kept for
/// [`EXITED_PROCESS_RETENTION`]: removes it from its session.
pub type RetireHook = Box<dyn FnOnce(&Arc<Process>) + Send>;

#[derive(Default)]
struct WriteIds {
    order: VecDeque<String>,
    set: HashSet<String>,
}

impl WriteIds {
    fn contains(&self, id: &str) -> bool {
        self.set.contains(id)
    }
    fn remember(&mut self, id: String) {
        if self.set.insert(id.clone()) {
            self.order.push_back(id);
            if self.order.len() > REMEMBERED_WRITE_IDS {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }
}

struct State {
    log: OutputLog,
    write_ids: WriteIds,
    /// Writable stdin (pipe or PTY) not yet closed by the client.
    stdin: Option<mpsc::UnboundedSender<StdinOp>>,
    /// stdin existed but failed (EPIPE) or the process exited.
    stdin_broken: bool,
    has_stdin: bool,
    /// `sandboxDenied`, computed at exit (SANDBOX.md §2.8).
    sandbox_denied: bool,
    /// The limit that ended the process, once one fired.
    limit: Option<exec_server_protocol::types::LimitReason>,
    /// The signal that ended the process, once it exited by one.
    signal: Option<nix::sys::signal::Signal>,
    /// Set while the server hands its processes to a new binary (an
    /// upgrade): stdin takes nothing more, so nothing accepted is lost.
    frozen: bool,
}

/// A managed process.
pub struct Process {
    /// Client-chosen id.
    pub id: String,
    /// OS pid (also its process group and session id).
    pub pid: u32,
    /// Its cgroup, where available: kills descendants that left its group.
    cgroup: Mutex<Option<Arc<cgroup::ProcessCgroup>>>,
    tty: Option<Arc<AsyncFd<OwnedFd>>>,
    state: Mutex<State>,
    /// Bumped on every new event; long-polls wait on it.
    changed: watch::Sender<u64>,
    /// Wakes a paused pump when output is delivered.
    resume: Notify,
    /// Byte budget of stdin data queued for the child.
    stdin_budget: Arc<tokio::sync::Semaphore>,
    /// Started confined: `sandboxDenied` is computed at exit.
    sandboxed: bool,
    /// When it started: older closed records are retired first.
    pub started: std::time::Instant,
    /// Fired when the record leaves its session early (session end, or
    /// retired to make room): the pump stops keeping it.
    discarded: Notify,
    /// What lives exactly as long as the process is open (its network proxy):
    /// dropped when `process/closed` is sent; `None` once closed.
    kept: Mutex<Option<Vec<KeptUntilClosed>>>,
    /// What it was started with, for `process/list`.
    started_with: list::StartedWith,
    /// Output bytes delivered so far (all streams), for `process/list`.
    output_bytes: std::sync::atomic::AtomicU64,
    /// Where its pump and stdin writer stop for an upgrade ([`handover`]).
    park: handover::Park,
}

/// The server's settings a process is started with.
pub struct SpawnSettings {
    /// The output spool, when enabled.
    pub spool: Option<Arc<spool::SpoolConfig>>,
    /// The session's share of the spool, which its output counts against.
    pub spool_share: Arc<spool::SessionShare>,
    /// Between the SIGTERM and the SIGKILL of a fired limit.
    pub limit_grace: Duration,
    /// Its place in the running counts, given back when it exits.
    pub live: Option<live::LiveSlot>,
    /// The server's tool directories and cgroups.
    pub host: Host,
}

/// What every process of one server shares: the tool directories its
/// children's `PATH` is led by, and its cgroups. Owned by the server's state,
/// so two servers in one process (embedded ones) each have their own;
/// cheap to clone.
#[derive(Clone)]
pub struct Host {
    /// `prependPathDirs`: put in front of the server's `PATH` where a
    /// child's environment starts from the server's.
    pub tool_dirs: Arc<[std::path::PathBuf]>,
    /// Its per-process cgroups and caps.
    pub cgroups: cgroup::Cgroups,
    /// Raised when the server hands over to a new binary: every process
    /// parks ([`handover`]).
    pub handover: handover::Signal,
    /// Sandboxes prepared ahead for the next sandboxed starts ([`warm`]).
    pub warm: Arc<warm::Pool>,
    /// Sinks an embedder in this process offered for its starts ([`sink`]).
    pub output_sinks: Option<Arc<sink::OutputSinks>>,
}

/// Something kept alive until the process closes.
pub type KeptUntilClosed = Box<dyn std::any::Any + Send>;

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Output ends for the pump: stdout and stderr (each until its end of
/// file), or the PTY master.
enum Sources {
    Pipes(Option<AsyncFd<OwnedFd>>, Option<AsyncFd<OwnedFd>>),
    Pty(Arc<AsyncFd<OwnedFd>>),
}

fn nonblocking(fd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = fcntl(&fd, FcntlArg::F_GETFL).map_err(std::io::Error::from)?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    fcntl(&fd, FcntlArg::F_SETFL(flags)).map_err(std::io::Error::from)?;
    // SAFETY: an OwnedFd is a valid open descriptor that keeps its number for as
    // long as it is owned, here by the AsyncFd.
    unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

/// Reads once; `Ok(0)` at end of file (a PTY's EIO counts as end of file).
/// Reads once into `buf` after its first `at` bytes, waiting until there is
/// something to read.
async fn read_some(
    fd: &AsyncFd<OwnedFd>,
    buf: &mut read_buf::ReadBuf,
    at: usize,
) -> std::io::Result<usize> {
    loop {
        let mut guard = fd.readable().await?;
        match guard.try_io(|inner| raw_read(inner.get_ref(), buf, at)) {
            Ok(r) => return r,
            Err(_would_block) => continue,
        }
    }
}

/// One read into `buf` after its first `at` bytes; a terminal whose other
/// side is gone (`EIO`) reads as the end of the output.
fn raw_read(fd: &OwnedFd, buf: &mut read_buf::ReadBuf, at: usize) -> std::io::Result<usize> {
    match buf.read_from(fd, at) {
        Err(e) if e.raw_os_error() == Some(libc::EIO) => Ok(0),
        r => r,
    }
}

impl Process {
    /// Carries out `plan`: starts the child and its pump. The pump waits for
    /// `start_gate` (fired once the `process/start` response is queued, or
    /// dropped) before sending any notification, so the response always
    /// comes first. Errors: the plan's caps cannot hold, or the start failed
    /// (see [`spawn::start`]).
    pub fn spawn(
        plan: plan::LaunchPlan,
        link: Arc<Link>,
        start_gate: oneshot::Receiver<()>,
        on_retire: RetireHook,
        settings: SpawnSettings,
    ) -> std::io::Result<Arc<Process>> {
        let SpawnSettings {
            spool,
            spool_share,
            limit_grace,
            live,
            host,
        } = settings;
        let caps = plan.limits.as_ref().filter(|l| resources::any(Some(l)));
        // A start routed through its own network proxy has a route (and
        // proxy variables) no later start shares: a sandbox made for its
        // key could never be taken, only crowd out those that can.
        let warmable = plan
            .confinement
            .as_ref()
            .filter(|sb| caps.is_none() && !sb.routed());
        let served = warmable.and_then(|sb| host.warm.take(&plan.exec, sb));
        let (started, cgroup) = match served {
            Some(served) => (served.started, served.cgroup),
            None => Self::start_cold(&plan, caps, &host)?,
        };
        if let Some(sb) = warmable {
            host.warm.prepare_next(&plan.exec, sb, &host.cgroups);
        }
        crate::metrics::process_spawned();
        let confinement = started.confinement;
        let pid = started.pid;
        // A child of the `process/start` request's span, open until the
        // process is closed: its duration is the process's lifetime.
        let span = tracing::info_span!(
            "process",
            process_id = %plan.process_id,
            pid,
            tty = plan.exec.tty(),
            sandboxed = confinement.is_some(),
            exit_code = tracing::field::Empty,
        );
        let mut sinks = [None, None];
        let (sources, stdin_fd, tty) = match started.io {
            spawn::ChildIo::Pipes {
                stdin,
                stdout,
                stderr,
            } => {
                if let Some(offered) = &host.output_sinks {
                    sinks = offered.take(&plan.process_id);
                }
                (
                    Sources::Pipes(Some(nonblocking(stdout)?), Some(nonblocking(stderr)?)),
                    stdin.map(nonblocking).transpose()?.map(Arc::new),
                    None,
                )
            }
            spawn::ChildIo::Pty { master } => {
                let m = Arc::new(nonblocking(master)?);
                (Sources::Pty(m.clone()), Some(m.clone()), Some(m))
            }
        };
        let has_stdin = stdin_fd.is_some();
        let stdin_tx = stdin_fd.map(|fd| {
            let (tx, rx) = mpsc::unbounded_channel();
            (tx, rx, fd)
        });
        let (changed, _) = watch::channel(0);
        let proc = Arc::new(Process {
            id: plan.process_id.clone(),
            pid,
            cgroup: Mutex::new(cgroup.map(Arc::new)),
            tty,
            state: Mutex::new(State {
                log: OutputLog::new(
                    plan.ack_output,
                    spool.map(|c| spool::Spool::new(c, spool_share)),
                )
                .with_acked_window(plan.output_window_bytes),
                write_ids: WriteIds::default(),
                stdin: stdin_tx.as_ref().map(|(tx, _, _)| tx.clone()),
                stdin_broken: false,
                has_stdin,
                sandbox_denied: false,
                limit: None,
                signal: None,
                frozen: false,
            }),
            changed,
            resume: Notify::new(),
            stdin_budget: Arc::new(tokio::sync::Semaphore::new(MAX_PENDING_STDIN_BYTES)),
            sandboxed: confinement.is_some(),
            started: std::time::Instant::now(),
            discarded: Notify::new(),
            kept: Mutex::new(Some(plan.kept)),
            started_with: plan.shown,
            output_bytes: std::sync::atomic::AtomicU64::new(0),
            park: handover::Park::new(&host.handover),
        });
        if let Some((_, rx, fd)) = stdin_tx {
            proc.park.stdin_started();
            tokio::spawn(stdin_writer(proc.clone(), rx, fd));
        }
        tokio::spawn(pump(
            proc.clone(),
            sources,
            started.exit,
            link,
            start_gate,
            on_retire,
            pump::From::Start,
            Held {
                confinement,
                span,
                limits: limits::Watch::new(
                    plan.limits.as_ref(),
                    tokio::time::Instant::now(),
                    limit_grace,
                ),
                live,
                sinks,
            },
        ));
        Ok(proc)
    }

    /// Keeps `v` until the process closes (all output read and the child
    /// reaped); dropped at once if it already has.
    pub fn hold_until_closed(&self, v: KeptUntilClosed) {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(list) = kept.as_mut() {
            list.push(v);
        }
    }

    /// The child's OS pid (also its process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// True if something the process started is still alive: its output is
    /// still open (a child holds it), or its cgroup still has members.
    pub fn has_leftovers(&self) -> bool {
        let open = !lock(&self.state).log.is_closed();
        open || self
            .cgroup
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|g| g.is_populated())
    }

    /// True while the process has not been reaped.
    pub fn is_running(&self) -> bool {
        lock(&self.state).log.exit_code().is_none()
    }

    /// True once all output is drained and the exit recorded.
    pub fn is_closed(&self) -> bool {
        lock(&self.state).log.is_closed()
    }

    /// True once closed and every event was delivered (read, acknowledged,
    /// or pushed to a client that does not acknowledge).
    pub fn is_fully_read(&self) -> bool {
        lock(&self.state).log.fully_delivered()
    }

    /// The record left its session: release what it holds (descriptors, the
    /// spool) as soon as the process is closed, instead of keeping it readable
    /// for [`EXITED_PROCESS_RETENTION`].
    pub fn discard(&self) {
        self.discarded.notify_one();
    }

    /// Answers `process/read`, long-polling up to `wait` when nothing is available.
    pub async fn read(
        &self,
        after: u64,
        max_bytes: Option<u64>,
        wait: Option<Duration>,
    ) -> ReadResponse {
        let mut rx = self.changed.subscribe();
        let deadline = wait.map(|w| tokio::time::Instant::now() + w);
        loop {
            let frozen = {
                let mut st = lock(&self.state);
                let ready = !st.frozen && st.log.has_events_after(after);
                let due = deadline.is_none_or(|d| tokio::time::Instant::now() >= d);
                if !st.frozen && (ready || due) {
                    // Asking from `after` proves everything up to it was received.
                    st.log.mark_delivered(after);
                    let page = st.log.read(after, max_bytes);
                    if let Some(last) = page.chunks.last() {
                        st.log.delivered_by_push(last.seq);
                    }
                    let exit = st.log.exit_code();
                    // A page the spool cut short is not the end, even after the
                    // close: the reader goes on from `nextSeq`.
                    let closed = st.log.is_closed() && !page.truncated;
                    let sandbox_denied = st.sandbox_denied;
                    let limit = st.limit.filter(|_| exit.is_some());
                    let signal = st.signal.map(|s| s.as_str().to_string());
                    drop(st);
                    self.resume.notify_one();
                    return ReadResponse {
                        chunks: page.chunks,
                        next_seq: page.next_seq,
                        exited: exit.is_some(),
                        exit_code: exit,
                        closed,
                        failure: None,
                        sandbox_denied,
                        limit,
                        signal,
                    };
                }
                rx.borrow_and_update();
                st.frozen
            };
            if frozen {
                // Handing over: the log is being taken apart, and this
                // connection ends at the `execve`. The client reads again
                // once it has resumed.
                return std::future::pending().await;
            }
            // Wake on a change or at the deadline; the next pass builds the page.
            if let Some(deadline) = deadline {
                let _ = tokio::time::timeout_at(deadline, rx.changed()).await;
            }
        }
    }

    /// `process/ack`: events through `seq` were consumed.
    pub fn ack(&self, seq: u64) {
        lock(&self.state).log.mark_delivered(seq);
        self.resume.notify_one();
    }

    /// `process/signal`: to the process group, if the process still runs.
    pub fn signal(&self, signal: ProcessSignal) {
        if !self.is_running() {
            return;
        }
        use nix::sys::signal::Signal;
        let sig = match signal {
            ProcessSignal::Interrupt => Signal::SIGINT,
            ProcessSignal::Terminate => Signal::SIGTERM,
            ProcessSignal::Kill => Signal::SIGKILL,
            ProcessSignal::Hangup => Signal::SIGHUP,
            ProcessSignal::Quit => Signal::SIGQUIT,
            ProcessSignal::User1 => Signal::SIGUSR1,
            ProcessSignal::User2 => Signal::SIGUSR2,
            ProcessSignal::Continue => Signal::SIGCONT,
            ProcessSignal::Stop => Signal::SIGSTOP,
            ProcessSignal::WindowChange => Signal::SIGWINCH,
        };
        kill::signal_group(self.pid, sig);
    }

    /// `process/terminate`: kills the tree, and whatever is left in the
    /// process's cgroup even after it exited (double-forked daemons); true if
    /// the process was running.
    pub fn terminate(&self) -> bool {
        let (running, closed) = {
            let st = lock(&self.state);
            (st.log.exit_code().is_none(), st.log.is_closed())
        };
        if let Some(group) = &*self.cgroup.lock().unwrap_or_else(|p| p.into_inner()) {
            group.kill();
        }
        if !closed {
            kill::kill_tree(self.pid);
        }
        // A paused pump must run to observe the exit and drain.
        self.resume.notify_one();
        running
    }

    /// Settles its cgroup once the process has closed, with one read of
    /// its members: while something lives in it (a daemon the process left
    /// behind), it is kept and returned shared, so a deadline that outlives
    /// the process still ends it; else it is given back, so the next start
    /// reuses it rather than making one.
    fn settle_cgroup(&self) -> Option<Arc<cgroup::ProcessCgroup>> {
        let mut slot = self.cgroup.lock().unwrap_or_else(|p| p.into_inner());
        let group = slot.as_ref()?;
        match group.occupancy() {
            cgroup::Occupancy::Populated => return slot.clone(),
            cgroup::Occupancy::Empty => group.seen_empty_after_exit(),
            cgroup::Occupancy::Unreadable => {}
        }
        let group = slot.take();
        drop(slot);
        drop(group);
        None
    }

    /// The memory or task cap that fired, read from its cgroup's counters.
    fn cap_exceeded(&self) -> Option<LimitReason> {
        self.cgroup
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()?
            .cap_exceeded()
    }

    /// The process's cgroup when something still lives in it (a daemon it
    /// left behind), for the session to kill at its end.
    pub fn take_leftovers(&self) -> Option<Arc<cgroup::ProcessCgroup>> {
        let mut slot = self.cgroup.lock().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_some_and(|g| g.is_populated()) {
            slot.take()
        } else {
            None
        }
    }

    /// `process/resize` (PTY only).
    /// Errors: [`ErrorKind::InvalidInput`](crate::error::ErrorKind::InvalidInput)
    /// on a pipe process; the OS error if the terminal refuses the size.
    pub fn resize(&self, cols: u16, rows: u16) -> ExecResult<()> {
        match &self.tty {
            Some(m) => spawn::set_pty_size(m.get_ref(), cols, rows).map_err(ExecError::io),
            None => Err(ExecError::invalid_input(format!(
                "process {} is not running on a terminal",
                self.id
            ))),
        }
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }
}

impl Process {
    /// Starts `plan`'s child the cold way, in a new per-process cgroup
    /// (`caps` written into it first). Errors: as [`Self::spawn`].
    fn start_cold(
        plan: &plan::LaunchPlan,
        caps: Option<&exec_server_protocol::types::ProcessLimits>,
        host: &Host,
    ) -> std::io::Result<(spawn::Started, Option<cgroup::ProcessCgroup>)> {
        let mut cgroup = host.cgroups.create();
        if let Some(limits) = caps {
            // A cap must hold or the start fails: never a command that
            // runs believing it is capped.
            let group = cgroup.as_mut().ok_or_else(|| {
                std::io::Error::other(
                    "the process's cgroup could not be made; its caps cannot hold",
                )
            })?;
            group.set_caps(limits)?;
        }
        let join = match &cgroup {
            Some(g) if caps.is_some() => g.join()?,
            Some(g) => g.join().unwrap_or_default(),
            None => cgroup::Join::default(),
        };
        let started = spawn::start(&plan.exec, &join, plan.confinement.as_ref())?;
        Ok((started, cgroup))
    }
}
