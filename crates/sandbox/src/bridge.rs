//! The in-namespace half of a proxy-routed sandbox (`enforceManagedNetwork`):
//! a small forwarder, forked by the inner stage before it installs the
//! filter and execs the command, that listens on `127.0.0.1:PORT` inside the
//! sandbox's own network namespace and carries each connection to the
//! executor's proxy over a Unix socket bound into the sandbox. The child's
//! proxy variables name the same port numbers as the proxy outside, so they
//! need no rewriting. Nothing else leaves the namespace.
//!
//! The forwarder dies with the command: the sandbox's PID namespace ends when
//! the command does, and it also asks for `SIGKILL` when its parent goes.
//!
//! It reaches the proxy only through sockets it opened before the command
//! ran ([`PinnedSocket`]): renaming something over a socket's name inside
//! the sandbox cannot send a connection anywhere else.

use crate::pinned::PinnedSocket;
use crate::plan::{ProxyRoute, PROXY_DIR_INSIDE};

use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Prefix of the inner stage's mode argument for a routed sandbox.
pub const MODE_PREFIX: &str = "proxyrouted:";
/// Prefix of the mode argument for a routed sandbox with transparent TCP
/// ([`crate::transparent`]).
pub const MODE_PREFIX_TCP: &str = "proxyrouted-tcp:";
/// Connections carried at once; further ones are closed at accept: 512.
pub const MAX_CONNECTIONS: usize = 512;

/// The flag in a mode argument that keeps `socket(AF_UNIX)` allowed
/// ([`ProxyRoute::allow_all_unix_sockets`]).
pub const ALL_UNIX_FLAG: &str = "all-unix";

/// The inner stage's mode argument for `route`:
/// `proxyrouted:[all-unix,]PORT=PATH[,PORT=PATH]` (`proxyrouted-tcp:…` with
/// [`ProxyRoute::transparent`]), paths as seen inside.
pub fn inner_mode(route: &ProxyRoute) -> String {
    let mut pairs: Vec<String> = Vec::new();
    if route.allow_all_unix_sockets {
        pairs.push(ALL_UNIX_FLAG.to_string());
    }
    pairs.extend(
        route
            .ports
            .iter()
            .map(|(port, name)| format!("{port}={PROXY_DIR_INSIDE}/{name}")),
    );
    let prefix = if route.transparent {
        MODE_PREFIX_TCP
    } else {
        MODE_PREFIX
    };
    format!("{prefix}{}", pairs.join(","))
}

/// Where the transparent SOCKS socket is inside the sandbox.
pub fn transparent_socket() -> PathBuf {
    Path::new(PROXY_DIR_INSIDE).join(crate::transparent::SOCKET)
}

/// What a routed mode argument asks of the bridge and the filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Loopback port inside → the proxy's socket, as seen inside.
    pub routes: Vec<(u16, PathBuf)>,
    /// `socket(AF_UNIX)` stays allowed (`dangerouslyAllowAllUnixSockets`).
    pub allow_all_unix_sockets: bool,
}

/// Parses what follows [`MODE_PREFIX`]; `None` when malformed or without a
/// route.
pub fn parse(spec: &str) -> Option<Spec> {
    let mut out = Spec {
        routes: Vec::new(),
        allow_all_unix_sockets: false,
    };
    for item in spec.split(',') {
        if item == ALL_UNIX_FLAG {
            out.allow_all_unix_sockets = true;
            continue;
        }
        let (port, path) = item.split_once('=')?;
        out.routes.push((port.parse().ok()?, PathBuf::from(path)));
    }
    (!out.routes.is_empty()).then_some(out)
}

