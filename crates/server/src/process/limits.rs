//! A process's `limits` (an extension of `process/start`): when each is due,
//! how much output may still be delivered, and what the pump does when one
//! fires. Pure bookkeeping over instants the pump passes in; the pump signals.
//!
//! A limit that fires records its [`LimitReason`] once (the first wins), and
//! the tree is asked to stop with SIGTERM, then killed (SIGKILL to the tree and
//! its cgroup) a grace later ([`DEFAULT_KILL_GRACE`], `--limit-grace`) if it
//! still runs.

use exec_server_protocol::types::{LimitReason, ProcessLimits};
use std::time::Duration;
use tokio::time::Instant;

/// Default time between the SIGTERM a fired limit sends and the SIGKILL
/// that follows if the process has not exited: 2 s (`--limit-grace`).
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(2);

/// Checks `limits` before a start: each given member must be at least 1,
/// and the memory, task and CPU caps must hold where `places` says
/// ([`super::resources::Places::check`]). Errors name the member
/// (`limits.timeoutMs must be at least 1`).
pub fn validate(limits: &ProcessLimits, places: &super::resources::Places) -> Result<(), String> {
    for (name, v) in [
        ("timeoutMs", limits.timeout_ms),
        ("idleTimeoutMs", limits.idle_timeout_ms),
        ("maxOutputBytes", limits.max_output_bytes),
    ] {
        if v == Some(0) {
            return Err(format!("limits.{name} must be at least 1"));
        }
    }
    places.check(limits)
}

/// The members of `limits` by wire name, each with its value.
fn members(l: &mut ProcessLimits) -> [(&'static str, &mut Option<u64>); 6] {
    [
        ("timeoutMs", &mut l.timeout_ms),
        ("idleTimeoutMs", &mut l.idle_timeout_ms),
        ("maxOutputBytes", &mut l.max_output_bytes),
        ("memoryBytes", &mut l.memory_bytes),
        ("maxTasks", &mut l.max_tasks),
        ("cpuPercent", &mut l.cpu_percent),
    ]
}

/// The limits a start runs with: each member as the request gives it, else
/// the server's default (`--default-limits`), else its ceiling
/// (`--max-limits`). `None` when no member is set. For every member a
/// larger value allows more, so a request may lower a ceiling, never raise
/// it. Errors: a member above its ceiling (`limits.timeoutMs (600000) is
/// above this server's ceiling (300000, --max-limits)`).
pub fn effective(
    asked: Option<&ProcessLimits>,
    defaults: &ProcessLimits,
    ceilings: &ProcessLimits,
) -> Result<Option<ProcessLimits>, String> {
    let mut out = asked.cloned().unwrap_or_default();
    let (mut d, mut c) = (defaults.clone(), ceilings.clone());
    for (((name, v), (_, dv)), (_, cv)) in members(&mut out)
        .into_iter()
        .zip(members(&mut d))
        .zip(members(&mut c))
    {
        if let (Some(a), Some(max)) = (*v, *cv) {
            if a > max {
                return Err(format!(
                    "limits.{name} ({a}) is above this server's ceiling ({max}, --max-limits)"
                ));
            }
        }
        *v = v.or(*dv).or(*cv);
    }
    Ok((out != ProcessLimits::default()).then_some(out))
}

/// What the pump should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing is due.
    Wait,
    /// A limit fired: SIGTERM the tree.
    Terminate(LimitReason),
    /// The grace after SIGTERM ran out: kill the tree.
    Kill,
}

/// One process's limits and where it stands against them.
#[derive(Debug)]
pub struct Watch {
    deadline: Option<Instant>,
    idle: Option<Duration>,
    last_output: Instant,
    max_output: Option<u64>,
    output: u64,
    /// The limit that fired, and when.
    fired: Option<(LimitReason, Instant)>,
    /// SIGTERM was sent.
    terminated: bool,
    /// When the SIGKILL is due, until it is sent.
    kill_at: Option<Instant>,
    /// Between SIGTERM and SIGKILL.
    grace: Duration,
}

