//! The `sandbox` member of `process/start` and every `fs/*` method
//! (`FileSystemSandboxContext`, SANDBOX.md §1).
//!
//! Wire quirks kept exactly, because the reference's decode errors (-32602) are
//! serde's messages for these very shapes:
//! - camelCase at the context level, but **snake_case inside `permissions`**
//!   (`file_system`, `glob_pattern`, `project_roots`, …);
//! - `windowsSandboxLevel` is required even on Linux;
//! - access `none` is accepted and means `deny` ([`FileSystemAccess::is_deny`]);
//! - unknown fields are ignored at every level.

use crate::path::PathUri;
use serde::{Deserialize, Serialize};

/// `sandbox`: the portable sandbox intent of one request.
///
/// Decode errors (all -32602, texts of the reference): ``missing field `permissions` ``,
/// ``missing field `windowsSandboxLevel` ``, `unknown variant …` for every enum,
/// `invalid URI: …` for a path that is not a `file:` URI.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileSystemSandboxContext {
    /// `permissions`: what the command may do.
    pub permissions: ExecPermissionProfile,
    /// `windowsSandboxLevel`: required, ignored on Linux.
    pub windows_sandbox_level: WindowsSandboxLevel,
    /// `cwd`: the policy's working directory. For `process/start` it defaults to
    /// the process `cwd`; `fs/*` requires it when the profile has cwd-dependent
    /// entries ([`FileSystemSandboxContext::is_dynamic`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathUri>,
    /// `policyContext`: newer home of `cwd` and `workspaceRoots` (same meaning;
    /// the top-level fields win when both are given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_context: Option<PolicyContext>,
    /// `workspaceRoots`: what `project_roots` and `current_working_directory` expand to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workspace_roots: Vec<PathUri>,
    /// `userHomeDir` (accepted, unused on Linux).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_home_dir: Option<PathUri>,
    /// `temporaryDirectories` (accepted, unused on Linux: `tmpdir` is the child's `TMPDIR`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temporary_directories: Option<Vec<PathUri>>,
    /// `windowsSandboxProxySettingsMode` (Windows only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows_sandbox_proxy_settings_mode: Option<WindowsProxySettingsMode>,
    /// `useLegacyLandlock`: with a restricted file system the reference's helper
    /// refuses to run the command (SANDBOX.md §2.5); so does this server.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub use_legacy_landlock: bool,
    /// `sandboxOverride` (no effect on Linux).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_override: Option<SandboxOverride>,
}

impl FileSystemSandboxContext {
    /// The policy cwd: `cwd`, else `policyContext.cwd`.
    pub fn policy_cwd(&self) -> Option<&PathUri> {
        self.cwd
            .as_ref()
            .or_else(|| self.policy_context.as_ref()?.cwd.as_ref())
    }

    /// The workspace roots: `workspaceRoots`, else `policyContext.workspaceRoots`.
    pub fn roots(&self) -> &[PathUri] {
        if !self.workspace_roots.is_empty() {
            return &self.workspace_roots;
        }
        self.policy_context
            .as_ref()
            .map(|p| p.workspace_roots.as_slice())
            .unwrap_or(&[])
    }

    /// True when the profile has entries whose meaning depends on the policy cwd
    /// (`project_roots`, `current_working_directory`, a relative glob): `fs/*`
    /// then needs `cwd` (-32602 `file system sandbox context with dynamic
    /// permissions requires cwd`).
    pub fn is_dynamic(&self) -> bool {
        let ExecPermissionProfile::Managed {
            file_system: FileSystemPermissions::Restricted { entries },
            ..
        } = &self.permissions
        else {
            return false;
        };
        entries.iter().any(|e| match &e.path {
            PermissionPath::Special {
                value: SpecialPath::ProjectRoots { .. } | SpecialPath::CurrentWorkingDirectory,
            } => true,
            PermissionPath::GlobPattern { pattern } => !pattern.starts_with('/'),
            _ => false,
        })
    }
}

/// `policyContext`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyContext {
    /// `cwd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathUri>,
    /// `workspaceRoots`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workspace_roots: Vec<PathUri>,
}

/// `windowsSandboxLevel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WindowsSandboxLevel {
    /// `disabled`.
    Disabled,
    /// `restricted-token`.
    RestrictedToken,
    /// `elevated`.
    Elevated,
    /// `mxc`.
    Mxc,
}

/// `windowsSandboxProxySettingsMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WindowsProxySettingsMode {
    /// `reconcile`.
    Reconcile,
    /// `preserve`.
    Preserve,
}

/// `sandboxOverride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SandboxOverride {
    /// `noOverride`.
    NoOverride,
    /// `escalatedSandboxWithRestrictions`.
    EscalatedSandboxWithRestrictions,
    /// `bypassSandboxFirstAttempt`.
    BypassSandboxFirstAttempt,
}

/// `permissions` (ExecPermissionProfile), tagged by `type`; inner names snake_case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecPermissionProfile {
    /// `managed`: the executor confines the file system and the network.
    Managed {
        /// `file_system`.
        file_system: FileSystemPermissions,
        /// `network`.
        network: NetworkAccess,
    },
    /// `disabled`: no restriction at all.
    Disabled,
    /// `external`: the caller is already sandboxed; only `network` applies.
    External {
        /// `network`.
        network: NetworkAccess,
    },
}

/// `network`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkAccess {
    /// `restricted`: no network.
    Restricted,
    /// `enabled`: the host network.
    Enabled,
}

