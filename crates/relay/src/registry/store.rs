//! Where the registry keeps registrations and harness authorizations, behind
//! [`Store`] so that several registry nodes can later share a database.
//!
//! [`super::sqlite::SqliteStore`] persists (`--db PATH`); [`MemoryStore`] keeps
//! nothing across restarts (tests, and a registry started without `--db`).

use crate::keys::WirePublicKey;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Mutex;

/// The executor currently registered for an environment.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Registration {
    /// Environment id.
    pub environment_id: String,
    /// `executor_registration_id` handed out.
    pub registration_id: String,
    /// The executor's static key.
    pub executor_key: WirePublicKey,
}

/// One `harness_key_authorization`: bound to a harness key, a registration and
/// an environment; single use; expires.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Authorization {
    /// Environment id.
    pub environment_id: String,
    /// Registration it was issued for.
    pub registration_id: String,
    /// The harness key it names.
    pub harness_key: WirePublicKey,
    /// Expiry, seconds since the Unix epoch.
    pub expires_unix: u64,
}

/// A store failure: I/O, a corrupt file, a refused statement, or a database
/// that stayed unreachable ([`StoreError::is_unreachable`]).
#[derive(Debug, thiserror::Error)]
#[error("registry store: {message}")]
pub struct StoreError {
    message: String,
    unreachable: bool,
}

impl StoreError {
    /// A failure described by `message`.
    pub fn new(message: impl Into<String>) -> StoreError {
        StoreError {
            message: message.into(),
            unreachable: false,
        }
    }

    /// The database could not be reached for as long as the store retries.
    pub fn unreachable(message: impl Into<String>) -> StoreError {
        StoreError {
            message: message.into(),
            unreachable: true,
        }
    }

    /// Whether the database could not be reached (worth trying again later),
    /// rather than refusing what was asked.
    pub fn is_unreachable(&self) -> bool {
        self.unreachable
    }

    /// What failed.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Registrations and authorizations. Implementations must be safe to call from
/// many tasks; each call is atomic (across every node sharing the store).
#[async_trait::async_trait]
pub trait Store: Send + Sync {
    /// Sets the environment's registration (replacing any earlier one).
    async fn put_registration(&self, r: Registration) -> Result<(), StoreError>;
    /// The environment's registration.
    async fn registration(&self, environment_id: &str) -> Result<Option<Registration>, StoreError>;
    /// Records an authorization under its opaque token.
    async fn put_authorization(&self, token: &str, a: Authorization) -> Result<(), StoreError>;
    /// Removes and returns the authorization (single use); also drops expired ones.
    async fn take_authorization(
        &self,
        token: &str,
        now_unix: u64,
    ) -> Result<Option<Authorization>, StoreError>;
    /// The key that signs relay URLs; created on first use and kept.
    async fn signing_key(&self) -> Result<[u8; 32], StoreError>;

    /// Records that registry node `node_id` is alive and its relay is at
    /// `ws_base` (each node calls it every [`super::fleet::HEARTBEAT`]).
    /// A store one node owns (memory, SQLite) keeps no fleet: nothing to do.
    async fn node_heartbeat(&self, _node_id: &str, _ws_base: &str) -> Result<(), StoreError> {
        Ok(())
    }
    /// Removes node `node_id` and the attachments it held (a node stopping).
    async fn node_gone(&self, _node_id: &str) -> Result<(), StoreError> {
        Ok(())
    }
    /// Records that `a.node_id` holds the executor socket of `a.environment_id`.
    async fn attach(&self, _a: &Attachment) -> Result<(), StoreError> {
        Ok(())
    }
    /// Removes the attachment `attach_id` of `environment_id` (its socket
    /// ended), unless a newer one replaced it.
    async fn detach(&self, _environment_id: &str, _attach_id: &str) -> Result<(), StoreError> {
        Ok(())
    }
    /// Where `environment_id`'s executor socket is attached, when the node
    /// holding it was heard from within `fresh`.
    async fn attachment(
        &self,
        _environment_id: &str,
        _fresh: std::time::Duration,
    ) -> Result<Option<Attachment>, StoreError> {
        Ok(None)
    }
}

/// Which registry node holds an environment's executor socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// Environment id.
    pub environment_id: String,
    /// The registration the socket was attached for.
    pub registration_id: String,
    /// The node holding the socket.
    pub node_id: String,
    /// That node's relay base URL (`ws://…` or `wss://…`).
    pub ws_base: String,
    /// This attachment (a reconnect on the same node replaces it).
    pub attach_id: String,
}

#[derive(Default, Serialize, Deserialize)]
struct Data {
    #[serde(default)]
    signing_key: Option<String>,
    #[serde(default)]
    registrations: HashMap<String, Registration>,
    #[serde(default)]
    authorizations: HashMap<String, Authorization>,
    /// Expired authorizations are swept when this many are kept (then twice
    /// what is left, at least [`SWEEP_AT_LEAST`]): not only when one is taken.
    #[serde(skip)]
    sweep_at: usize,
}