/// A [`Watch`] written down for the next image of the server (an upgrade):
/// each instant as milliseconds from the moment it was written, negative
/// for one already past.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct WatchParts {
    deadline_in_ms: Option<i64>,
    idle_ms: Option<u64>,
    last_output_in_ms: i64,
    max_output: Option<u64>,
    output: u64,
    fired: Option<(LimitReason, i64)>,
    terminated: bool,
    kill_in_ms: Option<i64>,
    grace_ms: u64,
}

/// `at` as milliseconds from `now` (negative when past).
fn offset_ms(at: Instant, now: Instant) -> i64 {
    if at >= now {
        (at - now).as_millis().min(i64::MAX as u128) as i64
    } else {
        -((now - at).as_millis().min(i64::MAX as u128) as i64)
    }
}

/// The instant `ms` milliseconds from `now`.
fn at_offset(ms: i64, now: Instant) -> Instant {
    let d = Duration::from_millis(ms.unsigned_abs());
    if ms >= 0 {
        now + d
    } else {
        now.checked_sub(d).unwrap_or(now)
    }
}

impl Watch {
    /// Writes the watch down at `now`.
    pub fn parts(&self, now: Instant) -> WatchParts {
        WatchParts {
            deadline_in_ms: self.deadline.map(|d| offset_ms(d, now)),
            idle_ms: self.idle.map(|d| d.as_millis() as u64),
            last_output_in_ms: offset_ms(self.last_output, now),
            max_output: self.max_output,
            output: self.output,
            fired: self.fired.map(|(r, at)| (r, offset_ms(at, now))),
            terminated: self.terminated,
            kill_in_ms: self.kill_at.map(|k| offset_ms(k, now)),
            grace_ms: self.grace.as_millis() as u64,
        }
    }

    /// The watch [`Watch::parts`] wrote down, read at `now`: each deadline
    /// keeps the time it had left.
    pub fn from_parts(p: &WatchParts, now: Instant) -> Watch {
        Watch {
            deadline: p.deadline_in_ms.map(|ms| at_offset(ms, now)),
            idle: p.idle_ms.map(Duration::from_millis),
            last_output: at_offset(p.last_output_in_ms, now),
            max_output: p.max_output,
            output: p.output,
            fired: p.fired.map(|(r, ms)| (r, at_offset(ms, now))),
            terminated: p.terminated,
            kill_at: p.kill_in_ms.map(|ms| at_offset(ms, now)),
            grace: Duration::from_millis(p.grace_ms),
        }
    }

    /// Starts watching at `now` (no limits: never fires); a fired limit's
    /// SIGKILL follows its SIGTERM after `grace`.
    pub fn new(limits: Option<&ProcessLimits>, now: Instant, grace: Duration) -> Watch {
        let limits = limits.cloned().unwrap_or_default();
        Watch {
            deadline: limits.timeout_ms.map(|ms| now + Duration::from_millis(ms)),
            idle: limits.idle_timeout_ms.map(Duration::from_millis),
            last_output: now,
            max_output: limits.max_output_bytes,
            output: 0,
            fired: None,
            terminated: false,
            kill_at: None,
            grace,
        }
    }

