//! A calling peer over a [`Connection`]: sends requests and notifications, matches
//! responses to calls through the [`PendingCalls`] table, and hands notifications and
//! requests from the other side to the owner through a channel.

use crate::admission::{AdmissionGuard, InboundAdmission};
use crate::pending::{CallError, PendingCall, PendingCalls};
use crate::transport::{Connection, Inbound, Outbound};
use exec_server_protocol::{
    binary, encode_error, encode_notification, encode_request_traced, encode_response, ErrorObject,
    Message, RequestId, TraceContext,
};
use serde_json::Value;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Gives the trace context of the code making a call (e.g. the current
/// OpenTelemetry span), or `None`.
pub type TraceSource = fn() -> Option<TraceContext>;

static TRACE_SOURCE: OnceLock<TraceSource> = OnceLock::new();

/// Installs, once per process, where [`RpcPeer::call`] takes the `trace`
/// member of each request it sends. Returns `false` if one was already set
/// (the first stays). Without a source requests carry no `trace`.
pub fn set_trace_source(source: TraceSource) -> bool {
    TRACE_SOURCE.set(source).is_ok()
}

/// The trace context for a request sent now, from the installed source.
pub fn current_trace() -> Option<TraceContext> {
    TRACE_SOURCE.get().and_then(|source| source())
}

/// Something the other side sent that is not a response.
#[derive(Debug)]
pub enum Incoming {
    /// A notification.
    Notification {
        /// Method.
        method: String,
        /// Params (`Null` when absent).
        params: Value,
        /// The raw bytes of `params.chunk` when the notification came as a
        /// binary frame (then `chunk` is absent from `params`).
        payload: Option<bytes::Bytes>,
    },
    /// A request to answer with [`RpcPeer::respond`] (the guard frees its id).
    Request {
        /// Id to answer.
        id: RequestId,
        /// Method.
        method: String,
        /// Params.
        params: Value,
        /// Releases the id when dropped.
        guard: AdmissionGuard,
    },
}

/// Capacity of the channel of [`Incoming`] items. When full, reading from the
/// connection waits (backpressure reaches the sender).
pub const INCOMING_QUEUE: usize = 1024;

/// A JSON-RPC peer that makes calls. Cheap to clone.
#[derive(Clone)]
pub struct RpcPeer {
    outbound: Outbound,
    pending: PendingCalls,
    closed: watch::Receiver<bool>,
    peer: String,
}

impl RpcPeer {
    /// Starts the reader task over `conn`; returns the peer and the stream of
    /// incoming notifications and requests (ends when the connection closes).
    pub fn start(conn: Connection) -> (RpcPeer, mpsc::Receiver<Incoming>) {
        let Connection {
            mut inbound,
            outbound,
            peer,
        } = conn;
        let pending = PendingCalls::new();
        let (closed_tx, closed_rx) = watch::channel(false);
        let (in_tx, in_rx) = mpsc::channel(INCOMING_QUEUE);
        let admission = InboundAdmission::default();
        let reader_pending = pending.clone();
        let reader_out = outbound.clone();
        tokio::spawn(async move {
            while let Some(item) = inbound.recv().await {
                let decoded = match item {
                    Inbound::Message(text) => Message::decode(text.as_bytes())
                        .map(|m| (m, None))
                        .map_err(|e| e.to_string()),
                    // A frame only our servers send, and only once agreed.
                    Inbound::Binary(frame) if binary::looks_binary(&frame) => {
                        binary::decode_message(&frame).map(|(m, p)| (m, Some(p)))
                    }
                    Inbound::Binary(frame) => match String::from_utf8(Vec::from(frame)) {
                        Ok(text) => Message::decode(text.as_bytes())
                            .map(|m| (m, None))
                            .map_err(|e| e.to_string()),
                        Err(_) => Err("message is not valid UTF-8".into()),
                    },
                    Inbound::Invalid(_) => continue,
                    // Only a server's reader lifts; read as sent.
                    Inbound::Lifted(lifted) => Message::decode(&lifted.restore())
                        .map(|m| (m, None))
                        .map_err(|e| e.to_string()),
                };
                let (msg, payload) = match decoded {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!("undecodable message from server: {e}");
                        continue;
                    }
                };
                match msg {
                    Message::Response(r) => match payload {
                        Some(p) => {
                            reader_pending.complete_with_payload(&r.id, r.result, p);
                        }
                        None => {
                            reader_pending.complete(&r.id, Ok(r.result));
                        }
                    },
                    Message::Error(e) => {
                        reader_pending.complete(&e.id, Err(e.error));
                    }
                    Message::Notification(n) => {
                        let item = Incoming::Notification {
                            method: n.method,
                            params: n.params,
                            payload,
                        };
                        if in_tx.send(item).await.is_err() {
                            // Owner stopped listening; keep serving responses.
                        }
                    }
                    Message::Request(r) => match admission.admit(&r.id) {
                        Ok(guard) => {
                            let item = Incoming::Request {
                                id: r.id,
                                method: r.method,
                                params: r.params,
                                guard,
                            };
                            let _ = in_tx.send(item).await;
                        }
                        Err(e) => {
                            let _ = reader_out.send(encode_error(&r.id, &e)).await;
                        }
                    },
                }
            }
            // Responses already read were delivered above, in order; only now fail
            // the calls still waiting. Closed is said first: a caller woken
            // by the failure must see the peer closed (and reconnect), not
            // reuse it and fail again at once.
            let _ = closed_tx.send(true);
            reader_pending.close_all();
        });
        (
            RpcPeer {
                outbound,
                pending,
                closed: closed_rx,
                peer,
            },
            in_rx,
        )
    }

    /// Calls `method` and waits for its result. The request carries the
    /// caller's trace context when a [`TraceSource`] is installed.
    pub async fn call(
        &self,
        method: &str,
        params: Value,
        timeout: Option<Duration>,
    ) -> Result<Value, CallError> {
        self.send_call(method, params).await?.wait(timeout).await
    }

    /// Sends a request for `method` and returns its answer to wait for
    /// later, so that other messages can follow it before it is answered
    /// (pipelining). Errors: [`CallError::Closed`], or too many calls
    /// waiting.
    pub async fn send_call(&self, method: &str, params: Value) -> Result<PendingCall, CallError> {
        let call = self.pending.register()?;
        self.outbound
            .send(encode_request_traced(
                &call.id,
                method,
                &params,
                current_trace().as_ref(),
            ))
            .await
            .map_err(|_| CallError::Closed)?;
        Ok(call)
    }

    /// Calls `method` with `params` (which must not hold `chunk`) and
    /// `payload` as its `chunk`: as one binary frame once binary frames are on
    /// ([`Outbound::enable_binary`]), else as base64 in the JSON text. The
    /// result's `chunk` is apart when it came as a binary frame's payload.
    pub async fn call_with_payload(
        &self,
        method: &str,
        params: Value,
        payload: Option<bytes::Bytes>,
        timeout: Option<Duration>,
    ) -> Result<(Value, Option<bytes::Bytes>), CallError> {
        let call = self.pending.register()?;
        let trace = current_trace();
        let sent = match payload {
            Some(bytes) if self.outbound.binary_frames() => {
                // The payload stays where it is: the frame's header and head
                // are a part of their own.
                let head = encode_request_traced(&call.id, method, &params, trace.as_ref());
                let header = binary::encode(binary::Kind::ParamsChunk, &head, &[]);
                self.outbound.send_binary_parts(header.into(), bytes).await
            }
            payload => {
                let text =
                    with_base64_chunk(&call.id, method, params, payload.as_deref(), trace.as_ref());
                self.outbound.send(text).await
            }
        };
        sent.map_err(|_| CallError::Closed)?;
        call.wait_with_payload(timeout).await
    }

    /// [`Self::call_with_payload`] for a payload with room in front: as a
    /// binary frame, the frame is built around the bytes in their own buffer,
    /// which this call then owns alone, so a client masks it in place
    /// instead of copying it. The buffer is consumed either way.
    pub async fn call_with_frame_buf(
        &self,
        method: &str,
        params: Value,
        payload: binary::FrameBuf,
        timeout: Option<Duration>,
    ) -> Result<(Value, Option<bytes::Bytes>), CallError> {
        let call = self.pending.register()?;
        let trace = current_trace();
        let sent = if self.outbound.binary_frames() {
            let head = encode_request_traced(&call.id, method, &params, trace.as_ref());
            let (frame, _) = payload.into_frame(binary::Kind::ParamsChunk, &head);
            self.outbound.send_binary(frame).await
        } else {
            let text = with_base64_chunk(
                &call.id,
                method,
                params,
                Some(payload.payload()),
                trace.as_ref(),
            );
            self.outbound.send(text).await
        };
        sent.map_err(|_| CallError::Closed)?;
        call.wait_with_payload(timeout).await
    }

    /// Turns binary frames on for this connection (the server agreed in
    /// `initialize`); false when the transport cannot carry them.
    pub fn enable_binary(&self) -> bool {
        self.outbound.enable_binary()
    }

    /// True once binary frames are on for this connection (both ends agreed).
    pub fn binary_frames(&self) -> bool {
        self.outbound.binary_frames()
    }

    /// True when the transport could carry binary frames (a WebSocket), so
    /// announcing them in `initialize` makes sense.
    pub fn binary_capable(&self) -> bool {
        self.outbound.binary_capable()
    }

    /// Sends a notification.
    pub async fn notify(&self, method: &str, params: Value) -> Result<(), CallError> {
        self.outbound
            .send(encode_notification(method, &params))
            .await
            .map_err(|_| CallError::Closed)
    }

    /// Answers a request received as [`Incoming::Request`].
    pub async fn respond(
        &self,
        id: &RequestId,
        outcome: Result<Value, ErrorObject>,
    ) -> Result<(), CallError> {
        let text = match outcome {
            Ok(v) => encode_response(id, &v),
            Err(e) => encode_error(id, &e),
        };
        self.outbound
            .send(text)
            .await
            .map_err(|_| CallError::Closed)
    }

    /// Closes the connection (as if the network dropped it).
    pub fn close(&self) {
        self.outbound.close();
    }

    /// Closes the connection as [`RpcPeer::close`] does, then waits until
    /// its writer has stopped (a WebSocket's close frame written and the
    /// socket shut down), at most `bound`: a program that exits right after
    /// would otherwise end the connection without its close frame, which
    /// the server sees as an abnormal closure (1006).
    pub async fn close_and_flush(&self, bound: std::time::Duration) {
        self.close();
        let _ = tokio::time::timeout(bound, self.outbound.closed()).await;
    }

    /// True once the connection has closed.
    pub fn is_closed(&self) -> bool {
        *self.closed.borrow() || self.outbound.is_closed()
    }

    /// Resolves when the connection has closed.
    pub async fn closed(&self) {
        let mut rx = self.closed.clone();
        let _ = rx.wait_for(|c| *c).await;
    }

    /// Calls in flight.
    pub fn pending_calls(&self) -> usize {
        self.pending.len()
    }

    /// Description of the other side.
    pub fn peer(&self) -> &str {
        &self.peer
    }
}

