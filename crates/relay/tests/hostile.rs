//! Hostile and broken peers against our registry, relay and executor (in
//! process, loopback): each gets a clear outcome and no other stream is disturbed.

use exec_server_relay::executor;
use exec_server_relay::frame::{Body, Frame, RESET_PROTOCOL_ERROR};
use exec_server_relay::harness::{self, HarnessError};
use exec_server_relay::keys::{prologue, Identity, PublicKey};
use exec_server_relay::noise::Initiator;
use exec_server_relay::random::OsRandom;
use exec_server_relay::registry::signing::{self, Grant, Role};
use exec_server_relay::registry::store::{
    Authorization, MemoryStore, Registration, Store, StoreError,
};
use exec_server_relay::registry::{Config, Registry};
use exec_server_relay::registry_client::{RegistryClient, RegistryError};
use exec_server_relay::stream::Channel;
use exec_server_relay::testing::echo_handler;
use futures_util::{SinkExt, StreamExt};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

struct Setup {
    base: String,
    store: Arc<MemoryStore>,
    client: RegistryClient,
}

/// Our registry on a loopback port: its base URL and store.
async fn start_registry(config: Config) -> (String, Arc<MemoryStore>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let store = Arc::new(MemoryStore::default());
    let reg = Registry::new(config, store.clone(), format!("ws://{addr}"))
        .await
        .unwrap();
    tokio::spawn(reg.serve(l));
    (format!("http://{addr}"), store)
}

/// Registry + an executor whose streams echo every message back.
async fn setup(env: &str) -> Setup {
    let (base, store) = start_registry(Config::default()).await;
    let config = executor::Config {
        registry: RegistryClient::new(&base, "exec", None, true).unwrap(),
        environment_id: env.into(),
        keepalive: executor::KEEPALIVE,
        pong_timeout: executor::PONG_TIMEOUT,
        observer: std::sync::Arc::new(executor::NoObserver),
        transport_cipher: exec_server_relay::TransportCipher::preferred(),
    };
    tokio::spawn(executor::run(config, echo_handler()));
    let client = RegistryClient::new(&base, "harness", None, true).unwrap();
    let s = Setup {
        base,
        store,
        client,
    };
    drop(connect_when_attached(&s.client, env).await);
    s
}

/// A harness stream to `env`, retried (bounded) until its executor has
/// registered and attached in the background.
async fn connect_when_attached(client: &RegistryClient, env: &str) -> Channel {
    let me = Identity::generate(&mut OsRandom);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match harness::connect(client, env, &me).await {
            Ok(ch) => return ch,
            Err(e) => assert!(Instant::now() < deadline, "executor never attached: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn echo(ch: &mut Channel, msg: &[u8]) {
    ch.outbound.send(msg.to_vec().into()).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), ch.inbound.recv())
        .await
        .unwrap();
    assert_eq!(got.as_deref(), Some(msg));
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A raw harness socket that claimed `stream_id`.
async fn raw_socket(
    s: &Setup,
    env: &str,
    stream_id: &str,
) -> (Ws, exec_server_relay::api::ConnectResponse) {
    let me = Identity::generate(&mut OsRandom);
    let bundle = s.client.connect(env, &me.public_key()).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::connect_async(bundle.url.as_str())
        .await
        .unwrap();
    ws.send(Message::Binary(Frame::resume(stream_id).encode().into()))
        .await
        .unwrap();
    (ws, bundle)
}

/// A raw harness socket that claimed `sid` and sent msg1 as `me`,
/// presenting `authorization` (else the one issued for `me`).
async fn send_msg1(
    client: &RegistryClient,
    env: &str,
    sid: &str,
    me: &Identity,
    authorization: Option<&str>,
) -> (Ws, Initiator) {
    let bundle = client.connect(env, &me.public_key()).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::connect_async(bundle.url.as_str())
        .await
        .unwrap();
    let exec_key = PublicKey::from_wire(&bundle.executor_public_key).unwrap();
    let p = prologue(env, &bundle.executor_registration_id, sid);
    let auth = authorization.unwrap_or(&bundle.harness_key_authorization);
    let (init, msg1) = Initiator::start(me, &exec_key, &p, auth.as_bytes(), &mut OsRandom).unwrap();
    ws.send(Message::Binary(Frame::resume(sid).encode().into()))
        .await
        .unwrap();
    ws.send(Message::Binary(Frame::handshake(sid, msg1).encode().into()))
        .await
        .unwrap();
    (ws, init)
}

async fn next_frame(ws: &mut Ws) -> Option<Frame> {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .ok()??
        {
            Ok(Message::Binary(b)) => return Frame::decode(&b).ok(),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => continue,
        }
    }
}

