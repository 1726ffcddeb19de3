//! The domain error: what went wrong in a session, process, file or HTTP
//! operation, in terms a backend can produce without knowing the wire. Only
//! `handlers/` turns an [`ExecError`] into a JSON-RPC code and text.

use std::fmt;

/// What kind of failure an [`ExecError`] is; a caller branches on this, never
/// on the text. The one vocabulary of every layer (see
/// [`exec_server_protocol::error::ErrorKind`]): the handlers answer with it,
/// the sandbox's file helper carries it across its pipe, the client reads it.
pub use exec_server_protocol::error::ErrorKind;

/// A domain failure: a kind, a message for people, and the underlying error when
/// there is one.
#[derive(Debug)]
pub struct ExecError {
    kind: ErrorKind,
    message: String,
    path: Option<std::path::PathBuf>,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// Result of a domain operation.
pub type ExecResult<T> = Result<T, ExecError>;

impl ExecError {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ExecError {
            kind,
            message: message.into(),
            path: None,
            source: None,
        }
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// An OS error, its text as the message (`No such file or directory (os
    /// error 2)`): [`ErrorKind::NotFound`] for ENOENT, [`ErrorKind::Io`] otherwise.
    pub fn io(err: std::io::Error) -> Self {
        let kind = if err.kind() == std::io::ErrorKind::NotFound {
            ErrorKind::NotFound
        } else {
            ErrorKind::Io
        };
        ExecError::new(kind, err.to_string()).with_source(err)
    }

    /// [`ErrorKind::NotFound`].
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
    /// [`ErrorKind::UnknownId`].
    pub fn unknown_id(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::UnknownId, message)
    }
    /// [`ErrorKind::AlreadyExists`].
    pub fn already_exists(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::AlreadyExists, message)
    }
    /// [`ErrorKind::InvalidInput`].
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }
    /// [`ErrorKind::InvalidParams`].
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidParams, message)
    }
    /// [`ErrorKind::LimitReached`].
    pub fn limit_reached(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::LimitReached, message)
    }
    /// [`ErrorKind::PermissionDenied`].
    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::PermissionDenied, message)
    }
    /// [`ErrorKind::Failed`].
    pub fn failed(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Failed, message)
    }

    /// Names the path the failure is about (a program, a working directory).
    pub fn with_path(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.path = Some(path.into());
        self
    }

    /// The kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The path the failure is about, when one was named.
    pub fn path(&self) -> Option<&std::path::Path> {
        self.path.as_deref()
    }

    /// The message, without the source's text.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The underlying OS error, if this came from one.
    pub fn io_error(&self) -> Option<&std::io::Error> {
        self.source.as_ref()?.downcast_ref()
    }
}

impl From<std::io::Error> for ExecError {
    fn from(err: std::io::Error) -> Self {
        ExecError::io(err)
    }
}

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ExecError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    #[test]
    fn io_errors_keep_their_source_and_text() {
        let e = ExecError::io(std::io::Error::from_raw_os_error(2));
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert_eq!(e.message(), "No such file or directory (os error 2)");
        assert_eq!(e.io_error().and_then(|e| e.raw_os_error()), Some(2));
        assert!(e.source().is_some());
        let e = ExecError::from(std::io::Error::from_raw_os_error(13));
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(ExecError::failed("x").source().is_none());
    }
}
