//! Counts of processes that have not exited, per server and per session,
//! taken before a start and given back at exit: `--max-processes` and
//! `--max-session-processes` hold however many starts race.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A count of running processes.
pub type LiveCount = Arc<AtomicUsize>;

/// One place in each of a few [`LiveCount`]s, given back when dropped (the
/// process exited, or its start failed).
pub struct LiveSlot {
    counts: Vec<LiveCount>,
}

impl LiveSlot {
    /// Takes one place in each `(count, cap)`, all or none. Errors: the
    /// index of the first count already at its cap.
    pub fn take(counts: &[(&LiveCount, Option<usize>)]) -> Result<LiveSlot, usize> {
        let mut slot = LiveSlot {
            counts: Vec::with_capacity(counts.len()),
        };
        for (i, (count, cap)) in counts.iter().enumerate() {
            let mut now = count.load(Ordering::Acquire);
            loop {
                if cap.is_some_and(|c| now >= c) {
                    // Dropping `slot` gives back what was taken so far.
                    return Err(i);
                }
                match count.compare_exchange_weak(now, now + 1, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => break,
                    Err(seen) => now = seen,
                }
            }
            slot.counts.push(Arc::clone(count));
        }
        Ok(slot)
    }
}

impl Drop for LiveSlot {
    fn drop(&mut self) {
        for c in &self.counts {
            c.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_or_none_and_given_back_on_drop() {
        let (server, session) = (LiveCount::default(), LiveCount::default());
        let a = LiveSlot::take(&[(&session, Some(2)), (&server, Some(2))]).unwrap();
        let b = LiveSlot::take(&[(&session, Some(2)), (&server, Some(2))]).unwrap();
        assert_eq!(
            LiveSlot::take(&[(&session, None), (&server, Some(2))]).err(),
            Some(1)
        );
        assert_eq!(
            session.load(Ordering::SeqCst),
            2,
            "the refused take gave its place back"
        );
        drop(a);
        assert_eq!(server.load(Ordering::SeqCst), 1);
        let c = LiveSlot::take(&[(&session, Some(2)), (&server, Some(2))]).unwrap();
        drop((b, c));
        assert_eq!(
            (
                session.load(Ordering::SeqCst),
                server.load(Ordering::SeqCst)
            ),
            (0, 0)
        );
    }
}
