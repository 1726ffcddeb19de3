//! Calls to an environment registry (ours or any compatible one), as the
//! reference makes them: `POST {base}/cloud/environment/{id}/{action}`, JSON,
//! `Authorization: Bearer …`, redirects not followed.

use crate::api::*;
use crate::keys::{PublicKey, SECURITY_PROFILE};
use std::time::Duration;

/// Per-request timeout: 10 s.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Most of an error body quoted in an error: 4096 characters.
pub const ERROR_BODY_PREVIEW: usize = 4096;

/// A registry call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// 401 or 403.
    #[error("authentication failed ({status}): {message}")]
    Auth {
        /// HTTP status.
        status: u16,
        /// Server's message (omitted when secrets are involved).
        message: String,
    },
    /// Any other non-2xx.
    #[error("environment registry error {status}{}: {message}", spaced(code))]
    Http {
        /// HTTP status.
        status: u16,
        /// `error.code`, or empty.
        code: String,
        /// `error.message`, or the start of the body.
        message: String,
    },
    /// Not reachable, timed out, or the body was cut.
    #[error("environment registry unreachable: {0}")]
    Transport(String),
    /// The answer breaks the protocol (wrong environment, profile, missing fields).
    #[error("environment registry protocol error: {0}")]
    Protocol(String),
}

/// ` CODE`, or nothing for an answer that named none.
fn spaced(code: &str) -> String {
    if code.is_empty() {
        String::new()
    } else {
        format!(" {code}")
    }
}

