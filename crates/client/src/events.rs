//! Per-process events released strictly in seq order, without gaps or duplicates,
//! whether they arrive as pushed notifications or in `process/read` replies, into
//! a queue bounded by bytes ([`MAX_QUEUED_OUTPUT_BYTES`]) that the process's
//! consumer drains.

use exec_server_protocol::types::{OutputStream, ReadResponse};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Notify;

/// Output bytes a process's queue holds before the connection's reader waits
/// for the consumer: 16 MiB, or the output window asked of the server and
/// 1 MiB more when that is larger. With a server that
/// supports `process/ack` the queue never gets there (the server stops at
/// its window of unacknowledged output, 8 MiB unless asked, and the
/// consumer acknowledges as it takes events); with one that does not, a
/// slow consumer slows the connection instead of growing memory.
pub const MAX_QUEUED_OUTPUT_BYTES: usize = 16 * 1024 * 1024;

#[derive(Default)]
struct QueueState {
    events: VecDeque<ProcessEvent>,
    output_bytes: usize,
    sender_gone: bool,
    receiver_gone: bool,
}

struct Queue {
    state: Mutex<QueueState>,
    readable: Notify,
    writable: Notify,
    /// Output bytes at which the connection's reader waits for room.
    cap: std::sync::atomic::AtomicUsize,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn output_len(ev: &ProcessEvent) -> usize {
    match ev {
        ProcessEvent::Output { data, .. } => data.len(),
        _ => 0,
    }
}

/// The producing end of a process's event queue.
pub(crate) struct EventSender(Arc<Queue>);

/// The consuming end of a process's event queue.
pub(crate) struct EventReceiver(Arc<Queue>);

/// Waits for room in a queue without holding the process table.
#[derive(Clone)]
pub(crate) struct RoomWaiter(Arc<Queue>);

/// A new, empty queue that holds up to [`MAX_QUEUED_OUTPUT_BYTES`] of
/// output, or `window` and 1 MiB more when the server stops at a window of
/// its own larger than that (`outputWindowBytes`): with a consumer that
/// acknowledges, the server's window is then what bounds the queue, and a
/// slow consumer never holds the connection's reader up.
pub(crate) fn event_queue(window: Option<u64>) -> (EventSender, EventReceiver) {
    let beyond_window = window
        .and_then(|w| usize::try_from(w).ok())
        .map_or(0, |w| w.saturating_add(crate::client::ACK_EVERY_BYTES));
    let q = Arc::new(Queue {
        state: Mutex::default(),
        readable: Notify::new(),
        writable: Notify::new(),
        cap: MAX_QUEUED_OUTPUT_BYTES.max(beyond_window).into(),
    });
    (EventSender(q.clone()), EventReceiver(q))
}

impl EventSender {
    fn send(&self, ev: ProcessEvent) {
        let mut st = self.0.lock();
        if st.receiver_gone {
            return;
        }
        st.output_bytes += output_len(&ev);
        st.events.push_back(ev);
        drop(st);
        self.0.readable.notify_one();
    }
}

impl Drop for EventSender {
    fn drop(&mut self) {
        self.0.lock().sender_gone = true;
        self.0.readable.notify_one();
    }
}

impl RoomWaiter {
    /// Returns once the queue holds less than its cap of output (see
    /// [`event_queue`]), or its consumer is gone.
    pub async fn wait(&self) {
        loop {
            let notified = self.0.writable.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = self.0.lock();
                let cap = self.0.cap.load(std::sync::atomic::Ordering::Relaxed);
                if st.receiver_gone || st.output_bytes < cap {
                    return;
                }
            }
            notified.await;
        }
    }
}

impl EventReceiver {
    /// The next event; `None` once the producer is gone and the queue empty.
    pub async fn recv(&mut self) -> Option<ProcessEvent> {
        loop {
            {
                let mut st = self.0.lock();
                if let Some(ev) = st.events.pop_front() {
                    st.output_bytes -= output_len(&ev);
                    drop(st);
                    self.0.writable.notify_waiters();
                    return Some(ev);
                }
                if st.sender_gone {
                    return None;
                }
            }
            self.0.readable.notified().await;
        }
    }

