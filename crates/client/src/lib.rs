//! A typed async client for exec-server (and for the Codex CLI's `exec-server`
//! 0.169.0, which speaks the same protocol).
//!
//! * [`ExecServerClient`]: every method of the protocol as an async call; lazy
//!   connect shared by concurrent callers; after a dropped connection the session
//!   is resumed within [`client::SESSION_RECOVERY_TIMEOUT`], each process is replayed
//!   from its last released seq, and a gap is reported as
//!   [`ProcessEvent::Failed`], never as silent loss. Stdin writes are retried with
//!   the same writeId, which the server de-duplicates.
//! * [`ProcessHandle`]: a started process's events, strictly in seq order.
//! * [`environment`]: the local/remote `Environment` abstraction and its configuration.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use exec_server_client::{ClientOptions, ExecServerClient, ProcessEvent, Source};
//! use exec_server_protocol::{types::ExecParams, PathUri};
//!
//! let client = ExecServerClient::new(ClientOptions::new(Source::from_url("ws://127.0.0.1:8765", None)?));
//! let mut proc = client
//!     .start_process(ExecParams::new(
//!         "p1",
//!         vec!["echo".into(), "hello".into()],
//!         PathUri::parse("file:///tmp")?,
//!         [("PATH".to_string(), "/usr/bin:/bin".to_string())].into(),
//!     ))
//!     .await?;
//! while let Some(ev) = proc.next_event().await {
//!     match ev {
//!         ProcessEvent::Output { data, .. } => print!("{}", String::from_utf8_lossy(&data)),
//!         ProcessEvent::Exited { code, .. } => println!("exit {code}"),
//!         ProcessEvent::Closed { .. } => break,
//!         ProcessEvent::Failed(why) => return Err(why.into()),
//!     }
//! }
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod client;
pub mod connect;
pub mod environment;
pub mod error;
pub mod events;
#[cfg(feature = "relay")]
pub mod relay;

pub use client::{ClientOptions, ExecServerClient, ProcessHandle};
pub use connect::Source;
pub use error::{ClientError, ConnectionError, ConnectionErrorKind};
pub use events::ProcessEvent;
