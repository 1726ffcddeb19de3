//! The JSON-RPC envelope as the reference speaks it: no `jsonrpc` member is sent and
//! one received is ignored; messages are classified by which members they carry.

use crate::decode::{from_slice_bounded, MAX_JSONRPC_VALUE_NODES};
use crate::error::ErrorObject;
use crate::trace::TraceContext;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;

/// A JSON-RPC request id: a string or a signed 64-bit integer. Integer `1` and string
/// `"1"` are different ids.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RequestId {
    /// A signed 64-bit integer id.
    Integer(i64),
    /// A string id (may be empty).
    String(String),
}

impl RequestId {
    /// The id the server uses for replies to messages it could not decode: `-1`.
    pub const UNDECODABLE: RequestId = RequestId::Integer(-1);
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::Integer(i) => write!(f, "{i}"),
            RequestId::String(s) => write!(f, "{s:?}"),
        }
    }
}

/// A request: `{id, method, params?}`. Absent params are [`Value::Null`].
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Request id, echoed in the response.
    pub id: RequestId,
    /// Method name, e.g. `process/start`.
    pub method: String,
    /// Raw params; `Null` when absent.
    pub params: Value,
    /// The optional `trace` member (W3C trace context); a malformed one is
    /// `None`, never an error.
    pub trace: Option<TraceContext>,
}

/// A notification: `{method, params?}`.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    /// Method name, e.g. `process/output`.
    pub method: String,
    /// Raw params; `Null` when absent.
    pub params: Value,
}

/// A successful response: `{id, result}`.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// Id of the request answered.
    pub id: RequestId,
    /// The result value.
    pub result: Value,
}

/// An error response: `{error:{code, message, data?}, id}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorResponse {
    /// Id of the request answered (`-1` for an undecodable message).
    pub id: RequestId,
    /// The error.
    pub error: ErrorObject,
}

/// Any message of the dialect, classified as the reference classifies: `method`+`id` is a
/// request, `method` alone a notification, `result` a response, anything else an
/// error response.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// `{id, method, params?}`
    Request(Request),
    /// `{method, params?}`
    Notification(Notification),
    /// `{id, result}`
    Response(Response),
    /// `{id, error}`
    Error(ErrorResponse),
}

/// Why a message could not be decoded. Its text is the serde-style detail the
/// reference puts after its transport prefix, e.g. `expected a JSON-RPC object`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DecodeError {}

impl Message {
    /// Decodes one message with the node budget ([`MAX_JSONRPC_VALUE_NODES`]) and
    /// duplicate-key check.
    pub fn decode(text: &[u8]) -> Result<Message, DecodeError> {
        Self::decode_with_budget(text, MAX_JSONRPC_VALUE_NODES)
    }

    /// As [`Message::decode`] with an explicit node budget.
    pub fn decode_with_budget(text: &[u8], max_nodes: usize) -> Result<Message, DecodeError> {
        let value = from_slice_bounded(text, max_nodes).map_err(|e| DecodeError(e.to_string()))?;
        Self::from_value(value)
    }

    /// Classifies an already parsed value.
    pub fn from_value(value: Value) -> Result<Message, DecodeError> {
        let Value::Object(mut obj) = value else {
            return Err(DecodeError("expected a JSON-RPC object".into()));
        };
        let has_method = obj.contains_key("method");
        let has_id = obj.contains_key("id");
        if has_method {
            let method = take_string(&mut obj, "method")?;
            let params = obj.remove("params").unwrap_or(Value::Null);
            if has_id {
                let id = take_id(&mut obj)?;
                let trace = obj.get("trace").and_then(TraceContext::from_value);
                return Ok(Message::Request(Request {
                    id,
                    method,
                    params,
                    trace,
                }));
            }
            return Ok(Message::Notification(Notification { method, params }));
        }
        if let Some(result) = obj.remove("result") {
            let id = take_id(&mut obj)?;
            return Ok(Message::Response(Response { id, result }));
        }
        let error = obj
            .remove("error")
            .ok_or_else(|| DecodeError("missing field `error`".into()))?;
        let error: ErrorObject =
            serde_json::from_value(error).map_err(|e| DecodeError(e.to_string()))?;
        let id = take_id(&mut obj)?;
        Ok(Message::Error(ErrorResponse { id, error }))
    }

    /// Encodes the message as the reference does (no `jsonrpc` member).
    pub fn encode(&self) -> String {
        match self {
            Message::Request(r) => {
                encode_request_traced(&r.id, &r.method, &r.params, r.trace.as_ref())
            }
            Message::Notification(n) => encode_notification(&n.method, &n.params),
            Message::Response(r) => encode_response(&r.id, &r.result),
            Message::Error(e) => encode_error(&e.id, &e.error),
        }
    }
}

fn take_string(obj: &mut Map<String, Value>, key: &str) -> Result<String, DecodeError> {
    match obj.remove(key) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(DecodeError(format!(
            "invalid type: {}, expected a string",
            describe(&other)
        ))),
        None => Err(DecodeError(format!("missing field `{key}`"))),
    }
}

fn take_id(obj: &mut Map<String, Value>) -> Result<RequestId, DecodeError> {
    match obj.remove("id") {
        Some(Value::String(s)) => Ok(RequestId::String(s)),
        Some(Value::Number(n)) if n.as_i64().is_some() => {
            Ok(RequestId::Integer(n.as_i64().unwrap_or_default()))
        }
        Some(_) => Err(DecodeError(
            "data did not match any variant of untagged enum RequestId".into(),
        )),
        None => Err(DecodeError("missing field `id`".into())),
    }
}

