//! A link that drops again while the session is being resumed: a start
//! cut off by the first drop still goes through, on the third connection.
//! The server is a script on a Unix socket (one JSON message per line), so
//! each drop falls where the test puts it.

mod scripted;

use exec_server_client::ProcessEvent;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;

/// Serves three connections of one session. The first takes `initialize`
/// and ends at `process/start` (unanswered); the second takes the resume
/// and ends at the catch-up's `process/read`; the third answers the read
/// "unknown process" (the start never ran) and the start, then pushes one
/// line, the exit and the close. Returns every message's method, per
/// connection.
async fn serve(listener: UnixListener) -> Vec<Vec<String>> {
    let mut seen = Vec::new();
    for conn in 0..3 {
        let Ok((sock, _)) = listener.accept().await else {
            break;
        };
        let (r, mut w) = sock.into_split();
        let mut lines = BufReader::new(r).lines();
        let mut methods = Vec::new();
        'conn: while let Ok(Some(line)) = lines.next_line().await {
            let msg: Value = serde_json::from_str(&line).unwrap();
            let method = msg["method"].as_str().unwrap_or_default().to_string();
            methods.push(method.clone());
            let id = msg["id"].clone();
            let out = match (conn, method.as_str()) {
                (_, "initialize") => vec![json!({"id": id, "result": {"sessionId": "s1"}})],
                (0, "process/start") | (1, "process/read") => break 'conn,
                (2, "process/read") => vec![json!({"id": id, "error": {"code": -32600,
                    "message": "unknown process id p1"}})],
                (2, "process/start") => vec![
                    json!({"id": id, "result": {"processId": "p1", "sandboxType": "none"}}),
                    json!({"method": "process/output", "params": {"processId": "p1",
                        "seq": 1, "stream": "stdout", "chunk": "aGkK"}}),
                    json!({"method": "process/exited", "params": {"processId": "p1",
                        "seq": 2, "exitCode": 0}}),
                    json!({"method": "process/closed", "params": {"processId": "p1",
                        "seq": 3}}),
                ],
                _ => Vec::new(),
            };
            for m in out {
                let mut text = m.to_string();
                text.push('\n');
                if w.write_all(text.as_bytes()).await.is_err() {
                    break 'conn;
                }
            }
        }
        seen.push(methods);
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_survives_a_second_drop_during_the_resume() {
    let (dir, listener, client) = scripted::socket("redrop");
    let server = tokio::spawn(serve(listener));
    let mut p = tokio::time::timeout(
        Duration::from_secs(20),
        client.start_process(scripted::p1()),
    )
    .await
    .expect("the start within 20 s")
    .expect("the start went through");
    let mut events = Vec::new();
    loop {
        let ev = scripted::next_event(&mut p, &events).await;
        match ev {
            Some(ProcessEvent::Output { data, .. }) => events.push(data.to_vec()),
            Some(ProcessEvent::Exited { code, .. }) => events.push(format!("exit {code}").into()),
            Some(ProcessEvent::Closed { .. }) => break,
            other => panic!("unexpected {other:?} after {events:?}"),
        }
    }
    assert_eq!(events, [b"hi\n".to_vec(), b"exit 0".to_vec()]);
    assert_eq!(client.recoveries(), 2);
    let seen = scripted::finish(client, server, dir).await;
    assert_eq!(seen[0], ["initialize", "initialized", "process/start"]);
    assert_eq!(&seen[1][..2], ["initialize", "initialized"]);
    assert!(seen[2].iter().any(|m| m == "process/start"), "{seen:?}");
}
