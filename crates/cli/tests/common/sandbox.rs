//! Shared fixtures of the sandbox tests (`sandbox.rs`, `sandbox_fs.rs`).

use super::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

pub const PY: &str = "/usr/bin/python3";

pub struct Fixture {
    pub ws: PathBuf,
    pub out: PathBuf,
}

/// `<ws>` with `.git/HEAD` and `in.txt`; `<out>/secret.txt`; the escaping
/// symlinks of SANDBOX.md §4.
pub fn fixture(tag: &str) -> Fixture {
    let base = tmpdir(tag);
    let ws = base.join("ws");
    let out = base.join("out");
    std::fs::create_dir_all(ws.join(".git")).unwrap();
    std::fs::write(ws.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(ws.join("in.txt"), "in").unwrap();
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("secret.txt"), "secret").unwrap();
    std::os::unix::fs::symlink(&out, ws.join("escape_dir")).unwrap();
    std::os::unix::fs::symlink(out.join("secret.txt"), ws.join("escape_file")).unwrap();
    std::os::unix::fs::symlink(out.join("new.txt"), ws.join("dangling")).unwrap();
    Fixture { ws, out }
}

pub fn special(kind: &str, access: &str) -> Value {
    json!({"path": {"type": "special", "value": {"kind": kind}}, "access": access})
}

pub fn path_entry(p: &Path, access: &str) -> Value {
    json!({"path": {"type": "path", "path": uri(p)}, "access": access})
}

pub fn sandbox(ws: &Path, entries: Vec<Value>, network: &str) -> Value {
    json!({"windowsSandboxLevel": "disabled", "cwd": uri(ws), "workspaceRoots": [uri(ws)],
           "permissions": {"type": "managed", "network": network,
                           "file_system": {"type": "restricted", "entries": entries}}})
}

/// Workspace-write: root readable, the workspace writable, no network.
pub fn ww(ws: &Path) -> Value {
    sandbox(
        ws,
        vec![special("root", "read"), special("project_roots", "write")],
        "restricted",
    )
}

/// Read-only: root readable, nothing writable, no network.
pub fn ro(ws: &Path) -> Value {
    sandbox(ws, vec![special("root", "read")], "restricted")
}

#[derive(Debug)]
pub struct Run {
    pub sandbox_type: String,
    pub out: String,
    pub exit: i64,
    pub denied: bool,
}

/// Runs `sh -c script` in `cwd` with `sandbox` (or none) and waits for its close.
pub async fn run(c: &mut Conn, id: &str, cwd: &Path, script: &str, sandbox: Option<Value>) -> Run {
    let mut p = start_params(id, &["/bin/sh", "-c", script], cwd, false, false);
    if let Some(s) = sandbox {
        p["sandbox"] = s;
    }
    let started = c.ok("process/start", p).await;
    let mut out = Vec::new();
    let mut exit = None;
    let mut denied = None;
    loop {
        let m = c
            .expect(|m| m["params"]["processId"] == json!(id), WAIT)
            .await
            .unwrap_or_else(|| panic!("{id}: no close"));
        match m["method"].as_str() {
            Some("process/output") => out.extend(unb64(&m["params"]["chunk"])),
            Some("process/exited") => {
                exit = m["params"]["exitCode"].as_i64();
                denied = m["params"]["sandboxDenied"].as_bool();
            }
            Some("process/closed") => break,
            _ => {}
        }
    }
    Run {
        sandbox_type: started["sandboxType"].as_str().unwrap_or("").to_string(),
        out: String::from_utf8_lossy(&out).into_owned(),
        exit: exit.expect("exit code"),
        denied: denied.expect("sandboxDenied"),
    }
}

pub fn entries(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

pub async fn fs_err(c: &mut Conn, method: &str, params: Value) -> (i64, String) {
    let r = c.call(method, params).await;
    assert!(r.get("error").is_some(), "{method} succeeded: {r}");
    (
        r["error"]["code"].as_i64().unwrap_or(0),
        r["error"]["message"].as_str().unwrap_or("").to_string(),
    )
}

/// This build's server hard-linked (or copied) alone into a fresh
/// directory, started on loopback: with no inner-stage program beside it,
/// it runs itself as the inner stage. Returns the child (stop it by its
/// pid), its URL and its path.
pub fn lone_server(tag: &str) -> (std::process::Child, String, PathBuf) {
    let alone = tmpdir(tag).join("exec-server");
    if std::fs::hard_link(BIN, &alone).is_err() {
        std::fs::copy(BIN, &alone).expect("copy the server");
    }
    let mut child = server_command(&alone)
        .args(["--listen", "ws://127.0.0.1:0"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the lone server");
    let url = first_stdout_line(&mut child);
    (child, url, alone)
}
