//! Whole-tree operations (`fs/remove` with `recursive`, `fs/copy` of a
//! directory) without recursion on the call stack and without following any
//! symlink below the named path.
//!
//! A peer controls the depth of a tree, so both walks keep their state in a
//! heap `Vec` and hold only the current directory open: going down opens a
//! child by name (`O_NOFOLLOW`), going up opens `..` and checks that it is the
//! directory recorded on the way down. Memory grows with depth by one short
//! record per level; descriptors stay constant.

use super::resolve::{id_of, id_of_fd, kind, open_parent_checked, open_subdir, FileId};
use nix::dir::{Dir, Type};
use nix::fcntl::{openat, readlinkat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstat, fstatat, mkdirat, Mode, SFlag};
use nix::unistd::{symlinkat, unlinkat, UnlinkatFlags};
use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

/// The entries of an open directory, without `.` and `..`.
fn entries(dir: impl AsFd) -> io::Result<Vec<(OsString, Option<Type>)>> {
    let mut d = Dir::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut out = Vec::new();
    for e in d.iter() {
        let e = e?;
        let name = e.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        out.push((OsStr::from_bytes(name).to_owned(), e.file_type()));
    }
    Ok(out)
}

fn is_dir_entry(dir: impl AsFd, name: &OsStr, hint: Option<Type>) -> io::Result<bool> {
    match hint {
        Some(t) => Ok(t == Type::Directory),
        None => {
            let st = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
            Ok(kind(&st) == SFlag::S_IFDIR)
        }
    }
}

/// An error for a tree that crosses into another file system.
fn mount_point(name: &OsStr) -> io::Error {
    io::Error::other(format!(
        "`{}` is a mount point; it was left in place",
        name.to_string_lossy()
    ))
}

/// Removes directory `name` of `parent` with everything below it. Symlinks are
/// removed, never entered; mount points below it are refused, never emptied.
/// Stops at the first error (what was removed stays removed).
pub fn remove_tree(parent: &OwnedFd, name: &OsStr) -> io::Result<()> {
    let top = open_subdir(parent, name)?;
    let device = fstat(&top)?.st_dev;
    // One record per level below `top`: the directory's name in its parent and
    // the parent's identity.
    let mut ancestors: Vec<(OsString, FileId)> = Vec::new();
    let mut current = top;
    loop {
        let mut descend = None;
        for (entry, hint) in entries(&current)? {
            if is_dir_entry(&current, &entry, hint)? {
                descend = Some(entry);
                break;
            }
            match unlinkat(&current, entry.as_os_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(entry) = descend {
            let child = open_subdir(&current, &entry)?;
            if fstat(&child)?.st_dev != device {
                return Err(mount_point(&entry));
            }
            ancestors.push((entry, id_of_fd(&current)?));
            current = child;
            continue;
        }
        let Some((entry, parent_id)) = ancestors.pop() else {
            break;
        };
        let up = open_parent_checked(&current, parent_id)?;
        drop(current);
        unlinkat(&up, entry.as_os_str(), UnlinkatFlags::RemoveDir)?;
        current = up;
    }
    drop(current);
    Ok(unlinkat(parent, name, UnlinkatFlags::RemoveDir)?)
}

/// Copies regular file `src_name` of `src_dir` to `dst_name` of `dst_dir`
/// (created or overwritten, permission bits of the source). `follow_dst`
/// follows a symlink at the destination (only for the path the client named).
/// Refuses, before truncating anything, when both names are the same file
/// (hard links included).
pub fn copy_file(
    src_dir: impl AsFd,
    src_name: &OsStr,
    dst_dir: impl AsFd,
    dst_name: &OsStr,
    follow_dst: bool,
) -> io::Result<()> {
    let src = openat(
        src_dir,
        src_name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let src_st = fstat(&src)?;
    if kind(&src_st) != SFlag::S_IFREG {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is not a regular file, directory or symlink",
                src_name.to_string_lossy()
            ),
        ));
    }
    let mut flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    if !follow_dst {
        flags |= OFlag::O_NOFOLLOW;
    }
    let dst = openat(dst_dir, dst_name, flags, Mode::from_bits_truncate(0o600))?;
    let dst_st = fstat(&dst)?;
    if id_of(&dst_st) == id_of(&src_st) {
        return Err(same_file());
    }
    if kind(&dst_st) != SFlag::S_IFREG {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the destination is not a regular file",
        ));
    }
    let mut dst = File::from(dst);
    dst.set_len(0)?;
    io::copy(&mut File::from(src), &mut dst)?;
    fchmod(&dst, Mode::from_bits_truncate(src_st.st_mode & 0o777))?;
    Ok(())
}

