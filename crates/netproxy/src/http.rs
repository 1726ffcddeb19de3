//! The HTTP listener (hyper, HTTP/1.1): `CONNECT host:port` opens a tunnel;
//! an absolute-URI request (`GET http://host/path`) is forwarded with the
//! origin-form target. Blocked requests get 403 with the reference's JSON
//! body; an allowed destination that cannot be reached gets 502.

use crate::mask::Scheme;
use crate::policy::{Decision, Destination, Protocol, REASON_LOCAL};
use crate::{upstream, Shared};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub(crate) type Body = BoxBody<Bytes, hyper::Error>;

/// Longest a client may take to send its request headers: 30 s.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Headers meant for the proxy or for one hop only; never forwarded.
const HOP_HEADERS: [&str; 8] = [
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
];

pub(crate) async fn serve<S>(io: S, client: Option<SocketAddr>, shared: Arc<Shared>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(handle(req, client, shared).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(io), svc)
        .with_upgrades()
        .await;
}

async fn handle(
    req: Request<Incoming>,
    client: Option<SocketAddr>,
    shared: Arc<Shared>,
) -> Response<Body> {
    if req.method() == Method::CONNECT {
        connect(req, client, shared).await
    } else {
        forward(req, client, shared).await
    }
}

/// Host (IPv6 without brackets) and port of an authority, `default` when absent.
fn split(auth: &hyper::http::uri::Authority, default: u16) -> (String, u16) {
    let h = auth.host();
    let h = h
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(h);
    (h.to_string(), auth.port_u16().unwrap_or(default))
}

async fn connect(
    req: Request<Incoming>,
    client: Option<SocketAddr>,
    shared: Arc<Shared>,
) -> Response<Body> {
    let Some(auth) = req.uri().authority().cloned() else {
        return plain(StatusCode::BAD_REQUEST, "CONNECT needs host:port\n");
    };
    let (host, port) = split(&auth, 443);
    let dest = Destination {
        protocol: Protocol::HttpsConnect,
        host,
        port,
        method: Some("CONNECT".into()),
        client,
    };
    let target = upstream::resolve(&dest.host, port).await;
    let d = shared.policy.decide(&dest, target.local).await;
    if !d.allowed() {
        return blocked(&dest, &d);
    }
    let mut up = match upstream::connect(&target.addrs).await {
        Ok(s) => s,
        Err(e) => return bad_gateway(&dest, &e),
    };
    let intercept = shared.mitm.is_some()
        && shared
            .masking
            .as_ref()
            .is_some_and(|m| m.intercepts(&dest.host, port));
    let stop = shared.clone();
    tokio::spawn(async move {
        let Ok(upgraded) = hyper::upgrade::on(req).await else {
            return;
        };
        let mut down = TokioIo::new(upgraded);
        if intercept {
            let (host, shared) = (dest.host, stop.clone());
            tokio::select! {
                _ = crate::mitm::serve(down, up, host, port, target.addrs, shared) => {}
                _ = stop.stopped() => {}
            }
            return;
        }
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
            _ = stop.stopped() => {}
        }
    });
    Response::new(empty())
}

async fn forward(
    req: Request<Incoming>,
    client: Option<SocketAddr>,
    shared: Arc<Shared>,
) -> Response<Body> {
    let uri = req.uri().clone();
    let (Some("http"), Some(auth)) = (uri.scheme_str(), uri.authority()) else {
        return plain(
            StatusCode::BAD_REQUEST,
            "this is a proxy: send an absolute http:// URI, or CONNECT for https\n",
        );
    };
    let (host, port) = split(auth, 80);
    let dest = Destination {
        protocol: Protocol::Http,
        host,
        port,
        method: Some(req.method().as_str().to_string()),
        client,
    };
    let target = upstream::resolve(&dest.host, port).await;
    let d = shared.policy.decide(&dest, target.local).await;
    if !d.allowed() {
        return blocked(&dest, &d);
    }
    let up = match upstream::connect(&target.addrs).await {
        Ok(s) => s,
        Err(e) => return bad_gateway(&dest, &e),
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(up)).await {
        Ok(x) => x,
        Err(e) => return bad_gateway(&dest, &e),
    };
    let stop = shared.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = conn => {}
            _ = stop.stopped() => {}
        }
    });
    let (mut parts, body) = req.into_parts();
    parts.uri = match uri.path_and_query() {
        Some(pq) => pq
            .as_str()
            .parse()
            .unwrap_or_else(|_| hyper::Uri::from_static("/")),
        None => hyper::Uri::from_static("/"),
    };
    strip_hop_headers(&mut parts.headers);
    if let Some(m) = &shared.masking {
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        m.substitute(Scheme::Http, &dest.host, port, path, &mut parts.headers);
    }
    if !parts.headers.contains_key(hyper::header::HOST) {
        if let Ok(v) = HeaderValue::from_str(auth.as_str()) {
            parts.headers.insert(hyper::header::HOST, v);
        }
    }
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_headers(&mut parts.headers);
            Response::from_parts(parts, body.boxed())
        }
        Err(e) => bad_gateway(&dest, &e),
    }
}

/// Removes the [`HOP_HEADERS`].
pub(crate) fn strip_hop_headers(h: &mut hyper::HeaderMap) {
    for name in HOP_HEADERS {
        h.remove(name);
    }
}

fn empty() -> Body {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from_static(text.as_bytes()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r
}

fn json(status: StatusCode, body: serde_json::Value) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(body.to_string()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// The human sentence of a blocked request's body.
fn message(d: &Decision) -> &'static str {
    match d.reason.as_str() {
        REASON_LOCAL => "Sandbox policy blocks local/private network addresses.",
        crate::policy::REASON_DENIED => "The network policy denies this domain.",
        crate::policy::REASON_METHOD => "Limited network mode allows only GET, HEAD and OPTIONS.",
        _ if d.verdict == crate::Verdict::Ask => {
            "This domain needs approval before it can be reached."
        }
        _ => "The network policy does not allow this domain.",
    }
}

/// 403 with the reference's JSON body (SANDBOX.md §3.1).
fn blocked(dest: &Destination, d: &Decision) -> Response<Body> {
    json(
        StatusCode::FORBIDDEN,
        serde_json::json!({
            "status": "blocked",
            "host": dest.host,
            "reason": d.reason,
            "decision": d.verdict.as_str(),
            "source": d.source.as_str(),
            "protocol": dest.protocol.as_str(),
            "port": dest.port,
            "message": message(d),
        }),
    )
}

fn bad_gateway(dest: &Destination, e: &dyn std::fmt::Display) -> Response<Body> {
    tracing::debug!(host = %dest.host, port = dest.port, "network proxy: upstream failed: {e}");
    json(
        StatusCode::BAD_GATEWAY,
        serde_json::json!({
            "status": "error",
            "host": dest.host,
            "port": dest.port,
            "protocol": dest.protocol.as_str(),
            "message": format!("cannot reach {}:{}: {e}", dest.host, dest.port),
        }),
    )
}

/// 502 for a request inside an intercepted tunnel.
pub(crate) fn bad_gateway_text(host: &str, port: u16, e: &str) -> Response<Body> {
    let dest = Destination {
        protocol: Protocol::HttpsConnect,
        host: host.to_string(),
        port,
        method: None,
        client: None,
    };
    bad_gateway(&dest, &e)
}
