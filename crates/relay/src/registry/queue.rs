//! Frames a node holds for harnesses, and the budgets that bound them.
//!
//! An executor's reader never waits for a harness (one harness that stops
//! reading must not hold its executor's other streams), so what a harness
//! does not read piles up on the node. Three budgets bound it, each counted
//! in what the frames hold in memory ([`charge`]):
//! - a stream: [`STREAM_BUFFER_BYTES`], past which that stream is reset;
//! - an environment: [`ENVIRONMENT_BUFFER_BYTES`], so one tenant's stalled
//!   streams cannot take the node's memory, however many it opens;
//! - the node: [`DEFAULT_NODE_BUFFER_BYTES`] unless configured, so many
//!   environments together cannot either.
//!
//! Past an environment's or the node's budget, the stream holding the most in
//! that scope is reset (a stalled one, not the reader that happened to push
//! next), and its frames are freed at once ([`HarnessQueue::forfeit`]), so
//! the bytes counted are always the bytes held.

use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Bytes queued towards one harness before its stream is reset: 32 MiB,
/// four times the output window an acknowledging client lets a process
/// have in flight (8 MiB), so only a harness that stopped reading gets there.
pub const STREAM_BUFFER_BYTES: usize = 32 << 20;
/// Bytes queued towards all the harnesses of one environment: 64 MiB, two
/// streams' budgets (a client that reads keeps its stream far below its own).
pub const ENVIRONMENT_BUFFER_BYTES: usize = 64 << 20;
/// Bytes queued towards all harnesses on a node unless configured: 512 MiB.
pub const DEFAULT_NODE_BUFFER_BYTES: usize = 512 << 20;

/// What a queued frame costs beyond its bytes (its allocation's header, its
/// handle, its slot in the queue), charged to the budgets so that a flood
/// of tiny frames is bounded by memory, not by payload: 128 bytes.
const QUEUED_FRAME_OVERHEAD: usize = 128;

/// What `frame` costs the budgets while it is queued or being written.
pub fn charge(frame: &Bytes) -> usize {
    frame.len() + QUEUED_FRAME_OVERHEAD
}

/// Which budget a frame would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The stream's own ([`STREAM_BUFFER_BYTES`]).
    Stream,
    /// Its environment's ([`ENVIRONMENT_BUFFER_BYTES`]).
    Environment,
    /// The node's.
    Node,
}

/// Why [`HarnessQueue::push`] did not queue a frame.
#[derive(Debug)]
pub enum Refused {
    /// The harness's writer is gone (or the stream was reset).
    Gone,
    /// Queuing it would pass this budget; the frame is handed back.
    Over(Scope, Bytes),
}

/// A shared byte count with its limit (an environment's or the node's).
#[derive(Debug, Clone)]
pub struct Pool {
    held: Arc<AtomicUsize>,
    limit: usize,
}

impl Pool {
    /// An empty pool of `limit` bytes.
    pub fn new(limit: usize) -> Pool {
        Pool {
            held: Arc::new(AtomicUsize::new(0)),
            limit,
        }
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    fn take(&self, n: usize) -> bool {
        if self.held.fetch_add(n, Ordering::SeqCst) + n > self.limit {
            self.held.fetch_sub(n, Ordering::SeqCst);
            return false;
        }
        true
    }

    fn give(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::SeqCst);
    }
}

struct Held {
    frames: VecDeque<Bytes>,
    bytes: usize,
    /// No more frames are taken: the writer is gone or the stream was reset.
    closed: bool,
}

/// Frames from an executor towards one harness socket, charged to the
/// stream's, its environment's and the node's budgets until the harness's
/// writer has written them (or given up): a frame taken off the queue stays
/// charged until [`HarnessQueue::release`]. Cheap to clone (shared).
#[derive(Clone)]
pub struct HarnessQueue {
    held: Arc<Mutex<Held>>,
    ready: Arc<Notify>,
    environment: Pool,
    node: Pool,
}

