//! Starting a program born inside a cgroup, at the cost of `posix_spawn`.
//!
//! Why not the standard library: a child that must join a cgroup before it
//! runs needs a hook between fork and exec, which makes `std::process` fork
//! (copying the page tables of a large, multi-threaded server) and then move
//! the child with a write to `cgroup.procs`, which takes the kernel's global
//! cgroup migration lock: about 0.6 ms per start, and concurrent starts
//! queue on it. `clone3(CLONE_INTO_CGROUP)` places the child in its cgroup
//! as it is created, under the read side of that lock; with `CLONE_VM |
//! CLONE_VFORK` (what `posix_spawn` does) the child borrows the parent's
//! memory until it calls `execve`, so nothing is copied either.
//!
//! The child runs on a stack of its own in the parent's memory, with every
//! signal blocked and every handler reset by the kernel (`CLONE_CLEAR_SIGHAND`):
//! it makes only raw system calls on data prepared beforehand, takes no lock,
//! never allocates, and reports through memory the parent reads once it
//! resumes: that it ran at all, and the errno of a step that failed.
//! x86-64 Linux only; elsewhere [`launch`] answers `Unsupported` and the
//! caller keeps its portable path.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::RawFd;
use std::os::raw::c_char;

/// A program ready to start: every string already in the form `execve`
/// takes, so the child allocates nothing.
pub struct Program {
    path: CString,
    cwd: CString,
    _strings: Vec<CString>,
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
}

// SAFETY: the raw pointers point into `_strings`, owned by the same value and
// never mutated; moving the value between threads moves their owner too.
unsafe impl Send for Program {}

impl Program {
    /// `path` run as `argv` (`argv[0]` is what the program sees as its
    /// name) with exactly `env` (`NAME=value` each), in `cwd`. Errors:
    /// `InvalidInput` when a string holds a NUL byte.
    pub fn new<A, E>(path: &[u8], argv: A, env: E, cwd: &[u8]) -> io::Result<Program>
    where
        A: IntoIterator,
        A::Item: AsRef<[u8]>,
        E: IntoIterator,
        E::Item: AsRef<[u8]>,
    {
        let c = |b: &[u8]| {
            CString::new(b).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte"))
        };
        let argv: Vec<CString> = argv
            .into_iter()
            .map(|a| c(a.as_ref()))
            .collect::<io::Result<_>>()?;
        let envs: Vec<CString> = env
            .into_iter()
            .map(|e| c(e.as_ref()))
            .collect::<io::Result<_>>()?;
        let ptrs = |v: &[CString]| {
            let mut p: Vec<*const c_char> = v.iter().map(|s| s.as_ptr()).collect();
            p.push(std::ptr::null());
            p
        };
        let (argv_ptrs, envp) = (ptrs(&argv), ptrs(&envs));
        let mut strings = argv;
        strings.extend(envs);
        Ok(Program {
            path: c(path)?,
            cwd: c(cwd)?,
            _strings: strings,
            argv: argv_ptrs,
            envp,
        })
    }
}

/// How the child is set up before `execve`.
#[derive(Debug, Default)]
pub struct Setup {
    /// Descriptors that become the child's 0, 1 and 2 (the parent's stay
    /// open; they should be close-on-exec).
    pub stdio: [RawFd; 3],
    /// A new session (the child leads it and its process group); else a new
    /// process group only.
    pub new_session: bool,
    /// Make the terminal on fd 0 the controlling one (with `new_session`).
    pub controlling_tty: bool,
    /// A cgroup v2 directory (an open descriptor) the child is born in.
    pub cgroup: Option<RawFd>,
    /// Mark every descriptor above 2 close-on-exec first (what the parent
    /// inherited, or another thread opened without the flag).
    pub close_inherited: bool,
    /// Descriptors that must cross the `execve` (their close-on-exec flag
    /// cleared, after [`Self::close_inherited`]).
    pub keep_fds: Vec<RawFd>,
    /// Signals the program starts with ignored (`SIG_IGN` crosses `execve`).
    pub ignored_signals: Vec<libc::c_int>,
}

/// Bytes of the child's stack: it makes system calls and nothing else.
const CHILD_STACK_BYTES: usize = 64 * 1024;

