//! Trace context end to end: a request's W3C `trace` member becomes the parent
//! of the server's request span, the process span is its child, and `exec-server
//! run` sends its own span's context, all checked at an OTLP/HTTP receiver on
//! loopback that decodes the exported protobuf.

use crate::common;

use common::{start_params, Conn, BIN};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::json;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An OTLP/HTTP receiver: accepts POSTs on loopback, answers 200, and keeps
/// every span it decodes.
struct Receiver {
    url: String,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Receiver {
    fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let spans = Arc::new(Mutex::new(Vec::new()));
        let keep = spans.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let keep = keep.clone();
                std::thread::spawn(move || serve(stream, &keep));
            }
        });
        Receiver { url, spans }
    }

    /// Waits (≤ 20 s) until `cond` holds for the spans received so far.
    fn wait_for(&self, what: &str, cond: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let spans = self.spans.lock().expect("spans").clone();
            if cond(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not received; spans: {:?}",
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// One keep-alive HTTP/1.1 connection: each request's body (Content-Length)
/// is decoded as an `ExportTraceServiceRequest`.
fn serve(stream: TcpStream, keep: &Mutex<Vec<Span>>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut out = match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    };
    let mut r = BufReader::new(stream);
    for _ in 0..10_000 {
        let mut length = 0usize;
        let mut line = String::new();
        let mut head_lines = 0;
        loop {
            line.clear();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            head_lines += 1;
            if line == "\r\n" {
                break;
            }
            let lower = line.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
            assert!(head_lines < 100, "endless header");
        }
        let mut body = vec![0u8; length];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let req = ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP protobuf");
        let mut spans = keep.lock().expect("spans");
        for rs in req.resource_spans {
            for ss in rs.scope_spans {
                spans.extend(ss.spans);
            }
        }
        drop(spans);
        let _ = out.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
    }
}

/// The binary with `args`, exporting to `otlp` with a short batch delay;
/// stopped by PID (SIGTERM, then SIGKILL) when dropped.
struct Proc(Child);

impl Proc {
    fn spawn(args: &[&str], otlp: &str) -> Proc {
        // After the subcommand, if any: a global flag before one is refused.
        let (head, tail) = match args.first() {
            Some(a) if !a.starts_with('-') => args.split_at(1),
            _ => args.split_at(0),
        };
        let child = crate::common::server_command(BIN)
            .args(head)
            .args(["--otlp-endpoint", otlp])
            .args(tail)
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start exec-server");
        Proc(child)
    }

    fn first_line(&mut self) -> String {
        common::first_stdout_line(&mut self.0)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn attr(s: &Span, key: &str) -> Option<String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    s.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
        .map(|v| match v {
            Value::StringValue(s) => s.clone(),
            Value::IntValue(i) => i.to_string(),
            Value::BoolValue(b) => b.to_string(),
            other => format!("{other:?}"),
        })
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_trace_parents_the_request_and_process_spans() {
    let receiver = Receiver::start();
    let mut server = Proc::spawn(&["--listen", "ws://127.0.0.1:0"], &receiver.url);
    let url = server.first_line();
    let mut c = Conn::open(&url, None).await;
    let dir = common::tmpdir("otlp");
    let mut start = json!({
        "id": 900,
        "method": "process/start",
        "params": start_params("traced", &["/bin/sh", "-c", "exit 3"], &dir, false, false),
        "trace": {"traceparent": format!("00-{TRACE_ID}-{PARENT_ID}-01"), "tracestate": "vendor=1"},
    });
    c.send_raw(start.to_string()).await;
    let r = c.response(900).await;
    assert_eq!(r["result"]["processId"], "traced", "{r}");
    assert_eq!(
        c.collect("traced", Duration::from_secs(10)).await.exit,
        Some(3)
    );
    // A malformed trace is ignored: the request still succeeds.
    start["id"] = json!(901);
    start["params"]["processId"] = json!("untraced");
    start["trace"] = json!({"traceparent": "00-zz-yy-01"});
    c.send_raw(start.to_string()).await;
    let r = c.response(901).await;
    assert_eq!(r["result"]["processId"], "untraced", "{r}");
    c.collect("untraced", Duration::from_secs(10)).await;

    let spans = receiver.wait_for("request and process spans", |spans| {
        let in_trace: Vec<_> = spans
            .iter()
            .filter(|s| hex(&s.trace_id) == TRACE_ID)
            .collect();
        in_trace.iter().any(|s| s.name == "process/start")
            && in_trace.iter().any(|s| s.name == "process")
    });
    let request = spans
        .iter()
        .find(|s| s.name == "process/start" && hex(&s.trace_id) == TRACE_ID)
        .expect("request span");
    assert_eq!(hex(&request.parent_span_id), PARENT_ID);
    assert_eq!(request.trace_state, "vendor=1");
    let process = spans
        .iter()
        .find(|s| s.name == "process" && hex(&s.trace_id) == TRACE_ID)
        .expect("process span");
    assert_eq!(process.parent_span_id, request.span_id);
    assert_eq!(attr(process, "process_id").as_deref(), Some("traced"));
    assert_eq!(attr(process, "exit_code").as_deref(), Some("3"));
    // The untraced start got a trace of its own, not ours.
    let other = spans
        .iter()
        .find(|s| s.name == "process" && attr(s, "process_id").as_deref() == Some("untraced"));
    if let Some(o) = other {
        assert_ne!(hex(&o.trace_id), TRACE_ID);
    }
    c.close().await;
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_commands_span_the_request_span_and_the_process_span_share_one_trace() {
    let receiver = Receiver::start();
    let mut server = Proc::spawn(&["--listen", "ws://127.0.0.1:0"], &receiver.url);
    let url = server.first_line();
    let client = Proc::spawn(
        &["run", "--connect", &url, "--", "/bin/true"],
        &receiver.url,
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut client = client;
    let status = loop {
        if let Ok(Some(s)) = client.0.try_wait() {
            break s;
        }
        assert!(Instant::now() < deadline, "exec-server run did not finish");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    let spans = receiver.wait_for("client, request and process spans", |spans| {
        let Some(root) = spans.iter().find(|s| s.name == "exec-server run") else {
            return false;
        };
        let same = |name: &str| {
            spans
                .iter()
                .any(|s| s.name == name && s.trace_id == root.trace_id)
        };
        same("process/start") && same("process")
    });
    let root = spans
        .iter()
        .find(|s| s.name == "exec-server run")
        .expect("client span");
    let request = spans
        .iter()
        .find(|s| s.name == "process/start" && s.trace_id == root.trace_id)
        .expect("request span");
    assert_eq!(
        request.parent_span_id, root.span_id,
        "the request's parent is the client's span"
    );
    let process = spans
        .iter()
        .find(|s| s.name == "process" && s.trace_id == root.trace_id)
        .expect("process span");
    assert_eq!(process.parent_span_id, request.span_id);
    drop(server);
}
