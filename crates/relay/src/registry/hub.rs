//! The rendezvous relay: one executor socket per environment, one harness
//! socket per stream, frames routed by `stream_id` without being opened.
//!
//! Backpressure: frames from harnesses wait for room in their executor's
//! bounded queue, so a slow executor slows its harnesses down. Frames from an
//! executor never wait for a harness: each stream has its own queue, bounded
//! at [`STREAM_BUFFER_BYTES`], past which that stream alone is reset (its
//! client resumes the session on a new stream), and all the streams of an
//! environment, and of the node, have budgets of their own (`queue.rs`). So a
//! harness that stops reading holds at most its own budget, and its
//! executor's other streams keep flowing. The executor's server bounds what
//! a process may have in flight anyway (its output window), so a client that
//! reads, however slowly, stays far below the budget.
//!
//! Liveness: an environment whose executor socket is attached is *live*, and
//! a new registration for it is refused ([`Hub::unless_executor_live`]) so it
//! cannot displace the executor. A socket stops counting when it closes, fails,
//! or sends nothing at all (not even a Pong to our Pings, sent every half of
//! the silence timeout) for the hub's silence timeout: so a dead socket looks
//! live for at most that long after its last frame. A harness socket silent
//! for [`HARNESS_SILENCE_TIMEOUT`] is dropped too, and its stream reset.

use super::close::{
    send_close, CloseWith, CLAIM_REFUSED, EXECUTOR_GONE, NO_EXECUTOR, NO_HANDSHAKE, SILENT,
    STREAM_RESET,
};
use super::harness_writer;
use super::queue::{HarnessQueue, PipeBudget, Pool, Refused, Scope, Splicing};
pub use super::queue::{DEFAULT_NODE_BUFFER_BYTES, ENVIRONMENT_BUFFER_BYTES, STREAM_BUFFER_BYTES};
use super::relay_io::{classify, spawn_writer, Read, PONG_QUEUE};
use super::splice_route::FromExecutor;
use crate::frame::{self, Body, Frame, RESET_HARNESS_DISCONNECTED};
use crate::socket::splice::SharedTcp;
use crate::socket::{CloseStatus, Message, Reader, Role, Writer};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Harness pipes a node holds at once unless configured: 1 024 (2 048 file
/// descriptors).
pub const DEFAULT_SPLICE_PIPES: usize = 1024;

/// Frames queued towards an executor socket before its harnesses wait.
pub const QUEUE_FRAMES: usize = 64;
/// Time a harness has to claim its stream with `Resume` after the upgrade.
pub const CLAIM_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a relay socket's peer has, once it starts a message, to finish it:
/// 60 s (a frame is at most 256 KiB, 32 s at 8 KB/s). A peer that stalls
/// mid-message (holding the node's buffer for it) is dropped then; a socket
/// quiet between messages is left to the silence and ping policy.
pub const MESSAGE_TIMEOUT: Duration = Duration::from_secs(60);
/// Idle sockets are pinged this often (executor sockets at least twice per
/// silence timeout).
pub const PING_INTERVAL: Duration = Duration::from_secs(30);
/// How long an executor socket may send nothing before the relay drops it and
/// the environment stops being live: 60 s (executors ping every 30 s and
/// answer the relay's pings, so a working one is never this quiet).
pub const EXECUTOR_SILENCE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a harness socket may send nothing before the relay drops it and
/// resets its stream: 120 s, four of the relay's Pings left unanswered (a
/// harness that reads its socket answers each at once). A harness that is
/// gone without a close (its host asleep, its link cut) then stops holding
/// its connection slot and its stream.
pub const HARNESS_SILENCE_TIMEOUT: Duration = Duration::from_secs(120);

struct ExecutorLink {
    id: u64,
    registration_id: String,
    tx: mpsc::Sender<Bytes>,
    stop: CancellationToken,
}

struct Route {
    executor: Option<ExecutorLink>,
    streams: HashMap<String, StreamLink>,
    /// What all its streams' queues hold ([`ENVIRONMENT_BUFFER_BYTES`]).
    buffered: Pool,
}

impl Default for Route {
    fn default() -> Route {
        Route {
            executor: None,
            streams: HashMap::new(),
            buffered: Pool::new(ENVIRONMENT_BUFFER_BYTES),
        }
    }
}

impl Route {
    /// Ends every stream (their executor is gone or replaced): each writer
    /// sends what is queued, then closes.
    fn end_streams(&mut self) {
        for (_, stream) in self.streams.drain() {
            stream.queue.close();
        }
    }
}

/// One harness socket's stream on the node: its queue and how to end it.
#[derive(Clone)]
struct StreamLink {
    queue: HarnessQueue,
    stop: CancellationToken,
    close: CloseWith,
    /// Cancelled once the executor answered with its handshake (msg2): a
    /// claim it never answers is dropped after [`CLAIM_TIMEOUT`].
    established: CancellationToken,
}

/// What a frame from an executor means to the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A Noise handshake message (msg2 towards a harness).
    Handshake,
    /// The executor ends the stream.
    Reset,
    /// Data and the rest.
    Other,
}

