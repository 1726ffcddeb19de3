//! `run`'s limit flags (`--timeout`, `--idle-timeout`, `--max-output`,
//! `--memory`, `--max-tasks`, `--cpus`): their value syntax, the
//! capabilities they need, and what the command's exit says when one fired.

use exec_server_protocol::types::{LimitReason, ProcessLimits};
use std::collections::BTreeMap;
use std::time::Duration;

/// The limit flags of `run` and `shell`.
#[derive(clap::Args, Debug, Clone, Default)]
#[command(next_help_heading = "Limits")]
pub struct LimitArgs {
    /// End the command (and everything it started: SIGTERM, then SIGKILL 2 s
    /// later) once it has run this long: 500ms, 90s, 10m, 2h. Exits 124 then
    /// (137 if it had to be killed), with a line on stderr.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// End the command once it has printed nothing for this long (same
    /// syntax and exit as --timeout).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub idle_timeout: Option<Duration>,
    /// Deliver at most this much output (64K, 512M, 1G; all streams), then
    /// end the command (same exit as --timeout).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub max_output: Option<u64>,
    /// Memory the command and everything it starts may use together (at
    /// least 1M; 512M, 2G). Past it the kernel kills a member: exit 137.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub memory: Option<u64>,
    /// Processes and threads the command's tree may have at once; a fork
    /// past it fails (EAGAIN) and the tree is ended when the command exits.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_tasks: Option<u64>,
    /// CPUs the command's tree may keep busy (0.5, 2): it is slowed, never
    /// ended.
    #[arg(long, value_name = "CPUS", value_parser = parse_cpus)]
    pub cpus: Option<u64>,
}

impl LimitArgs {
    /// `limits` for `process/start`; `None` when no flag was given.
    pub fn to_limits(&self) -> Option<ProcessLimits> {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
        let limits = ProcessLimits {
            timeout_ms: self.timeout.map(ms),
            idle_timeout_ms: self.idle_timeout.map(ms),
            max_output_bytes: self.max_output,
            memory_bytes: self.memory,
            max_tasks: self.max_tasks,
            cpu_percent: self.cpus,
        };
        (limits != ProcessLimits::default()).then_some(limits)
    }
}

/// Refuses limits the server would not hold: the `processLimits`
/// capability, and for `--memory`, `--max-tasks`, `--cpus` the capability
/// of each. The error names the flag and the capability.
pub fn check_capabilities(
    limits: &ProcessLimits,
    capabilities: &BTreeMap<String, bool>,
) -> Result<(), String> {
    let has = |key: &str| capabilities.get(key).copied().unwrap_or(false);
    if !has("processLimits") {
        return Err(
            "the server does not enforce limits such as --timeout, --idle-timeout or \
                    --max-output (no processLimits capability)"
                .into(),
        );
    }
    for (asked, flag, key) in [
        (
            limits.memory_bytes.is_some(),
            "--memory",
            "processMemoryLimit",
        ),
        (
            limits.max_tasks.is_some(),
            "--max-tasks",
            "processTasksLimit",
        ),
        (limits.cpu_percent.is_some(), "--cpus", "processCpuLimit"),
    ] {
        if asked && !has(key) {
            return Err(format!(
                "the server cannot hold {flag} (no {key} capability: no cgroup controller for it)"
            ));
        }
    }
    Ok(())
}

/// Parses `--default-limits`/`--max-limits`: comma-separated `KEY=VALUE`
/// with the keys and value syntax of `run`'s flags (`timeout=10m,
/// idle-timeout=2m,max-output=1G,memory=2G,max-tasks=512,cpus=2`).
pub fn parse_limit_list(text: &str) -> Result<ProcessLimits, String> {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
    let mut l = ProcessLimits::default();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| format!("`{item}` is not KEY=VALUE (e.g. timeout=10m)"))?;
        let slot = match key.trim() {
            "timeout" => &mut l.timeout_ms,
            "idle-timeout" => &mut l.idle_timeout_ms,
            "max-output" => &mut l.max_output_bytes,
            "memory" => &mut l.memory_bytes,
            "max-tasks" => &mut l.max_tasks,
            "cpus" => &mut l.cpu_percent,
            other => {
                return Err(format!(
                    "unknown limit `{other}` (timeout, idle-timeout, max-output, memory, \
                     max-tasks, cpus)"
                ))
            }
        };
        let v = match key.trim() {
            "timeout" | "idle-timeout" => ms(parse_duration(value)?),
            "max-output" | "memory" => parse_bytes(value)?,
            "cpus" => parse_cpus(value)?,
            _ => match value.trim().parse::<u64>() {
                Ok(n) if n >= 1 => n,
                _ => {
                    return Err(format!(
                        "`{value}`: max-tasks is a whole number, at least 1"
                    ))
                }
            },
        };
        if slot.replace(v).is_some() {
            return Err(format!("`{}` is given twice", key.trim()));
        }
    }
    Ok(l)
}

