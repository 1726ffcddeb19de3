//! Our environment registry and rendezvous relay in one process: the three
//! registry endpoints (`POST /cloud/environment/{id}/register`, `/connect`,
//! `/validate`), the relay WebSocket (`GET /relay?…`, signed URL) and
//! `GET /livez` (200 while the process serves), `GET /readyz` (200 once
//! the store answered the node's last heartbeat, else 503) and
//! `GET /metrics` (the node's Prometheus metrics, see [`metrics`]) on one
//! port, HTTP/1.1 with keep-alive (over TLS when configured), served by hyper.
//!
//! What it guarantees: relay URLs are signed and expire, and a harness's
//! opens one socket only (its nonce is taken from the store at the upgrade,
//! on whichever node; a second upgrade with it is refused as `expired`); an
//! authorization names
//! one harness key, one registration and one environment, is single use and
//! lives [`AUTHORIZATION_TTL`]; `/validate` says yes only for that exact key;
//! frames are routed by stream id and never opened (it has no key to open them);
//! environment ids are `[A-Za-z0-9_-]{1,256}` (else `400 invalid_environment_id`);
//! a registration never displaces a connected executor: while its relay socket
//! is attached, `/register` answers `503 registration_conflict` (which
//! executors retry with a growing jittered delay), and a socket stops counting
//! once closed or silent for [`Config::executor_silence_timeout`].

mod close;
pub use close::NO_EXECUTOR;
pub mod fleet;
mod harness_writer;
pub mod hub;
pub mod metrics;
mod pending;
mod pipes;
pub mod postgres;
mod queue;
mod relay_io;
pub mod signing;
mod splice_route;
pub mod sqlite;
pub mod store;
pub mod tokens;
mod write_deadline;

mod http;

use crate::api::*;
use crate::environment_id;
use crate::keys::{PublicKey, SECURITY_PROFILE};
use signing::{Grant, Role};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use store::{Attachment, Authorization, Registration, Store};
use tokens::Tokens;

/// A 401's message for an executor's bearer that no token line accepts.
const BAD_EXECUTOR_TOKEN: &str =
    "invalid executor token (unknown, expired, or for another environment)";
/// The same for a harness's bearer.
const BAD_HARNESS_TOKEN: &str =
    "invalid harness token (unknown, expired, or for another environment)";

/// How long an executor's relay URL stays valid: 10 minutes (then the executor
/// is refused with `expired` and registers again).
pub const EXECUTOR_URL_TTL: Duration = Duration::from_secs(600);
/// How long a harness's relay URL stays valid: 60 s (it is used at once).
pub const HARNESS_URL_TTL: Duration = Duration::from_secs(60);
/// How long a `harness_key_authorization` stays valid: 60 s.
pub const AUTHORIZATION_TTL: Duration = Duration::from_secs(60);

/// Prefix of the store token under which a harness URL's nonce is kept
/// until its upgrade takes it. `/connect`'s authorizations start `hka_`,
/// and `/validate` refuses a token with this prefix.
const URL_NONCE_PREFIX: &str = "url_";

/// Registry settings.
pub struct Config {
    /// Executors' bearer tokens; `None` accepts any (loopback testing only).
    pub executor_tokens: Option<Tokens>,
    /// Harnesses' bearer tokens; `None` accepts any.
    pub harness_tokens: Option<Tokens>,
    /// Executor relay URL lifetime.
    pub executor_url_ttl: Duration,
    /// How long an executor's relay socket may send nothing (not even a Pong)
    /// before it is dropped and its environment may be registered again:
    /// the longest a dead socket blocks a restarted executor.
    pub executor_silence_timeout: Duration,
    /// Serve HTTPS/WSS with this configuration; `None` is plain HTTP (the
    /// caller allows that on loopback only).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Most connections served at once (HTTP and relay sockets alike); a
    /// connection past it is answered `503 node_at_connection_limit` and
    /// closed. Default [`DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// Most bytes the node holds for harnesses that do not read, across all
    /// environments (as queued frames cost them); past it the stream holding
    /// the most is reset and its client resumes on a new one. Each stream
    /// and each environment has its own budget below it
    /// ([`hub::STREAM_BUFFER_BYTES`], [`hub::ENVIRONMENT_BUFFER_BYTES`]).
    /// Default [`hub::DEFAULT_NODE_BUFFER_BYTES`].
    pub relay_buffer_bytes: usize,
    /// Most pipes the node holds at once to splice frames to harnesses
    /// (two file descriptors each, on top of `max_connections`' one per
    /// connection); a stream past it is read and routed as usual. Default
    /// [`hub::DEFAULT_SPLICE_PIPES`].
    pub splice_pipes: usize,
}

