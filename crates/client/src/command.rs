//! [`Command`]: a process to start, built like [`std::process::Command`], so a
//! caller never fills [`ExecParams`] by hand.

use crate::client::{ExecServerClient, ProcessHandle};
use crate::error::ClientError;
use exec_server_protocol::types::{EnvInherit, EnvPolicy, ExecParams, PtySize};
use exec_server_protocol::{ErrorObject, PathUri};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `PATH` given to a child whose environment has none and does not inherit the
/// server's: the usual Unix search path, so `sh -c 'ls'` finds `ls`.
pub const DEFAULT_CHILD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A process to start on a server (`process/start`).
///
/// Defaults: working directory `/` (on the server's host), an environment of
/// only what [`env`](Self::env) sets plus a `PATH` of [`DEFAULT_CHILD_PATH`]
/// when none is set, pipes (not a PTY), stdin `/dev/null`, a process id the
/// client makes up, the process left running when its handle is dropped
/// (`kill_on_drop(false)`, like [`tokio::process::Command`]), and no kill of
/// leftovers after exit.
///
/// ```no_run
/// # async fn demo(client: exec_server_client::ExecServerClient) -> Result<(), exec_server_client::ClientError> {
/// use exec_server_client::Command;
/// let out = Command::new("make")
///     .arg("test")
///     .cwd("/src/project")
///     .env("CI", "1")
///     .inherit_env()
///     .spawn(&client)
///     .await?
///     .wait_with_output(16 << 20)
///     .await?;
/// println!("exit {}: {}", out.code, String::from_utf8_lossy(&out.stdout));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Command {
    argv: Vec<String>,
    cwd: PathBuf,
    env: BTreeMap<String, String>,
    inherit_env: bool,
    pty: Option<PtySize>,
    stdin_piped: bool,
    process_id: Option<String>,
    arg0: Option<String>,
    pub(crate) kill_on_drop: bool,
    pub(crate) kill_leftovers_after: Option<Duration>,
    limits: exec_server_protocol::types::ProcessLimits,
    network_proxy: Option<exec_server_protocol::types::RemoteNetworkProxyLaunchConfig>,
}

