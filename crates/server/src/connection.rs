//! One connection: decode each message, enforce the handshake, dispatch requests
//! through the router, and detach the session when the connection ends.
//!
//! Requests that change state are handled in arrival order (awaited in line);
//! long-polls (`process/read`) and HTTP requests are spawned so they never delay
//! the requests behind them.

use crate::ServerState;
use bytes::Bytes;
use exec_server_protocol::{encode_error, methods, ErrorObject, Message, RequestId};
use exec_server_rpc::pending::PendingCalls;
use exec_server_rpc::router::{Mode, Reply};
use exec_server_rpc::transport::TextStream;
use exec_server_rpc::{Connection, Inbound, Outbound};
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tracing::Instrument;

/// Spawned (detached) requests one connection may have running at once (long-polls,
/// HTTP); further ones are refused with -32600 rather than stalling the connection.
pub const MAX_DETACHED_REQUESTS_PER_CONNECTION: usize = 1024;

/// Server→client requests one connection may have in flight: 256 (the reference's limit).
pub const MAX_SERVER_CALLS: usize = 256;

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
    /// The server's own calls to this client (`network/policyRequest`): ids
    /// from 1, at most [`MAX_SERVER_CALLS`] in flight; failed with `Closed`
    /// when the connection ends.
    pub calls: PendingCalls,
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
    pub fn session(&self) -> Option<Arc<crate::session::Session>> {
        match &*self.phase() {
            Phase::Ready(s) | Phase::Initializing(s) => Some(s.clone()),
            Phase::Fresh => None,
        }
    }
}

/// Serves `conn` until it closes or sends something connection-fatal: a
/// notification other than `initialized` (or `initialized` before
/// `initialize`), or a response with an id this connection never gave out
/// (the server's only calls are the proxy's `network/policyRequest`). A
/// response to a call of ours that no longer waits is dropped, the
/// connection kept ([`is_late_answer`]).
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
        calls: PendingCalls::from_one(MAX_SERVER_CALLS),
        phase: Mutex::new(Phase::Fresh),
    });
    let _counted = crate::metrics::connection_opened();
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
        let flow = match decode(&ctx, item) {
            Ok((Message::Request(req), payload)) => request(&ctx, req, payload, &detached).await,
            Ok((Message::Notification(n), _)) => notification(&ctx, &n.method),
            Ok((Message::Response(r), _)) => answer(&ctx, &r.id, Ok(r.result)),
            Ok((Message::Error(e), _)) => answer(&ctx, &e.id, Err(e.error)),
            Err(why) => {
                let e = crate::handlers::undecodable(&parse_context, &why);
                crate::metrics::request_error(e.code);
                sent(
                    ctx.outbound
                        .send(encode_error(&RequestId::UNDECODABLE, &e))
                        .await,
                )
            }
        };
        if flow.is_break() {
            break;
        }
    }
    ctx.outbound.close();
    // Pending asks of the proxy end now (a deny), never left hanging.
    ctx.calls.close_all();
    if let Some(s) = ctx.session() {
        server.sessions.detach(&s, ctx.id);
    }
}

/// Whether the connection goes on after this step.
type Flow = ControlFlow<()>;

/// Goes on while the connection still takes what is sent.
fn sent<E>(r: Result<(), E>) -> Flow {
    match r {
        Ok(()) => Flow::Continue(()),
        Err(_) => Flow::Break(()),
    }
}

