//! Remote-mode benchmark: the same server reached directly and through our
//! registry + relay, with this crate's client on both paths.
//!
//! ```text
//! relay_bench DIRECT_WS_URL REGISTRY_URL ENV_ID EXECUTOR_PID [SPAWNS] [IDLE]
//! ```
//!
//! Prints spawn latency p50/p99 (`process/start` of `true` until its exit event,
//! on an established connection), stream throughput (`head -c 256 MiB
//! /dev/zero`, bytes delivered to the caller per second: best of three per
//! path, then five rounds alternating direct, relay and relay with
//! AES-256-GCM records instead of AEGIS-256X2, each round's ratios and their
//! medians, so that a machine that slows down for a while slows every path
//! alike), and the executor's RSS growth per idle relay stream (IDLE
//! connected clients). See
//! BENCHMARKS.md for the command that starts the three processes.

use exec_server_client::relay::RelaySource;
use exec_server_client::{ClientOptions, ExecServerClient, ProcessEvent, Source};
use exec_server_protocol::types::ExecParams;
use exec_server_relay::TransportCipher;
use std::time::{Duration, Instant};

const STREAM_BYTES: usize = 256 * 1024 * 1024;

fn params(id: &str, argv: &[&str]) -> ExecParams {
    ExecParams::new(
        id,
        argv.iter().map(|s| s.to_string()).collect(),
        exec_server_protocol::PathUri::parse("file:///tmp").expect("static uri"),
        [("PATH".to_string(), "/usr/bin:/bin".to_string())].into(),
    )
}

