//! The disk spool: a process's delivered output that no longer fits the memory
//! window goes to files of its own instead of being dropped, so `process/read`
//! from any seq still on disk replays exactly.
//!
//! Files are anonymous (`O_TMPFILE`, or created and unlinked at once where the
//! file system lacks it) in a directory only this user can enter: nothing is
//! left behind, whether the record is retired, the session expires, the server
//! shuts down or crashes. Each process spools into segments of a quarter of
//! its cap; the oldest segment is dropped whole when the process's cap or the
//! server-wide budget would be passed, which the reader sees as a seq jump.
//!
//! Record layout (little-endian): seq `u64`, stream `u8`, length `u32`, bytes.
//!
//! The writes themselves run on the server's [`writer`] thread; a read waits
//! for the spool's queued writes first.

mod handover;
mod share;
mod writer;

pub use handover::{SegmentParts, SpoolParts};
pub use share::SessionShare;

use bytes::Bytes;
use exec_server_protocol::types::{OutputStream, ProcessOutputChunk};
use exec_server_protocol::ByteChunk;
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use writer::{Outstanding, Writer};

/// Default cap of spooled output per process: 64 MiB, 64 times what the
/// reference retains. A link drop loses at most what was in flight (socket
/// buffers: a few MiB), so this also leaves room for a reader that pages late.
/// Larger caps cost page cache that is rarely read: a stream past the cap
/// writes over its recycled segments instead of filling fresh memory (see
/// `Spool::spare`), about a fifth of the cost. `--output-spool-bytes` sets it.
pub const DEFAULT_SPOOL_BYTES_PER_PROCESS: u64 = 64 * 1024 * 1024;
/// Default cap of spooled output across the server: 4 GiB.
pub const DEFAULT_SPOOL_TOTAL_BYTES: u64 = 4 * 1024 * 1024 * 1024;
/// Default cap of spooled output across one session's processes: 1 GiB, a
/// quarter of the server's, so one session cannot take the whole spool.
pub const DEFAULT_SPOOL_SESSION_BYTES: u64 = 1024 * 1024 * 1024;
/// Most output bytes one `process/read` without `maxBytes` returns from the
/// spool: 4 MiB (the page then ends early and `nextSeq` says where to go on).
pub const SPOOL_PAGE_BYTES: u64 = 4 * 1024 * 1024;
/// Spacing of the in-memory index into a segment: one entry per 64 KiB.
const INDEX_EVERY_BYTES: u64 = 64 * 1024;
/// Records are gathered into one vectored write of about this size before
/// they go to the writer, and flushed before any read: 1 MiB. Fresh page
/// cache costs less per byte filled by large writes than by one write a
/// record (figures: BENCHMARKS.md, "Figures behind design choices").
const GATHER_BYTES: usize = 1024 * 1024;
/// Most pieces one gathered write holds (a quarter of `IOV_MAX`): room for
/// about 1 MiB of 4 KiB records, each with its header piece.
const GATHER_PIECES: usize = 256;
const HEADER_BYTES: usize = 13;
/// Chunks this long are written straight from their buffer, not copied among
/// the small records: 4 KiB. The pump hands over a short read as a copy of
/// its own size, so a held chunk pins no larger buffer; copying the chunks of
/// a child that writes 8 KiB at a time showed in a stream's server profile.
const DIRECT_WRITE_BYTES: usize = 4 * 1024;

/// Where and how much to spool; shared by every process of a server.
#[derive(Debug)]
pub struct SpoolConfig {
    dir: PathBuf,
    per_process: u64,
    total: u64,
    per_session: u64,
    used: AtomicU64,
    writer: Writer,
}

