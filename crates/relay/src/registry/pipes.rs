//! The pipes a node splices harnesses' frames through (`splice_route.rs`,
//! `socket/splice.rs`): one per stream that gets a large frame, made at its
//! first, bounded per node because each takes two file descriptors.

use crate::socket::splice::{Pipe, SharedTcp};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// How many harness pipes a node holds at once: each takes two file
/// descriptors, which the node's connection limit must leave room for.
#[derive(Debug)]
pub struct PipeBudget {
    open: AtomicUsize,
    limit: usize,
}

impl PipeBudget {
    /// At most `limit` pipes at once.
    pub fn new(limit: usize) -> PipeBudget {
        PipeBudget {
            open: AtomicUsize::new(0),
            limit,
        }
    }

    /// Pipes open now.
    #[cfg(test)]
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    fn take(&self) -> bool {
        if self.open.fetch_add(1, Ordering::SeqCst) >= self.limit {
            self.open.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    fn give(&self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A harness socket a node may splice frames to, and the pipe they go
/// through: made at its first use (a harness that never gets a large
/// frame costs no pipe) while the node's [`PipeBudget`] has room, kept
/// until the stream ends.
#[derive(Debug)]
pub struct Splicing {
    /// The harness's socket.
    pub tcp: SharedTcp,
    pipe: OnceLock<Pipe>,
    budget: Arc<PipeBudget>,
}

impl Splicing {
    /// Frames for `tcp` may go through a pipe counted in `budget`.
    pub fn new(tcp: SharedTcp, budget: Arc<PipeBudget>) -> Splicing {
        Splicing {
            tcp,
            pipe: OnceLock::new(),
            budget,
        }
    }

    /// The pipe, made now if it was not yet; `None` while the node holds
    /// as many pipes as its budget allows or none can be made (out of file
    /// descriptors): frames are then read as usual.
    pub fn pipe(&self) -> Option<&Pipe> {
        if let Some(p) = self.pipe.get() {
            return Some(p);
        }
        if !self.budget.take() {
            return None;
        }
        match Pipe::new() {
            // Only one task asks before the pipe exists (the executor's
            // reader), so this is the first.
            Ok(p) => {
                if let Err(p) = self.pipe.set(p) {
                    drop(p);
                    self.budget.give();
                }
                self.pipe.get()
            }
            Err(e) => {
                self.budget.give();
                tracing::debug!("no pipe for a harness socket: {e}");
                None
            }
        }
    }
}

impl Drop for Splicing {
    fn drop(&mut self) {
        if self.pipe.get().is_some() {
            self.budget.give();
        }
    }
}
