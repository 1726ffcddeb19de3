//! stdio and Unix-socket transports, and the paths the Codex CLI takes.

use crate::common;
use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::Duration;

fn read_until(reader: &mut impl BufRead, pred: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..1000 {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 {
            panic!("stream ended");
        }
        let v: Value = serde_json::from_str(&line).unwrap();
        if pred(&v) {
            return v;
        }
    }
    panic!("no matching message in 1000 lines");
}

#[test]
fn stdio_one_message_per_line() {
    let d = tmpdir("stdio");
    let mut child = crate::common::server_command(BIN)
        .args(["--listen", "stdio"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    // A watchdog: a hung server must fail the test, not hang it.
    let pid = child.id() as i32;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog_done = done.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(20));
        if !watchdog_done.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    });
    let start = json!({"id": 2, "method": "process/start", "params": start_params("p1", &["echo", "hi"], &d, false, false)});
    let script = format!(
        "{}\n\n{}\n{}\n{{\"a\":1}} {{\"b\":2}}\n",
        json!({"id": 1, "method": "initialize", "params": {"clientName": "t"}}),
        json!({"method": "initialized"}),
        start
    );
    stdin.write_all(script.as_bytes()).unwrap();
    let r = read_until(&mut out, |v| v["id"] == 1);
    assert!(r["result"]["sessionId"].is_string());
    let r = read_until(&mut out, |v| v["id"] == 2);
    assert_eq!(r["result"]["processId"], "p1");
    let (mut output, mut error) = (None, None);
    while output.is_none() || error.is_none() {
        let v = read_until(&mut out, |v| {
            v["method"] == "process/output" || v["id"] == -1
        });
        if v["id"] == -1 {
            error = Some(v);
        } else {
            output = Some(v);
        }
    }
    let (o, e) = (output.unwrap(), error.unwrap());
    assert_eq!(unb64(&o["params"]["chunk"]), b"hi\n");
    assert_eq!(e["error"]["code"], -32600);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("trailing characters"),
        "{e}"
    );
    drop(stdin); // EOF ends the server
    let status = child.wait().unwrap();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(status.success());
}

