//! The executor side: register a Noise key with the registry, hold a WebSocket
//! to the relay URL it returns, and serve every admitted stream (see [`mux`]).
//!
//! Lifecycle (as the reference 0.169.0): one identity per process; register
//! (retrying only `503 registration_conflict`, with jitter); connect; when the
//! socket dies, sleep a jittered backoff (1, 2, 4… capped at 30 s, not reset by
//! a good connection) and reconnect with the same registration; an HTTP 4xx on
//! the upgrade means the registration is gone: register again at once. Ours
//! also registers again when the relay cannot be reached at all (its registry
//! node may have died; another node of the fleet answers the registration).

pub mod mux;
pub(crate) mod shared_writer;

use crate::frame::MAX_FRAME_BYTES;
use crate::keys::Identity;
pub use crate::noise::TransportCipher;
use crate::random::{OsRandom, Randomness};
use crate::registry_client::{RegistryClient, RegistryError};
use crate::socket::ConnectError;
use crate::stream::Channel;
use std::sync::Arc;
use std::time::Duration;

/// Called with every admitted stream; must not block (spawn the work).
pub type StreamHandler = Arc<dyn Fn(Channel) + Send + Sync>;

/// Keepalive ping interval: 30 s (as the reference).
pub const KEEPALIVE: Duration = Duration::from_secs(30);
/// Time without any frame from the relay after a ping before the socket is dropped.
pub const PONG_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest reconnect backoff: 30 s.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A relay connection that lasted this long was a good one: the reconnect
/// backoff starts again from 1 s after it ends (5 s).
pub const STABLE_CONNECTION: Duration = Duration::from_secs(5);
/// Retries while the registry answers `registration_conflict` (another
/// executor's relay socket is attached): 10, after jittered delays from
/// [`FIRST_CONFLICT_DELAY`] doubling to [`MAX_BACKOFF`], 76 to 152 s in all —
/// longer than our relay lets a dead socket look live
/// ([`crate::registry::hub::EXECUTOR_SILENCE_TIMEOUT`], 60 s), so an executor
/// restarted while its old socket is half open still gets in.
pub const MAX_CONFLICT_RETRIES: u32 = 10;
/// Delay before the first retry after `registration_conflict` (then doubled).
pub const FIRST_CONFLICT_DELAY: Duration = Duration::from_millis(500);

/// Executor settings.
pub struct Config {
    /// The registry, with the executor's bearer.
    pub registry: RegistryClient,
    /// Environment id (trimmed, non-empty).
    pub environment_id: String,
    /// Ping interval.
    pub keepalive: Duration,
    /// Silence tolerated after a ping.
    pub pong_timeout: Duration,
    /// Told of streams and handshake failures (for metrics); [`NoObserver`]
    /// when nobody counts.
    pub observer: Arc<dyn Observer>,
    /// Taken when a harness offers it (see [`TransportCipher`]);
    /// [`TransportCipher::AesGcm`] keeps every stream on the reference's
    /// records. Usually [`TransportCipher::preferred`].
    pub transport_cipher: TransportCipher,
}

/// What an executor tells its owner as it works, e.g. to count it in
/// metrics. Called on the executor's task: keep each call short.
pub trait Observer: Send + Sync {
    /// A stream passed its handshake and validation and was handed to the
    /// stream handler.
    fn stream_opened(&self) {}
    /// A stream that was opened ended (reset, error, or the handler closed it).
    fn stream_closed(&self) {}
    /// A stream's handshake or validation failed (counted toward the pause of
    /// new handshakes).
    fn handshake_failed(&self) {}
    /// Registered (or registered again) with the registry.
    fn registered(&self) {}
    /// The registry answered `503 registration_conflict` (another executor is
    /// connected for the environment); the registration is retried after a
    /// jittered delay.
    fn registration_conflict(&self) {}
}

/// An [`Observer`] that ignores everything.
pub struct NoObserver;

impl Observer for NoObserver {}

/// Why a relay socket ended (logged, never fatal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disconnect {
    /// The relay closed it.
    PeerClose,
    /// Reading failed.
    ReadError,
    /// Writing failed or stalled.
    WriteError,
    /// Nothing heard for too long.
    PongTimeout,
}

