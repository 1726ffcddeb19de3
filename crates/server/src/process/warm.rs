//! Sandboxes prepared ahead ("warm", [`exec_server_sandbox::warm`]): after a
//! sandboxed start, the next bubblewrap sandboxes with the same plan, working
//! directory and stdin mode are started at once (two, or up to four while
//! starts come back to back), their inner stage waiting on a pipe; the next
//! start that matches takes one and only sends its command.
//! bubblewrap's set-up, the network namespace, the inner stage's exec and the
//! seccomp filter are then off the start's path.
//!
//! Why a warm sandbox confines exactly as a cold one (SANDBOX.md "Sandboxes
//! prepared ahead"): it is built from the same plan by the same code, and the
//! plan is resolved again for the start that takes it and must be equal
//! ([`PlanKey`]: mounts, placeholders, seccomp mode, network, proxy route),
//! as must the working directory and stdin mode; it serves one command and
//! is never reused, so no command shares its PID namespace, `/tmp` or
//! mounts with another; the command's environment and arguments arrive
//! whole in the message and nothing of them is in the sandbox before.
//! What differs is the time its view was made: at most [`MAX_AGE`] earlier.
//!
//! Only pipe-mode starts without caps and without a network proxy of their
//! own take a warm sandbox (a PTY is made per start; caps are written into
//! the cgroup before the child joins it; each proxied start has its own
//! proxy and route, so no later start could take one made for it).

use super::cgroup::{Cgroups, ProcessCgroup};
use super::plan::{Exec, Io};
use super::spawn::{self, ChildIo, Started};
use crate::reaper::Exit;
use crate::sandbox::{Confinement, StartSandbox};
use exec_server_sandbox::PlanKey;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// Longest a warm sandbox waits for its command before it is ended: 30 s
/// (its placeholders, empty read-only directories standing for absent
/// protected names, exist on the host meanwhile).
pub const MAX_AGE: Duration = Duration::from_secs(30);

/// Longest [`Pool::drain`] waits for the warm sandboxes to exit: 2 s.
const DRAIN_BOUND: Duration = Duration::from_secs(2);

/// The warm sandboxes of one server. Cheap to share (`Arc`).
#[derive(Default)]
pub struct Pool {
    /// Most kept at once (`--warm-sandboxes`); 0 turns them off.
    capacity: usize,
    state: Mutex<State>,
    next_id: AtomicU64,
    /// Set at shutdown and at an upgrade: no warm sandbox is kept after.
    closed: std::sync::atomic::AtomicBool,
}

/// Warm sandboxes kept for one key to begin with: 2, so starts an agent
/// makes between its turns find one ready while the next is being made.
const PER_KEY: usize = 2;

/// Most kept for one key: 4. A sandbox takes several milliseconds to make
/// and most of that is waiting in the kernel, not computing, so starts
/// that come back to back outrun two being made at a time; four being made
/// at once keep up on two cores (BENCHMARKS.md "Sandboxed spawn, a deeper
/// pool for a burst").
const MAX_PER_KEY: usize = 4;

/// Two takes of one key this close together, the second finding its
/// sandbox still setting up, are a burst: the key's depth grows by one.
const BURST_GAP: Duration = Duration::from_secs(1);

/// Most keys whose demand is remembered: 64.
const MAX_DEMAND_RECORDS: usize = 64;

/// The pool's entries, the keys of those being made, and how deep each
/// key's supply is kept.
#[derive(Default)]
struct State {
    entries: Vec<Entry>,
    making: Vec<Key>,
    demand: Vec<Demand>,
}

/// How many warm sandboxes one key keeps, grown by bursts of starts and
/// reset to [`PER_KEY`] when one of its sandboxes waits [`MAX_AGE`] unused.
struct Demand {
    key: Key,
    depth: usize,
    last_take: std::time::Instant,
}

impl State {
    /// Warm sandboxes kept for `key`: [`PER_KEY`] unless a burst deepened it.
    fn depth(&self, key: &Key) -> usize {
        self.demand
            .iter()
            .find(|d| d.key == *key)
            .map_or(PER_KEY, |d| d.depth)
    }

