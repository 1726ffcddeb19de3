//! Building and starting a child: environment, program lookup, pipes or a PTY, and
//! its own session and process group.

use super::born::{sandbox_born_in_cgroup, try_born_in_cgroup};
use super::plan::{Exec, Io};
use super::spawn_error::{tag, Stage};
use crate::reaper;
use exec_server_protocol::types::{EnvInherit, EnvPolicy, PtySize};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use tokio::sync::oneshot;

/// PATH searched when the child's environment has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Variable names kept by `envPolicy.inherit: "core"`.
pub const CORE_ENV_VARS: &[&str] = &[
    "PATH", "SHELL", "TMPDIR", "TEMP", "TMP", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "LOGNAME",
    "USER",
];

/// Name patterns dropped by an `envPolicy` unless `ignoreDefaultExcludes` is set.
pub const DEFAULT_EXCLUDES: &[&str] = &["*KEY*", "*SECRET*", "*TOKEN*"];

/// Server variables never passed to a child by inheritance, whatever the policy:
/// credentials of the server itself.
pub const NON_INHERITABLE_ENV_VARS: &[&str] =
    &["CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN", "EXEC_SERVER_TOKEN"];

/// The server's environment as children inherit it: its `PATH` led by the
/// `tool_dirs` it lacks (the reported `prependPathDirs`, as the reference's
/// bundled tool directory is: so a Codex command finds `rg` there; the
/// client does not add these directories itself).
pub fn server_env(tool_dirs: &[PathBuf]) -> impl Iterator<Item = (String, String)> + '_ {
    std::env::vars().map(move |(k, v)| {
        if k != "PATH" || tool_dirs.is_empty() {
            return (k, v);
        }
        let dirs = tool_dirs;
        let mut parts: Vec<String> = dirs
            .iter()
            .map(|d| d.display().to_string())
            .filter(|d| !v.split(':').any(|p| p == d))
            .collect();
        if parts.is_empty() {
            return (k, v);
        }
        parts.push(v);
        (k, parts.join(":"))
    })
}

/// Case-insensitive glob match with `*` and `?`.
pub fn wildcard_match(pattern: &str, name: &str) -> bool {
    exec_server_sandbox::glob::matches(&pattern.to_ascii_uppercase(), &name.to_ascii_uppercase())
}

/// The child's environment: `env` exactly, or the policy applied to the server's
/// environment with `env` layered on top.
pub fn build_env(
    env: &BTreeMap<String, String>,
    policy: Option<&EnvPolicy>,
    server_env: impl Iterator<Item = (String, String)>,
) -> BTreeMap<String, String> {
    let Some(policy) = policy else {
        return env.clone();
    };
    let mut out: BTreeMap<String, String> = match policy.inherit {
        EnvInherit::All => server_env.collect(),
        EnvInherit::Core => server_env
            .filter(|(k, _)| CORE_ENV_VARS.contains(&k.as_str()))
            .collect(),
        EnvInherit::None => BTreeMap::new(),
    };
    out.retain(|k, _| !NON_INHERITABLE_ENV_VARS.contains(&k.as_str()));
    exclude_by_policy(&mut out, policy);
    for (k, v) in &policy.set {
        out.insert(k.clone(), v.clone());
    }
    keep_only_by_policy(&mut out, policy);
    for (k, v) in env {
        out.insert(k.clone(), v.clone());
    }
    out
}

/// Drops the variables `policy` excludes (its default excludes unless
/// `ignoreDefaultExcludes`, its `exclude` patterns), then keeps only those its
/// `includeOnly` names, when that list is not empty.
pub fn apply_policy_filters(vars: &mut BTreeMap<String, String>, policy: &EnvPolicy) {
    exclude_by_policy(vars, policy);
    keep_only_by_policy(vars, policy);
}

fn exclude_by_policy(vars: &mut BTreeMap<String, String>, policy: &EnvPolicy) {
    if !policy.ignore_default_excludes {
        vars.retain(|k, _| !DEFAULT_EXCLUDES.iter().any(|p| wildcard_match(p, k)));
    }
    vars.retain(|k, _| !policy.exclude.iter().any(|p| wildcard_match(p, k)));
}

fn keep_only_by_policy(vars: &mut BTreeMap<String, String>, policy: &EnvPolicy) {
    if !policy.include_only.is_empty() {
        vars.retain(|k, _| policy.include_only.iter().any(|p| wildcard_match(p, k)));
    }
}

