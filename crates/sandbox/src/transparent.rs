//! Transparent TCP for a proxy-routed sandbox (`networkProxy.proxy.transparentTcp`,
//! `--linux-sandbox-transparent-tcp`): a program that ignores the proxy
//! variables and `connect()`s a TCP socket to any non-loopback address is
//! carried through the executor's SOCKS5 listener, so the proxy's policy
//! decides it by destination IP.
//!
//! # How
//!
//! A seccomp filter with a user-notification listener
//! (`SECCOMP_FILTER_FLAG_NEW_LISTENER`, Linux 5.9+) stops every `connect()`
//! of the command and its descendants and hands it to a supervisor thread in
//! the bridge process (forked before the filter, so not subject to it):
//!
//! 1. it reads the destination `sockaddr` from `/proc/PID/mem` and the
//!    socket's type through `pidfd_getfd` (same user inside the sandbox's user
//!    namespace: no capability needed);
//! 2. anything but a TCP socket connecting to a non-loopback IPv4/IPv6
//!    address is let through unchanged (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`):
//!    Unix sockets, the loopback bridge ports of the proxy variables, UDP;
//! 3. otherwise it opens the proxy's transparent SOCKS socket (bound into the
//!    sandbox), asks `CONNECT ip:port`; a refusal makes the program's
//!    `connect()` fail with `ECONNREFUSED` (`EHOSTUNREACH`/`ENETUNREACH` for
//!    an unreachable destination);
//! 4. on success it connects a fresh TCP socket to its own loopback relay,
//!    puts it in place of the program's socket (`SECCOMP_IOCTL_NOTIF_ADDFD`
//!    with `SETFD`, keeping `O_NONBLOCK` and close-on-exec) and makes
//!    `connect()` return 0; the relay copies bytes to the SOCKS stream.
//!
//! # Why it fails closed
//!
//! The sandbox's private network namespace holds only a loopback: whatever
//! the supervisor lets through, cannot read, or misses (a supervisor that died
//! makes `connect()` fail with `ENOSYS`; an address swapped after it was read
//! is still confined to that loopback) reaches nothing outside. The
//! supervisor only adds a way out, and that way is the policy-checked proxy.
//! If the filter cannot be installed or the listener handed over, the command
//! never starts (the inner stage exits 101).
//!
//! # Limits
//!
//! - No name resolution inside: a program must connect to an IP address (the
//!   proxy's policy therefore matches the IP literal).
//! - Socket options set before `connect()` are lost with the replaced socket;
//!   an IPv6 socket is replaced by an IPv4 one (the relay is on 127.0.0.1).
//! - A non-blocking `connect()` blocks for the policy decision.
//! - TCP Fast Open (`sendto` with `MSG_FASTOPEN`) and x32 calls are not
//!   intercepted (they fail in the namespace).

use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// File name of the proxy's transparent SOCKS5 socket in the route directory.
pub const SOCKET: &str = "tcp.sock";
/// Connections carried at once; more fail with `ECONNREFUSED`: 512.
pub const MAX_CONNECTIONS: usize = 512;
/// Foreign connections to the relay skipped while pairing one: 64.
const MAX_STRANGERS: usize = 64;
/// Longest the SOCKS5 exchange (including the policy decision) may take: 5 min.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(300);

/// Oldest kernel with everything used here (`SECCOMP_IOCTL_NOTIF_ADDFD`): 5.9.
pub const MIN_KERNEL: (u32, u32) = (5, 9);

/// Whether this kernel is new enough ([`MIN_KERNEL`], from `uname`). Where it
/// is not, a transparent start fails closed (exit 101) rather than run.
pub fn supported() -> bool {
    // SAFETY: utsname is plain data uname fills.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::uname(&mut u) } != 0 {
        return false;
    }
    // SAFETY: uname NUL-terminates the release.
    let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) };
    kernel_at_least(&release.to_string_lossy(), MIN_KERNEL)
}

fn kernel_at_least(release: &str, (major, minor): (u32, u32)) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (a, b) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

