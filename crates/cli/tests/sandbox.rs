//! The sandbox on Linux (SANDBOX.md §4, cases S1–S25 except the file-system
//! methods S16–S22, which are in `sandbox_fs.rs`, and more): every case
//! starts the real binary, sends a `sandbox`, and checks the outcome on the
//! host. Only temp directories these tests create are written; host settings
//! are never changed (S25 disables user namespaces inside a user namespace the
//! test made).

use crate::common;

use common::sandbox::*;
use common::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

#[tokio::test]
async fn s1_s2_s3_workspace_write_confines_writes() {
    let s = Server::start(&[]);
    let f = fixture("s1");
    let mut c = Conn::open(&s.url, None).await;
    let r = run(
        &mut c,
        "s1",
        &f.ws,
        &format!("echo a > {}/t", f.out.display()),
        Some(ww(&f.ws)),
    )
    .await;
    assert_eq!(r.sandbox_type, "linuxSeccomp");
    assert_ne!(r.exit, 0);
    assert!(r.out.contains("Read-only file system"), "{r:?}");
    assert!(!f.out.join("t").exists());

    let r = run(&mut c, "s2", &f.ws, "echo b > t", Some(ww(&f.ws))).await;
    assert_eq!((r.exit, r.denied), (0, false), "{r:?}");
    assert_eq!(std::fs::read_to_string(f.ws.join("t")).unwrap(), "b\n");

    for (i, target) in ["escape_dir/x", "escape_file", "dangling"]
        .iter()
        .enumerate()
    {
        let r = run(
            &mut c,
            &format!("s3-{i}"),
            &f.ws,
            &format!("echo x > {target}"),
            Some(ww(&f.ws)),
        )
        .await;
        assert_ne!(r.exit, 0, "{target}: {r:?}");
    }
    assert_eq!(entries(&f.out), ["secret.txt"]);
    assert_eq!(
        std::fs::read_to_string(f.out.join("secret.txt")).unwrap(),
        "secret"
    );
}

#[tokio::test]
async fn s4_s5_read_only_reads_but_never_writes() {
    let s = Server::start(&[]);
    let f = fixture("s4");
    let mut c = Conn::open(&s.url, None).await;
    let r = run(
        &mut c,
        "s4",
        &f.ws,
        &format!("cat {}/secret.txt", f.out.display()),
        Some(ro(&f.ws)),
    )
    .await;
    assert_eq!((r.exit, r.out.as_str()), (0, "secret"));
    let r = run(&mut c, "s5", &f.ws, "echo q > t4", Some(ro(&f.ws))).await;
    assert_eq!((r.exit, r.denied), (2, true), "{r:?}");
    assert!(!f.ws.join("t4").exists());
}

#[tokio::test]
async fn s6_descendants_inherit_the_confinement() {
    let s = Server::start(&[]);
    let f = fixture("s6");
    let mut c = Conn::open(&s.url, None).await;
    let o = f.out.display();
    let script = format!(
        "sh -c 'echo 1 > {o}/a'; setsid sh -c 'echo 2 > {o}/b' & wait; \
         {PY} -c \"open('{o}/c', 'w')\"; exit 0"
    );
    let r = run(&mut c, "s6", &f.ws, &script, Some(ww(&f.ws))).await;
    assert_eq!(r.exit, 0, "{r:?}");
    assert_eq!(r.out.matches("Read-only file system").count(), 3, "{r:?}");
    assert_eq!(entries(&f.out), ["secret.txt"]);
}

