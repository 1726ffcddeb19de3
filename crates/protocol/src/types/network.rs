//! Managed network: `process/start.networkProxy` (`RemoteNetworkProxyLaunchConfig`,
//! SANDBOX.md §1.4, CAPABILITIES.md §0), the server→client request
//! `network/policyRequest` and the audit notification `network/policyDecision`
//! (SANDBOX.md §3.2).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// `networkProxy` of `process/start`: start an executor-local proxy for this
/// process. Unknown members are ignored, as by the reference (0.169.0).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoteNetworkProxyLaunchConfig {
    /// `proxy` (required): what the proxy allows.
    pub proxy: RemoteNetworkProxyConfig,
    /// `auditMetadata`: opaque to us; kept for the audit trail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_metadata: Option<Value>,
    /// `environmentId`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_id: Option<String>,
    /// `executionId`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    /// `policyDecisionTimeoutMs` (milliseconds): when present, destinations no
    /// rule decides are asked of the client (`network/policyRequest`), waiting
    /// this long plus a 5 s transport margin; when absent they are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_decision_timeout_ms: Option<u64>,
}

/// `networkProxy.proxy` (`RemoteNetworkProxyConfig`): the seven booleans and
/// `mode` are required, the rest optional.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoteNetworkProxyConfig {
    /// `enabled`: must be true for a launch.
    pub enabled: bool,
    /// `enableSocks5`: also start a SOCKS5 listener.
    pub enable_socks5: bool,
    /// `enableSocks5Udp`: the SOCKS5 listener accepts UDP ASSOCIATE.
    pub enable_socks5_udp: bool,
    /// `allowUpstreamProxy`: accepted; this executor never chains to an upstream proxy.
    pub allow_upstream_proxy: bool,
    /// `dangerouslyAllowAllUnixSockets`: a sandbox routed through the proxy may
    /// create `AF_UNIX` sockets (otherwise `socket(AF_UNIX)` fails with `EPERM`,
    /// as the reference); Unix sockets never pass through the proxy.
    pub dangerously_allow_all_unix_sockets: bool,
    /// `mode`: `limited` or `full`.
    pub mode: NetworkMode,
    /// `allowLocalBinding`: loopback/private destinations are allowed without asking.
    pub allow_local_binding: bool,
    /// `domains`: pattern → `allow` / `deny` / `none` (`none` = no rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domains: Option<BTreeMap<String, DomainPermission>>,
    /// `unixSockets`: path → `allow` / `deny`; accepted, not enforced by the proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unix_sockets: Option<BTreeMap<String, UnixSocketPermission>>,
    /// `reviewDomains`: patterns always asked of the client (`networkProxyReviewDomains`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review_domains: Option<Vec<String>>,
    /// `credentialMasking` (`credentialMasking` capability): the child's
    /// environment holds placeholders instead of the built-in providers'
    /// secrets (and those of `credentialProviders`); the proxy puts the real
    /// secret back only in requests to that provider's destinations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_masking: Option<bool>,
    /// `credentialProviders` (`credentialMaskingCustomProviders` capability):
    /// provider name → [`CredentialProviderConfig`], masked besides the
    /// built-in ones when `credentialMasking` is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_providers: Option<BTreeMap<String, CredentialProviderConfig>>,
    /// `transparentTcp` (0.171.0, `networkProxyTransparentTcp`): in an
    /// enforced sandbox, raw TCP connections of programs that ignore the
    /// proxy variables go through the proxy's SOCKS5 policy too. Absent: the
    /// server's `--linux-sandbox-transparent-tcp` decides. A non-boolean is
    /// refused (-32602), as by 0.171.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transparent_tcp: Option<bool>,
}

