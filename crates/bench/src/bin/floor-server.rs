//! The protocol's floor for a spawn: the least a server can do to answer
//! `process/start` over a WebSocket, so that a server's spawn latency can be
//! read against it as well as against a local fork+exec+wait.
//!
//! ```text
//! floor-server        prints ws://127.0.0.1:PORT, then serves until killed
//! ```
//!
//! One blocking thread per connection, no runtime, no sessions, no limits,
//! no cgroup, no sandbox: `initialize` is answered, `process/start` spawns
//! `argv` (stdin `/dev/null`, stdout and stderr sharing one pipe), answers,
//! sends that pipe's output as `process/output` (`stream` always `stdout`)
//! until end of file, then `process/exited` and `process/closed`;
//! `process/terminate` answers `running: false`. Nothing else is supported:
//! other requests get -32601, bad params -32602, a failed spawn -32603. It
//! serves one process at a time per connection (the next request is read
//! once the process closed), which is all the `spawn`
//! scenario of `exec-server-bench` needs. Not a server to use: a yardstick.

use serde_json::{json, Value};
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use tokio_tungstenite::tungstenite::{self, Message, WebSocket};

fn main() {
    let listener = match TcpListener::bind("127.0.0.1:0").and_then(|l| {
        let addr = l.local_addr()?;
        Ok((l, addr))
    }) {
        Ok((l, addr)) => {
            println!("ws://{addr}");
            l
        }
        Err(e) => {
            eprintln!("floor-server: cannot listen on loopback: {e}");
            std::process::exit(1);
        }
    };
    for socket in listener.incoming().flatten() {
        std::thread::spawn(move || serve(socket));
    }
}

fn serve(socket: TcpStream) {
    let _ = socket.set_nodelay(true);
    let Ok(mut ws) = tungstenite::accept(socket) else {
        return;
    };
    while let Ok(message) = ws.read() {
        let Message::Text(text) = message else {
            continue;
        };
        let Ok(request) = serde_json::from_str::<Value>(&text) else {
            let _ = ws.send(error(Value::Null, -32700, "not JSON"));
            continue;
        };
        let id = request.get("id").cloned();
        let sent = match (request["method"].as_str(), id) {
            (Some("initialize"), Some(id)) => ws.send(reply(id, json!({"sessionId": "floor"}))),
            (Some("process/start"), Some(id)) => start(&mut ws, id, &request["params"]),
            // Every process this connection started has ended by now.
            (Some("process/terminate"), Some(id)) => ws.send(reply(id, json!({"running": false}))),
            (_, Some(id)) => ws.send(error(id, -32601, "not supported by the floor server")),
            (_, None) => Ok(()),
        };
        if sent.is_err() {
            return;
        }
    }
}

/// Runs one process to its end, sending its reply and notifications.
fn start(ws: &mut WebSocket<TcpStream>, id: Value, params: &Value) -> tungstenite::Result<()> {
    let process_id = params["processId"].as_str().unwrap_or_default().to_string();
    let argv: Vec<&str> = params["argv"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some((program, args)) = argv.split_first() else {
        return ws.send(error(
            id,
            -32602,
            "argv must be a non-empty array of strings",
        ));
    };
    let cwd = params["cwd"].as_str().unwrap_or("file:///");
    let mut command = Command::new(program);
    command
        .args(args)
        .current_dir(cwd.strip_prefix("file://").unwrap_or(cwd))
        .env_clear()
        .stdin(Stdio::null());
    if let Some(env) = params["env"].as_object() {
        command.envs(env.iter().filter_map(|(k, v)| Some((k, v.as_str()?))));
    }
    let (mut reader, writer) = match std::io::pipe() {
        Ok(pair) => pair,
        Err(e) => return ws.send(error(id, -32603, &e.to_string())),
    };
    let spawned = writer
        .try_clone()
        .map(|w2| command.stdout(writer).stderr(w2))
        .and_then(|c| c.spawn());
    drop(command); // the parent's copies of the write end: end of file comes at the child's exit
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => return ws.send(error(id, -32603, &e.to_string())),
    };
    ws.send(reply(id, json!({"processId": process_id})))?;
    let mut seq = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n @ 1..) = reader.read(&mut buf) {
        seq += 1;
        let mut chunk = String::new();
        exec_server_base64::encode_append(&buf[..n], &mut chunk);
        ws.send(note(
            "process/output",
            json!({"processId": process_id, "seq": seq, "stream": "stdout", "chunk": chunk}),
        ))?;
    }
    let code = child.wait().ok().and_then(|s| s.code()).unwrap_or(-1);
    ws.write(note(
        "process/exited",
        json!({"processId": process_id, "seq": seq + 1, "exitCode": code}),
    ))?;
    ws.send(note(
        "process/closed",
        json!({"processId": process_id, "seq": seq + 2}),
    ))
}

fn reply(id: Value, result: Value) -> Message {
    Message::text(json!({"id": id, "result": result}).to_string())
}

fn error(id: Value, code: i64, message: &str) -> Message {
    Message::text(json!({"id": id, "error": {"code": code, "message": message}}).to_string())
}

fn note(method: &str, params: Value) -> Message {
    Message::text(json!({"method": method, "params": params}).to_string())
}
