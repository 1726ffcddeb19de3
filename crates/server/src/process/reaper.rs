//! Child reaping without polling: one SIGCHLD listener calls `waitpid(-1, WNOHANG)`
//! until nothing is left and hands each status to the waiter registered for that pid.
//!
//! The server is made a child subreaper (`PR_SET_CHILD_SUBREAPER`), so descendants
//! orphaned by their parents are re-parented to it rather than to init; they are
//! reaped here too (no zombies) and remain findable for [`super::kill`].
//!
//! Spawning and reaping share one lock: a child cannot be reaped before its waiter
//! is registered, and the standard library's own `waitpid` on a failed `exec` never
//! races with ours.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};
use tokio::sync::oneshot;

/// Exit code for an exit status: the status itself, or 128+N for signal N.
pub fn exit_code(status: nix::sys::wait::WaitStatus) -> Option<i32> {
    use nix::sys::wait::WaitStatus;
    match status {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, sig, _) => Some(128 + sig as i32),
        _ => None,
    }
}

struct Reaper {
    spawn_lock: Mutex<()>,
    waiters: Mutex<HashMap<i32, oneshot::Sender<i32>>>,
}

static REAPER: OnceLock<Reaper> = OnceLock::new();

fn reaper() -> &'static Reaper {
    REAPER.get_or_init(|| Reaper {
        spawn_lock: Mutex::new(()),
        waiters: Mutex::new(HashMap::new()),
    })
}

/// Starts the SIGCHLD listener (once) and makes this process a child subreaper.
/// Call before the first spawn. The listener runs on a thread of its own, so it
/// outlives the runtime that installed it (an embedding program may start and
/// drop several runtimes, as `#[tokio::test]` does).
pub fn install() -> std::io::Result<()> {
    static STARTED: Mutex<bool> = Mutex::new(false);
    let mut started = lock(&STARTED);
    if *started {
        return Ok(());
    }
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("exec-server-reaper".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            runtime.block_on(async move {
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
        })?;
    ready_rx
        .recv()
        .map_err(|_| std::io::Error::other("the reaper thread ended before it started"))??;
    *started = true;
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer flag and no pointers.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
    Ok(())
}

fn reap_all() {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let r = reaper();
    let _spawning = lock(&r.spawn_lock);
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => break,
            Ok(status) => {
                let (Some(pid), Some(code)) = (status.pid(), exit_code(status)) else {
                    continue;
                };
                if let Some(tx) = lock(&r.waiters).remove(&pid.as_raw()) {
                    let _ = tx.send(code);
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `spawn` under the spawn lock and registers a waiter for the pid it returns.
/// The receiver yields the exit code (status or 128+signal).
pub fn spawn_and_watch<T>(
    spawn: impl FnOnce() -> std::io::Result<(T, u32)>,
) -> std::io::Result<(T, oneshot::Receiver<i32>)> {
    let r = reaper();
    let _guard = lock(&r.spawn_lock);
    let (value, pid) = spawn()?;
    let (tx, rx) = oneshot::channel();
    lock(&r.waiters).insert(pid as i32, tx);
    Ok((value, rx))
}