/// Installs the `connect()`-notifying filter on the calling (single-threaded)
/// process and returns its listener. `PR_SET_NO_NEW_PRIVS` must be set
/// already (the main filter sets it). Errors: the kernel's (no user
/// notification support, or a listener already installed).
pub fn install_filter() -> std::io::Result<OwnedFd> {
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    let ins = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let prog = [
        ins(LD_W_ABS, 0, 0, 4), // seccomp_data.arch
        ins(JEQ_K, 1, 0, AUDIT_ARCH),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW), // foreign ABI: the main filter kills it
        ins(LD_W_ABS, 0, 0, 0),                    // seccomp_data.nr
        ins(JEQ_K, 0, 1, libc::SYS_connect as u32),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_USER_NOTIF),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: the program outlives the call; the kernel copies it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &fprog as *const libc::sock_fprog,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor the kernel gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Serves the notifications of `listener` until it fails (the sandbox ended);
/// `socks` is the proxy's transparent SOCKS5 socket, pinned.
pub fn supervise(listener: OwnedFd, socks: crate::pinned::PinnedSocket) {
    let Ok(relay) = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)) else {
        return;
    };
    let sup = Arc::new(Supervisor {
        listener,
        socks,
        relay: Mutex::new(relay),
        live: AtomicUsize::new(0),
    });
    loop {
        // SAFETY: seccomp_notif is plain data the kernel fills (it must be zeroed).
        let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        // SAFETY: RECV writes one seccomp_notif into req.
        let r = unsafe {
            libc::ioctl(
                sup.listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_RECV,
                &mut req,
            )
        };
        if r < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                // Interrupted, or the caller died before we read it.
                Some(libc::EINTR) | Some(libc::ENOENT) => continue,
                _ => return,
            }
        }
        if sup.live.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            sup.live.fetch_sub(1, Ordering::SeqCst);
            sup.respond(req.id, -libc::ECONNREFUSED, false);
            continue;
        }
        let s = sup.clone();
        let spawned = std::thread::Builder::new().spawn(move || {
            s.handle(&req);
            s.live.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            sup.live.fetch_sub(1, Ordering::SeqCst);
            sup.respond(req.id, -libc::ECONNREFUSED, false);
        }
    }
}

struct Supervisor {
    listener: OwnedFd,
    socks: crate::pinned::PinnedSocket,
    /// Held while a relay pair is made, so each accept gets its own connect.
    relay: Mutex<TcpListener>,
    live: AtomicUsize,
}

/// What one intercepted `connect()` is.
struct Call {
    pid: u32,
    fd: RawFd,
    dest: SocketAddr,
}

impl Supervisor {
    fn handle(&self, req: &libc::seccomp_notif) {
        let Some(call) = self.inspect(req) else {
            // Not ours to carry: the kernel runs it in the namespace.
            self.respond(req.id, 0, true);
            return;
        };
        let stream = match socks_connect(&self.socks, call.dest) {
            Ok(s) => s,
            Err(errno) => {
                self.respond(req.id, -errno, false);
                return;
            }
        };
        let Some((client, server)) = self.relay_pair() else {
            self.respond(req.id, -libc::ECONNREFUSED, false);
            return;
        };
        let (nonblock, cloexec) = fd_flags(call.pid, call.fd);
        if nonblock {
            let _ = client.set_nonblocking(true);
        }
        let add = libc::seccomp_notif_addfd {
            id: req.id,
            flags: libc::SECCOMP_ADDFD_FLAG_SETFD as u32,
            srcfd: client.as_raw_fd() as u32,
            newfd: call.fd as u32,
            newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
        };
        // SAFETY: ADDFD reads one seccomp_notif_addfd.
        let r = unsafe {
            libc::ioctl(
                self.listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_ADDFD,
                &add,
            )
        };
        if r < 0 {
            self.respond(req.id, -libc::ECONNREFUSED, false);
            return;
        }
        drop(client);
        self.respond(req.id, 0, false);
        crate::carry::carry(server, stream);
    }

