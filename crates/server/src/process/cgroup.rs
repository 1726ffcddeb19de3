//! One control group (cgroup v2) per started process, where the OS offers one.
//!
//! A daemon that double-forks (`(setsid cmd &)`) leaves its process group and
//! session, and once its parent exits it is re-parented to the server: nothing
//! in `/proc` ties it to the process that started it any more. Membership of a
//! cgroup is inherited by every descendant and cannot be left without write
//! access to the hierarchy, so killing a process's cgroup (`cgroup.kill`) takes
//! such daemons with it — on `process/terminate`, session expiry and shutdown.
//!
//! The server makes `exec-server-<pid>-<12 hex>/` below its own cgroup in the first
//! writable cgroup2 mount, and `p<n>/` below that per process (eight made
//! ahead; an emptied one is reused, a killed one never). An unconfined child
//! without caps is born in it (`clone3`, see [`ProcessCgroup::join`]); others
//! join it between fork and exec ([`ProcessCgroup::join_handles`]), which
//! needs a `pre_exec` hook and so a fork. Where there is no writable cgroup2 (no mount, no permission,
//! an unprivileged container), everything here is a no-op and the
//! process-group kill of [`super::kill`] alone applies; [`Cgroups::available`]
//! says which.

use super::resources::Places;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Most empty cgroups kept for reuse: 256.
const POOLED_CGROUPS: usize = 256;
/// Empty cgroups made ahead, at start and whenever a killed one is removed,
/// so a start finds one ready (no `mkdir` on its path): 8.
const PREFILLED_CGROUPS: usize = 8;

/// One server's cgroups: its directory, the empty per-process cgroups kept
/// for reuse, and where memory, task and CPU caps are held. Owned by the
/// server's state, so two servers in one process (embedded ones) each have
/// their own, configured apart; cheap to clone (shared).
#[derive(Clone)]
pub struct Cgroups {
    inner: Arc<Inner>,
}

struct Inner {
    /// `exec-server-<pid>-<12 hex>` below the server's own cgroup; `None`
    /// when per-process cgroups are off or the OS does not let us make one.
    base: Option<PathBuf>,
    /// Empty per-process cgroups kept for reuse: creating and removing a
    /// cgroup takes the kernel's global cgroup lock, which made concurrent
    /// starts several times slower. At most [`POOLED_CGROUPS`].
    pool: Mutex<Vec<Pooled>>,
    next: AtomicU64,
    /// Where each cap is held (see [`super::resources`]).
    places: Places,
}

impl Cgroups {
    /// Makes this server's cgroup directory (sweeping those of dead
    /// servers first) when `enabled` (`--process-cgroups`, on by default)
    /// and the OS allows it; otherwise per-process cgroups are off and
    /// every method is a no-op.
    pub fn new(enabled: bool) -> Cgroups {
        let name = format!(
            "exec-server-{}-{}",
            std::process::id(),
            crate::rundir::short_id()
        );
        let base = enabled.then(|| make_base(&name)).flatten();
        let places = match &base {
            Some(b) => Places::detect(b, &name),
            None => Places::none(),
        };
        let inner = Arc::new(Inner {
            base,
            pool: Mutex::new(Vec::new()),
            next: AtomicU64::new(1),
            places,
        });
        inner.refill();
        Cgroups { inner }
    }

    /// This server's cgroups written down for the next image of the
    /// process (an upgrade); `None` when per-process cgroups are off.
    pub fn parts(&self) -> Option<CgroupsParts> {
        Some(CgroupsParts {
            base: self.inner.base.clone()?,
            next: self.inner.next.load(Ordering::Relaxed),
            pool: self.inner.pool().iter().map(|p| p.dir.clone()).collect(),
        })
    }

    /// The cgroups a previous image of this process made ([`Cgroups::parts`]):
    /// the same directory (its processes stay where they are), pool and
    /// names. Without parts, or with `enabled` off, as [`Cgroups::new`].
    pub fn adopt(enabled: bool, parts: Option<CgroupsParts>) -> Cgroups {
        let Some(parts) = parts.filter(|_| enabled) else {
            return Cgroups::new(enabled);
        };
        let name = parts
            .base
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let places = Places::detect(&parts.base, &name);
        let inner = Arc::new(Inner {
            base: Some(parts.base),
            pool: Mutex::new(parts.pool.into_iter().map(|dir| Pooled { dir }).collect()),
            next: AtomicU64::new(parts.next),
            places,
        });
        inner.refill();
        Cgroups { inner }
    }