    /// The wall-clock deadline, while no limit has fired.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline.filter(|_| self.fired.is_none())
    }

    /// The limit that fired, if one did.
    pub fn fired(&self) -> Option<LimitReason> {
        self.fired.map(|(r, _)| r)
    }

    /// When [`Watch::tick`] next has something to do (possibly already
    /// past); `None`: never.
    pub fn next_due(&self) -> Option<Instant> {
        if let Some((_, at)) = self.fired {
            return if self.terminated {
                self.kill_at
            } else {
                Some(at)
            };
        }
        let idle = self.idle.map(|d| self.last_output + d);
        match (self.deadline, idle) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// `n` bytes of output were read at `now`: how many of them may be
    /// delivered. Reaching the output cap fires [`LimitReason::OutputLimit`]
    /// (due at once); past it, nothing more is delivered.
    pub fn output(&mut self, n: usize, now: Instant) -> usize {
        self.last_output = now;
        let Some(max) = self.max_output else {
            return n;
        };
        let allowed = (n as u64).min(max.saturating_sub(self.output)) as usize;
        self.output += allowed as u64;
        if self.output >= max {
            self.fire(LimitReason::OutputLimit, now);
        }
        allowed
    }

    /// `n` bytes of output are known to be on their way (what a sink's
    /// source holds when the command exits): if they reach the cap, it fires
    /// now, as it will once they are moved, so `exited` already says so.
    /// Nothing is counted as delivered.
    pub fn output_pending(&mut self, n: u64, now: Instant) {
        if n > 0 && self.output_room().is_some_and(|room| n >= room) {
            self.fire(LimitReason::OutputLimit, now);
        }
    }

    /// Output bytes the cap still allows: `None` without a cap.
    pub fn output_room(&self) -> Option<u64> {
        self.max_output.map(|max| max.saturating_sub(self.output))
    }

    /// The client holds output back (the server waits to hand it over or
    /// has paused reading for it) at `now`: the command is not silent, so
    /// the idle clock restarts.
    pub fn output_held(&mut self, now: Instant) {
        self.last_output = now;
    }

    fn fire(&mut self, reason: LimitReason, now: Instant) {
        if self.fired.is_none() {
            self.fired = Some((reason, now));
        }
    }

    /// Time is `now`: fires a due deadline or idle timeout; asks for the
    /// SIGTERM of a fired limit once, then for the SIGKILL when the grace
    /// has run out.
    pub fn tick(&mut self, now: Instant) -> Action {
        if self.fired.is_none() {
            if self.deadline.is_some_and(|d| now >= d) {
                self.fire(LimitReason::WallTimeout, now);
            } else if self.idle.is_some_and(|d| now >= self.last_output + d) {
                self.fire(LimitReason::IdleTimeout, now);
            }
        }
        let Some((reason, _)) = self.fired else {
            return Action::Wait;
        };
        if !self.terminated {
            self.terminated = true;
            self.kill_at = Some(now + self.grace);
            return Action::Terminate(reason);
        }
        match self.kill_at {
            Some(t) if now >= t => {
                self.kill_at = None;
                Action::Kill
            }
            _ => Action::Wait,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(timeout: Option<u64>, idle: Option<u64>, max: Option<u64>) -> ProcessLimits {
        ProcessLimits {
            timeout_ms: timeout,
            idle_timeout_ms: idle,
            max_output_bytes: max,
            ..Default::default()
        }
    }

    #[test]
    fn deadline_then_sigterm_then_sigkill_after_the_grace() {
        let t0 = Instant::now();
        let mut w = Watch::new(
            Some(&limits(Some(1000), None, None)),
            t0,
            DEFAULT_KILL_GRACE,
        );
        assert_eq!(w.next_due(), Some(t0 + Duration::from_millis(1000)));
        assert_eq!(w.tick(t0 + Duration::from_millis(999)), Action::Wait);
        let t1 = t0 + Duration::from_millis(1000);
        assert_eq!(w.tick(t1), Action::Terminate(LimitReason::WallTimeout));
        assert_eq!(w.next_due(), Some(t1 + DEFAULT_KILL_GRACE));
        assert_eq!(w.tick(t1 + Duration::from_millis(10)), Action::Wait);
        assert_eq!(w.tick(t1 + DEFAULT_KILL_GRACE), Action::Kill);
        assert_eq!(w.next_due(), None);
        assert_eq!(w.fired(), Some(LimitReason::WallTimeout));
    }

    #[test]
    fn output_moves_the_idle_timeout_and_the_cap_cuts_the_chunk() {
        let t0 = Instant::now();
        let mut w = Watch::new(
            Some(&limits(None, Some(100), Some(10))),
            t0,
            DEFAULT_KILL_GRACE,
        );
        let t1 = t0 + Duration::from_millis(90);
        assert_eq!(w.output(4, t1), 4);
        assert_eq!(w.next_due(), Some(t1 + Duration::from_millis(100)));
        assert_eq!(w.tick(t0 + Duration::from_millis(150)), Action::Wait);
        assert_eq!(w.output(8, t1), 6, "cut at the cap");
        assert_eq!(w.next_due(), Some(t1), "due at once");
        assert_eq!(w.tick(t1), Action::Terminate(LimitReason::OutputLimit));
        assert_eq!(w.output(5, t1), 0, "nothing past the cap");
        assert_eq!(w.fired(), Some(LimitReason::OutputLimit));
    }

    #[test]
    fn output_pending_past_the_cap_fires_it_and_within_it_does_not() {
        let t0 = Instant::now();
        let limits = ProcessLimits {
            max_output_bytes: Some(5000),
            ..Default::default()
        };
        let mut w = Watch::new(Some(&limits), t0, Duration::from_secs(1));
        assert_eq!(w.output(1000, t0), 1000);
        w.output_pending(3999, t0);
        assert_eq!(w.fired(), None, "within the cap");
        w.output_pending(4000, t0);
        assert_eq!(w.fired(), Some(LimitReason::OutputLimit));
        assert_eq!(w.output_room(), Some(4000), "nothing counted as delivered");
    }

    #[test]
    fn output_held_back_by_the_client_is_not_silence_but_the_deadline_still_fires() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut w = Watch::new(
            Some(&limits(Some(1000), Some(300), None)),
            t0,
            DEFAULT_KILL_GRACE,
        );
        w.output_held(t0 + ms(250));
        assert_eq!(
            w.tick(t0 + ms(400)),
            Action::Wait,
            "idle restarted at 250 ms"
        );
        w.output_held(t0 + ms(500));
        assert_eq!(w.next_due(), Some(t0 + ms(800)));
        w.output_held(t0 + ms(800));
        assert_eq!(
            w.tick(t0 + ms(1000)),
            Action::Terminate(LimitReason::WallTimeout),
            "held output does not move the deadline"
        );
    }

    #[test]
    fn defaults_fill_in_ceilings_cap_and_a_raise_is_refused() {
        let defaults = limits(Some(60_000), None, None);
        let ceilings = limits(Some(600_000), None, Some(1 << 30));
        let got = effective(None, &defaults, &ceilings).unwrap().unwrap();
        assert_eq!(got, limits(Some(60_000), None, Some(1 << 30)));
        let asked = limits(Some(1000), Some(50), None);
        let got = effective(Some(&asked), &defaults, &ceilings)
            .unwrap()
            .unwrap();
        assert_eq!(got, limits(Some(1000), Some(50), Some(1 << 30)));
        let raise = limits(Some(600_001), None, None);
        assert_eq!(
            effective(Some(&raise), &defaults, &ceilings).unwrap_err(),
            "limits.timeoutMs (600001) is above this server's ceiling (600000, --max-limits)"
        );
        let none = ProcessLimits::default();
        assert_eq!(effective(None, &none, &none), Ok(None));
    }

    #[test]
    fn no_limits_never_fire_and_zero_is_refused() {
        let t0 = Instant::now();
        let mut w = Watch::new(None, t0, DEFAULT_KILL_GRACE);
        assert_eq!(w.next_due(), None);
        assert_eq!(w.output(1 << 20, t0), 1 << 20);
        assert_eq!(w.tick(t0 + Duration::from_secs(86_400)), Action::Wait);
        let places = crate::process::resources::Places::none();
        assert_eq!(
            validate(&limits(Some(0), None, None), &places).unwrap_err(),
            "limits.timeoutMs must be at least 1"
        );
        assert!(validate(&limits(Some(1), Some(1), Some(1)), &places).is_ok());
    }
}
