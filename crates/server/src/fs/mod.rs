//! File system methods (`fs/*`). Each operation is blocking and runs on Tokio's
//! blocking pool; errors follow SPEC §7: not-found is -32004, other OS errors
//! -32603 with the OS text, wrong kinds -32600.

pub mod handles;
pub mod walk;
pub mod watch;

use exec_server_protocol::types::*;
use exec_server_protocol::{ByteChunk, ErrorObject, PathUri};
use handles::HandleTable;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

/// Largest file `fs/readFile` returns: 256 MiB. Larger files must be read with
/// `fs/open` + `fs/readBlock`, which keeps memory flat.
pub const MAX_READ_FILE_BYTES: u64 = 256 * 1024 * 1024;
/// Largest block of `fs/readBlock` and `fs/writeBlock`: 1 MiB.
pub const MAX_BLOCK_BYTES: u64 = 1024 * 1024;

/// The native path of a URI: -32602 for a NUL byte, -32600 for a URI that names
/// no path on this host (e.g. another host), as the reference answers.
pub fn native(p: &PathUri) -> Result<PathBuf, ErrorObject> {
    let path = p.to_path().map_err(ErrorObject::invalid_request)?;
    if path.as_os_str().as_encoded_bytes().contains(&0) {
        return Err(ErrorObject::invalid_params(format!(
            "path `{p}` contains a NUL byte"
        )));
    }
    Ok(path)
}

fn io(e: std::io::Error) -> ErrorObject {
    ErrorObject::from_io(&e)
}

fn not_a_file(p: &Path) -> ErrorObject {
    ErrorObject::invalid_request(format!("path `{}` is not a file", p.display()))
}

/// `fs/readFile`.
pub fn read_file(p: &ReadFileParams) -> Result<ReadFileResponse, ErrorObject> {
    let path = native(&p.path)?;
    let meta = std::fs::metadata(&path).map_err(io)?;
    if !meta.is_file() {
        return Err(not_a_file(&path));
    }
    if meta.len() > MAX_READ_FILE_BYTES {
        return Err(ErrorObject::invalid_request(format!(
            "file `{}` is {} bytes, above the fs/readFile limit of {} bytes; read it in blocks with fs/open and fs/readBlock",
            path.display(),
            meta.len(),
            MAX_READ_FILE_BYTES
        )));
    }
    let data = std::fs::read(&path).map_err(io)?;
    Ok(ReadFileResponse {
        data_base64: ByteChunk(data),
    })
}

/// `fs/writeFile`: creates or truncates.
pub fn write_file(p: WriteFileParams) -> Result<Empty, ErrorObject> {
    let path = native(&p.path)?;
    std::fs::write(&path, &p.data_base64.0).map_err(io)?;
    Ok(Empty {})
}

/// `fs/createDirectory`.
pub fn create_directory(p: &CreateDirectoryParams) -> Result<Empty, ErrorObject> {
    let path = native(&p.path)?;
    if p.recursive {
        std::fs::create_dir_all(&path).map_err(io)?;
    } else {
        std::fs::create_dir(&path).map_err(io)?;
    }
    Ok(Empty {})
}

