//! The domain error: what went wrong in a session, process, file or HTTP
//! operation, in terms a backend can produce without knowing the wire. Only
//! `handlers/` turns an [`ExecError`] into a JSON-RPC code and text.

use std::fmt;

/// What kind of failure an [`ExecError`] is; a caller branches on this, never on
/// the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A file, directory or open handle does not exist (ENOENT included).
    NotFound,
    /// An id the client should hold does not name anything here (a session or a
    /// process); unlike [`ErrorKind::NotFound`] this is the client's mistake.
    UnknownId,
    /// The client-chosen id (process, handle, watch) is taken.
    AlreadyExists,
    /// The request cannot apply to the object as it is (wrong kind of file
    /// system object, out-of-range offset, a terminal call on a pipe process).
    InvalidInput,
    /// A parameter is malformed (a NUL byte in a path, a bad URL or header).
    InvalidParams,
    /// A per-session or per-connection limit is reached.
    LimitReached,
    /// A policy refuses the request (e.g. a sandbox this server cannot enforce).
    PermissionDenied,
    /// A write to something that only reads.
    ReadOnly,
    /// The session is attached to another connection.
    Attached,
    /// `process/start`: the program does not exist (not in `PATH`, or no file
    /// at the path given); the [`std::io::Error`] is the source.
    ProgramNotFound,
    /// `process/start`: the program exists but cannot be executed (no execute
    /// permission, or not a format the kernel runs).
    NotExecutable,
    /// `process/start`: the working directory does not exist or is not a
    /// directory.
    CwdNotFound,
    /// The child process could not be started otherwise; the [`std::io::Error`] is the
    /// [`source`](std::error::Error::source) (ENOENT included: a missing program
    /// is not a missing file the client named).
    Spawn,
    /// An operating-system failure other than not-found; the
    /// [`std::io::Error`] is the [`source`](std::error::Error::source).
    Io,
    /// Anything else that failed on the executor (a child that cannot be fed,
    /// an HTTP transport failure).
    Failed,
}

impl ErrorKind {
    const ALL: [ErrorKind; 15] = [
        ErrorKind::NotFound,
        ErrorKind::UnknownId,
        ErrorKind::AlreadyExists,
        ErrorKind::InvalidInput,
        ErrorKind::InvalidParams,
        ErrorKind::LimitReached,
        ErrorKind::PermissionDenied,
        ErrorKind::ReadOnly,
        ErrorKind::Attached,
        ErrorKind::ProgramNotFound,
        ErrorKind::NotExecutable,
        ErrorKind::CwdNotFound,
        ErrorKind::Spawn,
        ErrorKind::Io,
        ErrorKind::Failed,
    ];

    /// A stable name (`"notFound"`, `"io"`, …), for carrying a kind between
    /// processes of this server (the sandbox's file helper); never on the wire.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "notFound",
            ErrorKind::UnknownId => "unknownId",
            ErrorKind::AlreadyExists => "alreadyExists",
            ErrorKind::InvalidInput => "invalidInput",
            ErrorKind::InvalidParams => "invalidParams",
            ErrorKind::LimitReached => "limitReached",
            ErrorKind::PermissionDenied => "permissionDenied",
            ErrorKind::ReadOnly => "readOnly",
            ErrorKind::Attached => "attached",
            ErrorKind::ProgramNotFound => "programNotFound",
            ErrorKind::NotExecutable => "notExecutable",
            ErrorKind::CwdNotFound => "cwdNotFound",
            ErrorKind::Spawn => "spawn",
            ErrorKind::Io => "io",
            ErrorKind::Failed => "failed",
        }
    }

    /// The kind [`name`](Self::name) returned, if any.
    pub fn from_name(name: &str) -> Option<ErrorKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

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

    #[test]
    fn kind_names_round_trip() {
        for k in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_name(k.name()), Some(k));
        }
        assert_eq!(ErrorKind::from_name("nope"), None);
    }
}