/// Resolves `program` like `execvp` would, in the child's PATH then [`DEFAULT_PATH`].
/// A name with a `/` is taken relative to `cwd`.
pub fn resolve_program(
    program: &str,
    env: &BTreeMap<String, String>,
    cwd: &Path,
) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if program.contains('/') {
        return Ok(cwd.join(program));
    }
    let mut saw_non_executable = false;
    let child_path = env.get("PATH").map(String::as_str).unwrap_or("");
    for dir in child_path.split(':').chain(DEFAULT_PATH.split(':')) {
        if dir.is_empty() {
            continue;
        }
        let candidate = Path::new(dir).join(program);
        if let Ok(meta) = std::fs::metadata(&candidate) {
            if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                return Ok(candidate);
            }
            saw_non_executable = true;
        }
    }
    Err(if saw_non_executable {
        std::io::Error::from_raw_os_error(libc::EACCES)
    } else {
        std::io::Error::from_raw_os_error(libc::ENOENT)
    })
}

/// The I/O ends the server keeps for a started child.
pub enum ChildIo {
    /// Pipe mode.
    Pipes {
        /// Writable stdin when `pipeStdin` was set.
        stdin: Option<OwnedFd>,
        /// stdout read end.
        stdout: OwnedFd,
        /// stderr read end.
        stderr: OwnedFd,
    },
    /// PTY mode: the master side, for reading output and writing input.
    Pty {
        /// The PTY master.
        master: OwnedFd,
    },
}

/// A started child.
pub struct Started {
    /// OS pid (also its process group and session id).
    pub pid: u32,
    /// I/O ends.
    pub io: ChildIo,
    /// Yields how the child ended once it is reaped.
    pub exit: oneshot::Receiver<reaper::Exit>,
    /// What a sandboxed child needs until it exits; `None` when unsandboxed.
    pub confinement: Option<crate::sandbox::Confinement>,
}

/// Default PTY size when `process/start` gives none.
pub const DEFAULT_PTY_SIZE: PtySize = PtySize { cols: 80, rows: 24 };

/// Moves the calling (child) process into the cgroup whose `cgroup.procs` is
/// open as `fd`. Only async-signal-safe calls: it runs between fork and exec.
/// A failure leaves the child where it is (the process-group kill remains).
fn join_cgroup(fd: std::os::fd::RawFd) {
    // SAFETY: write(2) of a static buffer to an fd the parent keeps open.
    unsafe {
        libc::write(fd, b"0".as_ptr().cast(), 1);
    }
}

/// Starts `exec`, confined by `sandbox` when given; the child (bubblewrap
/// and everything in the sandbox, when confined) joins the cgroups of
/// `join` before it runs: born in its cgroup where it can be (see
/// [`exec_server_sysio::launch`]), else by writing to their `cgroup.procs`
/// between fork and exec. Errors are OS errors (cwd or program missing,
/// exec failure) and sandbox refusals, answered as spawn failures.
pub fn start(
    exec: &Exec,
    join: &super::cgroup::Join,
    sandbox: Option<&crate::sandbox::StartSandbox>,
) -> std::io::Result<Started> {
    refuse_nul_bytes(exec)?;
    let cwd = exec.cwd.as_path();
    let meta = std::fs::metadata(cwd).map_err(|e| tag(Stage::Cwd, cwd, e))?;
    if !meta.is_dir() {
        let e = std::io::Error::from_raw_os_error(libc::ENOTDIR);
        return Err(tag(Stage::Cwd, cwd, e));
    }
    let program = resolve_program(&exec.argv[0], &exec.env, cwd)
        .map_err(|e| tag(Stage::Program, Path::new(&exec.argv[0]), e))?;
    // Without a sandbox, an exec failure is about the program itself (with
    // one, the sandbox's launcher is what runs first).
    let exec_failed = |e: std::io::Error| match sandbox {
        None => tag(Stage::Program, &program, e),
        Some(_) => e,
    };
    let arg0 = exec.arg0.as_deref().unwrap_or(&exec.argv[0]);
    if sandbox.is_none() {
        if let Some(started) = try_born_in_cgroup(exec, &program, arg0, join) {
            return started.map_err(exec_failed);
        }
    }
    let v2_procs = join.v2_procs();
    // Raw descriptors collected before the fork: the child only iterates.
    let cgroup_fds: Vec<std::os::fd::RawFd> = join
        .procs
        .iter()
        .chain(&v2_procs)
        .map(|f| f.as_raw_fd())
        .collect();
    let (mut cmd, guard, _fds, hooks) = match sandbox {
        None => {
            let mut cmd = Command::new(&program);
            cmd.args(&exec.argv[1..]);
            cmd.arg0(OsString::from(arg0));
            cmd.env_clear();
            cmd.envs(&exec.env);
            (cmd, None, Vec::new(), None)
        }
        Some(sb) => {
            let plan = sb.plan(&exec.env)?;
            let p = sb.prepare(plan, &exec.env, &program, arg0, &exec.argv[1..], cwd)?;
            // A plain exec may carry its own argv[0], which born_in_cgroup
            // could not read back from the command: it forks.
            let hooks = Some(p.hooks).filter(|_| p.confined);
            (p.command, Some((p.guard, p.confined)), p.fds, hooks)
        }
    };
    // Registered as soon as its pid exists, before any of its output is read.
    let confine = move |pid: u32| {
        sandbox
            .zip(guard)
            .map(|(sb, (g, confined))| sb.confinement(g, pid, confined))
    };
    // The environment is the command's own where it runs unconfined (set
    // above, or by the sandbox's plain exec); a confined command's reaches
    // only its own execve, through the inner stage, and bubblewrap and the
    // stage start with none (exec_server_sandbox::env_fd).
    cmd.current_dir(cwd);
    if hooks.is_none() {
        // An unconfined command, like a confined one, gets every signal at
        // its default, none blocked, and no descriptor but its stdio,
        // however the server was started (a confined one's hooks do this
        // before bubblewrap or the inner stage runs).
        // SAFETY: system calls only, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                exec_server_sysio::signals::restore_defaults();
                exec_server_sysio::signals::close_inherited_on_exec()
            });
        }
    }
    if let Some(hooks) = &hooks {
        if let Some(spawned) = sandbox_born_in_cgroup(&cmd, hooks, exec.io, join) {
            let (pid, io, exit) = spawned?;
            return Ok(Started {
                pid,
                io,
                exit,
                confinement: confine(pid),
            });
        }
    }
    let exec_io = exec.io;
    let fork = move || match exec_io {
        Io::Pty(size) => on_a_pty(cmd, size, cgroup_fds),
        Io::Pipes { stdin } => on_pipes(cmd, stdin, cgroup_fds),
    };
    // A sandbox is forked by the launcher thread, whose end alone would
    // end it (`--die-with-parent`): it survives an upgrade.
    let (pid, io, exit) = match sandbox {
        Some(_) => crate::launcher::run(fork),
        None => fork(),
    }
    .map_err(exec_failed)?;
    Ok(Started {
        pid,
        io,
        exit,
        confinement: confine(pid),
    })
}

