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
//!
//! A frame is not queued at all while the harness's socket keeps up: with
//! nothing queued and the socket's writer idle, the executor's reader writes
//! it through ([`HarnessQueue::send`]) as far as the socket takes it without
//! waiting, from the core that just read it, and only what is left goes to
//! the harness's writer task. That saves a hand-over between tasks (and
//! often between cores) per frame on the relay's busiest path.
//!
//! A harness that agreed to masked frames, on a socket the node can splice
//! to, may also be sent frames exactly as its executor sent them, which the
//! executor's reader moves into this queue's pipe without copying them
//! ([`Item::Piped`], `splice_route.rs`); they take their turn among the
//! other frames, charged as they are.

pub use super::pipes::{PipeBudget, Splicing};
use crate::socket::splice::splice_out_now;
use crate::socket::{Outgoing, Remainder, Writer, WrittenNow};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Waker};
use tokio::io::AsyncWrite;
use tokio::sync::Notify;

/// A harness socket's writer as the node holds it.
pub type HarnessWriter = Writer<Box<dyn AsyncWrite + Unpin + Send>>;

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
pub(super) const QUEUED_FRAME_OVERHEAD: usize = 128;

/// What `frame` costs the budgets while it is queued or being written.
pub fn charge(frame: &Bytes) -> usize {
    frame.len() + QUEUED_FRAME_OVERHEAD
}

/// What a queue holds for its harness, in order.
#[derive(Debug)]
pub enum Item {
    /// A frame's payload: the writer adds its header.
    Frame(Bytes),
    /// This many bytes of a frame, header and masked payload as the
    /// executor sent them, waiting in the queue's pipe (the whole frame, or
    /// its start if a [`Item::Raw`] follows).
    Piped(usize),
    /// The rest of a piped frame that the socket took only part of: it
    /// must follow that part at once, before any pong or ping.
    PipedRest(usize),
    /// Bytes of a frame as the executor sent it, read because the pipe was
    /// full: the rest of the frame whose start is the [`Item::Piped`]
    /// before it, written as they are, at once after it.
    Raw(Bytes),
}

impl Item {
    /// What it costs the budgets while queued or being written.
    pub fn charge(&self) -> usize {
        let len = match self {
            Item::Frame(b) | Item::Raw(b) => b.len(),
            Item::Piped(n) | Item::PipedRest(n) => *n,
        };
        len + QUEUED_FRAME_OVERHEAD
    }

    /// Whether it continues a frame whose start went out before it.
    fn continues_a_frame(&self) -> bool {
        matches!(self, Item::PipedRest(_) | Item::Raw(_))
    }
}

/// The rest of a frame a turn writes before anything else.
pub enum Lead {
    /// Bytes read as they are.
    Raw(Bytes),
    /// Bytes in this pipe.
    Piped(Arc<Splicing>, usize),
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

    /// Takes `n` whatever the limit (for what cannot be refused any more).
    fn force(&self, n: usize) {
        self.held.fetch_add(n, Ordering::SeqCst);
    }

    fn give(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::SeqCst);
    }
}

struct Held {
    frames: VecDeque<Item>,
    bytes: usize,
    /// No more frames are taken: the writer is gone or the stream was reset.
    closed: bool,
    /// The harness socket's writer while nobody writes with it: `None`
    /// before it is attached and while its task writes.
    idle: Option<HarnessWriter>,
    /// What a write-through left of its frame (written before anything
    /// else), with its charge.
    owed: Option<(Remainder, usize)>,
    /// A write-through failed: the socket is unusable.
    broken: bool,
}

/// How far [`HarnessQueue::write_through`] got with an item.
enum Through {
    Written,
    /// In part: the rest is owed (a frame's, charged anew) or back at the
    /// queue's front (piped bytes', still charged `rest_charge`).
    Part {
        rest_charge: usize,
    },
    /// Not at all: the item is handed back.
    Blocked(Item),
    /// The socket failed.
    Failed,
}

