//! `environment/info`: what the executor is, computed once at start.

use exec_server_protocol::types::{EnvironmentInfo, ShellInfo};
use exec_server_protocol::PathUri;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Version reported as `executorVersion`: the protocol version we implement, so
/// clients that compare versions treat us as the reference release.
pub const EXECUTOR_VERSION: &str = "0.169.0";

/// Capability flags. The reference's keys come first with the values that are true
/// of this server; our additions use new keys that a Codex client ignores.
/// `sandbox_enforced`: this server confines sandboxed requests (`sandboxEnforced`, ours).
pub fn capabilities(
    sandbox_enforced: bool,
    caps: &crate::process::resources::Places,
) -> BTreeMap<String, bool> {
    [
        // Reference keys.
        ("networkProxyLaunch", true),
        ("networkProxyReviewDomains", true),
        ("credentialMasking", true),
        ("credentialMaskingCustomProviders", true),
        ("capabilityDiscoverySandbox", sandbox_enforced),
        ("fsWatchMissing", true),
        ("capabilityDiscoveryV2", true),
        ("environmentConfigRead", true),
        ("httpHeaderEnvVars", true),
        ("sandboxedFileStreaming", sandbox_enforced),
        ("fileWriteStreaming", true),
        ("shellSnapshotV2", true),
        ("windowsMxc", false),
        ("linuxRootWritePreservesDevices", sandbox_enforced),
        // 0.171.0's key: `proxy.transparentTcp` routes an enforced sandbox's
        // raw TCP through the proxy (only with a sandbox to enforce it).
        (
            "networkProxyTransparentTcp",
            sandbox_enforced && crate::network::TransparentTcpConfig::supported(),
        ),
        (
            "linuxApprovedRootWritePreservesRestrictions",
            sandbox_enforced,
        ),
        // Ours.
        ("processResize", true),
        ("processCloseStdin", true),
        ("processExtendedSignals", true),
        ("processOutputAck", true),
        ("processTreeKill", true),
        // `limits` of `process/start`: timeoutMs, idleTimeoutMs,
        // maxOutputBytes; the exit names the one that fired.
        ("processLimits", true),
        // `process/list`: the caller's session's processes.
        ("processList", true),
        ("fsWatch", true),
        ("sandboxEnforced", sandbox_enforced),
        // Binary frames (`docs/binary-frames.md`): offered to a client that
        // announces them in `initialize`, on WebSocket connections.
        ("binaryFrames", true),
    ]
    .into_iter()
    // `limits.memoryBytes`, `maxTasks`, `cpuPercent`: true where a cgroup
    // controller holds them for the whole tree.
    .chain(caps.capabilities())
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn uri(p: &Path) -> Option<PathUri> {
    PathUri::from_path(p)
}

/// Computes the info for this host; `sandbox_enforced` and `caps` as
/// [`capabilities`].
pub fn environment_info(
    sandbox_enforced: bool,
    caps: &crate::process::resources::Places,
    prepend_path: &[PathBuf],
) -> EnvironmentInfo {
    let shell_path = std::env::var("SHELL")
        .ok()
        .filter(|s| Path::new(s).is_absolute())
        .unwrap_or_else(|| {
            if Path::new("/bin/bash").exists() {
                "/bin/bash".into()
            } else {
                "/bin/sh".into()
            }
        });
    let shell_name = Path::new(&shell_path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "sh".into());
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let tmpdir = std::env::var_os("TMPDIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    let hostname = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    let machine_id = std::fs::read_to_string("/etc/machine-id").unwrap_or_default();
    let digest = Sha256::digest(format!(
        "exec-server\0{hostname}\0{}\0{}",
        machine_id.trim(),
        nix::unistd::getuid()
    ));
    EnvironmentInfo {
        shell: ShellInfo {
            name: shell_name,
            path: shell_path,
        },
        executor_version: EXECUTOR_VERSION.into(),
        provider_id: Some(format!("sha256:{}", hex::encode(digest))),
        cwd: std::env::current_dir().ok().as_deref().and_then(uri),
        user_home_dir: home.as_deref().and_then(uri),
        platform_os: Some(std::env::consts::OS.to_string()),
        prepend_path_dirs: prepend_path_dirs(prepend_path)
            .iter()
            .filter_map(|d| uri(d))
            .collect(),
        temporary_directories: tmpdir.as_deref().and_then(uri).into_iter().collect(),
        temp_dir: uri(&std::env::temp_dir()),
        capabilities: capabilities(sandbox_enforced, caps),
    }
}

/// True if `dir/name` is an executable regular file (symlinks followed).
fn has_executable(dir: &Path, name: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(dir.join(name))
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `prependPathDirs`: directories the client puts in front of `PATH` for the
/// commands it runs here, so the tools it relies on (ripgrep above all) are
/// found even when a command's `PATH` lacks them. `explicit` (`--prepend-path`)
/// wins: its existing directories, in order (a missing one is left out with a
/// warning, never reported). Otherwise the first directory holding an
/// executable `rg` among `tools/` beside this executable, `$CARGO_HOME/bin` and
/// `~/.cargo/bin`, or none (where `rg` is in a system directory, commands find
/// it on their usual `PATH`).
pub fn prepend_path_dirs(explicit: &[PathBuf]) -> Vec<PathBuf> {
    if !explicit.is_empty() {
        return explicit
            .iter()
            .filter(|d| {
                let ok = d.is_absolute() && d.is_dir();
                if !ok {
                    tracing::warn!(
                        "--prepend-path {}: not an existing absolute directory; not reported",
                        d.display()
                    );
                }
                ok
            })
            .cloned()
            .collect();
    }
    let beside_exe = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|p| p.join("tools")));
    let cargo_home = std::env::var_os("CARGO_HOME").map(|h| PathBuf::from(h).join("bin"));
    let home_cargo = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo/bin"));
    [beside_exe, cargo_home, home_cargo]
        .into_iter()
        .flatten()
        .find(|d| has_executable(d, "rg"))
        .into_iter()
        .collect()
}