async fn client(source: Source) -> ExecServerClient {
    let mut opts = ClientOptions::new(source);
    opts.connect_timeout = Duration::from_secs(10);
    let c = ExecServerClient::new(opts);
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = c.connect().await {
        assert!(Instant::now() < deadline, "cannot connect: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c
}

/// Runs `argv` to its exit; returns output bytes seen.
async fn run(c: &ExecServerClient, id: &str, argv: &[&str]) -> usize {
    let mut p = c.start_process(params(id, argv)).await.expect("start");
    let mut n = 0;
    let mut code = None;
    loop {
        match tokio::time::timeout(Duration::from_secs(120), p.next_event())
            .await
            .expect("event within 120 s")
        {
            Some(ProcessEvent::Output { data, .. }) => n += data.len(),
            Some(ProcessEvent::Exited { code: c, .. }) => code = Some(c),
            Some(ProcessEvent::Closed { .. }) | None => break,
            Some(ProcessEvent::Failed(why)) => panic!("{why}"),
        }
    }
    assert_eq!(code, Some(0), "{argv:?}");
    n
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// `head -c 256 MiB /dev/zero` once: the MiB/s delivered.
async fn stream(c: &ExecServerClient, tag: &str) -> f64 {
    let t = Instant::now();
    let n = run(
        c,
        tag,
        &["head", "-c", &STREAM_BYTES.to_string(), "/dev/zero"],
    )
    .await;
    assert_eq!(n, STREAM_BYTES);
    n as f64 / t.elapsed().as_secs_f64() / (1024.0 * 1024.0)
}

/// [`stream`] three times: the best MiB/s.
async fn best_stream(c: &ExecServerClient, tag: &str) -> f64 {
    let mut best = 0f64;
    for i in 0..3 {
        best = best.max(stream(c, &format!("{tag}-{i}")).await);
    }
    best
}

/// Rounds of one direct stream, one relay stream with our records
/// (AEGIS-256X2) and one with the reference's (AES-256-GCM): each round's
/// relay/direct ratios, and their medians.
async fn interleaved(direct: &ExecServerClient, relay: &ExecServerClient, aes: &ExecServerClient) {
    let (mut ratios, mut aes_ratios) = (Vec::new(), Vec::new());
    let mut line = String::new();
    for i in 0..5 {
        let d = stream(direct, &format!("id-{i}")).await;
        let r = stream(relay, &format!("ir-{i}")).await;
        let g = stream(aes, &format!("ig-{i}")).await;
        ratios.push(r / d);
        aes_ratios.push(g / d);
        line.push_str(&format!(" {r:.0}|{g:.0}/{d:.0}"));
    }
    println!("interleaved relay (AEGIS-256X2 | AES-256-GCM) / direct MiB/s:{line}");
    for (name, mut ratios) in [("", ratios), (" with AES-256-GCM records", aes_ratios)] {
        let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        let median = pct(&mut ratios, 0.5);
        println!(
            "relay/direct stream ratio{name}: median {median:.2} of rounds {}",
            shown.join(" ")
        );
    }
}

async fn measure(name: &str, c: &ExecServerClient, spawns: usize) -> f64 {
    for i in 0..10 {
        run(c, &format!("warm-{i}"), &["true"]).await;
    }
    let mut lat = Vec::with_capacity(spawns);
    for i in 0..spawns {
        let t = Instant::now();
        run(c, &format!("s-{i}"), &["true"]).await;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let (p50, p99) = (pct(&mut lat, 0.5), pct(&mut lat, 0.99));
    let best = best_stream(c, "z").await;
    println!("{name:>7}: spawn p50 {p50:.3} ms, p99 {p99:.3} ms ({spawns} spawns); stream {best:.0} MiB/s");
    p50
}

/// A stream to the executor whose harness starts `yes` and then never reads
/// again: what a hung or stalled client looks like to the relay.
async fn stalled_neighbour(registry: &str, env: &str) -> exec_server_relay::stream::Channel {
    use exec_server_relay::harness;
    use exec_server_relay::registry_client::RegistryClient;
    use exec_server_relay::{Identity, OsRandom};
    let client = RegistryClient::new(registry, "bench", None, true).expect("registry url");
    let me = Identity::generate(&mut OsRandom);
    let mut ch = harness::connect(&client, env, &me).await.expect("stream");
    let init = r#"{"id":1,"method":"initialize","params":{"clientName":"stalled"}}"#;
    ch.outbound
        .send(init.as_bytes().to_vec().into())
        .await
        .expect("send");
    ch.inbound.recv().await.expect("initialize answer");
    ch.outbound
        .send(br#"{"method":"initialized"}"#.to_vec().into())
        .await
        .expect("send");
    let start = serde_json::json!({
        "id": 2, "method": "process/start", "params": params("stalled", &["yes"]),
    });
    ch.outbound
        .send(start.to_string().into_bytes().into())
        .await
        .expect("send");
    ch
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("executor pid");
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

fn main() {
    // As the `exec-server` program does: with glibc's defaults every message
    // of an output chunk's size is mapped afresh and its pages faulted in,
    // which measures the allocator rather than the path.
    exec_server_sysio::malloc::tune();
    tokio::runtime::Runtime::new()
        .expect("a tokio runtime")
        .block_on(bench());
}

async fn bench() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 5 {
        eprintln!(
            "usage: relay_bench DIRECT_WS_URL REGISTRY_URL ENV_ID EXECUTOR_PID [SPAWNS] [IDLE]"
        );
        std::process::exit(2);
    }
    let pid: u32 = a[4].parse().expect("pid");
    let spawns: usize = a.get(5).and_then(|s| s.parse().ok()).unwrap_or(300);
    let idle: usize = a.get(6).and_then(|s| s.parse().ok()).unwrap_or(100);
    let relay =
        || Source::relay(RelaySource::new(&a[2], &a[3], "bench", None).expect("relay source"));
    let direct = client(Source::from_url(&a[1], None).expect("direct url")).await;
    let through = client(relay()).await;
    let aes = client(Source::relay(
        RelaySource::new(&a[2], &a[3], "bench", None)
            .expect("relay source")
            .with_transport_cipher(TransportCipher::AesGcm),
    ))
    .await;
    let d = measure("direct", &direct, spawns).await;
    let r = measure("relay", &through, spawns).await;
    println!("relay adds {:.3} ms to the spawn p50", r - d);
    interleaved(&direct, &through, &aes).await;
    drop(aes);
    // One stream beside a stalled one on the same executor.
    let stalled = stalled_neighbour(&a[2], &a[3]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let beside = best_stream(&through, "b").await;
    println!("  relay: stream {beside:.0} MiB/s beside a stalled stream on the same executor");
    drop(stalled);
    drop(direct);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(pid);
    let mut held = Vec::with_capacity(idle);
    for _ in 0..idle {
        held.push(client(relay()).await);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss_kib(pid);
    println!(
        "executor RSS {before} KiB -> {after} KiB with {idle} more idle relay streams: {:.1} KiB per stream",
        (after as f64 - before as f64) / idle as f64
    );
    drop(held);
    drop(through);
}
