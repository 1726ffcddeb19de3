//! One connection: decode each message, enforce the handshake, dispatch requests
//! through the router, and detach the session when the connection ends.
//!
//! Requests that change state are handled in arrival order (awaited in line);
//! long-polls (`process/read`) and HTTP requests are spawned so they never delay
//! the requests behind them.

use crate::ServerState;
use exec_server_protocol::{encode_error, methods, ErrorObject, Message, RequestId};
use exec_server_rpc::router::{Mode, Reply};
use exec_server_rpc::{Connection, Inbound, Outbound};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Semaphore;

/// Spawned (detached) requests one connection may have running at once (long-polls,
/// HTTP); further ones are refused with -32600 rather than stalling the connection.
pub const MAX_DETACHED_REQUESTS_PER_CONNECTION: usize = 1024;

/// Where a connection is in the handshake.
#[derive(Clone)]
pub enum Phase {
    /// No successful `initialize` yet.
    Fresh,
    /// `initialize` answered; waiting for `initialized`.
    Initializing(Arc<crate::session::Session>),
    /// Ready.
    Ready(Arc<crate::session::Session>),
}

/// Per-connection context handed to every handler.
pub struct ConnCtx {
    /// Server state.
    pub server: Arc<ServerState>,
    /// Connection id (unique in this server).
    pub id: u64,
    /// Sending handle.
    pub outbound: Outbound,
    /// Handshake phase.
    pub phase: Mutex<Phase>,
}

/// Handlers take a shared context.
pub type Ctx = Arc<ConnCtx>;

impl ConnCtx {
    /// The phase lock.
    pub fn phase(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session, once `initialize` succeeded.
    pub fn session(&self) -> Result<Arc<crate::session::Session>, ErrorObject> {
        match &*self.phase() {
            Phase::Ready(s) | Phase::Initializing(s) => Ok(s.clone()),
            Phase::Fresh => Err(ErrorObject::invalid_request(
                "client must call initialize first",
            )),
        }
    }
}

/// The group name used in handshake errors, as the reference words them.
pub fn method_group(method: &str) -> &'static str {
    if method.starts_with("process/") {
        "exec"
    } else if method.starts_with("fs/") {
        "filesystem"
    } else if method.starts_with("http/") {
        "http"
    } else if method.starts_with("environment") {
        "environment info"
    } else {
        "capability"
    }
}

/// The handshake gate: every method but `initialize` needs `initialize` and then
/// `initialized`. Runs after params decode.
pub fn gate(ctx: &Ctx, method: &str) -> Result<(), ErrorObject> {
    if method == methods::INITIALIZE {
        return Ok(());
    }
    match &*ctx.phase() {
        Phase::Ready(_) => Ok(()),
        Phase::Fresh => Err(ErrorObject::invalid_request(format!(
            "client must call initialize before using {} methods",
            method_group(method)
        ))),
        Phase::Initializing(_) => Err(ErrorObject::invalid_request(format!(
            "client must send initialized before using {} methods",
            method_group(method)
        ))),
    }
}

