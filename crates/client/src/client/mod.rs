//! The client: lazy connect, typed calls, per-process ordered event streams, and
//! session recovery after a dropped connection.

mod connection;
mod files;
mod incoming;
mod process;
mod watch;

pub use process::{Output, ProcessHandle, TerminateOutcome};
pub use watch::{Watch, WatchEvent};

use crate::connect::Source;
pub use crate::error::ClientError;
use crate::error::{ConnectionError, ConnectionErrorKind};
use crate::events::OrderedEvents;
use exec_server_protocol::methods as m;
use exec_server_protocol::types::*;
use exec_server_rpc::peer::RpcPeer;
use exec_server_rpc::CallError;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::mpsc;

/// How long the client keeps trying to resume its session after the connection
/// drops: 25 s, inside the server's 30 s detached-session lifetime.
pub const SESSION_RECOVERY_TIMEOUT: Duration = Duration::from_secs(25);
/// Pause between resume attempts: 100 ms.
pub const RECOVERY_RETRY_INTERVAL: Duration = Duration::from_millis(100);
/// Output bytes a [`ProcessHandle`] hands over between two `process/ack`
/// calls: 1 MiB.
pub const ACK_EVERY_BYTES: usize = 1024 * 1024;
/// The output window a client over a relay asks for: 32 MiB (the most a
/// server grants). Through a relay a stream's bytes wait in two sockets and
/// the node's queue besides the client's; with the direct path's 8 MiB the
/// executor paused for acknowledgements that were on their way (2 GiB
/// through the relay on two cores: 0.69-0.71 of the direct rate at 8 MiB,
/// 0.73-0.76 at 32 MiB; BENCHMARKS.md).
pub const RELAY_OUTPUT_WINDOW_BYTES: u64 = 32 * 1024 * 1024;
/// Output chunks a [`ProcessHandle`] hands over between two `process/ack`
/// calls: 4096. Why: the server's window counts chunks as well as bytes
/// (49 999 undelivered chunks, 8 MiB), and a terminal sends one chunk per
/// line, so 50 000 short lines fill it long before 1 MiB of bytes.
pub const ACK_EVERY_CHUNKS: usize = 4096;
/// How often a call cut off by a dropped connection goes again on the
/// resumed session (calls safe to repeat, and `process/start`, whose
/// repeat checks whether the first one started the process): 5. A link
/// that drops again while the session is being resumed costs one each.
pub(crate) const RETRIES_AFTER_DROP: u32 = 5;
/// How often a request the server answered `upgrading` (it hands over to
/// a new binary and did nothing) is sent again: 100 times, every 50 ms
/// (the handover takes milliseconds; a refused one, up to 20 s).
const UPGRADE_RETRIES: u32 = 100;
/// The pause before each of those.
const UPGRADE_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// True when the server answered `upgrading`: it hands over to a new binary
/// and did nothing, so the same request (the same writeId) may go again,
/// whatever the method; the old image's connection ends within
/// milliseconds and the request then reaches the new one.
fn upgrading(e: &CallError) -> bool {
    use exec_server_protocol::error::ErrorKind;
    matches!(e, CallError::Server(o) if ErrorKind::of(o) == Some(ErrorKind::Upgrading))
}

/// Client settings.
#[derive(Clone)]
pub struct ClientOptions {
    /// Where to connect.
    pub source: Source,
    /// Sent as `clientName`.
    pub client_name: String,
    /// Limit for one connection attempt.
    pub connect_timeout: Duration,
    /// Limit for one call (`None`: no limit).
    pub call_timeout: Option<Duration>,
    /// How long to try resuming after a drop.
    pub recovery_timeout: Duration,
    /// Answers the server's `network/policyRequest`s (processes started with
    /// a `networkProxy`); `None` refuses them (-32601), which the server
    /// takes as a deny.
    pub network_policy: Option<crate::network::SharedNetworkPolicy>,
    /// Sent as `outputWindowBytes` with every `ackOutput` start that does
    /// not set its own: the unacknowledged output (bytes) at which the
    /// server pauses the process. `None` leaves the server's (8 MiB). By
    /// default [`RELAY_OUTPUT_WINDOW_BYTES`] for a relay source, whose path
    /// holds more in flight than a direct one, and `None` otherwise.
    pub output_window_bytes: Option<u64>,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("source", &self.source)
            .field("client_name", &self.client_name)
            .field("connect_timeout", &self.connect_timeout)
            .field("call_timeout", &self.call_timeout)
            .field("recovery_timeout", &self.recovery_timeout)
            .field("network_policy", &self.network_policy.is_some())
            .finish()
    }
}

