//! The inner stage: the last step before the command, run as this very binary
//! re-executed with [`INNER_FLAG`] (inside bubblewrap's namespaces, or alone for
//! a seccomp-only plan).
//!
//! Why a stage of our own rather than bubblewrap's `--seccomp FD` alone:
//! bubblewrap's outer process does not forward signals, so the server starts
//! it with the job-control and termination signals ignored (a client's
//! `process/signal` or a PTY's Ctrl-C must reach the command, not end the
//! sandbox). Ignored dispositions are inherited across `exec`, so something
//! inside must restore them before the command runs; this stage does that,
//! installs the seccomp filter, sets `argv[0]` (bubblewrap 0.8 cannot) and
//! `execv`s the command. It costs one exec of a small-startup binary.

use crate::seccomp::{self, SeccompMode};
use std::ffi::{CString, OsString};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;

/// The hidden command-line flag selecting the inner stage:
/// `<exe> --sandbox-inner-exec <restricted|vmsocket|proxyrouted:ROUTES|proxyrouted-tcp:ROUTES|none> env:FD <program> <argv0> [args…]`
/// (`ROUTES` as [`crate::bridge::inner_mode`] writes them),
/// where `FD` holds the command's environment, exactly
/// ([`crate::env_fd`]; the stage itself starts with none).
/// A warm sandbox's is `<exe> --sandbox-inner-exec <mode> warm:MSG:REPLY
/// <cwd> [mount point…]` ([`crate::warm`]).
pub const INNER_FLAG: &str = "--sandbox-inner-exec";

/// Exit status when the command cannot be executed inside the sandbox (as a
/// shell's `command not found` / `not executable`).
pub const EXIT_NOT_FOUND: i32 = 127;
/// See [`EXIT_NOT_FOUND`].
pub const EXIT_CANNOT_EXEC: i32 = 126;
/// Exit status when the managed-network bridge cannot be set up (the
/// reference's helper exits 101 when proxy routing fails).
pub const EXIT_PROXY_BRIDGE: i32 = 101;

fn fail(msg: &str, code: i32) -> ! {
    // "sandbox" in the text marks the failure for sandboxDenied (SANDBOX.md §2.8).
    eprintln!("exec-server sandbox: {msg}");
    std::process::exit(code)
}

fn cstring(s: &OsString) -> CString {
    CString::new(s.as_bytes())
        .unwrap_or_else(|_| fail("argument holds a NUL byte", EXIT_CANNOT_EXEC))
}

