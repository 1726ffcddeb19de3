//! JSON-RPC error objects and the codes this dialect uses.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

/// -32600: undecodable message, handshake gate, unknown session, duplicate ids,
/// wrong kind of file system object.
pub const INVALID_REQUEST: i64 = -32600;
/// -32601: method not found.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// -32602: params that do not decode or are out of range.
pub const INVALID_PARAMS: i64 = -32602;
/// -32603: OS errors other than not-found, spawn failures, HTTP transport failures.
pub const INTERNAL_ERROR: i64 = -32603;
/// -32004: not found (ENOENT, unknown file handle).
pub const NOT_FOUND: i64 = -32004;
/// -32010: the session is attached to another connection.
pub const SESSION_ALREADY_ATTACHED: i64 = -32010;

/// A JSON-RPC error object: `{code, message, data?}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorObject {
    /// One of the codes above (others may come from other peers).
    pub code: i64,
    /// Human-readable text; match it loosely.
    pub message: String,
    /// Optional structured detail; the reference never sends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// Not on the wire: the OS error number behind an error made by
    /// [`ErrorObject::from_io`], so a caller can re-map it by kind (the
    /// sandboxed file-system helper answers as the reference's does).
    #[serde(skip)]
    pub os_error: Option<i32>,
}

impl ErrorObject {
    /// An error with `code` and `message`.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        ErrorObject {
            code,
            message: message.into(),
            data: None,
            os_error: None,
        }
    }
    /// -32600 with `message`.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(INVALID_REQUEST, message)
    }
    /// -32601 for `method`: ``exec-server stub does not implement `METHOD` yet``.
    pub fn method_not_found(method: &str) -> Self {
        Self::new(
            METHOD_NOT_FOUND,
            format!("exec-server stub does not implement `{method}` yet"),
        )
    }
    /// -32602 with `message`.
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(INVALID_PARAMS, message)
    }
    /// -32603 with `message`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(INTERNAL_ERROR, message)
    }
    /// -32004 with `message`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(NOT_FOUND, message)
    }
    /// -32010: `session <id> is already attached to another connection`.
    pub fn session_already_attached(session_id: &str) -> Self {
        Self::new(
            SESSION_ALREADY_ATTACHED,
            format!("session {session_id} is already attached to another connection"),
        )
    }
    /// Maps an I/O error as the reference does: not-found → -32004, others → -32603,
    /// both with the OS text (`No such file or directory (os error 2)`).
    pub fn from_io(err: &std::io::Error) -> Self {
        let mut e = if err.kind() == std::io::ErrorKind::NotFound {
            Self::not_found(err.to_string())
        } else {
            Self::internal(err.to_string())
        };
        e.os_error = err.raw_os_error();
        e
    }
}

impl fmt::Display for ErrorObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.message, self.code)
    }
}

impl std::error::Error for ErrorObject {}

/// What kind of failure an error is: `data.kind` of our errors (the
/// reference sends no `data`), and the kind every layer of this server
/// speaks (the domain errors, the sandbox's file helper, the client). One
/// vocabulary: the wire name is the serde name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum ErrorKind {
    /// `notFound`: a file, directory or open handle does not exist (-32004).
    NotFound,
    /// `unknownId`: an id the client should hold names nothing here (a
    /// session, a process); unlike `notFound` the client's mistake (-32600).
    UnknownId,
    /// `alreadyExists`: the client-chosen id (process, handle, watch) is
    /// taken (-32600).
    AlreadyExists,
    /// `invalidInput`: the request cannot apply to the object as it is
    /// (wrong kind of object, out-of-range offset, a terminal call on a pipe
    /// process) (-32600).
    InvalidInput,
    /// `invalidParams`: a parameter is malformed (-32602).
    InvalidParams,
    /// `limitReached`: a per-session, per-connection or per-server limit is
    /// reached (-32600).
    LimitReached,
    /// `permissionDenied`: a policy or the OS (EACCES, EPERM) refused (-32603).
    PermissionDenied,
    /// `readOnly`: a write to something that only reads (-32603).
    ReadOnly,
    /// `sessionAttached`: the session is attached to another connection
    /// (-32010).
    SessionAttached,
    /// `programNotFound`: `process/start`'s program does not exist (-32603).
    ProgramNotFound,
    /// `notExecutable`: the program exists but cannot be executed (-32603).
    NotExecutable,
    /// `cwdNotFound`: the working directory does not exist or is not a
    /// directory (-32603).
    CwdNotFound,
    /// `spawnFailed`: the child could not be started otherwise (-32603).
    SpawnFailed,
    /// `io`: an operating-system failure other than not-found (-32603).
    Io,
    /// `failed`: anything else that failed on the executor (-32603).
    Failed,
    /// `upgrading`: the server is handing over to a new binary and did
    /// nothing; resume the session and send the same request again (a
    /// write with the same writeId is applied once) (-32603).
    Upgrading,
}

impl ErrorKind {
    /// The JSON-RPC code an error of this kind is answered with.
    pub fn code(self) -> i64 {
        match self {
            ErrorKind::NotFound => NOT_FOUND,
            ErrorKind::UnknownId
            | ErrorKind::AlreadyExists
            | ErrorKind::InvalidInput
            | ErrorKind::LimitReached => INVALID_REQUEST,
            ErrorKind::InvalidParams => INVALID_PARAMS,
            ErrorKind::SessionAttached => SESSION_ALREADY_ATTACHED,
            _ => INTERNAL_ERROR,
        }
    }

    /// The wire name (`notFound`, `spawnFailed`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "notFound",
            ErrorKind::UnknownId => "unknownId",
            ErrorKind::AlreadyExists => "alreadyExists",
            ErrorKind::InvalidInput => "invalidInput",
            ErrorKind::InvalidParams => "invalidParams",
            ErrorKind::LimitReached => "limitReached",
            ErrorKind::PermissionDenied => "permissionDenied",
            ErrorKind::ReadOnly => "readOnly",
            ErrorKind::SessionAttached => "sessionAttached",
            ErrorKind::ProgramNotFound => "programNotFound",
            ErrorKind::NotExecutable => "notExecutable",
            ErrorKind::CwdNotFound => "cwdNotFound",
            ErrorKind::SpawnFailed => "spawnFailed",
            ErrorKind::Io => "io",
            ErrorKind::Failed => "failed",
            ErrorKind::Upgrading => "upgrading",
        }
    }

    /// The kind an error object names in `data.kind`, if it names one this
    /// version knows.
    pub fn of(e: &ErrorObject) -> Option<ErrorKind> {
        let kind = e.data.as_ref()?.get("kind")?;
        ErrorKind::deserialize(kind).ok()
    }
}

#[cfg(test)]
mod kind_tests {
    use super::*;

    #[test]
    fn the_wire_name_is_the_serde_name() {
        for k in [
            ErrorKind::NotFound,
            ErrorKind::SessionAttached,
            ErrorKind::SpawnFailed,
            ErrorKind::ProgramNotFound,
            ErrorKind::Io,
        ] {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
            let mut e = ErrorObject::new(k.code(), "x");
            e.data = Some(serde_json::json!({"kind": k.as_str()}));
            assert_eq!(ErrorKind::of(&e), Some(k));
        }
        let mut e = ErrorObject::new(-32603, "x");
        e.data = Some(serde_json::json!({"kind": "somethingNew"}));
        assert_eq!(ErrorKind::of(&e), None);
    }
}
