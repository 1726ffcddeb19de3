//! Block I/O on handles: `fs/open`, `fs/readBlock`, `fs/writeBlock`.

use super::handles::{self, HandleTable};
use super::resolve::{kind, Follow};
use super::{located, native, not_a_file, open_for_read, write, MAX_BLOCK_BYTES};
use crate::error::{ExecError, ExecResult};
use exec_server_protocol::types::*;
use exec_server_protocol::ByteChunk;
use nix::sys::stat::SFlag;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// `fs/open`: `mode` `read` (default) or `replace`. A replace writes a
/// temporary file that `fs/close` renames over the target (see [`write`]).
pub fn open(p: &OpenParams, table: &HandleTable) -> ExecResult<OpenResponse> {
    table.check_free(&p.handle_id)?;
    let path = native(&p.path)?;
    let handle = match p.mode {
        OpenMode::Read => handles::Handle::read(open_for_read(&path, None)?),
        OpenMode::Replace => {
            let at = located(&path, Follow::Ancestors, || not_a_file(&path))?;
            if at.lstat().is_ok_and(|st| kind(&st) == SFlag::S_IFDIR) {
                return Err(not_a_file(&path));
            }
            handles::Handle::write(write::open_writer(at, true).map_err(ExecError::io)?)
        }
    };
    table.insert(&p.handle_id, handle)?;
    Ok(OpenResponse {
        handle_id: p.handle_id.clone(),
    })
}

/// `fs/readBlock`: up to `len` bytes at `offset`; `eof` once the end is reached.
pub fn read_block(p: &ReadBlockParams, table: &HandleTable) -> ExecResult<ReadBlockResponse> {
    let file = block_to_read(p, table)?;
    let mut buf = Vec::new();
    let n = exec_server_sysio::read_at::append_at(&file, &mut buf, p.len as usize, p.offset)
        .map_err(ExecError::io)?;
    Ok(ReadBlockResponse {
        eof: reached_end(&file, p.offset, n)?,
        chunk: ByteChunk::from(buf),
    })
}

/// The handle's file, once `len` and `offset` are in range.
fn block_to_read(p: &ReadBlockParams, table: &HandleTable) -> ExecResult<Arc<File>> {
    if p.len == 0 || p.len > MAX_BLOCK_BYTES {
        return Err(ExecError::invalid_input(format!(
            "file read block length must be between 1 and {MAX_BLOCK_BYTES}"
        )));
    }
    check_offset(p.offset, p.len)?;
    table.get(&p.handle_id)
}

/// Whether `n` bytes read at `offset` reached the file's end.
fn reached_end(file: &File, offset: u64, n: usize) -> ExecResult<bool> {
    let size = file.metadata().map_err(ExecError::io)?.len();
    Ok(offset + n as u64 >= size)
}

/// Pieces [`read_block_pieces`] hands over: 96 KiB, a multiple of 3 (so
/// pieces encode to base64 that can be appended) small enough that a piece
/// is still in the core's cache when it is encoded.
pub const READ_BLOCK_PIECE_BYTES: usize = 3 * 32 * 1024;

