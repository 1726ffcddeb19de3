//! Reaching a destination: resolving it once (the local/private check uses
//! the very addresses then connected to, so a name cannot be re-resolved to a
//! local address between the decision and the connect) and connecting.

use crate::host;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;

/// Longest a name lookup may take: 10 s.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest one connect attempt may take: 10 s.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A destination's addresses and whether it is local/private.
pub struct Target {
    /// Loopback, private, link-local… (or named `localhost`).
    pub local: bool,
    /// What to connect to; empty when the name did not resolve.
    pub addrs: Vec<SocketAddr>,
}

/// Resolves `host:port`. A name that does not resolve is not local (it will
/// fail to connect: 502).
pub async fn resolve(host_name: &str, port: u16) -> Target {
    if let Some(ip) = host::literal(host_name) {
        return Target {
            local: host::is_local_ip(ip),
            addrs: vec![SocketAddr::new(ip, port)],
        };
    }
    if host::is_malformed(host_name) {
        return Target {
            local: false,
            addrs: vec![],
        };
    }
    let addrs: Vec<SocketAddr> =
        match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host_name, port)))
            .await
        {
            Ok(Ok(a)) => a.collect(),
            _ => vec![],
        };
    Target {
        local: host::is_local_name(host_name) || addrs.iter().any(|a| host::is_local_ip(a.ip())),
        addrs,
    }
}

/// Connects to the first address that answers.
pub async fn connect(addrs: &[SocketAddr]) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "host did not resolve");
    for a in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(a)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Ok(Err(e)) => last = e,
            Err(_) => last = std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
        }
    }
    Err(last)
}