/// What the harness's writer task is to do next ([`HarnessQueue::take_turn`]).
// Returned by value once per turn and matched at once, never stored: the
// size of `Write` costs nothing a box would save.
#[allow(clippy::large_enum_variant)]
pub enum Turn {
    /// Write the rest of a frame written through in part (if any), then
    /// the batch, with this writer; then [`HarnessQueue::end_turn`] with
    /// the charge given.
    Write {
        writer: HarnessWriter,
        owed: Option<Remainder>,
        charge: usize,
        /// The rest of a frame to write after `owed`, before the batch.
        lead: Option<Lead>,
        /// Bytes to splice from this pipe to the socket after the batch.
        piped: Option<(Arc<Splicing>, usize)>,
    },
    /// Nothing to write (yet).
    Idle,
    /// The queue is closed and written out: the writer stays idle for the
    /// close frame ([`HarnessQueue::finish`]).
    End,
    /// A write-through failed (or the writer was never attached): drop
    /// the socket without a close frame.
    Broken,
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
    splicing: Option<Arc<Splicing>>,
}

impl HarnessQueue {
    /// An empty queue counted against `environment` and `node`.
    pub fn new(environment: Pool, node: Pool) -> HarnessQueue {
        HarnessQueue {
            held: Arc::new(Mutex::new(Held {
                frames: VecDeque::new(),
                bytes: 0,
                closed: false,
                idle: None,
                owed: None,
                broken: false,
            })),
            ready: Arc::new(Notify::new()),
            environment,
            node,
            splicing: None,
        }
    }

    /// Frames for this queue's harness may be spliced to its socket
    /// through a pipe (the harness agreed to masked frames).
    pub fn with_splicing(mut self, splicing: Splicing) -> HarnessQueue {
        self.splicing = Some(Arc::new(splicing));
        self
    }

