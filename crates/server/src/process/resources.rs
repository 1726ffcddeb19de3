//! Memory, task and CPU caps for a process's whole tree (`limits.memoryBytes`,
//! `limits.maxTasks`, `limits.cpuPercent`), held by the kernel through cgroups.
//!
//! A cap holds for everything the process starts, daemons included, because
//! cgroup membership is inherited and cannot be left. Two places can hold one:
//!
//! - the per-process cgroup v2 of [`super::cgroup`], when the server's cgroup
//!   has the controller (`memory`, `pids`, `cpu` in its `cgroup.controllers`,
//!   i.e. delegated to it): the controllers are enabled once in the subtree
//!   of the server's directory, and a capped cgroup is never pooled for reuse
//!   (its limits and event counts would carry over);
//! - otherwise the controller's cgroup v1 hierarchy, on hosts with systemd's
//!   hybrid layout (v2 mounted, the controllers still on v1), when it is
//!   mounted and writable: a cgroup there per capped process, which the child
//!   joins between fork and exec next to its v2 one, removed with it.
//!
//! Both need the v2 cgroup (it is what kills the tree). Where neither place
//! holds a cap, [`unavailable`] names it and the request is refused: a cap is
//! never pretended. What fired is read from the cgroup's own counters when
//! the process exits ([`Caps::exceeded`]).

use exec_server_protocol::types::{LimitReason, ProcessLimits};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// One kind of cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    /// `memory`: `limits.memoryBytes`.
    Memory,
    /// `pids`: `limits.maxTasks`.
    Pids,
    /// `cpu`: `limits.cpuPercent`.
    Cpu,
}

impl Controller {
    const ALL: [Controller; 3] = [Controller::Memory, Controller::Pids, Controller::Cpu];

    /// The kernel's name of the controller (the same in v1 and v2).
    fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
        }
    }

    /// The `limits` member it holds.
    pub fn member(self) -> &'static str {
        match self {
            Controller::Memory => "memoryBytes",
            Controller::Pids => "maxTasks",
            Controller::Cpu => "cpuPercent",
        }
    }

    /// The `environmentInfo.capabilities` key that says it holds here.
    pub fn capability(self) -> &'static str {
        match self {
            Controller::Memory => "processMemoryLimit",
            Controller::Pids => "processTasksLimit",
            Controller::Cpu => "processCpuLimit",
        }
    }

    fn asked(self, limits: &ProcessLimits) -> Option<u64> {
        match self {
            Controller::Memory => limits.memory_bytes,
            Controller::Pids => limits.max_tasks,
            Controller::Cpu => limits.cpu_percent,
        }
    }
}

/// Where a controller's caps are written.
#[derive(Debug)]
enum Place {
    /// In the process's own v2 cgroup.
    V2,
    /// In a cgroup of its own below this server directory of a v1 hierarchy.
    V1(PathBuf),
}

/// Where each cap is held for one server, found when its cgroups are made
/// (see [`super::cgroup::Cgroups::places`]).
#[derive(Debug)]
pub struct Places([Option<Place>; 3]);

impl Places {
    /// No cap holds (per-process cgroups off or unavailable).
    pub fn none() -> Places {
        Places([None, None, None])
    }

    /// Finds where each cap can be held for the server whose v2 directory
    /// is `v2` (named `name`, the same name used in the v1 hierarchies).
    pub fn detect(v2: &Path, name: &str) -> Places {
        Places(Controller::ALL.map(|c| find_place(c, v2, name)))
    }

    fn place(&self, c: Controller) -> Option<&Place> {
        self.0[c as usize].as_ref()
    }

    /// True when `controller`'s caps hold on this server.
    pub fn available(&self, controller: Controller) -> bool {
        self.place(controller).is_some()
    }

