//! What the proxy answers itself, to the plain listener and inside an
//! intercepted tunnel alike: the body type, the hop-by-hop headers it
//! strips, its header timeout, and its 403 (blocked) and 502 (unreachable)
//! bodies in the reference's JSON shape (SANDBOX.md §3.1).

use crate::policy::{Decision, Destination, Protocol, REASON_LOCAL};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
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

/// Removes the [`HOP_HEADERS`].
pub(crate) fn strip_hop_headers(h: &mut hyper::HeaderMap) {
    for name in HOP_HEADERS {
        h.remove(name);
    }
}

pub(crate) fn empty() -> Body {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}

pub(crate) fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
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
pub(crate) fn blocked(dest: &Destination, d: &Decision) -> Response<Body> {
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

pub(crate) fn bad_gateway(dest: &Destination, e: &dyn std::fmt::Display) -> Response<Body> {
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
