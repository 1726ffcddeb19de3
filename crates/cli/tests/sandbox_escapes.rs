//! Issue 30's sandbox escapes, each tried for real and judged on the host:
//! a confined command must not reach this server's Unix listener (to start
//! an unconfined process), swap the managed proxy's socket for a host one,
//! or write into the host directory the proxy's sockets live in.
//!
//! Each test runs its own server on a `unix://` socket with `TMPDIR` set to a
//! directory of its own, so the server's runtime directory is the test's.

use crate::common::sandbox::*;
use crate::common::*;
use crate::managed_network::proxy;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

/// A fresh directory with a short path: the server's sockets live below
/// it, and a Unix socket's path must fit in 108 bytes.
fn short_tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("esc-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A server on `unix://<dir>/exec.sock` with `TMPDIR=<dir>`; killed when dropped.
struct UnixServer {
    child: Child,
    socket: PathBuf,
    tmp: PathBuf,
}

impl UnixServer {
    fn start(tmp: &Path) -> UnixServer {
        let socket = tmp.join("exec.sock");
        let mut child = crate::common::server_command(BIN)
            .arg("--listen")
            .arg(format!("unix://{}", socket.display()))
            .env("TMPDIR", tmp)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start exec-server");
        let line = first_stdout_line(&mut child);
        assert_eq!(line, format!("unix://{}", socket.display()));
        UnixServer {
            child,
            socket,
            tmp: tmp.to_path_buf(),
        }
    }

    /// This server's runtime directory (the only one under the base).
    fn runtime_dir(&self) -> PathBuf {
        // SAFETY: geteuid cannot fail.
        let base = self
            .tmp
            .join(format!("exec-server-run-{}", unsafe { libc::geteuid() }));
        let dirs: Vec<PathBuf> = std::fs::read_dir(&base)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            // Beside it: the server's upgrade control socket.
            .filter(|p| p.is_dir())
            .collect();
        assert_eq!(dirs.len(), 1, "one live server: {dirs:?}");
        dirs[0].clone()
    }
}

impl Drop for UnixServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A JSON-RPC client on the server's Unix socket (one message per line).
struct Lines {
    r: BufReader<OwnedReadHalf>,
    w: OwnedWriteHalf,
    next: i64,
}

impl Lines {
    async fn open(path: &Path) -> Lines {
        let s = tokio::net::UnixStream::connect(path)
            .await
            .expect("connect");
        let (r, w) = s.into_split();
        let mut c = Lines {
            r: BufReader::new(r),
            w,
            next: 1,
        };
        c.call("initialize", json!({"clientName": "escape-test"}))
            .await;
        c.send(json!({"jsonrpc": "2.0", "method": "initialized"}))
            .await;
        c
    }

    async fn send(&mut self, v: Value) {
        let mut line = v.to_string();
        line.push('\n');
        self.w.write_all(line.as_bytes()).await.expect("send");
    }

    async fn recv(&mut self) -> Value {
        let mut line = String::new();
        let n = tokio::time::timeout(WAIT * 6, self.r.read_line(&mut line))
            .await
            .expect("a message in time")
            .expect("read");
        assert!(n > 0, "the server closed the connection");
        serde_json::from_str(&line).expect("JSON line")
    }

    async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        loop {
            let m = self.recv().await;
            if m["id"] == json!(id) {
                assert!(m.get("error").is_none(), "{method}: {m}");
                return m["result"].clone();
            }
        }
    }

    /// Starts `p` and returns its output and exit code once it closed.
    async fn run(&mut self, p: Value) -> (String, i64) {
        let id = p["processId"].clone();
        self.call("process/start", p).await;
        let mut run = Run::default();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let m = self.recv().await;
            if m["params"]["processId"] == id && run.take(&m) {
                break;
            }
        }
        run.finish()
    }
}

/// One process's output and exit code, gathered from its notifications.
#[derive(Default)]
struct Run {
    out: Vec<u8>,
    exit: Option<i64>,
}

