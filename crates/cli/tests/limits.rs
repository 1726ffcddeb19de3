//! `limits` of `process/start` against the real binary: each limit ends the
//! whole tree with its reason on `process/exited`, on pipes, on a PTY and in
//! the sandbox; bad limits are -32602 naming the member; `run`'s flags.

use crate::common;
use common::sandbox::ro;
use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn with_limits(mut params: Value, limits: Value) -> Value {
    params["limits"] = limits;
    params
}

/// Starts `argv` with `limits` (optionally on a PTY or in a sandbox) and
/// collects it: (what it delivered, exit code, limit, seconds it took).
/// Also `caps`'.
pub(crate) async fn run_limited(
    s: &Server,
    argv: &[&str],
    limits: Value,
    tty: bool,
    sandbox: Option<Value>,
) -> (Collected, f64) {
    let d = tmpdir("limits");
    let mut c = Conn::open(&s.url, None).await;
    let mut params = with_limits(start_params("p", argv, &d, tty, false), limits);
    if let Some(sb) = sandbox {
        params["sandbox"] = sb;
    }
    let t = Instant::now();
    c.ok("process/start", params).await;
    let got = c.collect("p", Duration::from_secs(30)).await;
    let took = t.elapsed().as_secs_f64();
    c.close().await;
    let _ = std::fs::remove_dir_all(&d);
    (got, took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_ends_a_sleep_on_pipes_on_a_pty_and_in_the_sandbox() {
    let s = Server::start(&[]);
    let ws = tmpdir("limits-ws");
    for (tty, sandbox) in [(false, None), (true, None), (false, Some(ro(&ws)))] {
        let (got, took) = run_limited(
            &s,
            &["sleep", "1000"],
            json!({"timeoutMs": 500}),
            tty,
            sandbox.clone(),
        )
        .await;
        assert_eq!(
            got.limit.as_deref(),
            Some("wallTimeout"),
            "tty {tty}, sandbox {}",
            sandbox.is_some()
        );
        assert_eq!(got.exit, Some(128 + 15), "ended by SIGTERM");
        assert!(took < 3.0, "took {took:.2} s");
    }
    let _ = std::fs::remove_dir_all(&ws);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_timeout_ends_a_silent_command_and_spares_a_chatty_one() {
    let s = Server::start(&[]);
    let (silent, _) = run_limited(
        &s,
        &["sh", "-c", "echo start; exec sleep 1000"],
        json!({"idleTimeoutMs": 300}),
        false,
        None,
    )
    .await;
    assert_eq!(silent.limit.as_deref(), Some("idleTimeout"));
    assert_eq!(silent.bytes, b"start\n");
    // Printing every 100 ms, it outlives a 400 ms idle timeout until its
    // 1.5 s deadline.
    let (chatty, took) = run_limited(
        &s,
        &["sh", "-c", "while :; do echo x; sleep 0.1; done"],
        json!({"idleTimeoutMs": 400, "timeoutMs": 1500}),
        false,
        None,
    )
    .await;
    assert_eq!(
        chatty.limit.as_deref(),
        Some("wallTimeout"),
        "took {took:.2} s"
    );
    assert!(chatty.bytes.len() >= 10, "{} bytes", chatty.bytes.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yes_under_an_output_cap_delivers_exactly_the_cap() {
    let s = Server::start(&[]);
    for tty in [false, true] {
        let (got, _) =
            run_limited(&s, &["yes"], json!({"maxOutputBytes": 1 << 20}), tty, None).await;
        assert_eq!(got.limit.as_deref(), Some("outputLimit"), "tty {tty}");
        assert_eq!(got.bytes.len(), 1 << 20, "tty {tty}");
        let line: &[u8] = if tty { b"y\r\n" } else { b"y\n" };
        assert!(got.bytes.chunks(line.len()).take(1000).all(|c| c == line));
    }
}

/// Starts `argv` as `p` with `limits` on a connection of its own, in a new
/// working directory, and reads nothing of it: the connection and the
/// directory.
async fn start_unread(s: &Server, argv: &[&str], limits: Value) -> (Conn, std::path::PathBuf) {
    let d = tmpdir("limits-unread");
    let mut c = Conn::open(&s.url, None).await;
    let params = with_limits(start_params("p", argv, &d, false, false), limits);
    c.ok("process/start", params).await;
    (c, d)
}

/// A client that stops reading holds the output back, not the limits: the
/// server waits to hand it a chunk, and the deadline still ends the command
/// (and the output cap's and the grace's follow-ups with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_fires_while_the_client_reads_nothing() {
    let s = Server::start(&[]);
    let marker = "sleep 1000.93";
    let script = format!("{marker} & head -c 64M /dev/zero; wait");
    let (mut c, d) = start_unread(&s, &["sh", "-c", &script], json!({"timeoutMs": 1000})).await;
    assert!(
        eventually(Duration::from_secs(10), || !pids_matching(marker)
            .is_empty())
        .await,
        "the command started"
    );
    // Nothing is read meanwhile: the output fills the socket and the
    // server's queue, and the server waits to hand over the next chunk.
    assert!(
        eventually(Duration::from_secs(6), || pids_matching(marker).is_empty()).await,
        "the command outlived its 1 s deadline while its client read nothing"
    );
    let got = c.collect("p", Duration::from_secs(60)).await;
    assert_eq!(got.limit.as_deref(), Some("wallTimeout"));
    assert_eq!(got.exit, Some(128 + 15), "ended by SIGTERM");
    c.close().await;
    let _ = std::fs::remove_dir_all(&d);
}

/// Output a stalled client holds back is not silence: `yes`, blocked on
/// its full pipe behind a client that reads nothing, outlives a 300 ms idle
/// timeout and is ended by its deadline instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_held_back_by_a_stalled_client_is_not_idleness() {
    let s = Server::start(&[]);
    let limits = json!({"idleTimeoutMs": 300, "timeoutMs": 2500});
    let (mut c, d) = start_unread(&s, &["yes"], limits).await;
    // Nothing is read for the first 3 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let got = c.collect("p", Duration::from_secs(60)).await;
    assert_eq!(got.limit.as_deref(), Some("wallTimeout"));
    c.close().await;
    let _ = std::fs::remove_dir_all(&d);
}

/// A command that ignores SIGTERM is killed after the grace (2 s), and a
/// daemon it double-forked dies with the deadline too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_kills_what_ignores_sigterm_and_the_daemons_it_left() {
    let s = Server::start(&[]);
    let d = tmpdir("limits-daemon");
    let pidfile = d.join("daemon.pid");
    let script = format!(
        "trap '' TERM; (setsid sh -c 'echo $$ > {}; exec sleep 1000' </dev/null >/dev/null 2>&1 &); sleep 1000",
        pidfile.display()
    );
    let (got, took) = run_limited(
        &s,
        &["sh", "-c", &script],
        json!({"timeoutMs": 500}),
        false,
        None,
    )
    .await;
    assert_eq!(got.limit.as_deref(), Some("wallTimeout"));
    assert_eq!(got.exit, Some(128 + 9), "killed after the grace");
    assert!((2.0..6.0).contains(&took), "took {took:.2} s");
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::path::Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    {
        assert!(
            Instant::now() < deadline,
            "the daemon {pid} outlived the deadline"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[tokio::test]
async fn bad_limits_are_refused_naming_the_member() {
    let s = Server::start(&[]);
    let d = tmpdir("limits-bad");
    let mut c = Conn::open(&s.url, None).await;
    for (limits, want) in [
        (
            json!({"timeoutMs": 0}),
            "limits.timeoutMs must be at least 1",
        ),
        (
            json!({"idleTimeoutMs": 0}),
            "limits.idleTimeoutMs must be at least 1",
        ),
        (json!({"memoryBytes": 1}), "memoryBytes"),
        (json!({"timeoutMs": "soon"}), "expected u64"),
    ] {
        let r = c
            .call(
                "process/start",
                with_limits(start_params("x", &["true"], &d, false, false), limits),
            )
            .await;
        assert_eq!(r["error"]["code"], json!(-32602), "{r}");
        let msg = r["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(want), "{msg}");
    }
    let info = c.ok("environment/info", Value::Null).await;
    assert_eq!(info["capabilities"]["processLimits"], json!(true));
    let _ = std::fs::remove_dir_all(&d);
}

/// `run --timeout` exits 124 with one line on stderr; `--max-output` cuts.
#[test]
fn run_flags_end_the_command_and_say_why() {
    let out = crate::common::server_command(BIN)
        .args(["run", "--timeout", "300ms", "--", "sleep", "1000"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(124));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ran past --timeout"), "{err}");
    let out = crate::common::server_command(BIN)
        .args(["run", "--max-output", "64K", "--", "yes"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(124));
    assert_eq!(out.stdout.len(), 65536);
    let out = crate::common::server_command(BIN)
        .args(["run", "--timeout", "0", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a zero limit is a usage error");
}

/// `process/list` shows the session's processes with what they were
/// started with and where they stand; another session sees none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_list_shows_this_sessions_processes_only() {
    let s = Server::start(&[]);
    let d = tmpdir("list");
    let mut c = Conn::open(&s.url, None).await;
    c.ok(
        "process/start",
        with_limits(
            start_params(
                "long",
                &["sh", "-c", "echo hello; exec sleep 1000"],
                &d,
                false,
                false,
            ),
            json!({"timeoutMs": 60000}),
        ),
    )
    .await;
    c.ok(
        "process/start",
        start_params("short", &["true"], &d, true, false),
    )
    .await;
    let short = c.collect("short", Duration::from_secs(10)).await;
    assert_eq!(short.exit, Some(0));
    // Wait until `long` has printed, so its output count is known.
    c.expect(
        |m| m["method"] == json!("process/output") && m["params"]["processId"] == json!("long"),
        Duration::from_secs(10),
    )
    .await
    .expect("long's output");
    let list = c.ok("process/list", json!({})).await;
    let procs = list["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2, "{list}");
    let long = &procs[0];
    assert_eq!(long["processId"], json!("long"));
    assert_eq!(long["state"], json!("running"));
    assert_eq!(long["argv"][0], json!("sh"));
    assert_eq!(long["cwd"], json!(uri(&d)));
    assert_eq!(long["tty"], json!(false));
    assert_eq!(long["outputBytes"], json!(6));
    assert_eq!(long["limits"], json!({"timeoutMs": 60000}));
    assert!(long["pid"].as_u64().unwrap() > 1);
    assert!(long["memoryBytes"].as_u64().unwrap() > 0, "{long}");
    assert!(long["cpuTimeMs"].is_u64(), "{long}");
    assert!(long["startedAtMs"].as_u64().unwrap() > 1_700_000_000_000);
    let short = &procs[1];
    assert_eq!(
        (
            &short["processId"],
            &short["state"],
            &short["exitCode"],
            &short["tty"]
        ),
        (&json!("short"), &json!("closed"), &json!(0), &json!(true)),
        "{short}"
    );
    assert!(short.get("memoryBytes").is_none(), "{short}");
    // Another session lists nothing of this one's.
    let mut other = Conn::open(&s.url, None).await;
    let theirs = other.ok("process/list", Value::Null).await;
    assert_eq!(theirs["processes"], json!([]));
    c.ok("process/terminate", json!({"processId": "long"}))
        .await;
    c.close().await;
    other.close().await;
    let _ = std::fs::remove_dir_all(&d);
}

/// Runs `exec-server ARGS --operator-token-file TOKEN LAST`.
async fn operator_cli(args: &[&str], token: &std::path::Path, last: &str) -> std::process::Output {
    tokio::process::Command::from(crate::common::server_command(BIN))
        .args(args)
        .arg("--operator-token-file")
        .arg(token)
        .arg(last)
        .output()
        .await
        .unwrap()
}

/// The operator view: with the server's operator credential, `process/list`
/// (`allSessions`) and `exec-server ps` show every session's processes;
/// without it, or with a wrong one, nothing of another session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_sees_every_session_and_nobody_else_does() {
    use std::os::unix::fs::PermissionsExt;
    let d = tmpdir("operator");
    let token = d.join("operator.token");
    std::fs::write(&token, "op-secret-4711\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let s = Server::start(&["--operator-token-file", token.to_str().unwrap()]);
    let mut a = Conn::open(&s.url, None).await;
    a.ok(
        "process/start",
        start_params("a1", &["sleep", "1000"], &d, false, false),
    )
    .await;
    let mut b = Conn::open(&s.url, None).await;
    for bad in [
        json!({"allSessions": true}),
        json!({"allSessions": true, "operatorToken": "nope"}),
    ] {
        let r = b.call("process/list", bad).await;
        assert_eq!(r["error"]["code"], json!(-32600), "{r}");
        assert!(!r.to_string().contains("op-secret"), "{r}");
    }
    let all = b
        .ok(
            "process/list",
            json!({"allSessions": true, "operatorToken": "op-secret-4711"}),
        )
        .await;
    let procs = all["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{all}");
    assert_eq!(procs[0]["processId"], json!("a1"));
    assert!(
        procs[0]["sessionId"]
            .as_str()
            .is_some_and(|id| id.len() > 8),
        "{all}"
    );
    let out = tokio::process::Command::from(crate::common::server_command(BIN))
        .args([
            "ps",
            "--connect",
            &s.url,
            "--operator-token-file",
            token.to_str().unwrap(),
        ])
        .output()
        .await
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        table
            .lines()
            .any(|l| l.contains("a1") && l.contains("running") && l.ends_with("sleep 1000")),
        "{table}"
    );
    let out = tokio::process::Command::from(crate::common::server_command(BIN))
        .args(["ps", "--connect", &s.url])
        .env_remove("EXEC_SERVER_OPERATOR_TOKEN")
        .output()
        .await
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("operator credential"));
    // A wrong credential cannot stop another session's process either.
    let r = b
        .call(
            "process/operatorSignal",
            json!({"sessionId": procs[0]["sessionId"], "processId": "a1", "operatorToken": "nope"}),
        )
        .await;
    assert_eq!(r["error"]["code"], json!(-32600), "{r}");
    // `kill` with the credential ends it: session A sees it exit by SIGKILL.
    let out = operator_cli(&["kill", "--connect", &s.url], &token, "a1").await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = a.collect("a1", Duration::from_secs(10)).await;
    assert_eq!(got.exit, Some(128 + 9));
    let out = operator_cli(&["kill", "--connect", &s.url], &token, "nosuch").await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no process nosuch"));
    a.close().await;
    b.close().await;
    let _ = std::fs::remove_dir_all(&d);
}

/// `--limit-grace` sets the time between SIGTERM and SIGKILL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grace_before_the_kill_is_the_servers_flag() {
    let s = Server::start(&["--limit-grace", "200ms"]);
    let (got, took) = run_limited(
        &s,
        &["sh", "-c", "trap '' TERM; sleep 1000"],
        json!({"timeoutMs": 300}),
        false,
        None,
    )
    .await;
    assert_eq!(got.limit.as_deref(), Some("wallTimeout"));
    assert_eq!(got.exit, Some(128 + 9));
    assert!(took < 1.8, "took {took:.2} s with a 200 ms grace");
}

/// The detached-session TTL ends every kind of process a session left:
/// on pipes, on a PTY, in the sandbox, and a double-forked daemon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_ttl_ends_every_kind_of_process() {
    let s = Server::start(&["--detached-session-ttl", "1"]);
    let d = tmpdir("ttl-kinds");
    let ws = tmpdir("ttl-kinds-ws");
    let pidfile = d.join("daemon.pid");
    let mut c = Conn::open(&s.url, None).await;
    c.ok(
        "process/start",
        start_params("pipe", &["sleep", "1001"], &d, false, false),
    )
    .await;
    c.ok(
        "process/start",
        start_params("pty", &["sleep", "1002"], &d, true, false),
    )
    .await;
    let mut sandboxed = start_params("sandboxed", &["sleep", "1003"], &ws, false, false);
    sandboxed["sandbox"] = ro(&ws);
    c.ok("process/start", sandboxed).await;
    let daemon = format!(
        "(setsid sh -c 'echo $$ > {}; exec sleep 1004' </dev/null >/dev/null 2>&1 &); exit 0",
        pidfile.display()
    );
    c.ok(
        "process/start",
        start_params("daemon", &["sh", "-c", &daemon], &d, false, false),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pidfile.exists()
        || ["sleep 1001", "sleep 1002", "sleep 1003"]
            .iter()
            .any(|n| pids_matching(n).is_empty())
    {
        assert!(Instant::now() < deadline, "not everything started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let daemon_pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    c.close().await;
    let gone = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z "))
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left: Vec<&str> = ["sleep 1001", "sleep 1002", "sleep 1003"]
            .into_iter()
            .filter(|n| !pids_matching(n).is_empty())
            .collect();
        if left.is_empty() && gone(daemon_pid) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left after the session's TTL: {left:?}, daemon alive: {}",
            !gone(daemon_pid)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::remove_dir_all(&ws);
}

/// `--max-session-processes` and `--max-processes` refuse a start past
/// them (-32600, `limitReached`, naming the flag); an exited process frees
/// its place; the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_caps_refuse_past_them_and_free_on_exit() {
    let s = Server::start(&["--max-session-processes", "2", "--max-processes", "3"]);
    let d = tmpdir("caps");
    let mut a = Conn::open(&s.url, None).await;
    for id in ["a1", "a2"] {
        a.ok(
            "process/start",
            start_params(id, &["sleep", "1000"], &d, false, false),
        )
        .await;
    }
    let r = a
        .call(
            "process/start",
            start_params("a3", &["sleep", "1000"], &d, false, false),
        )
        .await;
    assert_eq!(r["error"]["code"], json!(-32600), "{r}");
    assert_eq!(r["error"]["data"]["kind"], json!("limitReached"), "{r}");
    assert!(r.to_string().contains("--max-session-processes"), "{r}");
    let mut b = Conn::open(&s.url, None).await;
    b.ok(
        "process/start",
        start_params("b1", &["sleep", "1000"], &d, false, false),
    )
    .await;
    let r = b
        .call(
            "process/start",
            start_params("b2", &["sleep", "1000"], &d, false, false),
        )
        .await;
    assert!(r.to_string().contains("--max-processes"), "{r}");
    // An exited process frees its place.
    a.ok("process/terminate", json!({"processId": "a1"})).await;
    a.collect("a1", Duration::from_secs(10)).await;
    b.ok(
        "process/start",
        start_params("b2", &["true"], &d, false, false),
    )
    .await;
    let info = b.ok("environment/info", Value::Null).await;
    assert!(info["capabilities"].is_object());
    for (c, id) in [(&mut a, "a2"), (&mut b, "b1")] {
        c.ok("process/terminate", json!({"processId": id})).await;
    }
    a.close().await;
    b.close().await;
    let _ = std::fs::remove_dir_all(&d);
}

/// Starts racing on eight connections never overshoot `--max-processes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_starts_never_overshoot_the_server_cap() {
    let s = Server::start(&["--max-processes", "3"]);
    let d = tmpdir("caps-race");
    let mut conns = Vec::new();
    for _ in 0..8 {
        conns.push(Conn::open(&s.url, None).await);
    }
    let results = futures_util::future::join_all(conns.iter_mut().enumerate().map(|(i, c)| {
        let params = start_params(&format!("r{i}"), &["sleep", "1000"], &d, false, false);
        async move { c.call("process/start", params).await }
    }))
    .await;
    let started = results.iter().filter(|r| r.get("error").is_none()).count();
    assert_eq!(started, 3, "{results:?}");
    for (i, (c, r)) in conns.iter_mut().zip(&results).enumerate() {
        if r.get("error").is_none() {
            c.ok("process/terminate", json!({"processId": format!("r{i}")}))
                .await;
        }
    }
    for c in conns {
        c.close().await;
    }
    let _ = std::fs::remove_dir_all(&d);
}