/// One inbound item as a message and, for a binary frame, its raw payload;
/// the error text of a -32600 otherwise.
fn decode(ctx: &ConnCtx, item: Inbound) -> Result<(Message, Option<Bytes>), String> {
    match item {
        // A hot request's base64 is decoded in the message's own buffer.
        Inbound::Message(text) => {
            exec_server_fastpath::hot::decode_text(text).map_err(|e| e.to_string())
        }
        // Agreed in `initialize`: a binary frame carries a request's
        // `params.chunk` raw (docs/binary-frames.md).
        Inbound::Binary(frame) if ctx.outbound.binary_frames() => {
            match exec_server_protocol::binary::decode_message(&frame) {
                Ok((Message::Request(r), payload)) => Ok((Message::Request(r), Some(payload))),
                Ok(_) => Err("a binary frame from a client must be a request".into()),
                Err(e) => Err(e),
            }
        }
        // Otherwise its bytes are a text message, as in the reference.
        Inbound::Binary(frame) => match String::from_utf8(Vec::from(frame)) {
            Ok(text) => Message::decode(text.as_bytes())
                .map(|m| (m, None))
                .map_err(|e| e.to_string()),
            Err(_) => Err("message is not valid UTF-8".into()),
        },
        Inbound::Invalid(why) => Err(why),
        // A large hot request, its base64 decoded while it arrived.
        Inbound::Lifted(lifted) => {
            exec_server_fastpath::hot::decode_lifted(lifted).map_err(|e| e.to_string())
        }
    }
}

/// Dispatches a request: an inline one is answered before the next message
/// is read; a detached one runs beside the loop, refused past
/// [`MAX_DETACHED_REQUESTS_PER_CONNECTION`] in flight.
async fn request(
    ctx: &Ctx,
    req: exec_server_protocol::Request,
    payload: Option<Bytes>,
    detached: &Arc<Semaphore>,
) -> Flow {
    let server = &ctx.server;
    let started = Instant::now();
    let method = server.router.known_method(&req.method);
    // Fields are the method's wire name (or `other`) and the id: never
    // params, which may carry file contents, environments or secrets.
    let span = tracing::info_span!(
        "request",
        otel.name = method.unwrap_or("other"),
        otel.kind = "server",
        conn = ctx.id,
        method = method.unwrap_or("other"),
        id = %req.id,
        error_code = tracing::field::Empty,
    );
    // Before the span is first entered: a started span keeps its parent.
    if let Some(t) = &req.trace {
        exec_server_telemetry::adopt_parent(&span, t);
    }
    let dispatched = span.in_scope(|| {
        server
            .router
            .dispatch_with_payload(ctx.clone(), &req.method, req.params, payload)
    });
    match dispatched {
        Err(e) => {
            span.record("error_code", e.code);
            span.in_scope(|| tracing::debug!(code = e.code, "refused"));
            crate::metrics::request_done(method, started, Some(e.code));
            sent(ctx.outbound.send(encode_error(&req.id, &e)).await)
        }
        Ok((Mode::Inline, fut)) => {
            let outcome = fut.instrument(span.clone()).await;
            let r = reply(&ctx.outbound, &req.id, outcome, method, started)
                .instrument(span)
                .await;
            sent(r)
        }
        Ok((Mode::Detached, fut)) => {
            // Never block the connection on a full table: refuse this one.
            let Ok(permit) = detached.clone().try_acquire_owned() else {
                let e = crate::handlers::too_many_in_flight(MAX_DETACHED_REQUESTS_PER_CONNECTION);
                crate::metrics::request_done(method, started, Some(e.code));
                return sent(ctx.outbound.send(encode_error(&req.id, &e)).await);
            };
            let out = ctx.outbound.clone();
            tokio::spawn(
                async move {
                    let outcome = fut.await;
                    let _ = reply(&out, &req.id, outcome, method, started).await;
                    drop(permit);
                }
                .instrument(span),
            );
            Flow::Continue(())
        }
    }
}

/// A client notification: `initialized` completes the handshake; anything
/// else (or `initialized` before `initialize`) closes the connection.
fn notification(ctx: &ConnCtx, method: &str) -> Flow {
    if method != methods::INITIALIZED {
        tracing::debug!(conn = ctx.id, %method, "unexpected notification; closing");
        return Flow::Break(());
    }
    let mut phase = ctx.phase();
    match &*phase {
        Phase::Initializing(s) => *phase = Phase::Ready(s.clone()),
        Phase::Ready(_) => {} // a second `initialized` is harmless
        Phase::Fresh => {
            tracing::debug!(conn = ctx.id, "initialized before initialize; closing");
            return Flow::Break(());
        }
    }
    Flow::Continue(())
}

