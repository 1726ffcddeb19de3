//! The pending-call table: calls this peer made and whose responses it awaits.
//!
//! Ids are integers from a counter. At most [`MAX_PENDING_CALLS`] calls are in
//! flight. An entry leaves the table when its response arrives,
//! when its timeout fires, or when the connection closes, in which case every
//! waiter gets [`CallError::Closed`] — a disconnect is never disguised as a
//! JSON-RPC error code.

use exec_server_protocol::{ErrorObject, RequestId};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// Calls allowed in flight at once: 1024.
pub const MAX_PENDING_CALLS: usize = 1024;

/// Why a call did not produce a result.
#[derive(Debug, Clone, PartialEq)]
pub enum CallError {
    /// The peer answered with a JSON-RPC error.
    Server(ErrorObject),
    /// The connection closed before the answer arrived.
    Closed,
    /// No answer within the call's timeout; the entry was removed.
    TimedOut,
    /// [`MAX_PENDING_CALLS`] calls are already in flight.
    PendingRequestLimitExceeded,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Server(e) => write!(f, "server error {}: {}", e.code, e.message),
            CallError::Closed => f.write_str("connection closed"),
            CallError::TimedOut => f.write_str("request timed out"),
            CallError::PendingRequestLimitExceeded => {
                write!(f, "more than {MAX_PENDING_CALLS} requests in flight")
            }
        }
    }
}

impl std::error::Error for CallError {}

/// A result, and the raw bytes of its `chunk` when it came in a binary frame.
type Answer = Result<(Value, Option<bytes::Bytes>), CallError>;

type Waiter = oneshot::Sender<Answer>;

#[derive(Default)]
struct Table {
    waiters: HashMap<i64, Waiter>,
    closed: bool,
}

/// The table. Cheap to clone (shared).
#[derive(Clone)]
pub struct PendingCalls {
    /// The first id given out; with `next_id`, the range of ids issued.
    first_id: i64,
    next_id: Arc<AtomicI64>,
    table: Arc<Mutex<Table>>,
    capacity: usize,
}

impl Default for PendingCalls {
    fn default() -> Self {
        PendingCalls {
            first_id: 0,
            next_id: Arc::default(),
            table: Arc::default(),
            capacity: MAX_PENDING_CALLS,
        }
    }
}

/// A registered call: its id and the receiver of its outcome.
pub struct PendingCall {
    /// The id to put in the request.
    pub id: RequestId,
    rx: oneshot::Receiver<Answer>,
    key: i64,
    table: PendingCalls,
}

impl PendingCalls {
    /// An empty table (ids from 0, at most [`MAX_PENDING_CALLS`] in flight).
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty table whose ids start at 1 and which holds at most `capacity`
    /// calls: the server's calls to its client (`network/policyRequest`, at
    /// most 256 in flight as in the reference).
    pub fn from_one(capacity: usize) -> Self {
        PendingCalls {
            first_id: 1,
            next_id: Arc::new(AtomicI64::new(1)),
            table: Arc::default(),
            capacity,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // A poisoned lock only means another thread panicked mid-update; the map is
        // still structurally sound.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a call. Errors with `PendingRequestLimitExceeded` when full and
    /// `Closed` after [`PendingCalls::close_all`].
    pub fn register(&self) -> Result<PendingCall, CallError> {
        let mut t = self.lock();
        if t.closed {
            return Err(CallError::Closed);
        }
        if t.waiters.len() >= self.capacity {
            return Err(CallError::PendingRequestLimitExceeded);
        }
        let key = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        t.waiters.insert(key, tx);
        Ok(PendingCall {
            id: RequestId::Integer(key),
            rx,
            key,
            table: self.clone(),
        })
    }

    /// Delivers a response or error for `id`. Returns false if no call waits for it
    /// (an unsolicited response).
    pub fn complete(&self, id: &RequestId, outcome: Result<Value, ErrorObject>) -> bool {
        self.deliver(id, outcome.map(|v| (v, None)).map_err(CallError::Server))
    }

    /// Delivers a result whose `chunk` came as a binary frame's payload
    /// (`result` is the head's, without `chunk`). False as [`Self::complete`].
    pub fn complete_with_payload(
        &self,
        id: &RequestId,
        result: Value,
        payload: bytes::Bytes,
    ) -> bool {
        self.deliver(id, Ok((result, Some(payload))))
    }

    fn deliver(&self, id: &RequestId, answer: Answer) -> bool {
        let RequestId::Integer(key) = id else {
            return false;
        };
        let waiter = self.lock().waiters.remove(key);
        match waiter {
            Some(w) => {
                let _ = w.send(answer);
                true
            }
            None => false,
        }
    }

    /// True when this table gave out `id`, whether its call still waits,
    /// was answered, timed out or was dropped: an answer to it that
    /// [`Self::complete`] refuses came late (or twice), not from nowhere.
    pub fn issued(&self, id: &RequestId) -> bool {
        let RequestId::Integer(key) = id else {
            return false;
        };
        (self.first_id..self.next_id.load(Ordering::Relaxed)).contains(key)
    }

    /// Fails every waiting call with `Closed` and refuses new ones.
    pub fn close_all(&self) {
        let waiters: Vec<_> = {
            let mut t = self.lock();
            t.closed = true;
            t.waiters.drain().map(|(_, w)| w).collect()
        };
        for w in waiters {
            let _ = w.send(Err(CallError::Closed));
        }
    }

    /// Calls in flight.
    pub fn len(&self) -> usize {
        self.lock().waiters.len()
    }

    /// True when no call is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn remove(&self, key: i64) {
        self.lock().waiters.remove(&key);
    }
}

impl PendingCall {
    /// Waits for the outcome; on timeout the entry is removed and `TimedOut` returned.
    /// A result that came with a binary payload gets it back as a base64
    /// `chunk` member, so a caller that expects the JSON form still sees it.
    pub async fn wait(self, timeout: Option<Duration>) -> Result<Value, CallError> {
        let (mut value, payload) = self.wait_with_payload(timeout).await?;
        if let Some(bytes) = payload {
            if let Value::Object(m) = &mut value {
                m.insert(
                    exec_server_protocol::binary::PAYLOAD_MEMBER.into(),
                    Value::String(exec_server_protocol::ByteChunk::encode(&bytes)),
                );
            }
        }
        Ok(value)
    }

