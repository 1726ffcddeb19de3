//! `fs/*`: whole-file and directory operations, block I/O on handles, watches.
//! File operations run on the blocking pool; with `--concurrent-requests` > 1
//! they are spawned (`fs_mode`), otherwise they keep arrival order.

use super::{blocking, fs_route, raw_bytes_reply, session_of, Sandboxed};
use crate::connection::Ctx;
use crate::error::ExecError;
use crate::fs;
use crate::sandbox::fs_helper::Route;
use exec_server_protocol::types::*;
use exec_server_protocol::{methods as m, ErrorObject};
use exec_server_rpc::router::{Mode, Reply, Router};
use serde::de::DeserializeOwned;
use serde::Serialize;

const READ_FILE_HEAD: &str = "{\"dataBase64\":\"";
const READ_FILE_TAIL: &str = "\"}";

/// The `fs/readFile` result, base64 written into the reply as the file is read:
/// the server holds the reply (4/3 of the file) and one piece, never the file
/// itself as well. Returns the reply and the byte count read.
fn read_file_reply(p: &ReadFileParams) -> Result<(Reply, usize), ExecError> {
    use exec_server_protocol::bytes;
    let mut s = String::new();
    let mut n = 0;
    fs::read_file_chunks(p, |event| match event {
        fs::FileRead::Size(len) => {
            let want =
                READ_FILE_HEAD.len() + bytes::encoded_len(len as usize) + READ_FILE_TAIL.len();
            s.reserve_exact(want + super::REPLY_ENVELOPE_SPARE);
            s.push_str(READ_FILE_HEAD);
        }
        fs::FileRead::Piece(piece) => {
            n += piece.len();
            bytes::encode_into(piece, &mut s);
        }
    })?;
    s.push_str(READ_FILE_TAIL);
    Ok((Reply::json(s), n))
}

/// The JSON `fs/readBlock` result, `{"chunk":"…","eof":…}`, encoded piece by
/// piece as the block is read. Returns the reply and the byte count read.
fn read_block_reply(
    p: &ReadBlockParams,
    files: &fs::handles::HandleTable,
) -> Result<(Reply, usize), ExecError> {
    use exec_server_protocol::bytes;
    const HEAD: &str = "{\"chunk\":\"";
    let mut s = String::with_capacity(
        HEAD.len()
            + bytes::encoded_len(p.len.min(fs::MAX_BLOCK_BYTES) as usize)
            + "\",\"eof\":false}".len()
            + super::REPLY_ENVELOPE_SPARE,
    );
    s.push_str(HEAD);
    let (n, eof) = fs::read_block_pieces(p, files, |piece| bytes::encode_into(piece, &mut s))?;
    s.push_str(if eof {
        "\",\"eof\":true}"
    } else {
        "\",\"eof\":false}"
    });
    Ok((Reply::json(s), n))
}

/// Pieces of base64 a streamed `fs/readFile` reply may have produced ahead of
/// the socket: with [`fs::READ_FILE_PIECE_BYTES`] pieces, about 4 MiB.
const READ_FILE_PIECES_AHEAD: usize = 3;

/// The `fs/readFile` result sent while the file is read (transports that
/// stream a message). The checks (missing file, too large, …) and the first
/// piece's read are answered as errors before anything is sent; after that
/// the server holds only a few pieces, never the file or its base64. A read
/// error later closes the connection (the reply cannot be completed
/// honestly).
async fn read_file_streamed(p: ReadFileParams) -> Result<Reply, ErrorObject> {
    use exec_server_protocol::bytes;
    use exec_server_rpc::transport::{StreamAborted, StreamPiece};
    fn encoded(piece: &[u8]) -> (Vec<u8>, usize) {
        let mut text = String::with_capacity(bytes::encoded_len(piece.len()));
        bytes::encode_into(piece, &mut text);
        (text.into_bytes(), piece.len())
    }
    let (mut pieces, first) = blocking(move || {
        let (file, len) = fs::open_file_to_read(&p)?;
        let mut pieces = fs::FilePieces::new(file, len);
        let first = pieces.next_piece().map_err(ExecError::io)?.map(encoded);
        Ok::<_, ExecError>((pieces, first))
    })
    .await?;
    let (tx, rx) = tokio::sync::mpsc::channel(READ_FILE_PIECES_AHEAD);
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::task::spawn_blocking(move || {
        // Dropped when the producer stops, however it stops.
        let _done = done_tx;
        let mut sent = 0;
        let mut next = first;
        while let Some((text, n)) = next.take() {
            if tx.blocking_send(Ok(StreamPiece::Data(text))).is_err() {
                return; // the connection is gone
            }
            sent += n;
            match pieces.next_piece() {
                Ok(piece) => next = piece.map(encoded),
                Err(e) => {
                    tracing::warn!(
                        "fs/readFile failed after {sent} bytes were sent: {e}; closing the connection"
                    );
                    let _ = tx.blocking_send(Err(StreamAborted));
                    return;
                }
            }
        }
        if tx.blocking_send(Ok(StreamPiece::End)).is_ok() {
            crate::metrics::file_read(sent);
        }
    });
    Ok(Reply::streamed(
        READ_FILE_HEAD.into(),
        rx,
        READ_FILE_TAIL,
        done_rx,
    ))
}

