//! Starting and stopping the servers under test, and reading their memory.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A server to measure: a command to start, or a URL.
pub struct Target {
    pub name: String,
    spec: String,
}

/// A running server (stopped by PID when the run ends).
pub struct Running {
    pub url: String,
    child: Option<Child>,
}

impl Target {
    pub fn parse(s: &str) -> Result<Target, String> {
        let (name, spec) = s.split_once('=').ok_or(format!(
            "--server takes NAME=COMMAND or NAME=URL, got `{s}`"
        ))?;
        Ok(Target {
            name: name.trim().into(),
            spec: spec.trim().into(),
        })
    }

    pub async fn start(&self) -> Result<Running, String> {
        if self.spec.starts_with("ws://") {
            return Ok(Running {
                url: self.spec.clone(),
                child: None,
            });
        }
        let parts: Vec<&str> = self.spec.split_whitespace().collect();
        let mut child = Command::new(parts[0])
            .args(&parts[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start `{}`: {e}", self.spec))?;
        let mut line = String::new();
        let stdout = child.stdout.take().ok_or("no stdout")?;
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        let url = line.trim().to_string();
        if !url.starts_with("ws://") {
            let _ = child.kill();
            return Err(format!("`{}` printed `{url}`, not a ws:// URL", self.spec));
        }
        Ok(Running {
            url,
            child: Some(child),
        })
    }
}

impl Running {
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Resident memory of the server and its descendants' parent only, in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        let pid = self.pid()?;
        status_field(pid, "VmRSS:")
    }

    pub fn stop(mut self) {
        if let Some(mut c) = self.child.take() {
            // SIGTERM so the server can kill its process trees, then make sure.
            // SAFETY: kill(2) with a pid we own.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            for _ in 0..100 {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn status_field(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// CPU time, in ns, that all live threads of process `pid` have run
/// (`/proc/PID/task/*/schedstat`, nanosecond resolution). `None` when the
/// process is gone.
pub fn cpu_ns(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0u64;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue; // the thread ended meanwhile
        };
        total += stat
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(total)
}

pub fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| format!("Linux {}", s.trim()))
        .unwrap_or_default()
}