    /// The capability keys of the caps, each with whether it holds here.
    pub fn capabilities(&self) -> [(&'static str, bool); 3] {
        Controller::ALL.map(|c| (c.capability(), self.available(c)))
    }

    /// Checks the caps `limits` asks for: each at least its minimum (1 MiB
    /// of memory, 1 task, 1 % of a CPU) and each holding on this server.
    /// The error names the member and, for one that cannot hold, why.
    pub fn check(&self, limits: &ProcessLimits) -> Result<(), String> {
        for c in Controller::ALL {
            let Some(v) = c.asked(limits) else { continue };
            let min = match c {
                Controller::Memory => MIN_MEMORY_BYTES,
                _ => 1,
            };
            if v < min {
                return Err(format!("limits.{} must be at least {min}", c.member()));
            }
            let max = match c {
                Controller::Memory => MAX_MEMORY_BYTES,
                Controller::Pids => MAX_TASKS,
                Controller::Cpu => MAX_CPU_PERCENT,
            };
            if v > max {
                return Err(format!("limits.{} must be at most {max}", c.member()));
            }
            if !self.available(c) {
                return Err(unavailable(c));
            }
        }
        Ok(())
    }

    /// Removes the server's v1 directories (shutdown, after the tree
    /// kill): what a live member kept is retried a few rounds.
    pub fn remove_all(&self) {
        for p in self.0.iter().flatten() {
            if let Place::V1(base) = p {
                super::cgroup::kill_and_remove_tree(base);
            }
        }
    }
}

fn find_place(c: Controller, v2: &Path, name: &str) -> Option<Place> {
    let offered = std::fs::read_to_string(v2.join("cgroup.controllers")).unwrap_or_default();
    if offered.split_whitespace().any(|n| n == c.name())
        && std::fs::write(v2.join("cgroup.subtree_control"), format!("+{}", c.name())).is_ok()
    {
        return Some(Place::V2);
    }
    let own = super::cgroup::own_dir(Some(c.name()))?;
    super::cgroup::sweep_dead(&own);
    let dir = own.join(name);
    match std::fs::create_dir(&dir) {
        // It exists when a previous image of this process (an upgrade)
        // made it: `name` carries the pid and a random suffix.
        Ok(()) => Some(Place::V1(dir)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Some(Place::V1(dir)),
        Err(e) => {
            tracing::debug!("no {} cap ({}: {e})", c.member(), dir.display());
            None
        }
    }
}

/// Why `controller`'s cap cannot hold here.
pub fn unavailable(c: Controller) -> String {
    format!(
        "limits.{} cannot be held on this server: no `{}` cgroup controller is delegated to it \
         (cgroup v2) nor writable (cgroup v1), or per-process cgroups are off \
         (capability {} is false)",
        c.member(),
        c.name(),
        c.capability()
    )
}

/// Smallest `limits.memoryBytes`: 1 MiB (less cannot even start a shell).
pub const MIN_MEMORY_BYTES: u64 = 1024 * 1024;
/// Largest `limits.memoryBytes`: 2^53 (8 PiB; a cgroup takes no more).
pub const MAX_MEMORY_BYTES: u64 = 1 << 53;
/// Largest `limits.maxTasks`: 4 194 304, the kernel's most pids.
pub const MAX_TASKS: u64 = 4_194_304;
/// Largest `limits.cpuPercent`: 1 048 576 (10 486 CPUs).
pub const MAX_CPU_PERCENT: u64 = 1 << 20;
/// The CPU cap's accounting period: 100 ms, the kernel's default.
const CPU_PERIOD_US: u64 = 100_000;

/// True when `limits` asks for any cap.
pub fn any(limits: Option<&ProcessLimits>) -> bool {
    limits.is_some_and(|l| Controller::ALL.iter().any(|c| c.asked(l).is_some()))
}

/// The caps of one process, written before it starts. Dropping it removes
/// its v1 cgroups (a live member keeps one until the shutdown sweep).
#[derive(Debug, Default)]
pub struct Caps {
    /// Its v1 cgroups, one per capped controller held on v1.
    v1: Vec<PathBuf>,
    /// Where to read whether a cap fired: (file, key, reason).
    counters: Vec<(PathBuf, &'static str, LimitReason)>,
}

impl Caps {
    /// Writes the caps `limits` asks for: into `v2` (the process's v2
    /// cgroup) or into v1 cgroups made for it. Errors: a cap that cannot
    /// hold here, or a cgroup file that refused it (named).
    pub fn apply(limits: &ProcessLimits, v2: &Path, places: &Places) -> io::Result<Caps> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let mut caps = Caps::default();
        for c in Controller::ALL {
            let Some(value) = c.asked(limits) else {
                continue;
            };
            let (dir, v1) = match places.place(c) {
                Some(Place::V2) => (v2.to_path_buf(), false),
                Some(Place::V1(base)) => {
                    let dir = fresh_dir(base, &NEXT)?;
                    caps.v1.push(dir.clone());
                    (dir, true)
                }
                None => return Err(io::Error::other(unavailable(c))),
            };
            write_cap(c, value, &dir, v1)?;
            match c {
                Controller::Memory => caps.counters.push((
                    dir.join(if v1 {
                        "memory.oom_control"
                    } else {
                        "memory.events"
                    }),
                    "oom_kill",
                    LimitReason::MemoryLimit,
                )),
                Controller::Pids => {
                    caps.counters
                        .push((dir.join("pids.events"), "max", LimitReason::TasksLimit))
                }
                Controller::Cpu => {}
            }
        }
        Ok(caps)
    }

    /// `cgroup.procs` of each v1 cgroup, opened for writing: the child
    /// writes `0` to each between fork and exec.
    pub fn join_handles(&self) -> io::Result<Vec<std::fs::File>> {
        self.v1
            .iter()
            .map(|d| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(d.join("cgroup.procs"))
            })
            .collect()
    }

    /// The cap that fired, if one did: the memory cap when the OOM killer
    /// ended a member, else the task cap when a fork was refused at it.
    pub fn exceeded(&self) -> Option<LimitReason> {
        self.counters.iter().find_map(|(file, key, reason)| {
            let text = std::fs::read_to_string(file).ok()?;
            let count = text.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == *key).then(|| v.trim().parse::<u64>().ok())?
            })?;
            (count > 0).then_some(*reason)
        })
    }
}

