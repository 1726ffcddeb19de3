//! Listeners: WebSocket (`ws://IP:PORT`), stdio, and Unix sockets (`unix:///path`).

use crate::auth::check_upgrade;
use crate::{connection, ServerState};
use exec_server_rpc::transport;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

/// Read and write buffer of each WebSocket connection: 16 KiB (the library's
/// default, 128 KiB, dominated the memory of an idle connection).
pub const WS_BUFFER_BYTES: usize = 16 * 1024;

/// Time a new socket has to complete the WebSocket upgrade, and then again to
/// complete the JSON-RPC handshake (`initialize` answered, `initialized` received)
/// on a WebSocket or Unix socket connection: 10 s. A connection that misses either
/// is closed, so idle sockets cannot hold `--max-connections` slots.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Sockets allowed in the middle of the upgrade at once: 1024; more are dropped.
pub const MAX_PENDING_HANDSHAKES: usize = 1024;

/// Where to listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// `ws://IP:PORT` (port 0 = ephemeral).
    WebSocket(SocketAddr),
    /// `stdio` or `stdio://`: one connection on stdin/stdout, one message per line.
    Stdio,
    /// `unix:///path/to.sock`: one message per line; socket mode 0600.
    Unix(PathBuf),
}

impl FromStr for ListenAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "stdio" || s == "stdio://" {
            return Ok(ListenAddr::Stdio);
        }
        if let Some(rest) = s.strip_prefix("ws://") {
            let rest = rest.trim_end_matches('/');
            return rest
                .parse()
                .map(ListenAddr::WebSocket)
                .map_err(|_| format!("`{s}` is not ws://IP:PORT (e.g. ws://127.0.0.1:0)"));
        }
        if let Some(path) = s.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(format!(
                    "`{s}` needs an absolute path: unix:///path/to.sock"
                ));
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        Err(format!(
            "unsupported listen address `{s}`: use ws://IP:PORT, stdio, or unix:///path/to.sock"
        ))
    }
}

/// A bound listener.
pub enum Listener {
    /// TCP for WebSocket.
    WebSocket(TcpListener, SocketAddr),
    /// stdio.
    Stdio,
    /// Unix socket and its path.
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// The TCP port it listens on (WebSocket only).
    pub fn tcp_port(&self) -> Option<u16> {
        match self {
            Listener::WebSocket(l, _) => l.local_addr().ok().map(|a| a.port()),
            _ => None,
        }
    }

    /// What an upgrade hands over: the socket's descriptor, `ws` or `unix`,
    /// the URL. `None` for stdio, whose one connection cannot cross.
    pub fn handover(&self) -> Option<(std::os::fd::RawFd, &'static str, String)> {
        use std::os::fd::AsRawFd;
        match self {
            Listener::WebSocket(l, _) => Some((l.as_raw_fd(), "ws", self.url())),
            Listener::Unix(l, _) => Some((l.as_raw_fd(), "unix", self.url())),
            Listener::Stdio => None,
        }
    }

    /// The listener a previous image of this process handed over
    /// ([`Listener::handover`]). Errors: an unknown kind or URL, or a
    /// descriptor that is not such a socket.
    pub fn inherited(fd: std::os::fd::OwnedFd, kind: &str, url: &str) -> std::io::Result<Listener> {
        let bad = || std::io::Error::other(format!("cannot take over listener {kind} {url}"));
        match (kind, url.parse::<ListenAddr>().map_err(|_| bad())?) {
            ("ws", ListenAddr::WebSocket(_)) => {
                let l = std::net::TcpListener::from(fd);
                l.set_nonblocking(true)?;
                let l = TcpListener::from_std(l)?;
                let local = l.local_addr()?;
                Ok(Listener::WebSocket(l, local))
            }
            ("unix", ListenAddr::Unix(path)) => {
                let l = std::os::unix::net::UnixListener::from(fd);
                l.set_nonblocking(true)?;
                Ok(Listener::Unix(UnixListener::from_std(l)?, path))
            }
            _ => Err(bad()),
        }
    }

    /// The URL clients use, printed on start: `ws://127.0.0.1:PORT`, `stdio`,
    /// `unix:///path`.
    pub fn url(&self) -> String {
        match self {
            Listener::WebSocket(_, a) => format!("ws://{a}"),
            Listener::Stdio => "stdio".into(),
            Listener::Unix(_, p) => format!("unix://{}", p.display()),
        }
    }
}

/// Binds `addr`. A stale Unix socket file (nobody accepting) is replaced; a live
/// one is an `AddrInUse` error.
pub async fn bind(addr: &ListenAddr) -> std::io::Result<Listener> {
    match addr {
        ListenAddr::WebSocket(a) => {
            let l = TcpListener::bind(a).await?;
            let local = l.local_addr()?;
            Ok(Listener::WebSocket(l, local))
        }
        ListenAddr::Stdio => Ok(Listener::Stdio),
        ListenAddr::Unix(path) => {
            use std::os::unix::fs::{FileTypeExt, PermissionsExt};
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                if !meta.file_type().is_socket() {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        format!("{} exists and is not a socket", path.display()),
                    ));
                }
                if tokio::net::UnixStream::connect(path).await.is_ok() {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::AddrInUse,
                        format!("{} is in use by a running server", path.display()),
                    ));
                }
                std::fs::remove_file(path)?;
            }
            // Bind with a tight umask so the socket is never reachable by others,
            // not even between bind and chmod.
            // SAFETY: umask only swaps the process's file mode mask.
            let old = unsafe { libc::umask(0o177) };
            let l = UnixListener::bind(path);
            // SAFETY: as above.
            unsafe { libc::umask(old) };
            let l = l?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            Ok(Listener::Unix(l, path.clone()))
        }
    }
}

