//! Whole-file writes that readers never see half done.
//!
//! `fs/writeFile` and `fs/open {mode: "replace"}` write a temporary file in the
//! target's directory and rename it over the target when complete, so a reader
//! sees the old content or the new, never an empty or partial file, and an
//! interrupted upload leaves the old file intact. The rename keeps the
//! target's permission bits and, where allowed, its owner.
//!
//! A target the rename would change the meaning of is written in place instead
//! (as before): a symlink that is followed (the link stays a link), a file with
//! other hard links (they keep sharing the content), and anything that is not a
//! regular file (FIFOs, devices). So is a target whose directory does not let
//! us create the temporary file, and a target that is a mount point: a
//! sandbox's view binds protected names (`.git`…) and read-only entries over
//! their paths, and an `fs/open` replace commits its rename in the server,
//! outside that view, where the mount is not: written in place, the target is
//! opened in the view and a read-only one is refused there (EROFS).

use super::resolve::{kind, Located};
use nix::fcntl::{fcntl, openat, renameat, FcntlArg, OFlag};
use nix::sys::stat::{fchmod, FileStat, Mode, SFlag};
use nix::unistd::{fchown, unlinkat, Gid, Uid, UnlinkatFlags};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};

/// A temporary file that becomes the target when committed and is removed
/// when dropped uncommitted.
pub struct PendingReplace {
    dir: OwnedFd,
    temp: OsString,
    target: OsString,
    committed: bool,
}

impl PendingReplace {
    /// The directory, the temporary name and the target name, without
    /// removing the temporary file (its new owner commits or drops it).
    pub fn into_parts(self) -> (OwnedFd, OsString, OsString) {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never used or dropped again, so each field is moved
        // out exactly once.
        unsafe {
            (
                std::ptr::read(&me.dir),
                std::ptr::read(&me.temp),
                std::ptr::read(&me.target),
            )
        }
    }

    /// A pending replace from [`PendingReplace::into_parts`].
    pub fn from_parts(dir: OwnedFd, temp: OsString, target: OsString) -> PendingReplace {
        PendingReplace {
            dir,
            temp,
            target,
            committed: false,
        }
    }

