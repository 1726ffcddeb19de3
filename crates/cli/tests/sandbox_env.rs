//! A confined command's environment reaches the command and nothing before
//! it. bubblewrap runs on the host, and the inner stage runs before the
//! seccomp filter and the Landlock domain: with the request's environment,
//! a dynamically linked one would load what `LD_PRELOAD` names first, code
//! that then runs unconfined (found by an adversarial pass). Judged with the
//! loader's own `LD_DEBUG`: its output names every program it loads, and
//! `LD_DEBUG_OUTPUT` puts it in a host directory the sandbox cannot write.

use crate::common::sandbox::*;
use crate::common::*;
use serde_json::json;
use std::path::Path;

/// The files in `dir` whose names start with `prefix`, with their contents.
fn debug_files(dir: &Path, prefix: &str) -> Vec<(String, String)> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .map(|n| {
            let text = std::fs::read_to_string(dir.join(&n)).unwrap_or_default();
            (n, text)
        })
        .collect()
}

/// Starts `p` and collects its output and exit code until it closes.
async fn run_to_close(c: &mut Conn, p: serde_json::Value) -> (String, i64) {
    let id = p["processId"].clone();
    c.ok("process/start", p).await;
    let (mut out, mut code) = (Vec::new(), None);
    loop {
        let m = c
            .expect(|m| m["params"]["processId"] == id, WAIT)
            .await
            .unwrap_or_else(|| panic!("{id}: no close"));
        match m["method"].as_str() {
            Some("process/output") => out.extend(unb64(&m["params"]["chunk"])),
            Some("process/exited") => code = m["params"]["exitCode"].as_i64(),
            Some("process/closed") => break,
            _ => {}
        }
    }
    (
        String::from_utf8_lossy(&out).into_owned(),
        code.expect("exit code"),
    )
}

#[tokio::test]
async fn the_requests_environment_steers_nothing_before_the_command() {
    // The server alone in a directory runs itself as the inner stage: a
    // dynamically linked one, as the workspace's `exec-server-inner` is.
    let (mut child, url, alone) = lone_server("env-alone");
    let f = fixture("env-steer");
    let mut c = Conn::open(&url, None).await;
    // Namespaces (bubblewrap, then the inner stage), and the seccomp filter
    // alone (the inner stage on the host, then the command).
    let full_write = sandbox(&f.ws, vec![special("root", "write")], "restricted");
    let mut results = Vec::new();
    for (name, policy) in [("ww", ww(&f.ws)), ("seccomp", full_write)] {
        let mut p = start_params(
            name,
            &["/bin/sh", "-c", "echo \"ran [$LD_DEBUG]\""],
            &f.ws,
            false,
            false,
        );
        let prefix = format!("lddebug-{name}");
        p["env"] = json!({
            "PATH": "/usr/bin:/bin",
            "LD_DEBUG": "files",
            "LD_DEBUG_OUTPUT": f.out.join(&prefix),
        });
        p["sandbox"] = policy;
        let (out, code) = run_to_close(&mut c, p).await;
        results.push((name, out, code, debug_files(&f.out, &prefix)));
    }
    // Stopped by its pid before the assertions can fail.
    let _ = child.kill();
    let _ = child.wait();
    let server = alone.display().to_string();
    for (name, out, code, files) in results {
        // The command got its environment, exactly.
        assert_eq!(code, 0, "{name}: {out}");
        assert!(out.contains("ran [files]"), "{name}: {out}");
        // Nothing before it loaded with it: no loader output naming the
        // inner stage (in the command's stderr, where a loader that cannot
        // write LD_DEBUG_OUTPUT writes, or in a file)…
        assert!(
            !out.contains(&server),
            "{name}: the inner stage loaded with the request's environment: {out}"
        );
        for (file, text) in &files {
            assert!(
                !text.contains(&server) && !text.contains("bwrap"),
                "{name}: {file} shows the inner stage or bubblewrap loading with the request's environment:\n{text}"
            );
        }
        // …and, with namespaces, no file on the host at all: only bubblewrap,
        // outside the sandbox, could have written one there.
        if name == "ww" {
            assert!(
                files.is_empty(),
                "bubblewrap ran with the request's environment: {files:?}"
            );
        }
    }
}

