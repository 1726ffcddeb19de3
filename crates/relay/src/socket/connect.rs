//! Opening a relay socket as a client: the HTTP upgrade request is written by
//! hand (it is one fixed request) and its answer parsed with `httparse`; then
//! [`Reader`] and [`Writer`] take the connection over.
//!
//! Why not an HTTP client library here: a harness's first frames (`Resume`
//! and the Noise msg1) are known before the socket is opened, and writing
//! them right behind the upgrade request, before its 101 answer, saves the
//! upgrade's round trip on every new connection (at 25 ms one way, 50 ms of
//! a new connection's 335). HTTP client libraries write nothing on a
//! connection until the upgrade is answered. A node that refuses the upgrade
//! answers it with an error and closes the connection; the early frames are
//! then never read as WebSocket frames by anyone.

use super::{Outgoing, Reader, Role, Writer};
use crate::api::{MASKED_FRAMES_HEADER, REJECTION_HEADER};
use std::io::Cursor;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Chain, ReadHalf, WriteHalf};
use tokio::net::TcpStream;

/// A plain or TLS connection.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A client's upgraded connection, read side: the bytes read past the 101
/// answer's head, then the connection.
pub type UpgradedRead = Chain<Cursor<Vec<u8>>, ReadHalf<Box<dyn Io>>>;

/// A client's relay socket's read half.
pub type ClientReader = Reader<UpgradedRead>;
/// A client's relay socket's write half.
pub type ClientWriter = Writer<WriteHalf<Box<dyn Io>>>;
/// The two halves of a client's relay socket.
pub type ClientSocket = (ClientReader, ClientWriter);

/// Most bytes the upgrade's answer head may take: 16 KiB.
const MAX_ANSWER_HEAD_BYTES: usize = 16 * 1024;
/// Most header lines the upgrade's answer may have.
const MAX_ANSWER_HEADERS: usize = 100;
/// Time to connect, finish TLS and read the upgrade's answer: 10 s. A node
/// that accepts and then says nothing (overloaded, or cut off by a network
/// partition) fails the attempt, so an executor registers again (with every
/// registry URL it was given) and a harness retries, instead of waiting on
/// it for ever.
pub const UPGRADE_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// A header given for the upgrade request would break its framing (a
    /// line break in a value, a colon or space in a name).
    #[error("invalid header for the relay upgrade: {0}")]
    Header(String),
    /// Connecting, TLS or the HTTP exchange failed.
    #[error("cannot open the relay socket: {0}")]
    Failed(String),
}

fn failed(e: impl std::fmt::Display) -> ConnectError {
    ConnectError::Failed(e.to_string())
}

/// Opens a relay socket to `url` (`ws://` or `wss://`, TLS with
/// [`crate::tls::client_config`]'s roots) with `headers` added to the
/// upgrade request, reading messages of up to `limit` bytes, within
/// [`UPGRADE_TIMEOUT`].
pub async fn connect(
    url: &str,
    headers: &[(&str, String)],
    limit: usize,
) -> Result<ClientSocket, ConnectError> {
    connect_sending(url, headers, limit, &mut Vec::new()).await
}

/// [`connect`], writing the frames of `early` (emptied) right behind the
/// upgrade request, before its answer is read: they reach the node in the
/// upgrade's round trip instead of after it. Only for frames that may be
/// lost with a refused upgrade: then the node never reads them. Bounded by
/// [`UPGRADE_TIMEOUT`] (then [`ConnectError::Failed`]).
pub async fn connect_sending(
    url: &str,
    headers: &[(&str, String)],
    limit: usize,
    early: &mut Vec<Outgoing>,
) -> Result<ClientSocket, ConnectError> {
    connect_within(url, headers, limit, early, UPGRADE_TIMEOUT).await
}

/// [`connect_sending`] bounded by `bound` instead of [`UPGRADE_TIMEOUT`].
async fn connect_within(
    url: &str,
    headers: &[(&str, String)],
    limit: usize,
    early: &mut Vec<Outgoing>,
    bound: Duration,
) -> Result<ClientSocket, ConnectError> {
    tokio::time::timeout(bound, open(url, headers, limit, early))
        .await
        .unwrap_or_else(|_| {
            Err(failed(format!(
                "no answer to the upgrade within {} s",
                bound.as_secs_f64()
            )))
        })
}

