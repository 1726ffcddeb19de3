//! The rendezvous relay: one executor socket per environment, one harness
//! socket per stream, frames routed by `stream_id` without being opened.
//!
//! Backpressure: a frame is handed to its destination's bounded queue, waiting
//! while it is full, so a slow reader slows its sender down instead of growing
//! memory (the cost: one slow harness can delay its executor's other streams).
//!
//! Liveness: an environment whose executor socket is attached is *live*, and
//! a new registration for it is refused ([`Hub::unless_executor_live`]) so it
//! cannot displace the executor. A socket stops counting when it closes, fails,
//! or sends nothing at all (not even a Pong to our Pings, sent every half of
//! the silence timeout) for the hub's silence timeout: so a dead socket looks
//! live for at most that long after its last frame.

use crate::frame::{self, Body, Frame, RESET_HARNESS_DISCONNECTED};
use futures_util::{SinkExt, StreamExt};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;

/// Frames queued towards one socket before its senders wait.
pub const QUEUE_FRAMES: usize = 64;
/// Time a harness has to claim its stream with `Resume` after the upgrade.
pub const CLAIM_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle sockets are pinged this often (executor sockets at least twice per
/// silence timeout).
pub const PING_INTERVAL: Duration = Duration::from_secs(30);
/// How long an executor socket may send nothing before the relay drops it and
/// the environment stops being live: 60 s (executors ping every 30 s and
/// answer the relay's pings, so a working one is never this quiet).
pub const EXECUTOR_SILENCE_TIMEOUT: Duration = Duration::from_secs(60);

struct ExecutorLink {
    id: u64,
    registration_id: String,
    tx: mpsc::Sender<Vec<u8>>,
    stop: CancellationToken,
}

#[derive(Default)]
struct Route {
    executor: Option<ExecutorLink>,
    streams: HashMap<String, mpsc::Sender<Vec<u8>>>,
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
    rx: mpsc::Receiver<Vec<u8>>,
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
                route.streams.clear();
            }
        }
    }
}

/// Writes queued frames and pings; ends when the queue closes or `stop` fires.
fn spawn_writer<S>(
    mut sink: futures_util::stream::SplitSink<WebSocketStream<S>, Message>,
    mut rx: mpsc::Receiver<Vec<u8>>,
    stop: CancellationToken,
    ping_every: Duration,
) -> tokio::task::JoinHandle<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut ping = tokio::time::interval(ping_every);
        ping.tick().await;
        loop {
            let msg = tokio::select! {
                m = rx.recv() => match m { Some(b) => Message::Binary(b.into()), None => break },
                _ = ping.tick() => Message::Ping(Vec::new().into()),
                _ = stop.cancelled() => break,
            };
            if tokio::time::timeout(Duration::from_secs(30), sink.send(msg))
                .await
                .map_or(true, |r| r.is_err())
            {
                break;
            }
        }
        let _ = sink.close().await;
    })
}

impl Hub {
    /// A hub whose executor sockets are dropped after `executor_silence`
    /// without a frame.
    pub fn new(executor_silence: Duration) -> Hub {
        Hub {
            routes: Routes::default(),
            admission: tokio::sync::Mutex::new(()),
            next_id: AtomicU64::new(0),
            executor_silence,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Route>> {
        lock_routes(&self.routes)
    }

    async fn admit(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.admission.lock().await
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
            route.streams.clear();
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
    pub async fn serve_executor<S>(&self, ws: WebSocketStream<S>, attachment: ExecutorAttachment)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let ExecutorAttachment { link, rx } = attachment;
        let (sink, mut stream) = ws.split();
        let stop = link.stop.clone();
        let ping_every = PING_INTERVAL.min(self.executor_silence / 2);
        let writer = spawn_writer(sink, rx, stop.clone(), ping_every);
        loop {
            let msg = tokio::select! {
                m = tokio::time::timeout(self.executor_silence, stream.next()) => match m {
                    Ok(m) => m,
                    Err(_) => {
                        tracing::info!(environment = %link.env, "executor socket silent too long; dropping it");
                        None
                    }
                },
                _ = stop.cancelled() => None,
            };
            let bytes = match msg {
                Some(Ok(Message::Binary(b))) => b,
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => continue,
            };
            let Ok(stream_id) = frame::peek_stream_id(&bytes) else {
                continue;
            };
            let target = self
                .lock()
                .get(&link.env)
                .and_then(|r| r.streams.get(&stream_id).cloned());
            if let Some(t) = target {
                let _ = t.send(bytes.to_vec()).await;
            }
        }
        writer.abort();
        // Not live any more before the socket closes: whoever sees it close
        // may register at once.
        drop(link);
        drop(stream);
    }

    /// Serves one harness socket: it must claim a stream with `Resume` first;
    /// then its frames for that stream go to the executor and back.
    pub async fn serve_harness<S>(
        &self,
        ws: WebSocketStream<S>,
        env: String,
        registration_id: String,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (sink, mut stream) = ws.split();
        let first = match tokio::time::timeout(CLAIM_TIMEOUT, stream.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => b,
            _ => return,
        };
        let stream_id = match Frame::decode(&first) {
            Ok(f) if f.validate().is_ok() && matches!(f.body, Some(Body::Resume { .. })) => {
                f.stream_id
            }
            _ => return,
        };
        let (tx, rx) = mpsc::channel(QUEUE_FRAMES);
        let executor = {
            let mut routes = self.lock();
            let route = routes.entry(env.clone()).or_default();
            let exec = match &route.executor {
                Some(e) if e.registration_id == registration_id => e.tx.clone(),
                _ => return,
            };
            if route.streams.contains_key(&stream_id) {
                return; // someone else holds this stream id
            }
            route.streams.insert(stream_id.clone(), tx.clone());
            exec
        };
        let stop = CancellationToken::new();
        let writer = spawn_writer(sink, rx, stop.clone(), PING_INTERVAL);
        drop(tx);
        let mut ok = executor.send(first.to_vec()).await.is_ok();
        while ok {
            let msg = tokio::select! {
                m = stream.next() => m,
                _ = executor.closed() => None,
            };
            let bytes = match msg {
                Some(Ok(Message::Binary(b))) => b,
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => continue,
            };
            // A harness speaks for its own stream only.
            if frame::peek_stream_id(&bytes).ok().as_deref() != Some(stream_id.as_str()) {
                continue;
            }
            ok = executor.send(bytes.to_vec()).await.is_ok();
        }
        let still_ours = {
            let mut routes = self.lock();
            routes
                .get_mut(&env)
                .and_then(|r| r.streams.remove(&stream_id))
                .is_some()
        };
        if still_ours {
            let reset = Frame::reset(&stream_id, RESET_HARNESS_DISCONNECTED).encode();
            let _ = executor.try_send(reset);
        }
        stop.cancel();
        let _ = writer.await;
    }
}
