//! Why a node ends a relay socket: the status of the close frame its writer
//! sends (RFC 6455 §7.4), so the peer can say why it was dropped. The table
//! of statuses is in `docs/remote-registration.md`.

use crate::socket::{CloseStatus, Writer};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWrite;

/// The status of the close frame a socket's writer sends when the socket
/// ends, set by whoever ends it (its reader, a stream reset): the peer then
/// learns why. The first status set is kept; none by default.
#[derive(Clone, Default)]
pub(super) struct CloseWith(Arc<Mutex<Option<CloseStatus>>>);

impl CloseWith {
    pub(super) fn set(&self, status: Option<CloseStatus>) {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = status;
        }
    }

    pub(super) fn get(&self) -> Option<CloseStatus> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Why the node ends a harness socket whose claim it refuses.
pub(super) const CLAIM_REFUSED: CloseStatus =
    CloseStatus::policy("the first message must claim a free stream (Resume) within 10 s");
/// Why the node ends a harness socket whose claimed stream the executor did
/// not answer with a handshake (a claim alone holds a connection slot).
pub(super) const NO_HANDSHAKE: CloseStatus =
    CloseStatus::policy("no Noise handshake completed within 10 s of the claim");
/// Why the node drops a socket that sent nothing for its silence timeout.
pub(super) const SILENT: CloseStatus = CloseStatus::policy("silent too long");
/// Why the node ends a harness socket whose stream it reset.
pub(super) const STREAM_RESET: CloseStatus =
    CloseStatus::policy("stream reset: the harness stopped reading");
/// Why the node ends a harness socket that claims a stream of an
/// environment whose executor is not attached to it (not yet, or any
/// more): 1013, "try again later", as it may be reconnecting.
pub const NO_EXECUTOR: CloseStatus = CloseStatus {
    code: 1013,
    reason: "no executor of this environment is attached to this node",
};
/// Why the node ends a harness socket whose executor has gone.
pub(super) const EXECUTOR_GONE: CloseStatus = CloseStatus {
    code: 1001,
    reason: "the executor is gone",
};

/// Ends a socket with a close frame of `status` (bounded: 5 s), whether the
/// node refuses it at its claim or its writer stops.
pub(super) async fn send_close<W: AsyncWrite + Unpin>(
    mut writer: Writer<W>,
    status: Option<CloseStatus>,
) {
    let _ = tokio::time::timeout(Duration::from_secs(5), writer.close(status)).await;
}
