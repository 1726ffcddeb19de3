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

use crate::plan::{ProxyRoute, PROXY_DIR_INSIDE};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
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

/// The inner stage's mode argument for `route`:
/// `proxyrouted:PORT=PATH[,PORT=PATH]` (`proxyrouted-tcp:…` with
/// [`ProxyRoute::transparent`]), paths as seen inside.
pub fn inner_mode(route: &ProxyRoute) -> String {
    let pairs: Vec<String> = route
        .ports
        .iter()
        .map(|(port, name)| format!("{port}={PROXY_DIR_INSIDE}/{name}"))
        .collect();
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

/// Parses what follows [`MODE_PREFIX`]; `None` when malformed or empty.
pub fn parse(spec: &str) -> Option<Vec<(u16, PathBuf)>> {
    let v: Option<Vec<_>> = spec
        .split(',')
        .map(|pair| {
            let (port, path) = pair.split_once('=')?;
            Some((port.parse().ok()?, PathBuf::from(path)))
        })
        .collect();
    v.filter(|v| !v.is_empty())
}

/// Binds every listener, then forks the forwarder; returns in the parent
/// once the ports are listening (so the command never races the bridge).
/// With `transparent` (the proxy's transparent SOCKS socket) the forwarder
/// also runs the [`crate::transparent`] supervisor, and the parent gets the
/// channel to hand it the filter's listener over ([`crate::transparent::send_fd`]).
/// Errors: a bind, socketpair or fork failure.
pub fn start(
    routes: &[(u16, PathBuf)],
    transparent: Option<PathBuf>,
) -> std::io::Result<Option<UnixStream>> {
    let listeners = routes
        .iter()
        .map(|(port, path)| Ok((TcpListener::bind(("127.0.0.1", *port))?, path.clone())))
        .collect::<std::io::Result<Vec<_>>>()?;
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
            // SAFETY: prctl with integer arguments.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
            if let (Some(socks), Some((_, ours))) = (transparent, channel) {
                std::thread::spawn(move || {
                    if let Ok(listener) = crate::transparent::recv_fd(&ours) {
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

fn serve(listeners: Vec<(TcpListener, PathBuf)>) {
    let live = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = listeners
        .into_iter()
        .map(|(l, path)| {
            let live = live.clone();
            std::thread::spawn(move || accept(l, &path, &live))
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

fn accept(l: TcpListener, path: &Path, live: &Arc<AtomicUsize>) {
    for conn in l.incoming() {
        let Ok(tcp) = conn else { continue };
        if live.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            live.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let path = path.to_path_buf();
        let live = live.clone();
        std::thread::spawn(move || {
            if let Ok(unix) = UnixStream::connect(&path) {
                carry(tcp, unix);
            }
            live.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// Copies both ways until both directions ended.
pub(crate) fn carry(tcp: TcpStream, unix: UnixStream) {
    let (Ok(tcp2), Ok(unix2)) = (tcp.try_clone(), unix.try_clone()) else {
        return;
    };
    let _ = tcp.set_nodelay(true);
    let up = std::thread::spawn(move || {
        pipe(&tcp2, &unix2);
        let _ = unix2.shutdown(Shutdown::Write);
    });
    pipe(&unix, &tcp);
    let _ = tcp.shutdown(Shutdown::Write);
    let _ = up.join();
}

fn pipe(mut from: impl Read, mut to: impl Write) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
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
        };
        let m = inner_mode(&r);
        assert_eq!(
            m,
            "proxyrouted:8080=/dev/exec-server-netproxy/http.sock,1080=/dev/exec-server-netproxy/socks.sock"
        );
        let p = parse(m.strip_prefix(MODE_PREFIX).unwrap()).unwrap();
        assert_eq!(
            p[1],
            (1080, PathBuf::from("/dev/exec-server-netproxy/socks.sock"))
        );
        assert!(parse("").is_none() && parse("x=/a").is_none() && parse("1").is_none());
        let t = ProxyRoute {
            transparent: true,
            ..r
        };
        assert!(inner_mode(&t).starts_with("proxyrouted-tcp:8080="));
    }
}
