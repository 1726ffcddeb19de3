//! The client: lazy connect, typed calls, per-process ordered event streams, and
//! session recovery after a dropped connection.

use crate::connect::Source;
pub use crate::error::ClientError;
use crate::error::{ConnectionError, ConnectionErrorKind};
use crate::events::{OrderedEvents, ProcessEvent};
use exec_server_protocol::types::*;
use exec_server_protocol::{methods as m, ErrorObject, PathUri};
use exec_server_rpc::peer::{Incoming, RpcPeer};
use exec_server_rpc::CallError;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::mpsc;

/// How long the client keeps trying to resume its session after the connection
/// drops: 25 s, inside the server's 30 s detached-session lifetime.
pub const SESSION_RECOVERY_TIMEOUT: Duration = Duration::from_secs(25);
/// Pause between resume attempts: 100 ms.
pub const RECOVERY_RETRY_INTERVAL: Duration = Duration::from_millis(100);
/// Output bytes released to the consumer between two `process/ack` calls: 1 MiB.
pub const ACK_EVERY_BYTES: usize = 1024 * 1024;

/// Client settings.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Where to connect.
    pub source: Source,
    /// Sent as `clientName`.
    pub client_name: String,
    /// Limit for one connection attempt.
    pub connect_timeout: Duration,
    /// Limit for one call (`None`: no limit).
    pub call_timeout: Option<Duration>,
    /// How long to try resuming after a drop.
    pub recovery_timeout: Duration,
}

impl ClientOptions {
    /// Defaults for `source`: 10 s connect timeout, no call timeout, 25 s recovery.
    pub fn new(source: Source) -> Self {
        ClientOptions {
            source,
            client_name: "exec-server-client".into(),
            connect_timeout: Duration::from_secs(10),
            call_timeout: None,
            recovery_timeout: SESSION_RECOVERY_TIMEOUT,
        }
    }
}

struct ProcEntry {
    events: OrderedEvents,
    unacked_bytes: usize,
}

#[derive(Default)]
struct Slot {
    peer: Option<RpcPeer>,
    failed: Option<ConnectionError>,
}

struct Inner {
    opts: ClientOptions,
    slot: tokio::sync::Mutex<Slot>,
    session_id: Mutex<Option<String>>,
    env_info: Mutex<Option<EnvironmentInfo>>,
    procs: Mutex<HashMap<String, ProcEntry>>,
    http_streams: Mutex<HashMap<String, mpsc::UnboundedSender<HttpBodyDelta>>>,
    closed: AtomicBool,
    next_write: AtomicU64,
    write_prefix: String,
    recoveries: AtomicU64,
    /// Tells the recovery task that a connection ended with work outstanding.
    lost: mpsc::UnboundedSender<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A client of one exec-server session. Cheap to clone; connects on first use.
#[derive(Clone)]
pub struct ExecServerClient {
    inner: Arc<Inner>,
}

/// A started process: its id and its ordered events.
pub struct ProcessHandle {
    /// The process id.
    pub id: String,
    client: ExecServerClient,
    events: mpsc::UnboundedReceiver<ProcessEvent>,
}

impl ExecServerClient {
    /// A client for `opts`; nothing happens until the first call.
    pub fn new(opts: ClientOptions) -> Self {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let (lost, mut lost_rx) = mpsc::unbounded_channel();
        let client = ExecServerClient {
            inner: Arc::new(Inner {
                opts,
                slot: tokio::sync::Mutex::new(Slot::default()),
                session_id: Mutex::new(None),
                env_info: Mutex::new(None),
                procs: Mutex::new(HashMap::new()),
                http_streams: Mutex::new(HashMap::new()),
                closed: AtomicBool::new(false),
                next_write: AtomicU64::new(1),
                write_prefix: format!("w{:x}{:x}", std::process::id(), n),
                recoveries: AtomicU64::new(0),
                lost,
            }),
        };
        // Recovery runs in its own task, started here rather than from inside a
        // connection, so that process streams resume even when no call is made.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let weak = Arc::downgrade(&client.inner);
            rt.spawn(async move {
                while lost_rx.recv().await.is_some() {
                    let Some(inner) = weak.upgrade() else { return };
                    let _ = ExecServerClient { inner }.peer().await;
                }
            });
        }
        client
    }

