//! `process/start.shellSnapshot` (capability `shellSnapshotV2`): a command
//! `[<shell>, "-lc", <script>, …]` runs with the user's login-shell state
//! captured once per scope, instead of the shell re-reading its startup files
//! for every command.
//!
//! Per session, a scope's capture is keyed by the request (scope id, shell
//! name and path), the command's cwd, env policy and sandbox, and the
//! variables that choose the startup files ([`STARTUP_VARS`]): a command that
//! would start its login shell differently gets its own capture. Other
//! variables may differ from command to command (Codex sends a tool-call id in
//! each): a snapshot keeps only what the startup files changed
//! ([`EnvChange`]), applied to each command's own environment. The capture
//! runs exactly as the command would (environment, cwd, sandbox), so it sees
//! what the command could see and nothing more.
//!
//! The command then runs as `<shell> -pc` (bash; `-c` for sh, `-fc` for zsh:
//! no startup files) with a one-line prologue that `eval`s the captured
//! options, functions, aliases and umask. Of the captured environment, an
//! extension of a variable (`PATH=/x:$PATH`) applies to the command's own
//! value, as a login shell would; a variable set or unset outright applies
//! unless the request names it (the request wins, as in the reference). A
//! failed capture is retried at most [`MAX_ATTEMPTS`] times,
//! [`RETRY_BACKOFF`] apart; meanwhile and after, the command runs unchanged,
//! as a plain login shell.

mod capture;

use crate::process::plan::Exec;
pub use capture::{CaptureError, EnvChange, Snapshot, CAPTURE_TIMEOUT, MAX_CAPTURE_BYTES};
use exec_server_protocol::types::{
    EnvPolicy, ExecParams, FileSystemSandboxContext, ShellSnapshotRequest,
};
use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::OnceCell;

/// Longest `scopeId`: 256 bytes.
pub const MAX_SCOPE_BYTES: usize = 256;
/// Captures kept per session (least recently used evicted): 16.
pub const MAX_CACHED: usize = 16;
/// Captures tried per cache entry before giving up on it: 3.
pub const MAX_ATTEMPTS: u32 = 3;
/// Wait after a failed capture before the next command may try again: 1 s.
pub const RETRY_BACKOFF: Duration = Duration::from_secs(1);
/// The captured state is passed in variables of at most this size (64 KiB):
/// Linux refuses a single argument or variable over 128 KiB.
const STATE_CHUNK_BYTES: usize = 64 * 1024;
/// Prefix of those variables; the prologue unsets them before anything else.
const STATE_VAR_PREFIX: &str = "EXEC_SERVER_SHELL_SNAPSHOT_";
/// Variables that decide which startup files a shell reads: part of a
/// capture's key.
pub const STARTUP_VARS: &[&str] = &["HOME", "ZDOTDIR", "ENV", "BASH_ENV", "XDG_CONFIG_HOME"];

/// Shells whose state can be captured (`shellSnapshot.shell.name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShellKind {
    /// `bash`.
    Bash,
    /// `zsh`.
    Zsh,
    /// `sh` (POSIX: options and aliases; it cannot print functions).
    Sh,
}

impl ShellKind {
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "bash" => Some(Self::Bash),
            "zsh" => Some(Self::Zsh),
            "sh" => Some(Self::Sh),
            _ => None,
        }
    }

    /// The flag that runs a command string without startup files, and what
    /// the command string starts with.
    fn restore_flag_and_preamble(self) -> (&'static str, &'static str) {
        match self {
            // Privileged mode keeps bash from reading $BASH_ENV and importing
            // functions from the environment; it is turned off at once.
            ShellKind::Bash => ("-pc", "set +o privileged; "),
            ShellKind::Zsh => ("-fc", ""),
            ShellKind::Sh => ("-c", ""),
        }
    }

    /// How the prologue prints, whatever functions the state defines.
    fn printf(self) -> &'static str {
        match self {
            ShellKind::Sh => "command printf",
            _ => "builtin printf",
        }
    }
}

/// A `shellSnapshot` the server refuses (invalid params).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    /// `scopeId` empty or over [`MAX_SCOPE_BYTES`].
    #[error("shell snapshot scope must be non-empty and at most {MAX_SCOPE_BYTES} bytes")]
    Scope,
    /// `shell.name` is not one of [`ShellKind`]'s.
    #[error("shell snapshots are unsupported for shell `{0}`")]
    UnsupportedShell(String),
}