/// Connections a node serves at once unless configured: 16 384.
pub const DEFAULT_MAX_CONNECTIONS: usize = 16 * 1024;

impl Default for Config {
    fn default() -> Self {
        Config {
            executor_tokens: None,
            harness_tokens: None,
            executor_url_ttl: EXECUTOR_URL_TTL,
            executor_silence_timeout: hub::EXECUTOR_SILENCE_TIMEOUT,
            tls: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            relay_buffer_bytes: hub::DEFAULT_NODE_BUFFER_BYTES,
            splice_pipes: hub::DEFAULT_SPLICE_PIPES,
        }
    }
}

/// A running registry's shared state.
pub struct Registry {
    config: Config,
    store: Arc<dyn Store>,
    hub: hub::Hub,
    signing_key: [u8; 32],
    ws_base: String,
    /// This node's id among the nodes sharing the store.
    node_id: String,
    /// The store answered this node's last heartbeat (`/readyz`).
    store_ok: std::sync::atomic::AtomicBool,
    metrics: metrics::NodeMetrics,
    /// `/connect` answers whose authorizations may still be used.
    pending_connects: pending::PendingConnects,
}

/// An HTTP answer: status, JSON body, extra headers.
pub(crate) struct Reply {
    pub status: u16,
    pub body: String,
    pub headers: Vec<(&'static str, String)>,
}

impl Reply {
    fn json<T: serde::Serialize>(v: &T) -> Reply {
        Reply {
            status: 200,
            body: serde_json::to_string(v).unwrap_or_default(),
            headers: Vec::new(),
        }
    }

    fn error(status: u16, code: &str, message: &str) -> Reply {
        Reply::json(&ErrorBody {
            error: ErrorDetail {
                code: code.into(),
                message: message.into(),
            },
        })
        .with_status(status)
    }

