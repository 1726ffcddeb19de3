//! A minimal, neutral JSON-RPC-over-WebSocket driver (no client library), so both
//! servers are measured through exactly the same code.

use exec_server_fastpath::skim;
use exec_server_rpc::transport::{self, Inbound, Outbound, Role};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};

/// Calls awaiting their response; `None` once the connection has ended (a
/// call then fails at once instead of waiting for ever).
type Waiters = Arc<Mutex<Option<HashMap<i64, oneshot::Sender<Response>>>>>;

/// A connection: calls are matched by id; notifications go to a channel.
///
/// The driver costs every server the same and as little as it can, so that
/// the figures are the server's: a message is skimmed once for the members
/// needed (`skim`: no `Value` tree, no copy, strings skipped by a SIMD
/// search), and base64 goes through the same SIMD codec as our server's
/// (`exec_server_base64`). WebSocket frames are read and written by the same
/// code as our client's (`exec_server_rpc::transport::websocket`), which puts
/// a payload straight into its message's buffer.
pub struct Conn {
    sink: Outbound,
    waiters: Waiters,
    next: AtomicI64,
    pub notes: tokio::sync::Mutex<mpsc::UnboundedReceiver<Note>>,
}

/// A response as received: the whole message text and where its `result`
/// (or `error`) lies in it.
pub struct Response {
    text: String,
    result: Option<Range<usize>>,
    error: Option<Range<usize>>,
    /// The members of `result` when it is an object (key span, value span),
    /// found in the pass that split the message.
    result_members: Vec<(Range<usize>, Range<usize>)>,
}

impl Response {
    /// The result's JSON text, or the error as text.
    pub fn result_text(&self) -> Result<&str, String> {
        match (&self.result, &self.error) {
            (_, Some(e)) => Err(self.text[e.clone()].to_string()),
            (Some(r), None) => Ok(&self.text[r.clone()]),
            (None, None) => Err(format!("response without result: {}", self.text.as_str())),
        }
    }
    /// The text of member `key` of an object result (found when the
    /// message was split: no second pass over a large result).
    pub fn result_member(&self, key: &str) -> Option<&str> {
        self.result_members
            .iter()
            .find(|(k, _)| &self.text[k.clone()] == key)
            .map(|(_, v)| &self.text[v.clone()])
    }
    /// The result parsed into a tree (for small results).
    pub fn result(&self) -> Result<Value, String> {
        serde_json::from_str(self.result_text()?).map_err(|e| e.to_string())
    }
}

/// What the scenarios need of a notification (the bytes are counted, not kept).
#[derive(Debug)]
pub struct Note {
    pub method: String,
    pub process_id: String,
    /// Decoded length of `params.chunk`, if present.
    pub chunk_len: usize,
    pub exit_code: Option<i64>,
}

/// Length of decoded base64 without decoding.
pub fn b64_len(s: &str) -> usize {
    let pad = s.bytes().rev().take_while(|b| *b == b'=').count();
    s.len() / 4 * 3 - pad
}

/// A request whose text ends in one base64 string member: `head` (the text
/// up to and including the string's opening quote), `data` in standard
/// padded base64, then `"}}`. Sized once: growing a message of megabytes by
/// its last three bytes would copy it whole.
pub fn request_ending_in_base64(head: &str, data: &[u8]) -> String {
    const TAIL: &str = "\"}}";
    let mut text = String::with_capacity(
        head.len() + exec_server_protocol::bytes::encoded_len(data.len()) + TAIL.len(),
    );
    text.push_str(head);
    exec_server_base64::encode_append(data, &mut text);
    text.push_str(TAIL);
    text
}

