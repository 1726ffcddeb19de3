//! `exec-server --remote URL --environment-id ID --registration-bearer-stdin`:
//! serve this machine through a registry and relay (no open port needed). Each
//! relay stream is a full connection of this server (sessions, resume).

use clap::Args;
use exec_server::ServerState;
use exec_server_relay::executor::{self, Config, StreamHandler};
use exec_server_relay::registry_client::RegistryClient;
use std::io::BufRead;
use std::io::Read as _;
use std::sync::Arc;

/// Longest bearer read from stdin: 16 KiB.
const MAX_BEARER_BYTES: usize = 16 * 1024;

/// Remote-mode flags (on the serve command).
#[derive(Args, Debug, Clone, Default)]
pub struct RemoteArgs {
    /// Register with the environment registry at URL and serve through its relay
    /// instead of listening (https, or http on loopback). Several nodes of one
    /// registry, comma-separated (`URL,URL,…`), are tried in turn: when the
    /// node holding this executor's relay socket goes, it registers again
    /// with one that answers.
    #[arg(long, value_name = "URL[,URL…]", requires = "environment_id")]
    pub remote: Option<String>,
    /// The environment id to register as: 1 to 256 of A-Z, a-z, 0-9, `_`, `-`.
    #[arg(
        long,
        value_name = "ID",
        requires = "remote",
        value_parser = crate::environment_id::EnvironmentIdParser
    )]
    pub environment_id: Option<String>,
    /// Read the registry bearer token as one line from stdin (else CODEX_API_KEY).
    #[arg(long, requires = "remote")]
    pub registration_bearer_stdin: bool,
}

/// Whether CODEX_API_KEY may be sent to every registry URL in `urls`
/// (comma-separated).
fn host_allows_api_key(urls: &str) -> bool {
    urls.split(',').all(one_host_allows_api_key)
}

fn one_host_allows_api_key(url: &str) -> bool {
    let Ok(u) = url::Url::parse(url.trim()) else {
        return false;
    };
    let host = u.host_str().unwrap_or("").to_ascii_lowercase();
    let loopback = host == "localhost"
        || host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback());
    let openai = ["openai.com", "openai.org"]
        .iter()
        .any(|d| host == *d || host.ends_with(&format!(".{d}")));
    loopback || (u.scheme() == "https" && openai)
}

/// The registry bearer and whether error bodies may be shown (not for a bearer
/// from stdin).
pub(crate) fn bearer(args: &RemoteArgs, url: &str) -> Result<(String, bool), String> {
    if args.registration_bearer_stdin {
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .take(MAX_BEARER_BYTES as u64 + 1)
            .read_line(&mut line)
            .map_err(|e| format!("cannot read the bearer from stdin: {e}"))?;
        if line.len() > MAX_BEARER_BYTES {
            return Err("the bearer on stdin is longer than 16 KiB".into());
        }
        return Ok((line.trim().to_string(), false));
    }
    match std::env::var("CODEX_API_KEY") {
        Ok(k) if !k.trim().is_empty() => {
            if !host_allows_api_key(url) {
                return Err("CODEX_API_KEY is only sent to https openai.com/openai.org or loopback registries".into());
            }
            Ok((k.trim().to_string(), true))
        }
        _ => Err(
            "no registry credential: pass --registration-bearer-stdin or set CODEX_API_KEY".into(),
        ),
    }
}

/// Counts the executor's relay streams and handshake failures in the
/// server's Prometheus metrics.
struct RelayMetrics;

impl executor::Observer for RelayMetrics {
    fn stream_opened(&self) {
        exec_server::metrics::relay_stream_opened();
    }
    fn stream_closed(&self) {
        exec_server::metrics::relay_stream_closed();
    }
    fn handshake_failed(&self) {
        exec_server::metrics::relay_handshake_failed();
    }
    fn registered(&self) {
        exec_server::metrics::relay_registered();
    }
}

/// The registration credential and whether registry error bodies may be
/// shown (not with a bearer from stdin), as an upgrade hands it over: it
/// was read from stdin once, by the first binary.
pub type Credential = (String, bool);

