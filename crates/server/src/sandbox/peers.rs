//! Recognising a connection that comes from inside one of this server's own
//! sandboxes, so the Unix listener can refuse it: a confined command that
//! reached this server's socket could otherwise start unconfined processes.
//!
//! Every confined start registers the process id of its first process
//! (bubblewrap, or the inner stage of a seccomp-only plan) while it runs. A
//! peer belongs to a sandbox when that process is among its ancestors. Inside
//! bubblewrap's PID namespace an orphan is re-parented to the namespace's
//! init, itself a child of the registered bubblewrap, so a double fork does
//! not break the chain. The peer is named by `SO_PEERCRED` and, where the
//! kernel has it (Linux 6.5+), pinned by `SO_PEERPIDFD`: a peer that is gone
//! by the end of the check (its id may have been reused) is refused too.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

/// Most ancestors walked from a peer: 256 (deeper trees are refused).
pub const MAX_ANCESTRY: usize = 256;
/// Walks retried when a process vanished mid-walk: 3.
const WALK_TRIES: usize = 3;
/// `SO_PEERPIDFD` (Linux 6.5+; not yet in every libc).
const SO_PEERPIDFD: libc::c_int = 77;

/// The live sandboxes' first process ids.
#[derive(Debug, Default)]
pub struct SandboxPids(Mutex<HashSet<u32>>);

/// Keeps `pid` registered until dropped (when its process has exited).
#[derive(Debug)]
pub struct Registration {
    set: Arc<SandboxPids>,
    pid: u32,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut s) = self.set.0.lock() {
            s.remove(&self.pid);
        }
    }
}

/// Why a peer is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not from a sandbox of this server.
    Outside,
    /// From inside one of this server's sandboxes.
    Sandboxed,
    /// Cannot be told (no peer credentials, the peer or an ancestor vanished,
    /// a chain deeper than [`MAX_ANCESTRY`]): refused, failing closed.
    Unknown,
}

impl SandboxPids {
    /// Registers the first process of a sandbox.
    pub fn register(self: &Arc<Self>, pid: u32) -> Registration {
        if let Ok(mut s) = self.0.lock() {
            s.insert(pid);
        }
        Registration {
            set: self.clone(),
            pid,
        }
    }

    fn contains(&self, pid: u32) -> bool {
        self.0.lock().is_ok_and(|s| s.contains(&pid))
    }

    /// Judges the peer of the connected Unix socket `fd`.
    pub fn judge(&self, fd: RawFd) -> Verdict {
        if self.0.lock().is_ok_and(|s| s.is_empty()) {
            // No sandbox runs: nobody to walk up to.
            return Verdict::Outside;
        }
        let Some(pid) = peer_pid(fd) else {
            return Verdict::Unknown;
        };
        let pidfd = peer_pidfd(fd);
        let mut verdict = Verdict::Unknown;
        for _ in 0..WALK_TRIES {
            verdict = self.walk(pid);
            if verdict != Verdict::Unknown {
                break;
            }
        }
        if verdict == Verdict::Outside && pidfd.as_ref().is_some_and(|p| !alive(p)) {
            return Verdict::Unknown;
        }
        verdict
    }

    fn walk(&self, mut pid: u32) -> Verdict {
        let me = std::process::id();
        for _ in 0..MAX_ANCESTRY {
            if self.contains(pid) {
                return Verdict::Sandboxed;
            }
            if pid <= 1 || pid == me {
                return Verdict::Outside;
            }
            match parent_of(pid) {
                Some(p) => pid = p,
                None => return Verdict::Unknown,
            }
        }
        Verdict::Unknown
    }
}

impl SandboxPids {
    /// Judges a TCP connection accepted on `local` from `peer`. Only a
    /// sandbox sharing the host's network (`network: enabled`) can reach a
    /// host listener directly: the connecting socket is found in this
    /// network namespace's `/proc/net/tcp{,6}`; it is
    /// [`Verdict::Outside`] only when a process outside every live sandbox
    /// holds it, [`Verdict::Sandboxed`] when a sandbox's process does, and
    /// [`Verdict::Unknown`] when nobody does (a socket in flight in an
    /// `SCM_RIGHTS` message, to be taken back after the check: refused). A
    /// peer on another machine is `Outside`; so is every peer while no
    /// sandbox runs.
    pub fn judge_tcp(&self, local: SocketAddr, peer: SocketAddr) -> Verdict {
        match self.0.lock() {
            Ok(s) if s.is_empty() => return Verdict::Outside,
            Ok(_) => {}
            Err(_) => return Verdict::Unknown,
        }
        let Some(inode) = socket_inode(peer, local) else {
            return Verdict::Outside;
        };
        let needle = format!("socket:[{inode}]");
        let holds = |pid: u32| {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| {
                    std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == needle.as_str())
                })
        };
        // Every holder is judged by its ancestry (a fresh fork of a
        // sandboxed holder is still below its sandbox's root).
        let mut outside = false;
        for pid in std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        {
            if !holds(pid) {
                continue;
            }
            match self.walk(pid) {
                Verdict::Outside => outside = true,
                _ => return Verdict::Sandboxed,
            }
        }
        match outside {
            true => Verdict::Outside,
            false => Verdict::Unknown,
        }
    }
}

