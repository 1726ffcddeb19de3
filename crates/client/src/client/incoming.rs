//! What the server sends unasked: notifications routed to process streams and
//! HTTP body streams, and the end of a connection, which starts recovery.

use super::connection::fill_gap;
use super::{lock, Inner};
use crate::events::{FailureReason, ProcessEvent, StreamFailure};
use exec_server_protocol::types::*;
use exec_server_protocol::{methods as m, ErrorObject};
use exec_server_rpc::peer::{Incoming, RpcPeer};
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Routes notifications of one connection; when it ends, starts recovery.
pub(super) async fn dispatch(
    weak: std::sync::Weak<Inner>,
    peer: RpcPeer,
    mut incoming: mpsc::Receiver<Incoming>,
) {
    while let Some(item) = incoming.recv().await {
        let Some(inner) = weak.upgrade() else { return };
        match item {
            Incoming::Notification {
                method,
                params,
                payload,
            } => {
                if method == m::PROCESS_OUTPUT {
                    // Backpressure: a consumer that is behind holds the reader.
                    let room = params["processId"]
                        .as_str()
                        .and_then(|id| lock(&inner.procs).get(id).map(|e| e.events.room()));
                    if let Some(room) = room {
                        drop(inner);
                        room.wait().await;
                        let Some(again) = weak.upgrade() else { return };
                        on_notification(&again, &peer, &method, params, payload);
                        continue;
                    }
                }
                on_notification(&inner, &peer, &method, params, payload)
            }
            Incoming::Request {
                id,
                method,
                params,
                guard,
            } => {
                let policy = inner.opts.network_policy.clone();
                let peer = peer.clone();
                // Answered on a task of its own: a slow decision (a person at a
                // terminal) must not hold the process streams behind it.
                tokio::spawn(async move {
                    let outcome = match (method.as_str(), policy) {
                        (m::NETWORK_POLICY_REQUEST, Some(policy)) => {
                            match serde_json::from_value::<NetworkPolicyRequestParams>(params) {
                                Ok(req) => {
                                    let decision = policy.decide(req).await;
                                    serde_json::to_value(NetworkPolicyRequestResult { decision })
                                        .map_err(|e| ErrorObject::internal(e.to_string()))
                                }
                                Err(e) => Err(ErrorObject::invalid_params(e.to_string())),
                            }
                        }
                        _ => Err(ErrorObject::method_not_found(&method)),
                    };
                    let _ = peer.respond(&id, outcome).await;
                    drop(guard);
                });
            }
        }
    }
    let Some(inner) = weak.upgrade() else { return };
    if inner.closed.load(Ordering::SeqCst) || !inner.opts.source.is_reconnectable() {
        if !inner.opts.source.is_reconnectable() {
            for e in lock(&inner.procs).values_mut() {
                e.events.fail(StreamFailure::new(
                    FailureReason::RecoveryFailed,
                    "connection to the stdio program ended",
                ));
            }
        }
        return;
    }
    let has_work = lock(&inner.procs).values().any(|e| !e.events.is_finished());
    if has_work {
        let _ = inner.lost.send(());
    }
}

/// `payload`: the raw `params.chunk` of a notification that came as a binary
/// frame; `peer`: the connection it came on.
fn on_notification(
    inner: &Arc<Inner>,
    peer: &RpcPeer,
    method: &str,
    params: Value,
    payload: Option<bytes::Bytes>,
) {
    match method {
        m::PROCESS_OUTPUT => {
            let decoded = super::with_chunk::<ProcessOutputNotification>(method, (params, payload));
            let Some(n) = well_formed(inner, method, decoded) else {
                return;
            };
            let mut procs = lock(&inner.procs);
            let Some(e) = procs.get_mut(&n.process_id) else {
                return;
            };
            e.events.add(ProcessEvent::Output {
                seq: n.seq,
                stream: n.stream,
                data: n.chunk.0,
            });
            fill_gap(inner, peer, &n.process_id, e);
        }
        m::PROCESS_EXITED => {
            let decoded = serde_json::from_value::<ProcessExitedNotification>(params);
            let Some(n) = well_formed(inner, method, decoded) else {
                return;
            };
            if let Some(e) = lock(&inner.procs).get_mut(&n.process_id) {
                e.events.add(ProcessEvent::Exited {
                    seq: n.seq,
                    code: n.exit_code,
                    limit: n.limit,
                    signal: n.signal,
                });
                fill_gap(inner, peer, &n.process_id, e);
            }
        }
        m::PROCESS_CLOSED => {
            let decoded = serde_json::from_value::<ProcessClosedNotification>(params);
            let Some(n) = well_formed(inner, method, decoded) else {
                return;
            };
            if let Some(e) = lock(&inner.procs).get_mut(&n.process_id) {
                e.events.add(ProcessEvent::Closed { seq: n.seq });
                fill_gap(inner, peer, &n.process_id, e);
            }
        }
        m::HTTP_REQUEST_BODY_DELTA => {
            let decoded = serde_json::from_value::<HttpBodyDelta>(params);
            let Some(d) = well_formed(inner, method, decoded) else {
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
        m::FS_CHANGED => super::watch::on_changed(inner, params),
        m::FS_WATCH_ENDED => super::watch::on_ended(inner, params),
        _ => {}
    }
}

/// Malformed notifications a client logs; past that, one line says the
/// rest go unlogged (a broken or hostile server cannot flood the log).
const MALFORMED_LOGGED: u32 = 8;

/// The decoded notification, or `None` after a warning naming `method` and
/// why (the first [`MALFORMED_LOGGED`] of a client): a notification that
/// does not decode is ignored, as the reference's client does, but not
/// silently.
fn well_formed<T, E: std::fmt::Display>(
    inner: &Inner,
    method: &str,
    decoded: Result<T, E>,
) -> Option<T> {
    match decoded {
        Ok(n) => Some(n),
        Err(e) => {
            let seen = inner.malformed.fetch_add(1, Ordering::Relaxed);
            if seen < MALFORMED_LOGGED {
                tracing::warn!("ignored a malformed {method} notification from the server: {e}");
            } else if seen == MALFORMED_LOGGED {
                tracing::warn!(
                    "the server keeps sending malformed notifications; no longer logged"
                );
            }
            None
        }
    }
}
