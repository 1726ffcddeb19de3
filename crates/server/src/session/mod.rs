//! Sessions: what survives a dropped connection.
//!
//! A session owns its process table, its open file handles and its watches. A
//! connection attaches to one session at a time through the session's [`Link`];
//! when the connection ends the session is detached (processes keep running and
//! their output is kept) and is torn down [`DETACHED_SESSION_TTL`] later unless a
//! client resumes it first.

pub mod registry;

use crate::fs::handles::HandleTable;
use crate::process::Process;
use exec_server_rpc::Outbound;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub use registry::SessionRegistry;

/// How long a detached session (and its processes) is kept: 30 s, as in the reference.
pub const DETACHED_SESSION_TTL: Duration = Duration::from_secs(30);

/// Most processes one session may hold (live or retained): 1024.
pub const MAX_PROCESSES_PER_SESSION: usize = 1024;

/// The attachment of a session to a connection.
#[derive(Default)]
pub struct Link {
    current: Mutex<Option<(u64, Outbound)>>,
}

impl Link {
    fn lock(&self) -> MutexGuard<'_, Option<(u64, Outbound)>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The attached connection's sending handle, if attached and alive.
    pub fn outbound(&self) -> Option<Outbound> {
        self.lock()
            .as_ref()
            .filter(|(_, o)| !o.is_closed())
            .map(|(_, o)| o.clone())
    }

    /// The id of the attached live connection.
    pub fn attached_to(&self) -> Option<u64> {
        self.lock()
            .as_ref()
            .filter(|(_, o)| !o.is_closed())
            .map(|(id, _)| *id)
    }

    fn attach(&self, conn: u64, out: Outbound) {
        *self.lock() = Some((conn, out));
    }

    /// Detaches if `conn` is the attached connection; true if it was.
    fn detach(&self, conn: u64) -> bool {
        let mut cur = self.lock();
        if cur.as_ref().is_some_and(|(id, _)| *id == conn) {
            *cur = None;
            return true;
        }
        false
    }
}

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
    /// Cgroups of retired processes that still hold live descendants
    /// (double-forked daemons): killed when the session ends.
    leftovers: Mutex<Vec<crate::process::cgroup::ProcessCgroup>>,
    /// Bumped on every attach, so a stale expiry timer does nothing.
    pub(crate) generation: AtomicU64,
}

impl Session {
    pub(crate) fn new(id: String) -> Self {
        Session {
            id,
            link: Arc::new(Link::default()),
            processes: Mutex::new(HashMap::new()),
            files: HandleTable::default(),
            watches: Default::default(),
            leftovers: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
        }
    }

    fn procs(&self) -> MutexGuard<'_, HashMap<String, Arc<Process>>> {
        self.processes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The process with this id.
    pub fn process(&self, id: &str) -> Option<Arc<Process>> {
        self.procs().get(id).cloned()
    }

    /// Number of processes in the table.
    pub fn process_count(&self) -> usize {
        self.procs().len()
    }

    /// Runs `insert` while holding the table lock if `id` is free; `insert` starts
    /// the process. Errors: `Ok(None)` from `insert` is not allowed.
    pub fn insert_process_with<E>(
        &self,
        id: &str,
        insert: impl FnOnce() -> Result<Arc<Process>, E>,
    ) -> Result<Result<Arc<Process>, E>, InsertError> {
        let mut procs = self.procs();
        if procs.contains_key(id) {
            return Err(InsertError::Exists);
        }
        if procs.len() >= MAX_PROCESSES_PER_SESSION {
            return Err(InsertError::Full);
        }
        let r = insert();
        if let Ok(p) = &r {
            procs.insert(id.to_string(), p.clone());
        }
        Ok(r)
    }

    /// Removes `proc` from the table if it is still the one under its id.
    pub fn retire(&self, proc: &Arc<Process>) {
        let mut procs = self.procs();
        if procs.get(&proc.id).is_some_and(|p| Arc::ptr_eq(p, proc)) {
            procs.remove(&proc.id);
        }
        drop(procs);
        if let Some(group) = proc.take_leftovers() {
            self.leftovers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(group);
        }
    }

    /// Kills every process tree and closes every handle (session end).
    pub fn teardown(&self) {
        let procs: Vec<_> = self.procs().drain().map(|(_, p)| p).collect();
        for p in procs {
            p.terminate();
        }
        let leftovers =
            std::mem::take(&mut *self.leftovers.lock().unwrap_or_else(|p| p.into_inner()));
        for group in leftovers {
            group.kill();
        }
        self.files.clear();
        self.watches.clear();
    }
}

/// Why a process could not be added.
#[derive(Debug, PartialEq, Eq)]
pub enum InsertError {
    /// The id is taken in this session.
    Exists,
    /// [`MAX_PROCESSES_PER_SESSION`] reached.
    Full,
}
