//! The registry's HTTP side as a client sees it on the wire: keep-alive,
//! size limits, the slow-client timeout, and the node's metrics.

use exec_server_relay::executor;
use exec_server_relay::harness;
use exec_server_relay::keys::Identity;
use exec_server_relay::random::OsRandom;
use exec_server_relay::registry::store::MemoryStore;
use exec_server_relay::registry::{Config, Registry};
use exec_server_relay::registry_client::RegistryClient;
use exec_server_relay::testing::echo_handler;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

async fn start_registry() -> String {
    start_registry_with(Config::default()).await
}

/// A node serving at most `n` connections at once.
async fn start_limited(n: usize) -> String {
    start_registry_with(Config {
        max_connections: n,
        ..Config::default()
    })
    .await
}

async fn start_registry_with(config: Config) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let reg = Registry::new(
        config,
        Arc::new(MemoryStore::default()),
        format!("ws://{addr}"),
    )
    .await
    .unwrap();
    tokio::spawn(reg.serve(l));
    addr.to_string()
}

/// Reads one response's head: its status, its header lines (lowercased)
/// and its `content-length` (0 when absent).
async fn read_head(r: &mut BufReader<TcpStream>) -> (u16, String, usize) {
    let mut line = String::new();
    r.read_line(&mut line).await.unwrap();
    let status = line.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (mut head, mut len) = (String::new(), 0);
    loop {
        let mut h = String::new();
        r.read_line(&mut h).await.unwrap();
        if h == "\r\n" || h.is_empty() {
            break;
        }
        let h = h.to_ascii_lowercase();
        if let Some(v) = h.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
        head.push_str(&h);
    }
    (status, head, len)
}

/// Reads one response: its status and body (by `content-length`).
async fn read_response(r: &mut BufReader<TcpStream>) -> (u16, String) {
    let (status, _, len) = read_head(r).await;
    let mut body = vec![0; len];
    r.read_exact(&mut body).await.unwrap();
    (status, String::from_utf8(body).unwrap())
}

/// Reads until the server closes the connection (bounded at 30 s).
async fn read_to_close(r: &mut BufReader<TcpStream>) -> String {
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), r.read_to_end(&mut rest))
        .await
        .expect("the server closes the connection")
        .unwrap_or(0);
    String::from_utf8_lossy(&rest).into_owned()
}

/// Three requests on one connection get three answers: the connection is
/// kept alive.
#[tokio::test]
async fn one_connection_serves_several_requests() {
    let addr = start_registry().await;
    let mut conn = BufReader::new(TcpStream::connect(&addr).await.unwrap());
    for path in ["/livez", "/readyz", "/livez"] {
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
        conn.get_mut().write_all(req.as_bytes()).await.unwrap();
        let (status, body) = read_response(&mut conn).await;
        assert!(
            status == 200 || (path == "/readyz" && status == 503),
            "{path}: {status} {body}"
        );
        assert!(
            body.contains("\"node\"") || body.contains("not_ready"),
            "{body}"
        );
    }
    let body = "{}";
    let req = format!(
        "POST /cloud/environment/a%2Fb/connect HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.get_mut().write_all(req.as_bytes()).await.unwrap();
    let (status, body) = read_response(&mut conn).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("invalid_environment_id"), "{body}");
}

/// HEAD of a probe or of `/metrics` answers as GET does, without the body
/// (it was 404); `/metrics` says it is OpenMetrics text, as it is.
#[tokio::test]
async fn head_asks_probes_and_metrics_for_their_status() {
    let addr = start_registry().await;
    let mut conn = BufReader::new(TcpStream::connect(&addr).await.unwrap());
    for path in ["/livez", "/metrics"] {
        let req = format!("HEAD {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
        conn.get_mut().write_all(req.as_bytes()).await.unwrap();
        let (status, head, _) = read_head(&mut conn).await;
        assert_eq!(status, 200, "{path}: {head}");
        if path == "/metrics" {
            assert!(
                head.contains("content-type: application/openmetrics-text"),
                "{head}"
            );
        }
    }
    // No body came: the next answer on the connection is the next request's.
    let req = format!("GET /livez HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    conn.get_mut().write_all(req.as_bytes()).await.unwrap();
    let (status, body) = read_response(&mut conn).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"node\""), "{body}");
}