    /// Connects now (otherwise the first call does).
    pub async fn connect(&self) -> Result<(), ClientError> {
        self.peer().await.map(|_| ())
    }

    /// The session id, once connected.
    pub fn session_id(&self) -> Option<String> {
        lock(&self.inner.session_id).clone()
    }

    /// How many times the session was resumed after a drop.
    pub fn recoveries(&self) -> u64 {
        self.inner.recoveries.load(Ordering::Relaxed)
    }

    /// Closes the connection for good (the server keeps the session for its TTL).
    pub async fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        let mut slot = self.inner.slot.lock().await;
        slot.peer = None;
        slot.failed = Some(ConnectionError::new(
            ConnectionErrorKind::Closed,
            "client closed",
        ));
    }

    /// Drops the current connection without closing the client, as a network
    /// failure would; the client then recovers the session. For tests and chaos.
    pub async fn drop_connection(&self) {
        // Connect (or finish resuming) first, so every call drops a live connection.
        let _ = self.peer().await;
        let mut slot = self.inner.slot.lock().await;
        if let Some(p) = slot.peer.take() {
            p.close();
        }
    }

    fn supports(&self, capability: &str) -> bool {
        lock(&self.inner.env_info)
            .as_ref()
            .and_then(|i| i.capabilities.get(capability).copied())
            .unwrap_or(false)
    }

    /// The server's environment info (from `initialize`, else `environment/info`).
    pub async fn environment_info(&self) -> Result<EnvironmentInfo, ClientError> {
        self.peer().await?;
        if let Some(i) = lock(&self.inner.env_info).clone() {
            return Ok(i);
        }
        self.call(m::ENVIRONMENT_INFO, &(), true).await
    }

    async fn peer(&self) -> Result<RpcPeer, ClientError> {
        let mut slot = self.inner.slot.lock().await;
        if let Some(p) = &slot.peer {
            if !p.is_closed() {
                return Ok(p.clone());
            }
        }
        if let Some(f) = &slot.failed {
            return Err(ClientError::Connection(f.clone()));
        }
        let resume = self.session_id();
        if resume.is_some() && !self.inner.opts.source.is_reconnectable() {
            let why = ConnectionError::new(
                ConnectionErrorKind::Closed,
                "connection to a stdio program ended; it cannot be resumed",
            );
            slot.failed = Some(why.clone());
            self.fail_all(&why.to_string());
            return Err(ClientError::Connection(why));
        }
        if resume.is_some() {
            tracing::warn!(
                "connection to {:?} lost; resuming the session",
                self.inner.opts.source
            );
        }
        let deadline = tokio::time::Instant::now() + self.inner.opts.recovery_timeout;
        loop {
            match self.connect_once(resume.clone()).await {
                Ok(peer) => {
                    slot.peer = Some(peer.clone());
                    if resume.is_some() {
                        self.inner.recoveries.fetch_add(1, Ordering::Relaxed);
                        self.replay(&peer).await;
                    }
                    return Ok(peer);
                }
                Err((why, retryable)) => {
                    if resume.is_none() {
                        return Err(why);
                    }
                    if !retryable || tokio::time::Instant::now() >= deadline {
                        let why = ConnectionError::unrecoverable(why);
                        slot.failed = Some(why.clone());
                        self.fail_all(&why.to_string());
                        return Err(ClientError::Connection(why));
                    }
                    tokio::time::sleep(RECOVERY_RETRY_INTERVAL).await;
                }
            }
        }
    }

    fn fail_all(&self, why: &str) {
        for e in lock(&self.inner.procs).values_mut() {
            e.events.fail(why.to_string());
        }
        lock(&self.inner.http_streams).clear();
    }

    /// One attempt: connect and initialize (resuming `resume`). The flag says
    /// whether another attempt may succeed.
    async fn connect_once(&self, resume: Option<String>) -> Result<RpcPeer, (ClientError, bool)> {
        let opts = &self.inner.opts;
        let conn = opts
            .source
            .connect(opts.connect_timeout)
            .await
            .map_err(|e| (ClientError::Connection(e), true))?;
        let (peer, incoming) = RpcPeer::start(conn);
        tokio::spawn(dispatch(
            Arc::downgrade(&self.inner),
            peer.clone(),
            incoming,
        ));
        let params = InitializeParams {
            client_name: opts.client_name.clone(),
            resume_session_id: resume,
        };
        let value = serde_json::to_value(&params).unwrap_or_default();
        let init = peer
            .call(m::INITIALIZE, value, Some(opts.connect_timeout))
            .await
            .map_err(|e| {
                let retryable = match &e {
                    CallError::Server(err) => {
                        err.code == exec_server_protocol::error::SESSION_ALREADY_ATTACHED
                    }
                    _ => true,
                };
                (ClientError::from(e), retryable)
            })?;
        let init: InitializeResponse = serde_json::from_value(init)
            .map_err(|e| (ClientError::protocol(m::INITIALIZE, e), false))?;
        peer.notify(m::INITIALIZED, Value::Null)
            .await
            .map_err(|e| (ClientError::from(e), true))?;
        *lock(&self.inner.session_id) = Some(init.session_id);
        if let Some(info) = init.environment_info {
            *lock(&self.inner.env_info) = Some(info);
        }
        Ok(peer)
    }

    /// After a resume, read each unfinished process from its last released seq.
    async fn replay(&self, peer: &RpcPeer) {
        let todo: Vec<(String, u64)> = lock(&self.inner.procs)
            .iter()
            .filter(|(_, e)| !e.events.is_finished())
            .map(|(id, e)| (id.clone(), e.events.last_published()))
            .collect();
        for (id, after) in todo {
            let params = ReadParams {
                process_id: id.clone(),
                after_seq: Some(after),
                max_bytes: None,
                wait_ms: Some(0),
            };
            let r = peer
                .call(
                    m::PROCESS_READ,
                    serde_json::to_value(&params).unwrap_or_default(),
                    None,
                )
                .await;
            let mut procs = lock(&self.inner.procs);
            let Some(e) = procs.get_mut(&id) else {
                continue;
            };
            match r.map(serde_json::from_value::<ReadResponse>) {
                Ok(Ok(page)) => {
                    e.unacked_bytes += e.events.recover(page);
                }
                Ok(Err(err)) => e.events.fail(format!("bad process/read reply: {err}")),
                Err(CallError::Server(err)) => e
                    .events
                    .fail(format!("process lost while recovering: {}", err.message)),
                Err(_) => {} // connection dropped again: the next recovery retries
            }
        }
    }

    /// Calls `method`; with `retry`, a call cut by a dropped connection is sent
    /// again once after recovery (only for calls that are safe to repeat).
    pub async fn call<P: Serialize, R: DeserializeOwned>(
        &self,
        method: &str,
        params: &P,
        retry: bool,
    ) -> Result<R, ClientError> {
        let value = serde_json::to_value(params).map_err(|e| ClientError::protocol(method, e))?;
        let mut attempt = 0;
        loop {
            let peer = self.peer().await?;
            match peer
                .call(method, value.clone(), self.inner.opts.call_timeout)
                .await
            {
                Ok(v) => {
                    return serde_json::from_value(v).map_err(|e| ClientError::protocol(method, e))
                }
                Err(CallError::Closed) if retry && attempt == 0 => attempt += 1,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// `process/start`. `ackOutput` is set when the server supports it, so no
    /// output is dropped across connection losses.
    pub async fn start_process(
        &self,
        mut params: ExecParams,
    ) -> Result<ProcessHandle, ClientError> {
        self.peer().await?;
        params.ack_output = self.supports("processOutputAck");
        let (tx, rx) = mpsc::unbounded_channel();
        let id = params.process_id.clone();
        {
            let mut procs = lock(&self.inner.procs);
            if procs.get(&id).is_some_and(|e| !e.events.is_finished()) {
                return Err(ClientError::Server(ErrorObject::invalid_request(format!(
                    "process {id} already exists"
                ))));
            }
            procs.insert(
                id.clone(),
                ProcEntry {
                    events: OrderedEvents::new(tx),
                    unacked_bytes: 0,
                },
            );
        }
        let mut outcome = self
            .call::<_, ExecResponse>(m::PROCESS_START, &params, false)
            .await
            .map(Some);
        if matches!(&outcome, Err(ClientError::Connection(_))) {
            // The request may or may not have reached the server before the drop.
            // Retry once; if the server refuses the retry, ask it whether the
            // process exists (the first attempt started it) rather than guess
            // from the refusal's text. A live duplicate in this session was
            // refused locally above.
            outcome = match self
                .call::<_, ExecResponse>(m::PROCESS_START, &params, false)
                .await
            {
                Err(ClientError::Server(e))
                    if e.code == exec_server_protocol::error::INVALID_REQUEST =>
                {
                    match self.started_before(&id).await {
                        true => Ok(None),
                        false => Err(ClientError::Server(e)),
                    }
                }
                other => other.map(Some),
            };
        }
        match outcome {
            Ok(_) => Ok(ProcessHandle {
                id,
                client: self.clone(),
                events: rx,
            }),
            Err(e) => {
                lock(&self.inner.procs).remove(&id);
                Err(e)
            }
        }
    }

    /// True if the server holds process `id`, whose events it then feeds to the
    /// process's stream from the last one released (a `process/read` that
    /// waits for nothing).
    async fn started_before(&self, id: &str) -> bool {
        let Some(after) = lock(&self.inner.procs)
            .get(id)
            .map(|e| e.events.last_published())
        else {
            return false;
        };
        let params = ReadParams {
            process_id: id.to_string(),
            after_seq: Some(after),
            max_bytes: None,
            wait_ms: Some(0),
        };
        let Ok(page) = self.read_process(&params).await else {
            return false;
        };
        if let Some(e) = lock(&self.inner.procs).get_mut(id) {
            e.unacked_bytes += e.events.recover(page);
        }
        true
    }

    /// `process/read`.
    pub async fn read_process(&self, params: &ReadParams) -> Result<ReadResponse, ClientError> {
        self.call(m::PROCESS_READ, params, true).await
    }

    /// `process/write` with a fresh writeId (retried with the same id after a drop).
    pub async fn write_process(
        &self,
        process_id: &str,
        data: Vec<u8>,
    ) -> Result<WriteStatus, ClientError> {
        let n = self.inner.next_write.fetch_add(1, Ordering::Relaxed);
        let params = WriteParams {
            process_id: process_id.into(),
            chunk: exec_server_protocol::ByteChunk(data),
            write_id: format!("{}-{n}", self.inner.write_prefix),
        };
        let r: WriteResponse = self.call(m::PROCESS_WRITE, &params, true).await?;
        Ok(r.status)
    }

    /// `process/closeStdin` (ours; the reference answers -32601).
    pub async fn close_stdin(&self, process_id: &str) -> Result<WriteStatus, ClientError> {
        let r: WriteResponse = self
            .call(
                m::PROCESS_CLOSE_STDIN,
                &ProcessIdParams {
                    process_id: process_id.into(),
                },
                true,
            )
            .await?;
        Ok(r.status)
    }

    /// `process/signal`.
    pub async fn signal(&self, process_id: &str, signal: ProcessSignal) -> Result<(), ClientError> {
        let _: Value = self
            .call(
                m::PROCESS_SIGNAL,
                &SignalParams {
                    process_id: process_id.into(),
                    signal,
                },
                false,
            )
            .await?;
        Ok(())
    }

    /// `process/terminate`: true if it was running.
    pub async fn terminate(&self, process_id: &str) -> Result<bool, ClientError> {
        let r: TerminateResponse = self
            .call(
                m::PROCESS_TERMINATE,
                &ProcessIdParams {
                    process_id: process_id.into(),
                },
                true,
            )
            .await?;
        Ok(r.running)
    }

    /// `process/resize` (ours).
    pub async fn resize(&self, process_id: &str, cols: u16, rows: u16) -> Result<(), ClientError> {
        let _: Value = self
            .call(
                m::PROCESS_RESIZE,
                &ResizeParams {
                    process_id: process_id.into(),
                    cols,
                    rows,
                },
                true,
            )
            .await?;
        Ok(())
    }

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
        Ok(r.data_base64.0)
    }

    /// `fs/writeFile`.
    pub async fn write_file(&self, path: &PathUri, data: Vec<u8>) -> Result<(), ClientError> {
        let p = WriteFileParams {
            path: path.clone(),
            data_base64: exec_server_protocol::ByteChunk(data),
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
        use tokio::io::AsyncWriteExt;
        const BLOCK: u64 = 1024 * 1024;
        const IN_FLIGHT: usize = 4;
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
                        me.call::<_, ReadBlockResponse>(m::FS_READ_BLOCK, &p, true)
                            .await
                    }));
                    if queue.len() == 1 && next_offset == BLOCK {
                        break; // learn the size class from the first block before fanning out
                    }
                }
                let Some(task) = queue.pop_front() else { break };
                let block = task
                    .await
                    .map_err(|e| ClientError::protocol(m::FS_READ_BLOCK, e))??;
                sink.write_all(&block.chunk.0)
                    .await
                    .map_err(|e| ClientError::local("local write", e))?;
                total += block.chunk.0.len() as u64;
                if block.eof {
                    for t in queue.drain(..) {
                        t.abort();
                    }
                    break;
                }
            }
            sink.flush()
                .await
                .map_err(|e| ClientError::local("local write", e))?;
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
        use tokio::io::AsyncReadExt;
        const BLOCK: usize = 1024 * 1024;
        const IN_FLIGHT: usize = 4;
        let handle = self.open_handle(path, OpenMode::Replace).await?;
        let result = async {
            let mut offset = 0u64;
            let mut queue = std::collections::VecDeque::new();
            loop {
                let mut buf = vec![0u8; BLOCK];
                let mut n = 0;
                while n < BLOCK {
                    let k = source
                        .read(&mut buf[n..])
                        .await
                        .map_err(|e| ClientError::local("local read", e))?;
                    if k == 0 {
                        break;
                    }
                    n += k;
                }
                if n == 0 {
                    break;
                }
                buf.truncate(n);
                let me = self.clone();
                let p = WriteBlockParams {
                    handle_id: handle.clone(),
                    offset,
                    chunk: exec_server_protocol::ByteChunk(buf),
                };
                offset += n as u64;
                queue.push_back(tokio::spawn(async move {
                    me.call::<_, Value>(m::FS_WRITE_BLOCK, &p, true).await
                }));
                if queue.len() >= IN_FLIGHT {
                    if let Some(t) = queue.pop_front() {
                        t.await
                            .map_err(|e| ClientError::protocol(m::FS_WRITE_BLOCK, e))??;
                    }
                }
            }
            for t in queue {
                t.await
                    .map_err(|e| ClientError::protocol(m::FS_WRITE_BLOCK, e))??;
            }
            Ok(offset)
        }
        .await;
        self.close_handle(handle).await;
        result
    }

    /// `http/request`. With `streamResponse`, the body arrives on the returned receiver.
    pub async fn http_request(
        &self,
        params: HttpRequestParams,
    ) -> Result<(HttpResponse, Option<mpsc::UnboundedReceiver<HttpBodyDelta>>), ClientError> {
        let rx = if params.stream_response {
            let (tx, rx) = mpsc::unbounded_channel();
            lock(&self.inner.http_streams).insert(params.request_id.clone(), tx);
            Some(rx)
        } else {
            None
        };
        let r = self.call(m::HTTP_REQUEST, &params, false).await;
        if r.is_err() {
            lock(&self.inner.http_streams).remove(&params.request_id);
        }
        Ok((r?, rx))
    }
}

