//! Remote mode for the client (harness side) and the glue that turns a relay
//! stream into an ordinary JSON-RPC connection (used by the executor too).
//!
//! A [`RelaySource`] reaches an environment by id through a registry: each
//! connection attempt is a fresh `/connect`, socket, stream and handshake
//! pinned to the executor key the registry names (see
//! `exec_server_relay::harness`), so session recovery above works unchanged.

use exec_server_protocol::binary;
use exec_server_relay::harness::{self, HarnessError};
use exec_server_relay::registry_client::RegistryClient;
use exec_server_relay::stream::Channel;
use exec_server_relay::{Identity, OsRandom};
use exec_server_rpc::transport::{self, Inbound};
use exec_server_rpc::{Connection, Outgoing};

/// `CODEX_EXEC_SERVER_NOISE_REGISTRY_URL`: the registry's base URL.
pub const ENV_REGISTRY_URL: &str = "CODEX_EXEC_SERVER_NOISE_REGISTRY_URL";
/// `CODEX_EXEC_SERVER_NOISE_ENVIRONMENT_ID`: the environment to reach.
pub const ENV_ENVIRONMENT_ID: &str = "CODEX_EXEC_SERVER_NOISE_ENVIRONMENT_ID";
/// `CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN`: the harness's bearer (blank = missing).
pub const ENV_AUTH_TOKEN: &str = "CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN";
/// `CODEX_EXEC_SERVER_NOISE_CHATGPT_ACCOUNT_ID`: sent as `chatgpt-account-id` on `/connect`.
pub const ENV_ACCOUNT_ID: &str = "CODEX_EXEC_SERVER_NOISE_CHATGPT_ACCOUNT_ID";

/// An environment reached through a registry and relay.
#[derive(Clone)]
pub struct RelaySource {
    registry: RegistryClient,
    environment_id: String,
    identity: Identity,
}

impl std::fmt::Debug for RelaySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "environment {} via {:?}",
            self.environment_id, self.registry
        )
    }
}

impl RelaySource {
    /// A source for `environment_id` at the registry `base_url` with `token`
    /// (trimmed; must not be empty). The harness identity is made here, once.
    pub fn new(
        base_url: &str,
        environment_id: &str,
        token: &str,
        account_id: Option<String>,
    ) -> Result<RelaySource, String> {
        let environment_id = environment_id.trim();
        if environment_id.is_empty() {
            return Err("the environment id is empty".into());
        }
        let registry =
            RegistryClient::new(base_url, token, account_id, true).map_err(|e| e.to_string())?;
        Ok(RelaySource {
            registry,
            environment_id: environment_id.to_string(),
            identity: Identity::generate(&mut OsRandom),
        })
    }

    /// From the reference's variables: `None` when none is set; an error when
    /// only some are (as the reference).
    pub fn from_env() -> Result<Option<RelaySource>, String> {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        match (
            get(ENV_REGISTRY_URL),
            get(ENV_ENVIRONMENT_ID),
            get(ENV_AUTH_TOKEN),
        ) {
            (None, None, None) => Ok(None),
            (Some(url), Some(env), Some(token)) => {
                RelaySource::new(&url, &env, &token, get(ENV_ACCOUNT_ID)).map(Some)
            }
            _ => Err(format!(
                "{ENV_REGISTRY_URL}, {ENV_ENVIRONMENT_ID} and {ENV_AUTH_TOKEN} must be set together"
            )),
        }
    }

    /// One attempt: a fresh stream to the executor.
    pub async fn connect(&self) -> Result<Connection, String> {
        match harness::connect(&self.registry, &self.environment_id, &self.identity).await {
            Ok(ch) => Ok(connection_from_channel(ch)),
            Err(e @ HarnessError::Authentication) => Err(format!(
                "environment {}: {e} (not the executor the registry named)",
                self.environment_id
            )),
            Err(e) => Err(format!("environment {}: {e}", self.environment_id)),
        }
    }
}

/// Makes a relay stream an ordinary connection. Messages are JSON text (a
/// message that is not UTF-8 is passed on as undecodable) unless both ends
/// agree on binary frames in `initialize`: only ours do, so a reference
/// harness or executor at the other end keeps JSON, while ours get the
/// binary fast path (raw bytes instead of base64) over the relay too.
pub fn connection_from_channel(ch: Channel) -> Connection {
    let (conn, mut end) = transport::binary_channel(ch.peer);
    let Channel {
        mut inbound,
        outbound,
        ..
    } = ch;
    let closer = end.closer.clone();
    let in_tx = end.inbound;
    // JSON text never starts with a binary frame's kind byte; whether binary
    // frames were agreed is checked by the connection's reader.
    let inbound_pump = tokio::spawn(async move {
        loop {
            let m = tokio::select! {
                m = inbound.recv() => m,
                _ = in_tx.closed() => None,
            };
            let Some(m) = m else { break };
            let item = if binary::looks_binary(&m) {
                Inbound::Binary(m.into())
            } else {
                match String::from_utf8(m) {
                    Ok(s) => Inbound::Message(s),
                    Err(_) => Inbound::Invalid("message is not valid UTF-8".into()),
                }
            };
            if in_tx.send(item).await.is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        loop {
            let m = tokio::select! {
                m = end.outbound.recv() => m,
                _ = closer.notified() => None,
            };
            let message = match m {
                None => break,
                Some(Outgoing::Text(m)) => m.into_bytes(),
                Some(Outgoing::Binary(frame)) => Vec::from(frame),
                Some(Outgoing::BinaryParts(head, payload)) => {
                    let mut frame = Vec::with_capacity(head.len() + payload.len());
                    frame.extend_from_slice(&head);
                    frame.extend_from_slice(&payload);
                    frame
                }
                // Never queued: a channel does not stream text.
                Some(Outgoing::Stream(_)) => break,
            };
            if outbound.send(message).await.is_err() {
                break;
            }
        }
        // Closing ends both directions, so the stream (and its socket) goes away.
        inbound_pump.abort();
    });
    conn
}