type Routes = Arc<Mutex<HashMap<String, Route>>>;

fn lock_routes(routes: &Routes) -> std::sync::MutexGuard<'_, HashMap<String, Route>> {
    routes.lock().unwrap_or_else(|p| p.into_inner())
}

/// Routing table of every environment.
pub struct Hub {
    routes: Routes,
    /// Serialises "is it live? then register" against "is this registration
    /// current? then attach", so neither can slip between the other's check
    /// and its action. Never held while `routes` is waited for by a socket.
    admission: tokio::sync::Mutex<()>,
    next_id: AtomicU64,
    executor_silence: Duration,
    /// What all streams' queues hold on this node.
    buffered: Pool,
    /// Bytes routed and streams reset, for the node's metrics.
    pub(crate) counters: super::metrics::Counters,
    /// The harness pipes this node holds at once.
    pipes: Arc<PipeBudget>,
}

impl Default for Hub {
    fn default() -> Self {
        Hub::new(EXECUTOR_SILENCE_TIMEOUT)
    }
}

/// A registration was refused: the environment's executor socket is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an executor is connected for this environment")]
pub struct ExecutorLive;

/// An executor socket admitted to its environment's route (before the
/// WebSocket upgrade is answered), to be served by [`Hub::serve_executor`].
/// Dropping it unserved detaches it again.
pub struct ExecutorAttachment {
    link: AttachedLink,
    rx: mpsc::Receiver<Bytes>,
}

impl ExecutorAttachment {
    /// This attachment's number on this node (a reconnect gets a new one).
    pub fn id(&self) -> u64 {
        self.link.id
    }
}

/// Removes its executor link from the route when dropped, unless another
/// socket has replaced it since.
struct AttachedLink {
    routes: Routes,
    env: String,
    id: u64,
    stop: CancellationToken,
}

impl Drop for AttachedLink {
    fn drop(&mut self) {
        self.stop.cancel();
        let mut routes = lock_routes(&self.routes);
        if let Some(route) = routes.get_mut(&self.env) {
            if route.executor.as_ref().is_some_and(|e| e.id == self.id) {
                route.executor = None;
                // The executor's streams die with it.
                route.end_streams();
            }
        }
    }
}

impl Hub {
    /// A hub whose executor sockets are dropped after `executor_silence`
    /// without a frame, holding at most [`DEFAULT_NODE_BUFFER_BYTES`] for
    /// harnesses.
    pub fn new(executor_silence: Duration) -> Hub {
        Hub::with_buffer(executor_silence, DEFAULT_NODE_BUFFER_BYTES)
    }

