//! The document side of a process's handover: what a parked process is
//! written down as ([`ProcessDoc`]), and where its descriptors and bytes go
//! ([`Sink`]) and come back from ([`Source`]).

use crate::process::cgroup::ProcessCgroupParts;
use crate::process::limits::WatchParts;
use crate::process::list::StartedWith;
use exec_server_protocol::types::{LimitReason, OutputStream};
use serde::{Deserialize, Serialize};
use std::os::fd::{OwnedFd, RawFd};
use std::path::PathBuf;

/// Where a document keeps descriptors and bytes.
pub trait Sink {
    /// Keeps `fd` open across the `execve`; its number in the document.
    fn fd(&mut self, fd: RawFd) -> i32;
    /// Puts `bytes` in the document's blob.
    fn bytes(&mut self, bytes: &[u8]) -> Blob;
}

/// Where the next image finds them again.
pub trait Source {
    /// The descriptor numbered `n` in the document, now owned (each once).
    /// Errors: not handed over, or taken already.
    fn fd(&mut self, n: i32) -> std::io::Result<OwnedFd>;
    /// The bytes at `blob`. Errors: outside the blob.
    fn bytes(&self, blob: Blob) -> std::io::Result<bytes::Bytes>;
}

/// A place in the document's blob.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Blob {
    /// Offset in bytes.
    pub at: u64,
    /// Length in bytes.
    pub len: u64,
}

/// One retained chunk of output.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct ChunkDoc {
    pub(super) seq: u64,
    pub(super) stream: OutputStream,
    pub(super) data: Blob,
}

/// One spool segment.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct SegmentDoc {
    pub(super) fd: i32,
    pub(super) len: u64,
    pub(super) first_seq: u64,
    pub(super) last_seq: u64,
    pub(super) index: Vec<(u64, u64)>,
}

/// A process written down for the next image: everything its record,
/// pump and stdin writer held.
#[derive(Debug, Serialize, Deserialize)]
pub struct ProcessDoc {
    pub(super) id: String,
    pub(super) pid: u32,
    /// PTY master (also its stdin), when it runs on a terminal.
    pub(super) pty: Option<i32>,
    /// stdout and stderr pipes still open.
    pub(super) stdout: Option<i32>,
    pub(super) stderr: Option<i32>,
    /// The stdin pipe, while a writer holds it.
    pub(super) stdin: Option<i32>,
    pub(super) cgroup: Option<ProcessCgroupParts>,
    pub(super) chunks: Vec<ChunkDoc>,
    pub(super) next_seq: u64,
    pub(super) delivered_seq: u64,
    pub(super) ack_mode: bool,
    /// The flow-control window; absent in a document of an image that
    /// knew only the fixed ones (then the default for `ack_mode`).
    #[serde(default)]
    pub(super) window: Option<usize>,
    pub(super) exited: Option<(u64, i32)>,
    pub(super) closed_seq: Option<u64>,
    pub(super) spool: Option<(Vec<SegmentDoc>, bool)>,
    pub(super) write_ids: Vec<String>,
    pub(super) has_stdin: bool,
    /// The client may still write (it has not closed stdin).
    pub(super) stdin_open: bool,
    pub(super) stdin_broken: bool,
    /// Accepted stdin bytes the child has not taken, in order.
    pub(super) stdin_pending: Vec<Blob>,
    /// A close of stdin is queued behind them.
    pub(super) stdin_close_pending: bool,
    pub(super) sandbox_denied: bool,
    pub(super) limit: Option<LimitReason>,
    pub(super) signal: Option<i32>,
    pub(super) sandboxed: bool,
    /// Sandbox placeholders on the host, and whether the pid counts among
    /// the live sandboxes.
    pub(super) placeholders: Vec<PathBuf>,
    pub(super) confined: bool,
    pub(super) started_with: StartedWith,
    /// Milliseconds it had run when written down.
    pub(super) age_ms: u64,
    pub(super) output_bytes: u64,
    /// The exit, once the pump recorded it; or one delivered but not yet
    /// recorded.
    pub(super) exit_code: Option<i32>,
    pub(super) pending_exit: Option<(i32, Option<i32>)>,
    /// The output is closed: only the record's retention is left.
    pub(super) closed: bool,
    pub(super) limits: Option<WatchParts>,
    pub(super) live: bool,
    /// Its managed network proxy, while it has one.
    #[serde(default)]
    pub(super) proxy: Option<crate::network::handover::ProxyDoc>,
}

impl ProcessDoc {
    /// The process id the client chose.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The OS pid (unchanged across the upgrade).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Every descriptor it names: terminal, pipes, spool files.
    pub fn fds(&self) -> Vec<i32> {
        let mut all: Vec<i32> = [self.pty, self.stdout, self.stderr, self.stdin]
            .into_iter()
            .flatten()
            .collect();
        if let Some((segments, _)) = &self.spool {
            all.extend(segments.iter().map(|s| s.fd));
        }
        all.extend(self.proxy.iter().flat_map(|p| p.fds()));
        all
    }

    /// Takes its proxy out, to serve it again first ([`adopt`] is sync; a
    /// proxy starts in the runtime).
    pub fn take_proxy(&mut self) -> Option<crate::network::handover::ProxyDoc> {
        self.proxy.take()
    }

    /// True when every blob range it names lies within `len` bytes.
    pub fn blobs_within(&self, len: u64) -> bool {
        let within = |b: &Blob| b.at.checked_add(b.len).is_some_and(|end| end <= len);
        self.chunks.iter().all(|c| within(&c.data)) && self.stdin_pending.iter().all(within)
    }

    /// True while it has not exited (its exit is neither recorded nor
    /// delivered): the next image must wait for it.
    pub fn running(&self) -> bool {
        self.exit_code.is_none() && self.pending_exit.is_none() && !self.closed
    }
}
