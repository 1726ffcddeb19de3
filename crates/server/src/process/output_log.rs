//! The per-process event log: one seq counter shared by output chunks, the exited
//! event and the closed event, with retention caps and flow control.
//!
//! Retention: chunks the client has been given (pushed on a live connection, returned
//! by `process/read`, or acknowledged) are kept up to [`RETAINED_OUTPUT_BYTES_PER_PROCESS`]
//! and [`RETAINED_OUTPUT_CHUNKS_PER_PROCESS`], oldest dropped first, as in the reference.
//! Chunks not yet delivered are never dropped: instead the reader of the child's
//! output pauses (the child blocks in `write(2)`) once the undelivered output reaches
//! the flow-control window. So output produced while no client is attached is
//! kept, not lost, and memory stays bounded.
//!
//! With a [`Spool`], delivered chunks trimmed from memory go to disk instead of
//! being dropped, up to the spool's caps; `process/read` then serves them from
//! there, at most [`SPOOL_PAGE_BYTES`] a page unless `maxBytes` asks for less.

use super::spool::{Spool, SPOOL_PAGE_BYTES};
use exec_server_protocol::types::{OutputStream, ProcessOutputChunk};
use exec_server_protocol::ByteChunk;
use std::collections::VecDeque;

/// Bytes of delivered output retained per process: 1 MiB, as in the reference.
pub const RETAINED_OUTPUT_BYTES_PER_PROCESS: usize = 1024 * 1024;
/// Chunks retained per process: 50 000, as in the reference.
pub const RETAINED_OUTPUT_CHUNKS_PER_PROCESS: usize = 50_000;
/// Undelivered output after which reading from the child pauses, for clients that
/// do not acknowledge (`process/ack`): 1 MiB, so nothing the reference would retain
/// is ever dropped unseen.
pub const UNACKED_WINDOW_BYTES: usize = 1024 * 1024;
/// The same window for clients that opted in with `ackOutput` and acknowledge: 8 MiB,
/// large enough that acknowledgements every few hundred KiB never stall a stream
/// on a direct connection. A client may ask for another (`outputWindowBytes`),
/// from [`MIN_ACKED_WINDOW_BYTES`] to [`MAX_ACKED_WINDOW_BYTES`].
pub const ACKED_WINDOW_BYTES: usize = 8 * 1024 * 1024;
/// The smallest window a client may ask for: 64 KiB (smaller asks get it).
pub const MIN_ACKED_WINDOW_BYTES: usize = 64 * 1024;
/// The largest window a client may ask for: 32 MiB (larger asks get it), as
/// much as a relay node holds for one stream: a path through a relay keeps
/// more bytes in flight (two sockets, the node's queue) than a direct one.
pub const MAX_ACKED_WINDOW_BYTES: usize = 32 * 1024 * 1024;
/// Undelivered chunks after which reading pauses (keeps under the chunk cap).
pub const WINDOW_CHUNKS: usize = RETAINED_OUTPUT_CHUNKS_PER_PROCESS - 1;

/// The window of a log in `ack_mode` (or not) whose client asked for none:
/// [`ACKED_WINDOW_BYTES`] or [`UNACKED_WINDOW_BYTES`].
pub fn default_window(ack_mode: bool) -> usize {
    if ack_mode {
        ACKED_WINDOW_BYTES
    } else {
        UNACKED_WINDOW_BYTES
    }
}

/// One retained chunk.
#[derive(Debug, Clone)]
pub struct Chunk {
    /// Sequence number.
    pub seq: u64,
    /// Source stream.
    pub stream: OutputStream,
    /// The bytes (shared with the frame that pushed them, if any).
    pub data: bytes::Bytes,
}

/// The log. Not synchronised itself; the process state holds it under a lock.
#[derive(Debug)]
pub struct OutputLog {
    chunks: VecDeque<Chunk>,
    retained_bytes: usize,
    next_seq: u64,
    /// Every event with seq ≤ this has been delivered (or acknowledged).
    delivered_seq: u64,
    undelivered_bytes: usize,
    undelivered_chunks: usize,
    ack_mode: bool,
    /// Undelivered bytes at which reading pauses.
    window: usize,
    exited: Option<(u64, i32)>,
    closed_seq: Option<u64>,
    spool: Option<Spool>,
}