impl ClientOptions {
    /// Defaults for `source`: 10 s connect timeout, no call timeout, 25 s recovery.
    pub fn new(source: Source) -> Self {
        ClientOptions {
            client_name: "exec-server-client".into(),
            connect_timeout: Duration::from_secs(10),
            call_timeout: None,
            recovery_timeout: SESSION_RECOVERY_TIMEOUT,
            network_policy: None,
            output_window_bytes: relay_window(&source),
            source,
        }
    }
}

/// [`ClientOptions::output_window_bytes`]'s default for `source`.
fn relay_window(source: &Source) -> Option<u64> {
    match source {
        #[cfg(feature = "relay")]
        Source::Relay(_) => Some(RELAY_OUTPUT_WINDOW_BYTES),
        _ => None,
    }
}

/// A change of the client's connection ([`ExecServerClient::connection_events`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ConnectionEvent {
    /// The connection ended with work outstanding; resuming the session.
    Lost,
    /// The session was resumed on a new connection; process streams go on.
    Recovered {
        /// The session id (unchanged).
        session_id: String,
    },
    /// The session could not be resumed; open process streams failed with
    /// [`FailureReason::RecoveryFailed`](crate::FailureReason::RecoveryFailed).
    RecoveryFailed(ConnectionError),
}

/// Connection events kept for a slow [`ExecServerClient::connection_events`]
/// reader before the oldest are dropped: 64.
const CONNECTION_EVENT_BACKLOG: usize = 64;

/// How long [`ExecServerClient::close`] waits for the connection's close
/// frame to be written: a socket that takes nothing for that long is
/// dropped without one.
const CLOSE_FLUSH: Duration = Duration::from_millis(500);

struct ProcEntry {
    events: OrderedEvents,
    /// The server said it started the process (its `process/start` was
    /// answered, or a `process/read` found it). Until then a recovery's
    /// catch-up that finds no such process leaves the stream alone: the
    /// start may not have reached the server yet, and its own outcome
    /// (or retry) decides.
    confirmed: bool,
    /// Catch-ups of this process under way ([`connection::CatchingUp`]): a
    /// gap in its pushed events waits for them instead of starting another.
    catching_up: u32,
}

#[derive(Default)]
struct Slot {
    peer: Option<RpcPeer>,
    failed: Option<ConnectionError>,
}

struct Inner {
    opts: ClientOptions,
    slot: tokio::sync::Mutex<Slot>,
    session_id: Mutex<Option<String>>,
    env_info: Mutex<Option<EnvironmentInfo>>,
    /// The outcome of a fresh session's `initialize`, sent without waiting
    /// for its answer (`None` inside until it comes); see [`Self::initialized`].
    init: Mutex<Option<InitOutcome>>,
    procs: Mutex<HashMap<String, ProcEntry>>,
    http_streams: Mutex<HashMap<String, mpsc::UnboundedSender<HttpBodyDelta>>>,
    watches: Mutex<HashMap<String, watch::WatchEntry>>,
    closed: AtomicBool,
    next_write: AtomicU64,
    next_process: AtomicU64,
    write_prefix: String,
    recoveries: AtomicU64,
    /// Notifications from the server that did not decode (see
    /// `incoming::well_formed`).
    malformed: std::sync::atomic::AtomicU32,
    conn_events: tokio::sync::broadcast::Sender<ConnectionEvent>,
    /// Tells the recovery task that a connection ended with work outstanding.
    lost: mpsc::UnboundedSender<()>,
}

/// A pipelined `initialize`'s outcome, once it is known.
type InitOutcome = tokio::sync::watch::Receiver<Option<Result<(), ClientError>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A client of one exec-server session. Cheap to clone; connects on first use.
#[derive(Clone)]
pub struct ExecServerClient {
    inner: Arc<Inner>,
}