    /// [`Hub::new`], holding at most `node_buffer_bytes` (bytes, as queued
    /// frames cost them) for all harnesses together.
    pub fn with_buffer(executor_silence: Duration, node_buffer_bytes: usize) -> Hub {
        Hub {
            routes: Routes::default(),
            admission: tokio::sync::Mutex::new(()),
            next_id: AtomicU64::new(0),
            executor_silence,
            buffered: Pool::new(node_buffer_bytes),
            counters: super::metrics::Counters::default(),
            pipes: Arc::new(PipeBudget::new(DEFAULT_SPLICE_PIPES)),
        }
    }

    /// This hub, holding at most `n` harness pipes at once (two file
    /// descriptors each; a stream past it is read and routed as usual).
    pub fn with_splice_pipes(mut self, n: usize) -> Hub {
        self.pipes = Arc::new(PipeBudget::new(n));
        self
    }

    /// Bytes queued towards harnesses on this node now.
    pub fn buffered_bytes(&self) -> usize {
        self.buffered.held()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Route>> {
        lock_routes(&self.routes)
    }

    async fn admit(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.admission.lock().await
    }

    /// Executor sockets attached and harness streams open on this node.
    pub fn counts(&self) -> (usize, usize) {
        let routes = self.lock();
        let executors = routes.values().filter(|r| r.executor.is_some()).count();
        let streams = routes.values().map(|r| r.streams.len()).sum();
        (executors, streams)
    }

    /// Whether an executor socket is attached for `env`.
    pub fn executor_live(&self, env: &str) -> bool {
        self.lock().get(env).is_some_and(|r| r.executor.is_some())
    }

    /// Runs `register` unless `env`'s executor is live, with no executor
    /// attaching in between.
    pub async fn unless_executor_live<T, F>(
        &self,
        env: &str,
        register: impl FnOnce() -> F,
    ) -> Result<T, ExecutorLive>
    where
        F: std::future::Future<Output = T>,
    {
        let _admission = self.admit().await;
        if self.executor_live(env) {
            return Err(ExecutorLive);
        }
        Ok(register().await)
    }

    /// Attaches an executor socket for `registration_id` if `current` (run
    /// with no registration in between) says that registration is still the
    /// environment's; a socket of the same registration already attached is
    /// replaced (a reconnect), and its streams end.
    pub async fn attach_executor<E, F>(
        &self,
        env: &str,
        registration_id: &str,
        current: impl FnOnce() -> F,
    ) -> Result<ExecutorAttachment, E>
    where
        F: std::future::Future<Output = Result<(), E>>,
    {
        let _admission = self.admit().await;
        current().await?;
        let (tx, rx) = mpsc::channel(QUEUE_FRAMES);
        let stop = CancellationToken::new();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut routes = self.lock();
        let route = routes.entry(env.to_string()).or_default();
        if let Some(old) = route.executor.replace(ExecutorLink {
            id,
            registration_id: registration_id.to_string(),
            tx,
            stop: stop.clone(),
        }) {
            old.stop.cancel();
            route.end_streams();
        }
        Ok(ExecutorAttachment {
            link: AttachedLink {
                routes: self.routes.clone(),
                env: env.to_string(),
                id,
                stop,
            },
            rx,
        })
    }

    /// Serves an attached executor's socket until it closes, stays silent for
    /// the silence timeout, or another socket replaces it; then detaches it.
    /// `tcp`: the socket under `reader`, when data frames may be spliced
    /// from it (`splice_route.rs`).
    pub async fn serve_executor<R, W>(
        &self,
        (mut reader, writer): (Reader<R>, Writer<W>),
        attachment: ExecutorAttachment,
        tcp: Option<SharedTcp>,
    ) where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let ExecutorAttachment { link, rx } = attachment;
        let stop = link.stop.clone();
        let ping_every = PING_INTERVAL.min(self.executor_silence / 2);
        let (pong_tx, pong_rx) = mpsc::channel(PONG_QUEUE);
        let close = CloseWith::default();
        let mut writer = spawn_writer(
            writer,
            rx,
            pong_rx,
            (stop.clone(), close.clone()),
            ping_every,
        );
        loop {
            // Every other branch ends the loop, so a frame half read when
            // one of them wins is never needed.
            let next = self.next_from_executor(&link.env, &mut reader, tcp.as_ref());
            let msg = tokio::select! {
                m = tokio::time::timeout(self.executor_silence, next) => match m {
                    Ok(FromExecutor::Read(m)) => m,
                    Ok(FromExecutor::Spliced) => continue,
                    Err(_) => {
                        tracing::info!(environment = %link.env, "executor socket silent too long; dropping it");
                        close.set(Some(SILENT));
                        Ok(None)
                    }
                },
                _ = stop.cancelled() => Ok(None),
            };
            let bytes = match classify(msg, &pong_tx) {
                Read::Frame(b) => b,
                Read::Skip => continue,
                Read::End(status) => {
                    close.set(status);
                    break;
                }
            };
            let Ok((head, _)) = Frame::decode_located(&bytes) else {
                continue;
            };
            let kind = match head.body {
                Some(Body::Handshake { .. }) => Kind::Handshake,
                Some(Body::Reset { .. }) => Kind::Reset,
                _ => Kind::Other,
            };
            self.route_to_harness(&link.env, &head.stream_id, bytes, kind);
        }
        // Not live any more before the socket closes: whoever sees it close
        // may register at once.
        drop(link);
        stop.cancel();
        // Its close frame, unless a write is stuck: bounded as any write.
        if tokio::time::timeout(Duration::from_secs(5), &mut writer)
            .await
            .is_err()
        {
            writer.abort();
        }
        drop(reader);
    }