#[tokio::test]
async fn unix_socket_mode_0600_and_stale_file() {
    use std::os::unix::fs::PermissionsExt;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let d = tmpdir("unix");
    let sock = d.join("s.sock");
    // A stale socket file left by a dead server is replaced.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let url = format!("unix://{}", sock.display());
    let mut child = crate::common::server_command(BIN)
        .args(["--listen", &url])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(first_stdout_line(&mut child), url);
    assert_eq!(
        std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let s = tokio::net::UnixStream::connect(&sock).await.unwrap();
    let (r, mut w) = s.into_split();
    let mut r = tokio::io::BufReader::new(r);
    w.write_all(
        format!(
            "{}\n{}\n",
            json!({"id": 1, "method": "initialize", "params": {"clientName": "t"}}),
            json!({"method": "initialized"})
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    w.write_all(format!("{}\n", json!({"id": 2, "method": "environment/status"})).as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..2 {
        let mut l = String::new();
        tokio::time::timeout(Duration::from_secs(5), r.read_line(&mut l))
            .await
            .unwrap()
            .unwrap();
        got.push(serde_json::from_str::<Value>(&l).unwrap());
    }
    assert_eq!(got[1], json!({"id": 2, "result": {"status": "ready"}}));
    // A second server on the same live socket refuses to start.
    let second = crate::common::server_command(BIN)
        .args(["--listen", &url])
        .output()
        .unwrap();
    assert!(!second.status.success());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
    assert!(!sock.exists(), "socket file removed on shutdown");
}

/// The Codex CLI sends envPolicy inherit all, listens to notifications only,
/// terminates each process after it exits, and types into PTYs.
#[tokio::test]
async fn codex_client_paths() {
    let mut child = crate::common::server_command(BIN)
        .args(["--listen", "ws://127.0.0.1:0"])
        .env("VISIBLE_VAR", "yes")
        .env("MY_API_KEY", "secret")
        .env("EXEC_SERVER_TOKEN", "server-secret")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let url = first_stdout_line(&mut child);
    let server = Server { child, url };
    let d = tmpdir("codex");
    let mut c = Conn::open(&server.url, None).await;
    let mut p = start_params("env", &["/usr/bin/env"], &d, false, false);
    p["env"] = json!({"EXTRA": "1"});
    p["envPolicy"] = json!({"inherit": "all", "ignoreDefaultExcludes": false, "exclude": [], "set": {}, "includeOnly": []});
    c.ok("process/start", p).await;
    let n = c.collect("env", WAIT).await;
    let text = String::from_utf8_lossy(&n.bytes);
    assert!(
        text.contains("VISIBLE_VAR=yes") && text.contains("EXTRA=1"),
        "{text}"
    );
    assert!(
        !text.contains("MY_API_KEY") && !text.contains("server-secret"),
        "{text}"
    );
    let r = c.ok("process/terminate", json!({"processId": "env"})).await;
    assert_eq!(r["running"], json!(false));

    c.ok(
        "process/start",
        start_params("tty", &["cat"], &d, true, false),
    )
    .await;
    let w = c
        .ok(
            "process/write",
            json!({"processId": "tty", "chunk": b64(b"hi\n"), "writeId": "1"}),
        )
        .await;
    assert_eq!(w["status"], "accepted");
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("hi\r\nhi\r\n") {
        let m = c
            .expect(
                |m| m["method"] == "process/output" && m["params"]["processId"] == "tty",
                WAIT,
            )
            .await
            .expect("echo");
        seen.extend(unb64(&m["params"]["chunk"]));
    }
    c.ok(
        "process/resize",
        json!({"processId": "tty", "cols": 100, "rows": 40}),
    )
    .await;
    let r = c.ok("process/terminate", json!({"processId": "tty"})).await;
    assert_eq!(r["running"], json!(true));
    assert_eq!(c.collect("tty", WAIT).await.exit, Some(137));
}

#[tokio::test]
async fn pty_size_and_resize() {
    let s = Server::start(&[]);
    let d = tmpdir("resize");
    let mut c = Conn::open(&s.url, None).await;
    let mut p = start_params(
        "sz",
        &["sh", "-c", "stty size; read x; stty size"],
        &d,
        true,
        false,
    );
    p["ptySize"] = json!({"cols": 120, "rows": 33});
    c.ok("process/start", p).await;
    c.expect(
        |m| {
            m["method"] == "process/output"
                && String::from_utf8_lossy(&unb64(&m["params"]["chunk"])).contains("33 120")
        },
        WAIT,
    )
    .await
    .expect("initial size");
    c.ok(
        "process/resize",
        json!({"processId": "sz", "cols": 90, "rows": 20}),
    )
    .await;
    c.ok(
        "process/write",
        json!({"processId": "sz", "chunk": b64(b"\n"), "writeId": "1"}),
    )
    .await;
    let n = c.collect("sz", WAIT).await;
    assert!(
        String::from_utf8_lossy(&n.bytes).contains("20 90"),
        "{:?}",
        String::from_utf8_lossy(&n.bytes)
    );
}

#[tokio::test]
async fn extended_signals_and_unknown_signal() {
    let s = Server::start(&[]);
    let d = tmpdir("sig");
    let mut c = Conn::open(&s.url, None).await;
    for (sig, code) in [
        ("terminate", 143),
        ("kill", 137),
        ("hangup", 129),
        ("user1", 138),
    ] {
        let id = format!("s-{sig}");
        c.ok(
            "process/start",
            start_params(&id, &["sleep", "30"], &d, false, false),
        )
        .await;
        c.ok("process/signal", json!({"processId": id, "signal": sig}))
            .await;
        assert_eq!(c.collect(&id, WAIT).await.exit, Some(code), "{sig}");
    }
    let r = c
        .call(
            "process/signal",
            json!({"processId": "x", "signal": "bogus"}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32602);
}

/// A long-poll never delays other requests, even at --concurrent-requests 1,
/// while requests about one process keep their order.
#[tokio::test]
async fn long_poll_does_not_block_other_requests() {
    let s = Server::start(&["--concurrent-requests", "1"]);
    let d = tmpdir("lp");
    let mut c = Conn::open(&s.url, None).await;
    c.ok(
        "process/start",
        start_params("cat", &["cat"], &d, false, true),
    )
    .await;
    let read_id = c
        .send(
            "process/read",
            json!({"processId": "cat", "afterSeq": 0, "waitMs": 5000}),
        )
        .await;
    let t0 = std::time::Instant::now();
    let st = c.send("environment/status", Value::Null).await;
    c.response(st).await;
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "status waited {:?} behind a long-poll",
        t0.elapsed()
    );
    c.ok(
        "process/write",
        json!({"processId": "cat", "chunk": b64(b"x\n"), "writeId": "1"}),
    )
    .await;
    let r = c.response(read_id).await;
    assert_eq!(unb64(&r["result"]["chunks"][0]["chunk"]), b"x\n");
    c.ok("process/terminate", json!({"processId": "cat"})).await;
}

/// A message above --max-message-bytes is refused with close code 1009, and the
/// server keeps serving other connections.
#[tokio::test]
async fn oversized_message_closes_with_1009() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message as Ws;
    let s = Server::start(&["--max-message-bytes", "1048576"]);
    let (mut ws, _) = tokio_tungstenite::connect_async(&s.url).await.unwrap();
    let big = format!(
        "{{\"id\":1,\"method\":\"environment/status\",\"params\":{{\"x\":\"{}\"}}}}",
        "a".repeat(2 << 20)
    );
    let _ = ws.send(Ws::text(big)).await;
    let mut code = None;
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
        match m {
            Ok(Ws::Close(Some(f))) => {
                code = Some(u16::from(f.code));
                break;
            }
            Ok(_) => continue,
            Err(_) => break,
        }
    }
    assert_eq!(code, Some(1009));
    let mut c = Conn::open(&s.url, None).await;
    assert_eq!(
        c.ok("environment/status", Value::Null).await["status"],
        "ready"
    );
}

/// The server's own WebSocket framing keeps RFC 6455's control rules: a ping
/// is answered with a pong carrying its payload, a message split in
/// fragments with a ping between them is read whole, a close is answered
/// with a close, and a frame a client sent unmasked ends the connection
/// with 1002.
#[tokio::test]
async fn control_frames_fragments_and_protocol_errors() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::Message as Ws;
    let s = Server::start(&[]);
    let (mut ws, _) = tokio_tungstenite::connect_async(&s.url).await.unwrap();
    type Socket = tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >;
    async fn next(ws: &mut Socket) -> Option<Result<Ws, tokio_tungstenite::tungstenite::Error>> {
        tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("no frame in 10 s")
    }
    ws.send(Ws::Ping(b"are you there".to_vec().into()))
        .await
        .unwrap();
    match next(&mut ws).await {
        Some(Ok(Ws::Pong(p))) => assert_eq!(&p[..], b"are you there"),
        other => panic!("expected a pong, got {other:?}"),
    }
    // Pings sent together: the newest is always answered (a pong may stand
    // for earlier pings, never for a later one).
    for i in 0..5 {
        ws.feed(Ws::Ping(format!("p{i}").into_bytes().into()))
            .await
            .unwrap();
    }
    ws.flush().await.unwrap();
    let mut last_pong = Vec::new();
    while last_pong != b"p4" {
        match next(&mut ws).await {
            Some(Ok(Ws::Pong(p))) => last_pong = p.to_vec(),
            other => panic!("expected pongs, got {other:?} after {last_pong:?}"),
        }
    }
    let text = r#"{"id":1,"method":"initialize","params":{"clientName":"frag"}}"#;
    let (a, b) = text.split_at(20);
    let part = |op, bytes: &str, fin| {
        Ws::Frame(Frame::message(
            bytes.as_bytes().to_vec(),
            OpCode::Data(op),
            fin,
        ))
    };
    ws.send(part(Data::Text, a, false)).await.unwrap();
    ws.send(Ws::Ping(b"mid".to_vec().into())).await.unwrap();
    ws.send(part(Data::Continue, b, true)).await.unwrap();
    let mut answered = false;
    for _ in 0..3 {
        match next(&mut ws).await {
            Some(Ok(Ws::Pong(p))) => assert_eq!(&p[..], b"mid"),
            Some(Ok(Ws::Text(t))) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                assert_eq!(v["id"], 1, "{v}");
                assert!(v["result"]["sessionId"].is_string(), "{v}");
                answered = true;
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(answered, "the fragmented initialize got no answer");
    ws.send(Ws::Close(None)).await.unwrap();
    let mut closed = false;
    while let Some(m) = next(&mut ws).await {
        match m {
            Ok(Ws::Close(_)) => closed = true,
            Ok(_) => continue,
            Err(_) => break,
        }
    }
    assert!(closed, "the server did not answer the close");

    // Unmasked frames from a client, written by hand on a raw socket: 1002.
    assert_eq!(
        close_code_after(&s.url, &[0x81, 0x02, b'h', b'i']).await,
        1002
    );
    // A masked text frame whose payload is not UTF-8: 1007 (RFC 6455 §8.1).
    let payload = b"{\"id\":1,\"method\":\"x\xff\"}";
    let key = [0x12u8, 0x34, 0x56, 0x78];
    let mut frame = vec![0x81, 0x80 | payload.len() as u8];
    frame.extend_from_slice(&key);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    assert_eq!(close_code_after(&s.url, &frame).await, 1007);
    // The server goes on serving.
    let mut c = Conn::open(&s.url, None).await;
    c.ok("environment/info", Value::Null).await;
}

/// Upgrades a raw TCP connection to `url`, writes `frame`, and returns the
/// code of the close frame the server answers with (the connection must end).
async fn close_code_after(url: &str, frame: &[u8]) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.trim_start_matches("ws://").to_string();
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    tcp.write_all(
        format!(
            "GET / HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut response = Vec::new();
    while !response.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(tcp.read(&mut byte).await.unwrap(), 1, "handshake cut short");
        response.push(byte[0]);
    }
    assert!(response.starts_with(b"HTTP/1.1 101"));
    tcp.write_all(frame).await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut rest))
        .await
        .expect("the connection stayed open")
        .unwrap();
    // One close frame: opcode 8, unmasked, then the code.
    assert!(rest.len() >= 4, "{rest:?}");
    assert_eq!(rest[0], 0x88, "{rest:?}");
    u16::from_be_bytes([rest[2], rest[3]])
}

/// Limits: processes per session and open handles are bounded with clear errors.
#[tokio::test]
async fn connection_limit_refuses_with_503() {
    let s = Server::start(&["--max-connections", "2"]);
    let _a = Conn::open(&s.url, None).await;
    let _b = Conn::open(&s.url, None).await;
    let third = tokio_tungstenite::connect_async(&s.url).await;
    match third {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 503)
        }
        other => panic!("third connection: {:?}", other.map(|_| ())),
    }
}

