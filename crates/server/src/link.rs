//! The attachment of a session to the connection it currently talks through: a
//! leaf that the process pump, the file watcher and the network proxy write
//! their notifications to (and the proxy its calls to the client), so none of
//! them needs to know what a session is.

use exec_server_protocol::encode_request_traced;
use exec_server_rpc::pending::PendingCalls;
use exec_server_rpc::{CallError, Outbound};
use serde_json::Value;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The attached connection: its id, sending handle and table of the
/// server's own calls to that client.
struct Attached {
    conn: u64,
    out: Outbound,
    calls: PendingCalls,
}

/// The attachment of a session to a connection: where its notifications go.
/// Detached (no connection, or a closed one), notifications are dropped and the
/// client reads what it missed by seq; calls fail at once with `Closed`.
#[derive(Default)]
pub struct Link {
    current: Mutex<Option<Attached>>,
}

impl Link {
    fn lock(&self) -> MutexGuard<'_, Option<Attached>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The attached connection's sending handle, if attached and alive.
    pub fn outbound(&self) -> Option<Outbound> {
        self.lock()
            .as_ref()
            .filter(|a| !a.out.is_closed())
            .map(|a| a.out.clone())
    }

    /// The id of the attached live connection.
    pub fn attached_to(&self) -> Option<u64> {
        self.lock()
            .as_ref()
            .filter(|a| !a.out.is_closed())
            .map(|a| a.conn)
    }

    pub(crate) fn attach(&self, conn: u64, out: Outbound, calls: PendingCalls) {
        *self.lock() = Some(Attached { conn, out, calls });
    }

    /// Detaches if `conn` is the attached connection; true if it was.
    pub(crate) fn detach(&self, conn: u64) -> bool {
        let mut cur = self.lock();
        if cur.as_ref().is_some_and(|a| a.conn == conn) {
            *cur = None;
            return true;
        }
        false
    }

    /// Calls `method` on the attached client and waits up to `timeout` for
    /// the result. Errors: `Closed` when detached or when the connection ends
    /// first, `TimedOut`, `PendingRequestLimitExceeded`, or the client's
    /// JSON-RPC error (`Server`).
    pub async fn call(
        &self,
        method: &str,
        params: &Value,
        timeout: Duration,
    ) -> Result<Value, CallError> {
        let (out, calls) = self
            .lock()
            .as_ref()
            .filter(|a| !a.out.is_closed())
            .map(|a| (a.out.clone(), a.calls.clone()))
            .ok_or(CallError::Closed)?;
        let call = calls.register()?;
        // Named after the caller's span (W3C trace context) when spans are exported.
        let trace = exec_server_telemetry::current_trace();
        out.send(encode_request_traced(
            &call.id,
            method,
            params,
            trace.as_ref(),
        ))
        .await
        .map_err(|_| CallError::Closed)?;
        call.wait(Some(timeout)).await
    }
}
