//! `process/*` params, results and notifications.

use crate::bytes::ByteChunk;
use crate::path::PathUri;
use crate::types::network::RemoteNetworkProxyLaunchConfig;
use crate::types::sandbox::FileSystemSandboxContext;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// How the child's environment is built from the server's (`envPolicy`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvPolicy {
    /// Which server variables to start from.
    pub inherit: EnvInherit,
    /// When false, names matching `*KEY*`, `*SECRET*`, `*TOKEN*` (case-insensitive) are dropped.
    pub ignore_default_excludes: bool,
    /// Extra name patterns (`*` and `?` wildcards, case-insensitive) to drop.
    pub exclude: Vec<String>,
    /// Variables set last, overriding everything.
    pub set: BTreeMap<String, String>,
    /// When non-empty, only names matching one of these patterns are kept.
    pub include_only: Vec<String>,
}

/// Starting point of an [`EnvPolicy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EnvInherit {
    /// Every server variable.
    All,
    /// PATH, SHELL, TMPDIR, TEMP, TMP, HOME, LANG, LC_ALL, LC_CTYPE, LOGNAME, USER.
    Core,
    /// Nothing.
    None,
}

/// Initial PTY size in character cells (ours).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// `process/start.shellSnapshot`: which login shell's state to capture, and the
/// scope within which that capture is reused.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShellSnapshotRequest {
    /// `scopeId`: commands of one scope (within one session, cwd, env policy
    /// and sandbox) share one capture; 1..=256 bytes, else -32602.
    pub scope_id: String,
    /// `shell`: the shell whose state is captured.
    pub shell: SnapshotShell,
}

/// `shellSnapshot.shell`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SnapshotShell {
    /// `name`: `bash`, `zsh` or `sh`; another name is refused with -32602 when
    /// the command is one the snapshot applies to.
    pub name: String,
    /// `path`: the shell's program; the snapshot applies only to a command whose
    /// `argv[0]` is exactly this string and whose `argv[1]` is `-lc`.
    pub path: String,
}

/// Params of `process/start`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecParams {
    /// Client-chosen id, unique among the session's live processes.
    pub process_id: String,
    /// Program and arguments; must not be empty.
    pub argv: Vec<String>,
    /// Working directory.
    pub cwd: PathUri,
    /// The child's entire environment (unless `envPolicy` is given).
    pub env: BTreeMap<String, String>,
    /// Run on a pseudo-terminal.
    pub tty: bool,
    /// Give a non-tty child a writable stdin pipe (else stdin is /dev/null).
    #[serde(default)]
    pub pipe_stdin: bool,
    /// argv[0] override.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arg0: Option<String>,
    /// Build the environment from the server's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_policy: Option<EnvPolicy>,
    /// `sandbox`: portable sandbox intent (SANDBOX.md); absent = no sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<FileSystemSandboxContext>,
    /// `enforceManagedNetwork`: with a `sandbox` and a `networkProxy`, the
    /// command's only way out is the proxy; without a proxy (or without a
    /// sandbox) the start is refused.
    #[serde(default)]
    pub enforce_managed_network: bool,
    /// Advanced reference fields, accepted and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_network: Option<Value>,
    /// `networkProxy`: start an executor-local proxy for this process (SANDBOX.md §3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_proxy: Option<RemoteNetworkProxyLaunchConfig>,
    /// `shellSnapshot`: run a `<shell> -lc <script>` command with the user's
    /// login-shell state captured once per scope instead of re-reading the
    /// startup files (CAPABILITIES.md §8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell_snapshot: Option<ShellSnapshotRequest>,
    /// Advanced reference field, accepted and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// Ours: initial PTY size (default 80×24).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty_size: Option<PtySize>,
    /// Ours: keep unacknowledged output until `process/ack` (flow control, no loss).
    /// Reading from the process pauses once 8 MiB or 49 999 chunks are
    /// unacknowledged, so a client acknowledges well before either (a terminal
    /// sends a chunk per line: short lines reach the chunk count first).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ack_output: bool,
    /// Ours: `outputWindowBytes`, with `ackOutput`, the unacknowledged
    /// output (bytes) at which reading from the process pauses, instead of
    /// 8 MiB: a path that holds more in flight (a relay) asks for more.
    /// Brought within 64 KiB..=32 MiB; 0, or a window without `ackOutput`,
    /// is refused (-32602). A server that does not know it ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_window_bytes: Option<u64>,
    /// Ours: `limits`, what the process may use before the server ends it
    /// (advertised by the `processLimits` capability; absent = none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ProcessLimits>,
}

