//! A TCP proxy that aborts connections (RST, no WebSocket close) after a random
//! number of server-to-client bytes, a bounded number of times; loopback only.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A running proxy; dropping it stops accepting.
pub struct CutProxy {
    /// `ws://127.0.0.1:<port>` of the proxy.
    pub url: String,
    cuts: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    /// Proxies to `target` (`ws://host:port`); until `cuts` connections were
    /// aborted, each new one is aborted after between `min` and `max` bytes
    /// from the server (xorshift with `seed`); later ones forward untouched.
    pub async fn start(target: &str, cuts: usize, min: usize, max: usize, seed: u64) -> CutProxy {
        let target: SocketAddr = target
            .trim_start_matches("ws://")
            .trim_end_matches('/')
            .parse()
            .expect("target address");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}", listener.local_addr().unwrap());
        let done = Arc::new(AtomicUsize::new(0));
        let counter = done.clone();
        let task = tokio::spawn(async move {
            let mut rng = seed | 1;
            // Budgets are handed out at accept time: a connection accepted
            // while an earlier one is still being cut must not get one too,
            // or more than `cuts` connections could be cut.
            let mut planned = 0;
            while let Ok((client, _)) = listener.accept().await {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let budget = if planned < cuts {
                    planned += 1;
                    Some(min + (rng as usize) % (max - min + 1))
                } else {
                    None
                };
                let counter = counter.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    if pipe(client, server, budget).await {
                        counter.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        CutProxy {
            url,
            cuts: done,
            task,
        }
    }

    /// Connections aborted so far.
    pub fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Forwards both ways; with `budget`, aborts both sockets once that many
/// server bytes went through. True if it cut.
async fn pipe(client: TcpStream, server: TcpStream, budget: Option<usize>) -> bool {
    if budget.is_some() {
        // SO_LINGER 0: closing sends RST, as a dropped NAT mapping or a killed
        // proxy would; neither side gets a WebSocket close.
        reset_on_close(&client);
        reset_on_close(&server);
    }
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = cr.read(&mut buf).await {
            if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
    let mut buf = vec![0u8; 16 * 1024];
    let mut sent = 0usize;
    let mut cut = false;
    loop {
        let want = match budget {
            Some(b) if sent >= b => {
                cut = true;
                break;
            }
            Some(b) => buf.len().min(b - sent),
            None => buf.len(),
        };
        match sr.read(&mut buf[..want]).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if cw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
                sent += n;
            }
        }
    }
    // Dropping every half closes both sockets (with RST when cut).
    up.abort();
    let _ = up.await;
    cut
}

/// SO_LINGER with a zero timeout: the socket's close sends RST at once.
fn reset_on_close(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket descriptor, and a pointer to a linger struct of
    // the size given, alive for the call.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}
