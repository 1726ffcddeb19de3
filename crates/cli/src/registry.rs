//! `exec-server registry`: our environment registry and rendezvous relay in one
//! process. Prints its base URL (`http://127.0.0.1:PORT`) as the only stdout line.

use clap::Args;
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
    /// Address to listen on (IP:PORT; port 0 picks a free one). Plain HTTP, so
    /// loopback only: put a TLS proxy in front to serve other machines.
    #[arg(long, default_value = "127.0.0.1:0", value_name = "IP:PORT")]
    pub listen: String,
    /// Keep registrations, authorizations and the relay-URL signing key in this
    /// SQLite database (WAL mode; created mode 0600; kept across restarts);
    /// without it they live in memory.
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,
    /// Executors' bearer tokens: one a line, `TOKEN` or `sha256:HEX`, optionally
    /// preceded by `ENV_ID ` to allow one environment only.
    #[arg(long, value_name = "FILE")]
    pub executor_tokens: Option<PathBuf>,
    /// Harnesses' (clients') bearer tokens, same format.
    #[arg(long, value_name = "FILE")]
    pub harness_tokens: Option<PathBuf>,
}

fn tokens(path: &Option<PathBuf>) -> Result<Option<Tokens>, String> {
    let Some(p) = path else { return Ok(None) };
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
    if !addr.ip().is_loopback() {
        return fail(
            "plain HTTP is only served on loopback; put a TLS proxy in front for other machines"
                .into(),
        );
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
        Some(p) => match SqliteStore::open(p) {
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
    let config = Config {
        executor_tokens,
        harness_tokens,
        ..Config::default()
    };
    let registry = match Registry::new(config, store, format!("ws://{local}")) {
        Ok(r) => r,
        Err(e) => return fail(e.to_string()),
    };
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "http://{local}");
        let _ = out.flush();
    }
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => return fail(format!("cannot handle SIGTERM: {e}")),
    };
    tokio::select! {
        _ = registry.serve(listener) => {}
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    0
}