/// A one-shot HTTP server on loopback; returns its port.
fn http_once(body: &'static str) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

#[tokio::test]
async fn s7_s8_network_restricted_or_enabled() {
    let s = Server::start(&[]);
    let f = fixture("s7");
    let mut c = Conn::open(&s.url, None).await;
    let port = http_once("body-s8");
    let r = run(
        &mut c,
        "s7",
        &f.ws,
        &format!("curl -s http://127.0.0.1:{port}/"),
        Some(ww(&f.ws)),
    )
    .await;
    assert_eq!(r.exit, 7, "curl cannot connect: {r:?}");
    let py = format!(
        "{PY} -c \"import socket\nsocket.socket(socket.AF_UNIX).close()\nprint('unix ok')\n\
         try:\n  socket.socket(socket.AF_INET)\nexcept PermissionError as e:\n  print('inet', e.errno)\""
    );
    let r = run(&mut c, "s7b", &f.ws, &py, Some(ww(&f.ws))).await;
    assert_eq!(r.out, "unix ok\ninet 1\n", "{r:?}");
    let enabled = sandbox(
        &f.ws,
        vec![special("root", "read"), special("project_roots", "write")],
        "enabled",
    );
    let r = run(
        &mut c,
        "s8",
        &f.ws,
        &format!("curl -s http://127.0.0.1:{port}/"),
        Some(enabled),
    )
    .await;
    assert_eq!((r.exit, r.out.as_str()), (0, "body-s8"), "{r:?}");
}

#[tokio::test]
async fn s9_protected_names_stay_read_only_and_leave_nothing() {
    // A warm sandbox holds its placeholders while it waits (`sandbox_warm`
    // checks they go with it); here nothing may be left once the command is.
    let s = Server::start(&["--warm-sandboxes", "0"]);
    let f = fixture("s9");
    // A nested repository and a worktree-style `.git` pointer file.
    std::fs::create_dir_all(f.ws.join("sub/.git")).unwrap();
    std::fs::write(f.ws.join("sub/.git/config"), "c").unwrap();
    std::fs::create_dir_all(f.ws.join("wt")).unwrap();
    std::fs::write(f.ws.join("wt/.git"), "gitdir: ../.git\n").unwrap();
    let mut c = Conn::open(&s.url, None).await;
    let script = "echo > .git/HEAD; mkdir .codex; mkdir .aws/x; echo > sub/.git/config; \
                  echo > wt/.git; echo ok > sub/file; exit 0";
    let r = run(&mut c, "s9", &f.ws, script, Some(ww(&f.ws))).await;
    assert_eq!(r.exit, 0);
    assert!(r.out.matches("Read-only file system").count() >= 4, "{r:?}");
    assert_eq!(
        std::fs::read_to_string(f.ws.join(".git/HEAD")).unwrap(),
        "ref: refs/heads/main\n"
    );
    assert_eq!(
        std::fs::read_to_string(f.ws.join("sub/.git/config")).unwrap(),
        "c"
    );
    assert_eq!(
        std::fs::read_to_string(f.ws.join("wt/.git")).unwrap(),
        "gitdir: ../.git\n"
    );
    assert_eq!(
        std::fs::read_to_string(f.ws.join("sub/file")).unwrap(),
        "ok\n"
    );
    // No placeholder is left on the host.
    assert_eq!(
        entries(&f.ws),
        [
            ".git",
            "dangling",
            "escape_dir",
            "escape_file",
            "in.txt",
            "sub",
            "wt"
        ]
    );
}

#[tokio::test]
async fn a_nested_protected_name_made_a_symlink_fails_no_later_start() {
    let s = Server::start(&["--warm-sandboxes", "0"]);
    let f = fixture("s9link");
    let mut c = Conn::open(&s.url, None).await;
    // A confined command leaves nested `.git` symlinks behind: to a
    // directory (the workspace itself) and dangling.
    let script = "mkdir -p a b && ln -s .. a/.git && ln -s ../nowhere b/.git && echo made";
    let r = run(&mut c, "l0", &f.ws, script, Some(ww(&f.ws))).await;
    assert_eq!((r.exit, r.out.as_str()), (0, "made\n"), "{r:?}");
    // The next start still runs, and the workspace is still writable in it.
    let r = run(
        &mut c,
        "l1",
        &f.ws,
        "echo ok > after; echo ran",
        Some(ww(&f.ws)),
    )
    .await;
    assert_eq!((r.exit, r.out.as_str()), (0, "ran\n"), "{r:?}");
    assert_eq!(std::fs::read_to_string(f.ws.join("after")).unwrap(), "ok\n");
}

#[tokio::test]
async fn thousands_of_nested_repositories_fail_no_start() {
    let s = Server::start(&["--warm-sandboxes", "0"]);
    let f = fixture("s9many");
    // Without a bound each start would bind all 1 000 (2.9 s), and 3 000
    // would pass bubblewrap's 9 000 arguments.
    for i in 0..1_000 {
        std::fs::create_dir_all(f.ws.join(format!("r{i}/.git"))).unwrap();
    }
    let mut c = Conn::open(&s.url, None).await;
    let script = "n=0; for d in r*/.git; do (echo x > $d/config) 2>/dev/null || n=$((n+1)); done; \
                  echo ok > r0/file; echo protected:$n";
    let r = run(&mut c, "n0", &f.ws, script, Some(ww(&f.ws))).await;
    assert_eq!(r.exit, 0, "{r:?}");
    assert!(f.ws.join("r0/file").is_file());
    // The first MAX_NESTED_PROTECTED found are still protected, checked on
    // the host too.
    assert_eq!(r.out, "protected:256\n", "{r:?}");
    let written = (0..1_000)
        .filter(|i| f.ws.join(format!("r{i}/.git/config")).exists())
        .count();
    assert_eq!(written, 1_000 - 256);
    // A `/tmp` full of repositories slows every `/tmp`-writable start.
    let _ = std::fs::remove_dir_all(f.ws.parent().unwrap_or(&f.ws));
}

#[tokio::test]
async fn s10_s11_s12_sandbox_denied() {
    let s = Server::start(&[]);
    let f = fixture("s10");
    let mut c = Conn::open(&s.url, None).await;
    for (i, (script, exit, denied)) in [
        ("exit 1", 1, false),
        ("echo 'permission denied' >&2; exit 1", 1, true),
        ("echo 'permission denied'; exit 0", 0, false),
        ("kill -SYS $$", 159, true),
        ("exit 42", 42, false),
    ]
    .into_iter()
    .enumerate()
    {
        let r = run(&mut c, &format!("s10-{i}"), &f.ws, script, Some(ww(&f.ws))).await;
        assert_eq!((r.exit, r.denied), (exit, denied), "{script}: {r:?}");
    }
    let r = run(
        &mut c,
        "s11",
        &f.ws,
        "echo 'Operation not permitted'; exit 3",
        None,
    )
    .await;
    assert_eq!(
        (r.sandbox_type.as_str(), r.exit, r.denied),
        ("none", 3, false)
    );
    // S12: process/read reports it too.
    let read = c
        .ok("process/read", json!({"processId": "s10-1", "afterSeq": 0}))
        .await;
    assert_eq!(read["sandboxDenied"], true, "{read}");
    let read = c
        .ok("process/read", json!({"processId": "s10-0", "afterSeq": 0}))
        .await;
    assert_eq!(read["sandboxDenied"], false, "{read}");
}

#[tokio::test]
async fn s13_denied_paths_are_unreadable() {
    let s = Server::start(&[]);
    let f = fixture("s13");
    let mut c = Conn::open(&s.url, None).await;
    let deny_dir = sandbox(
        &f.ws,
        vec![special("root", "read"), path_entry(&f.out, "deny")],
        "restricted",
    );
    let r = run(
        &mut c,
        "s13",
        &f.ws,
        &format!("cat {}/secret.txt", f.out.display()),
        Some(deny_dir),
    )
    .await;
    assert!(r.out.contains("Permission denied"), "{r:?}");
    assert!(!r.out.contains("secret\n") && !r.out.starts_with("secret"));
    let deny_file = sandbox(
        &f.ws,
        vec![
            special("root", "read"),
            json!({"path": {"type": "path", "path": uri(&f.out.join("secret.txt"))}, "access": "none"}),
        ],
        "restricted",
    );
    let r = run(&mut c, "s13b", &f.ws, "cat escape_file", Some(deny_file)).await;
    assert!(r.out.contains("Permission denied"), "{r:?}");
    // A glob hides every match.
    std::fs::write(f.ws.join("a.env"), "k").unwrap();
    let glob = sandbox(
        &f.ws,
        vec![
            special("root", "read"),
            json!({"path": {"type": "glob_pattern", "pattern": "*.env"}, "access": "deny"}),
        ],
        "restricted",
    );
    let r = run(&mut c, "s13c", &f.ws, "cat a.env", Some(glob)).await;
    assert!(r.out.contains("Permission denied"), "{r:?}");
}

#[tokio::test]
async fn s14_slash_tmp_is_writable_only_when_listed() {
    let s = Server::start(&[]);
    let f = fixture("s14");
    // A directory of the root temp dir (not inside the workspace).
    let t = PathBuf::from("/tmp").join(format!("es-test-s14-{}", std::process::id()));
    std::fs::create_dir_all(&t).unwrap();
    let mut c = Conn::open(&s.url, None).await;
    let r = run(
        &mut c,
        "s14",
        &f.ws,
        &format!("echo x > {}/x", t.display()),
        Some(ww(&f.ws)),
    )
    .await;
    assert_ne!(r.exit, 0);
    assert!(!t.join("x").exists());
    let with_tmp = sandbox(
        &f.ws,
        vec![
            special("root", "read"),
            special("project_roots", "write"),
            special("slash_tmp", "write"),
        ],
        "restricted",
    );
    let r = run(
        &mut c,
        "s14b",
        &f.ws,
        &format!("echo x > {}/x", t.display()),
        Some(with_tmp),
    )
    .await;
    assert_eq!(r.exit, 0, "{r:?}");
    assert_eq!(std::fs::read_to_string(t.join("x")).unwrap(), "x\n");
    std::fs::remove_dir_all(&t).unwrap();
}

#[tokio::test]
async fn s15_only_the_sandbox_processes_are_visible() {
    let s = Server::start(&[]);
    let f = fixture("s15");
    let mut c = Conn::open(&s.url, None).await;
    let r = run(
        &mut c,
        "s15",
        &f.ws,
        "ls /proc; ls /proc/1/root/ >/dev/null && echo rootok",
        Some(ww(&f.ws)),
    )
    .await;
    let pids: Vec<i64> = r.out.lines().filter_map(|l| l.parse().ok()).collect();
    assert!(!pids.is_empty() && pids.iter().all(|p| *p < 10), "{r:?}");
    assert!(!pids.contains(&(s.pid() as i64)));
    // Nothing outside can be signalled.
    let r = run(
        &mut c,
        "s15b",
        &f.ws,
        &format!("kill -0 {}", s.pid()),
        Some(ww(&f.ws)),
    )
    .await;
    assert_ne!(r.exit, 0, "{r:?}");
}

#[tokio::test]
async fn s23_s24_unsupported_confinement_never_runs_the_command() {
    let s = Server::start(&[]);
    let f = fixture("s23");
    let mut c = Conn::open(&s.url, None).await;
    let mut legacy = ww(&f.ws);
    legacy["useLegacyLandlock"] = json!(true);
    let mut p = start_params("s23", &["touch", "made23"], &f.ws, false, false);
    p["sandbox"] = legacy;
    let r = c.call("process/start", p).await;
    assert_eq!(r["error"]["code"], -32603, "{r}");
    let mut p = start_params("s24", &["touch", "made24"], &f.ws, false, false);
    p["sandbox"] = ww(&f.ws);
    p["enforceManagedNetwork"] = json!(true);
    let r = c.call("process/start", p).await;
    assert_eq!(r["error"]["code"], -32603, "{r}");
    assert!(!f.ws.join("made23").exists() && !f.ws.join("made24").exists());
}

/// S25: user namespaces unavailable (disabled inside a user namespace made for
/// this test): the start succeeds, the command never runs, no fallback.
#[tokio::test]
async fn s25_no_user_namespaces_fails_closed() {
    let f = fixture("s25");
    let script = format!(
        "echo 0 > /proc/sys/user/max_user_namespaces && exec {BIN} --listen ws://127.0.0.1:0"
    );
    let mut child = Command::new("unshare")
        .args(["--user", "--map-root-user", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("unshare");
    let url = first_stdout_line(&mut child);
    assert!(url.starts_with("ws://"), "{url:?}");
    let mut c = Conn::open(&url, None).await;
    let r = run(&mut c, "s25", &f.ws, "touch made25", Some(ww(&f.ws))).await;
    assert_eq!(r.sandbox_type, "linuxSeccomp");
    assert_ne!(r.exit, 0, "{r:?}");
    assert!(!f.ws.join("made25").exists());
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test]
async fn root_cannot_change_the_host_through_proc() {
    let s = Server::start(&[]);
    let f = fixture("proc");
    let mut c = Conn::open(&s.url, None).await;
    // Writes back the current value: a no-op even if it were allowed.
    let r = run(
        &mut c,
        "dn",
        &f.ws,
        "v=$(cat /proc/sys/kernel/domainname); echo \"$v\" > /proc/sys/kernel/domainname",
        Some(ro(&f.ws)),
    )
    .await;
    assert_ne!(r.exit, 0, "{r:?}");
    assert!(
        r.out.contains("Read-only file system") || r.out.contains("Permission denied"),
        "{r:?}"
    );
}

#[tokio::test]
async fn environment_and_arg0_are_exactly_as_requested() {
    let s = Server::start(&[]);
    let f = fixture("env");
    let mut c = Conn::open(&s.url, None).await;
    let mut p = json!({"processId": "e", "argv": ["env"], "cwd": uri(&f.ws),
                       "env": {"PATH": "/usr/bin:/bin", "FOO": "bar"}, "tty": false, "sandbox": ww(&f.ws)});
    c.ok("process/start", p.clone()).await;
    let got = c.collect("e", WAIT).await;
    assert_eq!(
        String::from_utf8_lossy(&got.bytes),
        "FOO=bar\nPATH=/usr/bin:/bin\n"
    );
    p["processId"] = json!("a");
    p["argv"] = json!([
        PY,
        "-c",
        "import sys; print(open('/proc/self/cmdline').read().split('\\0')[0])"
    ]);
    p["arg0"] = json!("custom-zero");
    c.ok("process/start", p).await;
    let got = c.collect("a", WAIT).await;
    assert_eq!(String::from_utf8_lossy(&got.bytes), "custom-zero\n");
}

#[tokio::test]
async fn pty_signals_and_terminate_work_confined() {
    let s = Server::start(&[]);
    let f = fixture("pty");
    let mut c = Conn::open(&s.url, None).await;
    // A PTY child owns its terminal and reads what is written.
    let mut p = start_params(
        "t",
        &[
            "/bin/sh",
            "-c",
            "tty >/dev/null && echo is-tty; read x; echo got-$x",
        ],
        &f.ws,
        true,
        false,
    );
    p["sandbox"] = ww(&f.ws);
    assert_eq!(
        c.ok("process/start", p).await["sandboxType"],
        "linuxSeccomp"
    );
    c.expect(
        |m| m["method"] == "process/output" && unb64(&m["params"]["chunk"]).starts_with(b"is-tty"),
        WAIT,
    )
    .await
    .expect("is-tty");
    c.ok(
        "process/write",
        json!({"processId": "t", "chunk": b64(b"abc\n"), "writeId": "w1"}),
    )
    .await;
    let got = c.collect("t", WAIT).await;
    assert!(
        String::from_utf8_lossy(&got.bytes).contains("got-abc"),
        "{got:?}"
    );
    assert_eq!(got.exit, Some(0));
    // A signal reaches the command (not the sandbox's monitor).
    let mut p = start_params(
        "i",
        &[
            "/bin/sh",
            "-c",
            "trap 'echo got-int; exit 5' INT; echo ready; while :; do sleep 0.05; done",
        ],
        &f.ws,
        false,
        false,
    );
    p["sandbox"] = ww(&f.ws);
    c.ok("process/start", p).await;
    c.expect(
        |m| m["method"] == "process/output" && unb64(&m["params"]["chunk"]).starts_with(b"ready"),
        WAIT,
    )
    .await
    .expect("ready");
    c.ok(
        "process/signal",
        json!({"processId": "i", "signal": "interrupt"}),
    )
    .await;
    let got = c.collect("i", WAIT).await;
    assert_eq!(got.exit, Some(5), "{got:?}");
    assert!(String::from_utf8_lossy(&got.bytes).contains("got-int"));
    // Terminate kills the whole sandbox.
    let marker = format!("sbx-term-{}", std::process::id());
    let mut p = start_params(
        "k",
        &["/bin/sh", "-c", &format!("sleep 300 # {marker}")],
        &f.ws,
        false,
        false,
    );
    p["sandbox"] = ww(&f.ws);
    c.ok("process/start", p).await;
    assert!(eventually(WAIT, || !pids_matching(&marker).is_empty()).await);
    assert_eq!(
        c.ok("process/terminate", json!({"processId": "k"})).await["running"],
        true
    );
    c.collect("k", WAIT).await;
    assert!(eventually(Duration::from_secs(5), || pids_matching(&marker).is_empty()).await);
}

#[tokio::test]
async fn capabilities_tell_the_truth() {
    let s = Server::start(&[]);
    let mut c = Conn::open(&s.url, None).await;
    let info = c.ok("environment/info", Value::Null).await;
    assert_eq!(info["capabilities"]["sandboxEnforced"], true, "{info}");
    assert_eq!(
        info["capabilities"]["linuxRootWritePreservesDevices"], true,
        "{info}"
    );
    assert_eq!(
        info["capabilities"]["linuxApprovedRootWritePreservesRestrictions"], true,
        "{info}"
    );
}

/// `linuxApprovedRootWritePreservesRestrictions`: an approval that escalates a
/// restricted profile to root write keeps its denies, including a deny named
/// through a symlink (the target stays denied, through either name), and the
/// devices; a write to a denied file's directory still reaches the host.
#[tokio::test]
async fn approved_root_write_keeps_denies_named_through_symlinks() {
    let s = Server::start(&[]);
    let f = fixture("approvedroot");
    let secret = f.out.join("secret.txt");
    // The deny names the symlink <ws>/escape_file → <out>/secret.txt.
    let escalated = sandbox(
        &f.ws,
        vec![
            special("root", "write"),
            path_entry(&f.ws.join("escape_file"), "deny"),
        ],
        "restricted",
    );
    let mut c = Conn::open(&s.url, None).await;
    for (id, path) in [
        ("via-target", secret.clone()),
        ("via-link", f.ws.join("escape_file")),
    ] {
        let r = run(
            &mut c,
            id,
            &f.ws,
            &format!("cat {} ; echo changed > {}", path.display(), path.display()),
            Some(escalated.clone()),
        )
        .await;
        assert!(!r.out.lines().any(|l| l == "secret"), "{id}: {r:?}");
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "secret", "{id}");
    }
    let r = run(
        &mut c,
        "devices-and-write",
        &f.ws,
        &format!(
            "echo x > /dev/null && head -c 2 /dev/zero | wc -c && echo w > {}/other.txt",
            f.out.display()
        ),
        Some(escalated),
    )
    .await;
    assert_eq!((r.exit, r.out.as_str()), (0, "2\n"), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(f.out.join("other.txt")).unwrap(),
        "w\n"
    );
}

/// `linuxRootWritePreservesDevices`: a policy that makes `/` writable but
/// denies a path (so it needs the namespace view) keeps the standard devices
/// usable, keeps the denied path unreadable, and writes reach the host.
#[tokio::test]
async fn root_write_with_denies_keeps_devices_and_denies() {
    let s = Server::start(&[]);
    let f = fixture("rootwrite");
    let secret = f.out.join("secret.txt");
    let policy = sandbox(
        &f.ws,
        vec![special("root", "write"), path_entry(&secret, "deny")],
        "restricted",
    );
    let mut c = Conn::open(&s.url, None).await;
    let r = run(
        &mut c,
        "dev",
        &f.ws,
        "echo x > /dev/null && head -c 4 /dev/zero | wc -c && head -c 1 /dev/urandom > /dev/null && echo ok",
        Some(policy.clone()),
    )
    .await;
    assert_eq!(r.sandbox_type, "linuxSeccomp");
    assert_eq!((r.exit, r.out.as_str()), (0, "4\nok\n"), "{r:?}");
    let r = run(
        &mut c,
        "deny",
        &f.ws,
        &format!("cat {}", secret.display()),
        Some(policy.clone()),
    )
    .await;
    assert_ne!(r.exit, 0, "{r:?}");
    assert!(r.out.contains("Permission denied"), "{r:?}");
    assert!(!r.out.lines().any(|l| l == "secret"), "{r:?}");
    let r = run(
        &mut c,
        "write",
        &f.ws,
        &format!("echo w > {}/new.txt", f.out.display()),
        Some(policy),
    )
    .await;
    assert_eq!(r.exit, 0, "{r:?}");
    assert_eq!(
        std::fs::read_to_string(f.out.join("new.txt")).unwrap(),
        "w\n"
    );
}