impl ExecServerClient {
    /// A client for `opts`; nothing happens until the first call.
    pub fn new(opts: ClientOptions) -> Self {
        // Every request names the caller's current span (W3C trace context)
        // when the program records spans with OpenTelemetry; else nothing.
        // Once per process: later clients find it set.
        exec_server_rpc::peer::set_trace_source(exec_server_telemetry::current_trace);
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let (lost, mut lost_rx) = mpsc::unbounded_channel();
        let client = ExecServerClient {
            inner: Arc::new(Inner {
                opts,
                slot: tokio::sync::Mutex::new(Slot::default()),
                session_id: Mutex::new(None),
                env_info: Mutex::new(None),
                init: Mutex::new(None),
                procs: Mutex::new(HashMap::new()),
                http_streams: Mutex::new(HashMap::new()),
                watches: Mutex::new(HashMap::new()),
                closed: AtomicBool::new(false),
                next_write: AtomicU64::new(1),
                next_process: AtomicU64::new(1),
                write_prefix: format!("w{:x}{:x}", std::process::id(), n),
                recoveries: AtomicU64::new(0),
                malformed: Default::default(),
                conn_events: tokio::sync::broadcast::channel(CONNECTION_EVENT_BACKLOG).0,
                lost,
            }),
        };
        // Recovery runs in its own task, started here rather than from inside a
        // connection, so that process streams resume even when no call is made.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let weak = Arc::downgrade(&client.inner);
            rt.spawn(async move {
                while lost_rx.recv().await.is_some() {
                    let Some(inner) = weak.upgrade() else { return };
                    let _ = ExecServerClient { inner }.peer().await;
                }
            });
        }
        client
    }

    /// A process id unique to this client (`<client prefix>-p<n>`), for a
    /// [`Command`](crate::Command) given none.
    pub fn next_process_id(&self) -> String {
        let n = self.inner.next_process.fetch_add(1, Ordering::Relaxed);
        format!("{}-p{n}", self.inner.write_prefix)
    }

    /// Connects now (otherwise the first call does).
    pub async fn connect(&self) -> Result<(), ClientError> {
        self.peer().await.map(|_| ())
    }

    /// The session id, once connected.
    pub fn session_id(&self) -> Option<String> {
        lock(&self.inner.session_id).clone()
    }

    /// Whether the current connection carries binary frames: bytes travel
    /// raw instead of as base64 (both ends are ours and agreed in
    /// `initialize`; over WebSocket and relay streams). False while not
    /// connected.
    pub async fn binary_frames(&self) -> bool {
        let _ = self.initialized().await;
        let slot = self.inner.slot.lock().await;
        slot.peer
            .as_ref()
            .is_some_and(|p| !p.is_closed() && p.binary_frames())
    }

    /// How many times the session was resumed after a drop.
    pub fn recoveries(&self) -> u64 {
        self.inner.recoveries.load(Ordering::Relaxed)
    }

    /// Losses and recoveries of the connection from now on (a
    /// [`broadcast`](tokio::sync::broadcast) receiver: a reader more than 64
    /// events behind gets `Lagged`).
    pub fn connection_events(&self) -> tokio::sync::broadcast::Receiver<ConnectionEvent> {
        self.inner.conn_events.subscribe()
    }

    fn announce(&self, ev: ConnectionEvent) {
        let _ = self.inner.conn_events.send(ev);
    }

    /// Closes the connection for good (the server keeps the session for its
    /// TTL): on a WebSocket with a close frame (1000), waiting at most
    /// 500 ms for it to be written.
    pub async fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        let peer = {
            let mut slot = self.inner.slot.lock().await;
            slot.failed = Some(ConnectionError::new(
                ConnectionErrorKind::Closed,
                "client closed",
            ));
            slot.peer.take()
        };
        // Closed, not only let go: the connection's reader holds the peer
        // too, and would keep the socket (and the server's attachment of
        // the session) open until the server ended it. Flushed, so that a
        // program exiting next still says goodbye with a close frame.
        if let Some(p) = peer {
            p.close_and_flush(CLOSE_FLUSH).await;
        }
    }

    /// Drops the current connection without closing the client, as a network
    /// failure would; the client then recovers the session. For tests and chaos.
    pub async fn drop_connection(&self) {
        // Connect (or finish resuming) first, so every call drops a live connection.
        let _ = self.peer().await;
        let mut slot = self.inner.slot.lock().await;
        if let Some(p) = slot.peer.take() {
            p.close();
        }
    }

    fn supports(&self, capability: &str) -> bool {
        lock(&self.inner.env_info)
            .as_ref()
            .and_then(|i| i.capabilities.get(capability).copied())
            .unwrap_or(false)
    }

    /// The server's environment info (from `initialize`, else `environment/info`).
    pub async fn environment_info(&self) -> Result<EnvironmentInfo, ClientError> {
        self.peer().await?;
        if let Some(i) = lock(&self.inner.env_info).clone() {
            return Ok(i);
        }
        self.call(m::ENVIRONMENT_INFO, &(), true).await
    }

    /// The connection, initialized: every call but a fresh session's first
    /// `process/start` waits for `initialize`'s answer here.
    async fn peer(&self) -> Result<RpcPeer, ClientError> {
        let peer = self.peer_early().await?;
        self.initialized().await?;
        Ok(peer)
    }

    /// Waits for the answer to a pipelined `initialize`, if one is out; its
    /// error when it failed (the connection is then closed).
    async fn initialized(&self) -> Result<(), ClientError> {
        let Some(mut rx) = lock(&self.inner.init).clone() else {
            return Ok(());
        };
        let outcome = match rx.wait_for(Option::is_some).await {
            Ok(outcome) => outcome.clone().unwrap_or(Ok(())),
            Err(_) => Err(ClientError::Connection(ConnectionError::new(
                ConnectionErrorKind::Closed,
                "the connection ended during initialize",
            ))),
        };
        outcome
    }

    /// True when `initialize` has been answered (successfully or not).
    fn init_settled(&self) -> bool {
        lock(&self.inner.init)
            .as_ref()
            .is_none_or(|rx| rx.borrow().is_some())
    }

    /// Calls `method`; with `retry`, a call cut by a dropped connection is sent
    /// again after recovery, up to [`RETRIES_AFTER_DROP`] times (only for
    /// calls that are safe to repeat).
    pub async fn call<P: Serialize, R: DeserializeOwned>(
        &self,
        method: &str,
        params: &P,
        retry: bool,
    ) -> Result<R, ClientError> {
        self.call_maybe_early(method, params, retry, false).await
    }

    /// [`Self::call`]; with `early`, the first attempt goes out behind a
    /// pipelined `initialize` without waiting for its answer.
    pub(crate) async fn call_maybe_early<P: Serialize, R: DeserializeOwned>(
        &self,
        method: &str,
        params: &P,
        retry: bool,
        early: bool,
    ) -> Result<R, ClientError> {
        let value = serde_json::to_value(params).map_err(|e| ClientError::protocol(method, e))?;
        let mut attempt = 0;
        let mut upgrades = 0;
        loop {
            let peer = if early && attempt == 0 && upgrades == 0 {
                self.peer_early().await?
            } else {
                self.peer().await?
            };
            match peer
                .call(method, value.clone(), self.inner.opts.call_timeout)
                .await
            {
                Ok(v) => {
                    return serde_json::from_value(v).map_err(|e| ClientError::protocol(method, e))
                }
                Err(CallError::Closed) if retry && attempt < RETRIES_AFTER_DROP => attempt += 1,
                Err(e) if upgrading(&e) && upgrades < UPGRADE_RETRIES => {
                    upgrades += 1;
                    tokio::time::sleep(UPGRADE_RETRY_PAUSE).await;
                }
                Err(e) => return Err(ClientError::from_call(e)),
            }
        }
    }

    /// Calls `method` whose params' or result's `chunk` holds bytes:
    /// `params` without `chunk`, `payload` as its bytes. On a connection with
    /// binary frames the bytes travel raw; otherwise as base64. The result's
    /// `chunk`, when it came raw, is returned apart. `retry` as [`Self::call`].
    pub(crate) async fn call_chunked(
        &self,
        method: &str,
        params: Value,
        payload: Option<bytes::Bytes>,
        retry: bool,
    ) -> Result<(Value, Option<bytes::Bytes>), ClientError> {
        let mut attempt = 0;
        let mut upgrades = 0;
        loop {
            let peer = self.peer().await?;
            match peer
                .call_with_payload(
                    method,
                    params.clone(),
                    // A share, not a copy: a retry sends the same bytes.
                    payload.clone(),
                    self.inner.opts.call_timeout,
                )
                .await
            {
                Ok(v) => return Ok(v),
                Err(CallError::Closed) if retry && attempt < RETRIES_AFTER_DROP => attempt += 1,
                Err(e) if upgrading(&e) && upgrades < UPGRADE_RETRIES => {
                    upgrades += 1;
                    tokio::time::sleep(UPGRADE_RETRY_PAUSE).await;
                }
                Err(e) => return Err(ClientError::from_call(e)),
            }
        }
    }

    /// `http/request`. With `streamResponse`, the body arrives on the returned receiver.
    pub async fn http_request(
        &self,
        params: HttpRequestParams,
    ) -> Result<(HttpResponse, Option<mpsc::UnboundedReceiver<HttpBodyDelta>>), ClientError> {
        let rx = if params.stream_response {
            let (tx, rx) = mpsc::unbounded_channel();
            lock(&self.inner.http_streams).insert(params.request_id.clone(), tx);
            Some(rx)
        } else {
            None
        };
        let r = self.call(m::HTTP_REQUEST, &params, false).await;
        if r.is_err() {
            lock(&self.inner.http_streams).remove(&params.request_id);
        }
        Ok((r?, rx))
    }
}

