//! Hostile and broken peers against our registry, relay and executor (in
//! process, loopback): each gets a clear outcome and no other stream is disturbed.

use exec_server_relay::executor::{self, StreamHandler};
use exec_server_relay::frame::{Body, Frame, RESET_PROTOCOL_ERROR};
use exec_server_relay::harness::{self, HarnessError};
use exec_server_relay::keys::{prologue, Identity, PublicKey};
use exec_server_relay::noise::{Initiator, OsRandom};
use exec_server_relay::registry::signing::{self, Grant, Role};
use exec_server_relay::registry::store::{MemoryStore, Store};
use exec_server_relay::registry::{Config, Registry};
use exec_server_relay::registry_client::{RegistryClient, RegistryError};
use exec_server_relay::stream::Channel;
use futures_util::{SinkExt, StreamExt};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

struct Setup {
    base: String,
    store: Arc<MemoryStore>,
    client: RegistryClient,
}

/// Registry + an executor whose streams echo every message back.
async fn setup(env: &str) -> Setup {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let store = Arc::new(MemoryStore::default());
    let reg = Registry::new(Config::default(), store.clone(), format!("ws://{addr}")).unwrap();
    tokio::spawn(reg.serve(l));
    let base = format!("http://{addr}");
    let handler: StreamHandler = Arc::new(|mut ch: Channel| {
        tokio::spawn(async move {
            while let Some(m) = ch.inbound.recv().await {
                if ch.outbound.send(m).await.is_err() {
                    break;
                }
            }
        });
    });
    let config = executor::Config {
        registry: RegistryClient::new(&base, "exec", None, true).unwrap(),
        environment_id: env.into(),
        keepalive: executor::KEEPALIVE,
        pong_timeout: executor::PONG_TIMEOUT,
        observer: std::sync::Arc::new(executor::NoObserver),
    };
    tokio::spawn(executor::run(config, handler));
    let client = RegistryClient::new(&base, "harness", None, true).unwrap();
    let s = Setup {
        base,
        store,
        client,
    };
    // Wait (bounded) for the executor to attach.
    let me = Identity::generate(&mut OsRandom);
    let deadline = Instant::now() + Duration::from_secs(10);
    while harness::connect(&s.client, env, &me).await.is_err() {
        assert!(Instant::now() < deadline, "executor never attached");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s
}

async fn echo(ch: &mut Channel, msg: &[u8]) {
    ch.outbound.send(msg.to_vec()).await.unwrap();
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
    let bundle = s.client.connect("e2", &mallory.public_key()).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::connect_async(bundle.url.as_str())
        .await
        .unwrap();
    let sid = "mallory-stream";
    let exec_key = PublicKey::from_wire(&bundle.executor_public_key).unwrap();
    let p = prologue("e2", &bundle.executor_registration_id, sid);
    let (_init, msg1) = Initiator::start(
        &mallory,
        &exec_key,
        &p,
        alices.harness_key_authorization.as_bytes(),
        &mut OsRandom,
    )
    .unwrap();
    ws.send(Message::Binary(Frame::resume(sid).encode().into()))
        .await
        .unwrap();
    ws.send(Message::Binary(Frame::handshake(sid, msg1).encode().into()))
        .await
        .unwrap();
    assert!(is_protocol_reset(&next_frame(&mut ws).await, sid));
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
    let key = s.store.signing_key().unwrap();
    let reg = s.store.registration("e4").unwrap().unwrap();
    let grant = Grant {
        role: Role::Harness,
        environment_id: "e4".into(),
        registration_id: reg.registration_id.clone(),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frames_close_only_their_socket() {
    let s = setup("e5").await;
    let me = Identity::generate(&mut OsRandom);
    let mut good = harness::connect(&s.client, "e5", &me).await.unwrap();
    let (mut ws, _) = raw_socket(&s, "e5", "big").await;
    let _ = ws
        .send(Message::Binary(
            Frame::data("big", 0, vec![0; 300 * 1024]).encode().into(),
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
        assert!(is_protocol_reset(&next_frame(&mut ws).await, &sid));
    }
    let paused_at = Instant::now();
    match harness::connect(&s.client, "e6", &me).await {
        Err(HarnessError::Refused) => {}
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
