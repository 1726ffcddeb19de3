//! A small HTTP/1.1 front: one request per connection (`Connection: close`),
//! bounded head and body, then either a JSON answer or a WebSocket upgrade.
//! With TLS configured every connection is a TLS connection first (a client
//! has [`REQUEST_TIMEOUT`] for the handshake and its request together).

use super::{Registry, Reply};
use crate::api::REJECTION_HEADER;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

/// Largest request head: 16 KiB.
const MAX_HEAD: usize = 16 * 1024;
/// Largest request body: 64 KiB (a connect body is about 1.7 KB).
const MAX_BODY: usize = 64 * 1024;
/// Time a client has to send its whole request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) async fn serve(registry: Arc<Registry>, listener: TcpListener) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("registry accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let registry = registry.clone();
        match registry.config.tls.clone() {
            None => {
                tokio::spawn(async move { handle(registry, stream).await });
            }
            Some(tls) => {
                tokio::spawn(async move {
                    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
                    match tokio::time::timeout(REQUEST_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => handle(registry, stream).await,
                        Ok(Err(e)) => tracing::debug!("tls handshake failed: {e}"),
                        Err(_) => tracing::debug!("tls handshake timed out"),
                    }
                });
            }
        }
    }
}

struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body_start: Vec<u8>,
    content_length: usize,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> Option<Request> {
    let mut buf = Vec::with_capacity(2048);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let headers: Vec<(String, String)> = req
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_string(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect();
                let content_length = headers
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, v)| v.trim().parse().ok())
                    .unwrap_or(0);
                return Some(Request {
                    method: req.method?.to_string(),
                    path: req.path?.to_string(),
                    headers,
                    body_start: buf[len..].to_vec(),
                    content_length,
                });
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => continue,
            _ => return None,
        }
    }
}

async fn respond<S: AsyncWrite + Unpin>(stream: &mut S, reply: Reply) {
    let reason = match reply.status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let mut head = format!(
        "HTTP/1.1 {} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        reply.status,
        reply.body.len()
    );
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(reply.body.as_bytes()).await;
    let _ = stream.shutdown().await;
}

fn bearer(req: &Request) -> Option<&str> {
    let v = req.header("authorization")?.trim();
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

async fn handle<S>(registry: Arc<Registry>, mut stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Ok(Some(req)) = tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut stream)).await else {
        return;
    };
    let (path, query) = match req.path.split_once('?') {
        Some((p, q)) => (p.to_string(), q.to_string()),
        None => (req.path.clone(), String::new()),
    };
    if req.method == "GET" && path == "/relay" {
        return upgrade(registry, stream, &req, &query).await;
    }
    if req.method == "GET" && (path == "/livez" || path == "/readyz") {
        let reply = match (path.as_str(), registry.ready()) {
            ("/livez", _) | (_, Ok(())) => Reply::json(&serde_json::json!({
                "status": "ok", "node": registry.node_id()
            })),
            (_, Err(why)) => Reply::error(503, "not_ready", &why),
        };
        return respond(&mut stream, reply).await;
    }
    let Some(rest) = path.strip_prefix("/cloud/environment/") else {
        return respond(
            &mut stream,
            Reply::error(404, "not_found", "no such endpoint"),
        )
        .await;
    };
    if req.method != "POST" {
        return respond(
            &mut stream,
            Reply::error(405, "method_not_allowed", "use POST"),
        )
        .await;
    }
    if req.content_length > MAX_BODY {
        return respond(
            &mut stream,
            Reply::error(413, "too_large", "request body too large"),
        )
        .await;
    }
    let mut body = req.body_start.clone();
    if body.len() < req.content_length {
        let mut more = vec![0u8; req.content_length - body.len()];
        if tokio::time::timeout(REQUEST_TIMEOUT, stream.read_exact(&mut more))
            .await
            .map_or(true, |r| r.is_err())
        {
            return;
        }
        body.extend_from_slice(&more);
    }
    body.truncate(req.content_length);
    // `{id}/{action}`: the id is the first segment, taken as sent (a valid id
    // never needs percent-encoding, so an encoded one is refused as invalid).
    let Some((env, action)) = rest.split_once('/') else {
        return respond(
            &mut stream,
            Reply::error(404, "not_found", "no such endpoint"),
        )
        .await;
    };
    let reply = registry.handle_post(env, action, bearer(&req), &body).await;
    respond(&mut stream, reply).await;
}

async fn upgrade<S>(registry: Arc<Registry>, mut stream: S, req: &Request, query: &str)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let key = match (req.header("upgrade"), req.header("sec-websocket-key")) {
        (Some(u), Some(k)) if u.eq_ignore_ascii_case("websocket") => k.trim().to_string(),
        _ => {
            return respond(
                &mut stream,
                Reply::error(400, "bad_request", "expected a WebSocket upgrade"),
            )
            .await
        }
    };
    let admitted = match registry.admit_upgrade(query).await {
        Ok(a) => a,
        Err(reason) => {
            let mut r = Reply::error(403, reason, "relay upgrade refused");
            r.headers.push((REJECTION_HEADER, reason.to_string()));
            return respond(&mut stream, r).await;
        }
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let head = format!(
        "HTTP/1.1 101 Switching Protocols\r\nconnection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-accept: {accept}\r\n\r\n"
    );
    if stream.write_all(head.as_bytes()).await.is_err() || !req.body_start.is_empty() {
        return;
    }
    let mut cfg = WebSocketConfig::default();
    cfg.max_message_size = Some(crate::frame::MAX_FRAME_BYTES);
    cfg.max_frame_size = Some(crate::frame::MAX_FRAME_BYTES);
    let ws =
        tokio_tungstenite::WebSocketStream::from_raw_socket(stream, Role::Server, Some(cfg)).await;
    registry.serve_socket(ws, admitted).await;
}
