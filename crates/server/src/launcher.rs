//! The launcher thread: the one thread that forks every sandbox, and that
//! makes an upgrade's `execve`.
//!
//! Why one thread: bubblewrap's `--die-with-parent` (`PR_SET_PDEATHSIG`)
//! kills a sandbox when the *thread* that forked it ends, and an `execve`
//! ends every thread of the process but the one that calls it. A sandbox
//! forked by a runtime worker would die at an upgrade. Forked by the thread
//! that also calls `execve`, its parent thread lives on as the next image's
//! main thread. In the binary the launcher *is* the main thread
//! ([`run_here`]), so after any number of upgrades every sandbox's parent
//! thread is still alive. An embedding program gets a launcher thread of
//! its own on first use.

use std::sync::mpsc;
use std::sync::OnceLock;

type Job = Box<dyn FnOnce() + Send>;

static LAUNCHER: OnceLock<mpsc::Sender<Job>> = OnceLock::new();

fn launcher() -> &'static mpsc::Sender<Job> {
    LAUNCHER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name("exec-server-launcher".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            });
        if let Err(e) = spawned {
            // Jobs then run on their callers' threads (see `run`).
            tracing::warn!("no launcher thread ({e}): sandboxes may not survive an upgrade");
        }
        tx
    })
}

/// Runs `job` on the launcher thread and returns what it returns (the
/// caller blocks meanwhile). Where there is no launcher thread, `job` runs
/// on the caller's. A panic in `job` is resumed in the caller.
pub fn run<R: Send + 'static>(job: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::sync_channel(1);
    let wrapped: Job = Box::new(move || {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        let _ = tx.send(result);
    });
    if let Err(mpsc::SendError(job)) = launcher().send(wrapped) {
        job();
    }
    match rx.recv() {
        Ok(Ok(value)) => value,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        // Unreachable: the wrapped job always answers before it is dropped.
        Err(_) => std::panic::resume_unwind(Box::new("the launcher thread ended")),
    }
}

/// Makes the calling thread (the binary's main thread) the launcher, runs
/// `main` on a new thread meanwhile, and returns what `main` returns. If a
/// launcher already exists, `main` simply runs here.
pub fn run_here<R: Send + 'static>(main: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel::<Job>();
    if LAUNCHER.set(tx.clone()).is_err() {
        return main();
    }
    let (done_tx, done_rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("exec-server-main".into())
        .spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(main));
            let _ = done_tx.send(result);
            // Wakes the loop below to see that `main` is done.
            let _ = tx.send(Box::new(|| {}));
        });
    if let Err(e) = spawned {
        panic!("cannot start the server's thread: {e}");
    }
    loop {
        if let Ok(job) = rx.recv() {
            job();
        }
        match done_rx.try_recv() {
            Ok(Ok(value)) => return value,
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(mpsc::TryRecvError::Empty) => {}
            Err(mpsc::TryRecvError::Disconnected) => {
                std::panic::resume_unwind(Box::new("the server's thread ended"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn jobs_run_on_one_thread_and_return_their_values() {
        let a = super::run(|| std::thread::current().id());
        let b = super::run(|| std::thread::current().id());
        assert_eq!(a, b);
        assert_ne!(a, std::thread::current().id());
        assert_eq!(super::run(|| 6 * 7), 42);
    }
}
