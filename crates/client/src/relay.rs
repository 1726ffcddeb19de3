//! Remote mode for the client (harness side) and the glue that turns a relay
//! stream into an ordinary JSON-RPC connection (used by the executor too).
//!
//! A [`RelaySource`] reaches an environment by id through a registry: each
//! connection attempt is a fresh `/connect`, socket, stream and handshake
//! pinned to the executor key the registry names (see
//! `exec_server_relay::harness`), so session recovery above works unchanged.

use crate::error::{ConfigError, ConnectionError, ConnectionErrorKind};
use exec_server_relay::harness::{self, HarnessError};
use exec_server_relay::registry_client::RegistryClient;
use exec_server_relay::stream::{Channel, OutMessage, StreamSender};
use exec_server_relay::{Identity, OsRandom, TransportCipher};
use exec_server_rpc::transport;
use exec_server_rpc::Connection;

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
    offer: TransportCipher,
}

impl std::fmt::Debug for RelaySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "environment {} via registry {}",
            self.environment_id,
            self.registry.bases().join(",")
        )
    }
}

impl RelaySource {
    /// A source for `environment_id` at the registry `base_url` with `token`
    /// (trimmed; must not be empty). The harness identity is made here, once.
    /// Errors: an empty id or token, a registry URL that cannot be used.
    pub fn new(
        base_url: &str,
        environment_id: &str,
        token: &str,
        account_id: Option<String>,
    ) -> Result<RelaySource, ConfigError> {
        let environment_id = environment_id.trim();
        if environment_id.is_empty() {
            return Err(ConfigError::new("the environment id is empty"));
        }
        let registry = RegistryClient::new(base_url, token, account_id, true)
            .map_err(|e| ConfigError::new(e.to_string()))?;
        Ok(RelaySource {
            registry,
            environment_id: environment_id.to_string(),
            identity: Identity::generate(&mut OsRandom),
            offer: TransportCipher::preferred(),
        })
    }

    /// This source offering `offer` to the executor on each connection:
    /// [`TransportCipher::Aegis256X2`] (the default unless
    /// `EXEC_SERVER_RELAY_CIPHER=aes-256-gcm`) is taken by our executor and
    /// ignored by the reference's; [`TransportCipher::AesGcm`] offers
    /// nothing, so every record is AES-256-GCM.
    pub fn with_transport_cipher(mut self, offer: TransportCipher) -> RelaySource {
        self.offer = offer;
        self
    }

    /// From the reference's variables: `None` when none is set; an error when
    /// only some are (as the reference).
    pub fn from_env() -> Result<Option<RelaySource>, ConfigError> {
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
            _ => Err(ConfigError::new(format!(
                "{ENV_REGISTRY_URL}, {ENV_ENVIRONMENT_ID} and {ENV_AUTH_TOKEN} must be set together"
            ))),
        }
    }

    /// One attempt: a fresh stream to the executor.
    pub(crate) async fn connect(&self) -> Result<Connection, ConnectionError> {
        let attempt = harness::connect_offering(
            &self.registry,
            &self.environment_id,
            &self.identity,
            self.offer,
        );
        let why = match attempt.await {
            Ok(ch) => return Ok(connection_from_channel(ch)),
            Err(e @ HarnessError::Authentication) => format!(
                "environment {}: {e} (not the executor the registry named)",
                self.environment_id
            ),
            Err(e) => format!("environment {}: {e}", self.environment_id),
        };
        Err(ConnectionError::new(ConnectionErrorKind::Other, why))
    }
}

/// Makes a relay stream an ordinary connection (see
/// [`transport::byte_channels`]): our client's end of a stream, and our
/// executor's. Its messages are sealed in the connection's writing task.
pub fn connection_from_channel(ch: Channel) -> Connection {
    transport::byte_channels(ch.peer, ch.inbound, RelaySink(ch.outbound))
}

/// A relay stream's sending end as a connection's [`transport::MessageSink`].
struct RelaySink(StreamSender);

impl transport::MessageSink for RelaySink {
    async fn send_message(
        &mut self,
        head: bytes::Bytes,
        body: bytes::Bytes,
    ) -> Result<(), transport::Closed> {
        let message = OutMessage { head, body };
        self.0.send(message).await.map_err(|_| transport::Closed)
    }
}