/// A raw WebSocket driver that sees text and binary frames as they come.
mod raw {
    use futures_util::{SinkExt, StreamExt};
    use serde_json::{json, Value};
    use std::time::Duration;
    use tokio_tungstenite::tungstenite::Message as Ws;

    pub type Socket = tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >;

    /// One message: its JSON (the head, for a binary frame) and, for a
    /// binary frame, its kind byte and payload.
    #[derive(Debug)]
    pub struct Got {
        pub json: Value,
        pub binary: Option<(u8, Vec<u8>)>,
    }

    pub fn frame(kind: u8, head: &Value, payload: &[u8]) -> Vec<u8> {
        let head = head.to_string();
        let mut f = vec![kind];
        f.extend_from_slice(&(head.len() as u32).to_be_bytes());
        f.extend_from_slice(head.as_bytes());
        f.extend_from_slice(payload);
        f
    }

    pub async fn next(ws: &mut Socket) -> Got {
        loop {
            let m = tokio::time::timeout(Duration::from_secs(10), ws.next())
                .await
                .expect("a message within 10 s")
                .expect("connection open")
                .expect("read");
            match m {
                Ws::Text(t) => {
                    return Got {
                        json: serde_json::from_str(t.as_str()).unwrap(),
                        binary: None,
                    }
                }
                Ws::Binary(b) => {
                    let n = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
                    return Got {
                        json: serde_json::from_slice(&b[5..5 + n]).unwrap(),
                        binary: Some((b[0], b[5 + n..].to_vec())),
                    };
                }
                _ => continue,
            }
        }
    }

