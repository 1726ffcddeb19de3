//! Per-process events released strictly in seq order, without gaps or duplicates,
//! whether they arrive as pushed notifications or in `process/read` replies.

use exec_server_protocol::types::{OutputStream, ReadResponse};
use std::collections::BTreeMap;
use tokio::sync::mpsc;

/// One event of a process, in seq order.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcessEvent {
    /// A chunk of output.
    Output {
        /// Sequence number.
        seq: u64,
        /// Source stream.
        stream: OutputStream,
        /// The bytes.
        data: Vec<u8>,
    },
    /// The process exited: status, or 128+N for signal N.
    Exited {
        /// Sequence number.
        seq: u64,
        /// Exit code.
        code: i32,
    },
    /// All output is drained; the last event.
    Closed {
        /// Sequence number.
        seq: u64,
    },
    /// Events were lost (the server no longer retained them) or the session could
    /// not be recovered. Terminal.
    Failed(String),
}

/// The ordering buffer of one process.
pub struct OrderedEvents {
    last_published: u64,
    pending: BTreeMap<u64, ProcessEvent>,
    exit_published: bool,
    closed: bool,
    failed: bool,
    tx: mpsc::UnboundedSender<ProcessEvent>,
}

impl OrderedEvents {
    /// A buffer publishing into `tx`.
    pub fn new(tx: mpsc::UnboundedSender<ProcessEvent>) -> Self {
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
            let _ = self.tx.send(ev);
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
        let _ = self.tx.send(event);
    }

    /// Fails the stream with `why` (terminal).
    pub fn fail(&mut self, why: String) {
        self.fail_with(ProcessEvent::Failed(why));
    }

    /// Applies a `process/read` reply made with `afterSeq = last_published` during
    /// recovery: buffers its chunks, places the close and exit events, and fails the
    /// stream if any other seq is missing (the server dropped it). Returns the number
    /// of output bytes released.
    pub fn recover(&mut self, r: ReadResponse) -> usize {
        if let Some(f) = r.failure {
            self.fail(format!("process failed: {f}"));
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
                    self.fail(format!("close event conflicts with output at seq {target}"));
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
        match (
            missing.as_slice(),
            r.exited && !self.exit_published,
            r.exit_code,
        ) {
            ([], _, _) => {}
            ([one], true, Some(code)) => {
                self.pending
                    .insert(*one, ProcessEvent::Exited { seq: *one, code });
            }
            _ => {
                self.fail(format!(
                    "process events are no longer retained while recovering through sequence {target}"
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

    fn out(seq: u64, s: &str) -> ProcessEvent {
        ProcessEvent::Output {
            seq,
            stream: OutputStream::Stdout,
            data: s.as_bytes().to_vec(),
        }
    }

    #[test]
    fn releases_in_order_without_duplicates() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut o = OrderedEvents::new(tx);
        o.add(out(2, "b"));
        assert!(rx.try_recv().is_err(), "held until seq 1 arrives");
        o.add(out(1, "a"));
        o.add(out(1, "a"));
        o.add(ProcessEvent::Exited { seq: 3, code: 0 });
        o.add(ProcessEvent::Closed { seq: 4 });
        let got: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(
            got,
            vec![
                out(1, "a"),
                out(2, "b"),
                ProcessEvent::Exited { seq: 3, code: 0 },
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
                    chunk: ByteChunk(d.as_bytes().to_vec()),
                })
                .collect(),
            next_seq: next,
            exited,
            exit_code: code,
            closed,
            failure: None,
            sandbox_denied: false,
        }
    }

    #[test]
    fn recovery_places_exit_and_close() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut o = OrderedEvents::new(tx);
        o.add(out(1, "a"));
        o.recover(page(&[(2, "b")], 5, true, Some(3), true));
        let got: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(
            got,
            vec![
                out(1, "a"),
                out(2, "b"),
                ProcessEvent::Exited { seq: 3, code: 3 },
                ProcessEvent::Closed { seq: 4 }
            ]
        );
    }

    #[test]
    fn recovery_reports_a_gap() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut o = OrderedEvents::new(tx);
        o.add(out(1, "a"));
        o.recover(page(&[(5, "e")], 6, false, None, false));
        let got: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[1],
            ProcessEvent::Failed(
                "process events are no longer retained while recovering through sequence 5".into()
            )
        );
        assert!(o.is_finished());
    }
}
