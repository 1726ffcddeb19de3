//! `initialize`, `environment/info`, `environment/status`.

use crate::path::PathUri;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Params of `initialize`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    /// Any string naming the client.
    pub client_name: String,
    /// Resume this detached session instead of opening a new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_session_id: Option<String>,
    /// Ours, optional: extensions the client can use (wire name `extensions`).
    /// Ignored by the reference; a value of any other shape is ignored here
    /// too, so no client that does not know it sees a change.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_extensions"
    )]
    pub extensions: Option<ClientExtensions>,
}

/// What a client announces in `initialize` `extensions` (ours).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientExtensions {
    /// The highest binary-frame version the client speaks (wire name
    /// `binaryFrames`; 1 = `docs/binary-frames.md`), absent or 0 for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary_frames: Option<u32>,
}

/// `extensions` of an unexpected shape reads as absent, never as an error.
fn lenient_extensions<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<ClientExtensions>, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(v).ok())
}

/// Result of `initialize`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResponse {
    /// UUID v4 of the session (the same one on resume).
    pub session_id: String,
    /// Same object as `environment/info` (optional for older servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_info: Option<EnvironmentInfo>,
    /// Ours: the binary-frame version this connection now uses in both
    /// directions (wire name `binaryFrames`); present only when the client
    /// announced one and the transport carries binary frames.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary_frames: Option<u32>,
}

/// The shell the executor would use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShellInfo {
    /// e.g. `bash`.
    pub name: String,
    /// e.g. `/bin/bash`.
    pub path: String,
}

/// Result of `environment/info`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentInfo {
    /// The shell the executor would use.
    pub shell: ShellInfo,
    /// Executor version (`"0.0.0"` when a peer omits it).
    #[serde(default = "default_version")]
    pub executor_version: String,
    /// `sha256:<hex>` identity of the executor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// Working directory of the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathUri>,
    /// Home directory of the server's user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_home_dir: Option<PathUri>,
    /// `linux`, `macos`, `windows`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform_os: Option<String>,
    /// Directories put in front of PATH for children.
    #[serde(default)]
    pub prepend_path_dirs: Vec<PathUri>,
    /// From TMPDIR; empty when unset.
    #[serde(default)]
    pub temporary_directories: Vec<PathUri>,
    /// The system temporary directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temp_dir: Option<PathUri>,
    /// Feature flags; absent means false. Our additions use new keys.
    #[serde(default)]
    pub capabilities: BTreeMap<String, bool>,
}

fn default_version() -> String {
    "0.0.0".into()
}

/// Result of `environment/status`: `{"status":"ready"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusResponse {
    /// Always `ready` from this server.
    pub status: String,
}
