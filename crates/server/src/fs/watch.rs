//! `fs/watch` / `fs/unwatch` (ours): change notifications for a path, built on the
//! `notify` crate (inotify on Linux). Watches belong to the session, are bounded
//! by [`MAX_WATCHES_PER_SESSION`], and end with it. Changes are sent as `fs/changed`
//! to the connection attached at the time; while detached they are dropped (a
//! watcher that must not miss anything re-reads the tree after resuming).

use crate::session::Link;
use exec_server_protocol::types::FsChangedNotification;
use exec_server_protocol::{methods, ErrorObject, PathUri};
use notify::{EventKind, RecursiveMode, Watcher};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Most watches one session may hold: 64.
pub const MAX_WATCHES_PER_SESSION: usize = 64;

/// Notifications queued per watch before further changes are dropped: 1024.
pub const WATCH_QUEUE_EVENTS: usize = 1024;

/// The session's watches.
#[derive(Default)]
pub struct WatchTable {
    watches: Mutex<HashMap<String, notify::RecommendedWatcher>>,
}

impl WatchTable {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, notify::RecommendedWatcher>> {
        self.watches.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts watching. Errors: -32600 for a taken id or a full table, -32004 when
    /// the path does not exist, -32603 for other watcher failures.
    pub fn watch(
        &self,
        id: &str,
        path: &PathUri,
        recursive: bool,
        link: Arc<Link>,
    ) -> Result<(), ErrorObject> {
        let native = path.to_path().map_err(ErrorObject::invalid_params)?;
        {
            let w = self.lock();
            if w.contains_key(id) {
                return Err(ErrorObject::invalid_request(format!(
                    "watch `{id}` already exists"
                )));
            }
            if w.len() >= MAX_WATCHES_PER_SESSION {
                return Err(ErrorObject::invalid_request(format!(
                    "too many watches in this session (limit {MAX_WATCHES_PER_SESSION})"
                )));
            }
        }
        std::fs::metadata(&native).map_err(|e| ErrorObject::from_io(&e))?;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<FsChangedNotification>(WATCH_QUEUE_EVENTS);
        let watch_id = id.to_string();
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let Ok(ev) = res else { return };
            let kind = match ev.kind {
                EventKind::Create(_) => "create",
                EventKind::Modify(notify::event::ModifyKind::Name(_)) => "rename",
                EventKind::Modify(_) => "modify",
                EventKind::Remove(_) => "remove",
                EventKind::Access(_) => return,
                _ => "other",
            };
            let paths = ev
                .paths
                .iter()
                .filter_map(|p| PathUri::from_path(p))
                .collect();
            // Full queue: drop rather than block the watcher thread.
            let _ = tx.try_send(FsChangedNotification {
                watch_id: watch_id.clone(),
                kind: kind.into(),
                paths,
            });
        })
        .map_err(|e| ErrorObject::internal(format!("cannot watch: {e}")))?;
        let mode = if recursive {
            RecursiveMode::Recursive
        } else {
            RecursiveMode::NonRecursive
        };
        watcher.watch(&native, mode).map_err(|e| {
            ErrorObject::internal(format!("cannot watch {}: {e}", native.display()))
        })?;
        tokio::spawn(async move {
            while let Some(n) = rx.recv().await {
                let Some(out) = link.outbound() else { continue };
                let params = serde_json::to_value(&n).unwrap_or_default();
                let _ = out
                    .send(exec_server_protocol::encode_notification(
                        methods::FS_CHANGED,
                        &params,
                    ))
                    .await;
            }
        });
        self.lock().insert(id.to_string(), watcher);
        Ok(())
    }

    /// Stops a watch (unknown ids are fine).
    pub fn unwatch(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Stops every watch.
    pub fn clear(&self) {
        self.lock().clear();
    }
}
