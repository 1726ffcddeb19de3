//! Resolving a policy's paths without following a symlink a sandboxed
//! command could have made.
//!
//! Why: every path of a policy is canonicalised when its view is built, and
//! bind mounts then pin what the path named at that moment. A command that
//! can write a directory can put a symlink there (or swap one in with
//! `renameat2(RENAME_EXCHANGE)`), so a later policy whose path passes through
//! that directory would be resolved to wherever the command chose: with
//! `workspaceRoots: [ws, ws/d]` and `ws/d` swapped for a link to a host
//! directory, that directory became a writable root. So this process keeps
//! every directory a confined view of it made writable ([`record`]), and a
//! path whose resolution follows a symlink inside one of them, or inside a
//! writable root of the same policy, is refused ([`Resolver::check`]). The
//! record is kept in a file ([`keep_in`]) so that it outlives the process
//! and is shared by every server of the host that uses the same file.
//! A policy that writes the whole disk is not recorded: it confines no
//! writes, so nothing it made is trusted anyway.

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Most symlinks one resolution follows before `ELOOP`, as the kernel: 40.
const MAX_LINKS: usize = 40;

/// Most directories [`record`] keeps: 65 536. Past it, every symlink is
/// distrusted (a path through any refuses its plan) rather than forgotten.
pub const MAX_RECORDED: usize = 65_536;

/// The directories confined views made writable.
static WRITTEN: Mutex<Written> = Mutex::new(Written {
    dirs: None,
    overflowed: false,
    journal: None,
});

struct Written {
    /// Shared with each [`Resolver`] taken since it last changed (copied
    /// only when a directory is added while one holds it): a start does not
    /// copy the whole record. `None` until the first.
    dirs: Option<Arc<BTreeSet<PathBuf>>>,
    overflowed: bool,
    journal: Option<Journal>,
}

/// The file that keeps [`WRITTEN`] across restarts and shares it between
/// servers of one host: canonical paths separated by NUL bytes (a path holds
/// none), appended to, never rewritten.
struct Journal {
    path: PathBuf,
    /// Bytes of it already read.
    read: u64,
}

impl Written {
    fn insert(&mut self, dir: PathBuf) -> bool {
        let dirs = self.dirs.get_or_insert_with(Default::default);
        if dirs.contains(&dir) {
            return false;
        }
        if dirs.len() >= MAX_RECORDED {
            self.overflowed = true;
            return false;
        }
        Arc::make_mut(dirs).insert(dir)
    }

    /// Takes in what other processes appended to the journal since it was
    /// last read (one `stat` when nothing was).
    fn refresh(&mut self) {
        use std::io::{Read, Seek};
        use std::os::unix::fs::OpenOptionsExt;
        let Some(j) = &self.journal else {
            return;
        };
        let Ok(meta) = std::fs::metadata(&j.path) else {
            return;
        };
        if meta.len() <= j.read {
            return;
        }
        let (path, from) = (j.path.clone(), j.read);
        let mut bytes = Vec::new();
        let read = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .and_then(|mut f| {
                f.seek(std::io::SeekFrom::Start(from))?;
                f.read_to_end(&mut bytes)
            });
        if read.is_err() {
            return;
        }
        // Up to the last separator: an entry being appended is read later.
        let Some(end) = bytes.iter().rposition(|b| *b == 0) else {
            return;
        };
        for entry in bytes[..end].split(|b| *b == 0) {
            use std::os::unix::ffi::OsStrExt;
            let p = Path::new(std::ffi::OsStr::from_bytes(entry));
            if p.is_absolute() {
                self.insert(p.to_path_buf());
            }
        }
        if let Some(j) = &mut self.journal {
            j.read = from + end as u64 + 1;
        }
    }

    fn append(&self, dirs: &[PathBuf]) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::OpenOptionsExt;
        let Some(j) = &self.journal else {
            return Ok(());
        };
        let mut line = Vec::new();
        for d in dirs {
            line.extend_from_slice(d.as_os_str().as_bytes());
            line.push(0);
        }
        // One write with O_APPEND: entries of two servers never interleave.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&j.path)?
            .write_all(&line)
    }
}

