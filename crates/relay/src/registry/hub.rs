//! The rendezvous relay: one executor socket per environment, one harness
//! socket per stream, frames routed by `stream_id` without being opened.
//!
//! Backpressure: a frame is handed to its destination's bounded queue, waiting
//! while it is full, so a slow reader slows its sender down instead of growing
//! memory (the cost: one slow harness can delay its executor's other streams).

use crate::frame::{self, Body, Frame, RESET_HARNESS_DISCONNECTED};
use futures_util::{SinkExt, StreamExt};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
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
/// Idle sockets are pinged this often.
pub const PING_INTERVAL: Duration = Duration::from_secs(30);

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

/// Routing table of every environment.
#[derive(Default)]
pub struct Hub {
    routes: Mutex<HashMap<String, Route>>,
    next_id: AtomicU64,
}

/// Writes queued frames and pings; ends when the queue closes or `stop` fires.
fn spawn_writer<S>(
    mut sink: futures_util::stream::SplitSink<WebSocketStream<S>, Message>,
    mut rx: mpsc::Receiver<Vec<u8>>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut ping = tokio::time::interval(PING_INTERVAL);
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
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Route>> {
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves an executor's socket until it closes or another executor replaces it.
    pub async fn serve_executor<S>(
        &self,
        ws: WebSocketStream<S>,
        env: String,
        registration_id: String,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (sink, mut stream) = ws.split();
        let (tx, rx) = mpsc::channel(QUEUE_FRAMES);
        let stop = CancellationToken::new();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut routes = self.lock();
            let route = routes.entry(env.clone()).or_default();
            if let Some(old) = route.executor.replace(ExecutorLink {
                id,
                registration_id,
                tx,
                stop: stop.clone(),
            }) {
                old.stop.cancel();
                // The old executor's streams die with it.
                route.streams.clear();
            }
        }
        let writer = spawn_writer(sink, rx, stop.clone());
        loop {
            let msg = tokio::select! {
                m = stream.next() => m,
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
                .get(&env)
                .and_then(|r| r.streams.get(&stream_id).cloned());
            if let Some(t) = target {
                let _ = t.send(bytes.to_vec()).await;
            }
        }
        stop.cancel();
        writer.abort();
        let mut routes = self.lock();
        if let Some(route) = routes.get_mut(&env) {
            if route.executor.as_ref().is_some_and(|e| e.id == id) {
                route.executor = None;
                route.streams.clear();
            }
        }
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
        let writer = spawn_writer(sink, rx, stop.clone());
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
