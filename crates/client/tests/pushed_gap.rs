//! A server that fails to push one event of a process (the reference's
//! protocol allows a client to read it back): the client reads it with
//! `process/read` and the stream goes on in order, instead of holding the
//! events after it for ever. The server is a script on a Unix socket (one
//! JSON message per line), so the missing push is certain.

use exec_server_client::{ClientOptions, ExecServerClient, ProcessEvent, Source};
use exec_server_protocol::types::ExecParams;
use exec_server_protocol::PathUri;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;

/// The process's output events: seq, base64 of the bytes.
const CHUNKS: [(u64, &str); 3] = [(1, "b25lCg=="), (2, "dHdvCg=="), (3, "dGhyZWUK")];

/// Serves one connection: pushes output 1 and 3 after the start (not 2),
/// answers `process/read` with what follows `afterSeq`, then pushes the
/// exit and the close. Returns the `afterSeq` of every read.
async fn serve(listener: UnixListener) -> Vec<u64> {
    let (sock, _) = listener.accept().await.unwrap();
    let (r, mut w) = sock.into_split();
    let mut lines = BufReader::new(r).lines();
    let mut reads = Vec::new();
    let mut process_id = String::new();
    while let Ok(Some(line)) = lines.next_line().await {
        let msg: Value = serde_json::from_str(&line).unwrap();
        let id = msg["id"].clone();
        let mut out = Vec::new();
        match msg["method"].as_str() {
            Some("initialize") => out.push(json!({"id": id, "result": {"sessionId": "s1"}})),
            Some("process/start") => {
                process_id = msg["params"]["processId"].as_str().unwrap().to_string();
                out.push(
                    json!({"id": id, "result": {"processId": process_id, "sandboxType": "none"}}),
                );
                for (seq, chunk) in CHUNKS.iter().filter(|(seq, _)| *seq != 2) {
                    out.push(json!({"method": "process/output", "params": {
                        "processId": process_id, "seq": seq, "stream": "stdout", "chunk": chunk}}));
                }
            }
            Some("process/read") => {
                let after = msg["params"]["afterSeq"].as_u64().unwrap_or(0);
                reads.push(after);
                let chunks: Vec<Value> = CHUNKS
                    .iter()
                    .filter(|(seq, _)| *seq > after)
                    .map(|(seq, chunk)| json!({"seq": seq, "stream": "stdout", "chunk": chunk}))
                    .collect();
                out.push(json!({"id": id, "result": {"chunks": chunks, "nextSeq": 4,
                    "exited": false, "exitCode": null, "closed": false, "failure": null}}));
                out.push(json!({"method": "process/exited", "params": {
                    "processId": process_id, "seq": 4, "exitCode": 0}}));
                out.push(json!({"method": "process/closed", "params": {
                    "processId": process_id, "seq": 5}}));
            }
            _ => {}
        }
        for m in out {
            let mut text = m.to_string();
            text.push('\n');
            if w.write_all(text.as_bytes()).await.is_err() {
                return reads;
            }
        }
    }
    reads
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_the_server_did_not_push_is_read_and_the_stream_goes_on_in_order() {
    let dir = std::env::temp_dir().join(format!("esc-gap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("server.sock");
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let server = tokio::spawn(serve(listener));

    let url = format!("unix://{}", path.display());
    let client = ExecServerClient::new(ClientOptions::new(Source::from_url(&url, None).unwrap()));
    let params = ExecParams::new(
        "p1",
        vec!["true".into()],
        PathUri::parse("file:///").unwrap(),
        Default::default(),
    );
    let mut p = client.start_process(params).await.unwrap();
    let mut events = Vec::new();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), p.next_event())
            .await
            .unwrap_or_else(|_| panic!("stalled after {events:?}"));
        match ev {
            Some(ProcessEvent::Output { seq, data, .. }) => {
                events.push(format!("{seq}:{}", String::from_utf8_lossy(&data).trim()))
            }
            Some(ProcessEvent::Exited { seq, code, .. }) => {
                events.push(format!("{seq}:exit {code}"))
            }
            Some(ProcessEvent::Closed { seq }) => {
                events.push(format!("{seq}:closed"));
                break;
            }
            other => panic!("unexpected {other:?} after {events:?}"),
        }
    }
    assert_eq!(
        events,
        ["1:one", "2:two", "3:three", "4:exit 0", "5:closed"],
        "every event, once, in seq order"
    );
    client.close().await;
    let reads = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server's connection ended")
        .unwrap();
    assert_eq!(reads, [1], "one read, from the last event released");
    let _ = std::fs::remove_dir_all(&dir);
}
