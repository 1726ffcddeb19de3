//! Answering the server's `network/policyRequest` (SANDBOX.md §3.2): when a
//! process started with a `networkProxy` reaches a destination its rules
//! leave open, the server's proxy asks the client; the decision stays here.
//! Set a [`NetworkPolicy`] on [`ClientOptions::network_policy`](crate::ClientOptions);
//! without one the client answers -32601 and the server denies.

use exec_server_protocol::types::{NetworkDecision, NetworkPolicyRequestParams};
use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// What a [`NetworkPolicy`] returns.
pub type DecisionFuture = Pin<Box<dyn Future<Output = NetworkDecision> + Send>>;

/// Decides the server's `network/policyRequest`s. The server waits at most
/// the start's `policyDecisionTimeoutMs` + 5 s for the answer, then denies.
pub trait NetworkPolicy: Send + Sync + 'static {
    /// The decision for one destination (`allow`, `deny` or `ask`, with a
    /// reason of at most 1024 bytes and no control characters).
    fn decide(&self, request: NetworkPolicyRequestParams) -> DecisionFuture;
}

impl<F, Fut> NetworkPolicy for F
where
    F: Fn(NetworkPolicyRequestParams) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = NetworkDecision> + Send + 'static,
{
    fn decide(&self, request: NetworkPolicyRequestParams) -> DecisionFuture {
        Box::pin(self(request))
    }
}

/// Allows the listed hosts (case-insensitive, exact names or IP literals)
/// and denies every other with the reason `not in the client's allow list`.
#[derive(Debug, Clone, Default)]
pub struct AllowHosts {
    hosts: BTreeSet<String>,
}

impl AllowHosts {
    /// An allow-list of `hosts`.
    pub fn new<I: IntoIterator<Item = S>, S: AsRef<str>>(hosts: I) -> Self {
        AllowHosts {
            hosts: hosts.into_iter().map(|h| normal(h.as_ref())).collect(),
        }
    }

    /// True when `host` is listed.
    pub fn allows(&self, host: &str) -> bool {
        self.hosts.contains(&normal(host))
    }

    /// The decision for `host`.
    pub fn decision(&self, host: &str) -> NetworkDecision {
        if self.allows(host) {
            NetworkDecision::Allow
        } else {
            NetworkDecision::Deny {
                reason: Some("not in the client's allow list".into()),
            }
        }
    }
}

/// A host as the server's proxy compares it (`netproxy::host::normalize`,
/// which a test holds this to without making the client depend on the
/// proxy): trimmed, lowercase, no trailing dot, no IPv6 brackets.
fn normal(h: &str) -> String {
    let h = h.trim().trim_end_matches('.');
    let h = h
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(h);
    h.to_ascii_lowercase()
}

impl NetworkPolicy for AllowHosts {
    fn decide(&self, request: NetworkPolicyRequestParams) -> DecisionFuture {
        let d = self.decision(&request.request.host);
        Box::pin(async move { d })
    }
}

/// A shared policy, as [`ClientOptions::network_policy`](crate::ClientOptions) holds it.
pub type SharedNetworkPolicy = Arc<dyn NetworkPolicy>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_is_exact_and_case_insensitive() {
        let a = AllowHosts::new(["Example.com", "[::1]"]);
        assert_eq!(a.decision("example.COM."), NetworkDecision::Allow);
        assert_eq!(a.decision("::1"), NetworkDecision::Allow);
        assert!(matches!(
            a.decision("sub.example.com"),
            NetworkDecision::Deny { .. }
        ));
    }

    #[test]
    fn hosts_compare_as_the_proxy_compares_them() {
        for h in [
            "Example.COM.",
            " example.com ",
            "[::1]",
            "[::1].",
            "::1",
            "127.0.0.1",
            "localhost..",
            "[fe80::1%25eth0]",
            "",
            ".",
            "[",
            "ÄÖ.example",
            "a.b.c.D",
        ] {
            assert_eq!(normal(h), exec_server_netproxy::host::normalize(h), "{h:?}");
        }
    }
}
