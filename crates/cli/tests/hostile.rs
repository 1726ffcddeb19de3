//! Hostile and careless clients (from an adversarial review): each case is a
//! resource a client must not be able to exhaust, or data it must not destroy.

use crate::common;
use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Idle sockets that never finish the upgrade do not lock real clients out.
#[tokio::test]
async fn idle_sockets_do_not_take_connection_slots() {
    let s = Server::start(&["--max-connections", "5"]);
    let addr = s.url.trim_start_matches("ws://").to_string();
    let mut idle = Vec::new();
    for _ in 0..50 {
        idle.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    let t0 = Instant::now();
    let mut c = Conn::open(&s.url, None).await;
    assert_eq!(
        c.ok("environment/status", Value::Null).await["status"],
        "ready"
    );
    assert!(t0.elapsed() < Duration::from_secs(2));
}

/// Stdin data the child does not read is bounded: writes beyond the budget wait
/// instead of growing memory.
#[tokio::test]
async fn stdin_writes_are_bounded() {
    let s = Server::start(&[]);
    let d = tmpdir("stdin");
    let mut c = Conn::open(&s.url, None).await;
    c.ok(
        "process/start",
        start_params("s", &["sleep", "60"], &d, false, true),
    )
    .await;
    let mb = b64(&vec![b'x'; 1 << 20]);
    for i in 0..8 {
        let r = c
            .ok(
                "process/write",
                json!({"processId": "s", "chunk": mb, "writeId": format!("w{i}")}),
            )
            .await;
        assert_eq!(r["status"], "accepted");
    }
    let id = c
        .send(
            "process/write",
            json!({"processId": "s", "chunk": mb, "writeId": "w8"}),
        )
        .await;
    assert!(
        c.expect(|m| m["id"] == json!(id), Duration::from_millis(800))
            .await
            .is_none(),
        "the ninth MiB must wait for the child to read"
    );
}

/// More long-polls than the per-connection limit: the excess is refused at once
/// and the connection keeps answering.
#[tokio::test]
async fn too_many_long_polls_are_refused_not_stalled() {
    let s = Server::start(&[]);
    let d = tmpdir("polls");
    let mut c = Conn::open(&s.url, None).await;
    c.ok(
        "process/start",
        start_params("p", &["sleep", "30"], &d, false, false),
    )
    .await;
    for _ in 0..1100 {
        c.send(
            "process/read",
            json!({"processId": "p", "afterSeq": 0, "waitMs": 5000}),
        )
        .await;
    }
    let refused = c
        .expect(|m| m["error"]["code"] == json!(-32600), WAIT)
        .await;
    assert!(refused.is_some(), "excess long-polls get an error");
    let t0 = Instant::now();
    let st = c.send("environment/status", Value::Null).await;
    c.response(st).await;
    assert!(t0.elapsed() < Duration::from_secs(1));
    c.ok("process/terminate", json!({"processId": "p"})).await;
}

/// A sandbox is enforced, never silently ignored (the sandbox's own cases are
/// in `sandbox.rs`).
#[tokio::test]
async fn sandbox_is_enforced_never_ignored() {
    let s = Server::start(&[]);
    let d = tmpdir("sandbox");
    let mut c = Conn::open(&s.url, None).await;
    let ro = json!({"permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [{"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"}]}, "network": "restricted"}, "windowsSandboxLevel": "disabled"});
    let r = c
        .call(
            "fs/writeFile",
            json!({"path": uri(&d.join("x")), "dataBase64": "", "sandbox": ro}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32603);
    assert!(!d.join("x").exists());
    // Reads are allowed.
    std::fs::write(d.join("r"), "ok").unwrap();
    c.ok(
        "fs/readFile",
        json!({"path": uri(&d.join("r")), "sandbox": ro}),
    )
    .await;
    // The operator's opt-out changes nothing where the sandbox can be enforced.
    let s2 = Server::start(&["--allow-unsandboxed"]);
    let mut c2 = Conn::open(&s2.url, None).await;
    let mut p = start_params("p", &["touch", "made"], &d, false, false);
    p["sandbox"] = ro;
    assert_eq!(
        c2.ok("process/start", p).await["sandboxType"],
        "linuxSeccomp"
    );
    let got = c2.collect("p", WAIT).await;
    assert_ne!(got.exit, Some(0));
    assert!(!d.join("made").exists());
}

/// fs/copy never destroys a destination with a symlink, never blocks on a FIFO,
/// and refuses to copy a file onto itself.
#[tokio::test]
async fn fs_copy_edge_cases() {
    let s = Server::start(&[]);
    let d = tmpdir("copy");
    let mut c = Conn::open(&s.url, None).await;
    std::fs::write(d.join("precious"), "keep me").unwrap();
    std::os::unix::fs::symlink("/etc/hostname", d.join("link")).unwrap();
    let r = c.call("fs/copy", json!({"sourcePath": uri(&d.join("link")), "destinationPath": uri(&d.join("precious")), "recursive": false})).await;
    assert_eq!(r["error"]["code"], -32603);
    assert_eq!(
        std::fs::read_to_string(d.join("precious")).unwrap(),
        "keep me"
    );
    nix::unistd::mkfifo(&d.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let t0 = Instant::now();
    let r = c.call("fs/copy", json!({"sourcePath": uri(&d.join("fifo")), "destinationPath": uri(&d.join("f2")), "recursive": false})).await;
    assert_eq!(r["error"]["code"], -32600);
    assert!(t0.elapsed() < Duration::from_secs(2));
    let r = c.call("fs/copy", json!({"sourcePath": uri(&d.join("precious")), "destinationPath": uri(&d.join("precious")), "recursive": false})).await;
    assert_eq!(r["error"]["code"], -32600);
    assert_eq!(
        std::fs::read_to_string(d.join("precious")).unwrap(),
        "keep me"
    );
    // A directory holding a FIFO copies without hanging (the FIFO is skipped).
    std::fs::create_dir(d.join("dir")).unwrap();
    nix::unistd::mkfifo(&d.join("dir/fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    std::fs::write(d.join("dir/file"), "f").unwrap();
    c.ok("fs/copy", json!({"sourcePath": uri(&d.join("dir")), "destinationPath": uri(&d.join("dir2")), "recursive": true})).await;
    assert!(d.join("dir2/file").exists() && !d.join("dir2/fifo").exists());
}

/// File handles are released when the connection drops.
#[tokio::test]
async fn handles_are_released_on_disconnect() {
    let s = Server::start(&[]);
    let d = tmpdir("fds");
    std::fs::write(d.join("f"), "x").unwrap();
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", s.pid()))
            .map(|r| r.count())
            .unwrap_or(0)
    };
    let before = fds();
    for _ in 0..3 {
        let mut c = Conn::open(&s.url, None).await;
        for i in 0..200 {
            c.ok(
                "fs/open",
                json!({"handleId": format!("h{i}"), "path": uri(&d.join("f"))}),
            )
            .await;
        }
        c.close().await;
    }
    assert!(
        eventually(Duration::from_secs(5), || fds() <= before + 5).await,
        "fds {before} -> {}",
        fds()
    );
}

/// URIs the reference rejects: query or fragment, NUL byte, another host.
#[tokio::test]
async fn bad_path_uris() {
    let s = Server::start(&[]);
    let mut c = Conn::open(&s.url, None).await;
    for (p, code) in [
        ("file:///tmp/x?y=1", -32602),
        ("file:///tmp/a%00b", -32602),
        ("file://otherhost/tmp/x", -32600),
    ] {
        let r = c.call("fs/getMetadata", json!({"path": p})).await;
        assert_eq!(r["error"]["code"], json!(code), "{p}: {r}");
    }
}

/// A sandbox that denies reading a path is enforced on reads and on streams.
#[tokio::test]
async fn read_denying_sandbox_is_enforced() {
    let s = Server::start(&[]);
    let d = tmpdir("deny");
    std::fs::write(d.join("secret"), "s").unwrap();
    let mut c = Conn::open(&s.url, None).await;
    let deny = json!({"permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [{"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"}, {"path": {"type": "path", "path": uri(&d.join("secret"))}, "access": "deny"}]}, "network": "enabled"}, "windowsSandboxLevel": "disabled"});
    let r = c
        .call(
            "fs/readFile",
            json!({"path": uri(&d.join("secret")), "sandbox": deny}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32600, "{r}");
    let r = c
        .call(
            "fs/open",
            json!({"handleId": "h", "path": uri(&d.join("secret")), "sandbox": deny}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32600, "{r}");
}

/// `fs/writeFile` with `dataBase64` that is not base64: -32600 in the
/// reference's words, small or large (decoded as it arrives), and only after
/// the session gate and the path were checked; nothing is written.
#[tokio::test]
async fn write_file_with_bad_base64_is_refused_as_the_reference() {
    let s = Server::start(&[]);
    let d = tmpdir("bad-b64");
    let target = uri(&d.join("w"));
    // Before initialize, the gate answers first.
    let mut early = Conn::connect(&s.url).await;
    let r = early
        .call(
            "fs/writeFile",
            json!({"path": target, "dataBase64": "QUJ!"}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("initialize"),
        "{r}"
    );
    let mut c = Conn::open(&s.url, None).await;
    let long_bad = format!("{}QUJ!{}", "QUJD".repeat(100_000), "QUJD".repeat(1000));
    for (data, fault) in [
        ("QUJ!".to_string(), "Invalid symbol 33, offset 3."),
        ("QQ".to_string(), "Invalid padding"),
        (long_bad, "Invalid symbol 33, offset 400003."),
    ] {
        let r = c
            .call("fs/writeFile", json!({"path": target, "dataBase64": data}))
            .await;
        assert_eq!(r["error"]["code"], -32600, "{r}");
        assert_eq!(
            r["error"]["message"],
            format!("fs/writeFile requires valid base64 dataBase64: {fault}")
        );
    }
    // A path that is not a file URI is refused before the base64.
    let r = c
        .call(
            "fs/writeFile",
            json!({"path": "relative/x", "dataBase64": "QUJ!"}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(!d.join("w").exists());
}