/// `fs/readBlock`, handed over in pieces of [`READ_BLOCK_PIECE_BYTES`] (the
/// last may be shorter) through one reused per-thread buffer: the JSON reply
/// is encoded from bytes still in cache instead of from a 1 MiB copy.
/// Returns the bytes read and whether the end of the file was reached.
///
/// # Errors
/// As [`read_block`]; `on` may have seen pieces before a read error.
pub fn read_block_pieces(
    p: &ReadBlockParams,
    table: &HandleTable,
    mut on: impl FnMut(&[u8]),
) -> ExecResult<(usize, bool)> {
    thread_local! {
        static PIECE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let file = block_to_read(p, table)?;
    let len = p.len as usize;
    let n = PIECE
        .with_borrow_mut(|buf| {
            let mut done = 0;
            while done < len {
                buf.clear();
                let want = (len - done).min(READ_BLOCK_PIECE_BYTES);
                let got = exec_server_sysio::read_at::append_at(
                    &file,
                    buf,
                    want,
                    p.offset + done as u64,
                )?;
                if got > 0 {
                    on(buf);
                }
                done += got;
                if got < want {
                    break;
                }
            }
            Ok::<_, std::io::Error>(done)
        })
        .map_err(ExecError::io)?;
    Ok((n, reached_end(&file, p.offset, n)?))
}

fn check_offset(offset: u64, len: u64) -> ExecResult<()> {
    if offset
        .checked_add(len)
        .is_none_or(|end| end > i64::MAX as u64)
    {
        return Err(ExecError::invalid_input(format!(
            "file offset {offset} is out of range"
        )));
    }
    Ok(())
}

/// `fs/writeBlock`: positional write; a gap is zero-filled by the OS.
pub fn write_block(p: &WriteBlockParams, table: &HandleTable) -> ExecResult<Empty> {
    let len = p.chunk.0.len() as u64;
    if len == 0 || len > MAX_BLOCK_BYTES {
        return Err(ExecError::invalid_input(format!(
            "file write block length must be between 1 and {MAX_BLOCK_BYTES}"
        )));
    }
    check_offset(p.offset, len)?;
    let (file, prealloc) = table.get_for_write(&p.handle_id)?;
    if let Some(prealloc) = prealloc {
        prealloc.before_write(&file, p.offset, len);
    }
    file.write_all_at(&p.chunk.0, p.offset)
        .map_err(ExecError::io)?;
    Ok(Empty {})
}

#[cfg(test)]
mod tests {
    use super::*;
    use exec_server_protocol::PathUri;
    use std::path::Path;

    /// The wire code the handlers give this error (the mapping under test too).
    fn code(e: ExecError) -> i64 {
        crate::handlers::wire_error(&e).code
    }

    fn uri(p: &Path) -> PathUri {
        PathUri::from_path(p).unwrap()
    }

    /// A fresh scratch directory of this test process.
    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn opening(id: &str, f: &Path, mode: OpenMode) -> OpenParams {
        OpenParams {
            handle_id: id.into(),
            path: uri(f),
            mode,
            sandbox: None,
        }
    }

    fn block(id: &str, offset: u64, len: u64) -> ReadBlockParams {
        ReadBlockParams {
            handle_id: id.into(),
            offset,
            len,
        }
    }

    #[test]
    fn block_io_and_errors() {
        let dir = scratch("fsblk");
        let table = HandleTable::default();
        let f = dir.join("f");
        let open_w = opening("w", &f, OpenMode::Replace);
        open(&open_w, &table).unwrap();
        assert_eq!(
            code(open(&open_w, &table).unwrap_err()),
            -32600,
            "duplicate handle"
        );
        write_block(
            &WriteBlockParams {
                handle_id: "w".into(),
                offset: 0,
                chunk: ByteChunk::from(b"hello".to_vec()),
            },
            &table,
        )
        .unwrap();
        write_block(
            &WriteBlockParams {
                handle_id: "w".into(),
                offset: 8,
                chunk: ByteChunk::from(b"x".to_vec()),
            },
            &table,
        )
        .unwrap();
        let e = write_block(
            &WriteBlockParams {
                handle_id: "w".into(),
                offset: 0,
                chunk: ByteChunk::from(vec![]),
            },
            &table,
        )
        .unwrap_err();
        assert_eq!(code(e), -32600);
        table.remove("w").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"hello\0\0\0x");
        open(&opening("r", &f, OpenMode::Read), &table).unwrap();
        let r = read_block(&block("r", 0, 5), &table).unwrap();
        assert_eq!((&r.chunk.0[..], r.eof), (&b"hello"[..], false));
        let r = read_block(&block("r", 5, 4), &table).unwrap();
        assert!(r.eof, "reading exactly to the end reports eof");
        let r = read_block(&block("r", 100, 4), &table).unwrap();
        assert!(r.eof && r.chunk.0.is_empty());
        let e = write_block(
            &WriteBlockParams {
                handle_id: "r".into(),
                offset: 0,
                chunk: ByteChunk::from(b"x".to_vec()),
            },
            &table,
        )
        .unwrap_err();
        assert_eq!(code(e), -32603, "read handle is not writable");
        let e = read_block(&block("zz", 0, 1), &table).unwrap_err();
        assert_eq!(code(e), -32004);
        let e = read_block(&block("r", 0, 0), &table).unwrap_err();
        assert_eq!(code(e), -32600);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Pieces are whole multiples of 3 but the last, join to the block's
    /// bytes, and say eof exactly as `read_block` does.
    #[test]
    fn a_block_read_in_pieces_is_the_block() {
        let dir = scratch("fspieces");
        let f = dir.join("f");
        let data: Vec<u8> = (0..READ_BLOCK_PIECE_BYTES * 5 + 7)
            .map(|i| (i * 131 % 251) as u8)
            .collect();
        std::fs::write(&f, &data).unwrap();
        let table = HandleTable::default();
        open(&opening("r", &f, OpenMode::Read), &table).unwrap();
        let cases = [
            (0, MAX_BLOCK_BYTES, data.len(), true),
            (
                1,
                READ_BLOCK_PIECE_BYTES as u64 * 2,
                READ_BLOCK_PIECE_BYTES * 2,
                false,
            ),
            (data.len() as u64 - 5, 100, 5, true),
            (data.len() as u64 + 9, 100, 0, true),
        ];
        for (offset, len, want, want_eof) in cases {
            let p = block("r", offset, len);
            let mut got = Vec::new();
            let mut sizes = Vec::new();
            let (n, eof) = read_block_pieces(&p, &table, |piece| {
                sizes.push(piece.len());
                got.extend_from_slice(piece);
            })
            .unwrap();
            let at = (offset as usize).min(data.len());
            assert_eq!((n, eof), (want, want_eof), "offset {offset} len {len}");
            assert_eq!(got, data[at..at + want], "offset {offset} len {len}");
            let whole = read_block(&p, &table).unwrap();
            assert_eq!((&whole.chunk.0[..], whole.eof), (&got[..], eof));
            if let Some((_, all_but_last)) = sizes.split_last() {
                assert!(all_but_last.iter().all(|s| *s == READ_BLOCK_PIECE_BYTES));
            }
        }
        let e = read_block_pieces(&block("r", 0, 0), &table, |_| {
            panic!("no piece for a refused read")
        });
        assert_eq!(code(e.unwrap_err()), -32600);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