impl HarnessQueue {
    /// An empty queue counted against `environment` and `node`.
    pub fn new(environment: Pool, node: Pool) -> HarnessQueue {
        HarnessQueue {
            held: Arc::new(Mutex::new(Held {
                frames: VecDeque::new(),
                bytes: 0,
                closed: false,
            })),
            ready: Arc::new(Notify::new()),
            environment,
            node,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `other` is this very queue (not another with the same id).
    pub fn same(&self, other: &HarnessQueue) -> bool {
        Arc::ptr_eq(&self.held, &other.held)
    }

    /// Bytes this stream holds now, queued or being written (as charged).
    pub fn held(&self) -> usize {
        self.lock().bytes
    }

    /// Frames queued and not yet taken by the writer.
    #[cfg(test)]
    pub fn queued_frames(&self) -> usize {
        self.lock().frames.len()
    }

    /// Queues `frame`, or says which budget it would pass (handing it back).
    pub fn push(&self, frame: Bytes) -> Result<(), Refused> {
        let n = charge(&frame);
        let mut held = self.lock();
        if held.closed {
            return Err(Refused::Gone);
        }
        if held.bytes + n > STREAM_BUFFER_BYTES {
            return Err(Refused::Over(Scope::Stream, frame));
        }
        if !self.environment.take(n) {
            return Err(Refused::Over(Scope::Environment, frame));
        }
        if !self.node.take(n) {
            self.environment.give(n);
            return Err(Refused::Over(Scope::Node, frame));
        }
        held.bytes += n;
        held.frames.push_back(frame);
        drop(held);
        self.ready.notify_one();
        Ok(())
    }

    /// The next frame, waiting for one; `None` once the queue is closed and
    /// empty.
    pub async fn recv(&self) -> Option<Bytes> {
        loop {
            // Registered before the check, so a push in between is not lost.
            let notified = self.ready.notified();
            if let Some(frame) = self.try_recv() {
                return Some(frame);
            }
            if self.lock().closed {
                return None;
            }
            notified.await;
        }
    }

    /// A frame already queued, without waiting. It stays charged until
    /// [`HarnessQueue::release`].
    pub fn try_recv(&self) -> Option<Bytes> {
        self.lock().frames.pop_front()
    }

    /// Frames taken off this queue, costing `n` ([`charge`]), are written or
    /// dropped: they no longer count.
    pub fn release(&self, n: usize) {
        let mut held = self.lock();
        let n = n.min(held.bytes);
        held.bytes -= n;
        drop(held);
        self.environment.give(n);
        self.node.give(n);
    }

    /// Closes the queue and frees what is queued at once: for a stream being
    /// reset, or a writer that is gone (what its writer has taken counts
    /// until the writer releases it, which a reset makes it do at once).
    /// Returns the bytes freed.
    pub fn forfeit(&self) -> usize {
        let mut held = self.lock();
        held.closed = true;
        let freed: usize = held.frames.drain(..).map(|f| charge(&f)).sum();
        held.bytes -= freed;
        drop(held);
        self.environment.give(freed);
        self.node.give(freed);
        self.ready.notify_one();
        freed
    }

    /// Closes the queue after what it holds: the writer sends that, then ends.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_budget_refuses_with_its_scope_and_gives_the_frame_back() {
        let frame = Bytes::from(vec![1u8; 1000]);
        let cost = charge(&frame);
        // Room for two frames in the environment, three on the node.
        let environment = Pool::new(2 * cost);
        let node = Pool::new(3 * cost);
        let a = HarnessQueue::new(environment.clone(), node.clone());
        let b = HarnessQueue::new(Pool::new(usize::MAX), node.clone());
        assert!(a.push(frame.clone()).is_ok() && a.push(frame.clone()).is_ok());
        match a.push(frame.clone()) {
            Err(Refused::Over(Scope::Environment, back)) => assert_eq!(back, frame),
            other => panic!("{other:?}"),
        }
        assert!(b.push(frame.clone()).is_ok());
        assert!(matches!(
            b.push(frame.clone()),
            Err(Refused::Over(Scope::Node, _))
        ));
        // A refusal takes nothing.
        assert_eq!((environment.held(), node.held()), (2 * cost, 3 * cost));
        let big = Bytes::from(vec![0u8; STREAM_BUFFER_BYTES]);
        let c = HarnessQueue::new(Pool::new(usize::MAX), Pool::new(usize::MAX));
        assert!(matches!(c.push(big), Err(Refused::Over(Scope::Stream, _))));
    }

    #[tokio::test]
    async fn taking_a_frame_or_forfeiting_frees_it_everywhere() {
        let frame = Bytes::from(vec![1u8; 4096]);
        let (environment, node) = (Pool::new(1 << 20), Pool::new(1 << 20));
        let q = HarnessQueue::new(environment.clone(), node.clone());
        for _ in 0..3 {
            q.push(frame.clone()).unwrap();
        }
        assert_eq!(q.recv().await, Some(frame.clone()));
        // Taken but not yet written: still counted.
        assert_eq!(q.held(), 3 * charge(&frame));
        q.release(charge(&frame));
        assert_eq!(q.held(), 2 * charge(&frame));
        assert_eq!((environment.held(), node.held()), (q.held(), q.held()));
        assert_eq!(q.forfeit(), 2 * charge(&frame));
        assert_eq!((q.held(), environment.held(), node.held()), (0, 0, 0));
        assert!(matches!(q.push(frame), Err(Refused::Gone)));
        assert_eq!(q.recv().await, None, "a forfeited queue gives nothing more");
    }

    #[tokio::test]
    async fn a_closed_queue_gives_what_it_holds_then_ends() {
        let q = HarnessQueue::new(Pool::new(1 << 20), Pool::new(1 << 20));
        let waiting = {
            let q = q.clone();
            tokio::spawn(async move { q.recv().await })
        };
        q.push(Bytes::from_static(b"x")).unwrap();
        assert_eq!(waiting.await.unwrap(), Some(Bytes::from_static(b"x")));
        q.push(Bytes::from_static(b"y")).unwrap();
        q.close();
        assert_eq!(q.recv().await, Some(Bytes::from_static(b"y")));
        assert_eq!(q.recv().await, None);
    }
}
