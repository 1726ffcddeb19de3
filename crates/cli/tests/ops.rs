//! Operability: Prometheus metrics, log formats (and no secrets in them).

mod common;

use common::{start_params, Conn, BIN};
use serde_json::json;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The binary with its stderr captured line by line (and stdout's first line,
/// the URL); killed by PID when dropped.
struct Logged {
    child: Child,
    url: String,
    lines: Arc<Mutex<Vec<String>>>,
    new_line: mpsc::Receiver<String>,
}

impl Logged {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Logged {
        let mut child = Command::new(BIN)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start exec-server");
        let stderr = child.stderr.take().expect("stderr");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, new_line) = mpsc::channel();
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        let mut url = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut url)
            .expect("first stdout line");
        Logged {
            child,
            url: url.trim().to_string(),
            lines,
            new_line,
        }
    }

    /// The first stderr line (so far or within 10 s) containing `needle`.
    fn wait_line(&self, needle: &str) -> String {
        if let Some(l) = self
            .lines
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.contains(needle))
        {
            return l.clone();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.new_line.recv_timeout(left) {
                Ok(l) if l.contains(needle) => return l,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        panic!(
            "no stderr line with {needle:?}: {:?}",
            self.lines.lock().unwrap()
        );
    }

    /// SIGTERM, wait (bounded), and return everything written to stderr.
    fn stop(mut self) -> Vec<String> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The reader thread ends at EOF, which the exit just caused.
        let deadline = Instant::now() + Duration::from_secs(5);
        while self
            .new_line
            .recv_timeout(Duration::from_millis(100))
            .is_ok()
            && Instant::now() < deadline
        {}
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.1 GET on loopback; returns (status line, body).
fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read response");
    let (head, body) = text.split_once("\r\n\r\n").expect("a header block");
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

fn value(scrape: &prometheus_parse::Scrape, name: &str, label: Option<(&str, &str)>) -> f64 {
    let found = scrape
        .samples
        .iter()
        .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)));
    match found.map(|s| &s.value) {
        Some(prometheus_parse::Value::Counter(v))
        | Some(prometheus_parse::Value::Gauge(v))
        | Some(prometheus_parse::Value::Untyped(v)) => *v,
        other => panic!("{name} {label:?}: {other:?}"),
    }
}

#[tokio::test]
async fn metrics_count_connections_processes_requests_and_bytes() {
    let server = Logged::start(
        &[
            "--listen",
            "ws://127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        &[("RUST_LOG", "info")],
    );
    let line = server.wait_line("metrics on http://");
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .expect("address in the log line")
        .to_string();

    let dir = common::tmpdir("metrics");
    let mut c = Conn::open(&server.url, None).await;
    let runs: [(&str, &[&str]); 3] = [
        ("ok", &["sh", "-c", "printf hello"]),
        ("fail", &["sh", "-c", "exit 3"]),
        ("killed", &["sh", "-c", "kill -9 $$"]),
    ];
    for (id, argv) in runs {
        c.ok("process/start", start_params(id, argv, &dir, false, false))
            .await;
    }
    let mut exits = Vec::new();
    for (id, _) in runs {
        exits.push(c.collect(id, Duration::from_secs(10)).await.exit);
    }
    assert_eq!(exits, [Some(0), Some(3), Some(137)]);
    // A start that fails, an unknown method, and a file written and read.
    let missing = start_params("x", &["/nonexistent/program"], &dir, false, false);
    let r = c.call("process/start", missing).await;
    let failed_code = r["error"]["code"].as_i64().unwrap_or_else(|| panic!("{r}"));
    let r = c.call("no/such", json!({})).await;
    assert_eq!(r["error"]["code"], json!(-32601), "{r}");
    let file = common::uri(&dir.join("f"));
    c.ok(
        "fs/writeFile",
        json!({"path": file, "dataBase64": common::b64(b"12345")}),
    )
    .await;
    c.ok("fs/readFile", json!({"path": file})).await;

    let (status, body) = http_get(&addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("the exposition parses");
    let v = |name, label| value(&scrape, name, label);
    assert_eq!(v("exec_server_connections_total", None), 1.0);
    assert_eq!(v("exec_server_connections_open", None), 1.0);
    assert_eq!(v("exec_server_sessions", Some(("state", "attached"))), 1.0);
    assert_eq!(v("exec_server_sessions", Some(("state", "detached"))), 0.0);
    assert_eq!(
        v(
            "exec_server_process_starts_total",
            Some(("outcome", "started"))
        ),
        3.0
    );
    assert_eq!(
        v(
            "exec_server_process_starts_total",
            Some(("outcome", "failed"))
        ),
        1.0
    );
    assert_eq!(
        v("exec_server_process_exits_total", Some(("class", "zero"))),
        1.0
    );
    assert_eq!(
        v(
            "exec_server_process_exits_total",
            Some(("class", "nonzero"))
        ),
        1.0
    );
    assert_eq!(
        v("exec_server_process_exits_total", Some(("class", "signal"))),
        1.0
    );
    assert_eq!(v("exec_server_processes_running", None), 0.0);
    assert_eq!(v("exec_server_process_output_bytes_total", None), 5.0);
    assert_eq!(
        v("exec_server_file_bytes_total", Some(("op", "write"))),
        5.0
    );
    assert_eq!(v("exec_server_file_bytes_total", Some(("op", "read"))), 5.0);
    let failed_code = failed_code.to_string();
    assert_eq!(
        v(
            "exec_server_request_errors_total",
            Some(("code", &failed_code))
        ),
        1.0
    );
    assert_eq!(
        v("exec_server_request_errors_total", Some(("code", "-32601"))),
        1.0
    );
    // Durations: one histogram per known method; the unknown one is "other".
    let count = |method: &str| {
        scrape
            .samples
            .iter()
            .find(|s| {
                s.metric == "exec_server_request_duration_seconds"
                    && s.labels.get("method") == Some(method)
            })
            .map(|s| match &s.value {
                prometheus_parse::Value::Histogram(h) => {
                    h.iter().map(|b| b.count).fold(0.0, f64::max)
                }
                other => panic!("not a histogram: {other:?}"),
            })
    };
    assert_eq!(count("process/start"), Some(4.0));
    assert_eq!(count("initialize"), Some(1.0));
    assert_eq!(count("other"), Some(1.0));
    assert_eq!(count("no/such"), None);

    assert_eq!(http_get(&addr, "/").0, "HTTP/1.1 404 Not Found");
    c.close().await;
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