    /// The cgroup a previous image of this process gave a process that
    /// still runs ([`ProcessCgroup::parts`]).
    pub fn adopt_process(&self, parts: ProcessCgroupParts) -> ProcessCgroup {
        ProcessCgroup {
            dir: parts.dir,
            caps: parts.caps.map(super::resources::Caps::from_parts),
            owner: self.inner.clone(),
            killed: Arc::new(std::sync::atomic::AtomicBool::new(parts.killed)),
            seen_empty: Default::default(),
        }
    }

    /// True when processes get a cgroup of their own.
    pub fn available(&self) -> bool {
        self.inner.base.is_some()
    }

    /// Where memory, task and CPU caps are held.
    pub fn places(&self) -> &Places {
        &self.inner.places
    }

    /// Creates an empty cgroup for a process about to start; `None` where
    /// cgroups are unavailable (the process-group kill still applies).
    pub fn create(&self) -> Option<ProcessCgroup> {
        self.inner.base.as_ref()?;
        let popped = self.inner.pool().pop();
        let Pooled { dir } = match popped {
            Some(p) => p,
            None => match self.inner.fresh() {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!("cannot make a cgroup: {e}; its daemons escape the cgroup kill");
                    return None;
                }
            },
        };
        Some(ProcessCgroup {
            dir,
            caps: None,
            owner: self.inner.clone(),
            killed: Default::default(),
            seen_empty: Default::default(),
        })
    }

    /// Kills every process in every per-process cgroup and removes the
    /// server's cgroup directories (shutdown). Bounded: gives up on a
    /// directory that stays busy after a few rounds.
    pub fn kill_all_and_remove(&self) {
        self.inner.kill_all_and_remove();
    }
}

impl Inner {
    fn kill_all_and_remove(&self) {
        self.pool().clear();
        if let Some(base) = &self.base {
            kill_and_remove_tree(base);
        }
        self.places.remove_all();
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, Vec<Pooled>> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new empty cgroup below the server's directory.
    fn fresh(&self) -> io::Result<Pooled> {
        let base = self.base.as_ref().ok_or(io::ErrorKind::NotFound)?;
        let dir = base.join(format!("p{}", self.next.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir(&dir)?;
        Ok(Pooled { dir })
    }

    /// Tops the pool up to [`PREFILLED_CGROUPS`] (best effort).
    fn refill(&self) {
        if self.base.is_none() {
            return;
        }
        while self.pool().len() < PREFILLED_CGROUPS {
            match self.fresh() {
                Ok(p) => self.pool().push(p),
                Err(_) => return,
            }
        }
    }
}

/// An empty cgroup ready for a process (no descriptor is held for it: a
/// pool of 256 would hold 256).
struct Pooled {
    dir: PathBuf,
}

/// A server that goes away without a shutdown (an embedded one dropped, a
/// CLI command's embedded server at exit) still ends what it started and
/// leaves no directory behind.
impl Drop for Inner {
    fn drop(&mut self) {
        self.kill_all_and_remove();
    }
}

/// Makes the server's directory `name` below its own cgroup in the first
/// cgroup2 mount, after sweeping those of dead servers there.
fn make_base(name: &str) -> Option<PathBuf> {
    let parent = own_dir(None)?;
    sweep_dead(&parent);
    // Named by pid and a random suffix: a server killed with SIGKILL leaves
    // its directory behind, and a later server given the same pid must not
    // inherit it (its `p<n>` names would clash, and a process whose cgroup
    // cannot be made escapes the cgroup kill).
    let dir = parent.join(name);
    match std::fs::create_dir(&dir) {
        Ok(()) => Some(dir),
        Err(e) => {
            tracing::debug!("no per-process cgroups ({e}); process-group kill only");
            None
        }
    }
}

/// Ends what servers that are gone (killed before they could shut down)
/// left running, and removes their cgroup directories:
/// `exec-server-<pid>[-<suffix>]` whose pid no longer runs. Nothing can
/// reach those processes any more (their sessions died with their server),
/// and left alone they would run on unbounded by any deadline.
pub(super) fn sweep_dead(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("exec-server-")) else {
            continue;
        };
        let pid = rest.split('-').next().unwrap_or("");
        if pid.is_empty() || Path::new("/proc").join(pid).exists() {
            continue;
        }
        kill_and_remove_tree(&entry.path());
    }
}

/// Kills the members of every cgroup below `dir` and removes them, then
/// `dir` itself. Bounded: a member that does not die within 0.5 s keeps its
/// directory until the next sweep.
pub(super) fn kill_and_remove_tree(dir: &Path) {
    for child in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if !child.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let child = child.path();
        for _ in 0..50 {
            kill_members(&child);
            match std::fs::remove_dir(&child) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                _ => break,
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// The directory of this process's cgroup in the cgroup2 mount (`None`), or
/// in the v1 hierarchy that holds `controller`.
pub(super) fn own_dir(controller: Option<&str>) -> Option<PathBuf> {
    let holds = |list: &str| controller.is_some_and(|c| list.split(',').any(|n| n == c));
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // Fields: id parent major:minor root mount-point options... - fstype source super-options
    let mount = mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut r = right.split_whitespace();
        let (fstype, super_opts) = (r.next()?, r.nth(1).unwrap_or(""));
        let wanted = match controller {
            None => fstype == "cgroup2",
            Some(_) => fstype == "cgroup" && holds(super_opts),
        };
        wanted.then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
    })?;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    // Lines: hierarchy-id:controller[,controller...]:path (v2: `0::path`)
    let rel = own.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, names, path) = (f.next()?, f.next()?, f.next()?);
        let wanted = match controller {
            None => names.is_empty(),
            Some(_) => holds(names),
        };
        wanted.then_some(path)
    })?;
    Some(mount.join(rel.trim_start_matches('/')))
}

