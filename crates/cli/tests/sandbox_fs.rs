//! The sandbox on the server's own file-system methods (SANDBOX.md §2.7,
//! cases S16–S22, and streams): outcomes checked on the host.

use crate::common;

use common::sandbox::*;
use common::*;
use serde_json::json;

#[tokio::test]
async fn s16_to_s22_file_system_methods_obey_the_policy() {
    let s = Server::start(&[]);
    let f = fixture("s16");
    let mut c = Conn::open(&s.url, None).await;
    let w = ww(&f.ws);
    // S16
    let e = fs_err(
        &mut c,
        "fs/writeFile",
        json!({"path": uri(&f.out.join("f")), "dataBase64": b64(b"x"), "sandbox": w}),
    )
    .await;
    assert_eq!(
        e,
        (-32603, "Read-only file system (os error 30)".to_string())
    );
    assert!(!f.out.join("f").exists());
    // S17
    let r = c
        .ok(
            "fs/writeFile",
            json!({"path": uri(&f.ws.join("f")), "dataBase64": b64(b"ok"), "sandbox": w}),
        )
        .await;
    assert_eq!(r, json!({}));
    assert_eq!(std::fs::read_to_string(f.ws.join("f")).unwrap(), "ok");
    // S18
    for (m, p) in [
        (
            "fs/writeFile",
            json!({"path": uri(&f.ws.join("escape_dir/f")), "dataBase64": "", "sandbox": w}),
        ),
        (
            "fs/remove",
            json!({"path": uri(&f.out.join("secret.txt")), "sandbox": w}),
        ),
        (
            "fs/copy",
            json!({"sourcePath": uri(&f.ws.join("in.txt")), "destinationPath": uri(&f.out.join("c")), "recursive": false, "sandbox": w}),
        ),
        (
            "fs/createDirectory",
            json!({"path": uri(&f.out.join("d")), "sandbox": w}),
        ),
        (
            "fs/writeFile",
            json!({"path": uri(&f.ws.join(".git/x")), "dataBase64": "", "sandbox": w}),
        ),
        (
            "fs/createDirectory",
            json!({"path": uri(&f.ws.join(".codex")), "recursive": false, "sandbox": w}),
        ),
    ] {
        let (code, msg) = fs_err(&mut c, m, p).await;
        assert!(code == -32603 || code == -32600, "{m}: {code} {msg}");
    }
    assert_eq!(entries(&f.out), ["secret.txt"]);
    assert!(!f.ws.join(".git/x").exists() && !f.ws.join(".codex").exists());
    // S19
    let r = c
        .ok(
            "fs/readFile",
            json!({"path": uri(&f.out.join("secret.txt")), "sandbox": w}),
        )
        .await;
    assert_eq!(unb64(&r["dataBase64"]), b"secret");
    // S20
    let deny = sandbox(
        &f.ws,
        vec![special("root", "read"), path_entry(&f.out, "deny")],
        "restricted",
    );
    let e = fs_err(
        &mut c,
        "fs/readFile",
        json!({"path": uri(&f.out.join("secret.txt")), "sandbox": deny}),
    )
    .await;
    assert_eq!(e, (-32600, "Permission denied (os error 13)".to_string()));
    // S21: the symlink's target is not in the view.
    let minimal = sandbox(
        &f.ws,
        vec![special("minimal", "read"), path_entry(&f.ws, "read")],
        "restricted",
    );
    let (code, msg) = fs_err(
        &mut c,
        "fs/readFile",
        json!({"path": uri(&f.ws.join("escape_file")), "sandbox": minimal}),
    )
    .await;
    assert_eq!(code, -32004, "{msg}");
    let r = c
        .ok(
            "fs/readFile",
            json!({"path": uri(&f.ws.join("in.txt")), "sandbox": minimal}),
        )
        .await;
    assert_eq!(unb64(&r["dataBase64"]), b"in");
    // S22
    let mut no_cwd = ww(&f.ws);
    no_cwd.as_object_mut().unwrap().remove("cwd");
    let e = fs_err(
        &mut c,
        "fs/writeFile",
        json!({"path": uri(&f.ws.join("g")), "dataBase64": "", "sandbox": no_cwd}),
    )
    .await;
    assert_eq!(
        e,
        (
            -32602,
            "file system sandbox context with dynamic permissions requires cwd".to_string()
        )
    );
    assert!(!f.ws.join("g").exists());
}

