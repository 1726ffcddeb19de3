//! The `--metrics-listen` endpoint: `GET /metrics` answers the text exposition
//! (HTTP/1.1 via hyper); any other path is 404, any other method 405.
//!
//! A listener of its own, never the JSON-RPC port, so a scraper needs no token
//! and the exec-server port never speaks plain HTTP.

use crate::ServerState;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// How long a scraper may take to send its request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The content type of the OpenMetrics text format that `prometheus-client` writes.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A bound metrics listener.
pub struct MetricsListener {
    listener: TcpListener,
}

impl MetricsListener {
    /// Binds `addr` (`IP:PORT`; port 0 picks one). Errors: the OS's bind error.
    pub async fn bind(addr: SocketAddr) -> std::io::Result<MetricsListener> {
        Ok(MetricsListener {
            listener: TcpListener::bind(addr).await?,
        })
    }

    /// The bound address (with the port the OS chose for port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// Serves scrapes until the task is dropped. Each connection runs on a task of
/// its own; a failed accept is logged and retried after a short pause (the
/// usual cause, running out of descriptors, passes).
pub async fn serve(listener: MetricsListener, state: Arc<ServerState>) {
    loop {
        let (stream, _) = match listener.listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("metrics listener: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(&req, &state)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

fn answer<B>(req: &Request<B>, state: &ServerState) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            (StatusCode::OK, CONTENT_TYPE, super::metrics().render(state))
        }
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "metrics are at /metrics\n".into(),
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    resp
}
