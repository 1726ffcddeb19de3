//! The registry's HTTP/1.1 front, served by hyper: keep-alive, bounded heads
//! ([`MAX_HEAD`]) and bodies ([`MAX_BODY`]), a slow-client timeout on every
//! request head that also closes a keep-alive connection left idle
//! ([`HEAD_TIMEOUT`]), then a JSON answer, the node's metrics, or a
//! WebSocket upgrade for `/relay`. With TLS configured every connection is a
//! TLS connection first (the handshake has [`HEAD_TIMEOUT`] too).

use super::write_deadline::WriteDeadline;
use super::{Registry, Reply};
use crate::api::{MASKED_FRAMES_HEADER, REJECTION_HEADER};
use crate::socket::splice::SharedTcp;
use crate::socket::{Reader, Role, Writer};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;

/// Largest request head: 16 KiB (hyper's read buffer, so also the most a
/// client may send ahead).
const MAX_HEAD: usize = 16 * 1024;
/// Largest request body: 64 KiB (a connect body is about 1.7 KB).
const MAX_BODY: usize = 64 * 1024;
/// Time a client has to send a request head (or to start its next one on a
/// kept-alive connection), its body, or its TLS handshake: 10 s.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a connection past the node's limit has for its TLS handshake and
/// request head (it is answered at once and closed): 1 s, so a flood of
/// them cannot hold the descriptors kept for the database.
const REFUSED_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest a write to a peer may stay blocked (a client that stopped
/// reading): 30 s, as the relay sockets' writers.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

type Body = Full<Bytes>;

/// A connection's place under the node's connection limit, held by the
/// connection's task and, once it is upgraded, by its relay socket's.
type Slot = Arc<tokio::sync::OwnedSemaphorePermit>;

pub(super) async fn serve(registry: Arc<Registry>, listener: TcpListener) {
    let slots = Arc::new(tokio::sync::Semaphore::new(registry.config.max_connections));
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
        let stream = WriteDeadline::new(stream, WRITE_TIMEOUT);
        let registry = registry.clone();
        // None past the limit: the connection is told so and closed.
        let slot = slots.clone().try_acquire_owned().ok().map(Arc::new);
        if slot.is_none() {
            registry.hub.counters.connections_refused.inc();
        }
        match registry.config.tls.clone() {
            None => {
                tokio::spawn(serve_connection(registry, stream, slot));
            }
            Some(tls) => {
                tokio::spawn(async move {
                    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
                    let limit = if slot.is_some() {
                        HEAD_TIMEOUT
                    } else {
                        REFUSED_TIMEOUT
                    };
                    match tokio::time::timeout(limit, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => serve_connection(registry, stream, slot).await,
                        Ok(Err(e)) => tracing::debug!("tls handshake failed: {e}"),
                        Err(_) => tracing::debug!("tls handshake timed out"),
                    }
                });
            }
        }
    }
}

/// Serves one connection's requests until it closes, idles past
/// [`HEAD_TIMEOUT`], or is upgraded to a relay socket. Without a `slot`
/// (the node is at its connection limit) it serves one request within
/// [`REFUSED_TIMEOUT`]: a health probe as usual, anything else 503.
async fn serve_connection<S>(registry: Arc<Registry>, io: S, slot: Option<Slot>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let full = slot.is_none();
    let service = hyper::service::service_fn(move |req| {
        let registry = registry.clone();
        let slot = slot.clone();
        async move { Ok::<_, Infallible>(route(registry, req, slot).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(!full)
        .timer(TokioTimer::new())
        .header_read_timeout(if full { REFUSED_TIMEOUT } else { HEAD_TIMEOUT })
        .max_buf_size(MAX_HEAD)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    if let Err(e) = conn.await {
        tracing::debug!("registry connection ended: {e}");
    }
}

fn respond(reply: Reply) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(reply.body)));
    *r.status_mut() = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let headers = r.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for (name, value) in reply.headers {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(name, v);
        }
    }
    r
}