fn is_protocol_reset(f: &Option<Frame>, stream_id: &str) -> bool {
    matches!(f, Some(Frame { stream_id: s, body: Some(Body::Reset { reason }), .. })
        if s == stream_id && reason == RESET_PROTOCOL_ERROR)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_before_handshake_and_garbage_handshakes_are_reset_without_disturbing_a_stream() {
    let s = setup("e1").await;
    let me = Identity::generate(&mut OsRandom);
    let mut good = harness::connect(&s.client, "e1", &me).await.unwrap();
    echo(&mut good, b"before").await;

    let (mut ws, _) = raw_socket(&s, "e1", "early-data").await;
    ws.send(Message::Binary(
        Frame::data("early-data", 0, vec![1; 32]).encode().into(),
    ))
    .await
    .unwrap();
    assert!(is_protocol_reset(&next_frame(&mut ws).await, "early-data"));

    // Undecodable bytes, a text message, an invalid frame: dropped, socket stays.
    let (mut ws, bundle) = raw_socket(&s, "e1", "junk").await;
    ws.send(Message::Binary(vec![0xff; 7].into()))
        .await
        .unwrap();
    ws.send(Message::Text("hello".into())).await.unwrap();
    let mut bad = Frame::handshake("junk", vec![1]);
    bad.version = 2;
    ws.send(Message::Binary(bad.encode().into())).await.unwrap();
    // Then garbage in a well-formed handshake: Reset.
    ws.send(Message::Binary(
        Frame::handshake("junk", vec![7; 3600]).encode().into(),
    ))
    .await
    .unwrap();
    assert!(is_protocol_reset(&next_frame(&mut ws).await, "junk"));
    drop(bundle);

    echo(&mut good, b"after").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_harnesss_authorization_is_refused() {
    let s = setup("e2").await;
    let alice = Identity::generate(&mut OsRandom);
    let mallory = Identity::generate(&mut OsRandom);
    let alices = s.client.connect("e2", &alice.public_key()).await.unwrap();
    // Mallory proves her own key but presents Alice's authorization.
    let auth = alices.harness_key_authorization.as_str();
    let sid = "mallory-stream";
    let (mut ws, init) = send_msg1(&s.client, "e2", sid, &mallory, Some(auth)).await;
    // The executor answers msg1 while it asks the registry; what Mallory
    // sends meanwhile is held, never echoed, and the refusal resets it.
    let mut f = next_frame(&mut ws).await;
    if let Some(Frame {
        body: Some(Body::Handshake { payload }),
        ..
    }) = f
    {
        let transport = init
            .finish(&payload, exec_server_relay::TransportCipher::AesGcm)
            .unwrap();
        let (mut send, _recv) = exec_server_relay::stream::halves(sid, transport);
        for frame in send.seal(b"steal").unwrap() {
            ws.send(Message::Binary(frame.into())).await.unwrap();
        }
        f = next_frame(&mut ws).await;
    }
    assert!(is_protocol_reset(&f, sid), "{f:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_prologue_or_executor_key_fails_the_handshake() {
    let s = setup("e3").await;
    let me = Identity::generate(&mut OsRandom);
    let (mut ws, bundle) = raw_socket(&s, "e3", "s1").await;
    let exec_key = PublicKey::from_wire(&bundle.executor_public_key).unwrap();
    // Prologue for another stream id: the executor cannot read msg1.
    let p = prologue("e3", &bundle.executor_registration_id, "another-stream");
    let (_i, msg1) = Initiator::start(
        &me,
        &exec_key,
        &p,
        bundle.harness_key_authorization.as_bytes(),
        &mut OsRandom,
    )
    .unwrap();
    ws.send(Message::Binary(
        Frame::handshake("s1", msg1).encode().into(),
    ))
    .await
    .unwrap();
    assert!(is_protocol_reset(&next_frame(&mut ws).await, "s1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_or_forged_relay_urls_are_refused_with_a_reason() {
    let s = setup("e4").await;
    let key = s.store.signing_key().await.unwrap();
    let reg = s.store.registration("e4").await.unwrap().unwrap();
    let grant = Grant {
        role: Role::Harness,
        environment_id: "e4".into(),
        registration_id: reg.registration_id.clone(),
        nonce: None,
    };
    let ws_base = s.base.replace("http://", "ws://");
    for (query, reason) in [
        (signing::sign(&key, &grant, 1), "expired"),
        (
            signing::sign(&[9; 32], &grant, u64::MAX / 2),
            "invalid_signature",
        ),
        ("role=harness".to_string(), "missing_expiry"),
    ] {
        let err = tokio_tungstenite::connect_async(format!("{ws_base}/relay?{query}"))
            .await
            .unwrap_err();
        match err {
            tokio_tungstenite::tungstenite::Error::Http(resp) => {
                assert_eq!(resp.status().as_u16(), 403);
                assert_eq!(
                    resp.headers()["x-codex-rendezvous-rejection-reason"],
                    reason
                );
            }
            other => panic!("expected an HTTP refusal, got {other}"),
        }
    }
}

/// The status of a raw `GET target` carrying a WebSocket key and `headers`.
async fn raw_upgrade(base: &str, target: &str, headers: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\n{headers}Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut head = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut head))
        .await
        .unwrap()
        .unwrap();
    std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap()
}

/// The HTTP refusal of a relay upgrade: status and rejection reason.
async fn refusal(url: &str) -> (u16, String) {
    match tokio_tungstenite::connect_async(url).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            let reason = resp.headers()["x-codex-rendezvous-rejection-reason"]
                .to_str()
                .unwrap()
                .to_string();
            (resp.status().as_u16(), reason)
        }
        Err(other) => panic!("expected an HTTP refusal, got {other}"),
        Ok(_) => panic!("{url} was accepted"),
    }
}

/// A harness's relay URL opens one socket: a second upgrade with it (a
/// leaked URL) is refused, and the URL's nonce is no authorization for
/// `/validate`, nor used up by one.
#[tokio::test]
async fn a_harness_url_opens_one_socket_only() {
    let s = setup("e10").await;
    let me = Identity::generate(&mut OsRandom);
    let bundle = s.client.connect("e10", &me.public_key()).await.unwrap();
    let url = url::Url::parse(&bundle.url).unwrap();
    let nonce = url
        .query_pairs()
        .find(|(k, _)| k == "n")
        .map(|(_, v)| v.into_owned())
        .expect("a harness URL has a nonce");
    let body = serde_json::json!({
        "executor_registration_id": bundle.executor_registration_id,
        "harness_public_key": me.public_key().to_wire(),
        "harness_key_authorization": format!("url_{nonce}"),
    });
    let (status, answer) = raw_post(
        &s.base,
        "/cloud/environment/e10/validate",
        &body.to_string(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&answer).unwrap()["valid"],
        false
    );
    // Malformed upgrades are refused before the URL is admitted, so they
    // do not use it up.
    let target = format!("/relay?{}", url.query().unwrap());
    for headers in [
        "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n",
        "Upgrade: websocket\r\nConnection: keep-alive\r\nSec-WebSocket-Version: 13\r\n",
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 8\r\n",
    ] {
        assert_eq!(
            raw_upgrade(&s.base, &target, headers).await,
            400,
            "{headers}"
        );
    }
    let (first, _) = tokio_tungstenite::connect_async(bundle.url.as_str())
        .await
        .expect("the first upgrade with the URL");
    assert_eq!(refusal(&bundle.url).await, (403, "expired".to_string()));
    drop(first);
    // A new /connect gives a new URL that works.
    let again = s.client.connect("e10", &me.public_key()).await.unwrap();
    assert_ne!(again.url, bundle.url);
    let (ws, _) = tokio_tungstenite::connect_async(again.url.as_str())
        .await
        .unwrap();
    drop(ws);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frames_close_only_their_socket() {
    let s = setup("e5").await;
    let me = Identity::generate(&mut OsRandom);
    let mut good = harness::connect(&s.client, "e5", &me).await.unwrap();
    let (mut ws, _) = raw_socket(&s, "e5", "big").await;
    // Over what a harness may send in one message (a Noise message and its
    // head), though under the 256 KiB an executor may.
    let _ = ws
        .send(Message::Binary(
            Frame::data("big", 0, vec![0; 100 * 1024]).encode().into(),
        ))
        .await;
    assert!(
        next_frame(&mut ws).await.is_none(),
        "the relay closes the oversized socket"
    );
    echo(&mut good, b"still here").await;
    // A 1 MiB message crosses as 18 records and comes back whole.
    let big = vec![b'z'; 1024 * 1024];
    echo(&mut good, &big).await;
}

#[tokio::test]
async fn a_registry_answering_garbage_is_a_clear_error() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        for body in [
            "HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nnot json",
            "HTTP/1.1 302 Found\r\nlocation: http://example.com/\r\ncontent-length: 0\r\n\r\n",
        ] {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 8192];
            let _ = s.read(&mut buf).await;
            s.write_all(body.as_bytes()).await.unwrap();
            let _ = s.shutdown().await;
        }
    });
    let c = RegistryClient::new(&format!("http://{addr}"), "t", None, true).unwrap();
    let me = Identity::generate(&mut OsRandom);
    match harness::connect(&c, "env", &me).await {
        Err(HarnessError::Registry(RegistryError::Protocol(m))) => {
            assert!(m.contains("invalid connect response"), "{m}")
        }
        other => panic!("{:?}", other.err()),
    }
    // A redirect is not followed.
    match c.connect("env", &me.public_key()).await {
        Err(RegistryError::Http { status: 302, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(
        RegistryClient::new("http://example.com", "t", None, true).is_err(),
        "plain http off loopback"
    );
    assert!(
        RegistryClient::new("http://127.0.0.1:1", "  ", None, true).is_err(),
        "blank token"
    );
}

/// 8 failed handshakes pause new ones for 10 s; the established stream keeps
/// working throughout, and admission resumes after the pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_budget_pauses_new_handshakes_only() {
    let s = setup("e6").await;
    let me = Identity::generate(&mut OsRandom);
    let mut good = harness::connect(&s.client, "e6", &me).await.unwrap();
    for i in 0..10 {
        let sid = format!("garbage-{i}");
        let (mut ws, _) = raw_socket(&s, "e6", &sid).await;
        ws.send(Message::Binary(
            Frame::handshake(&sid, vec![1; 3600]).encode().into(),
        ))
        .await
        .unwrap();
        let reset = next_frame(&mut ws).await;
        if i < executor::mux::MAX_FAILED_HANDSHAKES as usize {
            assert!(is_protocol_reset(&reset, &sid), "{i}: {reset:?}");
        } else {
            // Paused: refused as busy before being read.
            assert!(
                matches!(&reset, Some(Frame { body: Some(Body::Reset { reason }), .. })
                    if reason == exec_server_relay::frame::RESET_EXECUTOR_BUSY),
                "{i}: {reset:?}"
            );
        }
    }
    let paused_at = Instant::now();
    match harness::connect(&s.client, "e6", &me).await {
        Err(HarnessError::Refused(reason))
            if reason == exec_server_relay::frame::RESET_EXECUTOR_BUSY => {}
        other => panic!("a legitimate harness during the pause: {:?}", other.err()),
    }
    echo(&mut good, b"unaffected").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut ch = loop {
        match harness::connect(&s.client, "e6", &me).await {
            Ok(ch) => break ch,
            Err(_) => {
                assert!(Instant::now() < deadline, "admission never resumed");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    };
    assert!(
        paused_at.elapsed() >= Duration::from_secs(8),
        "paused {:?}",
        paused_at.elapsed()
    );
    echo(&mut ch, b"admitted again").await;
}

fn is_conflict(r: &Result<exec_server_relay::api::RegisterResponse, RegistryError>) -> bool {
    matches!(r, Err(RegistryError::Http { status: 503, code, message })
        if code == "registration_conflict" && message.contains("connected"))
}

/// A second registration of an environment whose executor is connected is
/// refused with `503 registration_conflict` (what executors retry), and the
/// live executor keeps its registration and stays reachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_registration_while_the_executor_is_connected_is_refused() {
    let s = setup("c1").await;
    let before = s.store.registration("c1").await.unwrap().unwrap();
    let intruder = RegistryClient::new(&s.base, "exec", None, true).unwrap();
    let key = Identity::generate(&mut OsRandom).public_key();
    for _ in 0..2 {
        let r = intruder.register("c1", &key).await;
        assert!(is_conflict(&r), "{r:?}");
    }
    assert_eq!(
        s.store.registration("c1").await.unwrap(),
        Some(before.clone())
    );
    let me = Identity::generate(&mut OsRandom);
    let bundle = s.client.connect("c1", &me.public_key()).await.unwrap();
    assert_eq!(bundle.executor_registration_id, before.registration_id);
    let mut ch = harness::connect(&s.client, "c1", &me).await.unwrap();
    echo(&mut ch, b"still the live executor").await;
}

/// `POST` with exactly these path bytes; the answer's status and body.
async fn raw_post(base: &str, path: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nAuthorization: Bearer t\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8(out).unwrap();
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
    (status, body.unwrap_or_default())
}

/// Environment ids are `[A-Za-z0-9_-]{1,256}`: anything else is a 400
/// `invalid_environment_id` on every endpoint, and the answer does not echo it.
#[tokio::test]
async fn bad_environment_ids_are_refused_on_every_endpoint() {
    use exec_server_relay::api::{ConnectRequest, RegisterRequest, ValidateRequest};
    let (base, _store) = start_registry(Config::default()).await;
    let key = Identity::generate(&mut OsRandom).public_key().to_wire();
    let bodies = [
        (
            "register",
            serde_json::to_string(&RegisterRequest {
                security_profile: exec_server_relay::keys::SECURITY_PROFILE.into(),
                executor_public_key: key.clone(),
            })
            .unwrap(),
        ),
        (
            "connect",
            serde_json::to_string(&ConnectRequest {
                harness_public_key: key.clone(),
            })
            .unwrap(),
        ),
        (
            "validate",
            serde_json::to_string(&ValidateRequest {
                executor_registration_id: "reg".into(),
                harness_public_key: key.clone(),
                harness_key_authorization: "hka".into(),
            })
            .unwrap(),
        ),
    ];
    let long = "x".repeat(257);
    let bad = [
        "..",
        "a%2F..%2F..%2Fx",
        "a%00b",
        "a%0Ab",
        "%E2%80%AEabc",
        "a.b",
        "a%20",
        "a&b=c",
        long.as_str(),
    ];
    for id in bad {
        for (action, body) in &bodies {
            let (status, reply) =
                raw_post(&base, &format!("/cloud/environment/{id}/{action}"), body).await;
            assert_eq!(status, 400, "{id} {action}: {reply}");
            let v: serde_json::Value = serde_json::from_str(&reply).unwrap();
            assert_eq!(
                v["error"]["code"], "invalid_environment_id",
                "{id} {action}"
            );
            let message = v["error"]["message"].as_str().unwrap();
            assert!(message.contains("A-Z"), "{message}");
            assert!(!reply.contains(id), "{id} echoed: {reply}");
        }
    }
    // The longest id is accepted.
    let longest = "y".repeat(256);
    let (status, reply) = raw_post(
        &base,
        &format!("/cloud/environment/{longest}/register"),
        &bodies[0].1,
    )
    .await;
    assert_eq!(status, 200, "{reply}");
}

/// Registers `env` and opens its relay socket by hand over raw TCP: an
/// executor that is attached but never answers (not even the relay's Pings).
async fn silent_executor(base: &str, env: &str) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let c = RegistryClient::new(base, "exec", None, true).unwrap();
    let key = Identity::generate(&mut OsRandom).public_key();
    let reg = c.register(env, &key).await.unwrap();
    let (host, path) = reg
        .url
        .strip_prefix("ws://")
        .and_then(|r| r.split_once('/'))
        .unwrap();
    let mut s = tokio::net::TcpStream::connect(host).await.unwrap();
    let req = format!(
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut b))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n, 1, "relay closed during the upgrade");
        head.push(b[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "{head:?}");
    s
}