    /// The call when it is a TCP connect to a non-loopback IP address.
    fn inspect(&self, req: &libc::seccomp_notif) -> Option<Call> {
        if i64::from(req.data.nr) != libc::SYS_connect {
            return None;
        }
        let fd = RawFd::try_from(req.data.args[0]).ok()?;
        let len = usize::try_from(req.data.args[2]).ok()?.min(128);
        let mut buf = [0u8; 128];
        let mem = File::open(format!("/proc/{}/mem", req.pid)).ok()?;
        let n = mem.read_at(&mut buf[..len], req.data.args[1]).ok()?;
        // The pid could have been reused between RECV and the read.
        if !self.valid(req.id) {
            return None;
        }
        let dest = parse_sockaddr(&buf[..n])?;
        if dest.ip().is_loopback() || dest.ip().is_unspecified() {
            return None;
        }
        if !unconnected_stream(req.pid, fd) {
            return None;
        }
        Some(Call {
            pid: req.pid,
            fd,
            dest,
        })
    }

    fn valid(&self, id: u64) -> bool {
        // SAFETY: ID_VALID reads one u64.
        unsafe {
            libc::ioctl(
                self.listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_ID_VALID,
                &id,
            ) == 0
        }
    }

    fn respond(&self, id: u64, error: i32, cont: bool) {
        let resp = libc::seccomp_notif_resp {
            id,
            val: 0,
            error,
            flags: if cont {
                libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32
            } else {
                0
            },
        };
        // SAFETY: SEND reads one seccomp_notif_resp. A failure means the
        // caller is gone (ENOENT): nothing to do.
        unsafe {
            libc::ioctl(
                self.listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_SEND,
                &resp,
            )
        };
    }

    /// A connected loopback TCP pair: (the end given to the program, ours).
    /// The relay port is reachable from inside the sandbox too: a connection
    /// that is not our own is dropped (at most [`MAX_STRANGERS`] per pair).
    fn relay_pair(&self) -> Option<(TcpStream, TcpStream)> {
        let relay = self.relay.lock().ok()?;
        let client = TcpStream::connect(relay.local_addr().ok()?).ok()?;
        let ours = client.local_addr().ok()?;
        for _ in 0..=MAX_STRANGERS {
            let (server, peer) = relay.accept().ok()?;
            if peer == ours {
                let _ = server.set_nodelay(true);
                return Some((client, server));
            }
        }
        None
    }
}

/// Parses a `sockaddr_in`/`sockaddr_in6` (IPv4-mapped IPv6 as IPv4).
fn parse_sockaddr(b: &[u8]) -> Option<SocketAddr> {
    let family = i32::from(u16::from_ne_bytes(b.get(0..2)?.try_into().ok()?));
    let port = u16::from_be_bytes(b.get(2..4)?.try_into().ok()?);
    match family {
        libc::AF_INET => {
            let ip: [u8; 4] = b.get(4..8)?.try_into().ok()?;
            Some(SocketAddr::new(IpAddr::V4(ip.into()), port))
        }
        libc::AF_INET6 => {
            let ip: [u8; 16] = b.get(8..24)?.try_into().ok()?;
            let ip = Ipv6Addr::from(ip);
            let ip = match ip.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(ip),
            };
            Some(SocketAddr::new(ip, port))
        }
        _ => None,
    }
}

/// Whether `fd` of thread `tid` is a stream (TCP) socket not yet connected
/// (a second `connect()` on a carried socket must get the kernel's
/// `EISCONN`, not a new connection).
fn unconnected_stream(tid: u32, fd: RawFd) -> bool {
    // pidfd_open takes a process, not a thread (before Linux 6.9); the
    // descriptor table is the process's.
    let Some(pid) = thread_group(tid) else {
        return false;
    };
    // SAFETY: plain syscalls; each returned descriptor is owned at once.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0);
        if pidfd < 0 {
            return false;
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd as RawFd);
        let dup = libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0);
        if dup < 0 {
            return false;
        }
        let dup = OwnedFd::from_raw_fd(dup as RawFd);
        let mut ty: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        let stream = libc::getsockopt(
            dup.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut ty as *mut libc::c_int).cast(),
            &mut len,
        ) == 0
            && ty == libc::SOCK_STREAM;
        let mut peer: libc::sockaddr_storage = std::mem::zeroed();
        let mut plen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let connected = libc::getpeername(
            dup.as_raw_fd(),
            (&mut peer as *mut libc::sockaddr_storage).cast(),
            &mut plen,
        ) == 0;
        stream && !connected
    }
}