    /// Notes a take of `key`; `waited` when the sandbox taken was still
    /// setting up. Two takes within [`BURST_GAP`], the second waiting,
    /// deepen the key's supply by one, up to [`MAX_PER_KEY`].
    fn took(&mut self, key: &Key, waited: bool) {
        let now = std::time::Instant::now();
        match self.demand.iter_mut().find(|d| d.key == *key) {
            Some(d) => {
                if waited && now.duration_since(d.last_take) < BURST_GAP {
                    d.depth = (d.depth + 1).min(MAX_PER_KEY);
                }
                d.last_take = now;
            }
            None => {
                // Keys whose sandboxes were displaced never expire: the
                // least recently taken record goes first.
                if self.demand.len() >= MAX_DEMAND_RECORDS {
                    let oldest = (0..self.demand.len()).min_by_key(|&i| self.demand[i].last_take);
                    oldest.map(|i| self.demand.swap_remove(i));
                }
                self.demand.push(Demand {
                    key: key.clone(),
                    depth: PER_KEY,
                    last_take: now,
                });
            }
        }
    }

    /// A sandbox of `key` waited unused until it expired: the burst is
    /// over, and the key's record goes.
    fn idle(&mut self, key: &Key) {
        self.demand.retain(|d| d.key != *key);
    }
}

/// What a warm sandbox was made for.
#[derive(Clone, PartialEq, Eq)]
struct Key {
    plan: PlanKey,
    cwd: PathBuf,
    stdin: bool,
}

/// One warm sandbox: a running bubblewrap whose inner stage waits.
struct Entry {
    id: u64,
    key: Key,
    pid: u32,
    io: Option<ChildIo>,
    exit: Option<oneshot::Receiver<Exit>>,
    /// The message pipe's write end; closing it unused ends the sandbox.
    message: Option<OwnedFd>,
    /// The reply pipe's read end ([`exec_server_sandbox::warm::INTACT`]).
    reply: OwnedFd,
    /// Its inner stage said it waits ([`exec_server_sandbox::warm::READY`]).
    ready: bool,
    confinement: Option<Confinement>,
    cgroup: Option<ProcessCgroup>,
}

/// A start served by a warm sandbox: the child and the cgroup it was born in.
pub struct Served {
    /// The started child.
    pub started: Started,
    /// Its per-process cgroup, when cgroups are on.
    pub cgroup: Option<ProcessCgroup>,
}