impl Conn {
    pub async fn connect(url: &str) -> Result<Conn, String> {
        let mut cfg = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default();
        // Room for the 85 MiB whole-file messages; a long fragmented
        // message reserves up to this much heap (see `warm_heap`).
        cfg.max_message_size = Some(256 << 20);
        cfg.max_frame_size = Some(256 << 20);
        let (ws, _) = tokio_tungstenite::connect_async_with_config(url, Some(cfg), true)
            .await
            .map_err(|e| e.to_string())?;
        let conn = transport::websocket(ws, Role::Client, url.to_string());
        let waiters: Waiters = Arc::new(Mutex::new(Some(HashMap::new())));
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(read_loop(conn.inbound, waiters.clone(), tx));
        Ok(Conn {
            sink: conn.outbound,
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
        self.send_text(json!({"method": method}).to_string()).await
    }

    async fn send_text(&self, text: String) -> Result<(), String> {
        self.sink.send(text).await.map_err(|e| e.to_string())
    }

    /// Sends a request; returns a receiver for its response.
    pub async fn send(
        &self,
        method: &str,
        params: Value,
    ) -> Result<oneshot::Receiver<Response>, String> {
        self.send_with(|id| json!({"id": id, "method": method, "params": params}).to_string())
            .await
    }

    /// Sends a request whose text `build` writes for the given id (for
    /// requests carrying megabytes, written without a `Value` tree).
    pub async fn send_with(
        &self,
        build: impl FnOnce(i64) -> String,
    ) -> Result<oneshot::Receiver<Response>, String> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        match self.waiters.lock().unwrap().as_mut() {
            Some(w) => w.insert(id, tx),
            None => return Err("connection closed".into()),
        };
        self.send_text(build(id)).await?;
        Ok(rx)
    }

    /// Calls and returns the raw response.
    pub async fn call_raw(&self, method: &str, params: Value) -> Result<Response, String> {
        let rx = self.send(method, params).await?;
        rx.await.map_err(|_| "connection closed".to_string())
    }

    /// Calls and returns `result`, or the error as text.
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, String> {
        self.call_raw(method, params)
            .await?
            .result()
            .map_err(|e| format!("{method}: {e}"))
    }
}

async fn read_loop(
    mut inbound: mpsc::Receiver<Inbound>,
    waiters: Waiters,
    tx: mpsc::UnboundedSender<Note>,
) {
    while let Some(msg) = inbound.recv().await {
        let Inbound::Message(t) = msg else { continue };
        let text = t.as_str();
        // One pass: `params` (of a notification) or `result` (of a response)
        // is read for its members, not skipped first and read again.
        let Some((members, nested)) = skim::members_and_nested(text, &["params", "result"]) else {
            continue;
        };
        let get = |key: &str| {
            members
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, r)| r.clone())
        };
        let (id, method) = (get("id"), get("method"));
        if let (Some(id), None) = (id, &method) {
            let Ok(id) = text[id].parse::<i64>() else {
                continue;
            };
            let (result, error) = (get("result"), get("error"));
            let waiter = waiters.lock().unwrap().as_mut().and_then(|w| w.remove(&id));
            if let Some(w) = waiter {
                let base = text.as_ptr() as usize;
                let result_members = nested
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| {
                        let at = k.as_ptr() as usize - base;
                        (at..at + k.len(), v)
                    })
                    .collect();
                let _ = w.send(Response {
                    text: t,
                    result,
                    error,
                    result_members,
                });
            }
            continue;
        }
        let method = method.and_then(|m| skim::plain_string(&text[m]));
        let param = |key: &str| {
            nested
                .as_ref()
                .and_then(|p| p.iter().find(|(k, _)| *k == key))
                .map(|(_, r)| &text[r.clone()])
        };
        let _ = tx.send(Note {
            method: method.unwrap_or_default().to_string(),
            process_id: param("processId")
                .and_then(skim::plain_string)
                .unwrap_or_default()
                .to_string(),
            chunk_len: param("chunk")
                .and_then(skim::plain_string)
                .map_or(0, b64_len),
            exit_code: param("exitCode").and_then(|c| c.parse().ok()),
        });
    }
    // Pending calls fail now (their senders are dropped); later ones at once.
    waiters.lock().unwrap().take();
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
        if n.process_id != id {
            continue;
        }
        match n.method.as_str() {
            "process/output" => bytes += n.chunk_len,
            "process/exited" => exit = n.exit_code,
            "process/closed" => return Ok((bytes, exit)),
            _ => {}
        }
    }
}
