//! A process as `process/list` shows it: what it was started with, and
//! where it stands now (state, CPU, memory, output, limits).

use super::{lock, Process};
use exec_server_protocol::types::{ExecParams, ProcessInfo, ProcessLimits, ProcessState};
use exec_server_protocol::PathUri;
use exec_server_sysio::procfs;
use std::sync::atomic::Ordering;

/// What a process was started with, as `process/list` shows it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StartedWith {
    argv: Vec<String>,
    cwd: PathUri,
    tty: bool,
    limits: Option<ProcessLimits>,
    /// Milliseconds since the Unix epoch.
    at_ms: u64,
}

impl StartedWith {
    /// The request `params` as the client sent it, started now.
    pub fn of(params: &ExecParams) -> StartedWith {
        StartedWith {
            argv: params.argv.clone(),
            cwd: params.cwd.clone(),
            tty: params.tty,
            limits: params.limits.clone(),
            at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        }
    }
}

impl Process {
    /// This process for `process/list`. CPU time and memory are the
    /// process's own (not its children's), read from `/proc` while it runs.
    pub fn info(&self) -> ProcessInfo {
        let (exit_code, closed, limit, signal) = {
            let st = lock(&self.state);
            (st.log.exit_code(), st.log.is_closed(), st.limit, st.signal)
        };
        let state = match (exit_code, closed) {
            (None, _) => ProcessState::Running,
            (Some(_), false) => ProcessState::Exited,
            (Some(_), true) => ProcessState::Closed,
        };
        // Only while it runs is the pid surely still this process's.
        let running = exit_code.is_none();
        let pid = self.pid as i32;
        let s = &self.started_with;
        ProcessInfo {
            session_id: None,
            process_id: self.id.clone(),
            pid: self.pid,
            argv: s.argv.clone(),
            cwd: s.cwd.clone(),
            tty: s.tty,
            started_at_ms: s.at_ms,
            cpu_time_ms: running.then(|| procfs::cpu_time_ms(pid)).flatten(),
            memory_bytes: running.then(|| procfs::resident_bytes(pid)).flatten(),
            output_bytes: self.output_bytes.load(Ordering::Relaxed),
            limits: s.limits.clone(),
            state,
            exit_code,
            limit: limit.filter(|_| exit_code.is_some()),
            signal: signal.map(|s| s.as_str().to_string()),
        }
    }
}
