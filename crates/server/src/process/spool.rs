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

use exec_server_protocol::types::{OutputStream, ProcessOutputChunk};
use exec_server_protocol::ByteChunk;
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Default cap of spooled output per process: 256 MiB.
pub const DEFAULT_SPOOL_BYTES_PER_PROCESS: u64 = 256 * 1024 * 1024;
/// Default cap of spooled output across the server: 4 GiB.
pub const DEFAULT_SPOOL_TOTAL_BYTES: u64 = 4 * 1024 * 1024 * 1024;
/// Most output bytes one `process/read` without `maxBytes` returns from the
/// spool: 4 MiB (the page then ends early and `nextSeq` says where to go on).
pub const SPOOL_PAGE_BYTES: u64 = 4 * 1024 * 1024;
/// Spacing of the in-memory index into a segment: one entry per 64 KiB.
const INDEX_EVERY_BYTES: u64 = 64 * 1024;
/// Records are gathered into writes of this size (fewer system calls on the
/// pump's path), and flushed before any read: 256 KiB.
const WRITE_BUFFER_BYTES: usize = 256 * 1024;
const HEADER_BYTES: usize = 13;
/// Chunks this long are written straight from their buffer: 64 KiB.
const DIRECT_WRITE_BYTES: usize = 64 * 1024;

/// Where and how much to spool; shared by every process of a server.
#[derive(Debug)]
pub struct SpoolConfig {
    dir: PathBuf,
    per_process: u64,
    total: u64,
    used: AtomicU64,
}

impl SpoolConfig {
    /// Spools into `dir` (created 0700 if missing; an existing one must be a
    /// directory owned by this user that nobody else can enter), at most
    /// `per_process` output bytes a process and `total` across the server.
    /// Errors: the directory cannot be created, or is unsafe (named in the
    /// message).
    pub fn new(dir: &Path, per_process: u64, total: u64) -> io::Result<Arc<SpoolConfig>> {
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
            used: AtomicU64::new(0),
        }))
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

    fn reserve(&self, n: u64) -> bool {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            if cur + n > self.total {
                return false;
            }
            match self.used.compare_exchange_weak(
                cur,
                cur + n,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    fn release(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }

    fn open_file(&self) -> io::Result<File> {
        let anonymous = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
            .open(&self.dir);
        match anonymous {
            Ok(f) => Ok(f),
            // No O_TMPFILE on this file system: a fresh name, unlinked at once.
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
                Ok(f)
            }
            Err(e) => Err(e),
        }
    }
}

/// One file of a process's spool.
#[derive(Debug)]
struct Segment {
    file: File,
    /// Bytes in the segment (headers included), the unflushed tail too.
    len: u64,
    /// Records not yet written to `file`: they start at `len - pending.len()`.
    pending: Vec<u8>,
    /// Output bytes in it (what the caps count).
    data_bytes: u64,
    first_seq: u64,
    last_seq: u64,
    /// (seq, offset) of a record at least every [`INDEX_EVERY_BYTES`].
    index: Vec<(u64, u64)>,
}

impl Segment {
    /// Writes the gathered records.
    fn flush(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let at = self.len - self.pending.len() as u64;
        self.file.write_all_at(&self.pending, at)?;
        self.pending.clear();
        Ok(())
    }
}

/// The spool of one process. Not synchronised; it lives in the output log.
#[derive(Debug)]
pub struct Spool {
    config: Arc<SpoolConfig>,
    segments: VecDeque<Segment>,
    data_bytes: u64,
    /// Set once a write failed: nothing more is spooled (gaps stay explicit).
    broken: bool,
}

impl Spool {
    /// An empty spool; no file exists until the first append.
    pub fn new(config: Arc<SpoolConfig>) -> Self {
        Spool {
            config,
            segments: VecDeque::new(),
            data_bytes: 0,
            broken: false,
        }
    }

    /// Seq of the oldest chunk on disk.
    pub fn first_seq(&self) -> Option<u64> {
        self.segments.front().map(|s| s.first_seq)
    }

