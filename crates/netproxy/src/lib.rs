//! `exec-server-netproxy`: the executor-local managed network proxy
//! (SANDBOX.md §3). One [`Proxy`] per process: an HTTP listener (CONNECT and
//! absolute-URI plain requests, served with hyper) and, when asked, a SOCKS5
//! listener (TCP `CONNECT`; `UDP ASSOCIATE` when enabled), on ephemeral
//! 127.0.0.1 ports, plus optionally the same listeners on Unix sockets (the
//! sandbox's bridge connects to those). Each destination is decided by the
//! [`policy`] (local/private check, `domains`, review, then a [`Decider`]); the
//! proxy knows nothing of JSON-RPC: the server implements [`Decider`].
//!
//! Dropping the [`Proxy`] closes the listeners and ends every connection and
//! tunnel it carried.
#![forbid(unsafe_code)]

pub mod env;
pub mod handover;
pub mod host;
mod http;
pub mod mask;
mod mitm;
pub mod policy;
mod responses;
mod socks;
mod upstream;

pub use policy::{
    Answer, AskFailure, BoxFuture, Decider, Decision, Destination, Pattern, Policy, Protocol,
    Rules, Source, Verdict,
};

pub use mitm::CaParts;
/// A certificate in DER (for [`Launch::upstream_roots`]).
pub use rustls::pki_types::CertificateDer;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What to start.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    /// The decision rules.
    pub rules: Rules,
    /// Start the SOCKS5 listener.
    pub socks5: bool,
    /// Accept SOCKS5 `UDP ASSOCIATE`.
    pub socks5_udp: bool,
    /// Also listen on `http.sock` (and `socks.sock`) in this existing directory.
    pub unix_dir: Option<PathBuf>,
    /// Credential masking: secrets to put back into requests to their
    /// providers. When it masked anything, `CONNECT`s to those providers'
    /// https origins are intercepted with a CA of this proxy's own
    /// ([`Proxy::ca_pem`]).
    pub masking: Option<Arc<mask::Masking>>,
    /// Roots trusted for upstream TLS besides the Mozilla roots (DER):
    /// for tests whose fake upstream has a test CA.
    pub upstream_roots: Vec<rustls::pki_types::CertificateDer<'static>>,
    /// Transparent TCP for a routed sandbox: also serve SOCKS5 `CONNECT` on
    /// [`TCP_SOCKET`] in `unix_dir` (whether or not `socks5` is set; that
    /// socket is not advertised in the child's environment).
    pub transparent_tcp: bool,
    /// `--tcp-upstream-proxy HOST:PORT`: SOCKS5 `CONNECT`s leave through this
    /// HTTP CONNECT proxy instead of connecting directly.
    pub tcp_upstream: Option<String>,
}

/// File name of the HTTP listener's Unix socket in [`Launch::unix_dir`].
pub const HTTP_SOCKET: &str = "http.sock";
/// File name of the SOCKS5 listener's Unix socket in [`Launch::unix_dir`].
pub const SOCKS_SOCKET: &str = "socks.sock";
/// File name of the transparent-TCP SOCKS5 socket in [`Launch::unix_dir`]
/// ([`Launch::transparent_tcp`]).
pub const TCP_SOCKET: &str = "tcp.sock";

pub(crate) struct Shared {
    pub policy: Policy,
    pub masking: Option<Arc<mask::Masking>>,
    pub mitm: Option<Arc<mitm::Authority>>,
    pub socks5_udp: bool,
    pub tcp_upstream: Option<String>,
    pub stop: watch::Receiver<()>,
}

impl Shared {
    /// Resolves when the proxy is dropped.
    pub async fn stopped(&self) {
        let mut s = self.stop.clone();
        while s.changed().await.is_ok() {}
    }
}

/// A running proxy. Dropping it stops it.
pub struct Proxy {
    ca_pem: Option<String>,
    /// The interception CA, for [`Proxy::handover`].
    mitm: Option<Arc<mitm::Authority>>,
    /// Its listeners' descriptors, for [`Proxy::handover`].
    fds: handover::ListenerFds,
    http: SocketAddr,
    socks: Option<SocketAddr>,
    allow_local_binding: bool,
    tasks: Vec<JoinHandle<()>>,
    _stop: watch::Sender<()>,
}

impl Proxy {
    /// Binds the listeners (127.0.0.1, ephemeral ports) and starts serving.
    /// Errors: the OS's bind errors.
    pub async fn start(launch: Launch, decider: Arc<dyn Decider>) -> std::io::Result<Proxy> {
        Self::start_with(launch, decider, None).await
    }

    /// Serves on the listeners and with the CA a previous image of the
    /// server handed over ([`Proxy::handover`]): the child's proxy
    /// variables and trusted CA stay right. Errors: a listener that is not
    /// one, or a CA that does not load.
    pub async fn take_over(
        launch: Launch,
        decider: Arc<dyn Decider>,
        inherited: handover::Inherited,
    ) -> std::io::Result<Proxy> {
        Self::start_with(launch, decider, Some(inherited)).await
    }