/// The process (thread group) of thread `tid`, from its status file.
fn thread_group(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))?
        .trim()
        .parse()
        .ok()
}

/// (`O_NONBLOCK`, close-on-exec) of `fd` in `pid`, from its fdinfo.
fn fd_flags(pid: u32, fd: RawFd) -> (bool, bool) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap_or_default();
    let flags = text
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|v| i32::from_str_radix(v.trim(), 8).ok())
        .unwrap_or(0);
    (flags & libc::O_NONBLOCK != 0, flags & libc::O_CLOEXEC != 0)
}

/// SOCKS5 `CONNECT dest` over the proxy's socket; `Err(errno)` for the
/// program's `connect()` when refused or unreachable.
fn socks_connect(socks: &crate::pinned::PinnedSocket, dest: SocketAddr) -> Result<UnixStream, i32> {
    let refused = |_| libc::ECONNREFUSED;
    let mut s = socks.connect().map_err(refused)?;
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(refused)?;
    let mut req = vec![5, 1, 0, 5, 1, 0];
    match dest.ip() {
        IpAddr::V4(v4) => {
            req.push(1);
            req.extend_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            req.push(4);
            req.extend_from_slice(&v6.octets());
        }
    }
    req.extend_from_slice(&dest.port().to_be_bytes());
    s.write_all(&req).map_err(refused)?;
    let mut head = [0u8; 2 + 4];
    s.read_exact(&mut head).map_err(refused)?;
    if head[..2] != [5, 0] || head[2] != 5 {
        return Err(libc::ECONNREFUSED);
    }
    let rest = match head[5] {
        1 => 4 + 2,
        4 => 16 + 2,
        _ => return Err(libc::ECONNREFUSED),
    };
    let mut bound = [0u8; 18];
    s.read_exact(&mut bound[..rest]).map_err(refused)?;
    match head[3] {
        0 => {
            s.set_read_timeout(None).map_err(refused)?;
            Ok(s)
        }
        3 => Err(libc::ENETUNREACH),
        4 => Err(libc::EHOSTUNREACH),
        _ => Err(libc::ECONNREFUSED),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_compare() {
        assert!(kernel_at_least("6.18.44-fc-v669", (5, 9)));
        assert!(kernel_at_least("5.9.0", (5, 9)));
        assert!(!kernel_at_least("5.8.18-generic", (5, 9)));
        assert!(!kernel_at_least("4.19", (5, 9)));
        assert!(!kernel_at_least("garbage", (5, 9)));
    }

    #[test]
    fn sockaddrs_parse() {
        let mut v4 = vec![0u8; 16];
        v4[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v4[2..4].copy_from_slice(&5000u16.to_be_bytes());
        v4[4..8].copy_from_slice(&[8, 8, 4, 4]);
        assert_eq!(parse_sockaddr(&v4), Some("8.8.4.4:5000".parse().unwrap()));
        let mut v6 = vec![0u8; 28];
        v6[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        v6[2..4].copy_from_slice(&443u16.to_be_bytes());
        v6[8..24].copy_from_slice(&"::ffff:1.2.3.4".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(parse_sockaddr(&v6), Some("1.2.3.4:443".parse().unwrap()));
        v6[8..24].copy_from_slice(&Ipv6Addr::LOCALHOST.octets());
        assert!(parse_sockaddr(&v6).unwrap().ip().is_loopback());
        let mut unix = vec![0u8; 16];
        unix[0..2].copy_from_slice(&(libc::AF_UNIX as u16).to_ne_bytes());
        assert_eq!(parse_sockaddr(&unix), None);
        assert_eq!(parse_sockaddr(&v4[..6]), None, "short address");
    }
}
