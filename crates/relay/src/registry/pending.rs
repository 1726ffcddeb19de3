//! How many `/connect` answers a node has given that may still be used: each
//! stores two single-use authorizations in the store for up to a minute
//! (about 3.4 KB), so a token holder calling `/connect` in a loop would
//! otherwise fill the store (an adversarial pass took a node from 151 MB to
//! 1.2 GB in 25 s). Each answer counts for as long as its authorizations live,
//! against its credential (the bearer it was asked with) for that
//! environment, against its credential across environments, and against the
//! node. Past a bound `/connect` is answered `429 too_many_connects` with
//! `retry-after`. The node's bound is far above one credential's, so one
//! credential cannot lock the others out (a single node-wide bound let one
//! token fill it in 3 s and refuse every tenant).

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Answers one credential may have outstanding for one environment on one
/// node: 1 024, far more than clients starting sessions need in a minute.
pub const PER_ENVIRONMENT: usize = 1024;
/// Answers one credential may have outstanding on one node across
/// environments: 4 096 (about 14 MB of authorizations).
pub const PER_CREDENTIAL: usize = 4 * 1024;
/// Answers outstanding on one node: 65 536 (about 220 MB at most), sixteen
/// credentials' worth.
pub const PER_NODE: usize = 64 * 1024;

/// Which bound a `/connect` would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    /// [`PER_ENVIRONMENT`].
    Environment,
    /// [`PER_CREDENTIAL`].
    Credential,
    /// [`PER_NODE`].
    Node,
}

impl Over {
    /// The bound passed.
    pub fn bound(self) -> usize {
        match self {
            Over::Environment => PER_ENVIRONMENT,
            Over::Credential => PER_CREDENTIAL,
            Over::Node => PER_NODE,
        }
    }
}

/// Outstanding `/connect` answers, each until its authorizations expire.
pub struct PendingConnects {
    lifetime: Duration,
    bounds: [usize; 3],
    /// Keys credentials by a hash of their bearer (never kept itself).
    hasher: RandomState,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Expiry of each outstanding answer, oldest first, per (credential,
    /// environment).
    answers: HashMap<(u64, String), VecDeque<Instant>>,
    per_credential: HashMap<u64, usize>,
    total: usize,
}

impl State {
    /// Drops the expired answers of the keys `which` selects, and keys left
    /// empty.
    fn sweep(&mut self, now: Instant, which: impl Fn(&(u64, String)) -> bool) {
        let State {
            answers,
            per_credential,
            total,
        } = self;
        answers.retain(|key, q| {
            if which(key) {
                let before = q.len();
                while q.front().is_some_and(|&t| t <= now) {
                    q.pop_front();
                }
                let gone = before - q.len();
                *total -= gone;
                if let Some(n) = per_credential.get_mut(&key.0) {
                    *n -= gone;
                }
            }
            !q.is_empty()
        });
        per_credential.retain(|_, n| *n > 0);
    }
}

impl PendingConnects {
    /// Answers count for `lifetime` (the authorizations' longest TTL).
    pub fn new(lifetime: Duration) -> PendingConnects {
        PendingConnects::with_bounds(lifetime, [PER_ENVIRONMENT, PER_CREDENTIAL, PER_NODE])
    }

    /// [`PendingConnects::new`] with other bounds: per environment, per
    /// credential, per node.
    pub fn with_bounds(lifetime: Duration, bounds: [usize; 3]) -> Self {
        PendingConnects {
            lifetime,
            bounds,
            hasher: RandomState::new(),
            state: Mutex::new(State::default()),
        }
    }

    /// Counts one more answer for `bearer` (`None`: a node without harness
    /// tokens) and `env` at `now`, unless a bound is reached.
    pub fn admit(&self, bearer: Option<&str>, env: &str, now: Instant) -> Result<(), Over> {
        let [per_env, per_credential, per_node] = self.bounds;
        let credential = bearer.map_or(0, |b| self.hasher.hash_one(b));
        let key = (credential, env.to_string());
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.total >= per_node {
            s.sweep(now, |_| true);
        } else if s.per_credential.get(&credential).copied().unwrap_or(0) >= per_credential {
            s.sweep(now, |k| k.0 == credential);
        } else {
            s.sweep(now, |k| *k == key);
        }
        if s.total >= per_node {
            return Err(Over::Node);
        }
        if s.per_credential.get(&credential).copied().unwrap_or(0) >= per_credential {
            return Err(Over::Credential);
        }
        let q = s.answers.entry(key).or_default();
        if q.len() >= per_env {
            return Err(Over::Environment);
        }
        q.push_back(now + self.lifetime);
        *s.per_credential.entry(credential).or_default() += 1;
        s.total += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bound_holds_until_answers_expire() {
        // 2 per environment, 3 per credential, 5 on the node.
        let p = PendingConnects::with_bounds(Duration::from_secs(60), [2, 3, 5]);
        let t0 = Instant::now();
        let (a, b, c) = (Some("token-a"), Some("token-b"), Some("token-c"));
        p.admit(a, "e1", t0).unwrap();
        p.admit(a, "e1", t0).unwrap();
        assert_eq!(p.admit(a, "e1", t0), Err(Over::Environment));
        // The same environment for another credential is not affected.
        p.admit(b, "e1", t0).unwrap();
        p.admit(a, "e2", t0).unwrap();
        assert_eq!(p.admit(a, "e3", t0), Err(Over::Credential));
        p.admit(b, "e2", t0).unwrap();
        // Five outstanding: the node is full, for a third credential too.
        assert_eq!(p.admit(c, "e9", t0), Err(Over::Node));
        // A refusal counts nothing: once the first answers expire there is
        // room again, for each bound.
        let later = t0 + Duration::from_secs(61);
        p.admit(c, "e9", later).unwrap();
        p.admit(a, "e1", later).unwrap();
        p.admit(a, "e1", later).unwrap();
        let s = p.state.lock().unwrap();
        assert_eq!(s.total, 3);
        assert_eq!(s.per_credential.values().sum::<usize>(), 3);
    }
}
