//! A stable-Rust fuzzer for the request router and handlers: it runs a real
//! server in this process, feeds one connection mutated JSON-RPC messages (valid
//! methods with mangled params, wrong types, huge numbers, bad URIs, random bytes),
//! and after every batch checks that the server still answers `environment/status`
//! on that connection and on a fresh one: no panic, no hang, no dropped connection.
//! Processes it starts are confined to `true`/`echo` and killed with the session.
//!
//! `cargo run --release -p exec-server --example fuzz_router -- --seconds 600`

use exec_server::{connection, ServerConfig, ServerState};
use exec_server_rpc::transport::{self, Connection, Inbound};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const METHODS: &[&str] = &[
    "initialize",
    "environment/info",
    "environment/status",
    "process/start",
    "process/read",
    "process/write",
    "process/signal",
    "process/terminate",
    "process/resize",
    "process/closeStdin",
    "process/ack",
    "fs/readFile",
    "fs/writeFile",
    "fs/createDirectory",
    "fs/getMetadata",
    "fs/canonicalize",
    "fs/readDirectory",
    "fs/walk",
    "fs/remove",
    "fs/copy",
    "fs/open",
    "fs/readBlock",
    "fs/writeBlock",
    "fs/close",
    "environmentConfig/read",
    "capabilities/discoverV2",
    "capabilityRoots/discoverV1",
    "http/request",
    "nope/nothing",
];

fn scalar(r: &mut Rng, scratch: &str) -> Value {
    match r.below(14) {
        0 => json!(null),
        1 => json!(true),
        2 => json!(-1),
        3 => json!(u64::MAX),
        4 => json!(i64::MIN),
        5 => json!(1.5),
        6 => json!(""),
        7 => json!("p1"),
        8 => json!(format!("file://{scratch}/f{}", r.below(4))),
        9 => json!(format!("file://{scratch}/d/../f{}", r.below(2))),
        10 => json!("http://127.0.0.1:1/"),
        11 => json!("aGVsbG8="),
        12 => json!("%00\u{0}\u{ffff}"),
        _ => json!(r.below(1 << 20)),
    }
}

fn value(r: &mut Rng, depth: usize, scratch: &str) -> Value {
    if depth > 3 || r.below(3) == 0 {
        return scalar(r, scratch);
    }
    match r.below(3) {
        0 => Value::Array(
            (0..r.below(4))
                .map(|_| value(r, depth + 1, scratch))
                .collect(),
        ),
        _ => {
            const KEYS: &[&str] = &[
                "processId",
                "argv",
                "cwd",
                "env",
                "tty",
                "pipeStdin",
                "afterSeq",
                "maxBytes",
                "waitMs",
                "chunk",
                "writeId",
                "signal",
                "path",
                "dataBase64",
                "recursive",
                "force",
                "options",
                "maxDepth",
                "maxDirectories",
                "maxEntries",
                "followDirectorySymlinks",
                "handleId",
                "offset",
                "len",
                "mode",
                "sourcePath",
                "destinationPath",
                "method",
                "url",
                "requestId",
                "headers",
                "timeoutMs",
                "cols",
                "rows",
                "seq",
                "roots",
                "configPaths",
                "requirementsPaths",
                "clientName",
                "resumeSessionId",
                "envPolicy",
                "streamResponse",
            ];
            let mut m = serde_json::Map::new();
            for _ in 0..r.below(8) {
                m.insert(
                    KEYS[r.below(KEYS.len())].to_string(),
                    value(r, depth + 1, scratch),
                );
            }
            Value::Object(m)
        }
    }
}

/// A valid-looking params object for `method`, then mangled.
fn params(r: &mut Rng, method: &str, scratch: &str) -> Value {
    let id = format!("p{}", r.below(4));
    let prog = ["true", "echo", "/bin/true"][r.below(3)];
    let mode = ["read", "replace"][r.below(2)];
    let mut base = match method {
        "process/start" => {
            json!({"processId": id, "argv": [prog, "x"], "cwd": format!("file://{scratch}"), "env": {}, "tty": r.below(2) == 0})
        }
        "process/read" => json!({"processId": id, "afterSeq": r.below(5), "waitMs": r.below(20)}),
        "process/write" => {
            json!({"processId": id, "chunk": "aGk=", "writeId": format!("w{}", r.below(8))})
        }
        "fs/writeFile" => {
            json!({"path": format!("file://{scratch}/f{}", r.below(4)), "dataBase64": "aGk="})
        }
        "fs/walk" => {
            json!({"path": format!("file://{scratch}"), "options": {"maxDepth": 2, "maxDirectories": 2, "maxEntries": 5, "followDirectorySymlinks": false}})
        }
        "fs/open" => {
            json!({"handleId": format!("h{}", r.below(3)), "path": format!("file://{scratch}/f{}", r.below(4)), "mode": mode})
        }
        "fs/readBlock" => {
            json!({"handleId": format!("h{}", r.below(3)), "offset": r.below(10), "len": r.below(10)})
        }
        "http/request" => {
            json!({"method": "GET", "url": "http://127.0.0.1:1/", "requestId": "r", "timeoutMs": 50})
        }
        _ => value(r, 0, scratch),
    };
    for _ in 0..r.below(3) {
        if let Value::Object(m) = &mut base {
            let keys: Vec<String> = m.keys().cloned().collect();
            if keys.is_empty() {
                break;
            }
            let k = &keys[r.below(keys.len())];
            match r.below(3) {
                0 => {
                    m.remove(k);
                }
                _ => {
                    m.insert(k.clone(), value(r, 2, scratch));
                }
            }
        }
    }
    base
}