/// `InvalidInput` naming the first argument (`argv[N]`, or `arg0`) that
/// holds a NUL byte: no `execve` can take one. Checked before any launch
/// path: std's `Command` keeps such an argument as a placeholder string
/// and fails only in its own `spawn`, so a path that reads the arguments
/// back (`clone3` into a cgroup, bubblewrap's inner stage) would run the
/// command with that placeholder instead.
fn refuse_nul_bytes(exec: &Exec) -> std::io::Result<()> {
    let named = exec
        .argv
        .iter()
        .enumerate()
        .map(|(i, a)| (format!("argv[{i}]"), a))
        .chain(exec.arg0.iter().map(|a| ("arg0".to_string(), a)));
    for (name, arg) in named {
        if arg.contains('\0') {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{name} holds a NUL byte"),
            ));
        }
    }
    Ok(())
}

/// What a started child gives its caller: its pid, its I/O ends and the
/// receiver of its exit.
pub(super) type Spawned = (u32, ChildIo, oneshot::Receiver<reaper::Exit>);

/// Starts `cmd` on a new PTY of `size`, as the leader of a new session
/// with the terminal as its controlling one, after joining the cgroups open
/// as `cgroup_fds`.
fn on_a_pty(
    mut cmd: Command,
    size: PtySize,
    cgroup_fds: Vec<std::os::fd::RawFd>,
) -> std::io::Result<Spawned> {
    let pty = open_pty(size)?;
    let slave = pty.slave;
    cmd.stdin(Stdio::from(slave.try_clone()?));
    cmd.stdout(Stdio::from(slave.try_clone()?));
    cmd.stderr(Stdio::from(slave));
    // SAFETY: only async-signal-safe calls (write, setsid, ioctl) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            for &fd in &cgroup_fds {
                join_cgroup(fd);
            }
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (child, exit) = reaper::spawn_command(&mut cmd)?;
    let pid = child.id();
    // Our copies of the slave were moved into `cmd` and are closed with it, so
    // the master sees EOF (EIO) once every process holding the slave is gone.
    drop(cmd);
    drop(child);
    Ok((pid, ChildIo::Pty { master: pty.master }, exit))
}

