//! Reaching a destination: resolving it once (the local/private check uses
//! the very addresses then connected to, so a name cannot be re-resolved to a
//! local address between the decision and the connect) and connecting.

use crate::host;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

/// Largest response head accepted from an upstream CONNECT proxy: 8 KiB.
pub const MAX_CONNECT_HEAD: usize = 8 * 1024;

/// Opens a tunnel to `host:port` through the HTTP CONNECT proxy `proxy`
/// (`HOST:PORT`, `--tcp-upstream-proxy`). Errors: the proxy cannot be
/// reached (`ConnectionRefused`, `TimedOut`, `NotFound`), or it answered
/// anything but a 2xx (`PermissionDenied`) or garbage (`InvalidData`). There
/// is no fallback to a direct connection.
pub async fn connect_via(proxy: &str, host: &str, port: u16) -> std::io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> =
        match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host(proxy)).await {
            Ok(Ok(a)) => a.collect(),
            _ => vec![],
        };
    let mut s = connect(&addrs).await?;
    let authority = match host::literal(host) {
        Some(std::net::IpAddr::V6(v6)) => format!("[{v6}]:{port}"),
        _ => format!("{host}:{port}"),
    };
    let req = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
    let exchange = async {
        s.write_all(req.as_bytes()).await?;
        // Byte by byte: nothing past the head may be consumed (it is the
        // destination's first bytes).
        let mut head = Vec::with_capacity(128);
        while !head.ends_with(b"\r\n\r\n") {
            if head.len() >= MAX_CONNECT_HEAD {
                return Err(std::io::ErrorKind::InvalidData.into());
            }
            head.push(s.read_u8().await?);
        }
        let status = head
            .split(|b| *b == b' ')
            .nth(1)
            .and_then(|c| std::str::from_utf8(c).ok())
            .and_then(|c| c.trim().parse::<u16>().ok())
            .ok_or(std::io::ErrorKind::InvalidData)?;
        if !(200..300).contains(&status) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("upstream proxy answered {status}"),
            ));
        }
        Ok(())
    };
    tokio::time::timeout(CONNECT_TIMEOUT, exchange)
        .await
        .map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::TimedOut, "upstream proxy timed out")
        })??;
    Ok(s)
}
