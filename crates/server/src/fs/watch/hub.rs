//! The one inotify instance of the process, shared by every watch of every
//! session: one file descriptor and one reader thread however many watches,
//! so `fs/watch` cannot exhaust the user's `fs.inotify.max_user_instances`.
//!
//! Only directories are watched in the kernel. A watched path is followed
//! through its parent directory (the anchor) by name, so replacing it (an
//! atomic save: write a temporary file, rename it over the path; or a directory
//! deleted and made again) keeps the watch alive and re-arms it on the new
//! inode. A watch ends only when its anchor goes away (removed, moved, or its
//! file system unmounted); its subscriber is then told why.
//!
//! Kernel watches are shared by path: two subscriptions on one directory use
//! one inotify watch, which is removed when no subscription needs it.

use exec_server_protocol::types::FsChangedNotification;
use exec_server_protocol::PathUri;
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{mpsc, oneshot};

/// Why a subscription could not be made.
#[derive(Debug)]
pub enum HubError {
    /// The user's inotify limit (instances or watches) is used up; the text
    /// names the sysctl.
    Exhausted(String),
    /// Any other failure to watch.
    Io(std::io::Error),
}

impl std::fmt::Display for HubError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HubError::Exhausted(s) => f.write_str(s),
            HubError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// A subscription's identity in the hub.
pub type SubId = u64;

/// What a subscriber receives when its watch ends on its own (not on unwatch):
/// the reason, in words.
pub type Ended = oneshot::Receiver<String>;

const MASK: WatchMask = WatchMask::CREATE
    .union(WatchMask::DELETE)
    .union(WatchMask::MODIFY)
    .union(WatchMask::ATTRIB)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MOVE_SELF)
    .union(WatchMask::ONLYDIR);

struct Sub {
    watch_id: String,
    target: PathBuf,
    recursive: bool,
    tx: mpsc::Sender<FsChangedNotification>,
    end: oneshot::Sender<String>,
}

impl Sub {
    fn anchor(&self) -> Option<&Path> {
        self.target.parent()
    }

    /// True if a change at `path` concerns this subscription.
    fn covers(&self, path: &Path) -> bool {
        path == self.target
            || path.parent() == Some(&self.target)
            || (self.recursive && path.starts_with(&self.target))
    }

    /// True if the directory at `dir` must be watched for this subscription.
    fn needs(&self, dir: &Path) -> bool {
        self.anchor() == Some(dir)
            || dir == self.target
            || (self.recursive && dir.starts_with(&self.target))
    }
}

#[derive(Default)]
struct State {
    /// Kernel watches by descriptor number, with the paths they stand for.
    dirs: HashMap<i32, (WatchDescriptor, Vec<PathBuf>)>,
    /// Ordered by components, so a directory's descendants follow it.
    by_path: BTreeMap<PathBuf, i32>,
    subs: HashMap<SubId, Sub>,
    next_sub: SubId,
}

/// The shared watcher.
pub struct Hub {
    watches: Mutex<Watches>,
    state: Mutex<State>,
}

static HUB: Mutex<Option<Arc<Hub>>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn classify(e: std::io::Error, what: &str) -> HubError {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => HubError::Exhausted(format!(
            "cannot watch {what}: the user's inotify watch limit (fs.inotify.max_user_watches) is used up"
        )),
        Some(libc::EMFILE) | Some(libc::ENFILE) => HubError::Exhausted(format!(
            "cannot watch {what}: the user's inotify instance limit (fs.inotify.max_user_instances) or the open file limit is reached"
        )),
        _ => HubError::Io(e),
    }
}

/// The process's hub, started on first use. A failed start is not remembered:
/// the next watch tries again.
pub fn hub() -> Result<Arc<Hub>, HubError> {
    let mut slot = lock(&HUB);
    if let Some(h) = slot.as_ref() {
        return Ok(h.clone());
    }
    let inotify = Inotify::init().map_err(|e| classify(e, "anything"))?;
    let hub = Arc::new(Hub {
        watches: Mutex::new(inotify.watches()),
        state: Mutex::default(),
    });
    let reader = hub.clone();
    std::thread::Builder::new()
        .name("fs-watch".into())
        .spawn(move || reader.run(inotify))
        .map_err(HubError::Io)?;
    *slot = Some(hub.clone());
    Ok(hub)
}

/// Kernel reads are 64 KiB at most (hundreds of events).
const READ_BUFFER_BYTES: usize = 64 * 1024;

