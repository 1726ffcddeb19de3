//! Turning a [`Plan`] into the command that starts one confined child.

use crate::inner::INNER_FLAG;
use crate::plan::{Mount, Plan};
use crate::protect::Placeholder;
use crate::Error;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The programs a confined start needs.
#[derive(Debug, Clone)]
pub struct Runtime {
    /// bubblewrap, when found; `None` makes every plan that needs namespaces
    /// fail with [`Error::BwrapMissing`] (never a silent downgrade).
    pub bwrap: Option<PathBuf>,
    /// This server's executable; it must handle [`INNER_FLAG`] first thing
    /// in `main`.
    pub helper: PathBuf,
    /// The inner stage's executable ([`crate::inner`]): `helper`, or the
    /// smaller program of the same build that starts faster
    /// ([`crate::inner_program::beside`]).
    pub inner: PathBuf,
    /// The server's own files, hidden in every confined view whatever the
    /// policy grants: its Unix listen sockets, spool and runtime directories
    /// (absolute; canonical where they exist). A directory becomes an empty
    /// mode-000 read-only tmpfs, anything else an empty mode-000 file.
    pub hidden: Vec<PathBuf>,
}

impl Runtime {
    /// Finds `bwrap` on `PATH` (then `/usr/bin`), with `helper` as the inner
    /// stage (see [`Runtime::inner`] for a faster one).
    pub fn locate(helper: PathBuf) -> Runtime {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let bwrap = std::env::split_paths(&path)
            .chain([PathBuf::from("/usr/bin")])
            .map(|d| d.join("bwrap"))
            .find(|p| is_executable(p));
        Runtime {
            bwrap,
            inner: helper.clone(),
            helper,
            hidden: Vec::new(),
        }
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// What must live as long as the confined child: its placeholders (removed
/// from the host when the last user is gone). Drop it once the child exited.
#[derive(Debug, Default)]
pub struct Guard {
    _placeholders: Vec<Placeholder>,
}

impl Guard {
    /// The host paths of its placeholders, for a server handing its
    /// running sandboxes over to a new binary ([`Guard::adopt`]).
    pub fn placeholder_paths(&self) -> Vec<std::path::PathBuf> {
        self._placeholders
            .iter()
            .map(|p| p.path().to_path_buf())
            .collect()
    }

    /// The guard a previous image of this process held for a child that
    /// still runs: its placeholders at `paths`, counted again (never
    /// created: a path that is gone stays gone).
    pub fn adopt(paths: &[std::path::PathBuf]) -> Guard {
        Guard {
            _placeholders: paths.iter().map(|p| Placeholder::adopt(p)).collect(),
        }
    }
}

/// A command ready for stdio, environment and spawning. The caller sets the
/// environment (passed through unchanged to the command), stdio and process
/// group; it must not clear the inherited descriptors the command refers to.
pub struct Prepared {
    /// The command to spawn.
    pub command: Command,
    /// Keep until the child exited.
    pub guard: Guard,
    /// Descriptors the command reads at start (closed in the server once spawned).
    pub fds: Vec<OwnedFd>,
    /// The command runs confined (namespaces, or at least the seccomp
    /// filter); false for a plain exec ([`Plan::Direct`]).
    pub confined: bool,
    /// What [`Self::command`]'s `pre_exec` does, for a caller that starts
    /// the same program another way (`clone3` into a cgroup).
    pub hooks: Hooks,
}

/// The set-up between fork and exec a prepared command needs.
#[derive(Debug, Default, Clone)]
pub struct Hooks {
    /// Mark every inherited descriptor above 2 close-on-exec.
    pub close_inherited: bool,
    /// Then clear that flag on these (they cross into the sandbox).
    pub keep_fds: Vec<std::os::fd::RawFd>,
    /// Start with these signals ignored.
    pub ignored_signals: Vec<libc::c_int>,
}

/// What to run inside.
pub struct Target<'a> {
    /// Absolute path of the program.
    pub program: &'a Path,
    /// `argv[0]`.
    pub arg0: &'a str,
    /// The arguments after `argv[0]`.
    pub args: &'a [String],
    /// Working directory (must be visible inside).
    pub cwd: &'a Path,
    /// The command's environment, exactly (`PWD` included or not, as
    /// requested). A confined command's reaches only its own `execve`:
    /// bubblewrap and the inner stage start with none ([`crate::env_fd`]).
    pub env: &'a std::collections::BTreeMap<String, String>,
}

/// Signals a client or a terminal sends to the whole process group: the
/// bubblewrap monitor ignores them (it would die and take the sandbox with it
/// instead of letting the command handle them); the inner stage restores them.
const MONITOR_IGNORED: [libc::c_int; 7] = [
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGTSTP,
];

/// Parts of `/proc` re-bound read-only over the sandbox's own `/proc` (the
/// list container runtimes keep read-only).
pub const PROC_READ_ONLY: [&str; 5] = [
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/proc/fs",
    "/proc/acpi",
    "/proc/scsi",
];

/// Builds the command for `plan`. `Plan::Direct` runs the program itself.
///
/// Errors: [`Error::BwrapMissing`] for a confined plan without bubblewrap;
/// [`Error::Io`] when a descriptor cannot be made.
///
/// A confined command (namespaces, or the seccomp filter alone) is
/// started with an empty environment, the command's own in
/// [`Prepared::fds`] for the inner stage ([`crate::env_fd`]): spawn it
/// without adding any. A plain exec gets the environment set here.
pub fn prepare(runtime: &Runtime, plan: Plan, target: &Target<'_>) -> Result<Prepared, Error> {
    let env_of = || -> Result<(OwnedFd, OsString), Error> {
        let fd = crate::env_fd::write(target.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(Error::Io)?;
        let arg = OsString::from(format!("{}{}", crate::env_fd::ENV_PREFIX, fd.as_raw_fd()));
        Ok((fd, arg))
    };
    match Confined::of(plan) {
        Ok(plan) => {
            let (env, arg) = env_of()?;
            confined(
                runtime,
                plan,
                target.cwd,
                |mode, _| inner_stage(target, mode, arg),
                vec![env],
            )
        }
        Err(Plan::Seccomp(mode)) => {
            let (env, arg) = env_of()?;
            let mut command = Command::new(&runtime.inner);
            command
                .args(inner_stage(target, mode.as_str(), arg))
                .current_dir(target.cwd)
                .env_clear();
            let fds = vec![env];
            let hooks = keep_hooks(&mut command, &fds, &[]);
            Ok(Prepared {
                command,
                guard: Guard::default(),
                fds,
                confined: true,
                hooks,
            })
        }
        // Plan::Direct.
        Err(_) => {
            let mut command = Command::new(target.program);
            command
                .arg0(target.arg0)
                .args(target.args)
                .current_dir(target.cwd)
                .env_clear()
                .envs(target.env);
            Ok(Prepared {
                command,
                guard: Guard::default(),
                fds: Vec::new(),
                confined: false,
                hooks: Hooks::default(),
            })
        }
    }
}

/// A sandbox prepared ahead ([`crate::warm`]): spawn [`Warm::prepared`]
/// with the command's stdio (its environment is empty), then write the command's
/// message ([`crate::warm::encode`]) to [`Warm::message`] and close it.
pub struct Warm {
    /// The bubblewrap command, its inner stage waiting for the message.
    pub prepared: Prepared,
    /// The message pipe's write end (close-on-exec, [`crate::warm::MAX_MESSAGE_BYTES`]
    /// of room).
    pub message: OwnedFd,
    /// The reply pipe's read end: one byte, [`crate::warm::INTACT`] just
    /// before the command's `execve`, or [`crate::warm::STALE`] (then
    /// nothing runs).
    pub reply: OwnedFd,
}

/// A pipe, both ends close-on-exec. Errors: the OS's.
fn pipe() -> Result<(OwnedFd, OwnedFd), Error> {
    let mut ends = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(Error::Io(std::io::Error::last_os_error()));
    }
    // SAFETY: both descriptors are new and owned here alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) })
}

/// Builds a warm sandbox for `plan` with its working directory `cwd`;
/// `Ok(None)` for a plan without namespaces (nothing to prepare ahead).
///
/// Errors: as [`prepare`], and the pipes'.
pub fn prepare_warm(runtime: &Runtime, plan: Plan, cwd: &Path) -> Result<Option<Warm>, Error> {
    let Ok(plan) = Confined::of(plan) else {
        return Ok(None);
    };
    let (read, write) = pipe()?;
    let (reply, reply_w) = pipe()?;
    // SAFETY: fcntl on a pipe this function owns.
    let room = unsafe {
        libc::fcntl(
            write.as_raw_fd(),
            libc::F_SETPIPE_SZ,
            crate::warm::MAX_MESSAGE_BYTES as libc::c_int,
        )
    };
    if room < 0 || (room as usize) < crate::warm::MAX_MESSAGE_BYTES {
        return Err(Error::Io(std::io::Error::last_os_error()));
    }
    let tail = OsString::from(format!(
        "{}{}:{}",
        crate::warm::WARM_PREFIX,
        read.as_raw_fd(),
        reply_w.as_raw_fd()
    ));
    let prepared = confined(
        runtime,
        plan,
        cwd,
        |mode, mount_points| {
            let mut v = vec![INNER_FLAG.into(), mode.into(), tail, cwd.as_os_str().into()];
            v.extend(mount_points);
            v
        },
        vec![read, reply_w],
    )?;
    Ok(Some(Warm {
        prepared,
        message: write,
        reply,
    }))
}

/// The parts of [`Plan::Confined`].
struct Confined {
    view: crate::plan::View,
    seccomp: crate::seccomp::SeccompMode,
    unshare_net: bool,
    proxy: Option<crate::plan::ProxyRoute>,
}

impl Confined {
    /// The parts of a confined plan; any other plan back as it was.
    fn of(plan: Plan) -> Result<Confined, Plan> {
        match plan {
            Plan::Confined {
                view,
                seccomp,
                unshare_net,
                proxy,
            } => Ok(Confined {
                view,
                seccomp,
                unshare_net,
                proxy,
            }),
            other => Err(other),
        }
    }
}

/// The bubblewrap command for a confined plan; `inner` gives the inner
/// stage's arguments for its seccomp or proxy mode and the view's mount
/// points, and `passed` are descriptors they name (they cross into the
/// sandbox).
fn confined(
    runtime: &Runtime,
    plan: Confined,
    cwd: &Path,
    inner: impl FnOnce(&str, Vec<OsString>) -> Vec<OsString>,
    passed: Vec<OwnedFd>,
) -> Result<Prepared, Error> {
    let Confined {
        view,
        seccomp,
        unshare_net,
        proxy,
    } = plan;
    let bwrap = runtime.bwrap.as_ref().ok_or(Error::BwrapMissing)?;
    let mut args = Args(Vec::with_capacity(64));
    args.namespaces(unshare_net);
    let (mut fds, mount_points) = args.view(runtime, &view)?;
    if let Some(route) = &proxy {
        // Read-only: the command must not write into the host
        // directory (a read-only policy would then fill the host's
        // disk) nor rename anything over the proxy's sockets (the
        // bridge pins them anyway).
        args.push(&[
            "--ro-bind".as_ref(),
            route.host_dir.as_ref(),
            crate::PROXY_DIR_INSIDE.as_ref(),
        ]);
    }
    args.proc();
    args.push(&["--cap-drop".as_ref(), "ALL".as_ref()]);
    args.push(&[
        "--chdir".as_ref(),
        cwd.as_ref(),
        "--".as_ref(),
        runtime.inner.as_ref(),
    ]);
    let mode = match &proxy {
        Some(route) => crate::bridge::inner_mode(route),
        None => seccomp.as_str().to_string(),
    };
    args.0.extend(inner(&mode, mount_points));
    let mut command = Command::new(bwrap);
    // Nothing of a request's environment reaches bubblewrap (on the host)
    // or the inner stage (before its filter): see `crate::env_fd`.
    command.args(args.0).current_dir(cwd).env_clear();
    fds.extend(passed);
    let hooks = monitor_hooks(&mut command, &fds);
    Ok(Prepared {
        command,
        guard: Guard {
            _placeholders: view.placeholders,
        },
        fds,
        confined: true,
        hooks,
    })
}

/// The inner stage's arguments: its flag, the seccomp or proxy `mode`, the
/// environment's descriptor (`env:FD`), then the program, its `argv[0]`
/// and its arguments.
fn inner_stage(target: &Target<'_>, mode: &str, env: OsString) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec![
        INNER_FLAG.into(),
        mode.into(),
        env,
        target.program.into(),
        target.arg0.into(),
    ];
    v.extend(target.args.iter().map(OsString::from));
    v
}