/// `limits` of `process/start` (an extension the reference does not know).
/// Each member is optional; an unknown member is refused (-32602) rather
/// than ignored, so a limit this server cannot hold is never pretended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProcessLimits {
    /// `timeoutMs`: wall-clock time from the start, in milliseconds (≥ 1),
    /// after which the whole tree is ended ([`LimitReason::WallTimeout`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// `idleTimeoutMs`: milliseconds (≥ 1) without any stdout, stderr or
    /// terminal output after which the tree is ended
    /// ([`LimitReason::IdleTimeout`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// `maxOutputBytes`: output bytes (all streams, ≥ 1) delivered at most;
    /// the chunk that crosses it is cut there, nothing after it is
    /// delivered, and the tree is ended ([`LimitReason::OutputLimit`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// `memoryBytes`: memory (≥ 1 MiB) the whole tree may use, page cache
    /// included, held by its cgroup (`memory.max`); past it the kernel's
    /// OOM killer ends a member ([`LimitReason::MemoryLimit`]). Needs the
    /// `processMemoryLimit` capability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// `maxTasks`: processes and threads (≥ 1) the whole tree may have at
    /// once (`pids.max`); a `fork` or `clone` past it fails with `EAGAIN`
    /// ([`LimitReason::TasksLimit`]). Needs `processTasksLimit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tasks: Option<u64>,
    /// `cpuPercent`: CPU time the whole tree may use, in percent of one CPU
    /// (≥ 1; 150 = one and a half CPUs), held by its cgroup (`cpu.max`,
    /// 100 ms periods): the tree is slowed, never ended. Needs
    /// `processCpuLimit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_percent: Option<u64>,
}

/// Which limit ended a process (`limit` of `process/exited` and of a
/// `process/read` answer, an extension; absent when none did).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LimitReason {
    /// `wallTimeout`: `limits.timeoutMs` passed.
    WallTimeout,
    /// `idleTimeout`: no output for `limits.idleTimeoutMs`.
    IdleTimeout,
    /// `outputLimit`: `limits.maxOutputBytes` were delivered.
    OutputLimit,
    /// `memoryLimit`: the kernel's OOM killer ended a member of the tree
    /// at `limits.memoryBytes` (its cgroup's `oom_kill` count).
    MemoryLimit,
    /// `tasksLimit`: a `fork`/`clone` in the tree was refused at
    /// `limits.maxTasks` (its cgroup's `pids.events` `max` count).
    TasksLimit,
}

impl LimitReason {
    /// The wire name (`wallTimeout`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            LimitReason::WallTimeout => "wallTimeout",
            LimitReason::IdleTimeout => "idleTimeout",
            LimitReason::OutputLimit => "outputLimit",
            LimitReason::MemoryLimit => "memoryLimit",
            LimitReason::TasksLimit => "tasksLimit",
        }
    }
}

impl ExecParams {
    /// Params with the given id, argv, cwd and exact environment, and every
    /// optional field at its default (pipes, no stdin, no policy, no sandbox).
    pub fn new(
        process_id: impl Into<String>,
        argv: Vec<String>,
        cwd: PathUri,
        env: BTreeMap<String, String>,
    ) -> Self {
        ExecParams {
            process_id: process_id.into(),
            argv,
            cwd,
            env,
            tty: false,
            pipe_stdin: false,
            arg0: None,
            env_policy: None,
            sandbox: None,
            enforce_managed_network: false,
            managed_network: None,
            network_proxy: None,
            shell_snapshot: None,
            metadata: None,
            pty_size: None,
            ack_output: false,
            output_window_bytes: None,
            limits: None,
        }
    }
}

