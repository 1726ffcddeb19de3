//! A session's share of the spool: the bytes its processes hold on disk
//! now, counted against `--output-spool-session-bytes` next to the
//! server-wide budget, so one session's floods cannot take the whole spool
//! from the others.

use std::sync::atomic::{AtomicU64, Ordering};

/// The spooled bytes of one session's processes (records and spare files),
/// shared by them; a new session starts at zero.
#[derive(Debug, Default)]
pub struct SessionShare {
    used: AtomicU64,
}

impl SessionShare {
    /// Bytes this session's processes hold in the spool now.
    pub fn used_bytes(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
}

/// Takes `n` bytes of `used` if that stays within `cap`; false otherwise.
pub(super) fn reserve(used: &AtomicU64, cap: u64, n: u64) -> bool {
    let mut cur = used.load(Ordering::Relaxed);
    loop {
        if cur.saturating_add(n) > cap {
            return false;
        }
        match used.compare_exchange_weak(cur, cur + n, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(now) => cur = now,
        }
    }
}

/// Reserves `n` bytes of the server's budget and of the session's share,
/// both or neither.
pub(super) fn reserve_both(
    server: &AtomicU64,
    total: u64,
    share: &SessionShare,
    per_session: u64,
    n: u64,
) -> bool {
    if !reserve(server, total, n) {
        return false;
    }
    if !reserve(&share.used, per_session, n) {
        server.fetch_sub(n, Ordering::Relaxed);
        return false;
    }
    true
}

/// Counts `n` bytes already on disk against the share, whatever its cap
/// (output a previous image of the server spooled).
pub(super) fn count(share: &SessionShare, n: u64) {
    share.used.fetch_add(n, Ordering::Relaxed);
}

/// Gives `n` bytes back to both.
pub(super) fn release_both(server: &AtomicU64, share: &SessionShare, n: u64) {
    server.fetch_sub(n, Ordering::Relaxed);
    share.used.fetch_sub(n, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_past_its_cap_takes_nothing_from_the_server() {
        let server = AtomicU64::new(0);
        let share = SessionShare::default();
        assert!(reserve_both(&server, 100, &share, 10, 8));
        assert!(!reserve_both(&server, 100, &share, 10, 3), "share full");
        assert_eq!(server.load(Ordering::Relaxed), 8, "server rolled back");
        let other = SessionShare::default();
        assert!(reserve_both(&server, 100, &other, 10, 9), "another session");
        release_both(&server, &share, 8);
        assert_eq!((server.load(Ordering::Relaxed), share.used_bytes()), (9, 0));
    }
}
