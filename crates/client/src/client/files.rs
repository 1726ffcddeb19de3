//! Files: whole-file calls, directory calls, and streamed transfers over
//! `fs/open` + `fs/readBlock` / `fs/writeBlock`.

use super::{ClientError, ExecServerClient};
use exec_server_protocol::binary::FrameBuf;
use exec_server_protocol::types::*;
use exec_server_protocol::{methods as m, PathUri};
use serde_json::Value;
use std::sync::atomic::Ordering;

impl ExecServerClient {
    /// `fs/readFile`.
    pub async fn read_file(&self, path: &PathUri) -> Result<Vec<u8>, ClientError> {
        let r: ReadFileResponse = self
            .call(
                m::FS_READ_FILE,
                &ReadFileParams {
                    path: path.clone(),
                    follow_symlinks: None,
                    sandbox: None,
                },
                true,
            )
            .await?;
        Ok(r.data_base64.into_vec())
    }

    /// `fs/writeFile`.
    pub async fn write_file(&self, path: &PathUri, data: Vec<u8>) -> Result<(), ClientError> {
        let p = WriteFileParams {
            path: path.clone(),
            data_base64: exec_server_protocol::bytes::LenientChunk::from(data),
            follow_symlinks: None,
            sandbox: None,
        };
        let _: Value = self.call(m::FS_WRITE_FILE, &p, true).await?;
        Ok(())
    }

    /// `fs/getMetadata`.
    pub async fn metadata(&self, path: &PathUri) -> Result<MetadataResponse, ClientError> {
        self.call(
            m::FS_GET_METADATA,
            &PathParams {
                path: path.clone(),
                follow_symlinks: None,
                sandbox: None,
            },
            true,
        )
        .await
    }

    /// `fs/readDirectory`.
    pub async fn read_directory(&self, path: &PathUri) -> Result<Vec<DirectoryEntry>, ClientError> {
        let r: ReadDirectoryResponse = self
            .call(
                m::FS_READ_DIRECTORY,
                &PathParams {
                    path: path.clone(),
                    follow_symlinks: None,
                    sandbox: None,
                },
                true,
            )
            .await?;
        Ok(r.entries)
    }

    /// `fs/createDirectory`.
    pub async fn create_directory(
        &self,
        path: &PathUri,
        recursive: bool,
    ) -> Result<(), ClientError> {
        let p = CreateDirectoryParams {
            path: path.clone(),
            recursive,
            follow_symlinks: None,
            sandbox: None,
        };
        let _: Value = self.call(m::FS_CREATE_DIRECTORY, &p, true).await?;
        Ok(())
    }

    /// `fs/remove`.
    pub async fn remove(
        &self,
        path: &PathUri,
        recursive: bool,
        force: bool,
    ) -> Result<(), ClientError> {
        let p = RemoveParams {
            path: path.clone(),
            recursive,
            force,
            follow_symlinks: None,
            sandbox: None,
        };
        let _: Value = self.call(m::FS_REMOVE, &p, true).await?;
        Ok(())
    }

    /// `fs/copy`.
    pub async fn copy(
        &self,
        from: &PathUri,
        to: &PathUri,
        recursive: bool,
    ) -> Result<(), ClientError> {
        let p = CopyParams {
            source_path: from.clone(),
            destination_path: to.clone(),
            recursive,
            sandbox: None,
        };
        let _: Value = self.call(m::FS_COPY, &p, true).await?;
        Ok(())
    }

    /// `fs/canonicalize`.
    pub async fn canonicalize(&self, path: &PathUri) -> Result<PathUri, ClientError> {
        let r: CanonicalizeResponse = self
            .call(
                m::FS_CANONICALIZE,
                &PathParams {
                    path: path.clone(),
                    follow_symlinks: None,
                    sandbox: None,
                },
                true,
            )
            .await?;
        Ok(r.path)
    }

    /// `fs/walk`.
    pub async fn walk(
        &self,
        path: &PathUri,
        options: WalkOptions,
    ) -> Result<WalkResponse, ClientError> {
        self.call(
            m::FS_WALK,
            &WalkParams {
                path: path.clone(),
                options,
                sandbox: None,
            },
            true,
        )
        .await
    }

