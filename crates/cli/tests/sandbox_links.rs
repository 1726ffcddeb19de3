//! A policy path is never resolved through a symlink a sandboxed command
//! could have made: with `workspaceRoots: [ws, ws/d]`, a command that swapped
//! `ws/d` for a link to a host directory made that directory a writable root
//! of every later start and `fs/*` request. Checked on the host: nothing is
//! written where the link points.

use crate::common;

use common::sandbox::*;
use common::*;
use serde_json::{json, Value};
use std::path::Path;

fn roots(ws: &Path, roots: &[&Path]) -> Value {
    let mut s = ww(ws);
    s["workspaceRoots"] = json!(roots.iter().map(|r| uri(r)).collect::<Vec<_>>());
    s
}

/// The confined command's `renameat2(RENAME_EXCHANGE)` of `d` and `l` (a
/// link to `target`) in `ws`; its output.
async fn swap_in_a_link(c: &mut Conn, ws: &Path, target: &Path) -> String {
    let script = format!(
        "import ctypes,os\nos.symlink('{}', 'l')\nlibc=ctypes.CDLL(None,use_errno=True)\n\
         r=libc.renameat2(-100,b'd',-100,b'l',2)\nprint('swapped' if r==0 else os.strerror(ctypes.get_errno()))",
        target.display()
    );
    let mut p = start_params("swap", &[PY, "-c", &script], ws, false, false);
    p["sandbox"] = roots(ws, &[ws]);
    c.ok("process/start", p).await;
    let got = c.collect("swap", WAIT).await;
    String::from_utf8_lossy(&got.bytes).into_owned()
}

#[tokio::test]
async fn a_nested_root_swapped_for_a_symlink_is_refused() {
    let s = Server::start(&[]);
    let f = fixture("links-nested");
    let mut c = Conn::open(&s.url, None).await;
    std::fs::create_dir(f.ws.join("d")).unwrap();
    // A command confined to `ws` alone may swap `ws/d`: it is no mount point there.
    let out = swap_in_a_link(&mut c, &f.ws, &f.out).await;
    assert_eq!(out.trim(), "swapped");
    assert!(f.ws.join("d").symlink_metadata().unwrap().is_symlink());

    let d = f.ws.join("d");
    // The nested root of the same policy, and a policy of `ws/d` alone
    // (another session's), whose link lies in a directory a sandbox wrote.
    for (id, policy) in [
        ("nested", roots(&f.ws, &[&f.ws, &d])),
        ("alone", roots(&d, &[&d])),
    ] {
        let mut p = start_params(id, &["/bin/sh", "-c", "echo x > pwn"], &d, false, false);
        p["sandbox"] = policy.clone();
        let r = c.call("process/start", p).await;
        let msg = r["error"]["message"].as_str().unwrap_or("");
        assert_eq!(r["error"]["code"], json!(-32603), "{id}: {r}");
        assert!(msg.contains("cannot be trusted"), "{id}: {msg}");
        let (code, msg) = fs_err(
            &mut c,
            "fs/writeFile",
            json!({"path": uri(&d.join("pwn")), "dataBase64": "eA==", "sandbox": policy}),
        )
        .await;
        assert_eq!(code, -32603, "{id}: {msg}");
        assert!(msg.contains("cannot be trusted"), "{id}: {msg}");
    }
    assert_eq!(
        entries(&f.out),
        ["secret.txt"],
        "nothing written through the link"
    );

    // Put back, the same policies run.
    std::fs::remove_file(&d).unwrap();
    std::fs::rename(f.ws.join("l"), &d).unwrap();
    let r = run(
        &mut c,
        "back",
        &d,
        "echo x > ok",
        Some(roots(&f.ws, &[&f.ws, &d])),
    )
    .await;
    assert_eq!(r.exit, 0, "{r:?}");
    assert_eq!(std::fs::read_to_string(d.join("ok")).unwrap(), "x\n");
}