impl Run {
    /// Takes one notification of the process; true once it closed.
    fn take(&mut self, m: &Value) -> bool {
        match m["method"].as_str() {
            Some("process/output") => self.out.extend(unb64(&m["params"]["chunk"])),
            Some("process/exited") => self.exit = m["params"]["exitCode"].as_i64(),
            Some("process/closed") => return true,
            _ => {}
        }
        false
    }

    fn finish(self) -> (String, i64) {
        (
            String::from_utf8_lossy(&self.out).into_owned(),
            self.exit.expect("exit code"),
        )
    }
}

/// Python that tries to reach the server at `socket` and start an
/// unconfined `touch marker` through it; prints `unix=<errno>` when the
/// socket cannot be made, `connect=<errno>` when it cannot connect,
/// `refused` when the server closes without answering, `started` when
/// the escape worked.
fn escape_script(socket: &Path, marker: &Path) -> String {
    let start = json!({"jsonrpc": "2.0", "id": 2, "method": "process/start", "params": {
        "processId": "escaped", "argv": ["/usr/bin/touch", marker.display().to_string()],
        "cwd": "file:///", "env": {}, "tty": false}});
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"clientName": "inside"}});
    let inited = json!({"jsonrpc": "2.0", "method": "initialized"});
    format!(
        r#"
import socket, sys, time
try:
    s = socket.socket(socket.AF_UNIX)
except OSError as e:
    print("unix=%d" % e.errno); sys.exit(0)
try:
    s.connect({socket:?})
except OSError as e:
    print("connect=%d" % e.errno); sys.exit(0)
s.settimeout(10)
f = s.makefile("rwb")
try:
    for m in ({init:?}, {inited:?}, {start:?}):
        f.write(m.encode() + b"\n"); f.flush()
    got = b"".join(f.readline() for _ in range(2))
except OSError:
    got = b""
print("started" if b'"processId"' in got else "refused")
time.sleep(1)
"#,
        socket = socket.display().to_string(),
        init = init.to_string(),
        inited = inited.to_string(),
        start = start.to_string(),
    )
}

fn python(id: &str, cwd: &Path, script: &str, sandbox: Value) -> Value {
    let mut p = start_params(id, &[PY, "-c", script], cwd, false, false);
    p["sandbox"] = sandbox;
    p
}

/// Routes `p` through a managed proxy (`enforceManagedNetwork`).
fn routed(mut p: Value, proxy_extra: Value) -> Value {
    p["networkProxy"] = json!({"proxy": proxy(proxy_extra)});
    p["enforceManagedNetwork"] = json!(true);
    p
}

#[tokio::test]
async fn no_sandbox_reaches_the_servers_own_unix_listener() {
    let tmp = short_tmp("l");
    let server = UnixServer::start(&tmp);
    let mut c = Lines::open(&server.socket).await;
    let f = fixture("esc-listener");
    let marker = f.out.join("marker");
    let script = escape_script(&server.socket, &marker);
    let enabled = sandbox(
        &f.ws,
        vec![special("root", "read"), special("project_roots", "write")],
        "enabled",
    );
    let cases: Vec<(&str, Value, &str)> = vec![
        // Defect 1: Unix sockets were open in managed-network mode.
        (
            "ro-routed",
            routed(python("a", &f.ws, &script, ro(&f.ws)), json!({})),
            "unix=1",
        ),
        (
            "ww-routed",
            routed(python("b", &f.ws, &script, ww(&f.ws)), json!({})),
            "unix=1",
        ),
        // Defect 7: the listener is hidden where Unix sockets are allowed.
        (
            "ww-routed-all-unix",
            routed(
                python("c", &f.ws, &script, ww(&f.ws)),
                json!({"dangerouslyAllowAllUnixSockets": true}),
            ),
            "connect=",
        ),
        (
            "ww-network",
            python("d", &f.ws, &script, enabled.clone()),
            "connect=",
        ),
        // Network restricted: connect() itself is denied.
        ("ro", python("e", &f.ws, &script, ro(&f.ws)), "connect=1"),
        ("ww", python("f", &f.ws, &script, ww(&f.ws)), "connect=1"),
    ];
    for (name, p, want) in cases {
        let (out, exit) = c.run(p).await;
        assert!(out.contains(want), "{name}: wanted {want}: {out:?}");
        assert_eq!(exit, 0, "{name}: {out}");
        assert!(!marker.exists(), "{name}: an unconfined process ran: {out}");
    }
    // Past the mask (a hard link the host made in the workspace), the
    // listener itself refuses a peer from inside a sandbox (SO_PEERCRED).
    let link = f.ws.join("link.sock");
    std::fs::hard_link(&server.socket, &link).unwrap();
    let script = escape_script(&link, &marker);
    let (out, _) = c.run(python("g", &f.ws, &script, enabled)).await;
    assert!(out.contains("refused"), "ww-network via a link: {out:?}");
    assert!(!marker.exists(), "an unconfined process ran: {out}");
    // The same link from outside any sandbox still serves.
    let (out, _) = c
        .run(start_params("h", &[PY, "-c", &script], &f.ws, false, false))
        .await;
    assert!(out.contains("started"), "unsandboxed via the link: {out:?}");
    assert!(
        eventually(WAIT, || marker.exists()).await,
        "the unsandboxed client's process ran"
    );
}