/// Reads (never answering) until the relay closes the socket; what it sent.
async fn read_until_closed(s: &mut tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf))
            .await
            .expect("the relay never dropped the socket")
        {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Tells a test when the executor hits a conflict and when it registered.
struct RegistrationEvents(tokio::sync::mpsc::UnboundedSender<&'static str>);

impl executor::Observer for RegistrationEvents {
    fn registered(&self) {
        let _ = self.0.send("registered");
    }
    fn registration_conflict(&self) {
        let _ = self.0.send("conflict");
    }
}

/// Our executor, refused because another executor's socket is attached,
/// retries; once that socket is gone it registers and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_executor_retries_a_registration_conflict_until_the_live_socket_is_gone() {
    let (base, store) = start_registry(Config::default()).await;
    let live = silent_executor(&base, "c2").await;
    let first = store.registration("c2").await.unwrap().unwrap();
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let config = executor::Config {
        registry: RegistryClient::new(&base, "exec", None, true).unwrap(),
        environment_id: "c2".into(),
        keepalive: executor::KEEPALIVE,
        pong_timeout: executor::PONG_TIMEOUT,
        observer: Arc::new(RegistrationEvents(tx)),
        transport_cipher: exec_server_relay::TransportCipher::preferred(),
    };
    let ours = tokio::spawn(executor::run(config, echo_handler()));
    let event = tokio::time::timeout(Duration::from_secs(10), events.recv()).await;
    assert_eq!(event.unwrap(), Some("conflict"));
    assert_eq!(store.registration("c2").await.unwrap(), Some(first.clone()));
    assert!(events.try_recv().is_err(), "no registration while it lives");
    // The live executor goes away (its socket closes): ours gets in.
    drop(live);
    let registered = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(e) = events.recv().await {
            if e == "registered" {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(registered.ok(), Some(true));
    assert_ne!(store.registration("c2").await.unwrap(), Some(first));
    let client = RegistryClient::new(&base, "harness", None, true).unwrap();
    let mut ch = connect_when_attached(&client, "c2").await;
    echo(&mut ch, b"the new executor").await;
    ours.abort();
}

/// A socket that sends nothing (not even Pongs to the relay's Pings) counts
/// as live only until the silence timeout: then the relay drops it and a new
/// registration succeeds at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_executor_socket_blocks_registration_only_until_the_silence_timeout() {
    let silence = Duration::from_millis(1500);
    let config = Config {
        executor_silence_timeout: silence,
        ..Config::default()
    };
    let (base, store) = start_registry(config).await;
    let mut silent = silent_executor(&base, "c3").await;
    let attached = Instant::now();
    let other = RegistryClient::new(&base, "exec", None, true).unwrap();
    let key = Identity::generate(&mut OsRandom).public_key();
    let r = other.register("c3", &key).await;
    assert!(is_conflict(&r), "{r:?}");
    let got = read_until_closed(&mut silent).await;
    let waited = attached.elapsed();
    assert!(waited >= silence.mul_f64(0.9), "dropped after {waited:?}");
    assert_eq!(got.first(), Some(&0x89), "the relay pinged it first");
    let reg = other.register("c3", &key).await.unwrap();
    let now = store.registration("c3").await.unwrap().unwrap();
    assert_eq!(now.registration_id, reg.executor_registration_id);
    let me = Identity::generate(&mut OsRandom);
    let bundle = other.connect("c3", &me.public_key()).await.unwrap();
    assert_eq!(
        bundle.executor_registration_id,
        reg.executor_registration_id
    );
}

/// A store whose authorizations are taken late: the registry's `/validate`
/// answers after `delay`, so an executor holds its new streams that long.
struct SlowValidation {
    inner: MemoryStore,
    delay: Duration,
}

#[async_trait::async_trait]
impl Store for SlowValidation {
    async fn put_registration(&self, r: Registration) -> Result<(), StoreError> {
        self.inner.put_registration(r).await
    }
    async fn registration(&self, environment_id: &str) -> Result<Option<Registration>, StoreError> {
        self.inner.registration(environment_id).await
    }
    async fn put_authorization(&self, token: &str, a: Authorization) -> Result<(), StoreError> {
        self.inner.put_authorization(token, a).await
    }
    async fn take_authorization(
        &self,
        token: &str,
        now_unix: u64,
    ) -> Result<Option<Authorization>, StoreError> {
        tokio::time::sleep(self.delay).await;
        self.inner.take_authorization(token, now_unix).await
    }
    async fn signing_key(&self) -> Result<[u8; 32], StoreError> {
        self.inner.signing_key().await
    }
}

/// A harness stream on a raw socket, past its handshake: the socket and
/// the stream's sealing and opening halves.
async fn handshaken(
    client: &RegistryClient,
    env: &str,
    sid: &str,
) -> (
    Ws,
    exec_server_relay::stream::SendHalf,
    exec_server_relay::stream::RecvHalf,
) {
    let me = Identity::generate(&mut OsRandom);
    let (mut ws, init) = send_msg1(client, env, sid, &me, None).await;
    let Some(Frame {
        body: Some(Body::Handshake { payload }),
        ..
    }) = next_frame(&mut ws).await
    else {
        panic!("no msg2");
    };
    let (send, recv) = exec_server_relay::stream::halves(
        sid,
        init.finish(&payload, exec_server_relay::TransportCipher::AesGcm)
            .unwrap(),
    );
    (ws, send, recv)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_held_until_admitted_and_reset_past_its_budget() {
    use exec_server_relay::executor::mux::MAX_HELD_BYTES;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let store = Arc::new(SlowValidation {
        inner: MemoryStore::default(),
        delay: Duration::from_millis(1500),
    });
    let reg = Registry::new(Config::default(), store, format!("ws://{addr}"))
        .await
        .unwrap();
    tokio::spawn(reg.serve(l));
    let base = format!("http://{addr}");
    tokio::spawn(executor::run(
        executor::Config {
            registry: RegistryClient::new(&base, "exec", None, true).unwrap(),
            environment_id: "e9".into(),
            keepalive: executor::KEEPALIVE,
            pong_timeout: executor::PONG_TIMEOUT,
            observer: Arc::new(executor::NoObserver),
            transport_cipher: exec_server_relay::TransportCipher::preferred(),
        },
        echo_handler(),
    ));
    let client = RegistryClient::new(&base, "harness", None, true).unwrap();
    drop(connect_when_attached(&client, "e9").await);

    // Within its budget while the registry thinks: kept, then all of it
    // is served once admitted.
    let (mut ws, mut send, mut recv) = handshaken(&client, "e9", "within").await;
    let sent_at = Instant::now();
    let message = vec![7u8; MAX_HELD_BYTES / 4];
    for _ in 0..3 {
        for f in send.seal(&message).unwrap() {
            ws.send(Message::Binary(f.into())).await.unwrap();
        }
    }
    let mut echoed = 0;
    while echoed < 3 * message.len() {
        match next_frame(&mut ws).await {
            Some(Frame {
                body: Some(Body::Data { seq, payload, .. }),
                ..
            }) => {
                // Nothing comes back before the registry has answered.
                assert!(sent_at.elapsed() >= Duration::from_millis(1400));
                for m in recv.open(seq, payload).unwrap() {
                    assert!(m.iter().all(|b| *b == 7));
                    echoed += m.len();
                }
            }
            other => panic!("echo expected, got {other:?}"),
        }
    }

    // Past its budget before the answer: reset at once, nothing served.
    let (mut ws, mut send, _recv) = handshaken(&client, "e9", "over").await;
    let sent_at = Instant::now();
    let message = vec![9u8; MAX_HELD_BYTES / 4];
    for _ in 0..5 {
        for f in send.seal(&message).unwrap() {
            ws.send(Message::Binary(f.into())).await.unwrap();
        }
    }
    let f = next_frame(&mut ws).await;
    assert!(is_protocol_reset(&f, "over"), "{f:?}");
    assert!(
        sent_at.elapsed() < Duration::from_millis(1400),
        "reset for its budget, not after the registry's answer"
    );
}
