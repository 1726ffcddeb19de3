//! File system methods (`fs/*`). Each operation is blocking and runs on Tokio's
//! blocking pool. Errors are [`ExecError`]s: an OS error keeps the OS text
//! ([`ExecError::io`]: not-found apart from the rest); a request that does not
//! apply to what the path names (not a file, a directory without `recursive`,
//! a copy into itself, a block out of range) is
//! [`InvalidInput`](crate::error::ErrorKind::InvalidInput).

mod blocks;
pub mod handles;
pub mod prealloc;
pub mod resolve;
pub mod tree;
pub mod walk;
pub mod watch;
pub mod write;

use crate::error::{ExecError, ExecResult};
use exec_server_protocol::types::*;
use exec_server_protocol::{ByteChunk, PathUri};
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstatat, mkdirat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};
use resolve::{kind, locate, Follow, Located};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

/// Largest file `fs/readFile` returns: 256 MiB. Larger files must be read with
/// `fs/open` + `fs/readBlock`, which keeps memory flat.
pub const MAX_READ_FILE_BYTES: u64 = 256 * 1024 * 1024;
/// Largest block of `fs/readBlock` and `fs/writeBlock`: 1 MiB.
pub const MAX_BLOCK_BYTES: u64 = 1024 * 1024;

pub use blocks::{open, read_block, read_block_pieces, write_block, READ_BLOCK_PIECE_BYTES};

/// The native path of a URI, normalised (no `.` components, no trailing slash):
/// [`InvalidParams`](crate::error::ErrorKind::InvalidParams) for a NUL byte,
/// [`InvalidInput`](crate::error::ErrorKind::InvalidInput) for a URI that names
/// no path on this host (e.g. another host), as the reference answers.
pub fn native(p: &PathUri) -> ExecResult<PathBuf> {
    let path = p.to_path().map_err(ExecError::invalid_input)?;
    if path.as_os_str().as_encoded_bytes().contains(&0) {
        return Err(ExecError::invalid_params(format!(
            "path `{p}` contains a NUL byte"
        )));
    }
    Ok(resolve::normalize(&path))
}

fn nix_io(e: nix::errno::Errno) -> ExecError {
    ExecError::io(e.into())
}

fn not_a_file(p: &Path) -> ExecError {
    ExecError::invalid_input(format!("path `{}` is not a file", p.display()))
}

/// The directory holding `path`'s final name; `/` (no final name) is
/// `on_root`'s error.
fn located(
    path: &Path,
    follow: Follow,
    on_root: impl FnOnce() -> ExecError,
) -> ExecResult<Located> {
    locate(path, follow)
        .map_err(ExecError::io)?
        .ok_or_else(on_root)
}

fn operation_not_permitted() -> ExecError {
    // What the reference answers for `/`.
    ExecError::invalid_input(std::io::Error::from_raw_os_error(libc::EPERM).to_string())
}

/// Opens `path` for reading, resolved once; FIFOs open without blocking (and
/// are then refused as not a file).
fn open_for_read(path: &Path, follow: Option<bool>) -> ExecResult<File> {
    let follow = Follow::from_wire(follow);
    let mut flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    if follow == Follow::Never {
        flags |= OFlag::O_NOFOLLOW;
    }
    let fd = match locate(path, follow).map_err(ExecError::io)? {
        Some(at) => openat(&at.dir, at.name.as_os_str(), flags, Mode::empty()),
        None => return Err(not_a_file(path)),
    }
    .map_err(nix_io)?;
    let file = File::from(fd);
    if !file.metadata().map_err(ExecError::io)?.is_file() {
        return Err(not_a_file(path));
    }
    Ok(file)
}

/// `fs/readFile`.
pub fn read_file(p: &ReadFileParams) -> ExecResult<ReadFileResponse> {
    let mut data = Vec::new();
    read_file_chunks(p, |event| match event {
        FileRead::Size(len) => data.reserve_exact(len as usize),
        FileRead::Piece(piece) => data.extend_from_slice(piece),
    })?;
    Ok(ReadFileResponse {
        data_base64: ByteChunk::from(data),
    })
}

