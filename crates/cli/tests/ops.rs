//! Operability: Prometheus metrics, log formats (and no secrets in them).

use crate::common;

use common::{start_params, Conn, BIN};
use serde_json::json;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

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
        let mut child = crate::common::server_command(BIN)
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

/// The binary on loopback with `--metrics-listen metrics` (`IP:PORT`),
/// logging at `level` (a `RUST_LOG` filter).
fn with_metrics_on(metrics: &str, level: &str) -> Logged {
    let args = ["--listen", "ws://127.0.0.1:0", "--metrics-listen", metrics];
    Logged::start(&args, &[("RUST_LOG", level)])
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
    let server = with_metrics_on("127.0.0.1:0", "info");
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

/// A WebSocket JSON-RPC exchange with a bearer token: `initialize`,
/// `initialized`, then each `(method, params)` in turn; returns the responses.
async fn exchange_with_token(
    url: &str,
    token: &str,
    calls: &[(&str, serde_json::Value)],
) -> Vec<serde_json::Value> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message as Ws;
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .expect("upgrade with the token");
    let mut answers = Vec::new();
    let init = ("initialize", json!({"clientName": "ops-test"}));
    for (i, (method, params)) in std::iter::once(&init).chain(calls).enumerate() {
        let msg = json!({"id": i, "method": method, "params": params});
        ws.send(Ws::text(msg.to_string())).await.unwrap();
        let answer = loop {
            let next = tokio::time::timeout(Duration::from_secs(10), ws.next())
                .await
                .expect("an answer within 10 s");
            let Some(Ok(Ws::Text(t))) = next else {
                panic!("connection ended: {next:?}")
            };
            let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
            if v["id"] == json!(i) {
                break v;
            }
        };
        if i == 0 {
            ws.send(Ws::text(json!({"method": "initialized"}).to_string()))
                .await
                .unwrap();
        }
        answers.push(answer);
    }
    let _ = ws.close(None).await;
    answers
}