impl SpoolConfig {
    /// Spools into `dir` (created 0700 if missing; an existing one must be a
    /// directory owned by this user that nobody else can enter), at most
    /// `per_process` output bytes a process, `per_session` across one
    /// session's processes and `total` across the server. Errors: the
    /// directory cannot be created, or is unsafe (named in the message).
    pub fn new(
        dir: &Path,
        per_process: u64,
        per_session: u64,
        total: u64,
    ) -> io::Result<Arc<SpoolConfig>> {
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "cannot create output spool directory {}: {e}",
                        dir.display()
                    ),
                ))
            }
        }
        let meta = std::fs::symlink_metadata(dir)?;
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "output spool directory {} must be a directory owned by uid {uid} with mode 0700 \
                     (it is {}, owner {}, mode {:o})",
                    dir.display(),
                    if meta.is_dir() { "a directory" } else { "not a directory" },
                    meta.uid(),
                    meta.permissions().mode() & 0o7777
                ),
            ));
        }
        Ok(Arc::new(SpoolConfig {
            dir: dir.to_path_buf(),
            per_process,
            total,
            per_session,
            used: AtomicU64::new(0),
            writer: Writer::start(),
        }))
    }

    /// The directory its files are made in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The default directory: `exec-server-spool-<uid>` in the system temp dir.
    pub fn default_dir() -> PathBuf {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        std::env::temp_dir().join(format!("exec-server-spool-{uid}"))
    }

    /// Output bytes spooled now, across the server.
    pub fn used_bytes(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn segment_bytes(&self) -> u64 {
        (self.per_process / 4).max(1024 * 1024)
    }

    fn reserve(&self, share: &SessionShare, n: u64) -> bool {
        share::reserve_both(&self.used, self.total, share, self.per_session, n)
    }

    fn release(&self, share: &SessionShare, n: u64) {
        share::release_both(&self.used, share, n);
    }

    /// A new anonymous file in the directory (`O_TMPFILE`, or created and
    /// unlinked at once where the file system lacks it), mode 0600.
    fn open_file(&self) -> io::Result<Arc<File>> {
        let anonymous = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
            .open(&self.dir);
        match anonymous {
            Ok(f) => Ok(Arc::new(f)),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
                static NEXT: AtomicU64 = AtomicU64::new(0);
                let name = self.dir.join(format!(
                    "spool-{}-{}",
                    std::process::id(),
                    NEXT.fetch_add(1, Ordering::Relaxed)
                ));
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_CLOEXEC)
                    .open(&name)?;
                std::fs::remove_file(&name)?;
                Ok(Arc::new(f))
            }
            Err(e) => Err(e),
        }
    }
}

/// One file of a process's spool.
#[derive(Debug)]
struct Segment {
    file: Arc<File>,
    /// Bytes in the segment, headers included, the unflushed tail too:
    /// its length on disk and what the caps count.
    len: u64,
    /// The tail not yet handed to the writer, in order: `pieces`, then
    /// `small` (headers and small records, copied). It starts at
    /// `len - unsent()`.
    pieces: Vec<Bytes>,
    small: Vec<u8>,
    first_seq: u64,
    last_seq: u64,
    /// (seq, offset) of a record at least every [`INDEX_EVERY_BYTES`].
    index: Vec<(u64, u64)>,
}

impl Segment {
    fn new(file: Arc<File>, first_seq: u64) -> Segment {
        Segment {
            file,
            len: 0,
            pieces: Vec::new(),
            small: Vec::new(),
            first_seq,
            last_seq: first_seq,
            index: Vec::new(),
        }
    }

    /// Adds a record to the unsent tail; hands the tail to the writer once
    /// it is [`GATHER_BYTES`] long.
    fn push(
        &mut self,
        header: &[u8; HEADER_BYTES],
        data: Bytes,
        config: &SpoolConfig,
        owner: &Arc<Outstanding>,
    ) {
        self.small.extend_from_slice(header);
        let added = HEADER_BYTES + data.len();
        if data.len() >= DIRECT_WRITE_BYTES {
            // A large chunk is written from its own buffer: copying it
            // among the small records cost as much as writing it.
            self.seal_small();
            self.pieces.push(data);
        } else {
            self.small.extend_from_slice(&data);
        }
        self.len += added as u64;
        if self.unsent() >= GATHER_BYTES || self.pieces.len() >= GATHER_PIECES {
            self.flush(config, owner);
        }
    }

    /// Moves the small records gathered so far into `pieces`.
    fn seal_small(&mut self) {
        if self.small.is_empty() {
            return;
        }
        // A few headers are copied; a long run of small records hands over
        // its buffer instead.
        let piece = if self.small.len() < 4096 {
            let p = Bytes::copy_from_slice(&self.small);
            self.small.clear();
            p
        } else {
            Bytes::from(std::mem::take(&mut self.small))
        };
        self.pieces.push(piece);
    }

    /// Bytes of the tail not yet handed to the writer.
    fn unsent(&self) -> usize {
        self.pieces.iter().map(Bytes::len).sum::<usize>() + self.small.len()
    }

    /// Hands the unsent tail to the writer.
    fn flush(&mut self, config: &SpoolConfig, owner: &Arc<Outstanding>) {
        let unsent = self.unsent();
        if unsent == 0 {
            return;
        }
        self.seal_small();
        let at = self.len - unsent as u64;
        config
            .writer
            .write(owner, &self.file, at, std::mem::take(&mut self.pieces));
    }
}

