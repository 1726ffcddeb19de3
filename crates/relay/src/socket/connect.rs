//! Opening a relay socket as a client: hyper sends the HTTP upgrade request
//! and hands over the upgraded connection (with whatever it read past the
//! 101 answer), then [`Reader`] and [`Writer`] take it over.

use super::{Reader, Role, Writer};
use crate::api::REJECTION_HEADER;
use bytes::Bytes;
use hyper::header::{HeaderValue, CONNECTION, HOST, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY};
use hyper::header::{SEC_WEBSOCKET_VERSION, UPGRADE};
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};
use tokio::net::TcpStream;

/// A plain or TLS connection.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// An upgraded client connection.
pub type Upgraded = TokioIo<hyper::upgrade::Upgraded>;

/// A client's relay socket's read half.
pub type ClientReader = Reader<ReadHalf<Upgraded>>;
/// A client's relay socket's write half.
pub type ClientWriter = Writer<WriteHalf<Upgraded>>;
/// The two halves of a client's relay socket.
pub type ClientSocket = (ClientReader, ClientWriter);

/// Why a relay socket could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The server answered the upgrade with `status`, not 101; `reason` is
    /// its rejection header (`x-codex-relay-rejection` style), if any.
    #[error("the relay refused the WebSocket upgrade with HTTP {status}{}", reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default())]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The rejection header's value.
        reason: Option<String>,
    },
    /// The URL is not `ws://` or `wss://` with a host.
    #[error("invalid relay URL: {0}")]
    Url(String),
    /// Connecting, TLS or the HTTP exchange failed.
    #[error("cannot open the relay socket: {0}")]
    Failed(String),
}

fn failed(e: impl std::fmt::Display) -> ConnectError {
    ConnectError::Failed(e.to_string())
}

/// Opens a relay socket to `url` (`ws://` or `wss://`, TLS with
/// [`crate::tls::client_config`]'s roots) with `headers` added to the
/// upgrade request, reading messages of up to `limit` bytes.
pub async fn connect(
    url: &str,
    headers: &[(&str, String)],
    limit: usize,
) -> Result<ClientSocket, ConnectError> {
    let parsed = url::Url::parse(url).map_err(|e| ConnectError::Url(e.to_string()))?;
    let tls = match parsed.scheme() {
        "wss" => true,
        "ws" => false,
        other => return Err(ConnectError::Url(format!("unsupported scheme {other}"))),
    };
    let host = parsed
        .host_str()
        .ok_or_else(|| ConnectError::Url("no host".into()))?;
    let port = parsed.port_or_known_default().unwrap_or(80);
    let bare_host = host.trim_start_matches('[').trim_end_matches(']');
    let tcp = TcpStream::connect((bare_host, port))
        .await
        .map_err(failed)?;
    tcp.set_nodelay(true).map_err(failed)?;
    let io: Box<dyn Io> = if tls {
        let config = crate::tls::client_config().map_err(failed)?;
        let name = rustls::pki_types::ServerName::try_from(bare_host.to_string())
            .map_err(|e| ConnectError::Url(e.to_string()))?;
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&config));
        Box::new(connector.connect(name, tcp).await.map_err(failed)?)
    } else {
        Box::new(tcp)
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(failed)?;
    // Drives the HTTP exchange; it ends by handing the connection over.
    tokio::spawn(conn.with_upgrades());
    let key = tokio_tungstenite::tungstenite::handshake::client::generate_key();
    let path = match parsed.query() {
        Some(q) => format!("{}?{q}", parsed.path()),
        None => parsed.path().to_string(),
    };
    let authority = match parsed.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    };
    let mut request = hyper::Request::get(path)
        .header(HOST, authority)
        .header(UPGRADE, "websocket")
        .header(CONNECTION, "Upgrade")
        .header(SEC_WEBSOCKET_KEY, key.as_str())
        .header(SEC_WEBSOCKET_VERSION, "13");
    for (name, value) in headers {
        request = request.header(*name, value.as_str());
    }
    let request = request
        .body(http_body_util::Empty::<Bytes>::new())
        .map_err(|e| ConnectError::Url(e.to_string()))?;
    let response = sender.send_request(request).await.map_err(failed)?;
    if response.status() != hyper::StatusCode::SWITCHING_PROTOCOLS {
        let reason = response
            .headers()
            .get(REJECTION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        return Err(ConnectError::Refused {
            status: response.status().as_u16(),
            reason,
        });
    }
    let expected = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let accepted = response.headers().get(SEC_WEBSOCKET_ACCEPT);
    if accepted != HeaderValue::from_str(&expected).ok().as_ref() {
        return Err(ConnectError::Failed(
            "the server's Sec-WebSocket-Accept does not match the key".into(),
        ));
    }
    let upgraded = hyper::upgrade::on(response).await.map_err(failed)?;
    let (r, w) = tokio::io::split(TokioIo::new(upgraded));
    Ok((
        Reader::new(r, Role::Client, limit),
        Writer::new(w, Role::Client),
    ))
}
