//! Children born in their per-process cgroup: `clone3(CLONE_INTO_CGROUP)`
//! from a stack of their own ([`exec_server_sysio::launch`]), for unconfined
//! commands and for bubblewrap alike, instead of a fork followed by a
//! `cgroup.procs` write (which waits for the kernel's global migration lock:
//! milliseconds on an idle machine, while the spawn lock is held). Where
//! `clone3` cannot, each caller goes the fork way ([`super::spawn`]).

use super::plan::{Exec, Io};
use super::spawn::{open_pty, ChildIo, Spawned, Started};
use crate::reaper;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::Command;

/// Starts an unconfined `exec` born in its cgroup, when `join` allows it
/// and `clone3` does; `None` when the start is to go the fork way instead
/// (no cgroup, caps to join after fork, or `clone3` refused or killed the
/// child at birth: nothing ran). Errors: the child's set-up or program.
pub(super) fn try_born_in_cgroup(
    exec: &Exec,
    program: &Path,
    arg0: &str,
    join: &super::cgroup::Join,
) -> Option<std::io::Result<Started>> {
    let dir = join.dir.as_ref().filter(|_| join.procs.is_empty())?;
    if !BORN_IN_CGROUP.load(std::sync::atomic::Ordering::Relaxed) {
        return None;
    }
    let started = born_in_cgroup(exec, program, arg0, dir.as_raw_fd());
    let (pid, io, exit) = match launched(started, join)? {
        Ok(spawned) => spawned,
        Err(e) => return Some(Err(e)),
    };
    Some(Ok(Started {
        pid,
        io,
        exit,
        confinement: None,
    }))
}

/// Starts a sandbox's prepared `command`, with `hooks` standing for what
/// its `pre_exec` does, born in the cgroup of `join` (no `cgroup.procs`
/// write, which waits for the kernel's global migration lock: milliseconds
/// on an idle machine), with no environment (a confined command's own
/// reaches only its `execve`, through the inner stage), on the launcher
/// thread (see [`crate::launcher`]). `None`: the start is to go the fork
/// way (no cgroup directory, caps to join, or `clone3` unavailable).
pub(super) fn sandbox_born_in_cgroup(
    command: &Command,
    hooks: &exec_server_sandbox::Hooks,
    io: Io,
    join: &super::cgroup::Join,
) -> Option<std::io::Result<Spawned>> {
    use exec_server_sysio::launch::{Program, Setup};
    use std::os::unix::ffi::OsStrExt;
    let dir = join.dir.as_ref().filter(|_| join.procs.is_empty())?;
    if !BORN_IN_CGROUP.load(std::sync::atomic::Ordering::Relaxed) {
        return None;
    }
    let path = command.get_program().as_bytes();
    let argv = std::iter::once(path).chain(command.get_args().map(|a| a.as_bytes()));
    let cwd = command.get_current_dir()?.as_os_str().as_bytes();
    let prog = match Program::new(path, argv, std::iter::empty::<String>(), cwd) {
        Ok(p) => p,
        Err(e) => return Some(Err(e)),
    };
    let setup = Setup {
        cgroup: Some(dir.as_raw_fd()),
        close_inherited: hooks.close_inherited,
        keep_fds: hooks.keep_fds.clone(),
        ignored_signals: hooks.ignored_signals.clone(),
        ..Setup::default()
    };
    let started = crate::launcher::run(move || launch_on(&prog, setup, io));
    launched(started, join)
}

/// What a start born in its cgroup came to: `None` when the start is to
/// go the fork way instead (`clone3` refused, or the cgroup killed the
/// child at birth: nothing ran; the cgroup is then never reused).
fn launched(
    started: Result<Spawned, Launch>,
    join: &super::cgroup::Join,
) -> Option<std::io::Result<Spawned>> {
    use exec_server_sysio::launch::LaunchError;
    match started {
        Ok(spawned) => Some(Ok(spawned)),
        Err(Launch::Setup(e)) | Err(Launch::Child(LaunchError::Child(e))) => Some(Err(e)),
        // The fork way joins the cgroup after fork, unaffected by a past kill.
        Err(Launch::Child(LaunchError::BornKilled)) => {
            join.poison();
            tracing::info!("a cgroup killed what was born in it; not reused");
            None
        }
        Err(Launch::Child(LaunchError::Clone(e))) => {
            if clone3_unavailable(&e) {
                BORN_IN_CGROUP.store(false, std::sync::atomic::Ordering::Relaxed);
                tracing::info!(
                    "clone3 into a cgroup unavailable ({e}); children join theirs after fork"
                );
            } else {
                tracing::debug!("clone3 into a cgroup refused ({e}); this child joins after fork");
            }
            None
        }
    }
}