/// The spool of one process. Not synchronised; it lives in the output log.
#[derive(Debug)]
pub struct Spool {
    config: Arc<SpoolConfig>,
    /// Its session's share, which its bytes count against too.
    share: Arc<SessionShare>,
    segments: VecDeque<Segment>,
    data_bytes: u64,
    /// Writes not yet done; once one failed, nothing more is spooled and
    /// reads fail (gaps stay explicit).
    outstanding: Arc<Outstanding>,
    /// The file of the segment dropped last, and its length, written over
    /// by the next segment: its pages are already in the page cache, and
    /// writing over them costs a fraction of filling fresh ones (BENCHMARKS.md),
    /// so a stream longer than the cap stops
    /// paying for fresh memory once the cap is reached. Its length counts
    /// against the server's budget until it is reused; a spare the budget
    /// has no room for is closed instead.
    spare: Option<(Arc<File>, u64)>,
}

impl Spool {
    /// An empty spool counting against `config`'s budgets and `share`;
    /// no file exists until the first append.
    pub fn new(config: Arc<SpoolConfig>, share: Arc<SessionShare>) -> Self {
        Spool {
            config,
            share,
            segments: VecDeque::new(),
            data_bytes: 0,
            outstanding: Arc::new(Outstanding::default()),
            spare: None,
        }
    }

    /// Seq of the oldest chunk on disk.
    pub fn first_seq(&self) -> Option<u64> {
        self.segments.front().map(|s| s.first_seq)
    }

    /// Bytes of the records on disk: output plus a 13-byte header a chunk
    /// (what the caps count), not counting the spare file.
    pub fn data_bytes(&self) -> u64 {
        self.data_bytes
    }

    /// Appends a chunk evicted from memory (chunks come in seq order). Returns
    /// false when it could not be kept (caps, disk errors): the reader then
    /// sees a gap.
    pub fn append(&mut self, seq: u64, stream: OutputStream, data: Bytes) -> bool {
        // The caps count the record as it is on disk, header included: a
        // flood of one-byte chunks is bounded as tightly as a stream.
        let n = data.len() as u64 + HEADER_BYTES as u64;
        if self.outstanding.failed() || n > self.config.per_process {
            return false;
        }
        while self.data_bytes + n > self.config.per_process {
            self.drop_oldest(true);
        }
        while !self.config.reserve(&self.share, n) {
            if self.segments.is_empty() {
                return false;
            }
            // The server's budget is short: no spare is kept, so each drop
            // frees its whole segment.
            self.drop_oldest(false);
        }
        match self.write_record(seq, stream, data) {
            Ok(()) => {
                self.data_bytes += n;
                true
            }
            Err(e) => {
                tracing::warn!(
                    "output spool file could not be made, spooling stops for this process: {e}"
                );
                self.config.release(&self.share, n);
                self.outstanding.mark_failed();
                false
            }
        }
    }

    fn write_record(&mut self, seq: u64, stream: OutputStream, data: Bytes) -> io::Result<()> {
        let full = self
            .segments
            .back()
            .is_none_or(|s| s.len >= self.config.segment_bytes());
        if full {
            if let Some(last) = self.segments.back_mut() {
                last.flush(&self.config, &self.outstanding);
            }
            let file = match self.spare.take() {
                Some((file, size)) => {
                    // Writes still queued for its old records must land
                    // before the new ones, which may be written inline.
                    self.outstanding.wait_idle();
                    // From here on its records count, as they are written.
                    self.config.release(&self.share, size);
                    file
                }
                None => self.config.open_file()?,
            };
            self.segments.push_back(Segment::new(file, seq));
        }
        let Some(seg) = self.segments.back_mut() else {
            return Err(io::Error::other("no segment"));
        };
        let len = u32::try_from(data.len()).map_err(|_| io::Error::other("chunk too large"))?;
        if seg
            .index
            .last()
            .is_none_or(|&(_, off)| seg.len - off >= INDEX_EVERY_BYTES)
        {
            seg.index.push((seq, seg.len));
        }
        let mut header = [0u8; HEADER_BYTES];
        header[..8].copy_from_slice(&seq.to_le_bytes());
        header[8] = stream_code(stream);
        header[9..].copy_from_slice(&len.to_le_bytes());
        seg.push(&header, data, &self.config, &self.outstanding);
        seg.last_seq = seq;
        Ok(())
    }

    /// Drops the oldest segment; its file becomes the spare when `keep` and
    /// the server's budget has room for it.
    fn drop_oldest(&mut self, keep: bool) {
        if let Some(seg) = self.segments.pop_front() {
            self.data_bytes -= seg.len;
            self.config.release(&self.share, seg.len);
            if let Some((_, size)) = self.spare.take() {
                self.config.release(&self.share, size);
            }
            if keep && self.config.reserve(&self.share, seg.len) {
                self.spare = Some((seg.file, seg.len));
            }
        }
    }