impl ProcessHandle {
    /// The next event in seq order; `None` after `Closed`/`Failed` was taken.
    pub async fn next_event(&mut self) -> Option<ProcessEvent> {
        let ev = self.events.recv().await;
        if matches!(
            ev,
            Some(ProcessEvent::Closed { .. } | ProcessEvent::Failed(_))
        ) {
            lock(&self.client.inner.procs).remove(&self.id);
        }
        ev
    }

    /// Writes to stdin.
    pub async fn write(&self, data: Vec<u8>) -> Result<WriteStatus, ClientError> {
        self.client.write_process(&self.id, data).await
    }

    /// Sends end of file on stdin.
    pub async fn close_stdin(&self) -> Result<WriteStatus, ClientError> {
        self.client.close_stdin(&self.id).await
    }

    /// Sends a signal to the process group.
    pub async fn signal(&self, s: ProcessSignal) -> Result<(), ClientError> {
        self.client.signal(&self.id, s).await
    }

    /// Kills the process tree; true if it was running.
    pub async fn terminate(&self) -> Result<bool, ClientError> {
        self.client.terminate(&self.id).await
    }

    /// Resizes the PTY.
    pub async fn resize(&self, cols: u16, rows: u16) -> Result<(), ClientError> {
        self.client.resize(&self.id, cols, rows).await
    }