/// The cgroup of one process. Dropping it removes the directory when it is
/// empty (a live daemon keeps it until it is killed or the server exits).
pub struct ProcessCgroup {
    dir: PathBuf,
    /// Its memory, task and CPU caps, if it has any: such a cgroup is
    /// never pooled (its limits and event counts would carry over).
    caps: Option<super::resources::Caps>,
    /// The server's cgroups, whose pool it returns to.
    owner: Arc<Inner>,
    /// Set once `cgroup.kill` was written (by us, or seen by a child born
    /// killed): such a cgroup is never pooled. Why: this kernel (6.18)
    /// kills every child later born into a cgroup that was ever killed
    /// (`clone3(CLONE_INTO_CGROUP)` compares the cgroup's kill count with
    /// the parent's), so a reused one would kill the next command at once.
    killed: Arc<std::sync::atomic::AtomicBool>,
    /// Set once a read after its process ended showed it empty (see
    /// [`ProcessCgroup::seen_empty_after_exit`]).
    seen_empty: std::sync::atomic::AtomicBool,
}

/// What a cgroup's `cgroup.events` says about its members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Occupancy {
    /// Some process is still in it.
    Populated,
    /// Nothing is in it, and it is not frozen.
    Empty,
    /// It could not be read (gone, broken), or it is frozen: not reused.
    Unreadable,
}

/// A server's [`Cgroups`] written down for an upgrade.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CgroupsParts {
    base: PathBuf,
    next: u64,
    pool: Vec<PathBuf>,
}

/// A [`ProcessCgroup`] written down for an upgrade.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ProcessCgroupParts {
    dir: PathBuf,
    killed: bool,
    caps: Option<super::resources::CapsParts>,
}

impl ProcessCgroup {
    /// Writes the cgroup down for the next image of this process.
    pub fn parts(&self) -> ProcessCgroupParts {
        ProcessCgroupParts {
            dir: self.dir.clone(),
            killed: self.killed.load(Ordering::Relaxed),
            caps: self.caps.as_ref().map(|c| c.parts()),
        }
    }

    /// Writes the memory, task and CPU caps `limits` asks for (see
    /// [`super::resources`]). Errors: a cap that cannot hold, named.
    pub fn set_caps(
        &mut self,
        limits: &exec_server_protocol::types::ProcessLimits,
    ) -> io::Result<()> {
        self.caps = Some(super::resources::Caps::apply(
            limits,
            &self.dir,
            &self.owner.places,
        )?);
        Ok(())
    }

    /// The cap that fired, if one did (read at exit).
    pub fn cap_exceeded(&self) -> Option<exec_server_protocol::types::LimitReason> {
        self.caps.as_ref()?.exceeded()
    }

