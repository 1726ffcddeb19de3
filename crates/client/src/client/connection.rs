//! The connection: connecting, initializing (pipelined for a fresh
//! session), resuming the session after a drop, and catching every
//! unfinished process stream up from its last released event.

use super::{lock, ConnectionEvent, ExecServerClient, Inner, ProcEntry, RECOVERY_RETRY_INTERVAL};
use crate::error::{ClientError, ConnectionError, ConnectionErrorKind};
use crate::events::{FailureReason, StreamFailure};
use exec_server_protocol::methods as m;
use exec_server_protocol::types::*;
use exec_server_rpc::peer::RpcPeer;
use exec_server_rpc::CallError;
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Most `process/read` pages one catch-up takes: 10 000.
const MAX_CATCH_UP_PAGES: usize = 10_000;
/// A catch-up page with at least this much output may have been cut short
/// (a server's disk-spool pages hold up to 4 MiB): read on. 1 MiB.
const CATCH_UP_MORE_BYTES: usize = 1024 * 1024;
/// How long a catch-up's `process/read` (which waits for nothing) may go
/// unanswered before the stream fails: 60 s.
const CATCH_UP_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// Reads one gap in the pushed events may take while each still moves the
/// stream on: 8.
const MAX_GAP_READS: usize = 8;

/// Reads process `id` from its last released seq (`process/read`s that wait
/// for nothing) until the server has nothing older to give: a page served from
/// a disk spool may end early, and the server pushes only what is new. Waits
/// for room in the consumer's queue between pages.
///
/// A process the server does not know fails its stream only if its start
/// was confirmed before the read was sent; either way the answer is
/// [`CatchUp::Unknown`].
pub(super) async fn catch_up(inner: &Arc<Inner>, peer: &RpcPeer, id: &str) -> CatchUp {
    let _counted = match lock(&inner.procs).get_mut(id) {
        Some(e) => CatchingUp::count(inner, id, e),
        None => return CatchUp::Done,
    };
    read_pages(inner, peer, id).await
}

/// A pushed event of process `id` (whose entry is `entry`) left a gap: the
/// event before it was not pushed on this connection (a server that
/// dropped it). Unless a catch-up of that process is already under way,
/// reads from the last released event on a task of its own, so the stream
/// goes on (or fails, when the server no longer holds the event) instead
/// of waiting for ever.
pub(super) fn fill_gap(inner: &Arc<Inner>, peer: &RpcPeer, id: &str, entry: &mut ProcEntry) {
    if entry.catching_up > 0 || entry.events.first_held().is_none() {
        return;
    }
    tracing::warn!(
        process_id = id,
        after_seq = entry.events.last_published(),
        "an event of the process was not pushed; reading it"
    );
    let counted = CatchingUp::count(inner, id, entry);
    let (inner, peer, id) = (inner.clone(), peer.clone(), id.to_string());
    tokio::spawn(async move {
        for _ in 0..MAX_GAP_READS {
            let before = match lock(&inner.procs).get(&id) {
                Some(e) => e.events.last_published(),
                None => break,
            };
            if read_pages(&inner, &peer, &id).await != CatchUp::Done {
                break;
            }
            let mut procs = lock(&inner.procs);
            let Some(e) = procs.get_mut(&id) else { break };
            let Some(held) = e.events.first_held() else {
                break;
            };
            if e.events.last_published() == before {
                // The server's own read ends before what it pushed.
                e.events.fail(StreamFailure::new(
                    FailureReason::Protocol,
                    format!(
                        "the server pushed seq {held}, but its process/read ends before seq {}",
                        before + 1
                    ),
                ));
                break;
            }
        }
        drop(counted);
    });
}

/// A catch-up of one process under way, counted in its entry
/// ([`ProcEntry::catching_up`]) while this lives.
pub(super) struct CatchingUp {
    inner: Arc<Inner>,
    id: String,
}

impl CatchingUp {
    fn count(inner: &Arc<Inner>, id: &str, entry: &mut ProcEntry) -> CatchingUp {
        entry.catching_up += 1;
        CatchingUp {
            inner: inner.clone(),
            id: id.to_string(),
        }
    }
}

impl Drop for CatchingUp {
    fn drop(&mut self) {
        if let Some(e) = lock(&self.inner.procs).get_mut(&self.id) {
            e.catching_up = e.catching_up.saturating_sub(1);
        }
    }
}