impl RegistryError {
    /// Whether retrying later may help (transport errors, 5xx, 429).
    pub fn is_retryable(&self) -> bool {
        match self {
            RegistryError::Transport(_) => true,
            RegistryError::Http { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }
}

/// A registry at one base URL with one credential.
#[derive(Clone)]
pub struct RegistryClient {
    /// One base URL per registry node, tried in turn.
    bases: Vec<String>,
    /// The base that answered last (tried first).
    current: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    bearer: String,
    account_id: Option<String>,
    http: reqwest::Client,
    show_bodies: bool,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient")
            .field("bases", &self.bases)
            .field("bearer", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// The base URL is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Largest registry answer read: 1 MiB (a registration, a connect or a
/// validation is well under 4 KiB; a hostile or broken registry must not
/// make an executor or a client hold gigabytes).
pub const MAX_ANSWER_BYTES: usize = 1 << 20;

/// `r`'s body, or `None` once it passes [`MAX_ANSWER_BYTES`].
async fn read_bounded(mut r: reqwest::Response) -> Result<Option<bytes::Bytes>, reqwest::Error> {
    if r.content_length()
        .is_some_and(|n| n > MAX_ANSWER_BYTES as u64)
    {
        return Ok(None);
    }
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = r.chunk().await? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body.freeze()))
}

/// The `error.code` of a registry's error body, if it has one.
fn error_code(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<ErrorBody>(body)
        .ok()
        .map(|e| e.error.code)
}

/// Checks one registry base URL (trimmed, trailing `/` removed): https, or
/// http on a loopback host.
fn check_base(base: &str) -> Result<String, ConfigError> {
    let base = base.trim().trim_end_matches('/').to_string();
    if base.is_empty() {
        return Err(ConfigError("the registry URL is empty".into()));
    }
    let url =
        url::Url::parse(&base).map_err(|e| ConfigError(format!("invalid registry URL: {e}")))?;
    let loopback = match url.host() {
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    };
    match url.scheme() {
        "https" => Ok(base),
        "http" if loopback => Ok(base),
        _ => Err(ConfigError(
            "the registry URL must be https (http only on loopback)".into(),
        )),
    }
}

impl RegistryClient {
    /// A client for `base`: one registry URL, or several nodes of one
    /// registry comma-separated (`https://a,https://b`), tried in turn —
    /// starting with the one that answered last — when one cannot be reached,
    /// so a fleet needs no load balancer to survive a node. Each is trimmed,
    /// its trailing `/` removed, and must be https, or http on a loopback
    /// host. `bearer` is trimmed and must not be empty. `show_bodies`: quote
    /// error bodies in errors (off when they might echo secrets).
    pub fn new(
        base: &str,
        bearer: &str,
        account_id: Option<String>,
        show_bodies: bool,
    ) -> Result<RegistryClient, ConfigError> {
        let bases = base
            .split(',')
            .map(check_base)
            .collect::<Result<Vec<_>, _>>()?;
        let bearer = bearer.trim().to_string();
        if bearer.is_empty() {
            return Err(ConfigError("the registry token is empty".into()));
        }
        let mut http = reqwest::Client::builder();
        for root in crate::tls::extra_roots().map_err(|e| ConfigError(e.to_string()))? {
            let cert = reqwest::Certificate::from_der(&root)
                .map_err(|e| ConfigError(format!("{}: {e}", crate::tls::CA_FILE_ENV)))?;
            http = http.add_root_certificate(cert);
        }
        let http = http
            .redirect(reqwest::redirect::Policy::none())
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| ConfigError(format!("cannot build the HTTP client: {e}")))?;
        Ok(RegistryClient {
            bases,
            current: Default::default(),
            bearer,
            account_id: account_id.filter(|a| !a.trim().is_empty()),
            http,
            show_bodies,
        })
    }

    /// The registry nodes' base URLs, in the order given.
    pub fn bases(&self) -> &[String] {
        &self.bases
    }

    async fn post<Req: serde::Serialize, Resp: serde::de::DeserializeOwned>(
        &self,
        env: &str,
        action: &str,
        body: &Req,
        extra: Option<(&str, &str)>,
    ) -> Result<Resp, RegistryError> {
        use std::sync::atomic::Ordering;
        let body = serde_json::to_vec(body).map_err(|e| RegistryError::Protocol(e.to_string()))?;
        let first = self.current.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        let mut answered = None;
        let mut busy = None;
        for i in 0..self.bases.len() {
            let at = (first + i) % self.bases.len();
            let mut req = self
                .http
                .post(format!(
                    "{}/cloud/environment/{env}/{action}",
                    self.bases[at]
                ))
                .header("content-type", "application/json")
                .header("authorization", format!("Bearer {}", self.bearer))
                .body(body.clone());
            if let Some((k, v)) = extra {
                req = req.header(k, v);
            }
            if let (Some(a), "connect") = (&self.account_id, action) {
                req = req.header("chatgpt-account-id", a);
            }
            let sent: Result<_, reqwest::Error> = async {
                let r = req.send().await?;
                let status = r.status().as_u16();
                Ok((status, read_bounded(r).await?))
            }
            .await;
            match sent {
                Ok((_, None)) => {
                    return Err(RegistryError::Protocol(format!(
                        "{}: an answer over {MAX_ANSWER_BYTES} bytes",
                        self.bases[at]
                    )))
                }
                // A node at its connection limit (or not ready) answers
                // 503: the next node may serve. Not when its database is
                // unreachable: the nodes share it, and each would wait for
                // it in turn.
                Ok((503, Some(bytes)))
                    if i + 1 < self.bases.len()
                        && error_code(&bytes).as_deref() != Some("store_unavailable") =>
                {
                    let code = error_code(&bytes).unwrap_or_default();
                    tracing::warn!(registry = %self.bases[at], "registry node answered 503 {code}; trying the next");
                    failures.push(format!("{}: 503 {code}", self.bases[at]));
                    // Kept: if no node serves, this answer (its code, e.g.
                    // `registration_conflict`) is the one to report.
                    busy = Some((503, bytes));
                }
                Ok((status, Some(bytes))) => {
                    self.current.store(at, Ordering::Relaxed);
                    answered = Some((status, bytes));
                    break;
                }
                Err(e) => {
                    let why = crate::causes::chain(&e.without_url());
                    if self.bases.len() > 1 {
                        tracing::warn!(registry = %self.bases[at], "registry node unreachable: {why}");
                    }
                    failures.push(format!("{}: {why}", self.bases[at]));
                }
            }
        }
        let Some((status, bytes)) = answered.or(busy) else {
            return Err(RegistryError::Transport(failures.join("; ")));
        };
        if (200..300).contains(&status) {
            return serde_json::from_slice(&bytes)
                .map_err(|_| RegistryError::Protocol(format!("invalid {action} response")));
        }
        let (code, message) = match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(e) => (e.error.code, e.error.message),
            Err(_) => (
                String::new(),
                String::from_utf8_lossy(&bytes)
                    .trim()
                    .chars()
                    .take(ERROR_BODY_PREVIEW)
                    .collect(),
            ),
        };
        let message = if self.show_bodies {
            message
        } else {
            "response body omitted".into()
        };
        if status == 401 || status == 403 {
            return Err(RegistryError::Auth { status, message });
        }
        Err(RegistryError::Http {
            status,
            code,
            message,
        })
    }

    /// Registers an executor key. Checks the answer names this environment and profile.
    pub async fn register(
        &self,
        env: &str,
        key: &PublicKey,
    ) -> Result<RegisterResponse, RegistryError> {
        let r: RegisterResponse = self
            .post(
                env,
                "register",
                &RegisterRequest {
                    security_profile: SECURITY_PROFILE.into(),
                    executor_public_key: key.to_wire(),
                },
                None,
            )
            .await?;
        if r.environment_id != env || r.security_profile != SECURITY_PROFILE {
            return Err(RegistryError::Protocol(
                "registration for another environment or profile".into(),
            ));
        }
        if r.executor_registration_id.trim().is_empty() || r.url.trim().is_empty() {
            return Err(RegistryError::Protocol("incomplete registration".into()));
        }
        Ok(r)
    }