/// `fs/open` under a sandbox: the helper opens the file inside the view and
/// passes the descriptor back (`sandboxedFileStreaming`).
#[tokio::test]
async fn sandboxed_file_streaming() {
    let s = Server::start(&[]);
    let f = fixture("stream");
    let mut c = Conn::open(&s.url, None).await;
    let w = ww(&f.ws);
    c.ok(
        "fs/open",
        json!({"handleId": "h", "path": uri(&f.ws.join("big")), "mode": "replace", "sandbox": w}),
    )
    .await;
    c.ok(
        "fs/writeBlock",
        json!({"handleId": "h", "offset": 0, "chunk": b64(b"streamed")}),
    )
    .await;
    // As unsandboxed: the upload replaces the target only when closed.
    assert!(!f.ws.join("big").exists());
    c.ok("fs/close", json!({"handleId": "h"})).await;
    assert_eq!(
        std::fs::read_to_string(f.ws.join("big")).unwrap(),
        "streamed"
    );
    let e = fs_err(
        &mut c,
        "fs/open",
        json!({"handleId": "o", "path": uri(&f.out.join("big")), "mode": "replace", "sandbox": w}),
    )
    .await;
    assert_eq!(
        e,
        (-32603, "Read-only file system (os error 30)".to_string())
    );
    assert!(!f.out.join("big").exists());
    let deny = sandbox(
        &f.ws,
        vec![special("root", "read"), path_entry(&f.out, "deny")],
        "restricted",
    );
    let e = fs_err(
        &mut c,
        "fs/open",
        json!({"handleId": "d", "path": uri(&f.out.join("secret.txt")), "sandbox": deny}),
    )
    .await;
    assert_eq!(e, (-32600, "Permission denied (os error 13)".to_string()));
    c.ok(
        "fs/open",
        json!({"handleId": "r", "path": uri(&f.ws.join("in.txt")), "sandbox": deny}),
    )
    .await;
    let r = c
        .ok(
            "fs/readBlock",
            json!({"handleId": "r", "offset": 0, "len": 100}),
        )
        .await;
    assert_eq!(unb64(&r["chunk"]), b"in");
}

/// An `fs/open` replace commits its rename in the server, outside the
/// sandbox's view: a protected name (a nested `.git` pointer file) or a file
/// a `read` entry names under a writable root must be refused at open, as a
/// write in the view is, never renamed over on the host at close (found by
/// an adversarial pass: the `.git` file then held what the client wrote).
/// Two replace uploads into one directory at once both land (their helpers'
/// temporary names once collided: each is pid 2 in its namespace).
#[tokio::test]
async fn a_replace_upload_obeys_the_view_it_was_opened_in() {
    let s = Server::start(&[]);
    let f = fixture("replace-view");
    let mut c = Conn::open(&s.url, None).await;
    std::fs::create_dir_all(f.ws.join("sub")).unwrap();
    std::fs::write(f.ws.join("sub/.git"), "gitdir: ../real\n").unwrap();
    std::fs::write(f.ws.join("ro_file"), "kept").unwrap();
    let read_entry = sandbox(
        &f.ws,
        vec![
            special("root", "read"),
            special("project_roots", "write"),
            path_entry(&f.ws.join("ro_file"), "read"),
        ],
        "restricted",
    );
    for (name, target, policy, before) in [
        ("git", f.ws.join("sub/.git"), ww(&f.ws), "gitdir: ../real\n"),
        ("ro", f.ws.join("ro_file"), read_entry, "kept"),
    ] {
        let e = fs_err(
            &mut c,
            "fs/open",
            json!({"handleId": name, "path": uri(&target), "mode": "replace", "sandbox": policy}),
        )
        .await;
        assert_eq!(
            e,
            (-32603, "Read-only file system (os error 30)".to_string()),
            "{name}"
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), before, "{name}");
    }
    let w = ww(&f.ws);
    for h in ["a", "b"] {
        c.ok(
            "fs/open",
            json!({"handleId": h, "path": uri(&f.ws.join(h)), "mode": "replace", "sandbox": w}),
        )
        .await;
    }
    for h in ["a", "b"] {
        c.ok(
            "fs/writeBlock",
            json!({"handleId": h, "offset": 0, "chunk": b64(h.as_bytes())}),
        )
        .await;
        c.ok("fs/close", json!({"handleId": h})).await;
        assert_eq!(std::fs::read_to_string(f.ws.join(h)).unwrap(), h);
    }
}