async fn status_ok(conn: &mut Connection, id: i64) -> bool {
    let msg = json!({"id": id, "method": "environment/status"}).to_string();
    if conn.outbound.send(msg).await.is_err() {
        return false;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match tokio::time::timeout(left, conn.inbound.recv()).await {
            Ok(Some(Inbound::Message(t))) => {
                if let Ok(v) = serde_json::from_str::<Value>(&t) {
                    if v["id"] == json!(id) {
                        return v["result"]["status"] == "ready";
                    }
                }
            }
            _ => return false,
        }
    }
    false
}

fn open(state: &std::sync::Arc<ServerState>) -> Connection {
    let (a, b) = tokio::io::duplex(1 << 20);
    let (sr, sw) = tokio::io::split(b);
    tokio::spawn(connection::serve(
        state.clone(),
        transport::lines(sr, sw, "fuzz".into()),
        "fuzz".into(),
        None,
    ));
    let (cr, cw) = tokio::io::split(a);
    transport::lines(cr, cw, "fuzz client".into())
}

#[tokio::main]
async fn main() {
    let mut seconds = 10u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--seconds" {
            seconds = args.next().and_then(|s| s.parse().ok()).unwrap_or(seconds);
        }
    }
    let scratch = std::env::temp_dir().join(format!("fuzz-router-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&scratch);
    let scratch_s = scratch.display().to_string();
    let state = match ServerState::new(ServerConfig {
        detached_session_ttl: Duration::from_millis(200),
        ..ServerConfig::default()
    }) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fuzz_router: {e}");
            std::process::exit(1);
        }
    };
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(7)
        | 1;
    let mut r = Rng(seed);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let (mut sent, mut conns) = (0u64, 0u64);
    let mut failures = 0;
    while Instant::now() < deadline {
        let mut conn = open(&state);
        conns += 1;
        let init =
            json!({"id": 0, "method": "initialize", "params": {"clientName": "fuzz"}}).to_string();
        let _ = conn.outbound.send(init).await;
        if r.below(8) != 0 {
            let _ = conn
                .outbound
                .send(r#"{"method":"initialized"}"#.to_string())
                .await;
        }
        for i in 0..200 {
            let method = METHODS[r.below(METHODS.len())];
            let msg = if r.below(20) == 0 {
                // Raw garbage and envelope edge cases.
                [
                    "{",
                    "[]",
                    "{\"id\":1.5,\"method\":\"x\"}",
                    "{\"id\":1,\"id\":2}",
                    "null",
                    "{\"method\":1}",
                ][r.below(6)]
                .to_string()
            } else {
                json!({"id": i + 1, "method": method, "params": params(&mut r, method, &scratch_s)})
                    .to_string()
            };
            // Keep reading while sending: a client that stops reading is (rightly)
            // stalled by the server's backpressure.
            let mut delivered = false;
            let send = conn.outbound.send(msg);
            tokio::pin!(send);
            loop {
                tokio::select! {
                    r = &mut send => { delivered = r.is_ok(); break; }
                    m = conn.inbound.recv() => if m.is_none() { break },
                }
            }
            if !delivered {
                break;
            }
            sent += 1;
        }
        let alive = status_ok(&mut conn, 1_000_000).await;
        let mut fresh = open(&state);
        let _ = fresh
            .outbound
            .send(
                json!({"id": 0, "method": "initialize", "params": {"clientName": "probe"}})
                    .to_string(),
            )
            .await;
        let _ = fresh
            .outbound
            .send(r#"{"method":"initialized"}"#.to_string())
            .await;
        let fresh_ok = status_ok(&mut fresh, 1_000_001).await;
        // A connection may legitimately be closed by a stray notification or response;
        // a fresh connection must always work.
        if !fresh_ok {
            failures += 1;
            eprintln!("fuzz_router: server stopped answering (seed {seed})");
            break;
        }
        let _ = alive;
        fresh.outbound.close();
        conn.outbound.close();
    }
    state.shutdown();
    let _ = std::fs::remove_dir_all(&scratch);
    println!(
        "fuzz_router: {sent} requests on {conns} connections in {:.1} s, {failures} failures (seed {seed})",
        started.elapsed().as_secs_f64()
    );
    if failures > 0 {
        std::process::exit(1);
    }
}
