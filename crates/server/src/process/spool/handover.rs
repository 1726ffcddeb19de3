//! A spool handed from one image of the server to the next (an upgrade,
//! see `crate::handover`): its segment files stay open across `execve`,
//! and their records, index and counts go on unchanged.

use super::{share, Segment, SessionShare, Spool, SpoolConfig};
use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One segment file of a spool taken apart.
#[derive(Debug)]
pub struct SegmentParts {
    /// The anonymous file; its descriptor crosses the `execve`.
    pub file: Arc<File>,
    /// Bytes on disk, headers included.
    pub len: u64,
    /// Seq of its first record.
    pub first_seq: u64,
    /// Seq of its last record.
    pub last_seq: u64,
    /// `(seq, offset)` of a record at least every 64 KiB.
    pub index: Vec<(u64, u64)>,
}

/// A [`Spool`] taken apart: every write it queued is on disk.
#[derive(Debug)]
pub struct SpoolParts {
    /// Its segments, oldest first.
    pub segments: Vec<SegmentParts>,
    /// A write had failed: nothing more is spooled, and reads fail.
    pub failed: bool,
}

impl Spool {
    /// Waits for every write it queued, then takes it apart. Its bytes
    /// stay counted in this server's budget until the `execve`.
    pub fn take_parts(&mut self) -> SpoolParts {
        if let Some(last) = self.segments.back_mut() {
            last.flush(&self.config, &self.outstanding);
        }
        self.outstanding.wait_idle();
        let segments = self
            .segments
            .drain(..)
            .map(|s| SegmentParts {
                file: s.file,
                len: s.len,
                first_seq: s.first_seq,
                last_seq: s.last_seq,
                index: s.index,
            })
            .collect();
        SpoolParts {
            segments,
            failed: self.outstanding.failed(),
        }
    }

    /// The spool [`Spool::take_parts`] took apart, counted against
    /// `config`'s budget and `share` whatever they hold (the bytes are on
    /// disk already; new output then drops the oldest first).
    pub fn from_parts(
        config: Arc<SpoolConfig>,
        share: Arc<SessionShare>,
        parts: SpoolParts,
    ) -> Spool {
        let mut spool = Spool::new(config, share);
        for s in parts.segments {
            spool.data_bytes += s.len;
            spool.segments.push_back(Segment {
                file: s.file,
                len: s.len,
                pieces: Vec::new(),
                small: Vec::new(),
                first_seq: s.first_seq,
                last_seq: s.last_seq,
                index: s.index,
            });
        }
        spool
            .config
            .used
            .fetch_add(spool.data_bytes, Ordering::Relaxed);
        share::count(&spool.share, spool.data_bytes);
        if parts.failed {
            spool.outstanding.mark_failed();
        }
        spool
    }
}