/// Result of `process/start`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecResponse {
    /// The id given.
    pub process_id: String,
    /// `none`, `macosSeatbelt`, `linuxSeccomp`, `windowsRestrictedToken`.
    pub sandbox_type: String,
    /// Ours (`pid`, additive; the reference sends none): the child's OS process
    /// id on the server's host, also its process group id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
}

/// Which stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OutputStream {
    /// Standard output of a pipe-mode child.
    Stdout,
    /// Standard error of a pipe-mode child.
    Stderr,
    /// The PTY of a tty-mode child (stderr merged).
    Pty,
}

impl OutputStream {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
            OutputStream::Pty => "pty",
        }
    }
}

/// Params of `process/read`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadParams {
    /// Process id.
    pub process_id: String,
    /// Return chunks with seq > this (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_seq: Option<u64>,
    /// Byte budget (bytes of decoded output); at least one chunk is always returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// Long-poll up to this many milliseconds when nothing is available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// One retained output chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessOutputChunk {
    /// Sequence number.
    pub seq: u64,
    /// Source stream.
    pub stream: OutputStream,
    /// The bytes.
    pub chunk: ByteChunk,
}

/// Result of `process/read`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadResponse {
    /// Chunks with seq > afterSeq, ascending.
    pub chunks: Vec<ProcessOutputChunk>,
    /// Where the next read should start: one past the last chunk returned. With
    /// `maxBytes`, as in the reference, at least one chunk is returned whatever its
    /// size, and a read with nothing to return past the last event points after it.
    pub next_seq: u64,
    /// The process has exited.
    pub exited: bool,
    /// Exit status, or 128+N for signal N; null until exited.
    pub exit_code: Option<i32>,
    /// All output is drained.
    pub closed: bool,
    /// Launch or runtime failure text.
    pub failure: Option<String>,
    /// Sandbox denial (always false here).
    #[serde(default)]
    pub sandbox_denied: bool,
    /// Ours: the limit that ended the process, once it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<LimitReason>,
    /// Ours: the signal that ended the process (`SIGKILL`, …), once it
    /// exited, when one did; absent for a normal exit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
}

/// Params of `process/write`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteParams {
    /// Process id.
    pub process_id: String,
    /// Bytes for stdin.
    pub chunk: ByteChunk,
    /// Idempotency key: a repeated id is answered `accepted` without writing again.
    pub write_id: String,
}

/// Outcome of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WriteStatus {
    /// Written (or already written under this writeId).
    Accepted,
    /// No such process in this session.
    UnknownProcess,
    /// The process has no writable stdin.
    StdinClosed,
    /// Not ready yet.
    Starting,
}

/// Result of `process/write` and `process/closeStdin`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteResponse {
    /// Outcome.
    pub status: WriteStatus,
}

/// Signals for `process/signal`. The reference knows only `interrupt`; the rest are ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ProcessSignal {
    /// SIGINT.
    Interrupt,
    /// SIGTERM.
    Terminate,
    /// SIGKILL.
    Kill,
    /// SIGHUP.
    Hangup,
    /// SIGQUIT.
    Quit,
    /// SIGUSR1.
    User1,
    /// SIGUSR2.
    User2,
    /// SIGCONT.
    Continue,
    /// SIGSTOP.
    Stop,
    /// SIGWINCH.
    WindowChange,
}

/// Params of `process/signal`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SignalParams {
    /// Process id.
    pub process_id: String,
    /// Signal name.
    pub signal: ProcessSignal,
}

/// Params of `process/terminate`, `process/closeStdin`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessIdParams {
    /// Process id.
    pub process_id: String,
}

/// Result of `process/terminate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TerminateResponse {
    /// True if the process was running and has been killed.
    pub running: bool,
    /// Ours (`killedLeftovers`, additive; the reference sends none): true if
    /// the process had exited but something it started was still alive (held
    /// its output open, or stayed in its cgroup) and has been killed. Sent
    /// only when true, so every other reply is exactly the reference's.
    #[serde(
        rename = "killedLeftovers",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub killed_leftovers: Option<bool>,
}