impl Hub {
    /// Subscribes to changes at `target` (which must exist), its direct
    /// children when it is a directory, and its whole tree when `recursive`.
    /// Changes arrive on the returned receiver (dropped when full); if the watch
    /// ends on its own, the reason arrives on [`Ended`] and the receiver closes.
    pub fn subscribe(
        &self,
        watch_id: &str,
        target: PathBuf,
        recursive: bool,
        queue: usize,
    ) -> Result<(SubId, mpsc::Receiver<FsChangedNotification>, Ended), HubError> {
        let (tx, rx) = mpsc::channel(queue);
        let (end, ended) = oneshot::channel();
        let mut st = lock(&self.state);
        let id = st.next_sub;
        st.next_sub += 1;
        let sub = Sub {
            watch_id: watch_id.to_string(),
            target: target.clone(),
            recursive,
            tx,
            end,
        };
        let anchor = sub.anchor().map(Path::to_path_buf);
        st.subs.insert(id, sub);
        let armed = match &anchor {
            Some(a) => self.add_dir(&mut st, a),
            None => Ok(()),
        }
        .and_then(|()| {
            if target.is_dir() {
                self.add_tree(&mut st, &target, recursive)
            } else {
                Ok(())
            }
        });
        if let Err(e) = armed {
            st.subs.remove(&id);
            self.prune(&mut st);
            return Err(e);
        }
        Ok((id, rx, ended))
    }

    /// Ends a subscription without a reason (unwatch, session end).
    pub fn unsubscribe(&self, id: SubId) {
        let mut st = lock(&self.state);
        if st.subs.remove(&id).is_some() {
            self.prune(&mut st);
        }
    }

    fn add_dir(&self, st: &mut State, dir: &Path) -> Result<(), HubError> {
        if st.by_path.contains_key(dir) {
            return Ok(());
        }
        let wd = lock(&self.watches)
            .add(dir, MASK)
            .map_err(|e| classify(e, &dir.display().to_string()))?;
        let n = wd.get_watch_descriptor_id();
        let entry = st.dirs.entry(n).or_insert_with(|| (wd, Vec::new()));
        entry.1.push(dir.to_path_buf());
        st.by_path.insert(dir.to_path_buf(), n);
        Ok(())
    }

    /// Watches `root` and, when `recursive`, every directory below it, walking
    /// with an explicit stack (depth is not bounded by the call stack).
    fn add_tree(&self, st: &mut State, root: &Path, recursive: bool) -> Result<(), HubError> {
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            match self.add_dir(st, &dir) {
                Ok(()) => {}
                // Gone or replaced by a file meanwhile: its parent reports that.
                Err(HubError::Io(_)) if dir != root => continue,
                Err(e) => return Err(e),
            }
            if !recursive {
                continue;
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
        Ok(())
    }

    /// Forgets the path `gone` and every path below it (a directory removed or
    /// moved away); kernel watches left without a path are removed.
    fn forget_below(&self, st: &mut State, gone: &Path) {
        let stale: Vec<PathBuf> = st
            .by_path
            .range(gone.to_path_buf()..)
            .map(|(p, _)| p)
            .take_while(|p| p.starts_with(gone))
            .cloned()
            .collect();
        for p in stale {
            self.forget_path(st, &p);
        }
    }

    fn forget_path(&self, st: &mut State, path: &Path) {
        let Some(n) = st.by_path.remove(path) else {
            return;
        };
        let empty = match st.dirs.get_mut(&n) {
            Some((_, paths)) => {
                paths.retain(|p| p != path);
                paths.is_empty()
            }
            None => false,
        };
        if empty {
            if let Some((wd, _)) = st.dirs.remove(&n) {
                // Fails harmlessly when the kernel already dropped it.
                let _ = lock(&self.watches).remove(wd);
            }
        }
    }

    /// Removes kernel watches no subscription needs any more.
    fn prune(&self, st: &mut State) {
        let unneeded: Vec<PathBuf> = st
            .by_path
            .keys()
            .filter(|p| !st.subs.values().any(|s| s.needs(p)))
            .cloned()
            .collect();
        for p in unneeded {
            self.forget_path(st, &p);
        }
    }

    /// Ends every subscription whose anchor is no longer watched, telling it why.
    fn end_orphans(&self, st: &mut State, why: &str) {
        let orphans: Vec<SubId> = st
            .subs
            .iter()
            .filter(|(_, s)| s.anchor().is_some_and(|a| !st.by_path.contains_key(a)))
            .map(|(id, _)| *id)
            .collect();
        if orphans.is_empty() {
            return;
        }
        for id in orphans {
            if let Some(sub) = st.subs.remove(&id) {
                let _ = sub.end.send(why.to_string());
            }
        }
        self.prune(st);
    }

    fn run(&self, mut inotify: Inotify) {
        let mut buf = vec![0u8; READ_BUFFER_BYTES];
        loop {
            let events = match inotify.read_events_blocking(&mut buf) {
                Ok(events) => events,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::error!("fs/watch: reading inotify events failed: {e}; watches stop");
                    let mut st = lock(&self.state);
                    let ids: Vec<SubId> = st.subs.keys().copied().collect();
                    for id in ids {
                        if let Some(sub) = st.subs.remove(&id) {
                            let _ = sub.end.send(format!("the watcher failed: {e}"));
                        }
                    }
                    return;
                }
            };
            let mut st = lock(&self.state);
            for ev in events {
                let name = ev.name.map(|n| n.to_os_string());
                self.handle(&mut st, ev.wd.get_watch_descriptor_id(), ev.mask, name);
            }
        }
    }

