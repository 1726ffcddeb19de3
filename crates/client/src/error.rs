//! Client errors: typed, with the underlying error as
//! [`source()`](std::error::Error::source), and an [`ErrorKind`] a caller
//! branches on ([`ClientError::kind`]) instead of matching message text.

use crate::events::{FailureReason, StreamFailure};
use exec_server_protocol::error::{INVALID_PARAMS, INVALID_REQUEST, NOT_FOUND};
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
    /// The session was lost: the connection ended and could not be resumed.
    recovery_failed: bool,
    http_status: Option<u16>,
    message: String,
    source: Option<Source>,
}

impl ConnectionError {
    /// A failure of `kind` described by `message`.
    pub(crate) fn new(kind: ConnectionErrorKind, message: impl Into<String>) -> Self {
        ConnectionError {
            kind,
            recovery_failed: false,
            http_status: None,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying error.
    pub(crate) fn with_source(mut self, source: impl Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// `context: err` for an OS error; refused when nothing listens there.
    pub(crate) fn io(context: impl fmt::Display, err: std::io::Error) -> Self {
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
    pub(crate) fn websocket(
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
    pub(crate) fn unrecoverable(last: ClientError) -> Self {
        let (kind, http_status) = match &last {
            ClientError::Connection(c) => (c.kind, c.http_status),
            ClientError::TimedOut => (ConnectionErrorKind::TimedOut, None),
            _ => (ConnectionErrorKind::Other, None),
        };
        ConnectionError {
            kind,
            recovery_failed: true,
            http_status,
            message: format!("session could not be recovered: {last}"),
            source: Some(Arc::new(last)),
        }
    }

    /// The kind.
    pub fn kind(&self) -> ConnectionErrorKind {
        self.kind
    }

    /// Marks the session as lost (a connection that cannot be resumed).
    pub(crate) fn session_lost(mut self) -> Self {
        self.recovery_failed = true;
        self
    }

    /// True if the session was lost: the connection ended and could not be
    /// resumed within the recovery timeout (or cannot be resumed at all).
    pub fn is_session_lost(&self) -> bool {
        self.recovery_failed
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

/// A configuration that cannot be used: an `environments.toml`, the
/// `EXEC_SERVER_URL` or remote-mode variables, a URL or an environment id.
/// Its message names the file, variable or entry; the underlying error (a
/// TOML parse error, an OS error) is its [`source()`](Error::source).
#[derive(Debug, Clone)]
pub struct ConfigError {
    message: String,
    source: Option<Source>,
}

impl ConfigError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        ConfigError {
            message: message.into(),
            source: None,
        }
    }

    pub(crate) fn with_source(mut self, source: impl Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// The same error, its message prefixed with `context: ` (a file name).
    pub(crate) fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }

    /// What is wrong, naming the file, variable or entry.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for ConfigError {
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
    /// A process's event stream failed before the process closed (from
    /// [`ProcessHandle::wait`](crate::ProcessHandle::wait) and friends).
    Stream(StreamFailure),
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
    pub(crate) fn protocol(
        context: impl Into<String>,
        err: impl Error + Send + Sync + 'static,
    ) -> Self {
        ClientError::Protocol {
            context: context.into(),
            source: Arc::new(err),
        }
    }

    /// A local I/O failure during a transfer.
    pub(crate) fn local(context: &'static str, err: std::io::Error) -> Self {
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

    /// The OS error number the server reported: the `errno` of the error's
    /// structured `data` (this server), else the `(os error N)` the OS text
    /// ends with (the reference): e.g. `Some(2)` for a program that does not
    /// exist.
    pub fn os_error(&self) -> Option<i32> {
        let e = self.server_error()?;
        if let Some(n) = e.data.as_ref().and_then(|d| d.get("errno")?.as_i64()) {
            return i32::try_from(n).ok();
        }
        let (_, tail) = e.message.rsplit_once("(os error ")?;
        tail.strip_suffix(')')?.parse().ok()
    }

    /// The path the server's structured error `data` names (`path`), if any.
    pub fn path(&self) -> Option<&str> {
        self.server_error()?.data.as_ref()?.get("path")?.as_str()
    }

    /// What kind of failure this is. From a server error: the `kind` of its
    /// structured `data` when the server sends one (this server does), else
    /// the JSON-RPC code alone (the reference sends no `data`, so a missing
    /// program, a missing cwd and a non-executable file are all
    /// [`ErrorKind::Other`] there).
    pub fn kind(&self) -> ErrorKind {
        match self {
            ClientError::Server(e) => server_kind(e),
            ClientError::Connection(c) if c.is_session_lost() => ErrorKind::RecoveryFailed,
            ClientError::Connection(c) => match c.kind() {
                ConnectionErrorKind::Refused => ErrorKind::ConnectRefused,
                ConnectionErrorKind::Unauthorized => ErrorKind::Unauthorized,
                ConnectionErrorKind::TimedOut => ErrorKind::TimedOut,
                _ => ErrorKind::Connection,
            },
            ClientError::TimedOut => ErrorKind::TimedOut,
            ClientError::Stream(s) => match s.reason {
                FailureReason::EventsLost => ErrorKind::EventsLost,
                FailureReason::RecoveryFailed => ErrorKind::RecoveryFailed,
                _ => ErrorKind::Other,
            },
            ClientError::Protocol { .. } | ClientError::Local { .. } => ErrorKind::Other,
        }
    }
}

/// What went wrong, for a caller to branch on ([`ClientError::kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// `process/start`: the program does not exist (in `PATH`, or at the path
    /// given). Wire `data.kind`: `programNotFound`.
    ProgramNotFound,
    /// `process/start`: the program exists but cannot be executed (no execute
    /// permission, not a binary or script). Wire: `notExecutable`.
    NotExecutable,
    /// `process/start`: the working directory does not exist or is not a
    /// directory. Wire: `cwdNotFound`.
    CwdNotFound,
    /// A file, directory or handle does not exist (-32004). Wire: `notFound`.
    NotFound,
    /// The OS or a policy refused (EACCES/EPERM, a sandbox refusal). Wire:
    /// `permissionDenied`.
    PermissionDenied,
    /// The request does not apply: unknown or taken id, a reached limit, a bad
    /// argument this client caught (-32600).
    InvalidRequest,
    /// Malformed params (-32602).
    InvalidParams,
    /// Nothing listens at the server's address.
    ConnectRefused,
    /// The server refused the connection for want of a valid token (HTTP 401).
    Unauthorized,
    /// The connection ended and the session could not be resumed.
    RecoveryFailed,
    /// Process events were lost while the connection was down.
    EventsLost,
    /// A connect attempt or a call did not finish in time.
    TimedOut,
    /// Another connection failure (closed client, refused upgrade, TLS).
    Connection,
    /// Anything else (an OS failure on the server, a bad reply, a local I/O
    /// error).
    Other,
}

/// The kind of a server error: `data.kind` when present (the protocol's
/// one vocabulary, [`exec_server_protocol::error::ErrorKind`]), else the code.
fn server_kind(e: &ErrorObject) -> ErrorKind {
    use exec_server_protocol::error::ErrorKind as Wire;
    match Wire::of(e) {
        Some(Wire::ProgramNotFound) => return ErrorKind::ProgramNotFound,
        Some(Wire::NotExecutable) => return ErrorKind::NotExecutable,
        Some(Wire::CwdNotFound) => return ErrorKind::CwdNotFound,
        Some(Wire::NotFound) => return ErrorKind::NotFound,
        Some(Wire::PermissionDenied) => return ErrorKind::PermissionDenied,
        Some(Wire::InvalidParams) => return ErrorKind::InvalidParams,
        Some(Wire::UnknownId | Wire::AlreadyExists | Wire::InvalidInput | Wire::LimitReached) => {
            return ErrorKind::InvalidRequest
        }
        _ => {}
    }
    match e.code {
        NOT_FOUND => ErrorKind::NotFound,
        INVALID_REQUEST => ErrorKind::InvalidRequest,
        INVALID_PARAMS => ErrorKind::InvalidParams,
        _ => ErrorKind::Other,
    }
}

impl From<StreamFailure> for ClientError {
    fn from(f: StreamFailure) -> Self {
        ClientError::Stream(f)
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Server(e) => {
                // What a log line needs besides the message: the kind and
                // the path this server puts in `data` (the reference sends none).
                f.write_str(&e.message)?;
                let field = |k: &str| e.data.as_ref()?.get(k)?.as_str();
                match (field("kind"), field("path")) {
                    (Some(kind), Some(path)) => write!(f, " [{kind}: {path}]")?,
                    (Some(kind), None) => write!(f, " [{kind}]")?,
                    (None, Some(path)) => write!(f, " [{path}]")?,
                    (None, None) => {}
                }
                write!(f, " (code {})", e.code)
            }
            ClientError::Connection(c) => write!(f, "connection: {c}"),
            ClientError::TimedOut => f.write_str("request timed out"),
            ClientError::Stream(s) => write!(f, "process stream failed: {s}"),
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
            ClientError::Stream(s) => Some(s),
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

impl ClientError {
    /// A failed call of the rpc layer, in the client's vocabulary (crate
    /// private: the rpc layer's types stay out of the public API).
    pub(crate) fn from_call(e: CallError) -> Self {
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
    fn a_server_error_names_its_kind_and_path() {
        let mut e = ErrorObject::internal("No such file or directory (os error 2)");
        e.data = Some(serde_json::json!({"kind": "programNotFound", "path": "/no/tool"}));
        assert_eq!(
            ClientError::Server(e.clone()).to_string(),
            format!(
                "No such file or directory (os error 2) [programNotFound: /no/tool] (code {})",
                e.code
            )
        );
        e.data = None;
        assert_eq!(
            ClientError::Server(e.clone()).to_string(),
            format!("No such file or directory (os error 2) (code {})", e.code)
        );
    }

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
        assert_eq!(lost.kind(), ErrorKind::RecoveryFailed);
        assert_eq!(refused.kind(), ErrorKind::ConnectRefused);
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
        assert_eq!(plain.kind(), ErrorKind::Other, "the reference: code alone");
        let mut typed = ErrorObject::internal("No such file or directory (os error 2)");
        typed.data = Some(serde_json::json!({"errno": 2, "kind": "cwdNotFound", "path": "/x"}));
        let typed = ClientError::Server(typed);
        assert_eq!(typed.kind(), ErrorKind::CwdNotFound);
        assert_eq!((typed.os_error(), typed.path()), (Some(2), Some("/x")));
    }
}