/// One custom credential provider (`CredentialProviderConfig`; wire names in
/// snake_case, as the reference's: it is the reference's TOML provider
/// struct). Every member is optional (`{}` is accepted; an incomplete
/// provider masks nothing); unknown members are refused (-32602 `unknown
/// field`), as by the reference 0.169.0.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CredentialProviderConfig {
    /// `env`: names of the child's environment variables that may hold the secret.
    pub env: Vec<String>,
    /// `patterns`: regular expressions a value must match in full to be masked
    /// (and the placeholder matches too, so clients that check the shape keep working).
    pub patterns: Vec<String>,
    /// `url_prefixes`: where the secret may go: `https://host[:port][/path]`,
    /// `http://…`, or a bare host (`https` unless it is a loopback host);
    /// a host may start with `*.` (any subdomain).
    pub url_prefixes: Vec<String>,
    /// `url_prefix_from_env`: the name of a child variable holding one more prefix.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url_prefix_from_env: Option<String>,
    /// `auth`: how clients send the secret (`bearer`, `token`, `basic`, `header`).
    pub auth: Vec<CredentialAuthMethod>,
    /// `header`: the header name for `header` authentication.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// `prefix`: text before the secret in that header.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

/// An `auth` entry of a [`CredentialProviderConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CredentialAuthMethod {
    /// `bearer`: `Authorization: Bearer <secret>`.
    Bearer,
    /// `token`: `Authorization: token <secret>`.
    Token,
    /// `basic`: `Authorization: Basic base64(<user>:<secret>)` (or the secret as the pair).
    Basic,
    /// `header`: `<header>: <prefix><secret>`.
    Header,
}

/// `mode` of a [`RemoteNetworkProxyConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// `limited`: plain HTTP requests other than GET, HEAD and OPTIONS are refused.
    Limited,
    /// `full`: any method.
    Full,
}

/// A `domains` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DomainPermission {
    /// `allow`.
    Allow,
    /// `deny`.
    Deny,
    /// `none`: no rule for this pattern.
    None,
}

/// A `unixSockets` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnixSocketPermission {
    /// `allow`.
    Allow,
    /// `deny`.
    Deny,
}

/// -32602 text for `policyDecisionTimeoutMs: 0`.
pub const ZERO_DECISION_TIMEOUT: &str = "network policy decision callback timeout must be nonzero";
/// -32602 text for a callback-enabled start whose `processId` is empty or over 256 bytes.
pub const BAD_CALLBACK_PROCESS_ID: &str =
    "callback-enabled process ID must be non-empty and at most 256 bytes";
/// -32602 text for `proxy.enabled: false`.
pub const PROXY_NOT_ENABLED: &str = "invalid network proxy config: executor-local network proxy \
                                     launch requires an enabled proxy";

impl RemoteNetworkProxyLaunchConfig {
    /// Checks the launch against the process id (SANDBOX.md §1.4, case N7);
    /// the error is the -32602 message.
    pub fn validate(&self, process_id: &str) -> Result<(), &'static str> {
        if !self.proxy.enabled {
            return Err(PROXY_NOT_ENABLED);
        }
        match self.policy_decision_timeout_ms {
            Some(0) => Err(ZERO_DECISION_TIMEOUT),
            Some(_) if process_id.is_empty() || process_id.len() > 256 => {
                Err(BAD_CALLBACK_PROCESS_ID)
            }
            _ => Ok(()),
        }
    }
}

/// The destination of a `network/policyRequest` (`request`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkRequestInfo {
    /// `http`, `https_connect`, `socks5_tcp` or `socks5_udp`.
    pub protocol: String,
    /// Host name or IP literal as the child named it.
    pub host: String,
    /// Destination port.
    pub port: u16,
}

/// Params of the server→client request `network/policyRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicyRequestParams {
    /// The process whose proxy asks.
    pub process_id: String,
    /// The destination.
    pub request: NetworkRequestInfo,
}

