//! Where a client connects: a WebSocket URL, a Unix socket, a program spoken to
//! over its stdin/stdout, or a server embedded in this process.

use crate::error::{ConnectionError, ConnectionErrorKind};
use exec_server_rpc::{transport, Connection};
use std::path::PathBuf;
use std::time::Duration;

/// A connection source. More kinds may come: match with a `_` arm.
#[derive(Clone)]
#[non_exhaustive]
pub enum Source {
    /// `ws://` or `wss://` URL, with an optional bearer token.
    WebSocket {
        /// The URL.
        url: String,
        /// Sent as `Authorization: Bearer <token>`.
        token: Option<String>,
    },
    /// `unix:///path`: one JSON message per line.
    Unix(PathBuf),
    /// A program speaking the protocol on stdin/stdout (e.g.
    /// `ssh host exec-server --listen stdio`). Not reconnectable.
    Program {
        /// Program.
        program: String,
        /// Arguments.
        args: Vec<String>,
        /// Extra environment.
        env: Vec<(String, String)>,
        /// Working directory.
        cwd: Option<PathBuf>,
    },
    /// A server running in this process, reached over an in-memory pipe: the full
    /// protocol, no socket. Needs the `embedded` feature.
    #[cfg(feature = "embedded")]
    Embedded(EmbeddedServer),
    /// An environment reached by id through a registry and relay (remote
    /// mode); made with [`Source::relay`]. Needs the `relay` feature.
    #[cfg(feature = "relay")]
    Relay(std::sync::Arc<crate::relay::RelaySource>),
}

/// A server running in this process (what [`Source::embedded`] starts);
/// opaque: its state is the server's own.
#[cfg(feature = "embedded")]
#[derive(Clone)]
pub struct EmbeddedServer(std::sync::Arc<exec_server::ServerState>);

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::WebSocket { url, .. } => write!(f, "{url}"),
            Source::Unix(p) => write!(f, "unix://{}", p.display()),
            Source::Program { program, .. } => write!(f, "program {program}"),
            #[cfg(feature = "embedded")]
            Source::Embedded(_) => f.write_str("embedded server"),
            #[cfg(feature = "relay")]
            Source::Relay(r) => write!(f, "{r:?}"),
        }
    }
}

impl Source {
    /// Parses `ws://…`, `wss://…` or `unix:///…`.
    /// Errors: [`ConnectionErrorKind::Other`] for any other scheme.
    pub fn from_url(url: &str, token: Option<String>) -> Result<Source, ConnectionError> {
        if url.starts_with("ws://") || url.starts_with("wss://") {
            return Ok(Source::WebSocket {
                url: url.to_string(),
                token,
            });
        }
        if let Some(p) = url.strip_prefix("unix://") {
            return Ok(Source::Unix(PathBuf::from(p)));
        }
        Err(ConnectionError::new(
            ConnectionErrorKind::Other,
            format!("unsupported server URL `{url}`: use ws://HOST:PORT or unix:///path"),
        ))
    }

    /// Starts a server in this process and returns a source for it (feature
    /// `embedded`). Errors: the server cannot start, or (`Other`) no Tokio
    /// runtime is running on this thread: the server's tasks need one.
    #[cfg(feature = "embedded")]
    pub fn embedded() -> std::io::Result<Source> {
        Source::embedded_with(exec_server::ServerConfig::default())
    }