/// [`catch_up`]'s pages.
async fn read_pages(inner: &Inner, peer: &RpcPeer, id: &str) -> CatchUp {
    for _ in 0..MAX_CATCH_UP_PAGES {
        let (after, room) = match lock(&inner.procs).get(id) {
            Some(e) if !e.events.is_finished() => (e.events.last_published(), e.events.room()),
            _ => return CatchUp::Done,
        };
        room.wait().await;
        // Whether the server had taken the start before it is asked: only
        // then does "unknown process" mean the process is lost. A start
        // answered while the read is on its way was taken after the read
        // (one connection answers in order), and CI saw such a start's
        // stream failed by the read's "unknown process".
        let confirmed_before = match lock(&inner.procs).get(id) {
            Some(e) => e.confirmed,
            None => return CatchUp::Done,
        };
        let params = ReadParams {
            process_id: id.to_string(),
            after_seq: Some(after),
            max_bytes: None,
            wait_ms: Some(0),
        };
        let r = peer
            .call(
                m::PROCESS_READ,
                serde_json::to_value(&params).unwrap_or_default(),
                Some(CATCH_UP_READ_TIMEOUT),
            )
            .await;
        let mut procs = lock(&inner.procs);
        let Some(e) = procs.get_mut(id) else {
            return CatchUp::Done;
        };
        let page = match r.map(serde_json::from_value::<ReadResponse>) {
            Ok(Ok(page)) => page,
            Ok(Err(err)) => {
                e.events.fail(StreamFailure::new(
                    FailureReason::Protocol,
                    format!("bad process/read reply: {err}"),
                ));
                return CatchUp::Done;
            }
            Err(CallError::Server(err)) => {
                if confirmed_before {
                    e.events.fail(StreamFailure::new(
                        FailureReason::RecoveryFailed,
                        format!("process lost while recovering: {}", err.message),
                    ));
                }
                return CatchUp::Unknown;
            }
            Err(CallError::TimedOut) => {
                e.events.fail(StreamFailure::new(
                    FailureReason::RecoveryFailed,
                    format!(
                        "the server did not answer process/read within {} s",
                        CATCH_UP_READ_TIMEOUT.as_secs()
                    ),
                ));
                return CatchUp::Done;
            }
            // The connection dropped again: the next recovery goes on.
            Err(_) => return CatchUp::ConnectionLost,
        };
        e.confirmed = true;
        let bytes: usize = page.chunks.iter().map(|c| c.chunk.0.len()).sum();
        let maybe_more = !page.closed
            && bytes >= CATCH_UP_MORE_BYTES
            && page
                .chunks
                .last()
                .is_some_and(|c| c.seq + 1 == page.next_seq);
        e.events.recover(page);
        if !maybe_more || e.events.is_finished() {
            return CatchUp::Done;
        }
    }
    CatchUp::Done
}

/// How a [`catch_up`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CatchUp {
    /// The server gave everything it had (or the stream had ended).
    Done,
    /// The server does not know the process.
    Unknown,
    /// The connection failed; the next recovery reads on.
    ConnectionLost,
}

impl ExecServerClient {
    /// The connection, perhaps with its `initialize` still unanswered (a
    /// fresh session): requests sent on it follow `initialize` in order.
    pub(super) async fn peer_early(&self) -> Result<RpcPeer, ClientError> {
        let mut slot = self.inner.slot.lock().await;
        if let Some(p) = &slot.peer {
            if !p.is_closed() {
                return Ok(p.clone());
            }
        }
        if let Some(f) = &slot.failed {
            return Err(ClientError::Connection(f.clone()));
        }
        // A pipelined `initialize` on the connection that ended may have
        // been answered, its answer not yet taken: its outcome (a session
        // to resume, or none) decides, or a start cut off by the drop would
        // go again in a new session while the first may run in the old.
        let _ = self.initialized().await;
        let resume = self.session_id();
        if resume.is_some() && !self.inner.opts.source.is_reconnectable() {
            let why = ConnectionError::new(
                ConnectionErrorKind::Closed,
                "connection to a stdio program ended; it cannot be resumed",
            )
            .session_lost();
            slot.failed = Some(why.clone());
            self.fail_all(&why.to_string());
            self.announce(ConnectionEvent::RecoveryFailed(why.clone()));
            return Err(ClientError::Connection(why));
        }
        if resume.is_some() {
            tracing::warn!(
                "connection to {:?} lost; resuming the session",
                self.inner.opts.source
            );
            self.announce(ConnectionEvent::Lost);
        }
        // Counted before the new connection can push anything: a push that
        // comes before the replay's read shows a gap the replay fills.
        let counted = match resume {
            Some(_) => self.count_unfinished(),
            None => Vec::new(),
        };
        let deadline = tokio::time::Instant::now() + self.inner.opts.recovery_timeout;
        loop {
            match self.connect_once(resume.clone()).await {
                Ok(peer) => {
                    slot.peer = Some(peer.clone());
                    if resume.is_some() {
                        self.inner.recoveries.fetch_add(1, Ordering::Relaxed);
                        // Catch-up runs beside other calls, not under the
                        // slot's lock: it waits for room in each process's
                        // event queue, and the consumer that would make room
                        // may itself be waiting on a call (a deadlock when
                        // it held the lock).
                        let (client, peer) = (self.clone(), peer.clone());
                        tokio::spawn(async move {
                            client.replay(&peer, counted).await;
                            client.watches_recovered();
                            client.announce(ConnectionEvent::Recovered {
                                session_id: client.session_id().unwrap_or_default(),
                            });
                        });
                    }
                    return Ok(peer);
                }
                Err((why, retryable)) => {
                    if resume.is_none() {
                        return Err(why);
                    }
                    if !retryable || tokio::time::Instant::now() >= deadline {
                        let why = ConnectionError::unrecoverable(why);
                        slot.failed = Some(why.clone());
                        self.fail_all(&why.to_string());
                        self.announce(ConnectionEvent::RecoveryFailed(why.clone()));
                        return Err(ClientError::Connection(why));
                    }
                    tokio::time::sleep(RECOVERY_RETRY_INTERVAL).await;
                }
            }
        }
    }

