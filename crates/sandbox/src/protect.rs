//! Protected names (`.git`, `.codex`, `.agents`, `.aws`): read-only under every
//! writable root, and also in nested repositories found below it (the
//! reference leaves those writable).
//!
//! An absent protected name directly under a writable root gets an empty
//! directory as a placeholder, bound read-only, so the child cannot create it.
//! A mount needs an inode, so the placeholder exists on the host while a child
//! uses it; a process-wide count shares it between concurrent children and the
//! last one removes it (`rmdir`, so a directory someone filled meanwhile stays).

use crate::{Error, MAX_SCAN_DEPTH, MAX_SCAN_ENTRIES, PROTECTED_NAMES};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

fn registry() -> &'static Mutex<HashMap<PathBuf, usize>> {
    static R: OnceLock<Mutex<HashMap<PathBuf, usize>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Whether `e` says this user may not create the name (then the child,
/// with at most the same rights, may not either).
fn denied(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EACCES | libc::EPERM | libc::EROFS)
    )
}

/// One use of a placeholder directory; the last drop removes it from the host.
#[derive(Debug)]
pub struct Placeholder {
    path: PathBuf,
}

impl Placeholder {
    /// Creates (or shares) the placeholder at `path`. `Ok(None)` when `path`
    /// exists already (it is then protected as an existing name) or cannot be
    /// created by this user (then the child, with at most the same rights,
    /// cannot create it either).
    fn acquire(path: &Path) -> Result<Option<Placeholder>, Error> {
        let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = reg.get_mut(path) {
            // Removed on the host while in use: made again, or the new
            // child's bind would fail for want of its source.
            match make_dir(path) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) if denied(&e) => return Ok(None),
                Err(e) => return Err(Error::Placeholder(path.to_path_buf(), e)),
                Ok(()) => {}
            }
            *n += 1;
            return Ok(Some(Placeholder {
                path: path.to_path_buf(),
            }));
        }
        match make_dir(path) {
            Ok(()) => {
                reg.insert(path.to_path_buf(), 1);
                Ok(Some(Placeholder {
                    path: path.to_path_buf(),
                }))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(None),
            Err(e) if denied(&e) => Ok(None),
            Err(e) => Err(Error::Placeholder(path.to_path_buf(), e)),
        }
    }

    /// One more use of the placeholder at `path`, made by a previous image
    /// of this process (an upgrade): counted, not created.
    pub fn adopt(path: &Path) -> Placeholder {
        let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        *reg.entry(path.to_path_buf()).or_insert(0) += 1;
        Placeholder {
            path: path.to_path_buf(),
        }
    }

    /// The placeholder's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Placeholder {
    fn drop(&mut self) {
        let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        let last = match reg.get_mut(&self.path) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                reg.remove(&self.path);
                true
            }
            None => false,
        };
        if last {
            // Only an empty directory goes; anything put there stays.
            let _ = in_parent(&self.path, libc::unlinkat, libc::AT_REMOVEDIR);
        }
    }
}

/// `mkdir(path)` made in the directory `path`'s parent names now, never
/// through a symlink swapped in for it (a command of another policy may
/// write that directory): the parent is opened and checked to be itself.
fn make_dir(path: &Path) -> std::io::Result<()> {
    in_parent(path, libc::mkdirat, 0o777)
}

