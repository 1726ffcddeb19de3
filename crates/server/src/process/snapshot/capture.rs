//! Capturing a login shell's state: the script each shell runs after its startup
//! files, running it like the command would run (same environment, cwd and
//! sandbox), and parsing what it prints.
//!
//! The capture prints, after whatever the startup files printed:
//! `\n<marker>\n<state script>\0<NAME=value>\0<NAME=value>\0…`. The marker
//! holds 128 random bits drawn for each capture, so nothing the startup files
//! print (a commit message, a file, a web page) can pass for the state. The
//! state script (options, functions, aliases, umask) is later `eval`ed by the
//! command's shell; the environment is kept as what the startup files
//! changed in the environment they were given ([`EnvChange`]).

use super::ShellKind;
use crate::process::plan::{Exec, Io};
use crate::process::spawn;
use exec_server_protocol::types::EnvPolicy;
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// The start of the line that starts the captured state (a random token
/// follows); what precedes it is the startup files' own output, dropped.
const MARKER_PREFIX: &str = "# exec-server shell snapshot v1 ";
/// Most a capture may print: 512 KiB (state and environment together).
pub const MAX_CAPTURE_BYTES: usize = 512 * 1024;
/// How long a capture may take before it is killed: 10 s.
pub const CAPTURE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most stderr kept for the log when a capture fails: 1 KiB.
const STDERR_KEPT_BYTES: usize = 1024;

/// Variables a snapshot never carries: they describe the capturing shell, not
/// the user's setup.
const SHELL_OWN_VARS: &[&str] = &["PWD", "OLDPWD", "SHLVL", "_"];

/// What the startup files did to one environment variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvChange {
    /// Set it to a value unrelated to the one they were given.
    Set(String),
    /// Extended the value they were given (`PATH=/x:$PATH`): the same
    /// extension applies to a later command's own value.
    Wrap {
        /// What they put before it.
        prefix: String,
        /// What they put after it.
        suffix: String,
    },
    /// Unset it.
    Unset,
}

/// A captured login-shell state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Shell code that restores options, functions, aliases and the umask.
    pub state: String,
    /// What the startup files changed in the environment, by name.
    pub env: BTreeMap<String, EnvChange>,
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
/// to print its state after `marker`. Builtins are called as builtins, so
/// functions the startup files define under their names change nothing.
pub fn script(kind: ShellKind, marker: &str) -> String {
    let (say, state) = match kind {
        // Options first: `extglob` and the like change how the functions
        // after them parse; POSIX mode (which refuses some function names) is
        // off until its own line, after the functions.
        ShellKind::Bash => (
            "builtin printf",
            "builtin printf 'set +o posix\\n'; builtin shopt -p; builtin declare -f; \
             builtin alias -p; builtin set +o; builtin umask -p",
        ),
        ShellKind::Zsh => (
            "builtin printf",
            "builtin setopt | while IFS= builtin read -r o; do case $o in \
             (login|interactive|shinstdin|privileged|monitor|zle|singlecommand|restricted) ;; \
             (*) builtin print -r -- \"setopt $o\" ;; esac; done; builtin typeset -f; \
             builtin alias -L; builtin printf 'umask %s\\n' \"$(builtin umask)\"",
        ),
        // POSIX sh has no way to print functions; dash prints aliases bare.
        ShellKind::Sh => (
            "command printf",
            "command alias | while IFS= read -r a; do command printf 'alias %s\\n' \"$a\"; done; \
             set +o; command printf 'umask %s\\n' \"$(command umask)\"",
        ),
    };
    let exec = match kind {
        ShellKind::Sh => "exec",
        _ => "builtin exec",
    };
    format!("{say} '\\n%s\\n' '{MARKER_PREFIX}{marker}'; {state}; {say} '\\0'; {exec} env -0")
}