    /// The answer to request `id`, skipping (and returning) other messages.
    pub async fn answer(ws: &mut Socket, id: i64) -> (Got, Vec<Got>) {
        let mut others = Vec::new();
        for _ in 0..10_000 {
            let g = next(ws).await;
            if g.json["id"] == json!(id) {
                return (g, others);
            }
            others.push(g);
        }
        panic!("no answer to {id}");
    }

    pub async fn text(ws: &mut Socket, v: Value) {
        ws.send(Ws::text(v.to_string())).await.unwrap();
    }

    pub async fn binary(ws: &mut Socket, f: Vec<u8>) {
        ws.send(Ws::binary(f)).await.unwrap();
    }

    /// Connects and initializes, announcing binary frames when `announce`.
    pub async fn open(url: &str, announce: Option<Value>, resume: Option<&str>) -> (Socket, Value) {
        let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        let mut p = json!({"clientName": "raw"});
        if let Some(a) = announce {
            p["extensions"] = a;
        }
        if let Some(r) = resume {
            p["resumeSessionId"] = json!(r);
        }
        text(
            &mut ws,
            json!({"id": 1, "method": "initialize", "params": p}),
        )
        .await;
        let (init, _) = answer(&mut ws, 1).await;
        text(&mut ws, json!({"method": "initialized"})).await;
        (ws, init.json)
    }
}