    /// The client this process belongs to.
    pub fn client(&self) -> &ExecServerClient {
        &self.client
    }
}

/// Routes notifications of one connection; when it ends, starts recovery.
async fn dispatch(
    inner: std::sync::Weak<Inner>,
    peer: RpcPeer,
    mut incoming: mpsc::Receiver<Incoming>,
) {
    while let Some(item) = incoming.recv().await {
        let Some(inner) = inner.upgrade() else { return };
        match item {
            Incoming::Notification { method, params } => {
                on_notification(&inner, &peer, &method, params)
            }
            Incoming::Request { id, method, .. } => {
                // No network proxy runs on our behalf: refuse anything else asked.
                let _ = peer
                    .respond(&id, Err(ErrorObject::method_not_found(&method)))
                    .await;
            }
        }
    }
    let Some(inner) = inner.upgrade() else { return };
    if inner.closed.load(Ordering::SeqCst) || !inner.opts.source.is_reconnectable() {
        if !inner.opts.source.is_reconnectable() {
            let why = "connection to the stdio program ended".to_string();
            for e in lock(&inner.procs).values_mut() {
                e.events.fail(why.clone());
            }
        }
        return;
    }
    let has_work = lock(&inner.procs).values().any(|e| !e.events.is_finished());
    if has_work {
        let _ = inner.lost.send(());
    }
}