/// Runs the inner stage with the arguments after [`INNER_FLAG`]; never returns.
pub fn run(args: &[OsString]) -> ! {
    // A warm sandbox names no command (it comes in the message): what
    // follows its `<pwd>` are the mount points to check.
    let (mode, pwd, after) = match args {
        [mode, pwd, after @ ..] => (mode, pwd, after),
        _ => fail("inner stage: missing arguments", EXIT_CANNOT_EXEC),
    };
    // Ignored signals and the mask cross exec: the server starts bubblewrap
    // with the group signals ignored (its monitor must outlive them), and the
    // server itself may have inherited more. The command gets them all at
    // their default.
    exec_server_sysio::signals::restore_defaults();
    leave_the_servers_terminal();
    let pwd = pwd.as_bytes();
    let warm = pwd
        .strip_prefix(crate::warm::WARM_PREFIX.as_bytes())
        .map(|fds| {
            let fd = |s: &str| s.parse::<std::os::fd::RawFd>().ok().filter(|fd| *fd > 2);
            std::str::from_utf8(fds)
                .ok()
                .and_then(|s| s.split_once(':'))
                .and_then(|(m, r)| Some((fd(m)?, fd(r)?)))
                .unwrap_or_else(|| {
                    fail("inner stage: malformed warm descriptors", EXIT_CANNOT_EXEC)
                })
        });
    // The command's environment comes whole with a warm sandbox's message,
    // else from its descriptor; this stage's own is empty (see
    // `crate::env_fd`), and nothing of the request's reaches anything
    // before the command's `execve`.
    let env = match crate::env_fd::parse_arg(pwd) {
        Some(Some(fd)) => Some(crate::env_fd::read(fd).unwrap_or_else(|e| {
            fail(
                &format!("inner stage: cannot read the command's environment: {e}"),
                EXIT_CANNOT_EXEC,
            )
        })),
        Some(None) => fail(
            "inner stage: malformed environment descriptor",
            EXIT_CANNOT_EXEC,
        ),
        None => None,
    };
    if warm.is_none() && env.is_none() {
        fail(
            "inner stage: no environment for the command",
            EXIT_CANNOT_EXEC,
        );
    }
    let mut mode = mode.to_str();
    let routed = mode.and_then(|m| {
        (m.strip_prefix(crate::bridge::MODE_PREFIX)
            .map(|s| (s, false)))
        .or_else(|| {
            m.strip_prefix(crate::bridge::MODE_PREFIX_TCP)
                .map(|s| (s, true))
        })
    });
    let mut transparent = None;
    if let Some((spec, tcp)) = routed {
        let spec = crate::bridge::parse(spec)
            .unwrap_or_else(|| fail("inner stage: malformed proxy route", EXIT_CANNOT_EXEC));
        // The command must find the bridge listening when it starts.
        match crate::bridge::start(&spec.routes, tcp.then(crate::bridge::transparent_socket)) {
            Ok(channel) => transparent = channel,
            Err(e) => fail(
                &format!("failed to prepare the proxy routing bridge: {e}"),
                EXIT_PROXY_BRIDGE,
            ),
        }
        mode = Some(if spec.allow_all_unix_sockets {
            SeccompMode::ProxyRoutedAllUnix.as_str()
        } else {
            SeccompMode::ProxyRouted.as_str()
        });
    }
    match mode {
        Some("none") => {}
        Some(m) => match SeccompMode::parse(m) {
            Some(mode) => {
                if let Err(e) = seccomp::install(mode) {
                    fail(
                        &format!("cannot install the seccomp filter: {e}"),
                        EXIT_CANNOT_EXEC,
                    );
                }
            }
            None => fail("inner stage: unknown seccomp mode", EXIT_CANNOT_EXEC),
        },
        None => fail("inner stage: unknown seccomp mode", EXIT_CANNOT_EXEC),
    }
    // The boundary seccomp cannot draw: no write into the memory of an
    // unfiltered process (bubblewrap's init, the bridge, the server).
    // Where Landlock is missing the server warned at start.
    // SAFETY: prctl with integer arguments (set already by the filter's
    // install; Landlock needs it).
    unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if let Err(Err(e)) = crate::domain::enter() {
        fail(
            &format!("cannot enter the Landlock domain: {e}"),
            EXIT_CANNOT_EXEC,
        );
    }
    if let Some(channel) = transparent {
        // Fail closed: without the notifier raw TCP would silently stay
        // blocked while the client was promised it is routed.
        let handed = crate::transparent::install_filter()
            .and_then(|l| exec_server_sysio::fd_pass::send_fd(channel.as_raw_fd(), l.as_raw_fd()));
        if let Err(e) = handed {
            fail(
                &format!("failed to prepare transparent TCP routing: {e}"),
                EXIT_PROXY_BRIDGE,
            );
        }
    }
    if let Some((message, reply)) = warm {
        run_warm(message, reply, after);
    }
    let Some((program, rest)) = after.split_first() else {
        fail("inner stage: missing arguments", EXIT_CANNOT_EXEC)
    };
    let prog = cstring(program);
    let argv: Vec<CString> = rest.iter().map(cstring).collect();
    let env = env.unwrap_or_default();
    let (argv_ptrs, envp) = (pointers(&argv), pointers(&env));
    // SAFETY: NUL-terminated strings and NULL-terminated arrays that outlive the call.
    unsafe { libc::execve(prog.as_ptr(), argv_ptrs.as_ptr(), envp.as_ptr()) };
    exec_failed(&program.to_string_lossy())
}

/// Gives up the controlling terminal this stage inherited from the server
/// (a server run in a shell has one) unless its stdin is a terminal, which
/// only a PTY start's is (the PTY, the command's own). Why: a command that
/// keeps the server's terminal can open `/dev/tty`, make its process group
/// the foreground one (`tcsetpgrp`) and read what the operator types, or
/// print prompts there. Unlike a new session (`setsid`, bubblewrap's
/// `--new-session`), this keeps the command in the process group the
/// server signals. Fails closed: a terminal that cannot be given up
/// ends the stage before anything runs.
fn leave_the_servers_terminal() {
    // SAFETY: isatty, open, ioctl and close on integers and a static path.
    unsafe {
        if libc::isatty(0) == 1 {
            return;
        }
        let tty = libc::open(
            c"/dev/tty".as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if tty < 0 {
            // ENXIO: no controlling terminal. Any other failure leaves the
            // command unable to open it either.
            return;
        }
        let given_up = libc::ioctl(tty, libc::TIOCNOTTY as _, 0);
        libc::close(tty);
        if given_up < 0 {
            fail(
                &format!(
                    "cannot give up the server's terminal: {}",
                    std::io::Error::last_os_error()
                ),
                EXIT_CANNOT_EXEC,
            );
        }
    }
}

/// `strings` as the NULL-terminated array of pointers `execve` takes (valid
/// while `strings` lives).
fn pointers(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|a| a.as_ptr())
        .chain([std::ptr::null()])
        .collect()
}

