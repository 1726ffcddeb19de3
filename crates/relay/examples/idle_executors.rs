//! What an attached, idle executor costs a registry node: attaches N
//! executors (this crate's, in this process, sharing one HTTP client) to a
//! registry running as its own process, waits until the node's `/metrics`
//! counts them all, and prints the node's RSS growth per executor socket.
//!
//! ```text
//! idle_executors REGISTRY_URL REGISTRY_PID N
//! ```
//!
//! See `scripts/idle-executors.sh`, which starts the registry and stops it.

use exec_server_relay::executor::{self, StreamHandler};
use exec_server_relay::registry_client::RegistryClient;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

async fn attached(base: &str) -> u64 {
    let Ok(r) = reqwest::get(format!("{base}/metrics")).await else {
        return 0;
    };
    let text = r.text().await.unwrap_or_default();
    text.lines()
        .find_map(|l| {
            l.strip_prefix("exec_server_registry_executors_attached ")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(base), Some(pid), Some(n)) = (
        args.get(1),
        args.get(2).and_then(|p| p.parse::<u32>().ok()),
        args.get(3).and_then(|n| n.parse::<u64>().ok()),
    ) else {
        eprintln!("usage: idle_executors REGISTRY_URL REGISTRY_PID N");
        std::process::exit(2);
    };
    let handler: StreamHandler = Arc::new(|_| {});
    let registry = RegistryClient::new(base, "bench", None, true).expect("registry url");
    // A warm-up executor, so the node's lazily made state exists before the
    // baseline.
    let spawn = |i: u64| {
        let config = executor::Config {
            registry: registry.clone(),
            environment_id: format!("idle-{i}"),
            keepalive: executor::KEEPALIVE,
            pong_timeout: executor::PONG_TIMEOUT,
            observer: Arc::new(executor::NoObserver),
            transport_cipher: exec_server_relay::TransportCipher::preferred(),
        };
        tokio::spawn(executor::run(config, handler.clone()))
    };
    let mut tasks = vec![spawn(0)];
    let deadline = Instant::now() + Duration::from_secs(30);
    while attached(base).await < 1 {
        assert!(
            Instant::now() < deadline,
            "the first executor never attached"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(pid);
    let start = Instant::now();
    for i in 1..=n {
        tasks.push(spawn(i));
        if i % 500 == 0 {
            // Pace registrations so none times out on a 2-core machine.
            while attached(base).await + 250 < i {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let a = attached(base).await;
        if a > n {
            break;
        }
        assert!(Instant::now() < deadline, "only {a} of {} attached", n + 1);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = start.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_kib(pid);
    println!(
        "{n} more idle executors attached in {:.1} s; registry RSS {before} KiB -> {after} KiB: {:.1} KiB per executor",
        took.as_secs_f64(),
        (after.saturating_sub(before)) as f64 / n as f64
    );
    for t in tasks {
        t.abort();
    }
}