/// `params` as a JSON object without its `chunk` (which travels apart).
fn without_chunk<P: Serialize>(method: &str, params: &P) -> Result<Value, ClientError> {
    let mut v = serde_json::to_value(params).map_err(|e| ClientError::protocol(method, e))?;
    if let Value::Object(m) = &mut v {
        m.remove(exec_server_protocol::binary::PAYLOAD_MEMBER);
    }
    Ok(v)
}

/// Decodes a result whose `chunk` may have come apart as raw bytes.
fn with_chunk<R: DeserializeOwned + exec_server_protocol::binary::WithPayload>(
    method: &str,
    (mut value, payload): (Value, Option<bytes::Bytes>),
) -> Result<R, ClientError> {
    if payload.is_some() {
        exec_server_protocol::binary::add_empty_chunk(&mut value)
            .map_err(|e| ClientError::protocol(method, std::io::Error::other(e)))?;
    }
    let mut r: R = serde_json::from_value(value).map_err(|e| ClientError::protocol(method, e))?;
    if let Some(bytes) = payload {
        r.set_payload(bytes);
    }
    Ok(r)
}

#[cfg(all(test, feature = "embedded"))]
mod tests {
    use super::*;
    use crate::events::ProcessEvent;
    use exec_server_protocol::PathUri;