/// Keeps the record in `path` too (see [`Journal`]): loads what it holds and
/// appends every directory recorded from now on. Why: a symlink a command
/// planted outlives the server that confined it, and another server of the
/// same host may resolve the next policy. Errors: reading `path` (an absent
/// file is an empty record), a path that is not a regular file, making its
/// directory.
pub fn keep_in(path: &Path) -> std::io::Result<()> {
    let mut w = WRITTEN.lock().unwrap_or_else(|e| e.into_inner());
    // Made now, so the server can hide it from every view before any
    // sandbox could make it (or a file in it) first.
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.is_file() => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{} is not a regular file", path.display()),
            ))
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let known: Vec<PathBuf> = w.dirs.iter().flat_map(|d| d.iter().cloned()).collect();
    w.journal = Some(Journal {
        path: path.to_path_buf(),
        read: 0,
    });
    w.refresh();
    w.append(&known)
}

/// Remembers that sandboxes may write below each of `dirs` (canonical). `/`
/// is never recorded (see the module's documentation). A journal that cannot
/// be written is reported on stderr once per process; the record in memory
/// holds regardless.
pub fn record<'a>(dirs: impl IntoIterator<Item = &'a Path>) {
    let mut w = WRITTEN.lock().unwrap_or_else(|e| e.into_inner());
    let mut new = Vec::new();
    for d in dirs {
        if d != Path::new("/") && w.insert(d.to_path_buf()) {
            new.push(d.to_path_buf());
        }
    }
    if !new.is_empty() {
        if let Err(e) = w.append(&new) {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                eprintln!("exec-server: cannot keep the sandbox's writable directories: {e}")
            });
        }
    }
}

/// A symlink a resolution would have followed, and why it was not.
#[derive(Debug, thiserror::Error)]
#[error(
    "{link} is a symlink in a directory a sandboxed command may write ({writable}); a policy \
     path is never resolved through one"
)]
pub struct Untrusted {
    /// The symlink.
    pub link: PathBuf,
    /// The writable directory that holds it.
    pub writable: PathBuf,
}

/// Resolves policy paths against the recorded directories and `own` (the
/// policy's own writable roots, canonical).
pub struct Resolver {
    written: Arc<BTreeSet<PathBuf>>,
    overflowed: bool,
}

/// A path resolved: its canonical form and the symlinks followed on the way.
#[derive(Debug)]
pub struct Resolved {
    /// What `realpath(3)` gives.
    pub canonical: PathBuf,
    /// Each symlink followed, by the canonical path of the link itself.
    pub links: Vec<PathBuf>,
    /// Each directory the resolution went through and left again by `..`
    /// (in a symlink's target, say): not part of `canonical`, but a
    /// directory the result depended on.
    pub left: Vec<PathBuf>,
}

impl Resolver {
    /// A resolver that distrusts what is recorded now.
    pub fn new() -> Resolver {
        let mut w = WRITTEN.lock().unwrap_or_else(|e| e.into_inner());
        w.refresh();
        Resolver {
            written: w.dirs.clone().unwrap_or_default(),
            overflowed: w.overflowed,
        }
    }

    /// Checks that none of `resolved`'s links lies in a recorded directory
    /// or below one of `own` (`/` in `own` is ignored).
    pub fn check(&self, resolved: &Resolved, own: &[PathBuf]) -> Result<(), Untrusted> {
        for link in &resolved.links {
            let dir = link.parent().unwrap_or(Path::new("/"));
            let holder = own
                .iter()
                .chain(self.written.iter())
                .filter(|w| w.as_path() != Path::new("/"))
                .find(|w| dir.starts_with(w));
            if let Some(w) = holder {
                return Err(Untrusted {
                    link: link.clone(),
                    writable: w.clone(),
                });
            }
            if self.overflowed {
                return Err(Untrusted {
                    link: link.clone(),
                    writable: PathBuf::from(format!(
                        "more than {MAX_RECORDED} writable directories recorded"
                    )),
                });
            }
        }
        Ok(())
    }

