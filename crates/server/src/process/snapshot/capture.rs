//! Capturing a login shell's state: the script each shell runs after its startup
//! files, running it like the command would run (same environment, cwd and
//! sandbox), and parsing what it prints.
//!
//! The capture prints, after whatever the startup files printed:
//! `\n<MARKER>\n<state script>\0<NAME=value>\0<NAME=value>\0…`. The state
//! script (options, functions, aliases) is later `eval`ed by the command's
//! shell; the environment is merged into the command's.

use super::ShellKind;
use crate::process::spawn;
use exec_server_protocol::types::{EnvPolicy, ExecParams};
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// The line that starts the captured state; what precedes it is the startup
/// files' own output, which is dropped.
const MARKER: &str = "# exec-server shell snapshot v1";
/// Most a capture may print: 512 KiB (state and environment together).
pub const MAX_CAPTURE_BYTES: usize = 512 * 1024;
/// How long a capture may take before it is killed: 10 s.
pub const CAPTURE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most stderr kept for the log when a capture fails: 1 KiB.
const STDERR_KEPT_BYTES: usize = 1024;

/// Variables a snapshot never carries: they describe the capturing shell, not
/// the user's setup.
const SHELL_OWN_VARS: &[&str] = &["PWD", "OLDPWD", "SHLVL", "_"];

/// A captured login-shell state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Shell code that restores options, functions and aliases.
    pub state: String,
    /// The exported environment after the startup files ran, filtered.
    pub env: BTreeMap<String, String>,
}

/// Why a capture produced no snapshot (the command then runs unchanged).
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The shell could not be started.
    #[error("cannot start the shell: {0}")]
    Spawn(std::io::Error),
    /// Reading its output failed.
    #[error("cannot read the shell's output: {0}")]
    Read(std::io::Error),
    /// It ran past [`CAPTURE_TIMEOUT`] and was killed.
    #[error("timed out after {}s", CAPTURE_TIMEOUT.as_secs())]
    TimedOut,
    /// It printed more than [`MAX_CAPTURE_BYTES`].
    #[error("printed more than {MAX_CAPTURE_BYTES} bytes")]
    TooLarge,
    /// The startup files (or the capture) failed.
    #[error("exited with {code}; stderr: {stderr}")]
    Exit {
        /// Exit code (128+N for signal N).
        code: i32,
        /// The start of what it printed on stderr.
        stderr: String,
    },
    /// The output lacked the marker or the separator, or was not UTF-8.
    #[error("malformed output: {0}")]
    Malformed(&'static str),
}

/// The script a shell of this kind runs (as `-lc`, so after its startup files)
/// to print its state.
pub fn script(kind: ShellKind) -> String {
    let state = match kind {
        // Options first: `extglob` and the like change how the functions
        // after them parse.
        ShellKind::Bash => "shopt -p; set +o; declare -f; alias -p",
        ShellKind::Zsh => {
            "setopt | while IFS= read -r o; do case $o in \
             (login|interactive|shinstdin|privileged|monitor|zle|singlecommand|restricted) ;; \
             (*) print -r -- \"setopt $o\" ;; esac; done; typeset -f; alias -L"
        }
        // POSIX sh has no way to print functions; dash prints aliases bare.
        ShellKind::Sh => {
            "set +o; alias | while IFS= read -r a; do printf 'alias %s\\n' \"$a\"; done"
        }
    };
    format!("printf '\\n%s\\n' '{MARKER}'; {state}; printf '\\0'; exec env -0")
}