    /// The queue of `stream_id`'s harness, if that stream is open.
    pub(super) fn stream_queue(&self, env: &str, stream_id: &str) -> Option<HarnessQueue> {
        let routes = self.lock();
        Some(routes.get(env)?.streams.get(stream_id)?.queue.clone())
    }

    /// Queues `frame` for `stream_id`'s harness, if that stream is open. Past
    /// the stream's own budget the stream is reset; past its environment's or
    /// the node's, the stream holding the most in that scope is reset (freeing
    /// what it held) and the frame tried again.
    fn route_to_harness(&self, env: &str, stream_id: &str, frame: Bytes, kind: Kind) {
        let n = frame.len() as u64;
        let mut frame = frame;
        // Each turn resets one stream, so this ends; bounded anyway.
        for _ in 0..64 {
            let Some(target) = self
                .lock()
                .get(env)
                .and_then(|r| r.streams.get(stream_id).cloned())
            else {
                return;
            };
            match target.queue.send(frame) {
                Ok(()) => {
                    self.counters.to_harness.inc_by(n);
                    match kind {
                        // The executor answered the harness's msg1.
                        Kind::Handshake => target.established.cancel(),
                        // The executor ended the stream: the harness gets
                        // the Reset, then its socket is closed (one that
                        // ignored it would hold its slot).
                        Kind::Reset => self.end_stream(env, stream_id, &target),
                        Kind::Other => {}
                    }
                    return;
                }
                Err(Refused::Gone) => return,
                Err(Refused::Over(Scope::Stream, _)) => {
                    return self.reset_stream(env, stream_id, Scope::Stream)
                }
                Err(Refused::Over(scope, back)) => {
                    let Some((victim_env, victim)) = self.largest_stream(scope, env) else {
                        return;
                    };
                    self.reset_stream(&victim_env, &victim, scope);
                    if victim_env == env && victim == stream_id {
                        return;
                    }
                    frame = back;
                }
            }
        }
    }

    /// Ends `stream_id` of `env` after what is queued for it (the executor
    /// reset it): taken off the route, its writer sends the rest and closes.
    fn end_stream(&self, env: &str, stream_id: &str, link: &StreamLink) {
        let mut routes = self.lock();
        if let Some(route) = routes.get_mut(env) {
            if route
                .streams
                .get(stream_id)
                .is_some_and(|s| s.queue.same(&link.queue))
            {
                route.streams.remove(stream_id);
            }
        }
        drop(routes);
        link.queue.close();
    }