    /// [`Source::embedded`] with the server configured by `config` (its
    /// spool, limits, cgroups, tool directories, …). Each embedded server
    /// owns its configuration: several in one process do not share it.
    #[cfg(feature = "embedded")]
    pub fn embedded_with(config: exec_server::ServerConfig) -> std::io::Result<Source> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(std::io::Error::other(
                "the embedded exec-server needs a Tokio runtime: call this from inside one \
                 (e.g. #[tokio::main])",
            ));
        }
        let state = exec_server::ServerState::new(config)?;
        Ok(Source::Embedded(EmbeddedServer(state)))
    }

    /// An environment reached by id through a registry and relay (feature
    /// `relay`).
    #[cfg(feature = "relay")]
    pub fn relay(source: crate::relay::RelaySource) -> Source {
        Source::Relay(std::sync::Arc::new(source))
    }

    /// Whether a dropped connection can be re-established (not for programs).
    pub fn is_reconnectable(&self) -> bool {
        !matches!(self, Source::Program { .. })
    }

    /// Opens one connection within `timeout`.
    pub(crate) async fn connect(&self, timeout: Duration) -> Result<Connection, ConnectionError> {
        tokio::time::timeout(timeout, self.connect_inner())
            .await
            .map_err(|_| {
                ConnectionError::new(
                    ConnectionErrorKind::TimedOut,
                    format!(
                        "connecting to {self:?} timed out after {} ms",
                        timeout.as_millis()
                    ),
                )
            })?
    }

    async fn connect_inner(&self) -> Result<Connection, ConnectionError> {
        let other = |m: String| ConnectionError::new(ConnectionErrorKind::Other, m);
        match self {
            #[cfg(feature = "relay")]
            Source::Relay(r) => r.connect().await,
            Source::WebSocket { url, token } => {
                use tokio_tungstenite::tungstenite::client::IntoClientRequest;
                let mut req = url
                    .as_str()
                    .into_client_request()
                    .map_err(|e| ConnectionError::websocket(format!("bad URL {url}"), e))?;
                if let Some(t) = token {
                    let v = format!("Bearer {t}").parse().map_err(|_| {
                        other("token contains characters not allowed in a header".into())
                    })?;
                    req.headers_mut().insert("authorization", v);
                }
                let mut cfg = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default();
                cfg.max_message_size = Some(exec_server_protocol::MAX_MESSAGE_BYTES);
                cfg.max_frame_size = Some(exec_server_protocol::MAX_MESSAGE_BYTES);
                let (ws, _) = tokio_tungstenite::connect_async_with_config(req, Some(cfg), true)
                    .await
                    .map_err(|e| {
                        ConnectionError::websocket(format!("cannot connect to {url}"), e)
                    })?;
                Ok(transport::websocket(
                    ws,
                    transport::Role::Client,
                    url.clone(),
                ))
            }
            Source::Unix(path) => {
                let s = tokio::net::UnixStream::connect(path).await.map_err(|e| {
                    ConnectionError::io(format!("cannot connect to unix://{}", path.display()), e)
                })?;
                let (r, w) = s.into_split();
                Ok(transport::lines(r, w, format!("unix://{}", path.display())))
            }
            Source::Program {
                program,
                args,
                env,
                cwd,
            } => {
                let mut cmd = tokio::process::Command::new(program);
                cmd.args(args)
                    .envs(env.iter().cloned())
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .kill_on_drop(true);
                if let Some(c) = cwd {
                    cmd.current_dir(c);
                }
                let mut child = cmd
                    .spawn()
                    .map_err(|e| other(format!("cannot start {program}: {e}")).with_source(e))?;
                let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
                    return Err(other(format!("{program}: no stdio pipes")));
                };
                // The child lives as long as the connection's reader holds stdout;
                // wait for it in the background so it is reaped.
                tokio::spawn(async move {
                    let _ = child.wait().await;
                });
                Ok(transport::lines(
                    stdout,
                    stdin,
                    format!("program {program}"),
                ))
            }
            #[cfg(feature = "embedded")]
            Source::Embedded(EmbeddedServer(state)) => {
                // Messages cross as shared bytes, and binary frames are
                // agreed as on a WebSocket: output is never base64 here.
                let (client_conn, server_conn) =
                    transport::channel_pair("embedded server".into(), "embedded client".into());
                tokio::spawn(exec_server::connection::serve(
                    state.clone(),
                    server_conn,
                    "JSON-RPC message from embedded client".into(),
                    None,
                ));
                Ok(client_conn)
            }
        }
    }
}
