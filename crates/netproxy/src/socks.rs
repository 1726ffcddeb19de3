//! The SOCKS5 listener (RFC 1928, no authentication): `CONNECT` tunnels TCP;
//! `UDP ASSOCIATE` (only when enabled) relays datagrams through a UDP socket
//! on 127.0.0.1 for as long as the control connection stays open. Every
//! destination is decided by the policy; a refusal is reply code 2
//! ("connection not allowed by ruleset"). With [`crate::Launch::tcp_upstream`]
//! every allowed `CONNECT` goes out through that HTTP CONNECT proxy (a
//! refusal there is reply code 5), never directly.

use crate::policy::{Destination, Protocol};
use crate::{upstream, Shared};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UdpSocket;

const VERSION: u8 = 5;
const NO_AUTH: u8 = 0;
const NO_METHOD: u8 = 0xff;
const CMD_CONNECT: u8 = 1;
const CMD_UDP: u8 = 3;
const REP_OK: u8 = 0;
const REP_FAILURE: u8 = 1;
const REP_NOT_ALLOWED: u8 = 2;
const REP_HOST_UNREACHABLE: u8 = 4;
const REP_REFUSED: u8 = 5;
const REP_COMMAND: u8 = 7;
const REP_ADDRESS: u8 = 8;

/// Longest the greeting and request may take: 30 s.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest datagram relayed: 65 535 bytes.
const MAX_DATAGRAM: usize = 65_535;

pub(crate) async fn serve<S>(mut s: S, client: Option<SocketAddr>, shared: Arc<Shared>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Ok(Ok(req)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&mut s)).await else {
        return;
    };
    let (cmd, host, port) = match req {
        Ok(r) => r,
        Err(code) => {
            let _ = reply(&mut s, code, None).await;
            return;
        }
    };
    match cmd {
        CMD_CONNECT => tcp(s, client, shared, host, port).await,
        CMD_UDP if shared.socks5_udp => udp(s, client, shared).await,
        _ => {
            let _ = reply(&mut s, REP_COMMAND, None).await;
        }
    }
}

/// Reads the greeting and the request: `Ok(Err(code))` for a request to refuse.
async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
) -> std::io::Result<Result<(u8, String, u16), u8>> {
    let mut head = [0u8; 2];
    s.read_exact(&mut head).await?;
    if head[0] != VERSION {
        return Err(std::io::ErrorKind::InvalidData.into());
    }
    let mut methods = vec![0u8; usize::from(head[1])];
    s.read_exact(&mut methods).await?;
    if !methods.contains(&NO_AUTH) {
        s.write_all(&[VERSION, NO_METHOD]).await?;
        return Err(std::io::ErrorKind::PermissionDenied.into());
    }
    s.write_all(&[VERSION, NO_AUTH]).await?;
    let mut req = [0u8; 4];
    s.read_exact(&mut req).await?;
    if req[0] != VERSION {
        return Err(std::io::ErrorKind::InvalidData.into());
    }
    let host = match read_addr(s, req[3]).await? {
        Some(h) => h,
        None => return Ok(Err(REP_ADDRESS)),
    };
    let port = s.read_u16().await?;
    Ok(Ok((req[1], host, port)))
}

async fn read_addr<S: AsyncRead + Unpin>(s: &mut S, atyp: u8) -> std::io::Result<Option<String>> {
    Ok(Some(match atyp {
        1 => {
            let mut b = [0u8; 4];
            s.read_exact(&mut b).await?;
            Ipv4Addr::from(b).to_string()
        }
        3 => {
            let n = s.read_u8().await?;
            let mut b = vec![0u8; usize::from(n)];
            s.read_exact(&mut b).await?;
            String::from_utf8_lossy(&b).into_owned()
        }
        4 => {
            let mut b = [0u8; 16];
            s.read_exact(&mut b).await?;
            Ipv6Addr::from(b).to_string()
        }
        _ => return Ok(None),
    }))
}

fn encode_addr(out: &mut Vec<u8>, a: SocketAddr) {
    match a.ip() {
        IpAddr::V4(v4) => {
            out.push(1);
            out.extend_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            out.push(4);
            out.extend_from_slice(&v6.octets());
        }
    }
    out.extend_from_slice(&a.port().to_be_bytes());
}

async fn reply<S: AsyncWrite + Unpin>(
    s: &mut S,
    code: u8,
    bound: Option<SocketAddr>,
) -> std::io::Result<()> {
    let mut out = vec![VERSION, code, 0];
    encode_addr(
        &mut out,
        bound.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))),
    );
    s.write_all(&out).await
}

