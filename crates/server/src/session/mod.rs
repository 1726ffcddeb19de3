//! Sessions: what survives a dropped connection.
//!
//! A session owns its process table, its open file handles and its watches. A
//! connection attaches to one session at a time through the session's [`Link`];
//! when the connection ends the session is detached (processes keep running and
//! their output is kept) and is torn down [`DETACHED_SESSION_TTL`] later unless a
//! client resumes it first.

pub mod registry;

use crate::error::{ExecError, ExecResult};
use crate::fs::handles::HandleTable;
use crate::process::Process;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub use crate::link::Link;
pub use registry::SessionRegistry;

/// How long a detached session (and its processes) is kept: 30 s, as in the reference.
pub const DETACHED_SESSION_TTL: Duration = Duration::from_secs(30);

/// Most records one session's process table holds: 1024. A start that finds
/// it full retires closed records to make room (fully read ones first, then
/// the oldest), and is refused only when every record is a running process.
pub const MAX_PROCESSES_PER_SESSION: usize = 1024;

/// A session.
pub struct Session {
    /// UUID v4.
    pub id: String,
    /// Current attachment.
    pub link: Arc<Link>,
    processes: Mutex<HashMap<String, Arc<Process>>>,
    /// Open `fs/open` handles.
    pub files: HandleTable,
    /// `fs/watch` watches.
    pub watches: crate::fs::watch::WatchTable,
    /// `fs/watchMissing` watches.
    pub missing_watches: crate::fs::watch::missing::MissingWatchTable,
    /// `shellSnapshot` captures, per scope.
    pub shell_snapshots: crate::process::snapshot::ShellSnapshots,
    /// Cgroups of retired processes that still hold live descendants
    /// (double-forked daemons): killed when the session ends.
    leftovers: Mutex<Vec<Arc<crate::process::cgroup::ProcessCgroup>>>,
    /// Bumped on every attach, so a stale expiry timer does nothing.
    pub(crate) generation: AtomicU64,
    /// Set by [`Session::teardown`] under the process table's lock: no
    /// process is started after it.
    ended: AtomicBool,
    /// Its processes that have not exited (`--max-session-processes`).
    pub(crate) live: crate::process::live::LiveCount,
    /// What its processes hold in the output spool
    /// (`--output-spool-session-bytes`).
    pub(crate) spool_share: Arc<crate::process::spool::SessionShare>,
    /// The server's: set while it hands over to a new binary, when no
    /// process may start.
    frozen: Arc<AtomicBool>,
}

impl Session {
    pub(crate) fn new(id: String, frozen: Arc<AtomicBool>) -> Self {
        Session {
            id,
            link: Arc::new(Link::default()),
            processes: Mutex::new(HashMap::new()),
            files: HandleTable::default(),
            watches: Default::default(),
            missing_watches: Default::default(),
            shell_snapshots: Default::default(),
            leftovers: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
            ended: AtomicBool::new(false),
            live: Default::default(),
            spool_share: Default::default(),
            frozen,
        }
    }

    fn procs(&self) -> MutexGuard<'_, HashMap<String, Arc<Process>>> {
        self.processes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The process with this id.
    pub fn process(&self, id: &str) -> Option<Arc<Process>> {
        self.procs().get(id).cloned()
    }

    /// Every process the session holds, oldest first.
    pub fn processes(&self) -> Vec<Arc<Process>> {
        let mut all: Vec<Arc<Process>> = self.procs().values().cloned().collect();
        all.sort_by_key(|p| p.started);
        all
    }