    fn handle(&self, st: &mut State, wd: i32, mask: EventMask, name: Option<OsString>) {
        if mask.contains(EventMask::Q_OVERFLOW) {
            // Changes were lost: every subscriber should look again.
            for sub in st.subs.values() {
                send(sub, "other", &sub.target);
            }
            return;
        }
        let Some((_, bases)) = st.dirs.get(&wd) else {
            return;
        };
        let bases = bases.clone();
        if mask.contains(EventMask::IGNORED) {
            // The kernel dropped the watch (directory removed, file system unmounted).
            for b in &bases {
                self.forget_below(st, b);
            }
            st.dirs.remove(&wd);
            self.end_orphans(st, "the directory holding the watched path was removed");
            return;
        }
        if mask.contains(EventMask::MOVE_SELF) {
            // Paths below a moved directory are stale; a parent that is watched
            // too has already reported the move by name. A move within a
            // watched tree re-armed the directory under its new name (the same
            // descriptor) before this event is read: keep what still exists.
            for b in &bases {
                if !b.is_dir() {
                    self.forget_below(st, b);
                }
            }
            self.end_orphans(st, "the directory holding the watched path was moved");
            return;
        }
        let Some(name) = name else {
            // DELETE_SELF and the like: the parent's event names the change.
            return;
        };
        let kind = if mask.contains(EventMask::CREATE) {
            "create"
        } else if mask.contains(EventMask::DELETE) {
            "remove"
        } else if mask.intersects(EventMask::MOVED_FROM | EventMask::MOVED_TO) {
            "rename"
        } else if mask.intersects(EventMask::MODIFY | EventMask::ATTRIB) {
            "modify"
        } else {
            "other"
        };
        let is_dir = mask.contains(EventMask::ISDIR);
        for base in bases {
            let path = base.join(&name);
            if is_dir && mask.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
                // A watched path made again, or a new directory in a watched
                // tree: armed before anyone hears of it, so a client reacting
                // to the news misses nothing made inside.
                let wanted: Vec<bool> = st
                    .subs
                    .values()
                    .filter(|s| s.needs(&path))
                    .map(|s| s.recursive && path.starts_with(&s.target))
                    .collect();
                if !wanted.is_empty() {
                    let recursive = wanted.contains(&true);
                    if let Err(e) = self.add_tree(st, &path, recursive) {
                        tracing::warn!("fs/watch: cannot follow {}: {e}", path.display());
                    }
                }
            }
            for sub in st.subs.values() {
                if sub.covers(&path) {
                    send(sub, kind, &path);
                }
            }
            if is_dir && mask.intersects(EventMask::DELETE | EventMask::MOVED_FROM) {
                self.forget_below(st, &path);
                self.end_orphans(st, "the directory holding the watched path was removed");
            }
        }
    }
}

/// Queues one change for `sub`; a full queue drops it (never blocks the reader).
fn send(sub: &Sub, kind: &str, path: &Path) {
    let _ = sub.tx.try_send(FsChangedNotification {
        watch_id: sub.watch_id.clone(),
        kind: kind.into(),
        paths: PathUri::from_path(path).into_iter().collect(),
    });
}