/// An [`OutputLog`] taken apart, for an upgrade.
#[derive(Debug)]
pub struct LogParts {
    /// Retained chunks in memory, oldest first.
    pub chunks: Vec<Chunk>,
    /// The next seq to assign.
    pub next_seq: u64,
    /// Every event through this seq was delivered (or acknowledged).
    pub delivered_seq: u64,
    /// Delivery by acknowledgement only (`ackOutput`).
    pub ack_mode: bool,
    /// Undelivered bytes at which reading pauses ([`OutputLog::window`]).
    pub window: usize,
    /// The exited event's seq and exit code.
    pub exited: Option<(u64, i32)>,
    /// The closed event's seq.
    pub closed_seq: Option<u64>,
    /// Output trimmed from memory to disk.
    pub spool: Option<Spool>,
}

/// A page of `process/read`.
#[derive(Debug)]
pub struct Page {
    /// Chunks with seq > afterSeq.
    pub chunks: Vec<ProcessOutputChunk>,
    /// Where to continue.
    pub next_seq: u64,
    /// True when the page ended before the newest retained chunk because of
    /// the spool's page limit (not `maxBytes`).
    pub truncated: bool,
}

impl OutputLog {
    /// A new log; `ack_mode` selects delivery by acknowledgement only; with
    /// `spool`, trimmed output goes to disk.
    pub fn new(ack_mode: bool, spool: Option<Spool>) -> Self {
        OutputLog {
            chunks: VecDeque::new(),
            retained_bytes: 0,
            next_seq: 1,
            delivered_seq: 0,
            undelivered_bytes: 0,
            undelivered_chunks: 0,
            ack_mode,
            window: default_window(ack_mode),
            exited: None,
            closed_seq: None,
            spool,
        }
    }

    /// Takes the log apart (an upgrade hands it to the next image), leaving
    /// an empty one.
    pub fn take_parts(&mut self) -> LogParts {
        let log = std::mem::replace(self, OutputLog::new(self.ack_mode, None));
        LogParts {
            chunks: log.chunks.into(),
            next_seq: log.next_seq,
            delivered_seq: log.delivered_seq,
            ack_mode: log.ack_mode,
            window: log.window,
            exited: log.exited,
            closed_seq: log.closed_seq,
            spool: log.spool,
        }
    }

    /// The log [`OutputLog::take_parts`] took apart; its counts are
    /// recomputed from the chunks.
    pub fn from_parts(parts: LogParts) -> OutputLog {
        let LogParts {
            chunks,
            next_seq,
            delivered_seq,
            ack_mode,
            window,
            exited,
            closed_seq,
            spool,
        } = parts;
        let undelivered = chunks.iter().filter(|c| c.seq > delivered_seq);
        let (undelivered_bytes, undelivered_chunks) =
            undelivered.fold((0, 0), |(b, n), c| (b + c.data.len(), n + 1));
        OutputLog {
            retained_bytes: chunks.iter().map(|c| c.data.len()).sum(),
            chunks: chunks.into(),
            next_seq,
            delivered_seq,
            undelivered_bytes,
            undelivered_chunks,
            ack_mode,
            window,
            exited,
            closed_seq,
            spool,
        }
    }

    /// With `ackOutput`, pauses reading at `bytes` undelivered instead of
    /// [`ACKED_WINDOW_BYTES`] (the client's `outputWindowBytes`, if it gave
    /// one), brought within
    /// [`MIN_ACKED_WINDOW_BYTES`]..=[`MAX_ACKED_WINDOW_BYTES`]; without
    /// `ackOutput` the window stays [`UNACKED_WINDOW_BYTES`].
    pub fn with_acked_window(mut self, bytes: Option<u64>) -> OutputLog {
        if let (true, Some(bytes)) = (self.ack_mode, bytes) {
            let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
            self.window = bytes.clamp(MIN_ACKED_WINDOW_BYTES, MAX_ACKED_WINDOW_BYTES);
        }
        self
    }

    /// Undelivered bytes at which reading from the child pauses.
    pub fn window(&self) -> usize {
        self.window
    }

    /// The next seq that will be assigned.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Exit code once exited.
    pub fn exit_code(&self) -> Option<i32> {
        self.exited.map(|(_, c)| c)
    }

