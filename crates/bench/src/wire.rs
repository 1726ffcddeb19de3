//! A minimal, neutral JSON-RPC-over-WebSocket driver (no client library), so both
//! servers are measured through exactly the same code.

use base64::Engine;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message as Ws;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Sink = SplitSink<WebSocketStream<MaybeTlsStream<TcpStream>>, Ws>;
type Waiters = Arc<Mutex<HashMap<i64, oneshot::Sender<Value>>>>;

/// A connection: calls are matched by id; notifications go to a channel.
pub struct Conn {
    sink: tokio::sync::Mutex<Sink>,
    waiters: Waiters,
    next: AtomicI64,
    pub notes: tokio::sync::Mutex<mpsc::UnboundedReceiver<Value>>,
}

pub fn b64d(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap_or(""))
        .unwrap_or_default()
}

/// Length of decoded base64 without decoding.
pub fn b64_len(s: &str) -> usize {
    let pad = s.bytes().rev().take_while(|b| *b == b'=').count();
    s.len() / 4 * 3 - pad
}

pub fn b64e(d: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(d)
}

impl Conn {
    pub async fn connect(url: &str) -> Result<Conn, String> {
        let mut cfg = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default();
        cfg.max_message_size = Some(1 << 30);
        cfg.max_frame_size = Some(1 << 30);
        let (ws, _) = tokio_tungstenite::connect_async_with_config(url, Some(cfg), true)
            .await
            .map_err(|e| e.to_string())?;
        let (sink, stream) = ws.split();
        let waiters: Waiters = Arc::default();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(read_loop(stream, waiters.clone(), tx));
        Ok(Conn {
            sink: tokio::sync::Mutex::new(sink),
            waiters,
            next: AtomicI64::new(1),
            notes: tokio::sync::Mutex::new(rx),
        })
    }

    pub async fn open(url: &str) -> Result<Conn, String> {
        let c = Conn::connect(url).await?;
        c.call("initialize", json!({"clientName": "bench"})).await?;
        c.notify("initialized").await?;
        Ok(c)
    }

    pub async fn notify(&self, method: &str) -> Result<(), String> {
        self.sink
            .lock()
            .await
            .send(Ws::text(json!({"method": method}).to_string()))
            .await
            .map_err(|e| e.to_string())
    }

    /// Sends a request; returns a receiver for its response.
    pub async fn send(
        &self,
        method: &str,
        params: Value,
    ) -> Result<oneshot::Receiver<Value>, String> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().unwrap().insert(id, tx);
        let text = json!({"id": id, "method": method, "params": params}).to_string();
        self.sink
            .lock()
            .await
            .send(Ws::text(text))
            .await
            .map_err(|e| e.to_string())?;
        Ok(rx)
    }

    /// Calls and returns `result`, or the error as text.
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, String> {
        let rx = self.send(method, params).await?;
        let v = rx.await.map_err(|_| "connection closed".to_string())?;
        if let Some(e) = v.get("error") {
            return Err(format!("{method}: {e}"));
        }
        Ok(v["result"].clone())
    }
}

async fn read_loop(
    mut stream: SplitStream<WebSocketStream<MaybeTlsStream<TcpStream>>>,
    waiters: Waiters,
    tx: mpsc::UnboundedSender<Value>,
) {
    while let Some(Ok(msg)) = stream.next().await {
        let Ws::Text(t) = msg else { continue };
        let Ok(v) = serde_json::from_str::<Value>(t.as_str()) else {
            continue;
        };
        if let Some(id) = v.get("id").and_then(Value::as_i64) {
            if v.get("method").is_none() {
                if let Some(w) = waiters.lock().unwrap().remove(&id) {
                    let _ = w.send(v);
                }
                continue;
            }
        }
        let _ = tx.send(v);
    }
}

pub fn start_params(id: &str, argv: &[&str]) -> Value {
    json!({"processId": id, "argv": argv, "cwd": "file:///tmp", "env": {"PATH": "/usr/local/bin:/usr/bin:/bin"}, "tty": false})
}

/// Waits for `process/closed` of `id`, counting output bytes and taking the exit code.
pub async fn wait_closed(c: &Conn, id: &str) -> Result<(usize, Option<i64>), String> {
    let mut notes = c.notes.lock().await;
    let mut bytes = 0;
    let mut exit = None;
    loop {
        let n = tokio::time::timeout(std::time::Duration::from_secs(120), notes.recv())
            .await
            .map_err(|_| format!("{id}: no process/closed within 120 s"))?
            .ok_or("connection closed")?;
        if n["params"]["processId"] != json!(id) {
            continue;
        }
        match n["method"].as_str() {
            Some("process/output") => bytes += b64_len(n["params"]["chunk"].as_str().unwrap_or("")),
            Some("process/exited") => exit = n["params"]["exitCode"].as_i64(),
            Some("process/closed") => return Ok((bytes, exit)),
            _ => {}
        }
    }
}
