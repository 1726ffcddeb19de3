//! Client errors: typed, with the underlying error as
//! [`source()`](std::error::Error::source), and queries a caller branches on
//! ([`ClientError::is_not_found`], [`ClientError::is_unauthorized`],
//! [`ClientError::is_connection_refused`], [`ClientError::code`]) instead of
//! matching message text.

use exec_server_protocol::error::NOT_FOUND;
use exec_server_protocol::ErrorObject;
use exec_server_rpc::CallError;
use std::error::Error;
use std::fmt;
use std::sync::Arc;

type Source = Arc<dyn Error + Send + Sync>;

/// Why a connection could not be made, ended, or could not be recovered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionErrorKind {
    /// Nothing listens there (ECONNREFUSED, or a Unix socket path that does not exist).
    Refused,
    /// The server refused the WebSocket upgrade with HTTP 401: no token, or a wrong one.
    Unauthorized,
    /// The WebSocket upgrade was refused with another HTTP status (403, 503…).
    Rejected,
    /// The TLS handshake of a `wss://` URL failed.
    Tls,
    /// The attempt did not finish within the connect timeout.
    TimedOut,
    /// The connection ended (or the client was closed).
    Closed,
    /// Anything else (a bad URL, a program that cannot start, a refused resume).
    Other,
}

/// A connection failure: a kind, a message, and the underlying error.
#[derive(Debug, Clone)]
pub struct ConnectionError {
    kind: ConnectionErrorKind,
    http_status: Option<u16>,
    message: String,
    source: Option<Source>,
}

impl ConnectionError {
    /// A failure of `kind` described by `message`.
    pub fn new(kind: ConnectionErrorKind, message: impl Into<String>) -> Self {
        ConnectionError {
            kind,
            http_status: None,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// `context: err` for an OS error; refused when nothing listens there.
    pub fn io(context: impl fmt::Display, err: std::io::Error) -> Self {
        let kind = match err.kind() {
            std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound => {
                ConnectionErrorKind::Refused
            }
            std::io::ErrorKind::TimedOut => ConnectionErrorKind::TimedOut,
            _ => ConnectionErrorKind::Other,
        };
        ConnectionError::new(kind, format!("{context}: {err}")).with_source(err)
    }

    /// `context: err` for a WebSocket connect failure, classified by the
    /// library's error variant (never by its text).
    pub fn websocket(
        context: impl fmt::Display,
        err: tokio_tungstenite::tungstenite::Error,
    ) -> Self {
        use tokio_tungstenite::tungstenite::error::{Error as WsError, UrlError};
        let message = format!("{context}: {err}");
        let (kind, status) = match &err {
            WsError::Http(resp) if resp.status().as_u16() == 401 => {
                (ConnectionErrorKind::Unauthorized, Some(401))
            }
            WsError::Http(resp) => (ConnectionErrorKind::Rejected, Some(resp.status().as_u16())),
            WsError::Tls(_) | WsError::Url(UrlError::TlsFeatureNotEnabled) => {
                (ConnectionErrorKind::Tls, None)
            }
            WsError::Io(io) => {
                let kind = ConnectionError::io("", std::io::Error::from(io.kind())).kind;
                (kind, None)
            }
            _ => (ConnectionErrorKind::Other, None),
        };
        let mut e = ConnectionError::new(kind, message).with_source(err);
        e.http_status = status;
        e
    }

    /// "session could not be recovered": keeps the last attempt's kind, so the
    /// queries still answer for the cause.
    pub fn unrecoverable(last: ClientError) -> Self {
        let (kind, http_status) = match &last {
            ClientError::Connection(c) => (c.kind, c.http_status),
            ClientError::TimedOut => (ConnectionErrorKind::TimedOut, None),
            _ => (ConnectionErrorKind::Other, None),
        };
        ConnectionError {
            kind,
            http_status,
            message: format!("session could not be recovered: {last}"),
            source: Some(Arc::new(last)),
        }
    }

    /// The kind.
    pub fn kind(&self) -> ConnectionErrorKind {
        self.kind
    }

    /// The HTTP status of a refused WebSocket upgrade.
    pub fn http_status(&self) -> Option<u16> {
        self.http_status
    }
}

impl fmt::Display for ConnectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for ConnectionError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

/// Client errors.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ClientError {
    /// The server answered with a JSON-RPC error.
    Server(ErrorObject),
    /// Could not connect, the connection ended, or the session could not be recovered.
    Connection(ConnectionError),
    /// A call timed out.
    TimedOut,
    /// The reply (or the params) did not have the expected shape; the source is
    /// the decoding error.
    Protocol {
        /// What was being decoded (usually the method).
        context: String,
        /// The decoding error.
        source: Source,
    },
    /// A local file or stream of a transfer failed; the source is the OS error.
    Local {
        /// `local read` or `local write`.
        context: &'static str,
        /// The OS error.
        source: Arc<std::io::Error>,
    },
}

impl ClientError {
    /// A reply that does not decode.
    pub fn protocol(context: impl Into<String>, err: impl Error + Send + Sync + 'static) -> Self {
        ClientError::Protocol {
            context: context.into(),
            source: Arc::new(err),
        }
    }