pub(crate) struct Ctx {
    pub identity: Identity,
    pub registry: RegistryClient,
    pub environment_id: String,
    pub registration_id: String,
    pub handler: StreamHandler,
    pub keepalive: Duration,
    pub pong_timeout: Duration,
    pub observer: Arc<dyn Observer>,
    pub transport_cipher: TransportCipher,
}

/// A fatal executor error (registration refused or malformed).
#[derive(Debug, thiserror::Error)]
#[error("cannot register with the environment registry: {0}")]
pub struct ExecutorError(#[from] pub RegistryError);

fn jitter(d: Duration) -> Duration {
    let mut b = [0u8; 2];
    OsRandom.fill(&mut b);
    let f = 0.5 + (u16::from_le_bytes(b) as f64 / u16::MAX as f64) * 0.5;
    d.mul_f64(f)
}

/// The delays (before jitter) between registration attempts refused with
/// `registration_conflict`: 0.5, 1, 2 … 30, 30 s, [`MAX_CONFLICT_RETRIES`] of them.
fn conflict_delays() -> impl Iterator<Item = Duration> {
    std::iter::successors(Some(FIRST_CONFLICT_DELAY), |d| {
        Some((*d * 2).min(MAX_BACKOFF))
    })
    .take(MAX_CONFLICT_RETRIES as usize)
}

/// A refusal worth registering again for, and what it means (for the log):
/// another executor socket holds the environment (`registration_conflict`,
/// retried as the reference does), or the node cannot reach its database
/// for now (`store_unavailable`, ours).
fn conflict(e: &RegistryError) -> Option<&'static str> {
    let RegistryError::Http {
        status: 503, code, ..
    } = e
    else {
        return None;
    };
    match code.as_str() {
        // Not only another executor: this one's own socket on a node that
        // died holds the environment until that node's heartbeat expires.
        "registration_conflict" => Some(
            "the environment is held by another executor socket (another executor, \
             or this one's on a registry node that is gone, until that node's heartbeat expires)",
        ),
        "store_unavailable" => Some("the registry node cannot reach its database"),
        _ => None,
    }
}