impl Pool {
    /// A pool keeping at most `capacity` warm sandboxes (0: none).
    pub fn new(capacity: usize) -> Arc<Pool> {
        Arc::new(Pool {
            capacity,
            ..Pool::default()
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves `exec` confined by `sandbox` from a matching warm sandbox
    /// still waiting, sending it the command; `None` when there is none or
    /// the command does not suit one (a PTY, a NUL byte, a message over the
    /// bound, a missing cwd or program): the start then takes the cold way,
    /// which reports any error as usual.
    pub fn take(&self, exec: &Exec, sandbox: &StartSandbox) -> Option<Served> {
        if self.capacity == 0 {
            return None;
        }
        let Io::Pipes { stdin } = exec.io else {
            return None;
        };
        // Resolving the plan scans the writable roots: not for nothing.
        if self.state().entries.is_empty() {
            return None;
        }
        let cwd = exec.cwd.as_path();
        if !std::fs::metadata(cwd).is_ok_and(|m| m.is_dir()) {
            return None;
        }
        let program = spawn::resolve_program(&exec.argv[0], &exec.env, cwd).ok()?;
        let key = Key {
            plan: sandbox.plan(&exec.env).ok()?.key(),
            cwd: exec.cwd.clone(),
            stdin,
        };
        let arg0 = exec.arg0.as_deref().unwrap_or(&exec.argv[0]);
        let argv = std::iter::once(arg0).chain(exec.argv[1..].iter().map(String::as_str));
        let argv: Vec<&str> = argv.collect();
        let env = exec.env.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        let message =
            exec_server_sandbox::warm::encode(program.as_os_str(), argv.into_iter(), env)?;
        let mut entry = {
            let mut state = self.state();
            // One set up already, else the oldest (its set-up is the
            // furthest along).
            let mut first = None;
            let mut ready = None;
            for (i, e) in state.entries.iter_mut().enumerate() {
                if e.key != key {
                    continue;
                }
                first = first.or(Some(i));
                if e.ready || poll_ready(e) {
                    ready = Some(i);
                    break;
                }
            }
            let at = ready.or(first)?;
            state.took(&key, ready.is_none());
            state.entries.remove(at)
        };
        // Ended while it waited (its set-up failed, or it was killed): the
        // cold way says why, if anything is wrong.
        let alive = entry
            .exit
            .as_mut()
            .is_some_and(|rx| matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Empty)));
        if !alive {
            // try_recv consumed its exit: a receiver polled again after that
            // panics, so the drop must not wait on it (it has exited).
            entry.exit = None;
            return None;
        }
        let pipe = entry.message.take()?;
        // The pipe is empty and has room for the largest message: one write.
        match nix::unistd::write(&pipe, &message) {
            Ok(n) if n == message.len() => {}
            _ => return None,
        }
        drop(pipe);
        // The reply may take a while (a sandbox still setting up, a loaded
        // host; at most REPLY_BOUND_MS): the runtime's other tasks move to
        // another worker meanwhile instead of waiting behind this start.
        let intact = match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| confirmed(&entry))
            }
            _ => confirmed(&entry),
        };
        if !intact {
            return None;
        }
        let started = Started {
            pid: entry.pid,
            io: entry.io.take()?,
            exit: entry.exit.take()?,
            confinement: entry.confinement.take(),
        };
        Some(Served {
            started,
            cgroup: entry.cgroup.take(),
        })
    }

    /// Starts, in the background, warm sandboxes for the next starts like
    /// `exec` under `sandbox`, up to the key's depth ([`PER_KEY`], more in
    /// a burst: [`MAX_PER_KEY`]) waiting or being made, unless warm
    /// sandboxes are off. Best effort: a failure only means the
    /// next start takes the cold way.
    pub fn prepare_next(self: &Arc<Self>, exec: &Exec, sandbox: &StartSandbox, cgroups: &Cgroups) {
        let Io::Pipes { stdin } = exec.io else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.capacity == 0 {
            return;
        }
        let (pool, sandbox, cgroups) = (self.clone(), sandbox.clone(), cgroups.clone());
        let (env, cwd) = (exec.env.clone(), exec.cwd.clone());
        let expiry = runtime.clone();
        runtime.spawn_blocking(move || {
            for _ in 0..MAX_PER_KEY {
                let id = pool.next_id.fetch_add(1, Ordering::Relaxed);
                match pool.make(id, &sandbox, &env, cwd.clone(), stdin, &cgroups) {
                    Ok(true) => {
                        let pool = Arc::downgrade(&pool);
                        expiry.spawn(async move {
                            tokio::time::sleep(MAX_AGE).await;
                            if let Some(pool) = pool.upgrade() {
                                pool.expire(id);
                            }
                        });
                    }
                    Ok(false) => return,
                    Err(e) => {
                        tracing::debug!("no warm sandbox prepared: {e}");
                        return;
                    }
                }
            }
        });
    }

    /// Makes one warm sandbox and keeps it, ending the oldest ready one
    /// when those waiting and being made would exceed the capacity;
    /// `Ok(false)` when as many as the key's depth wait or are being made
    /// already, when the capacity's worth are still setting up, or the plan
    /// has no namespaces. Errors: the sandbox's preparation or spawn.
    fn make(
        &self,
        id: u64,
        sandbox: &StartSandbox,
        env: &std::collections::BTreeMap<String, String>,
        cwd: PathBuf,
        stdin: bool,
        cgroups: &Cgroups,
    ) -> std::io::Result<bool> {
        let plan = sandbox.plan(env)?;
        let key = Key {
            plan: plan.key(),
            cwd,
            stdin,
        };
        let displaced = {
            let mut state = self.state();
            let waiting = state.entries.iter().filter(|e| e.key == key).count();
            let making = state.making.iter().filter(|k| **k == key).count();
            if waiting + making >= state.depth(&key) {
                return Ok(false);
            }
            // Sandboxes still setting up count against the bound, and only
            // a ready one makes room: one displaced mid-set-up would finish
            // it before it saw its pipe closed, so a burst of starts in many
            // directories would set up several times the bound at once, all
            // competing with the starts for the CPU.
            let mut setting_up = state.making.len();
            for e in state.entries.iter_mut() {
                if !(e.ready || poll_ready(e)) {
                    setting_up += 1;
                }
            }
            if setting_up >= self.capacity {
                return Ok(false);
            }
            let displaced = if state.entries.len() + state.making.len() >= self.capacity {
                // The oldest ready one; there is one, since fewer than the
                // capacity are setting up.
                let at = state.entries.iter().position(|e| e.ready);
                at.map(|at| state.entries.remove(at))
            } else {
                None
            };
            state.making.push(key.clone());
            displaced
        };
        // Ended outside the lock (closing its pipe ends it at once).
        drop(displaced);
        let made = Self::spawn(id, key.clone(), sandbox, plan, cgroups);
        let evicted = {
            let mut state = self.state();
            if let Some(at) = state.making.iter().position(|k| *k == key) {
                state.making.remove(at);
            }
            match made {
                Ok(Some(entry)) if !self.closed.load(Ordering::Relaxed) => {
                    state.entries.push(entry);
                    (state.entries.len() > self.capacity).then(|| state.entries.remove(0))
                }
                Ok(entry) => entry,
                Err(e) => return Err(e),
            }
        };
        let kept = evicted.as_ref().is_none_or(|e| e.id != id);
        drop(evicted);
        Ok(kept)
    }

    /// Spawns one warm sandbox for `plan`; `None` for a plan without
    /// namespaces.
    fn spawn(
        id: u64,
        key: Key,
        sandbox: &StartSandbox,
        plan: exec_server_sandbox::Plan,
        cgroups: &Cgroups,
    ) -> std::io::Result<Option<Entry>> {
        let Some(warm) = sandbox.prepare_warm(plan, &key.cwd)? else {
            return Ok(None);
        };
        let cgroup = cgroups.create();
        let join = cgroup
            .as_ref()
            .and_then(|g| g.join().ok())
            .unwrap_or_default();
        let procs = join.v2_procs();
        let cgroup_fds = join
            .procs
            .iter()
            .chain(&procs)
            .map(std::os::fd::AsRawFd::as_raw_fd)
            .collect();
        let exec_server_sandbox::Warm {
            prepared,
            message,
            reply,
        } = warm;
        // The command's environment comes with its message.
        let command = prepared.command;
        let stdin = key.stdin;
        let io = Io::Pipes { stdin };
        let born = super::born::sandbox_born_in_cgroup(&command, &prepared.hooks, io, &join);
        let (pid, io, exit) = match born {
            Some(spawned) => spawned?,
            None => crate::launcher::run(move || spawn::on_pipes(command, stdin, cgroup_fds))?,
        };
        drop(prepared.fds);
        let confinement = sandbox.confinement(prepared.guard, pid, prepared.confined);
        Ok(Some(Entry {
            id,
            key,
            pid,
            io: Some(io),
            exit: Some(exit),
            message: Some(message),
            reply,
            ready: false,
            confinement: Some(confinement),
            cgroup,
        }))
    }

    /// Ends warm sandbox `id` if it still waits, unused for [`MAX_AGE`]:
    /// its key's burst, if any, is over.
    fn expire(&self, id: u64) {
        let gone = {
            let mut state = self.state();
            let at = state.entries.iter().position(|e| e.id == id);
            at.map(|at| {
                let gone = state.entries.remove(at);
                state.idle(&gone.key);
                gone
            })
        };
        drop(gone);
    }

    /// Ends every warm sandbox now and keeps none after (shutdown).
    pub fn close(&self) {
        drop(self.close_entries());
    }

    fn close_entries(&self) -> Vec<Entry> {
        let mut state = self.state();
        self.closed.store(true, Ordering::Relaxed);
        std::mem::take(&mut state.entries)
    }

    /// Ends every warm sandbox, keeps none after, and waits (at most 2 s) until each has
    /// exited (shutdown, and before an upgrade: nothing unknown to the next
    /// image is left running).
    pub async fn drain(&self) {
        let entries = self.close_entries();
        let mut exits = Vec::new();
        let mut held = Vec::new();
        for mut e in entries {
            e.message = None;
            exits.extend(e.exit.take());
            // The cgroup and placeholders are released once it has exited.
            held.push((e.cgroup.take(), e.confinement.take()));
        }
        let all = async {
            for rx in exits {
                let _ = rx.await;
            }
        };
        let _ = tokio::time::timeout(DRAIN_BOUND, all).await;
        drop(held);
    }
}