    /// How the server may read `path` itself, instead of through a
    /// confined view, and read what a confined command would see there
    /// ([`OutsideAView`]). `hidden` are the server's own paths, masked in
    /// every view.
    pub fn read_outside_a_view(&self, path: &Path, hidden: &[PathBuf]) -> OutsideAView {
        if self.overflowed || !path.is_absolute() {
            return OutsideAView::Differs;
        }
        let Ok(r) = resolve(path) else {
            return OutsideAView::Differs;
        };
        let overlaps = |p: &Path, d: &Path| p.starts_with(d) || d.starts_with(p);
        let kernel_views = ["/proc", "/sys", "/dev"].map(Path::new);
        if kernel_views.iter().any(|k| r.canonical.starts_with(k))
            || hidden.iter().any(|h| overlaps(&r.canonical, h))
        {
            return OutsideAView::Differs;
        }
        // A link in a writable directory or a hidden path is as untrusted
        // here as on a policy's path; a directory left by `..` as well.
        let left_a_zone = r
            .left
            .iter()
            .any(|d| self.written.iter().chain(hidden).any(|z| d.starts_with(z)));
        if self.check(&r, hidden).is_err() || left_a_zone {
            return OutsideAView::Differs;
        }
        let near_a_zone = self.written.iter().any(|z| overlaps(&r.canonical, z));
        match (near_a_zone, r.links.is_empty() && r.left.is_empty()) {
            (false, _) => OutsideAView::Same,
            (true, true) => OutsideAView::SameWithoutSymlinks,
            (true, false) => OutsideAView::Differs,
        }
    }
}

/// What [`Resolver::read_outside_a_view`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutsideAView {
    /// Nothing a sandbox may write lies on the way or at the end: reading
    /// the path as the operating system resolves it reads what a view
    /// shows there.
    Same,
    /// The path lies in (or holds) a directory a sandbox may write, and no
    /// symlink is on its way now: reading it is safe only if no symlink
    /// is followed (one swapped in meanwhile must fail the read).
    SameWithoutSymlinks,
    /// Read only through a view: the path cannot be resolved, leads into
    /// `/proc`, `/sys`, `/dev` or a hidden path, or follows a symlink (or
    /// a `..`) in a directory a sandbox may write.
    Differs,
}

impl Default for Resolver {
    fn default() -> Self {
        Resolver::new()
    }
}

/// `path` (canonical) opened `O_PATH | flags`, refused with
/// [`crate::Error::Moved`] unless the descriptor names `path` itself: a
/// component changed into a symlink since `path` was resolved would have
/// redirected the open. Errors: the open's, as [`crate::Error::Io`].
pub fn open_exact(path: &Path, flags: libc::c_int) -> Result<OwnedFd, crate::Error> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open(2) of a NUL-terminated path; the result is checked.
    let raw = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC | flags) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    let named = std::fs::read_link(format!("/proc/self/fd/{raw}"))?;
    if named != path {
        return Err(crate::Error::Moved(path.to_path_buf(), named));
    }
    Ok(fd)
}

/// Resolves the absolute `path` as `realpath(3)` does, one component at a
/// time, noting every symlink followed. Errors as `realpath(3)`: `NotFound`
/// when a component is missing, `NotADirectory`, `ELOOP` past 40 links,
/// `ENAMETOOLONG`.
pub fn resolve(path: &Path) -> std::io::Result<Resolved> {
    let mut todo: std::collections::VecDeque<std::ffi::OsString> = components(path);
    let mut current = PathBuf::from("/");
    let mut links = Vec::new();
    let mut left = Vec::new();
    while let Some(name) = todo.pop_front() {
        if name == ".." {
            if current.parent().is_some() {
                left.push(current.clone());
            }
            current.pop();
            continue;
        }
        let next = current.join(&name);
        let meta = std::fs::symlink_metadata(&next)?;
        if !meta.file_type().is_symlink() {
            if !todo.is_empty() && !meta.is_dir() {
                return Err(std::io::Error::from_raw_os_error(libc::ENOTDIR));
            }
            current = next;
            continue;
        }
        if links.len() >= MAX_LINKS {
            return Err(std::io::Error::from_raw_os_error(libc::ELOOP));
        }
        let target = std::fs::read_link(&next)?;
        links.push(next);
        if target.is_absolute() {
            current = PathBuf::from("/");
        }
        let mut rest = components(&target);
        rest.extend(todo);
        todo = rest;
    }
    Ok(Resolved {
        canonical: current,
        links,
        left,
    })
}