pub(super) fn register(r: &mut Router<Ctx>, fs_mode: Mode) {
    // Whole-path operations: confined by the sandbox helper, or the blocking
    // call in-process when the policy allows it anyway.
    r.request_with_payload(
        m::FS_WRITE_FILE,
        fs_mode,
        |ctx: Ctx, mut p: WriteFileParams| async move {
            // After the params, the session gate and the path, as the
            // reference.
            let n = fs::write_file_data(&p)?.len();
            let done: Empty = match fs_route(&ctx, &mut p)? {
                Route::Helper(h) => h.call(m::FS_WRITE_FILE, &p).await?,
                Route::InProcess => blocking(move || fs::write_file(p)).await?,
            };
            crate::metrics::file_written(n);
            Ok(done)
        },
    );
    path_op(r, m::FS_CREATE_DIRECTORY, fs_mode, |p| {
        fs::create_directory(&p)
    });
    path_op(r, m::FS_GET_METADATA, fs_mode, |p| fs::get_metadata(&p));
    path_op(r, m::FS_CANONICALIZE, fs_mode, |p| fs::canonicalize(&p));
    path_op(r, m::FS_READ_DIRECTORY, fs_mode, |p| fs::read_directory(&p));
    path_op(r, m::FS_REMOVE, fs_mode, |p| fs::remove(&p));
    path_op(r, m::FS_COPY, fs_mode, |p| fs::copy(&p));
    path_op(r, m::FS_WALK, fs_mode, |p: WalkParams| {
        let root = fs::native(&p.path)?;
        fs::walk::walk(&root, &p.options)
    });
    r.request_reply(
        m::FS_READ_FILE,
        fs_mode,
        |ctx: Ctx, mut p: ReadFileParams| async move {
            let route = fs_route(&ctx, &mut p)?;
            if matches!(route, Route::InProcess) && ctx.outbound.streams() {
                return read_file_streamed(p).await;
            }
            let read = match route {
                Route::Helper(h) => {
                    let data: ReadFileResponse = h.call(m::FS_READ_FILE, &p).await?;
                    let n = data.data_base64.0.len();
                    (
                        raw_bytes_reply(READ_FILE_HEAD, &data.data_base64.0, READ_FILE_TAIL),
                        n,
                    )
                }
                Route::InProcess => blocking(move || read_file_reply(&p)).await?,
            };
            crate::metrics::file_read(read.1);
            Ok(read.0)
        },
    );

    // Handles: they belong to the session.
    r.request(
        m::FS_OPEN,
        fs_mode,
        |ctx: Ctx, mut p: OpenParams| async move {
            let route = fs_route(&ctx, &mut p)?;
            let session = session_of(&ctx)?;
            if let Route::Helper(h) = route {
                // Opened inside the sandbox's view; the descriptor comes back.
                session.files.check_free(&p.handle_id)?;
                let handle = h.open(&p).await?;
                session.files.insert(&p.handle_id, handle)?;
                return Ok(OpenResponse {
                    handle_id: p.handle_id,
                });
            }
            blocking(move || fs::open(&p, &session.files)).await
        },
    );
    r.request_reply(
        m::FS_READ_BLOCK,
        fs_mode,
        |ctx: Ctx, p: ReadBlockParams| async move {
            let session = session_of(&ctx)?;
            if ctx.outbound.binary_frames() {
                let block = blocking(move || fs::read_block(&p, &session.files)).await?;
                crate::metrics::file_read(block.chunk.0.len());
                // The bytes go raw in a binary frame after `{"eof":…}`.
                let mut reply = Reply::json(format!("{{\"eof\":{}}}", block.eof));
                reply.payload = Some(block.chunk.into_vec());
                return Ok(reply);
            }
            let (reply, n) = blocking(move || read_block_reply(&p, &session.files)).await?;
            crate::metrics::file_read(n);
            Ok(reply)
        },
    );
    r.request_with_payload(
        m::FS_WRITE_BLOCK,
        fs_mode,
        |ctx: Ctx, p: WriteBlockParams| async move {
            let session = session_of(&ctx)?;
            let n = p.chunk.0.len();
            let done = blocking(move || fs::write_block(&p, &session.files)).await?;
            crate::metrics::file_written(n);
            Ok(done)
        },
    );
    r.request(
        m::FS_CLOSE,
        fs_mode,
        |ctx: Ctx, p: HandleParams| async move {
            // Closing commits a replace upload (a rename): file system work too.
            let session = session_of(&ctx)?;
            blocking(move || {
                session.files.remove(&p.handle_id).map_err(ExecError::io)?;
                Ok::<_, ExecError>(Empty {})
            })
            .await
        },
    );

    // Watches: in arrival order, so an unwatch never overtakes its watch.
    r.request(
        m::FS_WATCH,
        Mode::Inline,
        |ctx: Ctx, p: WatchParams| async move {
            let session = session_of(&ctx)?;
            session
                .watches
                .watch(&p.watch_id, &p.path, p.recursive, session.link.clone())?;
            Ok(Empty {})
        },
    );
    r.request(
        m::FS_WATCH_MISSING,
        Mode::Inline,
        |ctx: Ctx, p: FsWatchMissingParams| async move {
            let session = session_of(&ctx)?;
            let watching = session.missing_watches.watch(
                p.watch_id,
                &p.missing,
                p.present.as_ref(),
                session.link.clone(),
            );
            Ok(FsWatchMissingResponse { watching })
        },
    );
    r.request(
        m::FS_UNWATCH,
        Mode::Inline,
        |ctx: Ctx, p: UnwatchParams| async move {
            session_of(&ctx)?.watches.unwatch(&p.watch_id);
            Ok(Empty {})
        },
    );
}

