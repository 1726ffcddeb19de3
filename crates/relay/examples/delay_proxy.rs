//! A TCP proxy on loopback that delays every byte by a fixed time in each
//! direction (a wide-area link's latency without its loss), for measuring
//! remote mode at a given round-trip time where netem is unavailable.
//!
//! ```text
//! delay_proxy TARGET_ADDR ONE_WAY_MS
//! ```
//!
//! Prints `127.0.0.1:PORT` (where it listens) on its first line, then serves
//! until killed. Bytes keep their order; throughput is not limited. With
//! `ONE_WAY_MS` 0 it is a plain forwarder (256 KiB buffers, no timer, no
//! per-chunk allocation): the floor for any relay in user space, one extra
//! hop with no framing and no crypto.

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Copies `from` to `to`, each chunk written `delay` after it was read.
async fn delayed_copy(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(4096);
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if tx
            .send((Instant::now() + delay, buf[..n].to_vec()))
            .await
            .is_err()
        {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(target), Some(ms)) = (args.get(1), args.get(2).and_then(|m| m.parse::<u64>().ok()))
    else {
        eprintln!("usage: delay_proxy TARGET_ADDR ONE_WAY_MS");
        std::process::exit(2);
    };
    let delay = Duration::from_millis(ms);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    println!("{}", listener.local_addr().expect("local address"));
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            continue;
        };
        let target = target.clone();
        tokio::spawn(async move {
            let Ok(outbound) = TcpStream::connect(&target).await else {
                return;
            };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            if delay.is_zero() {
                let (mut inbound, mut outbound) = (inbound, outbound);
                let _ = tokio::io::copy_bidirectional_with_sizes(
                    &mut inbound,
                    &mut outbound,
                    256 * 1024,
                    256 * 1024,
                )
                .await;
                return;
            }
            let (ir, iw) = inbound.into_split();
            let (or, ow) = outbound.into_split();
            tokio::join!(delayed_copy(ir, ow, delay), delayed_copy(or, iw, delay));
        });
    }
}