/// `file_system`, tagged by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FileSystemPermissions {
    /// `restricted`: only what `entries` grant.
    Restricted {
        /// `entries`, applied in order of specificity (see the sandbox crate).
        entries: Vec<FileSystemEntry>,
    },
    /// `unrestricted`: full disk write.
    Unrestricted,
}

/// One `entries` element.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileSystemEntry {
    /// `path`.
    pub path: PermissionPath,
    /// `access`.
    pub access: FileSystemAccess,
}

/// `access`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileSystemAccess {
    /// `read`.
    Read,
    /// `write` (implies read).
    Write,
    /// `deny`: not readable.
    Deny,
    /// `none`: the reference normalises it to `deny`.
    None,
}

impl FileSystemAccess {
    /// True for `deny` and `none`.
    pub fn is_deny(self) -> bool {
        matches!(self, FileSystemAccess::Deny | FileSystemAccess::None)
    }
}

/// `path` of an entry, tagged by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PermissionPath {
    /// `path`: one `file:` URI.
    Path {
        /// `path`.
        path: PathUri,
    },
    /// `glob_pattern`: `*`, `?`, `[...]`, `**`; relative patterns are relative to the policy cwd.
    GlobPattern {
        /// `pattern`.
        pattern: String,
    },
    /// `special`.
    Special {
        /// `value`.
        value: SpecialPath,
    },
}

/// `special` paths, tagged by `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SpecialPath {
    /// `root`: the whole file system.
    Root,
    /// `minimal`: platform basics (`/bin`, `/etc`, `/lib*`, `/sbin`, `/usr`).
    Minimal,
    /// `current_working_directory`: expands to the workspace roots (a reference quirk).
    CurrentWorkingDirectory,
    /// `project_roots`: each workspace root, with `subpath` appended when given.
    ProjectRoots {
        /// `subpath`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        subpath: Option<String>,
    },
    /// `tmpdir`: the child's `TMPDIR`.
    Tmpdir,
    /// `slash_tmp`: `/tmp`.
    SlashTmp,
    /// `unknown`: a kind from a newer client; ignored.
    Unknown {
        /// `path`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<String>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decode(v: serde_json::Value) -> Result<FileSystemSandboxContext, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    #[test]
    fn workspace_write_decodes() {
        let s = decode(json!({"windowsSandboxLevel": "disabled", "cwd": "file:///w",
            "workspaceRoots": ["file:///w"],
            "permissions": {"type": "managed", "network": "restricted", "file_system": {"type": "restricted",
              "entries": [{"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
                          {"path": {"type": "special", "value": {"kind": "project_roots"}}, "access": "write"},
                          {"path": {"type": "path", "path": "file:///w/s"}, "access": "none"}]}}}))
        .unwrap();
        assert!(s.is_dynamic());
        assert_eq!(s.roots().len(), 1);
        let ExecPermissionProfile::Managed {
            file_system: FileSystemPermissions::Restricted { entries },
            network,
        } = &s.permissions
        else {
            panic!("managed");
        };
        assert_eq!(*network, NetworkAccess::Restricted);
        assert!(entries[2].access.is_deny());
    }

    #[test]
    fn errors_are_the_references() {
        let perm = |p: serde_json::Value| {
            decode(json!({"windowsSandboxLevel": "disabled", "permissions": p}))
        };
        assert_eq!(
            decode(json!({"permissions": {"type": "disabled"}})).unwrap_err(),
            "missing field `windowsSandboxLevel`"
        );
        assert_eq!(
            decode(json!({"windowsSandboxLevel": "disabled"})).unwrap_err(),
            "missing field `permissions`"
        );
        assert_eq!(
            perm(json!({"type": "x"})).unwrap_err(),
            "unknown variant `x`, expected one of `managed`, `disabled`, `external`"
        );
        assert_eq!(
            perm(json!({"type": "managed", "file_system": {"type": "x"}, "network": "enabled"}))
                .unwrap_err(),
            "unknown variant `x`, expected `restricted` or `unrestricted`"
        );
        assert_eq!(
            perm(
                json!({"type": "managed", "file_system": {"type": "unrestricted"}, "network": "x"})
            )
            .unwrap_err(),
            "unknown variant `x`, expected `restricted` or `enabled`"
        );
        let entry = |e: serde_json::Value| {
            perm(json!({"type": "managed", "network": "enabled", "file_system": {"type": "restricted", "entries": [e]}}))
                .unwrap_err()
        };
        assert_eq!(
            entry(json!({"path": {"type": "x"}, "access": "read"})),
            "unknown variant `x`, expected one of `path`, `glob_pattern`, `special`"
        );
        assert_eq!(
            entry(json!({"path": {"type": "path", "path": "file:///a"}, "access": "x"})),
            "unknown variant `x`, expected one of `read`, `write`, `deny`, `none`"
        );
        assert_eq!(
            entry(json!({"path": {"type": "path", "path": "/a"}, "access": "read"})),
            "invalid URI: relative URL without a base"
        );
        assert_eq!(
            entry(json!({"path": {"type": "special", "value": {"kind": "x"}}, "access": "read"})),
            "unknown variant `x`, expected one of `root`, `minimal`, `current_working_directory`, `project_roots`, `tmpdir`, `slash_tmp`, `unknown`"
        );
        assert_eq!(
            perm(json!({"type": "managed", "network": "enabled", "file_system": {"type": "restricted"}})).unwrap_err(),
            "missing field `entries`"
        );
        assert_eq!(
            perm(json!({"type": "external"})).unwrap_err(),
            "missing field `network`"
        );
    }
}
