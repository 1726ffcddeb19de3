//! The server's and the client's hot path over the wire's JSON: what is
//! done to a message's bytes before (or instead of) a full parse, so bulk
//! payloads are never copied into a JSON value.
//!
//! - [`skim`]: finds top-level members and plain strings without parsing;
//! - [`lift`]: while a WebSocket frame is read, decodes a large base64 member
//!   in place and leaves a small skeleton ([`lift::LiftedText`]);
//! - [`hot`]: decodes the methods whose payload is bulk (`process/write`,
//!   `fs/writeFile`, …) from text or a lifted skeleton, with the same
//!   answers as [`exec_server_protocol::Message::decode`] would give.
//!
//! It is a crate of its own so `exec-server-protocol` stays what travels on
//! the wire; every answer here is checked against that crate's decoder (unit
//! tests and the `fuzz_decode` example).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod hot;
pub mod lift;
pub mod skim;