/// The first registration: a registry that cannot be reached or answers
/// 5xx or 429 (other than `registration_conflict`, which [`register`]
/// retries and then gives up on) is tried again, 1 s doubling to 30 s,
/// jittered, for as long as it takes: an executor may start before its
/// network or its registry. A refusal (a bad token, an unknown profile)
/// ends the executor at once.
async fn first_registration(
    config: &Config,
    identity: &Identity,
) -> Result<crate::api::RegisterResponse, RegistryError> {
    let mut backoff = Duration::from_secs(1);
    loop {
        match register(config, identity).await {
            Err(e) if e.is_retryable() && !held_by_another(&e) => {
                let delay = jitter(backoff);
                tracing::warn!(
                    retry_in_ms = delay.as_millis() as u64,
                    "cannot register yet: {e}; trying again"
                );
                tokio::time::sleep(delay).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            other => return other,
        }
    }
}

/// `503 registration_conflict`: another executor holds the environment.
fn held_by_another(e: &RegistryError) -> bool {
    matches!(e, RegistryError::Http { code, .. } if code == "registration_conflict")
}

/// Registers, retrying (as the reference does) only `503 registration_conflict`,
/// after a growing jittered delay so that competing executors do not retry
/// in lock-step; the last refusal is returned when the delays run out.
async fn register(
    config: &Config,
    identity: &Identity,
) -> Result<crate::api::RegisterResponse, RegistryError> {
    let mut delays = conflict_delays();
    loop {
        let result = config
            .registry
            .register(&config.environment_id, &identity.public_key())
            .await;
        let e = match result {
            Err(e) => e,
            ok => return ok,
        };
        let Some(why) = conflict(&e) else {
            return Err(e);
        };
        config.observer.registration_conflict();
        let Some(delay) = delays.next() else {
            return Err(e);
        };
        let delay = jitter(delay);
        tracing::warn!(
            retry_in_ms = delay.as_millis() as u64,
            "{why}; registering again later"
        );
        tokio::time::sleep(delay).await;
    }
}

/// Runs the executor until a fatal registration error. `on_registered` is
/// called with the registration id after each successful registration.
pub async fn run(config: Config, handler: StreamHandler) -> Result<(), ExecutorError> {
    let identity = Identity::generate(&mut OsRandom);
    let mut reg = first_registration(&config, &identity).await?;
    config.observer.registered();
    tracing::info!(environment = %config.environment_id, "registered with the environment registry");
    let mut backoff = Duration::from_secs(1);
    // Whether `reg` was just obtained to replace one whose relay failed: its
    // relay is tried at once, without the backoff sleep in between.
    let mut fresh = false;
    loop {
        if url::Url::parse(&reg.url).is_err() {
            return Err(ExecutorError(RegistryError::Protocol(
                "invalid relay URL".into(),
            )));
        }
        let mut rid = [0u8; 16];
        OsRandom.fill(&mut rid);
        let rid: String = rid.iter().map(|b| format!("{b:02x}")).collect();
        let headers = [("x-request-id", format!("req_{rid}"))];
        let mut reregister = false;
        match crate::socket::connect(&reg.url, &headers, MAX_FRAME_BYTES).await {
            Ok(ws) => {
                tracing::info!("connected to the relay");
                let ctx = Arc::new(Ctx {
                    identity: identity.clone(),
                    registry: config.registry.clone(),
                    environment_id: config.environment_id.clone(),
                    registration_id: reg.executor_registration_id.clone(),
                    handler: handler.clone(),
                    keepalive: config.keepalive,
                    pong_timeout: config.pong_timeout,
                    observer: config.observer.clone(),
                    transport_cipher: config.transport_cipher,
                });
                let began = std::time::Instant::now();
                let why = mux::serve(ws, &ctx).await;
                tracing::warn!(reason = ?why, "relay connection lost");
                // Unlike the reference (0.169.0 never resets it), a node lost
                // after a good connection costs a second, not the doubled
                // wait of every earlier loss: from the third loss in an
                // executor's life, that outlasted the clients' 25 s recovery.
                if began.elapsed() >= STABLE_CONNECTION {
                    backoff = Duration::from_secs(1);
                }
            }
            Err(ConnectError::Refused { status, reason }) if (400..500).contains(&status) => {
                tracing::warn!(
                    status,
                    reason = reason.as_deref().unwrap_or("unknown"),
                    "relay refused the registration; registering again"
                );
                reregister = true;
            }
            Err(e) => {
                // Its node may be gone: registering again (with every
                // registry URL given) finds the relay of a live node.
                tracing::warn!("cannot connect to the relay: {e}; registering again");
                reregister = true;
            }
        }
        if reregister && !fresh {
            match register(&config, &identity).await {
                Ok(r) => {
                    config.observer.registered();
                    reg = r;
                    // The new relay (a live node's) is tried now; if it fails
                    // too, the backoff applies as usual.
                    fresh = true;
                    continue;
                }
                Err(e) if e.is_retryable() => tracing::warn!("registering again failed: {e}"),
                Err(e) => return Err(ExecutorError(e)),
            }
        }
        fresh = false;
        tokio::time::sleep(jitter(backoff)).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Even with the shortest jitter, conflict retries outlast the time our
    /// relay lets a dead executor socket look live.
    #[test]
    fn conflict_retries_outlast_a_dead_socket() {
        let delays: Vec<Duration> = conflict_delays().collect();
        assert_eq!(delays.len(), MAX_CONFLICT_RETRIES as usize);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]), "{delays:?}");
        let shortest: Duration = delays.iter().map(|d| d.mul_f64(0.5)).sum();
        let longest: Duration = delays.iter().sum();
        assert!(
            shortest > crate::registry::hub::EXECUTOR_SILENCE_TIMEOUT,
            "{shortest:?}"
        );
        assert!(longest <= Duration::from_secs(160), "{longest:?}");
        for d in delays {
            let j = jitter(d);
            assert!(j >= d.mul_f64(0.5) && j <= d, "{j:?} from {d:?}");
        }
    }
}