/// This build's server on loopback keeping its record in `state`.
fn server_keeping(state: &Path) -> Server {
    let mut child = crate::common::server_command(BIN)
        .args(["--listen", "ws://127.0.0.1:0"])
        .env("XDG_STATE_HOME", state)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start exec-server");
    let url = first_stdout_line(&mut child);
    Server { child, url }
}

#[tokio::test]
async fn the_record_outlives_the_server_and_is_shared() {
    let f = fixture("links-restart");
    let state = tmpdir("links-state");
    let d = f.ws.join("d");
    std::fs::create_dir(&d).unwrap();
    let first = server_keeping(&state);
    // A second server of the same host, running meanwhile.
    let beside = server_keeping(&state);
    let mut c = Conn::open(&first.url, None).await;
    let out = swap_in_a_link(&mut c, &f.ws, &f.out).await;
    assert_eq!(out.trim(), "swapped");
    drop(c);
    assert!(first.terminate().is_some());
    let again = server_keeping(&state);
    for s in [&again, &beside] {
        let mut c = Conn::open(&s.url, None).await;
        let mut p = start_params(
            "after",
            &["/bin/sh", "-c", "echo x > pwn"],
            &d,
            false,
            false,
        );
        p["sandbox"] = roots(&d, &[&d]);
        let r = c.call("process/start", p).await;
        let msg = r["error"]["message"].as_str().unwrap_or("");
        assert!(msg.contains("cannot be trusted"), "{r}");
    }
    assert_eq!(
        entries(&f.out),
        ["secret.txt"],
        "nothing written through the link"
    );
    let journal = std::fs::read(state.join("exec-server/sandbox-writable-dirs")).unwrap();
    let ws = std::fs::canonicalize(&f.ws).unwrap();
    assert!(journal
        .split(|b| *b == 0)
        .any(|e| e == ws.as_os_str().as_encoded_bytes()));
}

#[tokio::test]
async fn a_protected_name_made_a_symlink_exposes_nothing_hidden() {
    let s = Server::start(&[]);
    let f = fixture("links-git");
    let mut c = Conn::open(&s.url, None).await;
    let d = f.ws.join("d");
    std::fs::create_dir(&d).unwrap();
    // What a command confined to `ws` may do: point `ws/d/.git` above the
    // workspace (it reached `<out>`, outside every root, when re-bound).
    let r = run(
        &mut c,
        "plant",
        &f.ws,
        "ln -s ../.. d/.git",
        Some(roots(&f.ws, &[&f.ws])),
    )
    .await;
    assert_eq!(r.exit, 0, "{r:?}");
    let minimal = {
        let mut s = sandbox(
            &d,
            vec![
                special("minimal", "read"),
                special("project_roots", "write"),
            ],
            "restricted",
        );
        s["workspaceRoots"] = json!([uri(&d)]);
        s
    };
    let secret = f.out.join("secret.txt");
    let r = run(
        &mut c,
        "read",
        &d,
        &format!("cat {}; echo; echo x > ok", secret.display()),
        Some(minimal),
    )
    .await;
    assert!(!r.out.lines().any(|l| l == "secret"), "{r:?}");
    assert!(r.out.contains("No such file or directory"), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(d.join("ok")).unwrap(),
        "x\n",
        "{r:?}"
    );
}

