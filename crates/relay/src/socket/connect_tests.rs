use super::*;
use crate::socket::Message;
use bytes::Bytes;
use exec_server_wsframe::frame::{header, OpCode};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

const LIMIT: usize = 1 << 20;
const WAIT: Duration = Duration::from_secs(10);

/// Reads an upgrade request's head from `tcp`: the head, then any bytes
/// that came behind it.
async fn read_request_head(tcp: &mut TcpStream) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return (String::from_utf8(buf).unwrap(), rest);
        }
        let n = tcp.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the client closed before its request head ended");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The value of header `name` in a request head.
fn header_value<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

async fn listener() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/relay?x=1", l.local_addr().unwrap());
    (l, url)
}

#[tokio::test]
async fn early_frames_reach_the_node_before_the_upgrade_is_answered() {
    let (l, url) = listener().await;
    let node = tokio::spawn(async move {
        let (mut tcp, _) = l.accept().await.unwrap();
        let (head, rest) = read_request_head(&mut tcp).await;
        assert!(head.starts_with("GET /relay?x=1 HTTP/1.1\r\n"), "{head}");
        assert_eq!(header_value(&head, "x-extra"), Some("yes"));
        let key = header_value(&head, "sec-websocket-key")
            .unwrap()
            .to_string();
        // Nothing has been answered yet: both early frames must already be
        // on their way.
        let (r, mut w) = tcp.into_split();
        let mut frames = Reader::new(Cursor::new(rest).chain(r), Role::Server, LIMIT);
        for want in [&b"resume"[..], &b"msg1"[..]] {
            let m = tokio::time::timeout(WAIT, frames.next())
                .await
                .expect("an early frame before any answer")
                .unwrap();
            assert_eq!(m, Some(Message::Binary(Bytes::from_static(want))));
        }
        // The answer and a first frame in one write: the client must find
        // the frame among the bytes it read with the answer's head.
        let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
        let mut answer = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
        )
        .into_bytes();
        answer.extend_from_slice(header(true, OpCode::Binary, 4, None).as_slice());
        answer.extend_from_slice(b"msg2");
        w.write_all(&answer).await.unwrap();
        w
    });
    let mut early = vec![
        Outgoing::Binary(Bytes::from_static(b"resume")),
        Outgoing::Binary(Bytes::from_static(b"msg1")),
    ];
    let (mut reader, _writer) = tokio::time::timeout(
        WAIT,
        connect_sending(&url, &[("x-extra", "yes".into())], LIMIT, &mut early),
    )
    .await
    .expect("the upgrade answered")
    .unwrap();
    assert!(early.is_empty());
    let m = tokio::time::timeout(WAIT, reader.next()).await.unwrap();
    assert_eq!(
        m.unwrap(),
        Some(Message::Binary(Bytes::from_static(b"msg2")))
    );
    drop(node.await.unwrap());
}

/// Runs a node that answers the upgrade with `answer` (`{accept}` replaced
/// by the right key's accept value) and returns what `connect` made of it.
async fn connect_answered(answer: &'static str) -> Result<ClientSocket, ConnectError> {
    let (l, url) = listener().await;
    let node = tokio::spawn(async move {
        let (mut tcp, _) = l.accept().await.unwrap();
        let (head, _) = read_request_head(&mut tcp).await;
        let key = header_value(&head, "sec-websocket-key")
            .unwrap()
            .to_string();
        let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
        tcp.write_all(answer.replace("{accept}", &accept).as_bytes())
            .await
            .unwrap();
        // Done writing: a cut answer then ends at the connection's end.
        tcp.shutdown().await.unwrap();
        tcp
    });
    let got = tokio::time::timeout(WAIT, connect(&url, &[], LIMIT))
        .await
        .expect("an outcome");
    drop(node.await.unwrap());
    got
}

#[tokio::test]
async fn a_refused_upgrade_reports_its_status_and_reason() {
    let answer = "HTTP/1.1 403 Forbidden\r\nX-Codex-Rendezvous-Rejection-Reason: expired\r\ncontent-length: 0\r\n\r\n";
    let err = connect_answered(answer).await.err().expect("refused");
    assert!(
        matches!(&err, ConnectError::Refused { status: 403, reason: Some(r) } if r == "expired"),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_wrong_accept_key_or_a_closed_connection_fails_the_upgrade() {
    let wrong = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: AAAA\r\n\r\n";
    assert!(matches!(
        connect_answered(wrong).await,
        Err(ConnectError::Failed(_))
    ));
    let good = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n";
    // Without naming the upgrade, a 101 is not one (RFC 6455 §4.1).
    let unnamed = "HTTP/1.1 101 Switching Protocols\r\nSec-WebSocket-Accept: {accept}\r\n\r\n";
    assert!(matches!(
        connect_answered(unnamed).await,
        Err(ConnectError::Failed(_))
    ));
    assert!(connect_answered(good).await.is_ok());
    let cut = "HTTP/1.1 101 Switching";
    assert!(matches!(
        connect_answered(cut).await,
        Err(ConnectError::Failed(_))
    ));
}

#[test]
fn a_header_that_would_break_the_request_is_refused() {
    for (name, value) in [
        ("x-a", "b\r\nx-c: d"),
        ("x:a", "b"),
        ("", "b"),
        ("x a", "b"),
    ] {
        let got = request_head("/", "h", "k", &[(name, value.to_string())]);
        assert!(
            matches!(got, Err(ConnectError::Header(_))),
            "{name:?}: {value:?}"
        );
    }
    let ok = request_head("/p", "h:1", "k", &[("x-a", "b c".into())]).unwrap();
    assert!(String::from_utf8(ok)
        .unwrap()
        .ends_with("\r\nx-a: b c\r\n\r\n"));
}

#[tokio::test]
async fn a_node_that_never_answers_fails_the_upgrade_within_its_bound() {
    let (l, url) = listener().await;
    // Accepts and reads the request, then says nothing.
    let node = tokio::spawn(async move {
        let (mut tcp, _) = l.accept().await.unwrap();
        let _ = read_request_head(&mut tcp).await;
        tcp
    });
    let started = std::time::Instant::now();
    let bound = Duration::from_millis(300);
    let got = tokio::time::timeout(
        WAIT,
        connect_within(&url, &[], LIMIT, &mut Vec::new(), bound),
    )
    .await
    .expect("the bound ends the attempt");
    assert!(
        matches!(&got, Err(ConnectError::Failed(why)) if why.contains("no answer")),
        "{:?}",
        got.err()
    );
    assert!(started.elapsed() >= bound);
    drop(node.await.unwrap());
}
