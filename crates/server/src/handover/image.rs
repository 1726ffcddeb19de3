//! The state document an upgrade hands to the next image: a memfd that
//! crosses the `execve`, named by [`STATE_FD_ENV`].
//!
//! Layout: [`MAGIC`] (8 bytes), the version (`u32`, little-endian), the
//! length of the JSON part (`u64`), the JSON ([`StateDoc`]), then the blob
//! the JSON points into (retained output, pending stdin). Descriptors are
//! named by number: each is open in the next image, close-on-exec cleared
//! for the one `execve` and set again at once by [`Reader`].

use crate::process::cgroup::{CgroupsParts, ProcessCgroupParts};
use crate::process::handover::{Blob, ProcessDoc, Sink, Source};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::{Read, Seek, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

/// The version of the state document this binary writes.
pub const STATE_VERSION: u32 = 1;
/// The versions this binary reads (`exec-server --handover-version` prints
/// them; an upgrade to a binary that does not list [`STATE_VERSION`] is
/// refused before anything stops).
pub const READS_VERSIONS: &[u32] = &[1];
/// Names the state document's descriptor in the next image's environment.
pub const STATE_FD_ENV: &str = "EXEC_SERVER_HANDOVER_FD";
/// Set (to why) when an image gives the state back to the previous binary.
pub const REFUSED_ENV: &str = "EXEC_SERVER_HANDOVER_REFUSED";
/// The first bytes of a state document.
pub const MAGIC: &[u8; 8] = b"EXSVHAND";

/// Most bytes a state document may have: 8 GiB (retained output is at most
/// 1 MiB a process in memory; the spool stays in its files).
const MAX_DOC_BYTES: u64 = 8 << 30;

/// The listener the server accepted on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ListenerDoc {
    /// Its descriptor.
    pub fd: i32,
    /// `ws` or `unix`.
    pub kind: String,
    /// The URL it was printed as.
    pub url: String,
}

/// One session written down.
#[derive(Debug, Serialize, Deserialize)]
pub struct SessionDoc {
    /// Its id.
    pub id: String,
    /// Its processes.
    pub processes: Vec<ProcessDoc>,
    /// Cgroups of retired processes whose daemons still live.
    pub leftovers: Vec<ProcessCgroupParts>,
    /// Its `fs/watch` watches.
    #[serde(default)]
    pub watches: Vec<crate::fs::watch::WatchDoc>,
}

/// Everything the next image needs.
#[derive(Debug, Serialize, Deserialize)]
pub struct StateDoc {
    /// Random, new for each document: `--handover-check` prints it back,
    /// proving it read this very document.
    pub nonce: String,
    /// The version of the binary that wrote it (for messages).
    pub written_by: String,
    /// When the upgrade began, in milliseconds since the Unix epoch.
    pub began_ms: u64,
    /// The listener, where there is one.
    pub listener: Option<ListenerDoc>,
    /// The `exec-server upgrade` connection waiting for the outcome.
    pub control: Option<i32>,
    /// The previous binary, to go back to if this one cannot take over.
    pub previous_exe: Option<i32>,
    /// The runtime directory and the descriptor holding its lock.
    pub rundir: Option<(PathBuf, i32)>,
    /// The per-process cgroups' directory.
    pub cgroups: Option<CgroupsParts>,
    /// Every session.
    pub sessions: Vec<SessionDoc>,
    /// A remote executor's registration credential (the memfd is this
    /// process's alone), and whether registry error bodies may be shown.
    #[serde(default)]
    pub remote_credential: Option<(String, bool)>,
}

/// Collects descriptors and blob bytes while the document is written.
#[derive(Default)]
pub struct Writer {
    fds: Vec<RawFd>,
    blob: Vec<u8>,
}

impl Sink for Writer {
    fn fd(&mut self, fd: RawFd) -> i32 {
        self.fds.push(fd);
        fd
    }

