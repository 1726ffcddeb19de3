//! `exec-server upgrade` (and SIGUSR2): a second copy of the binary takes
//! over every session, process and the listener in place; clients resume.

use crate::common::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A second copy of the binary (a different file, as a package upgrade
/// would leave), in `dir`.
fn second_copy(dir: &Path) -> PathBuf {
    let copy = dir.join("exec-server-next");
    std::fs::copy(BIN, &copy).expect("copy the binary");
    copy
}

/// Runs `exec-server upgrade --pid PID --binary BINARY`: (exit code, stdout
/// and stderr).
fn upgrade(pid: u32, binary: &Path) -> (i32, String) {
    let out = crate::common::server_command(BIN)
        .args(["upgrade", "--pid", &pid.to_string(), "--binary"])
        .arg(binary)
        .args(["--timeout", "30s"])
        .stdin(Stdio::null())
        .output()
        .expect("run exec-server upgrade");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// The parent pid of `pid`, from `/proc`.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The script both stream tests run: its pid, `seq 1 N`, then its parent's
/// pid (the server's, if it was never restarted nor re-parented).
fn seq_script(n: u32) -> String {
    format!("echo pid=$$; seq 1 {n}; echo ppid=$(cut -d' ' -f4 /proc/$$/stat)")
}

/// Starts the client `cmd` with its stdout in `out`; returns once its
/// stream has begun.
async fn stream_to(mut cmd: Command, out: &Path) -> std::process::Child {
    let client = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run the client");
    assert!(
        eventually(WAIT, || std::fs::metadata(out)
            .is_ok_and(|m| m.len() > 4096))
        .await,
        "the stream began"
    );
    client
}

/// Waits (60 s at most) for the client running [`seq_script`] to succeed,
/// then checks its output byte for byte: the pid it printed first, every
/// line of `seq 1 n`, and `server` as the command's parent at its end.
async fn check_seq_client(client: &mut std::process::Child, out: &Path, n: u32, server: u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = client.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the client did not finish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "client: {status}");
    let got = std::fs::read(out).unwrap();
    let text = String::from_utf8_lossy(&got);
    let first = text.lines().next().unwrap_or_default();
    let pid: u32 = first
        .strip_prefix("pid=")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("first line {first:?}"));
    let mut want = format!("pid={pid}\n").into_bytes();
    want.extend(expected_seq(n as u64));
    want.extend(format!("ppid={server}\n").into_bytes());
    assert!(
        got == want,
        "output differs at byte {:?} ({} bytes, want {})",
        first_difference(&got, &want),
        got.len(),
        want.len()
    );
}