    /// True once the closed event is recorded.
    pub fn is_closed(&self) -> bool {
        self.closed_seq.is_some()
    }

    /// True once closed and every event through the close was delivered.
    pub fn fully_delivered(&self) -> bool {
        self.closed_seq.is_some_and(|c| self.delivered_seq + 1 >= c)
    }

    /// Seq of the oldest retained chunk (on disk or in memory), if any.
    pub fn oldest_seq(&self) -> Option<u64> {
        self.spool
            .as_ref()
            .and_then(Spool::first_seq)
            .or_else(|| self.chunks.front().map(|c| c.seq))
    }

    /// True when reading from the child should pause.
    pub fn window_full(&self) -> bool {
        self.undelivered_bytes >= self.window || self.undelivered_chunks >= WINDOW_CHUNKS
    }

    /// Appends a chunk; returns its seq.
    pub fn push_output(&mut self, stream: OutputStream, data: impl Into<bytes::Bytes>) -> u64 {
        let data = data.into();
        let seq = self.take_seq();
        self.retained_bytes += data.len();
        self.undelivered_bytes += data.len();
        self.undelivered_chunks += 1;
        self.chunks.push_back(Chunk { seq, stream, data });
        self.trim();
        seq
    }

    /// The retained output of every stream, concatenated in seq order.
    pub fn retained_output(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.retained_bytes);
        for c in &self.chunks {
            out.extend_from_slice(&c.data);
        }
        out
    }

    /// Records the exit; returns its seq.
    pub fn push_exited(&mut self, code: i32) -> u64 {
        let seq = self.take_seq();
        self.exited = Some((seq, code));
        seq
    }

    /// Records the close; returns its seq.
    pub fn push_closed(&mut self) -> u64 {
        let seq = self.take_seq();
        self.closed_seq = Some(seq);
        seq
    }

    fn take_seq(&mut self) -> u64 {
        let s = self.next_seq;
        self.next_seq += 1;
        s
    }

    /// Marks events through `seq` delivered by a push on a live connection. Ignored in
    /// ack mode, where only acknowledgements count.
    pub fn delivered_by_push(&mut self, seq: u64) {
        if !self.ack_mode {
            self.mark_delivered(seq);
        }
    }

    /// Marks events through `seq` delivered (read or acknowledged).
    pub fn mark_delivered(&mut self, seq: u64) {
        if seq <= self.delivered_seq {
            return;
        }
        self.delivered_seq = seq;
        // Recount from the back: undelivered chunks are the newest ones.
        let (mut bytes, mut n) = (0, 0);
        for c in self.chunks.iter().rev() {
            if c.seq <= seq {
                break;
            }
            bytes += c.data.len();
            n += 1;
        }
        self.undelivered_bytes = bytes;
        self.undelivered_chunks = n;
        self.trim();
    }

    fn trim(&mut self) {
        while self.retained_bytes > RETAINED_OUTPUT_BYTES_PER_PROCESS
            || self.chunks.len() > RETAINED_OUTPUT_CHUNKS_PER_PROCESS
        {
            match self.chunks.front() {
                Some(c) if c.seq <= self.delivered_seq => {
                    self.retained_bytes -= c.data.len();
                    let c = self.chunks.pop_front();
                    // An acknowledging client has said it holds these bytes:
                    // only output merely pushed (perhaps lost with a dropped
                    // link) is worth a disk write.
                    if let (Some(spool), Some(c), false) = (&mut self.spool, c, self.ack_mode) {
                        spool.append(c.seq, c.stream, c.data);
                    }
                }
                _ => break,
            }
        }
    }

    /// Answers `process/read` as the reference does: chunks with seq > `after`, at least one
    /// when any exists; with `max_bytes`, stop before exceeding it and set
    /// `next_seq` one past the last chunk returned.
    pub fn read(&mut self, after: u64, max_bytes: Option<u64>) -> Page {
        let mut chunks = Vec::new();
        let mut total: u64 = 0;
        // From the spool first when the reader is behind the memory window; a
        // page that starts there is bounded even without `maxBytes`.
        let in_memory = self.chunks.front().map_or(self.next_seq, |c| c.seq);
        let mut limit = max_bytes;
        let mut stopped = false;
        if let Some(spool) = self.spool.as_mut().filter(|_| after + 1 < in_memory) {
            let page_limit = max_bytes.unwrap_or(SPOOL_PAGE_BYTES);
            match spool.read(after, page_limit, &mut chunks) {
                Ok((n, complete)) => {
                    total = n;
                    stopped = !complete;
                }
                Err(e) => tracing::warn!("output spool read failed: {e}"),
            }
            if !chunks.is_empty() {
                limit = Some(page_limit);
            }
        }
        let start = self.chunks.partition_point(|c| c.seq <= after);
        for c in self.chunks.iter().skip(start).take_while(|_| !stopped) {
            if let Some(limit) = limit {
                if !chunks.is_empty() && total + c.data.len() as u64 > limit {
                    stopped = true;
                    break;
                }
            }
            total += c.data.len() as u64;
            chunks.push(ProcessOutputChunk {
                seq: c.seq,
                stream: c.stream,
                chunk: ByteChunk(c.data.clone()),
            });
        }
        let next_seq = match (limit, chunks.last()) {
            (Some(_), Some(last)) => last.seq + 1,
            _ => self.next_seq,
        };
        Page {
            chunks,
            next_seq,
            truncated: stopped && max_bytes.is_none(),
        }
    }

    /// True if something happened after `after`: a chunk, the exit, or the close.
    /// A long-poll returns at once when this holds.
    pub fn has_events_after(&self, after: u64) -> bool {
        self.chunks.back().is_some_and(|c| c.seq > after)
            || self.exited.is_some_and(|(seq, _)| seq > after)
            || self.closed_seq.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::spool::SpoolConfig;

    #[test]
    fn seq_shared_by_output_exit_close() {
        let mut log = OutputLog::new(false, None);
        assert_eq!(log.push_output(OutputStream::Stdout, b"a".to_vec()), 1);
        assert_eq!(log.push_exited(0), 2);
        assert_eq!(log.push_closed(), 3);
        let p = log.read(0, None);
        assert_eq!(p.chunks.len(), 1);
        assert_eq!(p.next_seq, 4);
    }

    #[test]
    fn max_bytes_quirk() {
        let mut log = OutputLog::new(false, None);
        for _ in 0..3 {
            log.push_output(OutputStream::Stdout, b"abc".to_vec());
        }
        log.push_exited(0);
        log.push_closed();
        let p = log.read(0, Some(9));
        assert_eq!(p.chunks.len(), 3);
        assert_eq!(p.next_seq, 4, "one past the last returned chunk");
        let p = log.read(0, Some(0));
        assert_eq!(p.chunks.len(), 1, "at least one chunk");
        assert_eq!(p.next_seq, 2);
        let p = log.read(3, Some(1));
        assert!(p.chunks.is_empty());
        assert_eq!(p.next_seq, 6);
    }

    #[test]
    fn undelivered_output_is_never_dropped_and_pauses() {
        let mut log = OutputLog::new(false, None);
        let chunk = vec![0u8; 64 * 1024];
        let mut pushed = 0;
        while !log.window_full() {
            log.push_output(OutputStream::Stdout, chunk.clone());
            pushed += 1;
        }
        assert_eq!(pushed * chunk.len(), UNACKED_WINDOW_BYTES);
        assert_eq!(log.oldest_seq(), Some(1));
        log.mark_delivered(pushed as u64);
        assert!(!log.window_full());
        // Delivered output is trimmed to the retention cap as more arrives.
        for _ in 0..20 {
            log.push_output(OutputStream::Stdout, chunk.clone());
            log.delivered_by_push(log.next_seq() - 1);
        }
        let retained: usize = log
            .read(0, None)
            .chunks
            .iter()
            .map(|c| c.chunk.0.len())
            .sum();
        assert!(retained <= RETAINED_OUTPUT_BYTES_PER_PROCESS);
        assert!(
            log.oldest_seq().unwrap() > 1,
            "a gap is visible as a seq jump"
        );
    }

    /// Chunks of 64 KiB pushed until `log` pauses, as bytes.
    fn fill(log: &mut OutputLog) -> usize {
        let chunk = vec![0u8; 64 * 1024];
        let mut pushed = 0;
        while !log.window_full() {
            log.push_output(OutputStream::Stdout, chunk.clone());
            pushed += chunk.len();
        }
        pushed
    }

    #[test]
    fn an_acknowledging_client_chooses_its_window_within_bounds() {
        let window = |ack: bool, asked: u64| {
            fill(&mut OutputLog::new(ack, None).with_acked_window(Some(asked)))
        };
        assert_eq!(fill(&mut OutputLog::new(true, None)), ACKED_WINDOW_BYTES);
        assert_eq!(window(true, 16 << 20), 16 << 20);
        assert_eq!(window(true, 1 << 40), MAX_ACKED_WINDOW_BYTES, "capped");
        assert_eq!(window(true, 1), MIN_ACKED_WINDOW_BYTES, "raised");
        assert_eq!(
            window(false, 16 << 20),
            UNACKED_WINDOW_BYTES,
            "without acknowledgements the window is fixed"
        );
        // An upgrade hands the window on with the log.
        let mut log = OutputLog::new(true, None).with_acked_window(Some(16 << 20));
        let log = OutputLog::from_parts(log.take_parts());
        assert_eq!(log.window(), 16 << 20);
    }

    #[test]
    fn ack_mode_ignores_pushes() {
        let mut log = OutputLog::new(true, None);
        let chunk = vec![0u8; 1024 * 1024];
        for _ in 0..8 {
            let s = log.push_output(OutputStream::Stdout, chunk.clone());
            log.delivered_by_push(s);
        }
        assert!(log.window_full());
        assert_eq!(log.oldest_seq(), Some(1));
        log.mark_delivered(8);
        assert!(!log.window_full());
        assert_eq!(
            log.oldest_seq(),
            Some(8),
            "trimmed to 1 MiB once acknowledged"
        );
    }

    /// Pushed-only output leaving memory goes to the spool; acknowledged
    /// output does not (the client holds it), so it costs no disk write.
    #[test]
    fn only_unacknowledged_output_is_spooled() {
        let d = std::env::temp_dir().join(format!("es-ackspool-{}", std::process::id()));
        let cfg = SpoolConfig::new(&d, 1 << 30, u64::MAX, 1 << 30).unwrap();
        let chunk = vec![7u8; 512 * 1024];
        for ack_mode in [false, true] {
            let mut log =
                OutputLog::new(ack_mode, Some(Spool::new(cfg.clone(), Default::default())));
            for _ in 0..8 {
                let s = log.push_output(OutputStream::Stdout, chunk.clone());
                log.delivered_by_push(s);
                log.mark_delivered(if ack_mode { s } else { 0 });
            }
            let page = log.read(0, None);
            if ack_mode {
                assert_eq!(log.oldest_seq(), Some(7), "acknowledged output was spooled");
                assert_eq!(page.chunks.first().map(|c| c.seq), Some(7));
            } else {
                assert_eq!(log.oldest_seq(), Some(1));
                assert_eq!(page.chunks.len(), 8);
                assert!(page.chunks.iter().all(|c| c.chunk.0 == chunk));
            }
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}

#[cfg(test)]
mod window_tests {
    use super::*;

    #[test]
    fn many_small_chunks_fill_the_window_by_count() {
        let mut log = OutputLog::new(false, None);
        let mut pushed = 0;
        while !log.window_full() {
            log.push_output(OutputStream::Stdout, b"x".to_vec());
            pushed += 1;
            assert!(pushed <= WINDOW_CHUNKS, "the window never filled");
        }
        assert_eq!(pushed, WINDOW_CHUNKS);
        // Delivering part of it reopens the window; nothing undelivered was dropped.
        log.mark_delivered(10);
        assert!(!log.window_full());
        assert_eq!(log.oldest_seq(), Some(1));
        assert_eq!(log.read(0, None).chunks.len(), WINDOW_CHUNKS);
    }

    #[test]
    fn exit_and_close_never_count_against_the_window() {
        let mut log = OutputLog::new(false, None);
        let big = vec![0u8; UNACKED_WINDOW_BYTES - 1];
        log.push_output(OutputStream::Stderr, big);
        assert!(!log.window_full());
        let exited = log.push_exited(3);
        let closed = log.push_closed();
        assert!(!log.window_full());
        assert_eq!((exited, closed), (2, 3));
        let page = log.read(1, None);
        assert!(page.chunks.is_empty());
        assert_eq!(page.next_seq, 4);
    }
}