/// What [`ShellSnapshots::apply`] did to a start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// No `shellSnapshot` in the request.
    NotRequested,
    /// The command is not `[shell.path, "-lc", script, …]`: unchanged.
    NotApplicable,
    /// No snapshot could be captured: unchanged (a plain login shell).
    CaptureFailed,
    /// The command now restores the snapshot instead of reading startup files.
    Restored,
}

#[derive(PartialEq)]
struct Key {
    request: ShellSnapshotRequest,
    cwd: std::path::PathBuf,
    env_policy: Option<EnvPolicy>,
    sandbox: Option<FileSystemSandboxContext>,
    startup_vars: Vec<Option<String>>,
}

/// A capture, or the earliest time a failed one may be retried.
type Cell = Arc<OnceCell<Result<Arc<Snapshot>, Instant>>>;

struct Entry {
    key: Key,
    attempts: u32,
    cell: Cell,
}

/// A session's captures, most recently used last.
#[derive(Default)]
pub struct ShellSnapshots {
    entries: Mutex<VecDeque<Entry>>,
}

impl ShellSnapshots {
    /// Rewrites `exec` (argv and environment) to restore the scope's
    /// snapshot, capturing it first if this scope has none yet. `request`
    /// is the wire request (its `shellSnapshot`, `envPolicy` and `sandbox`
    /// key the capture); `named`: variables the snapshot leaves as they are
    /// ([`crate::process::plan::named_by_request`]); `sandbox` confines the
    /// capture as it will the command; `volatile` names variables the server
    /// itself sets for each process (the network proxy's), which do not make
    /// a new capture.
    /// Errors: only a refused request; a failed capture leaves `exec` as is.
    pub async fn apply(
        &self,
        request: &ExecParams,
        exec: &mut Exec,
        named: &BTreeSet<String>,
        sandbox: Option<&crate::sandbox::StartSandbox>,
        volatile: &BTreeSet<String>,
        host: &crate::process::Host,
    ) -> Result<Outcome, SnapshotError> {
        let Some(snapshot_request) = request.shell_snapshot.clone() else {
            return Ok(Outcome::NotRequested);
        };
        if snapshot_request.scope_id.is_empty() || snapshot_request.scope_id.len() > MAX_SCOPE_BYTES
        {
            return Err(SnapshotError::Scope);
        }
        if exec.argv.len() < 3
            || exec.argv[0] != snapshot_request.shell.path
            || exec.argv[1] != "-lc"
        {
            return Ok(Outcome::NotApplicable);
        }
        let kind = ShellKind::from_name(&snapshot_request.shell.name)
            .ok_or_else(|| SnapshotError::UnsupportedShell(snapshot_request.shell.name.clone()))?;
        let mut env_policy = request.env_policy.clone();
        if let Some(policy) = env_policy.as_mut() {
            policy.set.retain(|k, _| !volatile.contains(k));
        }
        let key = Key {
            request: snapshot_request,
            cwd: exec.cwd.clone(),
            env_policy,
            sandbox: request.sandbox.clone(),
            startup_vars: STARTUP_VARS
                .iter()
                .map(|v| exec.env.get(*v).cloned())
                .collect(),
        };
        let cell = self.cell_for(key);
        let captured = cell
            .get_or_init(|| async {
                let policy = request.env_policy.as_ref();
                match capture::capture(kind, exec, policy, sandbox, host).await {
                    Ok(snapshot) => Ok(Arc::new(snapshot)),
                    Err(e) => {
                        tracing::warn!(error = %e, "shell snapshot capture failed; the command runs as a login shell");
                        Err(Instant::now() + RETRY_BACKOFF)
                    }
                }
            })
            .await;
        match captured {
            Ok(snapshot) => {
                restore(kind, snapshot, exec, named);
                Ok(Outcome::Restored)
            }
            Err(_) => Ok(Outcome::CaptureFailed),
        }
    }