#[tokio::test]
async fn a_stream_goes_on_byte_identical_across_an_upgrade_and_the_command_keeps_its_pid() {
    let dir = tmpdir("upgrade-seq");
    let next = second_copy(&dir);
    let server = Server::start(&[]);
    let out_path = dir.join("out");
    // The command prints its pid, the stream, then its parent's pid: the
    // server's, if it was never restarted nor re-parented.
    let script = seq_script(5_000_000);
    let mut cmd = crate::common::server_command(BIN);
    cmd.args(["run", "--connect", &server.url, "--", "sh", "-c", &script]);
    let mut client = stream_to(cmd, &out_path).await;
    let (code, text) = upgrade(server.pid(), &next);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("1 processes taken over"), "{text}");
    check_seq_client(&mut client, &out_path, 5_000_000, server.pid()).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_terminal_keeps_echoing_after_sigusr2_and_writes_stay_exactly_once() {
    let server = Server::start(&[]);
    let mut c = Conn::open(&server.url, None).await;
    let started = c
        .ok(
            "process/start",
            start_params("cat", &["cat"], Path::new("/tmp"), true, true),
        )
        .await;
    let pid = started["pid"].as_u64().unwrap() as u32;
    let write = |text: &str, id: &str| json!({"processId": "cat", "chunk": b64(text.as_bytes()), "writeId": id});
    c.ok("process/write", write("before\n", "w1")).await;
    let mut after = 0;
    let mut seen = String::new();
    let deadline = Instant::now() + WAIT;
    // The terminal's echo, then cat's copy: both before the upgrade.
    while seen.matches("before").count() < 2 && Instant::now() < deadline {
        let r = read(&mut c, "cat", after, 1000).await;
        after = r["nextSeq"].as_u64().unwrap() - 1;
        for k in r["chunks"].as_array().unwrap() {
            seen.push_str(&String::from_utf8_lossy(&unb64(&k["chunk"])));
        }
    }
    assert!(seen.contains("before"), "echo before the upgrade: {seen:?}");
    // SIGUSR2: the server upgrades to its own path (this test's binary).
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.pid() as i32),
        nix::sys::signal::Signal::SIGUSR2,
    )
    .unwrap();
    assert!(
        c.closed_within(WAIT).await,
        "the old image's connection closed"
    );
    let mut c = Conn::open_retry(&server.url, &c.session.clone()).await;
    // A retried write of an id applied before the upgrade is not applied again.
    c.ok("process/write", write("before\n", "w1")).await;
    c.ok("process/write", write("after\n", "w2")).await;
    let mut seen = String::new();
    let deadline = Instant::now() + WAIT;
    while !seen.contains("after") && Instant::now() < deadline {
        let r = read(&mut c, "cat", after, 1000).await;
        assert_eq!(r["exited"], json!(false), "cat runs on: {r}");
        after = r["nextSeq"].as_u64().unwrap() - 1;
        for k in r["chunks"].as_array().unwrap() {
            seen.push_str(&String::from_utf8_lossy(&unb64(&k["chunk"])));
        }
    }
    assert!(seen.contains("after"), "echo after the upgrade: {seen:?}");
    assert!(!seen.contains("before"), "w1 applied twice: {seen:?}");
    assert_eq!(
        parent_of(pid),
        Some(server.pid()),
        "cat is still the server's child"
    );
}