/// The client's verdict in a `network/policyRequest` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum NetworkDecision {
    /// `{"type":"allow"}`: forward.
    Allow,
    /// `{"type":"deny","reason":…}`: 403 with this reason.
    Deny {
        /// At most 1024 bytes, no control characters.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// `{"type":"ask","reason":…}`: treated as blocked (decision `ask`).
    Ask {
        /// As for `deny`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

/// Result of `network/policyRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkPolicyRequestResult {
    /// The verdict.
    pub decision: NetworkDecision,
}

/// Params of the audit notification `network/policyDecision`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicyDecisionNotification {
    /// The process whose proxy decided.
    pub process_id: String,
    /// Milliseconds since the Unix epoch.
    pub timestamp: u64,
    /// Always `domain`.
    pub scope: String,
    /// `allow`, `deny` or `ask`.
    pub decision: String,
    /// `decider` (the client answered) or `baseline_policy`.
    pub source: String,
    /// Why (`not_allowed_local`, `denied`, `not_allowed`, `allow`, or the client's reason).
    pub reason: String,
    /// As in [`NetworkRequestInfo`].
    pub protocol: String,
    /// As in [`NetworkRequestInfo`].
    pub host: String,
    /// As in [`NetworkRequestInfo`].
    pub port: u16,
    /// The HTTP method of a plain request (`GET`…), `CONNECT`, or null for SOCKS.
    pub method: Option<String>,
    /// The child's address as seen by the proxy (`127.0.0.1:PORT`), when known.
    pub client: Option<String>,
    /// True when the client allowed a destination the baseline would not have.
    pub policy_override: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn launch(extra: Value) -> Result<RemoteNetworkProxyLaunchConfig, serde_json::Error> {
        let mut v = json!({"proxy": {"enabled": true, "enableSocks5": false, "enableSocks5Udp": false,
            "allowUpstreamProxy": false, "dangerouslyAllowAllUnixSockets": false, "mode": "full",
            "allowLocalBinding": false}});
        if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        serde_json::from_value(v)
    }

    #[test]
    fn required_fields_and_unknown_extras() {
        let c = launch(json!({"policyDecisionTimeoutMs": 2000, "whatever": 1})).unwrap();
        assert_eq!(c.policy_decision_timeout_ms, Some(2000));
        assert_eq!(c.proxy.mode, NetworkMode::Full);
        let missing = json!({"proxy": {"enabled": true, "mode": "full"}});
        assert!(serde_json::from_value::<RemoteNetworkProxyLaunchConfig>(missing).is_err());
        let mut extra = launch(json!({})).unwrap();
        extra.proxy.domains = Some(BTreeMap::from([("a.b".into(), DomainPermission::None)]));
        let back: RemoteNetworkProxyLaunchConfig =
            serde_json::from_value(serde_json::to_value(&extra).unwrap()).unwrap();
        assert_eq!(back, extra);
    }

    #[test]
    fn n7_validation_texts() {
        let zero = launch(json!({"policyDecisionTimeoutMs": 0})).unwrap();
        assert_eq!(zero.validate("p"), Err(ZERO_DECISION_TIMEOUT));
        let cb = launch(json!({"policyDecisionTimeoutMs": 1})).unwrap();
        assert_eq!(cb.validate(""), Err(BAD_CALLBACK_PROCESS_ID));
        assert_eq!(cb.validate(&"x".repeat(257)), Err(BAD_CALLBACK_PROCESS_ID));
        assert_eq!(cb.validate(&"x".repeat(256)), Ok(()));
        assert_eq!(launch(json!({})).unwrap().validate(""), Ok(()));
        let mut off = launch(json!({})).unwrap();
        off.proxy.enabled = false;
        assert_eq!(off.validate("p"), Err(PROXY_NOT_ENABLED));
    }

    #[test]
    fn decision_shapes() {
        let d: NetworkPolicyRequestResult =
            serde_json::from_value(json!({"decision": {"type": "deny", "reason": "no"}})).unwrap();
        assert_eq!(
            d.decision,
            NetworkDecision::Deny {
                reason: Some("no".into())
            }
        );
        assert!(serde_json::from_value::<NetworkPolicyRequestResult>(
            json!({"decision": {"type": "maybe"}})
        )
        .is_err());
    }
}