/// Ignored dispositions and the mask survive `exec`: a server started with
/// signals ignored (in the background by a non-interactive shell, under
/// `nohup`, by a supervisor) or blocked must not hand them to any command,
/// confined or not, real-time ones included (the C libraries refuse to
/// reset those they reserve, and 64 is `SIGRTMAX` itself).
#[tokio::test]
async fn signals_the_server_inherited_ignored_or_blocked_reach_no_command() {
    use std::os::unix::process::CommandExt;
    let mut cmd = crate::common::server_command(BIN);
    cmd.args(["--listen", "ws://127.0.0.1:0"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped());
    // SAFETY: system calls only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGALRM, 34, 50, 64] {
                exec_server_sysio::signals::ignore(sig)?;
            }
            exec_server_sysio::signals::block(&[40])
        });
    }
    let mut child = cmd.spawn().expect("start exec-server");
    let url = first_stdout_line(&mut child);
    // The probe works: the server itself holds them.
    let server_status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let f = fixture("env-signals");
    let mut c = Conn::open(&url, None).await;
    let full_write = sandbox(&f.ws, vec![special("root", "write")], "restricted");
    let disabled = json!({"windowsSandboxLevel": "disabled", "cwd": uri(&f.ws),
        "permissions": {"type": "disabled"}});
    let probe = "grep -E '^Sig(Ign|Blk):' /proc/self/status";
    let mut results = Vec::new();
    let modes = [
        ("ww", Some(ww(&f.ws))),
        ("seccomp", Some(full_write)),
        ("disabled", Some(disabled)),
        ("none", None),
    ];
    for (name, policy) in modes {
        for tty in [false, true] {
            let id = format!("{name}-{tty}");
            let mut p = start_params(&id, &["/bin/sh", "-c", probe], &f.ws, tty, false);
            if let Some(policy) = &policy {
                p["sandbox"] = policy.clone();
            }
            results.push((id, run_to_close(&mut c, p).await));
        }
    }
    // Stopped by its pid before the assertions can fail.
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        !server_status.contains("SigIgn:\t0000000000000000"),
        "{server_status}"
    );
    for (id, (out, code)) in results {
        assert_eq!(code, 0, "{id}: {out}");
        assert!(out.contains("SigIgn:\t0000000000000000"), "{id}: {out}");
        assert!(out.contains("SigBlk:\t0000000000000000"), "{id}: {out}");
    }
}

/// A NUL byte cannot cross `execve`: an argument holding one is refused
/// with the same error in every mode, never run as something else (std's
/// `Command` keeps such an argument as a placeholder that a launch path
/// reading the arguments back would have run).
#[tokio::test]
async fn an_argument_with_a_nul_byte_is_refused_in_every_mode() {
    let s = Server::start(&[]);
    let f = fixture("env-nul");
    let mut c = Conn::open(&s.url, None).await;
    let full_write = sandbox(&f.ws, vec![special("root", "write")], "restricted");
    let disabled = json!({"windowsSandboxLevel": "disabled", "cwd": uri(&f.ws),
        "permissions": {"type": "disabled"}});
    let modes = [
        ("none", None),
        ("ww", Some(ww(&f.ws))),
        ("seccomp", Some(full_write)),
        ("disabled", Some(disabled)),
    ];
    for (name, policy) in modes {
        for (what, argv, arg0) in [
            ("argv[1]", vec!["/bin/echo", "a\0b"], None),
            ("argv[0]", vec!["/bin/ec\0ho"], None),
            ("arg0", vec!["/bin/echo", "x"], Some("x\0y")),
        ] {
            let id = format!("{name}-{what}");
            let mut p = start_params(&id, &argv, &f.ws, false, false);
            if let Some(a) = arg0 {
                p["arg0"] = json!(a);
            }
            if let Some(policy) = &policy {
                p["sandbox"] = policy.clone();
            }
            let r = c.call("process/start", p).await;
            assert_eq!(r["error"]["code"], -32603, "{id}: {r}");
            let message = r["error"]["message"].as_str().unwrap_or("");
            assert!(
                message.contains(&format!("{what} holds a NUL byte")),
                "{id}: {r}"
            );
        }
    }
}