/// serde's name for the type of a JSON value, as used in its "invalid type" errors.
pub fn describe(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "sequence",
        Value::Object(_) => "map",
    }
}

fn push_json<T: Serialize + ?Sized>(out: &mut String, v: &T) {
    // Serializing plain data into a String cannot fail; fall back to null defensively.
    match serde_json::to_string(v) {
        Ok(s) => out.push_str(&s),
        Err(_) => out.push_str("null"),
    }
}

/// `{"id":ID,"method":M,"params":P}` (params omitted when null).
pub fn encode_request(id: &RequestId, method: &str, params: &Value) -> String {
    encode_request_traced(id, method, params, None)
}

/// As [`encode_request`], with a `trace` member after `params` when given.
pub fn encode_request_traced(
    id: &RequestId,
    method: &str,
    params: &Value,
    trace: Option<&TraceContext>,
) -> String {
    let mut s = String::with_capacity(64);
    s.push_str("{\"id\":");
    push_json(&mut s, id);
    s.push_str(",\"method\":");
    push_json(&mut s, method);
    if !params.is_null() {
        s.push_str(",\"params\":");
        push_json(&mut s, params);
    }
    if let Some(t) = trace {
        s.push_str(",\"trace\":");
        push_json(&mut s, &t.to_value());
    }
    s.push('}');
    s
}

/// `{"method":M,"params":P}` for any serializable params (a typed notification or
/// a [`Value`]), without an intermediate [`Value`]; params omitted when they
/// encode as `null`.
pub fn encode_notification<T: Serialize + ?Sized>(method: &str, params: &T) -> String {
    let mut s = String::with_capacity(64);
    s.push_str("{\"method\":");
    push_json(&mut s, method);
    let mut p = String::new();
    push_json(&mut p, params);
    if p != "null" {
        s.push_str(",\"params\":");
        s.push_str(&p);
    }
    s.push('}');
    s
}

/// `{"id":ID,"result":R}` for any serializable result.
pub fn encode_response<T: Serialize + ?Sized>(id: &RequestId, result: &T) -> String {
    let mut s = String::with_capacity(64);
    s.push_str("{\"id\":");
    push_json(&mut s, id);
    s.push_str(",\"result\":");
    push_json(&mut s, result);
    s.push('}');
    s
}

/// `{"error":{"code":C,"message":M},"id":ID}` — `error` first, as the reference prints it.
pub fn encode_error(id: &RequestId, error: &ErrorObject) -> String {
    let mut s = String::with_capacity(96);
    s.push_str("{\"error\":");
    push_json(&mut s, error);
    s.push_str(",\"id\":");
    push_json(&mut s, id);
    s.push('}');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn trace_member_is_read_leniently_and_written_back() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let text = format!(r#"{{"id":1,"method":"m","trace":{{"traceparent":"{tp}"}}}}"#);
        let Ok(Message::Request(r)) = Message::decode(text.as_bytes()) else {
            panic!("a request");
        };
        assert_eq!(r.trace.as_ref().map(|t| t.traceparent.as_str()), Some(tp));
        assert_eq!(Message::Request(r).encode(), text);
        // A malformed trace never fails the request.
        let Ok(Message::Request(r)) =
            Message::decode(br#"{"id":1,"method":"m","trace":{"traceparent":7}}"#)
        else {
            panic!("still a request");
        };
        assert_eq!(r.trace, None);
    }

    #[test]
    fn classification_order() {
        let m = Message::decode(br#"{"jsonrpc":"2.0","id":1,"method":"m"}"#).unwrap();
        assert!(matches!(
            m,
            Message::Request(Request {
                id: RequestId::Integer(1),
                ..
            })
        ));
        let m = Message::decode(br#"{"method":"m","params":{"a":1}}"#).unwrap();
        assert_eq!(
            m,
            Message::Notification(Notification {
                method: "m".into(),
                params: json!({"a":1})
            })
        );
        let m = Message::decode(br#"{"id":"1","result":null}"#).unwrap();
        assert_eq!(
            m,
            Message::Response(Response {
                id: RequestId::String("1".into()),
                result: Value::Null
            })
        );
        assert_eq!(
            Message::decode(br#"{"id":7}"#).unwrap_err().0,
            "missing field `error`"
        );
        assert_eq!(
            Message::decode(b"[1,2]").unwrap_err().0,
            "expected a JSON-RPC object"
        );
        assert!(Message::decode(br#"{"id":1.5,"method":"m"}"#)
            .unwrap_err()
            .0
            .contains("untagged enum RequestId"));
        assert!(Message::decode(br#"{"id":null,"method":"m"}"#).is_err());
    }

    #[test]
    fn large_ids_are_exact() {
        let m = Message::decode(br#"{"id":9007199254740993,"method":"m"}"#).unwrap();
        assert_eq!(m.encode(), r#"{"id":9007199254740993,"method":"m"}"#);
    }

    #[test]
    fn error_is_printed_before_id() {
        let e = encode_error(&RequestId::Integer(-1), &ErrorObject::invalid_request("x"));
        assert_eq!(e, r#"{"error":{"code":-32600,"message":"x"},"id":-1}"#);
    }
}
