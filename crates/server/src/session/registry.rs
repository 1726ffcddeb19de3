//! The table of sessions: create, resume (attach), detach, expire.

use super::{Session, DETACHED_SESSION_TTL};
use crate::error::{ExecError, ExecResult};
use exec_server_rpc::pending::PendingCalls;
use exec_server_rpc::Outbound;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// All sessions of a server.
pub struct SessionRegistry {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    ttl: Duration,
    /// Set while the server hands over to a new binary: no process starts.
    frozen: Arc<AtomicBool>,
}

impl Default for SessionRegistry {
    fn default() -> Self {
        Self::new(DETACHED_SESSION_TTL)
    }
}

impl SessionRegistry {
    /// A registry whose detached sessions live `ttl`.
    pub fn new(ttl: Duration) -> Self {
        SessionRegistry {
            sessions: Mutex::new(HashMap::new()),
            ttl,
            frozen: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a new session attached to connection `conn` (`calls`: that
    /// connection's table of the server's own calls to the client).
    pub fn create(&self, conn: u64, out: Outbound, calls: PendingCalls) -> Arc<Session> {
        let id = uuid::Uuid::new_v4().to_string();
        let s = Arc::new(Session::new(id.clone(), self.frozen.clone()));
        s.link.attach(conn, out, calls);
        self.lock().insert(id, s.clone());
        s
    }

    /// Attaches connection `conn` to the existing session `id`.
    /// Errors: [`UnknownId`](crate::error::ErrorKind::UnknownId) `unknown session
    /// id <id>`; [`Attached`](crate::error::ErrorKind::SessionAttached) when attached to
    /// another connection.
    pub fn resume(
        &self,
        id: &str,
        conn: u64,
        out: Outbound,
        calls: PendingCalls,
    ) -> ExecResult<Arc<Session>> {
        let sessions = self.lock();
        let Some(s) = sessions.get(id).cloned() else {
            return Err(ExecError::unknown_id(format!("unknown session id {id}")));
        };
        if s.link.attached_to().is_some_and(|c| c != conn) {
            return Err(ExecError::new(
                crate::error::ErrorKind::SessionAttached,
                format!("session {id} is already attached to another connection"),
            ));
        }
        s.generation.fetch_add(1, Ordering::SeqCst);
        s.link.attach(conn, out, calls);
        Ok(s)
    }

    /// Detaches `session` from `conn` (if attached to it) and schedules its expiry.
    pub fn detach(self: &Arc<Self>, session: &Arc<Session>, conn: u64) {
        if !session.link.detach(conn) {
            return;
        }
        // File handles belong to the connection, as in the reference: a client
        // that drops and reconnects in a loop cannot pile up descriptors.
        session.files.clear();
        self.expire_later(session);
    }

    /// Stops every process start, for good (an upgrade: the server
    /// `execve`s next).
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::Release);
    }

    /// A detached session `id` a previous image of this server kept (an
    /// upgrade): it expires a TTL from now unless a client resumes it.
    pub fn adopt(self: &Arc<Self>, id: String) -> Arc<Session> {
        let s = Arc::new(Session::new(id.clone(), self.frozen.clone()));
        self.lock().insert(id, s.clone());
        self.expire_later(&s);
        s
    }

    /// Tears `session` down a TTL from now, unless it is attached again
    /// meanwhile.
    fn expire_later(self: &Arc<Self>, session: &Arc<Session>) {
        let generation = session.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let registry = Arc::downgrade(self);
        let session = session.clone();
        let ttl = self.ttl;
        tokio::spawn(async move {
            tokio::time::sleep(ttl).await;
            let Some(registry) = registry.upgrade() else {
                return;
            };
            let expired = {
                let mut sessions = registry.lock();
                let still_detached = session.generation.load(Ordering::SeqCst) == generation
                    && session.link.attached_to().is_none();
                if still_detached {
                    sessions.remove(&session.id);
                }
                still_detached
            };
            if expired {
                tracing::info!(session = %session.id, "detached session expired");
                session.teardown();
            }
        });
    }

    /// Number of sessions.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Sessions attached to a connection, and detached ones awaiting resume or
    /// expiry: `(attached, detached)`.
    pub fn counts(&self) -> (usize, usize) {
        let sessions = self.lock();
        let attached = sessions
            .values()
            .filter(|s| s.link.attached_to().is_some())
            .count();
        (attached, sessions.len() - attached)
    }

    /// True when there is no session.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The session with this id (attached or detached).
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.lock().get(id).cloned()
    }

    /// Every session (attached or detached), in no particular order.
    pub fn all(&self) -> Vec<Arc<Session>> {
        self.lock().values().cloned().collect()
    }

    /// Tears every session down (server shutdown).
    pub fn shutdown_all(&self) {
        let all: Vec<_> = self.lock().drain().map(|(_, s)| s).collect();
        for s in all {
            s.teardown();
        }
    }
}
