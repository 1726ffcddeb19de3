//! `environmentConfig/read`, `capabilities/discoverV2`, `capabilityRoots/discoverV1`.

use crate::path::PathUri;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Params of `environmentConfig/read`. The paths are TOML key paths
/// (e.g. `[["model"], ["shell_environment_policy", "inherit"]]`), not file paths.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentConfigReadParams {
    /// Working directory of the caller.
    pub cwd: PathUri,
    /// Keys to read from the user configuration.
    pub config_paths: Vec<Vec<String>>,
    /// Keys to read from the requirements files.
    pub requirements_paths: Vec<Vec<String>>,
}

/// One configuration file's contribution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigLayer {
    /// e.g. `user (/root/.codex/config.toml)`.
    pub source: String,
    /// Directory of the file.
    pub base_dir: PathUri,
    /// The requested keys, re-serialized as TOML.
    pub toml: String,
}

/// Layers of one kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigLayers {
    /// Layers, lowest precedence first.
    pub layers: Vec<ConfigLayer>,
    /// Where cloud layers would be inserted (0).
    pub cloud_insertion_index: u64,
}

/// Result of `environmentConfig/read`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentConfigReadResponse {
    /// Home directory.
    pub user_home_dir: Option<PathUri>,
    /// `$CODEX_HOME` (default `~/.codex`).
    pub codex_home_dir: Option<PathUri>,
    /// Host name.
    pub hostname: String,
    /// User configuration layers.
    pub config: ConfigLayers,
    /// Requirements layers.
    pub requirements: ConfigLayers,
}

/// Params of `capabilities/discoverV2`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoverV2Params {
    /// Directory to discover from.
    pub cwd: PathUri,
}

/// Result of `capabilities/discoverV2`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiscoverV2Response {
    /// Plugins found.
    pub plugins: Vec<Value>,
    /// Skills found.
    pub skills: Vec<Value>,
    /// Problems met.
    pub warnings: Vec<String>,
}

/// One root to inspect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapabilityRoot {
    /// Caller's id, echoed.
    pub id: String,
    /// Directory.
    pub path: PathUri,
    /// `sandbox`: the file-system sandbox the scan of this root runs under
    /// (SANDBOX.md); absent = unconfined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<super::sandbox::FileSystemSandboxContext>,
}

/// Params of `capabilityRoots/discoverV1`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RootsDiscoverParams {
    /// Roots, answered in order.
    pub roots: Vec<CapabilityRoot>,
}

/// A plugin manifest found in a root.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginFound {
    /// The manifest JSON.
    pub manifest: Value,
    /// `.mcp.json` beside the manifest's directory, when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_config: Option<Value>,
    /// `.app.json`, when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apps_config: Option<Value>,
}

/// A file's path and text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileContents {
    /// Where.
    pub path: PathUri,
    /// Text.
    pub contents: String,
}

/// A skill found in a root (`SKILL.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkillFound {
    /// The SKILL.md file.
    pub instructions: FileContents,
    /// Always `null`, as the reference sends it: the client reads the front
    /// matter from `instructions` itself.
    #[serde(default)]
    pub metadata: Option<Value>,
}

/// The answer for one root.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RootDiscovery {
    /// Caller's id.
    pub id: String,
    /// Directory.
    pub path: PathUri,
    /// Plugin manifest, if any.
    pub plugin: Option<PluginFound>,
    /// Skills.
    pub skills: Vec<SkillFound>,
    /// Namespace manifests.
    pub namespace_manifests: Vec<Value>,
    /// Problems met.
    pub warnings: Vec<String>,
    /// Why the root could not be read.
    pub error: Option<String>,
}

/// Result of `capabilityRoots/discoverV1`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RootsDiscoverResponse {
    /// One entry per requested root, in order.
    pub roots: Vec<RootDiscovery>,
}