fn bearer(req: &Request<Incoming>) -> Option<String> {
    let v = req.headers().get(AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_string())
}

/// The answer of a node at its connection limit.
fn at_limit(registry: &Registry) -> Response<Body> {
    let message = format!(
        "registry node {} is serving its limit of {} connections; try another node or later",
        registry.node_id, registry.config.max_connections
    );
    let mut reply = Reply::error(503, "node_at_connection_limit", &message);
    reply.headers.push(("retry-after", "1".into()));
    respond(reply)
}

/// Answers one request; `slot` is the connection's place under the limit,
/// `None` past it (only health probes are then served).
async fn route(
    registry: Arc<Registry>,
    req: Request<Incoming>,
    slot: Option<Slot>,
) -> Response<Body> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    // HEAD is GET without the body (hyper leaves it out), for probes that
    // ask only for the status.
    let get = method == Method::GET || method == Method::HEAD;
    // Probes are answered even past the limit: a busy node is alive.
    if get && (path == "/livez" || path == "/readyz") {
        return respond(match (path.as_str(), registry.ready()) {
            ("/livez", _) | (_, Ok(())) => Reply::json(&serde_json::json!({
                "status": "ok", "node": registry.node_id()
            })),
            (_, Err(why)) => Reply::error(503, "not_ready", &why),
        });
    }
    let Some(slot) = slot else {
        return at_limit(&registry);
    };
    if method == Method::GET && path == "/relay" {
        return upgrade(registry, req, slot).await;
    }
    if get && path == "/metrics" {
        let mut r = Response::new(Full::new(Bytes::from(registry.render_metrics())));
        // What prometheus-client writes (`# EOF`, `_total` counters).
        r.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        );
        return r;
    }
    // `{id}/{action}`: the id is the first segment, taken as sent (a valid id
    // never needs percent-encoding, so an encoded one is refused as invalid).
    let Some((env, action)) = path
        .strip_prefix("/cloud/environment/")
        .and_then(|rest| rest.split_once('/'))
    else {
        return respond(Reply::error(404, "not_found", "no such endpoint"));
    };
    if method != Method::POST {
        return respond(Reply::error(405, "method_not_allowed", "use POST"));
    }
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return respond(too_large());
    }
    let bearer = bearer(&req);
    let post = match registry.admit_post(env, action, bearer.as_deref()) {
        Ok(post) => post,
        Err(refused) => return respond(refused),
    };
    let body = match tokio::time::timeout(
        HEAD_TIMEOUT,
        Limited::new(req.into_body(), MAX_BODY).collect(),
    )
    .await
    {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return respond(too_large()),
        Ok(Err(_)) => return respond(Reply::error(400, "bad_request", "unreadable body")),
        Err(_) => {
            return respond(Reply::error(408, "timeout", "request body too slow"));
        }
    };
    respond(registry.handle_post(post, &body).await)
}

fn too_large() -> Reply {
    Reply::error(413, "too_large", "request body too large")
}

