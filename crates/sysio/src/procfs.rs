//! What `/proc` says of one process: its parent, process group, session and
//! CPU time (`/proc/<pid>/stat`), and its resident memory
//! (`/proc/<pid>/status`). Each read is one file; `None` once the process
//! is gone (or the file cannot be parsed).

/// The fields of `/proc/<pid>/stat` the server uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Parent pid.
    pub ppid: i32,
    /// Process group id.
    pub pgrp: i32,
    /// Session id.
    pub session: i32,
    /// User plus system CPU time, in clock ticks.
    pub cpu_ticks: u64,
}

/// `/proc/<pid>/stat` of `pid`.
pub fn stat(pid: i32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Parses a `/proc/<pid>/stat` line. The command name is in parentheses
/// and may itself hold spaces and parentheses: fields follow the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0]=state f[1]=ppid f[2]=pgrp f[3]=session … f[11]=utime f[12]=stime
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Some(Stat {
        ppid: f.get(1)?.parse().ok()?,
        pgrp: f.get(2)?.parse().ok()?,
        session: f.get(3)?.parse().ok()?,
        cpu_ticks: ticks(11) + ticks(12),
    })
}

/// The parent of `pid`.
pub fn parent_of(pid: i32) -> Option<i32> {
    stat(pid).map(|s| s.ppid)
}

/// CPU time (user + system) `pid` has used, in milliseconds.
pub fn cpu_time_ms(pid: i32) -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|h| *h > 0).unwrap_or(100);
    stat(pid).map(|s| s.cpu_ticks * 1000 / hz)
}

/// Resident memory of `pid` in bytes (`VmRSS`).
pub fn resident_bytes(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_with_spaces_and_parentheses() {
        let s = parse_stat("42 (a) b (c) S 7 8 9 0 0 0 0 0 0 0 5 6 0").unwrap();
        assert_eq!((s.ppid, s.pgrp, s.session, s.cpu_ticks), (7, 8, 9, 11));
        assert_eq!(parse_stat("42 (x"), None);
    }

    #[test]
    fn this_process() {
        let me = std::process::id() as i32;
        assert_eq!(
            parent_of(me),
            Some(std::os::unix::process::parent_id() as i32)
        );
        assert!(resident_bytes(me).is_some_and(|b| b > 0));
        assert!(cpu_time_ms(me).is_some());
        assert_eq!(stat(-1), None);
    }
}
