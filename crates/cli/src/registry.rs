//! `exec-server registry`: our environment registry and rendezvous relay in one
//! process. Prints its base URL (`http://127.0.0.1:PORT`, `https://…` with TLS,
//! or --public-url) as the only stdout line.

use clap::Args;
use exec_server_relay::registry::hub::DEFAULT_SPLICE_PIPES;
use exec_server_relay::registry::postgres::{self, PostgresStore};
use exec_server_relay::registry::sqlite::SqliteStore;
use exec_server_relay::registry::store::{MemoryStore, Store};
use exec_server_relay::registry::tokens::Tokens;
use exec_server_relay::registry::{Config, Registry};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// `registry` flags.
#[derive(Args, Debug)]
pub struct RegistryArgs {
    /// Address to listen on (IP:PORT; port 0 picks a free one). Without
    /// --tls-cert/--tls-key it serves plain HTTP, which is allowed on loopback only.
    #[arg(long, default_value = "127.0.0.1:0", value_name = "IP:PORT")]
    pub listen: String,
    /// PEM certificate chain: serve HTTPS and WSS (requires --tls-key).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The base URL clients use to reach this registry (`https://HOST:PORT`),
    /// when it differs from the address it listens on (a wildcard address, a
    /// name in the certificate); relay URLs are derived from it.
    #[arg(long, value_name = "URL")]
    pub public_url: Option<String>,
    /// Where registrations, authorizations and the relay-URL signing key are
    /// kept: a PostgreSQL URL (`postgres://USER:PW@HOST:5432/DB`, add
    /// `?sslmode=require` for TLS; several registry nodes can share one
    /// database; tables are created and migrated at start), or the PATH of a
    /// SQLite database (WAL mode; created mode 0600; kept across restarts).
    /// Without it they live in memory.
    #[arg(long, value_name = "URL|PATH")]
    pub db: Option<String>,
    /// Executors' bearer tokens: one a line, `TOKEN`, `sha256:HEX` (of a
    /// token), or `hs256:SECRET [iss=I] [aud=A] [skew=S]` (HS256 JWTs
    /// signed with SECRET, with the claims named), each optionally preceded
    /// by `ENV_ID ` to allow one environment only; `#` starts a comment.
    #[arg(long, value_name = "FILE")]
    pub executor_tokens: Option<PathBuf>,
    /// Harnesses' (clients') bearer tokens, same format.
    #[arg(long, value_name = "FILE")]
    pub harness_tokens: Option<PathBuf>,
    /// Most connections served at once: HTTP requests and relay sockets
    /// (one per attached executor and one per harness stream). Past it a
    /// new connection gets `503 node_at_connection_limit` and is closed, so
    /// the node keeps file descriptors for its database and its listener.
    /// Default: the open-file limit (raised at start to its hard limit)
    /// less 256 and less two per pipe the node may splice frames through
    /// (an eighth of the limit, at most 1 024), at least 64.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Most bytes the node holds for harnesses that do not read, across all
    /// environments (e.g. 512M, 2G). Each stream may hold 32 MiB and each
    /// environment 64 MiB of it; past any of the three budgets the stream
    /// holding the most is reset, and its client resumes its session on a
    /// new stream, losing nothing.
    #[arg(long, value_name = "BYTES", value_parser = crate::commands::parse_bytes,
          default_value = "512M")]
    pub relay_buffer_bytes: u64,
}

/// File descriptors kept back from connections: the store's pool, the
/// listener, logs.
const FD_RESERVE: u64 = 256;

/// Raises the soft open-file limit to the hard one (a node holding
/// thousands of executor sockets needs more than the usual 1024) and
/// returns the soft limit now in force.
fn raise_open_file_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return hard;
    }
    soft
}

/// `--max-connections`, or what the open-file limit allows, and the pipes
/// the node may splice through (an eighth of the limit's descriptors, at
/// most [`DEFAULT_SPLICE_PIPES`]; two descriptors each, left out of the
/// connections' room).
fn fd_limits(asked: Option<usize>) -> (usize, usize) {
    limits_within(raise_open_file_limit(), asked)
}

/// [`fd_limits`] for an open-file limit of `files`.
fn limits_within(files: u64, asked: Option<usize>) -> (usize, usize) {
    let pipes = (files / 8).min(DEFAULT_SPLICE_PIPES as u64);
    let fits = usize::try_from(files.saturating_sub(FD_RESERVE + 2 * pipes))
        .unwrap_or(usize::MAX)
        .max(64);
    let pipes = usize::try_from(pipes).unwrap_or(DEFAULT_SPLICE_PIPES);
    (connection_limit(asked, files, fits), pipes)
}