    /// The server turned out not to acknowledge output, so no window of its
    /// own bounds this queue: back to [`MAX_QUEUED_OUTPUT_BYTES`].
    pub fn without_server_window(&self) {
        self.0.cap.store(
            MAX_QUEUED_OUTPUT_BYTES,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Output bytes waiting in the queue.
    pub fn queued_output_bytes(&self) -> usize {
        self.0.lock().output_bytes
    }
}

impl Drop for EventReceiver {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.receiver_gone = true;
        st.events.clear();
        st.output_bytes = 0;
        drop(st);
        self.0.writable.notify_waiters();
    }
}

/// One event of a process, in seq order.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcessEvent {
    /// A chunk of output.
    Output {
        /// Sequence number.
        seq: u64,
        /// Source stream.
        stream: OutputStream,
        /// The bytes: a view of the message they arrived in (a 1 MiB
        /// binary frame's payload is not copied out).
        data: bytes::Bytes,
    },
    /// The process exited: status, or 128+N for signal N.
    Exited {
        /// Sequence number.
        seq: u64,
        /// Exit code.
        code: i32,
        /// The limit that ended it (`Command::timeout` and the like; only
        /// from servers that advertise `processLimits`), else `None`.
        limit: Option<exec_server_protocol::types::LimitReason>,
        /// The signal that ended it (`SIGKILL`, …), from servers that
        /// report it; `None` for a normal exit.
        signal: Option<String>,
    },
    /// All output is drained; the last event.
    Closed {
        /// Sequence number.
        seq: u64,
    },
    /// The stream ended without [`Closed`](Self::Closed): events were lost, the
    /// session could not be recovered, or the server reported the process
    /// failed. Terminal; [`StreamFailure::reason`] says which.
    Failed(StreamFailure),
}

/// Why a process's event stream ended early ([`ProcessEvent::Failed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureReason {
    /// The server no longer held events this client had not seen (they were
    /// dropped while the connection was down): output is incomplete.
    EventsLost,
    /// The connection ended and the session could not be resumed (or the
    /// server no longer knows the process): the process may still run.
    RecoveryFailed,
    /// The server reported that the process failed (its `failure` text).
    ProcessFailed,
    /// A reply that contradicts the protocol (undecodable, or a close placed
    /// on an output seq).
    Protocol,
}

/// A failed event stream: a [`FailureReason`] to branch on and a message for
/// people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamFailure {
    /// Why.
    pub reason: FailureReason,
    /// What happened, for people.
    pub message: String,
}