    fn with_status(mut self, status: u16) -> Reply {
        self.status = status;
        self
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Registry {
    /// Builds the registry; `ws_base` is the relay's base URL (`ws://HOST:PORT`,
    /// or `wss://…` with TLS) that relay URLs are made from.
    pub async fn new(
        config: Config,
        store: Arc<dyn Store>,
        ws_base: String,
    ) -> Result<Arc<Registry>, store::StoreError> {
        let store_seconds = metrics::store_histogram();
        let store: Arc<dyn Store> = Arc::new(metrics::TimedStore {
            inner: store,
            seconds: store_seconds.clone(),
        });
        let hub = hub::Hub::with_buffer(config.executor_silence_timeout, config.relay_buffer_bytes)
            .with_splice_pipes(config.splice_pipes);
        let metrics = metrics::NodeMetrics::new(&hub.counters, &store_seconds);
        Ok(Arc::new(Registry {
            signing_key: store.signing_key().await?,
            hub,
            metrics,
            config,
            store,
            ws_base,
            node_id: fleet::new_node_id(),
            store_ok: std::sync::atomic::AtomicBool::new(false),
            pending_connects: pending::PendingConnects::new(AUTHORIZATION_TTL.max(HARNESS_URL_TTL)),
        }))
    }

    /// Serves connections on `listener` until it fails, and tells the other
    /// nodes sharing the store that this one is alive ([`fleet::HEARTBEAT`]).
    pub async fn serve(self: Arc<Self>, listener: tokio::net::TcpListener) {
        let heartbeat = tokio::spawn(fleet::heartbeat(self.clone()));
        http::serve(self, listener).await;
        heartbeat.abort();
    }

    /// This node's metrics in the Prometheus text format (`GET /metrics`).
    fn render_metrics(&self) -> String {
        let (executors, streams) = self.hub.counts();
        self.metrics
            .render(executors, streams, self.hub.buffered_bytes())
    }

    fn relay_url(&self, base: &str, grant: &Grant, ttl: Duration) -> String {
        format!(
            "{base}/relay?{}",
            signing::sign(&self.signing_key, grant, now_unix() + ttl.as_secs())
        )
    }

    fn authorized(tokens: &Option<Tokens>, bearer: Option<&str>, env: &str) -> bool {
        match tokens {
            None => true,
            Some(t) => bearer.is_some_and(|b| t.allows(b, env)),
        }
    }

    /// Admits a POST by its head alone (a valid id, a known action, a
    /// bearer a token line accepts), so that a refused one's body is never
    /// read: anyone could make a node hold 64 KiB a connection for 10 s
    /// before the bearer was looked at. Errors: the refusal to answer.
    pub(crate) fn admit_post<'a>(
        &self,
        env: &'a str,
        action: &str,
        bearer: Option<&'a str>,
    ) -> Result<AdmittedPost<'a>, Reply> {
        // The message is fixed text: the id itself is never echoed.
        if let Err(e) = environment_id::validate(env) {
            return Err(Reply::error(400, "invalid_environment_id", &e.to_string()));
        }
        let (action, tokens, refusal) = match action {
            "register" => (
                PostAction::Register,
                &self.config.executor_tokens,
                BAD_EXECUTOR_TOKEN,
            ),
            "validate" => (
                PostAction::Validate,
                &self.config.executor_tokens,
                BAD_EXECUTOR_TOKEN,
            ),
            "connect" => (
                PostAction::Connect,
                &self.config.harness_tokens,
                BAD_HARNESS_TOKEN,
            ),
            _ => return Err(Reply::error(404, "not_found", "no such endpoint")),
        };
        if !Self::authorized(tokens, bearer, env) {
            return Err(Reply::error(401, "unauthorized", refusal));
        }
        Ok(AdmittedPost {
            env,
            action,
            bearer,
        })
    }

    /// Answers an admitted POST with its `body`.
    pub(crate) async fn handle_post(&self, post: AdmittedPost<'_>, body: &[u8]) -> Reply {
        let AdmittedPost {
            env,
            action,
            bearer,
        } = post;
        let result = match action {
            PostAction::Register => self.register(env, body).await,
            PostAction::Connect => self.connect(env, bearer, body).await,
            PostAction::Validate => self.validate(env, body).await,
        };
        result.unwrap_or_else(|e| {
            tracing::warn!(node = %self.node_id, "registry store failed: {e}");
            if e.is_unreachable() {
                Reply::error(
                    503,
                    "store_unavailable",
                    &format!(
                        "registry node {}: its database is unreachable; try again shortly",
                        self.node_id
                    ),
                )
            } else {
                Reply::error(
                    500,
                    "store_failed",
                    &format!("registry node {}: its store failed", self.node_id),
                )
            }
        })
    }

