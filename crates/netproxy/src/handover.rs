//! A proxy handed from one image of the server to the next (an upgrade):
//! the child keeps its proxy variables (the TCP ports), its sandbox keeps
//! its Unix sockets, and its trusted interception CA stays valid, because
//! the next image serves on the very same listening sockets with the same
//! CA key. Connections open at the upgrade end with the old image.

use crate::mitm::CaParts;
use std::os::fd::{OwnedFd, RawFd};
use std::path::Path;
use tokio::net::{TcpListener, UnixListener};

/// A proxy's listening sockets, by descriptor (valid while it lives).
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct ListenerFds {
    /// The HTTP listener (127.0.0.1).
    pub http: Option<RawFd>,
    /// The SOCKS5 listener (127.0.0.1).
    pub socks: Option<RawFd>,
    /// `http.sock` in the sandbox's directory.
    pub unix_http: Option<RawFd>,
    /// `socks.sock`.
    pub unix_socks: Option<RawFd>,
    /// `tcp.sock` (transparent TCP).
    pub unix_tcp: Option<RawFd>,
}

/// What the next image takes over: the listening sockets (owned now) and
/// the interception CA.
#[derive(Debug, Default)]
pub struct Inherited {
    /// The HTTP listener.
    pub http: Option<OwnedFd>,
    /// The SOCKS5 listener.
    pub socks: Option<OwnedFd>,
    /// `http.sock`.
    pub unix_http: Option<OwnedFd>,
    /// `socks.sock`.
    pub unix_socks: Option<OwnedFd>,
    /// `tcp.sock`.
    pub unix_tcp: Option<OwnedFd>,
    /// The interception CA, when the proxy masks credentials.
    pub ca: Option<CaParts>,
}

/// Which listener.
#[derive(Clone, Copy)]
pub(crate) enum Slot {
    Http,
    Socks,
    UnixHttp,
    UnixSocks,
    UnixTcp,
}

/// Where a starting proxy gets each listener: handed over, or bound now.
pub(crate) struct Listeners(Option<Inherited>);

impl Listeners {
    pub(crate) fn new(inherited: Option<Inherited>) -> Listeners {
        Listeners(inherited)
    }

    fn take(&mut self, slot: Slot) -> Option<OwnedFd> {
        let i = self.0.as_mut()?;
        match slot {
            Slot::Http => i.http.take(),
            Slot::Socks => i.socks.take(),
            Slot::UnixHttp => i.unix_http.take(),
            Slot::UnixSocks => i.unix_socks.take(),
            Slot::UnixTcp => i.unix_tcp.take(),
        }
    }

    /// The TCP listener of `slot`: handed over, or bound on 127.0.0.1 with
    /// an ephemeral port. Errors: the OS's.
    pub(crate) async fn tcp(&mut self, slot: Slot) -> std::io::Result<TcpListener> {
        match self.take(slot) {
            Some(fd) => {
                let l = std::net::TcpListener::from(fd);
                l.set_nonblocking(true)?;
                TcpListener::from_std(l)
            }
            None => TcpListener::bind(("127.0.0.1", 0)).await,
        }
    }

    /// The Unix listener of `slot`: handed over, or bound at `path`.
    /// Errors: the OS's.
    pub(crate) fn unix(&mut self, slot: Slot, path: &Path) -> std::io::Result<UnixListener> {
        match self.take(slot) {
            Some(fd) => {
                let l = std::os::unix::net::UnixListener::from(fd);
                l.set_nonblocking(true)?;
                UnixListener::from_std(l)
            }
            None => UnixListener::bind(path),
        }
    }
}
