//! The signal state a started program gets: every signal at its default,
//! none blocked, whatever the server inherited. Ignored dispositions and the
//! mask survive `execve`; a server started in the background by a
//! non-interactive shell (`SIGINT` and `SIGQUIT` ignored), under `nohup`
//! (`SIGHUP`) or by a supervisor would otherwise hand them to every command,
//! and a client's `process/signal` interrupt would do nothing.

/// The kernel's `struct sigaction` as `rt_sigaction` takes it on x86_64 and
/// aarch64: handler, flags, restorer, a 64-bit mask. All zero is `SIG_DFL`.
type KernelSigaction = [u64; 4];

/// `SIG_IGN` as the kernel's handler field holds it.
const SIG_IGN: u64 = 1;

/// Signals the kernel numbers: 1 to 64 (`_NSIG`).
const SIGNALS: std::ops::RangeInclusive<libc::c_int> = 1..=64;

/// Every ignored signal (but `SIGKILL` and `SIGSTOP`) back to `SIG_DFL`, and
/// the mask emptied. Handled signals are left alone: `execve` resets those,
/// and a C library's own must keep working until then. System calls only
/// (no lock, no allocation), so it may run between `fork` and `exec`; the C
/// libraries' wrappers are bypassed because they refuse the real-time
/// signals they reserve (32–33 for glibc, 32–34 for musl). Failures are
/// ignored: a signal the kernel refuses to change keeps its state.
pub fn restore_defaults() {
    let size = std::mem::size_of::<u64>();
    let default: KernelSigaction = [0; 4];
    for sig in SIGNALS {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        let mut old: KernelSigaction = [0; 4];
        // SAFETY: rt_sigaction reading into an array of the kernel's layout.
        let read = unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                std::ptr::null::<KernelSigaction>(),
                &mut old as *mut KernelSigaction,
                size,
            )
        };
        if read == 0 && old[0] == SIG_IGN {
            // SAFETY: rt_sigaction from an array of the kernel's layout.
            unsafe {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    &default as *const KernelSigaction,
                    std::ptr::null_mut::<KernelSigaction>(),
                    size,
                )
            };
        }
    }
    let none: u64 = 0;
    // SAFETY: rt_sigprocmask from a 64-bit mask; the old one is not asked for.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &none as *const u64,
            std::ptr::null_mut::<u64>(),
            size,
        )
    };
}

/// Ignores `sig` (`SIG_IGN`) through the system call itself, as
/// [`restore_defaults`] undoes it (a supervisor's or a shell's doing, or a
/// monitor that must outlive a signal). A system call only: it may run
/// between `fork` and `exec`. Errors: the OS's (`SIGKILL`, `SIGSTOP`, or a
/// number out of 1–64).
pub fn ignore(sig: libc::c_int) -> std::io::Result<()> {
    let ignored: KernelSigaction = [SIG_IGN, 0, 0, 0];
    // SAFETY: rt_sigaction from an array of the kernel's layout.
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            sig,
            &ignored as *const KernelSigaction,
            std::ptr::null_mut::<KernelSigaction>(),
            std::mem::size_of::<u64>(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Adds `sigs` to this thread's blocked mask through the system call
/// itself (what [`restore_defaults`] empties). A system call only. Errors:
/// the OS's.
pub fn block(sigs: &[libc::c_int]) -> std::io::Result<()> {
    let mask = sigs
        .iter()
        .filter(|s| (1..=64).contains(*s))
        .fold(0u64, |m, s| m | 1 << (s - 1));
    // SAFETY: rt_sigprocmask from a 64-bit mask; the old one is not asked for.
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_BLOCK,
            &mask as *const u64,
            std::ptr::null_mut::<u64>(),
            std::mem::size_of::<u64>(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Marks every descriptor from 3 up close-on-exec (`close_range`), so a
/// started program gets only its standard streams and what its caller then
/// makes inheritable again. A system call only: it may run between `fork`
/// and `exec`. Errors: the OS's (Linux before 5.11 has no such call).
pub fn close_inherited_on_exec() -> std::io::Result<()> {
    // SAFETY: close_range with integer arguments.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::FromRawFd;

    /// What `grep` finds in its own `/proc/self/status` (`SigIgn`, `SigBlk`)
    /// when started from a child that ignored SIGINT, SIGALRM, 34 and 64 and
    /// blocked SIGUSR1, after [`restore_defaults`] when `restore`.
    fn exec_status(restore: bool) -> String {
        let argv = [
            c"/bin/grep".as_ptr(),
            c"-E".as_ptr(),
            c"^Sig(Ign|Blk):".as_ptr(),
            c"/proc/self/status".as_ptr(),
            std::ptr::null(),
        ];
        let mut ends = [0; 2];
        // SAFETY: pipe fills the array.
        assert_eq!(unsafe { libc::pipe(ends.as_mut_ptr()) }, 0);
        // SAFETY: the child makes system calls only (no allocation), then
        // execs or exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            unsafe {
                libc::dup2(ends[1], 1);
                for sig in [libc::SIGINT, libc::SIGALRM, 34, 64] {
                    let _ = ignore(sig);
                }
                let _ = block(&[libc::SIGUSR1]);
                if restore {
                    restore_defaults();
                }
                libc::execv(argv[0], argv.as_ptr());
                libc::_exit(127);
            }
        }
        // SAFETY: the write end is ours to close; the read end becomes a File.
        let mut out = String::new();
        unsafe {
            libc::close(ends[1]);
            std::fs::File::from_raw_fd(ends[0])
                .read_to_string(&mut out)
                .unwrap();
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{status}"
        );
        out
    }

    #[test]
    fn ignored_signals_and_the_mask_do_not_survive_exec_once_restored() {
        let before = exec_status(false);
        // The probe works: without the restore they cross the exec.
        assert!(!before.contains("SigIgn:\t0000000000000000"), "{before}");
        assert!(!before.contains("SigBlk:\t0000000000000000"), "{before}");
        let after = exec_status(true);
        assert!(after.contains("SigIgn:\t0000000000000000"), "{after}");
        assert!(after.contains("SigBlk:\t0000000000000000"), "{after}");
    }
}