#[tokio::test]
async fn a_refused_binary_leaves_the_server_serving() {
    let dir = tmpdir("upgrade-refused");
    let server = Server::start(&[]);
    let mut c = Conn::open(&server.url, None).await;
    c.ok(
        "process/start",
        start_params("s", &["sleep", "30"], Path::new("/tmp"), false, false),
    )
    .await;
    // Not exec-server; an older one (another state version); not a program.
    let old = dir.join("old");
    std::fs::write(
        &old,
        "#!/bin/sh\necho 'exec-server 0.0.1 handover-state 7'\n",
    )
    .unwrap();
    let garbage = dir.join("garbage");
    std::fs::write(&garbage, [0x7fu8, b'E', b'L', b'F', 0, 1, 2, 3]).unwrap();
    for f in [&old, &garbage] {
        std::fs::set_permissions(f, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    for (binary, why) in [
        (
            Path::new("/bin/true"),
            "does not take over a running server",
        ),
        (old.as_path(), "reads state versions [7]"),
        (garbage.as_path(), "cannot run it"),
        (dir.join("missing").as_path(), "cannot run it"),
    ] {
        let (code, text) = upgrade(server.pid(), binary);
        assert_eq!(code, 1, "{binary:?}: {text}");
        assert!(
            text.contains("refused") && text.contains(why),
            "{binary:?}: {text}"
        );
    }
    // Refused before anything stopped: the same connection serves on.
    let r = read(&mut c, "s", 0, 0).await;
    assert_eq!(r["exited"], json!(false), "{r}");
    c.ok(
        "process/start",
        start_params("t", &["true"], Path::new("/tmp"), false, false),
    )
    .await;
    // One that lists the version but cannot read the state: the previous
    // binary takes the state back; the connection drops, the session resumes.
    let liar = dir.join("liar");
    std::fs::write(
        &liar,
        "#!/bin/sh\ncase \"$1\" in --handover-version) echo 'exec-server 9 handover-state 1';; \
         *) echo 'cannot read it' >&2; exit 3;; esac\n",
    )
    .unwrap();
    std::fs::set_permissions(&liar, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (code, text) = upgrade(server.pid(), &liar);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("cannot read the state"), "{text}");
    let mut c = Conn::open_retry(&server.url, &c.session.clone()).await;
    let r = read(&mut c, "s", 0, 0).await;
    assert_eq!(r["exited"], json!(false), "sleep survives: {r}");
    // One that says yes to the check without reading the document, and one
    // whose check hangs (and starts a child): both refused, nothing left.
    let mute = dir.join("mute");
    std::fs::write(
        &mute,
        "#!/bin/sh\ncase \"$1\" in --handover-version) echo 'exec-server 9 handover-state 1';; \
         *) echo ok;; esac\n",
    )
    .unwrap();
    let hang = dir.join("hang");
    std::fs::write(
        &hang,
        "#!/bin/sh\ncase \"$1\" in --handover-version) echo 'exec-server 9 handover-state 1';; \
         *) sleep 1000.41 & wait;; esac\n",
    )
    .unwrap();
    for (binary, why) in [
        (&mute, "without reading the state"),
        (&hang, "did not read the state within"),
    ] {
        std::fs::set_permissions(binary, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let (code, text) = upgrade(server.pid(), binary);
        assert_eq!(code, 1, "{text}");
        assert!(text.contains(why), "{text}");
        let mut again = Conn::open_retry(&server.url, &c.session.clone()).await;
        let r = read(&mut again, "s", 0, 0).await;
        assert_eq!(r["exited"], json!(false), "sleep survives {binary:?}: {r}");
        c = again;
    }
    assert!(
        eventually(WAIT, || pids_matching("sleep 1000.41").is_empty()).await,
        "the hung check's child was killed: {:?}",
        pids_matching("sleep 1000.41")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_hundred_sessions_with_three_hundred_processes_all_survive() {
    let dir = tmpdir("upgrade-many");
    let next = second_copy(&dir);
    let server = Server::start(&[]);
    let mut sessions = Vec::new();
    let mut pids = Vec::new();
    for s in 0..100 {
        let mut c = Conn::open(&server.url, None).await;
        for p in 0..3 {
            let id = format!("p{p}");
            let script = format!("echo s{s}{id}; exec sleep 60");
            let r = c
                .ok(
                    "process/start",
                    start_params(&id, &["sh", "-c", &script], Path::new("/tmp"), false, false),
                )
                .await;
            pids.push(r["pid"].as_u64().unwrap() as u32);
        }
        sessions.push(c.session.clone());
        c.close().await;
    }
    let (code, text) = upgrade(server.pid(), &next);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("100 sessions, 300 processes"), "{text}");
    for (s, session) in sessions.iter().enumerate() {
        let mut c = Conn::open_retry(&server.url, session).await;
        for p in 0..3 {
            let r = read(&mut c, &format!("p{p}"), 0, 2000).await;
            assert_eq!(r["exited"], json!(false), "session {s} p{p}: {r}");
            let text: String = r["chunks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|k| String::from_utf8_lossy(&unb64(&k["chunk"])).to_string())
                .collect();
            assert_eq!(text, format!("s{s}p{p}\n"), "session {s} p{p}");
        }
        c.close().await;
    }
    for pid in pids {
        assert_eq!(
            parent_of(pid),
            Some(server.pid()),
            "pid {pid} kept its parent"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_sandboxed_process_keeps_running_and_keeps_its_confinement() {
    use crate::common::sandbox::{fixture, ww};
    let f = fixture("upgrade-sandbox");
    let next = second_copy(f.ws.parent().unwrap());
    let server = Server::start(&[]);
    let mut c = Conn::open(&server.url, None).await;
    // Each line it reads names a file to create: inside the workspace, or
    // outside it (which the sandbox refuses).
    let script = "while read p; do if touch \"$p\" 2>/dev/null; then echo made $p; else echo refused $p; fi; done";
    let mut p = start_params("sb", &["sh", "-c", script], &f.ws, false, true);
    p["sandbox"] = ww(&f.ws);
    let started = c.ok("process/start", p).await;
    assert_eq!(started["sandboxType"], json!("linuxSeccomp"), "{started}");
    let write = |path: &Path, id: &str| {
        let line = format!("{}\n", path.display());
        json!({"processId": "sb", "chunk": b64(line.as_bytes()), "writeId": id})
    };
    c.ok("process/write", write(&f.ws.join("before"), "w1"))
        .await;
    // Twice: the sandbox's parent thread must outlive every image.
    for binary in [next.as_path(), Path::new(BIN)] {
        let (code, text) = upgrade(server.pid(), binary);
        assert_eq!(code, 0, "{text}");
    }
    let mut c = Conn::open_retry(&server.url, &c.session.clone()).await;
    c.ok("process/write", write(&f.ws.join("after"), "w2"))
        .await;
    c.ok("process/write", write(&f.out.join("escaped"), "w3"))
        .await;
    let mut seen = String::new();
    let mut after = 0;
    let deadline = Instant::now() + WAIT;
    while !seen.contains("refused") && Instant::now() < deadline {
        let r = read(&mut c, "sb", after, 1000).await;
        assert_eq!(r["exited"], json!(false), "{r}");
        after = r["nextSeq"].as_u64().unwrap() - 1;
        for k in r["chunks"].as_array().unwrap() {
            seen.push_str(&String::from_utf8_lossy(&unb64(&k["chunk"])));
        }
    }
    assert!(
        seen.contains("made") && seen.contains("refused"),
        "{seen:?}"
    );
    assert!(f.ws.join("before").exists() && f.ws.join("after").exists());
    assert!(
        !f.out.join("escaped").exists(),
        "the confinement held after the upgrade: {seen:?}"
    );
}

#[tokio::test]
async fn a_process_behind_the_managed_proxy_keeps_its_proxy_and_its_rules() {
    proxy_survives_an_upgrade(false).await;
}

#[tokio::test]
async fn a_sandbox_routed_through_its_proxy_keeps_its_route_and_its_rules() {
    proxy_survives_an_upgrade(true).await;
}

/// A process fetches a local URL (allowed) and a denied host (403) through
/// its managed proxy, before and after an upgrade; `sandboxed`: in a
/// sandbox whose only way out is the proxy (its Unix sockets, bridged).
async fn proxy_survives_an_upgrade(sandboxed: bool) {
    let dir = tmpdir("upgrade-proxy");
    let next = second_copy(&dir);
    let server = Server::start(&[]);
    let (base, _http) = crate::common::loopback_http::http_server().await;
    let mut c = Conn::open(&server.url, None).await;
    // Each line it reads is a URL to fetch through its proxy variables.
    let script =
        "while read u; do curl -sS --max-time 10 -o /dev/null -w '%{http_code}\\n' \"$u\"; done";
    let mut p = start_params("np", &["sh", "-c", script], &dir, false, true);
    let rules = json!({"allowLocalBinding": true, "domains": {"blocked.test": "deny"}});
    p["networkProxy"] = json!({"proxy": crate::managed_network::proxy(rules)});
    if sandboxed {
        p["enforceManagedNetwork"] = json!(true);
        p["sandbox"] = crate::common::sandbox::ww(&dir);
    }
    c.ok("process/start", p).await;
    let urls = format!("{base}/echo\nhttp://blocked.test/\n");
    let ask = |id: &str| json!({"processId": "np", "chunk": b64(urls.as_bytes()), "writeId": id});
    // Reads until `n` status lines have arrived after `after`.
    async fn statuses(c: &mut Conn, after: &mut u64, n: usize) -> Vec<String> {
        let mut text = String::new();
        let deadline = Instant::now() + WAIT;
        while text.lines().count() < n && Instant::now() < deadline {
            let r = read(c, "np", *after, 1000).await;
            assert_eq!(r["exited"], json!(false), "{r}");
            *after = r["nextSeq"].as_u64().unwrap() - 1;
            for k in r["chunks"].as_array().unwrap() {
                text.push_str(&String::from_utf8_lossy(&unb64(&k["chunk"])));
            }
        }
        text.lines().map(str::to_string).collect()
    }
    let mut after = 0;
    c.ok("process/write", ask("w1")).await;
    assert_eq!(statuses(&mut c, &mut after, 2).await, ["200", "403"]);
    let (code, text) = upgrade(server.pid(), &next);
    assert_eq!(code, 0, "{text}");
    let mut c = Conn::open_retry(&server.url, &c.session.clone()).await;
    c.ok("process/write", ask("w2")).await;
    assert_eq!(
        statuses(&mut c, &mut after, 2).await,
        ["200", "403"],
        "the same proxy port, the same rules, after the upgrade"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_remote_executor_reattaches_with_its_credential_and_the_stream_goes_on() {
    use crate::remote_mode::{start_executor, start_registry, wait_ready};
    let dir = tmpdir("upgrade-remote");
    let next = second_copy(&dir);
    let (exec_tokens, harness_tokens) = (dir.join("exec"), dir.join("harness"));
    std::fs::write(&exec_tokens, "up executor-secret\n").unwrap();
    std::fs::write(&harness_tokens, "harness-secret\n").unwrap();
    let (_registry, url) = start_registry(&[
        "--executor-tokens",
        exec_tokens.to_str().unwrap(),
        "--harness-tokens",
        harness_tokens.to_str().unwrap(),
    ]);
    // The bearer reaches the executor on stdin, once: the new binary must
    // register with the one handed over.
    let executor = start_executor(&url, "up", "executor-secret");
    wait_ready(&url, "up", "harness-secret");
    let out_path = dir.join("out");
    let script = seq_script(2_000_000);
    let mut cmd = crate::common::server_command(BIN);
    cmd.args(["run", "--registry", &url, "--environment", "up", "--"])
        .args(["sh", "-c", &script])
        .env("CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN", "harness-secret");
    let mut client = stream_to(cmd, &out_path).await;
    let (code, text) = upgrade(executor.0.id(), &next);
    assert_eq!(code, 0, "{text}");
    // The stream's process, and the finished one of `wait_ready` whose
    // record is still kept.
    assert!(text.contains("2 processes taken over"), "{text}");
    check_seq_client(&mut client, &out_path, 2_000_000, executor.0.id()).await;
    // New connections reach the new binary through the registry.
    wait_ready(&url, "up", "harness-secret");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_watch_goes_on_after_an_upgrade() {
    let dir = tmpdir("upgrade-watch");
    let watched = dir.join("watched");
    std::fs::create_dir_all(&watched).unwrap();
    let next = second_copy(&dir);
    let server = Server::start(&[]);
    let mut c = Conn::open(&server.url, None).await;
    c.ok(
        "fs/watch",
        json!({"watchId": "w1", "path": uri(&watched), "recursive": true}),
    )
    .await;
    let (code, text) = upgrade(server.pid(), &next);
    assert_eq!(code, 0, "{text}");
    let mut c = Conn::open_retry(&server.url, &c.session.clone()).await;
    std::fs::write(watched.join("after.txt"), "x").unwrap();
    let target = uri(&watched.join("after.txt"));
    let n = expect_fs_changed(&mut c, &target)
        .await
        .expect("fs/changed after the upgrade");
    assert_eq!(n["params"]["watchId"], "w1");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_reader_paging_through_spooled_output_sees_every_seq_across_upgrades() {
    let dir = tmpdir("upgrade-paging");
    let next = second_copy(&dir);
    let server = Server::start(&[]);
    let mut c = Conn::open(&server.url, None).await;
    // 40 MiB, read in pages of at most 2 MiB by a slow reader: most of it
    // is read back from the spool, some of it while an upgrade runs.
    let cmd = ["sh", "-c", "yes | head -c 41943040"];
    c.ok(
        "process/start",
        start_params("y", &cmd, Path::new("/tmp"), false, false),
    )
    .await;
    let pid = server.pid();
    let upgrader = std::thread::spawn(move || {
        for _ in 0..15 {
            std::thread::sleep(Duration::from_millis(100));
            let (code, text) = upgrade(pid, &next);
            assert_eq!(code, 0, "{text}");
        }
    });
    let (mut after, mut bytes) = (0u64, 0usize);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "read {bytes} bytes in 60 s");
        let params =
            json!({"processId": "y", "afterSeq": after, "waitMs": 1000, "maxBytes": 2 << 20});
        let id = c.send("process/read", params).await;
        let Some(r) = c.expect(|m| m["id"] == json!(id), WAIT).await else {
            // The old image's connection ended: resume on the new one.
            c = Conn::open_retry(&server.url, &c.session.clone()).await;
            continue;
        };
        let r = &r["result"];
        for k in r["chunks"].as_array().unwrap() {
            let seq = k["seq"].as_u64().unwrap();
            assert_eq!(seq, after + 1, "a page after {after} skipped seqs: {seq}");
            after = seq;
            bytes += unb64(&k["chunk"]).len();
        }
        if r["closed"] == json!(true) && r["chunks"].as_array().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    upgrader.join().expect("every upgrade succeeded");
    assert_eq!(bytes, 41_943_040);
    let _ = std::fs::remove_dir_all(&dir);
}