    /// Runs `start` while holding the table lock if `id` is free, and keeps the
    /// process it starts under `id`. Errors: `process <id> already exists`
    /// ([`AlreadyExists`](crate::error::ErrorKind::AlreadyExists)); the table holds
    /// [`MAX_PROCESSES_PER_SESSION`] processes that are all still running or
    /// draining ([`LimitReached`](crate::error::ErrorKind::LimitReached)); `start`'s OS error
    /// (see [`classify`](crate::process::spawn_error::classify)).
    pub fn insert_process_with(
        &self,
        id: &str,
        start: impl FnOnce() -> std::io::Result<Arc<Process>>,
    ) -> ExecResult<Arc<Process>> {
        let mut procs = self.procs();
        if self.ended.load(Ordering::Acquire) {
            // Torn down (expired, or the server is stopping) while this start
            // was on its way: a process started now would outlive its session.
            return Err(ExecError::failed("the session has ended"));
        }
        if self.frozen.load(Ordering::Acquire) {
            return Err(ExecError::new(
                crate::error::ErrorKind::Upgrading,
                "the server is being upgraded: the process was not started; resume the session \
                 and start it again",
            ));
        }
        if procs.contains_key(id) {
            return Err(ExecError::already_exists(format!(
                "process {id} already exists"
            )));
        }
        let retired = if procs.len() >= MAX_PROCESSES_PER_SESSION {
            let Some(old) = make_room(&mut procs) else {
                return Err(ExecError::limit_reached(format!(
                    "too many running processes in this session (limit {MAX_PROCESSES_PER_SESSION})"
                )));
            };
            Some(old)
        } else {
            None
        };
        let p = start().map_err(crate::process::spawn_error::classify)?;
        procs.insert(id.to_string(), p.clone());
        drop(procs);
        if let Some(old) = retired {
            old.discard();
            self.keep_leftovers(&old);
        }
        Ok(p)
    }

    /// Removes `proc` from the table if it is still the one under its id.
    pub fn retire(&self, proc: &Arc<Process>) {
        let mut procs = self.procs();
        if procs.get(&proc.id).is_some_and(|p| Arc::ptr_eq(p, proc)) {
            procs.remove(&proc.id);
        }
        drop(procs);
        self.keep_leftovers(proc);
    }

    /// Keeps the cgroup of a retired process that still holds live
    /// descendants, to kill them when the session ends.
    fn keep_leftovers(&self, proc: &Process) {
        if let Some(group) = proc.take_leftovers() {
            self.leftovers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(group);
        }
    }

    /// Puts `proc`, adopted from a previous image of the server, in the
    /// table (an upgrade).
    pub fn adopt_process(&self, proc: Arc<Process>) {
        self.procs().insert(proc.id.clone(), proc);
    }

    /// The cgroups of retired processes whose daemons still live, for the
    /// next image of the server.
    pub fn leftovers(&self) -> Vec<Arc<crate::process::cgroup::ProcessCgroup>> {
        self.leftovers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Keeps `group`, a leftover cgroup from a previous image.
    pub fn adopt_leftover(&self, group: crate::process::cgroup::ProcessCgroup) {
        self.leftovers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::new(group));
    }

    /// Kills every process tree and closes every handle (session end).
    pub fn teardown(&self) {
        let procs: Vec<_> = {
            let mut table = self.procs();
            self.ended.store(true, Ordering::Release);
            table.drain().map(|(_, p)| p).collect()
        };
        for p in procs {
            p.terminate();
            p.discard();
        }
        let leftovers =
            std::mem::take(&mut *self.leftovers.lock().unwrap_or_else(|p| p.into_inner()));
        for group in leftovers {
            group.kill();
        }
        self.files.clear();
        self.watches.clear();
        self.missing_watches.clear();
    }
}

/// Takes out the closed record to retire first (fully read before not, then
/// the oldest); `None` if every record is still running or draining.
fn make_room(procs: &mut HashMap<String, Arc<Process>>) -> Option<Arc<Process>> {
    let victim = procs
        .iter()
        .filter(|(_, p)| p.is_closed())
        .min_by_key(|(_, p)| (!p.is_fully_read(), p.started))
        .map(|(id, _)| id.clone())?;
    procs.remove(&victim)
}