    /// Asks to connect a harness key. Checks the answer is complete.
    pub async fn connect(
        &self,
        env: &str,
        key: &PublicKey,
    ) -> Result<ConnectResponse, RegistryError> {
        let r: ConnectResponse = self
            .post(
                env,
                "connect",
                &ConnectRequest {
                    harness_public_key: key.to_wire(),
                },
                None,
            )
            .await?;
        if r.environment_id != env || r.security_profile != SECURITY_PROFILE {
            return Err(RegistryError::Protocol(
                "connection data for another environment or profile".into(),
            ));
        }
        if r.url.trim().is_empty()
            || r.executor_registration_id.trim().is_empty()
            || r.harness_key_authorization.trim().is_empty()
        {
            return Err(RegistryError::Protocol(
                "incomplete Noise connection data".into(),
            ));
        }
        Ok(r)
    }

    /// Asks whether a harness key may use this registration (one stream).
    pub async fn validate(
        &self,
        env: &str,
        stream_id: &str,
        req: &ValidateRequest,
    ) -> Result<bool, RegistryError> {
        // The body may be echoed with the authorization in it: never quote it.
        let quiet = RegistryClient {
            show_bodies: false,
            ..self.clone()
        };
        let r: ValidateResponse = quiet
            .post(env, "validate", req, Some((STREAM_ID_HEADER, stream_id)))
            .await?;
        Ok(r.valid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::OsRandom;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A node that answers every request with `status` and the error body
    /// `code`; its base URL and how many requests it took.
    async fn node(status: u16, code: &'static str) -> (String, Arc<AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", l.local_addr().unwrap());
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 8192];
                let _ = s.read(&mut buf).await;
                counted.fetch_add(1, Ordering::SeqCst);
                let body = format!(r#"{{"error":{{"code":"{code}","message":"m"}}}}"#);
                let answer = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            }
        });
        (base, hits)
    }

    fn key() -> PublicKey {
        crate::keys::Identity::generate(&mut OsRandom).public_key()
    }

    /// A node that cannot reach the database the nodes share answers for
    /// all of them (the next would wait for it too: with three URLs the
    /// caller's timeout hid the clear 503 behind its own); a node not ready
    /// is passed over for the next.
    #[tokio::test]
    async fn a_shared_database_down_is_reported_at_once_and_a_node_not_ready_passed_over() {
        let (next, next_hits) = node(404, "environment_not_found").await;
        let (down, _) = node(503, "store_unavailable").await;
        let c = RegistryClient::new(&format!("{down},{next}"), "t", None, true).unwrap();
        match c.connect("env", &key()).await {
            Err(RegistryError::Http {
                status: 503, code, ..
            }) => {
                assert_eq!(code, "store_unavailable")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            next_hits.load(Ordering::SeqCst),
            0,
            "the next node was asked"
        );
        let (busy, _) = node(503, "not_ready").await;
        let c = RegistryClient::new(&format!("{busy},{next}"), "t", None, true).unwrap();
        match c.connect("env", &key()).await {
            Err(RegistryError::Http { status: 404, .. }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(next_hits.load(Ordering::SeqCst), 1);
    }

    /// An answer over 1 MiB is refused as it comes, not read whole (a
    /// hostile registry's 1.5 GiB answer took an executor to 3 GiB).
    #[tokio::test]
    async fn an_oversized_answer_is_refused_unread() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", l.local_addr().unwrap());
        let sent = Arc::new(AtomicUsize::new(0));
        let counted = sent.clone();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 8192];
            let _ = s.read(&mut buf).await;
            // No length: the body runs until the connection ends.
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n";
            s.write_all(head.as_bytes()).await.unwrap();
            let block = vec![b' '; 64 << 10];
            for _ in 0..(64 << 20) / block.len() {
                if s.write_all(&block).await.is_err() {
                    return;
                }
                counted.fetch_add(block.len(), Ordering::SeqCst);
            }
        });
        let c = RegistryClient::new(&base, "t", None, true).unwrap();
        match c.connect("env", &key()).await {
            Err(RegistryError::Protocol(m)) => assert!(m.contains("over 1048576 bytes"), "{m}"),
            other => panic!("{other:?}"),
        }
        let sent = sent.load(Ordering::SeqCst);
        assert!(sent < 16 << 20, "{sent} bytes were taken");
    }

    /// An unreachable node's error says why (reqwest alone says "error
    /// sending request").
    #[tokio::test]
    async fn an_unreachable_registry_says_why() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", l.local_addr().unwrap());
        drop(l);
        let c = RegistryClient::new(&base, "t", None, true).unwrap();
        match c.connect("env", &key()).await {
            Err(RegistryError::Transport(why)) => {
                assert!(why.contains("Connection refused"), "{why}")
            }
            other => panic!("{other:?}"),
        }
    }
}
