//! `deny` entries fail closed: one the server cannot enforce in full (a path
//! longer than PATH_MAX, a symlink loop, a glob whose walk is cut short)
//! refuses the start or the request instead of being dropped, and glob
//! character classes hide what they name. Each case checks the host file is
//! never read and nothing runs.

use crate::common;

use common::sandbox::*;
use common::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

fn glob_entry(pattern: &str, access: &str) -> Value {
    json!({"path": {"type": "glob_pattern", "pattern": pattern}, "access": access})
}

fn ww_denying(ws: &Path, deny: Value) -> Value {
    sandbox(
        ws,
        vec![
            special("root", "read"),
            special("project_roots", "write"),
            deny,
        ],
        "restricted",
    )
}

/// `<ws>/(100 × "d")/… /secret`, 45 levels deep (longer than PATH_MAX),
/// made one relative step at a time by a child Python.
fn deep_secret(ws: &Path) -> PathBuf {
    let made = std::process::Command::new(PY)
        .arg("-c")
        .arg(
            "import os,sys\nos.chdir(sys.argv[1])\nfor _ in range(45):\n os.mkdir('d'*100)\n \
             os.chdir('d'*100)\nopen('secret','w').write('deep-secret')",
        )
        .arg(ws)
        .status()
        .expect("python3");
    assert!(made.success());
    ws.join(format!("{}/", "d".repeat(100)).repeat(45))
        .join("secret")
}

/// A start refused before anything runs: the error's code and message, and
/// no `process/*` notification for `id`.
async fn refused_start(
    c: &mut Conn,
    id: &str,
    cwd: &Path,
    script: &str,
    sb: Value,
) -> (i64, String) {
    let mut p = start_params(id, &["/bin/sh", "-c", script], cwd, false, false);
    p["sandbox"] = sb;
    let r = c.call("process/start", p).await;
    let code = r["error"]["code"].as_i64();
    assert!(code.is_some(), "{id}: the start was not refused: {r}");
    (
        code.unwrap_or(0),
        r["error"]["message"].as_str().unwrap_or("").to_string(),
    )
}

#[tokio::test]
async fn a_deny_that_cannot_be_enforced_refuses_the_start_and_the_request() {
    let s = Server::start(&[]);
    let f = fixture("deny-unres");
    let mut c = Conn::open(&s.url, None).await;
    let marker = f.ws.join("ran");
    let script = format!("touch {}; cat secret", marker.display());

    // A deny path longer than PATH_MAX that exists.
    let deep = deep_secret(&f.ws);
    let policy = ww_denying(&f.ws, path_entry(&deep, "deny"));
    let (code, msg) = refused_start(&mut c, "long", &f.ws, &script, policy.clone()).await;
    assert_eq!(code, -32603, "{msg}");
    assert!(msg.contains("cannot be resolved"), "{code} {msg}");
    let (code, msg) = fs_err(
        &mut c,
        "fs/readFile",
        json!({"path": uri(&f.ws.join("in.txt")), "sandbox": policy}),
    )
    .await;
    assert!(msg.contains("cannot be resolved"), "{code} {msg}");

    // A deny path through a symlink loop.
    std::os::unix::fs::symlink(f.ws.join("b"), f.ws.join("a")).unwrap();
    std::os::unix::fs::symlink(f.ws.join("a"), f.ws.join("b")).unwrap();
    let policy = ww_denying(&f.ws, path_entry(&f.ws.join("a"), "deny"));
    let (code, msg) = refused_start(&mut c, "loop", &f.ws, &script, policy).await;
    assert!(msg.contains("cannot be resolved"), "{code} {msg}");

    // A deny glob over more entries than its walk may visit (50 000), made
    // on tmpfs where there is one (this disk takes 15 s for 51 000 files).
    let shm = Path::new("/dev/shm");
    let big = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        f.out.clone()
    }
    .join(format!("es-test-deny-walk-{}", std::process::id()));
    std::fs::create_dir_all(&big).unwrap();
    for i in 0..51 {
        let d = big.join(format!("d{i}"));
        std::fs::create_dir(&d).unwrap();
        for j in 0..1000 {
            std::fs::File::create(d.join(format!("f{j}"))).unwrap();
        }
    }
    std::fs::write(big.join("d50/id.key"), "key").unwrap();
    let pattern = format!("{}/**/*.key", big.display());
    let policy = ww_denying(&f.ws, glob_entry(&pattern, "deny"));
    let refused = refused_start(&mut c, "walk", &f.ws, &script, policy).await;
    std::fs::remove_dir_all(&big).unwrap();
    let (code, msg) = refused;
    assert!(msg.contains("50000 directory entries"), "{code} {msg}");
    assert!(!marker.exists(), "a refused start ran its command");

    // The same policy with an entry that names nothing runs.
    let ok = ww_denying(&f.ws, path_entry(&f.ws.join("absent"), "deny"));
    let r = run(
        &mut c,
        "absent",
        &f.ws,
        &format!("touch {}", marker.display()),
        Some(ok),
    )
    .await;
    assert_eq!(r.exit, 0, "{r:?}");
    assert!(marker.exists());
}

#[tokio::test]
async fn glob_character_classes_hide_what_they_name() {
    let s = Server::start(&[]);
    let f = fixture("deny-class");
    let mut c = Conn::open(&s.url, None).await;
    std::fs::write(f.ws.join("a.key"), "key-a").unwrap();
    std::fs::write(f.ws.join("b.key"), "key-b").unwrap();
    std::fs::create_dir_all(f.ws.join("sub")).unwrap();
    std::fs::write(f.ws.join("sub/id_rsa"), "key-rsa").unwrap();
    for (id, pattern, hidden, secret) in [
        ("class", "[a].key", "a.key", "key-a"),
        ("range", "**/id_[a-r]sa", "sub/id_rsa", "key-rsa"),
        ("negated", "[!b].key", "a.key", "key-a"),
        ("any-one", "**/id_?sa", "sub/id_rsa", "key-rsa"),
    ] {
        let policy = ww_denying(&f.ws, glob_entry(pattern, "deny"));
        let r = run(
            &mut c,
            id,
            &f.ws,
            &format!("cat {hidden}; echo; cat b.key"),
            Some(policy.clone()),
        )
        .await;
        assert!(r.out.contains("Permission denied"), "{id}: {r:?}");
        assert!(!r.out.contains(secret), "{id}: {r:?}");
        assert!(r.out.contains("key-b"), "{id}: {r:?}");
        let (code, msg) = fs_err(
            &mut c,
            "fs/readFile",
            json!({"path": uri(&f.ws.join(hidden)), "sandbox": policy}),
        )
        .await;
        assert_eq!(
            (code, msg.as_str()),
            (-32600, "Permission denied (os error 13)"),
            "{id}"
        );
    }
}