    fn bytes(&mut self, bytes: &[u8]) -> Blob {
        let at = self.blob.len() as u64;
        self.blob.extend_from_slice(bytes);
        Blob {
            at,
            len: bytes.len() as u64,
        }
    }
}

impl Writer {
    /// Writes `doc` and the blob into `memfd`, and clears close-on-exec on
    /// every descriptor named (`memfd` too). Errors: the write failed.
    pub fn finish(mut self, doc: &StateDoc, memfd: &std::fs::File) -> std::io::Result<()> {
        let json = serde_json::to_vec(doc).map_err(std::io::Error::other)?;
        let mut f = memfd;
        let mut head = Vec::with_capacity(20);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&STATE_VERSION.to_le_bytes());
        head.extend_from_slice(&(json.len() as u64).to_le_bytes());
        f.write_all(&head)?;
        f.write_all(&json)?;
        f.write_all(&self.blob)?;
        f.rewind()?;
        self.fds.push(memfd.as_raw_fd());
        for fd in self.fds {
            inheritable(fd, true)?;
        }
        Ok(())
    }

    /// Names `fd` in the document (the listener, the control connection).
    pub fn keep(&mut self, fd: RawFd) -> i32 {
        Sink::fd(self, fd)
    }
}

/// Sets or clears `FD_CLOEXEC` on `fd`.
pub fn inheritable(fd: RawFd, yes: bool) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor number; the result is checked.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let flags = if yes {
        flags & !libc::FD_CLOEXEC
    } else {
        flags | libc::FD_CLOEXEC
    };
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, flags) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A new memfd for the document (close-on-exec until it is finished).
pub fn memfd() -> std::io::Result<std::fs::File> {
    let name = c"exec-server-handover";
    // SAFETY: memfd_create takes a NUL-terminated name and flags.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor the kernel gave us.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Why a state document cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Not a state document.
    #[error("not an exec-server state document")]
    NotADocument,
    /// Another version.
    #[error("state document version {found}; this binary reads {reads:?}")]
    Version {
        /// The document's.
        found: u32,
        /// This binary's.
        reads: &'static [u32],
    },
    /// Cut short, or its JSON does not parse.
    #[error("corrupt state document: {0}")]
    Corrupt(String),
    /// Reading it failed.
    #[error("cannot read the state document: {0}")]
    Io(#[from] std::io::Error),
}

/// The state document as the next image reads it, with the descriptors it
/// names (each owned once taken).
pub struct Reader {
    /// The document.
    pub doc: StateDoc,
    blob: bytes::Bytes,
    fds: HashMap<i32, OwnedFd>,
    /// The document's own descriptor, kept to give the state back.
    pub memfd: std::fs::File,
}

impl Reader {
    /// Reads the document from `memfd` and claims every descriptor it
    /// names, setting close-on-exec on each again. Errors: see
    /// [`ReadError`] (a descriptor it names is not open: `Corrupt`), with
    /// `memfd` back and no descriptor claimed.
    pub fn read(memfd: std::fs::File) -> Result<Reader, (ReadError, std::fs::File)> {
        match Self::parse(&memfd) {
            Ok((doc, blob)) => Self::claim(doc, blob, memfd),
            Err(e) => Err((e, memfd)),
        }
    }

    fn parse(memfd: &std::fs::File) -> Result<(StateDoc, Vec<u8>), ReadError> {
        let mut f = memfd;
        f.rewind()?;
        let mut head = [0u8; 20];
        f.read_exact(&mut head)
            .map_err(|_| ReadError::NotADocument)?;
        if &head[..8] != MAGIC {
            return Err(ReadError::NotADocument);
        }
        let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        if !READS_VERSIONS.contains(&version) {
            return Err(ReadError::Version {
                found: version,
                reads: READS_VERSIONS,
            });
        }
        let mut len = [0u8; 8];
        len.copy_from_slice(&head[12..20]);
        let json_len = u64::from_le_bytes(len);
        let total = memfd.metadata()?.len();
        if total > MAX_DOC_BYTES || json_len > total.saturating_sub(20) {
            return Err(ReadError::Corrupt(format!(
                "{total} bytes, JSON part of {json_len}"
            )));
        }
        let mut json = vec![0u8; json_len as usize];
        f.read_exact(&mut json)
            .map_err(|e| ReadError::Corrupt(e.to_string()))?;
        let mut blob = Vec::with_capacity((total - 20 - json_len) as usize);
        f.read_to_end(&mut blob)?;
        let doc: StateDoc =
            serde_json::from_slice(&json).map_err(|e| ReadError::Corrupt(e.to_string()))?;
        Ok((doc, blob))
    }

    /// Checks every named descriptor is open and named once, then owns them.
    fn claim(
        doc: StateDoc,
        blob: Vec<u8>,
        memfd: std::fs::File,
    ) -> Result<Reader, (ReadError, std::fs::File)> {
        let named = named_fds(&doc);
        let mut seen = std::collections::HashSet::new();
        for &n in &named {
            // SAFETY: F_GETFD only reads the flags of a descriptor number.
            let open = n > 2 && unsafe { libc::fcntl(n, libc::F_GETFD) } >= 0;
            if !open || !seen.insert(n) || n == memfd.as_raw_fd() {
                let why = format!("descriptor {n} is not open, or named twice");
                return Err((ReadError::Corrupt(why), memfd));
            }
        }
        let mut fds = HashMap::new();
        for n in named {
            let _ = inheritable(n, false);
            // SAFETY: the previous image of this process kept `n` open for
            // us (checked above), and the document names it once.
            fds.insert(n, unsafe { OwnedFd::from_raw_fd(n) });
        }
        let _ = inheritable(memfd.as_raw_fd(), false);
        Ok(Reader {
            doc,
            blob: blob.into(),
            fds,
            memfd,
        })
    }

    /// Reads the document in `memfd` without taking anything over
    /// (`--handover-check`): the counts of sessions and processes it holds.
    /// Errors: see [`ReadError`].
    pub fn check(memfd: &std::fs::File) -> Result<(String, usize, usize), ReadError> {
        let (doc, blob) = Self::parse(memfd)?;
        let processes = doc.sessions.iter().map(|s| s.processes.len()).sum();
        for s in &doc.sessions {
            for p in &s.processes {
                if !p.blobs_within(blob.len() as u64) {
                    return Err(ReadError::Corrupt(format!(
                        "process {} points outside the blob",
                        p.id()
                    )));
                }
            }
        }
        Ok((doc.nonce, doc.sessions.len(), processes))
    }

    /// Takes the descriptor numbered `n`. Errors: not named, or taken.
    pub fn take_fd(&mut self, n: i32) -> std::io::Result<OwnedFd> {
        self.fds.remove(&n).ok_or_else(|| {
            std::io::Error::other(format!("descriptor {n} is not in the state document"))
        })
    }
}

impl Source for Reader {
    fn fd(&mut self, n: i32) -> std::io::Result<OwnedFd> {
        self.take_fd(n)
    }

    fn bytes(&self, blob: Blob) -> std::io::Result<bytes::Bytes> {
        let end = blob.at.checked_add(blob.len);
        match end {
            Some(end) if end <= self.blob.len() as u64 => {
                Ok(self.blob.slice(blob.at as usize..end as usize))
            }
            _ => Err(std::io::Error::other(
                "a blob range is outside the document",
            )),
        }
    }
}

/// Every descriptor number the document names.
fn named_fds(doc: &StateDoc) -> Vec<i32> {
    let mut all: Vec<i32> = Vec::new();
    all.extend(doc.listener.as_ref().map(|l| l.fd));
    all.extend(doc.control);
    all.extend(doc.previous_exe);
    all.extend(doc.rundir.as_ref().map(|r| r.1));
    for s in &doc.sessions {
        for p in &s.processes {
            all.extend(p.fds());
        }
    }
    all
}
