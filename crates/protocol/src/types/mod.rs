//! Typed params and results of every method, camelCase on the wire.

pub mod discovery;
pub mod fs;
pub mod http;
pub mod network;
pub mod process;
pub mod sandbox;
pub mod session;

pub use discovery::*;
pub use fs::*;
pub use http::*;
pub use network::*;
pub use process::*;
pub use sandbox::*;
pub use session::*;

/// An empty result or params object: `{}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Empty {}