/// A POST whose bearer no token accepts is refused on its head, its body
/// never waited for (a node held 64 KiB for 10 s for anyone who asked).
#[tokio::test]
async fn a_post_with_a_bad_bearer_is_refused_before_its_body() {
    use exec_server_relay::registry::tokens::Tokens;
    let addr = start_registry_with(Config {
        executor_tokens: Some(Tokens::parse("exec-secret\n").unwrap()),
        harness_tokens: Some(Tokens::parse("harness-secret\n").unwrap()),
        ..Config::default()
    })
    .await;
    for (action, who) in [("register", "executor"), ("connect", "harness")] {
        let mut conn = BufReader::new(TcpStream::connect(&addr).await.unwrap());
        // The body is announced and never sent.
        let req = format!(
            "POST /cloud/environment/env/{action} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer wrong\r\nContent-Length: 60000\r\n\r\n"
        );
        conn.get_mut().write_all(req.as_bytes()).await.unwrap();
        let (status, body) = tokio::time::timeout(Duration::from_secs(5), read_response(&mut conn))
            .await
            .expect("refused without waiting for the body");
        assert_eq!(status, 401, "{body}");
        assert!(body.contains(&format!("invalid {who} token")), "{body}");
    }
}

/// A body over 64 KiB is refused with 413 before it is read; a head over
/// 16 KiB is refused (431) and the connection closed.
#[tokio::test]
async fn oversized_bodies_and_heads_are_refused() {
    let addr = start_registry().await;
    let mut conn = BufReader::new(TcpStream::connect(&addr).await.unwrap());
    let req = format!(
        "POST /cloud/environment/e/connect HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 100000\r\n\r\n"
    );
    conn.get_mut().write_all(req.as_bytes()).await.unwrap();
    let (status, body) = read_response(&mut conn).await;
    assert_eq!(status, 413, "{body}");

    let mut conn = BufReader::new(TcpStream::connect(&addr).await.unwrap());
    let big = "x".repeat(20 * 1024);
    let req = format!("GET /livez HTTP/1.1\r\nHost: {addr}\r\nX-Big: {big}\r\n\r\n");
    // The server may close before it has read everything: a failed write is
    // the same outcome as an answer.
    let _ = conn.get_mut().write_all(req.as_bytes()).await;
    let rest = read_to_close(&mut conn).await;
    assert!(
        rest.is_empty() || rest.starts_with("HTTP/1.1 431"),
        "{rest:?}"
    );
}

