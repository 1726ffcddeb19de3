//! Waiting for the children this server started, and nothing else.
//!
//! Each child is waited for on its own: a pidfd (`pidfd_open`, Linux 5.3+)
//! becomes readable when it exits, then `waitpid(pid)` collects exactly that
//! child. A program that embeds the server keeps its own children's exit
//! statuses (an embedded server once reaped with `waitpid(-1)` and took them).
//! The waits run on a thread of their own with its own runtime, so they outlive
//! the runtime that spawned the child (an embedding program may start and drop
//! several runtimes, as `#[tokio::test]` does).
//!
//! **Orphan reaping** is for the `exec-server` binary only
//! ([`install`]`(true)`, from `ServerConfig::reap_orphans`): the process
//! becomes a child subreaper (`PR_SET_CHILD_SUBREAPER`), so descendants
//! orphaned by their parents are re-parented to it rather than to init, stay
//! findable for [`crate::process::kill`], and are reaped on `SIGCHLD` with
//! `waitpid(-1)` (no zombies). Whichever wait collects a registered child
//! first hands its status over; the other finds nothing. Spawning and
//! `waitpid(-1)` share one lock: a child cannot be reaped before its waiter
//! is registered, and the standard library's own `waitpid` on a failed `exec`
//! never races with it.

use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use tokio::sync::oneshot;

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// The exit status, or 128+N for signal N.
    pub code: i32,
    /// The signal that ended it, when one did.
    pub signal: Option<nix::sys::signal::Signal>,
}

/// How a child ended, from its wait status; `None` for a status that is not
/// an end (stopped, continued).
pub fn exit_of(status: nix::sys::wait::WaitStatus) -> Option<Exit> {
    use nix::sys::wait::WaitStatus;
    match status {
        WaitStatus::Exited(_, code) => Some(Exit { code, signal: None }),
        WaitStatus::Signaled(_, sig, _) => Some(Exit {
            code: 128 + sig as i32,
            signal: Some(sig),
        }),
        _ => None,
    }
}

struct Reaper {
    spawn_lock: Mutex<()>,
    waiters: Mutex<HashMap<i32, oneshot::Sender<Exit>>>,
    /// The runtime of the waits' thread.
    runtime: tokio::runtime::Handle,
    reaping_orphans: AtomicBool,
}

static REAPER: OnceLock<Reaper> = OnceLock::new();

/// Starts the waits' thread (once). With `reap_orphans` (the binary), also
/// makes this process a child subreaper that reaps every orphan; once on, it
/// stays on for the process. Call before the first spawn.
///
/// Errors: the thread or its runtime cannot be started.
pub fn install(reap_orphans: bool) -> std::io::Result<()> {
    let r = reaper()?;
    if reap_orphans && !r.reaping_orphans.swap(true, Ordering::SeqCst) {
        #[cfg(target_os = "linux")]
        // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer flag and no pointers.
        unsafe {
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        }
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        r.runtime.spawn(async move {
            let kind = tokio::signal::unix::SignalKind::child();
            let mut sigchld = match tokio::signal::unix::signal(kind) {
                Ok(s) => s,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            loop {
                reap_all();
                if sigchld.recv().await.is_none() {
                    break;
                }
            }
        });
        ready_rx
            .recv()
            .map_err(|_| std::io::Error::other("the orphan reaper ended before it started"))??;
    }
    Ok(())
}

/// Whether this process reaps orphans (and so owns every descendant).
pub fn reaping_orphans() -> bool {
    REAPER
        .get()
        .is_some_and(|r| r.reaping_orphans.load(Ordering::SeqCst))
}

fn reaper() -> std::io::Result<&'static Reaper> {
    static STARTING: Mutex<()> = Mutex::new(());
    if let Some(r) = REAPER.get() {
        return Ok(r);
    }
    let _starting = lock(&STARTING);
    if let Some(r) = REAPER.get() {
        return Ok(r);
    }
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("exec-server-reaper".into())
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => {
                    let _ = ready_tx.send(Ok(rt.handle().clone()));
                    rt.block_on(std::future::pending::<()>());
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })?;
    let runtime = ready_rx
        .recv()
        .map_err(|_| std::io::Error::other("the reaper thread ended before it started"))??;
    Ok(REAPER.get_or_init(|| Reaper {
        spawn_lock: Mutex::new(()),
        waiters: Mutex::new(HashMap::new()),
        runtime,
        reaping_orphans: AtomicBool::new(false),
    }))
}

/// Hands `pid`'s end to its waiter, if it still has one.
fn deliver(r: &Reaper, pid: i32, code: Exit) {
    if let Some(tx) = lock(&r.waiters).remove(&pid) {
        let _ = tx.send(code);
    }
}

fn reap_all() {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let Some(r) = REAPER.get() else { return };
    let _spawning = lock(&r.spawn_lock);
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => break,
            Ok(status) => {
                if let (Some(pid), Some(code)) = (status.pid(), exit_of(status)) {
                    deliver(r, pid.as_raw(), code);
                }
            }
        }
    }
}

