//! Remote mode end to end on loopback: our registry and relay, our executor
//! (the real binary with `--remote`), our client — and what hostile or broken
//! peers get.

use crate::common;
use common::*;
use exec_server_client::relay::RelaySource;
use exec_server_client::{ClientOptions, ExecServerClient, ProcessEvent, Source};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A child process killed (by PID) when dropped.
pub(crate) struct Proc(pub(crate) Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.0.wait();
    }
}

/// Starts `exec-server registry` with `extra` flags; returns it and its URL.
pub(crate) fn start_registry(extra: &[&str]) -> (Proc, String) {
    let mut child = crate::common::server_command(BIN)
        .arg("registry")
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start registry");
    let url = first_stdout_line(&mut child);
    assert!(url.starts_with("http://127.0.0.1:"), "{url:?}");
    (Proc(child), url)
}

/// Starts our executor registered as `env` at `url` with bearer `token`.
pub(crate) fn start_executor(url: &str, env: &str, token: &str) -> Proc {
    start_executor_with(url, env, token, &[])
}

/// As [`start_executor`], with `extra` flags.
fn start_executor_with(url: &str, env: &str, token: &str, extra: &[&str]) -> Proc {
    let mut args = vec!["--remote", url, "--environment-id", env];
    args.extend_from_slice(extra);
    Proc(spawn_with_bearer(&args, token, Stdio::inherit()))
}

/// `exec-server ARGS --registration-bearer-stdin` with `bearer` written to
/// its stdin (then closed), its stdout discarded and its stderr to `stderr`.
pub(crate) fn spawn_with_bearer(args: &[&str], bearer: &str, stderr: Stdio) -> Child {
    let mut child = crate::common::server_command(BIN)
        .args(args)
        .arg("--registration-bearer-stdin")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start exec-server");
    writeln!(child.stdin.take().unwrap(), "{bearer}").unwrap();
    child
}