#[tokio::test]
async fn the_proxy_socket_cannot_be_swapped_nor_its_directory_written() {
    let tmp = short_tmp("b");
    // Left by a server killed earlier: swept at start.
    // SAFETY: geteuid cannot fail.
    let base = tmp.join(format!("exec-server-run-{}", unsafe { libc::geteuid() }));
    std::fs::create_dir_all(base.join("dead/np-x")).unwrap();
    std::fs::set_permissions(&base, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    std::fs::write(base.join("dead/.lock"), "").unwrap();
    std::fs::write(base.join("dead/np-x/fill"), vec![0u8; 1 << 16]).unwrap();
    let legacy = tmp.join("exec-server-netproxy-0000");
    std::fs::create_dir_all(&legacy).unwrap();
    std::fs::write(legacy.join("fill"), "x").unwrap();
    let server = UnixServer::start(&tmp);
    assert!(
        !base.join("dead").exists(),
        "a dead server's directory is swept"
    );
    assert!(
        !legacy.exists(),
        "the older layout's dead directory is swept"
    );
    let mut c = Lines::open(&server.socket).await;
    let f = fixture("esc-bridge");
    // A host socket the command would like the bridge to reach.
    let host = f.out.join("host.sock");
    let listener = std::os::unix::net::UnixListener::bind(&host).unwrap();
    listener.set_nonblocking(true).unwrap();
    let script = format!(
        "d=/dev/exec-server-netproxy; \
         ln -s {host} ./swap-$$ 2>/dev/null; mv -f ./swap-$$ $d/http.sock; echo mv=$?; \
         ln -s {host} $d/x; echo ln=$?; \
         head -c 1048576 /dev/zero > $d/fill; echo write=$?; \
         curl -sS --max-time 10 -o /dev/null -w 'status=%{{http_code}}\\n' http://127.0.0.1:1/ 2>&1; \
         ls $d",
        host = host.display()
    );
    for (name, policy) in [("ro", ro(&f.ws)), ("ww", ww(&f.ws))] {
        let mut p = start_params(name, &["/bin/sh", "-c", &script], &f.ws, false, false);
        p["sandbox"] = policy;
        let p = routed(p, json!({}));
        let dir = server.runtime_dir();
        let (out, _) = c.run(p).await;
        for step in ["mv", "ln", "write"] {
            assert!(
                out.contains(&format!("{step}=")) && !out.contains(&format!("{step}=0")),
                "{name}: {step} fails: {out}"
            );
        }
        assert!(out.contains("Read-only file system"), "{name}: {out}");
        // The proxy answered (403: loopback is not allowed), not the host socket.
        assert!(
            out.contains("status=403"),
            "{name}: the proxy answered: {out}"
        );
        assert!(
            listener.accept().is_err(),
            "{name}: the host socket was reached"
        );
        // Removed with everything in it once the process closed.
        let left = || -> Vec<_> {
            std::fs::read_dir(&dir)
                .unwrap()
                .flatten()
                .map(|e| e.file_name())
                .filter(|n| n != ".lock")
                .collect()
        };
        assert!(
            eventually(WAIT, || left().is_empty()).await,
            "{name}: per-process files left: {:?}",
            left()
        );
    }
}

/// Starts `p` on the WebSocket connection `c` and collects its output and
/// exit code until it closes.
async fn run_ws(c: &mut Conn, p: Value) -> (String, i64) {
    let id = p["processId"].clone();
    c.ok("process/start", p).await;
    let mut run = Run::default();
    loop {
        let m = c
            .expect(|m| m["params"]["processId"] == id, WAIT * 6)
            .await
            .unwrap_or_else(|| panic!("{id}: no close"));
        if run.take(&m) {
            return run.finish();
        }
    }
}

fn sh(id: &str, cwd: &Path, script: &str, sandbox: Option<Value>) -> Value {
    let mut p = start_params(id, &["/bin/sh", "-c", script], cwd, false, false);
    if let Some(s) = sandbox {
        p["sandbox"] = s;
    }
    p
}

/// The second adversarial pass: the WebSocket listener over loopback (a
/// sandbox on the host's network) and through the managed proxy (local
/// binding allowed); other processes' memory through `/proc/PID/mem`;
/// Unix datagrams addressed to host sockets.
#[tokio::test]
async fn the_listener_and_unfiltered_processes_stay_out_of_reach() {
    let s = Server::start(&[]);
    let port: u16 = s.url.rsplit(':').next().unwrap().parse().unwrap();
    let mut c = Conn::open(&s.url, None).await;
    let f = fixture("esc-ws");
    let net = sandbox(
        &f.ws,
        vec![special("root", "read"), special("project_roots", "write")],
        "enabled",
    );
    // A raw WebSocket upgrade: 101 when the server serves the caller.
    let upgrade = format!(
        r#"
import socket
s = socket.create_connection(("127.0.0.1", {port}), timeout=10)
s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
          b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
try:
    got = s.recv(64)
except OSError:
    got = b""
print("ws=101" if b" 101 " in got else "ws=closed")
"#
    );
    // The same, with the socket in flight (SCM_RIGHTS) while the server
    // looks for who holds it, taken back afterwards.
    let inflight = upgrade.replace(
        "s.sendall(",
        "a, b = socket.socketpair()\nsocket.send_fds(a, [b'x'], [s.fileno()])\ns.close()\n\
         import time; time.sleep(1.5)\n_, fds, _, _ = socket.recv_fds(b, 1, 1)\n\
         s = socket.socket(fileno=fds[0])\ns.settimeout(10)\ns.sendall(",
    );
    // Both scripts work from outside any sandbox (first, while no sandbox of
    // this server runs: with one running, a socket in flight is refused).
    for (id, script) in [("ws-out", &upgrade), ("inflight-out", &inflight)] {
        let outside = start_params(id, &[PY, "-c", script], &f.ws, false, false);
        let (out, _) = run_ws(&mut c, outside).await;
        assert!(out.contains("ws=101"), "{id}, outside a sandbox: {out}");
    }
    let (out, _) = run_ws(&mut c, python("ws-net", &f.ws, &upgrade, net.clone())).await;
    assert!(out.contains("ws=closed"), "network enabled: {out}");
    let (out, _) = run_ws(&mut c, python("ws-inflight", &f.ws, &inflight, net.clone())).await;
    assert!(out.contains("ws=closed"), "in flight: {out}");
    // Through the proxy, even where local destinations are allowed.
    let curl = format!(
        "curl -sS --max-time 10 -o /dev/null -w 'status=%{{http_code}}\\n' http://127.0.0.1:{port}/"
    );
    let p = routed(
        sh("ws-proxy", &f.ws, &curl, Some(ro(&f.ws))),
        json!({"allowLocalBinding": true}),
    );
    let (out, _) = run_ws(&mut c, p).await;
    assert!(out.contains("status=403"), "through the proxy: {out}");
    // No process outside the command's own reach: bubblewrap's init, the
    // bridge, the server (whose child a seccomp-only command is).
    let mem = "for p in 1 $PPID $(grep -l proxy\"\"routed /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3); do \
               if (exec 3<>/proc/$p/mem) 2>/dev/null; then echo mem=$p:open; else echo mem=$p:denied; fi; done";
    let full_write = sandbox(&f.ws, vec![special("root", "write")], "restricted");
    let cases = vec![
        ("ro", sh("m1", &f.ws, mem, Some(ro(&f.ws)))),
        ("ww", sh("m2", &f.ws, mem, Some(ww(&f.ws)))),
        ("net", sh("m3", &f.ws, mem, Some(net))),
        ("full-write", sh("m4", &f.ws, mem, Some(full_write))),
        (
            "ro-routed",
            routed(sh("m5", &f.ws, mem, Some(ro(&f.ws))), json!({})),
        ),
    ];
    for (name, p) in cases {
        let (out, _) = run_ws(&mut c, p).await;
        assert!(out.contains("mem=1:denied"), "{name}: {out}");
        assert!(
            !out.contains(":open"),
            "{name}: another process's memory: {out}"
        );
    }
    let (out, _) = run_ws(&mut c, sh("m6", &f.ws, mem, None)).await;
    assert!(
        out.contains(":open"),
        "the same probe unconfined opens its parent's: {out}"
    );
    // Unix datagrams could be addressed to any host datagram socket.
    let dgram = r#"
import socket
for name, make in (("dgram", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)),
                   ("raw", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_RAW)),
                   ("dgram_pair", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)),
                   ("stream_pair", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM))):
    try:
        make(); print(name + "=ok")
    except OSError as e:
        print(name + "=%d" % e.errno)
