//! Client errors as Python exceptions: the class is picked in
//! `exec_server.errors` by the client's [`ErrorKind`], and carries the wire
//! code, the server's `data` (as JSON text, decoded in Python) and the kind's
//! name.

use exec_server_client::{ClientError, ConfigError, ErrorKind};
use pyo3::prelude::*;

/// The `exec_server.errors` class name for `kind`.
fn class_of(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::ProgramNotFound => "ProgramNotFound",
        ErrorKind::NotExecutable => "NotExecutable",
        ErrorKind::CwdNotFound => "CwdNotFound",
        ErrorKind::NotFound => "NotFound",
        ErrorKind::PermissionDenied => "PermissionDenied",
        ErrorKind::InvalidRequest => "InvalidRequest",
        ErrorKind::InvalidParams => "InvalidParams",
        ErrorKind::ConnectRefused => "ConnectionRefused",
        ErrorKind::Unauthorized => "Unauthorized",
        ErrorKind::RecoveryFailed => "SessionLost",
        ErrorKind::EventsLost => "EventsLost",
        ErrorKind::TimedOut => "TimedOut",
        ErrorKind::Connection => "ConnectionFailed",
        _ => "ExecServerError",
    }
}

/// The kind's name as the Python side shows it (`kind` attribute).
fn kind_name(kind: ErrorKind) -> String {
    format!("{kind:?}")
}

/// Builds the exception `class` of `exec_server.errors` with `message`,
/// `code`, `data` (JSON text or None) and `kind`.
fn raise(
    class: &str,
    message: String,
    code: Option<i64>,
    data: Option<String>,
    kind: String,
) -> PyErr {
    if crate::EXITING.load(std::sync::atomic::Ordering::Acquire) {
        // Made lazily: nothing here may enter an exiting interpreter.
        return pyo3::exceptions::PyRuntimeError::new_err(message);
    }
    Python::attach(|py| {
        let made = py
            .import("exec_server.errors")
            .and_then(|m| m.getattr("_make"))
            .and_then(|make| make.call1((class, message.clone(), code, data, kind)));
        match made {
            Ok(e) => PyErr::from_value(e),
            Err(e) => e,
        }
    })
}

/// A [`ClientError`] as its exception.
pub(crate) fn client(e: ClientError) -> PyErr {
    let kind = e.kind();
    let data = e
        .server_error()
        .and_then(|o| o.data.as_ref())
        .map(|d| d.to_string());
    raise(
        class_of(kind),
        e.to_string(),
        e.code(),
        data,
        kind_name(kind),
    )
}

/// A [`ConfigError`] (a bad URL, an unreadable configuration) as
/// `exec_server.errors.ConfigurationError`.
pub(crate) fn config(e: ConfigError) -> PyErr {
    configuration(e.to_string())
}

/// `exec_server.errors.ConfigurationError` with `message`.
pub(crate) fn configuration(message: String) -> PyErr {
    raise(
        "ConfigurationError",
        message,
        None,
        None,
        "Configuration".into(),
    )
}

/// A local I/O failure (the embedded server cannot start, a local file of a
/// transfer) as `exec_server.errors.LocalError`.
pub(crate) fn local(context: &str, e: std::io::Error) -> PyErr {
    raise(
        "LocalError",
        format!("{context}: {e}"),
        None,
        None,
        "Local".into(),
    )
}

/// Bad arguments caught before anything is sent, as `ValueError`.
pub(crate) fn value(message: impl Into<String>) -> PyErr {
    pyo3::exceptions::PyValueError::new_err(message.into())
}

/// A streamed HTTP body the server could not finish, as
/// `exec_server.errors.ConnectionFailed`.
pub(crate) fn stream_failed(reason: String) -> PyErr {
    raise(
        "ConnectionFailed",
        format!("the response body ended early: {reason}"),
        None,
        None,
        "Connection".into(),
    )
}