    /// `cgroup.procs` of its cgroups (the v2 one, then any v1 one its caps
    /// made), opened for writing (close-on-exec). The child writes `0` to
    /// each between fork and exec, so it is a member before it runs a
    /// single instruction of the command: nothing can fork out early.
    pub fn join_handles(&self) -> io::Result<Vec<std::fs::File>> {
        let mut files = vec![std::fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.procs"))?];
        if let Some(caps) = &self.caps {
            files.extend(caps.join_handles()?);
        }
        Ok(files)
    }

    /// How a child joins this cgroup: born in it (its directory, for
    /// `clone3`) when it has no caps; else by the `cgroup.procs` writes of
    /// [`Self::join_handles`] (caps may need cgroup v1 hierarchies too).
    pub fn join(&self) -> io::Result<Join> {
        if self.caps.is_some() {
            return Ok(Join {
                dir: None,
                procs: self.join_handles()?,
                poisoned: None,
            });
        }
        Ok(Join {
            dir: Some(std::fs::File::open(&self.dir)?),
            procs: Vec::new(),
            poisoned: Some(self.killed.clone()),
        })
    }

    /// True when the cgroup can serve another process: seen empty and not
    /// frozen (a cgroup that cannot be read, gone or broken, cannot).
    fn reusable(&self) -> bool {
        if self.caps.is_some() || self.killed.load(Ordering::Relaxed) {
            return false;
        }
        self.seen_empty.load(Ordering::Relaxed) || self.occupancy() == Occupancy::Empty
    }

    /// Records that its process has ended and a read found the cgroup
    /// [`Occupancy::Empty`]: nothing joins a cgroup after its process started
    /// (children are born in it or join before their exec), so it stays
    /// empty, and giving it back needs no second read.
    pub fn seen_empty_after_exit(&self) {
        self.seen_empty.store(true, Ordering::Relaxed);
    }

    /// What one read of its `cgroup.events` says.
    pub fn occupancy(&self) -> Occupancy {
        let Ok(events) = std::fs::read_to_string(self.dir.join("cgroup.events")) else {
            return Occupancy::Unreadable;
        };
        let has = |line: &str| events.lines().any(|l| l.trim() == line);
        if has("populated 1") {
            Occupancy::Populated
        } else if has("populated 0") && !has("frozen 1") {
            Occupancy::Empty
        } else {
            Occupancy::Unreadable
        }
    }

    /// True while some process is still in the cgroup.
    pub fn is_populated(&self) -> bool {
        self.occupancy() == Occupancy::Populated
    }

    /// SIGKILLs every process in the cgroup, daemons included.
    pub fn kill(&self) {
        self.killed.store(true, Ordering::Relaxed);
        kill_members(&self.dir);
    }
}

/// How a child joins its cgroups (see [`ProcessCgroup::join`]).
#[derive(Default)]
pub struct Join {
    /// The cgroup v2 directory to be born in, when that is enough.
    pub dir: Option<std::fs::File>,
    /// `cgroup.procs` files to write `0` to between fork and exec.
    pub procs: Vec<std::fs::File>,
    /// Its cgroup's "never reuse" mark.
    poisoned: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Join {
    /// Marks the cgroup never to be reused: it killed a child born in it.
    pub fn poison(&self) {
        if let Some(p) = &self.poisoned {
            p.store(true, Ordering::Relaxed);
        }
    }

    /// The v2 cgroup's `cgroup.procs`, opened from its directory, for a
    /// start that cannot be born in it (sandboxed, or `clone3` refused);
    /// `None` when [`Self::procs`] already holds what to write to, or it
    /// cannot be opened (the process-group kill still applies).
    pub fn v2_procs(&self) -> Option<std::fs::File> {
        let dir = self.dir.as_ref().filter(|_| self.procs.is_empty())?;
        nix::fcntl::openat(
            dir,
            "cgroup.procs",
            nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .ok()
        .map(std::fs::File::from)
    }
}

/// SIGKILLs every member of the cgroup `dir` (v2 or v1).
pub(super) fn kill_members(dir: &Path) {
    if std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    // Kernels before 5.14 have no cgroup.kill: signal each member.
    if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

impl Drop for ProcessCgroup {
    fn drop(&mut self) {
        if self.reusable() {
            let mut pool = self.owner.pool();
            if pool.len() < POOLED_CGROUPS {
                pool.push(Pooled {
                    dir: std::mem::take(&mut self.dir),
                });
                return;
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
        // Off any start's path: the next start finds a fresh one ready.
        self.owner.refill();
    }
}
