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

/// Watch id → its hub subscription, and what it watches (for an upgrade).
type Entries = Mutex<HashMap<String, Entry>>;

struct Entry {
    sub: SubId,
    path: PathUri,
    recursive: bool,
}

/// A watch written down for the next image of the server (an upgrade).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct WatchDoc {
    id: String,
    path: PathUri,
    recursive: bool,
}

/// The session's watches: watch id → subscription in the shared hub.
#[derive(Default)]
pub struct WatchTable {
    watches: Arc<Entries>,
}

fn lock(m: &Entries) -> MutexGuard<'_, HashMap<String, Entry>> {
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
        let entry = Entry {
            sub,
            path: path.clone(),
            recursive,
        };
        table.insert(id.to_string(), entry);
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
                if t.get(&watch_id).map(|e| e.sub) == Some(sub) {
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
        let entry = lock(&self.watches).remove(id);
        if let (Some(entry), Ok(hub)) = (entry, hub::hub()) {
            hub.unsubscribe(entry.sub);
        }
    }

    /// Stops every watch.
    pub fn clear(&self) {
        let subs: Vec<SubId> = lock(&self.watches).drain().map(|(_, e)| e.sub).collect();
        if subs.is_empty() {
            return;
        }
        if let Ok(hub) = hub::hub() {
            for sub in subs {
                hub.unsubscribe(sub);
            }
        }
    }

    /// Every watch, written down for the next image of the server.
    pub fn docs(&self) -> Vec<WatchDoc> {
        lock(&self.watches)
            .iter()
            .map(|(id, e)| WatchDoc {
                id: id.clone(),
                path: e.path.clone(),
                recursive: e.recursive,
            })
            .collect()
    }

    /// Watches again, in this image, what `doc` watched in the previous
    /// one (changes during the upgrade itself are not seen). A path gone
    /// meanwhile ends the watch with `fs/watchEnded`, as a removal would.
    pub fn adopt(&self, doc: WatchDoc, link: Arc<Link>) {
        if let Err(e) = self.watch(&doc.id, &doc.path, doc.recursive, link.clone()) {
            tracing::info!(watch = %doc.id, "upgrade: watch not taken over: {e}");
            let n = FsWatchEndedNotification {
                watch_id: doc.id,
                reason: format!("the server was upgraded and cannot watch it again: {e}"),
            };
            tokio::spawn(async move { notify(&link, methods::FS_WATCH_ENDED, &n).await });
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