/// Runs `params`' shell with the capture script in place of the command's, in
/// the same cwd, environment and sandbox as the command, and parses the
/// result. `argv` of `params` is `[shell, "-lc", script, args…]`.
pub async fn capture(
    kind: ShellKind,
    params: &ExecParams,
    cwd: &Path,
    sandbox: Option<&crate::sandbox::StartSandbox>,
) -> Result<Snapshot, CaptureError> {
    let mut run = params.clone();
    run.argv = vec![params.argv[0].clone(), "-lc".into(), script(kind)];
    run.tty = false;
    run.pipe_stdin = false;
    let started = spawn::start(&run, cwd, None, sandbox).map_err(CaptureError::Spawn)?;
    let spawn::ChildIo::Pipes { stdout, stderr, .. } = started.io else {
        return Err(CaptureError::Malformed("no pipes"));
    };
    let pid = started.pid;
    let mut exit = started.exit;
    let collect = async {
        let (out, err) = tokio::join!(
            read_limited(stdout, MAX_CAPTURE_BYTES + 1),
            read_limited(stderr, STDERR_KEPT_BYTES)
        );
        let out = out.map_err(CaptureError::Read)?;
        let code = (&mut exit).await.unwrap_or(-1);
        Ok::<_, CaptureError>((out, err.unwrap_or_default(), code))
    };
    let result = tokio::time::timeout(CAPTURE_TIMEOUT, collect).await;
    // The confinement (sandbox helpers) lives until the capture is over.
    drop(started.confinement);
    let (out, stderr, code) = match result {
        Ok(r) => r?,
        Err(_) => {
            // Not reaped yet (its exit was not received), so the group id is
            // still this shell's.
            if exit.try_recv().is_err() {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            return Err(CaptureError::TimedOut);
        }
    };
    if out.len() > MAX_CAPTURE_BYTES {
        return Err(CaptureError::TooLarge);
    }
    if code != 0 {
        return Err(CaptureError::Exit {
            code,
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        });
    }
    parse(&out, params.env_policy.as_ref())
}

/// Reads `fd` to its end, keeping at most `limit` bytes (the rest is read
/// and dropped, so the writer never blocks on a full pipe).
async fn read_limited(fd: OwnedFd, limit: usize) -> std::io::Result<Vec<u8>> {
    let mut rx = tokio::net::unix::pipe::Receiver::from_owned_fd(fd)?;
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = rx.read(&mut buf).await?;
        if n == 0 {
            return Ok(kept);
        }
        let room = limit.saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
}

/// Parses a capture's output. The environment is filtered like the command's
/// own would be under `policy` (its excludes and include-only list), so a
/// startup file cannot pass a variable the policy keeps from the command.
pub fn parse(out: &[u8], policy: Option<&EnvPolicy>) -> Result<Snapshot, CaptureError> {
    let marker = format!("\n{MARKER}\n");
    let start = find(out, marker.as_bytes())
        .ok_or(CaptureError::Malformed("no snapshot marker"))?
        + marker.len();
    let rest = &out[start..];
    let nul = rest
        .iter()
        .position(|b| *b == 0)
        .ok_or(CaptureError::Malformed("no environment"))?;
    let state = std::str::from_utf8(&rest[..nul])
        .map_err(|_| CaptureError::Malformed("state is not UTF-8"))?;
    let state = state
        .lines()
        .filter(|line| !is_unsettable_option(line))
        .collect::<Vec<_>>()
        .join("\n");
    let mut env = BTreeMap::new();
    for entry in rest[nul + 1..].split(|b| *b == 0) {
        let Ok(entry) = std::str::from_utf8(entry) else {
            continue;
        };
        let Some((name, value)) = entry.split_once('=') else {
            continue;
        };
        if name.is_empty() || SHELL_OWN_VARS.contains(&name) {
            continue;
        }
        env.insert(name.to_owned(), value.to_owned());
    }
    env.retain(|k, _| !spawn::NON_INHERITABLE_ENV_VARS.contains(&k.as_str()));
    if let Some(policy) = policy {
        spawn::apply_policy_filters(&mut env, policy);
    }
    Ok(Snapshot { state, env })
}

/// Options a shell prints but refuses to set (restoring them would only print
/// an error on every command).
fn is_unsettable_option(line: &str) -> bool {
    matches!(
        line,
        "shopt -s login_shell"
            | "shopt -u login_shell"
            | "shopt -s restricted_shell"
            | "shopt -u restricted_shell"
            | "set -o privileged"
            | "set +o privileged"
    )
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(noise: &str, state: &str, env: &[&str]) -> Vec<u8> {
        let mut out = format!("{noise}\n{MARKER}\n{state}\0").into_bytes();
        for e in env {
            out.extend_from_slice(e.as_bytes());
            out.push(0);
        }
        out
    }

    #[test]
    fn noise_before_the_marker_is_dropped_and_shell_vars_removed() {
        let out = output(
            "welcome!",
            "shopt -s extglob\nshopt -u login_shell\nf () \n{ \n    echo hi\n}",
            &[
                "A=1",
                "PWD=/x",
                "SHLVL=2",
                "_=/usr/bin/env",
                "B=x=y",
                "EXEC_SERVER_TOKEN=t",
            ],
        );
        let s = parse(&out, None).unwrap();
        assert_eq!(s.state, "shopt -s extglob\nf () \n{ \n    echo hi\n}");
        assert_eq!(
            s.env,
            BTreeMap::from([("A".into(), "1".into()), ("B".into(), "x=y".into())])
        );
    }

    #[test]
    fn policy_excludes_apply_to_captured_variables() {
        let out = output("", "", &["API_TOKEN=s", "KEEP=1", "DROP_ME=1"]);
        let policy = EnvPolicy {
            inherit: exec_server_protocol::types::EnvInherit::All,
            ignore_default_excludes: false,
            exclude: vec!["drop_*".into()],
            set: BTreeMap::new(),
            include_only: vec![],
        };
        let s = parse(&out, Some(&policy)).unwrap();
        assert_eq!(s.env, BTreeMap::from([("KEEP".into(), "1".into())]));
    }

    #[test]
    fn missing_marker_or_separator_is_malformed() {
        assert!(matches!(
            parse(b"no marker\0A=1\0", None),
            Err(CaptureError::Malformed(_))
        ));
        let no_sep = format!("\n{MARKER}\nstate only");
        assert!(matches!(
            parse(no_sep.as_bytes(), None),
            Err(CaptureError::Malformed(_))
        ));
    }
}