/// The client's answer to one of our calls: handed to its waiter, dropped
/// when late, fatal when its id was never given out.
fn answer(
    ctx: &ConnCtx,
    id: &RequestId,
    outcome: Result<serde_json::Value, exec_server_protocol::ErrorObject>,
) -> Flow {
    match ctx.calls.complete(id, outcome) || is_late_answer(ctx, id) {
        true => Flow::Continue(()),
        false => Flow::Break(()),
    }
}

/// Whether a response that `ctx.calls` had no waiter for is dropped (true)
/// rather than connection-fatal. An id this connection gave out is an answer
/// that came after its call timed out (the proxy already denied) or a second
/// answer: the client did nothing wrong, so unlike the reference the
/// connection and its session are kept. An id never given out is fatal, as
/// in the reference (SPEC.md §1.5, `env_unsolicited_response_closes`).
fn is_late_answer(ctx: &ConnCtx, id: &RequestId) -> bool {
    if ctx.calls.issued(id) {
        tracing::debug!(
            conn = ctx.id,
            ?id,
            "answer to a call that no longer waits; dropped"
        );
        true
    } else {
        tracing::debug!(conn = ctx.id, ?id, "response to no call of ours; closing");
        false
    }
}

/// Results from this size (bytes of JSON) on are sent without being copied
/// into their envelope: 64 KiB.
const LARGE_RESULT_BYTES: usize = 64 * 1024;

