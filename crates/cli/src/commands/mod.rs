//! Client subcommands, one file each: `run`, `shell`, `fs`, `info`. Without
//! `--connect` they talk to a server embedded in this process.

pub mod fs;
pub mod info;
pub mod kill;
mod limits;
mod local_out;
pub use limits::{parse_bytes, parse_duration, parse_limit_list};
mod network;
pub mod ps;
pub mod run;
pub mod shell;
mod terminal;

use clap::Args;
use exec_server_client::{
    ClientError, ClientOptions, ConnectionErrorKind, ExecServerClient, Source,
};
use exec_server_protocol::PathUri;
use std::path::{Path, PathBuf};

/// How to reach a server (shared by client subcommands).
#[derive(Args, Debug, Clone)]
pub struct ConnectArgs {
    /// Server URL: ws://HOST:PORT, wss://…, or unix:///path. Without it, an
    /// embedded server runs in this process (this machine, full protocol, no socket).
    #[arg(long, env = "EXEC_SERVER_URL", value_name = "URL", global = true)]
    pub connect: Option<String>,
    /// File holding a bearer token for --ws-auth servers (or set EXEC_SERVER_TOKEN);
    /// with --registry, the registry token (or set CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN).
    #[arg(long, value_name = "PATH", global = true)]
    pub token_file: Option<PathBuf>,
    /// Reach an environment through this registry and relay (remote mode);
    /// several nodes of one registry, comma-separated, are tried in turn.
    #[arg(
        long,
        value_name = "URL[,URL…]",
        global = true,
        requires = "environment",
        conflicts_with = "connect"
    )]
    pub registry: Option<String>,
    /// The environment id to reach with --registry.
    #[arg(
        long,
        value_name = "ID",
        global = true,
        requires = "registry",
        value_parser = crate::environment_id::EnvironmentIdParser
    )]
    pub environment: Option<String>,
}

impl ConnectArgs {
    /// A client for these arguments, named `name` to the server.
    fn client(&self, name: &str) -> Result<ExecServerClient, String> {
        self.client_with(name, None, None)
    }

    /// Whether these arguments name no server: the client's server is
    /// embedded in this process.
    fn is_embedded(&self) -> bool {
        self.connect.is_none() && self.registry.is_none()
    }

    /// As [`ConnectArgs::client`], answering `network/policyRequest`s with
    /// `policy`; an embedded server takes `sinks` for its starts.
    fn client_with(
        &self,
        name: &str,
        policy: Option<exec_server_client::network::SharedNetworkPolicy>,
        sinks: Option<std::sync::Arc<exec_server::OutputSinks>>,
    ) -> Result<ExecServerClient, String> {
        let token = match &self.token_file {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .map_err(|e| format!("cannot read {}: {e}", p.display()))?
                    .trim()
                    .to_string(),
            ),
            None => std::env::var("EXEC_SERVER_TOKEN").ok(),
        };
        let source = match (&self.registry, &self.connect) {
            (Some(registry), _) => crate::executor::relay_source(
                registry,
                self.environment.as_deref(),
                &self.token_file,
            )?,
            (None, Some(url)) => Source::from_url(url, token).map_err(|e| e.to_string())?,
            (None, None) => {
                let config = exec_server::ServerConfig {
                    output_sinks: sinks,
                    ..Default::default()
                };
                Source::embedded_with(config)
                    .map_err(|e| format!("cannot start the embedded server: {e}"))?
            }
        };
        let mut opts = ClientOptions::new(source);
        opts.client_name = name.into();
        opts.network_policy = policy;
        Ok(ExecServerClient::new(opts))
    }
}

/// Prints `msg` as the command's error; returns exit code 1.
fn fail(msg: impl std::fmt::Display) -> i32 {
    eprintln!("exec-server: {msg}");
    1
}

/// Adds what to do next to errors a user can fix.
fn explain(e: &ClientError) -> String {
    let hint = if e.is_unauthorized() {
        "the server requires a bearer token: pass --token-file PATH or set EXEC_SERVER_TOKEN (or the token given is wrong)"
    } else if e.connection_kind() == Some(ConnectionErrorKind::Tls) {
        "use ws:// for a plain server, or check the wss:// certificate"
    } else if e.is_connection_refused() {
        "is a server running there? start one with: exec-server --listen ws://127.0.0.1:PORT"
    } else {
        return e.to_string();
    };
    format!("{e}\n  {hint}")
}

/// The server's working directory, from `environment/info`.
async fn server_cwd(client: &ExecServerClient) -> Result<PathBuf, String> {
    let info = client.environment_info().await.map_err(|e| explain(&e))?;
    info.cwd
        .and_then(|c| c.to_path().ok())
        .ok_or_else(|| "the server did not report its working directory".to_string())
}

/// A remote path as given: a file: URI, an absolute path, or a path relative to
/// the server's working directory.
async fn remote_path(client: &ExecServerClient, p: &str) -> Result<PathUri, String> {
    if p.starts_with("file:") {
        return PathUri::parse(p);
    }
    let path = Path::new(p);
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        server_cwd(client).await?.join(path)
    };
    PathUri::from_path(&abs).ok_or_else(|| format!("`{p}` is not a valid path"))
}