/// Runs the `*at` call `op(parent_fd, name, arg)` on `path`'s final name in
/// its parent, opened as an `O_PATH` descriptor checked to name the parent
/// path itself (`ELOOP` if a component was redirected since).
fn in_parent<A>(
    path: &Path,
    op: unsafe extern "C" fn(libc::c_int, *const libc::c_char, A) -> libc::c_int,
    arg: A,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let invalid = || std::io::Error::from_raw_os_error(libc::EINVAL);
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(invalid());
    };
    let name = std::ffi::CString::new(name.as_bytes()).map_err(|_| invalid())?;
    let fd = crate::links::open_exact(parent, libc::O_DIRECTORY).map_err(|e| match e {
        Error::Io(e) => e,
        _ => std::io::Error::from_raw_os_error(libc::ELOOP),
    })?;
    // SAFETY: a directory descriptor held open and a NUL-terminated name.
    if unsafe { op(fd.as_raw_fd(), name.as_ptr(), arg) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `path` is a placeholder some sandbox of this process holds.
fn is_placeholder(path: &Path) -> bool {
    let reg = registry().lock().unwrap_or_else(|p| p.into_inner());
    reg.contains_key(path)
}

/// Removes every placeholder still registered (the server calls it at
/// shutdown, after killing every sandbox, when no guard will be dropped any
/// more). Only empty directories go.
pub fn release_all() {
    let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
    for (path, _) in reg.drain() {
        let _ = in_parent(&path, libc::unlinkat, libc::AT_REMOVEDIR);
    }
}

/// What [`scan`] found under one writable root.
#[derive(Debug, Default)]
pub struct Found {
    /// Existing protected names directly under the root (canonical).
    pub existing: Vec<PathBuf>,
    /// Protected names in nested directories (nested repositories).
    pub nested: Vec<PathBuf>,
    /// Placeholders standing for absent top-level names.
    pub placeholders: Vec<Placeholder>,
}

/// Finds the protected names under `root` (canonical): each top-level name
/// (existing, or a new placeholder), and nested ones up to [`MAX_SCAN_DEPTH`]
/// levels and [`MAX_SCAN_ENTRIES`] directory entries (a nested repository
/// deeper or later than that is not protected; symlinked directories are not
/// followed, their targets are outside the root or scanned in place; a
/// nested protected name that is a symlink is not protected).
pub fn scan(root: &Path) -> Result<Found, Error> {
    let mut found = Found::default();
    for name in PROTECTED_NAMES {
        let p = root.join(name);
        // A placeholder another child holds is shared, never taken for an
        // existing name: its last user removes it from the host, which
        // detaches it in every sandbox still running, so each user must
        // count (an adversarial pass created `.git` in a sandbox that way).
        if let Some(ph) = Placeholder::acquire(&p)? {
            found.placeholders.push(ph);
        } else if p.symlink_metadata().is_ok() {
            if let Ok(c) = std::fs::canonicalize(&p) {
                found.existing.push(c);
            }
        }
    }
    let mut budget = MAX_SCAN_ENTRIES;
    let mut level: Vec<PathBuf> = vec![root.to_path_buf()];
    for depth in 0..MAX_SCAN_DEPTH {
        let mut next = Vec::new();
        for dir in &level {
            let Ok(rd) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in rd.flatten() {
                if budget == 0 {
                    return Ok(found);
                }
                budget -= 1;
                let name = entry.file_name();
                let Ok(ft) = entry.file_type() else {
                    continue;
                };
                if PROTECTED_NAMES.iter().any(|n| name == *n) {
                    // A nested symlink is skipped like an absent name: a
                    // bind over it fails the start (a command that made
                    // one would fail every later start in its workspace),
                    // and a bind of its target would let a command make
                    // any directory, the workspace too, read-only.
                    // So is a placeholder of a sandbox rooted below
                    // (an empty directory standing for an absent name):
                    // its last user removes it, maybe before this bind.
                    if depth > 0 && !ft.is_symlink() && !is_placeholder(&entry.path()) {
                        found.nested.push(entry.path());
                    }
                    continue;
                }
                if ft.is_dir() {
                    next.push(entry.path());
                }
            }
        }
        if next.is_empty() {
            break;
        }
        level = next;
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh, empty, canonical directory `sbx-TAG-PID` with `dirs` made in it.
    fn fresh_root(tag: &str, dirs: &[&str]) -> PathBuf {
        let root = std::env::temp_dir().join(format!("sbx-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        for d in dirs {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::canonicalize(&root).unwrap()
    }

    #[test]
    fn a_placeholder_lives_while_any_of_its_users_does() {
        let root = fresh_root("protect", &[".git"]);
        let first = scan(&root).unwrap();
        assert_eq!(first.existing, vec![root.join(".git")]);
        assert_eq!(first.placeholders.len(), 3, "absent names get placeholders");
        // A second child while the first runs shares the same placeholders.
        let second = scan(&root).unwrap();
        assert_eq!(second.existing, vec![root.join(".git")]);
        assert_eq!(second.placeholders.len(), 3);
        drop(first);
        assert!(
            root.join(".codex").is_dir(),
            "kept while the second child runs"
        );
        drop(second);
        assert!(!root.join(".codex").exists(), "removed by its last user");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_placeholder_below_is_not_a_nested_protected_name() {
        let root = fresh_root("below", &["w/sub/.git"]);
        // A sandbox rooted at `w` holds placeholders there meanwhile.
        let inner = scan(&root.join("w")).unwrap();
        assert!(root.join("w/.codex").is_dir());
        // One rooted above protects the real nested repository, not the
        // placeholders, which their holder may remove before this bind.
        let outer = scan(&root).unwrap();
        assert_eq!(outer.nested, vec![root.join("w/sub/.git")]);
        drop((inner, outer));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_placeholder_removed_on_the_host_while_in_use_is_made_again() {
        let root = fresh_root("remade", &[]);
        let first = scan(&root).unwrap();
        std::fs::remove_dir(root.join(".codex")).unwrap();
        let second = scan(&root).unwrap();
        assert_eq!(second.placeholders.len(), first.placeholders.len());
        assert!(
            root.join(".codex").is_dir(),
            "the next child's bind has a source"
        );
        drop((first, second));
        assert!(!root.join(".codex").exists(), "removed by its last user");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_placeholder_is_never_made_through_a_parent_swapped_for_a_symlink() {
        let root = fresh_root("swapped", &["ws", "elsewhere"]);
        let ws = root.join("ws");
        // Resolved as a directory; replaced by a link before the placeholder.
        std::fs::remove_dir(&ws).unwrap();
        std::os::unix::fs::symlink(root.join("elsewhere"), &ws).unwrap();
        let r = scan(&ws);
        assert!(matches!(r, Err(Error::Placeholder(..))), "{r:?}");
        assert_eq!(
            std::fs::read_dir(root.join("elsewhere")).unwrap().count(),
            0
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
