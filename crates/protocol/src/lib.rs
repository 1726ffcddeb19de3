//! Wire types of the exec-server JSON-RPC dialect (that of the Codex CLI's
//! `exec-server` 0.169.0): the envelope, bounded decoding, method names, typed
//! params and results, error codes, [`ByteChunk`] and [`PathUri`]. No I/O.
//!
//! ```
//! use exec_server_protocol::{Message, RequestId, types::ExecParams};
//!
//! let text = br#"{"id":1,"method":"process/start","params":{"processId":"p1",
//!   "argv":["echo","hi"],"cwd":"file:///tmp","env":{},"tty":false}}"#;
//! let Ok(Message::Request(req)) = Message::decode(text) else { panic!() };
//! assert_eq!(req.id, RequestId::Integer(1));
//! let params: ExecParams = serde_json::from_value(req.params).unwrap();
//! assert_eq!(params.argv, ["echo", "hi"]);
//! assert_eq!(params.cwd.to_path().unwrap(), std::path::Path::new("/tmp"));
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod binary;
pub mod bytes;
pub mod decode;
pub mod envelope;
pub mod error;
pub mod methods;
pub mod path;
pub mod trace;
pub mod types;

pub use bytes::ByteChunk;
pub use decode::{from_slice_bounded, MAX_JSONRPC_VALUE_NODES};
pub use envelope::{
    encode_error, encode_notification, encode_request, encode_request_traced, encode_response,
    DecodeError, ErrorResponse, Message, Notification, Request, RequestId, Response,
};
pub use error::ErrorObject;
pub use path::PathUri;
pub use trace::TraceContext;

/// Largest WebSocket message (and frame) either side accepts: 128 MiB. Larger
/// ones close the connection with status 1009 (message too big). Enough for
/// `fs/writeFile` of 96 MiB after base64; larger files go through `fs/open` +
/// `fs/writeBlock`.
pub const MAX_MESSAGE_BYTES: usize = 128 * 1024 * 1024;

/// Decodes params into `T` as the reference does: absent params are `null`, and an
/// empty object is retried as `null` so that unit-like params accept `{}`.
/// Errors are serde's text, for a -32602 reply.
pub fn decode_params<T: serde::de::DeserializeOwned>(
    params: serde_json::Value,
) -> Result<T, String> {
    let empty_object = matches!(&params, serde_json::Value::Object(m) if m.is_empty());
    match serde_json::from_value::<T>(params) {
        Ok(v) => Ok(v),
        Err(e) if empty_object => {
            serde_json::from_value::<T>(serde_json::Value::Null).map_err(|_| e.to_string())
        }
        Err(e) => Err(e.to_string()),
    }
}
