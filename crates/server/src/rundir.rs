//! This server's private runtime directory: where per-process files that a
//! sandbox must reach (the managed proxy's sockets and CA bundle) live on the
//! host, and the one place to hide from every sandbox and to sweep.
//!
//! Layout: `$TMPDIR/exec-server-run-<euid>/` (mode 0700, owned by the
//! effective user; anything else there is refused) holds one directory per
//! running server, named by 12 random hex digits (names stay short: a Unix
//! socket's path must fit in 108 bytes), whose `.lock` that server holds with `flock`
//! for its whole life. The kernel drops the lock when the server dies, even
//! by `SIGKILL`, so a later server that can take it knows the owner is gone
//! and removes the directory ([`RuntimeDir::create`] sweeps at start).
//! Directories of the older layout (`$TMPDIR/exec-server-netproxy-<uuid>`)
//! are removed when none of their sockets answers.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Name of the lock file in each server's directory.
const LOCK: &str = ".lock";
/// Prefix of a server directory being made (renamed to its final name once
/// locked, so a sweep never sees an unlocked live one).
const NEW_PREFIX: &str = ".new-";
/// A half-made directory older than this is a crashed start: 10 min.
const STALE_NEW: Duration = Duration::from_secs(600);
/// Prefix of the per-process proxy directories of the older layout.
const LEGACY_PREFIX: &str = "exec-server-netproxy-";

/// One server's directory, removed (recursively) when dropped; its lock is
/// held until then.
#[derive(Debug)]
pub struct RuntimeDir {
    path: PathBuf,
    _lock: File,
}

impl RuntimeDir {
    /// The directory every server of this user shares:
    /// `$TMPDIR/exec-server-run-<euid>`.
    pub fn base() -> PathBuf {
        // SAFETY: geteuid cannot fail.
        let uid = unsafe { libc::geteuid() };
        std::env::temp_dir().join(format!("exec-server-run-{uid}"))
    }

    /// Makes this server's directory under `base` (created 0700 if absent),
    /// after removing those whose server is gone, and the older layout's
    /// dead directories in `base`'s parent.
    ///
    /// Errors: `base` is a symlink, not a directory, another user's, or open
    /// to group or others (`PermissionDenied`); creating or locking fails.
    pub fn create(base: &Path) -> std::io::Result<RuntimeDir> {
        ensure_private_dir(base)?;
        sweep(base);
        if let Some(parent) = base.parent() {
            sweep_legacy(parent);
        }
        let id = short_id();
        let new = base.join(format!("{NEW_PREFIX}{id}"));
        std::fs::DirBuilder::new().mode(0o700).create(&new)?;
        let lock = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(new.join(LOCK))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            let _ = std::fs::remove_dir_all(&new);
            return Err(e);
        }
        let path = base.join(&id);
        std::fs::rename(&new, &path)?;
        Ok(RuntimeDir { path, _lock: lock })
    }

    /// This server's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The descriptor holding its lock, which an upgrade keeps open across
    /// the `execve` (the lock then never lapses, so no sweep takes the
    /// directory meanwhile).
    pub fn lock_fd(&self) -> std::os::fd::RawFd {
        self._lock.as_raw_fd()
    }

    /// The directory a previous image of this process made and still
    /// locks through `lock` ([`RuntimeDir::lock_fd`]).
    pub fn adopt(path: PathBuf, lock: File) -> RuntimeDir {
        RuntimeDir { path, _lock: lock }
    }
}

/// The socket `exec-server upgrade` reaches the server with pid `pid`
/// through: `control-<pid>.sock` in `base` (this user's, mode 0700).
pub fn control_socket(base: &Path, pid: u32) -> PathBuf {
    base.join(format!("{CONTROL_PREFIX}{pid}.sock"))
}

/// The pids of the servers with a control socket in `base`.
pub fn control_sockets(base: &Path) -> Vec<(u32, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let pid = name
                .to_str()?
                .strip_prefix(CONTROL_PREFIX)?
                .strip_suffix(".sock")?
                .parse()
                .ok()?;
            Some((pid, e.path()))
        })
        .collect()
}

const CONTROL_PREFIX: &str = "control-";

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// 12 random hex digits (48 bits): a short name, unique enough for the few
/// entries of one directory (a clash fails the create, never shares).
pub fn short_id() -> String {
    let v = uuid::Uuid::new_v4().as_u128();
    format!("{:012x}", v & 0xffff_ffff_ffff)
}

fn ensure_private_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != me || meta.permissions().mode() & 0o077 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "refusing the runtime directory {}: it must be a directory of uid {me} with mode 0700",
                dir.display()
            ),
        ));
    }
    Ok(())
}

/// Removes the directories under `base` whose server is gone.
fn sweep(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let dead = if let Some(pid) = name
            .strip_prefix(CONTROL_PREFIX)
            .and_then(|n| n.strip_suffix(".sock"))
        {
            // A control socket lives as long as its server's pid.
            !Path::new("/proc").join(pid).exists()
        } else if name.starts_with(NEW_PREFIX) {
            entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_NEW)
        } else {
            owner_gone(&path)
        };
        if dead {
            tracing::info!("removing {} (its server is gone)", path.display());
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::remove_dir_all(&path);
            } else {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// True when `dir`'s lock can be taken (its holder is gone) or it has none.
fn owner_gone(dir: &Path) -> bool {
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dir.join(LOCK));
    match lock {
        // SAFETY: flock on a descriptor we own; dropping it releases the lock.
        Ok(f) => unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 },
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// Removes this user's `exec-server-netproxy-*` directories in `tmp` where no
/// socket answers (their server is gone).
fn sweep_legacy(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    for entry in entries.flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .starts_with(LEGACY_PREFIX)
        {
            continue;
        }
        let path = entry.path();
        let ours = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir() && m.uid() == me);
        if !ours {
            continue;
        }
        let live = std::fs::read_dir(&path)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                e.file_type().is_ok_and(|t| {
                    use std::os::unix::fs::FileTypeExt;
                    t.is_socket()
                }) && std::os::unix::net::UnixStream::connect(e.path()).is_ok()
            });
        if !live {
            tracing::info!("removing {} (its server is gone)", path.display());
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rundir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_dead_servers_directory_is_swept_and_a_live_one_kept() {
        let tmp = scratch("sweep");
        let base = tmp.join("run");
        let live = RuntimeDir::create(&base).unwrap();
        std::fs::write(live.path().join("big"), vec![0u8; 4096]).unwrap();
        // A crashed server: its lock file exists, nobody holds it.
        let dead = base.join("dead");
        std::fs::create_dir_all(dead.join("netproxy-x")).unwrap();
        std::fs::write(dead.join(LOCK), "").unwrap();
        std::fs::write(dead.join("netproxy-x/file"), "junk").unwrap();
        // The older layout, no socket answering.
        let legacy = tmp.join(format!("{LEGACY_PREFIX}1234"));
        std::fs::create_dir_all(&legacy).unwrap();
        std::fs::write(legacy.join("ca.pem"), "x").unwrap();
        let second = RuntimeDir::create(&base).unwrap();
        assert!(!dead.exists(), "the dead server's directory is gone");
        assert!(
            !legacy.exists(),
            "the older layout's dead directory is gone"
        );
        assert!(live.path().join("big").exists(), "a live server's is kept");
        let kept = live.path().to_path_buf();
        drop(live);
        assert!(!kept.exists(), "removed recursively when dropped");
        drop(second);
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn refuses_a_base_open_to_others() {
        let tmp = scratch("mode");
        let base = tmp.join("run");
        std::fs::create_dir(&base).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = RuntimeDir::create(&base).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