"#;
    for (name, p) in [
        ("ro", python("d1", &f.ws, dgram, ro(&f.ws))),
        (
            "ro-routed",
            routed(python("d2", &f.ws, dgram, ro(&f.ws)), json!({})),
        ),
    ] {
        let (out, _) = run_ws(&mut c, p).await;
        for want in ["dgram=1", "raw=1", "dgram_pair=1", "stream_pair=ok"] {
            assert!(out.contains(want), "{name}: {want}: {out}");
        }
    }
}

/// Descriptors the server's own parent left inheritable never reach a
/// command: not a confined one (a directory descriptor would walk the
/// host's tree), nor an unconfined one (it gets its stdio alone).
#[tokio::test]
async fn descriptors_the_server_inherited_stay_out_of_sandboxes() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let tmp = short_tmp("fd");
    let socket = tmp.join("exec.sock");
    let dir = std::fs::File::open(&tmp).unwrap();
    let raw = dir.as_raw_fd();
    let mut cmd = crate::common::server_command(BIN);
    cmd.arg("--listen")
        .arg(format!("unix://{}", socket.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // SAFETY: dup2 or fcntl only, between fork and exec: fd 7 without
    // close-on-exec. When the directory already is fd 7, dup2(7, 7) would
    // leave its close-on-exec flag set (the test's one flake): clear it.
    unsafe {
        cmd.pre_exec(move || {
            let r = match raw {
                7 => libc::fcntl(7, libc::F_SETFD, 0),
                _ => libc::dup2(raw, 7) - 7,
            };
            match r {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
    let mut child = cmd.spawn().unwrap();
    let _line = first_stdout_line(&mut child);
    let server = UnixServer {
        child,
        socket: socket.clone(),
        tmp: tmp.clone(),
    };
    let mut c = Lines::open(&server.socket).await;
    let f = fixture("esc-fd");
    let probe = "[ -e /proc/self/fd/7 ] && echo fd7=open || echo fd7=closed";
    let full_write = sandbox(&f.ws, vec![special("root", "write")], "restricted");
    for (name, policy) in [("ro", ro(&f.ws)), ("full-write", full_write)] {
        let (out, _) = c.run(sh(name, &f.ws, probe, Some(policy))).await;
        assert!(out.contains("fd7=closed"), "{name}: {out}");
    }
    // Nor does an unconfined command: it gets its stdio alone too.
    let (out, _) = c.run(sh("none", &f.ws, probe, None)).await;
    assert!(out.contains("fd7=closed"), "unconfined: {out}");
    // The probe itself works: the server holds it.
    let held = std::fs::read_link(format!("/proc/{}/fd/7", server.child.id()));
    assert_eq!(held.ok().as_deref(), Some(tmp.as_path()));
}
