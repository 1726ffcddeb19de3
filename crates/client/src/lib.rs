//! A typed async client for exec-server (and for the Codex CLI's `exec-server`
//! 0.169.0, which speaks the same protocol): start processes and stream their
//! output, read and write files, make HTTP requests, on this machine or a
//! remote one.
//!
//! * [`Command`] builds a process to start; [`Command::spawn`] returns a
//!   [`ProcessHandle`]: [`wait`](ProcessHandle::wait),
//!   [`wait_with_output`](ProcessHandle::wait_with_output) ([`Output`]),
//!   [`next_event`](ProcessHandle::next_event) ([`ProcessEvent`]) or
//!   [`output_stream`](ProcessHandle::output_stream), stdin
//!   ([`write`](ProcessHandle::write), [`close_stdin`](ProcessHandle::close_stdin)),
//!   [`signal`](ProcessHandle::signal) ([`ProcessSignal`]) and
//!   [`terminate`](ProcessHandle::terminate) ([`TerminateOutcome`]). Read
//!   [Exited and Closed](ProcessHandle#exited-and-closed) before waiting on a
//!   command that starts background jobs.
//! * [`ExecServerClient`] ([`ClientOptions`], [`Source`]): every method of the
//!   protocol as an async call; lazy connect shared by concurrent callers;
//!   after a dropped connection the session is resumed within
//!   [`SESSION_RECOVERY_TIMEOUT`], each process is replayed from its last
//!   released event, and a gap is reported as [`ProcessEvent::Failed`]
//!   ([`StreamFailure`], [`FailureReason`]), never as silent loss.
//!   [`connection_events`](ExecServerClient::connection_events) reports losses
//!   and recoveries ([`ConnectionEvent`]). Files go by [`PathUri`]
//!   ([`upload`](ExecServerClient::upload), [`download`](ExecServerClient::download),
//!   [`read_file`](ExecServerClient::read_file)…).
//! * [`Environment`] ([`environment`]): `local` (a server embedded in this
//!   process, feature `embedded`) or `remote`, configured as the Codex CLI does.
//! * Errors: [`ClientError`]; branch on [`ClientError::kind`] ([`ErrorKind`]),
//!   e.g. [`ErrorKind::ProgramNotFound`] vs [`ErrorKind::CwdNotFound`].
//!
//! The protocol types a caller needs are re-exported here ([`ExecParams`],
//! [`OutputStream`], [`WriteStatus`], [`ProcessSignal`], [`PathUri`], and the
//! rest under [`protocol`]), so this crate is the only dependency.
//!
//! ```no_run
//! use exec_server_client::{Command, Environment};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // `Environment::remote("box", "ws://127.0.0.1:8765", None)?` for a server elsewhere.
//!     let env = Environment::local()?;
//!     let out = Command::new("sh")
//!         .args(["-c", "echo hello; echo oops >&2; exit 3"])
//!         .cwd("/tmp")
//!         .spawn(&env.client)
//!         .await?
//!         .wait_with_output(1 << 20)
//!         .await?;
//!     assert_eq!((out.code, &out.stdout[..], &out.stderr[..]), (3, &b"hello\n"[..], &b"oops\n"[..]));
//!     Ok(())
//! }
//! ```
//!
//! More in `crates/client/examples/` (each one runs in the test suite).
//!
//! # Features
//!
//! | feature | default | what it adds | what it pulls in |
//! |---|---|---|---|
//! | `embedded` | yes | [`Environment::local`]: a server in this process | the whole server (process management, the sandbox, the network proxy) |
//! | `relay` | yes | environments reached by id through a registry and an end-to-end encrypted relay ([`relay`]) | reqwest and the Noise crypto |
//!
//! A harness that only talks to servers elsewhere over WebSocket, a Unix
//! socket or a program's stdio needs neither: `default-features = false`.
//!
//! Output arrives as [`Bytes`] (re-exported), and
//! [`ProcessHandle::output_stream`] is a [`futures_util::Stream`]: bring
//! [`StreamExt`] (re-exported) into scope to use it.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod client;
mod command;
mod connect;
pub mod environment;
mod error;
mod events;
pub mod network;
#[cfg(feature = "relay")]
pub mod relay;

pub use client::{
    ClientOptions, ConnectionEvent, ExecServerClient, Output, ProcessHandle, TerminateOutcome,
    Watch, WatchEvent, ACK_EVERY_BYTES, ACK_EVERY_CHUNKS, RECOVERY_RETRY_INTERVAL,
    RELAY_OUTPUT_WINDOW_BYTES, SESSION_RECOVERY_TIMEOUT,
};
pub use command::{Command, DEFAULT_CHILD_PATH};
#[cfg(feature = "embedded")]
pub use connect::EmbeddedServer;
pub use connect::Source;
pub use environment::{Environment, Environments};
pub use error::{ClientError, ConfigError, ConnectionError, ConnectionErrorKind, ErrorKind};
pub use events::{FailureReason, ProcessEvent, StreamFailure, MAX_QUEUED_OUTPUT_BYTES};
/// The embedded server's configuration ([`Source::embedded_with`]).
#[cfg(feature = "embedded")]
pub use exec_server::ServerConfig;
pub use network::{AllowHosts, NetworkPolicy};

/// The buffer type of [`ProcessEvent::Output`] (from the `bytes` crate).
pub use bytes::Bytes;
/// What [`ProcessHandle::output_stream`] needs in scope (from `futures-util`).
pub use futures_util::StreamExt;

#[doc(inline)]
pub use exec_server_protocol::types::{
    EnvInherit, EnvPolicy, ExecParams, LimitReason, OutputStream, ProcessLimits, ProcessSignal,
    PtySize, WriteStatus,
};
#[doc(inline)]
pub use exec_server_protocol::{ErrorObject, PathUri};

/// The protocol's wire types (params, replies, notifications) and error
/// codes, for the calls [`ExecServerClient`] makes with them.
pub mod protocol {
    #[doc(inline)]
    pub use exec_server_protocol::error;
    #[doc(inline)]
    pub use exec_server_protocol::types::*;
    #[doc(inline)]
    pub use exec_server_protocol::{ByteChunk, ErrorObject, PathUri};
}