/// Registers a blocking file operation whose params carry a `sandbox`: run in
/// the confined helper when the sandbox requires it, otherwise `op` runs on the
/// blocking pool.
fn path_op<P, R, E>(
    r: &mut Router<Ctx>,
    method: &'static str,
    mode: Mode,
    op: impl Fn(P) -> Result<R, E> + Copy + Send + Sync + 'static,
) where
    P: Sandboxed + Serialize + DeserializeOwned + Send + Sync + 'static,
    R: Serialize + DeserializeOwned + Send + 'static,
    E: Into<ErrorObject> + Send + 'static,
{
    r.request(method, mode, move |ctx: Ctx, mut p: P| async move {
        match fs_route(&ctx, &mut p)? {
            Route::Helper(h) => Ok(h.call(method, &p).await?),
            Route::InProcess => blocking(move || op(p)).await,
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use exec_server_protocol::PathUri;

    /// The reply built while the file is read holds exactly the file's bytes
    /// whatever the size (piece boundaries, padding only at the end), with
    /// room left for the envelope so the connection never copies it.
    #[test]
    fn streamed_read_file_reply_is_the_file() {
        let dir = std::env::temp_dir().join(format!("fsreply-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let piece = fs::READ_FILE_PIECE_BYTES;
        for size in [0, 1, 2, 3, 4, piece - 1, piece, piece + 1, 2 * piece + 2] {
            let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 251) as u8).collect();
            let f = dir.join(format!("f{size}"));
            std::fs::write(&f, &data).unwrap();
            let p = ReadFileParams {
                path: PathUri::from_path(&f).unwrap(),
                follow_symlinks: None,
                sandbox: None,
            };
            let (reply, n) = read_file_reply(&p).unwrap();
            assert_eq!(n, size);
            let s = reply.result_json;
            assert!(
                s.capacity() - s.len() >= super::super::REPLY_ENVELOPE_SPARE,
                "size {size}: no room for the envelope"
            );
            let v: serde_json::Value = serde_json::from_str(&s).unwrap();
            let got = base64::engine::general_purpose::STANDARD
                .decode(v["dataBase64"].as_str().unwrap())
                .unwrap();
            assert!(got == data, "size {size}: contents differ");
        }
        let missing = ReadFileParams {
            path: PathUri::from_path(&dir.join("missing")).unwrap(),
            follow_symlinks: None,
            sandbox: None,
        };
        assert!(read_file_reply(&missing).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
