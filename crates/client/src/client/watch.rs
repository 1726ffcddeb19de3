//! `fs/watch` (this server's extension, capability `fsWatch`): changes
//! under a path as a stream of [`WatchEvent`]s.

use super::{lock, ExecServerClient, Inner};
use crate::error::ClientError;
use exec_server_protocol::methods as m;
use exec_server_protocol::types::{
    FsChangedNotification, FsWatchEndedNotification, UnwatchParams, WatchParams,
};
use exec_server_protocol::PathUri;
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc;

/// One change reported by a [`Watch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// Something changed: `kind` is `create`, `modify`, `remove`, `rename`
    /// or `other`. `other` naming the watched path itself means changes may
    /// have been missed (the kernel's queue overflowed, or the connection
    /// was down and has been recovered): look again.
    Changed {
        /// What happened.
        kind: String,
        /// The paths affected.
        paths: Vec<PathUri>,
    },
    /// The watch stopped on its own (its directory went away, the session
    /// could not be recovered); the last event.
    Ended {
        /// Why, for people.
        reason: String,
    },
}

/// What the client keeps of a watch: where its events go, and its path.
pub(super) struct WatchEntry {
    tx: mpsc::UnboundedSender<WatchEvent>,
    path: PathUri,
}

/// A watch made by [`ExecServerClient::watch`]: its events in order.
/// Dropping it removes the watch on the server.
pub struct Watch {
    /// The watch id (unique in the session).
    pub id: String,
    client: ExecServerClient,
    rx: mpsc::UnboundedReceiver<WatchEvent>,
}

impl ExecServerClient {
    /// Watches `path` (a directory's whole tree with `recursive`) for
    /// changes. Errors: the server lacks `fs/watch` (the reference:
    /// -32601), the path does not exist ([`crate::ErrorKind::NotFound`]), or
    /// the session's watch limit is reached.
    pub async fn watch(&self, path: &PathUri, recursive: bool) -> Result<Watch, ClientError> {
        let n = self.inner.next_process.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}-w{n}", self.inner.write_prefix);
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.inner.watches).insert(
            id.clone(),
            WatchEntry {
                tx,
                path: path.clone(),
            },
        );
        let params = WatchParams {
            watch_id: id.clone(),
            path: path.clone(),
            recursive,
        };
        if let Err(e) = self.call::<_, Value>(m::FS_WATCH, &params, false).await {
            lock(&self.inner.watches).remove(&id);
            return Err(e);
        }
        Ok(Watch {
            id,
            client: self.clone(),
            rx,
        })
    }

    /// After a recovered connection: each watch is told to look again
    /// (notifications sent while the connection was down are lost).
    pub(super) fn watches_recovered(&self) {
        for entry in lock(&self.inner.watches).values() {
            let _ = entry.tx.send(WatchEvent::Changed {
                kind: "other".into(),
                paths: vec![entry.path.clone()],
            });
        }
    }

    /// The session is gone: every watch ends with `reason`.
    pub(super) fn watches_failed(&self, reason: &str) {
        for (_, entry) in lock(&self.inner.watches).drain() {
            let _ = entry.tx.send(WatchEvent::Ended {
                reason: reason.into(),
            });
        }
    }
}

/// `fs/changed`: to the watch it names.
pub(super) fn on_changed(inner: &Arc<Inner>, params: Value) {
    let Ok(n) = serde_json::from_value::<FsChangedNotification>(params) else {
        return;
    };
    if let Some(entry) = lock(&inner.watches).get(&n.watch_id) {
        let _ = entry.tx.send(WatchEvent::Changed {
            kind: n.kind,
            paths: n.paths,
        });
    }
}

/// `fs/watchEnded`: the watch's last event.
pub(super) fn on_ended(inner: &Arc<Inner>, params: Value) {
    let Ok(n) = serde_json::from_value::<FsWatchEndedNotification>(params) else {
        return;
    };
    if let Some(entry) = lock(&inner.watches).remove(&n.watch_id) {
        let _ = entry.tx.send(WatchEvent::Ended { reason: n.reason });
    }
}

impl Watch {
    /// The next event; `None` after [`WatchEvent::Ended`] (or once the
    /// client is closed).
    pub async fn next(&mut self) -> Option<WatchEvent> {
        self.rx.recv().await
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let removed = lock(&self.client.inner.watches).remove(&self.id).is_some();
        if !removed {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let params = UnwatchParams {
                watch_id: std::mem::take(&mut self.id),
            };
            rt.spawn(async move {
                let _: Result<Value, _> = client.call(m::FS_UNWATCH, &params, false).await;
            });
        }
    }
}