    /// The cell for `key`, made most recently used; a failed cell whose
    /// backoff is over is replaced (while attempts remain).
    fn cell_for(&self, key: Key) -> Cell {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = entries.iter().position(|e| e.key == key) {
            if let Some(mut entry) = entries.remove(i) {
                let retry_due = matches!(entry.cell.get(), Some(Err(at)) if Instant::now() >= *at);
                if retry_due && entry.attempts < MAX_ATTEMPTS {
                    entry.attempts += 1;
                    entry.cell = Arc::default();
                }
                let cell = entry.cell.clone();
                entries.push_back(entry);
                return cell;
            }
        }
        let cell = Cell::default();
        entries.push_back(Entry {
            key,
            attempts: 1,
            cell: cell.clone(),
        });
        while entries.len() > MAX_CACHED {
            entries.pop_front();
        }
        cell
    }
}

/// Makes `exec` run its script after restoring `snapshot`; variables in
/// `named` are extended but never set or unset by it.
fn restore(kind: ShellKind, snapshot: &Snapshot, exec: &mut Exec, named: &BTreeSet<String>) {
    let env = &mut exec.env;
    for (name, change) in &snapshot.env {
        match change {
            EnvChange::Wrap { prefix, suffix } => {
                let own = env.get(name).map(String::as_str).unwrap_or("");
                let value = format!("{prefix}{own}{suffix}");
                env.insert(name.clone(), value);
            }
            _ if named.contains(name) => {}
            EnvChange::Set(value) => {
                env.insert(name.clone(), value.clone());
            }
            EnvChange::Unset => {
                env.remove(name);
            }
        }
    }
    env.retain(|k, _| !k.starts_with(STATE_VAR_PREFIX));

    let mut names = Vec::new();
    let mut rest = snapshot.state.as_str();
    while !rest.is_empty() {
        let mut end = rest.len().min(STATE_CHUNK_BYTES);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let (chunk, tail) = rest.split_at(end);
        let name = format!("{STATE_VAR_PREFIX}{}", names.len());
        env.insert(name.clone(), chunk.to_owned());
        names.push(name);
        rest = tail;
    }
    let expansion: String = names.iter().map(|n| format!("${{{n}}}")).collect();
    let (flag, preamble) = kind.restore_flag_and_preamble();
    // One line, so the script's own line numbers ($LINENO, error messages)
    // are what they would be without the snapshot.
    let prologue = if names.is_empty() {
        String::new()
    } else {
        format!(
            "if ! eval \"unset {}; {expansion}\" >/dev/null; then \
             {} 'failed to restore shell snapshot\\n' >&2; fi; ",
            names.join(" "),
            kind.printf()
        )
    };
    exec.argv[1] = flag.to_owned();
    exec.argv[2] = format!("{preamble}{prologue}{}", exec.argv[2]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use exec_server_protocol::types::SnapshotShell;
    use std::collections::BTreeMap;

    fn params(argv: &[&str]) -> ExecParams {
        let cwd = exec_server_protocol::PathUri::parse("file:///tmp").unwrap();
        let mut p = ExecParams::new(
            "p",
            argv.iter().map(|s| s.to_string()).collect(),
            cwd,
            BTreeMap::from([("PATH".into(), "/req/bin".into())]),
        );
        p.shell_snapshot = Some(ShellSnapshotRequest {
            scope_id: "s".into(),
            shell: SnapshotShell {
                name: "bash".into(),
                path: "/bin/bash".into(),
            },
        });
        p
    }

    #[test]
    fn restore_keeps_request_variables_first_and_splits_large_state() {
        let mut p = params(&["/bin/bash", "-lc", "echo hi", "zero"]);
        let state = "x".repeat(STATE_CHUNK_BYTES + 10);
        p.env.insert("EDITOR".into(), "nano".into());
        p.env.insert(
            "UNSET_BY_PROFILE".into(),
            "kept: the request names it".into(),
        );
        let snapshot = Snapshot {
            state: state.clone(),
            env: BTreeMap::from([
                (
                    "PATH".into(),
                    EnvChange::Wrap {
                        prefix: "/profile/bin:".into(),
                        suffix: String::new(),
                    },
                ),
                ("FROM_PROFILE".into(), EnvChange::Set("1".into())),
                ("EDITOR".into(), EnvChange::Set("vim".into())),
                ("UNSET_BY_PROFILE".into(), EnvChange::Unset),
            ]),
        };
        let env = crate::process::spawn::build_env(&p.env, None, std::iter::empty());
        let mut exec = Exec::of(&p, "/tmp".into(), env);
        let named = crate::process::plan::named_by_request(&p, &exec.env, &BTreeSet::new(), false);
        restore(ShellKind::Bash, &snapshot, &mut exec, &named);
        assert_eq!(exec.argv[0], "/bin/bash");
        assert_eq!(exec.argv[1], "-pc");
        assert_eq!(exec.argv[3], "zero");
        assert!(exec.argv[2].starts_with("set +o privileged; if ! eval"));
        assert!(exec.argv[2].ends_with("; fi; echo hi"));
        assert!(!exec.argv[2].contains('\n'), "{}", exec.argv[2]);
        assert_eq!(exec.env["PATH"], "/profile/bin:/req/bin");
        assert_eq!(exec.env["FROM_PROFILE"], "1");
        assert_eq!(exec.env["EDITOR"], "nano");
        assert_eq!(exec.env["UNSET_BY_PROFILE"], "kept: the request names it");
        let chunks = format!("{STATE_VAR_PREFIX}0");
        assert_eq!(exec.env[&chunks].len(), STATE_CHUNK_BYTES);
        assert_eq!(exec.env[&format!("{STATE_VAR_PREFIX}1")].len(), 10);
    }

    #[test]
    fn a_masked_environment_keeps_every_variable_it_had() {
        let p = params(&["/bin/bash", "-lc", "echo hi"]);
        let env = BTreeMap::from([("API_KEY".to_string(), "placeholder".to_string())]);
        let mut exec = Exec::of(&p, "/tmp".into(), env);
        let snapshot = Snapshot {
            state: String::new(),
            env: BTreeMap::from([("API_KEY".into(), EnvChange::Set("real".into()))]),
        };
        let named = crate::process::plan::named_by_request(&p, &exec.env, &BTreeSet::new(), true);
        restore(ShellKind::Bash, &snapshot, &mut exec, &named);
        assert_eq!(exec.env["API_KEY"], "placeholder");
        let named = crate::process::plan::named_by_request(&p, &exec.env, &BTreeSet::new(), false);
        restore(ShellKind::Bash, &snapshot, &mut exec, &named);
        assert_eq!(exec.env["API_KEY"], "real");
    }

    async fn apply(
        cache: &ShellSnapshots,
        p: &ExecParams,
        host: &crate::process::Host,
    ) -> Result<Outcome, SnapshotError> {
        let mut exec = Exec::of(p, "/tmp".into(), p.env.clone());
        let none = BTreeSet::new();
        cache.apply(p, &mut exec, &none, None, &none, host).await
    }

    #[tokio::test]
    async fn refused_and_inapplicable_requests() {
        let cache = ShellSnapshots::default();
        let host = crate::process::Host {
            tool_dirs: Vec::new().into(),
            cgroups: crate::process::cgroup::Cgroups::new(false),
            handover: Default::default(),
            warm: crate::process::warm::Pool::new(0),
            output_sinks: None,
        };
        let p = params(&["/bin/bash", "-c", "echo"]);
        assert_eq!(apply(&cache, &p, &host).await, Ok(Outcome::NotApplicable));
        let p = params(&["bash", "-lc", "echo"]);
        assert_eq!(apply(&cache, &p, &host).await, Ok(Outcome::NotApplicable));
        let mut p = params(&["/bin/bash", "-lc", "echo"]);
        p.shell_snapshot.as_mut().unwrap().scope_id = String::new();
        assert_eq!(apply(&cache, &p, &host).await, Err(SnapshotError::Scope));
        let mut p = params(&["/bin/bash", "-lc", "echo"]);
        p.shell_snapshot.as_mut().unwrap().shell.name = "fish".into();
        assert_eq!(
            apply(&cache, &p, &host).await,
            Err(SnapshotError::UnsupportedShell("fish".into()))
        );
        let mut p = params(&["/bin/bash", "-lc", "echo"]);
        p.shell_snapshot = None;
        assert_eq!(apply(&cache, &p, &host).await, Ok(Outcome::NotRequested));
    }
}