async fn tcp<S>(mut s: S, client: Option<SocketAddr>, shared: Arc<Shared>, host: String, port: u16)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let dest = Destination {
        protocol: Protocol::Socks5Tcp,
        host,
        port,
        method: None,
        client,
    };
    let target = upstream::resolve(&dest.host, port).await;
    if !shared.policy.decide(&dest, target.local).await.allowed() {
        let _ = reply(&mut s, REP_NOT_ALLOWED, None).await;
        return;
    }
    let connected = match &shared.tcp_upstream {
        Some(proxy) => upstream::connect_via(proxy, &dest.host, port).await,
        None => upstream::connect(&target.addrs).await,
    };
    let mut up = match connected {
        Ok(u) => u,
        Err(e) => {
            let code = match e.kind() {
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::PermissionDenied => {
                    REP_REFUSED
                }
                std::io::ErrorKind::NotFound | std::io::ErrorKind::TimedOut => REP_HOST_UNREACHABLE,
                _ => REP_FAILURE,
            };
            let _ = reply(&mut s, code, None).await;
            return;
        }
    };
    if reply(&mut s, REP_OK, up.local_addr().ok()).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut s, &mut up).await;
}

/// Parses a client datagram: (host, port, payload offset). `None` = drop it
/// (fragmented or malformed).
fn parse_datagram(d: &[u8]) -> Option<(String, u16, usize)> {
    if d.len() < 4 || d[2] != 0 {
        return None;
    }
    let (host, at) = match d[3] {
        1 => (
            Ipv4Addr::from(<[u8; 4]>::try_from(d.get(4..8)?).ok()?).to_string(),
            8,
        ),
        4 => (
            Ipv6Addr::from(<[u8; 16]>::try_from(d.get(4..20)?).ok()?).to_string(),
            20,
        ),
        3 => {
            let n = usize::from(*d.get(4)?);
            (
                String::from_utf8_lossy(d.get(5..5 + n)?).into_owned(),
                5 + n,
            )
        }
        _ => return None,
    };
    let port = u16::from_be_bytes(d.get(at..at + 2)?.try_into().ok()?);
    Some((host, port, at + 2))
}

async fn udp<S>(mut s: S, client: Option<SocketAddr>, shared: Arc<Shared>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (Ok(relay), Ok(out)) = (
        UdpSocket::bind(("127.0.0.1", 0)).await,
        UdpSocket::bind(("0.0.0.0", 0)).await,
    ) else {
        let _ = reply(&mut s, REP_FAILURE, None).await;
        return;
    };
    if reply(&mut s, REP_OK, relay.local_addr().ok())
        .await
        .is_err()
    {
        return;
    }
    // Destinations decided in this association: (host, port) → where to send.
    let mut decided: HashMap<(String, u16), Option<SocketAddr>> = HashMap::new();
    let mut peer: Option<SocketAddr> = None;
    let mut from_child = vec![0u8; MAX_DATAGRAM];
    let mut from_net = vec![0u8; MAX_DATAGRAM];
    let mut ctl = [0u8; 64];
    loop {
        tokio::select! {
            r = s.read(&mut ctl) => {
                if !matches!(r, Ok(n) if n > 0) {
                    return; // control connection closed: the association ends
                }
            }
            r = relay.recv_from(&mut from_child) => {
                let Ok((n, src)) = r else { continue };
                if !src.ip().is_loopback() || peer.is_some_and(|p| p != src) {
                    continue;
                }
                peer = Some(src);
                let Some((host, port, at)) = parse_datagram(&from_child[..n]) else { continue };
                let key = (host.clone(), port);
                let to = match decided.get(&key) {
                    Some(t) => *t,
                    None => {
                        let dest = Destination { protocol: Protocol::Socks5Udp, host, port, method: None, client };
                        let target = upstream::resolve(&dest.host, port).await;
                        let ok = shared.policy.decide(&dest, target.local).await.allowed();
                        let t = if ok { target.addrs.first().copied() } else { None };
                        decided.insert(key, t);
                        t
                    }
                };
                if let Some(to) = to {
                    let _ = out.send_to(&from_child[at..n], to).await;
                }
            }
            r = out.recv_from(&mut from_net) => {
                let (Ok((n, src)), Some(p)) = (r, peer) else { continue };
                if !decided.values().any(|t| *t == Some(src)) {
                    continue; // only answers from destinations the child was allowed to reach
                }
                let mut d = vec![0, 0, 0];
                encode_addr(&mut d, src);
                d.extend_from_slice(&from_net[..n]);
                let _ = relay.send_to(&d, p).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagram_header() {
        let mut d = vec![0, 0, 0, 1, 8, 8, 8, 8, 0, 53];
        d.extend_from_slice(b"q");
        assert_eq!(parse_datagram(&d), Some(("8.8.8.8".into(), 53, 10)));
        let mut n = vec![0, 0, 0, 3, 3];
        n.extend_from_slice(b"a.b");
        n.extend_from_slice(&[0, 80]);
        assert_eq!(parse_datagram(&n), Some(("a.b".into(), 80, 10)));
        assert_eq!(
            parse_datagram(&[0, 0, 1, 1, 8, 8, 8, 8, 0, 53]),
            None,
            "fragments dropped"
        );
        assert_eq!(parse_datagram(&[0, 0, 0, 3, 9, b'a']), None, "short name");
        assert_eq!(parse_datagram(&[0, 0, 0, 9]), None);
    }
}
