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