/// A new directory `p<n>` below `base`, `n` from `next`. Names a previous
/// image of this process (an upgrade) still uses are skipped: its counter
/// started again at 1.
fn fresh_dir(base: &Path, next: &AtomicU64) -> io::Result<PathBuf> {
    loop {
        let dir = base.join(format!("p{}", next.fetch_add(1, Ordering::Relaxed)));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(named(&dir, e)),
        }
    }
}

fn named(path: &Path, e: io::Error) -> io::Error {
    tracing::warn!("cannot write {}: {e}", path.display());
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy())
        .unwrap_or_default();
    io::Error::new(e.kind(), format!("the cgroup refused {file}: {e}"))
}

fn write_file(path: PathBuf, value: &str) -> io::Result<()> {
    std::fs::write(&path, value).map_err(|e| named(&path, e))
}

fn write_cap(c: Controller, value: u64, dir: &Path, v1: bool) -> io::Result<()> {
    match (c, v1) {
        (Controller::Memory, false) => {
            write_file(dir.join("memory.max"), &value.to_string())?;
            // No swap to flee to, and the whole tree goes when one member
            // is chosen (best effort: older kernels lack these files).
            let _ = std::fs::write(dir.join("memory.swap.max"), "0");
            let _ = std::fs::write(dir.join("memory.oom.group"), "1");
            Ok(())
        }
        (Controller::Memory, true) => {
            write_file(dir.join("memory.limit_in_bytes"), &value.to_string())?;
            // Memory plus swap (present only with swap accounting).
            let _ = std::fs::write(dir.join("memory.memsw.limit_in_bytes"), value.to_string());
            Ok(())
        }
        (Controller::Pids, _) => write_file(dir.join("pids.max"), &value.to_string()),
        (Controller::Cpu, false) => write_file(
            dir.join("cpu.max"),
            &format!("{} {CPU_PERIOD_US}", value * CPU_PERIOD_US / 100),
        ),
        (Controller::Cpu, true) => {
            write_file(dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
            write_file(
                dir.join("cpu.cfs_quota_us"),
                &(value * CPU_PERIOD_US / 100).to_string(),
            )
        }
    }
}

/// A process's [`Caps`] written down for the next image of the server (an
/// upgrade): its v1 cgroups and the counters that say which cap fired.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CapsParts {
    v1: Vec<PathBuf>,
    counters: Vec<(PathBuf, LimitReason)>,
}

impl Caps {
    /// Writes the caps down; they stay in force (the cgroups are the
    /// kernel's, and this image is replaced before it drops them).
    pub fn parts(&self) -> CapsParts {
        CapsParts {
            v1: self.v1.clone(),
            counters: self
                .counters
                .iter()
                .map(|(file, _, reason)| (file.clone(), *reason))
                .collect(),
        }
    }

    /// The caps [`Caps::parts`] wrote down.
    pub fn from_parts(p: CapsParts) -> Caps {
        Caps {
            v1: p.v1,
            counters: p
                .counters
                .into_iter()
                .map(|(file, reason)| {
                    let key = match reason {
                        LimitReason::MemoryLimit => "oom_kill",
                        _ => "max",
                    };
                    (file, key, reason)
                })
                .collect(),
        }
    }
}

impl Drop for Caps {
    fn drop(&mut self) {
        for dir in &self.v1 {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_below_their_minimum_are_refused_naming_the_member() {
        let l = ProcessLimits {
            memory_bytes: Some(4096),
            ..Default::default()
        };
        let places = Places::none();
        assert_eq!(
            places.check(&l).unwrap_err(),
            "limits.memoryBytes must be at least 1048576"
        );
        let l = ProcessLimits {
            max_tasks: Some(0),
            ..Default::default()
        };
        assert_eq!(
            places.check(&l).unwrap_err(),
            "limits.maxTasks must be at least 1"
        );
        let l = ProcessLimits {
            cpu_percent: Some(MAX_CPU_PERCENT + 1),
            ..Default::default()
        };
        assert!(places.check(&l).unwrap_err().contains("at most"));
        let l = ProcessLimits {
            max_tasks: Some(MAX_TASKS + 1),
            ..Default::default()
        };
        assert_eq!(
            places.check(&l).unwrap_err(),
            "limits.maxTasks must be at most 4194304"
        );
        let l = ProcessLimits {
            max_tasks: Some(5),
            ..Default::default()
        };
        assert!(places.check(&l).unwrap_err().contains("cannot be held"));
        assert!(!any(Some(&ProcessLimits::default())));
        assert!(any(Some(&ProcessLimits {
            cpu_percent: Some(5),
            ..Default::default()
        })));
    }
}
