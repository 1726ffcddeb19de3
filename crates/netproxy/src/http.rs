//! The HTTP listener (hyper, HTTP/1.1): `CONNECT host:port` opens a tunnel;
//! an absolute-URI request (`GET http://host/path`) is forwarded with the
//! origin-form target. Blocked requests get 403 with the reference's JSON
//! body; an allowed destination that cannot be reached gets 502.

use crate::mask::Scheme;
use crate::policy::{Destination, Protocol};
use crate::responses::{
    bad_gateway, blocked, empty, plain, strip_hop_headers, Body, HEADER_READ_TIMEOUT,
};
use crate::{upstream, Shared};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

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
