//! How many `/connect` answers a node has given that may still be used: each
//! stores two single-use authorizations in the store for up to a minute
//! (about 3.4 KB), so a token holder calling `/connect` in a loop would
//! otherwise fill the store (an adversarial pass took a node from 151 MB to
//! 1.2 GB in 25 s). Counted per environment and per node, each answer for as
//! long as its authorizations live; past either bound `/connect` is answered
//! `429 too_many_connects` with `retry-after`.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `/connect` answers one environment may have outstanding on one node:
/// 1 024 a minute, far more than clients starting sessions need.
pub const PER_ENVIRONMENT: usize = 1024;
/// `/connect` answers outstanding on one node across environments: 16 384
/// (about 56 MB of authorizations at most).
pub const PER_NODE: usize = 16 * 1024;

/// Which bound a `/connect` would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    /// [`PER_ENVIRONMENT`].
    Environment,
    /// [`PER_NODE`].
    Node,
}

/// Outstanding `/connect` answers, each until its authorizations expire.
pub struct PendingConnects {
    lifetime: Duration,
    per_environment: usize,
    per_node: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Expiry of each outstanding answer, oldest first, per environment.
    by_environment: HashMap<String, VecDeque<Instant>>,
    total: usize,
}

impl PendingConnects {
    /// Answers count for `lifetime` (the authorizations' longest TTL).
    pub fn new(lifetime: Duration) -> PendingConnects {
        PendingConnects::with_bounds(lifetime, PER_ENVIRONMENT, PER_NODE)
    }

    /// [`PendingConnects::new`] with other bounds.
    pub fn with_bounds(lifetime: Duration, per_environment: usize, per_node: usize) -> Self {
        PendingConnects {
            lifetime,
            per_environment,
            per_node,
            state: Mutex::new(State::default()),
        }
    }

    /// Counts one more answer for `env` at `now`, unless a bound is reached.
    pub fn admit(&self, env: &str, now: Instant) -> Result<(), Over> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let expired = |q: &mut VecDeque<Instant>| {
            let before = q.len();
            while q.front().is_some_and(|&t| t <= now) {
                q.pop_front();
            }
            before - q.len()
        };
        let mut freed = 0;
        if s.total >= self.per_node {
            // Full: every environment's expired answers go, and the empty go.
            s.by_environment.retain(|_, q| {
                freed += expired(q);
                !q.is_empty()
            });
        } else if let Some(q) = s.by_environment.get_mut(env) {
            freed += expired(q);
        }
        s.total -= freed;
        if s.total >= self.per_node {
            return Err(Over::Node);
        }
        let q = s.by_environment.entry(env.to_string()).or_default();
        if q.len() >= self.per_environment {
            return Err(Over::Environment);
        }
        q.push_back(now + self.lifetime);
        s.total += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bound_holds_until_answers_expire() {
        let p = PendingConnects::with_bounds(Duration::from_secs(60), 3, 5);
        let t0 = Instant::now();
        for _ in 0..3 {
            p.admit("a", t0).unwrap();
        }
        assert_eq!(p.admit("a", t0), Err(Over::Environment));
        p.admit("b", t0).unwrap();
        p.admit("b", t0).unwrap();
        // Five outstanding: the node is full for any environment.
        assert_eq!(p.admit("c", t0), Err(Over::Node));
        // A refusal counts nothing: once the first answers expire, there is
        // room again, for the same environment too.
        let later = t0 + Duration::from_secs(61);
        p.admit("c", later).unwrap();
        p.admit("a", later).unwrap();
        assert_eq!(p.state.lock().unwrap().total, 2);
    }
}
