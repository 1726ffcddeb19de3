//! Several registry nodes on one store (PostgreSQL): which node holds each
//! executor's relay socket, and which nodes are alive.
//!
//! Routing choice: a harness that asks node B for an environment whose
//! executor is attached to node A gets a relay URL naming **A's own** relay
//! (`--public-url`), signed with the key every node shares; it then talks to
//! A directly. No node forwards frames for another: a stream costs no extra
//! hop and no node-to-node link exists to secure, at the price that every
//! node's relay must be reachable by harnesses (each node has a public URL;
//! a load balancer may still front the HTTP endpoints). See ARCHITECTURE.md.
//!
//! Liveness: each node upserts its row every [`HEARTBEAT`]; an attachment
//! counts only while its node was heard from within [`NODE_TIMEOUT`], so an
//! executor whose node died (even by `kill -9`) can register again on
//! another node within that bound, and harnesses are then sent there. A
//! node's silence counts only while another node's heartbeats, landing
//! without a gap for all of [`NODE_TIMEOUT`], prove the database was there
//! to hear it: after the database was away every heartbeat is old, and
//! live nodes must not look gone (their executors' harnesses would be sent
//! to the wrong relay, and a second executor let in). A node that stops
//! cleanly removes its rows at once ([`super::Registry::leave`]).

use super::Registry;
use std::sync::Arc;
use std::time::Duration;

/// How often a node tells the others it is alive: 1 s.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// A node not heard from for this long is gone, and so are its executor
/// attachments: 5 s.
pub const NODE_TIMEOUT: Duration = Duration::from_secs(5);

/// A fresh node id: 12 random hex digits.
pub fn new_node_id() -> String {
    let v = uuid::Uuid::new_v4().as_u128();
    format!("node-{:012x}", v & 0xffff_ffff_ffff)
}

/// Runs the node's heartbeat until the task is dropped.
pub(super) async fn heartbeat(registry: Arc<Registry>) {
    use std::sync::atomic::Ordering;
    let mut first = true;
    loop {
        let beat = registry
            .store
            .node_heartbeat(&registry.node_id, &registry.ws_base)
            .await;
        // Logged on each change only (the first failure, the recovery).
        let was_ok = registry.store_ok.swap(beat.is_ok(), Ordering::Relaxed) || first;
        first = false;
        match beat {
            Ok(()) if !was_ok => {
                tracing::info!(node = %registry.node_id, "registry store reachable again")
            }
            Err(e) if was_ok => tracing::warn!(node = %registry.node_id, "heartbeat failed: {e}"),
            _ => {}
        }
        tokio::time::sleep(HEARTBEAT).await;
    }
}

impl Registry {
    /// This node's id in the fleet.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// `/readyz`: ready once the store answered this node's last heartbeat
    /// (so other nodes know it and it can serve registrations). The error
    /// says why not, naming the node.
    pub fn ready(&self) -> Result<(), String> {
        match self.store_ok.load(std::sync::atomic::Ordering::Relaxed) {
            true => Ok(()),
            false => Err(format!(
                "registry node {}: its store did not answer the last heartbeat",
                self.node_id
            )),
        }
    }

    /// Removes this node and its executor attachments from the store, so
    /// harnesses stop being sent here at once (call when stopping).
    ///
    /// Errors: the store's.
    pub async fn leave(&self) -> Result<(), super::store::StoreError> {
        self.store.node_gone(&self.node_id).await
    }

    /// Whether `env`'s executor is attached to another live node.
    pub(super) async fn live_elsewhere(&self, env: &str) -> Result<bool, super::store::StoreError> {
        Ok(self
            .store
            .attachment(env, NODE_TIMEOUT)
            .await?
            .is_some_and(|a| a.node_id != self.node_id))
    }

    /// The relay base a harness for `env` is sent to: the node holding the
    /// executor's socket, else this one.
    pub(super) async fn relay_base_for(
        &self,
        env: &str,
    ) -> Result<String, super::store::StoreError> {
        Ok(match self.store.attachment(env, NODE_TIMEOUT).await? {
            Some(a) if a.node_id != self.node_id => {
                self.hub.counters.cross_node.inc();
                a.ws_base
            }
            _ => self.ws_base.clone(),
        })
    }
}