    /// `POST …/register`, its bearer already accepted ([`Self::admit_post`]).
    async fn register(&self, env: &str, body: &[u8]) -> Result<Reply, store::StoreError> {
        let Ok(req) = serde_json::from_slice::<RegisterRequest>(body) else {
            return Ok(Reply::error(400, "bad_request", "invalid register request"));
        };
        if req.security_profile != SECURITY_PROFILE
            || PublicKey::from_wire(&req.executor_public_key).is_err()
        {
            return Ok(Reply::error(
                400,
                "bad_request",
                "unsupported security profile or key",
            ));
        }
        let registration_id = format!("reg_{}", uuid::Uuid::new_v4().simple());
        let registration = Registration {
            environment_id: env.into(),
            registration_id: registration_id.clone(),
            executor_key: req.executor_public_key,
        };
        let put = self
            .hub
            .unless_executor_live(env, || async {
                if self.live_elsewhere(env).await? {
                    return Ok(false);
                }
                self.store.put_registration(registration).await?;
                Ok::<bool, store::StoreError>(true)
            })
            .await;
        match put {
            Ok(Ok(true)) => {}
            Ok(Err(e)) => return Err(e),
            Ok(Ok(false)) | Err(hub::ExecutorLive) => {
                return Ok(Reply::error(
                    503,
                    "registration_conflict",
                    &format!(
                        "an executor is connected for this environment; a new registration is \
                         accepted once its relay socket closes (or has been silent for {} s)",
                        self.config.executor_silence_timeout.as_secs()
                    ),
                ))
            }
        }
        let grant = Grant {
            role: Role::Executor,
            environment_id: env.into(),
            registration_id: registration_id.clone(),
            nonce: None,
        };
        Ok(Reply::json(&RegisterResponse {
            environment_id: env.into(),
            url: self.relay_url(&self.ws_base, &grant, self.config.executor_url_ttl),
            security_profile: SECURITY_PROFILE.into(),
            executor_registration_id: registration_id,
        }))
    }

    /// `POST …/connect`, its bearer already accepted ([`Self::admit_post`]);
    /// the bearer counts the connects it asks for.
    async fn connect(
        &self,
        env: &str,
        bearer: Option<&str>,
        body: &[u8],
    ) -> Result<Reply, store::StoreError> {
        let Ok(req) = serde_json::from_slice::<ConnectRequest>(body) else {
            return Ok(Reply::error(400, "bad_request", "invalid connect request"));
        };
        if PublicKey::from_wire(&req.harness_public_key).is_err() {
            return Ok(Reply::error(400, "bad_request", "invalid harness key"));
        }
        let Some(reg) = self.store.registration(env).await? else {
            return Ok(Reply::error(
                404,
                "environment_not_found",
                "no executor registered",
            ));
        };
        let now = std::time::Instant::now();
        if let Err(over) = self.pending_connects.admit(bearer, env, now) {
            let scope = match over {
                pending::Over::Environment => "for this token and environment",
                pending::Over::Credential => "for this token",
                pending::Over::Node => "in all",
            };
            let message = format!(
                "registry node {} has given {} connect answers {scope} within the last {} s \
                 (each counts until its authorizations expire, used or not); try again shortly",
                self.node_id,
                over.bound(),
                AUTHORIZATION_TTL.max(HARNESS_URL_TTL).as_secs(),
            );
            let mut reply = Reply::error(429, "too_many_connects", &message);
            reply.headers.push(("retry-after", "5".into()));
            return Ok(reply);
        }
        let token = format!("hka_{}", uuid::Uuid::new_v4().simple());
        self.store
            .put_authorization(
                &token,
                Authorization {
                    environment_id: env.into(),
                    registration_id: reg.registration_id.clone(),
                    harness_key: req.harness_public_key.clone(),
                    expires_unix: now_unix() + AUTHORIZATION_TTL.as_secs(),
                },
            )
            .await?;
        // The URL's nonce, kept as an authorization of its own for as long
        // as the URL is valid: the first upgrade with the URL takes it.
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        self.store
            .put_authorization(
                &format!("{URL_NONCE_PREFIX}{nonce}"),
                Authorization {
                    environment_id: env.into(),
                    registration_id: reg.registration_id.clone(),
                    harness_key: req.harness_public_key,
                    expires_unix: now_unix() + HARNESS_URL_TTL.as_secs(),
                },
            )
            .await?;
        let grant = Grant {
            role: Role::Harness,
            environment_id: env.into(),
            registration_id: reg.registration_id.clone(),
            nonce: Some(nonce),
        };
        let base = self.relay_base_for(env).await?;
        Ok(Reply::json(&ConnectResponse {
            environment_id: env.into(),
            url: self.relay_url(&base, &grant, HARNESS_URL_TTL),
            security_profile: SECURITY_PROFILE.into(),
            executor_registration_id: reg.registration_id,
            executor_public_key: reg.executor_key,
            harness_key_authorization: token,
        }))
    }