    /// `fs/open` under a fresh handle id.
    async fn open_handle(&self, path: &PathUri, mode: OpenMode) -> Result<String, ClientError> {
        let handle_id = self.handle_id();
        let params = OpenParams {
            handle_id: handle_id.clone(),
            path: path.clone(),
            mode,
            sandbox: None,
        };
        let _: OpenResponse = self.call(m::FS_OPEN, &params, false).await?;
        Ok(handle_id)
    }

    /// `fs/close`; failures are ignored (the server also closes handles when the
    /// connection ends).
    async fn close_handle(&self, handle_id: String) {
        let _: Result<Value, _> = self
            .call(m::FS_CLOSE, &HandleParams { handle_id }, true)
            .await;
    }

    fn handle_id(&self) -> String {
        format!(
            "h{}-{}",
            self.inner.write_prefix,
            self.inner.next_write.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Streams a remote file into `sink` with `fs/open` + `fs/readBlock` (1 MiB
    /// blocks, 4 in flight): memory stays flat for any size. Returns bytes copied.
    pub async fn download<W: tokio::io::AsyncWrite + Unpin>(
        &self,
        path: &PathUri,
        sink: &mut W,
    ) -> Result<u64, ClientError> {
        self.download_with_progress(path, sink, |_| {}).await
    }

    /// [`download`](Self::download), calling `progress` with the bytes
    /// written to `sink` so far after each block (1 MiB).
    pub async fn download_with_progress<W: tokio::io::AsyncWrite + Unpin>(
        &self,
        path: &PathUri,
        sink: &mut W,
        progress: impl FnMut(u64),
    ) -> Result<u64, ClientError> {
        self.download_into(path, BlockSink::Async(sink), progress)
            .await
    }

    /// [`download_with_progress`](Self::download_with_progress) into a local
    /// file, written from the start with positional writes on the blocking
    /// pool: each block goes from the message to the file without a copy.
    /// Returns bytes written.
    pub async fn download_to_file(
        &self,
        path: &PathUri,
        file: std::fs::File,
        progress: impl FnMut(u64),
    ) -> Result<u64, ClientError> {
        let sink: BlockSink<'_, tokio::io::Sink> = BlockSink::File(std::sync::Arc::new(file));
        self.download_into(path, sink, progress).await
    }

    async fn download_into<W: tokio::io::AsyncWrite + Unpin>(
        &self,
        path: &PathUri,
        mut sink: BlockSink<'_, W>,
        mut progress: impl FnMut(u64),
    ) -> Result<u64, ClientError> {
        const BLOCK: u64 = 1024 * 1024;
        const IN_FLIGHT: usize = 8;
        let handle = self.open_handle(path, OpenMode::Read).await?;
        let result = async {
            let mut next_offset = 0u64;
            let mut total = 0u64;
            let mut queue = std::collections::VecDeque::new();
            loop {
                while queue.len() < IN_FLIGHT {
                    let me = self.clone();
                    let p = ReadBlockParams {
                        handle_id: handle.clone(),
                        offset: next_offset,
                        len: BLOCK,
                    };
                    next_offset += BLOCK;
                    queue.push_back(tokio::spawn(async move {
                        let params = serde_json::to_value(&p)
                            .map_err(|e| ClientError::protocol(m::FS_READ_BLOCK, e))?;
                        let answer = me
                            .call_chunked(m::FS_READ_BLOCK, params, None, true)
                            .await?;
                        super::with_chunk::<ReadBlockResponse>(m::FS_READ_BLOCK, answer)
                    }));
                    if queue.len() == 1 && next_offset == BLOCK {
                        break; // learn the size class from the first block before fanning out
                    }
                }
                let Some(task) = queue.pop_front() else { break };
                let block = task
                    .await
                    .map_err(|e| ClientError::protocol(m::FS_READ_BLOCK, e))??;
                let len = block.chunk.0.len() as u64;
                sink.write(block.chunk.0, total).await?;
                total += len;
                progress(total);
                if block.eof {
                    for t in queue.drain(..) {
                        t.abort();
                    }
                    break;
                }
            }
            sink.flush().await?;
            Ok(total)
        }
        .await;
        self.close_handle(handle).await;
        result
    }

    /// Streams `source` into a remote file (created or truncated) with
    /// `fs/open {mode: replace}` + `fs/writeBlock` (1 MiB blocks, 4 in flight).
    pub async fn upload<R: tokio::io::AsyncRead + Unpin>(
        &self,
        source: &mut R,
        path: &PathUri,
    ) -> Result<u64, ClientError> {
        self.upload_with_progress(source, path, |_| {}).await
    }

    /// [`upload`](Self::upload), calling `progress` with the bytes the server
    /// has written so far after each block (1 MiB) it confirms.
    pub async fn upload_with_progress<R: tokio::io::AsyncRead + Unpin>(
        &self,
        source: &mut R,
        path: &PathUri,
        progress: impl FnMut(u64),
    ) -> Result<u64, ClientError> {
        self.upload_from(BlockSource::Async(source), path, progress)
            .await
    }

    /// [`upload_with_progress`](Self::upload_with_progress) from a local
    /// file, read from the start with positional reads on the blocking pool
    /// (no copy through an intermediate buffer). Returns bytes sent.
    pub async fn upload_from_file(
        &self,
        file: std::fs::File,
        path: &PathUri,
        progress: impl FnMut(u64),
    ) -> Result<u64, ClientError> {
        let source: BlockSource<'_, tokio::io::Empty> =
            BlockSource::File(std::sync::Arc::new(file));
        self.upload_from(source, path, progress).await
    }

    /// Calls `method` with `payload` as its `chunk`, sent from its own
    /// buffer (see [`exec_server_rpc::RpcPeer::call_with_frame_buf`], which
    /// consumes it). Not retried on a new connection: the calls that carry
    /// bytes this way use a file handle, which ends with its connection.
    async fn call_framed(
        &self,
        method: &str,
        params: Value,
        payload: FrameBuf,
    ) -> Result<Value, ClientError> {
        let peer = self.peer().await?;
        let (v, _) = peer
            .call_with_frame_buf(method, params, payload, self.inner.opts.call_timeout)
            .await
            .map_err(ClientError::from_call)?;
        Ok(v)
    }

    /// Uploads `source` to `path`. A file source starts over (at most
    /// [`UPLOAD_RESTARTS`] times) when the connection was lost part-way: the
    /// file handle, and with it the server's partial file, end with the
    /// connection (as in the reference), while a resumed session goes on.
    /// `progress` then starts from zero again. A stream cannot be read
    /// again: its upload fails.
    async fn upload_from<R: tokio::io::AsyncRead + Unpin>(
        &self,
        mut source: BlockSource<'_, R>,
        path: &PathUri,
        mut progress: impl FnMut(u64),
    ) -> Result<u64, ClientError> {
        let mut restarts = 0;
        loop {
            let recoveries = self.recoveries();
            match self.upload_once(&mut source, path, &mut progress).await {
                Err(e)
                    if restarts < UPLOAD_RESTARTS
                        && matches!(source, BlockSource::File(_))
                        && (self.recoveries() > recoveries
                            || e.kind() == crate::ErrorKind::Connection) =>
                {
                    restarts += 1;
                    tracing::warn!(
                        error = %e,
                        restarts,
                        "connection lost during an upload; starting it over"
                    );
                }
                r => return r,
            }
        }
    }

    /// One attempt of [`Self::upload_from`]: a fresh handle, every block.
    async fn upload_once<R: tokio::io::AsyncRead + Unpin>(
        &self,
        source: &mut BlockSource<'_, R>,
        path: &PathUri,
        progress: &mut impl FnMut(u64),
    ) -> Result<u64, ClientError> {
        const BLOCK: usize = 1024 * 1024;
        const IN_FLIGHT: usize = 8;
        let handle = self.open_handle(path, OpenMode::Replace).await?;
        let result = async {
            let mut offset = 0u64;
            let mut written = 0u64;
            let mut queue = std::collections::VecDeque::new();
            loop {
                let buf = source.read(BLOCK, offset).await?;
                let n = buf.payload().len();
                if n == 0 {
                    break;
                }
                let me = self.clone();
                let p = WriteBlockParams {
                    handle_id: handle.clone(),
                    offset,
                    chunk: exec_server_protocol::ByteChunk::default(),
                };
                let params = super::without_chunk(m::FS_WRITE_BLOCK, &p)?;
                offset += n as u64;
                // The block is sent from its own buffer (masked there by a
                // client, not copied).
                queue.push_back(tokio::spawn(async move {
                    me.call_framed(m::FS_WRITE_BLOCK, params, buf)
                        .await
                        .map(|_| n as u64)
                }));
                if queue.len() >= IN_FLIGHT {
                    if let Some(t) = queue.pop_front() {
                        written += t
                            .await
                            .map_err(|e| ClientError::protocol(m::FS_WRITE_BLOCK, e))??;
                        progress(written);
                    }
                }
            }
            for t in queue {
                written += t
                    .await
                    .map_err(|e| ClientError::protocol(m::FS_WRITE_BLOCK, e))??;
                progress(written);
            }
            Ok(offset)
        }
        .await;
        self.close_handle(handle).await;
        result
    }
}

/// Times a file upload starts over after losing its connection: 3.
const UPLOAD_RESTARTS: usize = 3;

/// Where a download's blocks go.
enum BlockSink<'a, W> {
    Async(&'a mut W),
    /// Positional writes on the blocking pool.
    File(std::sync::Arc<std::fs::File>),
}

impl<W: tokio::io::AsyncWrite + Unpin> BlockSink<'_, W> {
    /// Writes `data`, which belongs at `offset` (the bytes written so far).
    async fn write(&mut self, data: bytes::Bytes, offset: u64) -> Result<(), ClientError> {
        use tokio::io::AsyncWriteExt;
        let local = |e| ClientError::local("local write", e);
        match self {
            BlockSink::Async(w) => w.write_all(&data).await.map_err(local),
            BlockSink::File(f) => {
                use std::os::unix::fs::FileExt;
                let f = f.clone();
                tokio::task::spawn_blocking(move || f.write_all_at(&data, offset))
                    .await
                    .map_err(|e| local(std::io::Error::other(e)))?
                    .map_err(local)
            }
        }
    }

    async fn flush(&mut self) -> Result<(), ClientError> {
        use tokio::io::AsyncWriteExt;
        match self {
            BlockSink::Async(w) => w
                .flush()
                .await
                .map_err(|e| ClientError::local("local write", e)),
            BlockSink::File(_) => Ok(()),
        }
    }
}

/// Where an upload's blocks come from.
enum BlockSource<'a, R> {
    Async(&'a mut R),
    /// Positional reads on the blocking pool.
    File(std::sync::Arc<std::fs::File>),
}

impl<R: tokio::io::AsyncRead + Unpin> BlockSource<'_, R> {
    /// The next block: up to `len` bytes from `offset` (the bytes read so
    /// far), short only at the end; empty at the end. Room for a binary
    /// frame's header and head is left in front.
    async fn read(&mut self, len: usize, offset: u64) -> Result<FrameBuf, ClientError> {
        use tokio::io::AsyncReadExt;
        let local = |e| ClientError::local("local read", e);
        match self {
            BlockSource::Async(r) => {
                let mut buf = vec![0u8; BLOCK_HEADROOM + len];
                let mut n = 0;
                while n < len {
                    match r
                        .read(&mut buf[BLOCK_HEADROOM + n..])
                        .await
                        .map_err(local)?
                    {
                        0 => break,
                        k => n += k,
                    }
                }
                buf.truncate(BLOCK_HEADROOM + n);
                Ok(FrameBuf::from_parts(buf, BLOCK_HEADROOM))
            }
            BlockSource::File(f) => read_file_block(f.clone(), len, offset).await,
        }
    }
}

/// Room a block read for an upload leaves in front of its bytes for a binary
/// frame's header and head: 1 KiB (an `fs/writeBlock` head with its ids and
/// trace context takes a few hundred bytes; a longer one costs a copy).
const BLOCK_HEADROOM: usize = 1024;

/// Up to `len` bytes of `file` from `offset`, short only at its end: a
/// positional read on the blocking pool into unused capacity (the block is
/// not zeroed first), with [`BLOCK_HEADROOM`] in front.
async fn read_file_block(
    file: std::sync::Arc<std::fs::File>,
    len: usize,
    offset: u64,
) -> Result<FrameBuf, ClientError> {
    let local = |e| ClientError::local("local read", e);
    tokio::task::spawn_blocking(move || {
        let mut buf = FrameBuf::with_room(BLOCK_HEADROOM, len);
        exec_server_sysio::read_at::append_at(&file, buf.as_mut_vec(), len, offset)?;
        Ok(buf)
    })
    .await
    .map_err(|e| local(std::io::Error::other(e)))?
    .map_err(local)
}
