//! `run`'s limit flags (`--timeout`, `--idle-timeout`, `--max-output`): their
//! value syntax, and what the command's exit says when one fired.

use exec_server_protocol::types::LimitReason;
use std::time::Duration;

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
    }
}

/// `run`'s exit code for a command `reason` ended with `code`: 137 when it
/// had to be killed (SIGKILL after the grace), else [`EXIT_LIMIT`].
pub fn exit_code(code: i32) -> i32 {
    if code == 128 + 9 {
        code
    } else {
        EXIT_LIMIT
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
        assert_eq!(exit_code(143), EXIT_LIMIT);
        assert_eq!(exit_code(137), 137);
    }
}