/// The error for a copy onto its own source.
pub fn same_file() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "fs/copy source and destination are the same file",
    )
}

/// Copies a symlink as a symlink; an existing destination is EEXIST.
pub fn copy_link(
    src_dir: impl AsFd,
    src_name: &OsStr,
    dst_dir: impl AsFd,
    dst_name: &OsStr,
) -> io::Result<()> {
    let target = readlinkat(src_dir, src_name)?;
    Ok(symlinkat(target.as_os_str(), dst_dir, dst_name)?)
}

/// Creates directory `name` of `dir` (mode of the source), or opens it when it
/// already exists as a directory (copies merge into an existing tree).
fn make_dir(dir: impl AsFd + Copy, name: &OsStr, mode: u32, follow: bool) -> io::Result<OwnedFd> {
    match mkdirat(dir, name, Mode::from_bits_truncate(mode & 0o777)) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let mut flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    if !follow {
        flags |= OFlag::O_NOFOLLOW;
    }
    Ok(openat(dir, name, flags, Mode::empty())?)
}

/// One directory being copied: entries still to copy and the identities of
/// the source and destination directories (to check `..` on the way up).
struct Level {
    pending: Vec<(OsString, Option<Type>)>,
    src_id: FileId,
    dst_id: FileId,
}

/// Copies directory `src_name` of `src_dir` to `dst_name` of `dst_dir`.
/// Directories, regular files and symlinks (as symlinks) are copied; other
/// kinds are skipped. Nothing this copy created is ever copied again, so a
/// destination inside the source cannot make it recurse.
pub fn copy_tree(
    src_dir: impl AsFd,
    src_name: &OsStr,
    dst_dir: impl AsFd + Copy,
    dst_name: &OsStr,
) -> io::Result<()> {
    let mut src = open_subdir(src_dir, src_name)?;
    let mut dst = make_dir(dst_dir, dst_name, fstat(&src)?.st_mode, true)?;
    let mut created: HashSet<FileId> = HashSet::from([id_of_fd(&dst)?]);
    let mut levels = vec![Level {
        pending: entries(&src)?,
        src_id: id_of_fd(&src)?,
        dst_id: id_of_fd(&dst)?,
    }];
    while let Some(level) = levels.last_mut() {
        let Some((name, _)) = level.pending.pop() else {
            levels.pop();
            if let Some(parent) = levels.last() {
                src = open_parent_checked(&src, parent.src_id)?;
                dst = open_parent_checked(&dst, parent.dst_id)?;
            }
            continue;
        };
        let st = match fstatat(&src, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(nix::errno::Errno::ENOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        if created.contains(&id_of(&st)) {
            continue;
        }
        match kind(&st) {
            SFlag::S_IFDIR => {
                let child_src = open_subdir(&src, &name)?;
                let child_dst = make_dir(&dst, &name, st.st_mode, false)?;
                let dst_id = id_of_fd(&child_dst)?;
                created.insert(dst_id);
                levels.push(Level {
                    pending: entries(&child_src)?,
                    src_id: id_of(&st),
                    dst_id,
                });
                src = child_src;
                dst = child_dst;
            }
            SFlag::S_IFREG => copy_file(&src, &name, &dst, &name, false)?,
            SFlag::S_IFLNK => copy_link(&src, &name, &dst, &name)?,
            _ => {} // FIFOs, sockets and devices inside a tree are skipped
        }
    }
    Ok(())
}

/// True when directory `dir` is `ancestor` or lies below it (walking `..` up
/// to the root, so symlinks and bind mounts cannot hide the relation).
pub fn is_within(dir: &OwnedFd, ancestor: FileId) -> io::Result<bool> {
    let mut current = openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    loop {
        let id = id_of_fd(&current)?;
        if id == ancestor {
            return Ok(true);
        }
        let up = openat(
            &current,
            "..",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        if id_of_fd(&up)? == id {
            return Ok(false); // the root is its own parent
        }
        current = up;
    }
}