    /// Appends to `out` the spooled chunks with seq > `after`, in order, while
    /// their total stays within `limit` bytes (at least one chunk when any
    /// exists). Returns the bytes added, and whether every spooled chunk after
    /// `after` was added (false: the limit stopped the page).
    pub fn read(
        &mut self,
        after: u64,
        limit: u64,
        out: &mut Vec<ProcessOutputChunk>,
    ) -> io::Result<(u64, bool)> {
        if let Some(last) = self.segments.back_mut() {
            last.flush(&self.config, &self.outstanding);
        }
        self.outstanding.wait_idle();
        if self.outstanding.failed() {
            return Err(io::Error::other("an earlier spool write failed"));
        }
        let mut total = 0u64;
        for seg in self.segments.iter().filter(|s| s.last_seq > after) {
            // The last index entry at or before the first wanted record.
            let i = seg.index.partition_point(|&(seq, _)| seq <= after);
            let mut off = seg
                .index
                .get(i.saturating_sub(1))
                .map_or(0, |&(_, off)| off);
            let mut header = [0u8; HEADER_BYTES];
            while off < seg.len {
                seg.file.read_exact_at(&mut header, off)?;
                let (seq, stream, len) = parse_header(&header)?;
                let body = off + HEADER_BYTES as u64;
                off = body + len as u64;
                if seq <= after {
                    continue;
                }
                if !out.is_empty() && total + len as u64 > limit {
                    return Ok((total, false));
                }
                let mut data = vec![0u8; len as usize];
                seg.file.read_exact_at(&mut data, body)?;
                total += len as u64;
                out.push(ProcessOutputChunk {
                    seq,
                    stream,
                    chunk: ByteChunk::from(data),
                });
            }
        }
        Ok((total, true))
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        self.config.release(&self.share, self.data_bytes);
        if let Some((_, size)) = self.spare.take() {
            self.config.release(&self.share, size);
        }
    }
}

fn stream_code(s: OutputStream) -> u8 {
    match s {
        OutputStream::Stdout => 0,
        OutputStream::Stderr => 1,
        OutputStream::Pty => 2,
    }
}