/// Resolves the flags into an executor (reading the bearer from stdin unless
/// `inherited` carries it) and returns its future, which runs until a fatal
/// registration error (exit code 1), and the credential. Errors: the exit
/// code, after saying why on stderr.
pub fn prepare(
    args: &RemoteArgs,
    state: Arc<ServerState>,
    inherited: Option<Credential>,
) -> Result<
    (
        impl std::future::Future<Output = i32> + Send + 'static,
        Credential,
    ),
    i32,
> {
    let (Some(url), Some(env)) = (&args.remote, &args.environment_id) else {
        eprintln!("exec-server: --remote needs --environment-id");
        return Err(2);
    };
    let (token, show_bodies) = match inherited.map_or_else(|| bearer(args, url), Ok) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("exec-server: {e}");
            return Err(2);
        }
    };
    // With a bearer from stdin, registry error bodies are never shown.
    let registry = match RegistryClient::new(url, &token, None, show_bodies) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("exec-server: {e}");
            return Err(2);
        }
    };
    // Checked at parsing already; again for arguments built in code.
    let env = env.trim().to_string();
    if let Err(e) = exec_server_relay::environment_id::validate(&env) {
        eprintln!("exec-server: {e}");
        return Err(2);
    }
    let handler: StreamHandler = Arc::new(move |ch| {
        let state = state.clone();
        let peer = ch.peer.clone();
        tracing::debug!(%peer, cipher = ?ch.transport_cipher, "relay stream opened");
        let conn = exec_server_client::relay::connection_from_channel(ch);
        // A relay stream is a network peer: the same handshake deadline applies.
        tokio::spawn(exec_server::connection::serve(
            state,
            conn,
            format!("JSON-RPC message from {peer}"),
            Some(exec_server::listen::HANDSHAKE_TIMEOUT),
        ));
    });
    let config = Config {
        registry,
        environment_id: env,
        keepalive: executor::KEEPALIVE,
        pong_timeout: executor::PONG_TIMEOUT,
        observer: Arc::new(RelayMetrics),
        transport_cipher: exec_server_relay::TransportCipher::preferred(),
    };
    let running = async move {
        match executor::run(config, handler).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("exec-server: {e}");
                1
            }
        }
    };
    Ok((running, (token, show_bodies)))
}

/// The client's source for `--registry URL --environment ID`: the token comes
/// from `--token-file` or `CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN`, never argv.
pub fn relay_source(
    registry: &str,
    environment: Option<&str>,
    token_file: &Option<std::path::PathBuf>,
) -> Result<exec_server_client::Source, String> {
    use exec_server_client::relay::{RelaySource, ENV_ACCOUNT_ID, ENV_AUTH_TOKEN};
    let env = environment.ok_or("--registry needs --environment ID")?;
    let token = match token_file {
        Some(p) => {
            std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?
        }
        None => std::env::var(ENV_AUTH_TOKEN).map_err(|_| {
            format!("--registry needs a token: --token-file PATH or {ENV_AUTH_TOKEN}")
        })?,
    };
    let account = std::env::var(ENV_ACCOUNT_ID).ok();
    let source = RelaySource::new(registry, env, &token, account).map_err(|e| e.to_string())?;
    Ok(exec_server_client::Source::relay(source))
}

#[cfg(test)]
mod tests {
    use super::host_allows_api_key;

    #[test]
    fn api_key_host_rule() {
        assert!(host_allows_api_key("https://api.openai.com/x"));
        assert!(host_allows_api_key("https://openai.org"));
        assert!(host_allows_api_key("http://127.0.0.1:5"));
        assert!(host_allows_api_key("http://localhost:5"));
        assert!(!host_allows_api_key("http://api.openai.com"));
        assert!(!host_allows_api_key("https://evilopenai.com"));
        assert!(!host_allows_api_key("https://example.com"));
        assert!(host_allows_api_key("http://127.0.0.1:5,http://localhost:6"));
        assert!(!host_allows_api_key(
            "http://127.0.0.1:5,https://example.com"
        ));
    }
}
