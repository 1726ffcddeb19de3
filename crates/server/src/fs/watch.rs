//! `fs/watch` / `fs/unwatch` (ours; the reference knows no such method): change
//! notifications for a path. Watches belong to the session, are bounded by
//! [`MAX_WATCHES_PER_SESSION`], and end with it. All watches of the server share
//! one inotify instance and one reader thread ([`hub`]).
//!
//! Changes are sent as `fs/changed` to the connection attached at the time;
//! while detached they are dropped (a watcher that must not miss anything
//! re-reads the tree after resuming). A watch survives its path being replaced
//! (atomic save, directory removed and made again). When it ends on its own (the
//! directory holding the path went away) the client gets `fs/watchEnded` with a
//! reason, after the last `fs/changed`, and the id is free again.

mod hub;
pub mod missing;

use crate::error::{ExecError, ExecResult};
use crate::link::Link;
use exec_server_protocol::types::FsWatchEndedNotification;
use exec_server_protocol::{methods, PathUri};
use hub::{HubError, SubId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// Most watches one session may hold: 64.
pub const MAX_WATCHES_PER_SESSION: usize = 64;

/// Notifications queued per watch before further changes are dropped: 1024.
pub const WATCH_QUEUE_EVENTS: usize = 1024;

type Entries = Mutex<HashMap<String, SubId>>;

/// The session's watches: watch id → subscription in the shared hub.
#[derive(Default)]
pub struct WatchTable {
    watches: Arc<Entries>,
}

fn lock(m: &Entries) -> MutexGuard<'_, HashMap<String, SubId>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl WatchTable {
    /// Starts watching. Errors: `AlreadyExists` or `LimitReached` for a taken id or a full
    /// table, `NotFound` when the path does not exist, `Failed` when the
    /// user's inotify limits are used up
    /// (the message names the sysctl) or for other watcher failures.
    pub fn watch(
        &self,
        id: &str,
        path: &PathUri,
        recursive: bool,
        link: Arc<Link>,
    ) -> ExecResult<()> {
        let native = path.to_path().map_err(ExecError::invalid_params)?;
        let mut table = lock(&self.watches);
        if table.contains_key(id) {
            return Err(ExecError::already_exists(format!(
                "watch `{id}` already exists"
            )));
        }
        if table.len() >= MAX_WATCHES_PER_SESSION {
            return Err(ExecError::limit_reached(format!(
                "too many watches in this session (limit {MAX_WATCHES_PER_SESSION})"
            )));
        }
        std::fs::metadata(&native).map_err(ExecError::io)?;
        let hub = hub::hub().map_err(hub_error)?;
        let (sub, mut rx, ended) = hub
            .subscribe(id, native, recursive, WATCH_QUEUE_EVENTS)
            .map_err(hub_error)?;
        table.insert(id.to_string(), sub);
        drop(table);
        let table: Weak<Entries> = Arc::downgrade(&self.watches);
        let watch_id = id.to_string();
        tokio::spawn(async move {
            // Ends once the hub drops the subscription: unwatch, or the end.
            while let Some(n) = rx.recv().await {
                notify(&link, methods::FS_CHANGED, &n).await;
            }
            let Ok(reason) = ended.await else {
                return; // unwatched: nothing to say
            };
            if let Some(table) = table.upgrade() {
                let mut t = lock(&table);
                if t.get(&watch_id) == Some(&sub) {
                    t.remove(&watch_id);
                }
            }
            let n = FsWatchEndedNotification { watch_id, reason };
            notify(&link, methods::FS_WATCH_ENDED, &n).await;
        });
        Ok(())
    }

    /// Stops a watch (unknown ids are fine).
    pub fn unwatch(&self, id: &str) {
        let sub = lock(&self.watches).remove(id);
        if let (Some(sub), Ok(hub)) = (sub, hub::hub()) {
            hub.unsubscribe(sub);
        }
    }

    /// Stops every watch.
    pub fn clear(&self) {
        let subs: Vec<SubId> = lock(&self.watches).drain().map(|(_, s)| s).collect();
        if subs.is_empty() {
            return;
        }
        if let Ok(hub) = hub::hub() {
            for sub in subs {
                hub.unsubscribe(sub);
            }
        }
    }

    /// Number of live watches.
    pub fn len(&self) -> usize {
        lock(&self.watches).len()
    }

    /// True when the session watches nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn hub_error(e: HubError) -> ExecError {
    match e {
        HubError::Exhausted(why) => ExecError::failed(why),
        HubError::Io(e) => ExecError::failed(format!("cannot watch: {e}")).with_source(e),
    }
}

async fn notify<T: serde::Serialize>(link: &Link, method: &str, params: &T) {
    let Some(out) = link.outbound() else { return };
    let params = serde_json::to_value(params).unwrap_or_default();
    let _ = out
        .send(exec_server_protocol::encode_notification(method, &params))
        .await;
}
