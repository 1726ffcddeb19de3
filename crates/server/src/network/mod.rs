//! The server side of `networkProxy` (SANDBOX.md §3): turning the wire's
//! launch config into the proxy crate's [`Launch`], and [`ClientDecider`],
//! the proxy's [`Decider`] that asks the session's client with the
//! server→client request `network/policyRequest` and reports each decision
//! with the notification `network/policyDecision`. The proxy itself lives in
//! `exec-server-netproxy`.

pub mod handover;
pub mod masking;

use crate::link::Link;
use exec_server_netproxy::{
    Answer, AskFailure, BoxFuture, Decider, Decision, Destination, Launch, Pattern, Proxy, Rules,
    Verdict,
};
use exec_server_protocol::types::{
    DomainPermission, NetworkDecision, NetworkMode, NetworkPolicyDecisionNotification,
    NetworkPolicyRequestParams, NetworkPolicyRequestResult, NetworkRequestInfo,
    RemoteNetworkProxyLaunchConfig,
};
use exec_server_protocol::{encode_notification, methods};
use exec_server_rpc::CallError;
use exec_server_sandbox::ProxyRoute;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Added to `policyDecisionTimeoutMs` for the transport: 5 s (the reference's margin).
pub const TRANSPORT_MARGIN: Duration = Duration::from_secs(5);
/// Longest decision reason accepted from the client: 1024 bytes.
pub const MAX_REASON_BYTES: usize = 1024;

/// Why a start with `enforceManagedNetwork` and no `sandbox` is refused as
/// invalid params (ours: the reference silently ignores the flag then).
pub const ENFORCE_NEEDS_SANDBOX: &str =
    "enforceManagedNetwork requires a sandbox: without one the \
     command could bypass the network proxy (refused rather than run unenforced)";

/// Server-wide transparent-TCP settings (0.171.0's flags).
///
/// Decision (the reference's source was not available to check): the flag
/// is the server's default and the request's `proxy.transparentTcp` wins
/// when present, so a client that asks gets it (the capability promises the
/// field works) and one that says `false` keeps raw TCP blocked. It applies
/// only to sandboxes routed through the proxy (enforced managed network);
/// without a sandbox raw TCP is not intercepted at all.
#[derive(Debug, Clone, Default)]
pub struct TransparentTcpConfig {
    /// `--linux-sandbox-transparent-tcp`: route raw TCP of routed sandboxes
    /// whose request does not say `transparentTcp`.
    pub default_on: bool,
    /// `--tcp-upstream-proxy HOST:PORT`: every SOCKS5 `CONNECT` of a managed
    /// proxy (transparent or explicit) leaves through this HTTP CONNECT proxy.
    pub upstream_proxy: Option<String>,
}

impl TransparentTcpConfig {
    /// Whether this host can route transparent TCP (Linux 5.9+); a server
    /// asked to do it by default where it cannot refuses to start.
    pub fn supported() -> bool {
        exec_server_sandbox::transparent::supported()
    }

    /// Whether a process with `cfg`, routed or not, gets transparent TCP.
    pub fn enabled_for(&self, cfg: &RemoteNetworkProxyLaunchConfig, routed: bool) -> bool {
        routed && cfg.proxy.transparent_tcp.unwrap_or(self.default_on)
    }
}

/// A process's running proxy: the listeners, and for a sandboxed process
/// the private directory of its Unix sockets (removed when dropped, after
/// the proxy).
pub struct RunningProxy {
    /// The proxy.
    pub proxy: Proxy,
    /// How the sandbox reaches it, when routed.
    pub route: Option<ProxyRoute>,
    /// The CA bundle naming the proxy's interception CA, when it intercepts.
    pub ca: Option<masking::CaBundle>,
    _dir: Option<SocketDir>,
    /// What it was started from, for an upgrade ([`handover`]).
    cfg: RemoteNetworkProxyLaunchConfig,
    process_id: String,
    masking: Option<Arc<exec_server_netproxy::mask::Masking>>,
}

impl RunningProxy {
    /// The child's variables: the proxy's (SANDBOX.md §3.1) and, when the
    /// proxy intercepts, the CA bundle's.
    pub fn child_env(&self) -> Vec<(String, String)> {
        let mut v = self.proxy.child_env();
        if let Some(ca) = &self.ca {
            v.extend(ca.child_env());
        }
        v
    }
}

/// A private (0700) directory for the proxy's Unix sockets and CA bundle, in
/// the server's [`crate::rundir::RuntimeDir`]; removed with everything in
/// it when the process closes.
struct SocketDir(PathBuf);

impl SocketDir {
    fn create(parent: &Path) -> std::io::Result<SocketDir> {
        use std::os::unix::fs::DirBuilderExt;
        let p = parent.join(format!("np-{}", crate::rundir::short_id()));
        std::fs::DirBuilder::new().mode(0o700).create(&p)?;
        Ok(SocketDir(p))
    }
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts the proxy of process `process_id` (its decider asks the client of
/// `link`); `routed`: the process runs in a sandbox whose only exit is this
/// proxy, so it also listens on Unix sockets for the sandbox's bridge, in a
/// new directory under this path (the server's runtime directory);
/// `server`: the server's settings (transparent TCP, extra upstream roots,
/// its own ports, never reachable through the proxy); `mask`: the process's
/// credential masking ([`masking::mask_env`]) and its (masked)
/// environment.
/// Errors: [`Failed`](crate::error::ErrorKind::Failed), with the OS error
/// as its source, when the listeners cannot be bound or the CA bundle
/// cannot be written.
pub async fn start(
    cfg: &RemoteNetworkProxyLaunchConfig,
    process_id: &str,
    link: Arc<Link>,
    routed: Option<&Path>,
    server: &crate::ServerConfig,
    mask: Option<(
        Arc<exec_server_netproxy::mask::Masking>,
        &std::collections::BTreeMap<String, String>,
    )>,
) -> Result<RunningProxy, crate::error::ExecError> {
    let decider = decider_for(cfg, process_id, link);
    let dir = match routed {
        Some(parent) => Some(SocketDir::create(parent).map_err(start_failed)?),
        None => None,
    };
    let env = mask.as_ref().map(|(_, e)| *e);
    let masking = mask.map(|(m, _)| m);
    let dir_path = dir.as_ref().map(|d| d.0.clone());
    let l = launch_for(cfg, dir_path, server, masking.clone());
    let transparent = l.transparent_tcp;
    let proxy = Proxy::start(l, decider).await.map_err(start_failed)?;
    let ca = match (proxy.ca_pem(), env) {
        (Some(pem), Some(env)) => {
            let socket_dir = dir.as_ref().map(|d| d.0.as_path());
            Some(masking::CaBundle::write(pem, env, socket_dir).map_err(start_failed)?)
        }
        _ => None,
    };
    let route = dir.as_ref().map(|d| {
        let mut ports = vec![(
            proxy.http_addr().port(),
            exec_server_netproxy::HTTP_SOCKET.to_string(),
        )];
        if let Some(s) = proxy.socks_addr() {
            ports.push((s.port(), exec_server_netproxy::SOCKS_SOCKET.to_string()));
        }
        ProxyRoute {
            host_dir: d.0.clone(),
            ports,
            transparent,
            allow_all_unix_sockets: cfg.proxy.dangerously_allow_all_unix_sockets,
        }
    });
    Ok(RunningProxy {
        proxy,
        route,
        ca,
        _dir: dir,
        cfg: cfg.clone(),
        process_id: process_id.to_string(),
        masking,
    })
}

fn start_failed(e: std::io::Error) -> crate::error::ExecError {
    crate::error::ExecError::failed(format!("cannot start the network proxy: {e}")).with_source(e)
}

/// The decider of `process_id`'s proxy: it asks the client of `link`.
fn decider_for(
    cfg: &RemoteNetworkProxyLaunchConfig,
    process_id: &str,
    link: Arc<Link>,
) -> Arc<ClientDecider> {
    let timeout = Duration::from_millis(cfg.policy_decision_timeout_ms.unwrap_or(0));
    Arc::new(ClientDecider::new(link, process_id.to_string(), timeout))
}

/// The launch of a proxy for `cfg`: Unix sockets in `dir` when routed, the
/// server's transparent-TCP settings, reserved ports and upstream roots,
/// and the process's `masking`.
fn launch_for(
    cfg: &RemoteNetworkProxyLaunchConfig,
    dir: Option<PathBuf>,
    server: &crate::ServerConfig,
    masking: Option<Arc<exec_server_netproxy::mask::Masking>>,
) -> Launch {
    let tcp = &server.transparent_tcp;
    let mut l = launch(cfg);
    l.transparent_tcp = tcp.enabled_for(cfg, dir.is_some());
    l.unix_dir = dir;
    l.tcp_upstream = tcp.upstream_proxy.clone();
    l.masking = masking;
    l.rules.reserved_local_ports = server.reserved_ports.clone();
    l.upstream_roots = server
        .netproxy_upstream_roots
        .iter()
        .map(|d| exec_server_netproxy::CertificateDer::from(d.clone()))
        .collect();
    l
}

/// The proxy launch for a validated wire config.
pub fn launch(cfg: &RemoteNetworkProxyLaunchConfig) -> Launch {
    let p = &cfg.proxy;
    let mut rules = Rules {
        allow_local_binding: p.allow_local_binding,
        ask: cfg.policy_decision_timeout_ms.is_some(),
        limited: p.mode == NetworkMode::Limited,
        ..Rules::default()
    };
    for (pattern, perm) in p.domains.iter().flatten() {
        match perm {
            DomainPermission::Allow => rules.allow.push(Pattern::new(pattern)),
            DomainPermission::Deny => rules.deny.push(Pattern::new(pattern)),
            DomainPermission::None => {}
        }
    }
    rules.review = p
        .review_domains
        .iter()
        .flatten()
        .map(|d| Pattern::new(d))
        .collect();
    Launch {
        rules,
        socks5: p.enable_socks5,
        socks5_udp: p.enable_socks5 && p.enable_socks5_udp,
        ..Launch::default()
    }
}

/// Asks the client of `link` about destinations, for one process.
pub struct ClientDecider {
    link: Arc<Link>,
    process_id: String,
    timeout: Duration,
    /// The span current when the process was started (its `process/start`
    /// request): each question's span is its child, and the question carries
    /// that span's trace context to the client.
    parent: tracing::Span,
}

impl ClientDecider {
    /// A decider for `process_id`; `decision_timeout` is `policyDecisionTimeoutMs`
    /// (the call waits it plus [`TRANSPORT_MARGIN`]).
    pub fn new(link: Arc<Link>, process_id: String, decision_timeout: Duration) -> Self {
        ClientDecider {
            link,
            process_id,
            timeout: decision_timeout.saturating_add(TRANSPORT_MARGIN),
            parent: tracing::Span::current(),
        }
    }
}

/// Checks a client's result (SANDBOX.md §3.2): the shape, and a reason of at
/// most [`MAX_REASON_BYTES`] with no control characters.
pub fn parse_answer(v: serde_json::Value) -> Result<Answer, AskFailure> {
    let r: NetworkPolicyRequestResult = serde_json::from_value(v)
        .map_err(|e| AskFailure::Invalid(format!("malformed decision: {e}")))?;
    let (verdict, reason) = match r.decision {
        NetworkDecision::Allow => (Verdict::Allow, None),
        NetworkDecision::Deny { reason } => (Verdict::Deny, reason),
        NetworkDecision::Ask { reason } => (Verdict::Ask, reason),
    };
    if let Some(r) = &reason {
        if r.len() > MAX_REASON_BYTES || r.chars().any(char::is_control) {
            return Err(AskFailure::Invalid(
                "decision reason too long or has control characters".into(),
            ));
        }
    }
    Ok(Answer { verdict, reason })
}

impl Decider for ClientDecider {
    fn ask(&self, dest: &Destination) -> BoxFuture<Result<Answer, AskFailure>> {
        let params = NetworkPolicyRequestParams {
            process_id: self.process_id.clone(),
            request: NetworkRequestInfo {
                protocol: dest.protocol.as_str().into(),
                host: dest.host.clone(),
                port: dest.port,
            },
        };
        let link = self.link.clone();
        let timeout = self.timeout;
        let span = tracing::info_span!(
            parent: &self.parent,
            "network/policyRequest",
            otel.kind = "client",
            process_id = %self.process_id,
            port = dest.port,
        );
        Box::pin(tracing::Instrument::instrument(
            async move {
                let params =
                    serde_json::to_value(params).map_err(|e| AskFailure::Invalid(e.to_string()))?;
                match link
                    .call(methods::NETWORK_POLICY_REQUEST, &params, timeout)
                    .await
                {
                    Ok(v) => parse_answer(v),
                    Err(CallError::TimedOut) => Err(AskFailure::TimedOut),
                    Err(CallError::Closed) => Err(AskFailure::Unavailable),
                    Err(CallError::PendingRequestLimitExceeded) => Err(AskFailure::Busy),
                    Err(CallError::Server(e)) => Err(AskFailure::Invalid(format!(
                        "client answered {}: {}",
                        e.code, e.message
                    ))),
                }
            },
            span,
        ))
    }

    fn audit(&self, dest: &Destination, d: &Decision) {
        let Some(out) = self.link.outbound() else {
            return;
        };
        let n = NetworkPolicyDecisionNotification {
            process_id: self.process_id.clone(),
            timestamp: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            scope: "domain".into(),
            decision: d.verdict.as_str().into(),
            source: d.source.as_str().into(),
            reason: d.reason.clone(),
            protocol: dest.protocol.as_str().into(),
            host: dest.host.clone(),
            port: dest.port,
            method: dest.method.clone(),
            client: dest.client.map(|c| c.to_string()),
            policy_override: d.policy_override,
        };
        let Ok(params) = serde_json::to_value(n) else {
            return;
        };
        let text = encode_notification(methods::NETWORK_POLICY_DECISION, &params);
        tokio::spawn(async move {
            let _ = out.send(text).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_are_validated() {
        let ok = parse_answer(json!({"decision": {"type": "deny", "reason": "policy"}})).unwrap();
        assert_eq!(
            (ok.verdict, ok.reason.as_deref()),
            (Verdict::Deny, Some("policy"))
        );
        assert_eq!(
            parse_answer(json!({"decision": {"type": "allow"}}))
                .unwrap()
                .verdict,
            Verdict::Allow
        );
        for bad in [
            json!({"decision": {"type": "deny", "reason": "a\u{1}b"}}),
            json!({"decision": {"type": "ask", "reason": "x".repeat(1025)}}),
            json!({"decision": "allow"}),
            json!({}),
        ] {
            assert!(matches!(parse_answer(bad), Err(AskFailure::Invalid(_))));
        }
        assert!(
            parse_answer(json!({"decision": {"type": "deny", "reason": "x".repeat(1024)}})).is_ok()
        );
    }

    #[test]
    fn launch_maps_the_rules() {
        let cfg: RemoteNetworkProxyLaunchConfig = serde_json::from_value(json!({"proxy": {
            "enabled": true, "enableSocks5": false, "enableSocks5Udp": true, "allowUpstreamProxy": false,
            "dangerouslyAllowAllUnixSockets": false, "mode": "limited", "allowLocalBinding": true,
            "domains": {"a.com": "allow", "b.com": "deny", "c.com": "none"}, "reviewDomains": ["r.com"]}}))
        .unwrap();
        let l = launch(&cfg);
        assert_eq!(l.rules.allow, vec![Pattern::new("a.com")]);
        assert_eq!(l.rules.deny, vec![Pattern::new("b.com")]);
        assert_eq!(l.rules.review, vec![Pattern::new("r.com")]);
        assert!(l.rules.limited && l.rules.allow_local_binding && !l.rules.ask);
        assert!(!l.socks5 && !l.socks5_udp, "UDP needs the SOCKS listener");
    }

    #[test]
    fn transparent_tcp_request_wins_over_the_flag() {
        let cfg = |t: Option<bool>| -> RemoteNetworkProxyLaunchConfig {
            let mut v = json!({"proxy": {
                "enabled": true, "enableSocks5": false, "enableSocks5Udp": false,
                "allowUpstreamProxy": false, "dangerouslyAllowAllUnixSockets": false,
                "mode": "full", "allowLocalBinding": false}});
            if let Some(t) = t {
                v["proxy"]["transparentTcp"] = json!(t);
            }
            serde_json::from_value(v).unwrap()
        };
        let off = TransparentTcpConfig::default();
        let on = TransparentTcpConfig {
            default_on: true,
            upstream_proxy: None,
        };
        assert!(!off.enabled_for(&cfg(None), true));
        assert!(off.enabled_for(&cfg(Some(true)), true));
        assert!(on.enabled_for(&cfg(None), true));
        assert!(!on.enabled_for(&cfg(Some(false)), true));
        assert!(
            !on.enabled_for(&cfg(Some(true)), false),
            "only routed sandboxes"
        );
        assert_eq!(
            exec_server_netproxy::TCP_SOCKET,
            exec_server_sandbox::transparent::SOCKET
        );
        let bad = json!({"proxy": {
            "enabled": true, "enableSocks5": false, "enableSocks5Udp": false,
            "allowUpstreamProxy": false, "dangerouslyAllowAllUnixSockets": false,
            "mode": "full", "allowLocalBinding": false, "transparentTcp": 12345}});
        assert!(serde_json::from_value::<RemoteNetworkProxyLaunchConfig>(bad).is_err());
        // 0.171.0's loopbackPorts (shape unknown here) is tolerated, as every unknown key.
        let extra = json!({"proxy": {
            "enabled": true, "enableSocks5": false, "enableSocks5Udp": false,
            "allowUpstreamProxy": false, "dangerouslyAllowAllUnixSockets": false,
            "mode": "full", "allowLocalBinding": false, "loopbackPorts": [8080]}});
        assert!(serde_json::from_value::<RemoteNetworkProxyLaunchConfig>(extra).is_ok());
    }
}