    /// Where frames for this harness may be spliced, while the queue is
    /// open and the harness takes them.
    pub fn splicing(&self) -> Option<&Arc<Splicing>> {
        self.splicing.as_ref().filter(|_| !self.lock().closed)
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

    /// Gives the queue the harness socket's writer, for write-throughs and
    /// for its writer task ([`HarnessQueue::take_turn`]).
    pub fn attach(&self, writer: HarnessWriter) {
        self.lock().idle = Some(writer);
    }

    /// Writes `frame` through to the harness's socket when its writer is
    /// idle: first what is queued, then `frame`, as far as the socket takes
    /// them without waiting (from the core that just read them, with no
    /// hand-over to the writer task). What is left is queued, `frame` as
    /// [`HarnessQueue::push_locked`] does, the rest of a frame written in
    /// part charged whatever the budgets (half a frame cannot be taken
    /// back). Errors as `push_locked`; [`Refused::Gone`] too when the
    /// socket failed.
    pub fn send(&self, frame: Bytes) -> Result<(), Refused> {
        let mut held = self.lock();
        if held.closed {
            return Err(Refused::Gone);
        }
        let mut incoming = VecDeque::from([Item::Frame(frame)]);
        self.write_through_all(&mut held, &mut incoming, false)?;
        if let Some(Item::Frame(f)) = incoming.pop_front() {
            self.push_locked(&mut held, f)?;
        }
        self.wake_task(held);
        Ok(())
    }

    /// Wakes the writer task if anything is left for it.
    fn wake_task(&self, held: std::sync::MutexGuard<'_, Held>) {
        let for_task = !held.frames.is_empty() || held.owed.is_some();
        drop(held);
        if for_task {
            self.ready.notify_one();
        }
    }

    /// Writes what is queued, then `incoming`, through to the harness's
    /// socket while its writer is idle and the socket takes each item whole
    /// without waiting; leaves the rest of `incoming` in it. `charged`:
    /// whether `incoming`'s items are charged already. Errors:
    /// [`Refused::Gone`] when the socket failed.
    fn write_through_all(
        &self,
        held: &mut Held,
        incoming: &mut VecDeque<Item>,
        charged: bool,
    ) -> Result<(), Refused> {
        if held.idle.is_none() || held.owed.is_some() || held.broken {
            return Ok(());
        }
        loop {
            // Whether it came off the queue (else from `incoming`).
            let (next, from_queue) = match held.frames.pop_front() {
                Some(f) => (f, true),
                None => match incoming.pop_front() {
                    Some(f) => (f, false),
                    None => return Ok(()),
                },
            };
            let cost = if from_queue || charged {
                next.charge()
            } else {
                0
            };
            match self.write_through(held, next) {
                Through::Written => self.uncharge(held, cost),
                Through::Part { rest_charge } => {
                    self.uncharge(held, cost.saturating_sub(rest_charge));
                    return Ok(());
                }
                Through::Blocked(back) if from_queue => {
                    held.frames.push_front(back);
                    return Ok(());
                }
                Through::Blocked(back) => {
                    incoming.push_front(back);
                    return Ok(());
                }
                Through::Failed => {
                    self.ready.notify_one();
                    return Err(Refused::Gone);
                }
            }
        }
    }

    /// One item written now, as far as the socket takes it.
    fn write_through(&self, held: &mut Held, item: Item) -> Through {
        let Some(writer) = held.idle.as_mut() else {
            return Through::Blocked(item);
        };
        let frame = match item {
            Item::Frame(f) => f,
            Item::Piped(len) => return self.splice_through(held, len, false),
            Item::PipedRest(len) => return self.splice_through(held, len, true),
            // Rare (the pipe was full): left to the writer task.
            raw @ Item::Raw(_) => return Through::Blocked(raw),
        };
        // The waker is not needed: whoever finishes the frame is woken by
        // `ready` and then polls the socket with its own.
        match writer.write_now(&mut Context::from_waker(Waker::noop()), frame) {
            Ok(WrittenNow::All) => Through::Written,
            Ok(WrittenNow::Nothing(frame)) => Through::Blocked(Item::Frame(frame)),
            Ok(WrittenNow::Part(rest)) => {
                let n = rest.len() + QUEUED_FRAME_OVERHEAD;
                self.environment.force(n);
                self.node.force(n);
                held.bytes += n;
                held.owed = Some((rest, n));
                Through::Part { rest_charge: 0 }
            }
            Err(_) => {
                held.broken = true;
                Through::Failed
            }
        }
    }

    /// `len` piped bytes (`rest`: the rest of a frame) spliced to the socket
    /// now, as far as it takes them; what is left goes back to the queue's
    /// front.
    fn splice_through(&self, held: &mut Held, len: usize, rest: bool) -> Through {
        let Some(splicing) = self.splicing.as_ref() else {
            held.broken = true;
            return Through::Failed;
        };
        let Some(pipe) = splicing.pipe() else {
            held.broken = true;
            return Through::Failed;
        };
        match splice_out_now(pipe, splicing.tcp.tcp(), len) {
            Ok(0) if rest => Through::Blocked(Item::PipedRest(len)),
            Ok(0) => Through::Blocked(Item::Piped(len)),
            Ok(n) if n >= len => Through::Written,
            Ok(n) => {
                held.frames.push_front(Item::PipedRest(len - n));
                Through::Part {
                    rest_charge: Item::PipedRest(len - n).charge(),
                }
            }
            Err(_) => {
                held.broken = true;
                Through::Failed
            }
        }
    }

    /// A frame that was charged `n` is gone (written).
    fn uncharge(&self, held: &mut Held, n: usize) {
        held.bytes -= n;
        self.environment.give(n);
        self.node.give(n);
    }

    /// Queues `frame` in an open queue, or says which budget it would pass
    /// (handing it back).
    fn push_locked(&self, held: &mut Held, frame: Bytes) -> Result<(), Refused> {
        if let Err(scope) = self.take_budget(held, charge(&frame)) {
            return Err(Refused::Over(scope, frame));
        }
        held.frames.push_back(Item::Frame(frame));
        Ok(())
    }

    /// Charges `n` bytes to the stream, its environment and the node, or
    /// says which budget they would pass (taking nothing).
    fn take_budget(&self, held: &mut Held, n: usize) -> Result<(), Scope> {
        if held.bytes + n > STREAM_BUFFER_BYTES {
            return Err(Scope::Stream);
        }
        if !self.environment.take(n) {
            return Err(Scope::Environment);
        }
        if !self.node.take(n) {
            self.environment.give(n);
            return Err(Scope::Node);
        }
        held.bytes += n;
        Ok(())
    }

    /// Waits until something may be there for [`HarnessQueue::take_turn`]
    /// (a frame, the rest of one, the end); may wake with nothing.
    pub async fn ready(&self) {
        self.ready.notified().await
    }

    /// The writer task's next turn: `batch` (which may already hold pongs
    /// and pings) gets up to [`crate::MAX_FRAMES_PER_FLUSH`] frames in all
    /// from the queue, which stay charged until [`HarnessQueue::end_turn`];
    /// the writer is the task's until then (nothing is written through
    /// meanwhile: it would overtake what the task writes).
    pub fn take_turn(&self, batch: &mut Vec<Outgoing>) -> Turn {
        let mut held = self.lock();
        if held.broken {
            return Turn::Broken;
        }
        let mut charge_taken = 0;
        // The rest of a frame half written goes first, before the pongs
        // and pings already in `batch`.
        let mut lead = None;
        if held.frames.front().is_some_and(Item::continues_a_frame) {
            let Some(item) = held.frames.pop_front() else {
                return Turn::Broken;
            };
            charge_taken += item.charge();
            lead = match item {
                Item::Raw(b) => Some(Lead::Raw(b)),
                Item::PipedRest(n) => match self.splicing.clone() {
                    Some(splicing) => Some(Lead::Piped(splicing, n)),
                    None => {
                        held.broken = true;
                        return Turn::Broken;
                    }
                },
                _ => None,
            };
        }
        // Piped bytes make a turn of their own (after the pongs and pings
        // in `batch`), so that every frame goes out in its order.
        let mut piped = None;
        let mut frames = 0;
        while batch.len() < crate::MAX_FRAMES_PER_FLUSH {
            let Some(item) = held.frames.pop_front() else {
                break;
            };
            match item {
                Item::Piped(n) if frames == 0 => {
                    let Some(splicing) = self.splicing.clone() else {
                        held.broken = true;
                        return Turn::Broken;
                    };
                    charge_taken += item.charge();
                    piped = Some((splicing, n));
                    break;
                }
                // Piped after frames, or the rest of a frame started by the
                // piped bytes just taken: the next turn's.
                Item::Piped(_) | Item::PipedRest(_) | Item::Raw(_) => {
                    held.frames.push_front(item);
                    break;
                }
                Item::Frame(b) => {
                    charge_taken += charge(&b);
                    frames += 1;
                    batch.push(Outgoing::Binary(b));
                }
            }
        }
        let owed = held.owed.take();
        if let Some((_, n)) = &owed {
            charge_taken += n;
        }
        let nothing = batch.is_empty() && owed.is_none() && piped.is_none() && lead.is_none();
        if nothing && !held.closed {
            return Turn::Idle;
        }
        if nothing {
            return Turn::End;
        }
        let Some(writer) = held.idle.take() else {
            held.broken = true;
            return Turn::Broken;
        };
        let owed = owed.map(|(rest, _)| rest);
        Turn::Write {
            writer,
            owed,
            charge: charge_taken,
            lead,
            piped,
        }
    }

    /// The writer task stops early (its stream reset, its socket failed):
    /// the queue is closed and what it holds freed, as
    /// [`HarnessQueue::forfeit`]; returns the idle writer, unless a
    /// write-through broke it, with the rest of a frame it owes.
    pub fn finish(&self) -> Option<(HarnessWriter, Option<Remainder>)> {
        // A frame half written whose rest is queued: a close frame would
        // land inside it, so the socket is dropped without one.
        let mid_frame = self
            .lock()
            .frames
            .front()
            .is_some_and(Item::continues_a_frame);
        self.forfeit();
        let mut held = self.lock();
        let owed = held.owed.take().map(|(rest, n)| {
            held.bytes -= n;
            self.environment.give(n);
            self.node.give(n);
            rest
        });
        let broken = held.broken || mid_frame;
        let writer = held.idle.take().filter(|_| !broken)?;
        Some((writer, owed))
    }

    /// The writer task is done with its turn: what the turn took
    /// (`charge`) is written or dropped, and the writer is idle again, or,
    /// given `None` (its write failed or was abandoned half way), gone:
    /// nothing is written through to that socket any more.
    pub fn end_turn(&self, writer: Option<HarnessWriter>, charge: usize) {
        let mut held = self.lock();
        match writer {
            Some(w) => held.idle = Some(w),
            None => held.broken = true,
        }
        drop(held);
        self.release(charge);
    }

    /// A frame already queued, without waiting, as a writer task's turn
    /// takes it (tests stand in for the task). It stays charged until
    /// [`HarnessQueue::release`].
    #[cfg(test)]
    pub fn try_recv(&self) -> Option<Bytes> {
        match self.lock().frames.pop_front()? {
            Item::Frame(b) | Item::Raw(b) => Some(b),
            Item::Piped(_) | Item::PipedRest(_) => None,
        }
    }

    /// Frames taken off this queue, costing `n` ([`charge`]), are written or
    /// dropped: they no longer count.
    pub(super) fn release(&self, n: usize) {
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
        let freed: usize = held.frames.drain(..).map(|i| i.charge()).sum();
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

mod reserved;
pub use reserved::Reserved;

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