/// Longest a start waits for a warm sandbox's reply: 10 s (it may still be
/// setting up; on a loaded machine that can take a while).
const REPLY_BOUND_MS: u16 = 10_000;

/// Whether `entry`'s inner stage has said it waits; reads that byte if
/// it is there, never blocks.
fn poll_ready(entry: &mut Entry) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(entry.reply.as_fd(), PollFlags::POLLIN)];
    if !matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0) {
        return false;
    }
    let mut byte = [0u8; 1];
    entry.ready = matches!(nix::unistd::read(entry.reply.as_fd(), &mut byte), Ok(1))
        && byte[0] == exec_server_sandbox::warm::READY;
    entry.ready
}

/// Whether the command sent to `entry` runs there: its inner stage replied
/// that the sandbox's mounts are intact. `false` (a stale sandbox, or one
/// that ended before it read the command) guarantees the command did not
/// run, so the start may take the cold way. No reply within the bound
/// counts as running: a command must never run twice.
fn confirmed(entry: &Entry) -> bool {
    use exec_server_sandbox::warm::{INTACT, READY};
    use nix::errno::Errno;
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let deadline = std::time::Instant::now() + Duration::from_millis(REPLY_BOUND_MS.into());
    // READY (unless read already), then the answer; a signal to this thread
    // (a child's SIGCHLD) interrupts a wait without ending it.
    let mut reads = 0;
    while reads < 2 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let left = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(entry.reply.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, left) {
            Ok(n) if n > 0 => {}
            Err(Errno::EINTR) => continue,
            _ => {
                tracing::warn!(
                    pid = entry.pid,
                    "a warm sandbox did not reply in time; served as is"
                );
                return true;
            }
        }
        let mut byte = [0u8; 1];
        match nix::unistd::read(entry.reply.as_fd(), &mut byte) {
            Err(Errno::EINTR) => continue,
            Ok(1) if byte[0] == READY => reads += 1,
            Ok(1) if byte[0] == INTACT => return true,
            Ok(1) => {
                tracing::info!(
                    pid = entry.pid,
                    "a warm sandbox went stale (a mount of it is gone)"
                );
                return false;
            }
            // It ended before it read the command.
            Ok(_) => return false,
            Err(_) => return true,
        }
    }
    true
}

impl Drop for Entry {
    /// Closing the message pipe unused makes the inner stage exit 0; the
    /// cgroup and the placeholders are kept until the sandbox has exited,
    /// so the cgroup can be reused and no placeholder vanishes under it.
    fn drop(&mut self) {
        self.message = None;
        let (exit, cgroup, confinement) = (
            self.exit.take(),
            self.cgroup.take(),
            self.confinement.take(),
        );
        let Some(exit) = exit else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = exit.await;
                drop((cgroup, confinement));
            });
        } else {
            let pid = nix::unistd::Pid::from_raw(self.pid as i32);
            let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}