/// Records the request's duration (arrival to answer ready) and error code
/// under `method`, then queues the answer.
async fn reply(
    out: &Outbound,
    id: &RequestId,
    outcome: Result<Reply, ErrorObject>,
    method: Option<&'static str>,
    started: Instant,
) -> Result<(), exec_server_rpc::Closed> {
    let code = outcome.as_ref().err().map(|e| e.code);
    if let Some(c) = code {
        tracing::Span::current().record("error_code", c);
    }
    crate::metrics::request_done(method, started, code);
    tracing::debug!(
        error_code = code,
        seconds = started.elapsed().as_secs_f64(),
        "answered"
    );
    let Reply {
        result_json,
        after_send,
        payload,
        stream,
        stream_done,
    } = match outcome {
        Ok(reply) => reply,
        Err(e) => return out.send(encode_error(id, &e)).await,
    };
    // Spliced by hand: the result is already JSON text (often large, from the
    // byte-carrying hot paths), so it is never parsed back into a value.
    let id_json = serde_json::to_string(id).unwrap_or_else(|_| "null".into());
    let head = format!("{{\"id\":{id_json},\"result\":");
    let r = match (stream, payload) {
        (Some(mut stream), _) => {
            stream.head = format!("{head}{result_json}").into_bytes();
            stream.tail.push(b'}');
            out.send_stream(stream).await
        }
        (None, Some(bytes)) => {
            // The payload is a part of its own: never copied into the frame.
            use exec_server_protocol::binary;
            let head = format!("{head}{result_json}}}");
            let header = binary::encode(binary::Kind::ResultChunk, &head, &[]);
            out.send_binary_parts(header.into(), bytes.into()).await
        }
        // Sent between its envelope's head and tail, never copied to make
        // room for them.
        (None, None) if result_json.len() >= LARGE_RESULT_BYTES && out.streams() => {
            let whole =
                TextStream::whole(head.into_bytes(), result_json.into_bytes(), b"}".to_vec());
            out.send_stream(whole).await
        }
        (None, None) => {
            // Wrapped in the result's own buffer: byte-carrying results leave
            // room for the envelope, so it is moved, never reallocated.
            let mut s = result_json;
            s.reserve(head.len() + 1);
            s.insert_str(0, &head);
            s.push('}');
            out.send(s).await
        }
    };
    if let Some(f) = after_send {
        f();
    }
    // The producer of a streamed result reads while the writer sends; the
    // next request (of an in-order method) waits until the reading is over.
    if let Some(done) = stream_done {
        let _ = done.await;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ServerConfig;
    use serde_json::{json, Value};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    /// A server connection over an in-memory pipe; returns the client's ends.
    async fn connect() -> (
        tokio::io::WriteHalf<tokio::io::DuplexStream>,
        tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
        tokio::task::JoinHandle<()>,
    ) {
        let state = ServerState::new(ServerConfig::default()).unwrap();
        let (client, server) = tokio::io::duplex(1 << 16);
        let (sr, sw) = tokio::io::split(server);
        let conn = exec_server_rpc::transport::lines(sr, sw, "test".into());
        let task = tokio::spawn(serve(state, conn, "test message".into(), None));
        let (cr, cw) = tokio::io::split(client);
        (cw, BufReader::new(cr).lines(), task)
    }

    async fn next(
        lines: &mut tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    ) -> Option<Value> {
        let line = tokio::time::timeout(std::time::Duration::from_secs(5), lines.next_line())
            .await
            .expect("an answer within 5 s")
            .ok()??;
        serde_json::from_str(&line).ok()
    }

    #[tokio::test]
    async fn handshake_order_and_bad_input_are_answered() {
        let (mut w, mut r, task) = connect().await;
        w.write_all(b"{not json\n").await.unwrap();
        let e = next(&mut r).await.unwrap();
        assert_eq!(
            (e["id"].clone(), e["error"]["code"].clone()),
            (json!(-1), json!(-32600))
        );
        w.write_all(b"{\"id\":1,\"method\":\"process/read\",\"params\":{\"processId\":\"p\"}}\n")
            .await
            .unwrap();
        let e = next(&mut r).await.unwrap();
        assert_eq!(e["id"], json!(1));
        assert_eq!(
            e["error"]["message"],
            json!("client must call initialize before using exec methods")
        );
        w.write_all(b"{\"id\":2,\"method\":\"initialize\",\"params\":{\"clientName\":\"t\"}}\n")
            .await
            .unwrap();
        let ok = next(&mut r).await.unwrap();
        assert!(ok["result"]["sessionId"].is_string(), "{ok}");
        w.write_all(b"{\"id\":3,\"method\":\"environment/status\"}\n")
            .await
            .unwrap();
        let e = next(&mut r).await.unwrap();
        assert_eq!(
            e["error"]["message"],
            json!("client must send initialized before using environment info methods")
        );
        w.write_all(
            b"{\"method\":\"initialized\"}\n{\"id\":4,\"method\":\"environment/status\"}\n",
        )
        .await
        .unwrap();
        let ok = next(&mut r).await.unwrap();
        assert_eq!(ok, json!({"id": 4, "result": {"status": "ready"}}));
        // A response from the client is connection-fatal: the server closes.
        w.write_all(b"{\"id\":9,\"result\":{}}\n").await.unwrap();
        assert_eq!(next(&mut r).await, None);
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("the loop ends")
            .unwrap();
    }

    /// A line transport never agrees to binary frames, even when asked.
    #[tokio::test]
    async fn binary_frames_are_not_offered_on_lines() {
        let (mut w, mut r, _task) = connect().await;
        w.write_all(b"{\"id\":1,\"method\":\"initialize\",\"params\":{\"clientName\":\"t\",\"extensions\":{\"binaryFrames\":1}}}\n")
            .await
            .unwrap();
        let ok = next(&mut r).await.unwrap();
        assert!(ok["result"]["sessionId"].is_string(), "{ok}");
        assert!(ok["result"].get("binaryFrames").is_none(), "{ok}");
    }

    #[tokio::test]
    async fn an_unexpected_notification_ends_the_connection() {
        let (mut w, mut r, task) = connect().await;
        w.write_all(b"{\"method\":\"initialized\"}\n")
            .await
            .unwrap();
        assert_eq!(next(&mut r).await, None, "initialized before initialize");
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("the loop ends")
            .unwrap();
    }
}