fn on_notification(inner: &Arc<Inner>, peer: &RpcPeer, method: &str, params: Value) {
    match method {
        m::PROCESS_OUTPUT => {
            let Ok(n) = serde_json::from_value::<ProcessOutputNotification>(params) else {
                return;
            };
            let mut procs = lock(&inner.procs);
            let Some(e) = procs.get_mut(&n.process_id) else {
                return;
            };
            e.unacked_bytes += e.events.add(ProcessEvent::Output {
                seq: n.seq,
                stream: n.stream,
                data: n.chunk.0,
            });
            if e.unacked_bytes >= ACK_EVERY_BYTES {
                e.unacked_bytes = 0;
                let seq = e.events.last_published();
                let peer = peer.clone();
                let id = n.process_id.clone();
                tokio::spawn(async move {
                    let p = serde_json::json!({"processId": id, "seq": seq});
                    let _ = peer.call(m::PROCESS_ACK, p, None).await;
                });
            }
        }
        m::PROCESS_EXITED => {
            let Ok(n) = serde_json::from_value::<ProcessExitedNotification>(params) else {
                return;
            };
            if let Some(e) = lock(&inner.procs).get_mut(&n.process_id) {
                e.events.add(ProcessEvent::Exited {
                    seq: n.seq,
                    code: n.exit_code,
                });
            }
        }
        m::PROCESS_CLOSED => {
            let Ok(n) = serde_json::from_value::<ProcessClosedNotification>(params) else {
                return;
            };
            if let Some(e) = lock(&inner.procs).get_mut(&n.process_id) {
                e.events.add(ProcessEvent::Closed { seq: n.seq });
            }
        }
        m::HTTP_REQUEST_BODY_DELTA => {
            let Ok(d) = serde_json::from_value::<HttpBodyDelta>(params) else {
                return;
            };
            let mut streams = lock(&inner.http_streams);
            let done = d.done || d.error.is_some();
            let id = d.request_id.clone();
            if let Some(tx) = streams.get(&id) {
                let _ = tx.send(d);
            }
            if done {
                streams.remove(&id);
            }
        }
        _ => {}
    }
}