/// Answers a `/relay` upgrade once its signed URL is admitted, and serves the
/// socket after the 101 is sent.
async fn upgrade(
    registry: Arc<Registry>,
    mut req: Request<Incoming>,
    slot: Slot,
) -> Response<Body> {
    let headers = req.headers();
    let is_websocket = headers
        .get(hyper::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|u| u.trim().eq_ignore_ascii_case("websocket"));
    // RFC 6455 §4.2.1: `Connection` lists `Upgrade`, and the version is 13.
    // Checked before the URL is admitted: a malformed request (or one a
    // proxy mangled) must not use up a client URL's single use.
    let connection_upgrade = crate::socket::lists_token(
        headers
            .get_all(hyper::header::CONNECTION)
            .iter()
            .map(|v| v.as_bytes()),
        "upgrade",
    );
    let version_13 = headers
        .get(hyper::header::SEC_WEBSOCKET_VERSION)
        .is_some_and(|v| v.as_bytes() == b"13");
    let key = headers
        .get(hyper::header::SEC_WEBSOCKET_KEY)
        .map(|k| k.as_bytes().to_vec());
    let (true, Some(key)) = (is_websocket && connection_upgrade && version_13, key) else {
        return respond(Reply::error(
            400,
            "bad_request",
            "expected a WebSocket upgrade",
        ));
    };
    // A harness that takes masked frames, on a node that can splice to it
    // (TLS is not spliced through).
    let masked_ok = headers
        .get(MASKED_FRAMES_HEADER)
        .is_some_and(|v| v.as_bytes() == b"1")
        && registry.config.tls.is_none();
    let query = req.uri().query().unwrap_or("").to_string();
    let admitted = match registry.admit_upgrade(&query).await {
        Ok(a) => a,
        Err(reason) => {
            let mut r = Reply::error(403, reason, "relay upgrade refused");
            r.headers.push((REJECTION_HEADER, reason.to_string()));
            return respond(r);
        }
    };
    let upgraded = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let io = match upgraded.await {
            Ok(io) => io,
            Err(e) => {
                tracing::debug!("relay upgrade failed: {e}");
                return;
            }
        };
        // Framed by our own reader and writer: a node forwards payloads
        // without copying them (see `socket`).
        let (r, w, tcp, nothing_ahead) = relay_halves(io);
        let (limit, tcp) = match admitted {
            super::Admitted::Executor(..) => {
                (crate::frame::MAX_FRAME_BYTES, tcp.filter(|_| nothing_ahead))
            }
            super::Admitted::Harness(_) => (
                crate::frame::MAX_HARNESS_FRAME_BYTES,
                tcp.filter(|_| masked_ok),
            ),
        };
        let reader =
            Reader::new(r, Role::Server, limit).with_message_timeout(super::hub::MESSAGE_TIMEOUT);
        registry
            .serve_socket((reader, Writer::new(w, Role::Server)), admitted, tcp)
            .await;
        drop(slot);
    });
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(&key);
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(
        hyper::header::CONNECTION,
        HeaderValue::from_static("Upgrade"),
    );
    h.insert(
        hyper::header::UPGRADE,
        HeaderValue::from_static("websocket"),
    );
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert(hyper::header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if masked_ok {
        h.insert(MASKED_FRAMES_HEADER, HeaderValue::from_static("1"));
    }
    r
}

/// An upgraded relay connection's read and write halves, and its TCP
/// socket when frames may be spliced to it (a plain connection; TLS is not
/// spliced through) and whether they may be spliced from it too (nothing
/// read ahead by the HTTP server).
fn relay_halves(
    io: hyper::upgrade::Upgraded,
) -> (
    Box<dyn RelayRead>,
    Box<dyn RelayWrite>,
    Option<SharedTcp>,
    bool,
) {
    type Plain = TokioIo<WriteDeadline<tokio::net::TcpStream>>;
    match io.downcast::<Plain>() {
        Ok(parts) => {
            let tcp = SharedTcp::new(parts.io.into_inner().into_inner());
            let w = Box::new(WriteDeadline::new(tcp.clone(), WRITE_TIMEOUT));
            if parts.read_buf.is_empty() {
                (Box::new(tcp.clone()), w, Some(tcp), true)
            } else {
                let ahead = std::io::Cursor::new(parts.read_buf);
                let r = tokio::io::AsyncReadExt::chain(ahead, tcp.clone());
                (Box::new(r), w, Some(tcp), false)
            }
        }
        Err(io) => {
            let (r, w) = tokio::io::split(TokioIo::new(io));
            (Box::new(r), Box::new(w), None, false)
        }
    }
}

/// A relay connection's read half, as a node holds it.
trait RelayRead: AsyncRead + Unpin + Send {}
impl<T: AsyncRead + Unpin + Send> RelayRead for T {}
/// A relay connection's write half, as a node holds it.
trait RelayWrite: AsyncWrite + Unpin + Send {}
impl<T: AsyncWrite + Unpin + Send> RelayWrite for T {}