/// `d` in whole milliseconds, at least 1.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Command {
    /// Runs `program`, looked up in the child's `PATH` on the server when it has
    /// no `/`.
    pub fn new(program: impl Into<String>) -> Self {
        Command {
            argv: vec![program.into()],
            cwd: PathBuf::from("/"),
            env: BTreeMap::new(),
            inherit_env: false,
            pty: None,
            stdin_piped: false,
            process_id: None,
            arg0: None,
            kill_on_drop: false,
            kill_leftovers_after: None,
            limits: Default::default(),
            network_proxy: None,
        }
    }

    /// Adds one argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.argv.push(arg.into());
        self
    }

    /// Adds arguments.
    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.argv.extend(args.into_iter().map(Into::into));
        self
    }

    /// The working directory: an absolute path on the server's host. A relative
    /// path makes [`spawn`](Self::spawn) fail with
    /// [`ErrorKind::InvalidRequest`](crate::ErrorKind::InvalidRequest).
    pub fn cwd(mut self, dir: impl AsRef<Path>) -> Self {
        self.cwd = dir.as_ref().to_path_buf();
        self
    }

    /// Sets one variable of the child's environment (over an inherited one).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Sets several variables.
    pub fn envs<I, K, V>(mut self, vars: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        self.env
            .extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Starts from the **server's** environment minus secrets (names matching
    /// `*KEY*`, `*SECRET*`, `*TOKEN*`), as `exec-server run` does (wire:
    /// `envPolicy {inherit: all}`); [`env`](Self::env) values override it.
    pub fn inherit_env(mut self) -> Self {
        self.inherit_env = true;
        self
    }

    /// Runs on a pseudo-terminal `cols` cells wide and `rows` high, the same
    /// order as [`ProcessHandle::resize`](crate::ProcessHandle::resize)
    /// (stdout and stderr merged into
    /// [`OutputStream::Pty`](crate::OutputStream::Pty); stdin always
    /// writable).
    pub fn pty(mut self, cols: u16, rows: u16) -> Self {
        self.pty = Some(PtySize { rows, cols });
        self
    }

    /// Gives the child a writable stdin pipe (wire: `pipeStdin`); without it a
    /// pipe-mode child reads `/dev/null` and writes answer
    /// [`WriteStatus::StdinClosed`](crate::WriteStatus::StdinClosed).
    pub fn stdin_piped(mut self) -> Self {
        self.stdin_piped = true;
        self
    }

    /// Uses `id` as the process id (unique among the session's live processes)
    /// instead of a generated one.
    pub fn process_id(mut self, id: impl Into<String>) -> Self {
        self.process_id = Some(id.into());
        self
    }

    /// Overrides `argv[0]` as the child sees it.
    pub fn arg0(mut self, arg0: impl Into<String>) -> Self {
        self.arg0 = Some(arg0.into());
        self
    }

    /// With `true`, dropping the [`ProcessHandle`] before it handed over
    /// [`ProcessEvent::Closed`](crate::ProcessEvent::Closed) terminates the
    /// process and what is left of its group (`process/terminate`). Default
    /// `false`: the process runs on, and the server keeps it until the session
    /// ends.
    pub fn kill_on_drop(mut self, kill: bool) -> Self {
        self.kill_on_drop = kill;
        self
    }

    /// Once the process has exited, waits `grace` for its output to close and
    /// then kills what is left of its group (`process/terminate`): background
    /// children that keep stdout open would otherwise hold back
    /// [`ProcessEvent::Closed`](crate::ProcessEvent::Closed) for as long as they
    /// live. Off by default. Runs while the handle is read (any of
    /// [`ProcessHandle::next_event`], [`wait`](ProcessHandle::wait),
    /// [`wait_with_output`](ProcessHandle::wait_with_output)).
    pub fn kill_leftovers_after(mut self, grace: Duration) -> Self {
        self.kill_leftovers_after = Some(grace);
        self
    }

    /// Ends the process (and its whole tree: SIGTERM, then SIGKILL 2 s
    /// later) once it has run `limit`; its exit then carries
    /// [`LimitReason::WallTimeout`](crate::LimitReason::WallTimeout). Wire:
    /// `limits.timeoutMs` (a server without the `processLimits` capability
    /// ignores it). A limit under 1 ms counts as 1 ms.
    pub fn timeout(mut self, limit: Duration) -> Self {
        self.limits.timeout_ms = Some(millis(limit));
        self
    }

    /// Ends the process once it has printed nothing (stdout, stderr or
    /// terminal) for `limit` ([`LimitReason::IdleTimeout`](crate::LimitReason::IdleTimeout));
    /// wire: `limits.idleTimeoutMs`.
    pub fn idle_timeout(mut self, limit: Duration) -> Self {
        self.limits.idle_timeout_ms = Some(millis(limit));
        self
    }

    /// Delivers at most `bytes` of output (all streams), then ends the
    /// process ([`LimitReason::OutputLimit`](crate::LimitReason::OutputLimit));
    /// wire: `limits.maxOutputBytes`. At least 1.
    pub fn max_output(mut self, bytes: u64) -> Self {
        self.limits.max_output_bytes = Some(bytes.max(1));
        self
    }

    /// Caps the memory the process and everything it starts may use
    /// together at `bytes` (at least 1 MiB); past it the kernel's OOM killer
    /// ends a member and the exit carries
    /// [`LimitReason::MemoryLimit`](crate::LimitReason::MemoryLimit). Wire:
    /// `limits.memoryBytes`; a server without the `processMemoryLimit`
    /// capability refuses the start (-32602) rather than run it uncapped.
    pub fn memory(mut self, bytes: u64) -> Self {
        self.limits.memory_bytes = Some(bytes);
        self
    }

    /// Caps the processes and threads of the tree at `tasks` at once (a
    /// `fork` past it fails with `EAGAIN`; the exit then carries
    /// [`LimitReason::TasksLimit`](crate::LimitReason::TasksLimit)). Wire:
    /// `limits.maxTasks`; needs `processTasksLimit`.
    pub fn max_tasks(mut self, tasks: u64) -> Self {
        self.limits.max_tasks = Some(tasks.max(1));
        self
    }

    /// Caps the CPU time of the tree at `percent` of one CPU (150: one and
    /// a half CPUs); the tree is slowed, never ended. Wire:
    /// `limits.cpuPercent`; needs `processCpuLimit`.
    pub fn cpu_percent(mut self, percent: u64) -> Self {
        self.limits.cpu_percent = Some(percent.max(1));
        self
    }

    /// Runs the process behind a managed network proxy (wire
    /// `networkProxy`): its proxy variables point at a proxy the server
    /// starts for it, whose rules are `config`'s; destinations the rules
    /// leave open are asked of this client's
    /// [`NetworkPolicy`](crate::NetworkPolicy) (`network/policyRequest`).
    /// The server checks `config` at start (-32602 naming what is wrong).
    pub fn network_proxy(
        mut self,
        config: exec_server_protocol::types::RemoteNetworkProxyLaunchConfig,
    ) -> Self {
        self.network_proxy = Some(config);
        self
    }

    /// The `process/start` params this command sends, with `process_id` as the
    /// id when none was given. Errors: a relative or non-UTF-8 working directory
    /// ([`ErrorKind::InvalidRequest`](crate::ErrorKind::InvalidRequest)).
    pub fn to_params(&self, process_id: &str) -> Result<ExecParams, ClientError> {
        let cwd = PathUri::from_path(&self.cwd).ok_or_else(|| {
            ClientError::Server(ErrorObject::invalid_request(format!(
                "working directory `{}` must be an absolute path",
                self.cwd.display()
            )))
        })?;
        let mut env = self.env.clone();
        let env_policy = if self.inherit_env {
            Some(EnvPolicy {
                inherit: EnvInherit::All,
                ignore_default_excludes: false,
                exclude: Vec::new(),
                set: BTreeMap::new(),
                include_only: Vec::new(),
            })
        } else {
            env.entry("PATH".into())
                .or_insert_with(|| DEFAULT_CHILD_PATH.into());
            None
        };
        let mut p = ExecParams::new(
            self.process_id.as_deref().unwrap_or(process_id),
            self.argv.clone(),
            cwd,
            env,
        );
        p.env_policy = env_policy;
        p.tty = self.pty.is_some();
        p.pty_size = self.pty;
        p.pipe_stdin = self.stdin_piped;
        p.arg0 = self.arg0.clone();
        p.network_proxy = self.network_proxy.clone();
        if self.limits != Default::default() {
            p.limits = Some(self.limits.clone());
        }
        Ok(p)
    }

    /// Starts the process on `client`'s server. Errors as
    /// [`ExecServerClient::start_process`]; branch on
    /// [`ClientError::kind`] (e.g. [`ErrorKind::ProgramNotFound`](crate::ErrorKind::ProgramNotFound)).
    pub async fn spawn(&self, client: &ExecServerClient) -> Result<ProcessHandle, ClientError> {
        let params = self.to_params(&client.next_process_id())?;
        let mut handle = client.start_process(params).await?;
        handle.kill_on_drop = self.kill_on_drop;
        handle.kill_leftovers_after = self.kill_leftovers_after;
        Ok(handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_follow_the_builder() {
        let p = Command::new("sh")
            .args(["-c", "echo hi"])
            .cwd("/tmp")
            .env("A", "1")
            .stdin_piped()
            .to_params("x")
            .unwrap();
        assert_eq!(p.argv, ["sh", "-c", "echo hi"]);
        assert_eq!(p.cwd.as_str(), "file:///tmp");
        assert_eq!(p.process_id, "x");
        assert!(p.pipe_stdin && !p.tty && p.env_policy.is_none());
        assert_eq!(
            p.env.get("PATH").map(String::as_str),
            Some(DEFAULT_CHILD_PATH)
        );
        let p = Command::new("vi")
            .pty(100, 30)
            .inherit_env()
            .process_id("mine")
            .to_params("x")
            .unwrap();
        assert_eq!(p.process_id, "mine");
        assert_eq!(
            p.pty_size,
            Some(PtySize {
                rows: 30,
                cols: 100
            })
        );
        assert!(p.tty && p.env.is_empty());
        assert_eq!(p.env_policy.map(|e| e.inherit), Some(EnvInherit::All));
        let e = Command::new("ls").cwd("rel").to_params("x").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidRequest);
    }
}
