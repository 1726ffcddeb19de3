//! A server that fails to push one event of a process (the reference's
//! protocol allows a client to read it back): the client reads it with
//! `process/read` and the stream goes on in order, instead of holding the
//! events after it for ever. The server is a script on a Unix socket (one
//! JSON message per line), so the missing push is certain.

mod scripted;

use exec_server_client::{ExecServerClient, ProcessEvent};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;

/// The process's output events: seq, base64 of the bytes.
const CHUNKS: [(u64, &str); 3] = [(1, "b25lCg=="), (2, "dHdvCg=="), (3, "dGhyZWUK")];

/// Serves one connection: pushes output 1 and 3 after the start (not 2),
/// answers `process/read` with what follows `afterSeq`, then pushes the
/// exit and the close; or, `contradicting`, answers that the process has
/// nothing after seq 1 and pushes nothing more. Returns the `afterSeq` of
/// every read.
async fn serve(listener: UnixListener, contradicting: bool) -> Vec<u64> {
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
            Some("process/read") if contradicting => {
                reads.push(msg["params"]["afterSeq"].as_u64().unwrap_or(0));
                out.push(json!({"id": id, "result": {"chunks": [], "nextSeq": 2,
                    "exited": false, "exitCode": null, "closed": false, "failure": null}}));
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

/// A client of a scripted server on a socket in a fresh directory, and the
/// process `p1` started there. Returns the directory too (to remove).
async fn start(
    tag: &str,
    contradicting: bool,
) -> (
    ExecServerClient,
    exec_server_client::ProcessHandle,
    tokio::task::JoinHandle<Vec<u64>>,
    std::path::PathBuf,
) {
    let (dir, listener, client) = scripted::socket(tag);
    let server = tokio::spawn(serve(listener, contradicting));
    let p = client.start_process(scripted::p1()).await.unwrap();
    (client, p, server, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_the_server_did_not_push_is_read_and_the_stream_goes_on_in_order() {
    let (client, mut p, server, dir) = start("gap", false).await;
    let mut events = Vec::new();
    loop {
        let ev = scripted::next_event(&mut p, &events).await;
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
    let reads = scripted::finish(client, server, dir).await;
    assert_eq!(reads, [1], "one read, from the last event released");
}

/// A server whose read ends before what it pushed contradicts itself: the
/// stream fails, after one read, instead of waiting for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_ends_before_what_was_pushed_fails_the_stream() {
    let (client, mut p, server, dir) = start("gap-contradicting", true).await;
    let mut events = Vec::new();
    let failure = loop {
        let ev = scripted::next_event(&mut p, &events).await;
        match ev {
            Some(ProcessEvent::Output { seq, .. }) => events.push(seq),
            Some(ProcessEvent::Failed(f)) => break f,
            other => panic!("unexpected {other:?} after {events:?}"),
        }
    };
    assert_eq!(events, [1]);
    assert_eq!(
        failure.reason,
        exec_server_client::FailureReason::Protocol,
        "{failure}"
    );
    let reads = scripted::finish(client, server, dir).await;
    assert_eq!(reads, [1], "one read: it did not move the stream on");
}
