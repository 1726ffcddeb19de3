//! A node passes an executor's large data frames to our harness without
//! copying them (`splice(2)`, frames left as the executor masked them):
//! what arrives is exact, in order, whether the harness keeps up or stops
//! reading for a while; a harness that does not ask for masked frames is
//! never sent one. Our registry, executor and harness in process, loopback.

use exec_server_relay::executor;
use exec_server_relay::harness;
use exec_server_relay::keys::Identity;
use exec_server_relay::random::OsRandom;
use exec_server_relay::registry_client::RegistryClient;
use exec_server_relay::stream::Channel;
use exec_server_relay::testing::{echo_handler, memory_registry};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Our executor for `env`, registered at `base`, echoing every message.
fn start_echo_executor(base: &str, env: &str) {
    tokio::spawn(executor::run(
        executor::Config {
            registry: RegistryClient::new(base, "exec", None, true).unwrap(),
            environment_id: env.into(),
            keepalive: executor::KEEPALIVE,
            pong_timeout: executor::PONG_TIMEOUT,
            observer: std::sync::Arc::new(executor::NoObserver),
            transport_cipher: exec_server_relay::TransportCipher::preferred(),
        },
        echo_handler(),
    ));
}

/// A node on loopback with an echoing executor for `env` attached: the
/// node's base URL and a harness stream to the executor.
async fn echo_stream(env: &str) -> (String, Channel) {
    let base = memory_registry().await;
    start_echo_executor(&base, env);
    let client = RegistryClient::new(&base, "harness", None, true).unwrap();
    let me = Identity::generate(&mut OsRandom);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match harness::connect(&client, env, &me).await {
            Ok(ch) => return (base, ch),
            Err(e) => assert!(Instant::now() < deadline, "executor never attached: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A message of `len` bytes that differs from every other one sent (`n`).
fn message(n: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + n * 7 + i / 997) as u8).collect()
}

/// The node's counter `name` from its `/metrics`.
async fn metric(base: &str, name: &str) -> u64 {
    let addr = base.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut text = String::new();
    tcp.read_to_string(&mut text).await.unwrap();
    let full = format!("exec_server_registry_{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&full))
        .unwrap_or_else(|| panic!("no {full} in {text}"))
        .trim()
        .parse()
        .unwrap()
}

async fn recv(ch: &mut Channel) -> bytes::Bytes {
    tokio::time::timeout(Duration::from_secs(20), ch.inbound.recv())
        .await
        .expect("an echo within 20 s")
        .expect("the stream open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_echoes_are_spliced_and_exact() {
    let (base, mut ch) = echo_stream("sp1").await;
    let sizes = [1, 9_000, 70_000, 1_000_000, 5_000_000, 17, 300_000];
    for (n, len) in sizes.into_iter().enumerate() {
        ch.outbound.send(message(n, len).into()).await.unwrap();
        assert!(
            recv(&mut ch).await == message(n, len),
            "message {n} ({len} bytes)"
        );
    }
    let spliced = metric(&base, "spliced_bytes_to_harness_total").await;
    let routed = metric(&base, "relayed_bytes_to_harness_total").await;
    // The large messages' records (all but the last few KiB of each).
    assert!(spliced > 6_000_000, "spliced {spliced} of {routed}");
    assert!(spliced <= routed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_harness_that_stops_reading_gets_everything_once_it_reads_again() {
    let (base, mut ch) = echo_stream("sp2").await;
    // 20 MB echoed while the harness reads nothing: the node's pipe, the
    // kernel's buffers and the node's queue hold it (below the stream's
    // 32 MiB budget on the node, so never reset). Whether the pipe fills
    // (and frames are read instead) depends on how far the kernel grows
    // the socket buffers; `socket::splice::tests` and `registry::queue::
    // tests` cover that case directly.
    const COUNT: usize = 200;
    const LEN: usize = 100_000;
    let routed_before = metric(&base, "relayed_bytes_to_harness_total").await;
    for n in 0..COUNT {
        let sent = ch.outbound.send(message(n, LEN).into());
        tokio::time::timeout(Duration::from_secs(20), sent)
            .await
            .unwrap()
            .unwrap();
    }
    // Not read until the node has routed every echo.
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(&base, "relayed_bytes_to_harness_total").await - routed_before
        < (COUNT * LEN) as u64
    {
        assert!(
            Instant::now() < deadline,
            "the echoes never all reached the node"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for n in 0..COUNT {
        assert!(recv(&mut ch).await == message(n, LEN), "message {n}");
    }
    assert!(metric(&base, "spliced_bytes_to_harness_total").await > 0);
}

/// The node's answer head to a relay upgrade of a harness URL from
/// `/connect`, sent with `extra` header lines.
async fn upgrade_answer(extra: &str) -> String {
    let base = memory_registry().await;
    start_echo_executor(&base, "sp3");
    let client = RegistryClient::new(&base, "harness", None, true).unwrap();
    let me = Identity::generate(&mut OsRandom);
    let deadline = Instant::now() + Duration::from_secs(10);
    let bundle = loop {
        match client.connect("sp3", &me.public_key()).await {
            Ok(b) => break b,
            Err(e) => assert!(Instant::now() < deadline, "no executor: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let url = url::Url::parse(bundle.url.as_str()).unwrap();
    let addr = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap());
    let target = format!("{}?{}", url.path(), url.query().unwrap_or(""));
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&answer).to_ascii_lowercase()
}

#[tokio::test]
async fn masked_frames_are_offered_only_to_a_harness_that_asks() {
    let asked = upgrade_answer("X-Exec-Server-Masked-Frames: 1\r\n").await;
    assert!(asked.starts_with("http/1.1 101"), "{asked}");
    assert!(asked.contains("x-exec-server-masked-frames: 1"), "{asked}");
    let not_asked = upgrade_answer("").await;
    assert!(not_asked.starts_with("http/1.1 101"), "{not_asked}");
    assert!(!not_asked.contains("masked"), "{not_asked}");
}