/// `capabilityRoots/discoverV1` scans each root under its own sandbox: a root
/// the sandbox denies is never read (empty, with a warning, as the
/// reference), the same root without a sandbox, or under one that allows
/// reading it, yields its skill.
#[tokio::test]
async fn capability_discovery_obeys_each_roots_sandbox() {
    let s = Server::start(&[]);
    let f = fixture("disc-sandbox");
    let root = f.out.join("plugin");
    std::fs::create_dir_all(root.join(".codex-plugin")).unwrap();
    std::fs::write(root.join(".codex-plugin/plugin.json"), r#"{"name":"p"}"#).unwrap();
    std::fs::write(root.join("SKILL.md"), "---\nname: hidden\n---\n").unwrap();
    let deny = sandbox(
        &f.ws,
        vec![special("root", "read"), path_entry(&root, "deny")],
        "restricted",
    );
    let mut c = Conn::open(&s.url, None).await;
    let r = c
        .ok(
            "capabilityRoots/discoverV1",
            json!({"roots": [
                {"id": "denied", "path": uri(&root), "sandbox": deny},
                {"id": "readable", "path": uri(&root), "sandbox": ro(&f.ws)},
                {"id": "plain", "path": uri(&root)},
            ]}),
        )
        .await;
    let roots = r["roots"].as_array().unwrap();
    assert_eq!(roots.len(), 3);
    let denied = &roots[0];
    assert_eq!(denied["id"], "denied");
    assert_eq!(denied["skills"], json!([]), "{denied}");
    assert!(denied["plugin"].is_null(), "{denied}");
    assert!(
        denied["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("Permission denied")),
        "{denied}"
    );
    for found in &roots[1..] {
        assert_eq!(
            found["skills"][0]["instructions"]["contents"],
            "---\nname: hidden\n---\n"
        );
        assert_eq!(found["plugin"]["manifest"]["name"], "p");
    }
    let info = c.ok("environment/info", json!({})).await;
    assert_eq!(info["capabilities"]["capabilityDiscoverySandbox"], true);
}

/// The fourth adversarial pass: a read the policy allows everywhere ran in
/// the server itself, so a symlink a confined command planted pointed the
/// server at what no view shows: its own `/proc/self/environ` (its tokens),
/// its descriptors. Such a read now goes through the confined helper,
/// whose `/proc/self` is its own.
#[tokio::test]
async fn a_planted_symlink_cannot_point_a_full_read_at_the_servers_proc() {
    const CANARY: &str = "canary-7f3a1c";
    let mut cmd = server_command(BIN);
    cmd.args(["--listen", "ws://127.0.0.1:0"])
        .env("EXEC_SERVER_TEST_CANARY", CANARY);
    let s = Server::spawn(cmd);
    let f = fixture("fs-proc");
    let mut c = Conn::open(&s.url, None).await;
    let plant = run(
        &mut c,
        "plant",
        &f.ws,
        "ln -s /proc/self/environ notes.md && ln -s /proc/self/fd fds",
        Some(ww(&f.ws)),
    )
    .await;
    assert_eq!(plant.exit, 0, "{plant:?}");
    for (tag, policy) in [("ww", ww(&f.ws)), ("ro", ro(&f.ws))] {
        let r = c
            .ok(
                "fs/readFile",
                json!({"path": uri(&f.ws.join("notes.md")), "sandbox": policy}),
            )
            .await;
        let got = String::from_utf8_lossy(&unb64(&r["dataBase64"])).into_owned();
        assert!(
            !got.contains(CANARY),
            "{tag}: the server's environment: {got}"
        );
        // An ordinary file in the same place reads as before.
        let r = c
            .ok(
                "fs/readFile",
                json!({"path": uri(&f.ws.join("in.txt")), "sandbox": policy}),
            )
            .await;
        assert_eq!(unb64(&r["dataBase64"]), b"in", "{tag}");
    }
    // A file of the workspace is read by the server itself, refusing every
    // symlink, with the server's own permissions: as root (CI), one only
    // its owner may read is read as the reference reads it (a confined
    // helper, without root's powers, was refused).
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        use std::os::unix::fs::PermissionsExt;
        let private = f.ws.join("private.txt");
        std::fs::write(&private, "mine").unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&private, Some(1234), Some(1234)).unwrap();
        let r = c
            .ok(
                "fs/readFile",
                json!({"path": uri(&private), "sandbox": ww(&f.ws)}),
            )
            .await;
        assert_eq!(unb64(&r["dataBase64"]), b"mine");
    }
    // A capability root outside the workspace whose SKILL.md is a user's
    // link into it, to the planted file: the scan follows it, in a view.
    let root = f.out.join("caps");
    std::fs::create_dir_all(&root).unwrap();
    std::os::unix::fs::symlink(f.ws.join("notes.md"), root.join("SKILL.md")).unwrap();
    let r = c
        .ok(
            "capabilityRoots/discoverV1",
            json!({"roots": [{"id": "r", "path": uri(&root), "sandbox": ww(&f.ws)}]}),
        )
        .await;
    assert!(!r.to_string().contains(CANARY), "discovery: {r}");
    // Unconfined, the same request reads what the server sees (the fixture
    // holds: the canary is there to find).
    let r = c
        .ok("fs/readFile", json!({"path": uri(&f.ws.join("notes.md"))}))
        .await;
    assert!(String::from_utf8_lossy(&unb64(&r["dataBase64"])).contains(CANARY));
}
