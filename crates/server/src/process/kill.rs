//! Killing a whole process tree.
//!
//! Every child starts in its own process group (pipe mode) or its own session and
//! group (PTY mode, `setsid`), so its pid is also its group (and, on a PTY, session)
//! id. Killing "the process" means SIGKILL to:
//! 1. its process group;
//! 2. every process still in its session or group (on a PTY: jobs of the shell
//!    that moved to other groups);
//! 3. every live descendant by parent pid, found in `/proc` before anything is
//!    killed (this catches those that called `setsid` themselves while their
//!    parent was alive).
//!
//! Two rounds are made, for processes forked while the first round ran. A
//! descendant that both left the session and was orphaned before the kill is
//! re-parented to the server (subreaper) and killed by [`kill_all_descendants`] at
//! shutdown.

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use std::collections::{HashMap, HashSet};

use exec_server_sysio::procfs::{stat as proc_info, Stat as ProcInfo};

fn read_proc_table() -> HashMap<i32, ProcInfo> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Some(info) = proc_info(pid) {
            out.insert(pid, info);
        }
    }
    out
}

fn descendants(table: &HashMap<i32, ProcInfo>, roots: &[i32]) -> HashSet<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for (pid, info) in table {
        children.entry(info.ppid).or_default().push(*pid);
    }
    let mut seen = HashSet::new();
    let mut stack: Vec<i32> = roots.to_vec();
    while let Some(p) = stack.pop() {
        if let Some(kids) = children.get(&p) {
            for k in kids {
                if seen.insert(*k) {
                    stack.push(*k);
                }
            }
        }
    }
    seen
}

/// SIGKILLs the tree of the process `pid` (a session and group leader), as
/// described in the module docs.
pub fn kill_tree(pid: u32) {
    let pid = pid as i32;
    for _ in 0..2 {
        let table = read_proc_table();
        let mut victims = descendants(&table, &[pid]);
        for (p, info) in &table {
            if info.session == pid || info.pgrp == pid {
                victims.insert(*p);
            }
        }
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        for v in &victims {
            let _ = kill(Pid::from_raw(*v), Signal::SIGKILL);
        }
    }
}

/// Sends `signal` to the process group of `pid` (falls back to the process).
pub fn signal_group(pid: u32, signal: Signal) {
    if killpg(Pid::from_raw(pid as i32), signal).is_err() {
        let _ = kill(Pid::from_raw(pid as i32), signal);
    }
}

/// SIGKILLs every descendant of the server itself (shutdown).
pub fn kill_all_descendants() {
    let me = std::process::id() as i32;
    for _ in 0..2 {
        let table = read_proc_table();
        for v in descendants(&table, &[me]) {
            let _ = kill(Pid::from_raw(v), Signal::SIGKILL);
        }
    }
}