    async fn start_with(
        launch: Launch,
        decider: Arc<dyn Decider>,
        mut inherited: Option<handover::Inherited>,
    ) -> std::io::Result<Proxy> {
        let (stop_tx, stop) = watch::channel(());
        let allow_local_binding = launch.rules.allow_local_binding;
        let masking = launch.masking.filter(|m| !m.is_empty());
        let ca_parts = inherited.as_mut().and_then(|i| i.ca.take());
        let mitm = match (&masking, ca_parts) {
            (Some(_), Some(parts)) => Some(Arc::new(
                mitm::Authority::from_parts(&parts, &launch.upstream_roots)
                    .map_err(std::io::Error::other)?,
            )),
            (Some(_), None) => Some(Arc::new(
                mitm::Authority::new(&launch.upstream_roots).map_err(std::io::Error::other)?,
            )),
            (None, _) => None,
        };
        let mut fds = handover::ListenerFds::default();
        let mut listeners = handover::Listeners::new(inherited);
        let ca_pem = mitm.as_ref().map(|a| a.ca_pem().to_string());
        let shared = Arc::new(Shared {
            masking,
            mitm,
            policy: Policy::new(launch.rules, decider),
            socks5_udp: launch.socks5_udp,
            tcp_upstream: launch.tcp_upstream.clone(),
            stop,
        });
        let mut tasks = Vec::new();
        let http_l = listeners.tcp(handover::Slot::Http).await?;
        let http = http_l.local_addr()?;
        fds.http = Some(std::os::fd::AsRawFd::as_raw_fd(&http_l));
        tasks.push(tokio::spawn(accept_tcp(http_l, shared.clone(), Kind::Http)));
        let mut socks = None;
        if launch.socks5 {
            let l = listeners.tcp(handover::Slot::Socks).await?;
            socks = Some(l.local_addr()?);
            fds.socks = Some(std::os::fd::AsRawFd::as_raw_fd(&l));
            tasks.push(tokio::spawn(accept_tcp(l, shared.clone(), Kind::Socks)));
        }
        if let Some(dir) = &launch.unix_dir {
            let l = listeners.unix(handover::Slot::UnixHttp, &dir.join(HTTP_SOCKET))?;
            fds.unix_http = Some(std::os::fd::AsRawFd::as_raw_fd(&l));
            tasks.push(tokio::spawn(accept_unix(l, shared.clone(), Kind::Http)));
            if launch.socks5 {
                let l = listeners.unix(handover::Slot::UnixSocks, &dir.join(SOCKS_SOCKET))?;
                fds.unix_socks = Some(std::os::fd::AsRawFd::as_raw_fd(&l));
                tasks.push(tokio::spawn(accept_unix(l, shared.clone(), Kind::Socks)));
            }
            if launch.transparent_tcp {
                let l = listeners.unix(handover::Slot::UnixTcp, &dir.join(TCP_SOCKET))?;
                fds.unix_tcp = Some(std::os::fd::AsRawFd::as_raw_fd(&l));
                tasks.push(tokio::spawn(accept_unix(l, shared.clone(), Kind::Socks)));
            }
        }
        Ok(Proxy {
            ca_pem,
            mitm: shared.mitm.clone(),
            fds,
            http,
            socks,
            allow_local_binding,
            tasks,
            _stop: stop_tx,
        })
    }

    /// The HTTP listener's address (127.0.0.1:PORT).
    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }

    /// The SOCKS5 listener's address, when started.
    pub fn socks_addr(&self) -> Option<SocketAddr> {
        self.socks
    }

    /// The interception CA's certificate (PEM), when credential masking
    /// masked anything: the child must trust it (and only this child does).
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// What the next image of the server needs to serve the same child:
    /// its listeners' descriptors (valid while this proxy lives) and its
    /// interception CA.
    pub fn handover(&self) -> (handover::ListenerFds, Option<CaParts>) {
        (self.fds, self.mitm.as_ref().map(|m| m.parts()))
    }

    /// The child environment pointing at this proxy (SANDBOX.md §3.1).
    pub fn child_env(&self) -> Vec<(String, String)> {
        env::child_env(self.http, self.socks, self.allow_local_binding)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Http,
    Socks,
}

async fn accept_tcp(l: TcpListener, shared: Arc<Shared>, kind: Kind) {
    loop {
        match l.accept().await {
            Ok((s, peer)) => {
                let _ = s.set_nodelay(true);
                spawn_conn(s, Some(peer), shared.clone(), kind);
            }
            Err(e) => backoff(e).await,
        }
    }
}

async fn accept_unix(l: UnixListener, shared: Arc<Shared>, kind: Kind) {
    loop {
        match l.accept().await {
            Ok((s, _)) => spawn_conn(s, None, shared.clone(), kind),
            Err(e) => backoff(e).await,
        }
    }
}

/// A failed accept (usually out of descriptors) is retried after a pause.
async fn backoff(e: std::io::Error) {
    tracing::warn!("network proxy: accept failed: {e}");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
}

fn spawn_conn<S>(s: S, peer: Option<SocketAddr>, shared: Arc<Shared>, kind: Kind)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let stop = shared.clone();
        tokio::select! {
            _ = async {
                match kind {
                    Kind::Http => http::serve(s, peer, shared).await,
                    Kind::Socks => socks::serve(s, peer, shared).await,
                }
            } => {}
            _ = stop.stopped() => {}
        }
    });
}