/// What the child reads, and where it reports.
struct Shared<'a> {
    program: &'a Program,
    setup: &'a Setup,
    /// Set by the child first thing: still 0 after `clone3` returned a pid
    /// means the child was killed before it ran (see [`LaunchError::BornKilled`]).
    started: i32,
    /// 0, or the errno of the step that failed.
    errno: i32,
}

/// Why [`launch`] started nothing.
#[derive(Debug)]
pub enum LaunchError {
    /// `clone3` itself refused: `ENOSYS`/`EINVAL`/`E2BIG` where the kernel
    /// lacks it or the cgroup option, `EPERM` from a seccomp filter,
    /// `EACCES`/`ENOENT`/`ENODEV`/`EBUSY`/`EBADF` for the cgroup,
    /// `EAGAIN`/`ENOMEM` for resources; `Unsupported` off x86-64 Linux.
    /// Nothing ran.
    Clone(io::Error),
    /// The child was killed before it ran a single instruction: its cgroup
    /// kills what is born into it (this kernel, 6.18, compares the parent's
    /// `cgroup.kill` count with that of a cgroup killed before). The cgroup
    /// must not be used again.
    BornKilled,
    /// A step in the child failed (`setsid`, `dup2`, `chdir`, `execve`, …);
    /// the child was reaped here. The error is about the program or its
    /// set-up.
    Child(io::Error),
}

