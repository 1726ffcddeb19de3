//! A Landlock domain around every confined command, for the boundary seccomp
//! cannot draw: other processes' memory.
//!
//! Why: seccomp denies `ptrace` and `process_vm_*`, but `/proc/PID/mem` is a
//! file. The processes a command can see that run without its filter —
//! bubblewrap's init (PID 1 of the sandbox), the managed-network bridge, or,
//! for a plan without namespaces, this very server — run as the same user,
//! so without more the command could write code into one of them and run
//! it unfiltered (found by an adversarial pass). Landlock allows `ptrace`
//! and everything that checks like it (`/proc/PID/mem`, `pidfd_getfd`,
//! `process_vm_*`) only towards processes in the same domain or a nested
//! one: the command and its descendants, never what started it.
//!
//! The domain restricts nothing else on the file system: it handles only
//! execution and cross-directory renames and links (`REFER`, which every
//! domain denies unless granted) and grants both beneath `/`. Where the
//! kernel can (ABI 6, Linux 6.12+) it also scopes signals: the command cannot
//! signal a process outside its domain (the server included). Landlock ABI 2 (Linux 5.19)
//! or newer is needed (ABI 1 would forbid every cross-directory rename);
//! without it [`enter`] reports [`Unsupported`] and the server says so at
//! start.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const CREATE_RULESET_VERSION: u32 = 1;
const RULE_PATH_BENEATH: u32 = 1;
const ACCESS_FS_EXECUTE: u64 = 1 << 0;
const ACCESS_FS_REFER: u64 = 1 << 13;
/// Lowest ABI used: 2 (`REFER` can be granted).
pub const MIN_ABI: i64 = 2;
/// ABI 6: signals to processes outside the domain can be refused.
const SCOPE_ABI: i64 = 6;
const SCOPE_SIGNAL: u64 = 1 << 1;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    /// ABI 6+; zero (and so accepted) on older kernels.
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// Landlock is missing or older than [`MIN_ABI`] on this kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsupported;

/// The kernel's Landlock ABI version, or `None` without Landlock.
pub fn abi() -> Option<i64> {
    // SAFETY: the version query takes no pointer.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    (v > 0).then_some(v)
}

/// Whether [`enter`] can work here.
pub fn supported() -> bool {
    abi().is_some_and(|v| v >= MIN_ABI)
}

/// Puts the calling (single-threaded) process, and everything it later
/// starts, in a new Landlock domain. Needs `PR_SET_NO_NEW_PRIVS` set first.
///
/// Errors: `Err(Ok(Unsupported))` where Landlock cannot be used; `Err(Err(e))`
/// for a failing call.
pub fn enter() -> Result<(), Result<Unsupported, std::io::Error>> {
    let abi = match abi() {
        Some(v) if v >= MIN_ABI => v,
        _ => return Err(Ok(Unsupported)),
    };
    let access = ACCESS_FS_EXECUTE | ACCESS_FS_REFER;
    let attr = RulesetAttr {
        handled_access_fs: access,
        handled_access_net: 0,
        // No signal to a process outside the sandbox either (the server,
        // whose child a command without namespaces is; bubblewrap's init).
        scoped: if abi >= SCOPE_ABI { SCOPE_SIGNAL } else { 0 },
    };
    // SAFETY: a valid attribute of the size given; the result is checked.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        )
    };
    if fd < 0 {
        return Err(Err(std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor the kernel gave us.
    let ruleset = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: open(2) of a static path.
    let root = unsafe { libc::open(c"/".as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if root < 0 {
        return Err(Err(std::io::Error::last_os_error()));
    }
    // SAFETY: as above.
    let root = unsafe { OwnedFd::from_raw_fd(root) };
    let rule = PathBeneathAttr {
        allowed_access: access,
        parent_fd: root.as_raw_fd(),
    };
    // SAFETY: a valid packed rule; both descriptors live across the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            RULE_PATH_BENEATH,
            &rule as *const PathBeneathAttr,
            0u32,
        )
    };
    if r != 0 {
        return Err(Err(std::io::Error::last_os_error()));
    }
    // SAFETY: restrict_self with a ruleset we own.
    let r = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32) };
    if r != 0 {
        return Err(Err(std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shell in the domain: the test process's memory is out of its
    /// reach (it could open it before), renames across directories work.
    #[test]
    fn the_domain_keeps_the_parent_out_of_reach() {
        use std::os::unix::process::CommandExt;
        if !supported() {
            eprintln!("Landlock ABI >= 2 unavailable: nothing to test");
            return;
        }
        let dir = std::env::temp_dir().join(format!("sbx-domain-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a")).unwrap();
        std::fs::create_dir_all(dir.join("b")).unwrap();
        std::fs::write(dir.join("a/f"), "x").unwrap();
        let script = format!(
            "(exec 3< /proc/{p}/mem) 2>/dev/null && echo opened; mv {d}/a/f {d}/b/f && echo moved; \
             kill -0 {p} 2>/dev/null && echo signalled",
            p = std::process::id(),
            d = dir.display()
        );
        let run = |confined: bool| {
            let mut cmd = std::process::Command::new("/bin/sh");
            cmd.args(["-c", &script]);
            if confined {
                // SAFETY: prctl and the Landlock calls only, between fork and exec.
                unsafe {
                    cmd.pre_exec(|| {
                        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        enter().map_err(|_| std::io::Error::other("landlock"))
                    });
                }
            }
            String::from_utf8(cmd.output().unwrap().stdout).unwrap()
        };
        let scoped = abi().is_some_and(|v| v >= SCOPE_ABI);
        let want = if scoped {
            "moved\n"
        } else {
            "moved\nsignalled\n"
        };
        assert_eq!(run(true), want, "confined");
        std::fs::rename(dir.join("b/f"), dir.join("a/f")).unwrap();
        assert_eq!(
            run(false),
            "opened\nmoved\nsignalled\n",
            "the same shell outside"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