/// False once `clone3` refused to place a child in its cgroup (an old
/// kernel, a seccomp filter): later starts go straight to the fork path.
static BORN_IN_CGROUP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// True for the errors of `clone3` that will not change for this server
/// (no such call or option, a seccomp filter's refusal): every later start
/// goes the fork way at once. Others (a cgroup gone or refused, no memory)
/// send only the start that met them that way.
fn clone3_unavailable(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::Unsupported
        || matches!(
            e.raw_os_error(),
            Some(libc::ENOSYS | libc::EINVAL | libc::E2BIG | libc::EPERM | libc::EOPNOTSUPP)
        )
}

/// Why [`born_in_cgroup`] started nothing: setting up the child's I/O
/// failed here, or [`launch`](exec_server_sysio::launch::launch) failed.
enum Launch {
    Setup(std::io::Error),
    Child(exec_server_sysio::launch::LaunchError),
}

impl From<std::io::Error> for Launch {
    fn from(e: std::io::Error) -> Launch {
        Launch::Setup(e)
    }
}

/// [`reaper::spawn_and_watch`] of a [`launch`](exec_server_sysio::launch::launch).
fn watched_launch(
    prog: &exec_server_sysio::launch::Program,
    setup: &exec_server_sysio::launch::Setup,
) -> Result<(u32, tokio::sync::oneshot::Receiver<reaper::Exit>), Launch> {
    reaper::spawn_with_pidfd_and_watch(|| {
        exec_server_sysio::launch::launch(prog, setup)
            .map(|l| (l.pid, l.pid, Some(l.pidfd)))
            .map_err(Launch::Child)
    })
}

/// Starts an unconfined `exec` born in the cgroup open as `cgroup_dir`
/// (`clone3(CLONE_INTO_CGROUP)`): on pipes in a process group of its own, or
/// on a PTY as the leader of a new session, exactly as the fork way
/// ([`super::spawn::on_pipes`]) does.
fn born_in_cgroup(
    exec: &Exec,
    program: &Path,
    arg0: &str,
    cgroup_dir: std::os::fd::RawFd,
) -> Result<Spawned, Launch> {
    use exec_server_sysio::launch::{Program, Setup};
    use std::os::unix::ffi::OsStrExt;
    let argv = std::iter::once(arg0).chain(exec.argv[1..].iter().map(String::as_str));
    let env = exec.env.iter().map(|(k, v)| format!("{k}={v}"));
    let prog = Program::new(
        program.as_os_str().as_bytes(),
        argv,
        env,
        exec.cwd.as_path().as_os_str().as_bytes(),
    )?;
    // Nothing the server inherited or opened crosses into the command.
    let setup = Setup {
        cgroup: Some(cgroup_dir),
        close_inherited: true,
        ..Setup::default()
    };
    launch_on(&prog, setup, exec.io)
}

/// Launches `prog` with `setup` (its stdio and session filled in here):
/// on pipes in a process group of its own, or on a PTY as the leader of a
/// new session, exactly as the fork way ([`super::spawn::on_pipes`]) does.
fn launch_on(
    prog: &exec_server_sysio::launch::Program,
    mut setup: exec_server_sysio::launch::Setup,
    io: Io,
) -> Result<Spawned, Launch> {
    let cloexec = nix::fcntl::OFlag::O_CLOEXEC;
    match io {
        Io::Pty(size) => {
            let pty = open_pty(size)?;
            let s = pty.slave.as_raw_fd();
            setup.stdio = [s, s, s];
            setup.new_session = true;
            setup.controlling_tty = true;
            let (pid, exit) = watched_launch(prog, &setup)?;
            // The master sees EOF (EIO) once every holder of the slave is gone.
            drop(pty.slave);
            Ok((pid, ChildIo::Pty { master: pty.master }, exit))
        }
        Io::Pipes { stdin } => {
            let (out_r, out_w) = nix::unistd::pipe2(cloexec).map_err(std::io::Error::from)?;
            let (err_r, err_w) = nix::unistd::pipe2(cloexec).map_err(std::io::Error::from)?;
            let (in_child, in_ours) = if stdin {
                let (r, w) = nix::unistd::pipe2(cloexec).map_err(std::io::Error::from)?;
                (r, Some(w))
            } else {
                let null = std::fs::File::open("/dev/null")?;
                (OwnedFd::from(null), None)
            };
            setup.stdio = [in_child.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()];
            let (pid, exit) = watched_launch(prog, &setup)?;
            drop((in_child, out_w, err_w));
            Ok((
                pid,
                ChildIo::Pipes {
                    stdin: in_ours,
                    stdout: out_r,
                    stderr: err_r,
                },
                exit,
            ))
        }
    }
}