#[tokio::test]
async fn nothing_masked_or_read_only_moves_with_its_directory() {
    let s = Server::start(&[]);
    let f = fixture("links-anchor");
    let mut c = Conn::open(&s.url, None).await;
    std::fs::create_dir_all(f.ws.join("a")).unwrap();
    std::fs::write(f.ws.join("a/secret"), "hidden").unwrap();
    std::fs::create_dir_all(f.ws.join("c/x")).unwrap();
    std::fs::write(f.ws.join("c/x/ro"), "ro").unwrap();
    std::fs::create_dir_all(f.ws.join("sub/.git")).unwrap();
    std::fs::write(f.ws.join("sub/.git/config"), "[core]\n").unwrap();
    let policy = sandbox(
        &f.ws,
        vec![
            special("root", "read"),
            special("project_roots", "write"),
            path_entry(&f.ws.join("a/secret"), "deny"),
            path_entry(&f.ws.join("c/x/ro"), "read"),
        ],
        "restricted",
    );
    // Each was moved away with its directory, and the next start of the
    // same policy found nothing to hide or protect at its path.
    let r = run(
        &mut c,
        "move",
        &f.ws,
        "mv a b; mv c/x c/y; mv c d; mv sub sub2; echo done",
        Some(policy.clone()),
    )
    .await;
    assert_eq!(r.out.matches("Device or resource busy").count(), 4, "{r:?}");
    for kept in ["a/secret", "c/x/ro", "sub/.git/config"] {
        assert!(f.ws.join(kept).is_file(), "{kept} moved: {r:?}");
    }
    let r = run(&mut c, "read", &f.ws, "cat a/secret", Some(policy)).await;
    assert!(r.out.contains("Permission denied"), "{r:?}");
}

#[tokio::test]
async fn the_record_is_out_of_reach_of_sandboxes() {
    let f = fixture("links-journal");
    // The record inside the workspace, as with a workspace at $HOME.
    let state = f.ws.join("state");
    let s = server_keeping(&state);
    let mut c = Conn::open(&s.url, None).await;
    let r = run(
        &mut c,
        "tamper",
        &f.ws,
        "rm -f state/exec-server/sandbox-writable-dirs; ls state/exec-server; \
         mv state/exec-server state/x; mv state st; echo done",
        Some(roots(&f.ws, &[&f.ws])),
    )
    .await;
    assert!(r.out.contains("done"), "{r:?}");
    let journal = std::fs::read(state.join("exec-server/sandbox-writable-dirs")).unwrap();
    let ws = std::fs::canonicalize(&f.ws).unwrap();
    assert!(
        journal
            .split(|b| *b == 0)
            .any(|e| e == ws.as_os_str().as_encoded_bytes()),
        "{r:?}"
    );
}

#[tokio::test]
async fn an_entry_inside_the_servers_state_is_masked_under_minimal() {
    let f = fixture("links-hidden");
    let state = f.out.join("state");
    let s = server_keeping(&state);
    let mut c = Conn::open(&s.url, None).await;
    let journal = state.join("exec-server/sandbox-writable-dirs");
    // Recorded by this first start; and a writable file entry is no error.
    let file = f.ws.join("f");
    std::fs::write(&file, "").unwrap();
    let only_file = sandbox(
        &f.ws,
        vec![special("root", "read"), path_entry(&file, "write")],
        "restricted",
    );
    let r = run(&mut c, "file", &f.ws, "echo x > f", Some(only_file)).await;
    assert_eq!(r.exit, 0, "{r:?}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "x\n");
    let r = run(&mut c, "ww", &f.ws, "true", Some(ww(&f.ws))).await;
    assert_eq!(r.exit, 0, "{r:?}");
    let before = std::fs::read(&journal).unwrap();
    assert!(!before.is_empty());
    let sub = state.join("exec-server/sub");
    std::fs::create_dir(&sub).unwrap();
    // `minimal` shows nothing above the entries, so a mask decided by
    // "shown" alone was never made, and the entries were bound.
    let inside = sandbox(
        &f.ws,
        vec![
            special("minimal", "read"),
            path_entry(&journal, "read"),
            path_entry(&sub, "write"),
        ],
        "restricted",
    );
    let script = format!(
        "cat {j}; (: > {j}); touch {d}/planted; echo done",
        j = journal.display(),
        d = sub.display()
    );
    let r = run(&mut c, "inside", Path::new("/"), &script, Some(inside)).await;
    assert!(r.out.contains("done"), "{r:?}");
    assert!(!r.out.contains(&f.ws.display().to_string()), "{r:?}");
    assert_eq!(std::fs::read(&journal).unwrap()[..before.len()], before[..]);
    assert!(!sub.join("planted").exists(), "{r:?}");
}