impl std::fmt::Display for LaunchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LaunchError::Clone(e) => write!(f, "clone3: {e}"),
            LaunchError::BornKilled => {
                f.write_str("the child was killed as it was born in its cgroup")
            }
            LaunchError::Child(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for LaunchError {}

/// A child [`launch`] started.
#[derive(Debug)]
pub struct Launched {
    /// Its process id.
    pub pid: u32,
    /// A pidfd for it (`CLONE_PIDFD`, close-on-exec), readable once it has
    /// exited: the caller waits on it without a `pidfd_open` of its own.
    pub pidfd: std::os::fd::OwnedFd,
}

/// Starts `program` as set up by `setup`; returns it once it has called
/// `execve`. Errors: see [`LaunchError`].
///
/// The caller must make sure nothing else reaps the child before this
/// returns (a failed child is waited for here).
pub fn launch(program: &Program, setup: &Setup) -> Result<Launched, LaunchError> {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    {
        imp::launch(program, setup)
    }
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    {
        let _ = (program, setup);
        Err(LaunchError::Clone(io::Error::from(
            io::ErrorKind::Unsupported,
        )))
    }
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod imp {
    use super::{LaunchError, Launched, Program, Setup, Shared, CHILD_STACK_BYTES};
    use std::cell::RefCell;
    use std::io;
    use std::os::fd::{FromRawFd, OwnedFd};

    /// The kernel's `struct clone_args` up to `cgroup` (version 2, 88 bytes).
    #[repr(C)]
    #[derive(Default)]
    struct CloneArgs {
        flags: u64,
        pidfd: u64,
        child_tid: u64,
        parent_tid: u64,
        exit_signal: u64,
        stack: u64,
        stack_size: u64,
        tls: u64,
        set_tid: u64,
        set_tid_size: u64,
        cgroup: u64,
    }

    const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
    /// Every handled signal back to its default in the child (Linux 5.5;
    /// `CLONE_INTO_CGROUP` needs 5.7): the child itself then never calls
    /// `sigaction`, which in newer C libraries takes a lock for SIGABRT.
    const CLONE_CLEAR_SIGHAND: u64 = 0x1_0000_0000;

    thread_local! {
        /// Each thread's child stack, made once: a child runs on it only
        /// while this thread sleeps in `clone3`, so one per thread serves
        /// every launch (a fresh 64 KiB each time was zeroed and faulted in).
        /// u128 keeps the top of the stack 16-byte aligned, as the ABI wants
        /// at a call.
        static STACK: RefCell<Vec<u128>> = const { RefCell::new(Vec::new()) };
    }

    pub(super) fn launch(program: &Program, setup: &Setup) -> Result<Launched, LaunchError> {
        // A launch never runs inside another on one thread (it calls out to
        // nothing), so the borrow is always free.
        STACK.with_borrow_mut(|stack| {
            if stack.is_empty() {
                stack.resize(CHILD_STACK_BYTES / 16, 0);
            }
            launch_on(program, setup, stack)
        })
    }

    fn launch_on(
        program: &Program,
        setup: &Setup,
        stack: &mut [u128],
    ) -> Result<Launched, LaunchError> {
        let mut shared = Shared {
            program,
            setup,
            started: 0,
            errno: 0,
        };
        let mut pidfd: libc::c_int = -1;
        let mut args = CloneArgs {
            flags: (libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD) as u64
                | CLONE_CLEAR_SIGHAND,
            pidfd: &mut pidfd as *mut libc::c_int as u64,
            exit_signal: libc::SIGCHLD as u64,
            stack: stack.as_mut_ptr() as u64,
            stack_size: std::mem::size_of_val(stack) as u64,
            ..CloneArgs::default()
        };
        if let Some(fd) = setup.cgroup {
            args.flags |= CLONE_INTO_CGROUP;
            args.cgroup = fd as u64;
        }
        // Every signal blocked across the clone: a handler of the parent's
        // must never run in the child, which shares its memory.
        // SAFETY: sigset_t values owned here; pthread_sigmask only reads and
        // writes them.
        let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        unsafe {
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        }
        let ret: isize;
        let arg = (&mut shared as *mut Shared).cast::<libc::c_void>();
        let entry = child as extern "C" fn(*mut libc::c_void) -> !;
        // SAFETY: clone3 with CLONE_VM | CLONE_VFORK: this thread sleeps
        // until the child has exec'd or exited, so `shared`, `stack` and
        // `program` outlive every use the child makes of them. The child
        // starts on `stack` (the kernel sets its stack pointer to the top)
        // and calls `child` at once, which never returns; only the parent
        // falls through to the label. rcx and r11 are clobbered by
        // `syscall`; r12 and r13 carry the entry and its argument across.
        unsafe {
            std::arch::asm!(
                "syscall",
                "test rax, rax",
                "jnz 2f",
                "xor ebp, ebp",
                "mov rdi, r13",
                "call r12",
                "ud2",
                "2:",
                inlateout("rax") libc::SYS_clone3 as isize => ret,
                in("rdi") &mut args as *mut CloneArgs,
                in("rsi") std::mem::size_of::<CloneArgs>(),
                in("r12") entry,
                in("r13") arg,
                lateout("rcx") _,
                lateout("r11") _,
            );
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        }
        if ret < 0 {
            return Err(LaunchError::Clone(io::Error::from_raw_os_error(
                -ret as i32,
            )));
        }
        let pid = ret as i32;
        // SAFETY: with CLONE_PIDFD a successful clone3 stored a fresh
        // descriptor that nothing else owns.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        // The child has exec'd or exited: its report is final.
        // SAFETY: plain reads of our own locals, which the child wrote.
        let (started, errno) = unsafe {
            (
                std::ptr::read_volatile(&shared.started),
                std::ptr::read_volatile(&shared.errno),
            )
        };
        if started != 0 && errno == 0 {
            return Ok(Launched {
                pid: pid as u32,
                pidfd,
            });
        }
        drop(pidfd);
        reap(pid);
        if started == 0 {
            return Err(LaunchError::BornKilled);
        }
        Err(LaunchError::Child(io::Error::from_raw_os_error(errno)))
    }

    /// Waits for our own child `pid`, which has exited (again when a signal
    /// interrupts the wait: a handler without `SA_RESTART`, as Python
    /// installs, would otherwise leave a zombie).
    fn reap(pid: i32) {
        let mut status = 0;
        loop {
            // SAFETY: waits for a child of ours; `status` outlives the call.
            let r = unsafe { libc::waitpid(pid, &mut status, 0) };
            if r >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return;
            }
        }
    }

    /// The child: set up, then `execve`. System calls only, on prepared data;
    /// a failure is written to `shared.errno` and the child exits 127.
    extern "C" fn child(arg: *mut libc::c_void) -> ! {
        // SAFETY: `arg` is the parent's `Shared`, alive while the parent
        // sleeps in clone3 (CLONE_VFORK); every call below is a system call
        // wrapper that touches no lock of the parent's.
        unsafe {
            let shared = &mut *arg.cast::<Shared>();
            std::ptr::write_volatile(&mut shared.started, 1);
            let errno = prepare_and_exec(shared.program, shared.setup);
            std::ptr::write_volatile(&mut shared.errno, errno.max(1));
            libc::_exit(127)
        }
    }

    /// Returns only on failure, with the errno.
    unsafe fn prepare_and_exec(program: &Program, setup: &Setup) -> i32 {
        let err = || {
            io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO)
        };
        // Handlers were reset by the kernel; ignored signals and the mask
        // would cross the exec: every one back to its default (SIGPIPE too,
        // which the Rust runtime ignores), then those the setup asks for.
        crate::signals::restore_defaults();
        if setup.close_inherited && crate::signals::close_inherited_on_exec().is_err() {
            return err();
        }
        for fd in &setup.keep_fds {
            if libc::fcntl(*fd, libc::F_SETFD, 0) < 0 {
                return err();
            }
        }
        for sig in &setup.ignored_signals {
            let _ = crate::signals::ignore(*sig);
        }
        let rc = if setup.new_session {
            libc::setsid()
        } else {
            libc::setpgid(0, 0)
        };
        if rc < 0 {
            return err();
        }
        // A source among 0..2 could be overwritten by an earlier dup2: move
        // such sources above 2 first (this fd table is the child's own).
        let mut src = setup.stdio;
        for fd in src.iter_mut() {
            if *fd < 3 {
                let moved = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 3);
                if moved < 0 {
                    return err();
                }
                *fd = moved;
            }
        }
        for (target, fd) in src.iter().enumerate() {
            if libc::dup2(*fd, target as i32) < 0 {
                return err();
            }
        }
        if setup.controlling_tty && libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
            return err();
        }
        if libc::chdir(program.cwd.as_ptr()) < 0 {
            return err();
        }
        let none = 0u64;
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &none as *const u64,
            std::ptr::null_mut::<u64>(),
            8usize,
        );
        libc::execve(
            program.path.as_ptr(),
            program.argv.as_ptr(),
            program.envp.as_ptr(),
        );
        err()
    }
}

