//! A transport-agnostic JSON-RPC peer for the exec-server dialect.
//!
//! * [`transport`]: WebSocket frames or newline-delimited lines in, encoded
//!   messages out, through bounded channels ([`transport::Connection`]).
//! * [`router`]: typed request handlers with params decoding and a gate.
//! * [`pending`]: the table of calls awaiting responses (limits, timeouts, `Closed`).
//! * [`admission`]: rules for requests received from the other side.
//! * [`peer`]: a calling peer built from the above (used by the client).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use exec_server_rpc::{peer::RpcPeer, transport};
//! let (ws, _) = tokio_tungstenite::connect_async("ws://127.0.0.1:8765").await?;
//! let (peer, _incoming) = RpcPeer::start(transport::websocket(ws, transport::Role::Client, "server".into()));
//! let init = peer
//!     .call("initialize", serde_json::json!({"clientName": "demo"}), None)
//!     .await?;
//! println!("session {}", init["sessionId"]);
//! peer.notify("initialized", serde_json::Value::Null).await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod admission;
pub mod peer;
pub mod pending;
pub mod router;
pub mod transport;

pub use pending::CallError;
pub use transport::{Closed, Connection, Inbound, Outbound, Outgoing};