    /// `POST …/validate`, its bearer already accepted ([`Self::admit_post`]).
    async fn validate(&self, env: &str, body: &[u8]) -> Result<Reply, store::StoreError> {
        let Ok(req) = serde_json::from_slice::<ValidateRequest>(body) else {
            return Ok(Reply::error(400, "bad_request", "invalid validate request"));
        };
        // A URL's nonce is no authorization, and stays for its upgrade.
        let token = &req.harness_key_authorization;
        let taken = if token.starts_with(URL_NONCE_PREFIX) {
            None
        } else {
            self.store.take_authorization(token, now_unix()).await?
        };
        let valid = match taken {
            Some(a) => {
                let current = self.store.registration(env).await?;
                a.environment_id == env
                    && a.registration_id == req.executor_registration_id
                    && current.is_some_and(|r| r.registration_id == a.registration_id)
                    && a.harness_key == req.harness_public_key
            }
            None => false,
        };
        Ok(Reply::json(&ValidateResponse { valid }))
    }

    /// Whether `grant`'s registration is still its environment's; the error
    /// is the rejection reason.
    async fn current(&self, grant: &Grant) -> Result<(), &'static str> {
        let current = self
            .store
            .registration(&grant.environment_id)
            .await
            .map_err(|_| "route_unavailable")?;
        match current {
            Some(r) if r.registration_id == grant.registration_id => Ok(()),
            Some(_) => Err("unexpected_executor_registration_id"),
            None => Err("unknown_route"),
        }
    }