/// Binds every listener, then forks the forwarder; returns in the parent
/// once the ports are listening (so the command never races the bridge).
/// With `transparent` (the proxy's transparent SOCKS socket) the forwarder
/// also runs the [`crate::transparent`] supervisor, and the parent gets the
/// channel to hand it the filter's listener over ([`exec_server_sysio::fd_pass::send_fd`]).
/// Errors: a proxy socket that is missing, not a socket or not this user's
/// ([`PinnedSocket::open`]); a bind, socketpair or fork failure.
pub fn start(
    routes: &[(u16, PathBuf)],
    transparent: Option<PathBuf>,
) -> std::io::Result<Option<UnixStream>> {
    let pin = |path: &Path| {
        PinnedSocket::open(path).map_err(|e| {
            std::io::Error::new(e.kind(), format!("proxy socket {}: {e}", path.display()))
        })
    };
    let listeners = routes
        .iter()
        .map(|(port, path)| Ok((TcpListener::bind(("127.0.0.1", *port))?, pin(path)?)))
        .collect::<std::io::Result<Vec<_>>>()?;
    let transparent = transparent.as_deref().map(pin).transpose()?;
    let channel = match &transparent {
        Some(_) => Some(UnixStream::pair()?),
        None => None,
    };
    // SAFETY: the inner stage is single-threaded here; the child only runs
    // our own code (no locks held across the fork).
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        0 => {
            detach_stdio();
            // SAFETY: prctl with integer arguments. Not dumpable: the
            // command (same user, no filter on reading files) must not open
            // this unfiltered process's memory or descriptors through /proc.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
            }
            if let (Some(socks), Some((_, ours))) = (transparent, channel) {
                std::thread::spawn(move || {
                    if let Ok(listener) =
                        exec_server_sysio::fd_pass::recv_fd(std::os::fd::AsRawFd::as_raw_fd(&ours))
                    {
                        drop(ours);
                        crate::transparent::supervise(listener, socks);
                    }
                });
            }
            serve(listeners);
            std::process::exit(0)
        }
        _ => Ok(channel.map(|(theirs, _)| theirs)),
    }
}

/// The forwarder must not hold the command's output pipes open (the server
/// waits for their end).
fn detach_stdio() {
    // SAFETY: open/dup2/close on descriptors this process owns.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
            if null > 2 {
                libc::close(null);
            }
        }
    }
}

fn serve(listeners: Vec<(TcpListener, PinnedSocket)>) {
    let live = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = listeners
        .into_iter()
        .map(|(l, socket)| {
            let live = live.clone();
            std::thread::spawn(move || accept(l, Arc::new(socket), &live))
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

fn accept(l: TcpListener, socket: Arc<PinnedSocket>, live: &Arc<AtomicUsize>) {
    for conn in l.incoming() {
        let Ok(tcp) = conn else { continue };
        if live.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            live.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let socket = socket.clone();
        let live = live.clone();
        std::thread::spawn(move || {
            if let Ok(unix) = socket.connect() {
                crate::carry::carry(tcp, unix);
            }
            live.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_round_trip() {
        let r = ProxyRoute {
            host_dir: "/tmp/x".into(),
            ports: vec![(8080, "http.sock".into()), (1080, "socks.sock".into())],
            transparent: false,
            allow_all_unix_sockets: false,
        };
        let m = inner_mode(&r);
        assert_eq!(
            m,
            "proxyrouted:8080=/dev/exec-server-netproxy/http.sock,1080=/dev/exec-server-netproxy/socks.sock"
        );
        let p = parse(m.strip_prefix(MODE_PREFIX).unwrap()).unwrap();
        assert_eq!(
            p.routes[1],
            (1080, PathBuf::from("/dev/exec-server-netproxy/socks.sock"))
        );
        assert!(!p.allow_all_unix_sockets);
        assert!(parse("").is_none() && parse("x=/a").is_none() && parse("1").is_none());
        assert!(
            parse(ALL_UNIX_FLAG).is_none(),
            "a flag alone routes nothing"
        );
        let t = ProxyRoute {
            transparent: true,
            allow_all_unix_sockets: true,
            ..r
        };
        let m = inner_mode(&t);
        assert!(m.starts_with("proxyrouted-tcp:all-unix,8080="));
        let p = parse(m.strip_prefix(MODE_PREFIX_TCP).unwrap()).unwrap();
        assert!(p.allow_all_unix_sockets && p.routes.len() == 2);
    }
}