/// A database store deletes expired authorizations at every this many
/// puts (256), not only when one is taken: a registry whose authorizations
/// were never used kept every one of them.
pub(crate) const SWEEP_EVERY_PUTS: usize = 256;

/// Whether the put counted by `puts` is one that sweeps.
pub(crate) fn sweeps(puts: &std::sync::atomic::AtomicUsize) -> bool {
    (puts.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1).is_multiple_of(SWEEP_EVERY_PUTS)
}

/// Authorizations kept before the first sweep of expired ones: 1 024.
const SWEEP_AT_LEAST: usize = 1024;

impl Data {
    fn signing_key(&mut self) -> ([u8; 32], bool) {
        if let Some(k) = self.signing_key.as_deref().and_then(hex_decode) {
            return (k, false);
        }
        let mut k = [0u8; 32];
        crate::random::Randomness::fill(&mut crate::random::OsRandom, &mut k);
        self.signing_key = Some(k.iter().map(|b| format!("{b:02x}")).collect());
        (k, true)
    }

    fn take(&mut self, token: &str, now: u64) -> Option<Authorization> {
        self.authorizations.retain(|_, a| a.expires_unix >= now);
        self.authorizations.remove(token)
    }
}

fn hex_decode(h: &str) -> Option<[u8; 32]> {
    hex::FromHex::from_hex(h).ok()
}

/// Keeps everything in memory.
#[derive(Default)]
pub struct MemoryStore(Mutex<Data>);

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn put_registration(&self, r: Registration) -> Result<(), StoreError> {
        let mut d = self.0.lock().unwrap_or_else(|p| p.into_inner());
        d.registrations.insert(r.environment_id.clone(), r);
        Ok(())
    }
    async fn registration(&self, env: &str) -> Result<Option<Registration>, StoreError> {
        let d = self.0.lock().unwrap_or_else(|p| p.into_inner());
        Ok(d.registrations.get(env).cloned())
    }
    async fn put_authorization(&self, token: &str, a: Authorization) -> Result<(), StoreError> {
        let mut d = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if d.authorizations.len() >= d.sweep_at.max(SWEEP_AT_LEAST) {
            let now = super::now_unix();
            d.authorizations.retain(|_, a| a.expires_unix >= now);
            d.sweep_at = 2 * d.authorizations.len();
        }
        d.authorizations.insert(token.to_string(), a);
        Ok(())
    }
    async fn take_authorization(
        &self,
        token: &str,
        now: u64,
    ) -> Result<Option<Authorization>, StoreError> {
        let mut d = self.0.lock().unwrap_or_else(|p| p.into_inner());
        Ok(d.take(token, now))
    }
    async fn signing_key(&self) -> Result<[u8; 32], StoreError> {
        let mut d = self.0.lock().unwrap_or_else(|p| p.into_inner());
        Ok(d.signing_key().0)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn key() -> WirePublicKey {
        WirePublicKey {
            suite: crate::keys::SUITE.into(),
            x25519_public_key: "a".into(),
            mlkem768_public_key: "b".into(),
        }
    }

    /// What every store must do: replace registrations, keep the signing key,
    /// hand out an authorization once, and never after it expired.
    pub(crate) async fn contract(s: &dyn Store) {
        let k = s.signing_key().await.unwrap();
        assert_eq!(s.signing_key().await.unwrap(), k);
        assert_eq!(s.registration("e").await.unwrap(), None);
        let mut r = Registration {
            environment_id: "e".into(),
            registration_id: "r0".into(),
            executor_key: key(),
        };
        s.put_registration(r.clone()).await.unwrap();
        r.registration_id = "r".into();
        s.put_registration(r.clone()).await.unwrap();
        assert_eq!(s.registration("e").await.unwrap(), Some(r));
        let a = Authorization {
            environment_id: "e".into(),
            registration_id: "r".into(),
            harness_key: key(),
            expires_unix: 100,
        };
        s.put_authorization("t1", a.clone()).await.unwrap();
        s.put_authorization("t2", a.clone()).await.unwrap();
        assert_eq!(s.take_authorization("t1", 50).await.unwrap(), Some(a));
        assert_eq!(s.take_authorization("t1", 50).await.unwrap(), None);
        assert_eq!(
            s.take_authorization("t2", 101).await.unwrap(),
            None,
            "expired"
        );
    }

    #[tokio::test]
    async fn memory_store_contract() {
        contract(&MemoryStore::default()).await;
    }

    /// Authorizations never taken used to stay until some other one was.
    #[tokio::test]
    async fn expired_authorizations_are_swept_as_more_come() {
        let s = MemoryStore::default();
        let auth = |expires_unix| Authorization {
            environment_id: "e".into(),
            registration_id: "r".into(),
            harness_key: key(),
            expires_unix,
        };
        for i in 0..SWEEP_AT_LEAST {
            s.put_authorization(&format!("old{i}"), auth(1))
                .await
                .unwrap();
        }
        s.put_authorization("new", auth(u64::MAX)).await.unwrap();
        assert_eq!(s.0.lock().unwrap().authorizations.len(), 1);
        assert_eq!(
            s.take_authorization("new", 2).await.unwrap(),
            Some(auth(u64::MAX))
        );
    }
}