fn components(p: &Path) -> std::collections::VecDeque<std::ffi::OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_outside_a_view_near_writable_hidden_or_kernel_paths() {
        let d = std::env::temp_dir().join(format!("sbx-differ-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for sub in ["ws/in", "ws/sub", "other", "state/run", "box/inner"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        let d = std::fs::canonicalize(&d).unwrap();
        std::fs::write(d.join("other/f"), "").unwrap();
        std::os::unix::fs::symlink(d.join("other/f"), d.join("ws/link")).unwrap();
        std::os::unix::fs::symlink(d.join("ws/in"), d.join("other/into-ws")).unwrap();
        // Out of the workspace and back through one of its directories.
        std::os::unix::fs::symlink("../ws/sub/../../other/f", d.join("other/via-ws")).unwrap();
        std::os::unix::fs::symlink(d.join("other/f"), d.join("other/plain")).unwrap();
        let resolver = Resolver {
            written: Arc::new([d.join("ws"), d.join("box/inner")].into_iter().collect()),
            overflowed: false,
        };
        let hidden = [d.join("state")];
        let read = |p: &Path| resolver.read_outside_a_view(p, &hidden);
        use OutsideAView::*;
        assert_eq!(read(&d.join("other/f")), Same, "nothing near it");
        assert_eq!(read(&d.join("other/plain")), Same, "a link nowhere near");
        assert_eq!(read(&d.join("ws/in")), SameWithoutSymlinks, "inside");
        assert_eq!(
            read(&d.join("box")),
            SameWithoutSymlinks,
            "holds a writable one"
        );
        assert_eq!(read(&d), Differs, "holds a hidden path");
        assert_eq!(
            read(&d.join("ws/link")),
            Differs,
            "a link a sandbox could swap"
        );
        assert_eq!(read(&d.join("other/into-ws")), Differs, "lands inside");
        assert_eq!(read(&d.join("other/via-ws")), Differs, "passes through");
        assert_eq!(read(&d.join("state/run")), Differs, "hidden");
        assert_eq!(
            read(Path::new("/proc/self/environ")),
            Differs,
            "the kernel's own"
        );
        assert_eq!(read(&d.join("none")), Differs, "cannot be resolved");
        assert_eq!(read(Path::new("relative")), Differs, "not absolute");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn resolves_as_realpath_and_names_each_link() {
        let d = std::env::temp_dir().join(format!("sbx-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("real/sub")).unwrap();
        std::os::unix::fs::symlink("real", d.join("rel")).unwrap();
        std::os::unix::fs::symlink(d.join("rel/sub"), d.join("abs")).unwrap();
        std::fs::write(d.join("f"), "").unwrap();
        let d = std::fs::canonicalize(&d).unwrap();
        let r = resolve(&d.join("abs/../sub/./")).unwrap();
        assert_eq!(
            r.canonical,
            std::fs::canonicalize(d.join("abs/../sub")).unwrap()
        );
        assert_eq!(r.links, vec![d.join("abs"), d.join("rel")]);
        assert_eq!(
            resolve(&d.join("real")).unwrap().links,
            Vec::<PathBuf>::new()
        );
        let kind = |p: &str| resolve(&d.join(p)).unwrap_err().kind();
        assert_eq!(kind("none/x"), std::io::ErrorKind::NotFound);
        assert_eq!(kind("f/x"), std::io::ErrorKind::NotADirectory);
        std::os::unix::fs::symlink(d.join("loop"), d.join("loop")).unwrap();
        assert_eq!(
            resolve(&d.join("loop")).unwrap_err().raw_os_error(),
            Some(libc::ELOOP)
        );

        // A link inside a writable root of the policy is distrusted.
        let resolver = Resolver {
            written: Arc::default(),
            overflowed: false,
        };
        let r = resolve(&d.join("abs")).unwrap();
        assert!(resolver.check(&r, &[PathBuf::from("/")]).is_ok());
        let e = resolver.check(&r, std::slice::from_ref(&d)).unwrap_err();
        assert_eq!((e.link, e.writable), (d.join("abs"), d.clone()));
        // ... and so is one inside a directory another view wrote.
        let recorded = Resolver {
            written: Arc::new(BTreeSet::from([d.clone()])),
            overflowed: false,
        };
        assert!(recorded.check(&r, &[]).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