    /// As [`Self::wait`], with the result's `chunk` apart when it came as a
    /// binary frame's payload (then absent from the value).
    pub async fn wait_with_payload(
        mut self,
        timeout: Option<Duration>,
    ) -> Result<(Value, Option<bytes::Bytes>), CallError> {
        let outcome = match timeout {
            Some(d) => match tokio::time::timeout(d, &mut self.rx).await {
                Ok(r) => r,
                Err(_) => {
                    self.table.remove(self.key);
                    return Err(CallError::TimedOut);
                }
            },
            None => (&mut self.rx).await,
        };
        outcome.unwrap_or(Err(CallError::Closed))
    }
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        // A caller that gave up (dropped its future) must not leak a slot.
        self.table.remove(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn out_of_order_responses_match_by_id() {
        let t = PendingCalls::new();
        let a = t.register().unwrap();
        let b = t.register().unwrap();
        let (ida, idb) = (a.id.clone(), b.id.clone());
        assert!(t.complete(&idb, Ok(json!("b"))));
        assert!(t.complete(&ida, Ok(json!("a"))));
        assert_eq!(a.wait(None).await.unwrap(), json!("a"));
        assert_eq!(b.wait(None).await.unwrap(), json!("b"));
        assert!(
            !t.complete(&ida, Ok(json!(1))),
            "second answer is unsolicited"
        );
    }

    #[tokio::test]
    async fn timeout_removes_entry() {
        let t = PendingCalls::new();
        let a = t.register().unwrap();
        let id = a.id.clone();
        assert_eq!(t.len(), 1);
        let r = a.wait(Some(Duration::from_millis(10))).await;
        assert_eq!(r, Err(CallError::TimedOut));
        assert_eq!(t.len(), 0);
        assert!(!t.complete(&id, Ok(json!(1))));
        assert!(t.issued(&id), "a late answer is told from an unknown id");
    }

    #[tokio::test]
    async fn issued_ids_are_only_those_given_out() {
        let t = PendingCalls::from_one(4);
        assert!(!t.issued(&RequestId::Integer(1)), "nothing given out yet");
        let a = t.register().unwrap();
        assert_eq!(a.id, RequestId::Integer(1));
        drop(a);
        let b = t.register().unwrap();
        assert!(t.complete(&b.id, Ok(json!(2))));
        for answered in [1, 2] {
            assert!(t.issued(&RequestId::Integer(answered)), "{answered}");
        }
        for never in [0, -1, 3, 77, i64::MAX] {
            assert!(!t.issued(&RequestId::Integer(never)), "{never}");
        }
        assert!(!t.issued(&RequestId::String("1".into())));
    }

    #[tokio::test]
    async fn close_wakes_every_waiter_with_closed() {
        let t = PendingCalls::new();
        let calls: Vec<_> = (0..5).map(|_| t.register().unwrap()).collect();
        let first = calls[0].id.clone();
        // A response read before the close is still delivered.
        t.complete(&first, Ok(json!("early")));
        t.close_all();
        let mut results = Vec::new();
        for c in calls {
            results.push(c.wait(None).await);
        }
        assert_eq!(results[0], Ok(json!("early")));
        assert!(results[1..].iter().all(|r| *r == Err(CallError::Closed)));
        assert_eq!(t.register().err(), Some(CallError::Closed));
    }

    #[tokio::test]
    async fn capacity_limit() {
        let t = PendingCalls::new();
        let held: Vec<_> = (0..MAX_PENDING_CALLS)
            .map(|_| t.register().unwrap())
            .collect();
        assert_eq!(
            t.register().err(),
            Some(CallError::PendingRequestLimitExceeded)
        );
        let first = &held[0];
        t.complete(&first.id.clone(), Ok(json!({})));
        assert!(t.register().is_ok(), "an answered call frees its slot");
        drop(held);
        assert!(t.register().is_ok());
        let e = t.complete(&RequestId::Integer(1), Err(ErrorObject::internal("x")));
        assert!(!e);
    }

    #[tokio::test]
    async fn server_side_table_counts_from_one_with_its_own_capacity() {
        let t = PendingCalls::from_one(2);
        let a = t.register().unwrap();
        assert_eq!(a.id, RequestId::Integer(1));
        let _b = t.register().unwrap();
        assert_eq!(
            t.register().err(),
            Some(CallError::PendingRequestLimitExceeded)
        );
    }

    #[tokio::test]
    async fn server_error_is_typed() {
        let t = PendingCalls::new();
        let a = t.register().unwrap();
        t.complete(&a.id.clone(), Err(ErrorObject::not_found("gone")));
        assert_eq!(
            a.wait(None).await,
            Err(CallError::Server(ErrorObject::not_found("gone")))
        );
    }
}