fn ms(t: std::io::Result<std::time::SystemTime>) -> i64 {
    t.ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// `fs/getMetadata`: type and size of the target, `isSymlink` of the path itself.
pub fn get_metadata(p: &PathParams) -> Result<MetadataResponse, ErrorObject> {
    let path = native(&p.path)?;
    let lmeta = std::fs::symlink_metadata(&path).map_err(io)?;
    let is_symlink = lmeta.file_type().is_symlink();
    let meta = if is_symlink {
        std::fs::metadata(&path).map_err(io)?
    } else {
        lmeta
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
pub fn canonicalize(p: &PathParams) -> Result<CanonicalizeResponse, ErrorObject> {
    let path = native(&p.path)?;
    let real = std::fs::canonicalize(&path).map_err(io)?;
    let path = PathUri::from_path(&real)
        .ok_or_else(|| ErrorObject::internal(format!("`{}` has no file URI", real.display())))?;
    Ok(CanonicalizeResponse { path })
}

/// `fs/readDirectory`: directory order; symlinks show their target's type; dangling
/// links are left out.
pub fn read_directory(p: &PathParams) -> Result<ReadDirectoryResponse, ErrorObject> {
    let path = native(&p.path)?;
    let mut entries = Vec::new();
    for e in std::fs::read_dir(&path).map_err(io)? {
        let e = e.map_err(io)?;
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

/// `fs/remove`.
pub fn remove(p: &RemoveParams) -> Result<Empty, ErrorObject> {
    let path = native(&p.path)?;
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && p.force => return Ok(Empty {}),
        Err(e) => return Err(io(e)),
    };
    let r = if meta.is_dir() {
        if p.recursive {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_dir(&path)
        }
    } else {
        std::fs::remove_file(&path)
    };
    r.map_err(io)?;
    Ok(Empty {})
}

/// `fs/copy`: files, directories with `recursive`, symlinks copied as symlinks.
pub fn copy(p: &CopyParams) -> Result<Empty, ErrorObject> {
    let src = native(&p.source_path)?;
    let dst = native(&p.destination_path)?;
    let meta = std::fs::symlink_metadata(&src).map_err(io)?;
    if meta.is_dir() {
        if !p.recursive {
            return Err(ErrorObject::invalid_request(
                "fs/copy requires recursive: true when sourcePath is a directory",
            ));
        }
        if dst.starts_with(&src) {
            return Err(ErrorObject::invalid_request(
                "fs/copy cannot copy a directory into itself",
            ));
        }
        copy_tree(&src, &dst).map_err(io)?;
    } else {
        if !meta.is_file() && !meta.file_type().is_symlink() {
            return Err(ErrorObject::invalid_request(format!(
                "fs/copy only copies regular files, directories and symlinks; `{}` is neither",
                src.display()
            )));
        }
        if let (Ok(a), Ok(b)) = (std::fs::canonicalize(&src), std::fs::canonicalize(&dst)) {
            if a == b {
                return Err(ErrorObject::invalid_request(
                    "fs/copy source and destination are the same file",
                ));
            }
        }
        copy_one(&src, &dst, &meta).map_err(io)?;
    }
    Ok(Empty {})
}

fn copy_one(src: &Path, dst: &Path, meta: &std::fs::Metadata) -> std::io::Result<()> {
    if meta.file_type().is_symlink() {
        // Never replace an existing destination with a link: EEXIST, as the reference.
        let target = std::fs::read_link(src)?;
        std::os::unix::fs::symlink(target, dst)
    } else if meta.is_file() {
        std::fs::copy(src, dst).map(|_| ())
    } else {
        // FIFOs, sockets and devices: opening one could block forever.
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} is not a regular file, directory or symlink",
                src.display()
            ),
        ))
    }
}

fn copy_tree(src: &Path, dst: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dst)?;
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let meta = std::fs::symlink_metadata(e.path())?;
        let to = dst.join(e.file_name());
        if meta.is_dir() {
            copy_tree(&e.path(), &to)?;
        } else if meta.is_file() || meta.file_type().is_symlink() {
            copy_one(&e.path(), &to, &meta)?;
        } // special files inside a tree are skipped
    }
    Ok(())
}

/// `fs/open`: `mode` `read` (default) or `replace` (create or truncate, then write).
pub fn open(p: &OpenParams, table: &HandleTable) -> Result<OpenResponse, ErrorObject> {
    table.check_free(&p.handle_id)?;
    let path = native(&p.path)?;
    let file = match p.mode {
        OpenMode::Read => {
            let meta = std::fs::metadata(&path).map_err(io)?;
            if !meta.is_file() {
                return Err(not_a_file(&path));
            }
            File::open(&path).map_err(io)?
        }
        OpenMode::Replace => {
            if std::fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
                return Err(not_a_file(&path));
            }
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .map_err(io)?
        }
    };
    table.insert(&p.handle_id, file)?;
    Ok(OpenResponse {
        handle_id: p.handle_id.clone(),
    })
}

/// `fs/readBlock`: up to `len` bytes at `offset`; `eof` once the end is reached.
pub fn read_block(
    p: &ReadBlockParams,
    table: &HandleTable,
) -> Result<ReadBlockResponse, ErrorObject> {
    if p.len == 0 || p.len > MAX_BLOCK_BYTES {
        return Err(ErrorObject::invalid_request(format!(
            "file read block length must be between 1 and {MAX_BLOCK_BYTES}"
        )));
    }
    check_offset(p.offset, p.len)?;
    let file = table.get(&p.handle_id)?;
    let mut buf = vec![0u8; p.len as usize];
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], p.offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(e)),
        }
    }
    buf.truncate(n);
    let size = file.metadata().map_err(io)?.len();
    Ok(ReadBlockResponse {
        eof: p.offset + n as u64 >= size,
        chunk: ByteChunk(buf),
    })
}

