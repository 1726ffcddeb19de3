//! What the managed proxy adds to one request to a loopback server: N
//! sequential `GET`s, each on a new connection (as curl makes them), straight
//! to a loopback upstream and through the proxy (plain absolute-URI request,
//! destination allowed by `allowLocalBinding`, so no decider round trip).
//! Prints p50 / p90 / p99 in microseconds for both and the p50 difference.
//!
//! `target/release/examples/proxy_overhead [REQUESTS]` (default 2000).

use exec_server_netproxy::{
    Answer, AskFailure, BoxFuture, Decider, Decision, Destination, Launch, Proxy, Rules,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct Nobody;

impl Decider for Nobody {
    fn ask(&self, _: &Destination) -> BoxFuture<Result<Answer, AskFailure>> {
        Box::pin(async { Err(AskFailure::Unavailable) })
    }
    fn audit(&self, _: &Destination, _: &Decision) {}
}

const BODY: &str = "hello";

async fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let a = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let _ = s.set_nodelay(true);
                let mut buf = [0u8; 4096];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(n) if n > 0 => seen.extend_from_slice(&buf[..n]),
                        _ => return,
                    }
                }
                let r = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{BODY}",
                    BODY.len()
                );
                let _ = s.write_all(r.as_bytes()).await;
            });
        }
    });
    a
}

/// One request on a new connection to `via`, asking for `target`; the time
/// until the whole response was read.
async fn one(via: SocketAddr, target: &str) -> Duration {
    let t = Instant::now();
    let mut s = TcpStream::connect(via).await.expect("connect");
    let _ = s.set_nodelay(true);
    let req = format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.expect("read");
    assert!(
        out.ends_with(BODY.as_bytes()),
        "{}",
        String::from_utf8_lossy(&out)
    );
    t.elapsed()
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1e6
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let up = upstream().await;
    let proxy = Proxy::start(
        Launch {
            rules: Rules {
                allow_local_binding: true,
                ..Rules::default()
            },
            ..Launch::default()
        },
        Arc::new(Nobody),
    )
    .await
    .expect("proxy");
    let absolute = format!("http://{up}/");
    let (mut direct, mut proxied) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..200 {
        one(up, "/").await;
        one(proxy.http_addr(), &absolute).await;
    }
    // Interleaved, so drift on a busy machine hits both alike.
    for _ in 0..n {
        direct.push(one(up, "/").await);
        proxied.push(one(proxy.http_addr(), &absolute).await);
    }
    let (d50, p50) = (pct(&mut direct, 0.5), pct(&mut proxied, 0.5));
    println!("requests: {n} each, new connection per request");
    println!(
        "direct : p50 {d50:.0} us  p90 {:.0} us  p99 {:.0} us",
        pct(&mut direct, 0.9),
        pct(&mut direct, 0.99)
    );
    println!(
        "proxied: p50 {p50:.0} us  p90 {:.0} us  p99 {:.0} us",
        pct(&mut proxied, 0.9),
        pct(&mut proxied, 0.99)
    );
    println!("added at p50: {:.0} us", p50 - d50);
}