/// Params of `process/resize` (ours).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResizeParams {
    /// Process id.
    pub process_id: String,
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// Params of `process/ack` (ours).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AckParams {
    /// Process id.
    pub process_id: String,
    /// Every event with seq ≤ this has been consumed.
    pub seq: u64,
}

/// `process/output` notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessOutputNotification {
    /// Process id.
    pub process_id: String,
    /// Sequence number.
    pub seq: u64,
    /// Source stream.
    pub stream: OutputStream,
    /// The bytes.
    pub chunk: ByteChunk,
}

/// `process/exited` notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessExitedNotification {
    /// Process id.
    pub process_id: String,
    /// Sequence number.
    pub seq: u64,
    /// Exit status, or 128+N for signal N.
    pub exit_code: i32,
    /// Always false here.
    #[serde(default)]
    pub sandbox_denied: bool,
    /// Ours: the limit that ended the process (absent when none did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<LimitReason>,
    /// Ours: the signal that ended the process (`SIGKILL`, `SIGTERM`, …),
    /// absent for a normal exit. `exitCode` is then 128+N, as a shell
    /// reports it; this tells it from a program that exited 137 itself. A
    /// sandboxed command's launcher reports its command's death by signal
    /// N as exit 128+N, so there it is present only when the launcher
    /// itself was signalled (a kill of the tree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
}

/// `process/closed` notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessClosedNotification {
    /// Process id.
    pub process_id: String,
    /// Sequence number.
    pub seq: u64,
}

/// Params of `process/list` (ours); absent or `{}`: the caller's session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessListParams {
    /// `allSessions`: every session's processes (the operator view), each
    /// with its `sessionId`. Needs `operatorToken`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all_sessions: bool,
    /// `operatorToken`: the server's operator credential
    /// (`--operator-token-file`); a missing or wrong one is -32600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_token: Option<String>,
}

/// Result of `process/list` (ours; advertised by the `processList`
/// capability): the caller's session's processes, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessListResponse {
    /// One entry per process the session still holds.
    pub processes: Vec<ProcessInfo>,
}

/// Where a process is in its life (`state` of [`ProcessInfo`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ProcessState {
    /// `running`: not exited yet.
    Running,
    /// `exited`: exited; something it started still holds its output open.
    Exited,
    /// `closed`: exited and all output closed (kept for reading for a while).
    Closed,
}

/// One process of `process/list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessInfo {
    /// The session it belongs to (in the operator view only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Its id in the session.
    pub process_id: String,
    /// OS pid (also its process group id).
    pub pid: u32,
    /// Program and arguments as started.
    pub argv: Vec<String>,
    /// Working directory as started.
    pub cwd: PathUri,
    /// On a pseudo-terminal.
    pub tty: bool,
    /// Start time, milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// CPU time (user + system) of the process itself so far, in
    /// milliseconds; absent once it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_time_ms: Option<u64>,
    /// Resident memory of the process itself, in bytes; absent once it
    /// exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Output bytes delivered so far (all streams).
    pub output_bytes: u64,
    /// Its `limits`, as started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ProcessLimits>,
    /// Running, exited or closed.
    pub state: ProcessState,
    /// Exit status once exited (128+N for signal N).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The limit that ended it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<LimitReason>,
    /// The signal that ended it, if one did (`SIGKILL`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
}

/// Params of `process/operatorSignal` (ours): the operator's way to stop a
/// process of any session (`exec-server kill`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperatorSignalParams {
    /// The process's session (`sessionId` of the operator view).
    pub session_id: String,
    /// The process's id in that session.
    pub process_id: String,
    /// The signal for its process group; absent: end the whole tree as
    /// `process/terminate` does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<ProcessSignal>,
    /// The server's operator credential (`--operator-token-file`).
    pub operator_token: String,
}