fn check_offset(offset: u64, len: u64) -> Result<(), ErrorObject> {
    if offset
        .checked_add(len)
        .is_none_or(|end| end > i64::MAX as u64)
    {
        return Err(ErrorObject::invalid_request(format!(
            "file offset {offset} is out of range"
        )));
    }
    Ok(())
}

/// `fs/writeBlock`: positional write; a gap is zero-filled by the OS.
pub fn write_block(p: &WriteBlockParams, table: &HandleTable) -> Result<Empty, ErrorObject> {
    let len = p.chunk.0.len() as u64;
    if len == 0 || len > MAX_BLOCK_BYTES {
        return Err(ErrorObject::invalid_request(format!(
            "file write block length must be between 1 and {MAX_BLOCK_BYTES}"
        )));
    }
    check_offset(p.offset, len)?;
    let file = table.get(&p.handle_id)?;
    file.write_all_at(&p.chunk.0, p.offset).map_err(io)?;
    Ok(Empty {})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(p: &Path) -> PathUri {
        PathUri::from_path(p).unwrap()
    }

    #[test]
    fn block_io_and_errors() {
        let dir = std::env::temp_dir().join(format!("fsblk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let table = HandleTable::default();
        let f = dir.join("f");
        let open_w = OpenParams {
            handle_id: "w".into(),
            path: uri(&f),
            mode: OpenMode::Replace,
            sandbox: None,
        };
        open(&open_w, &table).unwrap();
        assert_eq!(
            open(&open_w, &table).unwrap_err().code,
            -32600,
            "duplicate handle"
        );
        write_block(
            &WriteBlockParams {
                handle_id: "w".into(),
                offset: 0,
                chunk: ByteChunk(b"hello".to_vec()),
            },
            &table,
        )
        .unwrap();
        write_block(
            &WriteBlockParams {
                handle_id: "w".into(),
                offset: 8,
                chunk: ByteChunk(b"x".to_vec()),
            },
            &table,
        )
        .unwrap();
        let e = write_block(
            &WriteBlockParams {
                handle_id: "w".into(),
                offset: 0,
                chunk: ByteChunk(vec![]),
            },
            &table,
        )
        .unwrap_err();
        assert_eq!(e.code, -32600);
        table.remove("w");
        assert_eq!(std::fs::read(&f).unwrap(), b"hello\0\0\0x");
        let open_r = OpenParams {
            handle_id: "r".into(),
            path: uri(&f),
            mode: OpenMode::Read,
            sandbox: None,
        };
        open(&open_r, &table).unwrap();
        let r = read_block(
            &ReadBlockParams {
                handle_id: "r".into(),
                offset: 0,
                len: 5,
            },
            &table,
        )
        .unwrap();
        assert_eq!((r.chunk.0.as_slice(), r.eof), (&b"hello"[..], false));
        let r = read_block(
            &ReadBlockParams {
                handle_id: "r".into(),
                offset: 5,
                len: 4,
            },
            &table,
        )
        .unwrap();
        assert!(r.eof, "reading exactly to the end reports eof");
        let r = read_block(
            &ReadBlockParams {
                handle_id: "r".into(),
                offset: 100,
                len: 4,
            },
            &table,
        )
        .unwrap();
        assert!(r.eof && r.chunk.0.is_empty());
        let e = write_block(
            &WriteBlockParams {
                handle_id: "r".into(),
                offset: 0,
                chunk: ByteChunk(b"x".to_vec()),
            },
            &table,
        )
        .unwrap_err();
        assert_eq!(e.code, -32603, "read handle is not writable");
        assert_eq!(
            read_block(
                &ReadBlockParams {
                    handle_id: "zz".into(),
                    offset: 0,
                    len: 1
                },
                &table
            )
            .unwrap_err()
            .code,
            -32004
        );
        assert_eq!(
            read_block(
                &ReadBlockParams {
                    handle_id: "r".into(),
                    offset: 0,
                    len: 0
                },
                &table
            )
            .unwrap_err()
            .code,
            -32600
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
