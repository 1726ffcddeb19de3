//! `fs/watchMissing` (the reference's `fsWatchMissing`): a one-shot watch that
//! fires `fs/missingChanged` once when one of the `missing` paths (or one of
//! their missing ancestors) comes into existence, or when `present` goes away.
//! A client uses it to cache negative lookups (no `AGENTS.md`, no skills here)
//! and look again only when something appears.
//!
//! Each missing path is watched through its nearest existing ancestor, and
//! `present` through its parent, in the shared inotify hub; every change there
//! re-checks the condition, so unrelated changes never fire. Ids belong to the
//! session and stay taken after the watch fired, as in the reference; nothing
//! unwatches (the reference has no method for it), the session's end does.

use super::hub::{self, SubId};
use crate::link::Link;
use exec_server_protocol::types::FsMissingChangedNotification;
use exec_server_protocol::{methods, PathUri};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::mpsc;

/// Most paths (`missing` and `present` together) one watch may name: 64.
pub const MAX_PATHS_PER_WATCH: usize = 64;
/// Most armed missing-path watches per session: 64 (ids stay taken beyond it).
pub const MAX_MISSING_WATCHES_PER_SESSION: usize = 64;

#[derive(Default)]
struct Table {
    /// Every id ever used in the session.
    taken: HashSet<u64>,
    /// Armed watches: their hub subscriptions.
    armed: HashMap<u64, Vec<SubId>>,
}

/// The session's missing-path watches.
#[derive(Default)]
pub struct MissingWatchTable {
    table: Arc<Mutex<Table>>,
}

fn lock(m: &Mutex<Table>) -> MutexGuard<'_, Table> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One missing path: the ancestor watched, and its child on the way to the
/// path, whose appearance fires the watch.
struct Missing {
    anchor: PathBuf,
    next: PathBuf,
}

/// Where a missing path is watched from, or `None` if it cannot be: it exists,
/// lies under a non-directory, or in a place without useful change events
/// (`/` itself, `/proc`, `/sys`).
fn plan_missing(path: &Path) -> Option<Missing> {
    if path.symlink_metadata().is_ok() {
        return None;
    }
    let mut next = path.to_path_buf();
    let mut anchor = path.parent()?.to_path_buf();
    loop {
        match anchor.symlink_metadata() {
            Ok(_) => break,
            Err(_) => {
                next = anchor.clone();
                anchor = anchor.parent()?.to_path_buf();
            }
        }
    }
    let unwatchable =
        anchor == Path::new("/") || anchor.starts_with("/proc") || anchor.starts_with("/sys");
    (std::fs::metadata(&anchor).is_ok_and(|m| m.is_dir()) && !unwatchable)
        .then_some(Missing { anchor, next })
}

impl MissingWatchTable {
    /// Arms watch `id`. Returns false (nothing armed, no notification) as the
    /// reference does: the id was used before in this session, `missing` is
    /// empty, more than [`MAX_PATHS_PER_WATCH`] paths, a missing path exists or
    /// cannot be watched, `present` does not exist, the session holds
    /// [`MAX_MISSING_WATCHES_PER_SESSION`] armed watches, or the watcher
    /// cannot watch (inotify limits).
    pub fn watch(
        &self,
        id: u64,
        missing: &[PathUri],
        present: Option<&PathUri>,
        link: Arc<Link>,
    ) -> bool {
        let mut table = lock(&self.table);
        if table.taken.contains(&id) {
            return false;
        }
        let count = missing.len() + usize::from(present.is_some());
        if missing.is_empty()
            || count > MAX_PATHS_PER_WATCH
            || table.armed.len() >= MAX_MISSING_WATCHES_PER_SESSION
        {
            return false;
        }
        let Some(plans) = missing
            .iter()
            .map(|u| u.to_path().ok().as_deref().and_then(plan_missing))
            .collect::<Option<Vec<Missing>>>()
        else {
            return false;
        };
        let present = match present.map(|u| u.to_path()) {
            None => None,
            Some(Ok(p)) if p.symlink_metadata().is_ok() && p.parent().is_some() => Some(p),
            Some(_) => return false,
        };
        let Ok(hub) = hub::hub() else {
            return false;
        };
        // One subscription per directory to watch, all feeding one signal.
        let mut dirs: Vec<PathBuf> = plans.iter().map(|m| m.anchor.clone()).collect();
        if let Some(p) = &present {
            dirs.push(p.clone());
        }
        dirs.sort();
        dirs.dedup();
        let (signal, mut changed) = mpsc::channel::<()>(1);
        let mut subs = Vec::with_capacity(dirs.len());
        for dir in dirs {
            match hub.subscribe(&id.to_string(), dir, false, 16) {
                Ok((sub, mut rx, ended)) => {
                    subs.push(sub);
                    let signal = signal.clone();
                    tokio::spawn(async move {
                        while rx.recv().await.is_some() {
                            let _ = signal.try_send(());
                        }
                        // The watched directory went away: look again.
                        if ended.await.is_ok() {
                            let _ = signal.try_send(());
                        }
                    });
                }
                Err(_) => {
                    for sub in subs {
                        hub.unsubscribe(sub);
                    }
                    return false;
                }
            }
        }
        drop(signal);
        table.taken.insert(id);
        table.armed.insert(id, subs);
        drop(table);
        let weak = Arc::downgrade(&self.table);
        tokio::spawn(async move {
            while changed.recv().await.is_some() {
                let appeared = plans.iter().any(|m| m.next.symlink_metadata().is_ok());
                let gone = present
                    .as_ref()
                    .is_some_and(|p| p.symlink_metadata().is_err());
                if !(appeared || gone) {
                    continue;
                }
                let Some(table) = weak.upgrade() else { return };
                let Some(subs) = lock(&table).armed.remove(&id) else {
                    return; // the session ended
                };
                for sub in subs {
                    hub.unsubscribe(sub);
                }
                let n = FsMissingChangedNotification { watch_id: id };
                super::notify(&link, methods::FS_MISSING_CHANGED, &n).await;
                return;
            }
        });
        true
    }

    /// Disarms every watch (session end).
    pub fn clear(&self) {
        let armed: Vec<SubId> = lock(&self.table)
            .armed
            .drain()
            .flat_map(|(_, subs)| subs)
            .collect();
        if let Ok(hub) = hub::hub() {
            for sub in armed {
                hub.unsubscribe(sub);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_watch_from_the_nearest_existing_directory() {
        let d = std::env::temp_dir().join(format!("es-missing-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("file"), "").unwrap();
        let m = plan_missing(&d.join("a/b/c")).unwrap();
        assert_eq!(
            (m.anchor.as_path(), m.next.as_path()),
            (d.as_path(), d.join("a").as_path())
        );
        assert!(plan_missing(&d.join("file")).is_none(), "exists");
        assert!(plan_missing(&d.join("file/x")).is_none(), "under a file");
        assert!(
            plan_missing(Path::new("/nonexistent-top")).is_none(),
            "under /"
        );
        assert!(
            plan_missing(Path::new("/proc/self/nope")).is_none(),
            "in /proc"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