async fn open(
    url: &str,
    headers: &[(&str, String)],
    limit: usize,
    early: &mut Vec<Outgoing>,
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
    let authority = match parsed.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    };
    let path = match parsed.query() {
        Some(q) => format!("{}?{q}", parsed.path()),
        None => parsed.path().to_string(),
    };
    let key = tokio_tungstenite::tungstenite::handshake::client::generate_key();
    let head = request_head(&path, &authority, &key, headers)?;
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
    let (mut r, mut w) = tokio::io::split(io);
    // The request and the early frames in one write: one segment (one TLS
    // record) rather than two, so a node that refuses and closes at once
    // has read everything we sent and its answer is not lost to a reset.
    let mut first = head;
    if !early.is_empty() {
        let mut staged = Writer::new(Vec::new(), Role::Client);
        staged.send(early).await.map_err(failed)?;
        first.extend_from_slice(&staged.into_inner());
    }
    w.write_all(&first).await.map_err(failed)?;
    w.flush().await.map_err(failed)?;
    let writer = Writer::new(w, Role::Client);
    let (rest, masked_answered) = read_answer(&mut r, &key).await?;
    let mut reader = Reader::new(Cursor::new(rest).chain(r), Role::Client, limit);
    // Masked frames only when we asked for them and the node agreed.
    let masked_asked = headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case(MASKED_FRAMES_HEADER) && v == "1");
    if masked_asked && masked_answered {
        reader = reader.accept_masked();
    }
    Ok((reader, writer))
}

/// The upgrade request's head. Errors: a header name or value that would
/// break the request's framing (a line break, a colon in a name).
fn request_head(
    path: &str,
    authority: &str,
    key: &str,
    headers: &[(&str, String)],
) -> Result<Vec<u8>, ConnectError> {
    let mut head = format!(
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
    );
    for (name, value) in headers {
        let name_ok = !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic() && b != b':');
        let value_ok = value
            .bytes()
            .all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f));
        if !name_ok || !value_ok {
            return Err(ConnectError::Header(format!("{name:?}")));
        }
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    Ok(head.into_bytes())
}

/// Reads the upgrade's answer; returns the bytes read past its head (the
/// first frames), and whether it says the node may send masked frames
/// ([`MASKED_FRAMES_HEADER`]). Errors: not 101 ([`ConnectError::Refused`]), a wrong
/// `Sec-WebSocket-Accept`, a malformed or oversized head, the connection
/// closing first.
async fn read_answer(
    r: &mut ReadHalf<Box<dyn Io>>,
    key: &str,
) -> Result<(Vec<u8>, bool), ConnectError> {
    let mut buf = vec![0u8; MAX_ANSWER_HEAD_BYTES];
    let mut filled = 0;
    loop {
        if filled == buf.len() {
            return Err(failed("the upgrade's answer head is too long"));
        }
        let n = r.read(&mut buf[filled..]).await.map_err(failed)?;
        if n == 0 {
            return Err(failed("the relay closed the connection before answering"));
        }
        filled += n;
        let mut slots = [httparse::EMPTY_HEADER; MAX_ANSWER_HEADERS];
        let mut answer = httparse::Response::new(&mut slots);
        let head_len = match answer.parse(&buf[..filled]) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => continue,
            Err(e) => return Err(failed(format!("malformed upgrade answer: {e}"))),
        };
        let header = |name: &str| {
            answer
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| h.value)
        };
        let status = answer.code.unwrap_or(0);
        if status != 101 {
            let reason = header(REJECTION_HEADER)
                .and_then(|v| std::str::from_utf8(v).ok())
                .map(str::to_string);
            return Err(ConnectError::Refused { status, reason });
        }
        // RFC 6455 §4.1: a 101 that does not name the WebSocket upgrade is
        // not one.
        let names = |name: &str, token: &str| {
            let lines = answer
                .headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case(name));
            super::lists_token(lines.map(|h| h.value), token)
        };
        if !names("upgrade", "websocket") || !names("connection", "upgrade") {
            return Err(failed(
                "the server's 101 answer does not upgrade the connection to WebSocket",
            ));
        }
        let expected = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
        if header("sec-websocket-accept") != Some(expected.as_bytes()) {
            return Err(failed(
                "the server's Sec-WebSocket-Accept does not match the key",
            ));
        }
        let masked = header(MASKED_FRAMES_HEADER) == Some(b"1");
        return Ok((buf[head_len..filled].to_vec(), masked));
    }
}

#[cfg(test)]
#[path = "connect_tests.rs"]
mod tests;