    /// A local I/O failure during a transfer.
    pub fn local(context: &'static str, err: std::io::Error) -> Self {
        ClientError::Local {
            context,
            source: Arc::new(err),
        }
    }

    /// The server's JSON-RPC error code, if the server answered with an error.
    pub fn code(&self) -> Option<i64> {
        match self {
            ClientError::Server(e) => Some(e.code),
            _ => None,
        }
    }

    /// The server's error object, if it answered with one.
    pub fn server_error(&self) -> Option<&ErrorObject> {
        match self {
            ClientError::Server(e) => Some(e),
            _ => None,
        }
    }

    /// True if the server said the file, directory or handle does not exist (-32004).
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(NOT_FOUND)
    }

    /// True if the server refused the connection for want of a valid token (HTTP 401).
    pub fn is_unauthorized(&self) -> bool {
        self.connection_kind() == Some(ConnectionErrorKind::Unauthorized)
    }

    /// True if nothing listens at the server's address.
    pub fn is_connection_refused(&self) -> bool {
        self.connection_kind() == Some(ConnectionErrorKind::Refused)
    }

    /// The kind of connection failure, if this is one.
    pub fn connection_kind(&self) -> Option<ConnectionErrorKind> {
        match self {
            ClientError::Connection(c) => Some(c.kind()),
            _ => None,
        }
    }

    /// The OS error number the server reported, for servers (this one and the
    /// reference) that answer an OS failure with the OS text, which ends in
    /// `(os error N)`: e.g. `Some(2)` for a program that does not exist.
    pub fn os_error(&self) -> Option<i32> {
        let msg = &self.server_error()?.message;
        let (_, tail) = msg.rsplit_once("(os error ")?;
        tail.strip_suffix(')')?.parse().ok()
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Server(e) => write!(f, "{} (code {})", e.message, e.code),
            ClientError::Connection(c) => write!(f, "connection: {c}"),
            ClientError::TimedOut => f.write_str("request timed out"),
            ClientError::Protocol { context, source } => {
                write!(f, "unexpected reply: {context}: {source}")
            }
            ClientError::Local { context, source } => write!(f, "{context}: {source}"),
        }
    }
}

impl Error for ClientError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            ClientError::Server(e) => Some(e),
            ClientError::Connection(c) => Some(c),
            ClientError::TimedOut => None,
            ClientError::Protocol { source, .. } => Some(&**source),
            ClientError::Local { source, .. } => Some(&**source),
        }
    }
}

impl From<ConnectionError> for ClientError {
    fn from(e: ConnectionError) -> Self {
        ClientError::Connection(e)
    }
}

impl From<CallError> for ClientError {
    fn from(e: CallError) -> Self {
        match e {
            CallError::Server(e) => ClientError::Server(e),
            CallError::Closed => ClientError::Connection(
                ConnectionError::new(ConnectionErrorKind::Closed, "connection closed")
                    .with_source(e),
            ),
            CallError::TimedOut => ClientError::TimedOut,
            CallError::PendingRequestLimitExceeded => ClientError::Connection(
                ConnectionError::new(ConnectionErrorKind::Other, e.to_string()).with_source(e),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_follow_the_types_not_the_text() {
        let refused = ClientError::from(ConnectionError::io(
            "cannot connect to unix:///nowhere",
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        ));
        assert!(refused.is_connection_refused() && !refused.is_unauthorized());
        assert!(refused.source().and_then(|s| s.source()).is_some());
        let lost = ClientError::from(ConnectionError::unrecoverable(refused.clone()));
        assert!(lost.is_connection_refused(), "the cause's kind survives");
        assert_eq!(
            lost.to_string(),
            "connection: session could not be recovered: connection: \
             cannot connect to unix:///nowhere: connection refused"
        );

        let nf = ClientError::Server(ErrorObject::not_found(
            "No such file or directory (os error 2)",
        ));
        assert!(nf.is_not_found());
        assert_eq!((nf.code(), nf.os_error()), (Some(-32004), Some(2)));
        let plain = ClientError::Server(ErrorObject::internal("failed (os error x)"));
        assert_eq!(plain.os_error(), None);
        assert!(!plain.is_not_found() && plain.code() == Some(-32603));
    }
}