    pub(super) fn fail_all(&self, why: &str) {
        for e in lock(&self.inner.procs).values_mut() {
            e.events
                .fail(StreamFailure::new(FailureReason::RecoveryFailed, why));
        }
        lock(&self.inner.http_streams).clear();
        self.watches_failed(why);
    }

    /// One attempt: connect and initialize (resuming `resume`). The flag says
    /// whether another attempt may succeed.
    async fn connect_once(&self, resume: Option<String>) -> Result<RpcPeer, (ClientError, bool)> {
        let opts = &self.inner.opts;
        let conn = opts
            .source
            .connect(opts.connect_timeout)
            .await
            .map_err(|e| (ClientError::Connection(e), true))?;
        let (peer, incoming) = RpcPeer::start(conn);
        tokio::spawn(super::incoming::dispatch(
            Arc::downgrade(&self.inner),
            peer.clone(),
            incoming,
        ));
        // Binary frames are announced only where the transport carries them.
        let extensions = peer.binary_capable().then_some(ClientExtensions {
            binary_frames: Some(exec_server_protocol::binary::VERSION),
        });
        let params = InitializeParams {
            client_name: opts.client_name.clone(),
            resume_session_id: resume.clone(),
            extensions,
        };
        let value = serde_json::to_value(&params).unwrap_or_default();
        let call = peer
            .send_call(m::INITIALIZE, value)
            .await
            .map_err(|e| (ClientError::from_call(e), true))?;
        let timeout = Some(opts.connect_timeout);
        if resume.is_some() {
            // A resume must be accepted before anything is replayed on it.
            self.apply_init(&peer, call.wait(timeout).await)?;
            peer.notify(m::INITIALIZED, Value::Null)
                .await
                .map_err(|e| (ClientError::from_call(e), true))?;
            return Ok(peer);
        }
        // A fresh session: `initialized` and the first requests go right
        // behind `initialize` (servers, the reference's too, take a
        // connection's messages in order), which saves a round trip on
        // every new connection: through a relay at 25 ms one way, 100 ms.
        peer.notify(m::INITIALIZED, Value::Null)
            .await
            .map_err(|e| (ClientError::from_call(e), true))?;
        let (tx, rx) = tokio::sync::watch::channel(None);
        *lock(&self.inner.init) = Some(rx);
        let (client, early) = (self.clone(), peer.clone());
        tokio::spawn(async move {
            let outcome = client
                .apply_init(&early, call.wait(timeout).await)
                .map_err(|(e, _)| e);
            if outcome.is_err() {
                early.close();
            }
            tx.send_replace(Some(outcome));
        });
        Ok(peer)
    }

    /// Takes `initialize`'s answer: the session id, the environment's
    /// information, binary frames when agreed. The flag says whether another
    /// attempt may succeed.
    fn apply_init(
        &self,
        peer: &RpcPeer,
        answer: Result<Value, CallError>,
    ) -> Result<(), (ClientError, bool)> {
        let init = answer.map_err(|e| {
            let retryable = match &e {
                CallError::Server(err) => {
                    err.code == exec_server_protocol::error::SESSION_ALREADY_ATTACHED
                }
                _ => true,
            };
            (ClientError::from_call(e), retryable)
        })?;
        let init: InitializeResponse = serde_json::from_value(init)
            .map_err(|e| (ClientError::protocol(m::INITIALIZE, e), false))?;
        if init
            .binary_frames
            .is_some_and(|v| v == exec_server_protocol::binary::VERSION)
        {
            peer.enable_binary();
        }
        *lock(&self.inner.session_id) = Some(init.session_id);
        if let Some(info) = init.environment_info {
            *lock(&self.inner.env_info) = Some(info);
        }
        Ok(())
    }

    /// Each unfinished process, counted as catching up.
    fn count_unfinished(&self) -> Vec<CatchingUp> {
        lock(&self.inner.procs)
            .iter_mut()
            .filter(|(_, e)| !e.events.is_finished())
            .map(|(id, e)| CatchingUp::count(&self.inner, id, e))
            .collect()
    }

    /// After a resume, reads each process `counted` from its last released
    /// seq.
    async fn replay(&self, peer: &RpcPeer, counted: Vec<CatchingUp>) {
        for c in counted {
            read_pages(&self.inner, peer, &c.id).await;
        }
    }
}