/// Starts `cmd` with piped stdout and stderr (stdin piped when
/// `pipe_stdin`, else `/dev/null`) in a process group of its own, after
/// joining the cgroups open as `cgroup_fds`.
pub(super) fn on_pipes(
    mut cmd: Command,
    pipe_stdin: bool,
    cgroup_fds: Vec<std::os::fd::RawFd>,
) -> std::io::Result<Spawned> {
    cmd.stdin(if pipe_stdin {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    cmd.stdout(Stdio::piped());
    cmd.stderr(Stdio::piped());
    // Its own process group, not a new session: with no `pre_exec` hook the
    // standard library starts the child with posix_spawn (vfork-like), which is
    // several times faster than fork for a large, multi-threaded server. Joining
    // a cgroup needs the hook (and so fork) where cgroups are available.
    cmd.process_group(0);
    if !cgroup_fds.is_empty() {
        // SAFETY: only async-signal-safe writes between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                for &fd in &cgroup_fds {
                    join_cgroup(fd);
                }
                Ok(())
            });
        }
    }
    let (mut child, exit) = reaper::spawn_command(&mut cmd)?;
    let pid = child.id();
    let stdin = child.stdin.take().map(OwnedFd::from);
    let stdout = child
        .stdout
        .take()
        .map(OwnedFd::from)
        .ok_or_else(|| std::io::Error::other("stdout pipe missing"))?;
    let stderr = child
        .stderr
        .take()
        .map(OwnedFd::from)
        .ok_or_else(|| std::io::Error::other("stderr pipe missing"))?;
    Ok((
        pid,
        ChildIo::Pipes {
            stdin,
            stdout,
            stderr,
        },
        exit,
    ))
}

/// A new PTY's two ends.
pub(super) struct Pty {
    pub(super) master: OwnedFd,
    pub(super) slave: OwnedFd,
}

/// A new PTY of `size`, both ends opened close-on-exec: a child another
/// thread starts meanwhile must not inherit them (it could read or type on
/// this terminal, and the master would never report EOF while it lives).
/// `openpty(3)` opens them inheritable and cannot be used.
pub(super) fn open_pty(size: PtySize) -> std::io::Result<Pty> {
    use nix::fcntl::OFlag;
    use std::os::fd::{FromRawFd, IntoRawFd};
    let flags = OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    let master = nix::pty::posix_openpt(flags).map_err(std::io::Error::from)?;
    nix::pty::grantpt(&master).map_err(std::io::Error::from)?;
    nix::pty::unlockpt(&master).map_err(std::io::Error::from)?;
    // SAFETY: the descriptor is the PtyMaster's, given up to the OwnedFd.
    let master = unsafe { OwnedFd::from_raw_fd(master.into_raw_fd()) };
    // SAFETY: TIOCGPTPEER opens the slave of the master `fd` with the flags
    // given (Linux 4.13); the result is checked, then owned.
    let slave = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, flags.bits()) };
    if slave < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    set_pty_size(&master, size.cols, size.rows)?;
    Ok(Pty { master, slave })
}

/// Sets a PTY's window size.
pub fn set_pty_size(master: &impl AsRawFd, cols: u16, rows: u16) -> std::io::Result<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize struct that lives for the call.
    let r = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards() {
        assert!(wildcard_match("*KEY*", "MY_API_KEY"));
        assert!(wildcard_match("*key*", "MY_API_KEY"));
        assert!(wildcard_match("*TOKEN*", "GH_TOKEN"));
        assert!(!wildcard_match("*SECRET*", "PATH"));
        assert!(wildcard_match("P?TH", "PATH"));
        assert!(wildcard_match("PATH", "path"));
        assert!(!wildcard_match("PAT", "PATH"));
    }

    #[test]
    fn env_policy_layers() {
        let server = vec![
            ("PATH".to_string(), "/bin".to_string()),
            ("HOME".to_string(), "/root".to_string()),
            ("MY_API_KEY".to_string(), "k".to_string()),
            ("FOO".to_string(), "f".to_string()),
            ("EXEC_SERVER_TOKEN".to_string(), "t".to_string()),
        ];
        let mut policy = EnvPolicy {
            inherit: EnvInherit::All,
            ignore_default_excludes: false,
            exclude: vec![],
            set: BTreeMap::new(),
            include_only: vec![],
        };
        let env = BTreeMap::from([("X".to_string(), "1".to_string())]);
        let out = build_env(&env, Some(&policy), server.clone().into_iter());
        assert_eq!(out.keys().collect::<Vec<_>>(), ["FOO", "HOME", "PATH", "X"]);
        policy.ignore_default_excludes = true;
        let out = build_env(&env, Some(&policy), server.clone().into_iter());
        assert!(out.contains_key("MY_API_KEY"));
        assert!(
            !out.contains_key("EXEC_SERVER_TOKEN"),
            "server credentials never inherited"
        );
        policy.inherit = EnvInherit::Core;
        let out = build_env(&BTreeMap::new(), Some(&policy), server.clone().into_iter());
        assert_eq!(out.keys().collect::<Vec<_>>(), ["HOME", "PATH"]);
        let out = build_env(&env, None, server.into_iter());
        assert_eq!(out, env, "without a policy the env is exact");
    }
}