/// `--max-connections`, or the `fits` connections the open-file limit
/// (`files`) leaves room for.
fn connection_limit(asked: Option<usize>, files: u64, fits: usize) -> usize {
    match asked {
        Some(n) => {
            if n > fits {
                tracing::warn!(
                    "--max-connections {n} is more than the open-file limit ({files}) leaves room for; connections past about {fits} will fail to be accepted"
                );
            }
            n
        }
        None => fits,
    }
}

fn tokens(path: &Option<PathBuf>) -> Result<Option<Tokens>, String> {
    let Some(p) = path else { return Ok(None) };
    // Plain tokens and HS256 secrets are secrets.
    crate::credentials::check_permissions(p);
    let text =
        std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
    Tokens::parse(&text)
        .map(Some)
        .map_err(|e| format!("{}: {e}", p.display()))
}

/// Runs the registry until SIGTERM/SIGINT. Returns the exit code.
pub async fn run(args: RegistryArgs) -> i32 {
    let fail = |m: String| {
        eprintln!("exec-server registry: {m}");
        2
    };
    let addr: SocketAddr = match args
        .listen
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
    {
        Ok(a) => a,
        Err(_) => return fail(format!("`{}` is not IP:PORT", args.listen)),
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => match exec_server_relay::tls::server_config(c, k) {
            Ok(t) => Some(t),
            Err(e) => return fail(e.to_string()),
        },
        _ => None,
    };
    if tls.is_none() && !addr.ip().is_loopback() {
        return fail(format!(
            "refusing plain HTTP on {addr}: plain HTTP is only served on loopback; pass --tls-cert and --tls-key to listen on other addresses"
        ));
    }
    let (executor_tokens, harness_tokens) =
        match (tokens(&args.executor_tokens), tokens(&args.harness_tokens)) {
            (Ok(e), Ok(h)) => (e, h),
            (Err(e), _) | (_, Err(e)) => return fail(e),
        };
    if executor_tokens.is_none() || harness_tokens.is_none() {
        tracing::warn!("without --executor-tokens/--harness-tokens any bearer is accepted");
    }
    let store: Arc<dyn Store> = match &args.db {
        Some(url) if postgres::is_url(url) => match PostgresStore::connect(url).await {
            Ok(s) => Arc::new(s),
            Err(e) => return fail(e.to_string()),
        },
        Some(p) => match SqliteStore::open(std::path::Path::new(p)) {
            Ok(s) => Arc::new(s),
            Err(e) => return fail(e.to_string()),
        },
        None => Arc::new(MemoryStore::default()),
    };
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => return fail(format!("cannot listen on {addr}: {e}")),
    };
    let local = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => return fail(e.to_string()),
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let base = match &args.public_url {
        Some(u) => u.trim_end_matches('/').to_string(),
        None => format!("{scheme}://{local}"),
    };
    let ws_base = match base.split_once("://") {
        Some(("https", rest)) => format!("wss://{rest}"),
        Some(("http", rest)) => format!("ws://{rest}"),
        _ => return fail(format!("`{base}` is not an http(s) URL")),
    };
    let (max_connections, splice_pipes) = fd_limits(args.max_connections);
    let config = Config {
        executor_tokens,
        harness_tokens,
        tls,
        max_connections,
        splice_pipes,
        relay_buffer_bytes: usize::try_from(args.relay_buffer_bytes).unwrap_or(usize::MAX),
        ..Config::default()
    };
    let registry = match Registry::new(config, store, ws_base).await {
        Ok(r) => r,
        Err(e) => return fail(e.to_string()),
    };
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{base}");
        let _ = out.flush();
    }
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => return fail(format!("cannot handle SIGTERM: {e}")),
    };
    tokio::select! {
        _ = registry.clone().serve(listener) => {}
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    // Stopping: the other nodes stop sending harnesses here at once, and this
    // node's executors, whose sockets close as it exits, register elsewhere.
    if let Err(e) = registry.leave().await {
        tracing::warn!(node = registry.node_id(), "cannot leave the fleet: {e}");
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_and_pipes_fit_the_open_file_limit_together() {
        for files in [1024u64, 65_536, 1 << 20] {
            let (connections, pipes) = limits_within(files, None);
            let used = connections as u64 + 2 * pipes as u64 + FD_RESERVE;
            assert_eq!(
                used, files,
                "{files}: {connections} + 2 x {pipes} + reserve"
            );
        }
        assert_eq!(limits_within(1 << 20, None).1, DEFAULT_SPLICE_PIPES);
        assert_eq!(limits_within(1024, None), (512, 128));
        // Asked for: kept as asked.
        assert_eq!(limits_within(1024, Some(5000)).0, 5000);
    }
}