/// Binary frames (docs/binary-frames.md): a client that does not announce
/// them sees the reference dialect (a binary frame of JSON is still a text
/// message); one that does gets output and block reads raw, sends stdin and
/// block writes raw, in seq order, with bad frames refused by code and the
/// connection kept; a resumed session reads what it missed with process/read.
#[tokio::test]
async fn binary_frames_negotiated_and_exact() {
    use raw::*;
    let s = Server::start(&[]);
    let d = tmpdir("binframes");

    // Not announced (or announced in a shape we do not know): nothing changes.
    for announce in [None, Some(json!("yes")), Some(json!({"binaryFrames": 0}))] {
        let (mut ws, init) = open(&s.url, announce.clone(), None).await;
        assert!(init["result"]["sessionId"].is_string(), "{init}");
        assert!(
            init["result"].get("binaryFrames").is_none(),
            "{announce:?}: {init}"
        );
        assert_eq!(
            init["result"]["environmentInfo"]["capabilities"]["binaryFrames"],
            json!(true)
        );
        binary(
            &mut ws,
            br#"{"id":2,"method":"environment/status"}"#.to_vec(),
        )
        .await;
        let (g, _) = answer(&mut ws, 2).await;
        assert_eq!(g.json["result"]["status"], "ready");
        text(
            &mut ws,
            json!({"id": 3, "method": "process/start",
            "params": start_params("t", &["printf", "abc"], &d, false, false)}),
        )
        .await;
        let (_, mut seen) = answer(&mut ws, 3).await;
        while !seen.iter().any(|g| g.json["method"] == "process/closed") {
            seen.push(next(&mut ws).await);
        }
        assert!(seen.iter().all(|g| g.binary.is_none()), "{seen:?}");
        let out: Vec<u8> = seen
            .iter()
            .filter(|g| g.json["method"] == "process/output")
            .flat_map(|g| unb64(&g.json["params"]["chunk"]))
            .collect();
        assert_eq!(out, b"abc");
    }

    // Announced: the result says so.
    let (mut ws, init) = open(&s.url, Some(json!({"binaryFrames": 1})), None).await;
    assert_eq!(init["result"]["binaryFrames"], json!(1), "{init}");
    let session = init["result"]["sessionId"].as_str().unwrap().to_string();

    // stdin raw in, output raw out, in seq order, every byte value.
    text(
        &mut ws,
        json!({"id": 10, "method": "process/start",
        "params": start_params("cat", &["cat"], &d, false, true)}),
    )
    .await;
    answer(&mut ws, 10).await;
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let head = json!({"id": 11, "method": "process/write",
        "params": {"processId": "cat", "writeId": "w1"}});
    binary(&mut ws, frame(1, &head, &data)).await;
    let (g, mut seen) = answer(&mut ws, 11).await;
    assert_eq!(g.json["result"]["status"], "accepted", "{:?}", g.json);
    text(
        &mut ws,
        json!({"id": 12, "method": "process/closeStdin",
        "params": {"processId": "cat"}}),
    )
    .await;
    let mut out = Vec::new();
    let mut last_seq = 0;
    loop {
        let g = match seen.is_empty() {
            true => next(&mut ws).await,
            false => seen.remove(0),
        };
        if g.json["id"] == json!(12) {
            continue;
        }
        let seq = g.json["params"]["seq"].as_u64().unwrap();
        assert!(seq > last_seq, "seq {seq} after {last_seq}");
        last_seq = seq;
        match g.json["method"].as_str() {
            Some("process/output") => {
                let (kind, bytes) = g.binary.expect("output as a binary frame");
                assert_eq!(kind, 1);
                assert!(g.json["params"].get("chunk").is_none());
                assert_eq!(g.json["params"]["stream"], "stdout");
                out.extend(bytes);
            }
            Some("process/exited") => assert!(g.binary.is_none()),
            Some("process/closed") => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(out == data, "output differs ({} bytes)", out.len());

    // Block write raw, block read raw (result kind 2), contents on the host.
    let f = d.join("blocks.bin");
    text(
        &mut ws,
        json!({"id": 20, "method": "fs/open",
        "params": {"path": uri(&f), "handleId": "h", "mode": "replace"}}),
    )
    .await;
    let (g, _) = answer(&mut ws, 20).await;
    assert!(g.json.get("error").is_none(), "{:?}", g.json);
    let head = json!({"id": 21, "method": "fs/writeBlock",
        "params": {"handleId": "h", "offset": 0}});
    binary(&mut ws, frame(1, &head, &data)).await;
    let (g, _) = answer(&mut ws, 21).await;
    assert!(g.json.get("error").is_none(), "{:?}", g.json);
    text(
        &mut ws,
        json!({"id": 22, "method": "fs/close", "params": {"handleId": "h"}}),
    )
    .await;
    answer(&mut ws, 22).await;
    assert!(std::fs::read(&f).unwrap() == data);
    text(
        &mut ws,
        json!({"id": 23, "method": "fs/open",
        "params": {"path": uri(&f), "handleId": "r", "mode": "read"}}),
    )
    .await;
    answer(&mut ws, 23).await;
    text(
        &mut ws,
        json!({"id": 24, "method": "fs/readBlock",
        "params": {"handleId": "r", "offset": 1000, "len": 5000}}),
    )
    .await;
    let (g, _) = answer(&mut ws, 24).await;
    let (kind, bytes) = g.binary.expect("readBlock as a binary frame");
    assert_eq!((kind, g.json["result"]["eof"].clone()), (2, json!(false)));
    assert_eq!(bytes, &data[1000..6000]);

    // Refusals keep the connection: chunk given twice, bytes for a method
    // that takes none, a malformed frame, a response kind from a client.
    let twice = json!({"id": 30, "method": "process/write",
        "params": {"processId": "cat", "writeId": "w2", "chunk": "AA=="}});
    binary(&mut ws, frame(1, &twice, b"x")).await;
    assert_eq!(answer(&mut ws, 30).await.0.json["error"]["code"], -32602);
    let status = json!({"id": 31, "method": "environment/status"});
    binary(&mut ws, frame(1, &status, b"x")).await;
    assert_eq!(answer(&mut ws, 31).await.0.json["error"]["code"], -32602);
    binary(&mut ws, vec![1, 0, 0, 0, 50, b'{']).await;
    assert_eq!(answer(&mut ws, -1).await.0.json["error"]["code"], -32600);
    binary(&mut ws, frame(2, &json!({"id": 5, "result": {}}), b"x")).await;
    assert_eq!(answer(&mut ws, -1).await.0.json["error"]["code"], -32600);
    text(&mut ws, json!({"id": 32, "method": "environment/status"})).await;
    assert_eq!(
        answer(&mut ws, 32).await.0.json["result"]["status"],
        "ready"
    );

    // A process that runs while the client is away: the resumed connection
    // reads what it missed (process/read, JSON), then gets pushes raw.
    text(&mut ws, json!({"id": 40, "method": "process/start",
        "params": start_params("late", &["sh", "-c", "printf one; read x; printf two"], &d, false, true)})).await;
    answer(&mut ws, 40).await;
    let first = next(&mut ws).await;
    assert_eq!(
        first.binary.as_ref().map(|b| b.1.as_slice()),
        Some(&b"one"[..])
    );
    drop(ws);
    let mut resumed = None;
    for _ in 0..250 {
        let (ws, init) = open(&s.url, Some(json!({"binaryFrames": 1})), Some(&session)).await;
        if init.get("error").is_none() {
            resumed = Some((ws, init));
            break;
        }
        // The old connection's detach may not have landed yet (-32010).
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (mut ws, init) = resumed.expect("the session resumed within 5 s");
    assert_eq!(init["result"]["sessionId"], json!(session));
    text(
        &mut ws,
        json!({"id": 41, "method": "process/read",
        "params": {"processId": "late", "afterSeq": 0}}),
    )
    .await;
    let (g, _) = answer(&mut ws, 41).await;
    assert!(g.binary.is_none());
    assert_eq!(unb64(&g.json["result"]["chunks"][0]["chunk"]), b"one");
    let head = json!({"id": 42, "method": "process/write",
        "params": {"processId": "late", "writeId": "w3"}});
    binary(&mut ws, frame(1, &head, b"\n")).await;
    let (_, mut seen) = answer(&mut ws, 42).await;
    while !seen.iter().any(|g| g.json["method"] == "process/output") {
        seen.push(next(&mut ws).await);
    }
    let two = seen
        .iter()
        .find(|g| g.json["method"] == "process/output")
        .unwrap();
    assert_eq!(
        two.binary.as_ref().map(|b| b.1.as_slice()),
        Some(&b"two"[..])
    );
    let _ = std::fs::remove_dir_all(&d);
}