    /// Output bytes on disk.
    pub fn data_bytes(&self) -> u64 {
        self.data_bytes
    }

    /// Appends a chunk evicted from memory (chunks come in seq order). Returns
    /// false when it could not be kept (caps, disk errors): the reader then
    /// sees a gap.
    pub fn append(&mut self, seq: u64, stream: OutputStream, data: &[u8]) -> bool {
        if self.broken || data.len() as u64 > self.config.per_process {
            return false;
        }
        let n = data.len() as u64;
        while self.data_bytes + n > self.config.per_process {
            self.drop_oldest();
        }
        while !self.config.reserve(n) {
            if self.segments.is_empty() {
                return false;
            }
            self.drop_oldest();
        }
        match self.write_record(seq, stream, data) {
            Ok(()) => {
                self.data_bytes += n;
                true
            }
            Err(e) => {
                tracing::warn!("output spool write failed, spooling stops for this process: {e}");
                self.config.release(n);
                self.broken = true;
                false
            }
        }
    }

    fn write_record(&mut self, seq: u64, stream: OutputStream, data: &[u8]) -> io::Result<()> {
        let full = self
            .segments
            .back()
            .is_none_or(|s| s.len >= self.config.segment_bytes());
        if full {
            if let Some(last) = self.segments.back_mut() {
                last.flush()?;
            }
            self.segments.push_back(Segment {
                file: self.config.open_file()?,
                len: 0,
                pending: Vec::with_capacity(WRITE_BUFFER_BYTES),
                data_bytes: 0,
                first_seq: seq,
                last_seq: seq,
                index: Vec::new(),
            });
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
        seg.pending.extend_from_slice(&seq.to_le_bytes());
        seg.pending.push(stream_code(stream));
        seg.pending.extend_from_slice(&len.to_le_bytes());
        if data.len() >= DIRECT_WRITE_BYTES {
            // A large chunk goes to the file as it is, after what is
            // buffered: copying it into the buffer first cost as much as
            // writing it.
            seg.len += HEADER_BYTES as u64;
            seg.flush()?;
            seg.file.write_all_at(data, seg.len)?;
            seg.len += data.len() as u64;
        } else {
            seg.pending.extend_from_slice(data);
            seg.len += (HEADER_BYTES + data.len()) as u64;
            if seg.pending.len() >= WRITE_BUFFER_BYTES {
                seg.flush()?;
            }
        }
        seg.data_bytes += data.len() as u64;
        seg.last_seq = seq;
        Ok(())
    }

    fn drop_oldest(&mut self) {
        if let Some(seg) = self.segments.pop_front() {
            self.data_bytes -= seg.data_bytes;
            self.config.release(seg.data_bytes);
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
            if let Err(e) = last.flush() {
                self.broken = true;
                return Err(e);
            }
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
        self.config.release(self.data_bytes);
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
        let cfg = SpoolConfig::new(&d, 1 << 30, 1 << 30).unwrap();
        assert_eq!(
            std::fs::metadata(&d).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let mut sp = Spool::new(cfg.clone());
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
            assert!(sp.append(seq, OutputStream::Stderr, &data));
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
        let cfg = SpoolConfig::new(&d, 4 << 20, 6 << 20).unwrap();
        let mut a = Spool::new(cfg.clone());
        let chunk = vec![7u8; 64 * 1024];
        for seq in 1..=200u64 {
            assert!(a.append(seq, OutputStream::Stdout, &chunk));
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
        // A second process shares the server budget: the first keeps its data,
        // the second drops its own oldest to stay within it.
        let mut b = Spool::new(cfg.clone());
        for seq in 1..=100u64 {
            b.append(seq, OutputStream::Stdout, &chunk);
        }
        assert!(cfg.used_bytes() <= 6 << 20);
        assert_eq!(a.first_seq(), Some(first));
        drop((a, b));
        assert_eq!(cfg.used_bytes(), 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn refuses_a_directory_others_can_enter() {
        let d = dir("unsafe");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = SpoolConfig::new(&d, 1, 1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("mode 0700"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
