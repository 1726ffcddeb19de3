//! `floor-server`, the yardstick of `scripts/floor.py`'s spawn row: started
//! as a binary on loopback, it must answer as the protocol says, or its
//! figure measures nothing.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio_tungstenite::tungstenite::{self, Message, WebSocket};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start() -> (
    Server,
    WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>,
) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_floor-server"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("floor-server starts");
    let mut url = String::new();
    let stdout = child.stdout.take().expect("piped stdout");
    let server = Server(child);
    BufReader::new(stdout)
        .read_line(&mut url)
        .expect("floor-server prints its URL");
    let (ws, _) = tungstenite::connect(url.trim()).expect("connects");
    if let tungstenite::stream::MaybeTlsStream::Plain(s) = ws.get_ref() {
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
    }
    (server, ws)
}

fn call(ws: &mut WebSocket<impl std::io::Read + std::io::Write>, v: Value) -> Value {
    ws.send(Message::text(v.to_string())).expect("sends");
    next(ws)
}

fn next(ws: &mut WebSocket<impl std::io::Read + std::io::Write>) -> Value {
    let m = ws.read().expect("a message within 10 s");
    serde_json::from_str(m.to_text().expect("text")).expect("JSON")
}

#[test]
fn a_start_is_answered_then_its_output_exit_and_close_follow() {
    let (_server, mut ws) = start();
    let init = call(
        &mut ws,
        json!({"id": 0, "method": "initialize", "params": {"clientName": "t"}}),
    );
    assert!(init["result"].is_object(), "{init}");
    let reply = call(
        &mut ws,
        json!({"id": 1, "method": "process/start", "params": {"processId": "p",
            "argv": ["sh", "-c", "echo out; echo err >&2; exit 3"],
            "cwd": "file:///tmp", "env": {"PATH": "/usr/bin:/bin"}, "tty": false}}),
    );
    assert_eq!(reply, json!({"id": 1, "result": {"processId": "p"}}));
    let mut output = Vec::new();
    let exited = loop {
        let m = next(&mut ws);
        match m["method"].as_str() {
            Some("process/output") => {
                let chunk = m["params"]["chunk"].as_str().expect("chunk");
                let mut bytes = vec![0u8; chunk.len()];
                let n = exec_server_base64::decode(chunk.as_bytes(), &mut bytes).expect("base64");
                output.extend_from_slice(&bytes[..n]);
            }
            Some("process/exited") => break m,
            _ => panic!("unexpected {m}"),
        }
    };
    assert_eq!(output, b"out\nerr\n");
    assert_eq!(exited["params"]["exitCode"], 3);
    let closed = next(&mut ws);
    assert_eq!(closed["method"], "process/closed");
    assert_eq!(
        closed["params"]["seq"].as_u64(),
        exited["params"]["seq"].as_u64().map(|s| s + 1)
    );
    let terminated = call(
        &mut ws,
        json!({"id": 2, "method": "process/terminate", "params": {"processId": "p"}}),
    );
    assert_eq!(terminated["result"], json!({"running": false}));
}

#[test]
fn bad_requests_get_errors_and_the_connection_goes_on() {
    let (_server, mut ws) = start();
    let empty = call(
        &mut ws,
        json!({"id": 1, "method": "process/start", "params": {"processId": "p", "argv": []}}),
    );
    assert_eq!(empty["error"]["code"], -32602);
    let missing = call(
        &mut ws,
        json!({"id": 2, "method": "process/start", "params": {"processId": "p",
            "argv": ["/nonexistent/program"], "cwd": "file:///tmp"}}),
    );
    assert_eq!(missing["error"]["code"], -32603);
    let unknown = call(&mut ws, json!({"id": 3, "method": "fs/readFile"}));
    assert_eq!(unknown["error"]["code"], -32601);
    ws.send(Message::text("not json")).expect("sends");
    assert_eq!(next(&mut ws)["error"]["code"], -32700);
    let init = call(&mut ws, json!({"id": 4, "method": "initialize"}));
    assert_eq!(init["id"], 4);
}