/// Pieces [`read_file_chunks`] hands over: 768 KiB, a multiple of 3 so that
/// each piece encodes to base64 without padding and pieces can be appended.
pub const READ_FILE_PIECE_BYTES: usize = 3 * 256 * 1024;

/// What [`read_file_chunks`] reports, in order: the size once, then pieces.
pub enum FileRead<'a> {
    /// The file's size in bytes, as `fstat` reports it when opened (it may
    /// still grow or shrink).
    Size(u64),
    /// The next bytes of the file.
    Piece(&'a [u8]),
}

/// `fs/readFile` without holding the file: `on` learns the file's size, then
/// receives its contents in order, [`READ_FILE_PIECE_BYTES`] at a time (the
/// last piece may be shorter), through one reused buffer, so a reply can be
/// encoded as the file is read. Same checks and errors as [`read_file`]: a
/// file above [`MAX_READ_FILE_BYTES`] is refused before anything is read, and
/// one that grows meanwhile is never read past that cap.
pub fn read_file_chunks(p: &ReadFileParams, mut on: impl FnMut(FileRead<'_>)) -> ExecResult<()> {
    let (file, len) = open_file_to_read(p)?;
    on(FileRead::Size(len));
    let mut pieces = FilePieces::new(file, len);
    while let Some(piece) = pieces.next_piece().map_err(ExecError::io)? {
        on(FileRead::Piece(piece));
    }
    Ok(())
}

/// The checks of `fs/readFile` before any byte is read: the file opened for
/// reading and its size (`fstat`, bytes). Errors: the path's (not found, a
/// directory, …), and `InvalidInput` for a file above [`MAX_READ_FILE_BYTES`].
pub fn open_file_to_read(p: &ReadFileParams) -> ExecResult<(std::fs::File, u64)> {
    let path = native(&p.path)?;
    let file = open_for_read(&path, p.follow_symlinks)?;
    let len = file.metadata().map_err(ExecError::io)?.len();
    if len > MAX_READ_FILE_BYTES {
        return Err(ExecError::invalid_input(format!(
            "file `{}` is {} bytes, above the fs/readFile limit of {} bytes; read it in blocks with fs/open and fs/readBlock",
            path.display(),
            len,
            MAX_READ_FILE_BYTES
        )));
    }
    Ok((file, len))
}

/// An opened file read to its end (never past [`MAX_READ_FILE_BYTES`]) in
/// pieces of [`READ_FILE_PIECE_BYTES`]: every piece but the last is that
/// long, a multiple of 3, so pieces encode to base64 that can be appended.
pub struct FilePieces {
    reader: std::io::Take<std::fs::File>,
    buf: Vec<u8>,
    /// The last read filled the buffer: more may follow.
    full: bool,
    done: bool,
}

impl FilePieces {
    /// Pieces of `file`, whose size at open was `len` bytes.
    pub fn new(file: std::fs::File, len: u64) -> Self {
        // One byte past the size (rounded to whole base64 groups) sees the
        // end in one read for a small file.
        let first = (len as usize + 1).div_ceil(3) * 3;
        FilePieces {
            reader: file.take(MAX_READ_FILE_BYTES),
            buf: vec![0u8; first.min(READ_FILE_PIECE_BYTES)],
            full: false,
            done: false,
        }
    }

    /// The next piece, or `None` at the end. Errors: the read's.
    pub fn next_piece(&mut self) -> std::io::Result<Option<&[u8]>> {
        if self.done {
            return Ok(None);
        }
        if self.full && self.buf.len() < READ_FILE_PIECE_BYTES {
            // The file grew past its size at open: continue in full pieces.
            self.buf.resize(READ_FILE_PIECE_BYTES, 0);
        }
        // Fill the buffer completely (short reads happen) so every piece but
        // the last is a multiple of 3 bytes.
        let mut filled = 0;
        while filled < self.buf.len() {
            match self.reader.read(&mut self.buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.full = filled == self.buf.len();
        self.done = !self.full;
        Ok((filled > 0).then(|| &self.buf[..filled]))
    }
}

/// The bytes of an `fs/writeFile`, or `InvalidInput` naming why
/// its `dataBase64` is not base64, in the reference's words.
pub fn write_file_data(p: &WriteFileParams) -> ExecResult<&bytes::Bytes> {
    p.data_base64.bytes().map_err(|fault| {
        ExecError::invalid_input(format!(
            "fs/writeFile requires valid base64 dataBase64: {fault}"
        ))
    })
}

/// `fs/writeFile`: creates or replaces the whole file (see [`write`]).
pub fn write_file(p: WriteFileParams) -> ExecResult<Empty> {
    let path = native(&p.path)?;
    let follow = Follow::from_wire(p.follow_symlinks);
    let at = located(&path, follow, || {
        ExecError::io(std::io::Error::from_raw_os_error(libc::EISDIR))
    })?;
    let data = write_file_data(&p)?;
    write::write_whole(at, follow == Follow::Ancestors, data).map_err(ExecError::io)?;
    Ok(Empty {})
}

/// `fs/createDirectory`: with `recursive`, every missing directory on the way
/// is created one component at a time (so any depth works).
pub fn create_directory(p: &CreateDirectoryParams) -> ExecResult<Empty> {
    let path = native(&p.path)?;
    let follow = Follow::from_wire(p.follow_symlinks);
    if !p.recursive {
        let at = located(&path, follow, || {
            ExecError::io(std::io::Error::from_raw_os_error(libc::EEXIST))
        })?;
        mkdirat(
            &at.dir,
            at.name.as_os_str(),
            Mode::from_bits_truncate(0o777),
        )
        .map_err(nix_io)?;
        return Ok(Empty {});
    }
    let mut step = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    if follow == Follow::Never {
        step |= OFlag::O_NOFOLLOW;
    }
    let mut dir = resolve::open_dir(Path::new("/"), follow).map_err(ExecError::io)?;
    for c in path.components() {
        let std::path::Component::Normal(name) = c else {
            continue;
        };
        dir = match openat(&dir, name, step, Mode::empty()) {
            Ok(d) => d,
            Err(nix::errno::Errno::ENOENT) => {
                match mkdirat(&dir, name, Mode::from_bits_truncate(0o777)) {
                    Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                    Err(e) => return Err(nix_io(e)),
                }
                openat(&dir, name, step, Mode::empty()).map_err(nix_io)?
            }
            Err(e) => return Err(nix_io(e)),
        };
    }
    Ok(Empty {})
}

fn ms(t: std::io::Result<std::time::SystemTime>) -> i64 {
    t.ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// `fs/getMetadata`: type and size of the target, `isSymlink` of the path
/// itself. With `followSymlinks: false` no symlink is followed at all.
pub fn get_metadata(p: &PathParams) -> ExecResult<MetadataResponse> {
    let path = native(&p.path)?;
    let follow = Follow::from_wire(p.follow_symlinks);
    let is_symlink = match locate(&path, follow).map_err(ExecError::io)? {
        Some(at) => kind(&at.lstat().map_err(ExecError::io)?) == SFlag::S_IFLNK,
        None => false,
    };
    let meta = if is_symlink && follow == Follow::Never {
        std::fs::symlink_metadata(&path).map_err(ExecError::io)?
    } else {
        std::fs::metadata(&path).map_err(ExecError::io)?
    };
    Ok(MetadataResponse {
        is_directory: meta.is_dir(),
        is_file: meta.is_file(),
        is_symlink,
        size: meta.len(),
        created_at_ms: ms(meta.created()),
        modified_at_ms: ms(meta.modified()),
    })
}

/// `fs/canonicalize`.
pub fn canonicalize(p: &PathParams) -> ExecResult<CanonicalizeResponse> {
    let path = native(&p.path)?;
    let real = std::fs::canonicalize(&path).map_err(ExecError::io)?;
    let path = PathUri::from_path(&real)
        .ok_or_else(|| ExecError::failed(format!("`{}` has no file URI", real.display())))?;
    Ok(CanonicalizeResponse { path })
}

/// `fs/readDirectory`: directory order; symlinks show their target's type; dangling
/// links are left out.
pub fn read_directory(p: &PathParams) -> ExecResult<ReadDirectoryResponse> {
    let path = native(&p.path)?;
    let mut entries = Vec::new();
    for e in std::fs::read_dir(&path).map_err(ExecError::io)? {
        let e = e.map_err(ExecError::io)?;
        let Ok(meta) = std::fs::metadata(e.path()) else {
            continue;
        };
        entries.push(DirectoryEntry {
            file_name: e.file_name().to_string_lossy().into_owned(),
            is_directory: meta.is_dir(),
            is_file: meta.is_file(),
        });
    }
    Ok(ReadDirectoryResponse { entries })
}

/// `fs/remove`: the final name is never followed (a symlink is removed, its
/// target untouched, with or without a trailing slash); a directory's content
/// is removed without following links or crossing mount points.
pub fn remove(p: &RemoveParams) -> ExecResult<Empty> {
    let path = native(&p.path)?;
    let at = match locate(&path, Follow::from_wire(p.follow_symlinks)) {
        Ok(Some(at)) => at,
        Ok(None) => return Err(operation_not_permitted()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && p.force => return Ok(Empty {}),
        Err(e) => return Err(ExecError::io(e)),
    };
    let st = match at.lstat() {
        Ok(st) => st,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && p.force => return Ok(Empty {}),
        Err(e) => return Err(ExecError::io(e)),
    };
    let name = at.name.as_os_str();
    let r = if kind(&st) != SFlag::S_IFDIR {
        unlinkat(&at.dir, name, UnlinkatFlags::NoRemoveDir).map_err(Into::into)
    } else if p.recursive {
        tree::remove_tree(&at.dir, name)
    } else {
        unlinkat(&at.dir, name, UnlinkatFlags::RemoveDir).map_err(Into::into)
    };
    r.map_err(ExecError::io)?;
    Ok(Empty {})
}

fn copy_into_itself() -> ExecError {
    ExecError::invalid_input("fs/copy cannot copy a directory to itself or one of its descendants")
}

/// `fs/copy`: files, directories with `recursive`, symlinks copied as
/// symlinks. A directory is never copied into itself (checked on device and
/// inode, so symlinks cannot hide it); a file never onto itself (hard links
/// included).
pub fn copy(p: &CopyParams) -> ExecResult<Empty> {
    let src = native(&p.source_path)?;
    let dst = native(&p.destination_path)?;
    let Some(from) = locate(&src, Follow::Ancestors).map_err(ExecError::io)? else {
        // `/` itself: a directory that holds every destination.
        return Err(if p.recursive {
            copy_into_itself()
        } else {
            requires_recursive()
        });
    };
    let st = from.lstat().map_err(ExecError::io)?;
    let to = located(&dst, Follow::Ancestors, copy_into_itself)?;
    let (src_name, dst_name) = (from.name.as_os_str(), to.name.as_os_str());
    match kind(&st) {
        SFlag::S_IFDIR => {
            if !p.recursive {
                return Err(requires_recursive());
            }
            let source_id = resolve::id_of(&st);
            let target_dir = openat(
                &to.dir,
                ".",
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(nix_io)?;
            let onto_itself = fstatat(&to.dir, dst_name, nix::fcntl::AtFlags::empty())
                .is_ok_and(|d| resolve::id_of(&d) == source_id);
            if onto_itself || tree::is_within(&target_dir, source_id).map_err(ExecError::io)? {
                return Err(copy_into_itself());
            }
            tree::copy_tree(&from.dir, src_name, &to.dir, dst_name).map_err(ExecError::io)?;
        }
        SFlag::S_IFLNK => {
            tree::copy_link(&from.dir, src_name, &to.dir, dst_name).map_err(ExecError::io)?;
        }
        SFlag::S_IFREG => {
            tree::copy_file(&from.dir, src_name, &to.dir, dst_name, true).map_err(|e| {
                if e.kind() == std::io::ErrorKind::InvalidInput {
                    ExecError::invalid_input(e.to_string())
                } else {
                    ExecError::io(e)
                }
            })?;
        }
        _ => {
            return Err(ExecError::invalid_input(format!(
                "fs/copy only copies regular files, directories and symlinks; `{}` is neither",
                src.display()
            )))
        }
    }
    Ok(Empty {})
}

fn requires_recursive() -> ExecError {
    ExecError::invalid_input("fs/copy requires recursive: true when sourcePath is a directory")
}
