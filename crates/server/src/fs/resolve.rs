//! Path resolution for the `fs/*` methods.
//!
//! A method resolves its path once: the directory that holds the final name is
//! opened as a descriptor, one component at a time, and the final name is then
//! acted on relative to that descriptor (`*at` calls). A symlink swapped in
//! between a check and its use therefore cannot redirect the action, paths
//! longer than `PATH_MAX` (deep trees) still resolve, and `followSymlinks:
//! false` can refuse a symlink anywhere on the way, as the reference does.

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag, AT_FDCWD};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode, SFlag};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

/// How symlinks on the way to a path are treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Follow {
    /// Symlinks in the directories above the final name are followed, as the
    /// OS does (every method's default).
    Ancestors,
    /// `followSymlinks: false`: no component may be a symlink. A directory
    /// symlink on the way fails with ENOTDIR, a final one with ELOOP — the
    /// reference's answers.
    Never,
}

impl Follow {
    /// `Never` only for an explicit `followSymlinks: false`.
    pub fn from_wire(follow_symlinks: Option<bool>) -> Follow {
        if follow_symlinks == Some(false) {
            Follow::Never
        } else {
            Follow::Ancestors
        }
    }
}

/// The path without `.` components and trailing slashes (`..` segments were
/// already resolved when the URI was parsed). `link/` thus names the link
/// itself, as in the reference, never the directory it points to.
pub fn normalize(path: &Path) -> PathBuf {
    path.components().collect()
}

/// Device and inode: what makes two names the same file.
pub type FileId = (u64, u64);

/// The identity of a stat result.
pub fn id_of(st: &FileStat) -> FileId {
    (st.st_dev, st.st_ino)
}

/// The identity of an open descriptor.
pub fn id_of_fd(fd: impl AsFd) -> io::Result<FileId> {
    Ok(id_of(&fstat(fd)?))
}

/// The file type bits of a stat result.
pub fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT
}

/// A final name and an open descriptor of the directory that holds it.
pub struct Located {
    /// The directory (an `O_PATH` descriptor).
    pub dir: OwnedFd,
    /// The final component.
    pub name: OsString,
}

impl Located {
    /// `lstat` of the final name (never follows it).
    pub fn lstat(&self) -> io::Result<FileStat> {
        Ok(fstatat(
            &self.dir,
            self.name.as_os_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )?)
    }
}

/// Opens the directory holding the final component of the absolute, normalised
/// `path`. `Ok(None)` for `/`, which has no final component.
pub fn locate(path: &Path, follow: Follow) -> io::Result<Option<Located>> {
    let Some(name) = path.file_name() else {
        return Ok(None);
    };
    let parent = path.parent().unwrap_or(Path::new("/"));
    let dir = open_dir(parent, follow)?;
    Ok(Some(Located {
        dir,
        name: name.to_owned(),
    }))
}

/// Opens the directory `path` as an `O_PATH` descriptor, walking it one
/// component at a time.
pub fn open_dir(path: &Path, follow: Follow) -> io::Result<OwnedFd> {
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let step = match follow {
        Follow::Ancestors => flags,
        Follow::Never => flags | OFlag::O_NOFOLLOW,
    };
    let mut dir = openat(AT_FDCWD, "/", flags, Mode::empty())?;
    for c in path.components() {
        let name: &OsStr = match c {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => continue,
            Component::ParentDir => OsStr::new(".."),
            Component::Normal(n) => n,
        };
        dir = openat(&dir, name, step, Mode::empty())?;
    }
    Ok(dir)
}

/// Opens a directory entry for reading its entries, never following a symlink
/// (a symlink gives ENOTDIR or ELOOP).
pub fn open_subdir(dir: impl AsFd, name: &OsStr) -> io::Result<OwnedFd> {
    Ok(openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?)
}

/// The parent of an open directory, checked to be the one recorded on the way
/// down: a directory moved meanwhile fails instead of leading elsewhere.
pub fn open_parent_checked(dir: impl AsFd, expected: FileId) -> io::Result<OwnedFd> {
    let up = openat(
        dir,
        "..",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    if id_of_fd(&up)? != expected {
        return Err(io::Error::other(
            "a directory was moved while the operation ran; stopped",
        ));
    }
    Ok(up)
}

/// An `io::Error` from an errno.
pub fn errno(e: Errno) -> io::Error {
    io::Error::from(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_like_the_reference() {
        assert_eq!(normalize(Path::new("/a/link/")), Path::new("/a/link"));
        assert_eq!(normalize(Path::new("/a/./b/.")), Path::new("/a/b"));
        assert_eq!(normalize(Path::new("/")), Path::new("/"));
    }

    #[test]
    fn never_refuses_symlinks_on_the_way() {
        let tmp = std::env::temp_dir().join(format!("resolve-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(tmp.join("real")).unwrap();
        std::os::unix::fs::symlink(tmp.join("real"), tmp.join("link")).unwrap();
        let through = tmp.join("link/f");
        assert!(locate(&through, Follow::Ancestors).unwrap().is_some());
        let e = locate(&through, Follow::Never).err().unwrap();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR));
        assert!(locate(Path::new("/"), Follow::Never).unwrap().is_none());
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