    /// Renames the temporary file over the target.
    pub fn commit(mut self) -> io::Result<()> {
        self.committed = true;
        let r = renameat(
            &self.dir,
            self.temp.as_os_str(),
            &self.dir,
            self.target.as_os_str(),
        );
        if r.is_err() {
            let _ = unlinkat(&self.dir, self.temp.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
        Ok(r?)
    }
}

impl Drop for PendingReplace {
    fn drop(&mut self) {
        if !self.committed {
            let _ = unlinkat(&self.dir, self.temp.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
    }
}

/// How a whole-file write reaches its target.
pub enum Writer {
    /// Writing into a temporary file, renamed over the target on commit.
    Replace(File, PendingReplace),
    /// Writing the target itself, truncated.
    InPlace(File),
}

impl Writer {
    /// The file to write to.
    pub fn file(&self) -> &File {
        match self {
            Writer::Replace(f, _) | Writer::InPlace(f) => f,
        }
    }

    /// Finishes the write: renames a temporary file over the target.
    pub fn commit(self) -> io::Result<()> {
        match self {
            Writer::Replace(_, pending) => pending.commit(),
            Writer::InPlace(_) => Ok(()),
        }
    }
}

/// The mount id (`statx`'s `STATX_MNT_ID`) of `name` in `dir` (not
/// followed), or of `dir` itself for an empty name.
fn mount_id(dir: &impl std::os::fd::AsFd, name: &OsStr) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let name = std::ffi::CString::new(name.as_bytes())?;
    let flags = libc::AT_SYMLINK_NOFOLLOW
        | if name.is_empty() {
            libc::AT_EMPTY_PATH
        } else {
            0
        };
    // SAFETY: statx fills the zeroed buffer it is given; the name is
    // NUL-terminated and outlives the call.
    let mut buf: libc::statx = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::statx(
            dir.as_fd().as_raw_fd(),
            name.as_ptr(),
            flags,
            libc::STATX_MNT_ID,
            &mut buf,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if buf.stx_mask & libc::STATX_MNT_ID == 0 {
        return Err(io::Error::from_raw_os_error(libc::ENOSYS));
    }
    Ok(buf.stx_mnt_id)
}

/// Whether `at`'s final name is a mount point (another mount than its
/// directory's). Where the kernel cannot tell (before Linux 5.8), every
/// existing target counts as one: written in place, never renamed over.
fn is_mount_point(at: &Located) -> io::Result<bool> {
    match (
        mount_id(&at.dir, &at.name),
        mount_id(&at.dir, OsStr::new("")),
    ) {
        (Ok(target), Ok(dir)) => Ok(target != dir),
        (Err(e), _) | (_, Err(e)) if e.raw_os_error() == Some(libc::ENOSYS) => Ok(true),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// A name no other writer picks: this process's id, a counter and 64 random
/// bits (a sandbox's file helper is pid 2 in its own namespace, every time).
fn temp_name() -> OsString {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut random = [0u8; 8];
    // SAFETY: getrandom fills the buffer it is given (a short read leaves
    // zeros: the counter and pid still differ within a process).
    unsafe { libc::getrandom(random.as_mut_ptr().cast(), random.len(), 0) };
    OsString::from(format!(
        ".exec-server-{}-{n}-{:016x}.tmp",
        std::process::id(),
        u64::from_ne_bytes(random)
    ))
}

/// Opens a whole-file write of `at` (`follow_final`: follow a final symlink;
/// without it a symlink is ELOOP, as the reference answers).
pub fn open_writer(at: Located, follow_final: bool) -> io::Result<Writer> {
    let existing = match at.lstat() {
        Ok(st) => Some(st),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let replaceable = match &existing {
        None => true,
        Some(st) => kind(st) == SFlag::S_IFREG && st.st_nlink == 1 && !is_mount_point(&at)?,
    };
    if replaceable {
        match open_temp(&at, existing.as_ref()) {
            Ok(w) => return Ok(w),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)) => {}
            Err(e) => return Err(e),
        }
    }
    open_in_place(&at.dir, &at.name, follow_final)
}

fn open_temp(at: &Located, existing: Option<&FileStat>) -> io::Result<Writer> {
    let temp = temp_name();
    let mode = existing.map_or(0o666, |st| st.st_mode & 0o7777);
    let fd = openat(
        &at.dir,
        temp.as_os_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(mode),
    )?;
    let pending = PendingReplace {
        dir: at.dir.try_clone()?,
        temp,
        target: at.name.clone(),
        committed: false,
    };
    if let Some(st) = existing {
        // Best effort: a non-root server cannot give a file away.
        let _ = fchown(
            &fd,
            Some(Uid::from_raw(st.st_uid)),
            Some(Gid::from_raw(st.st_gid)),
        );
        fchmod(&fd, Mode::from_bits_truncate(st.st_mode & 0o7777))?;
    }
    Ok(Writer::Replace(File::from(fd), pending))
}

fn open_in_place(dir: &OwnedFd, name: &OsStr, follow_final: bool) -> io::Result<Writer> {
    // O_NONBLOCK: a FIFO without a reader fails (ENXIO) instead of hanging.
    let mut flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    if !follow_final {
        flags |= OFlag::O_NOFOLLOW;
    }
    let fd = openat(dir, name, flags, Mode::from_bits_truncate(0o666))?;
    fcntl(&fd, FcntlArg::F_SETFL(OFlag::empty()))?;
    let file = File::from(fd);
    if file.metadata()?.is_file() {
        file.set_len(0)?;
    }
    Ok(Writer::InPlace(file))
}

/// Writes all of `data` to `at` as one whole-file replacement.
pub fn write_whole(at: Located, follow_final: bool, data: &[u8]) -> io::Result<()> {
    let writer = open_writer(at, follow_final)?;
    let mut file = writer.file();
    if let Writer::Replace(f, _) = &writer {
        // The size is known: reserved at once (an in-place target's size
        // is visible, and is left to the writes).
        super::prealloc::reserve_whole(f, data.len() as u64);
    }
    file.write_all(data)?;
    writer.commit()
}