    /// The environment and id of the stream holding the most in `scope`
    /// (`env`'s streams, or the node's).
    fn largest_stream(&self, scope: Scope, env: &str) -> Option<(String, String)> {
        let routes = self.lock();
        let in_scope: Box<dyn Iterator<Item = (&String, &Route)>> = match scope {
            Scope::Node => Box::new(routes.iter()),
            _ => Box::new(routes.get_key_value(env).into_iter()),
        };
        in_scope
            .flat_map(|(e, r)| r.streams.iter().map(move |(id, s)| (e, id, s.queue.held())))
            .max_by_key(|(_, _, held)| *held)
            .map(|(e, id, _)| (e.clone(), id.clone()))
    }

    /// Resets `stream_id` of `env`, which passed the budget of `scope`: what
    /// it holds is freed at once, its socket is closed (the client resumes on
    /// a new stream) and the executor is told, as when a harness disconnects.
    fn reset_stream(&self, env: &str, stream_id: &str, scope: Scope) {
        let (stream, executor) = {
            let mut routes = self.lock();
            let Some(route) = routes.get_mut(env) else {
                return;
            };
            let Some(stream) = route.streams.remove(stream_id) else {
                return;
            };
            (stream, route.executor.as_ref().map(|e| e.tx.clone()))
        };
        let freed = stream.queue.forfeit();
        match scope {
            Scope::Stream => {
                tracing::info!(environment = %env, "a harness stopped reading: its stream is reset")
            }
            Scope::Environment => tracing::warn!(
                environment = %env, freed,
                "the environment's relay buffer is full: its largest stream is reset"
            ),
            Scope::Node => tracing::warn!(
                environment = %env, freed,
                "the node's relay buffer is full: its largest stream is reset"
            ),
        }
        self.counters.stalled_resets.inc();
        stream.close.set(Some(STREAM_RESET));
        stream.stop.cancel();
        if let Some(executor) = executor {
            tell_executor(&executor, stream_id);
        }
    }