/// Collects `pid` if it has exited (never blocks); `false` while it runs.
fn reap_one(r: &Reaper, pid: i32) -> bool {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    // Under the spawn lock, as every collecting wait: [`freeze`] then knows
    // that no status is between `waitpid` and its waiter.
    let _collecting = lock(&r.spawn_lock);
    match waitpid(nix::unistd::Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::StillAlive) => false,
        Ok(status) => {
            if let Some(code) = exit_of(status) {
                deliver(r, pid, code);
            }
            true
        }
        // Collected already (by the orphan reaper), or not our child.
        Err(_) => true,
    }
}

/// Holds every wait that collects a child (and every spawn) until dropped,
/// so an upgrade hands over each child either still waitable or with its
/// status already delivered (`Err` only where the reaper cannot start).
pub fn freeze() -> std::io::Result<MutexGuard<'static, ()>> {
    Ok(lock(&reaper()?.spawn_lock))
}

/// Waits for `pid`, a child a previous image of this process started (an
/// upgrade; the pid stays this process's child across `execve`). Call it
/// before [`install`] turns orphan reaping on, or the orphan reaper could
/// collect the child first. Errors: the reaper cannot start.
pub fn adopt(pid: u32) -> std::io::Result<oneshot::Receiver<Exit>> {
    let r = reaper()?;
    let (tx, rx) = oneshot::channel();
    {
        let _guard = lock(&r.spawn_lock);
        lock(&r.waiters).insert(pid as i32, tx);
    }
    watch(r, pid as i32, None);
    Ok(rx)
}

fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor the kernel gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Waits for `pid` on the waits' thread: its pidfd (`pidfd` when the spawn
/// made one, else opened here), or (kernels before 5.3) a blocking `waitpid`
/// on a thread of its own.
fn watch(r: &'static Reaper, pid: i32, pidfd: Option<OwnedFd>) {
    match pidfd.map_or_else(|| pidfd_open(pid), Ok) {
        Ok(fd) => {
            r.runtime.spawn(async move {
                // SAFETY: the AsyncFd owns the pidfd and deregisters it before it
                // is closed (on drop); nothing else holds the descriptor.
                let registered = unsafe {
                    tokio::io::unix::AsyncFd::register_with_interest(
                        fd,
                        tokio::io::Interest::READABLE,
                    )
                };
                let afd = match registered {
                    Ok(a) => a,
                    Err(_) => return blocking_wait(r, pid),
                };
                loop {
                    match afd.readable().await {
                        Ok(mut ready) => {
                            if reap_one(r, pid) {
                                return;
                            }
                            ready.clear_ready();
                        }
                        Err(_) => return blocking_wait(r, pid),
                    }
                }
            });
        }
        Err(_) => blocking_wait(r, pid),
    }
}

fn blocking_wait(r: &'static Reaper, pid: i32) {
    let spawned = std::thread::Builder::new()
        .name("exec-server-wait".into())
        .spawn(move || {
            use nix::sys::wait::waitpid;
            if let Ok(status) = waitpid(nix::unistd::Pid::from_raw(pid), None) {
                if let Some(code) = exit_of(status) {
                    deliver(r, pid, code);
                }
            }
        });
    if spawned.is_err() {
        tracing::warn!(pid, "cannot start a thread to wait for a child");
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// [`spawn_and_watch`] of a standard-library command: the child and the
/// receiver of how it ended. Errors: the spawn's.
pub fn spawn_command(
    cmd: &mut std::process::Command,
) -> std::io::Result<(std::process::Child, oneshot::Receiver<Exit>)> {
    spawn_and_watch(|| {
        let child = cmd.spawn()?;
        let pid = child.id();
        Ok::<_, std::io::Error>((child, pid))
    })
}

/// Runs `spawn` under the spawn lock, registers a waiter for the pid it
/// returns and starts waiting for that child alone. The receiver yields how
/// it ended ([`Exit`]).
///
/// Errors: `spawn`'s (of any type that can also carry an OS error), or the
/// waits' thread cannot be started.
pub fn spawn_and_watch<T, E: From<std::io::Error>>(
    spawn: impl FnOnce() -> Result<(T, u32), E>,
) -> Result<(T, oneshot::Receiver<Exit>), E> {
    spawn_with_pidfd_and_watch(|| spawn().map(|(value, pid)| (value, pid, None)))
}

/// [`spawn_and_watch`] for a spawn that also returns the child's pidfd
/// (`clone3` with `CLONE_PIDFD`): the wait uses it, and opens none.
pub fn spawn_with_pidfd_and_watch<T, E: From<std::io::Error>>(
    spawn: impl FnOnce() -> Result<(T, u32, Option<OwnedFd>), E>,
) -> Result<(T, oneshot::Receiver<Exit>), E> {
    let r = reaper()?;
    let (value, pid, pidfd) = {
        let _guard = lock(&r.spawn_lock);
        let (value, pid, pidfd) = spawn()?;
        let (tx, rx) = oneshot::channel();
        lock(&r.waiters).insert(pid as i32, tx);
        ((value, rx), pid, pidfd)
    };
    watch(r, pid as i32, pidfd);
    Ok(value)
}