    async fn next_output(p: &mut ProcessHandle) -> Vec<u8> {
        let ev = tokio::time::timeout(Duration::from_secs(10), p.next_event())
            .await
            .expect("an event within 10 s");
        match ev {
            Some(ProcessEvent::Output { data, .. }) => data.to_vec(),
            other => panic!("expected output, got {other:?}"),
        }
    }

    /// A dropped connection is recovered: same session, the stream continues in
    /// order, a write after the drop is delivered once, and the end arrives.
    #[tokio::test]
    async fn recovery_resumes_the_session_and_the_stream() {
        let client = ExecServerClient::new(ClientOptions::new(Source::embedded().unwrap()));
        let mut params = ExecParams::new(
            "cat",
            vec!["cat".into()],
            PathUri::parse("file:///").unwrap(),
            [("PATH".to_string(), "/usr/bin:/bin".to_string())].into(),
        );
        params.pipe_stdin = true;
        let mut p = client.start_process(params).await.unwrap();
        let session = client.session_id();
        assert!(session.is_some());
        p.write(b"one\n".to_vec()).await.unwrap();
        assert_eq!(next_output(&mut p).await, b"one\n");

        client.drop_connection().await;
        p.write(b"two\n".to_vec()).await.unwrap();
        assert_eq!(next_output(&mut p).await, b"two\n");
        assert_eq!(client.recoveries(), 1);
        assert_eq!(client.session_id(), session, "the session was resumed");

        p.close_stdin().await.unwrap();
        let mut tail = Vec::new();
        while let Some(ev) = tokio::time::timeout(Duration::from_secs(10), p.next_event())
            .await
            .expect("the end within 10 s")
        {
            tail.push(ev);
        }
        assert!(
            matches!(
                tail.as_slice(),
                [
                    ProcessEvent::Exited { code: 0, .. },
                    ProcessEvent::Closed { .. }
                ]
            ),
            "{tail:?}"
        );
    }

    /// A closed client refuses calls with a typed error.
    #[tokio::test]
    async fn a_closed_client_says_so() {
        let client = ExecServerClient::new(ClientOptions::new(Source::embedded().unwrap()));
        client.connect().await.unwrap();
        client.close().await;
        let e = client.environment_info().await.unwrap_err();
        assert_eq!(
            e.connection_kind(),
            Some(crate::error::ConnectionErrorKind::Closed)
        );
    }
}