/// Between fork and exec of the bubblewrap monitor: close what the server
/// inherited, ignore the group signals ([`MONITOR_IGNORED`]), and let `fds`
/// (the `--ro-bind-data` sources, the environment, a warm sandbox's pipes)
/// cross the exec.
fn monitor_hooks(command: &mut Command, fds: &[OwnedFd]) -> Hooks {
    keep_hooks(command, fds, &MONITOR_IGNORED)
}

/// Between fork and exec: close what the server inherited, start with
/// `ignored` signals ignored, and let `fds` cross the exec.
fn keep_hooks(command: &mut Command, fds: &[OwnedFd], ignored: &'static [libc::c_int]) -> Hooks {
    let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let hooks = Hooks {
        close_inherited: true,
        keep_fds: raw.clone(),
        ignored_signals: ignored.to_vec(),
    };
    // SAFETY: between fork and exec only system calls (rt_sigaction,
    // close_range, fcntl) on integers captured by value.
    unsafe {
        command.pre_exec(move || {
            exec_server_sysio::signals::restore_defaults();
            exec_server_sysio::signals::close_inherited_on_exec()?;
            for &sig in ignored {
                exec_server_sysio::signals::ignore(sig)?;
            }
            for fd in &raw {
                if libc::fcntl(*fd, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    hooks
}

/// bubblewrap's arguments, in order.
struct Args(Vec<OsString>);

impl Args {
    fn push(&mut self, a: &[&std::ffi::OsStr]) {
        self.0.extend(a.iter().map(|s| s.to_os_string()));
    }

    /// New user, PID, IPC and UTS namespaces (and network when
    /// `unshare_net`); the sandbox dies with the server.
    fn namespaces(&mut self, unshare_net: bool) {
        self.push(&[
            "--unshare-user".as_ref(),
            "--unshare-pid".as_ref(),
            "--unshare-ipc".as_ref(),
            "--unshare-uts".as_ref(),
        ]);
        if unshare_net {
            self.push(&["--unshare-net".as_ref()]);
        }
        self.push(&["--die-with-parent".as_ref()]);
    }

    /// The file-system view: the root, `/dev`, the policy's mounts and the
    /// server's hidden paths. Returns the descriptors of the empty files
    /// that deny single files (the command must inherit them) and the
    /// mount points of the policy's mounts and masks (a warm sandbox
    /// checks they are still mounted).
    fn view(
        &mut self,
        runtime: &Runtime,
        view: &crate::plan::View,
    ) -> Result<(Vec<OwnedFd>, Vec<OsString>), Error> {
        if view.full_read {
            self.push(&["--ro-bind".as_ref(), "/".as_ref(), "/".as_ref()]);
        } else {
            self.push(&["--tmpfs".as_ref(), "/".as_ref()]);
        }
        self.push(&["--dev".as_ref(), "/dev".as_ref()]);
        let mut fds = Vec::new();
        // The server's own sockets and directories: never reachable from
        // a sandbox, whatever the policy made readable or writable.
        let hidden = hidden_masks(&runtime.hidden, view);
        // Nothing masked or read-only may be moved away by renaming a
        // directory above it (`anchors`).
        let all = crate::anchors::anchored(view.mounts.iter().cloned().chain(hidden).collect());
        let mut points = Vec::new();
        for m in &all {
            if let Some(fd) = self.mount(m)? {
                fds.push(fd);
            }
            points.extend(m.point().map(|p| p.as_os_str().to_os_string()));
        }
        // A bind of `/` (or `/dev`) made after the minimal /dev hides its
        // device nodes (bind mounts carry nodev here): `echo > /dev/null`
        // would fail under a writable root. Set up /dev again on top
        // (`linuxRootWritePreservesDevices`).
        let covers_dev = |p: &Path| Path::new("/dev").starts_with(p);
        if all.iter().any(|m| match m {
            Mount::ReadOnly(p) | Mount::Protect(p) | Mount::Writable(p) => covers_dev(p),
            _ => false,
        }) {
            self.push(&["--dev".as_ref(), "/dev".as_ref()]);
        }
        Ok((fds, points))
    }

    /// One mount; a denied file returns the descriptor of its empty source.
    fn mount(&mut self, m: &Mount) -> Result<Option<OwnedFd>, Error> {
        match m {
            // Bound from a descriptor opened here and checked to name the
            // resolved path: bubblewrap would look the path up again, and a
            // command that can write one of its directories could have
            // swapped a symlink in since the plan was resolved.
            Mount::ReadOnly(p) | Mount::Writable(p) | Mount::Protect(p) => {
                let fd = crate::links::open_exact(p, 0)?;
                let n = OsString::from(fd.as_raw_fd().to_string());
                let flag = match m {
                    Mount::Writable(_) => "--bind-fd",
                    _ => "--ro-bind-fd",
                };
                self.push(&[flag.as_ref(), n.as_ref(), p.as_ref()]);
                return Ok(Some(fd));
            }
            // Best effort, like the scan that found it: gone or replaced
            // since (by a command that can write its directory), it is
            // skipped rather than followed.
            Mount::ProtectNested(p) => {
                let Ok(fd) = crate::links::open_exact(p, 0) else {
                    return Ok(None);
                };
                let n = OsString::from(fd.as_raw_fd().to_string());
                self.push(&["--ro-bind-fd".as_ref(), n.as_ref(), p.as_ref()]);
                return Ok(Some(fd));
            }
            Mount::DenyDir(p) => self.push(&[
                "--perms".as_ref(),
                "0000".as_ref(),
                "--tmpfs".as_ref(),
                p.as_ref(),
                "--remount-ro".as_ref(),
                p.as_ref(),
            ]),
            Mount::Symlink(link, target) => {
                self.push(&["--symlink".as_ref(), target.as_ref(), link.as_ref()])
            }
            Mount::DenyFile(p) => {
                let fd = empty_fd()?;
                let n = OsString::from(fd.as_raw_fd().to_string());
                self.push(&[
                    "--perms".as_ref(),
                    "0000".as_ref(),
                    "--ro-bind-data".as_ref(),
                    n.as_ref(),
                    p.as_ref(),
                ]);
                return Ok(Some(fd));
            }
        }
        Ok(None)
    }

    /// The sandbox's own `/proc`, with [`PROC_READ_ONLY`] re-bound over it.
    /// bubblewrap 0.8 covers only /proc/irq and /proc/bus: uid 0 outside is
    /// uid 0 inside, and some /proc files check nothing but the file mode
    /// (`kernel/domainname`, `sysrq-trigger`), so as root a sandboxed
    /// command could change the host.
    fn proc(&mut self) {
        self.push(&["--proc".as_ref(), "/proc".as_ref()]);
        for p in PROC_READ_ONLY {
            if Path::new(p).exists() {
                self.push(&["--ro-bind".as_ref(), p.as_ref(), p.as_ref()]);
            }
        }
    }
}

/// Masks for the server's own `hidden` paths that `view` shows, or that
/// hold one of its mounts (an entry inside one, under `minimal`, is not
/// "shown" from above but would be bound), on their real paths (masking a
/// symlink's name would leave its target).
fn hidden_masks(hidden: &[PathBuf], view: &crate::plan::View) -> Vec<Mount> {
    let holds_a_mount = |p: &Path| {
        view.mounts
            .iter()
            .any(|m| m.point().is_some_and(|q| q.starts_with(p)))
    };
    hidden
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .filter(|p| view.shows(p) || holds_a_mount(p))
        .map(|p| match p.is_dir() {
            true => Mount::DenyDir(p),
            false => Mount::DenyFile(p),
        })
        .collect()
}

/// A read end that is at end of file at once (a pipe whose write end is
/// closed): the content of a masked file.
fn empty_fd() -> Result<OwnedFd, Error> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Error::Io(std::io::Error::last_os_error()));
    }
    // SAFETY: both are fresh descriptors owned by nobody else.
    let (r, w) = unsafe {
        use std::os::fd::FromRawFd;
        (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
    };
    drop(w);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bind_source_swapped_for_a_symlink_is_refused() {
        let d = std::env::temp_dir().join(format!("sbx-pin-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("real")).unwrap();
        std::fs::create_dir_all(d.join("elsewhere")).unwrap();
        let d = std::fs::canonicalize(&d).unwrap();
        assert!(crate::links::open_exact(&d.join("real"), 0).is_ok());
        // Resolved as a directory, then replaced by a link before the bind.
        std::fs::remove_dir(d.join("real")).unwrap();
        std::os::unix::fs::symlink(d.join("elsewhere"), d.join("real")).unwrap();
        match crate::links::open_exact(&d.join("real"), 0) {
            Err(Error::Moved(p, now)) => {
                assert_eq!((p, now), (d.join("real"), d.join("elsewhere")))
            }
            other => panic!("{other:?}"),
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
