//! `run --allow-host` / `--network-proxy`: the command's traffic goes through
//! a managed proxy on the server (`networkProxy`), and this client answers the
//! proxy's `network/policyRequest`s: hosts given with `--allow-host` are
//! allowed; with no allow-list and a terminal on stdin the person at it is
//! asked; everything else is denied.

use exec_server_client::network::{DecisionFuture, NetworkPolicy};
use exec_server_client::AllowHosts;
use exec_server_protocol::types::{
    NetworkDecision, NetworkMode, NetworkPolicyRequestParams, RemoteNetworkProxyConfig,
    RemoteNetworkProxyLaunchConfig,
};
use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;

/// How long the server waits for an answer from a person: 120 s (plus its
/// 5 s margin); an allow-list answers at once.
const ASK_TIMEOUT_MS: u64 = 120_000;
/// The wait for an allow-list answer: 10 s.
const LIST_TIMEOUT_MS: u64 = 10_000;

/// The CLI's policy: the allow-list, then (when enabled) the terminal.
pub struct CliPolicy {
    allow: AllowHosts,
    ask: bool,
    /// One question at a time on the terminal.
    asking: Arc<std::sync::Mutex<()>>,
}

impl CliPolicy {
    /// The policy for `--allow-host` values; asks on the terminal only when
    /// the list is empty and stdin is a terminal.
    pub fn new(hosts: &[String]) -> Self {
        CliPolicy {
            allow: AllowHosts::new(hosts),
            ask: hosts.is_empty() && std::io::stdin().is_terminal(),
            asking: Arc::default(),
        }
    }

    /// The `networkProxy` to start the command with.
    pub fn launch(&self) -> RemoteNetworkProxyLaunchConfig {
        RemoteNetworkProxyLaunchConfig {
            proxy: RemoteNetworkProxyConfig {
                enabled: true,
                enable_socks5: false,
                enable_socks5_udp: false,
                allow_upstream_proxy: false,
                dangerously_allow_all_unix_sockets: false,
                mode: NetworkMode::Full,
                allow_local_binding: false,
                domains: None,
                unix_sockets: None,
                review_domains: None,
                credential_masking: None,
                credential_providers: None,
                transparent_tcp: None,
            },
            audit_metadata: None,
            environment_id: None,
            execution_id: None,
            policy_decision_timeout_ms: Some(if self.ask {
                ASK_TIMEOUT_MS
            } else {
                LIST_TIMEOUT_MS
            }),
        }
    }
}

impl NetworkPolicy for CliPolicy {
    fn decide(&self, req: NetworkPolicyRequestParams) -> DecisionFuture {
        let host = req.request.host.clone();
        if self.allow.allows(&host) || !self.ask {
            let d = self.allow.decision(&host);
            return Box::pin(async move { d });
        }
        let asking = self.asking.clone();
        Box::pin(async move {
            let question = format!(
                "exec-server: allow network access to {}:{} ({})? [y/N] ",
                host, req.request.port, req.request.protocol
            );
            let yes = tokio::task::spawn_blocking(move || {
                let _one = asking.lock().unwrap_or_else(|p| p.into_inner());
                ask_terminal(&question).unwrap_or(false)
            })
            .await
            .unwrap_or(false);
            if yes {
                NetworkDecision::Allow
            } else {
                NetworkDecision::Deny {
                    reason: Some("refused at the client's terminal".into()),
                }
            }
        })
    }
}

/// Asks on the controlling terminal (not stdin, which the command may be
/// reading): true for an answer starting with `y`.
fn ask_terminal(question: &str) -> std::io::Result<bool> {
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")?;
    let mut out = &tty;
    out.write_all(question.as_bytes())?;
    out.flush()?;
    let mut line = String::new();
    std::io::BufReader::new(&tty).read_line(&mut line)?;
    Ok(line.trim_start().to_ascii_lowercase().starts_with('y'))
}