/// Serves `conn` until it closes or sends something connection-fatal (SPEC §1.5).
/// With a `handshake_timeout`, a connection that has not completed the handshake
/// (`initialize` answered and `initialized` received) within it is closed, so a
/// socket that never speaks cannot keep a connection slot.
pub async fn serve(
    server: Arc<ServerState>,
    mut conn: Connection,
    parse_context: String,
    handshake_timeout: Option<Duration>,
) {
    let ctx: Ctx = Arc::new(ConnCtx {
        id: server.next_connection_id(),
        server: server.clone(),
        outbound: conn.outbound.clone(),
        phase: Mutex::new(Phase::Fresh),
    });
    let detached = Arc::new(Semaphore::new(MAX_DETACHED_REQUESTS_PER_CONNECTION));
    let handshake_deadline = tokio::time::sleep(handshake_timeout.unwrap_or(Duration::MAX));
    tokio::pin!(handshake_deadline);
    loop {
        let pending = handshake_timeout.is_some() && !matches!(*ctx.phase(), Phase::Ready(_));
        let item = tokio::select! {
            item = conn.inbound.recv() => item,
            _ = &mut handshake_deadline, if pending => {
                tracing::warn!(
                    conn = ctx.id,
                    peer = %conn.peer,
                    "no JSON-RPC handshake (initialize, initialized) within {:?}; closing",
                    handshake_timeout.unwrap_or_default()
                );
                break;
            }
        };
        let Some(item) = item else { break };
        let decoded = match item {
            Inbound::Message(text) => Message::decode(text.as_bytes()).map_err(|e| e.to_string()),
            Inbound::Invalid(why) => Err(why),
        };
        let msg = match decoded {
            Ok(m) => m,
            Err(why) => {
                let e =
                    ErrorObject::invalid_request(format!("failed to parse {parse_context}: {why}"));
                if ctx
                    .outbound
                    .send(encode_error(&RequestId::UNDECODABLE, &e))
                    .await
                    .is_err()
                {
                    break;
                }
                continue;
            }
        };
        match msg {
            Message::Request(req) => {
                let dispatched = server.router.dispatch(ctx.clone(), &req.method, req.params);
                match dispatched {
                    Err(e) => {
                        if ctx.outbound.send(encode_error(&req.id, &e)).await.is_err() {
                            break;
                        }
                    }
                    Ok((Mode::Inline, fut)) => {
                        let outcome = fut.await;
                        if reply(&ctx.outbound, &req.id, outcome).await.is_err() {
                            break;
                        }
                    }
                    Ok((Mode::Detached, fut)) => {
                        // Never block the connection on a full table: refuse this one.
                        let Ok(permit) = detached.clone().try_acquire_owned() else {
                            let e = ErrorObject::invalid_request(format!(
                                "too many requests in flight on this connection (limit {MAX_DETACHED_REQUESTS_PER_CONNECTION}); wait for some to finish"
                            ));
                            if ctx.outbound.send(encode_error(&req.id, &e)).await.is_err() {
                                break;
                            }
                            continue;
                        };
                        let out = ctx.outbound.clone();
                        tokio::spawn(async move {
                            let outcome = fut.await;
                            let _ = reply(&out, &req.id, outcome).await;
                            drop(permit);
                        });
                    }
                }
            }
            Message::Notification(n) if n.method == methods::INITIALIZED => {
                let mut phase = ctx.phase();
                match &*phase {
                    Phase::Initializing(s) => *phase = Phase::Ready(s.clone()),
                    Phase::Ready(_) => {} // a second `initialized` is harmless
                    Phase::Fresh => {
                        tracing::debug!(conn = ctx.id, "initialized before initialize; closing");
                        break;
                    }
                }
            }
            Message::Notification(n) => {
                tracing::debug!(conn = ctx.id, method = %n.method, "unexpected notification; closing");
                break;
            }
            Message::Response(_) | Message::Error(_) => {
                // This server has no requests of its own outstanding.
                tracing::debug!(conn = ctx.id, "unsolicited response; closing");
                break;
            }
        }
    }
    ctx.outbound.close();
    let session = match &*ctx.phase() {
        Phase::Ready(s) | Phase::Initializing(s) => Some(s.clone()),
        Phase::Fresh => None,
    };
    if let Some(s) = session {
        server.sessions.detach(&s, ctx.id);
    }
}

async fn reply(
    out: &Outbound,
    id: &RequestId,
    outcome: Result<Reply, ErrorObject>,
) -> Result<(), exec_server_rpc::Closed> {
    match outcome {
        Ok(Reply {
            result_json,
            after_send,
        }) => {
            let id_json = serde_json::to_string(id).unwrap_or_else(|_| "null".into());
            let mut s = String::with_capacity(result_json.len() + id_json.len() + 16);
            s.push_str("{\"id\":");
            s.push_str(&id_json);
            s.push_str(",\"result\":");
            s.push_str(&result_json);
            s.push('}');
            let r = out.send(s).await;
            if let Some(f) = after_send {
                f();
            }
            r
        }
        Err(e) => out.send(encode_error(id, &e)).await,
    }
}