/// The inode of this namespace's TCP socket bound to `local` and connected
/// to `remote`, from `/proc/net/tcp` or `/proc/net/tcp6`.
fn socket_inode(local: SocketAddr, remote: SocketAddr) -> Option<u64> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .find_map(|table| {
            let text = std::fs::read_to_string(table).ok()?;
            text.lines().skip(1).find_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let (l, r, inode) = (f.get(1)?, f.get(2)?, f.get(9)?);
                (parse_proc_addr(l)? == local && parse_proc_addr(r)? == remote)
                    .then(|| inode.parse().ok())
                    .flatten()
            })
        })
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6): the address
/// words as the kernel holds them, in this host's byte order.
fn parse_proc_addr(field: &str) -> Option<SocketAddr> {
    let (ip, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |h: &str| u32::from_str_radix(h, 16).ok().map(u32::to_ne_bytes);
    let ip: IpAddr = match ip.len() {
        8 => Ipv4Addr::from(word(ip)?).into(),
        32 => {
            let mut b = [0u8; 16];
            for (i, chunk) in b.chunks_mut(4).enumerate() {
                chunk.copy_from_slice(&word(ip.get(i * 8..i * 8 + 8)?)?);
            }
            let v6 = Ipv6Addr::from(b);
            // A v4 peer on a dual-stack socket shows as ::ffff:a.b.c.d.
            v6.to_ipv4_mapped()
                .map(IpAddr::V4)
                .unwrap_or(IpAddr::V6(v6))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// The parent of `pid` (`/proc/<pid>/stat`).
fn parent_of(pid: u32) -> Option<u32> {
    let pid = i32::try_from(pid).ok()?;
    exec_server_sysio::procfs::parent_of(pid).and_then(|p| u32::try_from(p).ok())
}

fn peer_pid(fd: RawFd) -> Option<u32> {
    // SAFETY: ucred is plain data; getsockopt writes at most `len` bytes.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0 && cred.pid > 0).then_some(cred.pid as u32)
}

fn peer_pidfd(fd: RawFd) -> Option<OwnedFd> {
    let mut pidfd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes one int.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut pidfd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    // SAFETY: a fresh descriptor the kernel gave us.
    (r == 0 && pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) })
}

/// Whether the process of `pidfd` still runs (signal 0 reaches it).
fn alive(pidfd: &OwnedFd) -> bool {
    // SAFETY: pidfd_send_signal with signal 0 only checks.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        ) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_registered_peer_is_sandboxed_until_unregistered() {
        let pids = Arc::new(SandboxPids::default());
        // The peer of a socketpair is this very process.
        let (ours, _theirs) = UnixStream::pair().unwrap();
        assert_eq!(pids.judge(ours.as_raw_fd()), Verdict::Outside);
        let reg = pids.register(std::process::id());
        assert_eq!(pids.judge(ours.as_raw_fd()), Verdict::Sandboxed);
        drop(reg);
        assert_eq!(pids.judge(ours.as_raw_fd()), Verdict::Outside);
    }

    #[test]
    fn a_loopback_connection_is_found_and_judged_by_who_holds_it() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_server, peer) = l.accept().unwrap();
        let local = l.local_addr().unwrap();
        assert_eq!(
            parse_proc_addr("0100007F:1F90"),
            Some("127.0.0.1:8080".parse().unwrap())
        );
        assert!(
            socket_inode(peer, local).is_some(),
            "the client's socket is listed"
        );
        let pids = Arc::new(SandboxPids::default());
        assert_eq!(pids.judge_tcp(local, peer), Verdict::Outside, "no sandbox");
        // This process holds the client socket: registered, it is "inside".
        let reg = pids.register(std::process::id());
        assert_eq!(pids.judge_tcp(local, peer), Verdict::Sandboxed);
        drop(reg);
        drop(client);
    }

    /// A socket in flight (sent with SCM_RIGHTS, its sender's copy closed)
    /// is held by nobody: it cannot be told apart from a sandbox's, refused.
    #[test]
    fn a_socket_nobody_holds_is_refused_while_sandboxes_run() {
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_server, peer) = l.accept().unwrap();
        let local = l.local_addr().unwrap();
        let (tx, _rx) = UnixStream::pair().unwrap();
        exec_server_sysio::fd_pass::send_with_fds(tx.as_raw_fd(), b"x", &[client.as_raw_fd()])
            .unwrap();
        drop(client);
        let pids = Arc::new(SandboxPids::default());
        assert_eq!(
            pids.judge_tcp(local, peer),
            Verdict::Outside,
            "no sandbox runs"
        );
        let _reg = pids.register(u32::MAX - 1);
        assert_eq!(pids.judge_tcp(local, peer), Verdict::Unknown);
    }

    #[test]
    fn parent_parsing_survives_odd_names() {
        assert_eq!(
            parent_of(std::process::id()),
            Some(std::os::unix::process::parent_id())
        );
    }
}