/// Replies [`crate::warm::READY`] on `reply`, then waits for the warm
/// sandbox's message on `message` ([`crate::warm`]);
/// an empty message (the server no longer needs this sandbox) exits 0.
/// Then, if every one of `mount_points` is still mounted, nothing changed
/// since the wait began, and the working directory is still the one its
/// path names (`cwd_and_mount_points[0]`), replies [`crate::warm::INTACT`]
/// on `reply` and executes the command with exactly its environment; else
/// replies [`crate::warm::STALE`] and exits [`EXIT_CANNOT_EXEC`] saying so
/// on stderr. Never returns.
fn run_warm(
    message: std::os::fd::RawFd,
    reply: std::os::fd::RawFd,
    cwd_and_mount_points: &[OsString],
) -> ! {
    let Some((cwd, mount_points)) = cwd_and_mount_points.split_first() else {
        fail("inner stage: missing arguments", EXIT_CANNOT_EXEC)
    };
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: the server passed these descriptors for this stage alone.
    let (message, reply) = unsafe { (OwnedFd::from_raw_fd(message), OwnedFd::from_raw_fd(reply)) };
    let mounts = || std::fs::read("/proc/self/mountinfo").ok();
    let made = mounts();
    let mut reply = std::fs::File::from(reply);
    // A server that stopped listening must not kill this stage with
    // SIGPIPE: it may still have decided the command runs.
    // SAFETY: a disposition of this single-threaded process, restored below.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    // Unheard, it is only a hint: the message decides.
    let _ = std::io::Write::write_all(&mut reply, &[crate::warm::READY]);
    let bytes = crate::warm::read_message(message).unwrap_or_else(|e| {
        fail(
            &format!("inner stage: cannot read the command: {e}"),
            EXIT_CANNOT_EXEC,
        )
    });
    if bytes.is_empty() {
        std::process::exit(0);
    }
    let Some(m) = crate::warm::decode(&bytes) else {
        fail("inner stage: malformed command message", EXIT_CANNOT_EXEC);
    };
    let now = mounts();
    let intact = match (&made, &now) {
        (Some(made), Some(now)) => {
            made == now && crate::warm::all_mounted(now, mount_points) && still_at(cwd)
        }
        _ => false,
    };
    let answer = if intact {
        crate::warm::INTACT
    } else {
        crate::warm::STALE
    };
    // Unheard, the server counted the command as running (it never runs
    // one twice): it runs, unless the sandbox is stale.
    let _ = std::io::Write::write_all(&mut reply, &[answer]);
    if !intact {
        // Heard, this exit is never reported (the start goes the cold way);
        // unheard (the server stopped waiting for the reply and counted the
        // command as running), it must not pass for a command that ran.
        fail(
            "the sandbox prepared for this command changed on the host before it ran \
             (a mount or the working directory); the command did not run",
            EXIT_CANNOT_EXEC,
        );
    }
    drop(reply);
    // SAFETY: as above, before the exec.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let (argv, envp) = (pointers(&m.argv), pointers(&m.env));
    // SAFETY: NUL-terminated strings and NULL-terminated arrays that outlive the call.
    unsafe { libc::execve(m.program.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    exec_failed(&m.program.to_string_lossy())
}

/// Whether the working directory is still the directory at `path`: a
/// warm sandbox holds its working directory, not its path, so a directory
/// moved on the host (into a protected `.git`, out of every writable root)
/// and replaced would take the command with it.
fn still_at(path: &OsString) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata("."), std::fs::metadata(path)) {
        (Ok(here), Ok(there)) => here.dev() == there.dev() && here.ino() == there.ino(),
        _ => false,
    }
}

/// Fails the start after an exec of `program` failed, with a shell's exit
/// status for it.
fn exec_failed(program: &str) -> ! {
    let err = std::io::Error::last_os_error();
    let code = if err.raw_os_error() == Some(libc::ENOENT) {
        EXIT_NOT_FOUND
    } else {
        EXIT_CANNOT_EXEC
    };
    fail(&format!("cannot execute {program}: {err}"), code)
}