/// The path of `program`, for messages.
impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("path", &self.path)
            .field("cwd", &self.cwd)
            .finish_non_exhaustive()
    }
}

/// `CStr` of the path, for callers that report it.
impl Program {
    /// The program's path.
    pub fn path(&self) -> &CStr {
        &self.path
    }
}

#[cfg(all(test, target_os = "linux", target_arch = "x86_64"))]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two descriptors we then own.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    /// Runs `script` under `sh -c` with `env`, in `cwd`; returns stdout and
    /// the exit status.
    fn run(script: &str, env: &[&str], cwd: &str) -> io::Result<(String, i32)> {
        let (out_r, out_w) = pipe();
        let null = std::fs::File::open("/dev/null").unwrap();
        let program = Program::new(b"/bin/sh", ["sh", "-c", script], env, cwd.as_bytes())?;
        let setup = Setup {
            stdio: [null.as_raw_fd(), out_w.as_raw_fd(), out_w.as_raw_fd()],
            new_session: false,
            controlling_tty: false,
            cgroup: None,
            ..Setup::default()
        };
        let launched = launch(&program, &setup).map_err(|e| match e {
            LaunchError::Child(e) | LaunchError::Clone(e) => e,
            LaunchError::BornKilled => io::Error::other("born killed"),
        })?;
        let pid = launched.pid;
        drop(out_w);
        let mut out = String::new();
        std::fs::File::from(out_r).read_to_string(&mut out).unwrap();
        // The pidfd the launch returned turns readable when the child exits.
        let mut poll = libc::pollfd {
            fd: launched.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd that outlives the call.
        assert_eq!(unsafe { libc::poll(&mut poll, 1, 10_000) }, 1);
        let mut status = 0;
        // SAFETY: our own child.
        assert_eq!(
            unsafe { libc::waitpid(pid as i32, &mut status, 0) },
            pid as i32
        );
        Ok((out, libc::WEXITSTATUS(status)))
    }

    #[test]
    fn runs_with_exactly_its_argv_env_and_cwd() {
        let (out, code) = run(
            "echo \"$X|$HOME|$(pwd)|$0\"; exit 3",
            &["X=one two", "PATH=/usr/bin:/bin"],
            "/tmp",
        )
        .unwrap();
        assert_eq!((out.as_str(), code), ("one two||/tmp|sh\n", 3));
    }

    #[test]
    fn the_child_has_default_signals_and_its_own_process_group() {
        // SIGPIPE (13) is ignored by the Rust runtime here; the child must
        // not inherit that, nor any blocked signal.
        let (out, _) = run(
            "grep -E '^(SigBlk|SigIgn)' /proc/self/status; ps -o pgid= -p $$; echo $$",
            &["PATH=/usr/bin:/bin"],
            "/",
        )
        .unwrap();
        let lines: Vec<&str> = out.lines().map(str::trim).collect();
        assert_eq!(lines[0], "SigBlk:\t0000000000000000");
        let ignored =
            u64::from_str_radix(lines[1].trim_start_matches("SigIgn:").trim(), 16).unwrap();
        assert_eq!(ignored & (1 << (libc::SIGPIPE - 1)), 0, "{out}");
        assert_eq!(lines[2], lines[3], "the child leads its own process group");
    }

    #[test]
    fn only_the_kept_descriptors_cross_and_the_ignored_signals_stay_ignored() {
        let (kept, _kept_w) = pipe();
        let (leaked, _leaked_w) = pipe();
        // An inheritable descriptor, as another thread might leave one.
        // SAFETY: fcntl on a descriptor this test owns.
        assert_eq!(
            unsafe { libc::fcntl(leaked.as_raw_fd(), libc::F_SETFD, 0) },
            0
        );
        let (out_r, out_w) = pipe();
        let null = std::fs::File::open("/dev/null").unwrap();
        let script = "ls /proc/self/fd | tr '\\n' ' '; echo; grep SigIgn /proc/self/status";
        let program = Program::new(
            b"/bin/sh",
            ["sh", "-c", script],
            ["PATH=/usr/bin:/bin"],
            b"/",
        )
        .unwrap();
        let setup = Setup {
            stdio: [null.as_raw_fd(), out_w.as_raw_fd(), out_w.as_raw_fd()],
            close_inherited: true,
            keep_fds: vec![kept.as_raw_fd()],
            ignored_signals: vec![libc::SIGHUP],
            ..Setup::default()
        };
        let pid = launch(&program, &setup).unwrap().pid;
        drop(out_w);
        let mut out = String::new();
        std::fs::File::from(out_r).read_to_string(&mut out).unwrap();
        let mut status = 0;
        // SAFETY: our own child.
        unsafe { libc::waitpid(pid as i32, &mut status, 0) };
        let mut lines = out.lines();
        let fds: Vec<i32> = lines
            .next()
            .unwrap_or("")
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        assert!(fds.contains(&kept.as_raw_fd()), "{out}");
        assert!(!fds.contains(&leaked.as_raw_fd()), "{out}");
        let ignored = lines
            .next()
            .unwrap_or("")
            .trim_start_matches("SigIgn:")
            .trim();
        let ignored = u64::from_str_radix(ignored, 16).unwrap();
        assert_ne!(ignored & (1 << (libc::SIGHUP - 1)), 0, "{out}");
    }

    #[test]
    fn failures_are_the_os_errors_of_the_step_that_failed() {
        let missing = Program::new(b"/nonexistent/prog", ["prog"], ["A=b"], b"/").unwrap();
        let setup = Setup {
            stdio: [0, 1, 2],
            new_session: false,
            controlling_tty: false,
            cgroup: None,
            ..Setup::default()
        };
        let child_errno = |e: LaunchError| match e {
            LaunchError::Child(e) => e.raw_os_error(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            child_errno(launch(&missing, &setup).unwrap_err()),
            Some(libc::ENOENT)
        );
        let e = run("true", &[], "/nonexistent-dir").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        let plain = std::env::temp_dir().join(format!("launch-plain-{}", std::process::id()));
        std::fs::write(&plain, "not a program").unwrap();
        let path = plain.to_str().unwrap().as_bytes().to_vec();
        let e = launch(&Program::new(&path, ["x"], [""; 0], b"/").unwrap(), &setup).unwrap_err();
        std::fs::remove_file(&plain).unwrap();
        assert_eq!(child_errno(e), Some(libc::EACCES));
        assert!(Program::new(b"/bin/sh", ["a\0b"], [""; 0], b"/").is_err());
    }
}