/// Parses a CPU share: a decimal number of CPUs (`0.5`, `2`) into percent
/// of one CPU. At least 0.01.
pub fn parse_cpus(text: &str) -> Result<u64, String> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number of CPUs (e.g. 0.5, 2)"))?;
    let pct = (v * 100.0).round();
    if !pct.is_finite() || pct < 1.0 {
        return Err(format!("`{text}`: at least 0.01 CPUs"));
    }
    Ok(pct.min(1e9) as u64)
}

/// Exit code of a command a time or output limit ended (as `timeout(1)`).
pub const EXIT_LIMIT: i32 = 124;

/// Parses a duration: a number with `ms`, `s`, `m` or `h` (`500ms`, `90s`,
/// `10m`, `2h`); a bare number is seconds. At least 1 ms.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (number, unit_ms) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1e3)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60e3)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600e3)
    } else {
        (t, 1e3)
    };
    let v: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (e.g. 500ms, 90s, 10m, 2h)"))?;
    let ms = v * unit_ms;
    if !ms.is_finite() || ms < 1.0 {
        return Err(format!("`{text}`: a limit must be at least 1ms"));
    }
    Ok(Duration::from_millis(ms.min(u64::MAX as f64) as u64))
}

/// Parses a byte count: a number with `K`, `M`, `G` (powers of 1024, an
/// optional trailing `B` or `iB`); a bare number is bytes. At least 1.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (number, scale) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let v: u64 = number
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a size (e.g. 65536, 64K, 512M, 1G)"))?;
    match v.checked_mul(scale) {
        Some(0) => Err(format!("`{text}`: a limit must be at least 1 byte")),
        Some(n) => Ok(n),
        None => Err(format!("`{text}` is too large")),
    }
}

/// The line `run` prints on stderr when `reason` ended the command.
pub fn describe(reason: LimitReason) -> &'static str {
    match reason {
        LimitReason::WallTimeout => "the command ran past --timeout and was ended",
        LimitReason::IdleTimeout => "the command printed nothing for --idle-timeout and was ended",
        LimitReason::OutputLimit => {
            "the command reached --max-output and was ended (output cut there)"
        }
        LimitReason::MemoryLimit => "the command reached --memory and was killed (out of memory)",
        LimitReason::TasksLimit => {
            "the command reached --max-tasks: a fork or thread was refused (EAGAIN)"
        }
    }
}

/// `run`'s exit code for a command `reason` ended with `code`: 137 when it
/// was killed (SIGKILL after the grace, the OOM killer), the command's own
/// code when a fork was refused at --max-tasks, else [`EXIT_LIMIT`].
pub fn exit_code(reason: LimitReason, code: i32) -> i32 {
    match reason {
        LimitReason::TasksLimit => code,
        _ if code == 128 + 9 => code,
        LimitReason::MemoryLimit => code,
        _ => EXIT_LIMIT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes_parse_and_bad_ones_say_why() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("0s").unwrap_err().contains("at least 1ms"));
        assert!(parse_duration("soon")
            .unwrap_err()
            .contains("not a duration"));
        assert_eq!(parse_bytes("64K"), Ok(65536));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert_eq!(parse_bytes("100"), Ok(100));
        assert!(parse_bytes("0").unwrap_err().contains("at least 1 byte"));
        assert!(parse_bytes("lots").unwrap_err().contains("not a size"));
        assert_eq!(exit_code(LimitReason::WallTimeout, 143), EXIT_LIMIT);
        assert_eq!(exit_code(LimitReason::WallTimeout, 137), 137);
        assert_eq!(exit_code(LimitReason::MemoryLimit, 137), 137);
        assert_eq!(exit_code(LimitReason::TasksLimit, 3), 3);
        assert_eq!(parse_cpus("0.5"), Ok(50));
        assert_eq!(parse_cpus("2"), Ok(200));
        assert!(parse_cpus("0").unwrap_err().contains("at least"));
        let l = parse_limit_list("timeout=10m, memory=2G,max-tasks=512,cpus=1.5").unwrap();
        assert_eq!(l.timeout_ms, Some(600_000));
        assert_eq!(l.memory_bytes, Some(2 << 30));
        assert_eq!((l.max_tasks, l.cpu_percent), (Some(512), Some(150)));
        assert!(parse_limit_list("speed=3")
            .unwrap_err()
            .contains("unknown limit"));
        assert!(parse_limit_list("max-tasks=0")
            .unwrap_err()
            .contains("at least 1"));
    }
}