/// A request's JSON text with `payload`, if any, as base64 in `params.chunk`.
fn with_base64_chunk(
    id: &exec_server_protocol::RequestId,
    method: &str,
    mut params: Value,
    payload: Option<&[u8]>,
    trace: Option<&exec_server_protocol::TraceContext>,
) -> String {
    if let (Some(bytes), Value::Object(m)) = (payload, &mut params) {
        m.insert(
            binary::PAYLOAD_MEMBER.into(),
            Value::String(exec_server_protocol::ByteChunk::encode(bytes)),
        );
    }
    encode_request_traced(id, method, &params, trace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncBufReadExt;

    /// A call failed by the connection's end finds the peer already closed,
    /// on every one of many tries across two worker threads (the closed flag
    /// used to be set after the calls were failed, so a caller could retry
    /// on the dead peer and fail again at once).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_failed_by_the_end_of_the_connection_sees_the_peer_closed() {
        for _ in 0..2000 {
            let (ours, theirs) = tokio::io::duplex(4096);
            let (r, w) = tokio::io::split(ours);
            let (peer, _incoming) = RpcPeer::start(crate::transport::lines(r, w, "t".into()));
            let server = tokio::spawn(async move {
                let (r, _w) = tokio::io::split(theirs);
                let mut line = String::new();
                let _ = tokio::io::BufReader::new(r).read_line(&mut line).await;
                // Dropping both halves ends the connection unanswered.
            });
            let got = peer.call("x", Value::Null, None).await;
            assert!(matches!(got, Err(CallError::Closed)), "{got:?}");
            assert!(peer.is_closed(), "failed as closed, yet not closed");
            server.await.unwrap();
        }
    }
}
