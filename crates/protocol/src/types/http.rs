//! `http/request` and its `http/request/bodyDelta` notifications.

use crate::bytes::ByteChunk;
use serde::{Deserialize, Serialize};

/// One request header; `valueEnvVar` takes the value from the server's environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpHeader {
    /// Header name.
    pub name: String,
    /// Header value (ignored when `valueEnvVar` is set).
    #[serde(default)]
    pub value: String,
    /// Name of a server environment variable holding the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_env_var: Option<String>,
}

/// Redirect handling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RedirectPolicy {
    /// Follow redirects (default).
    #[default]
    Follow,
    /// Return the 3xx response itself.
    Stop,
}

/// Params of `http/request`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRequestParams {
    /// HTTP method token.
    pub method: String,
    /// Absolute http or https URL.
    pub url: String,
    /// Caller-chosen stream id, unique on the connection until the final delta.
    pub request_id: String,
    /// Headers in order; repeats preserved.
    #[serde(default)]
    pub headers: Vec<HttpHeader>,
    /// Request body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<ByteChunk>,
    /// Whole-request timeout in ms (none when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Redirect policy.
    #[serde(default)]
    pub redirect_policy: RedirectPolicy,
    /// Send the body as `http/request/bodyDelta` notifications.
    #[serde(default)]
    pub stream_response: bool,
}

/// A response header (name lower-case).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HttpResponseHeader {
    /// Lower-case name.
    pub name: String,
    /// Value.
    pub value: String,
}

/// Result of `http/request`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Headers in wire order.
    pub headers: Vec<HttpResponseHeader>,
    /// Body (empty when streamed).
    pub body_base64: ByteChunk,
}

/// `http/request/bodyDelta` notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpBodyDelta {
    /// The request's stream id.
    pub request_id: String,
    /// From 1, +1 per delta.
    pub seq: u64,
    /// At most 1 MiB of body bytes.
    pub delta_base64: ByteChunk,
    /// Final delta.
    pub done: bool,
    /// Terminal error text.
    pub error: Option<String>,
}
