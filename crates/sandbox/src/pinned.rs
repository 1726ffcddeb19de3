//! A Unix socket pinned by descriptor: the bridge's only way to the proxy.
//!
//! Why: the proxy's sockets are reached through a directory the sandbox can
//! see. A path is looked up again at every `connect()`, so whoever can change
//! that directory (a rename, a symlink swapped in) chooses where the next
//! connection goes — e.g. a host daemon's socket. The bridge therefore opens
//! each socket once, before the command runs, as an `O_PATH` descriptor whose
//! inode it checks (a socket, owned by this user), and connects through
//! `/proc/self/fd/N`, which names that inode and no path. The directory is
//! also mounted read-only; this holds even where it were not.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// A socket file opened once; every [`PinnedSocket::connect`] reaches the
/// same inode whatever later happens to its name.
#[derive(Debug)]
pub struct PinnedSocket {
    fd: OwnedFd,
    /// For messages only.
    path: PathBuf,
}

impl PinnedSocket {
    /// Opens `path` without following a final symlink and checks that it is a
    /// socket owned by the effective user.
    ///
    /// Errors: the open's (`ENOENT`); `PermissionDenied` for anything but a
    /// socket of this user (a final symlink is opened as itself, so it is
    /// refused here too).
    pub fn open(path: &Path) -> std::io::Result<PinnedSocket> {
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: open(2) of a NUL-terminated path; the result is checked.
        let raw = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: fstat fills a plain struct; O_PATH descriptors allow it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        if st.st_mode & libc::S_IFMT != libc::S_IFSOCK || st.st_uid != me {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "{} is not a socket of this user (mode {:o}, owner {})",
                    path.display(),
                    st.st_mode,
                    st.st_uid
                ),
            ));
        }
        Ok(PinnedSocket {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// A new connection to the pinned socket. Needs `/proc` mounted (it is,
    /// in every sandbox bubblewrap builds here).
    pub fn connect(&self) -> std::io::Result<UnixStream> {
        UnixStream::connect(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// The path it was opened at (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sbx-pinned-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn echo_once(l: UnixListener, tag: &'static [u8]) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                let _ = s.write_all(tag);
            }
        })
    }

    #[test]
    fn a_renamed_over_name_does_not_redirect() {
        let d = dir("swap");
        let real = d.join("http.sock");
        let decoy = d.join("decoy.sock");
        let real_l = UnixListener::bind(&real).unwrap();
        let decoy_l = UnixListener::bind(&decoy).unwrap();
        let pinned = PinnedSocket::open(&real).unwrap();
        // The attack: a symlink to another socket renamed over the name.
        std::os::unix::fs::symlink(&decoy, d.join("link")).unwrap();
        std::fs::rename(d.join("link"), &real).unwrap();
        let t = echo_once(real_l, b"real");
        let mut s = pinned.connect().unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"real");
        t.join().unwrap();
        drop(decoy_l);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn refuses_symlinks_and_non_sockets() {
        let d = dir("kinds");
        let sock = d.join("s.sock");
        let _l = UnixListener::bind(&sock).unwrap();
        std::os::unix::fs::symlink(&sock, d.join("link")).unwrap();
        std::fs::write(d.join("file"), "x").unwrap();
        // O_PATH | O_NOFOLLOW opens the link itself, which is no socket.
        let link = PinnedSocket::open(&d.join("link")).unwrap_err();
        assert_eq!(link.kind(), std::io::ErrorKind::PermissionDenied);
        let file = PinnedSocket::open(&d.join("file")).unwrap_err();
        assert_eq!(file.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(PinnedSocket::open(&sock).is_ok());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