    /// Takes a harness URL's nonce from the store: only the first upgrade
    /// with the URL gets it. A used (or expired) nonce is refused as
    /// `expired`: the URL is no longer valid, and the harness asks
    /// `/connect` for a new one, as it does for every attempt. A harness URL
    /// without a nonce (signed by a node from before nonces) is let through.
    async fn take_url_nonce(&self, grant: &Grant) -> Result<(), &'static str> {
        let Some(nonce) = &grant.nonce else {
            return Ok(());
        };
        let token = format!("{URL_NONCE_PREFIX}{nonce}");
        let taken = self.store.take_authorization(&token, now_unix()).await;
        match taken {
            Ok(Some(a))
                if a.environment_id == grant.environment_id
                    && a.registration_id == grant.registration_id =>
            {
                Ok(())
            }
            Ok(_) => Err("expired"),
            Err(e) => {
                tracing::warn!(node = %self.node_id, "cannot take a relay URL's nonce: {e}");
                Err("route_unavailable")
            }
        }
    }

    /// Checks a relay upgrade's query and, for an executor, attaches its
    /// socket before the upgrade is answered (so it is live from then on);
    /// the error is the rejection reason.
    pub(crate) async fn admit_upgrade(&self, query: &str) -> Result<Admitted, &'static str> {
        let grant = signing::verify(&self.signing_key, query, now_unix())?;
        match grant.role {
            Role::Harness => {
                self.current(&grant).await?;
                self.take_url_nonce(&grant).await?;
                Ok(Admitted::Harness(grant))
            }
            Role::Executor => {
                let attachment = self
                    .hub
                    .attach_executor(&grant.environment_id, &grant.registration_id, || {
                        self.current(&grant)
                    })
                    .await?;
                let record = Attachment {
                    environment_id: grant.environment_id.clone(),
                    registration_id: grant.registration_id.clone(),
                    node_id: self.node_id.clone(),
                    ws_base: self.ws_base.clone(),
                    attach_id: format!("{}-{}", self.node_id, attachment.id()),
                };
                // The record is written by a task of its own, and the guard
                // that takes it out exists before the write is waited for:
                // a client that resets the connection drops this future at
                // any await, and a record of a socket nobody serves sent
                // every other node's harnesses here and refused the
                // executor's registration elsewhere for as long as this
                // node lived.
                let store = self.store.clone();
                let rec = record.clone();
                let mut recorded = Recorded {
                    store: self.store.clone(),
                    node_id: self.node_id.clone(),
                    record: Some(record),
                    write: Some(tokio::spawn(async move { store.attach(&rec).await })),
                };
                if let Some(write) = recorded.write.as_mut() {
                    match write.await {
                        Ok(Ok(())) => {}
                        // Served here all the same; other nodes send
                        // harnesses here once a later attach or heartbeat
                        // gets through.
                        Ok(Err(e)) => {
                            tracing::warn!(node = %self.node_id, "cannot record the executor's attachment: {e}")
                        }
                        Err(_) => return Err("route_unavailable"),
                    }
                }
                recorded.write = None;
                Ok(Admitted::Executor(attachment, recorded))
            }
        }
    }

    /// `tcp`: the socket under `ws`, when frames may be spliced from it (an
    /// executor's) or to it (a harness's that agreed to masked frames).
    pub(crate) async fn serve_socket<R, W>(
        &self,
        ws: (crate::socket::Reader<R>, crate::socket::Writer<W>),
        admitted: Admitted,
        tcp: Option<crate::socket::splice::SharedTcp>,
    ) where
        R: tokio::io::AsyncRead + Unpin + Send + 'static,
        W: tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        match admitted {
            Admitted::Executor(attachment, mut recorded) => {
                self.hub.serve_executor(ws, attachment, tcp).await;
                if let Some(record) = recorded.record.take() {
                    detach(&*self.store, &self.node_id, &record).await;
                }
            }
            Admitted::Harness(grant) => {
                self.hub
                    .serve_harness(ws, (grant.environment_id, grant.registration_id), tcp)
                    .await
            }
        }
    }
}

/// A registry POST admitted by its head ([`Registry::admit_post`]).
pub(crate) struct AdmittedPost<'a> {
    env: &'a str,
    action: PostAction,
    bearer: Option<&'a str>,
}

/// What a registry POST asks (`/cloud/environment/{id}/{action}`).
enum PostAction {
    Register,
    Connect,
    Validate,
}

/// Takes an executor socket's record out of the store, logging a failure.
async fn detach(store: &dyn Store, node_id: &str, record: &Attachment) {
    if let Err(e) = store
        .detach(&record.environment_id, &record.attach_id)
        .await
    {
        tracing::warn!(node = %node_id, "cannot record the executor's detachment: {e}");
    }
}

/// An executor socket's record in the store, taken out when its socket is
/// done, or when this is dropped first (the upgrade failed after its
/// admission, or was abandoned).
pub(crate) struct Recorded {
    store: Arc<dyn Store>,
    node_id: String,
    record: Option<Attachment>,
    /// The record's write, while it is still waited for.
    write: Option<tokio::task::JoinHandle<Result<(), store::StoreError>>>,
}

impl Drop for Recorded {
    fn drop(&mut self) {
        let Some(record) = self.record.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, node, write) = (self.store.clone(), self.node_id.clone(), self.write.take());
        runtime.spawn(async move {
            // After the write, or the record would land after its removal.
            if let Some(write) = write {
                let _ = write.await;
            }
            detach(&*store, &node, &record).await
        });
    }
}

/// A relay upgrade that passed its checks.
pub(crate) enum Admitted {
    /// An executor socket, already attached to its environment's route, and
    /// its record in the store.
    Executor(hub::ExecutorAttachment, Recorded),
    /// A harness socket for this grant.
    Harness(Grant),
}