/// Runs `exec`'s shell with the capture script in place of the command's, in
/// the same cwd, environment and sandbox as the command, and parses the
/// result, filtered by the request's `policy`. `exec.argv` is
/// `[shell, "-lc", script, args…]`; its environment is what the startup
/// files start from. Whatever the startup files leave running (background
/// jobs, daemons) is killed when the capture ends: by the capture's cgroup
/// where there is one, else by its process group.
pub async fn capture(
    kind: ShellKind,
    exec: &Exec,
    policy: Option<&EnvPolicy>,
    sandbox: Option<&crate::sandbox::StartSandbox>,
    host: &crate::process::Host,
) -> Result<Snapshot, CaptureError> {
    let marker = uuid::Uuid::new_v4().simple().to_string();
    let run = Exec {
        argv: vec![exec.argv[0].clone(), "-lc".into(), script(kind, &marker)],
        io: Io::Pipes { stdin: false },
        ..exec.clone()
    };
    let group = host.cgroups.create();
    let join = group
        .as_ref()
        .and_then(|g| g.join().ok())
        .unwrap_or_default();
    let started = spawn::start(&run, &join, sandbox).map_err(CaptureError::Spawn)?;
    drop(join);
    let spawn::ChildIo::Pipes { stdout, stderr, .. } = started.io else {
        return Err(CaptureError::Malformed("no pipes"));
    };
    let pid = started.pid;
    let mut exit = started.exit;
    // stderr is kept for the log only, and never waited for: a background
    // job may hold it open.
    let stderr_kept = Arc::new(Mutex::new(Vec::new()));
    let stderr_task = tokio::spawn(read_limited(stderr, STDERR_KEPT_BYTES, stderr_kept.clone()));
    let collect = async {
        let (out, code) = read_until_exit(stdout, MAX_CAPTURE_BYTES + 1, &mut exit)
            .await
            .map_err(CaptureError::Read)?;
        // What the shell wrote to stderr before exiting, if its reader is
        // still behind.
        tokio::task::yield_now().await;
        let err = stderr_kept.lock().map(|e| e.clone()).unwrap_or_default();
        Ok::<_, CaptureError>((out, err, code))
    };
    let result = tokio::time::timeout(CAPTURE_TIMEOUT, collect).await;
    stderr_task.abort();
    // Leftovers: background jobs of the startup files. Without a cgroup, the
    // shell's process group: its jobs keep the group id in use (it cannot be
    // reused while they live); a `setsid` daemon escapes this fallback.
    match &group {
        Some(g) => g.kill(),
        None => {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    // The confinement (sandbox helpers) lives until the capture is over.
    drop(started.confinement);
    let (out, stderr, code) = match result {
        Ok(r) => r?,
        Err(_) => return Err(CaptureError::TimedOut),
    };
    if out.len() > MAX_CAPTURE_BYTES {
        return Err(CaptureError::TooLarge);
    }
    let code = code.unwrap_or(-1);
    if code != 0 {
        return Err(CaptureError::Exit {
            code,
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        });
    }
    parse(&out, &marker, &exec.env, policy)
}

/// Reads `fd` (keeping at most `limit` bytes) until its end, or until the
/// shell has exited and what it wrote before exiting is read: a background
/// job of the startup files may hold the pipe open long after. Returns the
/// bytes and the exit code (`None` if the reaper dropped it).
async fn read_until_exit(
    fd: OwnedFd,
    limit: usize,
    exit: &mut tokio::sync::oneshot::Receiver<crate::reaper::Exit>,
) -> std::io::Result<(Vec<u8>, Option<i32>)> {
    let mut rx = tokio::net::unix::pipe::Receiver::from_owned_fd(fd)?;
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let keep = |kept: &mut Vec<u8>, data: &[u8]| {
        let room = limit.saturating_sub(kept.len());
        kept.extend_from_slice(&data[..data.len().min(room)]);
    };
    loop {
        tokio::select! {
            n = rx.read(&mut buf) => {
                let n = n?;
                if n == 0 {
                    return Ok((kept, exit.await.ok().map(|e| e.code)));
                }
                keep(&mut kept, &buf[..n]);
            }
            code = &mut *exit => {
                // Everything the shell wrote is in the pipe by now. Read with
                // the system call itself: `try_read` answers "would block"
                // from the runtime's cached readiness, without looking, when
                // the pipe's readiness event has not been seen yet.
                use std::os::fd::AsFd;
                loop {
                    match nix::unistd::read(rx.as_fd(), &mut buf) {
                        Ok(0) => break,
                        Ok(n) => keep(&mut kept, &buf[..n]),
                        Err(nix::errno::Errno::EAGAIN) => break,
                        Err(nix::errno::Errno::EINTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                return Ok((kept, code.ok().map(|e| e.code)));
            }
        }
    }
}

/// Reads `fd` to its end into `kept`, keeping at most `limit` bytes (the
/// rest is read and dropped, so the writer never blocks on a full pipe).
async fn read_limited(fd: OwnedFd, limit: usize, kept: Arc<Mutex<Vec<u8>>>) {
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return;
    };
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n @ 1..) = rx.read(&mut buf).await {
        if let Ok(mut kept) = kept.lock() {
            let room = limit.saturating_sub(kept.len());
            kept.extend_from_slice(&buf[..n.min(room)]);
        }
    }
}

/// Parses a capture's output, printed after `marker`. `given` is the
/// environment the startup files started from: what they left unchanged is
/// not part of the snapshot (a later command has its own). Variables `policy`
/// would keep from the command (its excludes and include-only list) are
/// dropped, so a startup file cannot pass one.
pub fn parse(
    out: &[u8],
    marker: &str,
    given: &BTreeMap<String, String>,
    policy: Option<&EnvPolicy>,
) -> Result<Snapshot, CaptureError> {
    let line = format!("\n{MARKER_PREFIX}{marker}\n");
    let start = find(out, line.as_bytes()).ok_or(CaptureError::Malformed("no snapshot marker"))?
        + line.len();
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
    let mut captured = BTreeMap::new();
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
        captured.insert(name.to_owned(), value.to_owned());
    }
    captured.retain(|k, _| !spawn::NON_INHERITABLE_ENV_VARS.contains(&k.as_str()));
    let mut env = BTreeMap::new();
    for (name, value) in &captured {
        let change = match given.get(name) {
            Some(old) if old == value => continue,
            Some(old) if !old.is_empty() => match value.split_once(old.as_str()) {
                Some((prefix, suffix)) => EnvChange::Wrap {
                    prefix: prefix.to_owned(),
                    suffix: suffix.to_owned(),
                },
                None => EnvChange::Set(value.clone()),
            },
            _ => EnvChange::Set(value.clone()),
        };
        env.insert(name.clone(), change);
    }
    if let Some(policy) = policy {
        let mut kept: BTreeMap<String, String> =
            env.keys().map(|k| (k.clone(), String::new())).collect();
        spawn::apply_policy_filters(&mut kept, policy);
        env.retain(|k, _| kept.contains_key(k));
    }
    for name in given.keys() {
        if !captured.contains_key(name) && !SHELL_OWN_VARS.contains(&name.as_str()) {
            env.insert(name.clone(), EnvChange::Unset);
        }
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

    const M: &str = "0123abcd";

    fn output(noise: &str, state: &str, env: &[&str]) -> Vec<u8> {
        let mut out = format!("{noise}\n{MARKER_PREFIX}{M}\n{state}\0").into_bytes();
        for e in env {
            out.extend_from_slice(e.as_bytes());
            out.push(0);
        }
        out
    }

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn only_what_the_startup_files_changed_is_kept() {
        let given = vars(&[("PATH", "/usr/bin"), ("PER_COMMAND", "1"), ("GONE", "x")]);
        let out = output(
            "welcome!",
            "shopt -s extglob\nshopt -u login_shell\nf () \n{ \n    echo hi\n}",
            &[
                "PATH=/profile/bin:/usr/bin:/tail",
                "PER_COMMAND=1",
                "NEW=x=y",
                "PWD=/x",
                "SHLVL=2",
                "_=/usr/bin/env",
                "EXEC_SERVER_TOKEN=t",
            ],
        );
        let s = parse(&out, M, &given, None).unwrap();
        assert_eq!(s.state, "shopt -s extglob\nf () \n{ \n    echo hi\n}");
        assert_eq!(
            s.env,
            BTreeMap::from([
                (
                    "PATH".into(),
                    EnvChange::Wrap {
                        prefix: "/profile/bin:".into(),
                        suffix: ":/tail".into()
                    }
                ),
                ("NEW".into(), EnvChange::Set("x=y".into())),
                ("GONE".into(), EnvChange::Unset),
            ])
        );
    }

    #[test]
    fn a_marker_printed_by_the_startup_files_is_not_the_capture_s() {
        let mut out = format!("\n{MARKER_PREFIX}forged\ntouch /tmp/pwned\0EVIL=1\0").into_bytes();
        out.extend(output("", "real", &["A=1"]));
        let s = parse(&out, M, &BTreeMap::new(), None).unwrap();
        assert_eq!(s.state, "real");
        assert_eq!(
            s.env,
            BTreeMap::from([("A".into(), EnvChange::Set("1".into()))])
        );
    }

    #[test]
    fn policy_excludes_apply_to_variables_the_startup_files_set() {
        let out = output("", "", &["API_TOKEN=s", "KEEP=1", "DROP_ME=1"]);
        let policy = EnvPolicy {
            inherit: exec_server_protocol::types::EnvInherit::All,
            ignore_default_excludes: false,
            exclude: vec!["drop_*".into()],
            set: BTreeMap::new(),
            include_only: vec![],
        };
        let s = parse(&out, M, &BTreeMap::new(), Some(&policy)).unwrap();
        assert_eq!(
            s.env,
            BTreeMap::from([("KEEP".into(), EnvChange::Set("1".into()))])
        );
    }

    #[test]
    fn missing_marker_or_separator_is_malformed() {
        assert!(matches!(
            parse(b"no marker\0A=1\0", M, &BTreeMap::new(), None),
            Err(CaptureError::Malformed(_))
        ));
        let no_sep = format!("\n{MARKER_PREFIX}{M}\nstate only");
        assert!(matches!(
            parse(no_sep.as_bytes(), M, &BTreeMap::new(), None),
            Err(CaptureError::Malformed(_))
        ));
    }
}
