//! WebSocket frames after the handshake (RFC 6455 §5): headers parsed and
//! built ([`frame`]), and the masking a client applies to what it sends
//! ([`mask`]). The readers and writers that use them live with their
//! callers: `exec-server-rpc`'s transport (messages for a JSON-RPC peer) and
//! `exec-server-relay`'s sockets (shared relay frames forwarded untouched).
#![deny(missing_docs)]

pub mod frame;
pub mod mask;