/// Both log formats, at the most verbose level, never show the WebSocket token
/// (accepted or refused) or a header value taken from the server's environment.
#[tokio::test]
async fn logs_in_both_formats_carry_no_secrets() {
    const TOKEN: &str = "tok-4f1d9c2e-never-in-logs";
    const HEADER_SECRET: &str = "hdr-7b3a5e91-never-in-logs";
    let dir = common::tmpdir("logs");
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let (http_base, http_task) = common::loopback_http::http_server().await;
    for format in ["text", "json"] {
        let server = Logged::start(
            &[
                "--listen",
                "ws://127.0.0.1:0",
                "--log-format",
                format,
                "--ws-auth",
                "capability-token",
                "--ws-token-file",
                token_file.to_str().unwrap(),
            ],
            &[("RUST_LOG", "trace"), ("OPS_TEST_SECRET", HEADER_SECRET)],
        );
        // A refused upgrade: the wrong token, which also must not be logged.
        let mut bad = server.url.as_str().into_client_request().unwrap();
        bad.headers_mut().insert(
            "authorization",
            "Bearer tok-wrong-never-in-logs".parse().unwrap(),
        );
        assert!(tokio_tungstenite::connect_async(bad).await.is_err());
        let request = json!({
            "method": "GET",
            "url": format!("{http_base}/echo"),
            "requestId": "r1",
            "headers": [{"name": "x-api-key", "value": "", "valueEnvVar": "OPS_TEST_SECRET"}],
        });
        let answers = exchange_with_token(&server.url, TOKEN, &[("http/request", request)]).await;
        let body = common::unb64(&answers[1]["result"]["bodyBase64"]);
        let body = String::from_utf8_lossy(&body);
        assert!(
            body.contains(HEADER_SECRET),
            "the header was sent: {}",
            answers[1]
        );
        let lines = server.stop();
        assert!(
            lines.iter().any(|l| l.contains("http/request")),
            "{format}: the request was logged at trace level: {lines:?}"
        );
        for secret in [TOKEN, HEADER_SECRET, "tok-wrong-never-in-logs"] {
            let leaks: Vec<_> = lines.iter().filter(|l| l.contains(secret)).collect();
            assert!(leaks.is_empty(), "{format} log shows {secret}: {leaks:?}");
        }
        if format == "json" {
            let mut with_span = 0;
            for l in &lines {
                let v: serde_json::Value = serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {l}"));
                assert!(v["timestamp"].is_string() && v["level"].is_string(), "{l}");
                if v["span"]["name"] == json!("request")
                    && v["span"]["method"] == json!("http/request")
                {
                    with_span += 1;
                }
            }
            assert!(with_span > 0, "no event inside the request span: {lines:?}");
        } else {
            assert!(lines.iter().all(|l| !l.trim_start().starts_with('{')));
        }
    }
    http_task.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs the binary with `args`; returns (exit code, stdout, stderr).
fn run(args: &[&str]) -> (i32, String, String) {
    let out = crate::common::server_command(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run exec-server");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn version_completions_and_man_page() {
    let (code, out, _) = run(&["--version"]);
    assert_eq!(code, 0);
    assert!(out.contains("protocol: Codex exec-server 0.169.0"), "{out}");

    let (code, script, err) = run(&["completions", "bash"]);
    assert_eq!(code, 0, "{err}");
    assert!(script.contains("--metrics-listen"), "flags are completed");
    // bash accepts it and registers a completion for the command.
    let dir = common::tmpdir("completions");
    let file = dir.join("exec-server.bash");
    std::fs::write(&file, &script).unwrap();
    let check = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} && complete -p exec-server",
            file.display()
        ))
        .output()
        .expect("bash");
    assert!(
        check.status.success() && String::from_utf8_lossy(&check.stdout).contains("exec-server"),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    for shell in ["zsh", "fish"] {
        let (code, script, _) = run(&["completions", shell]);
        assert_eq!(code, 0);
        assert!(script.contains("metrics-listen"), "{shell}");
    }
    let (code, _, err) = run(&["completions", "tcsh"]);
    assert_eq!(code, 2, "an unknown shell is a usage error: {err}");

    let (code, page, _) = run(&["man"]);
    assert_eq!(code, 0);
    assert!(page.contains(".TH exec-server 1"), "{page}");
    assert!(page.contains("metrics\\-listen"), "flags are documented");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The unit in contrib/ passes `systemd-analyze verify` with no warning, and
/// keeps the settings the sandbox needs.
#[test]
fn systemd_unit_verifies() {
    let unit = include_str!("../../../contrib/exec-server.service");
    let active: Vec<&str> = unit
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    assert!(active.contains(&"Type=exec"));
    assert!(active.contains(&"Restart=on-failure"));
    for breaks_sandbox in [
        "PrivateUsers=",
        "RestrictNamespaces=",
        "ProtectSystem=",
        "PrivateTmp=",
        "ProtectHome=",
        "SystemCallFilter=",
    ] {
        assert!(
            !active.iter().any(|l| l.starts_with(breaks_sandbox)),
            "{breaks_sandbox} would break the sandbox"
        );
    }
    let Ok(probe) = Command::new("systemd-analyze").arg("--version").output() else {
        println!("skipped: systemd-analyze is not installed here");
        return;
    };
    if !probe.status.success() {
        println!("skipped: systemd-analyze does not run here");
        return;
    }
    let dir = common::tmpdir("unit");
    let path = dir.join("exec-server.service");
    // verify checks that ExecStart's program exists: point it at this build.
    std::fs::write(&path, unit.replace("/usr/local/bin/exec-server", BIN)).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .expect("systemd-analyze");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.trim().is_empty(), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn sighup_is_ignored() {
    let server = Logged::start(&["--listen", "ws://127.0.0.1:0"], &[("RUST_LOG", "info")]);
    let pid = nix::unistd::Pid::from_raw(server.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    server.wait_line("SIGHUP: ignored");
    let mut c = Conn::open(&server.url, None).await;
    let info = c.ok("environment/info", json!({})).await;
    assert!(info["capabilities"].is_object(), "{info}");
    c.close().await;
    server.stop();
}

/// `--metrics-listen` off loopback warns as `--listen` does (issue 30): the
/// metrics listener has no authentication. Nothing is sent to the wildcard
/// address; only the server's stderr is read.
#[test]
fn metrics_listen_off_loopback_warns() {
    let warning = "without authentication: anyone who can reach it can read them";
    let server = with_metrics_on("0.0.0.0:0", "warn");
    let line = server.wait_line(warning);
    assert!(
        line.contains("WARN") && line.contains("serving metrics on http://0.0.0.0:"),
        "{line}"
    );
    server.stop();
    // On loopback: the listener is up (its info line) and nothing is warned.
    let server = with_metrics_on("127.0.0.1:0", "info");
    server.wait_line("metrics on http://127.0.0.1:");
    let lines = server.stop();
    assert!(!lines.iter().any(|l| l.contains(warning)), "{lines:?}");
}