impl StreamFailure {
    /// A failure for `reason` described by `message`.
    pub fn new(reason: FailureReason, message: impl Into<String>) -> Self {
        StreamFailure {
            reason,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for StreamFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StreamFailure {}

/// The ordering buffer of one process.
pub(crate) struct OrderedEvents {
    last_published: u64,
    pending: BTreeMap<u64, ProcessEvent>,
    exit_published: bool,
    closed: bool,
    failed: bool,
    tx: EventSender,
}

impl OrderedEvents {
    /// A buffer publishing into `tx`.
    pub fn new(tx: EventSender) -> Self {
        OrderedEvents {
            last_published: 0,
            pending: BTreeMap::new(),
            exit_published: false,
            closed: false,
            failed: false,
            tx,
        }
    }

    /// Seq of the last event released.
    pub fn last_published(&self) -> u64 {
        self.last_published
    }

    /// Waits for room in the consumer's queue (see [`RoomWaiter::wait`]).
    pub fn room(&self) -> RoomWaiter {
        RoomWaiter(self.tx.0.clone())
    }

    /// The lowest seq held back behind a gap, if any (none once finished:
    /// the end clears what is held). On one connection the server pushes
    /// in seq order, so a later event pushed first means the next one was
    /// not pushed, and only a `process/read` brings it.
    pub fn first_held(&self) -> Option<u64> {
        self.pending.keys().next().copied()
    }

    /// True once `Closed` or `Failed` was released.
    pub fn is_finished(&self) -> bool {
        self.closed || self.failed
    }

    /// Adds an event (duplicates and already-published seqs are ignored) and
    /// releases what is now contiguous. Returns the number of output bytes released.
    pub fn add(&mut self, event: ProcessEvent) -> usize {
        let seq = match &event {
            ProcessEvent::Output { seq, .. }
            | ProcessEvent::Exited { seq, .. }
            | ProcessEvent::Closed { seq } => *seq,
            ProcessEvent::Failed(_) => {
                self.fail_with(event);
                return 0;
            }
        };
        if self.is_finished() || seq <= self.last_published {
            return 0;
        }
        self.pending.entry(seq).or_insert(event);
        self.release()
    }

    fn release(&mut self) -> usize {
        let mut bytes = 0;
        while let Some(ev) = self.pending.remove(&(self.last_published + 1)) {
            self.last_published += 1;
            match &ev {
                ProcessEvent::Output { data, .. } => bytes += data.len(),
                ProcessEvent::Exited { .. } => self.exit_published = true,
                ProcessEvent::Closed { .. } => self.closed = true,
                ProcessEvent::Failed(_) => {}
            }
            self.tx.send(ev);
            if self.closed {
                self.pending.clear();
                break;
            }
        }
        bytes
    }

    fn fail_with(&mut self, event: ProcessEvent) {
        if self.is_finished() {
            return;
        }
        self.failed = true;
        self.pending.clear();
        self.tx.send(event);
    }

    /// Fails the stream with `why` (terminal).
    pub fn fail(&mut self, why: StreamFailure) {
        self.fail_with(ProcessEvent::Failed(why));
    }

    /// Applies a `process/read` reply made with `afterSeq = last_published` during
    /// recovery: buffers its chunks, places the close and exit events, and fails the
    /// stream if any other seq is missing (the server dropped it). Returns the number
    /// of output bytes released.
    pub fn recover(&mut self, r: ReadResponse) -> usize {
        if let Some(f) = r.failure {
            self.fail(StreamFailure::new(
                FailureReason::ProcessFailed,
                format!("process failed: {f}"),
            ));
            return 0;
        }
        let target = r.next_seq.saturating_sub(1);
        if target <= self.last_published || self.is_finished() {
            return 0;
        }
        for c in r.chunks {
            if c.seq > self.last_published {
                self.pending.entry(c.seq).or_insert(ProcessEvent::Output {
                    seq: c.seq,
                    stream: c.stream,
                    data: c.chunk.0,
                });
            }
        }
        if r.closed {
            match self.pending.get(&target) {
                Some(ProcessEvent::Output { .. }) => {
                    self.fail(StreamFailure::new(
                        FailureReason::Protocol,
                        format!("close event conflicts with output at seq {target}"),
                    ));
                    return 0;
                }
                _ => {
                    self.pending
                        .insert(target, ProcessEvent::Closed { seq: target });
                }
            }
        }
        let missing: Vec<u64> = (self.last_published + 1..=target)
            .filter(|s| !self.pending.contains_key(s))
            .collect();
        // A read carries the exit as a flag, not at its seq: the one seq it
        // leaves out is the exit's, unless the exit is already here (pushed
        // ahead of the gap), and then that seq is lost output.
        let exit_pending = self
            .pending
            .values()
            .any(|e| matches!(e, ProcessEvent::Exited { .. }));
        match (
            missing.as_slice(),
            r.exited && !self.exit_published && !exit_pending,
            r.exit_code,
        ) {
            ([], _, _) => {}
            ([one], true, Some(code)) => {
                self.pending.insert(
                    *one,
                    ProcessEvent::Exited {
                        seq: *one,
                        code,
                        limit: r.limit,
                        signal: r.signal.clone(),
                    },
                );
            }
            _ => {
                self.fail(StreamFailure::new(
                    FailureReason::EventsLost,
                    format!(
                        "process events are no longer retained while recovering through sequence {target}"
                    ),
                ));
                return 0;
            }
        }
        self.release()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exec_server_protocol::types::ProcessOutputChunk;
    use exec_server_protocol::ByteChunk;

    fn drain(rx: &mut EventReceiver) -> impl Iterator<Item = ProcessEvent> {
        let mut st = rx.0.lock();
        st.output_bytes = 0;
        std::mem::take(&mut st.events).into_iter()
    }

    fn exited(seq: u64, code: i32) -> ProcessEvent {
        ProcessEvent::Exited {
            seq,
            code,
            limit: None,
            signal: None,
        }
    }

    fn out(seq: u64, s: &str) -> ProcessEvent {
        ProcessEvent::Output {
            seq,
            stream: OutputStream::Stdout,
            data: bytes::Bytes::copy_from_slice(s.as_bytes()),
        }
    }

    #[tokio::test]
    async fn a_queue_behind_a_larger_server_window_holds_all_of_it() {
        let window = 32 * 1024 * 1024;
        // Output chunks of these sizes added in turn to a queue made for
        // `window` (the server then acknowledging, or not): whether the
        // reader had room after each.
        let room_after = |server_acks: bool, chunks: &[usize]| {
            let (tx, rx) = event_queue(Some(window as u64));
            if !server_acks {
                rx.without_server_window();
            }
            let mut o = OrderedEvents::new(tx);
            let room = o.room();
            let mut seq = 0;
            chunks
                .iter()
                .map(|&n| {
                    seq += 1;
                    o.add(ProcessEvent::Output {
                        seq,
                        stream: OutputStream::Stdout,
                        data: vec![1u8; n].into(),
                    });
                    futures_poll_once(Box::pin(room.wait()).as_mut()).is_ready()
                })
                .collect::<Vec<_>>()
        };
        // A full window from the server still leaves room: the reader
        // never waits on a consumer the server already holds back.
        assert_eq!(
            room_after(true, &[window, crate::client::ACK_EVERY_BYTES]),
            [true, false]
        );
        // A server that turns out not to acknowledge bounds nothing: the
        // queue is back to its own cap.
        assert_eq!(room_after(false, &[MAX_QUEUED_OUTPUT_BYTES]), [false]);
    }

    #[tokio::test]
    async fn the_queue_is_bounded_by_bytes_and_frees_room_as_it_is_read() {
        let (tx, mut rx) = event_queue(None);
        let mut o = OrderedEvents::new(tx);
        let room = o.room();
        let big = vec![1u8; MAX_QUEUED_OUTPUT_BYTES / 2];
        for seq in 1..=2 {
            o.add(ProcessEvent::Output {
                seq,
                stream: OutputStream::Stdout,
                data: big.clone().into(),
            });
        }
        assert_eq!(rx.queued_output_bytes(), MAX_QUEUED_OUTPUT_BYTES);
        let mut wait = Box::pin(room.wait());
        assert!(
            futures_poll_once(wait.as_mut()).is_pending(),
            "a full queue has no room"
        );
        assert!(matches!(
            rx.recv().await,
            Some(ProcessEvent::Output { seq: 1, .. })
        ));
        tokio::time::timeout(std::time::Duration::from_secs(5), wait)
            .await
            .expect("room after a read");
        // A consumer that went away never blocks the producer.
        drop(rx);
        o.add(ProcessEvent::Output {
            seq: 3,
            stream: OutputStream::Stdout,
            data: big.clone().into(),
        });
        tokio::time::timeout(std::time::Duration::from_secs(5), o.room().wait())
            .await
            .expect("no consumer, no wait");
    }

    fn futures_poll_once<F: std::future::Future>(
        f: std::pin::Pin<&mut F>,
    ) -> std::task::Poll<F::Output> {
        let waker = std::task::Waker::noop();
        f.poll(&mut std::task::Context::from_waker(waker))
    }

    #[test]
    fn releases_in_order_without_duplicates() {
        let (tx, mut rx) = event_queue(None);
        let mut o = OrderedEvents::new(tx);
        o.add(out(2, "b"));
        assert_eq!(rx.queued_output_bytes(), 0, "held until seq 1 arrives");
        o.add(out(1, "a"));
        o.add(out(1, "a"));
        o.add(exited(3, 0));
        o.add(ProcessEvent::Closed { seq: 4 });
        let got: Vec<_> = drain(&mut rx).collect();
        assert_eq!(
            got,
            vec![
                out(1, "a"),
                out(2, "b"),
                exited(3, 0),
                ProcessEvent::Closed { seq: 4 }
            ]
        );
    }

    fn page(
        chunks: &[(u64, &str)],
        next: u64,
        exited: bool,
        code: Option<i32>,
        closed: bool,
    ) -> ReadResponse {
        ReadResponse {
            chunks: chunks
                .iter()
                .map(|(s, d)| ProcessOutputChunk {
                    seq: *s,
                    stream: OutputStream::Stdout,
                    chunk: ByteChunk::from(d.as_bytes().to_vec()),
                })
                .collect(),
            next_seq: next,
            exited,
            exit_code: code,
            closed,
            failure: None,
            sandbox_denied: false,
            limit: None,
            signal: None,
        }
    }

    #[test]
    fn recovery_places_exit_and_close() {
        let (tx, mut rx) = event_queue(None);
        let mut o = OrderedEvents::new(tx);
        o.add(out(1, "a"));
        o.recover(page(&[(2, "b")], 5, true, Some(3), true));
        let got: Vec<_> = drain(&mut rx).collect();
        assert_eq!(
            got,
            vec![
                out(1, "a"),
                out(2, "b"),
                exited(3, 3),
                ProcessEvent::Closed { seq: 4 }
            ]
        );
    }

    /// A gap behind a pushed exit is not taken for the exit: a read that
    /// does not hold the missing seq loses output, and says so.
    #[test]
    fn a_missing_seq_behind_a_pushed_exit_is_lost_output() {
        let (tx, mut rx) = event_queue(None);
        let mut o = OrderedEvents::new(tx);
        o.add(out(1, "a"));
        o.add(out(3, "c"));
        o.add(exited(4, 0));
        o.recover(page(&[(3, "c")], 5, true, Some(0), false));
        let got: Vec<_> = drain(&mut rx).collect();
        assert_eq!(
            got,
            vec![
                out(1, "a"),
                ProcessEvent::Failed(StreamFailure::new(
                    FailureReason::EventsLost,
                    "process events are no longer retained while recovering through sequence 4"
                ))
            ]
        );
    }

    #[test]
    fn recovery_reports_a_gap() {
        let (tx, mut rx) = event_queue(None);
        let mut o = OrderedEvents::new(tx);
        o.add(out(1, "a"));
        o.recover(page(&[(5, "e")], 6, false, None, false));
        let got: Vec<_> = drain(&mut rx).collect();
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[1],
            ProcessEvent::Failed(StreamFailure::new(
                FailureReason::EventsLost,
                "process events are no longer retained while recovering through sequence 5"
            ))
        );
        assert!(o.is_finished());
    }
}