    /// Serves one harness socket: it must claim a stream with `Resume` first;
    /// then its frames for that stream go to the executor and back.
    /// `splice_to`: the socket under `writer`, when the harness agreed to
    /// masked frames and data frames may be spliced to it.
    pub async fn serve_harness<R, W>(
        &self,
        (mut reader, writer): (Reader<R>, Writer<W>),
        (env, registration_id): (String, String),
        splice_to: Option<SharedTcp>,
    ) where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let first = match tokio::time::timeout(CLAIM_TIMEOUT, reader.next()).await {
            Ok(Ok(Some(Message::Binary(b)))) => b,
            Ok(Err(e)) => return send_close(writer, CloseStatus::for_error(&e)).await,
            _ => return send_close(writer, Some(CLAIM_REFUSED)).await,
        };
        let stream_id = match Frame::decode(&first) {
            Ok(f) if f.validate().is_ok() && matches!(f.body, Some(Body::Resume { .. })) => {
                f.stream_id
            }
            _ => return send_close(writer, Some(CLAIM_REFUSED)).await,
        };
        let stop = CancellationToken::new();
        let close = CloseWith::default();
        let established = CancellationToken::new();
        let (queue, executor) = {
            let mut routes = self.lock();
            let route = routes.entry(env.clone()).or_default();
            let mut queue = HarnessQueue::new(route.buffered.clone(), self.buffered.clone());
            if let Some(tcp) = splice_to {
                queue = queue.with_splicing(Splicing::new(tcp, self.pipes.clone()));
            }
            let stream = StreamLink {
                queue: queue.clone(),
                stop: stop.clone(),
                close: close.clone(),
                established: established.clone(),
            };
            let exec = route
                .executor
                .as_ref()
                .filter(|e| e.registration_id == registration_id)
                .map(|e| e.tx.clone());
            match exec {
                // Unless someone else holds this stream id.
                Some(exec) if !route.streams.contains_key(&stream_id) => {
                    route.streams.insert(stream_id.clone(), stream);
                    (queue, Ok(exec))
                }
                Some(_) => (queue, Err(CLAIM_REFUSED)),
                None => (queue, Err(NO_EXECUTOR)),
            }
        };
        let executor = match executor {
            Ok(e) => e,
            Err(why) => return send_close(writer, Some(why)).await,
        };
        let (pong_tx, pong_rx) = mpsc::channel(PONG_QUEUE);
        queue.attach(Writer::new(Box::new(writer.into_inner()), Role::Server));
        let writer =
            harness_writer::spawn(queue, pong_rx, (stop.clone(), close.clone()), PING_INTERVAL);
        let mut ok = executor.send(first).await.is_ok();
        // The claim must lead to a handshake the executor answers: a socket
        // that only claims, or sends a msg1 the executor ignores, and
        // answers pings would hold its slot forever.
        let handshake_by = tokio::time::Instant::now() + CLAIM_TIMEOUT;
        let mut handshake_pending = true;
        // From the last message heard, whatever else wakes the loop.
        let mut silent_at = tokio::time::Instant::now() + HARNESS_SILENCE_TIMEOUT;
        while ok {
            // Every other branch ends the loop (see serve_executor); the
            // reader is cancel-safe.
            let msg = tokio::select! {
                m = reader.next() => m,
                () = tokio::time::sleep_until(silent_at) => {
                    tracing::info!(environment = %env, "harness socket silent too long; dropping it");
                    close.set(Some(SILENT));
                    Ok(None)
                }
                _ = executor.closed() => {
                    close.set(Some(EXECUTOR_GONE));
                    Ok(None)
                }
                () = tokio::time::sleep_until(handshake_by), if handshake_pending => {
                    if established.is_cancelled() {
                        handshake_pending = false;
                        continue;
                    }
                    tracing::info!(environment = %env, "harness claimed a stream the executor never answered; dropping it");
                    close.set(Some(NO_HANDSHAKE));
                    Ok(None)
                }
                _ = stop.cancelled() => Ok(None),
            };
            silent_at = tokio::time::Instant::now() + HARNESS_SILENCE_TIMEOUT;
            let bytes = match classify(msg, &pong_tx) {
                Read::Frame(b) => b,
                Read::Skip => continue,
                Read::End(status) => {
                    close.set(status);
                    break;
                }
            };
            // A harness speaks for its own stream only.
            if frame::peek_stream_id(&bytes).ok().as_deref() != Some(stream_id.as_str()) {
                continue;
            }
            let n = bytes.len() as u64;
            ok = executor.send(bytes).await.is_ok();
            if ok {
                self.counters.to_executor.inc_by(n);
            }
        }
        if !ok {
            // A send failed: the executor's queue is gone.
            close.set(Some(EXECUTOR_GONE));
        }
        let still_ours = {
            let mut routes = self.lock();
            routes
                .get_mut(&env)
                .and_then(|r| r.streams.remove(&stream_id))
                .is_some()
        };
        if still_ours {
            tell_executor(&executor, &stream_id);
        }
        stop.cancel();
        let _ = writer.await;
    }
}

/// Tells the executor that `stream_id` is gone (`Reset`, harness
/// disconnected), behind what is queued for it. Never dropped: it was
/// dropped when the executor's queue was full, and the executor then kept
/// the stream (and its session attached to it) for ever. A full queue gets
/// it from a task of its own, waiting as long as the node lets a silent
/// executor live; at most one a stream, and stream claims are bounded.
fn tell_executor(executor: &mpsc::Sender<Bytes>, stream_id: &str) {
    let reset: Bytes = Frame::reset(stream_id, RESET_HARNESS_DISCONNECTED)
        .encode()
        .into();
    if let Err(mpsc::error::TrySendError::Full(reset)) = executor.try_send(reset) {
        // The hub runs on the node's runtime; nothing to wait on without one.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let executor = executor.clone();
        runtime.spawn(async move {
            let _ = tokio::time::timeout(EXECUTOR_SILENCE_TIMEOUT, executor.send(reset)).await;
        });
    }
}

#[cfg(test)]
#[path = "hub_tests.rs"]
mod tests;