/// A client that sends half a head and then nothing is cut off after the
/// head timeout (10 s), and so is one idle between requests.
#[tokio::test]
async fn slow_and_idle_clients_are_cut_off() {
    let addr = start_registry().await;
    let start = Instant::now();
    let mut slow = BufReader::new(TcpStream::connect(&addr).await.unwrap());
    slow.get_mut().write_all(b"GET /livez HT").await.unwrap();
    let mut idle = BufReader::new(TcpStream::connect(&addr).await.unwrap());
    let req = format!("GET /livez HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    idle.get_mut().write_all(req.as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut idle).await.0, 200);
    let (slow_rest, idle_rest) = tokio::join!(read_to_close(&mut slow), read_to_close(&mut idle));
    assert!(!slow_rest.contains(" 200 "), "{slow_rest:?}");
    assert!(
        idle_rest.is_empty() || idle_rest.starts_with("HTTP/1.1 408"),
        "{idle_rest:?}"
    );
    assert!(
        start.elapsed() >= Duration::from_secs(9),
        "{:?}",
        start.elapsed()
    );
}

/// Sends `GET path` on `conn` and reads the answer.
async fn get(conn: &mut BufReader<TcpStream>, addr: &str, path: &str) -> (u16, String) {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    conn.get_mut().write_all(req.as_bytes()).await.unwrap();
    read_response(conn).await
}

/// A node at its connection limit answers a new connection 503 (the code
/// and the limit in the body) and closes it; the connections it serves go
/// on, and a place freed is taken by the next connection.
#[tokio::test]
async fn a_node_at_its_connection_limit_refuses_more_and_recovers() {
    let addr = start_limited(2).await;
    let connect = || async { BufReader::new(TcpStream::connect(&addr).await.unwrap()) };
    let (mut a, mut b) = (connect().await, connect().await);
    assert_eq!(get(&mut a, &addr, "/livez").await.0, 200);
    assert_eq!(get(&mut b, &addr, "/livez").await.0, 200);
    let mut c = connect().await;
    let (status, body) = get(&mut c, &addr, "/metrics").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("node_at_connection_limit") && body.contains("limit of 2"),
        "{body}"
    );
    assert_eq!(read_to_close(&mut c).await, "", "closed after the answer");
    // A health probe is answered all the same: a busy node is alive.
    let mut probe = connect().await;
    assert_eq!(get(&mut probe, &addr, "/livez").await.0, 200);
    // One that sends nothing is closed within a second, not ten.
    let mut silent = connect().await;
    let t = Instant::now();
    read_to_close(&mut silent).await;
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // Those already served are served still.
    assert_eq!(get(&mut a, &addr, "/livez").await.0, 200);
    drop(b);
    // The freed place goes to a new connection once the node sees the close.
    let mut served = None;
    for _ in 0..100 {
        let mut d = connect().await;
        let (status, _) = get(&mut d, &addr, "/metrics").await;
        if status == 200 {
            served = Some(d);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut d = served.expect("a place freed within 2 s");
    let (_, text) = get(&mut d, &addr, "/metrics").await;
    assert!(
        metric(&text, "exec_server_registry_connections_refused_total") >= 1.0,
        "{text}"
    );
}

/// A client given two nodes registers through the second while the first
/// is at its connection limit.
#[tokio::test]
async fn a_client_moves_on_from_a_node_at_its_limit() {
    let full = start_limited(1).await;
    let other = start_registry().await;
    let mut held = BufReader::new(TcpStream::connect(&full).await.unwrap());
    assert_eq!(get(&mut held, &full, "/metrics").await.0, 200);
    let client =
        RegistryClient::new(&format!("http://{full},http://{other}"), "exec", None, true).unwrap();
    let key = Identity::generate(&mut OsRandom).public_key();
    let r = client
        .register("two-nodes", &key)
        .await
        .expect("registered");
    assert!(r.url.contains(&other), "{} names the second node", r.url);
    // With the other node gone too, the busy node's answer is what is
    // reported (its code), not a bare transport failure.
    let gone = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let client =
        RegistryClient::new(&format!("http://{full},http://{gone}"), "exec", None, true).unwrap();
    match client.register("two-nodes", &key).await {
        Err(exec_server_relay::registry_client::RegistryError::Http { status, code, .. }) => {
            assert_eq!((status, code.as_str()), (503, "node_at_connection_limit"));
        }
        other => panic!("{other:?}"),
    }
}

/// The value of the metric line that starts with `name ` (0 when absent).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `/metrics` counts the node's executor sockets, streams, relayed bytes
/// and store calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_sockets_streams_and_bytes() {
    let addr = start_registry().await;
    let base = format!("http://{addr}");
    let config = executor::Config {
        registry: RegistryClient::new(&base, "exec", None, true).unwrap(),
        environment_id: "m".into(),
        keepalive: executor::KEEPALIVE,
        pong_timeout: executor::PONG_TIMEOUT,
        observer: Arc::new(executor::NoObserver),
        transport_cipher: exec_server_relay::TransportCipher::preferred(),
    };
    let exec = tokio::spawn(executor::run(config, echo_handler()));
    let client = RegistryClient::new(&base, "harness", None, true).unwrap();
    let me = Identity::generate(&mut OsRandom);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut ch = loop {
        match harness::connect(&client, "m", &me).await {
            Ok(ch) => break ch,
            Err(e) => assert!(Instant::now() < deadline, "executor never attached: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let msg = vec![5u8; 100_000];
    ch.outbound.send(msg.clone().into()).await.unwrap();
    let back = tokio::time::timeout(Duration::from_secs(10), ch.inbound.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back, msg);
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        metric(&text, "exec_server_registry_executors_attached"),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "exec_server_registry_streams_open"),
        1.0,
        "{text}"
    );
    // The echo was read whole: nothing is held for the harness.
    assert_eq!(
        metric(&text, "exec_server_registry_relay_buffered_bytes"),
        0.0,
        "{text}"
    );
    for direction in ["to_executor", "to_harness"] {
        let name = format!("exec_server_registry_relayed_bytes_{direction}_total");
        assert!(metric(&text, &name) > 100_000.0, "{name}: {text}");
    }
    assert!(
        metric(&text, "exec_server_registry_store_seconds_count") >= 3.0,
        "{text}"
    );
    exec.abort();
}

/// `/connect` stores two authorizations for a minute each time: past 1 024
/// outstanding answers for one environment the node answers 429 with `retry-after` (naming itself),
/// while another environment still connects. An adversarial pass took a
/// node from 151 MB to 1.2 GB with `/connect` in a loop before.
#[tokio::test]
async fn connects_past_what_an_environment_may_have_pending_are_refused() {
    let addr = start_registry().await;
    let base = format!("http://{addr}");
    let exec = RegistryClient::new(&base, "exec", None, true).unwrap();
    let key = Identity::generate(&mut OsRandom).public_key();
    for env in ["busy", "other"] {
        exec.register(env, &key).await.expect("registered");
    }
    let harness = RegistryClient::new(&base, "harness", None, true).unwrap();
    let me = Identity::generate(&mut OsRandom).public_key();
    let mut answered = 0;
    let refused = loop {
        match harness.connect("busy", &me).await {
            Ok(_) => answered += 1,
            Err(e) => break e,
        }
        assert!(answered <= 1024, "never refused");
    };
    assert_eq!(answered, 1024);
    match refused {
        exec_server_relay::registry_client::RegistryError::Http {
            status,
            code,
            message,
            ..
        } => {
            assert_eq!((status, code.as_str()), (429, "too_many_connects"));
            assert!(message.contains("registry node"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    harness
        .connect("other", &me)
        .await
        .expect("another environment connects");
}