/// `exec-server run --registry … -- argv` with the harness token in the environment.
pub(crate) fn run_cli(url: &str, env: &str, token: &str, argv: &[&str]) -> std::process::Output {
    crate::common::server_command(BIN)
        .args(["run", "--registry", url, "--environment", env, "--"])
        .args(argv)
        .env("CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN", token)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("remote-mode-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("tokens");
    std::fs::write(&p, text).unwrap();
    p
}

/// Waits (bounded) until `run` through the relay succeeds: the executor registers
/// and attaches in the background.
pub(crate) fn wait_ready(url: &str, env: &str, token: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = run_cli(url, env, token, &["true"]);
        if out.status.success() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "executor not reachable: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn uname_through_registry_and_relay_with_tokens() {
    let exec_tokens = temp_file("exec", "devbox executor-secret\n");
    let harness_tokens = temp_file("harness", "harness-secret\n");
    let (_reg, url) = start_registry(&[
        "--executor-tokens",
        exec_tokens.to_str().unwrap(),
        "--harness-tokens",
        harness_tokens.to_str().unwrap(),
    ]);
    let _exec = start_executor(&url, "devbox", "executor-secret");
    wait_ready(&url, "devbox", "harness-secret");
    let out = run_cli(&url, "devbox", "harness-secret", &["uname", "-a"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("Linux "),
        "{:?}",
        out.stdout
    );
    let out = run_cli(&url, "devbox", "harness-secret", &["sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7));

    // A wrong harness token is refused by the registry, with a clear message.
    let out = run_cli(&url, "devbox", "wrong", &["true"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("401"), "{err}");
    assert!(!err.contains("harness-secret"));
    // An executor token scoped to devbox cannot register another environment.
    let mut other = start_executor(&url, "other", "executor-secret");
    let status = wait_exit(&mut other.0, Duration::from_secs(10));
    assert_eq!(status, Some(1), "registration refused is fatal");
    for p in [exec_tokens, harness_tokens] {
        let _ = std::fs::remove_dir_all(p.parent().unwrap());
    }
}

/// An environment registered but with no executor attached (it died) is
/// reported as such, not as a relay that closed for no reason.
#[test]
fn an_environment_without_its_executor_says_so() {
    let (_reg, url) = start_registry(&[]);
    let mut exec = start_executor(&url, "gone", "exec-token");
    wait_ready(&url, "gone", "harness-token");
    let _ = exec.0.kill();
    let _ = exec.0.wait();
    let out = run_cli(&url, "gone", "harness-token", &["true"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no executor of this environment is attached"),
        "{err}"
    );
}

fn wait_exit(c: &mut Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(s)) = c.try_wait() {
            return s.code();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// A TCP proxy in front of the relay: `cut()` drops every socket through it.
struct Proxy {
    port: u16,
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Proxy {
    async fn start(target: u16) -> Proxy {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let list = conns.clone();
        tokio::spawn(async move {
            while let Ok((mut a, _)) = l.accept().await {
                let h = tokio::spawn(async move {
                    if let Ok(mut b) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await {
                        let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
                    }
                });
                list.lock().unwrap().push(h.abort_handle());
            }
        });
        Proxy { port, conns }
    }

    fn cut(&self) {
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }
}

/// Our client on `env` through the registry at `url` (harness token `h`),
/// connected once the executor has attached (bounded at 20 s).
async fn relay_client(url: &str, env: &str) -> ExecServerClient {
    let source = RelaySource::new(url, env, "h", None).unwrap();
    let mut opts = ClientOptions::new(Source::relay(source));
    opts.connect_timeout = Duration::from_secs(10);
    let c = ExecServerClient::new(opts);
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.connect().await.is_err() {
        assert!(Instant::now() < deadline, "executor never reachable");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c
}

/// `seq 1 2000000` through the relay is byte-identical across 5 drops of the
/// harness's socket and 2 of every relay socket (the executor's included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seq_2000000_survives_harness_and_executor_drops() {
    use exec_server_relay::registry::{store::MemoryStore, Config, Registry};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let reg_port = l.local_addr().unwrap().port();
    let proxy = Proxy::start(reg_port).await;
    // Relay URLs point at the proxy; registry calls go straight to the registry.
    let registry = Registry::new(
        Config::default(),
        Arc::new(MemoryStore::default()),
        format!("ws://127.0.0.1:{}", proxy.port),
    )
    .await
    .unwrap();
    tokio::spawn(registry.serve(l));
    let url = format!("http://127.0.0.1:{reg_port}");
    let _exec = start_executor(&url, "seq-env", "t");
    let c = relay_client(&url, "seq-env").await;
    assert!(
        c.binary_frames().await,
        "our client and executor agree on binary frames over a relay stream"
    );
    let want = expected_seq(2_000_000);
    let total = want.len();
    let mut p = c
        .start_process(exec_params("big", &["seq", "1", "2000000"]))
        .await
        .unwrap();
    let mut bytes = Vec::with_capacity(total);
    let mut exit = None;
    // Drop points as fractions of the output: harness drops at 1..5/8, relay cuts at 3/16 and 11/16.
    let mut harness_drops = 0;
    let mut cuts = 0;
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(60), p.next_event())
            .await
            .expect("event within 60 s");
        match ev {
            Some(ProcessEvent::Output { data, .. }) => {
                bytes.extend_from_slice(&data);
                let progress = bytes.len() * 16 / total;
                if harness_drops < 5 && progress >= 2 * (harness_drops + 1) {
                    harness_drops += 1;
                    c.drop_connection().await;
                }
                if cuts < 2 && progress >= [3, 11][cuts] {
                    cuts += 1;
                    proxy.cut();
                }
            }
            Some(ProcessEvent::Exited { code, .. }) => exit = Some(code),
            Some(ProcessEvent::Closed { .. }) | None => break,
            Some(ProcessEvent::Failed(why)) => panic!("stream failed: {why}"),
        }
    }
    assert_eq!(exit, Some(0));
    assert_eq!((harness_drops, cuts), (5, 2));
    assert!(
        bytes == want,
        "output differs from seq 1 2000000 ({} bytes)",
        bytes.len()
    );
    // Drops that land while a resume is under way merge into it.
    assert!(c.recoveries() >= 3, "recoveries: {}", c.recoveries());
}

/// Files through the relay on the binary fast path: 24 MiB of every byte
/// value uploaded, read back whole and downloaded, each byte-identical on the
/// host and at the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_cross_the_relay_raw_and_exact() {
    use exec_server_client::PathUri;
    let (_reg, url) = start_registry(&[]);
    let _exec = start_executor(&url, "files", "t");
    let c = relay_client(&url, "files").await;
    assert!(
        c.binary_frames().await,
        "binary frames agreed over the relay"
    );
    let d = tmpdir("relay-files");
    let data: Vec<u8> = (0..24u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let src = d.join("src");
    std::fs::write(&src, &data).unwrap();
    let remote = PathUri::from_path(&d.join("remote")).unwrap();
    let sent = c
        .upload_from_file(std::fs::File::open(&src).unwrap(), &remote, |_| {})
        .await
        .unwrap();
    assert_eq!(sent, data.len() as u64);
    let on_host = std::fs::read(d.join("remote")).unwrap();
    assert_eq!(first_difference(&on_host, &data), None, "uploaded file");
    let whole = c.read_file(&remote).await.unwrap();
    assert_eq!(first_difference(&whole, &data), None, "fs/readFile");
    let mut downloaded = Vec::new();
    c.download(&remote, &mut downloaded).await.unwrap();
    assert_eq!(first_difference(&downloaded, &data), None, "download");
    c.close().await;
    std::fs::remove_dir_all(&d).unwrap();
}

fn codex_ref() -> Option<String> {
    let out = Command::new("sh")
        .args(["-c", "command -v codex-ref"])
        .output()
        .ok()?;
    let p = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!p.is_empty()).then_some(p)
}

/// The real Codex harness (`codex exec` with the three `CODEX_EXEC_SERVER_NOISE_*`
/// variables, driven by `../shared/realclient`'s mock model) runs a command on
/// our executor through our registry and relay. Skipped without `codex-ref` or
/// the shared directory.
#[test]
fn real_codex_harness_through_our_registry_to_our_executor() {
    let (_reg, url) = start_registry(&[]);
    let _exec = start_executor(&url, "devbox", "t");
    wait_ready(&url, "devbox", "h");
    codex_harness_runs_a_command(&url, "devbox", "h");
}

/// Runs the real Codex harness against environment `env` at the registry
/// `url` (harness token `token`) and asserts that a command's output reached
/// its (mock) model. Does nothing, and says so, without `codex-ref` or the
/// shared directory.
pub(crate) fn codex_harness_runs_a_command(url: &str, env: &str, token: &str) {
    let shared = std::env::var("SHARED_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared").to_string());
    let mock = std::path::Path::new(&shared).join("realclient/mock_model.py");
    let (Some(codex), true) = (codex_ref(), mock.exists()) else {
        eprintln!("codex-ref or {} missing; skipping", mock.display());
        return;
    };
    let dir = std::env::temp_dir().join(format!("remote-realclient-{}-{env}", std::process::id()));
    std::fs::create_dir_all(dir.join("home")).unwrap();
    std::fs::create_dir_all(dir.join("work")).unwrap();
    let script = r#"{"remote1": {"steps": [{"kind": "function", "name": "exec_command", "arguments": {"cmd": "echo REMOTE-MARKER-$((6*7))", "yield_time_ms": 3000}}], "final": "done"}}"#;
    std::fs::write(dir.join("script.json"), script).unwrap();
    let mut model = Command::new("python3")
        .arg(&mock)
        .args([
            "--script",
            dir.join("script.json").to_str().unwrap(),
            "--port",
            "0",
        ])
        .args(["--record", dir.join("rec.jsonl").to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut port = String::new();
    BufReader::new(model.stdout.take().unwrap())
        .read_line(&mut port)
        .unwrap();
    let _model = Proc(model);
    let config = format!(
        "model = \"gpt-5.5\"\nmodel_provider = \"realclient_mock\"\napproval_policy = \"never\"\nsandbox_mode = \"danger-full-access\"\n\n\
         [model_providers.realclient_mock]\nname = \"realclient mock\"\nbase_url = \"http://127.0.0.1:{}/v1\"\nwire_api = \"responses\"\n\
         request_max_retries = 0\nstream_max_retries = 0\nstream_idle_timeout_ms = 60000\n\n\
         [features]\nplugins = false\nremote_plugin = false\napps = false\n\n[analytics]\nenabled = false\n",
        port.trim()
    );
    std::fs::write(dir.join("home/config.toml"), config).unwrap();
    let out = Command::new(codex)
        .args([
            "exec",
            "--skip-git-repo-check",
            "--ephemeral",
            "--json",
            "--strict-config",
            "-C",
        ])
        .arg(dir.join("work"))
        .arg("[rc-scenario:remote1] follow the script")
        .env_remove("CODEX_EXEC_SERVER_URL")
        .env("CODEX_HOME", dir.join("home"))
        .env("NO_COLOR", "1")
        .env("CODEX_EXEC_SERVER_NOISE_REGISTRY_URL", url)
        .env("CODEX_EXEC_SERVER_NOISE_ENVIRONMENT_ID", env)
        .env("CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN", token)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let recorded = std::fs::read_to_string(dir.join("rec.jsonl")).unwrap_or_default();
    assert!(
        recorded.contains("REMOTE-MARKER-42"),
        "the command's output did not reach the model; codex stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `forward` bridges a listening exec-server (ours, then the reference when
/// installed) into the registry: `run --registry` reaches it stream by stream.
#[test]
fn forward_bridges_a_listening_server() {
    let mut targets = vec![Server::start(&[])];
    if let Some(codex) = codex_ref() {
        let mut child = Command::new(codex)
            .args(["exec-server", "--listen", "ws://127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let url = first_stdout_line(&mut child);
        targets.push(Server { child, url });
    }
    for (i, target) in targets.iter().enumerate() {
        let (_reg, url) = start_registry(&[]);
        let env = format!("fwd{i}");
        let args = [
            "forward",
            "--connect",
            &target.url,
            "--remote",
            &url,
            "--environment-id",
            &env,
        ];
        let _fwd = Proc(spawn_with_bearer(&args, "t", Stdio::inherit()));
        wait_ready(&url, &env, "h");
        let out = run_cli(&url, &env, "h", &["sh", "-c", "echo forwarded; exit 3"]);
        assert_eq!(
            out.status.code(),
            Some(3),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, b"forwarded\n");
    }
}

/// `POST /cloud/environment/{env}/connect` with a fresh harness key over a raw
/// HTTP/1.1 connection; returns the status line's code and the JSON body.
fn connect_raw(url: &str, env: &str) -> (u16, serde_json::Value) {
    use std::io::Read;
    let key = exec_server_relay::Identity::generate(&mut exec_server_relay::OsRandom)
        .public_key()
        .to_wire();
    let body = serde_json::json!({ "harness_public_key": key }).to_string();
    let host = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(host).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST /cloud/environment/{env}/connect HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let code = text[9..12].parse().unwrap();
    let json = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (
        code,
        serde_json::from_str(json).unwrap_or(serde_json::Value::Null),
    )
}

#[test]
fn sqlite_db_keeps_registrations_across_a_registry_restart() {
    let dir = std::env::temp_dir().join(format!("remote-mode-db-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("registry.db");
    let _ = std::fs::remove_file(&db);
    let (reg, url) = start_registry(&["--db", db.to_str().unwrap()]);
    let _exec = start_executor(&url, "persist", "any");
    wait_ready(&url, "persist", "any");
    let (code, before) = connect_raw(&url, "persist");
    assert_eq!(code, 200, "{before}");
    let registration = before["executor_registration_id"]
        .as_str()
        .unwrap()
        .to_string();
    // SIGKILL: nothing gets to flush; only what SQLite committed survives.
    drop(reg);
    let port = url.rsplit(':').next().unwrap().to_string();
    let (_reg2, url2) = start_registry(&[
        "--db",
        db.to_str().unwrap(),
        "--listen",
        &format!("127.0.0.1:{port}"),
    ]);
    assert_eq!(url2, url);
    let (code, after) = connect_raw(&url2, "persist");
    assert_eq!(code, 200, "{after}");
    assert_eq!(after["executor_registration_id"], registration.as_str());
    assert_eq!(after["executor_public_key"], before["executor_public_key"]);
    // The executor gets back onto the restarted relay and serves again.
    wait_ready(&url2, "persist", "any");
    let out = run_cli(&url2, "persist", "any", &["echo", "after restart"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "after restart\n");
    // A fresh database knows nothing of it.
    let (_reg3, url3) = start_registry(&["--db", dir.join("other.db").to_str().unwrap()]);
    assert_eq!(connect_raw(&url3, "persist").0, 404);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn registry_refuses_plain_http_off_loopback() {
    let out = crate::common::server_command(BIN)
        .args(["registry", "--listen", "0.0.0.0:0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--tls-cert"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed certificate for 127.0.0.1 and localhost: (cert PEM path, key PEM path).
fn self_signed(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let ck =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    (cert, key)
}

#[test]
fn tls_registry_and_relay_with_a_private_ca() {
    let dir = std::env::temp_dir().join(format!("remote-mode-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = self_signed(&dir);
    let mut child = crate::common::server_command(BIN)
        .args([
            "registry",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let url = first_stdout_line(&mut child);
    let _reg = Proc(child);
    assert!(url.starts_with("https://127.0.0.1:"), "{url:?}");
    // The executor trusts the certificate through SSL_CERT_FILE.
    let mut child = crate::common::server_command(BIN)
        .args([
            "--remote",
            &url,
            "--environment-id",
            "tls-env",
            "--registration-bearer-stdin",
        ])
        .env("SSL_CERT_FILE", &cert)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "any").unwrap();
    let _exec = Proc(child);
    let run = |ca: Option<&std::path::Path>| {
        let mut c = crate::common::server_command(BIN);
        c.args([
            "run",
            "--registry",
            &url,
            "--environment",
            "tls-env",
            "--",
            "echo",
            "over tls",
        ])
        .env("CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN", "any")
        .env_remove("SSL_CERT_FILE")
        .stdin(Stdio::null());
        if let Some(ca) = ca {
            c.env("SSL_CERT_FILE", ca);
        }
        c.output().unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let out = loop {
        let out = run(Some(&cert));
        if out.status.success() || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "over tls\n");
    // Without the CA the client refuses the registry's certificate.
    let out = run(None);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    // Plain HTTP to the TLS port gets no registry answer.
    let (code_or_none, _) =
        std::panic::catch_unwind(|| connect_raw(&url.replace("https", "http"), "tls-env"))
            .map(|(c, v)| (Some(c), v))
            .unwrap_or((None, serde_json::Value::Null));
    assert_ne!(code_or_none, Some(200));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Scrapes `http://addr/metrics` and returns `name → value` of unlabelled
/// samples, parsed with a Prometheus text parser.
fn scrape(addr: &str) -> std::collections::HashMap<String, f64> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).expect("metrics listener");
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    let lines = body.lines().map(|l| Ok(l.to_owned()));
    let parsed = prometheus_parse::Scrape::parse(lines).expect("metrics parse");
    parsed
        .samples
        .into_iter()
        .filter_map(|s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => {
                Some((s.metric, v))
            }
            prometheus_parse::Value::Untyped(v) => Some((s.metric, v)),
            _ => None,
        })
        .collect()
}

#[test]
fn relay_streams_and_registrations_are_counted_in_metrics() {
    let exec_tokens = temp_file("metrics-exec", "devbox executor-secret\n");
    let harness_tokens = temp_file("metrics-harness", "harness-secret\n");
    let (_reg, url) = start_registry(&[
        "--executor-tokens",
        exec_tokens.to_str().unwrap(),
        "--harness-tokens",
        harness_tokens.to_str().unwrap(),
    ]);
    // A free loopback port for the metrics listener (the executor prints no URL).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    let _exec = start_executor_with(
        &url,
        "devbox",
        "executor-secret",
        &["--metrics-listen", &addr],
    );
    wait_ready(&url, "devbox", "harness-secret");
    let out = run_cli(&url, "devbox", "harness-secret", &["sh", "-c", "exit 4"]);
    assert_eq!(out.status.code(), Some(4));
    // Both runs' streams were opened and, once their clients exited, closed.
    let deadline = Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = scrape(&addr);
        if m.get("exec_server_relay_streams_open") == Some(&0.0) {
            break m;
        }
        assert!(Instant::now() < deadline, "streams still open: {m:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(m["exec_server_relay_streams_total"] >= 2.0, "{m:?}");
    assert!(m["exec_server_relay_registrations_total"] >= 1.0, "{m:?}");
    assert_eq!(
        m["exec_server_relay_handshake_failures_total"], 0.0,
        "{m:?}"
    );
    for p in [exec_tokens, harness_tokens] {
        let _ = std::fs::remove_dir_all(p.parent().unwrap());
    }
}

/// A bad environment id is refused while the arguments are parsed (exit 2,
/// nothing sent anywhere), by the executor and the client alike, with a
/// message that names the rule and does not repeat the id.
#[test]
fn bad_environment_ids_are_refused_at_argument_parsing() {
    let long = "x".repeat(257);
    for bad in [
        "..",
        "a/../../x",
        "a\nb",
        "\u{202e}abc",
        "a b",
        "  ",
        long.as_str(),
    ] {
        let executor = crate::common::server_command(BIN)
            .args(["--remote", "http://127.0.0.1:9", "--environment-id", bad])
            .arg("--registration-bearer-stdin")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let client = crate::common::server_command(BIN)
            .args([
                "run",
                "--registry",
                "http://127.0.0.1:9",
                "--environment",
                bad,
            ])
            .args(["--", "true"])
            .env("CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN", "t")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        for (out, flag) in [(executor, "--environment-id"), (client, "--environment")] {
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{bad:?} {flag}: {err}");
            assert!(err.contains(flag), "{err}");
            assert!(err.contains("environment id"), "{err}");
            assert!(err.contains("A-Z, a-z, 0-9, '_' and '-'"), "{err}");
            if bad.trim().len() > 1 {
                assert!(!err.contains(bad.trim()), "{bad:?} echoed: {err}");
            }
        }
    }
}