fn refuse(status: u16, message: &str) -> ErrorResponse {
    let mut resp = http::Response::new(Some(message.to_string()));
    *resp.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::FORBIDDEN);
    resp
}

/// Whether a connection (from `peer`, for the log) is refused: its peer is
/// inside one of this server's sandboxes, or cannot be told apart from one.
fn refused(verdict: crate::sandbox::peers::Verdict, peer: &str) -> bool {
    use crate::sandbox::peers::Verdict;
    match verdict {
        Verdict::Outside => false,
        Verdict::Sandboxed => {
            tracing::warn!(
                peer,
                "refused a connection from inside one of this server's sandboxes"
            );
            true
        }
        Verdict::Unknown => {
            tracing::warn!(
                peer,
                "refused a connection whose peer process cannot be identified"
            );
            true
        }
    }
}

/// Serves connections until the listener fails (WebSocket, Unix) or the single
/// connection ends (stdio).
pub async fn serve(listener: Listener, state: Arc<ServerState>) {
    let slots = Arc::new(Semaphore::new(state.config.max_connections));
    match listener {
        Listener::Stdio => {
            let conn = transport::lines_with_limit(
                tokio::io::stdin(),
                tokio::io::stdout(),
                "exec-server stdio".into(),
                state.config.max_message_bytes,
            );
            // The one stdio client holds no slot another could want: no deadline.
            connection::serve(
                state,
                conn,
                "JSON-RPC message from exec-server stdio".into(),
                None,
            )
            .await;
        }
        Listener::Unix(l, path) => loop {
            let Ok((stream, _)) = l.accept().await else {
                continue;
            };
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                tracing::warn!("connection limit reached; refusing a unix socket connection");
                continue;
            };
            {
                use std::os::fd::AsRawFd;
                let verdict = state.sandbox.pids().judge(stream.as_raw_fd());
                if refused(verdict, &path.display().to_string()) {
                    continue;
                }
            }
            let state = state.clone();
            let peer = format!("exec-server unix socket {}", path.display());
            tokio::spawn(async move {
                let (r, w) = stream.into_split();
                let limit = state.config.max_message_bytes;
                let conn = transport::lines_with_limit(r, w, peer.clone(), limit);
                let context = format!("JSON-RPC message from {peer}");
                connection::serve(state, conn, context, Some(HANDSHAKE_TIMEOUT)).await;
                drop(permit);
            });
        },
        Listener::WebSocket(l, _) => {
            let handshakes = Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES));
            loop {
                let (stream, peer) = match l.accept().await {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                // Sockets that have not finished the upgrade do not hold connection
                // slots (idle sockets must not lock real clients out); they are
                // bounded separately and must finish within HANDSHAKE_TIMEOUT.
                let Ok(handshake_permit) = handshakes.clone().try_acquire_owned() else {
                    tracing::warn!(%peer, "too many pending handshakes; dropping a socket");
                    continue;
                };
                let state = state.clone();
                let slots = slots.clone();
                tokio::spawn(async move {
                    // A sandbox on the host's network reaches loopback too:
                    // never this server (it would start unconfined processes).
                    if let Ok(local) = stream.local_addr() {
                        let judged = state.clone();
                        let verdict = tokio::task::spawn_blocking(move || {
                            judged.sandbox.pids().judge_tcp(local, peer)
                        })
                        .await;
                        let verdict = verdict.unwrap_or(crate::sandbox::peers::Verdict::Unknown);
                        if refused(verdict, &peer.to_string()) {
                            return;
                        }
                    }
                    let auth = state.config.auth.clone();
                    // The slot is taken inside the upgrade callback, before the 101
                    // is sent: a client whose upgrade succeeded holds a slot, so the
                    // next one over the limit is refused with 503 deterministically.
                    let mut slot = None;
                    #[allow(clippy::result_large_err)] // the error type is tungstenite's
                    let callback =
                        |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
                            let h = req.headers();
                            check_upgrade(
                                auth.as_ref(),
                                h.get(http::header::ORIGIN).map(|v| v.as_bytes()),
                                h.get(http::header::AUTHORIZATION).map(|v| v.as_bytes()),
                            )
                            .map_err(|r| refuse(r.status, r.message))?;
                            match slots.try_acquire_owned() {
                                Ok(permit) => slot = Some(permit),
                                Err(_) => return Err(refuse(503, "too many connections")),
                            }
                            Ok(resp)
                        };
                    let mut cfg = WebSocketConfig::default();
                    // Small per-connection buffers: an idle connection costs little,
                    // and the library zeroes its read buffer before every read.
                    cfg.read_buffer_size = WS_BUFFER_BYTES;
                    cfg.write_buffer_size = WS_BUFFER_BYTES;
                    cfg.max_message_size = Some(state.config.max_message_bytes);
                    cfg.max_frame_size = Some(state.config.max_message_bytes);
                    let handshake = tokio_tungstenite::accept_hdr_async_with_config(
                        stream,
                        callback,
                        Some(cfg),
                    );
                    let ws = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                        Ok(Ok(ws)) => ws,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, "websocket handshake refused or failed: {e}");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "websocket handshake timed out");
                            return;
                        }
                    };
                    drop(handshake_permit);
                    let Some(permit) = slot else {
                        // Unreachable: a completed upgrade ran the callback.
                        return;
                    };
                    let name = format!("exec-server websocket {peer}");
                    let conn = transport::websocket(ws, transport::Role::Server, name.clone());
                    connection::serve(
                        state,
                        conn,
                        format!("websocket JSON-RPC message from {name}"),
                        Some(HANDSHAKE_TIMEOUT),
                    )
                    .await;
                    drop(permit);
                });
            }
        }
    }
}