fn parse_header(h: &[u8; HEADER_BYTES]) -> io::Result<(u64, OutputStream, u32)> {
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&h[..8]);
    let mut len = [0u8; 4];
    len.copy_from_slice(&h[9..]);
    let stream = match h[8] {
        0 => OutputStream::Stdout,
        1 => OutputStream::Stderr,
        2 => OutputStream::Pty,
        _ => return Err(io::Error::other("corrupt spool record")),
    };
    Ok((u64::from_le_bytes(seq), stream, u32::from_le_bytes(len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("es-spool-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn replays_exactly_from_any_seq() {
        let d = dir("replay");
        let cfg = SpoolConfig::new(&d, 1 << 30, u64::MAX, 1 << 30).unwrap();
        assert_eq!(
            std::fs::metadata(&d).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let mut sp = Spool::new(cfg.clone(), Default::default());
        // Small chunks (buffered) with a large one now and then (written
        // straight from its buffer), in any mix.
        let len = |seq: u64| {
            if seq % 500 == 7 {
                DIRECT_WRITE_BYTES + (seq as usize % 13)
            } else {
                (seq % 97) as usize + 1
            }
        };
        for seq in 1..=5000u64 {
            let data = vec![(seq % 251) as u8; len(seq)];
            assert!(sp.append(seq, OutputStream::Stderr, Bytes::from(data)));
            if seq % 1000 == 0 {
                // A read mid-stream sees every write handed over so far,
                // and the appends after it land after what it flushed.
                let mut out = Vec::new();
                sp.read(seq - 3, u64::MAX, &mut out).unwrap();
                let seqs: Vec<u64> = out.iter().map(|c| c.seq).collect();
                assert_eq!(seqs, vec![seq - 2, seq - 1, seq]);
            }
        }
        for after in [0, 1, 777, 4998, 4999, 5000] {
            let mut out = Vec::new();
            sp.read(after, u64::MAX, &mut out).unwrap();
            let seqs: Vec<u64> = out.iter().map(|c| c.seq).collect();
            assert_eq!(seqs, (after + 1..=5000).collect::<Vec<_>>());
            for c in &out {
                assert_eq!(c.chunk.0, vec![(c.seq % 251) as u8; len(c.seq)]);
                assert_eq!(c.stream, OutputStream::Stderr);
            }
        }
        // Nothing named is left in the directory.
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
        let used = cfg.used_bytes();
        assert!(used > 0);
        drop(sp);
        assert_eq!(cfg.used_bytes(), 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn caps_drop_whole_old_segments_and_pages_are_bounded() {
        let d = dir("caps");
        let cfg = SpoolConfig::new(&d, 4 << 20, u64::MAX, 6 << 20).unwrap();
        let mut a = Spool::new(cfg.clone(), Default::default());
        // Each chunk's bytes name its seq, so a record read from a recycled
        // segment file could not pass for another.
        let chunk = |seq: u64, n: usize| Bytes::from(vec![(seq % 251) as u8; n]);
        for seq in 1..=200u64 {
            assert!(a.append(seq, OutputStream::Stdout, chunk(seq, 64 * 1024)));
        }
        assert!(a.data_bytes() <= 4 << 20);
        let first = a.first_seq().unwrap();
        assert!(first > 1, "the oldest segments were dropped");
        let mut page = Vec::new();
        a.read(0, 1 << 20, &mut page).unwrap();
        assert_eq!(
            page.first().unwrap().seq,
            first,
            "a gap shows as a seq jump"
        );
        assert_eq!(page.len(), 16, "bounded by the limit");
        // Shorter records now, into recycled files still holding longer
        // ones: every page reads back exactly what was appended, to the end.
        let short = |seq: u64| 1000 + (seq as usize % 2000);
        for seq in 201..=2400u64 {
            assert!(a.append(seq, OutputStream::Stdout, chunk(seq, short(seq))));
        }
        let first = a.first_seq().unwrap();
        let mut all = Vec::new();
        a.read(first - 1, u64::MAX, &mut all).unwrap();
        let seqs: Vec<u64> = all.iter().map(|c| c.seq).collect();
        assert!(first > 200, "segments of long records were recycled");
        assert_eq!(seqs, (first..=2400).collect::<Vec<_>>());
        for c in &all {
            let n = short(c.seq);
            assert_eq!(c.chunk.0, chunk(c.seq, n), "seq {}", c.seq);
        }
        // A second process shares the server budget: the first keeps its data,
        // the second drops its own oldest to stay within it.
        let first = a.first_seq();
        let mut b = Spool::new(cfg.clone(), Default::default());
        for seq in 1..=100u64 {
            b.append(seq, OutputStream::Stdout, chunk(seq, 64 * 1024));
        }
        assert!(cfg.used_bytes() <= 6 << 20);
        assert_eq!(a.first_seq(), first);
        drop((a, b));
        assert_eq!(cfg.used_bytes(), 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The caps bound what is on disk: record headers count (a flood of
    /// one-byte chunks stays within them), and so does the spare file,
    /// against the server's budget.
    #[test]
    fn caps_count_headers_and_the_spare() {
        let d = dir("headers");
        let cap = 1 << 20;
        let cfg = SpoolConfig::new(&d, cap, u64::MAX, 2 << 20).unwrap();
        let mut sp = Spool::new(cfg.clone(), Default::default());
        for seq in 1..=200_000u64 {
            sp.append(seq, OutputStream::Stdout, Bytes::from_static(b"x"));
        }
        let on_disk = |sp: &Spool| sp.segments.iter().map(|s| s.len).sum::<u64>();
        assert_eq!(
            sp.data_bytes(),
            on_disk(&sp),
            "every byte on disk is counted"
        );
        assert!(
            on_disk(&sp) <= cap,
            "{} bytes on disk over a {cap}-byte cap",
            on_disk(&sp)
        );
        assert_eq!(cfg.used_bytes(), on_disk(&sp));
        // A dropped segment's file is kept, and counted, until it is reused.
        let oldest = sp.segments.front().map(|s| s.len).unwrap();
        sp.drop_oldest(true);
        assert_eq!(sp.spare.as_ref().map(|&(_, size)| size), Some(oldest));
        assert_eq!(cfg.used_bytes(), on_disk(&sp) + oldest);
        for seq in 200_001..=300_000u64 {
            sp.append(seq, OutputStream::Stdout, Bytes::from_static(b"x"));
        }
        let spare = sp.spare.as_ref().map_or(0, |&(_, size)| size);
        assert_eq!(cfg.used_bytes(), on_disk(&sp) + spare);
        // The last record is still there, exactly.
        let mut out = Vec::new();
        sp.read(299_999, u64::MAX, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].seq, &out[0].chunk.0[..]), (300_000, &b"x"[..]));
        drop(sp);
        assert_eq!(cfg.used_bytes(), 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn refuses_a_directory_others_can_enter() {
        let d = dir("unsafe");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = SpoolConfig::new(&d, 1, u64::MAX, 1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("mode 0700"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
